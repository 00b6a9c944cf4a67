//! `FailureDetector`: every server pings a random other server and reports one that does
//! not answer (docs/design.md §6 "Detection").
//!
//! Every [`PING_INTERVAL`] the server pings one `Up` server, other than itself, drawn at
//! random from the server list, with a deadline of [`PING_TIMEOUT`]. A ping that gets no
//! answer (refused, broken, or late) makes it report the server to the coordinators'
//! leader with `ReportFailure`; the coordinator pings the suspect itself before it
//! declares it crashed, so one false suspicion (a pause, a lost packet) costs one
//! coordinator ping, nothing more. Any answer, even an error status (a backup-only
//! server does not serve `Ping`), counts as alive. With N servers each pinging one a
//! tick, a crashed server is pinged within about `PING_INTERVAL` (N − 1 draws of 1 in
//! N − 1), so detection takes ~100–200 ms.
//!
//! * [`FailureDetector`] is the synchronous logic: the list of targets, the random
//!   draw, which failures to report. Randomness is a seeded `SmallRng`.
//! * [`FailureDetectorTask`] is the async driver: the ping loop, the server-list pulls
//!   (`GetTabletMap` every [`SERVER_LIST_REFRESH`], sooner when a `ServerListChanged`
//!   push recorded in the master's `ServerListWatch` announces a newer list — the
//!   replicator keeps its own list inside the appender task, out of reach), and the
//!   reports.
//!
//! # Failure handling
//! The ping loop never waits for a coordinator: list pulls and reports run as tasks of
//! the detector's `JoinSet`, at most one pull and one report per suspect at a time (and
//! at most [`REPORTS_IN_FLIGHT_MAX`] reports). A report that fails is not retried as
//! such: the next failed ping of that server sends another. A finished report makes the
//! next tick pull the list, so a server declared crashed stops being pinged (and
//! reported) within a tick or two rather than at the next periodic pull. A connection that failed a
//! ping is dropped from the pool, so the next ping dials anew.

use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{
    GetTabletMap, ReportFailure, ReportFailureRequest, TabletMapRequest,
};
use rampart_common::protocol::master::{Ping, PingRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::{ServerInfo, ServerStatus, TabletMap};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::replica_manager::ServerListWatch;

/// Time between two pings (docs/design.md §6: 100 ms, configurable).
pub const PING_INTERVAL: Duration = Duration::from_millis(100);

/// Deadline of one ping: a healthy server answers a ping from memory in well under a
/// millisecond, so 50 ms is a server that is gone or badly stalled.
pub const PING_TIMEOUT: Duration = Duration::from_millis(50);

/// The server list is pulled at least this often.
pub const SERVER_LIST_REFRESH: Duration = Duration::from_secs(1);

/// Deadline of one server-list pull (one round over the coordinators).
pub const SERVER_LIST_FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// Deadline of one failure report (one round over the coordinators).
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(1);

/// Most failure reports in flight at once (one per suspect besides).
pub const REPORTS_IN_FLIGHT_MAX: usize = 16;

// The inline ping must end before the next is due.
const _: () = assert!(PING_TIMEOUT.as_nanos() < PING_INTERVAL.as_nanos());
const _: () = assert!(REPORTS_IN_FLIGHT_MAX > 0);

/// A server to ping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its id.
    pub id: ServerId,
    /// Its RPC address.
    pub addr: String,
}

/// The detector's synchronous logic; see the module doc.
#[derive(Debug)]
pub struct FailureDetector {
    own: ServerId,
    rng: SmallRng,
    /// The `Up` servers of the last list, this server excluded.
    targets: Vec<Target>,
    /// `TabletMap::version` of the list held (0: none yet).
    list_version: u64,
    /// Suspects whose report is in flight. Invariant: at most
    /// [`REPORTS_IN_FLIGHT_MAX`] entries.
    reporting: HashSet<ServerId>,
}

impl FailureDetector {
    /// A detector for server `own`, drawing targets from a `SmallRng` seeded with
    /// `seed`, with an empty list.
    pub fn new(own: ServerId, seed: u64) -> FailureDetector {
        FailureDetector {
            own,
            rng: SmallRng::seed_from_u64(seed),
            targets: Vec::new(),
            list_version: 0,
            reporting: HashSet::new(),
        }
    }

    /// Takes the server list of version `version`; an older list than the one held is
    /// ignored (pulls may finish out of order).
    pub fn update_servers(&mut self, version: u64, servers: &[ServerInfo]) {
        if version < self.list_version {
            return;
        }
        self.list_version = version;
        self.targets = servers
            .iter()
            .filter(|s| s.status == ServerStatus::Up && s.id != self.own)
            .map(|s| Target {
                id: s.id,
                addr: s.addr.clone(),
            })
            .collect();
    }

    /// The version of the list held (0: none).
    pub fn list_version(&self) -> u64 {
        self.list_version
    }

    /// The servers it may ping.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// A random `Up` server other than this one; `None` when there is none.
    pub fn choose_target(&mut self) -> Option<Target> {
        if self.targets.is_empty() {
            return None;
        }
        let index = self.rng.gen_range(0..self.targets.len());
        Some(self.targets[index].clone())
    }

    /// A ping of `id` failed: whether to report it now (no report of it in flight, and
    /// room for one more). When true, the report counts as in flight until
    /// [`report_finished`](Self::report_finished).
    pub fn ping_failed(&mut self, id: ServerId) -> bool {
        if self.reporting.contains(&id) || self.reporting.len() >= REPORTS_IN_FLIGHT_MAX {
            return false;
        }
        self.reporting.insert(id);
        true
    }

    /// The report of `id` finished (delivered or not).
    pub fn report_finished(&mut self, id: ServerId) {
        self.reporting.remove(&id);
    }

    /// Reports in flight.
    pub fn reports_in_flight(&self) -> usize {
        self.reporting.len()
    }
}

/// Tunables of a [`FailureDetectorTask`].
#[derive(Clone, Debug)]
pub struct FailureDetectorConfig {
    /// Time between pings ([`PING_INTERVAL`]).
    pub ping_interval: Duration,
    /// Deadline of one ping ([`PING_TIMEOUT`]).
    pub ping_timeout: Duration,
    /// Seeds the target draw.
    pub seed: u64,
}

impl Default for FailureDetectorConfig {
    fn default() -> Self {
        FailureDetectorConfig {
            ping_interval: PING_INTERVAL,
            ping_timeout: PING_TIMEOUT,
            seed: 0,
        }
    }
}

/// What a background task of the detector finished with.
enum Done {
    /// A server-list pull: the list, or `None` when no coordinator served it.
    List(Option<TabletMap>),
    /// A report finished (delivered or not); which suspect it was about is kept by the
    /// task id.
    Reported,
}

/// What a failure detector did since it started (for metrics).
#[derive(Debug, Default)]
pub struct DetectorCounts {
    /// Pings sent.
    pub pings: std::sync::atomic::AtomicU64,
    /// Pings that got no answer in time (refused, broken, late).
    pub pings_unanswered: std::sync::atomic::AtomicU64,
    /// Servers reported to the coordinators as suspected crashed.
    pub suspicions_reported: std::sync::atomic::AtomicU64,
}

/// The async driver of a [`FailureDetector`]; see the module doc.
#[derive(Debug)]
pub struct FailureDetectorTask {
    detector: FailureDetector,
    /// This server's address: the `reporter` of its reports.
    own_addr: String,
    config: FailureDetectorConfig,
    coordinators: Arc<CoordinatorSet>,
    /// For coordinator calls (shared with the process's other coordinator traffic).
    coordinator_pool: Arc<RpcPool>,
    /// For pings only, so that dropping a failed connection touches nothing else.
    pings: RpcPool,
    /// Server-list versions pushed to this master, if it has one.
    watch: Option<Arc<ServerListWatch>>,
    /// What it did, shared with metrics.
    counts: Arc<DetectorCounts>,
}

impl FailureDetectorTask {
    /// A detector for server `own` at `own_addr`, pulling its list from and reporting
    /// to `coordinators`.
    pub fn new(
        own: ServerId,
        own_addr: String,
        config: FailureDetectorConfig,
        coordinators: Arc<CoordinatorSet>,
        coordinator_pool: Arc<RpcPool>,
    ) -> FailureDetectorTask {
        FailureDetectorTask {
            detector: FailureDetector::new(own, config.seed),
            own_addr,
            config,
            coordinators,
            coordinator_pool,
            pings: RpcPool::new(),
            watch: None,
            counts: Arc::default(),
        }
    }

    /// What this detector did so far, updated as it runs.
    pub fn counts(&self) -> Arc<DetectorCounts> {
        Arc::clone(&self.counts)
    }

    /// The same task, also pulling the list as soon as `watch` records a newer version
    /// than the one held.
    pub fn with_server_list_watch(mut self, watch: Arc<ServerListWatch>) -> FailureDetectorTask {
        self.watch = Some(watch);
        self
    }

    /// Pings and reports until `shutdown` completes; then aborts its pulls and reports.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tasks: JoinSet<Done> = JoinSet::new();
        // Which suspect each report task is about, so a task that panicked still frees
        // its slot.
        let mut reports: HashMap<tokio::task::Id, ServerId> = HashMap::new();
        let mut pulling = false;
        let mut pulled: Option<Instant> = None;
        let mut ticker = tokio::time::interval(self.config.ping_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = ticker.tick() => {}
            }
            while let Some(finished) = tasks.try_join_next_with_id() {
                let (task, done) = match finished {
                    Ok((task, done)) => (task, Some(done)),
                    Err(error) => {
                        tracing::warn!(%error, "failure detector task failed");
                        (error.id(), None)
                    }
                };
                if let Some(suspect) = reports.remove(&task) {
                    self.detector.report_finished(suspect);
                    // The coordinator may have declared it crashed: pull the list at
                    // once rather than ping and report it again until the next refresh.
                    pulled = None;
                } else {
                    pulling = false;
                }
                match done {
                    Some(Done::List(Some(map))) => {
                        self.detector.update_servers(map.version, &map.servers)
                    }
                    Some(Done::List(None)) | Some(Done::Reported) | None => {}
                }
            }
            let stale = pulled.map_or(true, |at| at.elapsed() >= SERVER_LIST_REFRESH);
            let announced = self
                .watch
                .as_ref()
                .is_some_and(|w| w.is_newer_than(self.detector.list_version()));
            if !pulling && (stale || announced) {
                pulling = true;
                pulled = Some(Instant::now());
                tasks.spawn(pull_servers(
                    Arc::clone(&self.coordinators),
                    Arc::clone(&self.coordinator_pool),
                ));
            }
            let Some(target) = self.detector.choose_target() else {
                continue;
            };
            let deadline = Instant::now() + self.config.ping_timeout;
            let ping = self
                .pings
                .call::<Ping>(&target.addr, &PingRequest {}, deadline);
            let outcome = tokio::select! {
                _ = &mut shutdown => break,
                outcome = ping => outcome,
            };
            let counted = |counter: &std::sync::atomic::AtomicU64| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            };
            counted(&self.counts.pings);
            let error = match outcome {
                Ok(_) => continue,
                // It answered: alive, whatever it said.
                Err(error) if !error.is_transport() => continue,
                Err(error) => error,
            };
            self.pings.forget(&target.addr);
            counted(&self.counts.pings_unanswered);
            if !self.detector.ping_failed(target.id) {
                continue;
            }
            counted(&self.counts.suspicions_reported);
            tracing::info!(suspect = %target.id, addr = %target.addr, %error, "ping failed; reporting");
            let request = ReportFailureRequest {
                server: target.id,
                reporter: self.own_addr.clone(),
            };
            let handle = tasks.spawn(report(
                Arc::clone(&self.coordinators),
                Arc::clone(&self.coordinator_pool),
                request,
            ));
            reports.insert(handle.id(), target.id);
        }
        tasks.shutdown().await;
    }
}

async fn pull_servers(coordinators: Arc<CoordinatorSet>, pool: Arc<RpcPool>) -> Done {
    let deadline = Instant::now() + SERVER_LIST_FETCH_TIMEOUT;
    match coordinators
        .call_round::<GetTabletMap>(&pool, &TabletMapRequest {}, deadline)
        .await
    {
        Ok(map) => Done::List(Some(map)),
        Err(error) => {
            tracing::debug!(%error, "failure detector: server list unavailable");
            Done::List(None)
        }
    }
}

async fn report(
    coordinators: Arc<CoordinatorSet>,
    pool: Arc<RpcPool>,
    request: ReportFailureRequest,
) -> Done {
    let deadline = Instant::now() + REPORT_TIMEOUT;
    if let Err(error) = coordinators
        .call_round::<ReportFailure>(&pool, &request, deadline)
        .await
    {
        tracing::warn!(suspect = %request.server, %error, "failure report not delivered");
    }
    Done::Reported
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use parking_lot::Mutex;
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Reply, Rpc, RpcServer, Service};
    use rampart_common::status::Status;
    use rampart_common::tablet::Services;
    use tokio::net::TcpListener;

    fn server(id: u64, addr: &str, status: ServerStatus) -> ServerInfo {
        ServerInfo {
            id: ServerId(id),
            addr: addr.to_string(),
            services: Services {
                master: true,
                backup: true,
            },
            status,
            failure_domain: addr.to_string(),
            disk_read_mbps: 100,
        }
    }

    #[test]
    fn choose_target_never_picks_itself_or_a_server_that_is_not_up() {
        let mut detector = FailureDetector::new(ServerId(1), 42);
        detector.update_servers(
            3,
            &[
                server(1, "a:1", ServerStatus::Up),
                server(2, "b:1", ServerStatus::Up),
                server(3, "c:1", ServerStatus::Crashed),
                server(4, "d:1", ServerStatus::Removed),
                server(5, "e:1", ServerStatus::Up),
            ],
        );
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            let target = detector.choose_target().expect("two Up servers");
            seen.insert(target.id);
        }
        assert_eq!(seen, HashSet::from([ServerId(2), ServerId(5)]));
    }

    #[test]
    fn choose_target_is_none_when_no_other_server_is_up() {
        let mut detector = FailureDetector::new(ServerId(1), 7);
        assert_eq!(detector.choose_target(), None);
        detector.update_servers(1, &[server(1, "a:1", ServerStatus::Up)]);
        assert_eq!(detector.choose_target(), None);
    }

    #[test]
    fn an_older_server_list_is_ignored() {
        let mut detector = FailureDetector::new(ServerId(1), 7);
        detector.update_servers(5, &[server(2, "b:1", ServerStatus::Up)]);
        detector.update_servers(4, &[server(3, "c:1", ServerStatus::Up)]);
        assert_eq!(detector.list_version(), 5);
        assert_eq!(detector.targets()[0].id, ServerId(2));
    }

    #[test]
    fn a_suspect_is_reported_once_until_its_report_finishes() {
        let mut detector = FailureDetector::new(ServerId(1), 7);
        assert!(detector.ping_failed(ServerId(2)));
        assert!(!detector.ping_failed(ServerId(2)));
        assert!(detector.ping_failed(ServerId(3)));
        detector.report_finished(ServerId(2));
        assert!(detector.ping_failed(ServerId(2)));
    }

    #[test]
    fn reports_in_flight_are_bounded() {
        let mut detector = FailureDetector::new(ServerId(1), 7);
        for id in 0..REPORTS_IN_FLIGHT_MAX as u64 {
            assert!(detector.ping_failed(ServerId(100 + id)));
        }
        assert!(!detector.ping_failed(ServerId(99)));
        assert_eq!(detector.reports_in_flight(), REPORTS_IN_FLIGHT_MAX);
    }

    #[test]
    fn the_same_seed_draws_the_same_targets() {
        let servers: Vec<ServerInfo> = (1..=10)
            .map(|id| server(id, &format!("h:{id}"), ServerStatus::Up))
            .collect();
        let draws = |seed| {
            let mut detector = FailureDetector::new(ServerId(1), seed);
            detector.update_servers(1, &servers);
            (0..20)
                .map(|_| detector.choose_target().map(|t| t.id))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(9), draws(9));
    }

    /// Serves `GetTabletMap` with a fixed list and records `ReportFailure`s.
    #[derive(Debug)]
    struct FakeCoordinator {
        map: TabletMap,
        reports: Mutex<Vec<ReportFailureRequest>>,
    }

    impl Service for FakeCoordinator {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                match opcode {
                    GetTabletMap::OPCODE => Reply::ok(&self.map),
                    ReportFailure::OPCODE => match Reply::decode::<ReportFailureRequest>(payload) {
                        Ok(request) => {
                            self.reports.lock().push(request);
                            Reply::ok(&())
                        }
                        Err(reply) => reply,
                    },
                    // Not a master: a `Ping` gets an error status, which is an answer.
                    _ => Reply::error(Status::UnknownOpcode, "fake coordinator"),
                }
            })
        }
    }

    #[tokio::test]
    async fn a_server_that_does_not_answer_is_reported_and_a_live_one_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let coordinator = listener.local_addr().expect("addr").to_string();
        // A port with nothing listening: connections are refused.
        let dead = {
            let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            gone.local_addr().expect("addr").to_string()
        };
        let own = "127.0.0.1:1".to_string();
        let fake = Arc::new(FakeCoordinator {
            map: TabletMap {
                version: 3,
                servers: vec![
                    server(1, &own, ServerStatus::Up),
                    server(2, &dead, ServerStatus::Up),
                    // The fake answers pings (with an error status): alive.
                    server(3, &coordinator, ServerStatus::Up),
                    server(4, &dead, ServerStatus::Crashed),
                ],
                tables: Vec::new(),
            },
            reports: Mutex::new(Vec::new()),
        });
        tokio::spawn(RpcServer::run(
            listener,
            Arc::clone(&fake),
            std::future::pending(),
        ));
        let config = FailureDetectorConfig {
            ping_interval: Duration::from_millis(10),
            ping_timeout: Duration::from_millis(50),
            seed: 5,
        };
        let task = FailureDetectorTask::new(
            ServerId(1),
            own.clone(),
            config,
            Arc::new(CoordinatorSet::new(&[coordinator.as_str()])),
            Arc::new(RpcPool::new()),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(task.run(async move {
            let _ = stopped.await;
        }));
        let deadline = Instant::now() + Duration::from_secs(2);
        while fake.reports.lock().len() < 2 {
            assert!(Instant::now() < deadline, "server 2 was not reported twice");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(stop);
        tokio::time::timeout(Duration::from_secs(2), running)
            .await
            .expect("the detector stops at shutdown")
            .expect("no panic");
        for report in fake.reports.lock().iter() {
            assert_eq!(report.server, ServerId(2));
            assert_eq!(report.reporter, own);
        }
    }
}
