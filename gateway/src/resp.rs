//! RESP2, the Redis serialization protocol: requests in ([`RequestParser`], which
//! resumes a request arriving over many reads), replies out ([`Reply`]). Pure code over
//! bytes, tested alone; the connection loop (`gateway`) drives it.
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

/// Longest line holding a number (an array's count, a bulk string's length): a sign,
/// 19 digits and room to spare. Longer is not a number: a protocol error.
pub const NUMBER_LINE_BYTES_MAX: usize = 32;

/// Takes requests off the front of a connection's input buffer, one at a time, keeping
/// its progress through a request that has not fully arrived.
///
/// A request split over many reads (a 64 MiB `MSET` arrives in thousands) is parsed
/// once: each call resumes where the last one stopped (the arguments already found, or
/// how far an inline line was searched for its end), and while a bulk string's bytes
/// are still arriving a call costs nothing until the buffer holds all of them
/// ([`RequestParser::bytes_wanted`] says how many, so the reader can reserve room for
/// them). Re-parsing from the request's start on every read cost time quadratic in the
/// number of reads.
///
/// # Contract
/// Between calls the caller only appends to the buffer; the parser alone takes bytes
/// off its front (a whole request at a time). Positions it keeps are offsets from the
/// front, which stays put until the request is taken. The limits passed may change
/// only between requests.
#[derive(Debug, Default)]
pub struct RequestParser {
    progress: Progress,
    /// Bytes the buffer must hold before the parse can go on (the end of the bulk
    /// string being read, with its CRLF); 0 when unknown.
    needed: usize,
    /// Bytes searched for line ends since the parser was made (what a re-parse from the
    /// start would multiply): for the tests.
    examined: u64,
}

/// How far the request at the front of the buffer has been parsed.
#[derive(Debug, Default)]
enum Progress {
    /// Its type byte not seen yet.
    #[default]
    Start,
    /// An inline command: its first `searched` bytes hold no LF.
    Inline {
        /// Bytes already searched.
        searched: usize,
    },
    /// An array of `count` bulk strings: those found, as spans of the buffer, and where
    /// the next one starts.
    Array {
        /// Its arguments' count.
        count: usize,
        /// The arguments found so far.
        spans: Vec<(usize, usize)>,
        /// Where the next argument's `$` line starts.
        at: usize,
    },
}

impl RequestParser {
    /// Takes one whole request off the front of `buf`: `Ok(None)` while it is
    /// incomplete (read more, appending to `buf`), `Ok(Some(args))` once whole (its
    /// bytes are consumed; an empty `args` for a null array or a blank line: nothing
    /// to run).
    pub fn take(
        &mut self,
        buf: &mut BytesMut,
        limits: &RequestLimits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let taken = self.parse(buf, limits);
        if !matches!(taken, Ok(None)) {
            // Taken, or the connection is done: the next request starts afresh.
            self.progress = Progress::Start;
            self.needed = 0;
        }
        let taken = taken?;
        // Incomplete: every byte in `buf` belongs to this request.
        if taken.is_none() && buf.len().max(self.needed) > limits.request_bytes_max {
            return Err(ProtocolError(format!(
                "request larger than {} bytes",
                limits.request_bytes_max
            )));
        }
        Ok(taken)
    }

    /// Bytes the request being parsed still needs at least before the parse can go on
    /// (the rest of a bulk string), given that `buf_len` are buffered; 0 when unknown.
    pub fn bytes_wanted(&self, buf_len: usize) -> usize {
        self.needed.saturating_sub(buf_len)
    }

    fn parse(
        &mut self,
        buf: &mut BytesMut,
        limits: &RequestLimits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        if buf.len() < self.needed {
            return Ok(None);
        }
        if let Progress::Start = self.progress {
            self.progress = match buf.first() {
                None => return Ok(None),
                Some(b'*') => {
                    let Some((count, at)) = self.line_number(buf, 0)? else {
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
                    Progress::Array {
                        count,
                        // Grown as arguments arrive, not from the claimed count.
                        spans: Vec::new(),
                        at,
                    }
                }
                Some(_) => Progress::Inline { searched: 0 },
            };
        }
        match &mut self.progress {
            Progress::Start => Ok(None),
            Progress::Inline { searched } => {
                let from = *searched;
                let Some(end) = buf[from..].iter().position(|&b| b == b'\n') else {
                    self.examined += (buf.len() - from) as u64;
                    *searched = buf.len();
                    if buf.len() > limits.inline_bytes_max {
                        return Err(ProtocolError("too big inline request".into()));
                    }
                    return Ok(None);
                };
                self.examined += (end + 1) as u64;
                take_inline(buf, from + end, limits).map(Some)
            }
            Progress::Array { count, spans, at } => {
                while spans.len() < *count {
                    match buf.get(*at) {
                        None => return Ok(None),
                        Some(b'$') => {}
                        Some(&other) => {
                            return Err(ProtocolError(format!(
                                "expected '$', got '{}'",
                                char::from(other).escape_default()
                            )))
                        }
                    }
                    let Some((len, start)) = line_number(buf, *at, &mut self.examined)? else {
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
                        self.needed = end + 2;
                        return Ok(None);
                    }
                    if &buf[end..end + 2] != b"\r\n" {
                        return Err(ProtocolError("bulk string not followed by CRLF".into()));
                    }
                    spans.push((start, end));
                    *at = end + 2;
                }
                let frame = buf.split_to(*at).freeze();
                Ok(Some(
                    spans
                        .iter()
                        .map(|&(start, end)| frame.slice(start..end))
                        .collect(),
                ))
            }
        }
    }

    fn line_number(
        &mut self,
        buf: &[u8],
        at: usize,
    ) -> Result<Option<(i64, usize)>, ProtocolError> {
        line_number(buf, at, &mut self.examined)
    }
}

/// The number on the line starting at `at` (after its one-byte type), and where the
/// next line starts; `None` while the line is incomplete. Adds the bytes it searched to
/// `examined`.
fn line_number(
    buf: &[u8],
    at: usize,
    examined: &mut u64,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    // A line of NUMBER_LINE_BYTES_MAX at most: searching it again on the next read costs
    // little.
    let rest = &buf[at + 1..];
    let window = &rest[..rest.len().min(NUMBER_LINE_BYTES_MAX + 2)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        *examined += window.len() as u64;
        if rest.len() > NUMBER_LINE_BYTES_MAX {
            return Err(ProtocolError("line too long".into()));
        }
        return Ok(None);
    };
    *examined += (end + 2) as u64;
    let text = std::str::from_utf8(&rest[..end])
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| ProtocolError("invalid length".into()))?;
    Ok(Some((text, at + 1 + end + 2)))
}

/// Takes the inline command whose line ends (LF) at `buf[end]`.
fn take_inline(
    buf: &mut BytesMut,
    end: usize,
    limits: &RequestLimits,
) -> Result<Vec<Bytes>, ProtocolError> {
    if end > limits.inline_bytes_max {
        return Err(ProtocolError("too big inline request".into()));
    }
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
    Ok(args)
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
        let result = RequestParser::default().take(&mut buf, &RequestLimits::default());
        (result, buf.len())
    }

    fn take_request(
        buf: &mut BytesMut,
        limits: &RequestLimits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        RequestParser::default().take(buf, limits)
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

    /// Feeds `stream` to one parser `step` bytes at a time, as reads would; the
    /// requests taken and the bytes the parser searched.
    fn feed(stream: &[u8], step: usize) -> (Vec<Vec<Bytes>>, u64) {
        let (mut parser, mut buf, mut taken) = (RequestParser::default(), BytesMut::new(), vec![]);
        let limits = RequestLimits::default();
        for chunk in stream.chunks(step) {
            buf.extend_from_slice(chunk);
            while let Some(args) = parser.take(&mut buf, &limits).expect("valid") {
                taken.push(args);
            }
        }
        assert!(buf.is_empty(), "{} bytes left", buf.len());
        (taken, parser.examined)
    }

    #[test]
    fn request_parser_resumes_a_request_split_over_many_reads() {
        // 5,000 one-byte arguments (35 KB) arriving 3 bytes per read: about 12,000
        // reads, each of which once re-parsed every argument found so far.
        let mut request = BytesMut::from(&b"*5000\r\n"[..]);
        for _ in 0..5000 {
            request.extend_from_slice(b"$1\r\nx\r\n");
        }
        let (taken, examined) = feed(&request, 3);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].len(), 5000);
        assert!(taken[0].iter().all(|arg| &arg[..] == b"x"));
        // Each line searched about once per read that ends inside it, not once per read.
        assert!(
            examined <= 2 * request.len() as u64,
            "searched {examined} bytes of a {}-byte request",
            request.len()
        );
    }

    #[test]
    fn request_parser_waits_for_a_bulk_string_without_searching_it() {
        let mut parser = RequestParser::default();
        let limits = RequestLimits::default();
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$100000\r\n"[..]);
        assert_eq!(parser.take(&mut buf, &limits), Ok(None));
        assert_eq!(parser.bytes_wanted(buf.len()), 100_002);
        let examined = parser.examined;
        for _ in 0..99 {
            buf.extend_from_slice(&[b'v'; 1000]);
            assert_eq!(parser.take(&mut buf, &limits), Ok(None));
        }
        assert_eq!(
            parser.examined, examined,
            "bytes of the value were searched"
        );
        assert_eq!(parser.bytes_wanted(buf.len()), 1002);
        buf.extend_from_slice(&[b'v'; 1000]);
        buf.extend_from_slice(b"\r\nPING\r\n");
        let args = parser
            .take(&mut buf, &limits)
            .expect("valid")
            .expect("whole");
        assert_eq!(args[0], Bytes::from("GET"));
        assert_eq!(args[1].len(), 100_000);
        assert_eq!(parser.bytes_wanted(buf.len()), 0);
        let ping = parser
            .take(&mut buf, &limits)
            .expect("valid")
            .expect("whole");
        assert_eq!(ping, vec![Bytes::from("PING")]);
    }

    #[test]
    fn request_parser_fed_byte_by_byte_takes_what_one_read_would() {
        let stream: &[u8] = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n\
            GET  k\r\n\r\n*-1\r\n*1\r\n$0\r\n\r\nPING\n";
        let (whole, _) = feed(stream, stream.len());
        for step in 1..stream.len() {
            assert_eq!(feed(stream, step).0, whole, "{step} bytes per read");
        }
        let words = |w: &[&str]| -> Vec<Bytes> {
            w.iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect()
        };
        assert_eq!(
            whole,
            vec![
                words(&["SET", "k", "a\r\nb"]),
                words(&["GET", "k"]),
                words(&[]),
                words(&[]),
                words(&[""]),
                words(&["PING"]),
            ]
        );
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
