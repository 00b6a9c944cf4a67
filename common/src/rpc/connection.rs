//! The client side of the RPC layer: one multiplexed TCP connection per peer.
//!
//! A [`Connection`] lets any number of tasks call concurrently. A caller encodes its
//! request straight into one buffer behind space for the frame header, writes it under
//! an async mutex on the socket's write half (one `write` per request, no extra task
//! hop), and waits on a oneshot that the connection's reader task completes when the
//! reply with the same rpc id arrives.
//!
//! # Failure handling
//! * Every call has a deadline; past it the call returns [`RpcError::Timeout`] and its
//!   slot is dropped, so a late reply is discarded. A call whose caller drops it early
//!   loses its slot the same way.
//! * If a caller is cancelled in the middle of writing its frame, the byte stream is
//!   no longer framed: a drop guard marks the connection broken, and every later writer
//!   checks that mark under the writer lock before writing, so the half frame is never
//!   completed with another request's bytes (the peer would execute a spliced request).
//!   The pool dials anew; the old socket closes when its last user drops it.
//! * Errors say whether the request may have run: [`RpcError::Connect`] and
//!   [`RpcError::NotSent`] mean it never reached the peer whole (safe to retry);
//!   [`RpcError::ConnectionLost`] and [`RpcError::Timeout`] come after it was sent.
//! * A peer that stalls in the middle of a frame for [`FRAME_STALL_TIMEOUT`] is treated
//!   as gone, and TCP keepalive detects peers that vanished without closing.
//! * When the reader sees end-of-stream, an error or a frame that is not a reply, it
//!   marks the connection closed and fails every call in flight with
//!   [`RpcError::ConnectionLost`].

use super::error::{RpcError, CONNECT_TIMEOUT};
use super::frame::{FrameHeader, Opcode, FRAME_HEADER_BYTES};
use super::message::{Rpc, WireMessage};
use crate::auth::Security;
use crate::buffer_pool::{self, BufferPool, POOLED_BYTES_MIN};
use crate::limits::RPC_PAYLOAD_BYTES_MAX;
use crate::secure::{ReadHalf, WriteHalf};
use crate::status::Status;
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

type ReplySlot = oneshot::Sender<(FrameHeader, Bytes)>;

/// State shared between callers and the reader task.
#[derive(Debug, Default)]
struct Shared {
    /// Calls waiting for their reply, by rpc id.
    /// Invariant: once `closed` is set and the map drained, nothing is inserted again
    /// (inserters check `closed` while holding the lock).
    pending: Mutex<HashMap<u64, ReplySlot>>,
    /// Set when the connection can carry no more calls.
    closed: AtomicBool,
}

impl Shared {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Dropping the senders wakes every waiting caller with ConnectionLost.
        self.pending.lock().clear();
    }
}

/// One multiplexed connection to a peer.
pub struct Connection {
    addr: String,
    /// Serialises whole frames onto the socket; never held across anything but the
    /// write of one frame.
    writer: tokio::sync::Mutex<WriteHalf>,
    shared: Arc<Shared>,
    next_rpc_id: AtomicU64,
    /// Aborted when the connection is dropped, so no reader outlives its connection.
    reader: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Marks the connection broken if a frame write is abandoned half-way.
struct WriteGuard<'a> {
    shared: &'a Shared,
    armed: bool,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.close();
        }
    }
}

/// Removes a call's reply slot from `pending` unless the reply arrived, whichever way
/// the call ends: its deadline, a write error, or the caller dropping the call future
/// (a `select!`, an outer timeout, an aborted task). Without it a cancelled call's slot
/// stayed until its reply came, and forever if the frame was never written (the caller
/// was cancelled while waiting for the writer).
struct PendingGuard<'a> {
    shared: &'a Shared,
    rpc_id: u64,
    /// Cleared once the reader has taken the slot out to deliver the reply.
    armed: bool,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.pending.lock().remove(&self.rpc_id);
        }
    }
}

impl Connection {
    /// Dials `addr` (with [`CONNECT_TIMEOUT`]) with the process's security
    /// (`crate::auth::process_security`).
    pub async fn connect(addr: &str) -> Result<Connection, RpcError> {
        Connection::connect_with(addr, &crate::auth::process_security()).await
    }

    /// Dials `addr` (with [`CONNECT_TIMEOUT`]), then secures the connection as
    /// `security` says (TLS, the cluster-token handshake: `crate::secure::dial`).
    pub async fn connect_with(addr: &str, security: &Security) -> Result<Connection, RpcError> {
        let connect_error = |reason: String| RpcError::Connect {
            addr: addr.to_string(),
            reason,
            refused: false,
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| connect_error("timed out".to_string()))?
            .map_err(|e| RpcError::Connect {
                addr: addr.to_string(),
                reason: e.to_string(),
                refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
            })?;
        stream
            .set_nodelay(true)
            .map_err(|e| connect_error(e.to_string()))?;
        let (read_half, write_half) = crate::secure::dial(addr, stream, security)
            .await
            .map_err(connect_error)?
            .split();
        let shared = Arc::new(Shared::default());
        let reader = tokio::spawn(read_replies(
            read_half,
            Arc::clone(&shared),
            addr.to_string(),
        ));
        Ok(Connection {
            addr: addr.to_string(),
            writer: tokio::sync::Mutex::new(write_half),
            shared,
            next_rpc_id: AtomicU64::new(1),
            reader: reader.abort_handle(),
        })
    }

    /// The peer's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connection can no longer carry calls.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Calls waiting for their reply; tests check that none is left behind.
    #[cfg(test)]
    pub(crate) fn pending_len(&self) -> usize {
        self.shared.pending.lock().len()
    }

    /// Calls RPC `R` and decodes its reply. A non-`Ok` reply status becomes
    /// [`RpcError::Status`] with the peer's detail text.
    pub async fn call<R: Rpc>(
        &self,
        request: &R::Request,
        deadline: Instant,
    ) -> Result<R::Reply, RpcError> {
        let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + 64);
        frame.resize(FRAME_HEADER_BYTES, 0);
        request.encode(&mut frame);
        let (header, payload) =
            self.call_raw(R::OPCODE, frame, deadline)
                .await
                .map_err(|error| match error {
                    RpcError::Timeout { addr, opcode, .. } => RpcError::Timeout {
                        addr,
                        opcode,
                        rpc: R::NAME,
                    },
                    error => error,
                })?;
        if header.status != Status::Ok {
            return Err(RpcError::Status {
                addr: self.addr.clone(),
                status: header.status,
                detail: String::from_utf8_lossy(&payload).into_owned(),
            });
        }
        R::Reply::decode(payload).map_err(|error| RpcError::Decode {
            addr: self.addr.clone(),
            error,
        })
    }

    /// Sends `frame` (whose first [`FRAME_HEADER_BYTES`] are reserved for the header)
    /// as a request with `opcode` and waits for the reply frame.
    pub async fn call_raw(
        &self,
        opcode: Opcode,
        mut frame: BytesMut,
        deadline: Instant,
    ) -> Result<(FrameHeader, Bytes), RpcError> {
        let lost = || RpcError::ConnectionLost {
            addr: self.addr.clone(),
        };
        assert!(
            frame.len() >= FRAME_HEADER_BYTES,
            "frame lacks room for its header"
        );
        let payload_len = frame.len() - FRAME_HEADER_BYTES;
        if payload_len > RPC_PAYLOAD_BYTES_MAX {
            return Err(RpcError::Status {
                addr: self.addr.clone(),
                status: Status::MessageTooLarge,
                detail: format!("request of {payload_len} bytes not sent"),
            });
        }
        let rpc_id = self.next_rpc_id.fetch_add(1, Ordering::Relaxed);
        let header = FrameHeader {
            opcode,
            is_reply: false,
            status: Status::Ok,
            rpc_id,
            payload_len: payload_len as u32,
        };
        header.write_to(&mut frame[..FRAME_HEADER_BYTES]);

        let not_sent = |reason: &str| RpcError::NotSent {
            addr: self.addr.clone(),
            reason: reason.to_string(),
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.shared.pending.lock();
            if self.is_closed() {
                return Err(not_sent("connection closed"));
            }
            pending.insert(rpc_id, tx);
        }
        let mut slot = PendingGuard {
            shared: &self.shared,
            rpc_id,
            armed: true,
        };
        // Set once the whole frame is on the socket: only then can the peer execute it.
        // A frame cut short is never completed (see below), so the peer never runs it.
        let mut sent = false;
        // One timer for the whole call: writing the frame and waiting for the reply.
        let outcome = tokio::time::timeout_at(deadline, async {
            {
                let mut writer = self.writer.lock().await;
                // A call abandoned mid-frame closed the connection while holding this
                // lock. Writing now would complete its frame with our bytes, and the
                // peer would execute a spliced request.
                if self.is_closed() {
                    return Err(not_sent("connection closed by an abandoned write"));
                }
                let mut guard = WriteGuard {
                    shared: &self.shared,
                    armed: true,
                };
                // The flush matters for TLS: rustls may hold the frame's tail until the
                // writer is polled again (plain TCP's flush does nothing).
                let result = match writer.write_all(&frame).await {
                    Ok(()) => writer.flush().await,
                    Err(error) => Err(error),
                };
                guard.armed = result.is_err();
                if let Err(error) = result {
                    return Err(not_sent(&error.to_string()));
                }
            }
            sent = true;
            rx.await.map_err(|_| lost())
        })
        .await;
        match outcome {
            Ok(Ok(reply)) => {
                // The reader removed the slot to send on it; skip a second lock.
                slot.armed = false;
                Ok(reply)
            }
            Ok(Err(error)) => Err(error),
            // `slot` drops the reply slot on the way out.
            Err(_) if sent => Err(RpcError::Timeout {
                addr: self.addr.clone(),
                opcode,
                rpc: "",
            }),
            Err(_) => Err(not_sent("deadline passed before the request was sent")),
        }
    }
}

/// Reads reply frames until the stream ends or misbehaves, completing pending calls.
async fn read_replies(mut socket: ReadHalf, shared: Arc<Shared>, addr: String) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        match next_frame(&mut socket, &mut buf).await {
            Ok(Some((header, payload))) if header.is_reply => {
                let slot = shared.pending.lock().remove(&header.rpc_id);
                // No slot: the caller timed out and left; the reply is dropped.
                if let Some(slot) = slot {
                    let _ = slot.send((header, payload));
                }
            }
            Ok(Some((header, _))) => {
                tracing::warn!(%addr, opcode = %header.opcode, "peer sent a request on a client connection; closing");
                break;
            }
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%addr, %error, "rpc connection closed");
                break;
            }
        }
    }
    shared.close();
}

/// Why a frame stream cannot be read further.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadFrameError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] super::frame::FrameError),
    #[error("payload of {len} bytes exceeds the limit")]
    TooLarge { header: FrameHeader, len: usize },
    #[error("stream ended inside a frame")]
    Truncated,
    #[error("peer sent nothing for {FRAME_STALL_TIMEOUT:?} inside a frame")]
    Stalled,
}

/// How long a peer may send nothing while a frame is half received. Between frames a
/// connection may idle forever (pooled connections do); inside one, silence means the
/// peer died or misbehaves.
pub const FRAME_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// TCP keepalive: probe an idle connection after this long...
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(30);
/// ...then every this long, giving up after a few unanswered probes.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Turns on TCP keepalive so a peer that vanished (power loss, partition) is noticed
/// even on an idle connection. Best effort: a socket that refuses keeps working.
pub(crate) fn set_keepalive(stream: &TcpStream) {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%error, "cannot enable TCP keepalive");
    }
}

/// Reads the next whole frame from `socket`, buffering in `buf`. `Ok(None)` at a clean
/// end of stream between frames.
///
/// A payload of [`POOLED_BYTES_MIN`] or more is read into a buffer of the process's
/// [`buffer_pool`](crate::buffer_pool) instead, exactly to its end (so `buf` never holds
/// part of it and the next frame's bytes stay in the socket): a recovery's pieces reuse
/// memory already touched instead of faulting in fresh pages for every one. Dropping
/// the future while it reads such a payload loses what it read (it is not in `buf`), so
/// the stream cannot go on: both callers drop it only to end the connection.
pub(crate) async fn next_frame<R: AsyncRead + Unpin>(
    socket: &mut R,
    buf: &mut BytesMut,
) -> Result<Option<(FrameHeader, Bytes)>, ReadFrameError> {
    next_frame_pooled(socket, buf, buffer_pool::shared()).await
}

/// [`next_frame`], with large payloads in buffers of `pool`.
pub(crate) async fn next_frame_pooled<R: AsyncRead + Unpin>(
    socket: &mut R,
    buf: &mut BytesMut,
    pool: &BufferPool,
) -> Result<Option<(FrameHeader, Bytes)>, ReadFrameError> {
    loop {
        if buf.len() >= FRAME_HEADER_BYTES {
            let header = FrameHeader::read_from(&buf[..FRAME_HEADER_BYTES])?;
            let len = header.payload_len as usize;
            if len > RPC_PAYLOAD_BYTES_MAX {
                return Err(ReadFrameError::TooLarge { header, len });
            }
            if buf.len() >= FRAME_HEADER_BYTES + len {
                let mut frame = buf.split_to(FRAME_HEADER_BYTES + len);
                let payload = frame.split_off(FRAME_HEADER_BYTES).freeze();
                return Ok(Some((header, payload)));
            }
            if len >= POOLED_BYTES_MIN {
                let _ = buf.split_to(FRAME_HEADER_BYTES);
                let payload = read_pooled_payload(socket, buf, len, pool).await?;
                return Ok(Some((header, payload)));
            }
            buf.reserve(FRAME_HEADER_BYTES + len - buf.len());
        } else if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        let read = if buf.is_empty() {
            socket.read_buf(buf).await?
        } else {
            read_within_stall(socket.read_buf(buf)).await?
        };
        if read == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(ReadFrameError::Truncated)
            };
        }
    }
}

/// The `len`-byte payload whose first bytes are all of `buf` (fewer than `len`), the
/// rest read from `socket` up to its end and no further, in a buffer of `pool`. Leaves
/// `buf` empty.
async fn read_pooled_payload<R: AsyncRead + Unpin>(
    socket: &mut R,
    buf: &mut BytesMut,
    len: usize,
    pool: &BufferPool,
) -> Result<Bytes, ReadFrameError> {
    let mut payload = pool.take(len);
    payload.extend_from_slice(buf);
    buf.clear();
    while payload.len() < len {
        let missing = len - payload.len();
        let mut rest = (&mut payload).limit(missing);
        if read_within_stall(socket.read_buf(&mut rest)).await? == 0 {
            return Err(ReadFrameError::Truncated);
        }
    }
    Ok(pool.freeze(payload))
}

/// `read`, failing with [`ReadFrameError::Stalled`] past [`FRAME_STALL_TIMEOUT`]: the
/// peer stopped in the middle of a frame.
async fn read_within_stall(
    read: impl std::future::Future<Output = std::io::Result<usize>>,
) -> Result<usize, ReadFrameError> {
    Ok(tokio::time::timeout(FRAME_STALL_TIMEOUT, read)
        .await
        .map_err(|_| ReadFrameError::Stalled)??)
}

/// Reuses one [`Connection`] per peer address, dialling anew when one breaks.
#[derive(Debug)]
pub struct RpcPool {
    connections: Mutex<HashMap<String, Arc<Connection>>>,
    /// How connections are secured: the process's, unless a test says otherwise.
    security: Arc<Security>,
}

impl Default for RpcPool {
    fn default() -> RpcPool {
        RpcPool::with_security(crate::auth::process_security())
    }
}

impl RpcPool {
    /// An empty pool that dials with the process's security.
    pub fn new() -> RpcPool {
        RpcPool::default()
    }

    /// An empty pool that dials with `security` (tests of refusals and TLS).
    pub fn with_security(security: Arc<Security>) -> RpcPool {
        RpcPool {
            connections: Mutex::new(HashMap::new()),
            security,
        }
    }

    /// The open connection to `addr`, dialling one if there is none.
    pub async fn get(&self, addr: &str) -> Result<Arc<Connection>, RpcError> {
        if let Some(connection) = self.connections.lock().get(addr) {
            if !connection.is_closed() {
                return Ok(Arc::clone(connection));
            }
        }
        let connection = Arc::new(Connection::connect_with(addr, &self.security).await?);
        let mut connections = self.connections.lock();
        // Two callers may have dialled at once; keep the first live one.
        match connections.get(addr) {
            Some(existing) if !existing.is_closed() => Ok(Arc::clone(existing)),
            _ => {
                connections.insert(addr.to_string(), Arc::clone(&connection));
                Ok(connection)
            }
        }
    }

    /// Calls RPC `R` on `addr` over the pooled connection.
    pub async fn call<R: Rpc>(
        &self,
        addr: &str,
        request: &R::Request,
        deadline: Instant,
    ) -> Result<R::Reply, RpcError> {
        let live = self
            .connections
            .lock()
            .get(addr)
            .filter(|c| !c.is_closed())
            .cloned();
        let connection = match live {
            Some(connection) => connection,
            // Dialling gets a timer of its own; the common case above needs none.
            None => tokio::time::timeout_at(deadline, self.get(addr))
                .await
                .map_err(|_| RpcError::Connect {
                    addr: addr.to_string(),
                    reason: "deadline passed while dialling".to_string(),
                    refused: false,
                })??,
        };
        connection.call::<R>(request, deadline).await
    }

    /// Forgets the connection to `addr` (after the peer is known to be gone).
    pub fn forget(&self, addr: &str) {
        self.connections.lock().remove(addr);
    }
}
