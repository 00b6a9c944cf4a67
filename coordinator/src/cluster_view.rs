//! `ClusterView`: how a cluster stands, as one value — what the status page, its JSON
//! (`/api/status`) and `rampart status` all show.
//!
//! [`ClusterView::gather`] is the driver: it asks every coordinator for its Raft status,
//! the leader for the configuration and its recovery reports, and every server that is
//! up for its figures (`ServerStats`), each with a short deadline, so that a page built
//! while a server or coordinator hangs still shows the rest (and what did not answer).
//! It works the same from any coordinator (a follower's page is the leader's view) and
//! from outside the cluster.
//!
//! [`ClusterView::problems`] is the pure core: from the view, what an operator must
//! know and do — writes that wait because fewer backups exist than replicas wanted, a
//! master whose memory is nearly full of live data, a recovery that waits for missing
//! replicas, crashed servers, coordinators that do not
//! answer, no leader — each said once, with its fix.

use futures::future::join_all;
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::protocol::coordinator::{
    DrainReply, GetTabletMap, ListDrains, ListDrainsRequest, RaftStatus, RaftStatusReply,
    RaftStatusRequest, Rebalance, RebalanceAction, RebalanceReply, RebalanceRequest,
    RecoveryReport, RecoveryStatus, RecoveryStatusRequest, ServerLoad, TabletMapRequest,
};
use rampart_common::protocol::master::{PingRequest, ServerStats, ServerStatsReply};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::{ServerStatus, TabletLoad, TabletMap};
use serde::Serialize;
use std::time::Duration;
use tokio::time::Instant;

/// How long one coordinator or server may take to answer for the view.
pub const VIEW_ANSWER_TIMEOUT: Duration = Duration::from_millis(800);

/// The share of a master's log memory holding live data from which it is a problem.
pub const MEMORY_NEARLY_FULL: f64 = 0.85;

/// How long the leader may take to be found and answer.
pub const VIEW_LEADER_TIMEOUT: Duration = Duration::from_millis(2000);

/// One coordinator, as it answered for itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CoordinatorView {
    /// The address asked.
    pub addr: String,
    /// Its Raft status, if it answered.
    pub raft: Option<RaftStatusReply>,
    /// Why it did not.
    pub error: Option<String>,
}

/// What a server is doing, as the status page says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerState {
    /// Enlisted and serving.
    Up,
    /// Declared crashed; its recovery has not started.
    Crashed,
    /// Declared crashed; its data is being recovered.
    Recovering,
    /// Declared crashed; its recovery waits (see the recovery's `waiting`).
    RecoveryWaiting,
    /// Gone for good (recovered, or removed).
    Removed,
}

impl ServerState {
    /// The word shown for it.
    pub fn word(self) -> &'static str {
        match self {
            ServerState::Up => "up",
            ServerState::Crashed => "crashed",
            ServerState::Recovering => "recovering",
            ServerState::RecoveryWaiting => "recovery waiting",
            ServerState::Removed => "removed",
        }
    }
}

/// One server of the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServerView {
    /// Its id.
    pub id: u64,
    /// Its RPC address.
    pub addr: String,
    /// What it is doing.
    pub state: ServerState,
    /// Its failure domain.
    pub failure_domain: String,
    /// Whether it runs a master and a backup.
    pub master: bool,
    /// Whether it runs a backup.
    pub backup: bool,
    /// Its figures, if it is up and answered.
    pub stats: Option<ServerStatsReply>,
    /// Why an up server did not answer.
    pub error: Option<String>,
}

/// One tablet of a table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TabletView {
    /// First key hash.
    pub start_hash: u64,
    /// Last key hash (inclusive).
    pub end_hash: u64,
    /// Its owner's id.
    pub owner: u64,
    /// What its owner is doing.
    pub owner_state: ServerState,
}

/// One table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TableView {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its tablets, in hash order.
    pub tablets: Vec<TabletView>,
}

/// The whole view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterView {
    /// When it was gathered (Unix milliseconds).
    pub gathered_unix_ms: u64,
    /// Every coordinator asked.
    pub coordinators: Vec<CoordinatorView>,
    /// The leader's address, if one served the configuration.
    pub leader: Option<String>,
    /// Configuration version the leader served (0 if none).
    pub config_version: u64,
    /// Why the configuration is missing, if it is.
    pub config_error: Option<String>,
    /// Every server ever enlisted.
    pub servers: Vec<ServerView>,
    /// Every table.
    pub tables: Vec<TableView>,
    /// The leader's recent recoveries, oldest first.
    pub recoveries: Vec<RecoveryReport>,
    /// The drains under way, by server id.
    pub drains: Vec<DrainReply>,
    /// Where rebalancing stands, with each master's and tablet's load, as the leader
    /// sees it (`None`: it did not say).
    pub rebalance: Option<RebalanceReply>,
    /// What an operator must know and do ([`ClusterView::problems`]).
    pub problems: Vec<String>,
}

impl ClusterView {
    /// Asks the coordinators at `coordinators` and the servers they list (module doc).
    pub async fn gather(coordinators: &[String], pool: &RpcPool) -> ClusterView {
        ClusterView::gather_within(coordinators, pool, VIEW_LEADER_TIMEOUT).await
    }

    /// [`gather`](Self::gather), waiting up to `leader_timeout` for the leader.
    pub async fn gather_within(
        coordinators: &[String],
        pool: &RpcPool,
        leader_timeout: Duration,
    ) -> ClusterView {
        let asked = join_all(coordinators.iter().map(|addr| async move {
            let deadline = Instant::now() + VIEW_ANSWER_TIMEOUT;
            match pool
                .call::<RaftStatus>(addr, &RaftStatusRequest {}, deadline)
                .await
            {
                Ok(raft) => CoordinatorView {
                    addr: addr.clone(),
                    raft: Some(raft),
                    error: None,
                },
                Err(error) => CoordinatorView {
                    addr: addr.clone(),
                    raft: None,
                    error: Some(error.to_string()),
                },
            }
        }))
        .await;
        let set = CoordinatorSet::new(coordinators);
        let deadline = Instant::now() + leader_timeout;
        let map = set
            .call::<GetTabletMap>(pool, &TabletMapRequest {}, deadline)
            .await;
        let (recoveries, recoveries_error) = match &map {
            Ok(_) => {
                let deadline = Instant::now() + leader_timeout;
                match set
                    .call::<RecoveryStatus>(pool, &RecoveryStatusRequest {}, deadline)
                    .await
                {
                    Ok(reply) => (reply.recoveries, None),
                    Err(error) => (Vec::new(), Some(error.to_string())),
                }
            }
            Err(_) => (Vec::new(), None),
        };
        let (map, config_error) = match map {
            Ok(map) => (map, None),
            Err(CoordinatorCallError::NoLeader { last, .. }) => (
                TabletMap::default(),
                Some(format!("no coordinator leader: {last}")),
            ),
            Err(CoordinatorCallError::Rpc(error)) => {
                (TabletMap::default(), Some(error.to_string()))
            }
        };
        let stats = join_all(map.servers.iter().map(|server| async move {
            if server.status != ServerStatus::Up {
                return None;
            }
            let deadline = Instant::now() + VIEW_ANSWER_TIMEOUT;
            Some(
                pool.call::<ServerStats>(&server.addr, &PingRequest {}, deadline)
                    .await
                    .map_err(|error| error.to_string()),
            )
        }))
        .await;
        let gathered_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        let leader = config_error.is_none().then(|| set.leader()).flatten();
        let mut view = ClusterView::assemble(
            gathered_unix_ms,
            asked,
            leader,
            config_error,
            &map,
            stats,
            recoveries,
        );
        if view.config_error.is_none() {
            let deadline = Instant::now() + leader_timeout;
            match set
                .call::<ListDrains>(pool, &ListDrainsRequest {}, deadline)
                .await
            {
                Ok(reply) => view.drains = reply.drains,
                Err(error) => view.problems.push(format!(
                    "the drains under way are unavailable ({error}): a server being drained \
                     shows as up"
                )),
            }
            let show = RebalanceRequest {
                action: RebalanceAction::Show,
            };
            // Load is a nicety: a leader that does not say leaves it out, no problem.
            view.rebalance = set.call::<Rebalance>(pool, &show, deadline).await.ok();
        }
        if let Some(error) = recoveries_error {
            view.problems.push(format!(
                "the leader's recovery reports are unavailable ({error}): crashed servers \
                 may be shown as crashed while they are being recovered"
            ));
        }
        view
    }

    /// Builds the view from what was gathered (pure): server states from the map and
    /// the recoveries, tablets with their owners' states, and the problems.
    pub fn assemble(
        gathered_unix_ms: u64,
        coordinators: Vec<CoordinatorView>,
        leader: Option<String>,
        config_error: Option<String>,
        map: &TabletMap,
        stats: Vec<Option<Result<ServerStatsReply, String>>>,
        recoveries: Vec<RecoveryReport>,
    ) -> ClusterView {
        let state_of = |id: rampart_common::ids::ServerId, status: ServerStatus| match status {
            ServerStatus::Up => ServerState::Up,
            ServerStatus::Removed => ServerState::Removed,
            ServerStatus::Crashed => match recoveries.iter().rev().find(|r| r.crashed == id) {
                Some(report) if report.waiting.is_some() => ServerState::RecoveryWaiting,
                Some(report) if report.done_ms == 0 => ServerState::Recovering,
                _ => ServerState::Crashed,
            },
        };
        let mut servers: Vec<ServerView> = map
            .servers
            .iter()
            .zip(stats.into_iter().chain(std::iter::repeat(None)))
            .map(|(server, answer)| {
                let (stats, error) = match answer {
                    Some(Ok(stats)) => (Some(stats), None),
                    Some(Err(error)) => (None, Some(error)),
                    None => (None, None),
                };
                ServerView {
                    id: server.id.0,
                    addr: server.addr.clone(),
                    state: state_of(server.id, server.status),
                    failure_domain: server.failure_domain.clone(),
                    master: server.services.master,
                    backup: server.services.backup,
                    stats,
                    error,
                }
            })
            .collect();
        servers.sort_by_key(|s| s.id);
        let tables = map
            .tables
            .iter()
            .map(|table| TableView {
                id: table.id.0,
                name: table.name.clone(),
                tablets: table
                    .tablets
                    .iter()
                    .map(|tablet| TabletView {
                        start_hash: tablet.start_hash,
                        end_hash: tablet.end_hash,
                        owner: tablet.owner.0,
                        owner_state: servers
                            .iter()
                            .find(|s| s.id == tablet.owner.0)
                            .map_or(ServerState::Removed, |s| s.state),
                    })
                    .collect(),
            })
            .collect();
        let mut view = ClusterView {
            gathered_unix_ms,
            coordinators,
            leader,
            config_version: map.version,
            config_error,
            servers,
            tables,
            recoveries,
            drains: Vec::new(),
            rebalance: None,
            problems: Vec::new(),
        };
        view.problems = view.problems();
        view
    }

    /// What an operator must know and do, each said once with its fix (module doc).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(error) = &self.config_error {
            problems.push(format!(
                "the configuration is unavailable ({error}): a majority of the coordinators \
                 must be up and reach each other; start the ones that are down"
            ));
        }
        for coordinator in &self.coordinators {
            if let Some(error) = &coordinator.error {
                problems.push(format!(
                    "coordinator {} does not answer ({error}); the others go on while a \
                     majority is up: restart it on its data directory",
                    coordinator.addr
                ));
            }
        }
        // Replicas wanted against backups that could hold them: a master never keeps a
        // replica on its own server, so R replicas need R + 1 servers with a backup.
        let replicas = self
            .servers
            .iter()
            .filter_map(|s| s.stats.as_ref().map(|stats| stats.replicas))
            .max()
            .unwrap_or(0) as usize;
        let backups_up = self
            .servers
            .iter()
            .filter(|s| s.state == ServerState::Up && s.backup)
            .count();
        let waiting: Vec<u64> = self
            .servers
            .iter()
            .filter(|s| {
                s.stats
                    .as_ref()
                    .is_some_and(|st| st.backup_shortage.is_some())
            })
            .map(|s| s.id)
            .collect();
        if replicas > 0 && backups_up < replicas + 1 {
            problems.push(format!(
                "cannot meet R = {replicas}: each master keeps its {replicas} replicas on \
                 other servers, so at least {} servers with a backup must be up, and {backups_up} \
                 are; writes wait until there are. Start more servers, or run the cluster with \
                 fewer replicas (--replicas)",
                replicas + 1
            ));
        } else if !waiting.is_empty() {
            let why = self
                .servers
                .iter()
                .find_map(|s| s.stats.as_ref()?.backup_shortage.clone())
                .unwrap_or_default();
            problems.push(format!("writes of server(s) {waiting:?} wait: {why}"));
        }
        for server in &self.servers {
            if let Some(stats) = &server.stats {
                let live = stats.log_bytes_live as f64 / stats.log_bytes_max.max(1) as f64;
                if live >= MEMORY_NEARLY_FULL {
                    problems.push(format!(
                        "server {}'s log memory is {:.0} % full of live data ({} of {} \
                         bytes): its cleaner frees little room per pass, so writes slow \
                         down and then fail with NoSpace; spread tables over more masters \
                         (a larger span), remove data, or give the servers more --memory",
                        server.id,
                        live * 100.0,
                        stats.log_bytes_live,
                        stats.log_bytes_max
                    ));
                }
            }
            if server.state == ServerState::Up {
                if let Some(error) = &server.error {
                    problems.push(format!(
                        "server {} at {} is up in the configuration but does not answer \
                         ({error}); if it stays silent it is declared crashed and recovered",
                        server.id, server.addr
                    ));
                }
            }
        }
        for report in &self.recoveries {
            if let Some(why) = &report.waiting {
                problems.push(format!(
                    "the recovery of {} waits: {why}. Bring back the servers that hold the \
                     missing replicas (restart them on their data directories), or let it \
                     go on without them: `rampart recovery allow-loss {}` (what they held is \
                     lost)",
                    report.crashed, report.crashed.0
                ));
            }
        }
        problems
    }

    /// The servers in a given state.
    pub fn count(&self, state: ServerState) -> usize {
        self.servers.iter().filter(|s| s.state == state).count()
    }

    /// The drain of server `id`, if it is being drained.
    pub fn drain(&self, id: u64) -> Option<&DrainReply> {
        self.drains.iter().find(|d| d.server.0 == id)
    }

    /// The load master `id` last reported, if the leader said.
    pub fn server_load(&self, id: u64) -> Option<&ServerLoad> {
        let rebalance = self.rebalance.as_ref()?;
        rebalance.servers.iter().find(|s| s.server.0 == id)
    }

    /// The load of `table`'s tablet starting at `start_hash`, as its owner last
    /// reported it, if the leader said.
    pub fn tablet_load(&self, table: u64, start_hash: u64) -> Option<&TabletLoad> {
        let rebalance = self.rebalance.as_ref()?;
        rebalance
            .servers
            .iter()
            .flat_map(|s| &s.tablets)
            .find(|t| t.range.table.0 == table && t.range.start == start_hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::{ServerId, TableId};
    use rampart_common::tablet::{ServerInfo, Services, TableInfo, Tablet};

    fn server(id: u64, status: ServerStatus) -> ServerInfo {
        ServerInfo {
            id: ServerId(id),
            addr: format!("127.0.0.1:{}", 9000 + id),
            services: Services {
                master: true,
                backup: true,
            },
            status,
            failure_domain: format!("d{id}"),
            disk_read_mbps: 100,
        }
    }

    fn stats(replicas: u32, shortage: Option<&str>) -> ServerStatsReply {
        ServerStatsReply {
            replicas,
            backup_shortage: shortage.map(str::to_string),
            ..ServerStatsReply::default()
        }
    }

    fn report(crashed: u64, waiting: Option<&str>, done_ms: u64) -> RecoveryReport {
        RecoveryReport {
            crashed: ServerId(crashed),
            declared_unix_ms: 0,
            detection_ms: 100,
            setup_ms: 50,
            done_ms,
            segments: 3,
            waiting: waiting.map(str::to_string),
            partitions: Vec::new(),
            lease_end: None,
            lease_end_ms: 0,
        }
    }

    fn map(servers: Vec<ServerInfo>) -> TabletMap {
        TabletMap {
            version: 7,
            tables: vec![TableInfo {
                id: TableId(1),
                name: "users".into(),
                tablets: vec![
                    Tablet {
                        table: TableId(1),
                        start_hash: 0,
                        end_hash: u64::MAX / 2,
                        owner: ServerId(1),
                    },
                    Tablet {
                        table: TableId(1),
                        start_hash: u64::MAX / 2 + 1,
                        end_hash: u64::MAX,
                        owner: ServerId(2),
                    },
                ],
            }],
            servers,
        }
    }

    #[test]
    fn a_healthy_cluster_has_no_problems() {
        let servers = (1..=4).map(|id| server(id, ServerStatus::Up)).collect();
        let answers = (0..4).map(|_| Some(Ok(stats(3, None)))).collect();
        let view = ClusterView::assemble(
            0,
            vec![],
            Some("c".into()),
            None,
            &map(servers),
            answers,
            vec![],
        );
        assert_eq!(view.problems, Vec::<String>::new());
        assert_eq!(view.count(ServerState::Up), 4);
        assert_eq!(view.tables[0].tablets[1].owner_state, ServerState::Up);
    }

    #[test]
    fn too_few_backups_for_r_is_one_problem_naming_the_fix() {
        // R = 3 with 3 servers up (one crashed): every master is short of a backup.
        let servers = vec![
            server(1, ServerStatus::Up),
            server(2, ServerStatus::Up),
            server(3, ServerStatus::Up),
            server(4, ServerStatus::Crashed),
        ];
        let shortage = "writes wait for backups: need 3 backups";
        let answers = vec![
            Some(Ok(stats(3, Some(shortage)))),
            Some(Ok(stats(3, Some(shortage)))),
            Some(Ok(stats(3, None))),
            None,
        ];
        let recoveries = vec![report(4, None, 0)];
        let view = ClusterView::assemble(0, vec![], None, None, &map(servers), answers, recoveries);
        assert_eq!(view.problems.len(), 1, "{:?}", view.problems);
        let problem = &view.problems[0];
        assert!(problem.contains("cannot meet R = 3"), "{problem}");
        assert!(problem.contains("at least 4 servers"), "{problem}");
        assert!(problem.contains("Start more servers"), "{problem}");
        assert!(problem.contains("--replicas"), "{problem}");
        assert_eq!(view.servers[3].state, ServerState::Recovering);
    }

    #[test]
    fn a_shortage_of_failure_domains_is_reported_from_the_masters() {
        let servers = (1..=4).map(|id| server(id, ServerStatus::Up)).collect();
        let why = "writes wait for backups: need 3 backups in distinct failure domains";
        let answers = vec![
            Some(Ok(stats(3, Some(why)))),
            Some(Ok(stats(3, None))),
            None,
            None,
        ];
        let view = ClusterView::assemble(0, vec![], None, None, &map(servers), answers, vec![]);
        assert_eq!(view.problems.len(), 1, "{:?}", view.problems);
        assert!(view.problems[0].contains("server(s) [1]"));
        assert!(view.problems[0].contains(why));
    }

    #[test]
    fn a_master_nearly_full_of_live_data_is_a_problem() {
        let servers = (1..=4).map(|id| server(id, ServerStatus::Up)).collect();
        let full = ServerStatsReply {
            log_bytes_live: 900,
            log_bytes_max: 1000,
            ..stats(3, None)
        };
        let roomy = ServerStatsReply {
            log_bytes_live: 800,
            log_bytes_max: 1000,
            ..stats(3, None)
        };
        let answers = vec![Some(Ok(full)), Some(Ok(roomy)), None, None];
        let view = ClusterView::assemble(0, vec![], None, None, &map(servers), answers, vec![]);
        assert_eq!(view.problems.len(), 1, "{:?}", view.problems);
        assert!(view.problems[0].starts_with("server 1's log memory is 90 % full"));
        assert!(view.problems[0].contains("--memory"));
    }

    #[test]
    fn a_waiting_recovery_and_silent_members_are_named_with_their_fix() {
        let servers = vec![
            server(1, ServerStatus::Up),
            server(2, ServerStatus::Up),
            server(3, ServerStatus::Crashed),
            server(4, ServerStatus::Removed),
        ];
        let answers = vec![
            Some(Ok(stats(1, None))),
            Some(Err("rpc Ping timed out".to_string())),
            None,
            None,
        ];
        let coordinators = vec![CoordinatorView {
            addr: "127.0.0.1:7001".into(),
            raft: None,
            error: Some("cannot connect".into()),
        }];
        let recoveries = vec![
            report(4, None, 900),
            report(3, Some("segment 7 missing"), 0),
        ];
        let view = ClusterView::assemble(
            0,
            coordinators,
            None,
            None,
            &map(servers),
            answers,
            recoveries,
        );
        assert_eq!(view.servers[2].state, ServerState::RecoveryWaiting);
        assert_eq!(view.servers[3].state, ServerState::Removed);
        let all = view.problems.join("\n");
        assert_eq!(view.problems.len(), 3, "{all}");
        assert!(all.contains("coordinator 127.0.0.1:7001 does not answer"));
        assert!(all.contains("server 2 at"));
        assert!(all.contains("segment 7 missing"));
        assert!(all.contains("rampart recovery allow-loss 3"));
    }
}
