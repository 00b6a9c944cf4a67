//! The frame header: every request and reply is `header ‖ payload`.
//!
//! ```text
//! offset  size  field
//!      0     4  magic      0x504D_4152 ("RAMP" read as bytes), little-endian
//!      4     2  opcode     which RPC
//!      6     2  status     0 in requests; the reply's Status code in replies
//!      8     8  rpc id     chosen by the caller, echoed in the reply
//!     16     4  length     payload bytes that follow
//! ```
//! Requests and replies share one layout; which one a frame is follows from the
//! direction of the connection. The high bit of the opcode marks replies, so a peer
//! that mixes them up is caught.

use crate::status::Status;
use bytes::{Buf, BufMut};
use std::fmt;

/// Bytes of the frame header.
pub const FRAME_HEADER_BYTES: usize = 20;

/// First four bytes of every frame: "RAMP".
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"RAMP");

/// Bit set in the opcode of every reply frame.
const REPLY_BIT: u16 = 0x8000;

/// An RPC's opcode. Values are stable wire constants (see the `protocol` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Opcode(pub u16);

/// The number: this layer knows no RPC by name (`protocol::opcode_name` does;
/// a typed call's errors carry [`Rpc::NAME`](super::Rpc::NAME)).
impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "opcode {}", self.0)
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Which RPC.
    pub opcode: Opcode,
    /// Whether this frame is a reply.
    pub is_reply: bool,
    /// `Ok` in requests; the outcome in replies.
    pub status: Status,
    /// Matches a reply to its request.
    pub rpc_id: u64,
    /// Payload bytes that follow the header.
    pub payload_len: u32,
}

/// Why a header is not acceptable; the connection that sent it is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame does not start with [`FRAME_MAGIC`].
    #[error("bad frame magic {0:#010x}")]
    BadMagic(u32),
}

impl FrameHeader {
    /// Writes the header into `out[..FRAME_HEADER_BYTES]`.
    pub fn write_to(&self, mut out: &mut [u8]) {
        assert!(
            out.len() >= FRAME_HEADER_BYTES,
            "frame header buffer too small"
        );
        out.put_u32_le(FRAME_MAGIC);
        let reply_bit = if self.is_reply { REPLY_BIT } else { 0 };
        out.put_u16_le(self.opcode.0 | reply_bit);
        out.put_u16_le(self.status.code());
        out.put_u64_le(self.rpc_id);
        out.put_u32_le(self.payload_len);
    }

    /// Reads a header from the first [`FRAME_HEADER_BYTES`] of `bytes`.
    pub fn read_from(mut bytes: &[u8]) -> Result<FrameHeader, FrameError> {
        assert!(
            bytes.len() >= FRAME_HEADER_BYTES,
            "frame header needs 20 bytes"
        );
        let magic = bytes.get_u32_le();
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let opcode = bytes.get_u16_le();
        let status = Status::from_code(bytes.get_u16_le());
        let rpc_id = bytes.get_u64_le();
        let payload_len = bytes.get_u32_le();
        Ok(FrameHeader {
            opcode: Opcode(opcode & !REPLY_BIT),
            is_reply: opcode & REPLY_BIT != 0,
            status,
            rpc_id,
            payload_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let header = FrameHeader {
            opcode: Opcode(42),
            is_reply: true,
            status: Status::WrongVersion,
            rpc_id: u64::MAX - 3,
            payload_len: 1234,
        };
        let mut buf = [0u8; FRAME_HEADER_BYTES];
        header.write_to(&mut buf);
        assert_eq!(FrameHeader::read_from(&buf), Ok(header));
    }

    #[test]
    fn header_with_bad_magic_is_refused() {
        let buf = [0xAAu8; FRAME_HEADER_BYTES];
        assert!(matches!(
            FrameHeader::read_from(&buf),
            Err(FrameError::BadMagic(_))
        ));
    }
}
