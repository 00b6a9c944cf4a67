//! `ServerChildren`: the background tasks of one storage server, started and stopped in
//! one place.
//!
//! On the server's runtime: the lease renewer (client requests are served only under a
//! valid lease), the tablet sync (pulls the committed tablet map when a renewal shows
//! the master behind), the version reserver (keeps version numbers below the ceiling the
//! coordinators granted), the client lease checker, the frozen watch (serves a range
//! frozen for a move again once its abort is committed and the news never came), the
//! failure detector (pings random servers, reports silent ones), the will uploader
//! (sends the master's recovery partitions when they change) and the load reporter
//! (sends the load of each tablet every second, for rebalancing).
//! On the backup runtime: the soft-NIC of the `tcp` transport, whose CPU is the backup's.
//!
//! # Shutdown
//! [`ServerChildren::stop`] drops the shared stop signal, so that every task ends
//! within its one in-flight call, and aborts those that have not after
//! [`BACKGROUND_STOP_TIMEOUT`]; the soft-NIC is aborted at once (a master still
//! writing to it sees the backup go away and re-creates its replica elsewhere).

use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::rpc::RpcPool;
use rampart_master::failure_detector::{
    DetectorCounts, FailureDetectorConfig, FailureDetectorTask,
};
use rampart_master::lease::{GrantHook, Lease, LeaseRenewer};
use rampart_master::load_report::LoadReporter;
use rampart_master::will_upload::WillUploader;
use rampart_master::MasterService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::config::StorageServerConfig;

/// How long a stopping server waits for its background tasks before aborting them (each
/// stops within one in-flight call).
pub const BACKGROUND_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// The running background tasks of one server.
#[derive(Debug)]
pub struct ServerChildren {
    /// Dropped to stop the tasks in `tasks`.
    stop: watch::Sender<()>,
    tasks: JoinSet<()>,
    /// On the backup runtime.
    nic: JoinHandle<()>,
    /// What the failure detector did (for metrics).
    detector_counts: Arc<DetectorCounts>,
}

impl ServerChildren {
    /// Starts the background tasks of `master` (server `id`, listening at `addr`) under
    /// `lease`, and the soft-NIC (`nic`, to be spawned on the backup runtime).
    pub fn start(
        id: ServerId,
        addr: &str,
        config: &StorageServerConfig,
        master: &MasterService,
        lease: Arc<Lease>,
        nic: JoinHandle<()>,
    ) -> ServerChildren {
        let (stop, stopped) = watch::channel(());
        let stopped = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.changed().await;
            }
        };
        let mut tasks = JoinSet::new();
        let set = Arc::new(CoordinatorSet::new(&config.coordinators));
        let pool = Arc::new(RpcPool::new());
        let tablet_sync = Arc::clone(master.tablet_sync());
        let reserver = master.version_reserver().cloned();
        let on_grant: GrantHook = {
            let (tablet_sync, reserver) = (Arc::clone(&tablet_sync), reserver.clone());
            Arc::new(move |grant| {
                tablet_sync.report(grant.tablets_epoch);
                if let Some(reserver) = &reserver {
                    reserver.note_ceiling(grant.version_ceiling);
                }
            })
        };
        let renewer = LeaseRenewer::new(id, lease, Arc::clone(&set), Arc::clone(&pool))
            .with_interval(config.lease_renew_interval)
            .on_grant(on_grant);
        tasks.spawn(renewer.run(stopped()));
        tasks.spawn(tablet_sync.run(stopped()));
        if let Some(reserver) = reserver {
            tasks.spawn(reserver.run(stopped()));
        }
        if let Some(checker) = master.client_leases().cloned() {
            tasks.spawn(checker.run(stopped()));
        }
        let frozen = master.frozen_watch(Arc::clone(&set), Arc::clone(&pool));
        tasks.spawn(frozen.run(stopped()));
        let detector = FailureDetectorTask::new(
            id,
            addr.to_string(),
            FailureDetectorConfig {
                ping_interval: config.ping_interval,
                ping_timeout: config.ping_timeout,
                seed: rand::random(),
            },
            Arc::clone(&set),
            Arc::clone(&pool),
        )
        .with_server_list_watch(master.server_list_watch());
        let detector_counts = detector.counts();
        tasks.spawn(detector.run(stopped()));
        let reporter = LoadReporter::new(
            id,
            Arc::clone(master.store()),
            Arc::clone(&set),
            Arc::clone(&pool),
        );
        tasks.spawn(reporter.run(stopped()));
        let uploader = WillUploader::new(id, master.will_source(), set, pool);
        tasks.spawn(uploader.run(stopped()));
        ServerChildren {
            stop,
            tasks,
            nic,
            detector_counts,
        }
    }

    /// What the failure detector did so far.
    pub fn detector_counts(&self) -> Arc<DetectorCounts> {
        Arc::clone(&self.detector_counts)
    }

    /// Stops every task (see the module doc); returns whether all ended in time.
    pub fn stop(self) -> impl Future<Output = bool> {
        let ServerChildren {
            stop,
            mut tasks,
            nic,
            ..
        } = self;
        nic.abort();
        drop(stop);
        async move {
            let drained = tokio::time::timeout(BACKGROUND_STOP_TIMEOUT, async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
            // Dropping the set aborts what is left.
            drained.is_ok()
        }
    }
}
