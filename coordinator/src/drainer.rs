//! `Drainer`: the leader's driver of drains (docs/design.md §7, "Draining a server").
//! The decisions are the state machine's (`state::drains`: nothing new goes to a server
//! being drained, and it is removed only once it owns nothing); this drives the servers
//! around them.
//!
//! # A drain
//! Every [`DRAIN_INTERVAL`] while this member leads, for each server being drained, one
//! step:
//! 1. **Its backup.** Once the other backups could hold every master's R replicas in
//!    distinct failure domains without it ([`backups_short`]; until then writes would
//!    wait, so the drain does), every other `Up` master that has not confirmed yet is
//!    asked to stop using its backup (`EvacuateBackup`): each re-creates its replicas
//!    there elsewhere, places none there again, and answers how far it got. First, so
//!    that what the moves copy is never replicated there.
//! 2. **Its tablets.** A run of its tablets moves ([`Mover::move_range`]) to the master,
//!    up and not being drained, that owns the fewest tablets ([`next_move`]); the step
//!    ends there.
//! 3. With no tablet left, the step ends until every master has answered that its log
//!    needs nothing on the backup any more (every segment whole, none with a replica
//!    there).
//! 4. **Removal.** `RemoveDrained`, naming the masters that confirmed (refused while it
//!    owns a tablet, is an end of an open move, a crashed server awaits its recovery, or
//!    an `Up` master has not confirmed — one that enlisted since, say). Then the
//!    replicas of its own log, which nothing needs, are freed on every backup
//!    (`EndRecovery`, which also fences its master there).
//!
//! A master's confirmation stays true: once it left the backup it never places a
//! replica there again while the server is `Up`. So confirmations gather over steps, and
//! a master busy closing segments need only be whole at one of them.
//!
//! So until the removal, the server keeps serving what it holds, and its backup keeps
//! every replica a recovery might read: nothing is lost if any server, this one
//! included, crashes on the way, and no recovery runs if none does.
//!
//! # A new leader
//! The state holds who is being drained; a new leader's drainer picks up where the old
//! one was. A move the old leader drove is aborted by the new leader's mover, and moved
//! again at a later step.

use parking_lot::Mutex;
use rampart_common::ids::ServerId;
use rampart_common::protocol::backup::{EndRecovery, EndRecoveryRequest};
use rampart_common::protocol::coordinator::{DrainReply, DrainState, PROPOSAL_TIMEOUT};
use rampart_common::protocol::master::{
    EvacuateBackup, EvacuateBackupRequest, PingRequest, ServerStats,
};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::{HashRange, ServerStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::mover::{owner_runs, Mover};
use crate::node::RaftNode;
use crate::state::{Command, CommandResult, CoordinatorState};

/// How often the leader takes a step of each drain.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(500);

/// Deadline of one `EvacuateBackup` or `EndRecovery` call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The leader's driver of drains; see the module doc.
#[derive(Debug)]
pub struct Drainer {
    node: RaftNode,
    pool: Arc<RpcPool>,
    mover: Arc<Mover>,
    /// What each drain waited for at its last step (this member's view).
    waiting: Mutex<BTreeMap<ServerId, Waiting>>,
    /// For each drain, the masters that answered that their logs need nothing on its
    /// backup any more. Stays true: such a master never places a replica there again
    /// while the server is `Up` (`master::replica_manager::server_list_watch`).
    confirmed: Mutex<BTreeMap<ServerId, BTreeSet<ServerId>>>,
}

/// What a drain waited for at its last step, and what its moves copied.
#[derive(Clone, Debug, Default)]
struct Waiting {
    masters: u32,
    detail: String,
    bytes_moved: u64,
}

impl Drainer {
    /// The drainer of `node`'s cluster, calling servers through `pool` and moving
    /// tablets with `mover`.
    pub fn new(node: RaftNode, pool: Arc<RpcPool>, mover: Arc<Mover>) -> Drainer {
        Drainer {
            node,
            pool,
            mover,
            waiting: Mutex::new(BTreeMap::new()),
            confirmed: Mutex::new(BTreeMap::new()),
        }
    }

    /// Where the drain of `server` stands in `state` (`None`: no such server).
    pub fn progress(&self, state: &CoordinatorState, server: ServerId) -> Option<DrainReply> {
        let info = state.server(server)?;
        let tablets_left = u32::try_from(state.tablets_owned(server)).unwrap_or(u32::MAX);
        let (drain, waiting) = if state.is_draining(server) {
            let waiting = self.waiting.lock().get(&server).cloned();
            let waiting = waiting.unwrap_or_else(|| Waiting {
                detail: "starting".into(),
                ..Waiting::default()
            });
            (DrainState::Draining, waiting)
        } else if info.status == ServerStatus::Removed {
            let detail = "removed (drained, or recovered after a crash)".into();
            let waiting = Waiting {
                detail,
                ..Waiting::default()
            };
            (DrainState::Removed, waiting)
        } else {
            let detail = match info.status {
                ServerStatus::Up => "up, not being drained",
                _ => "crashed: its recovery takes what it held",
            };
            let waiting = Waiting {
                detail: detail.into(),
                ..Waiting::default()
            };
            (DrainState::NotDraining, waiting)
        };
        Some(DrainReply {
            server,
            state: drain,
            tablets_left,
            masters_waiting: waiting.masters,
            detail: waiting.detail,
            bytes_moved: waiting.bytes_moved,
        })
    }

    /// While this member leads, every [`DRAIN_INTERVAL`]: a step of each drain. Runs
    /// until aborted.
    pub async fn run(self: Arc<Self>) {
        loop {
            tokio::time::sleep(DRAIN_INTERVAL).await;
            if self.node.leader_term().is_none() {
                continue;
            }
            let draining: Vec<ServerId> = self.node.with_state(|state| state.draining().collect());
            self.waiting.lock().retain(|id, _| draining.contains(id));
            self.confirmed.lock().retain(|id, _| draining.contains(id));
            for server in draining {
                self.step(server).await;
            }
        }
    }

    /// One step of the drain of `server` (module doc).
    async fn step(&self, server: ServerId) {
        // The masters leave its backup first, so that nothing moved off it (or written
        // anywhere meanwhile) is replicated there only to be re-created elsewhere.
        let Some(replicas) = self.replicas().await else {
            self.note(server, 0, "no master said its R; asked again".into());
            return;
        };
        if let Some(short) = self
            .node
            .with_state(|state| backups_short(state, server, replicas))
        {
            self.note(server, 0, format!("waiting for servers to join: {short}"));
            return;
        }
        let waiting = self.evacuate(server).await;
        if let Some((range, target)) = self.node.with_state(|state| next_move(state, server)) {
            self.note(server, 0, format!("moving {range:?} to {target}"));
            match self.mover.move_range(range, target).await {
                Ok(moved) => {
                    tracing::info!(%server, ?range, %target, id = %moved.id, bytes = moved.bytes, "drain: tablets moved");
                    if let Some(waiting) = self.waiting.lock().get_mut(&server) {
                        waiting.bytes_moved += moved.bytes;
                    }
                }
                Err(reply) => {
                    let why = format!(
                        "a move of {range:?} to {target} failed ({:?}: {}); tried again",
                        reply.status(),
                        String::from_utf8_lossy(reply.payload())
                    );
                    tracing::warn!(%server, %why, "drain");
                    self.note(server, 0, why);
                }
            }
            return;
        }
        if !waiting.is_empty() {
            let masters = u32::try_from(waiting.len()).unwrap_or(u32::MAX);
            self.note(
                server,
                masters,
                format!(
                    "masters re-creating the replicas on its backup: {}",
                    waiting.join("; ")
                ),
            );
            return;
        }
        self.note(server, 0, "removing".into());
        let confirmed: Vec<ServerId> = self
            .confirmed
            .lock()
            .get(&server)
            .map(|masters| masters.iter().copied().collect())
            .unwrap_or_default();
        let command = Command::RemoveDrained {
            id: server,
            confirmed,
        };
        let result = tokio::time::timeout(PROPOSAL_TIMEOUT, self.node.propose(command)).await;
        match result {
            Ok(Ok(CommandResult::StatusSet)) => {
                let freed = self.free_log(server).await;
                tracing::info!(%server, freed, "drain finished: server removed");
            }
            Ok(Ok(other)) => self.note(server, 0, format!("not removed: {other:?}")),
            Ok(Err(error)) => self.note(server, 0, format!("not removed: {error}")),
            Err(_) => self.note(server, 0, "removal not committed in time".into()),
        }
    }

    /// The replicas per segment the masters keep (R): the most any `Up` master reports;
    /// `None` when none answers (a cluster without masters keeps none: `Some(0)`).
    pub async fn replicas(&self) -> Option<usize> {
        let masters: Vec<String> = self.node.with_state(|state| {
            state
                .up_servers()
                .into_iter()
                .filter(|s| s.services.master)
                .map(|s| s.addr.clone())
                .collect()
        });
        let deadline = Instant::now() + CALL_TIMEOUT;
        let calls = masters.iter().map(|addr| async move {
            let stats = self
                .pool
                .call::<ServerStats>(addr, &PingRequest {}, deadline)
                .await;
            stats.ok().map(|stats| stats.replicas as usize)
        });
        let answers = futures::future::join_all(calls).await;
        if masters.is_empty() {
            return Some(0);
        }
        answers.into_iter().flatten().max()
    }

    /// Asks every `Up` master but `server` that has not confirmed yet to stop using its
    /// backup (a server without a backup needs no asking: every master confirms);
    /// returns, for each whose log still needs it, why.
    async fn evacuate(&self, server: ServerId) -> Vec<String> {
        let confirmed = self
            .confirmed
            .lock()
            .get(&server)
            .cloned()
            .unwrap_or_default();
        let (runs_backup, masters): (bool, Vec<(ServerId, String)>) =
            self.node.with_state(|state| {
                let runs_backup = state.server(server).is_some_and(|s| s.services.backup);
                let masters = state
                    .up_servers()
                    .into_iter()
                    .filter(|s| s.services.master && s.id != server && !confirmed.contains(&s.id))
                    .map(|s| (s.id, s.addr.clone()))
                    .collect();
                (runs_backup, masters)
            });
        if !runs_backup {
            let mut all = self.confirmed.lock();
            all.entry(server)
                .or_default()
                .extend(masters.iter().map(|&(id, _)| id));
            return Vec::new();
        }
        let request = EvacuateBackupRequest { backup: server };
        let deadline = Instant::now() + CALL_TIMEOUT;
        let calls = masters.iter().map(|(master, addr)| async move {
            let answer = self
                .pool
                .call::<EvacuateBackup>(addr, &request, deadline)
                .await;
            match answer {
                Ok(reply) if reply.done() => {
                    self.confirmed
                        .lock()
                        .entry(server)
                        .or_default()
                        .insert(*master);
                    None
                }
                Ok(reply) if !reply.reported => Some(format!("{master}: not looked yet")),
                Ok(reply) => Some(format!(
                    "{master}: {} segments with a replica there, {} not whole",
                    reply.on_backup, reply.not_whole
                )),
                Err(error) => Some(format!("{master}: {error}")),
            }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Frees the replicas of removed `server`'s own log on every `Up` backup; returns
    /// how many. A backup that does not answer keeps them (garbage until its next
    /// collection).
    async fn free_log(&self, server: ServerId) -> u32 {
        let backups: Vec<(ServerId, String)> = self.node.with_state(|state| {
            state
                .up_servers()
                .into_iter()
                .filter(|s| s.services.backup)
                .map(|s| (s.id, s.addr.clone()))
                .collect()
        });
        let request = EndRecoveryRequest { master: server };
        let deadline = Instant::now() + CALL_TIMEOUT;
        let calls = backups.iter().map(|(backup, addr)| async move {
            match self.pool.call::<EndRecovery>(addr, &request, deadline).await {
                Ok(reply) => reply.freed,
                Err(error) => {
                    tracing::warn!(%server, %backup, %error, "replicas of a drained master not freed");
                    0
                }
            }
        });
        futures::future::join_all(calls).await.into_iter().sum()
    }

    fn note(&self, server: ServerId, masters: u32, detail: String) {
        let mut waiting = self.waiting.lock();
        let entry = waiting.entry(server).or_default();
        entry.masters = masters;
        entry.detail = detail;
    }
}

/// The next run of `server`'s tablets to move off it, and where to: the master, `Up` and
/// not being drained, that owns the fewest tablets (the lowest id among equals).
pub fn next_move(state: &CoordinatorState, server: ServerId) -> Option<(HashRange, ServerId)> {
    let run = state.tables().find_map(|table| {
        owner_runs(&table.tablets, 0, u64::MAX)
            .into_iter()
            .find(|&(_, owner)| owner == server)
            .map(|(range, _)| range)
    })?;
    let target = state
        .up_servers()
        .into_iter()
        .filter(|s| s.services.master && s.id != server && !state.is_draining(s.id))
        .min_by_key(|s| (state.tablets_owned(s.id), s.id))?
        .id;
    Some((run, target))
}

/// Why the backups left without `server` (and without every server being drained)
/// could not hold `replicas` replicas of some master's segments in distinct failure
/// domains, if they could not: a drain then would make that master's writes wait.
pub fn backups_short(
    state: &CoordinatorState,
    server: ServerId,
    replicas: usize,
) -> Option<String> {
    let runs_backup = state.server(server).is_some_and(|s| s.services.backup);
    if !runs_backup || replicas == 0 {
        return None;
    }
    let up = state.up_servers();
    up.iter()
        .filter(|m| m.services.master && m.id != server)
        .find_map(|master| {
            let domains: BTreeSet<&str> = up
                .iter()
                .filter(|b| {
                    b.services.backup
                        && b.id != master.id
                        && b.id != server
                        && !state.is_draining(b.id)
                })
                .map(|b| b.failure_domain.as_str())
                .collect();
            (domains.len() < replicas).then(|| {
                format!(
                    "without {server}'s backup, {} would have backups in {} failure domains for \
                     R = {replicas} replicas (its own server never holds one); start another \
                     server with a backup",
                    master.id,
                    domains.len()
                )
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::tablet::Services;

    fn cluster(servers: usize) -> CoordinatorState {
        let mut state = CoordinatorState::new();
        for i in 0..servers {
            state.apply(&Command::EnlistServer {
                addr: format!("h{i}:1"),
                services: Services {
                    master: true,
                    backup: true,
                },
                failure_domain: format!("rack-{i}"),
                disk_read_mbps: 100,
            });
        }
        state
    }

    #[test]
    fn a_drain_waits_for_enough_backups_and_moves_to_the_least_loaded_master() {
        let mut state = cluster(3);
        let (one, two, three) = (ServerId(1), ServerId(2), ServerId(3));
        // R = 2 with three servers: each master has exactly two other backups.
        assert!(backups_short(&state, one, 2).is_some());
        assert_eq!(backups_short(&state, one, 1), None);
        state.apply(&Command::EnlistServer {
            addr: "h3:1".into(),
            services: Services {
                master: false,
                backup: true,
            },
            failure_domain: "rack-3".into(),
            disk_read_mbps: 100,
        });
        assert_eq!(backups_short(&state, one, 2), None);

        state.apply(&Command::CreateTable {
            name: "t".into(),
            span: 6,
        });
        state.apply(&Command::DrainServer { id: one });
        let (range, target) = next_move(&state, one).expect("a run to move");
        assert_eq!(state.tablets_of(one)[0].range(), range);
        assert!(target == two || target == three);
        state.apply(&Command::DrainServer { id: two });
        // Two is being drained too: only three takes tablets, and its backup leaves.
        assert_eq!(next_move(&state, one).map(|(_, t)| t), Some(three));
        assert!(backups_short(&state, one, 2).is_some());
    }
}
