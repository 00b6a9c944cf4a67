//! `rampart-gateway`: a Redis-protocol (RESP2) front door to one Rampart table, so that
//! `redis-cli`, `redis-benchmark` and Redis client libraries reach the cluster.
//!
//! It runs as its own process (`rampart gateway`), not inside a storage server: it
//! holds no data (every key goes through the client library to the master that owns
//! it, and every acknowledged write is on R backups), so it can run beside the
//! applications, in any number, and be restarted without a recovery; and its CPU does
//! not compete with a master's. `cluster up` starts one.
//!
//! # Modules
//! * [`resp`] — RESP2 requests and replies, pure and bounded.
//! * [`commands`] — the commands served, parsed and checked (pure).
//! * [`gateway`] — [`Gateway`], the listener and connection loop over a `Client`.

pub mod commands;
pub mod gateway;
pub mod resp;

pub use gateway::Gateway;
