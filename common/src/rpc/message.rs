//! How messages become payloads.
//!
//! Control messages are serde types encoded with bincode (fixed-width little-endian
//! integers, a size limit on decode so a hostile length prefix cannot make us allocate
//! gigabytes). Hot-path messages (read, write) implement [`WireMessage`] by hand so
//! that keys and values travel as raw bytes and decode as zero-copy slices of the
//! received frame.

use bytes::{Bytes, BytesMut};

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
    const OPCODE: super::Opcode;
    /// The RPC's name, for errors and logs.
    const NAME: &'static str;
    /// What the caller sends.
    type Request: WireMessage;
    /// What a successful call returns.
    type Reply: WireMessage;
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
            impl $crate::rpc::WireMessage for $ty {
                fn encode(&self, out: &mut ::bytes::BytesMut) {
                    $crate::rpc::message::encode_bincode(self, out)
                }
                fn decode(payload: ::bytes::Bytes) -> Result<Self, $crate::rpc::DecodeError> {
                    $crate::rpc::message::decode_bincode(&payload)
                }
            }
        )*
    };
}

bincode_message!(());
