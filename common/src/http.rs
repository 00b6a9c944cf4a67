//! A small HTTP/1.1 server for what operators point a browser or Prometheus at:
//! `/metrics` on every process, the status page on coordinators.
//!
//! It serves `GET` (and `HEAD`) only, one request per connection (`Connection: close`),
//! which is all a scraper or a page refreshing every two seconds needs, and keeps every
//! limit explicit: [`HTTP_CONNECTIONS_MAX`] connections at once, a request head of at
//! most [`HTTP_HEAD_BYTES_MAX`] read within [`HTTP_READ_TIMEOUT`], a handler answering
//! within [`HTTP_HANDLER_TIMEOUT`] (else 503), a response written within
//! [`HTTP_WRITE_TIMEOUT`]. Anything else gets a plain error status and the connection is
//! closed; the server keeps serving. A client that connects and sends nothing holds one
//! of the connections for up to the read timeout: an operator's port, not a public one.
//!
//! The request head is parsed by [`parse_request_head`], a pure function tested alone;
//! [`serve`] is the thin async driver around it and the caller's [`Handler`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Connections served at once; further ones wait in the listen backlog.
pub const HTTP_CONNECTIONS_MAX: usize = 64;
/// Largest request head (request line and headers) read; a longer one is answered 431.
pub const HTTP_HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub const HTTP_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a handler may take to answer.
pub const HTTP_HANDLER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a response may take to be written.
pub const HTTP_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed request: what the handler needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET` or `HEAD`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string after `?`, if any (not decoded).
    pub query: Option<String>,
}

impl Request {
    /// The value of `name` in the query (`a=1&b=2`), if present (not percent-decoded).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query.as_deref()?.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key == name).then_some(value)
        })
    }
}

/// A response: status, content type, body, and an optional `Location`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// The `Content-Type` header.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
    /// A `Location` header (redirects).
    pub location: Option<String>,
}

impl Response {
    /// A 200 response.
    pub fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status: 200,
            content_type,
            body: body.into(),
            location: None,
        }
    }

    /// An error response with a plain-text explanation.
    pub fn error(status: u16, why: impl std::fmt::Display) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{why}\n").into_bytes(),
            location: None,
        }
    }

    /// The bytes on the wire; `head_only` leaves the body out (`HEAD`).
    pub fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        if let Some(location) = &self.location {
            out.push_str(&format!("Location: {location}\r\n"));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if !head_only {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        302 => "Found",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Why a request head was refused: the status to answer and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The HTTP status.
    pub status: u16,
    /// Said in the body.
    pub why: String,
}

/// Parses a complete request head (up to and including the blank line). Only `GET` and
/// `HEAD` of an absolute path are accepted.
pub fn parse_request_head(head: &[u8]) -> Result<Request, Refused> {
    let bad = |why: &str| Refused {
        status: 400,
        why: why.to_string(),
    };
    let text = std::str::from_utf8(head).map_err(|_| bad("the request head is not UTF-8"))?;
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad("only HTTP/1.x is served"));
    }
    if method != "GET" && method != "HEAD" {
        return Err(Refused {
            status: 405,
            why: format!("method {method} not allowed: only GET and HEAD are served"),
        });
    }
    if !target.starts_with('/') {
        return Err(bad("the request target must be an absolute path"));
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query.to_string())),
        None => (target, None),
    };
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query,
    })
}

/// What a server does with a request.
pub type Handler =
    Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// Serves `handler` on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, handler: Handler, shutdown: impl Future<Output = ()>) {
    crate::rpc::server::accept_connections(
        listener,
        HTTP_CONNECTIONS_MAX,
        "http",
        shutdown,
        move |stream| serve_connection(stream, Arc::clone(&handler)),
    )
    .await;
}

/// Binds `addr` and serves `handler` there on a task of the current runtime until the
/// process ends; returns the bound address.
pub async fn spawn(addr: &str, handler: Handler) -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve(listener, handler, std::future::pending()));
    Ok(bound)
}

async fn serve_connection(mut stream: TcpStream, handler: Handler) {
    let head = tokio::time::timeout(HTTP_READ_TIMEOUT, read_head(&mut stream)).await;
    let (response, head_only) = match head {
        Err(_) => (
            Response::error(408, "request head not received in time"),
            false,
        ),
        Ok(Err(refused)) => (Response::error(refused.status, refused.why), false),
        Ok(Ok(head)) => match parse_request_head(&head) {
            Err(refused) => (Response::error(refused.status, refused.why), false),
            Ok(request) => {
                let head_only = request.method == "HEAD";
                let response = tokio::time::timeout(HTTP_HANDLER_TIMEOUT, handler(request))
                    .await
                    .unwrap_or_else(|_| Response::error(503, "the answer was not ready in time"));
                (response, head_only)
            }
        },
    };
    let bytes = response.encode(head_only);
    let _ = tokio::time::timeout(HTTP_WRITE_TIMEOUT, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    })
    .await;
}

/// Reads up to the end of the request head (a blank line).
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Refused> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|e| Refused {
            status: 400,
            why: e.to_string(),
        })?;
        if n == 0 {
            return Err(Refused {
                status: 400,
                why: "connection closed before the request head ended".into(),
            });
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_head_end(&head) {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > HTTP_HEAD_BYTES_MAX {
            return Err(Refused {
                status: 431,
                why: format!("request head longer than {HTTP_HEAD_BYTES_MAX} bytes"),
            });
        }
    }
}

fn find_head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// A plain HTTP GET of `path` on `addr` (for tests and for coordinators asking each
/// other): the status and body, within `timeout`.
pub async fn get(addr: &str, path: &str, timeout: Duration) -> std::io::Result<(u16, Vec<u8>)> {
    tokio::time::timeout(timeout, async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let end = find_head_end(&response)
            .ok_or_else(|| std::io::Error::other("response without a complete head"))?;
        let status = std::str::from_utf8(&response[..end])
            .ok()
            .and_then(|head| head.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other("response without a status code"))?;
        Ok((status, response[end..].to_vec()))
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "HTTP GET timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_with_a_query_parses() {
        let request =
            parse_request_head(b"GET /api/status?fragment=1&x HTTP/1.1\r\nHost: h\r\n\r\n")
                .expect("parses");
        assert_eq!(request.method, "GET");
        assert_eq!(request.path, "/api/status");
        assert_eq!(request.query_param("fragment"), Some("1"));
        assert_eq!(request.query_param("x"), Some(""));
        assert_eq!(request.query_param("y"), None);
    }

    #[test]
    fn other_methods_and_malformed_lines_are_refused() {
        let post = parse_request_head(b"POST / HTTP/1.1\r\n\r\n").expect_err("refused");
        assert_eq!(post.status, 405);
        for head in [
            &b"GET /\r\n\r\n"[..],
            b"GET / HTTP/2\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(parse_request_head(head).expect_err("refused").status, 400);
        }
    }

    #[test]
    fn a_response_says_its_length_and_closes() {
        let mut response = Response::ok("text/plain", "hi");
        response.location = Some("/x".into());
        let text = String::from_utf8(response.encode(false)).expect("text");
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(text.contains("Content-Length: 2\r\n"));
        assert!(text.contains("Location: /x\r\n"));
        assert!(text.ends_with("\r\n\r\nhi"));
        let head = String::from_utf8(response.encode(true)).expect("text");
        assert!(head.ends_with("\r\n\r\n"));
    }

    #[tokio::test]
    async fn a_server_answers_and_refuses_then_keeps_serving() {
        let handler: Handler = Arc::new(|request: Request| {
            Box::pin(async move {
                if request.path == "/hello" {
                    Response::ok("text/plain", "world")
                } else {
                    Response::error(404, "no such page")
                }
            })
        });
        let addr = spawn("127.0.0.1:0", handler)
            .await
            .expect("binds")
            .to_string();
        let timeout = Duration::from_secs(5);
        let (status, body) = get(&addr, "/hello", timeout).await.expect("answers");
        assert_eq!((status, body.as_slice()), (200, &b"world"[..]));
        let (status, _) = get(&addr, "/nope", timeout).await.expect("answers");
        assert_eq!(status, 404);
        // A head that never ends is cut off at the limit; the server goes on.
        let mut stream = TcpStream::connect(&addr).await.expect("connects");
        let long = vec![b'a'; HTTP_HEAD_BYTES_MAX + 2048];
        let _ = stream.write_all(&long).await;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 431"));
        let (status, _) = get(&addr, "/hello", timeout).await.expect("still answers");
        assert_eq!(status, 200);
    }
}
