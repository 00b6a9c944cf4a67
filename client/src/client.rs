//! `Client`: the table API of DESIGN.md §3 over the cluster.
//!
//! The client keeps a cached tablet map and sends each operation straight to the
//! master owning the key's hash. When a master answers `UnknownTablet` or cannot be
//! reached, the client refreshes the map from a coordinator and retries with
//! exponential backoff until the operation's deadline.
//!
//! # Retries and exactly-once
//! Every operation is retried until its deadline: through tablet moves, recoveries, and
//! connections that broke before or after the request was sent. Writes, removes and
//! increments are safe to send again because each carries an exactly-once identity
//! (`rampart_common::rifl`, RAMCloud's RIFL): the client's id, given by the coordinators
//! at [`Client::connect`], and a number per operation kept by its retries
//! ([`crate::tracker`]). A master that applied it before answers the retry from the
//! completion record it logged with the object — also after a crash moved the object to
//! another master — so the operation applies once and the caller gets its one outcome.
//! Only an operation whose deadline passes ends without an outcome:
//! [`ClientError::Timeout`], which may or may not have applied. Its message says what
//! the last attempt met and, asked briefly after the deadline (once a second per owner
//! at most), what the cluster says of the key's owner (for a multi-object operation, of
//! the owner whose objects were tried again last): crashed and being recovered, its
//! recovery waiting (and why), up but unable to replicate writes (too few backups for
//! R), or up with its memory nearly full of live data — each with the fix. A tablet
//! whose owner is merely being recovered times out as such, never as a coordinator
//! failure.
//!
//! A write-type operation waits for its number while one slow operation holds the
//! client's acknowledgement so far back that masters could not keep the records of the
//! operations numbered after it (`crate::tracker`, "Limits"); the wait counts against
//! its deadline, and one that ends there is a `Timeout` of no attempt (never sent).
//!
//! # Client lease
//! The client's id comes with a lease, renewed by a background task every third of its
//! length (`rampart_common::rifl`, "Leases"). Cut off from the coordinators (or paused)
//! for longer than the lease, the client loses its id: masters refuse its writes
//! `ClientLeaseExpired`. The client then opens a new id — as soon as a renewal is told
//! the lease expired, or an operation is refused — and carries on under it. Operations
//! numbered under the old id are never sent under the new one (that would make them
//! second, independent operations): each ends when refused, as
//! [`ClientError::LeaseExpired`], whose outcome is unknown (it may have applied once
//! before the lease ran out), or by its deadline. Operations that had no number yet wait
//! for the new id, until their deadline (then [`ClientError::NoCoordinator`]).
//!
//! # Coordinators
//! Table operations and map refreshes go to the leader of the coordinators' Raft group
//! through a [`CoordinatorSet`]: it asks the leader it last found first, follows
//! `NotLeader` hints, and goes round the given coordinators (pausing between rounds)
//! until the operation's deadline, when the operation fails with
//! [`ClientError::NoCoordinator`] carrying the last reason (`no leader: ...`,
//! `connection refused`). `TableDoesntExist` fails it at once. Every coordinator call of
//! the client is safe to repeat after a lost reply: reads, and creates and drops that are
//! idempotent by name.
//!
//! # Failure reports
//! A master that cannot be reached (a transport failure in a single-object operation,
//! an enumeration or a multi-op) is reported to the coordinators with `ReportFailure`
//! (DESIGN.md §6), by a background task: the operation refreshes its map and retries at
//! once, as above, without waiting for the report. Reports are rate-limited per server
//! and bounded in number ([`crate::failure_reporter`]); one that fails is dropped.
//!
//! A master that answers `Retry` (for instance because its lease lapsed while it was cut
//! off from the coordinators, so its tablets may be moving) makes the client refresh its
//! map before it tries again, and is reported as well: a master cut off from the
//! coordinators but not from its peers or clients answers every ping of its peers, so
//! without a client's report nobody would have the coordinator check it, and its tablets
//! would stay unavailable for as long as the partition lasts. The coordinator's own ping
//! decides; a master that merely was busy answers it.

use bytes::Bytes;
use parking_lot::RwLock;
use rampart_common::config::ByteSize;
use rampart_common::coordinator_set::{
    CoordinatorCallError, CoordinatorSet, COORDINATOR_ATTEMPT_TIMEOUT_MAX,
};
use rampart_common::ids::{key_hash, ClientId, ServerId, TableId, Version};
use rampart_common::limits::{MULTI_OPS_MAX, MULTI_WRITE_REQUEST_BYTES_MAX};
use rampart_common::protocol::coordinator::{
    CreateTable, CreateTableRequest, DropTable, DropTableRequest, GetTableId, GetTabletMap,
    OpenClient, OpenClientRequest, RecoveryStatus, RecoveryStatusRequest, RenewClientLease,
    RenewClientLeaseRequest, ReportFailure, ReportFailureRequest, TableNameRequest,
    TabletMapRequest,
};
use rampart_common::protocol::master::{
    Enumerate, EnumerateRequest, EnumeratedObject, Increment, IncrementRequest, MultiRead,
    MultiReadRequest, MultiRemove, MultiRemoveRequest, MultiWrite, MultiWriteReply,
    MultiWriteRequest, ObjectKey, PingRequest, Read, ReadRequest, Remove, RemoveRequest,
    ServerStats, ServerStatsReply, Write, WriteReply, WriteRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::rpc::{Rpc, RpcError, RpcPool};
use rampart_common::status::Status;
use rampart_common::tablet::ServerStatus;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::error::ClientError;
use crate::failure_reporter::{
    FailureReporter, FAILURE_REPORTS_IN_FLIGHT_MAX, FAILURE_REPORT_TIMEOUT,
};
use crate::tablet_map::TabletMapCache;
use crate::tracker::{Ticket, TicketsError, Tracker, TICKETS_MAX};

/// Tunables of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long one operation may take, retries included.
    pub deadline: Duration,
    /// First pause between retries on masters; doubles up to `backoff_max`. (Coordinator
    /// calls pause as `rampart_common::coordinator_set` says.)
    pub backoff_min: Duration,
    /// Longest pause between retries on masters.
    pub backoff_max: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: Duration::from_secs(10),
            backoff_min: Duration::from_millis(2),
            backoff_max: Duration::from_millis(200),
        }
    }
}

/// An object read from a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// The value.
    pub value: Bytes,
    /// Its version.
    pub version: Version,
}

/// One object of a [`Client::multi_write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteItem {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Bytes,
    /// The new value.
    pub value: Bytes,
    /// When to refuse.
    pub rules: RejectRules,
}

/// A connection to a Rampart cluster. Cheap to clone; clones share connections and
/// the tablet map.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The coordinators given to `connect`, and their leader once found.
    coordinators: CoordinatorSet,
    options: ClientOptions,
    pool: RpcPool,
    /// The cached map; replaced whole on refresh.
    map: RwLock<Arc<TabletMapCache>>,
    /// Serialises refreshes so a burst of `UnknownTablet`s fetches the map once.
    refreshing: tokio::sync::Mutex<()>,
    /// Which unreachable masters to report, and when. A `parking_lot` mutex: taken for
    /// a map lookup, never across an `.await`.
    reporter: parking_lot::Mutex<FailureReporter>,
    /// Bounds the reports in flight ([`FAILURE_REPORTS_IN_FLIGHT_MAX`]).
    reports_in_flight: Arc<tokio::sync::Semaphore>,
    /// This client's id and the numbers of its writes under it (exactly-once retries).
    /// Replaced by the lease task ([`keep_identity`]) once the id's lease expired; a
    /// watch, so that operations waiting for the new id wake when it comes.
    identity: watch::Sender<Arc<Tracker>>,
    /// Wakes the lease task at once: an operation found the id expired.
    lease_lost: Arc<Notify>,
    /// What the cluster last said of an owner whose operations timed out, and when
    /// (reused for [`EXPLANATION_REUSE`], so that a burst of timeouts asks once).
    explained: parking_lot::Mutex<HashMap<ServerId, (Instant, Option<String>)>>,
}

/// The outcome of one attempt, for the retry loop.
enum Attempt<T> {
    Done(Result<T, ClientError>),
    /// Refresh the map and try again (`UnknownTablet`, owner unreachable).
    Reroute(String),
    /// Try again after a pause (server busy).
    Later(String),
}

/// One object's part of a multi-op reply: its status, version and value (empty for
/// writes and removes).
type ObjectReply = (Status, Version, Bytes);

/// Per-operation retry state.
struct Retry {
    deadline: Instant,
    attempts: u32,
    backoff: Duration,
    backoff_max: Duration,
}

impl Retry {
    /// Pauses before the next attempt, or fails when the deadline has passed.
    async fn pause(&mut self, why: String) -> Result<(), ClientError> {
        self.attempts += 1;
        let now = Instant::now();
        if now >= self.deadline {
            return Err(ClientError::Timeout {
                attempts: self.attempts,
                last: why,
            });
        }
        tracing::debug!(attempt = self.attempts, %why, "retrying");
        tokio::time::sleep(self.backoff.min(self.deadline - now)).await;
        self.backoff = (self.backoff * 2).min(self.backoff_max);
        Ok(())
    }
}

impl Client {
    /// Connects to the cluster through its coordinators (`host:port` each; an entry may
    /// list several, comma-separated, as `RAMPART_COORDINATOR` does) and fetches the
    /// tablet map. Any one reachable coordinator is enough: the client finds the leader.
    pub async fn connect<S: AsRef<str>>(coordinators: &[S]) -> Result<Client, ClientError> {
        Client::connect_with(coordinators, ClientOptions::default()).await
    }

    /// Like [`connect`](Self::connect), with explicit options.
    pub async fn connect_with<S: AsRef<str>>(
        coordinators: &[S],
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        let coordinators = CoordinatorSet::new(coordinators);
        if coordinators.is_empty() {
            return Err(ClientError::NoCoordinator(
                "no coordinator address given".into(),
            ));
        }
        let pool = RpcPool::new();
        let deadline = Instant::now() + options.deadline;
        let opened = match coordinators
            .call::<OpenClient>(&pool, &OpenClientRequest {}, deadline)
            .await
        {
            Ok(reply) => reply,
            Err(CoordinatorCallError::NoLeader { last, .. }) => {
                return Err(ClientError::NoCoordinator(last))
            }
            Err(CoordinatorCallError::Rpc(error)) => return Err(ClientError::from_rpc(error)),
        };
        let client = Client {
            inner: Arc::new(Inner {
                coordinators,
                options,
                pool,
                map: RwLock::new(Arc::new(TabletMapCache::default())),
                refreshing: tokio::sync::Mutex::new(()),
                reporter: parking_lot::Mutex::new(FailureReporter::new()),
                reports_in_flight: Arc::new(tokio::sync::Semaphore::new(
                    FAILURE_REPORTS_IN_FLIGHT_MAX,
                )),
                identity: watch::Sender::new(Tracker::new(opened.client)),
                lease_lost: Arc::new(Notify::new()),
                explained: parking_lot::Mutex::new(HashMap::new()),
            }),
        };
        tokio::spawn(keep_identity(
            Arc::downgrade(&client.inner),
            Duration::from_millis(u64::from(opened.lease_ms)),
            Arc::clone(&client.inner.lease_lost),
        ));
        client.refresh_map(0, deadline).await?;
        Ok(client)
    }

    /// The options this client runs with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// The id the coordinators gave this client (its writes' completion records carry
    /// it). A new one once the lease of the last expired (module doc, "Client lease").
    pub fn id(&self) -> ClientId {
        self.inner.identity.borrow().client()
    }

    /// A number for one write-type operation, kept by its retries.
    async fn ticket(&self, deadline: Instant) -> Result<Ticket, ClientError> {
        self.tickets(1, deadline)
            .await?
            .pop()
            .ok_or_else(|| ClientError::Server("no number given".into()))
    }

    /// Numbers for `n` write-type operations (at most [`TICKETS_MAX`]), kept by their
    /// retries, under the client's current id. Waits until `deadline` while a slow
    /// operation holds the span of numbers full (`crate::tracker`, "Limits": then a
    /// `Timeout` of no attempt) or the id expired and no new one came yet (then
    /// `NoCoordinator`). Nothing was sent when it fails.
    async fn tickets(&self, n: usize, deadline: Instant) -> Result<Vec<Ticket>, ClientError> {
        let mut identity = self.inner.identity.subscribe();
        loop {
            let tracker = Arc::clone(&identity.borrow_and_update());
            match tracker.tickets(n, deadline).await {
                Ok(tickets) => return Ok(tickets),
                Err(error @ TicketsError::SpanFull { .. }) => {
                    return Err(ClientError::Timeout {
                        attempts: 0,
                        last: error.to_string(),
                    })
                }
                Err(TicketsError::Expired(client)) => {
                    self.inner.lease_lost.notify_one();
                    match tokio::time::timeout_at(deadline, identity.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => {
                            return Err(ClientError::Server("the client is closing".into()))
                        }
                        Err(_) => {
                            return Err(ClientError::NoCoordinator(format!(
                                "the lease of client {client} expired and no coordinator \
                                 opened a new client id in time"
                            )))
                        }
                    }
                }
            }
        }
    }

    /// Notes how an operation numbered under `tracker`'s id ended: `LeaseExpired` says
    /// that id expired, and the lease task opens a new one for the operations after it.
    /// The operation itself is not sent again (its outcome is unknown).
    fn settle<T>(&self, tracker: &Tracker, result: &Result<T, ClientError>) {
        if matches!(result, Err(ClientError::LeaseExpired(_))) {
            tracker.expire();
            self.inner.lease_lost.notify_one();
        }
    }

    /// [`settle`](Self::settle) for a multi-op whose objects `tickets` numbered.
    fn settle_all<T>(
        &self,
        tickets: &[Ticket],
        done: Result<Vec<Result<T, ClientError>>, ClientError>,
    ) -> Result<Vec<Result<T, ClientError>>, ClientError> {
        if let (Some(ticket), Ok(results)) = (tickets.first(), &done) {
            if let Some(expired) = results
                .iter()
                .find(|result| matches!(result, Err(ClientError::LeaseExpired(_))))
            {
                self.settle(ticket.tracker(), expired);
            }
        }
        done
    }

    /// The deadline of an operation starting now.
    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.options.deadline
    }

    fn retry(&self) -> Retry {
        self.retry_until(Instant::now() + self.inner.options.deadline)
    }

    fn retry_until(&self, deadline: Instant) -> Retry {
        let options = &self.inner.options;
        Retry {
            deadline,
            attempts: 0,
            backoff: options.backoff_min,
            backoff_max: options.backoff_max,
        }
    }

    fn map(&self) -> Arc<TabletMapCache> {
        Arc::clone(&self.inner.map.read())
    }

    /// Fetches the tablet map, unless one newer than `seen` arrived or a fetch finished
    /// after the caller saw its failure (so a burst of failures fetches once), trying
    /// until `deadline`.
    async fn refresh_map(&self, seen: u64, deadline: Instant) -> Result<(), ClientError> {
        let observed = std::time::Instant::now();
        let _refreshing = self.inner.refreshing.lock().await;
        let map = self.map();
        if map.version > seen || map.fetched_at.is_some_and(|at| at > observed) {
            return Ok(());
        }
        let map = self
            .coordinator_call::<GetTabletMap>(&TabletMapRequest {}, deadline)
            .await?;
        *self.inner.map.write() = Arc::new(TabletMapCache::new(map));
        Ok(())
    }

    /// [`refresh_map`](Self::refresh_map) inside an operation's retry loop, after an
    /// attempt that failed because of `why`. Should the operation's deadline pass during
    /// the refresh, the operation timed out because of `why` — not because of the
    /// coordinators, which were simply not asked again in time.
    async fn refresh_after(&self, seen: u64, retry: &Retry, why: &str) -> Result<(), ClientError> {
        match self.refresh_map(seen, retry.deadline).await {
            Err(_) if Instant::now() >= retry.deadline => Err(ClientError::Timeout {
                attempts: retry.attempts + 1,
                last: why.to_string(),
            }),
            result => result,
        }
    }

    /// Calls a coordinator RPC on the coordinators' leader, following `NotLeader`
    /// hints and retrying until `deadline` (see `rampart_common::coordinator_set`).
    async fn coordinator_call<R: Rpc>(
        &self,
        request: &R::Request,
        deadline: Instant,
    ) -> Result<R::Reply, ClientError> {
        self.coordinator_call_within::<R>(request, deadline, COORDINATOR_ATTEMPT_TIMEOUT_MAX)
            .await
    }

    /// [`coordinator_call`](Self::coordinator_call) of a table change, whose leader
    /// answers once the masters took their tablets, or after its own wait for them why
    /// they did not: each attempt waits up to [`TABLE_CHANGE_ATTEMPT_TIMEOUT`] for that
    /// answer rather than time out first.
    async fn coordinator_call_patient<R: Rpc>(
        &self,
        request: &R::Request,
        deadline: Instant,
    ) -> Result<R::Reply, ClientError> {
        self.coordinator_call_within::<R>(request, deadline, TABLE_CHANGE_ATTEMPT_TIMEOUT)
            .await
    }

    /// A coordinator call whose every attempt may take up to `attempt_timeout`.
    async fn coordinator_call_within<R: Rpc>(
        &self,
        request: &R::Request,
        deadline: Instant,
        attempt_timeout: Duration,
    ) -> Result<R::Reply, ClientError> {
        let inner = &self.inner;
        let result = inner
            .coordinators
            .call_with_attempts::<R>(&inner.pool, request, deadline, attempt_timeout)
            .await;
        match result {
            Ok(reply) => Ok(reply),
            Err(CoordinatorCallError::NoLeader { last, .. }) => {
                Err(ClientError::NoCoordinator(last))
            }
            Err(CoordinatorCallError::Rpc(RpcError::Status {
                status: Status::TableDoesntExist,
                detail,
                ..
            })) => Err(ClientError::TableDoesntExist(detail)),
            Err(CoordinatorCallError::Rpc(error)) => Err(ClientError::from_rpc(error)),
        }
    }

    /// Reports `server` (found unreachable) to the coordinators in the background,
    /// unless it was reported lately or too many reports are in flight (module doc).
    fn report_unreachable(&self, server: ServerId, error: &RpcError) {
        let Ok(permit) = Arc::clone(&self.inner.reports_in_flight).try_acquire_owned() else {
            return;
        };
        if !self
            .inner
            .reporter
            .lock()
            .should_report(server, Instant::now())
        {
            return;
        }
        tracing::debug!(%server, %error, "reporting an unreachable master");
        let inner = Arc::clone(&self.inner);
        let request = ReportFailureRequest {
            server,
            reporter: format!("client pid {}", std::process::id()),
        };
        tokio::spawn(async move {
            let deadline = Instant::now() + FAILURE_REPORT_TIMEOUT;
            if let Err(error) = inner
                .coordinators
                .call_round::<ReportFailure>(&inner.pool, &request, deadline)
                .await
            {
                tracing::debug!(%server, %error, "failure report not delivered");
            }
            drop(permit);
        });
    }

    /// Creates table `name` split over `span` tablets (spread over the masters), or
    /// returns the id of the existing table of that name.
    pub async fn create_table(&self, name: &str, span: u32) -> Result<TableId, ClientError> {
        let request = CreateTableRequest {
            name: name.to_string(),
            span,
        };
        let deadline = self.retry().deadline;
        let id = self
            .coordinator_call_patient::<CreateTable>(&request, deadline)
            .await?
            .id;
        self.refresh_map(self.map().version, deadline).await?;
        Ok(id)
    }

    /// Drops table `name` and all its objects. Dropping a missing table succeeds.
    ///
    /// The name is looked up once (at the coordinators, not in the cached map) and the
    /// table dropped by its id, so that a drop retried after an unknown outcome never
    /// drops a table another client created under the same name meanwhile.
    pub async fn drop_table(&self, name: &str) -> Result<(), ClientError> {
        let deadline = self.retry().deadline;
        let request = TableNameRequest {
            name: name.to_string(),
        };
        let id = match self
            .coordinator_call::<GetTableId>(&request, deadline)
            .await
        {
            Ok(reply) => reply.id,
            Err(ClientError::TableDoesntExist(_)) => return Ok(()),
            Err(error) => return Err(error),
        };
        self.drop_table_id(id).await
    }

    /// Drops the table with id `id` and all its objects; succeeds if it no longer exists.
    pub async fn drop_table_id(&self, id: TableId) -> Result<(), ClientError> {
        let deadline = self.retry().deadline;
        self.coordinator_call_patient::<DropTable>(&DropTableRequest { id }, deadline)
            .await?;
        self.refresh_map(self.map().version, deadline).await
    }

    /// The id of table `name`.
    pub async fn get_table_id(&self, name: &str) -> Result<TableId, ClientError> {
        if let Some(id) = self.map().table_id(name) {
            return Ok(id);
        }
        let request = TableNameRequest {
            name: name.to_string(),
        };
        self.coordinator_call::<GetTableId>(&request, self.retry().deadline)
            .await
            .map(|reply| reply.id)
    }

    /// Runs `attempt` against the owner of `key`, refreshing the map and retrying as
    /// the module doc describes: every request may be sent again, reads because they
    /// change nothing, writes because they carry their exactly-once identity.
    async fn on_owner<T, F, Fut>(
        &self,
        table: TableId,
        key: &[u8],
        deadline: Instant,
        attempt: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(String, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, RpcError>>,
    {
        self.on_hash(table, key_hash(key).0, deadline, |addr, _, deadline| {
            attempt(addr, deadline)
        })
        .await
    }

    /// Runs `attempt(owner address, tablet end hash, deadline)` against the owner of
    /// key hash `hash` of `table`, with the retry rules of [`on_owner`](Self::on_owner),
    /// until `deadline`.
    async fn on_hash<T, F, Fut>(
        &self,
        table: TableId,
        hash: u64,
        deadline: Instant,
        attempt: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(String, u64, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, RpcError>>,
    {
        let hash = rampart_common::ids::KeyHash(hash);
        let mut retry = self.retry_until(deadline);
        // The owner last tried: a timeout says what the cluster knows of it.
        let mut owner = None;
        let result = async {
            loop {
                let map = self.map();
                let Some((tablet, addr)) = map.route(table, hash) else {
                    // Should the deadline pass while the map is fetched, the operation timed
                    // out for want of an owner — not for want of a coordinator.
                    let why = map.why_unrouted(table, hash);
                    self.refresh_after(map.version, &retry, &why).await?;
                    let map = self.map();
                    if !map.has_table(table) {
                        return Err(ClientError::TableDoesntExist(table.to_string()));
                    }
                    if map.route(table, hash).is_none() {
                        retry.pause(map.why_unrouted(table, hash)).await?;
                    }
                    continue;
                };
                owner = Some(tablet.owner);
                let why = match attempt(addr.clone(), tablet.end_hash, retry.deadline).await {
                    Ok(Attempt::Done(result)) => return result,
                    Ok(Attempt::Reroute(why)) => {
                        self.refresh_after(map.version, &retry, &why).await?;
                        why
                    }
                    Ok(Attempt::Later(why)) => why,
                    // Never reached the master whole, or reached it and lost its answer: a
                    // read changes nothing, a write is answered from its completion record.
                    Err(e) if e.is_transport() => {
                        self.report_unreachable(tablet.owner, &e);
                        let why = e.to_string();
                        self.refresh_after(map.version, &retry, &why).await?;
                        why
                    }
                    // The master may be losing its tablets (a lapsed lease): look again, and
                    // report it, for a master cut off from the coordinators alone is still
                    // reachable here and nobody else would (the coordinator's ping decides).
                    Err(e) if matches!(e.status(), Some(Status::Retry | Status::ShuttingDown)) => {
                        if e.status() == Some(Status::Retry) {
                            self.report_unreachable(tablet.owner, &e);
                        }
                        let why = e.to_string();
                        self.refresh_after(map.version, &retry, &why).await?;
                        why
                    }
                    Err(e) => return Err(ClientError::from_rpc(e)),
                };
                // The refreshed map names another owner (a recovered tablet went live):
                // try it at once rather than after the backoff.
                let moved = self
                    .map()
                    .route(table, hash)
                    .is_some_and(|(_, owner)| owner != addr);
                if moved && Instant::now() < retry.deadline {
                    continue;
                }
                retry.pause(why).await?;
            }
        }
        .await;
        match (result, owner) {
            (Err(ClientError::Timeout { attempts, last }), Some(owner)) => {
                Err(self.explain_timeout(attempts, last, owner).await)
            }
            (result, _) => result,
        }
    }

    /// The `Timeout` of an operation whose key `owner` serves, with what the cluster
    /// says of that owner: crashed and being recovered (or why its recovery waits), or
    /// up but unable to replicate writes (too few backups for R). Asks for it briefly
    /// ([`EXPLAIN_TIMEOUT`]), after the deadline; says nothing more if nobody answers.
    async fn explain_timeout(&self, attempts: u32, last: String, owner: ServerId) -> ClientError {
        let cached = {
            let explained = self.inner.explained.lock();
            explained
                .get(&owner)
                .filter(|(at, _)| at.elapsed() < EXPLANATION_REUSE)
                .map(|(_, cause)| cause.clone())
        };
        let cause = match cached {
            Some(cause) => cause,
            None => {
                let cause = self.ask_why(owner).await;
                let mut explained = self.inner.explained.lock();
                if explained.len() >= EXPLANATIONS_MAX {
                    explained.clear();
                }
                explained.insert(owner, (Instant::now(), cause.clone()));
                cause
            }
        };
        let last = match (cause, last.is_empty()) {
            (Some(cause), true) => cause,
            (Some(cause), false) => format!("{last}; {cause}"),
            (None, _) => last,
        };
        ClientError::Timeout { attempts, last }
    }

    /// What the cluster says of `owner`, asked within [`EXPLAIN_TIMEOUT`]; `None` when
    /// nobody answered or there is nothing to say.
    async fn ask_why(&self, owner: ServerId) -> Option<String> {
        let map = self.map();
        let deadline = Instant::now() + EXPLAIN_TIMEOUT;
        let status = map.server(owner).map(|s| (s.status, s.addr.clone()));
        match status? {
            (ServerStatus::Crashed, _) => {
                let reports = self
                    .inner
                    .coordinators
                    .call::<RecoveryStatus>(&self.inner.pool, &RecoveryStatusRequest {}, deadline)
                    .await
                    .ok()?
                    .recoveries;
                Some(match reports.iter().rev().find(|r| r.crashed == owner) {
                    Some(report) => match &report.waiting {
                        Some(why) => {
                            format!("its owner {owner} crashed and its recovery waits: {why}")
                        }
                        None => format!(
                            "its owner {owner} crashed and is being recovered ({} of {} \
                             partitions live)",
                            report.partitions.iter().filter(|p| p.live_ms > 0).count(),
                            report.partitions.len()
                        ),
                    },
                    None => format!("its owner {owner} crashed; its recovery has not started"),
                })
            }
            (ServerStatus::Up, addr) => {
                let stats = self
                    .inner
                    .pool
                    .call::<ServerStats>(&addr, &PingRequest {}, deadline)
                    .await
                    .ok()?;
                explain_stats(owner, &stats)
            }
            (ServerStatus::Removed, _) => None,
        }
    }

    /// Sends single-object RPC `R` to the owner of `key` (with the retry rules of
    /// [`on_owner`](Self::on_owner)) until `deadline` and turns its reply into the next
    /// step with `step`.
    async fn on_owner_call<R: Rpc, T>(
        &self,
        table: TableId,
        key: &[u8],
        deadline: Instant,
        request: &R::Request,
        step: impl Fn(&str, R::Reply) -> Attempt<T>,
    ) -> Result<T, ClientError> {
        let step = &step;
        self.on_owner(table, key, deadline, |addr, deadline| async move {
            let reply = self.inner.pool.call::<R>(&addr, request, deadline).await?;
            Ok(step(&addr, reply))
        })
        .await
    }

    /// Reads `key`; `None` if it does not exist.
    pub async fn read(&self, table: TableId, key: &[u8]) -> Result<Option<Object>, ClientError> {
        let request = ReadRequest {
            table,
            key: Bytes::copy_from_slice(key),
        };
        let deadline = self.deadline();
        self.on_owner_call::<Read, _>(table, key, deadline, &request, |addr, reply| {
            match reply.status {
                Status::ObjectDoesntExist => Attempt::Done(Ok(None)),
                status => outcome(addr, status, reply.version, || {
                    Some(Object {
                        value: reply.value.clone(),
                        version: reply.version,
                    })
                }),
            }
        })
        .await
    }

    /// Writes `value` under `key`; returns the new version.
    pub async fn write(
        &self,
        table: TableId,
        key: &[u8],
        value: &[u8],
    ) -> Result<Version, ClientError> {
        self.write_with(table, key, value, RejectRules::default())
            .await
    }

    /// Writes `value` under `key` unless `rules` refuse; returns the new version.
    pub async fn write_with(
        &self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        rules: RejectRules,
    ) -> Result<Version, ClientError> {
        let deadline = self.deadline();
        let ticket = self.ticket(deadline).await?;
        let request = WriteRequest {
            table,
            key: Bytes::copy_from_slice(key),
            value: Bytes::copy_from_slice(value),
            rules,
            rifl: ticket.rifl(),
        };
        let result = self
            .on_owner_call::<Write, _>(table, key, deadline, &request, write_attempt)
            .await;
        self.settle(ticket.tracker(), &result);
        result
    }

    /// Removes `key`; returns the version removed, `None` if there was no object.
    pub async fn remove(&self, table: TableId, key: &[u8]) -> Result<Option<Version>, ClientError> {
        self.remove_with(table, key, RejectRules::default()).await
    }

    /// Removes `key` unless `rules` refuse; returns the version removed.
    pub async fn remove_with(
        &self,
        table: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<Option<Version>, ClientError> {
        let deadline = self.deadline();
        let ticket = self.ticket(deadline).await?;
        let request = RemoveRequest {
            table,
            key: Bytes::copy_from_slice(key),
            rules,
            rifl: ticket.rifl(),
        };
        let result = self
            .on_owner_call::<Remove, _>(table, key, deadline, &request, write_attempt)
            .await;
        self.settle(ticket.tracker(), &result);
        drop(ticket);
        let version = result?;
        Ok((version != Version(0)).then_some(version))
    }

    /// Adds `delta` to the 8-byte little-endian integer under `key` (a missing object
    /// counts as 0); returns the new value and version.
    pub async fn increment(
        &self,
        table: TableId,
        key: &[u8],
        delta: i64,
    ) -> Result<(i64, Version), ClientError> {
        self.increment_with(table, key, delta, RejectRules::default())
            .await
    }

    /// Like [`increment`](Self::increment) unless `rules` refuse.
    pub async fn increment_with(
        &self,
        table: TableId,
        key: &[u8],
        delta: i64,
        rules: RejectRules,
    ) -> Result<(i64, Version), ClientError> {
        let deadline = self.deadline();
        let ticket = self.ticket(deadline).await?;
        let request = IncrementRequest {
            table,
            key: Bytes::copy_from_slice(key),
            delta,
            rules,
            rifl: ticket.rifl(),
        };
        let result = self
            .on_owner_call::<Increment, _>(table, key, deadline, &request, |addr, reply| {
                outcome(addr, reply.status, reply.version, || {
                    (reply.value, reply.version)
                })
            })
            .await;
        self.settle(ticket.tracker(), &result);
        result
    }

    /// Groups item indices by the owner of their key; items whose table is unknown
    /// after a refresh fail with `TableDoesntExist`.
    async fn group_by_owner(
        &self,
        items: &[(TableId, &[u8])],
        pending: &[usize],
        retry: &mut Retry,
    ) -> Result<BTreeMap<String, Vec<usize>>, ClientError> {
        loop {
            let map = self.map();
            // By owner first, then by its address: one address looked up (and copied)
            // per owner, not per object (`TabletMapCache::route` is per object).
            let mut by_owner: BTreeMap<ServerId, Vec<usize>> = BTreeMap::new();
            let mut unrouted = None;
            for &i in pending {
                let (table, key) = items[i];
                match map.tablet(table, key_hash(key)) {
                    Some(tablet) => by_owner.entry(tablet.owner).or_default().push(i),
                    None => unrouted = Some(table),
                }
            }
            let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for (owner, indices) in by_owner {
                match map.addr(owner) {
                    Some(addr) => groups.entry(addr.to_string()).or_default().extend(indices),
                    None => unrouted = indices.first().map(|&i| items[i].0).or(unrouted),
                }
            }
            let Some(table) = unrouted else {
                return Ok(groups);
            };
            self.refresh_map(map.version, retry.deadline).await?;
            if !self.map().has_table(table) {
                return Err(ClientError::TableDoesntExist(table.to_string()));
            }
            retry
                .pause(format!("no owner for a key of {table}"))
                .await?;
        }
    }

    /// Reads several objects, in parallel from their masters. Results in input order:
    /// `Ok(None)` for a missing object, an error for an object that could not be read
    /// (e.g. a key over the size limit).
    pub async fn multi_read(
        &self,
        keys: &[(TableId, &[u8])],
    ) -> Result<Vec<Result<Option<Object>, ClientError>>, ClientError> {
        let request = |indices: &[usize]| MultiReadRequest {
            objects: indices
                .iter()
                .map(|&i| ObjectKey {
                    table: keys[i].0,
                    key: Bytes::copy_from_slice(keys[i].1),
                })
                .collect(),
        };
        let call = |addr: String, indices: Vec<usize>, deadline| {
            let request = request(&indices);
            async move {
                let reply = self
                    .inner
                    .pool
                    .call::<MultiRead>(&addr, &request, deadline)
                    .await?;
                Ok(reply
                    .objects
                    .into_iter()
                    .map(|r| (r.status, r.version, r.value))
                    .collect())
            }
        };
        let results = self
            .multi_op(keys, self.deadline(), |i| keys[i].1.len(), call)
            .await?;
        Ok(results
            .into_iter()
            .map(|result| match result? {
                (Status::Ok, version, value) => Ok(Some(Object { value, version })),
                (Status::ObjectDoesntExist, _, _) => Ok(None),
                (status, version, _) => {
                    Err(ClientError::from_status(status, version, String::new()))
                }
            })
            .collect())
    }

    /// Writes several objects, in parallel to their masters. Each object succeeds or
    /// fails on its own; results (new version or error) in input order.
    pub async fn multi_write(
        &self,
        items: &[WriteItem],
    ) -> Result<Vec<Result<Version, ClientError>>, ClientError> {
        let mut results = Vec::with_capacity(items.len());
        // Each object takes a number, TICKETS_MAX at most at a time.
        for items in items.chunks(TICKETS_MAX) {
            let deadline = self.deadline();
            let tickets = self.tickets(items.len(), deadline).await?;
            let rifls: Vec<Rifl> = tickets.iter().map(Ticket::rifl).collect();
            let keys: Vec<(TableId, &[u8])> = items.iter().map(|w| (w.table, &w.key[..])).collect();
            let request = |indices: &[usize]| MultiWriteRequest {
                objects: indices
                    .iter()
                    .map(|&i| WriteRequest {
                        table: items[i].table,
                        key: items[i].key.clone(),
                        value: items[i].value.clone(),
                        rules: items[i].rules,
                        rifl: rifls[i],
                    })
                    .collect(),
            };
            let weight = |i: usize| items[i].key.len() + items[i].value.len();
            let done = self
                .multi_mutate::<MultiWrite, _>(&keys, deadline, weight, request, |version| version)
                .await;
            results.extend(self.settle_all(&tickets, done)?);
        }
        Ok(results)
    }

    /// Removes several objects, in parallel. Results (version removed, `None` if
    /// missing, or error) in input order.
    pub async fn multi_remove(
        &self,
        keys: &[(TableId, &[u8])],
    ) -> Result<Vec<Result<Option<Version>, ClientError>>, ClientError> {
        let mut results = Vec::with_capacity(keys.len());
        for keys in keys.chunks(TICKETS_MAX) {
            let deadline = self.deadline();
            let tickets = self.tickets(keys.len(), deadline).await?;
            let rifls: Vec<Rifl> = tickets.iter().map(Ticket::rifl).collect();
            let request = |indices: &[usize]| MultiRemoveRequest {
                objects: indices
                    .iter()
                    .map(|&i| RemoveRequest {
                        table: keys[i].0,
                        key: Bytes::copy_from_slice(keys[i].1),
                        rules: RejectRules::default(),
                        rifl: rifls[i],
                    })
                    .collect(),
            };
            let removed = |version: Version| (version != Version(0)).then_some(version);
            let weight = |i: usize| keys[i].1.len();
            let done = self
                .multi_mutate::<MultiRemove, _>(keys, deadline, weight, request, removed)
                .await;
            results.extend(self.settle_all(&tickets, done)?);
        }
        Ok(results)
    }

    /// Multi-write and multi-remove: RPC `R` built by `request` for each owner's share
    /// of `keys`, each object's version turned into its result by `done`. Every object
    /// carries its exactly-once identity, so a share whose connection broke after it was
    /// sent is sent again (see the module doc).
    async fn multi_mutate<R, T>(
        &self,
        keys: &[(TableId, &[u8])],
        deadline: Instant,
        weight: impl Fn(usize) -> usize,
        request: impl Fn(&[usize]) -> R::Request,
        done: impl Fn(Version) -> T,
    ) -> Result<Vec<Result<T, ClientError>>, ClientError>
    where
        R: Rpc<Reply = MultiWriteReply>,
    {
        let call = |addr: String, indices: Vec<usize>, deadline| {
            let request = request(&indices);
            async move {
                let reply = self.inner.pool.call::<R>(&addr, &request, deadline).await?;
                Ok(reply
                    .objects
                    .into_iter()
                    .map(|r| (r.status, r.version, Bytes::new()))
                    .collect())
            }
        };
        let results = self.multi_op(keys, deadline, weight, call).await?;
        Ok(results
            .into_iter()
            .map(|result| match result? {
                (Status::Ok, version, _) => Ok(done(version)),
                (status, version, _) => {
                    Err(ClientError::from_status(status, version, String::new()))
                }
            })
            .collect())
    }

    /// The shared engine of the multi operations: groups objects by owner, in requests
    /// of at most [`MULTI_OPS_MAX`] objects and [`MULTI_WRITE_REQUEST_BYTES_MAX`] bytes
    /// (by `weight`), calls every owner in parallel, and retries the objects whose tablet
    /// moved, whose master asked to retry, or whose request never reached its master.
    /// Returns each object's (status, version, value), or the error that ended it.
    async fn multi_op<F, Fut>(
        &self,
        keys: &[(TableId, &[u8])],
        deadline: Instant,
        weight: impl Fn(usize) -> usize,
        call: F,
    ) -> Result<Vec<Result<ObjectReply, ClientError>>, ClientError>
    where
        F: Fn(String, Vec<usize>, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<ObjectReply>, RpcError>>,
    {
        let mut results: Vec<Option<Result<ObjectReply, ClientError>>> =
            keys.iter().map(|_| None).collect();
        let mut retry = self.retry_until(deadline);
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        // The owner of the last objects that had to be tried again: a timeout says what
        // the cluster knows of it.
        let mut stuck: Option<ServerId> = None;
        let finished = async {
            while !pending.is_empty() {
                let version = self.map().version;
                let groups = self.group_by_owner(keys, &pending, &mut retry).await?;
                let mut chunks = Vec::new();
                for (addr, indices) in groups {
                    let (mut chunk, mut bytes) = (Vec::new(), 0);
                    for i in indices {
                        let full = chunk.len() == MULTI_OPS_MAX
                            || (!chunk.is_empty()
                                && bytes + weight(i) > MULTI_WRITE_REQUEST_BYTES_MAX);
                        if full {
                            chunks.push((addr.clone(), std::mem::take(&mut chunk)));
                            bytes = 0;
                        }
                        bytes += weight(i);
                        chunk.push(i);
                    }
                    chunks.push((addr, chunk));
                }
                let calls = chunks.into_iter().map(|(addr, indices)| {
                    let future = call(addr.clone(), indices.clone(), retry.deadline);
                    async move { (addr, indices, future.await) }
                });
                let mut again = Vec::new();
                let mut why = String::new();
                for (addr, indices, outcome) in futures::future::join_all(calls).await {
                    if let Err(e) = &outcome {
                        if e.is_transport() || e.status() == Some(Status::Retry) {
                            if let Some(owner) = self.map().server_at(&addr) {
                                self.report_unreachable(owner, e);
                            }
                        }
                    }
                    let failed = match &outcome {
                        Ok(replies) => replies.iter().any(|(status, _, _)| {
                            matches!(status, Status::UnknownTablet | Status::Retry)
                        }),
                        Err(e) => {
                            e.is_transport()
                                || matches!(e.status(), Some(Status::Retry | Status::ShuttingDown))
                        }
                    };
                    if failed {
                        stuck = self.map().server_at(&addr).or(stuck);
                    }
                    match outcome {
                        Ok(replies) if replies.len() == indices.len() => {
                            for (i, (status, version, value)) in indices.into_iter().zip(replies) {
                                if matches!(status, Status::UnknownTablet | Status::Retry) {
                                    why = format!("{addr} answered {status} for some objects");
                                    again.push(i);
                                } else {
                                    results[i] = Some(Ok((status, version, value)));
                                }
                            }
                        }
                        Ok(replies) => {
                            let error = ClientError::Server(format!(
                                "{} replies for {} objects",
                                replies.len(),
                                indices.len()
                            ));
                            for i in indices {
                                results[i] = Some(Err(error.clone()));
                            }
                        }
                        Err(e) if e.is_transport() => {
                            why = e.to_string();
                            again.extend(indices);
                        }
                        Err(e)
                            if matches!(e.status(), Some(Status::Retry | Status::ShuttingDown)) =>
                        {
                            why = e.to_string();
                            again.extend(indices);
                        }
                        Err(e) => {
                            let error = ClientError::from_rpc(e);
                            for i in indices {
                                results[i] = Some(Err(error.clone()));
                            }
                        }
                    }
                }
                pending = again;
                if !pending.is_empty() {
                    self.refresh_after(version, &retry, &why).await?;
                    retry.pause(why).await?;
                }
            }
            Ok(())
        }
        .await;
        match (finished, stuck) {
            (Err(ClientError::Timeout { attempts, last }), Some(owner)) => {
                return Err(self.explain_timeout(attempts, last, owner).await)
            }
            (Err(error), _) => return Err(error),
            (Ok(()), _) => {}
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ClientError::Server("no reply".into()))))
            .collect())
    }

    /// The address of the master that serves `key` of `table`, per the cached tablet
    /// map (it may be stale; operations re-route by themselves). For diagnostics.
    pub fn locate(&self, table: TableId, key: &[u8]) -> Option<String> {
        self.map().route(table, key_hash(key)).map(|(_, addr)| addr)
    }

    /// Streams every object of `table`, in key-hash order, a page at a time.
    pub fn enumerate(&self, table: TableId) -> Enumeration {
        self.enumerate_from(table, 0)
    }

    /// Like [`enumerate`](Self::enumerate), from key hash `hash` on: an enumeration
    /// resumed where [`Enumeration::resume_hash`] said (a cursor kept between calls).
    pub fn enumerate_from(&self, table: TableId, hash: u64) -> Enumeration {
        Enumeration {
            client: self.clone(),
            table,
            next_hash: Some(hash),
        }
    }
}

/// Keeps the client behind `inner` an id with a lease (first `lease` long): renews it
/// every third of its length, and once it expired — the coordinators say so to a
/// renewal, or an operation was refused `ClientLeaseExpired` by a master and woke this
/// task through `lease_lost` — opens a new id and numbers the operations after under it
/// (module doc, "Client lease"). A renewal or an open that fails is tried again within a
/// second. Ends when the client is dropped.
async fn keep_identity(inner: std::sync::Weak<Inner>, lease: Duration, lease_lost: Arc<Notify>) {
    let mut lease = lease;
    let mut next = renew_interval(lease);
    loop {
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = lease_lost.notified() => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let tracker = Arc::clone(&inner.identity.borrow());
        let client = tracker.client();
        if !tracker.is_expired() {
            let request = RenewClientLeaseRequest { client };
            let deadline = Instant::now() + renew_interval(lease).min(LEASE_RENEW_TIMEOUT);
            match inner
                .coordinators
                .call::<RenewClientLease>(&inner.pool, &request, deadline)
                .await
            {
                Ok(reply) => {
                    lease = Duration::from_millis(u64::from(reply.lease_ms));
                    next = renew_interval(lease);
                    continue;
                }
                Err(CoordinatorCallError::Rpc(RpcError::Status {
                    status: Status::ClientLeaseExpired,
                    detail,
                    ..
                })) => {
                    tracing::warn!(%client, %detail, "client lease expired; opening a new client id");
                    tracker.expire();
                }
                Err(error) => {
                    tracing::debug!(%client, %error, "client lease not renewed; trying again");
                    next = renew_interval(lease).min(LEASE_RETRY_PAUSE);
                    continue;
                }
            }
        }
        let deadline = Instant::now() + LEASE_RENEW_TIMEOUT;
        match inner
            .coordinators
            .call::<OpenClient>(&inner.pool, &OpenClientRequest {}, deadline)
            .await
        {
            Ok(opened) => {
                tracing::warn!(
                    expired = %client,
                    new = %opened.client,
                    "client lease expired; writes go on under a new client id"
                );
                inner.identity.send_replace(Tracker::new(opened.client));
                lease = Duration::from_millis(u64::from(opened.lease_ms));
                next = renew_interval(lease);
            }
            Err(error) => {
                tracing::debug!(expired = %client, %error, "no new client id yet; trying again");
                next = renew_interval(lease).min(LEASE_RETRY_PAUSE);
            }
        }
    }
}

/// How often a lease of length `lease` is renewed: three times per lease, so that two
/// renewals may fail before it runs out.
fn renew_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(10))
}

/// Pause before a renewal or an open that failed is tried again.
const LEASE_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Deadline of one lease renewal.
const LEASE_RENEW_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest one attempt of a table change may take: the leader's commit
/// (`PROPOSAL_TIMEOUT`, 2 s) and its wait for the masters to take or drop their tablets
/// (3 s), then its answer.
pub const TABLE_CHANGE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(6);

/// How long a timed-out operation asks the cluster why (`explain_timeout`), after its
/// deadline.
pub const EXPLAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// How long what the cluster said of an owner is reused for the next timeouts.
pub const EXPLANATION_REUSE: Duration = Duration::from_secs(1);

/// What a master's own figures say of why its operations time out: writes waiting for
/// backups, or memory nearly full of live data; `None` when neither.
fn explain_stats(owner: ServerId, stats: &ServerStatsReply) -> Option<String> {
    if let Some(why) = &stats.backup_shortage {
        return Some(format!("its owner {owner} is up, but {why}"));
    }
    let live = stats.log_bytes_live as f64 / stats.log_bytes_max.max(1) as f64;
    (live >= MEMORY_NEARLY_FULL).then(|| {
        format!(
            "its owner {owner} is up, but its log memory is nearly full of live data ({} of \
             {} live): its cleaner frees little room per pass, so writes wait; spread the \
             table over more masters (create it with a larger span), remove data, or give \
             the servers more --memory",
            ByteSize(stats.log_bytes_live).readable(),
            ByteSize(stats.log_bytes_max).readable()
        )
    })
}

/// The share of its log memory holding live data from which a master's timeouts are
/// explained by its memory (its cleaner frees little per pass).
const MEMORY_NEARLY_FULL: f64 = 0.85;

/// Owners whose explanation is kept at once (cleared when full).
const EXPLANATIONS_MAX: usize = 1024;

/// The retry loop's next step for a single-object reply: `ok` builds the success value.
fn outcome<T>(addr: &str, status: Status, version: Version, ok: impl FnOnce() -> T) -> Attempt<T> {
    match status {
        Status::Ok => Attempt::Done(Ok(ok())),
        Status::UnknownTablet => Attempt::Reroute(format!("{addr}: unknown tablet")),
        Status::Retry => Attempt::Later(format!("{addr}: busy")),
        other => Attempt::Done(Err(ClientError::from_status(other, version, String::new()))),
    }
}

fn write_attempt(addr: &str, reply: WriteReply) -> Attempt<Version> {
    outcome(addr, reply.status, reply.version, || reply.version)
}

/// A table enumeration in progress (see [`Client::enumerate`]).
///
/// Its cursor is a key hash, so it survives tablets moving between masters: each page
/// is fetched from whoever owns the cursor's hash at that moment. An object present for
/// the whole enumeration is returned exactly once.
#[derive(Debug)]
pub struct Enumeration {
    client: Client,
    table: TableId,
    /// The next key hash to fetch from; `None` when done.
    next_hash: Option<u64>,
}

/// Bytes asked for per enumerate page.
pub const ENUMERATE_PAGE_BYTES: u32 = 1024 * 1024;

impl Enumeration {
    /// The key hash the next page starts from (to resume later with
    /// [`Client::enumerate_from`]); `None` once the table is exhausted.
    pub fn resume_hash(&self) -> Option<u64> {
        self.next_hash
    }

    /// The next non-empty page of objects, or `None` when the table is exhausted.
    pub async fn next_page(&mut self) -> Result<Option<Vec<EnumeratedObject>>, ClientError> {
        while let Some(resume) = self.next_hash {
            let client = &self.client;
            let (objects, next) = client
                .on_hash(
                    self.table,
                    resume,
                    client.deadline(),
                    |addr, tablet_end, deadline| {
                        let request = EnumerateRequest {
                            table: self.table,
                            resume_hash: resume,
                            end_hash: tablet_end,
                            max_bytes: ENUMERATE_PAGE_BYTES,
                        };
                        async move {
                            match client
                                .inner
                                .pool
                                .call::<Enumerate>(&addr, &request, deadline)
                                .await
                            {
                                Ok(page) => {
                                    let next = match page.next_hash {
                                        Some(next) => Some(next),
                                        None => tablet_end.checked_add(1),
                                    };
                                    Ok(Attempt::Done(Ok((page.objects, next))))
                                }
                                Err(RpcError::Status {
                                    status: Status::UnknownTablet,
                                    ..
                                }) => Ok(Attempt::Reroute(format!("{addr}: unknown tablet"))),
                                Err(e) => Err(e),
                            }
                        }
                    },
                )
                .await?;
            self.next_hash = next;
            if !objects.is_empty() {
                return Ok(Some(objects));
            }
        }
        Ok(None)
    }

    /// Collects the rest of the table (convenient for small tables and tests).
    pub async fn collect_all(mut self) -> Result<Vec<EnumeratedObject>, ClientError> {
        let mut all = Vec::new();
        while let Some(page) = self.next_page().await? {
            all.extend(page);
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::protocol::coordinator::{OpenClientReply, RenewClientLeaseReply};
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Reply, RpcServer, Service};
    use rampart_common::tablet::{
        ServerInfo, ServerStatus, Services, TableInfo, Tablet, TabletMap,
    };
    use tokio::net::TcpListener;

    #[test]
    fn a_masters_figures_explain_its_timeouts_with_the_fix() {
        let owner = ServerId(4);
        let calm = ServerStatsReply {
            log_bytes_live: 80,
            log_bytes_max: 100,
            ..ServerStatsReply::default()
        };
        assert_eq!(explain_stats(owner, &calm), None);
        let full = ServerStatsReply {
            log_bytes_live: 90 << 20,
            log_bytes_max: 100 << 20,
            ..ServerStatsReply::default()
        };
        let said = explain_stats(owner, &full).expect("a full master explains");
        assert!(
            said.contains("nearly full of live data (90MiB of 100MiB live)"),
            "{said}"
        );
        assert!(said.contains("--memory"), "{said}");
        let short = ServerStatsReply {
            backup_shortage: Some("writes wait for backups: need 3".into()),
            ..full
        };
        let said = explain_stats(owner, &short).expect("a master short of backups explains");
        assert!(
            said.ends_with("is up, but writes wait for backups: need 3"),
            "{said}"
        );
    }

    /// Serves a fixed tablet map and a client id, and records `ReportFailure`s.
    #[derive(Debug)]
    struct FakeCoordinator {
        map: TabletMap,
        reports: parking_lot::Mutex<Vec<(Instant, ReportFailureRequest)>>,
    }

    impl Service for FakeCoordinator {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                match opcode {
                    GetTabletMap::OPCODE => Reply::ok(&self.map),
                    OpenClient::OPCODE => Reply::ok(&OpenClientReply {
                        client: ClientId(7),
                        lease_ms: 30_000,
                    }),
                    ReportFailure::OPCODE => match Reply::decode::<ReportFailureRequest>(payload) {
                        Ok(request) => {
                            self.reports.lock().push((Instant::now(), request));
                            Reply::ok(&())
                        }
                        Err(reply) => reply,
                    },
                    _ => Reply::error(Status::UnknownOpcode, "fake coordinator"),
                }
            })
        }
    }

    /// A map of one table with one tablet, owned by server 9 at `addr`.
    fn one_master_map(table: TableId, addr: String) -> TabletMap {
        TabletMap {
            version: 2,
            servers: vec![ServerInfo {
                id: ServerId(9),
                addr,
                services: Services {
                    master: true,
                    backup: true,
                },
                status: ServerStatus::Up,
                failure_domain: "rack".into(),
                disk_read_mbps: 100,
            }],
            tables: vec![TableInfo {
                id: table,
                name: "t".into(),
                tablets: vec![Tablet {
                    table,
                    start_hash: 0,
                    end_hash: u64::MAX,
                    owner: ServerId(9),
                }],
            }],
        }
    }

    /// Serves `service` on a port of its own; its address.
    async fn serve(service: Arc<impl Service>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
        addr
    }

    /// A fake coordinator serving `map`, and a client of it whose operations end after
    /// 600 ms.
    async fn client_of(map: TabletMap) -> (Arc<FakeCoordinator>, Client) {
        let fake = Arc::new(FakeCoordinator {
            map,
            reports: parking_lot::Mutex::new(Vec::new()),
        });
        let coordinator = serve(Arc::clone(&fake)).await;
        let options = ClientOptions {
            deadline: Duration::from_millis(600),
            ..ClientOptions::default()
        };
        let client = Client::connect_with(&[coordinator], options)
            .await
            .expect("connect");
        (fake, client)
    }

    #[tokio::test]
    async fn an_unreachable_master_is_reported_at_most_once_per_interval() {
        // A port with nothing listening: the master is gone.
        let dead = {
            let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            gone.local_addr().expect("addr").to_string()
        };
        let table = TableId(1);
        let (fake, client) = client_of(one_master_map(table, dead)).await;
        let started = Instant::now();
        let error = client
            .read(table, b"k")
            .await
            .expect_err("the master is gone");
        // The operation timed out because its owner was unreachable; the coordinator
        // answered every time it was asked, and the error must not blame it.
        assert!(
            matches!(&error, ClientError::Timeout { last, .. } if last.contains("connect")),
            "{error}"
        );
        // A multi-op against the same master within the interval adds no report.
        let keys: [(TableId, &[u8]); 1] = [(table, b"k")];
        let _ = client.multi_read(&keys).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let reports = fake.reports.lock();
        assert!(!reports.is_empty(), "nothing reported");
        let elapsed = started.elapsed();
        let most = 1 + (elapsed.as_millis() / FAILURE_REPORT_INTERVAL_MS) as usize;
        assert!(
            reports.len() <= most,
            "{} reports in {elapsed:?}",
            reports.len()
        );
        for pair in reports.windows(2) {
            assert!(pair[1].0 - pair[0].0 >= Duration::from_millis(450));
        }
        for (_, report) in reports.iter() {
            assert_eq!(report.server, ServerId(9));
            assert!(report.reporter.starts_with("client"), "{}", report.reporter);
        }
    }

    /// A master whose lease lapsed: it answers every request `Retry`.
    #[derive(Debug)]
    struct LeaselessMaster;

    impl Service for LeaselessMaster {
        fn handle(&self, _: Opcode, _: Bytes) -> HandleFuture<'_> {
            Box::pin(async { Reply::error(Status::Retry, "lease lapsed") })
        }
    }

    #[tokio::test]
    async fn a_master_that_answers_retry_is_reported_for_the_coordinator_to_check() {
        // A master cut off from the coordinators but not from this client answers
        // `Retry`; only a client's report has the coordinator ping it.
        let table = TableId(1);
        let master = serve(Arc::new(LeaselessMaster)).await;
        let (fake, client) = client_of(one_master_map(table, master)).await;
        // Each operation is reported long before its last attempt, which runs into the
        // deadline (a timeout, reported as unreachable anyway).
        let early = |since: Instant| {
            let reports = fake.reports.lock();
            reports
                .iter()
                .filter(|(at, r)| {
                    r.server == ServerId(9)
                        && *at >= since
                        && *at - since < Duration::from_millis(300)
                })
                .count()
        };
        let started = Instant::now();
        let error = client.read(table, b"k").await.expect_err("never served");
        assert!(matches!(error, ClientError::Timeout { .. }), "{error}");
        assert_eq!(
            early(started),
            1,
            "the read's master was not reported at once"
        );
        tokio::time::sleep(FAILURE_REPORT_INTERVAL).await;
        let started = Instant::now();
        let keys: [(TableId, &[u8]); 1] = [(table, b"k")];
        let _ = client.multi_read(&keys).await;
        assert_eq!(
            early(started),
            1,
            "the multi-read's master was not reported at once"
        );
    }

    use crate::failure_reporter::FAILURE_REPORT_INTERVAL;
    const FAILURE_REPORT_INTERVAL_MS: u128 = FAILURE_REPORT_INTERVAL.as_millis();

    /// Client ids whose lease expired, as the coordinators and masters know them.
    type Expired = Arc<parking_lot::Mutex<std::collections::HashSet<ClientId>>>;

    /// A coordinator that numbers the clients it opens from 1, and renews their leases
    /// (`lease_ms` long) until they are in `expired`.
    #[derive(Debug)]
    struct LeasingCoordinator {
        map: TabletMap,
        lease_ms: u32,
        opened: std::sync::atomic::AtomicU64,
        expired: Expired,
    }

    impl Service for LeasingCoordinator {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            let reply = match opcode {
                GetTabletMap::OPCODE => Reply::ok(&self.map),
                OpenClient::OPCODE => {
                    let opened = self
                        .opened
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Reply::ok(&OpenClientReply {
                        client: ClientId(opened + 1),
                        lease_ms: self.lease_ms,
                    })
                }
                RenewClientLease::OPCODE => {
                    match Reply::decode::<RenewClientLeaseRequest>(payload) {
                        Ok(request) if self.expired.lock().contains(&request.client) => {
                            Reply::error(Status::ClientLeaseExpired, "did not renew")
                        }
                        Ok(_) => Reply::ok(&RenewClientLeaseReply {
                            lease_ms: self.lease_ms,
                        }),
                        Err(reply) => reply,
                    }
                }
                ReportFailure::OPCODE => Reply::ok(&()),
                _ => Reply::error(Status::UnknownOpcode, "leasing coordinator"),
            };
            Box::pin(async move { reply })
        }
    }

    /// A master that refuses the writes of clients in `expired` (`ClientLeaseExpired`),
    /// answers `Retry` to writes of key `slow` (as when the record of an earlier write
    /// is being recovered), applies the others, and logs every write it is sent.
    #[derive(Debug)]
    struct LeaseCheckingMaster {
        expired: Expired,
        sent: parking_lot::Mutex<Vec<(Bytes, Rifl)>>,
    }

    impl LeaseCheckingMaster {
        /// The identities of the writes of `key` it was sent, in order.
        fn sent_of(&self, key: &[u8]) -> Vec<Rifl> {
            let sent = self.sent.lock();
            sent.iter()
                .filter(|(k, _)| &k[..] == key)
                .map(|(_, rifl)| *rifl)
                .collect()
        }
    }

    impl Service for LeaseCheckingMaster {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            let reply = match opcode {
                Write::OPCODE => match Reply::decode::<WriteRequest>(payload) {
                    Ok(request) => {
                        let mut sent = self.sent.lock();
                        sent.push((request.key.clone(), request.rifl));
                        if self.expired.lock().contains(&request.rifl.client) {
                            Reply::error(Status::ClientLeaseExpired, "open a new client")
                        } else if &request.key[..] == b"slow" {
                            Reply::ok(&WriteReply {
                                status: Status::Retry,
                                version: Version(0),
                            })
                        } else {
                            Reply::ok(&WriteReply {
                                status: Status::Ok,
                                version: Version(sent.len() as u64),
                            })
                        }
                    }
                    Err(reply) => reply,
                },
                _ => Reply::error(Status::UnknownOpcode, "lease-checking master"),
            };
            Box::pin(async move { reply })
        }
    }

    /// A lease-checking master and a leasing coordinator (leases `lease_ms` long) over
    /// `expired`, and a client of them whose operations end after 5 s.
    async fn leased_client(lease_ms: u32) -> (Expired, Arc<LeaseCheckingMaster>, Client) {
        let expired = Expired::default();
        let master = Arc::new(LeaseCheckingMaster {
            expired: Arc::clone(&expired),
            sent: parking_lot::Mutex::new(Vec::new()),
        });
        let coordinator = serve(Arc::new(LeasingCoordinator {
            map: one_master_map(TableId(1), serve(Arc::clone(&master)).await),
            lease_ms,
            opened: std::sync::atomic::AtomicU64::new(0),
            expired: Arc::clone(&expired),
        }))
        .await;
        let options = ClientOptions {
            deadline: Duration::from_secs(5),
            ..ClientOptions::default()
        };
        let client = Client::connect_with(&[coordinator], options)
            .await
            .expect("connect");
        (expired, master, client)
    }

    #[tokio::test]
    async fn a_write_refused_for_an_expired_lease_ends_unknown_and_later_ones_use_a_new_id() {
        // Leases far longer than the test: the expiry is learned from the master.
        let (expired, master, client) = leased_client(60_000).await;
        let table = TableId(1);
        assert_eq!(client.id(), ClientId(1));
        client
            .write(table, b"before", b"v")
            .await
            .expect("under the first id");
        // A write in flight, tried again and again, when the lease expires.
        let slow = {
            let client = client.clone();
            tokio::spawn(async move { client.write(table, b"slow", b"v").await })
        };
        while master.sent_of(b"slow").is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        expired.lock().insert(ClientId(1));
        let error = slow
            .await
            .expect("the task ends")
            .expect_err("refused under an expired id");
        assert!(matches!(error, ClientError::LeaseExpired(_)), "{error:?}");
        assert!(error.outcome_unknown(), "{error}");
        // The next write goes on under a new id.
        client
            .write(table, b"after", b"v")
            .await
            .expect("under a new id");
        assert_eq!(client.id(), ClientId(2));
        let after = master.sent_of(b"after");
        assert_eq!(
            after,
            [Rifl {
                client: ClientId(2),
                seq: 1,
                ack: 0
            }]
        );
        // The write in flight was sent under its own identity only: never under the new
        // id, where it would have been a second write.
        let slow = master.sent_of(b"slow");
        assert!(slow.len() >= 2, "{slow:?}");
        assert!(slow.iter().all(|rifl| *rifl == slow[0]), "{slow:?}");
        assert_eq!(slow[0].client, ClientId(1));
    }

    #[tokio::test]
    async fn a_renewal_told_the_lease_expired_opens_a_new_id_for_the_writes_after() {
        // Renewed every 50 ms; the coordinators expire the first id (the client was cut
        // off, say) and say so to its next renewal.
        let (expired, master, client) = leased_client(150).await;
        let table = TableId(1);
        client
            .write(table, b"before", b"v")
            .await
            .expect("under the first id");
        expired.lock().insert(ClientId(1));
        let deadline = Instant::now() + Duration::from_secs(2);
        while client.id() == ClientId(1) {
            assert!(Instant::now() < deadline, "no new id opened");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(client.id(), ClientId(2));
        client
            .write(table, b"after", b"v")
            .await
            .expect("under the new id");
        assert_eq!(master.sent_of(b"before")[0].client, ClientId(1));
        assert_eq!(master.sent_of(b"after")[0].client, ClientId(2));
    }
}
