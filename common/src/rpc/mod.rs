//! The RPC layer of DESIGN.md §8: length-prefixed frames over TCP with many RPCs in
//! flight per connection, matched by rpc id.
//!
//! * [`frame`] — the 20-byte frame header and its codec.
//! * [`message`] — [`Rpc`] (an opcode with its request and reply types) and
//!   [`WireMessage`] (how a message becomes payload bytes).
//! * [`connection`] — the client side: one multiplexed connection, calls with
//!   deadlines, and [`RpcPool`] that reuses one connection per peer.
//! * [`server`] — the server side: accepts connections, reads frames, runs a
//!   [`Service`] per request and writes replies.
//! * [`stats`] — what the server counts of each request (opcode, status, latency), in
//!   plain atomics; `crate::metrics` names and serves them.
//!
//! The layer knows no RPC of its own: the messages are the `protocol` module's, which
//! builds on this module (never the other way round), and calls that must find the
//! coordinators' leader are `coordinator_set`'s.
//!
//! # Failure handling
//! A peer that sends garbage (bad magic, a reply where a request belongs) gets its
//! connection closed; an oversized payload gets a `MessageTooLarge` reply and then the
//! close (its stream cannot be resynchronised); an unknown opcode or an undecodable
//! payload gets an error reply and the connection stays open. None of these panic or
//! stall other connections. On the client side a lost connection fails every call in
//! flight on it at once with [`RpcError::ConnectionLost`], and the pool dials anew on
//! the next call.

pub mod connection;
pub mod frame;
pub mod message;
pub mod server;
pub mod stats;
#[cfg(test)]
mod tests;

pub use connection::{Connection, RpcPool};
pub use frame::{FrameHeader, Opcode, FRAME_HEADER_BYTES, FRAME_MAGIC};
pub use message::{DecodeError, Rpc, WireMessage};
pub use server::{Reply, RpcServer, Service};

use crate::status::Status;
use std::time::Duration;

/// Default deadline of one RPC when the caller sets none.
pub const RPC_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// How long dialling a peer may take before the call fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why an RPC did not produce a reply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The peer could not be reached.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// The peer.
        addr: String,
        /// What the OS said.
        reason: String,
    },
    /// The request never reached the peer whole (the connection broke or was found
    /// broken before the frame was written out); the peer did not execute it.
    #[error("request to {addr} not sent: {reason}")]
    NotSent {
        /// The peer.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The connection broke while the call was in flight; the request may or may not
    /// have been executed.
    #[error("connection to {addr} lost")]
    ConnectionLost {
        /// The peer.
        addr: String,
    },
    /// No reply before the deadline; the request may or may not have been executed.
    #[error("rpc {} to {addr} timed out", if rpc.is_empty() { opcode.to_string() } else { rpc.to_string() })]
    Timeout {
        /// The peer.
        addr: String,
        /// The call.
        opcode: Opcode,
        /// Its name ([`Rpc::NAME`]); empty for an untyped call.
        rpc: &'static str,
    },
    /// The peer answered with an error status.
    #[error("{addr} answered {status}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Status {
        /// The peer.
        addr: String,
        /// The status.
        status: Status,
        /// The peer's explanation, if any.
        detail: String,
    },
    /// The reply could not be decoded.
    #[error("undecodable reply from {addr}: {error}")]
    Decode {
        /// The peer.
        addr: String,
        /// What was wrong.
        error: DecodeError,
    },
}

impl RpcError {
    /// The status the peer answered, if it answered one.
    pub fn status(&self) -> Option<Status> {
        match self {
            RpcError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the peer may have executed the request although no reply came (the
    /// frame was sent whole, then the connection broke or the deadline passed).
    pub fn may_have_executed(&self) -> bool {
        matches!(
            self,
            RpcError::ConnectionLost { .. } | RpcError::Timeout { .. }
        )
    }

    /// Whether the peer is unreachable or broke mid-call (as opposed to answering).
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            RpcError::Connect { .. }
                | RpcError::NotSent { .. }
                | RpcError::ConnectionLost { .. }
                | RpcError::Timeout { .. }
        )
    }
}
