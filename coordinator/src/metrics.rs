//! `CoordinatorMetrics`: a coordinator's Prometheus metrics, read from its Raft member,
//! its state machine and (on the leader) its recovery reports when scraped. The RPC
//! layer's request counts and latencies are the process's own
//! (`rampart_common::metrics::rpc`).
//!
//! Recovery phase durations are histograms: each finished recovery of the reports is
//! observed once, at the first scrape that sees it (a leader keeps the last
//! `REPORTS_MAX`; a new leader starts with none, so a histogram counts what the member
//! that answers saw finish while it led).

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, GaugeVec, HistogramOpts, HistogramVec};
use rampart_common::ids::ServerId;
use rampart_common::metrics::{gauge, gauge_vec};
use rampart_common::tablet::ServerStatus;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::service::CoordinatorService;

/// The collector of one coordinator.
pub struct CoordinatorMetrics {
    service: Arc<CoordinatorService>,
    term: Gauge,
    leader: Gauge,
    is_leader: Gauge,
    commit: Gauge,
    applied: Gauge,
    snapshot: Gauge,
    config_version: Gauge,
    servers: GaugeVec,
    tables: Gauge,
    tablets: Gauge,
    clients: Gauge,
    recoveries: GaugeVec,
    phases: HistogramVec,
    /// Recoveries already observed in `phases`, by crashed server (ids are never reused).
    observed: Mutex<BTreeSet<ServerId>>,
}

impl std::fmt::Debug for CoordinatorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorMetrics").finish_non_exhaustive()
    }
}

impl CoordinatorMetrics {
    /// The metrics of `service`.
    pub fn new(service: Arc<CoordinatorService>) -> CoordinatorMetrics {
        let phases = HistogramVec::new(
            HistogramOpts::new(
                "rampart_recovery_phase_seconds",
                "Duration of each phase of finished recoveries: detection (last ping to \
                 declared crash), setup (fencing and listing replicas), replay (slowest \
                 partition), total (declared crash to every tablet live).",
            )
            .buckets(vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0,
            ]),
            &["phase"],
        );
        let phases = match phases {
            Ok(phases) => phases,
            Err(error) => unreachable!("a valid histogram: {error}"),
        };
        CoordinatorMetrics {
            service,
            term: gauge("rampart_raft_term", "This member's Raft term."),
            leader: gauge(
                "rampart_raft_leader_id",
                "The leader this member knows (0: none).",
            ),
            is_leader: gauge("rampart_raft_is_leader", "1 on the leader."),
            commit: gauge("rampart_raft_commit_index", "This member's commit index."),
            applied: gauge("rampart_raft_applied_index", "This member's applied index."),
            snapshot: gauge(
                "rampart_raft_snapshot_index",
                "Index of this member's last snapshot.",
            ),
            config_version: gauge(
                "rampart_cluster_config_version",
                "Version of the configuration this member applied.",
            ),
            servers: gauge_vec(
                "rampart_cluster_servers",
                "Servers in the configuration, by status.",
                &["status"],
            ),
            tables: gauge("rampart_cluster_tables", "Tables."),
            tablets: gauge("rampart_cluster_tablets", "Tablets of every table."),
            clients: gauge(
                "rampart_cluster_clients_open",
                "Clients with an open lease.",
            ),
            recoveries: gauge_vec(
                "rampart_recoveries",
                "Recoveries the leader reports (the last 32), by state; 0 on followers.",
                &["state"],
            ),
            phases,
            observed: Mutex::new(BTreeSet::new()),
        }
    }

    fn refresh(&self) {
        let node = self.service.node();
        let status = node.status();
        self.term.set(status.term as f64);
        self.leader.set(status.leader_id as f64);
        self.is_leader.set(f64::from(u8::from(node.is_leader())));
        self.commit.set(status.commit as f64);
        self.applied.set(status.applied as f64);
        self.snapshot.set(status.snapshot_index as f64);
        self.config_version.set(status.config_version as f64);
        let (up, crashed, removed, tables, tablets, clients) = node.with_state(|state| {
            let count = |wanted: ServerStatus| {
                state.servers().filter(|s| s.status == wanted).count() as f64
            };
            (
                count(ServerStatus::Up),
                count(ServerStatus::Crashed),
                count(ServerStatus::Removed),
                state.table_count() as f64,
                state.tablet_count() as f64,
                state.open_clients().count() as f64,
            )
        });
        self.servers.with_label_values(&["up"]).set(up);
        self.servers.with_label_values(&["crashed"]).set(crashed);
        self.servers.with_label_values(&["removed"]).set(removed);
        self.tables.set(tables);
        self.tablets.set(tablets);
        self.clients.set(clients);
        // Only the leader's reports are current: a former leader keeps its own.
        let reports = if node.is_leader() {
            self.service.recovery().reports()
        } else {
            Vec::new()
        };
        let mut counts = [0.0f64; 3];
        let mut observed = self.observed.lock();
        for report in &reports {
            let state = match (&report.waiting, report.done_ms) {
                (Some(_), _) => 1,
                (None, 0) => 0,
                (None, _) => 2,
            };
            counts[state] += 1.0;
            if state == 2 && observed.insert(report.crashed) {
                let replay = report
                    .partitions
                    .iter()
                    .map(|p| p.replay_ms)
                    .max()
                    .unwrap_or(0);
                for (phase, ms) in [
                    ("detection", report.detection_ms),
                    ("setup", report.setup_ms),
                    ("replay", replay),
                    ("total", report.done_ms),
                ] {
                    self.phases
                        .with_label_values(&[phase])
                        .observe(ms as f64 / 1000.0);
                }
            }
        }
        for (state, count) in ["running", "waiting", "done"].iter().zip(counts) {
            self.recoveries.with_label_values(&[state]).set(count);
        }
    }

    fn parts(&self) -> Vec<&dyn Collector> {
        vec![
            &self.term,
            &self.leader,
            &self.is_leader,
            &self.commit,
            &self.applied,
            &self.snapshot,
            &self.config_version,
            &self.servers,
            &self.tables,
            &self.tablets,
            &self.clients,
            &self.recoveries,
            &self.phases,
        ]
    }
}

impl Collector for CoordinatorMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.parts()
            .into_iter()
            .flat_map(|part| part.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.refresh();
        self.parts()
            .into_iter()
            .flat_map(|part| part.collect())
            .collect()
    }
}
