//! RESP2, the Redis serialization protocol: requests in, replies out. Pure functions
//! over bytes, tested alone; the connection loop (`gateway`) drives them.
//!
//! A request is an array of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`, what every
//! client library and `redis-cli` send) or an inline command (`GET k\r\n`, what a
//! person types into `telnet`). Every size is bounded ([`RequestLimits`]); a request
//! past a bound, or bytes that are not RESP, are a [`ProtocolError`]: the connection is
//! answered `-ERR Protocol error: ...` and closed, as Redis does (its stream cannot be
//! resynchronised).

use bytes::{Buf, Bytes, BytesMut};

/// Bounds on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most arguments (command name included).
    pub args_max: usize,
    /// Largest argument, in bytes.
    pub arg_bytes_max: usize,
    /// Longest inline command line.
    pub inline_bytes_max: usize,
    /// Most bytes of one request (all its arguments): what a connection may buffer.
    pub request_bytes_max: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            // MSET of 32,768 pairs.
            args_max: 65_537,
            // A value up to the cluster's largest (16 MiB) with room to spare.
            arg_bytes_max: 17 * 1024 * 1024,
            inline_bytes_max: 64 * 1024,
            // An MSET of 64 MiB; a client's query buffer is bounded by it.
            request_bytes_max: 64 * 1024 * 1024,
        }
    }
}

impl RequestLimits {
    /// What a connection may send before `AUTH` succeeds: an `AUTH` (with a user name)
    /// or a `QUIT`, nothing the size of data, so that unauthenticated connections cannot
    /// make the gateway buffer much (as Redis bounds them).
    pub const UNAUTHENTICATED: RequestLimits = RequestLimits {
        args_max: 3,
        arg_bytes_max: 1024,
        inline_bytes_max: 4096,
        request_bytes_max: 4096,
    };
}

/// Bytes that are not a RESP request, or one past a bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// Takes one whole request off the front of `buf`: `Ok(None)` while it is incomplete
/// (read more), `Ok(Some(args))` once whole (its bytes are consumed).
pub fn take_request(
    buf: &mut BytesMut,
    limits: &RequestLimits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let taken = take_request_unbounded(buf, limits)?;
    if taken.is_none() && buf.len() > limits.request_bytes_max {
        return Err(ProtocolError(format!(
            "request larger than {} bytes",
            limits.request_bytes_max
        )));
    }
    Ok(taken)
}

fn take_request_unbounded(
    buf: &mut BytesMut,
    limits: &RequestLimits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != b'*' {
        return take_inline(buf, limits);
    }
    let Some((count, mut at)) = line_number(buf, 0, limits.inline_bytes_max)? else {
        return Ok(None);
    };
    if count < 0 {
        // A null array: nothing to run.
        buf.advance(at);
        return Ok(Some(Vec::new()));
    }
    let count = count as usize;
    if count > limits.args_max {
        return Err(ProtocolError(format!(
            "{count} arguments, more than the {} allowed",
            limits.args_max
        )));
    }
    let mut spans = Vec::with_capacity(count);
    for _ in 0..count {
        match buf.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&other) => {
                return Err(ProtocolError(format!(
                    "expected '$', got '{}'",
                    char::from(other).escape_default()
                )))
            }
        }
        let Some((len, start)) = line_number(buf, at, 32)? else {
            return Ok(None);
        };
        if len < 0 || len as usize > limits.arg_bytes_max {
            return Err(ProtocolError(format!(
                "invalid bulk length {len} (at most {})",
                limits.arg_bytes_max
            )));
        }
        let end = start + len as usize;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError("bulk string not followed by CRLF".into()));
        }
        spans.push((start, end));
        at = end + 2;
    }
    let frame = buf.split_to(at).freeze();
    Ok(Some(
        spans
            .into_iter()
            .map(|(start, end)| frame.slice(start..end))
            .collect(),
    ))
}

/// The number on the line starting at `at` (after its one-byte type), and where the
/// next line starts; `None` while the line is incomplete.
fn line_number(
    buf: &[u8],
    at: usize,
    line_max: usize,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let rest = &buf[at + 1..];
    let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
        if rest.len() > line_max {
            return Err(ProtocolError("line too long".into()));
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&rest[..end])
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| ProtocolError("invalid length".into()))?;
    Ok(Some((text, at + 1 + end + 2)))
}

fn take_inline(
    buf: &mut BytesMut,
    limits: &RequestLimits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.inline_bytes_max {
            return Err(ProtocolError("too big inline request".into()));
        }
        return Ok(None);
    };
    let line = buf.split_to(end + 1).freeze();
    let text = line.slice(..end);
    let text = text.strip_suffix(b"\r").unwrap_or(&text);
    let args: Vec<Bytes> = text
        .split(|b| b.is_ascii_whitespace())
        .filter(|word| !word.is_empty())
        .map(Bytes::copy_from_slice)
        .collect();
    if args.len() > limits.args_max {
        return Err(ProtocolError("too many arguments".into()));
    }
    Ok(Some(args))
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(&'static str),
    /// `-ERR ...`: the text after the `-` (its first word is the error's kind).
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n ...` or the nil bulk string.
    Bulk(Option<Bytes>),
    /// `*n ...` or the nil array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// `+OK`.
    pub const OK: Reply = Reply::Simple("OK");

    /// An error reply of kind `ERR`.
    pub fn err(text: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {text}"))
    }

    /// A bulk string.
    pub fn bulk(bytes: impl Into<Bytes>) -> Reply {
        Reply::Bulk(Some(bytes.into()))
    }

    /// Appends the reply's bytes to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Reply::Simple(text) => {
                out.extend_from_slice(b"+");
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Error(text) => {
                out.extend_from_slice(b"-");
                // A line of its own: no CR or LF inside.
                let line: String = text
                    .chars()
                    .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
                    .collect();
                out.extend_from_slice(line.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Integer(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(bytes)) => {
                out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(Some(items)) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(bytes: &[u8]) -> (Result<Option<Vec<Bytes>>, ProtocolError>, usize) {
        let mut buf = BytesMut::from(bytes);
        let result = take_request(&mut buf, &RequestLimits::default());
        (result, buf.len())
    }

    #[test]
    fn arrays_of_bulk_strings_parse_and_pipeline() {
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n"[..]);
        let limits = RequestLimits::default();
        let first = take_request(&mut buf, &limits)
            .expect("valid")
            .expect("whole");
        assert_eq!(first, vec![Bytes::from("GET"), Bytes::from("k")]);
        let second = take_request(&mut buf, &limits)
            .expect("valid")
            .expect("whole");
        assert_eq!(second, vec![Bytes::from("PING")]);
        assert!(buf.is_empty());
        // Binary-safe: CRLF inside a bulk string is data.
        let (args, _) = take(b"*1\r\n$4\r\na\r\nb\r\n");
        assert_eq!(
            args.expect("valid").expect("whole"),
            vec![Bytes::from("a\r\nb")]
        );
    }

    #[test]
    fn a_partial_request_waits_for_more_and_consumes_nothing() {
        let whole = b"*2\r\n$3\r\nSET\r\n$5\r\nhello\r\n";
        for cut in 1..whole.len() {
            let (result, left) = take(&whole[..cut]);
            assert_eq!(result, Ok(None), "cut at {cut}");
            assert_eq!(left, cut);
        }
    }

    #[test]
    fn inline_commands_split_on_blanks() {
        let (args, left) = take(b"SET  k v\r\nGET");
        assert_eq!(
            args.expect("valid").expect("whole"),
            vec![Bytes::from("SET"), Bytes::from("k"), Bytes::from("v")]
        );
        assert_eq!(left, 3);
    }

    #[test]
    fn malformed_or_oversized_requests_are_protocol_errors() {
        for bad in [
            &b"*1\r\n:3\r\n"[..],
            b"*x\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$3\r\nabcd\r\n",
            b"*99999999\r\n",
            b"*1\r\n$999999999999\r\n",
        ] {
            let (result, _) = take(bad);
            assert!(result.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let limits = RequestLimits {
            inline_bytes_max: 8,
            ..RequestLimits::default()
        };
        let mut long = BytesMut::from(&b"GET aaaaaaaaaaaaaaa"[..]);
        assert!(take_request(&mut long, &limits).is_err());
        // Many arguments, each within bounds, but more bytes than a request may hold.
        let limits = RequestLimits {
            request_bytes_max: 64,
            ..RequestLimits::default()
        };
        let mut big = BytesMut::from(&b"*100\r\n"[..]);
        for _ in 0..10 {
            big.extend_from_slice(b"$10\r\n0123456789\r\n");
        }
        assert!(take_request(&mut big, &limits).is_err());
    }

    #[test]
    fn replies_encode_as_resp2() {
        let mut out = BytesMut::new();
        Reply::Array(Some(vec![
            Reply::OK,
            Reply::Integer(-3),
            Reply::bulk("v"),
            Reply::Bulk(None),
            Reply::err("bad\r\nthing"),
            Reply::Array(None),
        ]))
        .encode(&mut out);
        assert_eq!(
            &out[..],
            b"*6\r\n+OK\r\n:-3\r\n$1\r\nv\r\n$-1\r\n-ERR bad  thing\r\n*-1\r\n"
        );
    }
}
