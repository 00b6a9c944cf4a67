//! The `tcp` transport: a soft-NIC on the backup that places bytes into frames without
//! parsing them, and its client on the master (docs/design.md §5 "One-sided writes").
//!
//! [`serve`] is the backup's side: it takes a bound listener, a [`NicTarget`] (the
//! backup's frames) and a shutdown future, and for every request calls
//! [`NicTarget::place`] and answers with a status code. [`NicClient`] is the master's
//! side: one connection per backup address, dialled on first use and again after any
//! failure.
//!
//! # Wire format (little-endian)
//! Request: a [`NIC_REQUEST_HEADER_BYTES`]-byte header — magic `u32` ([`NIC_MAGIC`],
//! the bytes `RNIC`), handle `u64`, epoch `u64`, offset `u64`, length `u32` — then
//! `length` bytes. Reply: a `u16` status code ([`Status::code`]); `Ok` (0) means the
//! bytes are in the frame and may be acknowledged.
//!
//! Where the process holds a cluster token (`crate::auth`), a connection starts with the
//! token handshake, and a backup answers a master without the token `Unauthenticated`
//! and closes. No TLS: the soft-NIC runs between servers inside the cluster.
//!
//! Requests on one connection are answered in order, one at a time: the server reads a
//! request, places it and answers before it reads the next, and the client holds the
//! connection (an async mutex) from sending a request to reading its reply. A master
//! writes each segment's batches in order anyway; parallelism comes from one connection
//! per backup.
//!
//! # Limits and failure handling
//! * A request longer than [`NIC_WRITE_BYTES_MAX`] is answered `MessageTooLarge` (the
//!   RPC layer's answer to an oversized payload) and its connection closed: the stream
//!   cannot be resynchronised without reading the bytes.
//! * A bad magic closes the connection without an answer (the peer is not speaking this
//!   protocol, or the stream lost its framing).
//! * A peer that sends part of a request and then nothing for [`NIC_STALL_TIMEOUT`], or
//!   does not take a reply within it, is disconnected. An idle connection between
//!   requests may stay open (TCP keepalive ends it if the peer vanished).
//! * At most [`NIC_CONNECTIONS_MAX`] connections are served at once; further ones wait
//!   in the listen backlog. One connection's failure never affects another.
//! * The client reports refusals as [`FrameWriteError::Refused`] and anything else
//!   (connect, I/O, timeout, a cancelled call) as [`FrameWriteError::Transport`], after
//!   dropping the connection: a request cut in the middle leaves the stream unframed.
//!   After a transport error the write may or may not have landed.
//!
//! # Memory
//! Each connection reuses one receive buffer, kept up to
//! [`NIC_RECEIVE_BUFFER_KEPT_BYTES`] between requests, so the worst case is
//! `NIC_CONNECTIONS_MAX × NIC_WRITE_BYTES_MAX` while every connection sends a maximal
//! request. Placing more than [`NIC_INLINE_PLACE_BYTES_MAX`] runs on a blocking thread,
//! so a large copy does not stall the reactor.
//!
//! Cost: one round trip per write plus a copy on each side (≈ 30 µs on loopback for a
//! small batch).

use super::FrameWriteError;
use crate::ids::{Epoch, FrameHandle};
use crate::status::Status;
use std::collections::HashMap;
use std::future::Future;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// First four bytes of every request: `RNIC`.
pub const NIC_MAGIC: u32 = u32::from_le_bytes(*b"RNIC");

/// Bytes of a request header: magic, handle, epoch, offset, length.
pub const NIC_REQUEST_HEADER_BYTES: usize = 4 + 8 + 8 + 8 + 4;

/// Bytes of a reply: the status code.
pub const NIC_REPLY_BYTES: usize = 2;

/// Largest write: a whole segment (segments stay ≤ 64 MiB, `crate::limits`), so a
/// master can always move a replica in one request.
pub const NIC_WRITE_BYTES_MAX: u32 = 64 * 1024 * 1024;

/// Connections served at once: one per master writing to this backup is the norm.
pub const NIC_CONNECTIONS_MAX: usize = 1024;

/// How long a peer may leave a request (or our reply) half transferred before its
/// connection is closed.
pub const NIC_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a refused (tokenless) peer's request is read and dropped before the close.
const NIC_REFUSAL_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Read buffer of one soft-NIC connection: many small requests arrive in one `read`.
pub const NIC_READ_BUFFER_BYTES: usize = 64 * 1024;

/// Receive buffer capacity a connection keeps between requests; a larger one (after a
/// large write) is freed, so idle connections do not pin memory.
pub const NIC_RECEIVE_BUFFER_KEPT_BYTES: usize = 16 * 1024 * 1024;

/// Writes up to this size are placed on the connection's task; larger ones on a blocking
/// thread (≈ 25 µs of copying at memory speed).
pub const NIC_INLINE_PLACE_BYTES_MAX: usize = 256 * 1024;

const _: () = assert!(NIC_WRITE_BYTES_MAX as usize <= crate::limits::RPC_PAYLOAD_BYTES_MAX);
const _: () = assert!(NIC_INLINE_PLACE_BYTES_MAX <= NIC_RECEIVE_BUFFER_KEPT_BYTES);

/// Where the soft-NIC puts bytes: the backup's frames.
pub trait NicTarget: Send + Sync + 'static {
    /// Places `bytes` into open frame `handle` at `offset` if its epoch is `epoch`.
    /// Returns the refusal's status otherwise (`UnknownFrame`, `StaleEpoch`, `Fenced`,
    /// `InvalidArgument` past the frame's end). Must not block for long: it is a copy.
    fn place(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), Status>;
}

/// One decoded request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RequestHeader {
    handle: FrameHandle,
    epoch: Epoch,
    offset: u64,
    len: u32,
}

impl RequestHeader {
    fn encode(&self) -> [u8; NIC_REQUEST_HEADER_BYTES] {
        let mut out = [0u8; NIC_REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&NIC_MAGIC.to_le_bytes());
        out[4..12].copy_from_slice(&self.handle.0.to_le_bytes());
        out[12..20].copy_from_slice(&self.epoch.0.to_le_bytes());
        out[20..28].copy_from_slice(&self.offset.to_le_bytes());
        out[28..32].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// `None` for a bad magic.
    fn decode(bytes: &[u8; NIC_REQUEST_HEADER_BYTES]) -> Option<RequestHeader> {
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        if u32_at(0) != NIC_MAGIC {
            return None;
        }
        Some(RequestHeader {
            handle: FrameHandle(u64_at(4)),
            epoch: Epoch(u64_at(12)),
            offset: u64_at(20),
            len: u32_at(28),
        })
    }
}

/// Serves the soft-NIC on `listener` until `shutdown` completes, then stops accepting
/// and drops every connection. See the [module doc](self).
pub async fn serve<T: NicTarget>(
    listener: TcpListener,
    target: Arc<T>,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, target, shutdown, &crate::auth::process_security()).await;
}

/// [`serve`], demanding `security`'s token instead of the process's (never TLS: the
/// soft-NIC runs between servers).
pub async fn serve_with<T: NicTarget>(
    listener: TcpListener,
    target: Arc<T>,
    shutdown: impl Future<Output = ()>,
    security: &crate::auth::Security,
) {
    let internal = Arc::new(crate::auth::Security {
        token: security.token.clone(),
        ..crate::auth::Security::open()
    });
    crate::rpc::server::accept_connections(
        listener,
        NIC_CONNECTIONS_MAX,
        "soft-NIC",
        shutdown,
        move |stream| {
            let target = Arc::clone(&target);
            let security = Arc::clone(&internal);
            async move {
                if let Err(reason) = serve_connection(stream, target, &security).await {
                    tracing::debug!(%reason, "soft-NIC connection closed");
                }
            }
        },
    )
    .await;
}

async fn serve_connection<T: NicTarget>(
    stream: TcpStream,
    target: Arc<T>,
    security: &crate::auth::Security,
) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    crate::rpc::connection::set_keepalive(&stream);
    let peer = stream.peer_addr().map_err(|e| e.to_string())?;
    let (read_half, mut stream) =
        match crate::secure::accept(stream, peer, security, "soft-NIC").await {
            Ok(secured) => secured.split(),
            Err(crate::secure::Refused::NoToken { mut stream, .. }) => {
                // The peer's request is refused as any other: a status, then the close.
                // What it still sends is read and dropped (up to a request's bound, for a
                // moment), so that it reads the answer rather than a reset.
                let _ = reply(&mut stream, Status::Unauthenticated).await;
                let _ = stream.shutdown().await;
                let mut sink = vec![0u8; 64 * 1024];
                let _ = tokio::time::timeout(NIC_REFUSAL_DRAIN_TIMEOUT, async {
                    let mut drained = 0usize;
                    while drained <= NIC_WRITE_BYTES_MAX as usize {
                        match stream.read(&mut sink).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => drained += n,
                        }
                    }
                })
                .await;
                return Err("the peer presented no cluster token".to_string());
            }
            Err(crate::secure::Refused::Failed) => return Err("handshake failed".to_string()),
        };
    // Buffered: one `read` syscall usually brings a whole request (header and bytes).
    let mut reader = tokio::io::BufReader::with_capacity(NIC_READ_BUFFER_BYTES, read_half);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let mut header = [0u8; NIC_REQUEST_HEADER_BYTES];
        // Between requests the peer may be idle for as long as it likes.
        match reader.read(&mut header[..1]).await {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(error) => return Err(error.to_string()),
        }
        read_stalling(&mut reader, &mut header[1..]).await?;
        let Some(request) = RequestHeader::decode(&header) else {
            if header[..4] == crate::auth::AUTH_MAGIC {
                // A master holding a token, and this backup none: say so before closing.
                let _ = tokio::time::timeout(
                    NIC_STALL_TIMEOUT,
                    stream.write_all(&crate::auth::no_token_challenge()),
                )
                .await;
                return Err("the peer presents a cluster token and this backup holds none".into());
            }
            return Err("bad magic".to_string());
        };
        if request.len > NIC_WRITE_BYTES_MAX {
            reply(&mut stream, Status::MessageTooLarge).await?;
            return Err(format!(
                "write of {} bytes exceeds NIC_WRITE_BYTES_MAX ({NIC_WRITE_BYTES_MAX})",
                request.len
            ));
        }
        let len = request.len as usize;
        if buf.capacity() > NIC_RECEIVE_BUFFER_KEPT_BYTES && len <= NIC_RECEIVE_BUFFER_KEPT_BYTES {
            buf = Vec::new();
        }
        buf.resize(len, 0);
        read_stalling(&mut reader, &mut buf).await?;
        let status = if len <= NIC_INLINE_PLACE_BYTES_MAX {
            place(&*target, &request, &buf)
        } else {
            let target = Arc::clone(&target);
            let bytes = std::mem::take(&mut buf);
            let (status, bytes) = tokio::task::spawn_blocking(move || {
                let status = place(&*target, &request, &bytes);
                (status, bytes)
            })
            .await
            .map_err(|e| format!("placing task failed: {e}"))?;
            buf = bytes;
            status
        };
        reply(&mut stream, status).await?;
    }
}

fn place<T: NicTarget>(target: &T, request: &RequestHeader, bytes: &[u8]) -> Status {
    match target.place(request.handle, request.epoch, request.offset, bytes) {
        Ok(()) => Status::Ok,
        Err(status) => status,
    }
}

/// Fills `buf` from `stream`, failing if the peer stalls for [`NIC_STALL_TIMEOUT`] or
/// closes the stream.
async fn read_stalling(
    stream: &mut (impl AsyncRead + Unpin),
    buf: &mut [u8],
) -> Result<(), String> {
    let mut filled = 0;
    while filled < buf.len() {
        let read = tokio::time::timeout(NIC_STALL_TIMEOUT, stream.read(&mut buf[filled..]))
            .await
            .map_err(|_| format!("peer stalled for {NIC_STALL_TIMEOUT:?} inside a request"))?
            .map_err(|e| e.to_string())?;
        if read == 0 {
            return Err("peer closed the connection inside a request".to_string());
        }
        filled += read;
    }
    Ok(())
}

async fn reply(stream: &mut (impl AsyncWrite + Unpin), status: Status) -> Result<(), String> {
    tokio::time::timeout(
        NIC_STALL_TIMEOUT,
        stream.write_all(&status.code().to_le_bytes()),
    )
    .await
    .map_err(|_| format!("peer did not take a reply for {NIC_STALL_TIMEOUT:?}"))?
    .map_err(|e| e.to_string())
}

/// One backup's connection slot: `None` until dialled and after a failure. Held (the
/// async mutex) from sending a request to reading its reply.
type ConnectionSlot = Arc<tokio::sync::Mutex<Option<TcpStream>>>;

/// The master's soft-NIC client: one connection per backup address, re-dialled after
/// any failure. See the [module doc](self).
#[derive(Debug)]
pub struct NicClient {
    /// Connection slots by address. An entry is removed when its connection fails, so
    /// the map holds only backups this master talks to. A `parking_lot` mutex: held only
    /// to look up or insert, never across `.await`.
    connections: parking_lot::Mutex<HashMap<String, ConnectionSlot>>,
    /// The token it proves to backups.
    token: Option<crate::auth::ClusterToken>,
}

impl Default for NicClient {
    fn default() -> NicClient {
        NicClient::with_token(crate::auth::process_security().token.clone())
    }
}

impl NicClient {
    /// A client with no connections, proving the process's token.
    pub fn new() -> NicClient {
        NicClient::default()
    }

    /// A client with no connections, proving `token` (or none).
    pub fn with_token(token: Option<crate::auth::ClusterToken>) -> NicClient {
        NicClient {
            connections: parking_lot::Mutex::new(HashMap::new()),
            token,
        }
    }

    /// Writes `bytes` into frame `handle` (at `epoch`) at `offset` on the backup whose
    /// soft-NIC listens on `addr`, and waits for its answer, all within `timeout`.
    /// `Ok` means the bytes are in the frame. [`FrameWriteError::Refused`] carries the
    /// backup's refusal (a write over [`NIC_WRITE_BYTES_MAX`] is refused
    /// `MessageTooLarge` without being sent); [`FrameWriteError::Transport`] means the
    /// connection failed or timed out, and it has been dropped.
    pub async fn write(
        &self,
        addr: &str,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u64,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<(), FrameWriteError> {
        let Some(len) = u32::try_from(bytes.len())
            .ok()
            .filter(|&len| len <= NIC_WRITE_BYTES_MAX)
        else {
            return Err(FrameWriteError::Refused(Status::MessageTooLarge));
        };
        let header = RequestHeader {
            handle,
            epoch,
            offset,
            len,
        }
        .encode();
        let slot = self.slot(addr);
        let result = tokio::time::timeout(timeout, async {
            let mut guard = slot.lock().await;
            // Taken out while in use: if this call is cancelled or fails mid-request, the
            // half-written stream is dropped with it, never reused.
            let mut stream = match guard.take() {
                Some(stream) => stream,
                None => dial(addr, self.token.as_ref()).await?,
            };
            let status = exchange(&mut stream, &header, bytes).await?;
            // A backup that refused the connection (no token) has closed it.
            if status != Status::Unauthenticated {
                *guard = Some(stream);
            }
            Ok(status)
        })
        .await;
        let outcome = match result {
            Ok(Ok(status)) => Ok(status),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        };
        match outcome {
            Ok(Status::Ok) => Ok(()),
            Ok(status) => Err(FrameWriteError::Refused(status)),
            Err(reason) => {
                self.forget(addr, &slot);
                Err(FrameWriteError::Transport(format!(
                    "soft-NIC {addr}: {reason}"
                )))
            }
        }
    }

    fn slot(&self, addr: &str) -> ConnectionSlot {
        let mut connections = self.connections.lock();
        Arc::clone(connections.entry(addr.to_string()).or_default())
    }

    /// Drops the map's entry for `addr` if it is still `slot` (a failed connection), so
    /// the next call starts a fresh slot. A call holding `slot` keeps using it.
    fn forget(&self, addr: &str, slot: &ConnectionSlot) {
        let mut connections = self.connections.lock();
        if connections
            .get(addr)
            .is_some_and(|current| Arc::ptr_eq(current, slot))
        {
            connections.remove(addr);
        }
    }
}

/// Dials a backup's soft-NIC and proves `token`, if any.
async fn dial(addr: &str, token: Option<&crate::auth::ClusterToken>) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    crate::rpc::connection::set_keepalive(&stream);
    if let Some(token) = token {
        crate::auth::client_handshake(&mut stream, token)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(stream)
}

/// Sends one request (header and bytes in vectored writes, no copy) and reads its reply.
async fn exchange(
    stream: &mut TcpStream,
    header: &[u8; NIC_REQUEST_HEADER_BYTES],
    bytes: &[u8],
) -> Result<Status, String> {
    let (mut header_sent, mut bytes_sent) = (0, 0);
    while header_sent < header.len() || bytes_sent < bytes.len() {
        let parts = [
            IoSlice::new(&header[header_sent..]),
            IoSlice::new(&bytes[bytes_sent..]),
        ];
        let written = stream
            .write_vectored(&parts)
            .await
            .map_err(|e| format!("send failed: {e}"))?;
        if written == 0 {
            return Err("connection closed while sending".to_string());
        }
        let to_header = written.min(header.len() - header_sent);
        header_sent += to_header;
        bytes_sent += written - to_header;
    }
    let mut reply = [0u8; NIC_REPLY_BYTES];
    stream
        .read_exact(&mut reply)
        .await
        .map_err(|e| format!("no reply: {e}"))?;
    Ok(Status::from_code(u16::from_le_bytes(reply)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    /// Larger than the inline limit, so a whole-frame write takes the blocking path.
    const FRAME_BYTES: usize = NIC_INLINE_PLACE_BYTES_MAX + 4096;
    const TIMEOUT: Duration = Duration::from_secs(5);
    /// The one open frame of [`VecTarget`], at its epoch.
    const FRAME: FrameHandle = FrameHandle(1);
    const EPOCH: Epoch = Epoch(1);

    /// A frame per handle in a `Vec`; handle 1 at epoch 1 is the only open frame, and
    /// handle 2 refuses with `Fenced`.
    #[derive(Debug)]
    struct VecTarget {
        frame: Mutex<Vec<u8>>,
    }

    impl NicTarget for VecTarget {
        fn place(
            &self,
            handle: FrameHandle,
            epoch: Epoch,
            offset: u64,
            bytes: &[u8],
        ) -> Result<(), Status> {
            match (handle.0, epoch.0) {
                (1, 1) => {}
                (1, _) => return Err(Status::StaleEpoch),
                (2, _) => return Err(Status::Fenced),
                _ => return Err(Status::UnknownFrame),
            }
            let mut frame = self.frame.lock();
            let end = offset
                .checked_add(bytes.len() as u64)
                .filter(|&end| end <= frame.len() as u64)
                .ok_or(Status::InvalidArgument)?;
            frame[offset as usize..end as usize].copy_from_slice(bytes);
            Ok(())
        }
    }

    struct Server {
        addr: String,
        target: Arc<VecTarget>,
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<()>,
    }

    async fn start() -> Server {
        start_with(crate::auth::Security::open()).await
    }

    async fn start_with(security: crate::auth::Security) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let target = Arc::new(VecTarget {
            frame: Mutex::new(vec![0; FRAME_BYTES]),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&target);
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            serve_with(listener, served, shutdown, &security).await;
        });
        Server {
            addr,
            target,
            stop,
            task,
        }
    }

    /// Connects and sends raw bytes.
    async fn raw_request(addr: &str, bytes: &[u8]) -> TcpStream {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(bytes).await.expect("send");
        stream
    }

    async fn read_to_end(stream: &mut TcpStream) -> Vec<u8> {
        let mut out = Vec::new();
        tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut out))
            .await
            .expect("server closes the connection")
            .expect("read");
        out
    }

    fn header(handle: u64, epoch: u64, offset: u64, len: u32) -> [u8; NIC_REQUEST_HEADER_BYTES] {
        RequestHeader {
            handle: FrameHandle(handle),
            epoch: Epoch(epoch),
            offset,
            len,
        }
        .encode()
    }

    #[tokio::test]
    async fn write_lands_in_the_frame_and_the_connection_is_reused() {
        let server = start().await;
        let client = NicClient::new();
        client
            .write(&server.addr, FRAME, EPOCH, 10, b"hello", TIMEOUT)
            .await
            .expect("write");
        client
            .write(&server.addr, FRAME, EPOCH, 0, b"0123456789", TIMEOUT)
            .await
            .expect("second write, same connection");
        assert_eq!(&server.target.frame.lock()[..15], b"0123456789hello");
        assert_eq!(client.connections.lock().len(), 1);
        // A write larger than the inline limit is placed on a blocking thread.
        client
            .write(&server.addr, FRAME, EPOCH, 0, &[7u8; FRAME_BYTES], TIMEOUT)
            .await
            .expect("full frame");
        assert!(server.target.frame.lock().iter().all(|&b| b == 7));
    }

    #[tokio::test]
    async fn a_backup_with_a_token_takes_writes_only_from_masters_that_prove_it() {
        let token = crate::auth::test_token;
        let server = start_with(crate::auth::Security::with_token(token(
            "the cluster's token",
        )))
        .await;
        let tokenless = NicClient::with_token(None);
        // A small write and a whole frame: both read the refusal, not a reset.
        for bytes in [&b"intruder"[..], &[9u8; FRAME_BYTES][..]] {
            let refused = tokenless
                .write(&server.addr, FRAME, EPOCH, 0, bytes, TIMEOUT)
                .await;
            assert!(
                matches!(
                    refused,
                    Err(FrameWriteError::Refused(Status::Unauthenticated))
                ),
                "{} bytes: {refused:?}",
                bytes.len()
            );
        }
        let wrong = NicClient::with_token(Some(token("another cluster's")));
        let refused = wrong
            .write(&server.addr, FRAME, EPOCH, 0, b"intruder", TIMEOUT)
            .await;
        assert!(
            matches!(&refused, Err(FrameWriteError::Transport(reason)) if reason.contains("different cluster token")),
            "{refused:?}"
        );
        assert!(
            server.target.frame.lock().iter().all(|&b| b == 0),
            "nothing landed"
        );
        let member = NicClient::with_token(Some(token("the cluster's token")));
        member
            .write(&server.addr, FRAME, EPOCH, 0, b"member", TIMEOUT)
            .await
            .expect("the token admits the write");
        member
            .write(&server.addr, FRAME, EPOCH, 6, b"again", TIMEOUT)
            .await
            .expect("on the same connection");
        assert_eq!(&server.target.frame.lock()[..11], b"memberagain");
        // A master with a token and a backup without: refused, and told why.
        let open = start().await;
        let refused = member
            .write(&open.addr, FRAME, EPOCH, 0, b"x", TIMEOUT)
            .await;
        assert!(
            matches!(&refused, Err(FrameWriteError::Transport(reason)) if reason.contains("holds no cluster token")),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn refusals_come_back_as_their_status_and_keep_the_connection() {
        let server = start().await;
        let client = NicClient::new();
        let cases = [
            (1, 2, 0, Status::StaleEpoch),
            (2, 1, 0, Status::Fenced),
            (9, 1, 0, Status::UnknownFrame),
            (1, 1, FRAME_BYTES as u64, Status::InvalidArgument),
            (1, 1, u64::MAX, Status::InvalidArgument),
        ];
        for (handle, epoch, offset, expected) in cases {
            match client
                .write(
                    &server.addr,
                    FrameHandle(handle),
                    Epoch(epoch),
                    offset,
                    b"x",
                    TIMEOUT,
                )
                .await
            {
                Err(FrameWriteError::Refused(status)) => assert_eq!(status, expected),
                other => panic!("{handle}/{epoch}/{offset}: {other:?}"),
            }
        }
        client
            .write(&server.addr, FRAME, EPOCH, 0, b"after", TIMEOUT)
            .await
            .expect("the connection still works");
        assert_eq!(&server.target.frame.lock()[..5], b"after");
    }

    #[tokio::test]
    async fn bad_magic_closes_only_that_connection() {
        let server = start().await;
        let client = NicClient::new();
        client
            .write(&server.addr, FRAME, EPOCH, 0, b"one", TIMEOUT)
            .await
            .expect("write");
        let mut bad = header(1, 1, 0, 3);
        bad[0] = b'X';
        let mut garbage = raw_request(&server.addr, &bad).await;
        assert_eq!(read_to_end(&mut garbage).await, Vec::<u8>::new());
        client
            .write(&server.addr, FRAME, EPOCH, 0, b"two", TIMEOUT)
            .await
            .expect("other connection unaffected");
        assert_eq!(&server.target.frame.lock()[..3], b"two");
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_and_its_connection_closed() {
        let server = start().await;
        let mut stream = raw_request(&server.addr, &header(1, 1, 0, NIC_WRITE_BYTES_MAX + 1)).await;
        let answer = read_to_end(&mut stream).await;
        assert_eq!(
            answer,
            Status::MessageTooLarge.code().to_le_bytes().to_vec()
        );
        // The client refuses without sending.
        let client = NicClient::new();
        let huge = vec![0u8; NIC_WRITE_BYTES_MAX as usize + 1];
        assert!(matches!(
            client
                .write(&server.addr, FRAME, EPOCH, 0, &huge, TIMEOUT)
                .await,
            Err(FrameWriteError::Refused(Status::MessageTooLarge))
        ));
        assert!(client.connections.lock().is_empty());
        client
            .write(&server.addr, FRAME, EPOCH, 0, b"ok", TIMEOUT)
            .await
            .expect("the server still serves");
    }

    #[tokio::test]
    async fn the_server_survives_a_client_that_disconnects_mid_request() {
        let server = start().await;
        for cut in [
            1,
            NIC_REQUEST_HEADER_BYTES - 1,
            NIC_REQUEST_HEADER_BYTES + 2,
        ] {
            let mut request = header(1, 1, 0, 8).to_vec();
            request.extend_from_slice(b"abcdefgh");
            let stream = raw_request(&server.addr, &request[..cut]).await;
            drop(stream);
        }
        // Nothing was placed from the cut requests.
        tokio::task::yield_now().await;
        let client = NicClient::new();
        client
            .write(&server.addr, FRAME, EPOCH, 100, b"alive", TIMEOUT)
            .await
            .expect("still serving");
        let frame = server.target.frame.lock();
        assert!(frame[..8].iter().all(|&b| b == 0));
        assert_eq!(&frame[100..105], b"alive");
    }

    #[tokio::test]
    async fn transport_failures_drop_the_connection_and_a_later_write_redials() {
        let server = start().await;
        let client = NicClient::new();
        client
            .write(&server.addr, FRAME, EPOCH, 0, b"a", TIMEOUT)
            .await
            .expect("write");
        // Stop the server: its connections close.
        let Server {
            addr, stop, task, ..
        } = server;
        drop(stop);
        task.await.expect("server stops");
        match client.write(&addr, FRAME, EPOCH, 0, b"b", TIMEOUT).await {
            Err(FrameWriteError::Transport(reason)) => assert!(reason.contains(&addr), "{reason}"),
            other => panic!("expected a transport error, got {other:?}"),
        }
        assert!(client.connections.lock().is_empty());
        // A fresh server on another port: the client dials it.
        let server = start().await;
        client
            .write(&server.addr, FRAME, EPOCH, 0, b"c", TIMEOUT)
            .await
            .expect("redial");
        // A silent peer: the write times out as a transport error.
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let silent_addr = silent.local_addr().expect("addr").to_string();
        match client
            .write(
                &silent_addr,
                FRAME,
                EPOCH,
                0,
                b"d",
                Duration::from_millis(100),
            )
            .await
        {
            Err(FrameWriteError::Transport(reason)) => {
                assert!(reason.contains("no answer"), "{reason}")
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}
