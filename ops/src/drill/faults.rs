//! [`Injector`]: carries a [`FaultPlan`] out on a local cluster of processes — kills,
//! pauses, coordinator leader kills, moves of tablets, drains — and heals after each
//! fault: it waits until every
//! server it killed is recovered (`Removed` in the server list), starts a replacement in
//! its slot (the same data directory; it enlists as a new server), restarts a killed
//! coordinator, and waits for a leader. A cluster that does not heal within
//! [`HEAL_TIMEOUT`] is an anomaly of the drill, and no further fault is injected.
//!
//! Runs on a thread of its own (process control blocks); its coordinator calls run on
//! the drill's runtime through a handle.

use super::plan::{choose, Cut, FaultKind, FaultPlan, ServerView, Skip};
use crate::cluster::{coordinator_host, server_host, LocalCluster};
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::{ServerId, TableId};
use rampart_common::protocol::coordinator::{
    DrainServer, GetTabletMap, LeaseEnd, MoveTablets, MoveTabletsRequest, RaftStatus,
    RaftStatusRequest, RecoveryReport, RecoveryStatus, RecoveryStatusRequest, ServerIdRequest,
    TabletMapRequest,
};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::{ServerStatus, TabletMap};
use rampart_ops::netns::Network;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a cluster may take to heal from one fault: detection, recovery of every
/// server killed, a replacement started, a coordinator leader elected.
pub const HEAL_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a paused server may take to exit once resumed after it was declared crashed.
pub const PAUSED_EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the drill waits for a recovery master to take a partition of a recovery it
/// means to interrupt.
const RECOVERY_MASTER_WAIT: Duration = Duration::from_secs(20);

/// How often the injector asks the coordinators while it waits.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Deadline of one coordinator call of the injector.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Deadline of a move of a tablet (the client library's `MOVE_TIMEOUT`).
const MOVE_CALL_TIMEOUT: Duration = rampart_client::client::MOVE_TIMEOUT;

/// One fault of the drill, as it went.
#[derive(Clone, Debug)]
pub struct FaultRecord {
    /// Seconds from the drill's start to the injection.
    pub at_s: f64,
    /// Its kind.
    pub kind: FaultKind,
    /// What was done (`killed server 3 (slot 2)`), or why it was skipped.
    pub what: String,
    /// Whether it was injected (not skipped).
    pub injected: bool,
    /// Seconds from the injection until the cluster had healed.
    pub healed_after_s: f64,
}

/// Carries out faults on `cluster`.
#[derive(Debug)]
pub struct Injector {
    cluster: LocalCluster,
    runtime: tokio::runtime::Handle,
    pool: RpcPool,
    coordinators: CoordinatorSet,
    table: TableId,
    replicas: usize,
    plan: FaultPlan,
    start: Instant,
    /// Every fault, injected or skipped, in order.
    pub log: Vec<FaultRecord>,
    /// Every server killed or paused: each owes one recovery.
    pub crashed: Vec<u64>,
    /// What went wrong with the cluster itself (did not heal, a paused server that kept
    /// running): each counts as a violation.
    pub anomalies: Vec<String>,
}

impl Injector {
    /// An injector of `plan` on `cluster`, whose table under test is `table`.
    pub fn new(
        cluster: LocalCluster,
        runtime: tokio::runtime::Handle,
        table: TableId,
        replicas: usize,
        plan: FaultPlan,
        start: Instant,
    ) -> Injector {
        let coordinators =
            CoordinatorSet::new(&crate::startup::coordinator_list(&cluster.coordinator));
        Injector {
            cluster,
            runtime,
            pool: RpcPool::new(),
            coordinators,
            table,
            replicas,
            plan,
            start,
            log: Vec::new(),
            crashed: Vec::new(),
            anomalies: Vec::new(),
        }
    }

    /// The cluster, to stop it once the drill is done.
    pub fn into_cluster(self) -> LocalCluster {
        self.cluster
    }

    /// Injects faults as planned until `until` (or `stop`), one at a time, healing after
    /// each. Stops early when the cluster does not heal.
    pub fn run(&mut self, until: Instant, stop: &AtomicBool) {
        while let Some((gap, kind)) = self.plan.next_fault() {
            if !sleep_until((Instant::now() + gap).min(until), stop) || Instant::now() >= until {
                return;
            }
            let at_s = self.start.elapsed().as_secs_f64();
            let injected_at = Instant::now();
            let (what, injected, healed) = match self.inject(kind) {
                Ok(what) => (what, true, true),
                Err(Fault::Skipped(Skip(why))) => (format!("skipped: {why}"), false, true),
                Err(Fault::Unhealed(why)) => {
                    self.anomalies.push(format!("{kind} at {at_s:.1} s: {why}"));
                    (format!("did not heal: {why}"), true, false)
                }
            };
            let healed_after_s = injected_at.elapsed().as_secs_f64();
            println!(
                "fault {:>3} at {at_s:>6.1} s  {kind:<24} {what} ({healed_after_s:.1} s)",
                self.log.len() + 1
            );
            self.log.push(FaultRecord {
                at_s,
                kind,
                what,
                injected,
                healed_after_s,
            });
            if !healed {
                return;
            }
        }
        sleep_until(until, stop);
    }

    /// Waits until every server crashed by the drill is recovered and every slot runs a
    /// server again (after the last fault, before the final reads).
    pub fn settle(&mut self) -> Result<(), String> {
        let crashed = self.crashed.clone();
        self.wait_statuses(&crashed, ServerStatus::Removed)
    }

    /// How many of the servers the drill crashed the server list shows recovered.
    pub fn recovered(&self) -> usize {
        let Ok(map) = self.tablet_map() else {
            return 0;
        };
        self.crashed
            .iter()
            .filter(|&&id| {
                map.servers
                    .iter()
                    .any(|s| s.id == ServerId(id) && s.status == ServerStatus::Removed)
            })
            .count()
    }

    fn inject(&mut self, kind: FaultKind) -> Result<String, Fault> {
        match kind {
            FaultKind::KillMaster | FaultKind::KillBackup | FaultKind::KillTwo => {
                let slots = choose(kind, &self.view()?, self.replicas, self.plan.draw())?;
                let ids = self.kill(&slots)?;
                self.heal(&slots, &ids)?;
                Ok(format!(
                    "{} ({})",
                    describe_kills(&slots, &ids),
                    self.lease_ends(&ids)
                ))
            }
            FaultKind::KillDuringRecovery => {
                let slots = choose(kind, &self.view()?, self.replicas, self.plan.draw())?;
                let ids = self.kill(&slots)?;
                let (second, when) = self.recovery_master_of(ids[0])?;
                let mut what = describe_kills(&slots, &ids);
                let (mut slots, mut ids) = (slots, ids);
                if let Some(slot) = self.slot_of(second) {
                    ids.extend(self.kill(&[slot])?);
                    slots.push(slot);
                    what.push_str(&format!(
                        ", then its recovery master {second} (slot {slot}) {when}"
                    ));
                }
                self.heal(&slots, &ids)?;
                Ok(what)
            }
            FaultKind::Pause => {
                let slots = choose(kind, &self.view()?, self.replicas, self.plan.draw())?;
                self.pause(slots[0])
            }
            FaultKind::KillCoordinatorLeader => self.kill_leader(),
            FaultKind::Move => self.move_tablet(),
            FaultKind::Drain => {
                let slots = choose(kind, &self.view()?, self.replicas, self.plan.draw())?;
                self.drain(slots[0])
            }
            FaultKind::Partition => {
                if self.cluster.network.is_none() {
                    return Err(Fault::Skipped(Skip(
                        "the cluster has no network of its own to cut".into(),
                    )));
                }
                match Cut::drawn(self.plan.draw()) {
                    Cut::LeaderAlone => self.partition_leader(),
                    cut => {
                        let slots = choose(kind, &self.view()?, self.replicas, self.plan.draw())?;
                        self.partition_master(slots[0], cut)
                    }
                }
            }
        }
    }

    /// The hosts of the coordinators and of the server slots, by name.
    fn hosts(&self) -> (Vec<String>, Vec<String>) {
        let coordinators = self
            .cluster
            .coordinators
            .iter()
            .map(|(id, _)| coordinator_host(*id))
            .collect();
        let servers = (1..=self.cluster.servers.len()).map(server_host).collect();
        (coordinators, servers)
    }

    /// Cuts host `victim` off as `cut` says.
    fn cut(&self, victim: &str, cut: Cut) -> Result<(), Fault> {
        let (coordinators, servers) = self.hosts();
        let peers = cut.peers(victim, &coordinators, &servers);
        self.network()?
            .cut(victim, &peers, cut.kind())
            .map_err(|e| Fault::Unhealed(format!("cannot cut {victim} off: {e:#}")))
    }

    /// Restores every link of host `victim`.
    fn reconnect(&self, victim: &str) -> Result<(), Fault> {
        self.network()?
            .heal(victim)
            .map_err(|e| Fault::Unhealed(format!("cannot reconnect {victim}: {e:#}")))
    }

    fn network(&self) -> Result<&Network, Fault> {
        self.cluster
            .network
            .as_ref()
            .ok_or_else(|| Fault::Unhealed("the cluster has no network".into()))
    }

    /// Cuts the master of `slot` off as `cut` says until it is declared crashed and
    /// recovered, then reconnects it and waits for it to exit, as a master that learns
    /// it is dead must.
    fn partition_master(&mut self, slot: usize, cut: Cut) -> Result<String, Fault> {
        let id = self.cluster.servers[slot - 1].0;
        let host = server_host(slot);
        self.cut(&host, cut)?;
        self.crashed.push(id);
        let recovered = self.wait_statuses(&[id], ServerStatus::Removed);
        let reconnected = self.reconnect(&host);
        recovered.map_err(Fault::Unhealed)?;
        reconnected?;
        let lease_end = self.lease_end_of(id);
        // A live master taken for dead: its tablets went live while it could still
        // serve reads (the checker may show them stale). `None`: it owned no tablets.
        let proven = lease_end.filter(|end| *end != LeaseEnd::Waited);
        if let (Cut::MasterRejected, Some(end)) = (cut, proven) {
            return Err(Fault::Unhealed(format!(
                "server {id}, alive behind REJECT rules, was taken for dead ({end}): \
                 the coordinators must take only a supervisor's word here"
            )));
        }
        let what = format!(
            "cut server {id} (slot {slot}) off {cut} until recovered ({})",
            lease_end.map_or("owned no tablets".to_string(), |end| end.to_string())
        );
        self.expect_exit(slot, id, what, "reconnected")
    }

    /// What let the tablets of each crashed server of `ids` go live (`server 3: refused`).
    fn lease_ends(&self, ids: &[u64]) -> String {
        let reports = self.recoveries();
        ids.iter()
            .map(|&id| {
                let end = reports
                    .iter()
                    .rev()
                    .find(|r| r.crashed == ServerId(id))
                    .and_then(|r| r.lease_end);
                match end {
                    Some(end) => format!("server {id}: {end}"),
                    None => format!("server {id}: owned no tablets"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What let the tablets of crashed server `id` go live, as its recovery recorded.
    fn lease_end_of(&self, id: u64) -> Option<LeaseEnd> {
        self.recoveries()
            .iter()
            .rev()
            .find(|r| r.crashed == ServerId(id))
            .and_then(|r| r.lease_end)
    }

    /// Cuts the coordinators' leader off from the other coordinators and the servers
    /// until another is elected, for 1 to 3 s more, then reconnects it and waits for a
    /// leader.
    fn partition_leader(&mut self) -> Result<String, Fault> {
        let leader = self
            .leader_other_than(None)
            .ok_or_else(|| Fault::Skipped(Skip("no coordinator leader to cut off".into())))?;
        let host = coordinator_host(leader);
        self.cut(&host, Cut::LeaderAlone)?;
        let elected = self.wait_leader_other_than(Some(leader));
        let after = Duration::from_millis(1_000 + self.plan.draw() % 2_000);
        if elected.is_ok() {
            std::thread::sleep(after);
        }
        let reconnected = self.reconnect(&host);
        let new = elected?;
        reconnected?;
        let now = self.wait_leader_other_than(None)?;
        Ok(format!(
            "cut coordinator {leader}, the leader, off {}; coordinator {new} elected, \
             reconnected {:.1} s later; leader now {now}",
            Cut::LeaderAlone,
            after.as_secs_f64()
        ))
    }

    /// Moves a tablet of the table, drawn from the seed, to another server up (the whole
    /// move under the load: copied, frozen, committed or aborted).
    fn move_tablet(&mut self) -> Result<String, Fault> {
        let map = self.tablet_map().map_err(Fault::Unhealed)?;
        let tablets: Vec<_> = map
            .tables
            .iter()
            .filter(|t| t.id == self.table)
            .flat_map(|t| t.tablets.iter().copied())
            .collect();
        let draw = self.plan.draw();
        let tablet = *tablets
            .get((draw % tablets.len().max(1) as u64) as usize)
            .ok_or_else(|| Skip("the table has no tablets".into()))?;
        let targets: Vec<ServerId> = self
            .view()?
            .into_iter()
            .map(|s| ServerId(s.id))
            .filter(|&id| id != tablet.owner)
            .collect();
        let target = *targets
            .get(((draw >> 32) % targets.len().max(1) as u64) as usize)
            .ok_or_else(|| Skip("no other server is up".into()))?;
        let request = MoveTabletsRequest {
            table: self.table,
            start: tablet.start_hash,
            end: tablet.end_hash,
            target,
        };
        let moved = self.runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + MOVE_CALL_TIMEOUT;
            self.coordinators
                .call_with_attempts::<MoveTablets>(
                    &self.pool,
                    &request,
                    deadline,
                    MOVE_CALL_TIMEOUT,
                )
                .await
        });
        let range = format!("{:#018x}..={:#018x}", tablet.start_hash, tablet.end_hash);
        Ok(match moved {
            Ok(reply) => {
                let each: Vec<String> = reply
                    .moves
                    .iter()
                    .map(|m| {
                        format!(
                            "{} from {} ({} entries, frozen {} ms)",
                            m.id, m.source, m.entries, m.frozen_ms
                        )
                    })
                    .collect();
                format!("moved {range} to {target}: {}", each.join(", "))
            }
            // An aborted or refused move leaves the tablet where it was: the checker
            // says whether anything was lost.
            Err(error) => format!("move of {range} to {target} did not commit: {error}"),
        })
    }

    /// Drains the server of `slot`: waits until it is removed (no recovery) and its
    /// process exits, then starts a server in its slot again.
    fn drain(&mut self, slot: usize) -> Result<String, Fault> {
        let id = self.cluster.servers[slot - 1].0;
        let request = ServerIdRequest {
            server: ServerId(id),
        };
        let begun = self.runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
            self.coordinators
                .call::<DrainServer>(&self.pool, &request, deadline)
                .await
        });
        let started = Instant::now();
        match begun {
            Ok(_) => {}
            Err(error) if error.to_string().contains("not enough servers") => {
                return Err(Fault::Skipped(Skip(format!("cannot drain {id}: {error}"))));
            }
            Err(error) => {
                return Err(Fault::Unhealed(format!("drain of {id} not begun: {error}")));
            }
        }
        self.wait_statuses(&[id], ServerStatus::Removed)
            .map_err(Fault::Unhealed)?;
        let what = format!(
            "drained server {id} (slot {slot}) in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        self.expect_exit(slot, id, what, "removed")
    }

    /// Kills the servers of `slots`; returns their ids.
    fn kill(&mut self, slots: &[usize]) -> Result<Vec<u64>, Fault> {
        let mut ids = Vec::new();
        for &slot in slots {
            ids.push(self.cluster.servers[slot - 1].0);
            self.cluster
                .kill_server(slot)
                .map_err(|e| Fault::Unhealed(format!("cannot kill slot {slot}: {e:#}")))?;
        }
        self.crashed.extend(&ids);
        Ok(ids)
    }

    /// Waits until `ids` are recovered, then starts a server in each of `slots`.
    fn heal(&mut self, slots: &[usize], ids: &[u64]) -> Result<(), Fault> {
        self.wait_statuses(ids, ServerStatus::Removed)
            .map_err(Fault::Unhealed)?;
        for &slot in slots {
            self.cluster
                .restart_server(slot)
                .map_err(|e| Fault::Unhealed(format!("cannot restart slot {slot}: {e:#}")))?;
        }
        Ok(())
    }

    /// SIGSTOPs the server of `slot` until it is declared crashed and recovered, then
    /// SIGCONTs it and waits for it to exit, as a master that learns it is dead must.
    fn pause(&mut self, slot: usize) -> Result<String, Fault> {
        let id = self.cluster.servers[slot - 1].0;
        let name = format!("server #{slot}");
        self.cluster
            .children
            .signal(&name, libc::SIGSTOP)
            .map_err(|e| Fault::Unhealed(format!("{e:#}")))?;
        self.crashed.push(id);
        let recovered = self.wait_statuses(&[id], ServerStatus::Removed);
        let _ = self.cluster.children.signal(&name, libc::SIGCONT);
        recovered.map_err(Fault::Unhealed)?;
        // A paused process proves nothing: its kernel still accepts connections.
        let lease_end = self.lease_end_of(id);
        if let Some(end) = lease_end.filter(|end| *end != LeaseEnd::Waited) {
            return Err(Fault::Unhealed(format!(
                "server {id}, paused, was taken for dead ({end})"
            )));
        }
        let what = format!(
            "paused server {id} (slot {slot}) until recovered ({})",
            lease_end.map_or("owned no tablets".to_string(), |end| end.to_string())
        );
        self.expect_exit(slot, id, what, "resumed")
    }

    /// Waits for the server of `slot` (id `id`), declared crashed and recovered and then
    /// `woken` (resumed, reconnected), to exit, as a master that learns it is dead must;
    /// kills it (an anomaly) if it does not within [`PAUSED_EXIT_TIMEOUT`]. Then starts a
    /// server in its slot again.
    fn expect_exit(
        &mut self,
        slot: usize,
        id: u64,
        mut what: String,
        woken: &str,
    ) -> Result<String, Fault> {
        let name = format!("server #{slot}");
        let resumed = Instant::now();
        what.push_str(&format!(", then {woken}"));
        loop {
            if self.cluster.children.has_exited(&name) {
                what.push_str(&format!(
                    "; it exited {:.1} s later",
                    resumed.elapsed().as_secs_f64()
                ));
                break;
            }
            if resumed.elapsed() > PAUSED_EXIT_TIMEOUT {
                self.anomalies.push(format!(
                    "server {id} (slot {slot}), declared crashed and recovered, still ran {} \
                     s after it was {woken}",
                    PAUSED_EXIT_TIMEOUT.as_secs()
                ));
                let _ = self.cluster.kill_server(slot);
                what.push_str("; it did not exit and was killed");
                break;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        self.cluster
            .restart_server(slot)
            .map_err(|e| Fault::Unhealed(format!("cannot restart slot {slot}: {e:#}")))?;
        Ok(what)
    }

    /// Kills the coordinators' leader, restarts it after 1 to 3 s, waits for a leader.
    fn kill_leader(&mut self) -> Result<String, Fault> {
        let leader = self
            .leader_other_than(None)
            .ok_or_else(|| Fault::Skipped(Skip("no coordinator leader to kill".into())))?;
        self.cluster
            .kill_coordinator(leader)
            .map_err(|e| Fault::Unhealed(format!("{e:#}")))?;
        let down = Duration::from_millis(1_000 + self.plan.draw() % 2_000);
        std::thread::sleep(down);
        self.cluster
            .restart_coordinator(leader)
            .map_err(|e| Fault::Unhealed(format!("cannot restart coordinator {leader}: {e:#}")))?;
        let new = self.wait_leader_other_than(None)?;
        Ok(format!(
            "killed coordinator {leader}, the leader, for {:.1} s; leader now {new}",
            down.as_secs_f64()
        ))
    }

    /// Waits (at most [`HEAL_TIMEOUT`]) until a coordinator other than `old` leads.
    fn wait_leader_other_than(&self, old: Option<u64>) -> Result<u64, Fault> {
        let deadline = Instant::now() + HEAL_TIMEOUT;
        loop {
            if let Some(new) = self.leader_other_than(old) {
                return Ok(new);
            }
            if Instant::now() > deadline {
                return Err(Fault::Unhealed(match old {
                    Some(old) => format!("no coordinator but {old} elected leader"),
                    None => "no coordinator leader elected".into(),
                }));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// The id of the coordinators' leader, as a member that leads says (`old` not
    /// asked: cut off, it may still think it leads).
    fn leader_other_than(&self, old: Option<u64>) -> Option<u64> {
        let members: Vec<(u64, String)> = self
            .cluster
            .coordinators
            .iter()
            .filter(|(id, _)| Some(*id) != old)
            .cloned()
            .collect();
        self.runtime.block_on(async {
            for (_, addr) in &members {
                let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
                if let Ok(s) = self
                    .pool
                    .call::<RaftStatus>(addr, &RaftStatusRequest {}, deadline)
                    .await
                {
                    if s.leader_id != 0 && s.leader_id == s.id {
                        return Some(s.id);
                    }
                }
            }
            None
        })
    }

    fn tablet_map(&self) -> Result<TabletMap, String> {
        self.runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
            self.coordinators
                .call::<GetTabletMap>(&self.pool, &TabletMapRequest {}, deadline)
                .await
                .map_err(|e| format!("server list unavailable: {e}"))
        })
    }

    fn recoveries(&self) -> Vec<RecoveryReport> {
        self.runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
            self.coordinators
                .call::<RecoveryStatus>(&self.pool, &RecoveryStatusRequest {}, deadline)
                .await
                .map(|reply| reply.recoveries)
                .unwrap_or_default()
        })
    }

    /// The servers up now, by slot, and whether each masters tablets of the table.
    fn view(&self) -> Result<Vec<ServerView>, Fault> {
        let map = self.tablet_map().map_err(Fault::Unhealed)?;
        let owners: Vec<ServerId> = map
            .tables
            .iter()
            .filter(|t| t.id == self.table)
            .flat_map(|t| t.tablets.iter().map(|tablet| tablet.owner))
            .collect();
        Ok(map
            .servers
            .iter()
            .filter(|s| s.status == ServerStatus::Up)
            .filter_map(|s| {
                let slot = self.slot_of(s.id.0)?;
                Some(ServerView {
                    slot,
                    id: s.id.0,
                    masters_tablets: owners.contains(&s.id),
                })
            })
            .collect())
    }

    /// The slot whose running server has id `id`.
    fn slot_of(&self, id: u64) -> Option<usize> {
        let slot = self.cluster.servers.iter().position(|(i, _)| *i == id)? + 1;
        self.cluster.server_pid(slot).map(|_| slot)
    }

    /// A recovery master of `crashed`'s recovery once one has a partition (preferring
    /// one still replaying), and whether it was caught during the recovery or after.
    fn recovery_master_of(&self, crashed: u64) -> Result<(u64, &'static str), Fault> {
        let deadline = Instant::now() + RECOVERY_MASTER_WAIT;
        loop {
            let reports = self.recoveries();
            let partitions: Vec<_> = reports
                .iter()
                .filter(|r| r.crashed == ServerId(crashed))
                .flat_map(|r| r.partitions.iter())
                .filter(|p| p.master.0 != 0)
                .collect();
            if let Some(p) = partitions.iter().find(|p| p.live_ms == 0) {
                return Ok((p.master.0, "during its replay"));
            }
            if let Some(p) = partitions.first() {
                return Ok((p.master.0, "after its partition went live"));
            }
            if Instant::now() > deadline {
                return Err(Fault::Unhealed(format!(
                    "no recovery master took a partition of server {crashed} within {} s",
                    RECOVERY_MASTER_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until every server of `ids` has `status` in the server list.
    fn wait_statuses(&self, ids: &[u64], status: ServerStatus) -> Result<(), String> {
        let deadline = Instant::now() + HEAL_TIMEOUT;
        loop {
            let last = match self.tablet_map() {
                Ok(map) => {
                    let behind: Vec<String> = ids
                        .iter()
                        .filter(|&&id| {
                            !map.servers
                                .iter()
                                .any(|s| s.id == ServerId(id) && s.status == status)
                        })
                        .map(|id| id.to_string())
                        .collect();
                    if behind.is_empty() {
                        return Ok(());
                    }
                    format!("server(s) {} not {status:?}", behind.join(", "))
                }
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(format!("after {} s: {last}", HEAL_TIMEOUT.as_secs()));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

/// Why a fault did not go through.
enum Fault {
    /// Not injected (nothing fits it now).
    Skipped(Skip),
    /// Injected, or half-way, and the cluster did not heal.
    Unhealed(String),
}

impl From<Skip> for Fault {
    fn from(skip: Skip) -> Fault {
        Fault::Skipped(skip)
    }
}

fn describe_kills(slots: &[usize], ids: &[u64]) -> String {
    let each: Vec<String> = slots
        .iter()
        .zip(ids)
        .map(|(slot, id)| format!("server {id} (slot {slot})"))
        .collect();
    format!("killed {}", each.join(" and "))
}

/// Sleeps until `until` unless `stop` is set first; whether it slept the whole way.
fn sleep_until(until: Instant, stop: &AtomicBool) -> bool {
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep((until - Instant::now()).min(POLL_INTERVAL));
    }
    true
}
