//! A small RESP2 client for the benchmarks that compare Rampart with Redis (`bench
//! compare`): requests encoded as arrays of bulk strings, replies parsed by
//! [`take_reply`] (pure, tested alone), one request in flight per connection (a
//! closed-loop benchmark client needs no more).
//!
//! Limits: a reply is at most [`REPLY_BYTES_MAX`] (bulk strings and arrays included);
//! every call has a deadline ([`RespConnection::call`]).

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BytesMut};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest reply accepted.
pub const REPLY_BYTES_MAX: usize = 64 * 1024 * 1024;

/// How deeply arrays may nest in a reply.
const NESTING_MAX: usize = 8;

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+text`.
    Simple(String),
    /// `-text`.
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n ...`, or nil.
    Bulk(Option<Vec<u8>>),
    /// `*n ...`, or nil.
    Array(Option<Vec<Value>>),
}

/// Appends `args` as a RESP request (an array of bulk strings).
pub fn encode_request(args: &[&[u8]], out: &mut BytesMut) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Takes one whole reply off the front of `buf`; `Ok(None)` until it has arrived.
pub fn take_reply(buf: &mut BytesMut) -> Result<Option<Value>> {
    let mut at = 0;
    match parse(buf, &mut at, 0)? {
        Some(value) => {
            buf.advance(at);
            Ok(Some(value))
        }
        None if buf.len() > REPLY_BYTES_MAX => bail!("reply over {REPLY_BYTES_MAX} bytes"),
        None => Ok(None),
    }
}

/// The line at `*at` (without CRLF), moving `*at` past it; `None` if incomplete.
fn line<'a>(buf: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = &buf[*at..];
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    *at += end + 2;
    Some(&rest[..end])
}

fn number(text: &[u8]) -> Result<i64> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| anyhow!("bad number {:?} in a reply", String::from_utf8_lossy(text)))
}

fn parse(buf: &[u8], at: &mut usize, depth: usize) -> Result<Option<Value>> {
    if depth > NESTING_MAX {
        bail!("reply nested deeper than {NESTING_MAX}");
    }
    let Some(&kind) = buf.get(*at) else {
        return Ok(None);
    };
    *at += 1;
    let Some(text) = line(buf, at) else {
        return Ok(None);
    };
    let text_string = || String::from_utf8_lossy(text).into_owned();
    Ok(Some(match kind {
        b'+' => Value::Simple(text_string()),
        b'-' => Value::Error(text_string()),
        b':' => Value::Integer(number(text)?),
        b'$' => {
            let len = number(text)?;
            if len < 0 {
                return Ok(Some(Value::Bulk(None)));
            }
            let len = usize::try_from(len)?;
            if len > REPLY_BYTES_MAX {
                bail!("bulk string of {len} bytes in a reply");
            }
            if buf.len() < *at + len + 2 {
                return Ok(None);
            }
            let bytes = buf[*at..*at + len].to_vec();
            if &buf[*at + len..*at + len + 2] != b"\r\n" {
                bail!("bulk string not followed by CRLF");
            }
            *at += len + 2;
            Value::Bulk(Some(bytes))
        }
        b'*' => {
            let count = number(text)?;
            if count < 0 {
                return Ok(Some(Value::Array(None)));
            }
            let count = usize::try_from(count)?;
            if count > REPLY_BYTES_MAX / 4 {
                bail!("array of {count} items in a reply");
            }
            let mut items = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                match parse(buf, at, depth + 1)? {
                    Some(item) => items.push(item),
                    None => return Ok(None),
                }
            }
            Value::Array(Some(items))
        }
        other => bail!("reply starts with {:?}, not a RESP type", other as char),
    }))
}

/// One connection to a RESP server.
#[derive(Debug)]
pub struct RespConnection {
    addr: String,
    stream: TcpStream,
    input: BytesMut,
    output: BytesMut,
}

impl RespConnection {
    /// Dials `addr`.
    pub async fn connect(addr: &str) -> Result<RespConnection> {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow!("connecting to {addr} timed out"))?
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(RespConnection {
            addr: addr.to_string(),
            stream,
            input: BytesMut::with_capacity(16 * 1024),
            output: BytesMut::with_capacity(16 * 1024),
        })
    }

    /// Sends `args` and waits for the reply, within `timeout`. An error reply is
    /// returned as [`Value::Error`], not as `Err`.
    pub async fn call(&mut self, args: &[&[u8]], timeout: Duration) -> Result<Value> {
        self.output.clear();
        encode_request(args, &mut self.output);
        let exchange = async {
            self.stream.write_all(&self.output).await?;
            loop {
                if let Some(value) = take_reply(&mut self.input)? {
                    return Ok(value);
                }
                if self.stream.read_buf(&mut self.input).await? == 0 {
                    bail!("connection closed");
                }
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| anyhow!("{} did not answer within {timeout:?}", self.addr))?
            .with_context(|| format!("RESP call to {}", self.addr))
    }

    /// [`call`](Self::call), failing on an error reply.
    pub async fn call_ok(&mut self, args: &[&[u8]], timeout: Duration) -> Result<Value> {
        match self.call(args, timeout).await? {
            Value::Error(text) => bail!(
                "{} answered {:?}: {text}",
                self.addr,
                String::from_utf8_lossy(args[0])
            ),
            value => Ok(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_whole_or_wait_for_more() {
        let whole = b"+OK\r\n-ERR no\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n$1\r\nx\r\n:1\r\n*-1\r\n";
        let mut buf = BytesMut::from(&whole[..]);
        let expected = [
            Value::Simple("OK".into()),
            Value::Error("ERR no".into()),
            Value::Integer(42),
            Value::Bulk(Some(b"abc".to_vec())),
            Value::Bulk(None),
            Value::Array(Some(vec![
                Value::Bulk(Some(b"x".to_vec())),
                Value::Integer(1),
            ])),
            Value::Array(None),
        ];
        for value in expected {
            assert_eq!(take_reply(&mut buf).expect("valid"), Some(value));
        }
        assert!(buf.is_empty());
        // Every prefix of a reply is incomplete, never an error, and consumes nothing.
        let reply = b"*2\r\n$5\r\nhello\r\n:7\r\n";
        for cut in 0..reply.len() {
            let mut partial = BytesMut::from(&reply[..cut]);
            assert_eq!(
                take_reply(&mut partial).expect("a prefix"),
                None,
                "cut {cut}"
            );
            assert_eq!(partial.len(), cut);
        }
    }

    #[test]
    fn requests_are_arrays_of_bulk_strings_and_garbage_is_an_error() {
        let mut out = BytesMut::new();
        encode_request(&[b"SET", b"k", b"v v"], &mut out);
        assert_eq!(&out[..], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv v\r\n");
        assert!(take_reply(&mut BytesMut::from(&b"?what\r\n"[..])).is_err());
        assert!(take_reply(&mut BytesMut::from(&b":x\r\n"[..])).is_err());
        assert!(take_reply(&mut BytesMut::from(&b"$2\r\nabcd\r\n"[..])).is_err());
    }
}
