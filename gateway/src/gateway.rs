//! `Gateway`: a RESP listener in front of one table, driving the client library.
//!
//! Each connection reads requests ([`crate::resp::take_request`], pipelined requests
//! answered in order), parses them ([`crate::commands::parse`]) and runs them through
//! one shared [`Client`], which routes every key to its master and retries while
//! tablets move or a master is recovered, so every `OK` is a write on R backups, and a
//! write applies once however often it is retried (the client's exactly-once
//! identities). Commands Redis runs atomically on one key run here as the client's
//! compare-and-swap: `INCR` reads the decimal value and writes the sum on the condition
//! that the version did not change (trying again if it did); `SET ... GET` likewise.
//! `MSET` writes each key once, but not all at once (keys on different masters).
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
//! Limits: [`GATEWAY_CONNECTIONS_MAX`] connections (further ones wait in the listen
//! backlog), requests bounded by [`RequestLimits`] (so is what a connection buffers:
//! one request, 64 MiB at most), replies written within
//! [`REPLY_WRITE_TIMEOUT`]. A protocol error is answered and its connection closed; any
//! other error (an unknown command, a bad argument, a timed-out write) is answered and
//! the connection goes on.

use bytes::{Bytes, BytesMut};
use rampart_client::{Client, ClientError, TableId, WriteItem};
use rampart_common::auth::{ClusterToken, Security};
use rampart_common::reject::RejectRules;
use rampart_common::secure::SecureStream;
use rampart_common::tls::TlsAcceptor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::commands::{self, glob_match, Command, SetCondition};
use crate::resp::{take_request, Reply, RequestLimits};

/// Connections served at once.
pub const GATEWAY_CONNECTIONS_MAX: usize = 10_000;

/// How long a client may take to take a reply before its connection is closed.
pub const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

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
        let _ = stream.set_nodelay(true);
        let Ok(peer) = stream.peer_addr() else {
            return;
        };
        let Ok(mut stream) = rampart_common::secure::accept(stream, peer, &self.tls, "resp").await
        else {
            return;
        };
        self.connected.fetch_add(1, Ordering::Relaxed);
        let mut session = Session {
            id: self.next_client_id.fetch_add(1, Ordering::Relaxed),
            name: None,
            authenticated: self.password.is_none(),
            peer: Some(peer),
        };
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut output = BytesMut::with_capacity(16 * 1024);
        'serve: loop {
            // Every whole request read so far, in order (pipelining).
            loop {
                let limits = if session.authenticated {
                    &self.limits
                } else {
                    &RequestLimits::UNAUTHENTICATED
                };
                match take_request(&mut input, limits) {
                    Ok(Some(args)) if args.is_empty() => continue,
                    Ok(Some(args)) => {
                        let (reply, close) = self.run(&args, &mut session).await;
                        reply.encode(&mut output);
                        if close {
                            let _ = self.flush(&mut stream, &mut output).await;
                            break 'serve;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        Reply::err(error).encode(&mut output);
                        let _ = self.flush(&mut stream, &mut output).await;
                        break 'serve;
                    }
                }
            }
            if self.flush(&mut stream, &mut output).await.is_err() {
                break;
            }
            match stream.read_buf(&mut input).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        self.connected.fetch_sub(1, Ordering::Relaxed);
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
        match written {
            Ok(Ok(())) => Ok(()),
            _ => Err(()),
        }
    }

    /// Runs one request; the reply, and whether to close the connection after it.
    async fn run(&self, args: &[Bytes], session: &mut Session) -> (Reply, bool) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        if !session.authenticated && !may_run_unauthenticated(&args[0]) {
            return (
                Reply::Error("NOAUTH Authentication required.".into()),
                false,
            );
        }
        let command = match commands::parse(args) {
            Ok(command) => command,
            Err(reply) => return (reply, false),
        };
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
                let mut pages = client.enumerate_from(table, cursor);
                let mut keys = Vec::new();
                while keys.len() < count {
                    let Some(page) = pages.next_page().await? else {
                        break;
                    };
                    keys.extend(
                        page.into_iter()
                            .filter(|o| pattern.as_ref().map_or(true, |p| glob_match(p, &o.key)))
                            .map(|o| Reply::bulk(o.key)),
                    );
                }
                let next = pages.resume_hash().unwrap_or(0);
                Reply::Array(Some(vec![
                    Reply::bulk(next.to_string()),
                    Reply::Array(Some(keys)),
                ]))
            }
        })
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
            let rules = RejectRules {
                exists: condition == SetCondition::IfAbsent,
                doesnt_exist: condition == SetCondition::IfPresent,
                ..RejectRules::default()
            };
            return match client.write_with(table, key, value, rules).await {
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
             # Clients\r\nconnected_clients:{}\r\n# Stats\r\ntotal_commands_processed:{}\r\n\
             # Keyspace\r\n",
            self.table_name,
            self.connected.load(Ordering::Relaxed),
            self.commands.load(Ordering::Relaxed)
        )
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

/// The error reply for a client library error (its message names what failed;
/// timeouts and a full log get Redis's kinds).
fn client_error(error: ClientError) -> Reply {
    match error {
        ClientError::Timeout { .. } => Reply::Error(format!("TIMEOUT {error}")),
        ClientError::NoSpace => Reply::Error(format!("OOM {error}")),
        other => Reply::err(other),
    }
}
