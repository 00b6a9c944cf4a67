//! `rampart-coordinator`: the cluster configuration (docs/design.md §7), replicated by Raft.
//!
//! * [`state`] — `CoordinatorState`: the deterministic state machine of servers,
//!   tables, tablets and open clients; `apply(command) -> result`, no I/O.
//! * [`raft_storage`] — `RaftStorage`: the durable Raft log (entries, hard state, conf
//!   state, snapshot) in a `raft-engine` directory, behind `raft::Storage`.
//! * [`node`] — `RaftNode`: one member of the coordinators' Raft group; the ready loop,
//!   proposals, ReadIndex reads, snapshots, and the Raft traffic between coordinators.
//! * [`failure_verifier`] — `FailureVerifier`: on the leader, pings a reported server
//!   itself and declares it crashed if it stays silent (`Suspects`, its bookkeeping, is
//!   a plain struct).
//! * [`proof_of_death`] — when a crashed master's tablets may go live before its lease
//!   ran out: what proves its death under the `--proof-of-death` setting, and
//!   `lease_end`, the decision the recovery and the simulation share.
//! * [`recovery_manager`] — `RecoveryManager`: on the leader, recovers crashed masters (setup,
//!   partitioned replay on recovery masters, tablets live per partition, cleanup).
//! * `recovery_phases` — the decisions of a recovery as synchronous state machines: the
//!   phases of the whole (attempt, finish, clean up, wait, stop), the recovery masters
//!   tried for one partition and what a commit's outcome means, and the masters'
//!   confirmations of the end.
//! * [`recovery_plan`] — the pure planning steps of a recovery: log completeness,
//!   which replica of each segment to read, partitions, assignment.
//! * [`client_leases`] — `ClientLeases`: on the leader, when each open client last
//!   renewed its lease (kept in memory), and `ClientExpirer`, which commits the expiry
//!   of clients that stopped (`ExpireClients`), so masters may free their completion
//!   records.
//! * [`metrics`] — `CoordinatorMetrics`: Raft, configuration and recovery metrics for
//!   Prometheus, read when scraped.
//! * [`cluster_view`] — `ClusterView`: how the cluster stands (servers, tables,
//!   recoveries, and the problems an operator must fix), gathered over RPC from any
//!   coordinator or from outside.
//! * [`status_page`] — the HTML status page, its JSON (`/api/status`) and `/metrics`,
//!   served over HTTP by every coordinator.
//! * [`mover`] — `Mover`: on the leader, drives moves of tablets (begin, the target's
//!   copy, commit or abort, and telling both owners), and aborts open moves no drive of
//!   its own runs.
//! * [`collector`] — `Collector`: on the leader, frees on the backups the replicas of
//!   masters that are gone (recovered or drained) that a backup away at the time kept.
//! * [`drainer`] — `Drainer`: on the leader, drives drains of servers (their tablets
//!   moved away, the masters off their backups, then their removal).
//! * [`rebalance`] — `LoadBoard`: the masters' reported load and the rebalancer's
//!   decisions (which tablet to split or move), a plain synchronous struct;
//!   [`rebalancer`] — `Rebalancer`, on the leader, feeds it and carries them out.
//! * [`push`] — the coordinator's best-effort messages to masters about a committed
//!   change (server-list version, tablet changes), with a bounded retry.
//! * [`service`] — `CoordinatorService`: RPC handlers that propose commands through the
//!   node, serve linearizable reads, redirect clients to the leader, and push tablet
//!   ownership to masters.
//!
//! # Creating a table
//! A client sends `CreateTable{name, span}` to the leader (a follower answers `NotLeader`
//! naming it). The service proposes the command; once a majority of coordinators has it
//! durably, every member applies it: the state machine splits the key-hash space into
//! `span` equal tablets and assigns them round-robin over the live masters. The leader's
//! service then pushes `TakeTablets` (naming the owner and its tablet epoch) to each
//! owner and answers once every owner serves its tablets, so a client can use the table
//! as soon as `create_table` returns. A push that is lost costs nothing lasting: every
//! lease renewal tells a master its tablet epoch, and one behind pulls its tablets.
//!
//! # Recovering a crashed master
//! A server's pinger (or a client) reports a silent server with `ReportFailure`; the
//! leader pings it itself and commits `SetServerStatus{Crashed}` (see
//! [`failure_verifier`]). The recovery manager
//! then fences the master's replicas on every backup, checks that its log is complete,
//! has the backups read and split the replicas by partition, and sends each partition of
//! the master's will to a recovery master. As each one finishes, its tablets are handed
//! over through Raft (`RecoveredPartition`) and go live, once every lease the crashed
//! master held has lapsed or its death is proven ([`proof_of_death`]). See
//! [`recovery_manager`].
//!
//! # Membership
//! Static: every member is started with the same `--peers`, and a data directory belongs
//! to one member id for good (see docs/operating.md, "Replacing a coordinator").

pub mod client_leases;
pub mod cluster_view;
pub mod collector;
pub mod drainer;
pub mod failure_verifier;
pub mod metrics;
pub mod mover;
pub mod node;
pub mod proof_of_death;
pub mod push;
pub mod raft_storage;
pub mod rebalance;
pub mod rebalancer;
pub mod recovery_manager;
mod recovery_phases;
pub mod recovery_plan;
pub mod service;
pub mod state;
pub mod status_page;

pub use service::CoordinatorService;
pub use state::{Command, CommandResult, CoordinatorState};
