//! Tests of the RPC layer over real loopback sockets.
//!
//! A tiny [`TestService`] (echo, sleep, error) runs behind [`RpcServer`]; the tests
//! drive it through [`Connection`] and [`RpcPool`] for the client's view, and through
//! plain `TcpStream`s for frames no well-behaved client would send. Client-side failure
//! handling (stray replies, a peer that talks nonsense) uses a raw listener as the peer.
//!
//! Every listener binds port 0 (only the pool test re-binds the port it was given), and
//! everything that could hang runs under a timeout, so a bug fails a test instead of
//! stalling CI.

use super::frame::{FrameHeader, Opcode, FRAME_HEADER_BYTES};
use super::message::{DecodeError, Rpc, WireMessage};
use super::server::{HandleFuture, Reply, RpcServer, Service};
use super::{Connection, RpcError, RpcPool};
use crate::auth::{test_token, Security};
use crate::limits::RPC_PAYLOAD_BYTES_MAX;
use crate::status::Status;
use bytes::{Bytes, BytesMut};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{timeout, Instant};

/// Replies with the request payload as is.
const OP_ECHO: Opcode = Opcode(7001);
/// Payload: milliseconds (u64, little-endian) ‖ tag. Sleeps, then echoes the payload.
const OP_SLEEP: Opcode = Opcode(7002);
/// Replies `InvalidArgument` with the detail "detail".
const OP_ERROR: Opcode = Opcode(7003);
/// Records the payload in [`TestService::recorded`], then replies with nothing.
const OP_RECORD: Opcode = Opcode(7004);
/// Replies `Ok` with [`RPC_PAYLOAD_BYTES_MAX`] + 1 bytes, one more than a frame carries.
const OP_HUGE_REPLY: Opcode = Opcode(7005);
/// Served by nobody.
const OP_UNKNOWN: Opcode = Opcode(7999);

/// Bound on any single step a test waits for; a step past it is a hang, i.e. a bug.
const STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// How soon a server must close a connection that sent garbage.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The service behind every test server.
#[derive(Debug, Default)]
struct TestService {
    /// Sleep requests that began.
    sleeps_started: AtomicU64,
    /// Sleep requests that ran to completion, whether or not their caller stayed.
    sleeps_done: AtomicU64,
    /// Every payload [`OP_RECORD`] received, in order.
    recorded: parking_lot::Mutex<Vec<Bytes>>,
}

impl Service for TestService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        Box::pin(async move {
            match opcode {
                OP_ECHO => Reply::ok_with(|out| out.extend_from_slice(&payload)),
                OP_SLEEP => {
                    let Some(ms) = payload.get(..8) else {
                        return Reply::error(Status::MalformedRequest, "sleep takes 8 bytes of ms");
                    };
                    let ms = u64::from_le_bytes(ms.try_into().expect("slice of 8 bytes"));
                    self.sleeps_started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    self.sleeps_done.fetch_add(1, Ordering::SeqCst);
                    Reply::ok_with(|out| out.extend_from_slice(&payload))
                }
                OP_ERROR => Reply::error(Status::InvalidArgument, "detail"),
                OP_RECORD => {
                    self.recorded.lock().push(payload);
                    Reply::ok_with(|_| {})
                }
                OP_HUGE_REPLY => {
                    Reply::ok_with(|out| out.resize(out.len() + RPC_PAYLOAD_BYTES_MAX + 1, 0x11))
                }
                other => Reply::error(Status::UnknownOpcode, format!("opcode {}", other.0)),
            }
        })
    }
}

/// A message carried as raw bytes, for the test RPCs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Blob(Bytes);

impl WireMessage for Blob {
    fn encode(&self, out: &mut BytesMut) {
        out.extend_from_slice(&self.0);
    }
    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        Ok(Blob(payload))
    }
}

/// [`OP_ECHO`] as a typed RPC.
#[derive(Debug)]
struct Echo;

impl Rpc for Echo {
    const OPCODE: Opcode = OP_ECHO;
    const NAME: &'static str = "Echo";
    type Request = Blob;
    type Reply = Blob;
}

/// [`OP_ERROR`] as a typed RPC.
#[derive(Debug)]
struct Fail;

impl Rpc for Fail {
    const OPCODE: Opcode = OP_ERROR;
    const NAME: &'static str = "Fail";
    type Request = ();
    type Reply = ();
}

/// [`OP_HUGE_REPLY`] as a typed RPC.
#[derive(Debug)]
struct HugeReply;

impl Rpc for HugeReply {
    const OPCODE: Opcode = OP_HUGE_REPLY;
    const NAME: &'static str = "HugeReply";
    type Request = ();
    type Reply = Blob;
}

/// A running [`RpcServer`] with a [`TestService`]. Dropping it shuts the server down
/// (the shutdown future completes when its sender goes).
#[derive(Debug)]
struct TestServer {
    addr: SocketAddr,
    service: Arc<TestService>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TestServer {
    async fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        TestServer::serve(listener)
    }

    fn serve(listener: TcpListener) -> TestServer {
        TestServer::serve_with(listener, Arc::new(Security::open()))
    }

    /// A server that secures its connections with `security`.
    async fn start_with(security: Security) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        TestServer::serve_with(listener, Arc::new(security))
    }

    fn serve_with(listener: TcpListener, security: Arc<Security>) -> TestServer {
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let service = Arc::new(TestService::default());
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(RpcServer::run_with(
            listener,
            Arc::clone(&service),
            async move {
                let _ = shutdown_rx.await;
            },
            security,
        ));
        TestServer {
            addr,
            service,
            shutdown: Some(shutdown),
            task,
        }
    }

    fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Triggers shutdown and waits for `run` to return, which it must do promptly even
    /// with requests in flight.
    async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        timeout(STEP_TIMEOUT, &mut self.task)
            .await
            .expect("the server stops promptly after shutdown")
            .expect("the server task does not panic");
    }
}

fn deadline_in(after: Duration) -> Instant {
    Instant::now() + after
}

/// A request frame: room for the header, then `payload`.
fn frame(payload: &[u8]) -> BytesMut {
    let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + payload.len());
    frame.resize(FRAME_HEADER_BYTES, 0);
    frame.extend_from_slice(payload);
    frame
}

fn sleep_payload(ms: u64, tag: &[u8]) -> Vec<u8> {
    let mut payload = ms.to_le_bytes().to_vec();
    payload.extend_from_slice(tag);
    payload
}

fn header_bytes(header: FrameHeader) -> [u8; FRAME_HEADER_BYTES] {
    let mut bytes = [0u8; FRAME_HEADER_BYTES];
    header.write_to(&mut bytes);
    bytes
}

fn request_header(opcode: Opcode, rpc_id: u64, payload_len: u32) -> FrameHeader {
    FrameHeader {
        opcode,
        is_reply: false,
        status: Status::Ok,
        rpc_id,
        payload_len,
    }
}

async fn connect(addr: &str) -> Connection {
    timeout(STEP_TIMEOUT, Connection::connect(addr))
        .await
        .expect("connect does not hang")
        .expect("the server accepts connections")
}

async fn raw_connect(addr: &str) -> TcpStream {
    timeout(STEP_TIMEOUT, TcpStream::connect(addr))
        .await
        .expect("connect does not hang")
        .expect("the server accepts connections")
}

/// Reads one whole frame from a raw stream.
async fn read_frame(stream: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    timeout(STEP_TIMEOUT, async {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        stream
            .read_exact(&mut header)
            .await
            .expect("a frame header");
        let header = FrameHeader::read_from(&header).expect("a well-formed header");
        let mut payload = vec![0u8; header.payload_len as usize];
        stream
            .read_exact(&mut payload)
            .await
            .expect("the frame's payload");
        (header, payload)
    })
    .await
    .expect("a frame arrives")
}

/// Asserts that the peer closes `stream` within [`CLOSE_TIMEOUT`] without sending
/// anything first. A reset counts as closed.
async fn assert_closed_by_peer(stream: &mut TcpStream, why: &str) {
    let mut buf = [0u8; 64];
    match timeout(CLOSE_TIMEOUT, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("{why}: expected a close, got {n} bytes: {:?}", &buf[..n]),
        Err(_) => panic!("{why}: the connection is still open after {CLOSE_TIMEOUT:?}"),
    }
}

/// Polls `condition` until it holds, failing the test after [`STEP_TIMEOUT`].
async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let give_up = Instant::now() + STEP_TIMEOUT;
    while !condition() {
        assert!(Instant::now() < give_up, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An echo over `connection` returns its payload.
async fn assert_echo_works(connection: &Connection, tag: &str) {
    let (header, payload) = connection
        .call_raw(OP_ECHO, frame(tag.as_bytes()), deadline_in(STEP_TIMEOUT))
        .await
        .unwrap_or_else(|e| panic!("echo {tag:?} failed: {e}"));
    assert_eq!(header.status, Status::Ok);
    assert_eq!(&payload[..], tag.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_calls_in_flight_on_one_connection_are_matched_by_id() {
    const CALLS: usize = 200;
    let server = TestServer::start().await;
    let connection = Arc::new(connect(&server.addr()).await);
    let finished_count = Arc::new(AtomicU64::new(0));
    let mut calls = JoinSet::new();
    for i in 0..CALLS {
        let connection = Arc::clone(&connection);
        let finished_count = Arc::clone(&finished_count);
        calls.spawn(async move {
            // Distinct contents and lengths, so a reply handed to the wrong caller shows.
            let tag = format!("call {i};").repeat(i % 7 + 1).into_bytes();
            // Every fourth call sleeps, the earliest the longest (100 ms down to 1 ms),
            // so replies come back in a different order than the requests went out.
            let (opcode, payload) = if i % 4 == 0 {
                (OP_SLEEP, sleep_payload(((CALLS - i) / 2) as u64, &tag))
            } else {
                (OP_ECHO, tag)
            };
            let (header, reply) = connection
                .call_raw(opcode, frame(&payload), deadline_in(STEP_TIMEOUT))
                .await
                .unwrap_or_else(|e| panic!("call {i} failed: {e}"));
            let finished_as = finished_count.fetch_add(1, Ordering::SeqCst);
            assert!(header.is_reply);
            assert_eq!(header.opcode, opcode, "call {i}");
            assert_eq!(header.status, Status::Ok, "call {i}");
            assert_eq!(reply[..], payload[..], "call {i} got another call's reply");
            (i, finished_as)
        });
    }
    let mut finished_as = vec![u64::MAX; CALLS];
    timeout(STEP_TIMEOUT, async {
        while let Some(done) = calls.join_next().await {
            let (i, order) = done.expect("a call task panicked");
            finished_as[i] = order;
        }
    })
    .await
    .expect("all calls finish");
    assert!(finished_as.iter().all(|&order| order != u64::MAX));
    assert!(
        finished_as[0] > finished_as[1],
        "the 100 ms sleep issued first finished before the echo issued after it"
    );
    assert!(!connection.is_closed());
    assert_eq!(connection.pending_len(), 0);
}

#[tokio::test]
async fn a_call_past_its_deadline_times_out_and_the_connection_stays_usable() {
    let server = TestServer::start().await;
    let connection = connect(&server.addr()).await;
    let result = connection
        .call_raw(
            OP_SLEEP,
            frame(&sleep_payload(300, b"late")),
            deadline_in(Duration::from_millis(50)),
        )
        .await;
    match result {
        Err(RpcError::Timeout { opcode, .. }) => assert_eq!(opcode, OP_SLEEP),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(
        server.service.sleeps_done.load(Ordering::SeqCst),
        0,
        "the call gave up at its deadline, before the reply existed"
    );
    assert_eq!(
        connection.pending_len(),
        0,
        "the timed-out call left its slot"
    );
    assert!(!connection.is_closed());

    // This call is still waiting when the late reply arrives (at ~300 ms); it must get
    // its own reply, not the late one.
    let mine = sleep_payload(400, b"mine");
    let (header, reply) = connection
        .call_raw(OP_SLEEP, frame(&mine), deadline_in(STEP_TIMEOUT))
        .await
        .expect("a call after a timeout succeeds");
    assert_eq!(header.status, Status::Ok);
    assert_eq!(reply[..], mine[..]);
    assert_eq!(server.service.sleeps_done.load(Ordering::SeqCst), 2);
    assert_echo_works(&connection, "after the timeout").await;
    assert_eq!(connection.pending_len(), 0);
}

#[tokio::test]
async fn a_cancelled_call_leaves_no_pending_slot_behind() {
    let server = TestServer::start().await;
    let connection = connect(&server.addr()).await;
    // The caller gives up from outside (a select!, a dropped task) long before its own
    // deadline and before the reply exists.
    let cancelled = timeout(
        Duration::from_millis(50),
        connection.call_raw(
            OP_SLEEP,
            frame(&sleep_payload(1_000, b"abandoned")),
            deadline_in(Duration::from_secs(30)),
        ),
    )
    .await;
    assert!(cancelled.is_err(), "the sleep cannot have answered yet");
    assert_eq!(
        connection.pending_len(),
        0,
        "a cancelled call must not keep its reply slot until a reply that may never come"
    );
    assert_echo_works(&connection, "after the cancel").await;
}

#[tokio::test]
async fn a_call_cancelled_while_waiting_to_write_leaves_no_pending_slot_behind() {
    // A peer that reads nothing at first: the first call's large frame fills the socket
    // buffers and holds the writer; a second call is cancelled while queued behind it,
    // before any byte of its frame went out, so no reply will ever remove its slot.
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound").to_string();
    let connection = Arc::new(connect(&addr).await);
    let (mut peer, _) = listener.accept().await.expect("accept");
    let big = vec![0x5A; 16 * 1024 * 1024];
    let first = tokio::spawn({
        let connection = Arc::clone(&connection);
        let frame = frame(&big);
        async move {
            connection
                .call_raw(OP_ECHO, frame, deadline_in(STEP_TIMEOUT))
                .await
        }
    });
    // The first call registers its slot and takes the writer in the same poll.
    wait_until("the first call is writing", || {
        connection.pending_len() == 1
    })
    .await;
    let cancelled = timeout(
        Duration::from_millis(50),
        connection.call_raw(
            OP_ECHO,
            frame(b"queued"),
            deadline_in(Duration::from_secs(30)),
        ),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the second call cannot have been written"
    );

    // The peer catches up and answers the first call; the connection stays healthy.
    let (request, payload) = read_frame(&mut peer).await;
    assert_eq!(payload.len(), big.len());
    let reply = FrameHeader {
        is_reply: true,
        ..request_header(OP_ECHO, request.rpc_id, 0)
    };
    peer.write_all(&header_bytes(reply)).await.expect("write");
    timeout(STEP_TIMEOUT, first)
        .await
        .expect("the first call completes")
        .expect("no panic")
        .expect("the first call gets its reply");
    assert!(!connection.is_closed());
    assert_eq!(
        connection.pending_len(),
        0,
        "the cancelled call's slot outlived it"
    );
}

#[tokio::test]
async fn error_status_carries_the_detail() {
    let server = TestServer::start().await;
    let connection = connect(&server.addr()).await;
    let error = connection
        .call::<Fail>(&(), deadline_in(STEP_TIMEOUT))
        .await
        .expect_err("the error opcode fails");
    match &error {
        RpcError::Status {
            addr,
            status,
            detail,
        } => {
            assert_eq!(addr, &server.addr());
            assert_eq!(*status, Status::InvalidArgument);
            assert_eq!(detail, "detail");
        }
        other => panic!("expected a status error, got {other:?}"),
    }
    assert_eq!(error.status(), Some(Status::InvalidArgument));
    assert!(!error.is_transport());

    let (header, payload) = connection
        .call_raw(OP_ERROR, frame(b""), deadline_in(STEP_TIMEOUT))
        .await
        .expect("an error reply is still a reply");
    assert_eq!(header.status, Status::InvalidArgument);
    assert_eq!(&payload[..], b"detail");
    assert!(!connection.is_closed());
}

#[tokio::test]
async fn unknown_opcode_gets_an_error_reply_and_the_connection_stays_open() {
    let server = TestServer::start().await;
    let connection = connect(&server.addr()).await;
    let (header, _) = connection
        .call_raw(OP_UNKNOWN, frame(b"anything"), deadline_in(STEP_TIMEOUT))
        .await
        .expect("an unknown opcode gets a reply");
    assert!(header.is_reply);
    assert_eq!(header.opcode, OP_UNKNOWN);
    assert_eq!(header.status, Status::UnknownOpcode);
    assert!(!connection.is_closed());
    assert_echo_works(&connection, "after the unknown opcode").await;
}

#[tokio::test]
async fn bad_magic_closes_the_connection_and_the_server_keeps_serving_others() {
    let server = TestServer::start().await;
    let bystander = connect(&server.addr()).await;
    assert_echo_works(&bystander, "before").await;

    let mut raw = raw_connect(&server.addr()).await;
    raw.write_all(&[0xA5; FRAME_HEADER_BYTES])
        .await
        .expect("write garbage");
    assert_closed_by_peer(&mut raw, "bad magic").await;

    assert_echo_works(&bystander, "connection open before the garbage").await;
    assert_echo_works(&connect(&server.addr()).await, "connection opened after").await;
}

#[tokio::test]
async fn an_oversized_payload_gets_message_too_large_then_close() {
    let server = TestServer::start().await;
    // One past the limit, and the largest length a header can announce (4 GiB): the
    // server answers from the header alone, without reading or allocating the payload.
    for (rpc_id, len) in [(77, RPC_PAYLOAD_BYTES_MAX as u32 + 1), (78, u32::MAX)] {
        let mut raw = raw_connect(&server.addr()).await;
        raw.write_all(&header_bytes(request_header(OP_ECHO, rpc_id, len)))
            .await
            .expect("write header");
        let (header, detail) = read_frame(&mut raw).await;
        assert!(header.is_reply);
        assert_eq!(header.rpc_id, rpc_id);
        assert_eq!(header.opcode, OP_ECHO);
        assert_eq!(header.status, Status::MessageTooLarge, "{len} bytes");
        assert!(!detail.is_empty(), "the reply explains the limit");
        assert_closed_by_peer(&mut raw, "after MessageTooLarge").await;
    }
    assert_echo_works(&connect(&server.addr()).await, "after the oversized ones").await;
}

#[tokio::test]
async fn a_reply_frame_sent_to_a_server_closes_the_connection() {
    let server = TestServer::start().await;
    let reply = FrameHeader {
        is_reply: true,
        ..request_header(OP_ECHO, 5, 0)
    };
    // A request carries status Ok; any other status marks a confused peer too.
    let request_with_status = FrameHeader {
        status: Status::Internal,
        ..request_header(OP_ECHO, 6, 0)
    };
    for (header, why) in [
        (reply, "a reply frame"),
        (request_with_status, "a non-Ok request"),
    ] {
        let mut raw = raw_connect(&server.addr()).await;
        raw.write_all(&header_bytes(header))
            .await
            .expect("write header");
        assert_closed_by_peer(&mut raw, why).await;
    }
    assert_echo_works(&connect(&server.addr()).await, "afterwards").await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_request_does_not_disturb_the_server() {
    let server = TestServer::start().await;
    let bystander = connect(&server.addr()).await;

    // A header announcing 1000 bytes, then only 10, then gone.
    let mut cut_short = raw_connect(&server.addr()).await;
    cut_short
        .write_all(&header_bytes(request_header(OP_ECHO, 1, 1000)))
        .await
        .expect("write header");
    cut_short.write_all(&[7; 10]).await.expect("write payload");
    drop(cut_short);

    // A whole sleep request, gone before its reply.
    let mut impatient = raw_connect(&server.addr()).await;
    let payload = sleep_payload(100, b"nobody waits");
    let mut request = header_bytes(request_header(OP_SLEEP, 2, payload.len() as u32)).to_vec();
    request.extend_from_slice(&payload);
    impatient.write_all(&request).await.expect("write request");
    wait_until("the sleep request is running", || {
        server.service.sleeps_started.load(Ordering::SeqCst) == 1
    })
    .await;
    drop(impatient);

    // The orphaned request runs to completion; its reply goes nowhere.
    wait_until("the orphaned sleep finishes", || {
        server.service.sleeps_done.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(!server.task.is_finished(), "the server stopped");
    assert_echo_works(&bystander, "old connection").await;
    let fresh = connect(&server.addr()).await;
    assert_echo_works(&fresh, "new connection").await;
    let mine = sleep_payload(1, b"fresh sleep");
    let (_, reply) = fresh
        .call_raw(OP_SLEEP, frame(&mine), deadline_in(STEP_TIMEOUT))
        .await
        .expect("a sleep on a new connection succeeds");
    assert_eq!(reply[..], mine[..]);
}

#[tokio::test]
async fn server_shutdown_fails_calls_in_flight_with_connection_lost() {
    let server = TestServer::start().await;
    let connection = Arc::new(connect(&server.addr()).await);
    let call = tokio::spawn({
        let connection = Arc::clone(&connection);
        async move {
            connection
                .call_raw(
                    OP_SLEEP,
                    frame(&sleep_payload(10_000, b"outlived")),
                    deadline_in(Duration::from_secs(30)),
                )
                .await
        }
    });
    let service = Arc::clone(&server.service);
    wait_until("the sleep request is running", || {
        service.sleeps_started.load(Ordering::SeqCst) == 1
    })
    .await;

    // `stop` fails the test if the server waits for the 10 s sleep.
    server.stop().await;
    let result = timeout(Duration::from_secs(1), call)
        .await
        .expect("the call ends promptly once the server is gone")
        .expect("the call task does not panic");
    assert!(
        matches!(result, Err(RpcError::ConnectionLost { .. })),
        "expected ConnectionLost, got {result:?}"
    );
    assert!(connection.is_closed());
    assert_eq!(connection.pending_len(), 0);
    assert_eq!(service.sleeps_done.load(Ordering::SeqCst), 0);

    // A call on the connection already known closed never goes out: NotSent, which
    // (unlike ConnectionLost) tells the caller the peer cannot have executed it.
    let started = Instant::now();
    let again = connection
        .call_raw(OP_ECHO, frame(b"too late"), deadline_in(STEP_TIMEOUT))
        .await;
    assert!(
        matches!(again, Err(RpcError::NotSent { .. })),
        "expected NotSent, got {again:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a call on a closed connection waited for its deadline"
    );
}

#[tokio::test]
async fn the_pool_reconnects_after_the_peer_restarts() {
    let server = TestServer::start().await;
    let addr = server.addr;
    let pool = RpcPool::new();
    let echo = |tag: &'static str| {
        let pool = &pool;
        async move {
            let reply = timeout(
                STEP_TIMEOUT,
                pool.call::<Echo>(
                    &addr.to_string(),
                    &Blob(Bytes::from_static(tag.as_bytes())),
                    deadline_in(Duration::from_secs(1)),
                ),
            )
            .await
            .expect("a pool call does not hang");
            reply.map(|Blob(bytes)| {
                assert_eq!(&bytes[..], tag.as_bytes());
            })
        }
    };
    echo("first").await.expect("the first call succeeds");
    let first = pool.get(&addr.to_string()).await.expect("pooled");
    let again = pool.get(&addr.to_string()).await.expect("pooled");
    assert!(
        Arc::ptr_eq(&first, &again),
        "the pool reuses its connection"
    );
    drop((first, again));

    server.stop().await;
    // Nothing listens now; the port is free but may take a moment to be re-bindable.
    let give_up = Instant::now() + STEP_TIMEOUT;
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => break listener,
            Err(error) if Instant::now() < give_up => {
                tracing::debug!(%error, %addr, "re-bind failed; retrying");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => panic!("cannot re-bind {addr}: {error}"),
        }
    };
    let _restarted = TestServer::serve(listener);

    // The pool may not have noticed the old connection is dead before its first call;
    // that call may fail (as a transport error), the next one must dial anew.
    match echo("second").await {
        Ok(()) => {}
        Err(error) => {
            assert!(error.is_transport(), "unexpected error {error:?} on {addr}");
            echo("third")
                .await
                .unwrap_or_else(|e| panic!("the pool did not reconnect to {addr}: {e}"));
        }
    }
}

#[tokio::test]
async fn connect_to_a_closed_port_fails_with_a_refused_connect_error() {
    // Bound but not listening: the port stays this test's, and connections to it are
    // refused.
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind("127.0.0.1:0".parse().expect("an address"))
        .expect("bind a loopback port");
    let addr = socket
        .local_addr()
        .expect("a bound socket has an address")
        .to_string();

    let result = timeout(STEP_TIMEOUT, Connection::connect(&addr))
        .await
        .expect("connect does not hang");
    match result {
        Err(error @ RpcError::Connect { .. }) => {
            assert!(error.refused(), "{error:?}");
            assert!(error.to_string().contains(&addr), "{error}");
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
    let pool = RpcPool::new();
    let result = timeout(
        STEP_TIMEOUT,
        pool.call::<Echo>(
            &addr,
            &Blob(Bytes::new()),
            deadline_in(Duration::from_secs(1)),
        ),
    )
    .await
    .expect("a pool call does not hang");
    match result {
        Err(error @ RpcError::Connect { .. }) => {
            assert!(error.is_transport() && error.refused(), "{error:?}")
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
    drop(socket);
}

#[tokio::test]
async fn a_call_cancelled_mid_write_closes_the_connection() {
    // A peer that accepts but never reads: a large frame fills the socket buffers and
    // the write stalls part-way, so the deadline strikes mid-frame.
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound").to_string();
    let connection = connect(&addr).await;
    let (_peer, _) = listener.accept().await.expect("accept");

    let big = vec![0x5A; 32 * 1024 * 1024];
    let result = timeout(
        STEP_TIMEOUT,
        connection.call_raw(
            OP_ECHO,
            frame(&big),
            deadline_in(Duration::from_millis(100)),
        ),
    )
    .await
    .expect("the call ends at its deadline");
    // The frame never reached the peer whole, so the peer cannot have executed it: the
    // deadline struck before the request was sent, which is NotSent, not Timeout.
    assert!(
        matches!(result, Err(RpcError::NotSent { .. })),
        "expected NotSent, got {result:?}"
    );
    // Half a frame is on the wire: nothing sent after it could be framed correctly.
    assert!(connection.is_closed());
    assert_eq!(connection.pending_len(), 0);
    let next = connection
        .call_raw(OP_ECHO, frame(b"after"), deadline_in(STEP_TIMEOUT))
        .await;
    assert!(
        matches!(next, Err(RpcError::NotSent { .. })),
        "expected NotSent, got {next:?}"
    );
}

#[tokio::test]
async fn a_reply_for_an_unknown_rpc_id_is_dropped_and_the_right_one_delivered() {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound").to_string();
    let connection = Arc::new(connect(&addr).await);
    let (mut peer, _) = listener.accept().await.expect("accept");

    let call = tokio::spawn({
        let connection = Arc::clone(&connection);
        async move {
            connection
                .call_raw(OP_ECHO, frame(b"question"), deadline_in(STEP_TIMEOUT))
                .await
        }
    });
    let (request, payload) = read_frame(&mut peer).await;
    assert!(!request.is_reply);
    assert_eq!(&payload[..], b"question");
    for (rpc_id, answer) in [
        (request.rpc_id + 1000, &b"stray"[..]),
        (request.rpc_id, b"answer"),
    ] {
        let header = FrameHeader {
            is_reply: true,
            payload_len: answer.len() as u32,
            ..request_header(OP_ECHO, rpc_id, 0)
        };
        peer.write_all(&header_bytes(header)).await.expect("write");
        peer.write_all(answer).await.expect("write");
    }
    let (header, reply) = timeout(STEP_TIMEOUT, call)
        .await
        .expect("the call completes")
        .expect("no panic")
        .expect("the matching reply is delivered");
    assert_eq!(header.rpc_id, request.rpc_id);
    assert_eq!(&reply[..], b"answer");
    assert!(!connection.is_closed());
    assert_eq!(connection.pending_len(), 0);
}

#[tokio::test]
async fn a_peer_that_answers_with_a_malformed_frame_fails_calls_with_connection_lost() {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound").to_string();
    /// What the peer answers, given the request's rpc id.
    type Answer = fn(u64) -> [u8; FRAME_HEADER_BYTES];
    let answers: [(&str, Answer); 3] = [
        ("a request on a client connection", |id| {
            header_bytes(request_header(OP_ECHO, id, 0))
        }),
        ("an oversized reply", |id| {
            header_bytes(FrameHeader {
                is_reply: true,
                ..request_header(OP_ECHO, id, u32::MAX)
            })
        }),
        ("bad magic", |_| {
            let mut bytes = header_bytes(request_header(OP_ECHO, 1, 0));
            bytes[..4].copy_from_slice(b"PMAR");
            bytes
        }),
    ];
    for (what, answer) in answers {
        let connection = Arc::new(connect(&addr).await);
        let (mut peer, _) = listener.accept().await.expect("accept");
        let call = tokio::spawn({
            let connection = Arc::clone(&connection);
            async move {
                connection
                    .call_raw(OP_ECHO, frame(b"question"), deadline_in(STEP_TIMEOUT))
                    .await
            }
        });
        let (request, _) = read_frame(&mut peer).await;
        peer.write_all(&answer(request.rpc_id))
            .await
            .expect("write");
        let result = timeout(STEP_TIMEOUT, call)
            .await
            .expect("the call completes")
            .expect("no panic");
        assert!(
            matches!(result, Err(RpcError::ConnectionLost { .. })),
            "{what}: expected ConnectionLost, got {result:?}"
        );
        assert!(connection.is_closed(), "{what}");
        assert_eq!(connection.pending_len(), 0, "{what}");
    }
}

/// A TCP proxy on a fresh loopback port in front of `upstream`, for one connection. It
/// accepts and dials `upstream` at once but forwards nothing, in either direction, until
/// `release` is notified; until then a large frame sent through it fills the socket
/// buffers and the sender's write stalls part-way. The task ends when both directions
/// have closed.
async fn start_held_proxy(upstream: String, release: Arc<Notify>) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound").to_string();
    let task = tokio::spawn(async move {
        let (mut client, _) = timeout(STEP_TIMEOUT, listener.accept())
            .await
            .expect("the client dials the proxy")
            .expect("accept");
        let mut server = raw_connect(&upstream).await;
        release.notified().await;
        // Errors (a reset once one side is gone) end the proxy like a clean close.
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    });
    (addr, task)
}

/// A request frame carrying `len` bytes of `byte`.
fn uniform_frame(byte: u8, len: usize) -> BytesMut {
    let mut frame = frame(b"");
    frame.resize(FRAME_HEADER_BYTES + len, byte);
    frame
}

#[tokio::test]
async fn a_write_abandoned_mid_frame_is_never_completed_with_another_request() {
    const LEN: usize = 12 * 1024 * 1024;
    let server = TestServer::start().await;
    let release = Arc::new(Notify::new());
    let (proxy_addr, proxy) = start_held_proxy(server.addr(), Arc::clone(&release)).await;
    let connection = Arc::new(connect(&proxy_addr).await);

    // A: far more than the held proxy's socket buffers take, with a short deadline, so
    // the deadline strikes with A's frame half written and A still holding the writer.
    let a = tokio::spawn({
        let connection = Arc::clone(&connection);
        async move {
            connection
                .call_raw(
                    OP_RECORD,
                    uniform_frame(0xAA, LEN),
                    deadline_in(Duration::from_millis(300)),
                )
                .await
        }
    });
    wait_until("A is writing", || connection.pending_len() == 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // B: queued on the writer lock behind A, with all the time in the world.
    let b = tokio::spawn({
        let connection = Arc::clone(&connection);
        async move {
            connection
                .call_raw(
                    OP_RECORD,
                    uniform_frame(0xBB, LEN),
                    deadline_in(Duration::from_secs(30)),
                )
                .await
        }
    });
    wait_until("B waits behind A", || connection.pending_len() == 2).await;

    let a = timeout(STEP_TIMEOUT, a)
        .await
        .expect("A ends at its deadline")
        .expect("A does not panic");
    assert!(
        connection.is_closed(),
        "test premise: A's frame was cut short (the held proxy took all {LEN} bytes?); got {a:?}"
    );
    // A's frame never went out whole: the peer cannot have run it.
    match &a {
        Err(error @ RpcError::NotSent { .. }) => assert!(!error.may_have_executed()),
        other => panic!("A: expected NotSent, got {other:?}"),
    }

    // The proxy forwards again: whatever the client writes now reaches the server.
    release.notify_one();
    let b = timeout(STEP_TIMEOUT, b)
        .await
        .expect("B ends")
        .expect("B does not panic");

    // Close the client side; the server then sees the stream end (or garbage) and drops
    // its side, and only after every request it read has run, so once the proxy is done
    // the service has recorded everything it will ever receive.
    drop(connection);
    timeout(STEP_TIMEOUT, proxy)
        .await
        .expect("the proxied connection closes")
        .expect("the proxy does not panic");
    let recorded = server.service.recorded.lock().clone();
    for (i, payload) in recorded.iter().enumerate() {
        let aa = payload.iter().filter(|&&byte| byte == 0xAA).count();
        let bb = payload.iter().filter(|&&byte| byte == 0xBB).count();
        assert!(
            payload.len() == LEN && (aa == LEN || bb == LEN),
            "payload {i} the server executed is spliced: {} bytes, {aa} of 0xAA, {bb} of 0xBB",
            payload.len()
        );
    }
    match &b {
        Err(error @ RpcError::NotSent { .. }) => assert!(!error.may_have_executed()),
        other => panic!(
            "B: expected NotSent (written after A's half frame it would complete it), got {other:?}"
        ),
    }
    assert!(
        recorded.is_empty(),
        "neither A nor B went out whole, yet {} payloads were executed",
        recorded.len()
    );
}

#[tokio::test]
async fn errors_say_whether_the_request_may_have_executed() {
    let addr = || "10.0.0.9:7000".to_string();
    let never_ran = [
        RpcError::Connect {
            addr: addr(),
            reason: "refused".to_string(),
            refused: true,
        },
        RpcError::NotSent {
            addr: addr(),
            reason: "connection closed".to_string(),
        },
    ];
    for error in &never_ran {
        assert!(!error.may_have_executed(), "{error:?}");
        assert!(error.is_transport(), "{error:?}");
    }
    let may_have_run = [
        RpcError::ConnectionLost { addr: addr() },
        RpcError::Timeout {
            addr: addr(),
            opcode: OP_ECHO,
            rpc: "",
        },
    ];
    for error in &may_have_run {
        assert!(error.may_have_executed(), "{error:?}");
        assert!(error.is_transport(), "{error:?}");
    }

    let server = TestServer::start().await;
    let service = Arc::clone(&server.service);
    let busy = Arc::new(connect(&server.addr()).await);
    let idle = connect(&server.addr()).await;

    // Sent whole, then the deadline passed while the peer was running it: Timeout.
    let late = busy
        .call_raw(
            OP_SLEEP,
            frame(&sleep_payload(300, b"late")),
            deadline_in(Duration::from_millis(50)),
        )
        .await;
    match &late {
        Err(error @ RpcError::Timeout { .. }) => {
            assert!(error.may_have_executed());
            // An untyped call is named by its opcode; a typed one by its RPC.
            assert!(error
                .to_string()
                .starts_with(&format!("rpc {OP_SLEEP} to ")));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    let named = RpcError::Timeout {
        addr: addr(),
        opcode: OP_ECHO,
        rpc: Echo::NAME,
    };
    assert!(named.to_string().starts_with("rpc Echo to "), "{named}");
    assert_eq!(service.sleeps_started.load(Ordering::SeqCst), 1);

    // Sent whole, then the server died while running it: ConnectionLost.
    let in_flight = tokio::spawn({
        let busy = Arc::clone(&busy);
        async move {
            busy.call_raw(
                OP_SLEEP,
                frame(&sleep_payload(10_000, b"outlived")),
                deadline_in(Duration::from_secs(30)),
            )
            .await
        }
    });
    wait_until("the second sleep is running", || {
        service.sleeps_started.load(Ordering::SeqCst) == 2
    })
    .await;
    server.stop().await;
    let lost = timeout(STEP_TIMEOUT, in_flight)
        .await
        .expect("the call ends once the server is gone")
        .expect("no panic");
    match &lost {
        Err(error @ RpcError::ConnectionLost { .. }) => assert!(error.may_have_executed()),
        other => panic!("expected ConnectionLost, got {other:?}"),
    }

    // The idle connection notices the peer closed; a call on it never leaves: NotSent,
    // at once rather than at its deadline.
    wait_until("the idle connection sees the close", || idle.is_closed()).await;
    for (connection, which) in [(&*busy, "busy"), (&idle, "idle")] {
        let started = Instant::now();
        let result = connection
            .call_raw(OP_ECHO, frame(b"too late"), deadline_in(STEP_TIMEOUT))
            .await;
        match &result {
            Err(error @ RpcError::NotSent { .. }) => {
                assert!(!error.may_have_executed(), "{which}");
                assert!(error.is_transport(), "{which}");
            }
            other => panic!("{which}: expected NotSent, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{which}: a call on a closed connection waited for its deadline"
        );
        assert_eq!(connection.pending_len(), 0, "{which}");
    }
}

#[tokio::test]
async fn an_oversized_reply_fails_only_its_call_and_the_connection_stays_usable() {
    let server = TestServer::start().await;
    let connection = Arc::new(connect(&server.addr()).await);
    // A call in flight on the same connection while the oversized reply is produced.
    let bystander = tokio::spawn({
        let connection = Arc::clone(&connection);
        async move {
            let mine = sleep_payload(200, b"bystander");
            let (_, reply) = connection
                .call_raw(OP_SLEEP, frame(&mine), deadline_in(STEP_TIMEOUT))
                .await
                .expect("the bystander call is unaffected");
            assert_eq!(reply[..], mine[..]);
        }
    });
    wait_until("the bystander sleep is running", || {
        server.service.sleeps_started.load(Ordering::SeqCst) == 1
    })
    .await;

    let result = timeout(
        STEP_TIMEOUT,
        connection.call::<HugeReply>(&(), deadline_in(STEP_TIMEOUT)),
    )
    .await
    .expect("the call does not hang");
    let error = match result {
        Ok(Blob(payload)) => panic!("expected an error, got {} bytes", payload.len()),
        Err(error) => error,
    };
    assert_eq!(
        error.status(),
        Some(Status::MessageTooLarge),
        "expected a MessageTooLarge reply, got {error:?}"
    );
    assert!(!error.is_transport());
    assert!(
        !connection.is_closed(),
        "an oversized reply must not cost the connection"
    );
    assert_echo_works(&connection, "after the oversized reply").await;
    timeout(STEP_TIMEOUT, bystander)
        .await
        .expect("the bystander finishes")
        .expect("the bystander call succeeds");
    assert!(!connection.is_closed());
    assert_eq!(connection.pending_len(), 0);
}

// Access control and TLS (`crate::auth`, `crate::tls`, `crate::secure`).

/// Calls OP_ECHO with `security` on a fresh connection.
async fn echo_with(addr: &str, security: &Security) -> Result<Bytes, RpcError> {
    let connection = timeout(STEP_TIMEOUT, Connection::connect_with(addr, security))
        .await
        .expect("connecting does not hang")?;
    let (_, payload) = connection
        .call_raw(OP_ECHO, frame(b"hello"), deadline_in(STEP_TIMEOUT))
        .await?;
    Ok(payload)
}

#[tokio::test]
async fn a_server_with_a_token_refuses_a_client_without_it_and_says_why() {
    let server =
        TestServer::start_with(Security::with_token(test_token("the cluster's token"))).await;
    let connection = Connection::connect_with(&server.addr(), &Security::open())
        .await
        .expect("TCP connects");
    let call = connection
        .call::<Echo>(
            &Blob(Bytes::from_static(b"hello")),
            deadline_in(STEP_TIMEOUT),
        )
        .await;
    match call {
        Err(RpcError::Status { status, detail, .. }) => {
            assert_eq!(status, Status::Unauthenticated);
            assert!(detail.contains("--auth-token-file"), "{detail}");
        }
        other => panic!("a tokenless call must be refused: {other:?}"),
    }
    assert!(
        timeout(CLOSE_TIMEOUT, async {
            while !connection.is_closed() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .is_ok(),
        "the refused connection is closed"
    );
    assert_eq!(server.service.recorded.lock().len(), 0);
    server.stop().await;
}

/// Whether the server closes `stream` within `within` (a read sees the end, or a reset).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        timeout(within, stream.read(&mut byte)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn peers_that_never_finish_the_handshake_are_bounded_and_then_dropped() {
    use super::server::HANDSHAKES_PER_PEER_MAX;
    let token = test_token("the cluster's token");
    let server = TestServer::start_with(Security::with_token(token.clone())).await;
    // One host opens as many connections as it may have in their handshake, and says
    // nothing on any of them.
    let mut silent = Vec::new();
    for _ in 0..HANDSHAKES_PER_PEER_MAX {
        silent.push(TcpStream::connect(server.addr).await.expect("TCP connects"));
    }
    // Until the server has taken them all in, a next one may still be let through.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut one_more = TcpStream::connect(server.addr).await.expect("TCP connects");
    assert!(
        closed_within(&mut one_more, CLOSE_TIMEOUT).await,
        "past the per-address bound, a connection is closed at once"
    );
    // Another host (another loopback address) still gets in and proves the token.
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind("127.0.0.2:0".parse().expect("an address"))
        .expect("bind a second loopback address");
    let other = socket.connect(server.addr).await.expect("TCP connects");
    timeout(
        STEP_TIMEOUT,
        crate::secure::dial(&server.addr(), other, &Security::with_token(token.clone())),
    )
    .await
    .expect("the handshake does not hang")
    .expect("another address is admitted while the first is at its bound");
    // The silent connections are dropped once the handshake's time is up, and the host
    // gets in again.
    let waited = crate::auth::HANDSHAKE_TIMEOUT + Duration::from_secs(1);
    assert!(
        closed_within(&mut silent[0], waited).await,
        "a silent connection is closed after the handshake timeout"
    );
    for stream in &mut silent[1..] {
        assert!(closed_within(stream, CLOSE_TIMEOUT).await);
    }
    let echoed = echo_with(&server.addr(), &Security::with_token(token))
        .await
        .expect("the host is admitted again");
    assert_eq!(&echoed[..], b"hello");
    server.stop().await;
}

#[tokio::test]
async fn the_token_admits_a_client_and_another_token_is_refused() {
    let token = test_token("the cluster's token");
    let server = TestServer::start_with(Security::with_token(token.clone())).await;
    let echoed = echo_with(&server.addr(), &Security::with_token(token))
        .await
        .expect("the right token is admitted");
    assert_eq!(&echoed[..], b"hello");
    let refused = echo_with(
        &server.addr(),
        &Security::with_token(test_token("another cluster's")),
    )
    .await
    .expect_err("another token is refused");
    assert!(
        matches!(&refused, RpcError::Connect { reason, .. } if reason.contains("different cluster token")),
        "{refused}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_with_a_token_is_told_the_server_holds_none_and_the_server_serves_on() {
    let server = TestServer::start().await;
    let refused = echo_with(
        &server.addr(),
        &Security::with_token(test_token("the cluster's token")),
    )
    .await
    .expect_err("a server without the token is not trusted");
    assert!(
        matches!(&refused, RpcError::Connect { reason, .. } if reason.contains("holds no cluster token")),
        "{refused}"
    );
    let echoed = echo_with(&server.addr(), &Security::open())
        .await
        .expect("an open server goes on serving");
    assert_eq!(&echoed[..], b"hello");
    server.stop().await;
}

/// A self-signed certificate for 127.0.0.1 and localhost, and its key, as PEM files.
fn self_signed(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("a certificate");
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, certified.cert.pem()).expect("write the certificate");
    std::fs::write(&key, certified.key_pair.serialize_pem()).expect("write the key");
    (cert, key)
}

#[tokio::test]
async fn tls_round_trip_beside_plain_connections_with_the_token_inside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = self_signed(dir.path(), "server");
    let (other_ca, _) = self_signed(dir.path(), "other");
    let token = test_token("the cluster's token");
    let server = TestServer::start_with(Security {
        token: Some(token.clone()),
        tls_client: None,
        tls_server: Some(crate::tls::TlsAcceptor::from_files(&cert, &key).expect("acceptor")),
    })
    .await;
    let tls_client = Security {
        token: Some(token.clone()),
        tls_client: Some(crate::tls::TlsConnector::from_ca_file(&cert).expect("connector")),
        tls_server: None,
    };
    let echoed = echo_with(&server.addr(), &tls_client)
        .await
        .expect("a TLS client with the token");
    assert_eq!(&echoed[..], b"hello");
    // Large frames cross TLS records whole.
    let connection = Connection::connect_with(&server.addr(), &tls_client)
        .await
        .expect("connects");
    let big = vec![0x5a; 1 << 20];
    let (_, payload) = connection
        .call_raw(OP_ECHO, frame(&big), deadline_in(STEP_TIMEOUT))
        .await
        .expect("a 1 MiB echo over TLS");
    assert_eq!(&payload[..], &big[..]);
    // Servers among themselves: plain TCP on the same port, still with the token.
    let plain = echo_with(&server.addr(), &Security::with_token(token.clone()))
        .await
        .expect("plain TCP with the token");
    assert_eq!(&plain[..], b"hello");
    // Over TLS too, a client without the token is refused and told why.
    let tokenless = Security {
        token: None,
        tls_client: Some(crate::tls::TlsConnector::from_ca_file(&cert).expect("connector")),
        tls_server: None,
    };
    let connection = Connection::connect_with(&server.addr(), &tokenless)
        .await
        .expect("TLS connects");
    let (header, _) = connection
        .call_raw(OP_ECHO, frame(b"hello"), deadline_in(STEP_TIMEOUT))
        .await
        .expect("an answer");
    assert_eq!(header.status, Status::Unauthenticated);
    // A client that trusts another certificate does not talk to this server.
    let distrusting = Security {
        token: Some(token),
        tls_client: Some(crate::tls::TlsConnector::from_ca_file(&other_ca).expect("connector")),
        tls_server: None,
    };
    let refused = echo_with(&server.addr(), &distrusting)
        .await
        .expect_err("an unknown issuer is refused");
    assert!(
        matches!(&refused, RpcError::Connect { reason, .. } if reason.contains("TLS handshake failed")),
        "{refused}"
    );
    server.stop().await;
}

/// `header ‖ payload` of a reply frame with `rpc_id`.
fn reply_frame(rpc_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0; FRAME_HEADER_BYTES];
    FrameHeader {
        opcode: OP_ECHO,
        is_reply: true,
        status: Status::Ok,
        rpc_id,
        payload_len: payload.len() as u32,
    }
    .write_to(&mut out);
    out.extend_from_slice(payload);
    out
}

/// A payload of `POOLED_BYTES_MIN` or more is read into a pooled buffer, exactly to its
/// end: frames that arrive in odd pieces, a large one cut inside its header and inside
/// its payload, and small frames sharing a read with the end of a large one, all come
/// out whole and in order, and the large payloads' buffers go back to the pool.
#[tokio::test]
async fn large_payloads_are_read_whole_into_pooled_buffers() {
    use super::connection::next_frame_pooled;
    use crate::buffer_pool::{BufferPool, POOLED_BYTES_MIN};

    let payloads: Vec<Vec<u8>> = vec![
        (0..POOLED_BYTES_MIN + 7).map(|i| i as u8).collect(),
        b"small, right behind the large one".to_vec(),
        (0..3 * POOLED_BYTES_MIN).map(|i| (i * 7) as u8).collect(),
        vec![0x42; POOLED_BYTES_MIN],
        b"last".to_vec(),
    ];
    let stream: Vec<u8> = payloads
        .iter()
        .enumerate()
        .flat_map(|(i, p)| reply_frame(i as u64, p))
        .collect();
    let (mut writer, mut reader) = tokio::io::duplex(8 * 1024);
    let sender = tokio::spawn(async move {
        // Pieces of sizes that cut headers and payloads anywhere.
        let mut at = 0;
        for size in [5, 20, 40_000, 1, 70_000, 3, 17].into_iter().cycle() {
            if at == stream.len() {
                break;
            }
            let end = (at + size).min(stream.len());
            writer.write_all(&stream[at..end]).await.expect("write");
            at = end;
        }
    });
    let pool = BufferPool::new(8, 64 << 20);
    let mut buf = BytesMut::new();
    let mut received = Vec::new();
    for (i, sent) in payloads.iter().enumerate() {
        let read = next_frame_pooled(&mut reader, &mut buf, &pool);
        let (header, payload) = timeout(STEP_TIMEOUT, read)
            .await
            .expect("a frame in time")
            .expect("reads")
            .expect("a frame, not the end");
        assert_eq!(header.rpc_id, i as u64);
        assert!(payload[..] == sent[..], "payload {i} differs");
        received.push(payload);
    }
    sender.await.expect("sender");
    let end = timeout(
        STEP_TIMEOUT,
        next_frame_pooled(&mut reader, &mut buf, &pool),
    )
    .await
    .expect("the end in time")
    .expect("a clean end");
    assert!(end.is_none());
    assert_eq!(pool.free().0, 0, "the payloads hold their buffers");
    drop(received);
    assert_eq!(
        pool.free().0,
        3,
        "the three large payloads' buffers came back"
    );
}

/// A large payload cut short by the end of the stream is `Truncated`.
#[tokio::test]
async fn a_large_payload_cut_short_is_truncated() {
    use super::connection::{next_frame, ReadFrameError};
    use crate::buffer_pool::POOLED_BYTES_MIN;

    let mut stream = reply_frame(1, &vec![1; 2 * POOLED_BYTES_MIN]);
    stream.truncate(stream.len() - 10);
    let (mut writer, mut reader) = tokio::io::duplex(1 << 20);
    writer.write_all(&stream).await.expect("write");
    drop(writer);
    let mut buf = BytesMut::new();
    let read = timeout(STEP_TIMEOUT, next_frame(&mut reader, &mut buf))
        .await
        .expect("an answer in time");
    assert!(matches!(read, Err(ReadFrameError::Truncated)), "{read:?}");
}

/// A peer that stops sending inside a frame is `Stalled` after `FRAME_STALL_TIMEOUT`,
/// whether the payload is buffered in the connection's buffer or read into a pooled
/// one (the clock is paused: the wait takes no real time).
#[tokio::test(start_paused = true)]
async fn a_peer_stalled_inside_a_frame_is_stalled_small_or_large() {
    use super::connection::{next_frame_pooled, ReadFrameError, FRAME_STALL_TIMEOUT};
    use crate::buffer_pool::{BufferPool, POOLED_BYTES_MIN};

    for len in [100, 3 * POOLED_BYTES_MIN] {
        let mut stream = reply_frame(1, &vec![3; len]);
        stream.truncate(FRAME_HEADER_BYTES + len / 2);
        let (mut writer, mut reader) = tokio::io::duplex(1 << 20);
        writer.write_all(&stream).await.expect("write");
        let pool = BufferPool::new(4, 16 << 20);
        let mut buf = BytesMut::new();
        let started = Instant::now();
        let read = next_frame_pooled(&mut reader, &mut buf, &pool).await;
        assert!(
            matches!(read, Err(ReadFrameError::Stalled)),
            "{len}: {read:?}"
        );
        assert!(started.elapsed() >= FRAME_STALL_TIMEOUT, "{len}");
        drop(writer);
    }
}
