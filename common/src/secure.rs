//! Securing a TCP connection as the process's [`Security`] says: TLS first where
//! configured (`crate::tls`), then the cluster-token handshake (`crate::auth`), before
//! the connection's own protocol (RPC frames, soft-NIC requests) starts.
//!
//! [`dial`] is the client's side and [`accept`] the server's; both hand back a
//! [`SecureStream`] whose [`split`](SecureStream::split) gives the read and write halves
//! the protocols run on (a plain TCP stream splits without a lock, as before).

use crate::auth::{self, HandshakeError, Security};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A read half of a secured connection.
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A write half of a secured connection.
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// A connection after TLS (if any); the token handshake runs on it.
#[derive(Debug)]
pub enum SecureStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS, as dialled.
    TlsClient(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// TLS, as accepted.
    TlsServer(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl SecureStream {
    /// The read and write halves.
    pub fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            SecureStream::Plain(stream) => {
                let (read, write) = stream.into_split();
                (Box::new(read), Box::new(write))
            }
            SecureStream::TlsClient(stream) => {
                let (read, write) = tokio::io::split(*stream);
                (Box::new(read), Box::new(write))
            }
            SecureStream::TlsServer(stream) => {
                let (read, write) = tokio::io::split(*stream);
                (Box::new(read), Box::new(write))
            }
        }
    }

    /// Whether the connection runs over TLS.
    pub fn is_tls(&self) -> bool {
        !matches!(self, SecureStream::Plain(_))
    }
}

impl AsyncRead for SecureStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            SecureStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            SecureStream::TlsClient(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            SecureStream::TlsServer(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for SecureStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            SecureStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            SecureStream::TlsClient(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            SecureStream::TlsServer(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            SecureStream::Plain(s) => Pin::new(s).poll_flush(cx),
            SecureStream::TlsClient(s) => Pin::new(s.as_mut()).poll_flush(cx),
            SecureStream::TlsServer(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            SecureStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            SecureStream::TlsClient(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            SecureStream::TlsServer(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Secures a connection dialled to `addr`: TLS if `security` has a client set-up, then
/// the token handshake if it has a token. The error says what failed, for a connect
/// error.
pub async fn dial(
    addr: &str,
    stream: TcpStream,
    security: &Security,
) -> Result<SecureStream, String> {
    let mut secured = match &security.tls_client {
        Some(tls) => SecureStream::TlsClient(Box::new(tls.connect(addr, stream).await?)),
        None => SecureStream::Plain(stream),
    };
    if let Some(token) = &security.token {
        auth::client_handshake(&mut secured, token)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(secured)
}

/// Why [`accept`] did not produce a connection to serve.
#[derive(Debug)]
pub enum Refused {
    /// The peer presented no token; the caller answers in its protocol (it sent `first`
    /// as the start of its first message) and closes.
    NoToken {
        /// The connection, to answer on.
        stream: SecureStream,
        /// The peer's first four bytes.
        first: [u8; 4],
    },
    /// TLS or the handshake failed; already logged, nothing to answer.
    Failed,
}

/// Secures an accepted connection: TLS if the peer starts one and `security` has a
/// certificate, then the token handshake if `security` has a token. Refusals are logged
/// with `peer` and `what` (the server's name), never the token.
pub async fn accept(
    stream: TcpStream,
    peer: SocketAddr,
    security: &Security,
    what: &'static str,
) -> Result<SecureStream, Refused> {
    let mut secured = match &security.tls_server {
        Some(tls) => match crate::tls::starts_with_tls(&stream).await {
            Some(true) => match tls.accept(stream).await {
                Ok(stream) => SecureStream::TlsServer(Box::new(stream)),
                Err(reason) => {
                    tracing::debug!(%peer, server = what, %reason, "TLS connection refused");
                    return Err(Refused::Failed);
                }
            },
            Some(false) => SecureStream::Plain(stream),
            None => return Err(Refused::Failed),
        },
        None => SecureStream::Plain(stream),
    };
    let Some(token) = &security.token else {
        return Ok(secured);
    };
    match auth::server_handshake(&mut secured, token).await {
        Ok(()) => Ok(secured),
        Err(HandshakeError::NoToken { first }) => {
            if let Some(also) = REFUSALS.report() {
                if first[0] == crate::tls::TLS_HANDSHAKE_BYTE {
                    tracing::warn!(
                        %peer,
                        server = what,
                        also_refused = also,
                        token = token.fingerprint(),
                        "connection refused: the peer starts TLS, but this process has no \
                         certificate (--tls-cert, --tls-key)"
                    );
                } else {
                    tracing::warn!(
                        %peer,
                        server = what,
                        also_refused = also,
                        token = token.fingerprint(),
                        "connection refused: the peer presented no cluster token (start it \
                         with --auth-token-file)"
                    );
                }
            }
            Err(Refused::NoToken {
                stream: secured,
                first,
            })
        }
        // A peer that closed or went quiet mid-handshake (a port probe, a crash) is not
        // worth a warning; one with a wrong token or version is.
        Err(error @ (HandshakeError::Io(_) | HandshakeError::Timeout)) => {
            tracing::debug!(%peer, server = what, %error, "connection dropped in the handshake");
            Err(Refused::Failed)
        }
        Err(error) => {
            if let Some(also) = REFUSALS.report() {
                tracing::warn!(
                    %peer,
                    server = what,
                    %error,
                    token = token.fingerprint(),
                    also_refused = also,
                    "connection refused"
                );
            }
            Err(Refused::Failed)
        }
    }
}

/// At most one refusal is logged per [`REFUSAL_LOG_INTERVAL`]: a client retrying with the
/// wrong token (or an attacker) dials many times a second.
pub const REFUSAL_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

static REFUSALS: RefusalLog = RefusalLog::new();

/// When a refusal was last logged, and how many were not since: logs one refusal per
/// [`REFUSAL_LOG_INTERVAL`] (the gateway's `AUTH` failures use one too).
#[derive(Debug)]
pub struct RefusalLog {
    state: parking_lot::Mutex<Option<(std::time::Instant, u64)>>,
}

impl Default for RefusalLog {
    fn default() -> RefusalLog {
        RefusalLog::new()
    }
}

impl RefusalLog {
    /// Nothing logged yet.
    pub const fn new() -> RefusalLog {
        RefusalLog {
            state: parking_lot::const_mutex(None),
        }
    }

    /// `Some(refusals not logged since the last report)` if this one is to be logged.
    pub fn report(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let now = std::time::Instant::now();
        match &mut *state {
            Some((last, unlogged)) if now.duration_since(*last) < REFUSAL_LOG_INTERVAL => {
                *unlogged += 1;
                None
            }
            Some((last, unlogged)) => {
                let also = *unlogged;
                *last = now;
                *unlogged = 0;
                Some(also)
            }
            None => {
                *state = Some((now, 0));
                Some(0)
            }
        }
    }
}

/// Bounds the connections of one server that are in their TLS or token handshake: at
/// most `total_max` at once, and at most `per_peer_max` from one IP address. Until a
/// peer has proven the token it holds a connection slot; without a bound, peers that
/// never finish the handshake could take every slot and lock out the cluster's own pings
/// and calls. The per-address bound keeps one misbehaving host from using up the total:
/// the cluster's servers and clients, at other addresses, still get in.
#[derive(Debug)]
pub struct HandshakeGate {
    total_max: usize,
    per_peer_max: usize,
    /// Handshakes in flight, by peer address; an address is removed at zero.
    in_flight: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// A handshake let through a [`HandshakeGate`]; leaves it when dropped.
#[derive(Debug)]
pub struct HandshakeTicket<'a> {
    gate: &'a HandshakeGate,
    peer: std::net::IpAddr,
}

impl Drop for HandshakeTicket<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.gate.in_flight.lock();
        if let Some(count) = in_flight.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.peer);
            }
        }
    }
}

impl HandshakeGate {
    /// A gate of these bounds.
    pub fn new(total_max: usize, per_peer_max: usize) -> HandshakeGate {
        HandshakeGate {
            total_max,
            per_peer_max,
            in_flight: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Lets a handshake from `peer` in, unless a bound is reached.
    pub fn try_enter(&self, peer: std::net::IpAddr) -> Option<HandshakeTicket<'_>> {
        let mut in_flight = self.in_flight.lock();
        let total: usize = in_flight.values().sum();
        let from_peer = in_flight.get(&peer).copied().unwrap_or(0);
        if total >= self.total_max || from_peer >= self.per_peer_max {
            return None;
        }
        in_flight.insert(peer, from_peer + 1);
        Some(HandshakeTicket { gate: self, peer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn the_gate_bounds_handshakes_per_peer_and_in_all_and_frees_them() {
        let gate = HandshakeGate::new(3, 2);
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let c = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
        let first = gate.try_enter(a).expect("a's first");
        let second = gate.try_enter(a).expect("a's second");
        assert!(gate.try_enter(a).is_none(), "a is at its bound");
        let from_b = gate.try_enter(b).expect("b gets in while a is stuck");
        assert!(gate.try_enter(c).is_none(), "the total is reached");
        drop(first);
        let from_c = gate.try_enter(c).expect("room again");
        drop((second, from_b, from_c));
        assert!(gate.in_flight.lock().is_empty());
    }
}
