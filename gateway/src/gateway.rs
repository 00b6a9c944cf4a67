//! `Gateway`: a RESP listener in front of one table, driving the client library.
//!
//! Each connection reads requests ([`RequestParser`]; pipelined requests answered in
//! order, consecutive `GET`s or `SET`s among them sent together as one multi-operation,
//! [`crate::pipeline`]), parses them ([`crate::commands::parse`]) and runs them through
//! one shared [`Client`], which routes every key to its master and retries while
//! tablets move or a master is recovered, so every `OK` is a write on R backups, and a
//! write applies once however often it is retried (the client's exactly-once
//! identities). Commands Redis runs atomically on one key run here as the client's
//! compare-and-swap: `INCR` reads the decimal value and writes the sum on the condition
//! that the version did not change (trying again if it did); `SET ... GET` likewise.
//! `MSET` writes each key once, but not all at once (keys on different masters). `SCAN`
//! examines a bounded share of the table per call ([`crate::scan`]).
//!
//! Access: a gateway given the cluster token ([`Gateway::with_password`]) answers every
//! command but `AUTH` and `QUIT` with `NOAUTH` until the connection presents the RESP
//! password with `AUTH` (user `default` or none), as Redis does with `requirepass`; a
//! wrong one is answered `WRONGPASS` and logged with the peer's address (once per 10 s),
//! never the password. The password is derived from the token
//! (`ClusterToken::resp_password`), not the token itself: `AUTH` crosses the network in
//! clear without TLS. Until `AUTH` succeeds a connection may send only small requests
//! ([`RequestLimits::UNAUTHENTICATED`]).
//! Given a certificate ([`Gateway::with_tls`]) it also accepts TLS on the same port
//! (`redis-cli --tls`), told apart from plain RESP by the first byte.
//!
//! # Limits
//! Anyone who reaches the port can open connections, so nothing a connection holds is
//! unbounded ([`ConnectionLimits`], set with [`Gateway::with_connection_limits`]):
//! * [`GATEWAY_CONNECTIONS_MAX`] connections (further ones wait in the listen backlog),
//!   at most [`CONNECTIONS_PER_PEER_MAX`] from one IP address: the one past it is
//!   answered `-ERR max number of clients reached` and closed (in plain RESP, before
//!   any TLS);
//! * a connection's first command, and where a password is needed its successful
//!   `AUTH`, must arrive within [`FIRST_COMMAND_TIMEOUT`] of its accept (the TLS
//!   handshake included), or it is closed without a word; after that, a connection
//!   that sends nothing for the idle timeout is closed, if one is set (off by default,
//!   as Redis's `timeout 0`);
//! * requests bounded by [`RequestLimits`] (so is what a connection buffers: one
//!   request, 64 MiB at most), parsed once however many reads they arrive in;
//! * replies: once the replies waiting to be written pass
//!   [`REPLY_BYTES_PENDING_MAX`], they are written before any more input is parsed, so
//!   a pipeline of small requests for large values (`GET`s of 16 MiB values) cannot
//!   make the gateway buffer their replies all at once; what waits is at most the bound
//!   plus one reply (or the replies of one run of pipelined commands sent together,
//!   [`PIPELINE_BATCH_MAX`] at most). Replies are written within
//!   [`REPLY_WRITE_TIMEOUT`]. INFO's `client_recent_max_output_buffer` is the most that
//!   ever waited on one connection (since start, not recently).
//!
//! A protocol error is answered and its connection closed; any other error (an unknown
//! command, a bad argument, a timed-out write) is answered and the connection goes on.

use bytes::{Bytes, BytesMut};
use rampart_client::{Client, ClientError, TableId, Version, WriteItem};
use rampart_common::auth::{ClusterToken, Security};
use rampart_common::reject::RejectRules;
use rampart_common::secure::SecureStream;
use rampart_common::tls::TlsAcceptor;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::commands::{self, Command, SetCondition};
use crate::peer_connections::PeerConnections;
use crate::pipeline::{together_at_front, Together, PIPELINE_BATCH_MAX};
use crate::resp::{ProtocolError, Reply, RequestLimits, RequestParser};
use crate::scan::{ScanRest, ScanWalk};

/// Connections served at once.
pub const GATEWAY_CONNECTIONS_MAX: usize = 10_000;

/// Connections one IP address may hold open at once (default of
/// [`ConnectionLimits::connections_per_peer_max`]): a tenth of
/// [`GATEWAY_CONNECTIONS_MAX`], so that one host cannot take them all, yet more than an
/// application's pools need (redis-benchmark's default is 50 clients).
pub const CONNECTIONS_PER_PEER_MAX: usize = 1_000;

/// How long after its accept a connection may take to send its first command, and
/// where a password is needed to `AUTH` successfully (default of
/// [`ConnectionLimits::first_command_timeout`]): a client library connects and speaks
/// at once; a connection silent this long holds a place for nothing.
pub const FIRST_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Reply bytes a connection may have waiting to be written before it stops parsing
/// input and writes them (default of [`ConnectionLimits::reply_bytes_pending_max`]):
/// the size of the largest request, so that a pipeline answers at least as much as it
/// asked before it waits.
pub const REPLY_BYTES_PENDING_MAX: usize = 64 * 1024 * 1024;

/// How long a client may take to take a reply before its connection is closed.
pub const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Room made in a connection's input buffer before each read: as much as a typical
/// pipeline sends at once.
pub const READ_BYTES_MIN: usize = 16 * 1024;

/// Most room made before one read for a request known to need more (a large value
/// arriving): reads of up to a megabyte, without allocating all of a declared 17 MiB
/// argument before its bytes come.
pub const READ_BYTES_MAX: usize = 1024 * 1024;

/// Largest buffer a connection keeps once it is empty: one grown by a large request or
/// reply is given back, so that idle connections hold little.
pub const BUFFER_KEPT_BYTES_MAX: usize = 1024 * 1024;

const _: () = assert!(READ_BYTES_MIN <= READ_BYTES_MAX && READ_BYTES_MAX <= BUFFER_KEPT_BYTES_MAX);
const _: () = assert!(CONNECTIONS_PER_PEER_MAX <= GATEWAY_CONNECTIONS_MAX);

/// What one connection may hold, and for how long (see the module docs' *Limits*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Time from accept to the first command (and to a successful `AUTH` where a
    /// password is needed).
    pub first_command_timeout: Duration,
    /// Connections one IP address may hold open (at least 1).
    pub connections_per_peer_max: usize,
    /// Time an authenticated connection may send nothing before it is closed; `None`:
    /// forever (Redis's `timeout 0`).
    pub idle_timeout: Option<Duration>,
    /// Reply bytes waiting to be written past which input waits (at least 1).
    pub reply_bytes_pending_max: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            first_command_timeout: FIRST_COMMAND_TIMEOUT,
            connections_per_peer_max: CONNECTIONS_PER_PEER_MAX,
            idle_timeout: None,
            reply_bytes_pending_max: REPLY_BYTES_PENDING_MAX,
        }
    }
}

/// The reply to a connection past [`ConnectionLimits::connections_per_peer_max`]
/// (Redis's words for its `maxclients`).
const TOO_MANY_FROM_PEER: &[u8] = b"-ERR max number of clients reached (from this address; \
    the gateway's --connections-per-peer-max)\r\n";

/// Compare-and-swap attempts of one `INCR` or `SET ... GET` before it gives up under
/// contention.
pub const CAS_ATTEMPTS_MAX: usize = 1000;

/// The gateway: its client, its table, and what it counts.
#[derive(Debug)]
pub struct Gateway {
    client: Client,
    table: TableId,
    table_name: String,
    limits: RequestLimits,
    connection_limits: ConnectionLimits,
    /// Connections open per peer address.
    peers: Arc<PeerConnections>,
    /// Connections refused past the per-address cap, logged once per interval.
    crowded: rampart_common::secure::RefusalLog,
    /// The most reply bytes that ever waited to be written on one connection.
    reply_bytes_pending_peak: AtomicU64,
    /// What `AUTH` must present; `None`: connections need none.
    password: Option<ClusterToken>,
    /// TLS offered beside plain RESP (token unused: RESP clients do not speak the
    /// cluster handshake).
    tls: Arc<Security>,
    /// Wrong passwords, logged once per interval.
    refusals: rampart_common::secure::RefusalLog,
    next_client_id: AtomicU64,
    connected: AtomicU64,
    commands: AtomicU64,
}

/// What a connection remembers.
#[derive(Debug, Default)]
struct Session {
    id: u64,
    name: Option<Bytes>,
    /// Whether `AUTH` succeeded (or none is needed).
    authenticated: bool,
    /// Who connected, for the log.
    peer: Option<SocketAddr>,
    /// The page keys the last `SCAN` stopped inside, for the next call from its cursor.
    scan_rest: Option<ScanRest>,
}

impl Gateway {
    /// A gateway serving table `table_name` through `client`, creating the table over
    /// `span` tablets if it does not exist.
    pub async fn new(client: Client, table_name: &str, span: u32) -> Result<Gateway, ClientError> {
        let table = client.create_table(table_name, span).await?;
        Ok(Gateway {
            client,
            table,
            table_name: table_name.to_string(),
            limits: RequestLimits::default(),
            connection_limits: ConnectionLimits::default(),
            peers: Arc::new(PeerConnections::default()),
            crowded: rampart_common::secure::RefusalLog::new(),
            reply_bytes_pending_peak: AtomicU64::new(0),
            password: None,
            tls: Arc::new(Security::open()),
            refusals: rampart_common::secure::RefusalLog::new(),
            next_client_id: AtomicU64::new(1),
            connected: AtomicU64::new(0),
            commands: AtomicU64::new(0),
        })
    }

    /// Demands `AUTH` with `token`'s RESP password on every connection.
    pub fn with_password(mut self, token: Option<ClusterToken>) -> Gateway {
        self.password = token;
        self
    }

    /// Accepts TLS with `acceptor`'s certificate besides plain RESP.
    pub fn with_tls(mut self, acceptor: Option<TlsAcceptor>) -> Gateway {
        self.tls = Arc::new(Security {
            tls_server: acceptor,
            ..Security::open()
        });
        self
    }

    /// Bounds each connection with `limits` instead of [`ConnectionLimits::default`].
    ///
    /// # Panics
    /// If a count in `limits` is 0 (a programmer error: the flags are checked).
    pub fn with_connection_limits(mut self, limits: ConnectionLimits) -> Gateway {
        assert!(limits.connections_per_peer_max >= 1, "{limits:?}");
        assert!(limits.reply_bytes_pending_max >= 1, "{limits:?}");
        self.connection_limits = limits;
        self
    }

    /// The table it serves.
    pub fn table(&self) -> TableId {
        self.table
    }

    /// Serves connections on `listener` until `shutdown` completes.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        rampart_common::rpc::server::accept_connections(
            listener,
            GATEWAY_CONNECTIONS_MAX,
            "resp",
            shutdown,
            move |stream| {
                let gateway = Arc::clone(&self);
                async move { gateway.connection(stream).await }
            },
        )
        .await;
    }

    async fn connection(&self, stream: TcpStream) {
        let accepted = Instant::now();
        let limits = self.connection_limits;
        let _ = stream.set_nodelay(true);
        let Ok(peer) = stream.peer_addr() else {
            return;
        };
        let Some(_slot) = self.peers.admit(peer.ip(), limits.connections_per_peer_max) else {
            self.refuse_crowded(&stream, peer);
            return;
        };
        // The first command, and where a password is needed a successful AUTH, come by
        // then or the connection is closed.
        let first_command_deadline = accepted + limits.first_command_timeout;
        let secured = rampart_common::secure::accept(stream, peer, &self.tls, "resp");
        let Ok(Ok(mut stream)) = tokio::time::timeout_at(first_command_deadline, secured).await
        else {
            return;
        };
        self.connected.fetch_add(1, Ordering::Relaxed);
        let mut session = Session {
            id: self.next_client_id.fetch_add(1, Ordering::Relaxed),
            name: None,
            authenticated: self.password.is_none(),
            peer: Some(peer),
            scan_rest: None,
        };
        let mut parser = RequestParser::default();
        let mut input = BytesMut::with_capacity(READ_BYTES_MIN);
        let mut output = BytesMut::with_capacity(READ_BYTES_MIN);
        // Whether a command (not a blank line) came.
        let mut commanded = false;
        'serve: loop {
            // Every whole request read so far, in order, a batch at a time (pipelining).
            loop {
                let (batch, failure) = self.take_batch(&mut parser, &mut input, &session);
                if batch.is_empty() && failure.is_none() {
                    break;
                }
                commanded |= !batch.is_empty();
                let mut pending = self.parse_batch(&batch, &session);
                // The arguments, and the commands made of them, share the input buffer:
                // all dropped before the next read, it is reused rather than reallocated.
                drop(batch);
                let mut close = false;
                while !pending.is_empty() && !close {
                    let (replies, quit) = self.run_front(&mut pending, &mut session).await;
                    close = quit;
                    for reply in replies {
                        reply.encode(&mut output);
                        self.reply_bytes_pending_peak
                            .fetch_max(output.len() as u64, Ordering::Relaxed);
                        if output.len() >= limits.reply_bytes_pending_max
                            && self.flush(&mut stream, &mut output).await.is_err()
                        {
                            break 'serve;
                        }
                    }
                }
                // A QUIT closes; so does a protocol error (after the requests before
                // it are answered), as the stream cannot be resynchronised.
                if let (false, Some(error)) = (close, &failure) {
                    Reply::err(error).encode(&mut output);
                }
                if close || failure.is_some() {
                    let _ = self.flush(&mut stream, &mut output).await;
                    break 'serve;
                }
            }
            if self.flush(&mut stream, &mut output).await.is_err() {
                break;
            }
            let deadline = if commanded && session.authenticated {
                limits.idle_timeout.map(|idle| Instant::now() + idle)
            } else {
                Some(first_command_deadline)
            };
            if input.is_empty() && input.capacity() > BUFFER_KEPT_BYTES_MAX {
                input = BytesMut::new();
            }
            let room = parser
                .bytes_wanted(input.len())
                .clamp(READ_BYTES_MIN, READ_BYTES_MAX);
            input.reserve(room);
            let read = stream.read_buf(&mut input);
            let read = match deadline {
                None => read.await,
                Some(deadline) => match tokio::time::timeout_at(deadline, read).await {
                    Ok(read) => read,
                    Err(_) => {
                        tracing::debug!(
                            %peer,
                            first_command = !commanded,
                            authenticated = session.authenticated,
                            "RESP connection closed: nothing came in time"
                        );
                        break;
                    }
                },
            };
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        self.connected.fetch_sub(1, Ordering::Relaxed);
    }

    /// Answers a connection past the per-address cap and lets it close. Written
    /// without waiting (a fresh socket's buffer takes the line; if not, the close says
    /// enough), so a crowd of refused connections costs no task time.
    fn refuse_crowded(&self, stream: &TcpStream, peer: SocketAddr) {
        let _ = stream.try_write(TOO_MANY_FROM_PEER);
        if let Some(also) = self.crowded.report() {
            tracing::warn!(
                %peer,
                also_refused = also,
                open = self.peers.open_from(peer.ip()),
                "RESP connection refused: its address holds --connections-per-peer-max \
                 connections already"
            );
        }
    }

    async fn flush(&self, stream: &mut SecureStream, output: &mut BytesMut) -> Result<(), ()> {
        if output.is_empty() {
            return Ok(());
        }
        // Flushed: TLS may hold the reply's tail inside rustls until polled again.
        let write = async {
            stream.write_all(output).await?;
            stream.flush().await
        };
        let written = tokio::time::timeout(REPLY_WRITE_TIMEOUT, write).await;
        output.clear();
        if output.capacity() > BUFFER_KEPT_BYTES_MAX {
            *output = BytesMut::with_capacity(READ_BYTES_MIN);
        }
        match written {
            Ok(Ok(())) => Ok(()),
            _ => Err(()),
        }
    }

    /// The whole requests at the front of `input`, [`PIPELINE_BATCH_MAX`] at most
    /// (blank ones skipped), and the protocol error that ended them, if one did.
    fn take_batch(
        &self,
        parser: &mut RequestParser,
        input: &mut BytesMut,
        session: &Session,
    ) -> (Vec<Vec<Bytes>>, Option<ProtocolError>) {
        // Until AUTH succeeds, one at a time: AUTH changes the limits the next request
        // is parsed with.
        let (limits, batch_max) = if session.authenticated {
            (&self.limits, PIPELINE_BATCH_MAX)
        } else {
            (&RequestLimits::UNAUTHENTICATED, 1)
        };
        let mut batch = Vec::new();
        while batch.len() < batch_max {
            match parser.take(input, limits) {
                Ok(Some(args)) if args.is_empty() => {}
                Ok(Some(args)) => batch.push(args),
                Ok(None) => break,
                Err(error) => return (batch, Some(error)),
            }
        }
        (batch, None)
    }

    /// A batch's requests parsed, in order: the command, or the error to answer (before
    /// `AUTH` succeeds, `NOAUTH` for any command but `AUTH` and `QUIT`).
    fn parse_batch(
        &self,
        batch: &[Vec<Bytes>],
        session: &Session,
    ) -> VecDeque<Result<Command, Reply>> {
        self.commands
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        batch
            .iter()
            .map(|args| {
                if !session.authenticated && !may_run_unauthenticated(&args[0]) {
                    return Err(Reply::Error("NOAUTH Authentication required.".into()));
                }
                commands::parse(args)
            })
            .collect()
    }

    /// Runs the commands at the front of `pending` that go together
    /// ([`crate::pipeline`]), or else the first alone, taking them off; their replies,
    /// in order, and whether to close the connection after them (a `QUIT`).
    async fn run_front(
        &self,
        pending: &mut VecDeque<Result<Command, Reply>>,
        session: &mut Session,
    ) -> (Vec<Reply>, bool) {
        if let Some(together) = together_at_front(pending.make_contiguous()) {
            let len = together.len();
            pending.drain(..len);
            let replies = self.run_together(together).await;
            // The client library answers each item of a multi-operation, in order; a
            // reply missing would shift every later one onto the wrong request.
            assert_eq!(replies.len(), len, "one reply per command sent together");
            return (replies, false);
        }
        let (reply, close) = match pending.pop_front() {
            Some(Ok(command)) => self.run_command(command, session).await,
            Some(Err(reply)) => (reply, false),
            None => return (Vec::new(), false),
        };
        (vec![reply], close)
    }

    /// Runs commands that go together as one multi-operation; their replies, in order.
    async fn run_together(&self, together: Together) -> Vec<Reply> {
        let (client, table) = (&self.client, self.table);
        match together {
            Together::Gets(keys) => {
                let keys: Vec<(TableId, &[u8])> = keys.iter().map(|k| (table, &k[..])).collect();
                match client.multi_read(&keys).await {
                    Ok(outcomes) => outcomes
                        .into_iter()
                        .map(|outcome| match outcome {
                            Ok(object) => Reply::Bulk(object.map(|o| o.value)),
                            Err(error) => client_error(error),
                        })
                        .collect(),
                    Err(error) => vec![client_error(error); keys.len()],
                }
            }
            Together::Sets(run) => {
                let answers = run.commands_per_item();
                let items: Vec<WriteItem> = run
                    .items
                    .into_iter()
                    .map(|(key, value, condition)| WriteItem {
                        table,
                        key,
                        value,
                        rules: set_rules(condition),
                    })
                    .collect();
                let outcomes = match client.multi_write(&items).await {
                    Ok(outcomes) => outcomes,
                    Err(error) => return vec![client_error(error); run.commands.len()],
                };
                let mut replies = Vec::with_capacity(run.commands.len());
                for (item, value) in &run.commands {
                    let reply = match set_answer(&outcomes[*item], answers[*item]) {
                        Some(reply) => reply,
                        None => self
                            .set(&items[*item].key, value, SetCondition::Always, false)
                            .await
                            .unwrap_or_else(client_error),
                    };
                    replies.push(reply);
                }
                replies
            }
        }
    }

    /// Runs one parsed command; the reply, and whether to close the connection after it.
    async fn run_command(&self, command: Command, session: &mut Session) -> (Reply, bool) {
        let reply = match command {
            Command::Quit => return (Reply::OK, true),
            Command::Auth { username, password } => {
                return (self.auth(username, &password, session), false)
            }
            other => self.execute(other, session).await,
        };
        (reply.unwrap_or_else(client_error), false)
    }

    /// `AUTH`: checks the password against the cluster token (constant time).
    fn auth(&self, username: Option<Bytes>, password: &[u8], session: &mut Session) -> Reply {
        let Some(token) = &self.password else {
            return Reply::err(
                "AUTH <password> called without any password configured for the default user. \
                 Are you sure your configuration is correct?",
            );
        };
        let user_ok = username.as_ref().map_or(true, |u| &u[..] == b"default");
        if user_ok && token.matches_resp_password(password) {
            session.authenticated = true;
            return Reply::OK;
        }
        if let Some(also) = self.refusals.report() {
            tracing::warn!(
                peer = %session.peer.map_or_else(String::new, |p| p.to_string()),
                also_refused = also,
                "RESP connection presented a wrong password (AUTH); the password is \
                 `rampart token resp-password`'s, derived from the cluster token"
            );
        }
        Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".to_string())
    }

    async fn execute(&self, command: Command, session: &mut Session) -> Result<Reply, ClientError> {
        let (client, table) = (&self.client, self.table);
        Ok(match command {
            Command::Quit | Command::Auth { .. } => Reply::OK,
            Command::Ping(None) => Reply::Simple("PONG"),
            Command::Ping(Some(message)) | Command::Echo(message) => Reply::bulk(message),
            Command::Select => Reply::OK,
            Command::ClientSetName(name) => {
                session.name = Some(name);
                Reply::OK
            }
            Command::ClientGetName => Reply::Bulk(session.name.clone()),
            Command::ClientId => Reply::Integer(session.id as i64),
            Command::CommandList => Reply::Array(Some(Vec::new())),
            Command::CommandCount => Reply::Integer(commands::COMMANDS.len() as i64),
            Command::Info => Reply::bulk(self.info()),
            Command::ConfigGet(patterns) => commands::config_get(&patterns, &self.settings()),
            Command::Get(key) => Reply::Bulk(client.read(table, &key).await?.map(|o| o.value)),
            Command::Set {
                key,
                value,
                condition,
                get,
            } => self.set(&key, &value, condition, get).await?,
            Command::Del(keys) => {
                let keys: Vec<(TableId, &[u8])> = keys.iter().map(|k| (table, &k[..])).collect();
                let mut removed = 0;
                for outcome in client.multi_remove(&keys).await? {
                    removed += i64::from(outcome?.is_some());
                }
                Reply::Integer(removed)
            }
            Command::Exists(keys) => {
                let keys: Vec<(TableId, &[u8])> = keys.iter().map(|k| (table, &k[..])).collect();
                let mut found = 0;
                for outcome in client.multi_read(&keys).await? {
                    found += i64::from(outcome?.is_some());
                }
                Reply::Integer(found)
            }
            Command::IncrBy(key, delta) => self.incr_by(&key, delta).await?,
            Command::MGet(keys) => {
                let keys: Vec<(TableId, &[u8])> = keys.iter().map(|k| (table, &k[..])).collect();
                let values = client
                    .multi_read(&keys)
                    .await?
                    .into_iter()
                    .map(|outcome| outcome.map(|o| Reply::Bulk(o.map(|o| o.value))))
                    .collect::<Result<Vec<_>, _>>()?;
                Reply::Array(Some(values))
            }
            Command::MSet(pairs) => {
                let items: Vec<WriteItem> = pairs
                    .into_iter()
                    .map(|(key, value)| WriteItem {
                        table,
                        key,
                        value,
                        rules: RejectRules::default(),
                    })
                    .collect();
                for outcome in client.multi_write(&items).await? {
                    outcome?;
                }
                Reply::OK
            }
            Command::Scan {
                cursor,
                pattern,
                count,
            } => {
                self.scan(cursor, pattern.as_deref(), count, session)
                    .await?
            }
        })
    }

    /// `SCAN cursor`: at most `count` keys matching `pattern`, examining a bounded
    /// share of the table ([`ScanWalk`]); the cursor to go on from (0: done).
    async fn scan(
        &self,
        cursor: u64,
        pattern: Option<&[u8]>,
        count: usize,
        session: &mut Session,
    ) -> Result<Reply, ClientError> {
        let mut walk = ScanWalk::new(pattern, count);
        // Where to fetch pages from; `None`: the table is done.
        let mut from = Some(cursor);
        let mut rest = None;
        if let Some(mut kept) = session.scan_rest.take() {
            if kept.cursor() == cursor {
                match walk.take(kept.keys()) {
                    Some(stop) => {
                        kept.advance(stop);
                        rest = Some(kept);
                    }
                    None => from = kept.then(),
                }
            }
        }
        let mut next = None;
        if let (None, Some(from)) = (&rest, from) {
            let mut pages = self.client.enumerate_from(self.table, from);
            while !walk.is_done() {
                let Some(page) = pages.next_page().await? else {
                    break;
                };
                let keys: Vec<Bytes> = page.into_iter().map(|object| object.key).collect();
                if let Some(stop) = walk.take(&keys) {
                    rest = Some(ScanRest::new(&keys, stop, pages.resume_hash()));
                    break;
                }
            }
            next = pages.resume_hash();
        }
        let next = match &rest {
            Some(rest) => rest.cursor(),
            None => next.unwrap_or(0),
        };
        session.scan_rest = rest;
        let keys = walk.into_matched().into_iter().map(Reply::bulk).collect();
        Ok(Reply::Array(Some(vec![
            Reply::bulk(next.to_string()),
            Reply::Array(Some(keys)),
        ])))
    }

    async fn set(
        &self,
        key: &[u8],
        value: &[u8],
        condition: SetCondition,
        get: bool,
    ) -> Result<Reply, ClientError> {
        let (client, table) = (&self.client, self.table);
        if !get {
            return match client
                .write_with(table, key, value, set_rules(condition))
                .await
            {
                Ok(_) => Ok(Reply::OK),
                Err(ClientError::Rejected { .. }) => Ok(Reply::Bulk(None)),
                Err(error) => Err(error),
            };
        }
        for _ in 0..CAS_ATTEMPTS_MAX {
            let old = client.read(table, key).await?;
            let refused = match condition {
                SetCondition::Always => false,
                SetCondition::IfAbsent => old.is_some(),
                SetCondition::IfPresent => old.is_none(),
            };
            if refused {
                return Ok(Reply::Bulk(old.map(|o| o.value)));
            }
            match client
                .write_with(table, key, value, unchanged_since(old.as_ref()))
                .await
            {
                Ok(_) => return Ok(Reply::Bulk(old.map(|o| o.value))),
                Err(ClientError::Rejected { .. }) => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(contended())
    }

    async fn incr_by(&self, key: &[u8], delta: i64) -> Result<Reply, ClientError> {
        let (client, table) = (&self.client, self.table);
        for _ in 0..CAS_ATTEMPTS_MAX {
            let old = client.read(table, key).await?;
            let current = match &old {
                None => 0,
                Some(object) => match commands::integer(&object.value) {
                    Some(n) => n,
                    None => return Ok(Reply::err("value is not an integer or out of range")),
                },
            };
            let Some(sum) = current.checked_add(delta) else {
                return Ok(Reply::err("increment or decrement would overflow"));
            };
            let rules = unchanged_since(old.as_ref());
            match client
                .write_with(table, key, sum.to_string().as_bytes(), rules)
                .await
            {
                Ok(_) => return Ok(Reply::Integer(sum)),
                Err(ClientError::Rejected { .. }) => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(contended())
    }

    fn info(&self) -> String {
        format!(
            "# Server\r\nredis_version:7.0.0\r\nrampart_gateway:1\r\nrampart_table:{}\r\n\
             # Clients\r\nconnected_clients:{}\r\nclient_recent_max_output_buffer:{}\r\n\
             maxclients:{GATEWAY_CONNECTIONS_MAX}\r\n\
             # Stats\r\ntotal_commands_processed:{}\r\n# Keyspace\r\n",
            self.table_name,
            self.connected.load(Ordering::Relaxed),
            self.reply_bytes_pending_peak.load(Ordering::Relaxed),
            self.commands.load(Ordering::Relaxed)
        )
    }

    /// What `CONFIG GET` answers: the settings clients probe, in Redis's terms.
    fn settings(&self) -> Vec<(&'static str, String)> {
        // Redis's `timeout` is in whole seconds; a part of one rounds up (0 is none).
        let idle_s = self.connection_limits.idle_timeout.map_or(0, |idle| {
            idle.as_secs() + u64::from(idle.subsec_nanos() > 0)
        });
        vec![
            // No snapshots and no append-only file: every acknowledged write is in the
            // memory of its master and on R backups instead.
            ("save", String::new()),
            ("appendonly", "no".to_string()),
            ("databases", "1".to_string()),
            ("maxclients", GATEWAY_CONNECTIONS_MAX.to_string()),
            ("timeout", idle_s.to_string()),
        ]
    }
}

/// The reject rules of a `SET` without `GET` under `condition`.
fn set_rules(condition: SetCondition) -> RejectRules {
    RejectRules {
        exists: condition == SetCondition::IfAbsent,
        doesnt_exist: condition == SetCondition::IfPresent,
        ..RejectRules::default()
    }
}

/// A write that applies only if the object is as `old` found it (same version, or
/// still absent).
fn unchanged_since(old: Option<&rampart_client::Object>) -> RejectRules {
    match old {
        Some(object) => RejectRules {
            given_version: object.version,
            version_ne_given: true,
            doesnt_exist: true,
            ..RejectRules::default()
        },
        None => RejectRules {
            exists: true,
            ..RejectRules::default()
        },
    }
}

fn contended() -> Reply {
    Reply::err(format!(
        "the key changed under {CAS_ATTEMPTS_MAX} attempts in a row; try again"
    ))
}

/// Commands a connection may send before `AUTH`.
fn may_run_unauthenticated(name: &[u8]) -> bool {
    [&b"AUTH"[..], b"QUIT"]
        .iter()
        .any(|allowed| name.eq_ignore_ascii_case(allowed))
}

/// The reply to one `SET` of a pipelined run whose write (answering `answers` `SET`s of
/// its key) ended with `outcome`; `None`: run this `SET` alone — the write was refused
/// and absorbed `SET`s before it (`crate::pipeline`), so each gets the answer it would
/// have had alone. A write of unknown outcome answers each `SET` it absorbed so (it may
/// have applied, and then each of them did): none is run again.
fn set_answer(outcome: &Result<Version, ClientError>, answers: usize) -> Option<Reply> {
    match outcome {
        Ok(_) => Some(Reply::OK),
        Err(ClientError::Rejected { .. }) => Some(Reply::Bulk(None)),
        Err(error) if answers > 1 && !error.outcome_unknown() => None,
        Err(error) => Some(client_error(error.clone())),
    }
}

/// The error reply for a client library error (its message names what failed;
/// timeouts and a full log get Redis's kinds).
fn client_error(error: ClientError) -> Reply {
    match error {
        // Whether it applied is unknown: the client may ask again (and read).
        ClientError::Timeout { .. } | ClientError::LeaseExpired(_) => {
            Reply::Error(format!("TIMEOUT {error}"))
        }
        ClientError::NoSpace => Reply::Error(format!("OOM {error}")),
        other => Reply::err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_cluster::FakeCluster;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Longest a test waits for a reply or a close that should come at once.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// A request: an array of bulk strings.
    fn request(words: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", words.len()).into_bytes();
        for word in words {
            out.extend_from_slice(format!("${}\r\n", word.len()).as_bytes());
            out.extend_from_slice(word);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// The reply at the front of `buf` and its length; `None` while incomplete.
    fn parse_reply(buf: &[u8]) -> Option<(Reply, usize)> {
        let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&buf[1..line_end]).expect("text");
        let after = line_end + 2;
        match buf[0] {
            b'+' => Some((Reply::Simple(Box::leak(line.into())), after)),
            b'-' => Some((Reply::Error(line.to_string()), after)),
            b':' => Some((Reply::Integer(line.parse().expect("integer")), after)),
            b'$' => {
                let len: i64 = line.parse().expect("length");
                if len < 0 {
                    return Some((Reply::Bulk(None), after));
                }
                let end = after + len as usize;
                (buf.len() >= end + 2).then(|| {
                    (
                        Reply::bulk(Bytes::copy_from_slice(&buf[after..end])),
                        end + 2,
                    )
                })
            }
            b'*' => {
                let count: i64 = line.parse().expect("count");
                let mut at = after;
                let mut items = Vec::new();
                for _ in 0..count.max(0) {
                    let (item, len) = parse_reply(&buf[at..])?;
                    items.push(item);
                    at += len;
                }
                Some((Reply::Array((count >= 0).then_some(items)), at))
            }
            other => panic!("not a reply: {:?}", char::from(other)),
        }
    }

    /// A test's connection to the gateway.
    struct Connection {
        stream: tokio::net::TcpStream,
        buf: Vec<u8>,
    }

    impl Connection {
        async fn open(cluster: &FakeCluster) -> Connection {
            let stream = tokio::net::TcpStream::connect(cluster.gateway)
                .await
                .expect("the gateway listens");
            Connection {
                stream,
                buf: Vec::new(),
            }
        }

        async fn send(&mut self, bytes: &[u8]) {
            self.stream.write_all(bytes).await.expect("sent");
        }

        /// The next reply; panics if the connection closes or nothing comes in time.
        async fn reply(&mut self) -> Reply {
            loop {
                if let Some((reply, len)) = parse_reply(&self.buf) {
                    self.buf.drain(..len);
                    return reply;
                }
                let mut chunk = [0u8; 64 * 1024];
                let read = tokio::time::timeout(PATIENCE, self.stream.read(&mut chunk))
                    .await
                    .expect("a reply in time")
                    .expect("read");
                assert!(read > 0, "closed before a whole reply");
                self.buf.extend_from_slice(&chunk[..read]);
            }
        }

        async fn call(&mut self, words: &[&[u8]]) -> Reply {
            self.send(&request(words)).await;
            self.reply().await
        }

        /// Whether the gateway closes the connection within `wait` (what it sends
        /// before is discarded).
        async fn closes_within(&mut self, wait: Duration) -> bool {
            let deadline = Instant::now() + wait;
            let mut chunk = [0u8; 4096];
            loop {
                match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                    Err(_) => return false,
                    Ok(Ok(0) | Err(_)) => return true,
                    Ok(Ok(_)) => {}
                }
            }
        }
    }

    fn pong() -> Reply {
        Reply::Simple("PONG")
    }

    fn token() -> rampart_common::auth::ClusterToken {
        rampart_common::auth::ClusterToken::new(&[7; 32]).expect("a valid token")
    }

    #[tokio::test]
    async fn connection_silent_past_the_first_command_timeout_is_closed() {
        let limits = ConnectionLimits {
            first_command_timeout: Duration::from_millis(500),
            ..ConnectionLimits::default()
        };
        let cluster = FakeCluster::start(&[], limits, None).await;
        let mut silent = Connection::open(&cluster).await;
        assert!(silent.closes_within(PATIENCE).await);
        // Half a request is not a command.
        let mut slow = Connection::open(&cluster).await;
        slow.send(b"*1\r\n$4\r\nPI").await;
        assert!(slow.closes_within(PATIENCE).await);
        // A connection that spoke in time is not bound by it (no idle timeout is set).
        let mut prompt = Connection::open(&cluster).await;
        assert_eq!(prompt.call(&[b"PING"]).await, pong());
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(prompt.call(&[b"PING"]).await, pong());
    }

    #[tokio::test]
    async fn connection_that_does_not_authenticate_in_time_is_closed() {
        let limits = ConnectionLimits {
            first_command_timeout: Duration::from_millis(1000),
            ..ConnectionLimits::default()
        };
        let cluster = FakeCluster::start(&[], limits, Some(token())).await;
        // Commands before AUTH do not count: only AUTH ends the deadline.
        let mut stranger = Connection::open(&cluster).await;
        let Reply::Error(refused) = stranger.call(&[b"PING"]).await else {
            panic!("PING before AUTH answered");
        };
        assert!(refused.starts_with("NOAUTH"), "{refused}");
        let Reply::Error(wrong) = stranger.call(&[b"AUTH", b"guess"]).await else {
            panic!("a wrong password accepted");
        };
        assert!(wrong.starts_with("WRONGPASS"), "{wrong}");
        assert!(stranger.closes_within(PATIENCE).await);
        let mut member = Connection::open(&cluster).await;
        let password = token().resp_password();
        assert_eq!(
            member.call(&[b"AUTH", password.as_bytes()]).await,
            Reply::OK
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(member.call(&[b"PING"]).await, pong());
    }

    #[tokio::test]
    async fn connection_idle_past_the_idle_timeout_is_closed_when_one_is_set() {
        let limits = ConnectionLimits {
            idle_timeout: Some(Duration::from_millis(1000)),
            ..ConnectionLimits::default()
        };
        let cluster = FakeCluster::start(&[], limits, None).await;
        let mut idle = Connection::open(&cluster).await;
        // Activity keeps it open past the timeout...
        for _ in 0..6 {
            assert_eq!(idle.call(&[b"PING"]).await, pong());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // ...silence does not.
        assert!(idle.closes_within(PATIENCE).await);
        assert_eq!(
            idle_timeout_setting(&cluster).await,
            Reply::Array(Some(vec![Reply::bulk("timeout"), Reply::bulk("1")]))
        );
    }

    async fn idle_timeout_setting(cluster: &FakeCluster) -> Reply {
        Connection::open(cluster)
            .await
            .call(&[b"CONFIG", b"GET", b"timeout"])
            .await
    }

    #[tokio::test]
    async fn connection_past_the_per_peer_cap_is_answered_and_closed() {
        let limits = ConnectionLimits {
            connections_per_peer_max: 2,
            ..ConnectionLimits::default()
        };
        let cluster = FakeCluster::start(&[], limits, None).await;
        let mut first = Connection::open(&cluster).await;
        let mut second = Connection::open(&cluster).await;
        assert_eq!(first.call(&[b"PING"]).await, pong());
        assert_eq!(second.call(&[b"PING"]).await, pong());
        let mut third = Connection::open(&cluster).await;
        let Reply::Error(refused) = third.reply().await else {
            panic!("the third connection was not refused");
        };
        assert!(
            refused.starts_with("ERR max number of clients reached"),
            "{refused}"
        );
        assert!(third.closes_within(PATIENCE).await);
        // A place freed is a place to take.
        drop(first);
        let deadline = Instant::now() + PATIENCE;
        loop {
            let mut again = Connection::open(&cluster).await;
            again.send(&request(&[b"PING"])).await;
            if again.reply().await == pong() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the closed connection's place stays taken"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn replies_past_the_pending_bound_are_written_before_more_is_parsed() {
        const BOUND: usize = 4096;
        const VALUE_BYTES: usize = 1000;
        let limits = ConnectionLimits {
            reply_bytes_pending_max: BOUND,
            ..ConnectionLimits::default()
        };
        let cluster = FakeCluster::start(&[], limits, None).await;
        let mut connection = Connection::open(&cluster).await;
        // 64 requests in one write (64 KB): read together, they were answered together.
        let value = vec![b'v'; VALUE_BYTES];
        let pipeline: Vec<u8> = (0..64).flat_map(|_| request(&[b"ECHO", &value])).collect();
        connection.send(&pipeline).await;
        for _ in 0..64 {
            assert_eq!(connection.reply().await, Reply::bulk(value.clone()));
        }
        let Reply::Bulk(Some(info)) = connection.call(&[b"INFO"]).await else {
            panic!("INFO answered no text");
        };
        let info = String::from_utf8_lossy(&info).to_string();
        let peak: usize = info
            .lines()
            .find_map(|line| line.strip_prefix("client_recent_max_output_buffer:"))
            .expect("INFO tells the most reply bytes that waited")
            .parse()
            .expect("a number");
        let one_reply = VALUE_BYTES + "$1000\r\n\r\n".len();
        assert!(
            peak < BOUND + one_reply,
            "{peak} reply bytes waited; the bound is {BOUND} plus one reply"
        );
    }

    #[tokio::test]
    async fn pipelined_gets_and_sets_go_to_the_master_together_and_answer_in_order() {
        use rampart_common::protocol::master::{MultiRead, MultiWrite, Read, Write};
        let cluster = FakeCluster::start(&[], ConnectionLimits::default(), None).await;
        let mut connection = Connection::open(&cluster).await;
        let pipeline: Vec<u8> = [
            // Together (a multi-write), up to the key written again.
            request(&[b"SET", b"a", b"1"]),
            request(&[b"SET", b"b", b"2"]),
            request(&[b"SET", b"c", b"3"]),
            // Together, after them: refused, as `a` exists and `d` does not.
            request(&[b"SET", b"a", b"4", b"NX"]),
            request(&[b"SET", b"d", b"5", b"XX"]),
            // Together (a multi-read), seeing the writes before them.
            request(&[b"GET", b"a"]),
            request(&[b"GET", b"b"]),
            request(&[b"GET", b"none"]),
            request(&[b"GET", b"c"]),
            // Alone: the next is of another kind.
            request(&[b"SET", b"a", b"6"]),
            request(&[b"INCR", b"n"]),
            request(&[b"GET", b"a"]),
        ]
        .concat();
        connection.send(&pipeline).await;
        let mut replies = Vec::new();
        for _ in 0..12 {
            replies.push(connection.reply().await);
        }
        let nil = Reply::Bulk(None);
        assert_eq!(
            replies,
            [
                Reply::OK,
                Reply::OK,
                Reply::OK,
                nil.clone(),
                nil.clone(),
                Reply::bulk("1"),
                Reply::bulk("2"),
                nil,
                Reply::bulk("3"),
                Reply::OK,
                Reply::Integer(1),
                Reply::bulk("6"),
            ]
        );
        let master = &cluster.master;
        assert_eq!(master.calls::<MultiWrite>(), 2, "SETs sent together");
        assert_eq!(master.calls::<MultiRead>(), 1, "GETs sent together");
        // SET a 6 and the INCR's conditional write; the INCR's read and the last GET.
        assert_eq!(master.calls::<Write>(), 2);
        assert_eq!(master.calls::<Read>(), 2);
    }

    #[tokio::test]
    async fn pipelined_sets_arriving_in_pieces_answer_and_apply_in_order() {
        let cluster = FakeCluster::start(&[], ConnectionLimits::default(), None).await;
        let mut connection = Connection::open(&cluster).await;
        // Pieces sent one after the other without waiting, keys repeating across them
        // (and, as the pieces are read, within the runs they make).
        let mut expected = Vec::new();
        for piece in 0..8 {
            let mut pipeline = Vec::new();
            for i in 0..50 {
                let key = format!("k{}", (piece * 50 + i) % 120);
                let value = format!("{piece}-{i}");
                pipeline.extend(request(&[b"SET", key.as_bytes(), value.as_bytes()]));
                expected.push(Reply::OK);
            }
            connection.send(&pipeline).await;
        }
        connection.send(&request(&[b"GET", b"k0"])).await;
        connection.send(&request(&[b"GET", b"k119"])).await;
        for want in expected {
            assert_eq!(connection.reply().await, want);
        }
        // The last write of each key wins, as one at a time: k0's last is the 360th
        // SET (piece 7, its 10th), k119's the 359th (piece 7, its 9th).
        assert_eq!(connection.reply().await, Reply::bulk("7-10"));
        assert_eq!(connection.reply().await, Reply::bulk("7-9"));
    }

    #[tokio::test]
    async fn pipelined_sets_of_one_key_are_one_write_unless_it_is_refused() {
        use crate::fake_cluster::FAKE_VALUE_BYTES_MAX;
        use rampart_common::protocol::master::{MultiWrite, Write};
        let cluster = FakeCluster::start(&[], ConnectionLimits::default(), None).await;
        let mut connection = Connection::open(&cluster).await;
        // Sixteen SETs of one key (redis-benchmark -P 16 without -r): one write.
        let pipeline: Vec<u8> = (0..16)
            .flat_map(|i| request(&[b"SET", b"k", format!("{i:02}").as_bytes()]))
            .collect();
        connection.send(&pipeline).await;
        for _ in 0..16 {
            assert_eq!(connection.reply().await, Reply::OK);
        }
        assert_eq!(connection.call(&[b"GET", b"k"]).await, Reply::bulk("15"));
        let master = &cluster.master;
        assert_eq!(master.calls::<MultiWrite>(), 1);
        assert_eq!(master.calls::<Write>(), 0);
        // The last value refused (too large): the SETs run alone, each answered as it
        // would have been alone, and the value before the refused one stays.
        let small = vec![b's'; FAKE_VALUE_BYTES_MAX / 2];
        let large = vec![b'l'; FAKE_VALUE_BYTES_MAX + 1];
        let pipeline = [
            request(&[b"SET", b"k", &small]),
            request(&[b"SET", b"other", b"v"]),
            request(&[b"SET", b"k", &large]),
        ]
        .concat();
        connection.send(&pipeline).await;
        assert_eq!(connection.reply().await, Reply::OK);
        assert_eq!(connection.reply().await, Reply::OK);
        let Reply::Error(refused) = connection.reply().await else {
            panic!("a value too large was answered OK");
        };
        assert!(refused.contains("value too large"), "{refused}");
        assert_eq!(connection.call(&[b"GET", b"k"]).await, Reply::bulk(small));
        assert_eq!(master.calls::<MultiWrite>(), 2);
        assert_eq!(master.calls::<Write>(), 2, "the key's two SETs, alone");
    }

    #[test]
    fn an_absorbing_write_refused_runs_its_sets_alone_and_one_of_unknown_outcome_answers_each() {
        use rampart_common::status::Status;
        let timeout = ClientError::Timeout {
            attempts: 3,
            last: "no reply".into(),
        };
        let invalid = ClientError::Invalid {
            status: Status::InvalidArgument,
            detail: "value too large".into(),
        };
        // Applied, or its condition refused: the same answer for each SET it answers.
        for answers in [1, 16] {
            assert_eq!(set_answer(&Ok(Version(7)), answers), Some(Reply::OK));
            let rejected = ClientError::Rejected {
                status: Status::ObjectExists,
                current: Version(3),
            };
            assert_eq!(set_answer(&Err(rejected), answers), Some(Reply::Bulk(None)));
        }
        // Unknown outcome: each absorbed SET is answered TIMEOUT, none sent again (it may
        // have applied, and with it every one it absorbed).
        for answers in [1, 16] {
            let Some(Reply::Error(text)) = set_answer(&Err(timeout.clone()), answers) else {
                panic!("a timeout must be answered");
            };
            assert!(text.starts_with("TIMEOUT"), "{text}");
            let expired = ClientError::LeaseExpired("cut off".into());
            assert!(set_answer(&Err(expired), answers).is_some());
        }
        // Refused: alone, the error; having absorbed others, each of them runs alone.
        assert!(matches!(
            set_answer(&Err(invalid.clone()), 1),
            Some(Reply::Error(_))
        ));
        assert_eq!(set_answer(&Err(invalid), 2), None);
        assert_eq!(set_answer(&Err(ClientError::NoSpace), 2), None);
    }

    /// `SCAN`'s cursor and keys.
    fn scanned(reply: Reply) -> (u64, Vec<Bytes>) {
        let Reply::Array(Some(parts)) = reply else {
            panic!("SCAN answered {reply:?}");
        };
        match &parts[..] {
            [Reply::Bulk(Some(cursor)), Reply::Array(Some(keys))] => (
                std::str::from_utf8(cursor)
                    .expect("text")
                    .parse()
                    .expect("a cursor"),
                keys.iter()
                    .map(|key| match key {
                        Reply::Bulk(Some(key)) => key.clone(),
                        other => panic!("a key: {other:?}"),
                    })
                    .collect(),
            ),
            other => panic!("SCAN answered {other:?}"),
        }
    }

    #[tokio::test]
    async fn scan_examines_ten_times_count_per_call_and_returns_every_key_once() {
        let keys: Vec<Bytes> = (0..1000).map(|i| Bytes::from(format!("k{i:04}"))).collect();
        let cluster = FakeCluster::start(&keys, ConnectionLimits::default(), None).await;
        let mut connection = Connection::open(&cluster).await;
        // A pattern that matches nothing: one call examines 10 × COUNT keys and says
        // where it stopped, not the whole table.
        let (cursor, found) = scanned(
            connection
                .call(&[b"SCAN", b"0", b"MATCH", b"none*", b"COUNT", b"10"])
                .await,
        );
        assert!(found.is_empty());
        assert_ne!(cursor, 0, "one call walked the whole table");
        let mut calls = 1;
        let mut cursor = cursor;
        while cursor != 0 {
            let text = cursor.to_string();
            let (next, found) = scanned(
                connection
                    .call(&[
                        b"SCAN",
                        text.as_bytes(),
                        b"MATCH",
                        b"none*",
                        b"COUNT",
                        b"10",
                    ])
                    .await,
            );
            assert!(found.is_empty());
            cursor = next;
            calls += 1;
        }
        assert_eq!(calls, 10, "1,000 keys, 100 examined a call");
        // Without a pattern: COUNT keys a call, every key once; the page a call stopped
        // inside is not fetched again for the next.
        let returned_before = cluster.master.keys_returned.load(Ordering::Relaxed);
        let mut all = Vec::new();
        let mut cursor = 0;
        loop {
            let text = cursor.to_string();
            let (next, found) = scanned(
                connection
                    .call(&[b"SCAN", text.as_bytes(), b"COUNT", b"30"])
                    .await,
            );
            assert!(found.len() <= 30);
            all.extend(found);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        all.sort();
        assert_eq!(all, keys);
        let fetched = cluster.master.keys_returned.load(Ordering::Relaxed) - returned_before;
        assert_eq!(fetched, 1000, "each page fetched once");
    }

    #[tokio::test]
    async fn config_get_answers_known_names_and_an_empty_array_for_others() {
        let cluster = FakeCluster::start(&[], ConnectionLimits::default(), None).await;
        let mut connection = Connection::open(&cluster).await;
        // What redis-benchmark asks before it starts.
        assert_eq!(
            connection.call(&[b"CONFIG", b"GET", b"save"]).await,
            Reply::Array(Some(vec![Reply::bulk("save"), Reply::bulk("")]))
        );
        assert_eq!(
            connection.call(&[b"CONFIG", b"GET", b"appendonly"]).await,
            Reply::Array(Some(vec![Reply::bulk("appendonly"), Reply::bulk("no")]))
        );
        assert_eq!(
            connection
                .call(&[b"CONFIG", b"GET", b"no-such-setting"])
                .await,
            Reply::Array(Some(Vec::new()))
        );
        assert_eq!(
            idle_timeout_setting(&cluster).await,
            Reply::Array(Some(vec![Reply::bulk("timeout"), Reply::bulk("0")]))
        );
    }
}
