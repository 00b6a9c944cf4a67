//! The server side of the RPC layer.
//!
//! [`RpcServer::run`] takes a bound listener and a shutdown future from its caller (so
//! tests bind port 0 and stop servers at will), accepts connections up to
//! [`RPC_CONNECTIONS_MAX`], and for each request frame spawns a task that runs the
//! [`Service`] and writes the reply. A connection has at most
//! [`RPC_IN_FLIGHT_PER_CONNECTION_MAX`] requests running; past that its reader stops
//! reading, which pushes back onto the peer through TCP flow control.
//!
//! # Failure handling
//! * Bad magic, a reply frame on a server connection, or a stream cut inside a frame:
//!   the connection is closed.
//! * A payload longer than [`RPC_PAYLOAD_BYTES_MAX`]: a `MessageTooLarge` reply, then
//!   the connection is closed (the payload is never read into memory).
//! * A peer that stalls in the middle of a frame for [`super::connection::FRAME_STALL_TIMEOUT`], or does not
//!   take a reply within [`REPLY_WRITE_TIMEOUT`] (it stopped reading), is disconnected;
//!   TCP keepalive ends connections whose peer vanished without a word.
//! * Services answer unknown opcodes and undecodable payloads with `UnknownOpcode` and
//!   `MalformedRequest` replies; the connection stays open.
//! * Every request is counted and timed, by opcode and status, in the process's
//!   [`super::stats::rpc_stats`] (which `crate::metrics` serves).
//! * A peer that disconnects with requests in flight: they run to completion (a write
//!   is applied or not, atomically) and their replies are discarded.

use super::connection::{next_frame, ReadFrameError};
use super::frame::{FrameHeader, Opcode, FRAME_HEADER_BYTES};
use super::message::WireMessage;
use crate::auth::Security;
use crate::limits::{RPC_CONNECTIONS_MAX, RPC_IN_FLIGHT_PER_CONNECTION_MAX, RPC_PAYLOAD_BYTES_MAX};
use crate::secure::{Refused, WriteHalf};
use crate::status::Status;
use bytes::{Bytes, BytesMut};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinSet;

/// A boxed future returned by [`Service::handle`].
pub type HandleFuture<'a> = Pin<Box<dyn Future<Output = Reply> + Send + 'a>>;

/// What a server process does with requests.
pub trait Service: Send + Sync + 'static {
    /// Handles one request. Unknown opcodes and undecodable payloads must be answered
    /// with [`Reply::error`], never a panic.
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_>;

    /// Answers a request that never waits (a read served from memory) on the
    /// connection's own task, saving the spawn and wake-up of [`handle`](Self::handle)
    /// — a measurable share of a ~20 µs loopback round trip. `None` sends the request
    /// through `handle`. Must not block: it runs on the task that reads the connection.
    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        let _ = (opcode, payload);
        None
    }
}

/// How long a reply may take to be written before the peer is deemed stuck (it stopped
/// reading) and its connection is closed.
pub const REPLY_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A reply: a status and its encoded payload, behind room for the frame header.
pub struct Reply {
    status: Status,
    /// Invariant: the first [`FRAME_HEADER_BYTES`] are reserved for the header.
    frame: BytesMut,
    /// Close the connection instead of answering ([`Reply::disconnect`]).
    disconnect: bool,
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("status", &self.status)
            .field("payload_len", &(self.frame.len() - FRAME_HEADER_BYTES))
            .finish()
    }
}

impl Reply {
    /// A successful reply carrying `message`.
    pub fn ok<M: WireMessage>(message: &M) -> Reply {
        let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + 64);
        frame.resize(FRAME_HEADER_BYTES, 0);
        message.encode(&mut frame);
        Reply {
            status: Status::Ok,
            frame,
            disconnect: false,
        }
    }

    /// A successful reply whose payload `encode` appends (for messages that borrow
    /// their bytes, such as a value read straight from the log).
    pub fn ok_with(encode: impl FnOnce(&mut BytesMut)) -> Reply {
        let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + 64);
        frame.resize(FRAME_HEADER_BYTES, 0);
        encode(&mut frame);
        Reply {
            status: Status::Ok,
            frame,
            disconnect: false,
        }
    }

    /// A failed reply: `status` with a human-readable detail as payload.
    pub fn error(status: Status, detail: impl fmt::Display) -> Reply {
        let detail = detail.to_string();
        let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + detail.len());
        frame.resize(FRAME_HEADER_BYTES, 0);
        frame.extend_from_slice(detail.as_bytes());
        Reply {
            status,
            frame,
            disconnect: false,
        }
    }

    /// No answer: the connection is closed instead, as when it breaks after the request
    /// was handled (failpoints show what a lost reply does). Every other call in flight
    /// on the connection loses its reply too.
    pub fn disconnect() -> Reply {
        Reply {
            disconnect: true,
            ..Reply::error(Status::Internal, "connection dropped on purpose")
        }
    }

    /// Decodes a request payload, or produces the `MalformedRequest` reply for it.
    pub fn decode<M: WireMessage>(payload: Bytes) -> Result<M, Reply> {
        M::decode(payload).map_err(|e| Reply::error(Status::MalformedRequest, e))
    }

    /// The reply's status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The encoded payload (the bytes after the frame header), e.g. for a test that
    /// calls a [`Service`] directly and decodes its answer.
    pub fn payload(&self) -> &[u8] {
        &self.frame[FRAME_HEADER_BYTES..]
    }

    fn into_frame(mut self, opcode: Opcode, rpc_id: u64) -> BytesMut {
        let payload_len = self.frame.len() - FRAME_HEADER_BYTES;
        if payload_len > RPC_PAYLOAD_BYTES_MAX {
            // The peer would refuse the frame and drop the connection, failing every
            // other call on it; answer this call alone with an error instead.
            let detail = format!("reply of {payload_len} bytes exceeds the limit");
            return Reply::error(Status::MessageTooLarge, detail).into_frame(opcode, rpc_id);
        }
        let header = FrameHeader {
            opcode,
            is_reply: true,
            status: self.status,
            rpc_id,
            payload_len: (self.frame.len() - FRAME_HEADER_BYTES) as u32,
        };
        header.write_to(&mut self.frame[..FRAME_HEADER_BYTES]);
        self.frame
    }
}

/// Runs a [`Service`] behind a TCP listener.
#[derive(Debug)]
pub struct RpcServer;

impl RpcServer {
    /// Serves `service` on `listener` until `shutdown` completes, then stops accepting
    /// and drops every connection. Connections are secured as the process's security
    /// says (`crate::auth::process_security`).
    pub async fn run<S: Service>(
        listener: TcpListener,
        service: Arc<S>,
        shutdown: impl Future<Output = ()>,
    ) {
        RpcServer::run_with(listener, service, shutdown, crate::auth::process_security()).await;
    }

    /// [`run`](Self::run), securing connections with `security` instead (TLS offered
    /// beside plain TCP, the cluster-token handshake demanded: `crate::secure::accept`).
    pub async fn run_with<S: Service>(
        listener: TcpListener,
        service: Arc<S>,
        shutdown: impl Future<Output = ()>,
        security: Arc<Security>,
    ) {
        let handshakes = Arc::new(crate::secure::HandshakeGate::new(
            HANDSHAKES_IN_FLIGHT_MAX,
            HANDSHAKES_PER_PEER_MAX,
        ));
        accept_connections(
            listener,
            RPC_CONNECTIONS_MAX,
            "rpc",
            shutdown,
            move |stream| {
                serve_connection(
                    stream,
                    Arc::clone(&service),
                    Arc::clone(&security),
                    Arc::clone(&handshakes),
                )
            },
        )
        .await;
    }
}

/// Accepts connections on `listener` until `shutdown` completes, at most
/// `connections_max` open at once (past it, accepting waits for one to close), each
/// served by its own task running `serve`; then stops accepting and drops every
/// connection. `what` names the server in logs. Shared by the RPC server, the
/// soft-NIC (`onesided::nic`), the HTTP server and the RESP gateway.
pub async fn accept_connections<F, Fut>(
    listener: TcpListener,
    connections_max: usize,
    what: &'static str,
    shutdown: impl Future<Output = ()>,
    serve: F,
) where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(connections_max));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => permit,
        };
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let served = serve(stream);
                connections.spawn(async move {
                    served.await;
                    tracing::trace!(%peer, server = what, "connection closed");
                    drop(permit);
                });
            }
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, server = what, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        // Reap finished connections so the set does not grow without bound.
        while connections.try_join_next().is_some() {}
    }
    connections.shutdown().await;
}

/// Connections of one server in their TLS or token handshake at once
/// (`crate::secure::HandshakeGate`); past it, new connections are closed at once. A
/// quarter of [`RPC_CONNECTIONS_MAX`]: peers that never finish a handshake cannot hold
/// more slots than that.
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = RPC_CONNECTIONS_MAX / 4;

/// Of those, from one IP address: one host that opens connections and never proves the
/// token cannot shut the others out. Generous, since a host running several servers and
/// clients dials many connections at once when it starts.
pub const HANDSHAKES_PER_PEER_MAX: usize = 128;

/// Logs handshakes turned away for [`HANDSHAKES_IN_FLIGHT_MAX`] and tokens offered to a
/// server without one, once per interval each.
static BUSY_REFUSALS: crate::secure::RefusalLog = crate::secure::RefusalLog::new();
static UNEXPECTED_TOKENS: crate::secure::RefusalLog = crate::secure::RefusalLog::new();

async fn serve_connection<S: Service>(
    stream: TcpStream,
    service: Arc<S>,
    security: Arc<Security>,
    handshakes: Arc<crate::secure::HandshakeGate>,
) {
    if stream.set_nodelay(true).is_err() {
        return;
    }
    super::connection::set_keepalive(&stream);
    let Ok(peer) = stream.peer_addr() else {
        return;
    };
    let handshake = security.token.is_some() || security.tls_server.is_some();
    let permit = if handshake {
        match handshakes.try_enter(peer.ip()) {
            Some(permit) => Some(permit),
            None => {
                if let Some(also) = BUSY_REFUSALS.report() {
                    tracing::warn!(%peer, also_refused = also, "connection closed: too many connections in their handshake (this peer's, or all)");
                }
                return;
            }
        }
    } else {
        None
    };
    let accepted = crate::secure::accept(stream, peer, &security, "rpc").await;
    drop(permit);
    let secured = match accepted {
        Ok(secured) => secured,
        Err(Refused::NoToken { stream, first }) => {
            refuse_tokenless(stream, first).await;
            return;
        }
        Err(Refused::Failed) => return,
    };
    let (mut reader, writer) = secured.split();
    let writer = Arc::new(Mutex::new(ReplyWriter {
        half: writer,
        poisoned: false,
    }));
    // Notified when a reply cannot be written: the peer is gone or stopped reading.
    let broken = Arc::new(tokio::sync::Notify::new());
    let in_flight = Arc::new(Semaphore::new(RPC_IN_FLIGHT_PER_CONNECTION_MAX));
    let mut requests = JoinSet::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    // Created once: a `Notified` registered anew per request costs a lock each time.
    let broken_signal = broken.notified();
    tokio::pin!(broken_signal);
    loop {
        let frame = tokio::select! {
            frame = next_frame(&mut reader, &mut buf) => frame,
            _ = &mut broken_signal => break,
        };
        let (header, payload) = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(ReadFrameError::TooLarge { header, len }) => {
                let reply = Reply::error(
                    Status::MessageTooLarge,
                    format!("payload of {len} bytes exceeds the limit of {RPC_PAYLOAD_BYTES_MAX}"),
                );
                send_reply(
                    &writer,
                    reply.into_frame(header.opcode, header.rpc_id),
                    &broken,
                )
                .await;
                break;
            }
            Err(ReadFrameError::Frame(super::frame::FrameError::BadMagic(magic)))
                if magic.to_le_bytes() == crate::auth::AUTH_MAGIC =>
            {
                // A client holding a token, and this server none: say so before closing.
                if let Some(also) = UNEXPECTED_TOKENS.report() {
                    tracing::warn!(%peer, also_refused = also, "connection refused: the peer presents a cluster token and this server holds none (start it with --auth-token-file)");
                }
                let mut writer = writer.lock().await;
                let _ = tokio::time::timeout(REPLY_WRITE_TIMEOUT, async {
                    writer
                        .half
                        .write_all(&crate::auth::no_token_challenge())
                        .await?;
                    writer.half.flush().await
                })
                .await;
                break;
            }
            Err(error) => {
                tracing::debug!(%error, "dropping connection");
                break;
            }
        };
        if header.is_reply || header.status != Status::Ok {
            tracing::debug!(opcode = %header.opcode, "reply frame on a server connection; closing");
            break;
        }
        let arrived = std::time::Instant::now();
        if let Some(reply) = service.handle_now(header.opcode, &payload) {
            super::stats::rpc_stats().observe(header.opcode, reply.status, arrived.elapsed());
            answer(&writer, reply, &header, &broken).await;
            continue;
        }
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break;
        };
        let service = Arc::clone(&service);
        let writer = Arc::clone(&writer);
        let broken = Arc::clone(&broken);
        requests.spawn(async move {
            let reply = service.handle(header.opcode, payload).await;
            super::stats::rpc_stats().observe(header.opcode, reply.status, arrived.elapsed());
            answer(&writer, reply, &header, &broken).await;
            drop(permit);
        });
        while requests.try_join_next().is_some() {}
    }
    // Requests already running finish (their effects are atomic); their replies go
    // nowhere if the peer left.
    while requests.join_next().await.is_some() {}
}

/// Answers the first request of a peer that presented no cluster token with an
/// `Unauthenticated` error (so its caller learns why), then closes. `first` holds the
/// first four bytes, already read.
async fn refuse_tokenless(mut stream: crate::secure::SecureStream, first: [u8; 4]) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    header[..4].copy_from_slice(&first);
    let answered = async {
        stream.read_exact(&mut header[4..]).await.ok()?;
        let request = FrameHeader::read_from(&header).ok()?;
        let reply = Reply::error(
            Status::Unauthenticated,
            "this cluster requires its token: start the client with --auth-token-file \
             (or RAMPART_AUTH_TOKEN_FILE)",
        );
        stream
            .write_all(&reply.into_frame(request.opcode, request.rpc_id))
            .await
            .ok()?;
        stream.flush().await.ok()?;
        stream.shutdown().await.ok()
    };
    let _ = tokio::time::timeout(crate::auth::HANDSHAKE_TIMEOUT, answered).await;
}

/// The write half of a server connection.
struct ReplyWriter {
    half: WriteHalf,
    /// Set when a reply write was abandoned part-way (timeout, error). The stream is no
    /// longer framed: a later reply written after the half frame would be read as the
    /// rest of it, handing a caller another call's bytes. Nothing is written after it.
    poisoned: bool,
}

/// Sends `reply` to the request `header` describes, or closes the connection when the
/// reply says so ([`Reply::disconnect`]).
async fn answer(
    writer: &Mutex<ReplyWriter>,
    reply: Reply,
    header: &FrameHeader,
    broken: &tokio::sync::Notify,
) {
    if reply.disconnect {
        let mut writer = writer.lock().await;
        writer.poisoned = true;
        let _ = writer.half.shutdown().await;
        broken.notify_one();
        return;
    }
    send_reply(
        writer,
        reply.into_frame(header.opcode, header.rpc_id),
        broken,
    )
    .await;
}

/// Writes one reply frame. A peer that is gone, or that has not taken the frame within
/// [`REPLY_WRITE_TIMEOUT`], gets its connection closed through `broken`.
async fn send_reply(writer: &Mutex<ReplyWriter>, frame: BytesMut, broken: &tokio::sync::Notify) {
    let mut writer = writer.lock().await;
    if writer.poisoned {
        return;
    }
    // Flushed: TLS may hold the reply's tail inside rustls until the writer is polled again.
    let write = async {
        writer.half.write_all(&frame).await?;
        writer.half.flush().await
    };
    let written = tokio::time::timeout(REPLY_WRITE_TIMEOUT, write).await;
    if !matches!(written, Ok(Ok(()))) {
        writer.poisoned = true;
        let _ = writer.half.shutdown().await;
        broken.notify_one();
    }
}
