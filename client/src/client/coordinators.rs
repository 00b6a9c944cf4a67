//! What the client asks the coordinators: the tablet map it caches and routes by, calls
//! to their leader (table changes patiently), and reports of masters found unreachable.

use rampart_common::coordinator_set::{CoordinatorCallError, COORDINATOR_ATTEMPT_TIMEOUT_MAX};
use rampart_common::ids::{key_hash, ServerId, TableId};
use rampart_common::protocol::coordinator::{
    GetTabletMap, ReportFailure, ReportFailureRequest, TabletMapRequest, WatchTabletMap,
    WatchTabletMapRequest,
};
use rampart_common::rpc::{Rpc, RpcError};
use rampart_common::status::Status;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::retry::Retry;
use super::state::Client;
use crate::error::ClientError;
use crate::failure_reporter::FAILURE_REPORT_TIMEOUT;
use crate::tablet_map::TabletMapCache;

/// The longest one watch of the tablet map waits for a change ([`Client::watch_map`]).
pub const MAP_WATCH_WAIT: Duration = Duration::from_millis(1_000);

impl Client {
    pub(super) fn map(&self) -> Arc<TabletMapCache> {
        Arc::clone(&self.inner.map.read())
    }

    /// Fetches the tablet map, unless one newer than `seen` arrived or a fetch finished
    /// after the caller saw its failure (so a burst of failures fetches once), trying
    /// until `deadline`.
    pub(super) async fn refresh_map(
        &self,
        seen: u64,
        deadline: Instant,
    ) -> Result<(), ClientError> {
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

    /// Waits, until `deadline` or at most [`MAP_WATCH_WAIT`], for a tablet map in which
    /// `changed` holds (`WatchTabletMap`: the coordinators answer as soon as the map's
    /// version passes the one watched, such as when a crashed owner's tablet goes live
    /// elsewhere; a newer map where `changed` does not hold yet — another change — is
    /// kept and watched past); returns whether one came. One watch at a time per
    /// client: the operations behind it find the newer map when it comes. `false` when
    /// the coordinators do not answer it (an older release) or the wait ran out: the
    /// caller then pauses as before.
    pub(super) async fn watch_map(
        &self,
        deadline: Instant,
        changed: impl Fn(&TabletMapCache) -> bool,
    ) -> bool {
        let deadline = deadline.min(Instant::now() + MAP_WATCH_WAIT);
        let Ok(_watching) = tokio::time::timeout_at(deadline, self.inner.watching.lock()).await
        else {
            return false;
        };
        loop {
            let map = self.map();
            if changed(&map) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let request = WatchTabletMapRequest {
                seen: map.version,
                wait_ms: u32::try_from((deadline - now).as_millis()).unwrap_or(u32::MAX),
            };
            // The coordinator answers by the deadline: a timeout here is its silence.
            let attempt = (deadline - now) + COORDINATOR_ATTEMPT_TIMEOUT_MAX;
            let Ok(newer) = self
                .coordinator_call_within::<WatchTabletMap>(&request, deadline, attempt)
                .await
            else {
                return false;
            };
            if newer.version <= map.version {
                // The wait ran out (or this coordinator holds watches enough).
                return false;
            }
            let mut cached = self.inner.map.write();
            if newer.version > cached.version {
                *cached = Arc::new(TabletMapCache::new(newer));
            }
        }
    }

    /// [`refresh_map`](Self::refresh_map) inside an operation's retry loop, after an
    /// attempt that failed because of `why`. Should the operation's deadline pass during
    /// the refresh, the operation timed out because of `why` — not because of the
    /// coordinators, which were simply not asked again in time.
    pub(super) async fn refresh_after(
        &self,
        seen: u64,
        retry: &Retry,
        why: &str,
    ) -> Result<(), ClientError> {
        match self.refresh_map(seen, retry.deadline).await {
            Err(_) if Instant::now() >= retry.deadline => Err(ClientError::Timeout {
                attempts: retry.attempts + 1,
                last: why.to_string(),
            }),
            result => result,
        }
    }

    /// The address of the master that serves `key` of `table`, per the cached tablet
    /// map (it may be stale; operations re-route by themselves). For diagnostics.
    pub fn locate(&self, table: TableId, key: &[u8]) -> Option<String> {
        self.map().route(table, key_hash(key)).map(|(_, addr)| addr)
    }

    /// Calls a coordinator RPC on the coordinators' leader, following `NotLeader`
    /// hints and retrying until `deadline` (see `rampart_common::coordinator_set`).
    pub(super) async fn coordinator_call<R: Rpc>(
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
    pub(super) async fn coordinator_call_patient<R: Rpc>(
        &self,
        request: &R::Request,
        deadline: Instant,
    ) -> Result<R::Reply, ClientError> {
        self.coordinator_call_within::<R>(request, deadline, TABLE_CHANGE_ATTEMPT_TIMEOUT)
            .await
    }

    /// A coordinator call whose every attempt may take up to `attempt_timeout`.
    pub(super) async fn coordinator_call_within<R: Rpc>(
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
    /// unless it was reported lately or too many reports are in flight (the `client`
    /// module doc).
    pub(super) fn report_unreachable(&self, server: ServerId, error: &RpcError) {
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
}

/// Longest one attempt of a table change may take: the leader's commit
/// (`PROPOSAL_TIMEOUT`, 2 s) and its wait for the masters to take or drop their tablets
/// (3 s), then its answer.
pub const TABLE_CHANGE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(6);

/// Longest a move of tablets may take ([`Client::move_tablets`]): the target's copy
/// (`protocol::master::MOVE_IN_TIMEOUT`), then the commit and its pushes.
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(330);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::test_support::{one_master_map, serve};
    use crate::client::ClientOptions;
    use bytes::Bytes;
    use rampart_common::ids::ClientId;
    use rampart_common::protocol::coordinator::{OpenClient, OpenClientReply};
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Reply, Service};
    use rampart_common::tablet::TabletMap;
    use tokio::net::TcpListener;

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
}
