//! `Client`: the table API of docs/design.md §3 over the cluster.
//!
//! The client keeps a cached tablet map and sends each operation straight to the
//! master owning the key's hash. When a master answers `UnknownTablet` or cannot be
//! reached, the client refreshes the map from a coordinator and retries with
//! exponential backoff until the operation's deadline.
//!
//! # Retries and exactly-once
//! Every operation is retried until its deadline: through tablet moves, recoveries, and
//! connections that broke before or after the request was sent. Writes, removes and
//! increments are safe to send again because each carries an exactly-once identity
//! (`rampart_common::rifl`, RAMCloud's RIFL): the client's id, given by the coordinators
//! at [`Client::connect`], and a number per operation kept by its retries
//! ([`crate::tracker`]). A master that applied it before answers the retry from the
//! completion record it logged with the object — also after a crash moved the object to
//! another master — so the operation applies once and the caller gets its one outcome.
//! Only an operation whose deadline passes ends without an outcome:
//! [`ClientError::Timeout`], which may or may not have applied. Its message says what
//! the last attempt met and, asked briefly after the deadline (once a second per owner
//! at most), what the cluster says of the key's owner (for a multi-object operation, of
//! the owner whose objects were tried again last): crashed and being recovered, its
//! recovery waiting (and why), up but unable to replicate writes (too few backups for
//! R), or up with its memory nearly full of live data — each with the fix. A tablet
//! whose owner is merely being recovered times out as such, never as a coordinator
//! failure.
//!
//! A write-type operation waits for its number while one slow operation holds the
//! client's acknowledgement so far back that masters could not keep the records of the
//! operations numbered after it (`crate::tracker`, "Limits"); the wait counts against
//! its deadline, and one that ends there is a `Timeout` of no attempt (never sent).
//!
//! # Client lease
//! The client's id comes with a lease, renewed by a background task every third of its
//! length (`rampart_common::rifl`, "Leases"). Cut off from the coordinators (or paused)
//! for longer than the lease, the client loses its id: masters refuse its writes
//! `ClientLeaseExpired`. The client then opens a new id — as soon as a renewal is told
//! the lease expired, or an operation is refused — and carries on under it. Operations
//! numbered under the old id are never sent under the new one (that would make them
//! second, independent operations): each ends when refused, as
//! [`ClientError::LeaseExpired`], whose outcome is unknown (it may have applied once
//! before the lease ran out), or by its deadline. Operations that had no number yet wait
//! for the new id, until their deadline (then [`ClientError::NoCoordinator`]).
//!
//! # Coordinators
//! Table operations and map refreshes go to the leader of the coordinators' Raft group
//! through a [`CoordinatorSet`]: it asks the leader it last found first, follows
//! `NotLeader` hints, and goes round the given coordinators (pausing between rounds)
//! until the operation's deadline, when the operation fails with
//! [`ClientError::NoCoordinator`] carrying the last reason (`no leader: ...`,
//! `connection refused`). `TableDoesntExist` fails it at once. Every coordinator call of
//! the client is safe to repeat after a lost reply: reads, and creates and drops that are
//! idempotent by name.
//!
//! # Failure reports
//! A master that cannot be reached (a transport failure in a single-object operation,
//! an enumeration or a multi-op) is reported to the coordinators with `ReportFailure`
//! (docs/design.md §6), by a background task: the operation refreshes its map and retries at
//! once, as above, without waiting for the report. Reports are rate-limited per server
//! and bounded in number ([`crate::failure_reporter`]); one that fails is dropped.
//!
//! A master that answers `Retry` (for instance because its lease lapsed while it was cut
//! off from the coordinators, so its tablets may be moving) makes the client refresh its
//! map before it tries again, and is reported as well: a master cut off from the
//! coordinators but not from its peers or clients answers every ping of its peers, so
//! without a client's report nobody would have the coordinator check it, and its tablets
//! would stay unavailable for as long as the partition lasts. The coordinator's own ping
//! decides; a master that merely was busy answers it.
//!
//! # Files
//! * `state` — [`ClientOptions`], [`Object`], [`WriteItem`], and the [`Client`] with the
//!   state its clones share.
//! * `identity` — connecting, the numbers of write-type operations, and the client lease.
//! * `coordinators` — the cached tablet map, coordinator calls, and failure reports.
//! * `retry` — the retry loop of single-object operations and what a timeout explains.
//! * `table_api` — tables, and single-object reads, writes, removes and increments.
//! * `multi` — multi-reads, multi-writes and multi-removes.
//! * `enumeration` — [`Enumeration`]: a table, a page at a time.
//!
//! [`ClientError::Timeout`]: crate::error::ClientError::Timeout
//! [`ClientError::LeaseExpired`]: crate::error::ClientError::LeaseExpired
//! [`ClientError::NoCoordinator`]: crate::error::ClientError::NoCoordinator
//! [`CoordinatorSet`]: rampart_common::coordinator_set::CoordinatorSet

mod coordinators;
mod enumeration;
mod identity;
mod multi;
mod retry;
mod state;
mod table_api;
#[cfg(test)]
mod test_support;

pub use coordinators::{MOVE_TIMEOUT, TABLE_CHANGE_ATTEMPT_TIMEOUT};
pub use enumeration::{Enumeration, ENUMERATE_PAGE_BYTES};
pub use retry::{EXPLAIN_TIMEOUT, EXPLANATION_REUSE};
pub use state::{Client, ClientOptions, Object, WriteItem};
