//! `CoordinatorState`: the cluster configuration as a deterministic state machine
//! (docs/design.md §7).
//!
//! It holds the server list, the tables and their tablets, the open clients (whose
//! leases the leader keeps, `crate::client_leases`), the id counters and the
//! configuration version. Every change is a [`Command`]; [`CoordinatorState::apply`] executes
//! one and returns a [`CommandResult`]. The query methods read the state and change nothing.
//! What it hides: id assignment, tablet placement and the indexes that keep look-ups by name
//! and address cheap.
//!
//! # Determinism contract
//!
//! The state is replicated with Raft: each `Command` is a log entry that every replica
//! applies in log order, and replays after a restart. Replicas must agree exactly, so
//! `apply` is a pure function of (state, command):
//!
//! 1. No clocks. A time read inside `apply` would differ between replicas and between the
//!    first apply and a replay. Decisions that depend on time (declaring a server crashed
//!    after missed pings) are taken by the leader outside the state machine and enter it as
//!    commands ([`Command::SetServerStatus`], [`Command::ExpireClients`]).
//! 2. No randomness. Tablets are placed round-robin from a cursor kept in the state.
//! 3. No I/O. The async driver persists the log and sends the results.
//! 4. Only ordered containers (`BTreeMap`, `Vec`). A `HashMap`'s iteration order depends on
//!    a per-process random seed and would leak into placement and into
//!    [`TabletMap`](rampart_common::tablet::TabletMap).
//! 5. A rejected command changes nothing, not even [`CoordinatorState::version`], so a
//!    replica never has to undo half a command.
//!
//! # Snapshots
//!
//! The state derives `Serialize`/`Deserialize`: a snapshot is the serialized state.
//! Restoring a snapshot taken after entry k and applying entries k+1.. gives the same state
//! as applying every entry (a property test checks it). The encoding is bincode, which
//! has no optional fields: new fields go at the end, and [`CoordinatorState::decode`]
//! also reads the shorter encoding of the release before them (the one before open
//! clients). Call
//! [`CoordinatorState::check_invariants`] on a snapshot read from disk before installing it.
//!
//! # Idempotence
//!
//! Clients retry after a lost reply, so commands that a retry may repeat are idempotent:
//! creating an existing table returns that table (RAMCloud semantics), dropping a missing
//! table succeeds with nothing to drop, splitting a tablet where a tablet starts already
//! changes nothing, and setting a server to its current status is a no-op. None of these
//! bump the version.
//!
//! # Tablet epochs
//!
//! Every command that changes the tablets a server owns (create, drop, split, recovered
//! partition) bumps that server's *tablet epoch* by one. The pushes that follow carry it,
//! and lease renewals report it, so a master applies changes in order, notices one it
//! missed, and pulls its whole set then: the tablets it serves converge to the committed
//! map whatever became of the pushes (`protocol::master::TabletsRequest`).
//!
//! # Crash recovery
//!
//! A crashed server keeps its tablets until recovery hands them over: each recovered
//! partition enters as [`Command::RecoveredPartition`], which gives the partition's ranges
//! (splitting tablets where a range starts or ends inside one) to the recovery master
//! that replayed them. A crashed server that owns no tablet any more has been recovered;
//! the leader's recovery driver then frees its replicas and marks it `Removed`. Masters'
//! wills ([`Command::SetWill`]), the epochs of open segments whose replicas they
//! re-created ([`Command::SetOpenEpoch`]) and the operator's consent to lose data of an
//! incomplete log ([`Command::AllowLoss`]) live here too, so a new leader carries on any
//! recovery where the old one stopped (`coordinator::recovery_manager`).
//!
//! # Files
//!
//! * `command` — [`Command`] and [`CommandResult`], the limits `apply` enforces, and why a
//!   command is refused.
//! * `core` — the [`CoordinatorState`] struct, its fields' invariants, and `apply`.
//! * `servers` — enlisting servers, moving their status forward, the server list.
//! * `tables` — creating and dropping tables, tablet placement, tablet epochs.
//! * `recovery_records` — wills, open-segment epochs, version ceilings, consent to loss, and
//!   recovered partitions.
//! * `clients` — opening and expiring clients.
//! * `moves` — moves of tablets between masters: begun, then committed or aborted.
//! * `drains` — servers being drained: nothing new placed on them, then removed.
//! * `rebalancing` — the rebalancer's committed settings: paused, pinned ranges.
//! * `snapshot` — decoding a snapshot (this release's encoding or the older one) and
//!   [`CoordinatorState::check_invariants`].
//! * `test_support` — for tests only: the helpers the files' tests share.

mod clients;
mod command;
mod core;
mod drains;
mod moves;
mod rebalancing;
mod recovery_records;
mod servers;
mod snapshot;
mod tables;
#[cfg(test)]
mod test_support;

pub use self::command::{
    Command, CommandResult, MoveEnd, OpenMove, CLIENTS_MAX, CLIENT_IDS_START, ENDED_MOVES_KEPT,
    EXPIRE_CLIENTS_MAX, MOVES_MAX, OPEN_EPOCH_SEGMENTS_MAX, PINNED_MAX, SERVERS_MAX,
    SERVER_FIELD_BYTES_MAX, TABLES_MAX, TABLETS_MAX, TABLE_NAME_BYTES_MAX, TABLE_SPAN_MAX,
    WILL_RANGES_MAX,
};
pub use self::core::CoordinatorState;
pub use self::snapshot::InvariantViolation;
pub use rampart_common::tablet::HashRange;
