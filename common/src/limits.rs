//! Limits that are part of the protocol, with the reason for each.
//!
//! Limits a deployment may tune (value size, segment size, memory) live in
//! [`crate::config`]; the ones here bound what any peer may send, so they are constants.

/// Largest key, in bytes (docs/design.md §3). Keys are held in full in log entries and RPCs.
pub const KEY_BYTES_MAX: usize = 64 * 1024;

/// Default largest value (docs/design.md §3); servers may configure a different one up to
/// [`VALUE_BYTES_LIMIT`].
pub const VALUE_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// The most any server may configure as its largest value: a value must fit in one
/// segment with its key, and segments stay ≤ 64 MiB so replicas move in one piece.
pub const VALUE_BYTES_LIMIT: usize = 16 * 1024 * 1024;

/// Largest RPC payload. One multi-op request or enumerate page must fit; a peer that
/// announces more is answered `MessageTooLarge` and its connection is closed (its stream
/// cannot be resynchronised without reading the oversized payload).
pub const RPC_PAYLOAD_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Most objects in one multi_read / multi_write / multi_remove request.
pub const MULTI_OPS_MAX: usize = 4096;

/// Bytes of values one multi-read reply may carry; the objects past it are answered
/// `Retry` and the client asks for them again, so a reply stays below the payload limit
/// whatever the values' sizes. The first object is always served, so reads progress.
pub const MULTI_READ_REPLY_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Bytes of keys and values a client puts in one multi-write request (it splits larger
/// batches), keeping requests below the payload limit.
pub const MULTI_WRITE_REQUEST_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Requests one connection may have in flight on a server; further requests wait to be
/// read until one finishes (back-pressure onto the peer's socket).
pub const RPC_IN_FLIGHT_PER_CONNECTION_MAX: usize = 256;

/// Connections a server accepts at once; further ones wait in the listen backlog.
pub const RPC_CONNECTIONS_MAX: usize = 4096;

/// Bytes an enumerate page may carry, so a page stays well below the payload limit.
pub const ENUMERATE_PAGE_BYTES_MAX: usize = 4 * 1024 * 1024;

const _: () = assert!(KEY_BYTES_MAX + VALUE_BYTES_LIMIT + 4096 < RPC_PAYLOAD_BYTES_MAX);
const _: () =
    assert!(ENUMERATE_PAGE_BYTES_MAX + KEY_BYTES_MAX + VALUE_BYTES_LIMIT < RPC_PAYLOAD_BYTES_MAX);
const _: () = assert!(
    MULTI_READ_REPLY_BYTES_MAX + VALUE_BYTES_LIMIT + MULTI_OPS_MAX * 32 < RPC_PAYLOAD_BYTES_MAX
);
// Each object of a multi-write costs about 60 bytes besides its key and value (table,
// reject rules, exactly-once identity, length prefixes).
const _: () = assert!(
    MULTI_WRITE_REQUEST_BYTES_MAX + KEY_BYTES_MAX + VALUE_BYTES_LIMIT + MULTI_OPS_MAX * 128
        < RPC_PAYLOAD_BYTES_MAX
);
