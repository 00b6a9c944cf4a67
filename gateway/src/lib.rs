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
//! * [`resp`] — RESP2 requests and replies, pure and bounded; [`resp::RequestParser`]
//!   takes requests off a connection's input, resuming one that arrives in pieces.
//! * [`commands`] — the commands served, parsed and checked (pure).
//! * [`glob`] — `MATCH` patterns, in time linear in pattern × key.
//! * [`scan`] — [`scan::ScanWalk`], how much of the table one `SCAN` call examines.
//! * [`pipeline`] — which pipelined commands go to the masters together (pure).
//! * [`peer_connections`] — [`peer_connections::PeerConnections`], connections per
//!   peer address, capped.
//! * [`gateway`] — [`Gateway`], the listener and connection loop over a `Client`, and
//!   [`ConnectionLimits`], what one connection may hold and for how long.

pub mod commands;
pub mod gateway;
pub mod glob;
pub mod peer_connections;
pub mod pipeline;
pub mod resp;
pub mod scan;

#[cfg(test)]
mod fake_cluster;

pub use gateway::{ConnectionLimits, Gateway};
