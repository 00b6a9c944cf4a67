//! The RPC layer of docs/design.md §8: length-prefixed frames over TCP with many RPCs in
//! flight per connection, matched by rpc id.
//!
//! * [`frame`] — the 20-byte frame header and its codec.
//! * [`message`] — [`Rpc`] (an opcode with its request and reply types) and
//!   [`WireMessage`] (how a message becomes payload bytes).
//! * [`connection`] — the client side: one multiplexed connection, calls with
//!   deadlines, and [`RpcPool`] that reuses one connection per peer.
//! * [`server`] — the server side: accepts connections, reads frames, runs a
//!   [`Service`] per request and writes replies.
//! * [`router`] — [`Router`]: a service's table from opcode to typed handler, which
//!   decodes each request as its [`Rpc`] says and encodes the handler's reply.
//! * [`stats`] — what the server counts of each request (opcode, status, latency), in
//!   plain atomics; `crate::metrics` names and serves them.
//! * [`error`] — [`RpcError`], why a call produced no reply, and the default deadlines.
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
pub mod error;
pub mod frame;
pub mod message;
pub mod router;
pub mod server;
pub mod stats;
#[cfg(test)]
mod tests;

pub use connection::{Connection, RpcPool};
pub use error::{RpcError, CONNECT_TIMEOUT, RPC_TIMEOUT_DEFAULT};
pub use frame::{FrameHeader, Opcode, FRAME_HEADER_BYTES, FRAME_MAGIC};
pub use message::{DecodeError, Rpc, WireMessage};
pub use router::{RouteFuture, Router};
pub use server::{Reply, RpcServer, Service};
