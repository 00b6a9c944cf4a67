//! `LoadReporter`: sends this master's load to the coordinators' leader every
//! [`LOAD_REPORT_INTERVAL`] (docs/design.md §7, "Rebalancing"). What a report holds is
//! the store's ([`ObjectStore::load_report`], counted by `crate::tablet_load`); this
//! is the thin driver around it.
//!
//! A report lost (no leader, a timeout) is not sent again: its counts are gone, and the
//! next report covers the next interval. The leader smooths over reports and counts a
//! master it has not heard from lately as unknown, not idle.

use parking_lot::Mutex;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{
    ReportLoad, ReportLoadRequest, LOAD_REPORT_TABLETS_MAX,
};
use rampart_common::rpc::RpcPool;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

use crate::object_store::ObjectStore;

/// How often a master reports its load.
pub const LOAD_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Sends a master's load to the leader; see the module doc.
#[derive(Debug)]
pub struct LoadReporter {
    server: ServerId,
    store: Arc<Mutex<ObjectStore>>,
    coordinators: Arc<CoordinatorSet>,
    pool: Arc<RpcPool>,
}

impl LoadReporter {
    /// A reporter of master `server`'s `store` to `coordinators`.
    pub fn new(
        server: ServerId,
        store: Arc<Mutex<ObjectStore>>,
        coordinators: Arc<CoordinatorSet>,
        pool: Arc<RpcPool>,
    ) -> LoadReporter {
        LoadReporter {
            server,
            store,
            coordinators,
            pool,
        }
    }

    /// Reports every [`LOAD_REPORT_INTERVAL`] until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(LOAD_REPORT_INTERVAL);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick is at once: it only starts the first interval.
        ticker.tick().await;
        self.store.lock().load_report();
        let mut since = Instant::now();
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            let mut tablets = self.store.lock().load_report();
            let now = Instant::now();
            let interval = now.duration_since(since);
            since = now;
            tablets.truncate(LOAD_REPORT_TABLETS_MAX);
            let request = ReportLoadRequest {
                server: self.server,
                interval_ms: u32::try_from(interval.as_millis()).unwrap_or(u32::MAX),
                tablets,
            };
            let deadline = now + LOAD_REPORT_INTERVAL;
            let report = self
                .coordinators
                .call_round::<ReportLoad>(&self.pool, &request, deadline);
            let result = tokio::select! {
                _ = &mut shutdown => return,
                result = report => result,
            };
            if let Err(error) = result {
                tracing::debug!(server = %self.server, %error, "load report not delivered");
            }
        }
    }
}
