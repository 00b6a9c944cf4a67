//! `rampart-coordinator`: the cluster configuration (DESIGN.md §7).
//!
//! * [`state`] — `CoordinatorState`: the deterministic state machine of servers,
//!   tables and tablets; `apply(command) -> result`, no I/O.
//! * [`raft_storage`] — `RaftStorage`: the durable Raft log (entries, hard state, conf
//!   state, snapshot) in a `raft-engine` directory, behind `raft::Storage`.
//! * [`service`] — `CoordinatorService`: RPC handlers that apply commands and push
//!   tablet ownership to masters.
//!
//! # Creating a table
//! A client sends `CreateTable{name, span}`. The service applies the command: the state
//! machine splits the key-hash space into `span` equal tablets and assigns them
//! round-robin over the live masters. The service then pushes `TakeTablets` to each
//! owner and answers once every owner serves its tablets, so a client can use the table
//! as soon as `create_table` returns.
//!
//! This issue runs one coordinator process; the state machine is written so that a
//! later issue replicates its commands through Raft without changing it.

pub mod raft_storage;
pub mod service;
pub mod state;

pub use service::CoordinatorService;
pub use state::{Command, CommandResult, CoordinatorState};
