//! `Rebalancer`: the leader's driver of rebalancing (docs/design.md §7, "Rebalancing").
//! The decisions are [`LoadBoard`]'s (`crate::rebalance`); this feeds it the masters'
//! load reports and the committed map, and carries out what it decides: a split
//! (`SplitTablet`, then the owner told) or a move (`crate::mover`), one at a time.
//!
//! Every [`REBALANCE_INTERVAL`] while this member leads and rebalancing is on
//! (`rampart coordinator --rebalance`), not paused (committed, `state::rebalancing`),
//! and no drain or other move is under way, it asks the board what to do. Each decision
//! is logged with the figures behind it and kept (the newest [`DECISIONS_KEPT`]) with how
//! it ended, for `rampart rebalance`, `rampart status` and the status page.
//!
//! Loads live in this member's memory only: a new leader starts from the next reports,
//! and decides nothing until every master has reported to it.

use parking_lot::Mutex;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{
    OpenMoveView, RebalanceDecision, RebalanceReply, ReportLoadRequest, ServerLoad,
    PROPOSAL_TIMEOUT,
};
use rampart_common::protocol::master::{SyncTablets, SyncTabletsRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::{ServerStatus, Tablet};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

use crate::mover::Mover;
use crate::node::RaftNode;
use crate::rebalance::{Action, Decision, LoadBoard, RebalanceConfig, Verdict};
use crate::state::{Command, CommandResult, CoordinatorState};

/// How often the leader looks at the load.
pub const REBALANCE_INTERVAL: Duration = Duration::from_secs(1);

/// How many decisions are kept for display.
pub const DECISIONS_KEPT: usize = 32;

/// Deadline of the push telling an owner of its split tablet.
const SPLIT_PUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The leader's driver of rebalancing; see the module doc.
#[derive(Debug)]
pub struct Rebalancer {
    node: RaftNode,
    pool: Arc<RpcPool>,
    mover: Arc<Mover>,
    /// `--rebalance`: whether this member rebalances when it leads.
    enabled: bool,
    board: Mutex<LoadBoard>,
    decisions: Mutex<VecDeque<RebalanceDecision>>,
    /// The last reason nothing could be done, logged once until it changes.
    stuck: Mutex<Option<String>>,
}

impl Rebalancer {
    /// The rebalancer of `node`'s cluster, on when `enabled`, deciding by `config`.
    pub fn new(
        node: RaftNode,
        pool: Arc<RpcPool>,
        mover: Arc<Mover>,
        enabled: bool,
        config: RebalanceConfig,
    ) -> Rebalancer {
        Rebalancer {
            node,
            pool,
            mover,
            enabled,
            board: Mutex::new(LoadBoard::new(config)),
            decisions: Mutex::new(VecDeque::new()),
            stuck: Mutex::new(None),
        }
    }

    /// A master's load report (`ReportLoad`).
    pub fn report(&self, request: &ReportLoadRequest) {
        let interval = Duration::from_millis(u64::from(request.interval_ms));
        self.board.lock().report(
            Instant::now().into_std(),
            request.server,
            interval,
            &request.tablets,
        );
    }

    /// Where rebalancing stands, for `state`'s `Up` masters.
    pub fn view(&self, state: &CoordinatorState) -> RebalanceReply {
        let now = Instant::now().into_std();
        let board = self.board.lock();
        let servers = masters(state)
            .into_iter()
            .map(|(server, tablets)| {
                let tablets: Vec<_> = tablets
                    .iter()
                    .filter_map(|t| board.tablet_load(now, t))
                    .collect();
                ServerLoad {
                    server,
                    ops_per_s: tablets.iter().map(|t| t.ops).sum(),
                    bytes: tablets.iter().map(|t| t.bytes).sum(),
                    tablets,
                }
            })
            .collect();
        RebalanceReply {
            enabled: self.enabled,
            paused: state.rebalance_paused(),
            pinned: state.pinned().copied().collect(),
            move_cap_mb_s: state.move_cap_mb_s(),
            moves: state
                .open_moves()
                .map(|open| OpenMoveView {
                    id: open.id,
                    range: open.range,
                    source: open.source,
                    target: open.target,
                })
                .collect(),
            servers,
            decisions: self.decisions.lock().iter().cloned().collect(),
        }
    }

    /// While this member leads, every [`REBALANCE_INTERVAL`]: one look, and what it
    /// decides carried out. Runs until aborted.
    pub async fn run(self: Arc<Self>) {
        if !self.enabled {
            return;
        }
        loop {
            tokio::time::sleep(REBALANCE_INTERVAL).await;
            if self.node.leader_term().is_none() {
                continue;
            }
            let verdict = self.node.with_state(|state| {
                let mut board = self.board.lock();
                board.retain(|server| {
                    state
                        .server(server)
                        .is_some_and(|s| s.status == ServerStatus::Up)
                });
                let busy = state.rebalance_paused()
                    || state.draining().next().is_some()
                    || state.open_moves().next().is_some();
                if busy {
                    board.hold();
                    return Verdict::Wait;
                }
                board.decide(Instant::now().into_std(), &masters(state), |t| {
                    state.is_pinned(t)
                })
            });
            match verdict {
                Verdict::Wait => {}
                Verdict::Stuck(why) => {
                    let mut stuck = self.stuck.lock();
                    if stuck.as_deref() != Some(why.as_str()) {
                        tracing::info!(%why, "rebalance: a master is hot and nothing can help");
                        *stuck = Some(why);
                    }
                }
                Verdict::Act(decision) => {
                    *self.stuck.lock() = None;
                    self.act(decision).await;
                }
            }
        }
    }

    /// Carries out `decision`, keeping it with its outcome.
    async fn act(&self, decision: Decision) {
        tracing::info!(action = %decision.action, why = %decision.why, "rebalance");
        let at_unix_ms = unix_ms();
        {
            let mut decisions = self.decisions.lock();
            decisions.push_back(RebalanceDecision {
                at_unix_ms,
                action: decision.action.to_string(),
                why: decision.why.clone(),
                outcome: "under way".into(),
                done_unix_ms: 0,
                bytes_moved: 0,
            });
            while decisions.len() > DECISIONS_KEPT {
                decisions.pop_front();
            }
        }
        let (outcome, bytes_moved) = match decision.action {
            Action::Split { table, at } => (self.split(table, at).await, 0),
            Action::Move { range, to, .. } => match self.mover.move_range(range, to).await {
                Ok(moved) => (
                    format!(
                        "moved {} bytes in {} ms ({} frozen)",
                        moved.bytes,
                        u64::from(moved.copy_ms) + u64::from(moved.frozen_ms),
                        moved.frozen_ms
                    ),
                    moved.bytes,
                ),
                Err(reply) => (
                    format!(
                        "not moved ({:?}: {})",
                        reply.status(),
                        String::from_utf8_lossy(reply.payload())
                    ),
                    0,
                ),
            },
        };
        tracing::info!(action = %decision.action, %outcome, "rebalance: done");
        let mut decisions = self.decisions.lock();
        if let Some(last) = decisions
            .iter_mut()
            .rev()
            .find(|d| d.at_unix_ms == at_unix_ms && d.action == decision.action.to_string())
        {
            last.outcome = outcome;
            last.done_unix_ms = unix_ms();
            last.bytes_moved = bytes_moved;
        }
    }

    /// Commits the split of `table` at `at` and tells the owner, best effort (until it
    /// hears, it serves both halves as the one tablet they were); returns how it went.
    async fn split(&self, table: rampart_common::ids::TableId, at: u64) -> String {
        let command = Command::SplitTablet { table, at };
        let result = tokio::time::timeout(PROPOSAL_TIMEOUT, self.node.propose(command)).await;
        let epochs = match result {
            Ok(Ok(CommandResult::TabletSplit { epochs, .. })) => epochs,
            Ok(Ok(other)) => return format!("not split: {other:?}"),
            Ok(Err(error)) => return format!("not split: {error}"),
            Err(_) => return "not split: not committed in time".into(),
        };
        let deadline = Instant::now() + SPLIT_PUSH_TIMEOUT;
        for (owner, epoch) in epochs {
            let addr = self
                .node
                .with_state(|state| state.server(owner).map(|s| s.addr.clone()));
            let Some(addr) = addr else { continue };
            let request = SyncTabletsRequest { owner, epoch };
            if let Err(error) =
                crate::push::push_until::<SyncTablets>(&self.pool, &addr, &request, deadline).await
            {
                return format!(
                    "split; {owner} not told ({error}): it will at its next lease renewal"
                );
            }
        }
        "split".into()
    }
}

/// Now, in milliseconds since the Unix epoch.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Every master that may take tablets (`Up`, running a master, not being drained),
/// with its tablets from the committed map, in id order.
fn masters(state: &CoordinatorState) -> Vec<(ServerId, Vec<Tablet>)> {
    let tablets: Vec<Tablet> = state
        .tables()
        .flat_map(|t| t.tablets.iter().copied())
        .collect();
    state
        .up_servers()
        .into_iter()
        .filter(|s| s.services.master && !state.is_draining(s.id))
        .map(|s| {
            let owned = tablets
                .iter()
                .filter(|t| t.owner == s.id)
                .copied()
                .collect();
            (s.id, owned)
        })
        .collect()
}
