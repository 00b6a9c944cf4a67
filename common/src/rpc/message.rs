//! How messages become payloads.
//!
//! Control messages are serde types encoded with bincode (fixed-width little-endian
//! integers, a size limit on decode so a hostile length prefix cannot make us allocate
//! gigabytes). Hot-path messages (read, write, and the pieces a recovery fetches)
//! implement [`WireMessage`] by hand, with [`Cursor`], so that keys, values and log
//! entries travel as raw bytes and decode as zero-copy slices of the received frame.

use bytes::{Buf, Bytes, BytesMut};

/// A message that can be a request or reply payload.
pub trait WireMessage: Sized + Send + 'static {
    /// Appends the encoded message to `out`.
    fn encode(&self, out: &mut BytesMut);
    /// Decodes a whole payload.
    fn decode(payload: Bytes) -> Result<Self, DecodeError>;
}

/// One RPC: its opcode and message types. Implemented by zero-sized marker types in
/// the `protocol` module.
pub trait Rpc {
    /// The wire opcode.
    const OPCODE: super::frame::Opcode;
    /// The RPC's name, for errors and logs.
    const NAME: &'static str;
    /// What the caller sends.
    type Request: WireMessage;
    /// What a successful call returns.
    type Reply: WireMessage;
}

/// Bounds-checked reader over a payload that hands out zero-copy slices, for the
/// messages that implement [`WireMessage`] by hand. Integers are little-endian; `what`
/// names the field in the error of a payload that ends inside it.
#[derive(Debug)]
pub struct Cursor(Bytes);

/// A payload that ended inside `what`.
fn ends_inside(what: &str) -> DecodeError {
    DecodeError(format!("payload ends inside {what}"))
}

impl Cursor {
    /// A cursor at the start of `payload`.
    pub fn new(payload: Bytes) -> Cursor {
        Cursor(payload)
    }

    /// The next 8 bytes.
    pub fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        self.0.try_get_u64_le().map_err(|_| ends_inside(what))
    }

    /// The next 4 bytes.
    pub fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        self.0.try_get_u32_le().map_err(|_| ends_inside(what))
    }

    /// The next 2 bytes.
    pub fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        self.0.try_get_u16_le().map_err(|_| ends_inside(what))
    }

    /// The next byte.
    pub fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        self.0.try_get_u8().map_err(|_| ends_inside(what))
    }

    /// The next `len` bytes, sharing the payload's buffer.
    pub fn bytes(&mut self, len: usize, what: &str) -> Result<Bytes, DecodeError> {
        if self.0.remaining() < len {
            return Err(ends_inside(what));
        }
        Ok(self.0.split_to(len))
    }

    /// Everything left, sharing the payload's buffer.
    pub fn rest(self) -> Bytes {
        self.0
    }

    /// Ok if nothing is left.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.0.has_remaining() {
            return Err(DecodeError(format!(
                "{} trailing bytes",
                self.0.remaining()
            )));
        }
        Ok(())
    }
}

/// A payload that does not decode as the expected message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct DecodeError(pub String);

/// The wire encoding: fixed-width little-endian integers, no trailing bytes.
fn bincode_encoding() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .reject_trailing_bytes()
}

/// Encodes a serde message with the protocol's bincode options.
///
/// No size limit applies here: an oversized message is caught once, where its frame is
/// built (a request is refused before sending, a reply becomes `MessageTooLarge`).
/// With bincode's limit on encoding too, an oversized reply failed to serialise, and
/// the `expect` below turned that into a panic.
pub fn encode_bincode<T: serde::Serialize>(value: &T, out: &mut BytesMut) {
    use bincode::Options;
    use bytes::BufMut;
    // Without a limit, serialising plain data into memory fails only for types serde
    // cannot represent in bincode (`serialize_any` is never used), so an error here is
    // a programmer error in a protocol type.
    bincode_encoding()
        .serialize_into((&mut *out).writer(), value)
        .expect("protocol types always serialise");
}

/// Decodes a serde message with the protocol's bincode options, refusing length
/// prefixes that would allocate past the payload limit.
pub fn decode_bincode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, DecodeError> {
    use bincode::Options;
    bincode_encoding()
        .with_limit(crate::limits::RPC_PAYLOAD_BYTES_MAX as u64)
        .deserialize(payload)
        .map_err(|e| DecodeError(e.to_string()))
}

/// Implements [`WireMessage`] with bincode for serde types.
#[macro_export]
macro_rules! bincode_message {
    ($($ty:ty),* $(,)?) => {
        $(
            impl $crate::rpc::message::WireMessage for $ty {
                fn encode(&self, out: &mut ::bytes::BytesMut) {
                    $crate::rpc::message::encode_bincode(self, out)
                }
                fn decode(payload: ::bytes::Bytes) -> Result<Self, $crate::rpc::message::DecodeError> {
                    $crate::rpc::message::decode_bincode(&payload)
                }
            }
        )*
    };
}

bincode_message!(());
