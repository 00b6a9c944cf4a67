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
//! * Services answer unknown opcodes and undecodable payloads with `UnknownOpcode` and
//!   `MalformedRequest` replies; the connection stays open.
//! * A peer that disconnects with requests in flight: they run to completion (a write
//!   is applied or not, atomically) and their replies are discarded.

use super::connection::{next_frame, ReadFrameError};
use super::frame::{FrameHeader, Opcode, FRAME_HEADER_BYTES};
use super::message::WireMessage;
use crate::limits::{RPC_CONNECTIONS_MAX, RPC_IN_FLIGHT_PER_CONNECTION_MAX, RPC_PAYLOAD_BYTES_MAX};
use crate::status::Status;
use bytes::{Bytes, BytesMut};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
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
}

/// A reply: a status and its encoded payload, behind room for the frame header.
pub struct Reply {
    status: Status,
    /// Invariant: the first [`FRAME_HEADER_BYTES`] are reserved for the header.
    frame: BytesMut,
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
        }
    }

    /// A failed reply: `status` with a human-readable detail as payload.
    pub fn error(status: Status, detail: impl fmt::Display) -> Reply {
        let detail = detail.to_string();
        let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + detail.len());
        frame.resize(FRAME_HEADER_BYTES, 0);
        frame.extend_from_slice(detail.as_bytes());
        Reply { status, frame }
    }

    /// Decodes a request payload, or produces the `MalformedRequest` reply for it.
    pub fn decode<M: WireMessage>(payload: Bytes) -> Result<M, Reply> {
        M::decode(payload).map_err(|e| Reply::error(Status::MalformedRequest, e))
    }

    /// The reply's status.
    pub fn status(&self) -> Status {
        self.status
    }

    fn into_frame(mut self, opcode: Opcode, rpc_id: u64) -> BytesMut {
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
    /// and drops every connection.
    pub async fn run<S: Service>(
        listener: TcpListener,
        service: Arc<S>,
        shutdown: impl Future<Output = ()>,
    ) {
        let connection_permits = Arc::new(Semaphore::new(RPC_CONNECTIONS_MAX));
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                _ = &mut shutdown => break,
                permit = Arc::clone(&connection_permits).acquire_owned() => permit,
            };
            let Ok(permit) = permit else { break };
            let accepted = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, peer)) => {
                    let service = Arc::clone(&service);
                    connections.spawn(async move {
                        serve_connection(stream, service).await;
                        tracing::trace!(%peer, "connection closed");
                        drop(permit);
                    });
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
            // Reap finished connections so the set does not grow without bound.
            while connections.try_join_next().is_some() {}
        }
        connections.shutdown().await;
    }
}

async fn serve_connection<S: Service>(stream: TcpStream, service: Arc<S>) {
    if stream.set_nodelay(true).is_err() {
        return;
    }
    let (mut reader, writer) = stream.into_split();
    let writer = Arc::new(Mutex::new(writer));
    let in_flight = Arc::new(Semaphore::new(RPC_IN_FLIGHT_PER_CONNECTION_MAX));
    let mut requests = JoinSet::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        let (header, payload) = match next_frame(&mut reader, &mut buf).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(ReadFrameError::TooLarge { header, len }) => {
                let reply = Reply::error(
                    Status::MessageTooLarge,
                    format!("payload of {len} bytes exceeds the limit of {RPC_PAYLOAD_BYTES_MAX}"),
                );
                send_reply(&writer, reply.into_frame(header.opcode, header.rpc_id)).await;
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
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break;
        };
        let service = Arc::clone(&service);
        let writer = Arc::clone(&writer);
        requests.spawn(async move {
            let reply = service.handle(header.opcode, payload).await;
            send_reply(&writer, reply.into_frame(header.opcode, header.rpc_id)).await;
            drop(permit);
        });
        while requests.try_join_next().is_some() {}
    }
    // Requests already running finish (their effects are atomic); their replies go
    // nowhere if the peer left.
    while requests.join_next().await.is_some() {}
}

async fn send_reply(writer: &Mutex<OwnedWriteHalf>, frame: BytesMut) {
    let mut writer = writer.lock().await;
    // A failed write means the peer is gone; the reader notices and ends the connection.
    let _ = writer.write_all(&frame).await;
}
