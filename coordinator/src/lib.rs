//! `rampart-coordinator`: the cluster configuration (DESIGN.md §7), replicated by Raft.
//!
//! * [`state`] — `CoordinatorState`: the deterministic state machine of servers,
//!   tables and tablets; `apply(command) -> result`, no I/O.
//! * [`raft_storage`] — `RaftStorage`: the durable Raft log (entries, hard state, conf
//!   state, snapshot) in a `raft-engine` directory, behind `raft::Storage`.
//! * [`node`] — `RaftNode`: one member of the coordinators' Raft group; the ready loop,
//!   proposals, ReadIndex reads, snapshots, and the Raft traffic between coordinators.
//! * [`service`] — `CoordinatorService`: RPC handlers that propose commands through the
//!   node, serve linearizable reads, redirect clients to the leader, and push tablet
//!   ownership to masters.
//!
//! # Creating a table
//! A client sends `CreateTable{name, span}` to the leader (a follower answers `NotLeader`
//! naming it). The service proposes the command; once a majority of coordinators has it
//! durably, every member applies it: the state machine splits the key-hash space into
//! `span` equal tablets and assigns them round-robin over the live masters. The leader's
//! service then pushes `TakeTablets` to each owner and answers once every owner serves its
//! tablets, so a client can use the table as soon as `create_table` returns.
//!
//! # Membership
//! Static: every member is started with the same `--peers`, and a data directory belongs
//! to one member id for good (see the README on replacing a coordinator).

pub mod node;
pub mod raft_storage;
pub mod service;
pub mod state;

pub use service::CoordinatorService;
pub use state::{Command, CommandResult, CoordinatorState};
