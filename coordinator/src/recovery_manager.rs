//! `RecoveryManager`: the recovery of crashed masters (docs/design.md §6), driven by the
//! coordinators' Raft leader. Failures are verified and crashes declared before, by
//! [`FailureVerifier`]; the planning steps are pure functions in `recovery_plan`, and
//! every decision of what to do next — which phase, which recovery master, what a
//! commit's outcome means, who must still confirm the end — is a synchronous state
//! machine in `recovery_phases`. This module is their driver: the barriers, proposals,
//! RPCs and pauses.
//!
//! # What it does for callers
//! * [`RecoveryManager::run`]: while this coordinator leads, every server the state says
//!   is `Crashed` is recovered, each by its own task, so several crashes are recovered
//!   concurrently (RAMCloud ran one recovery at a time). A crash the verifier declares
//!   wakes it at once.
//! * [`RecoveryManager::reports`]: the timings of the last [`REPORTS_MAX`] recoveries.
//!
//! # One recovery (the three phases of §6)
//! 1. **Setup.** Every `Up` backup gets `StartRecovery`: it fences the crashed master's
//!    open frames and lists its replicas, with the log digest and footer of those not
//!    closed. [`check_log`] decides from the lists, and from the open-segment epochs the
//!    master recorded, whether the log is complete (the head is the highest segment with
//!    data; every footer found needs its successor; every segment of the head's digest
//!    needs a copy that holds all its acknowledged writes: see `recovery_plan` on which
//!    copies count). If not, the recovery **waits**, says
//!    which segments are missing in the log and in `RecoveryStatus`, and asks again every
//!    [`SETUP_RETRY_PAUSE`] — until the missing replicas come back (a backup restarted on
//!    its disk) or the operator runs `rampart recovery allow-loss`. Otherwise
//!    [`choose_sources_by_speed`] picks one replica per segment, spreading the reads over
//!    the backups by their disks' speed, and each backup is told to read its share in order and split it by
//!    partition (`RecoveryRead`). The partitions are the crashed master's will cut to the
//!    tablets it still owns ([`partitions_for`]), the largest halved by key hash while
//!    there are fewer than recovery masters ([`spread_over`]); [`assign_partitions`]
//!    spreads them over the `Up` masters by free memory.
//! 2. **Replay.** Each recovery master gets `Recover` with its partition and, per segment,
//!    the chosen backup first and the copies as good as it as fallbacks. It fetches, replays and
//!    re-replicates, and answers when done.
//! 3. **Cleanup.** A finished partition goes live at once, independently of the others:
//!    `RecoveredPartition` is committed (tablets split and handed to the recovery master)
//!    and the new owner is told to take them (`TakeTablets`, numbered by its tablet
//!    epoch; if that push is lost, the owner pulls its tablets at its next lease
//!    renewal, see `coordinator::service`). A partition whose recovery master failed is
//!    sent to another one. When the crashed master owns nothing any more, every `Up`
//!    master is told the recovery is over (`FinishRecovery`, see below), every backup
//!    frees its replicas (`EndRecovery`) and the server is marked `Removed`.
//!
//! # Fencing and leases
//! A master serves only while it holds a lease, granted by the leader through a
//! linearizable read ([`RecoveryConfig::lease`], counted by the master from when it sent
//! the renewal). A renewal answered before the crash was committed was sent before it,
//! so every lease of the crashed master has lapsed `lease` after this leader saw the
//! crash committed (or took the recovery over). Tablets go live no earlier than that,
//! plus `LEASE_MARGIN` for clock-rate differences — or sooner, once the master's death
//! is proven (its supervisor saw its process exit; under `--proof-of-death direct`, its
//! address refused a connection or another server answers there: see
//! [`crate::proof_of_death`], and [`FailureVerifier::probe`], which every recovery runs
//! once at its start under that setting). Setup and replay run meanwhile, so
//! the wait costs nothing when replay takes longer than the lease. Which of the lease's
//! end and a proof let the tablets go live is in the report (`lease_end`). Masters count their
//! lease on `CLOCK_BOOTTIME`, so a master whose machine was suspended finds its lease
//! over when it wakes; this wait may run on a clock that stops while the coordinator's
//! own machine sleeps, which only makes it longer. Writes are fenced
//! earlier still: the backups refuse them from setup on.
//!
//! # Failure handling
//! * Leadership lost: commits fail with `NotLeader`, and the task ends; the new leader
//!   finds the server still `Crashed` with the tablets not yet handed over, and starts
//!   again (a recovery is idempotent: what is left to recover is what the crashed server
//!   still owns, read after a barrier, so an entry of the old leader's that committed is
//!   seen). A proposal in flight may still commit under the new leader, so its recovery
//!   master is **not** told to forget anything: it keeps what it replayed, and either the
//!   commit makes it serve that (it pulls its tablets at its next lease renewal) or the
//!   commit never happened and a later `Recover` of those ranges there, or the
//!   recovery's `FinishRecovery`, forgets it. A master
//!   refuses a `Recover` of an attempt older than the newest it has seen for that
//!   crashed server, so a deposed leader's late request cannot erase a newer replay.
//! * A commit of unknown outcome (dropped, a snapshot covered it, refused): never a
//!   guess. After a read barrier, the committed map says which parts of the partition the
//!   recovery master owns — those it is told to serve (`SyncTablets`) — and only the rest
//!   it is told to forget (`AbandonRecovery`, naming the attempt: a master ignores the
//!   abandon of an attempt older than its latest `Recover` for that crashed server).
//! * A recovery master fails (`RecoveryFailed`, unreachable, crashed): its partition goes
//!   to another master, up to [`PARTITION_ATTEMPTS_MAX`] times; then the whole attempt
//!   starts again from setup (a backup may have died meanwhile). One that gave no answer
//!   (the connection broke, or [`RECOVER_TIMEOUT`] passed) is told in the background to
//!   abandon the partition, as it may still be replaying it or hold what it replayed; a
//!   recovery master also cancels by itself a `Recover` not done within
//!   [`RECOVER_TIMEOUT`].
//! * Replayed for nobody: an abandon is retried until [`CLEANUP_CALL_TIMEOUT`], but it
//!   can be lost for good, and a deposed leader sends none. So once the crashed master
//!   owns nothing, every `Up` master gets `FinishRecovery` with its tablet epoch as
//!   committed: it catches up with its tablets (what the map gives it is then owned and
//!   kept), forgets every unowned object any attempt replayed there, and refuses later
//!   `Recover`s of the crashed master. The server is marked `Removed` only once every
//!   `Up` master confirmed; until then the recovery says which did not, in its report,
//!   and asks again every [`SETUP_RETRY_PAUSE`]. One that does not answer at all is
//!   reported to the [`FailureVerifier`]: declared crashed, it is no longer asked.
//! * A backup dies: recovery masters fall back to other replicas that hold as much.

use rampart_common::failpoints;
use rampart_common::ids::{ServerId, TabletEpoch};
use rampart_common::protocol::backup::{
    EndRecovery, EndRecoveryRequest, PartitionRanges, RecoveryRead, RecoveryReadRequest,
    StartRecovery, StartRecoveryRequest,
};
use rampart_common::protocol::coordinator::{LeaseEnd, PartitionReport, RecoveryReport};
use rampart_common::protocol::master::{
    AbandonRecovery, AbandonRecoveryRequest, FinishRecovery, FinishRecoveryRequest, Ping,
    PingRequest, Recover, RecoverReply, RecoverRequest, RecoverySource, SyncTablets,
    SyncTabletsRequest, TabletsRequest, TakeTablets, RECOVER_TIMEOUT,
};
use rampart_common::rpc::{Rpc, RpcPool};
use rampart_common::status::Status;
use rampart_common::tablet::{ServerInfo, ServerStatus, Tablet};
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

use crate::failure_verifier::{ms, FailureVerifier};
use crate::node::{NodeError, RaftNode};
use crate::proof_of_death::{lease_end, ProofOfDeath};
use crate::push::{push_until, push_while_busy};
use crate::recovery_phases::{
    Attempted, Commit, FinishAnswer, FinishRound, Next, PartitionNext, PartitionTries, Phases,
};
use crate::recovery_plan::{
    assign_partitions, check_log, choose_sources_by_speed, most_free, partitions_for, spread_over,
    FoundReplica,
};
use crate::state::{Command, CommandResult};

/// How long a master may serve after it sent a renewal that was granted. Longer rides
/// out longer coordinator outages (a leader election takes 150–500 ms); shorter lets
/// recovered tablets go live sooner when replay is quick.
pub const LEASE_DEFAULT: Duration = Duration::from_millis(750);

/// Deadline of each of the coordinator's own pings of a suspect.
pub const VERIFY_TIMEOUT_DEFAULT: Duration = Duration::from_millis(200);

/// Pings of a suspect, one after another; all must fail before it is declared crashed. A
/// killed process refuses at once, so only a hung one costs the timeouts.
pub const VERIFY_ATTEMPTS_DEFAULT: u32 = 2;

/// How often the leader looks for crashed servers to recover.
pub const RECOVERY_SCAN_INTERVAL: Duration = Duration::from_millis(20);

/// Deadline of `StartRecovery` (each backup copies and scans its open frames of the
/// crashed master: a few milliseconds each) and of `RecoveryRead`.
pub const SETUP_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause before asking the backups again when the log is incomplete or no recovery
/// master is up.
pub const SETUP_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Recovery masters tried for one partition in one attempt.
pub const PARTITION_ATTEMPTS_MAX: u32 = 3;

/// Deadline of pushing recovered tablets to their new owner, and of `EndRecovery`.
pub const CLEANUP_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Recoveries whose reports are kept.
pub const REPORTS_MAX: usize = 32;

/// Tunables of failure verification and recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// Lease granted to masters.
    pub lease: Duration,
    /// Deadline of each verification ping.
    pub verify_timeout: Duration,
    /// Verification pings that must all fail.
    pub verify_attempts: u32,
    /// Recovery masters one recovery gives partitions to at most (those with the most
    /// free log memory; the others still take a partition whose master failed); `None`:
    /// every master that is up.
    pub masters_max: Option<usize>,
    /// What proves a crashed master's death, so that its tablets go live before its
    /// lease ran out (`proof_of_death`).
    pub proof_of_death: ProofOfDeath,
    /// How often the leader frees, on the backups, replicas of masters that are gone
    /// (`crate::collector`).
    pub collect_interval: Duration,
    /// Whether the leader rebalances, and by what settings (`crate::rebalancer`);
    /// `None`: off.
    pub rebalance: Option<crate::rebalance::RebalanceConfig>,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            lease: LEASE_DEFAULT,
            verify_timeout: VERIFY_TIMEOUT_DEFAULT,
            verify_attempts: VERIFY_ATTEMPTS_DEFAULT,
            masters_max: None,
            proof_of_death: ProofOfDeath::default(),
            collect_interval: crate::collector::COLLECT_INTERVAL_DEFAULT,
            rebalance: None,
        }
    }
}

/// What the leader keeps about failures and recoveries.
#[derive(Debug, Default)]
struct Inner {
    /// Crashed servers with a recovery task running here.
    running: BTreeSet<ServerId>,
    /// Reports of the last recoveries, oldest first; at most [`REPORTS_MAX`].
    reports: VecDeque<RecoveryReport>,
    /// Attempts started by this leader (the low half of recovery ids).
    attempts: u64,
}

/// Recovery on the coordinators' leader (module doc).
#[derive(Debug)]
pub struct RecoveryManager {
    node: RaftNode,
    pool: Arc<RpcPool>,
    config: RecoveryConfig,
    /// Declares the crashes this manager recovers, and says when.
    verifier: Arc<FailureVerifier>,
    /// A `parking_lot` mutex: held only for bookkeeping, never across an await.
    inner: parking_lot::Mutex<Inner>,
}

/// Tells the master at `addr` to forget objects of `ranges` (recovery `recovery` of
/// `crashed`) it does not own, and to cancel a recovery of them still under way there,
/// retrying until [`CLEANUP_CALL_TIMEOUT`]. Best effort: should it never get through,
/// the next `Recover` of those ranges there forgets them, and `FinishRecovery` at the
/// end of the recovery does in any case.
async fn abandon(
    pool: &RpcPool,
    addr: &str,
    crashed: ServerId,
    recovery: u64,
    ranges: PartitionRanges,
) {
    let deadline = Instant::now() + CLEANUP_CALL_TIMEOUT;
    let request = AbandonRecoveryRequest {
        crashed,
        recovery,
        ranges,
    };
    if let Err(error) = push_until::<AbandonRecovery>(pool, addr, &request, deadline).await {
        tracing::info!(%addr, %error, "AbandonRecovery failed; the master keeps the replayed objects until the recovery finishes");
    }
}

impl RecoveryManager {
    /// A manager over this coordinator's Raft member, recovering the crashes `verifier`
    /// declares (and any other it finds in the state).
    pub fn new(
        node: RaftNode,
        pool: Arc<RpcPool>,
        config: RecoveryConfig,
        verifier: Arc<FailureVerifier>,
    ) -> RecoveryManager {
        RecoveryManager {
            node,
            pool,
            config,
            verifier,
            inner: parking_lot::Mutex::new(Inner::default()),
        }
    }

    /// Its tunables.
    pub fn config(&self) -> &RecoveryConfig {
        &self.config
    }

    /// The reports of the last recoveries, oldest first.
    pub fn reports(&self) -> Vec<RecoveryReport> {
        self.inner.lock().reports.iter().cloned().collect()
    }

    /// Starts recovering every crashed server, for as long as this coordinator leads;
    /// runs until the process ends.
    pub async fn run(self: Arc<Self>) {
        loop {
            if self.node.is_leader() {
                let crashed = self.node.with_state(|state| state.crashed_servers());
                for server in crashed {
                    if self.inner.lock().running.insert(server) {
                        let me = Arc::clone(&self);
                        tokio::spawn(async move {
                            me.recover(server).await;
                            me.inner.lock().running.remove(&server);
                        });
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(RECOVERY_SCAN_INTERVAL) => {}
                _ = self.verifier.crash_declared() => {}
            }
        }
    }

    /// Updates this recovery's report.
    fn report(&self, crashed: ServerId, update: impl FnOnce(&mut RecoveryReport)) {
        let mut inner = self.inner.lock();
        if let Some(report) = inner
            .reports
            .iter_mut()
            .rev()
            .find(|r| r.crashed == crashed)
        {
            update(report);
        }
    }

    /// Recovers `crashed` until it owns nothing, then frees its replicas and removes it.
    async fn recover(&self, crashed: ServerId) {
        // A crash declared by another leader, or before a restart: timed from now.
        let (declared, detection) = self
            .verifier
            .take_declared(crashed)
            .unwrap_or((Instant::now(), Duration::ZERO));
        let declared_unix_ms = SystemTime::now()
            .checked_sub(declared.elapsed())
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, ms);
        {
            let mut inner = self.inner.lock();
            if inner.reports.len() >= REPORTS_MAX {
                inner.reports.pop_front();
            }
            inner.reports.push_back(RecoveryReport {
                crashed,
                declared_unix_ms,
                detection_ms: ms(detection),
                setup_ms: 0,
                done_ms: 0,
                segments: 0,
                waiting: None,
                partitions: Vec::new(),
                lease_end: None,
                lease_end_ms: 0,
            });
        }
        if self.config.proof_of_death.probes_addresses() {
            // A crash declared for another reason (a restart at its address, a report
            // to an earlier leader) has no ping of this leader behind it: look.
            let addr = self
                .node
                .with_state(|state| state.server(crashed).map(|s| s.addr.clone()));
            if let Some(addr) = addr {
                let verifier = Arc::clone(&self.verifier);
                tokio::spawn(async move { verifier.probe(crashed, &addr).await });
            }
        }
        tracing::info!(%crashed, "recovery started");
        let mut phases = Phases::new();
        let mut finish = FinishRound::new();
        let mut next = phases.start();
        loop {
            next = match next {
                Next::ReadMap => {
                    let owned = self.committed_tablets(crashed).await;
                    phases.committed(owned)
                }
                Next::Attempt(owned) => {
                    let attempted = match self.attempt(crashed, &owned, declared).await {
                        Ok(()) => Attempted::Ran,
                        Err(Stop::Leadership) => Attempted::LeadershipLost,
                        Err(Stop::Wait(why)) => Attempted::Wait(why),
                    };
                    let left = self.node.with_state(|state| state.tablets_of(crashed));
                    phases.attempted(attempted, &left)
                }
                Next::Finish => {
                    let confirmed = self.finish_on_masters(crashed, &mut finish).await;
                    phases.finished(confirmed)
                }
                Next::Wait(why) => {
                    // Said once per reason, not at every retry.
                    let said = self.reports().iter().any(|r| {
                        r.crashed == crashed && r.waiting.as_deref() == Some(why.as_str())
                    });
                    if !said {
                        tracing::warn!(%crashed, %why, "recovery waits");
                    }
                    self.report(crashed, |r| r.waiting = Some(why));
                    tokio::time::sleep(SETUP_RETRY_PAUSE).await;
                    Next::ReadMap
                }
                Next::Pause => {
                    tokio::time::sleep(SETUP_RETRY_PAUSE).await;
                    Next::ReadMap
                }
                Next::Cleanup => {
                    self.cleanup(crashed, declared).await;
                    return;
                }
                Next::Stop => return,
            };
        }
    }

    /// What `crashed` still owns, read after a barrier; `None` if this coordinator no
    /// longer leads or cannot read the committed map (the recovery is then left to the
    /// leader).
    async fn committed_tablets(&self, crashed: ServerId) -> Option<Vec<Tablet>> {
        if !self.node.is_leader() {
            tracing::info!(%crashed, "no longer leader; recovery left to the new leader");
            return None;
        }
        if let Err(error) = self.node.read_barrier().await {
            tracing::info!(%crashed, %error, "committed map unreadable; recovery left to the leader");
            return None;
        }
        Some(self.node.with_state(|state| state.tablets_of(crashed)))
    }

    /// Tells every `Up` master that the recovery of `crashed` is over (`FinishRecovery`,
    /// with its tablet epoch as committed: read after the caller's barrier), so that it
    /// forgets what any attempt replayed there for nobody — a `Recover` whose reply and
    /// abandon were both lost, or one of a leader that died before it could abandon. A
    /// master answering `Retry` (catching up with its tablets) is asked again until
    /// [`CLEANUP_CALL_TIMEOUT`]; an unreachable one is not waited for (a dead master
    /// cut off by a whole-cluster restart is declared crashed within milliseconds, and
    /// then left out of the next round). A server that says it is not the one
    /// meant (`WrongServer`) is gone, with its memory; one of an older release
    /// (`UnknownOpcode`) is not waited for; one that does not answer is reported to the
    /// failure verifier (the rules are [`FinishRound`]'s). Masters that confirmed in an
    /// earlier round are not asked. Returns which masters did not confirm: the caller
    /// asks again, as the server is not removed before they do.
    async fn finish_on_masters(
        &self,
        crashed: ServerId,
        round: &mut FinishRound,
    ) -> Result<(), String> {
        let masters: Vec<(ServerInfo, TabletEpoch)> = self.node.with_state(|state| {
            state
                .up_servers()
                .into_iter()
                .filter(|s| s.services.master && s.id != crashed && round.to_ask(s.id))
                .map(|s| (s.clone(), state.tablet_epoch(s.id)))
                .collect()
        });
        let deadline = Instant::now() + CLEANUP_CALL_TIMEOUT;
        let calls = masters.iter().map(|(master, tablet_epoch)| async move {
            let request = FinishRecoveryRequest {
                owner: master.id,
                crashed,
                tablet_epoch: *tablet_epoch,
            };
            let result =
                push_while_busy::<FinishRecovery>(&self.pool, &master.addr, &request, deadline)
                    .await;
            (master.id, result)
        });
        for (master, result) in futures::future::join_all(calls).await {
            let answer = match result {
                Ok(()) => FinishAnswer::Confirmed,
                Err(error) if error.status() == Some(Status::WrongServer) => {
                    tracing::info!(%crashed, %master, "a new server listens at the master's address; nothing to finish there");
                    FinishAnswer::NewServer
                }
                Err(error) if error.status() == Some(Status::UnknownOpcode) => {
                    tracing::warn!(%crashed, %master, "master does not know FinishRecovery (an older release?); what it replayed for nobody stays until it restarts");
                    FinishAnswer::OlderRelease
                }
                Err(error) if error.is_transport() => FinishAnswer::Silent(error.to_string()),
                Err(error) => FinishAnswer::Failed(error.to_string()),
            };
            if round.answered(master, answer) {
                let _ = self.verifier.report_failure(master, "recovery");
            }
        }
        round.end_round(crashed)
    }

    /// Frees the replicas of a recovered server on every backup and removes it.
    async fn cleanup(&self, crashed: ServerId, declared: Instant) {
        let backups = self.backups(crashed);
        let deadline = Instant::now() + CLEANUP_CALL_TIMEOUT;
        let request = EndRecoveryRequest { master: crashed };
        let calls = backups.iter().map(|b| {
            let request = &request;
            async move {
                let result = self
                    .pool
                    .call::<EndRecovery>(&b.addr, request, deadline)
                    .await;
                (b.id, result)
            }
        });
        let mut freed = 0;
        for (backup, result) in futures::future::join_all(calls).await {
            match result {
                Ok(reply) => freed += reply.freed,
                Err(error) => {
                    tracing::warn!(%crashed, %backup, %error, "replicas of a recovered master not freed")
                }
            }
        }
        let command = Command::SetServerStatus {
            id: crashed,
            status: ServerStatus::Removed,
        };
        if let Err(error) = self.node.propose(command).await {
            tracing::warn!(%crashed, %error, "recovered server not marked removed");
            return;
        }
        self.verifier.forget_proof(crashed);
        let done = ms(declared.elapsed());
        self.report(crashed, |r| {
            r.done_ms = done;
            r.waiting = None;
        });
        tracing::info!(%crashed, freed, total_ms = done, "recovery finished");
    }

    /// Waits until the tablets of `crashed` (declared at `declared`) may go live
    /// elsewhere: its lease ran out, or its death was proven
    /// (`proof_of_death::lease_end` over the proofs the verifier holds, woken by a new
    /// one). The first partition to get here records which it was in the report.
    async fn wait_lease_end(&self, crashed: ServerId, declared: Instant) {
        loop {
            let found = self.verifier.proof_found();
            tokio::pin!(found);
            found.as_mut().enable();
            let proof = self.verifier.proof_of(crashed);
            let (at, end) = lease_end(declared, self.config.lease, proof);
            if end != LeaseEnd::Waited || Instant::now() >= at {
                let at_ms = ms(at.saturating_duration_since(declared));
                let mut first = false;
                self.report(crashed, |r| {
                    if r.lease_end.is_none() {
                        (r.lease_end, r.lease_end_ms, first) = (Some(end), at_ms, true);
                    }
                });
                if first {
                    tracing::info!(%crashed, lease_end = %end, lease_end_ms = at_ms, "tablets may go live");
                }
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = &mut found => {}
            }
        }
    }

    /// The `Up` backups, except `crashed`.
    fn backups(&self, crashed: ServerId) -> Vec<ServerInfo> {
        self.node.with_state(|state| {
            state
                .up_servers()
                .into_iter()
                .filter(|s| s.services.backup && s.id != crashed)
                .cloned()
                .collect()
        })
    }

    /// One attempt: setup, replay of every partition, tablets live as each finishes.
    /// Returns once every partition went live or was given up on this attempt.
    async fn attempt(
        &self,
        crashed: ServerId,
        owned: &[Tablet],
        declared: Instant,
    ) -> Result<(), Stop> {
        // Setup: fence and list.
        let backups = self.backups(crashed);
        let deadline = Instant::now() + SETUP_CALL_TIMEOUT;
        let request = StartRecoveryRequest { master: crashed };
        let calls = backups.iter().map(|b| {
            let request = &request;
            async move {
                self.pool
                    .call::<StartRecovery>(&b.addr, request, deadline)
                    .await
            }
        });
        let mut found = Vec::new();
        for (index, result) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            match result {
                Ok(reply) => found.extend(reply.replicas.into_iter().map(|replica| FoundReplica {
                    backup: index,
                    replica,
                })),
                Err(error) => {
                    // Said once per recovery: a waiting recovery asks again every
                    // SETUP_RETRY_PAUSE (its report says why it waits).
                    let waiting = self
                        .reports()
                        .iter()
                        .any(|r| r.crashed == crashed && r.waiting.is_some());
                    if waiting {
                        tracing::debug!(%crashed, backup = %backups[index].id, %error, "backup did not answer StartRecovery");
                    } else {
                        tracing::warn!(%crashed, backup = %backups[index].id, %error, "backup did not answer StartRecovery");
                    }
                }
            }
        }
        let allow_loss = self.node.with_state(|state| state.loss_allowed(crashed));
        let (floors, never_wrote) = self.node.with_state(|state| {
            (
                state.open_epochs(crashed),
                state.version_ceiling(crashed) == 0,
            )
        });
        let segments =
            check_log(&found, &floors, allow_loss, never_wrote).map_err(|incomplete| {
                Stop::Wait(format!(
                    "log of {crashed} incomplete ({} replicas found on {} backups): {}; waiting \
                 for the missing replicas, or run `rampart recovery allow-loss {}`",
                    found.len(),
                    backups.len(),
                    incomplete.why,
                    crashed.0
                ))
            })?;
        let speeds: Vec<u32> = backups.iter().map(|b| b.disk_read_mbps).collect();
        let plan = choose_sources_by_speed(&segments, &found, &floors, &speeds);
        let will = self.node.with_state(|state| state.will(crashed).cloned());
        let partitions = partitions_for(will.as_ref(), owned);

        // Recovery masters by free memory; none being drained (`state::drains`).
        let masters: Vec<ServerInfo> = self.node.with_state(|state| {
            state
                .up_servers()
                .into_iter()
                .filter(|s| s.services.master && s.id != crashed && !state.is_draining(s.id))
                .cloned()
                .collect()
        });
        let pings = masters.iter().map(|m| async move {
            let deadline = Instant::now() + self.config.verify_timeout;
            self.pool
                .call::<Ping>(&m.addr, &PingRequest {}, deadline)
                .await
        });
        let pinged = futures::future::join_all(pings).await;
        let mut live_masters: Vec<(ServerInfo, u64)> = Vec::new();
        for (master, ping) in masters.iter().cloned().zip(pinged) {
            if let Ok(ping) = ping {
                let free = ping.log_bytes_max.saturating_sub(ping.log_bytes_used);
                live_masters.push((master, free));
            }
        }
        // Partitions go to the `masters_max` with the most free memory; the others stay
        // candidates for a partition whose master fails (`replay_partition` tries the
        // next ones in this order).
        let live_masters = most_free(live_masters, |m| m.id);
        let chosen = self
            .config
            .masters_max
            .unwrap_or(usize::MAX)
            .clamp(1, live_masters.len().max(1));
        let capacities: Vec<(ServerId, u64)> = live_masters
            .iter()
            .take(chosen)
            .map(|(m, free)| (m.id, *free))
            .collect();
        // A small master's few large partitions, halved so every chosen master replays.
        let partitions = spread_over(partitions, capacities.len());
        let bytes: Vec<u64> = partitions.iter().map(|p| p.1).collect();
        let Some(assigned) = assign_partitions(&bytes, &capacities) else {
            return Err(Stop::Wait(format!(
                "no master is up to recover {crashed} on"
            )));
        };

        // Start the reads.
        let recovery = self.recovery_id();
        let partition_ranges: Vec<PartitionRanges> =
            partitions.iter().map(|p| p.0.clone()).collect();
        let reads = plan.reads.iter().map(|(&backup, segments)| {
            let request = RecoveryReadRequest {
                master: crashed,
                recovery,
                segments: segments.clone(),
                partitions: partition_ranges.clone(),
            };
            let addr = backups[backup].addr.clone();
            async move {
                if let Err(error) = self.pool.call::<RecoveryRead>(&addr, &request, deadline).await {
                    tracing::warn!(%crashed, %addr, %error, "backup did not start its recovery reads");
                }
            }
        });
        futures::future::join_all(reads).await;
        let sources: Vec<RecoverySource> = plan
            .sources
            .iter()
            .map(|(segment, holders)| RecoverySource {
                segment: *segment,
                backups: holders.iter().map(|&b| backups[b].addr.clone()).collect(),
            })
            .collect();
        let setup_ms = ms(declared.elapsed());
        self.report(crashed, |r| {
            r.setup_ms = setup_ms;
            r.segments = segments.len() as u64;
            r.waiting = None;
            r.partitions = (0..partitions.len())
                .map(|i| PartitionReport {
                    partition: i as u32,
                    master: ServerId(0),
                    live_ms: 0,
                    replay_ms: 0,
                    replay_start_ms: setup_ms,
                    bytes: 0,
                    objects: 0,
                    attempts: 0,
                })
                .collect();
        });
        tracing::info!(
            %crashed, recovery, segments = segments.len(), partitions = partitions.len(),
            masters = capacities.len(), backups = plan.reads.len(), setup_ms,
            "recovery setup done; replaying"
        );

        // Replay every partition, each going live as soon as it is done.
        let candidates: Vec<(ServerId, String)> = live_masters
            .iter()
            .map(|(m, _)| (m.id, m.addr.clone()))
            .collect();
        let jobs = partition_ranges.into_iter().enumerate().map(|(i, ranges)| {
            let first = assigned[i];
            let candidates = &candidates;
            let sources = &sources;
            async move {
                self.replay_partition(
                    crashed, recovery, i as u32, ranges, sources, candidates, first, declared,
                )
                .await
            }
        });
        let results = futures::future::join_all(jobs).await;
        if results.iter().any(|r| matches!(r, Err(Stop::Leadership))) {
            return Err(Stop::Leadership);
        }
        Ok(())
    }

    /// A recovery id unique across leaders: the term in the high half (terms grow with
    /// every election), a count of this leader's attempts in the low half.
    fn recovery_id(&self) -> u64 {
        let term = self.node.status().term;
        let mut inner = self.inner.lock();
        inner.attempts += 1;
        (term << 32) | (inner.attempts & 0xffff_ffff)
    }

    /// Replays one partition on `candidates[first]`, then on the others in turn if it
    /// fails, and puts it live. Gives up (for this attempt) after
    /// [`PARTITION_ATTEMPTS_MAX`] masters.
    #[allow(clippy::too_many_arguments)]
    async fn replay_partition(
        &self,
        crashed: ServerId,
        recovery: u64,
        partition: u32,
        ranges: PartitionRanges,
        sources: &[RecoverySource],
        candidates: &[(ServerId, String)],
        first: usize,
        declared: Instant,
    ) -> Result<(), Stop> {
        // With loss allowed, replayed versions are shifted above every version the
        // crashed master handed out (`RecoverRequest::version_floor`).
        let version_floor = self.node.with_state(|state| {
            if state.loss_allowed(crashed) {
                state.version_ceiling(crashed)
            } else {
                0
            }
        });
        let request = RecoverRequest {
            crashed,
            recovery,
            partition,
            ranges: ranges.clone(),
            segments: sources.to_vec(),
            version_floor,
        };
        let mut tries =
            PartitionTries::new(first, candidates.len(), PARTITION_ATTEMPTS_MAX as usize);
        let mut replayed: Option<RecoverReply> = None;
        let mut step = tries.start(self.node.is_leader());
        loop {
            let current = tries.current().and_then(|index| candidates.get(index));
            step = match (step, current) {
                (PartitionNext::Recover(_), Some((master, addr))) => {
                    let started = ms(declared.elapsed());
                    self.report(crashed, |r| {
                        if let Some(p) = r.partitions.get_mut(partition as usize) {
                            p.master = *master;
                            p.attempts += 1;
                            p.replay_start_ms = started;
                        }
                    });
                    let deadline = Instant::now() + RECOVER_TIMEOUT;
                    match self.pool.call::<Recover>(addr, &request, deadline).await {
                        Ok(_)
                            if tries.first_try()
                                && failpoints::active(
                                    failpoints::LOSE_RECOVER_REPLY_AND_ABANDON,
                                ) =>
                        {
                            tracing::warn!(%crashed, partition, %master, "failpoint: the Recover reply and its abandon are lost; trying another master");
                            tries.failed(true, self.node.is_leader()).1
                        }
                        Ok(reply) => {
                            replayed = Some(reply);
                            tries.replayed()
                        }
                        Err(error) => {
                            tracing::warn!(%crashed, partition, %master, %error, "recovery master failed; trying another");
                            let answered = error.status().is_some();
                            let (abandon_on, next) = tries.failed(answered, self.node.is_leader());
                            if let Some((_, addr)) = abandon_on.and_then(|i| candidates.get(i)) {
                                // In the background: the next master starts now rather
                                // than after a dead one's `CLEANUP_CALL_TIMEOUT`.
                                let (pool, addr) = (Arc::clone(&self.pool), addr.clone());
                                let ranges = ranges.clone();
                                tokio::spawn(async move {
                                    abandon(&pool, &addr, crashed, recovery, ranges).await;
                                });
                            }
                            next
                        }
                    }
                }
                (PartitionNext::Commit, Some((master, addr))) => {
                    // Not before every lease of the crashed master has lapsed, or its
                    // death is proven.
                    self.wait_lease_end(crashed, declared).await;
                    let command = Command::RecoveredPartition {
                        crashed,
                        ranges: ranges.clone(),
                        owner: *master,
                    };
                    let mut outcome = self.node.propose(command).await;
                    if matches!(outcome, Ok(CommandResult::PartitionRecovered { .. }))
                        && failpoints::active(failpoints::RECOVERED_OUTCOME_UNKNOWN)
                    {
                        outcome = Err(NodeError::OutcomeUnknown);
                    }
                    let commit = match outcome {
                        Ok(CommandResult::PartitionRecovered { tablets, epoch }) => {
                            if !failpoints::active(failpoints::LOSE_RECOVERED_PUSH) {
                                self.push_tablets(*master, addr, tablets, epoch).await;
                            }
                            Commit::Committed
                        }
                        Err(error @ NodeError::NotLeader(_))
                        | Err(error @ NodeError::Stopped(_)) => {
                            tracing::info!(%crashed, partition, %error, "partition outcome left to the next leader");
                            Commit::LeadershipLost
                        }
                        Ok(CommandResult::Rejected { detail, .. }) => {
                            tracing::info!(%crashed, partition, %master, why = %detail, "partition refused; outcome read from the committed map");
                            Commit::Rejected
                        }
                        other => {
                            let why = match &other {
                                Ok(result) => format!("unexpected result {result:?}"),
                                Err(error) => error.to_string(),
                            };
                            tracing::info!(%crashed, partition, %master, %why, "partition outcome read from the committed map");
                            Commit::Unknown
                        }
                    };
                    tries.committed(commit)
                }
                (PartitionNext::Settle, Some((master, addr))) => {
                    let all_owned = self
                        .settle(crashed, recovery, &ranges, *master, addr)
                        .await
                        .ok();
                    let next = tries.settled(all_owned, self.node.is_leader());
                    if matches!(next, PartitionNext::Recover(_)) {
                        tracing::warn!(%crashed, partition, %master, "partition not committed; trying another master");
                    }
                    next
                }
                (PartitionNext::Live, Some((master, _))) => {
                    let reply = replayed.take().unwrap_or_default();
                    let live = ms(declared.elapsed());
                    self.report(crashed, |r| {
                        if let Some(p) = r.partitions.get_mut(partition as usize) {
                            p.live_ms = live;
                            p.replay_ms = u64::from(reply.replay_ms);
                            p.bytes = reply.bytes;
                            p.objects = reply.objects;
                        }
                    });
                    tracing::info!(
                        %crashed, partition, %master, objects = reply.objects, bytes = reply.bytes,
                        replay_ms = reply.replay_ms, live_ms = live, fallbacks = reply.fallbacks,
                        "partition live"
                    );
                    return Ok(());
                }
                (PartitionNext::Stop, _) => return Err(Stop::Leadership),
                // Done, or (never) a step naming no candidate.
                _ => return Ok(()),
            };
        }
    }

    /// Settles a `RecoveredPartition` whose commit the driver did not see, from the
    /// committed map (after a read barrier): the parts of `ranges` that `master` owns
    /// there are its — this attempt or an earlier one committed them — and it is told to
    /// catch up with its tablets; it is told to forget what it replayed of the rest.
    /// Returns whether all of `ranges` is `master`'s. Leaves everything as it is, and
    /// stops the attempt, when the map cannot be read (leadership lost).
    async fn settle(
        &self,
        crashed: ServerId,
        recovery: u64,
        ranges: &PartitionRanges,
        master: ServerId,
        addr: &str,
    ) -> Result<bool, Stop> {
        if let Err(error) = self.node.read_barrier().await {
            tracing::info!(%crashed, %master, %error, "committed map unreadable; partition left as it is");
            return Err(Stop::Leadership);
        }
        let (owned, other, epoch) = self.node.with_state(|state| {
            let (owned, other) = state.split_by_owner(ranges, master);
            (owned, other, state.tablet_epoch(master))
        });
        if !owned.is_empty() {
            // Before the abandon below: a master forgets only ranges it does not serve.
            self.sync_owner(master, addr, epoch).await;
        }
        if !other.is_empty() {
            abandon(&self.pool, addr, crashed, recovery, other.clone()).await;
        }
        Ok(other.is_empty())
    }

    /// Tells the new owner to serve its recovered tablets, retrying until
    /// [`CLEANUP_CALL_TIMEOUT`]. If it cannot be told, it finds out at its next lease
    /// renewal (which reports its tablet epoch); if it is dead, its own recovery takes
    /// the tablets over.
    async fn push_tablets(
        &self,
        owner: ServerId,
        addr: &str,
        tablets: Vec<Tablet>,
        epoch: TabletEpoch,
    ) {
        let request = TabletsRequest {
            owner,
            epoch,
            tablets,
        };
        self.tell::<TakeTablets>(owner, addr, &request).await;
    }

    /// Asks `owner` to catch up with its tablets, up to tablet epoch `epoch`; best effort,
    /// as [`push_tablets`](Self::push_tablets).
    async fn sync_owner(&self, owner: ServerId, addr: &str, epoch: TabletEpoch) {
        let request = SyncTabletsRequest { owner, epoch };
        self.tell::<SyncTablets>(owner, addr, &request).await;
    }

    /// Calls `R` on `owner` at `addr`, retrying until [`CLEANUP_CALL_TIMEOUT`]; failures
    /// are logged (the owner converges at its next lease renewal).
    async fn tell<R: Rpc<Reply = ()>>(&self, owner: ServerId, addr: &str, request: &R::Request) {
        let deadline = Instant::now() + CLEANUP_CALL_TIMEOUT;
        if let Err(error) = push_until::<R>(&self.pool, addr, request, deadline).await {
            tracing::warn!(%owner, %error, "owner not told of its recovered tablets; it catches up at its next lease renewal");
        }
    }
}

/// Why an attempt stopped short.
#[derive(Debug)]
enum Stop {
    /// This coordinator no longer leads.
    Leadership,
    /// Setup cannot proceed yet (the reason).
    Wait(String),
}
