//! [`RpcError`]: why an RPC produced no reply; and the default deadlines.

use super::frame::Opcode;
use super::message::DecodeError;
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
        /// The peer's host answered the attempt with a refusal (`ECONNREFUSED`): nothing
        /// listened on the port, or a firewall rule rejected it (see
        /// `coordinator::proof_of_death` for what that proves).
        refused: bool,
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
        /// Its name ([`Rpc::NAME`](super::message::Rpc::NAME)); empty for an untyped call.
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

    /// Whether dialling the peer was refused (`ECONNREFUSED`).
    pub fn refused(&self) -> bool {
        matches!(self, RpcError::Connect { refused: true, .. })
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
