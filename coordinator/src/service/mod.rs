//! `CoordinatorService`: the coordinator's RPC handlers over its Raft member
//! ([`RaftNode`](crate::node::RaftNode)).
//!
//! Every change is a [`Command`](crate::state::Command) proposed through Raft; the
//! handler answers with what applying it produced once it is committed. Reads that must
//! be current (`GetTabletMap`, `GetTableId`) pass a ReadIndex barrier first, so they are
//! linearizable. A coordinator that is not the leader answers `NotLeader` with a hint
//! naming the leader (see `NotLeaderHint`); clients follow it. `RaftStatus` is answered
//! by every coordinator, and `RaftMessages` carries Raft's own traffic between
//! coordinators.
//!
//! Changes that move tablets are followed by pushes to the masters concerned: `TakeTablets`
//! after a table is created, `DropTablets` after it is dropped, each naming the server it
//! is for and that server's tablet epoch after the change (see
//! `protocol::master::TabletsRequest`). Only `Up` owners are told: a crashed owner's
//! tablets are being recovered, and whoever listens at its address now is another server
//! (which refuses, `WrongServer`). A change and its pushes hold the lock of the table's
//! name (one of [`NAME_LOCKS`] stripes), so two concurrent creates/drops of one name
//! cannot reach a master in the wrong order, while changes to other tables proceed in
//! parallel. After an enlistment the leader tells every `Up` server the new configuration
//! version (`ServerListChanged`), and servers holding an older list pull it.
//!
//! # Ownership converges
//! A push is a shortcut, not the mechanism: every lease renewal (`RenewLease`) answers
//! the master's tablet epoch, and a master behind it pulls its whole set
//! (`GetOwnedTablets`, linearizable). So a push that was lost — the leader died between
//! commit and push, the master was unreachable — costs at most a renewal interval.
//!
//! # Failure handling
//! * A proposal not committed within [`PROPOSAL_TIMEOUT`](rampart_common::protocol::coordinator::PROPOSAL_TIMEOUT) (a leader cut off from its
//!   majority never commits) is answered `Retry` with the reason; its outcome is unknown,
//!   and every command is safe to retry (creates are idempotent by name, drops by table
//!   id, so a retried drop never hits a table re-created under the same name; a retried
//!   enlistment gets a new id and crashes the orphaned one).
//! * If an `Up` master cannot be reached to take its tablets, `create_table` answers
//!   `Retry` (the table exists; the client library retries, and a repeated create asks
//!   the owners to catch up, `SyncTablets`). A leader that dies between the commit and the
//!   push leaves the same state, repaired the same way — or by the owners' next renewal.
//!   Owners that are not `Up` do not make a create wait: their tablets come back through
//!   recovery.
//! * A failed `DropTablets` push is only logged: the table is already gone from the map,
//!   its id is never reused, so no client can reach the stale tablet through a fresh map,
//!   and the master drops it at its next lease renewal.
//!
//! # Files
//! * `shared.rs` — the [`CoordinatorService`] struct, its construction and accessors,
//!   and what every handler shares: proposals, read barriers, the table-name locks
//!   ([`NAME_LOCKS`]), the replies for refused commands and node errors.
//! * `servers.rs` — enlistment, masters' leases, failure reports, and what masters
//!   record: wills, open-segment epochs, version ceilings; the tablets a server owns.
//! * `tables.rs` — creating and dropping tables and the pushes to their masters
//!   ([`TABLET_PUSH_TIMEOUT`]), table ids and the tablet map, splitting tablets, and
//!   moving them (`MoveTablets`, through `crate::mover`; `GetMove`).
//! * `drains.rs` — draining a server (`DrainServer`, `GetDrain`; driven by
//!   `crate::drainer`).
//! * `rebalancing.rs` — the masters' load reports and the operator's view and pause of
//!   the rebalancer (`ReportLoad`, `Rebalance`; driven by `crate::rebalancer`).
//! * `recoveries.rs` — `AllowLoss` and `RecoveryStatus`.
//! * `clients.rs` — client ids and client leases.
//! * `raft.rs` — `RaftStatus` and the Raft traffic between coordinators.
//! * `routes.rs` — the table of handlers by opcode (a `rampart_common::rpc::Router`,
//!   built once) and the `Service` impl that dispatches through it.

mod clients;
mod drains;
mod raft;
mod rebalancing;
mod recoveries;
mod routes;
mod servers;
mod shared;
mod tables;

pub use shared::{CoordinatorService, NAME_LOCKS};
pub use tables::TABLET_PUSH_TIMEOUT;
