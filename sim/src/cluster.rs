//! `Cluster`: one seed's run over several masters — a table's tablets spread over them
//! by the coordinators' real `CreateTable`, a workload of batches each sent to one
//! master, client reads between batches checked against the [`History`], and every
//! crash recovered into the surviving masters (or a spare) the way the coordinator
//! does it: the crashed master's partitions from the real `partitions_for`, each
//! replayed by one recovery master (the real `split_replica`, `RecoveryPiece::parse`
//! and `ObjectStore::stage_replay`, replicated to the recovery master's own backups
//! under the same faults), then handed over by the real `RecoveredPartition` command
//! once the crashed master's lease surely ran out (the coordinator's own
//! `tablets_live_after`). After each recovery, and at the end, every key is read from the
//! master the coordinators name as its owner: every tablet must be served again, by a
//! live master, with nothing acknowledged missing.
//!
//! # Leases and zombies
//! Each master holds the real `Lease` on simulated time, renewed at the coordinators
//! between batches; it takes writes and serves reads only while it holds it. A zombie
//! (declared crashed while running) was cut off from the coordinators for a while: its
//! renewals are lost and its lease runs on until it lapses, or until a renewal gets
//! through, is refused and the master exits. Meanwhile clients with a stale tablet map
//! still send it batches and reads — before its tablets went elsewhere and after — and
//! its recovery runs beside it: a killed master is recovered at once, a zombie's
//! recovery goes on at every call any master makes and hands the tablets over once it
//! has read the log, whether the zombie still runs or not. A read the zombie serves
//! must still never be older than one read or acknowledged elsewhere.
//!
//! # Abandoned attempts
//! A partition goes to recovery masters in turn, as the coordinator's `PartitionTries`
//! sends it: from one drawn among the masters listed Up, to the next, up to
//! `PARTITION_ATTEMPTS_MAX` of them, then again from a new draw (the coordinator's next
//! attempt), so that with one candidate the same master tries again later. A try fails
//! when the coordinator gives up on it after part of the replay (`SimConfig::abandon_p`:
//! the answer came too late or was lost, and the master is told to abandon) or when the
//! master refuses the replay (`stage_replay` answers `NoSpace` while segments of an
//! earlier abandoned attempt are still in its log); either way the master forgets what
//! it replayed and cleans it out of its log ([`SimMaster::recover`]). The real
//! coordinator tells an unanswering master to abandon in the background while the next
//! one starts; here the forget comes first. A recovery master keeps serving its own
//! clients meanwhile: between two pieces of a replay, and after a failed try, a batch
//! of theirs may come in (`SimConfig::serve_during_replay_p`), so an abandoned attempt's
//! entries share segments with long-lived data. A master that takes a partition it
//! failed a try of may be killed soon after (`SimConfig::kill_holder_p`): its recovery
//! then reads whatever of that try is still in its log.
//!
//! One crash is handled at a time; the recovery masters do not crash while they replay
//! (a recovery master that dies mid-partition is not simulated yet: it is a second crash
//! during a recovery).

use rampart_common::ids::{key_hash, ClientId, ServerId, TableId};
use rampart_common::protocol::backup::PartitionRanges;
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;
use rampart_common::tablet::ServerStatus;
use rampart_coordinator::proof_of_death::lease_end;
use rampart_coordinator::recovery_manager::PARTITION_ATTEMPTS_MAX;
use rampart_coordinator::recovery_plan::{partitions_for, spread_over};
use rampart_coordinator::state::{Command, CommandResult};
use rampart_master::replay::RecoveryPiece;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::checker::{key_bytes, History};
use crate::crash_recovery::Recovery;
use crate::master::{ClientWrite, Pending, Recovered, SimMaster};
use crate::workload::{Draw, Workload};
use crate::world::{Crash, Stop, World, LEASE_US};

/// Of client reads, the share sent to a master drawn at random (a stale tablet map).
const STALE_READ_P: f64 = 0.3;

/// Steps after which a recovery that neither ends nor fails is reported stuck.
const RECOVERY_STEPS_MAX: usize = 200_000;

/// Tries of one partition that are abandoned, at most: every abandon is a random fault,
/// and a real recovery retries until one try succeeds.
const ABANDONS_PER_PARTITION_MAX: usize = 3;

/// Rounds of tries of one partition (each over up to `PARTITION_ATTEMPTS_MAX` masters)
/// after which a partition never replayed is reported: the abandons are bounded, and a
/// refusal lasts only until the cleaner took the abandoned attempt's segments.
const PARTITION_ROUNDS_MAX: usize = 20;

/// The masters of a run and what their clients were told.
#[derive(Debug)]
pub struct Cluster {
    pub masters: Vec<SimMaster>,
    pub history: History,
    table: TableId,
    /// How each crash came about, in order.
    pub crashes: Vec<Crash>,
    /// Partitions replayed by recovery masters.
    pub partitions_recovered: usize,
    /// Client writes of unknown outcome, retried with their identities.
    pending: Vec<Pending>,
    /// The number of the client's next write (its writes' `Rifl::seq`).
    next_seq: u64,
    /// Retries answered (from a completion record or by applying then).
    pub retries_answered: usize,
    /// Of them, those answered from a completion record.
    pub retries_from_record: usize,
    /// What the next batches write and remove.
    workload: Workload,
    /// Tries of a partition that failed on a recovery master: abandoned by the
    /// coordinator, or refused by the master.
    pub partition_tries_failed: usize,
    /// Batches recovery masters' clients wrote while they recovered
    /// (`SimConfig::serve_during_replay_p`).
    batches_served: usize,
    /// Masters that own a partition they failed a try of before
    /// (`SimConfig::kill_holder_p`).
    holders: BTreeSet<ServerId>,
}

/// Gives `ops` their exactly-once identities ([`Cluster::identify`]): the next numbers
/// from `next_seq`, acknowledging every number below the oldest of `pending`.
fn identify(pending: &[Pending], next_seq: &mut u64, ops: Vec<Draw>) -> Vec<ClientWrite> {
    let ack = pending
        .iter()
        .map(|p| p.write.rifl.seq - 1)
        .min()
        .unwrap_or(*next_seq - 1);
    ops.into_iter()
        .map(|(key, value)| {
            let seq = *next_seq;
            *next_seq += 1;
            ClientWrite {
                key,
                value,
                rifl: Rifl {
                    client: WRITER,
                    seq,
                    ack,
                },
            }
        })
        .collect()
}

/// Most tablets the splitting world splits the table into (`SimConfig::split_p`).
const SPLIT_TABLETS_MAX: usize = 8;

/// The client id of every write of the run (one client: its numbers order its writes).
pub const WRITER: ClientId = ClientId(1);

impl Cluster {
    /// The world's masters, serving one table of `SimConfig::tablets` tablets spread
    /// over them by the coordinators. Nothing is replicated yet ([`Cluster::run`]).
    pub fn new(world: &mut World) -> Result<Cluster, String> {
        let result = world.coordinator.apply(&Command::CreateTable {
            name: "sim".to_string(),
            span: world.config.tablets,
        });
        let CommandResult::TableCreated {
            id: table, tablets, ..
        } = result
        else {
            return Err(format!("CreateTable: {result:?}"));
        };
        world.note(format!("table {table}: {tablets:?}"));
        let (segment_bytes, replicas) = (world.config.segment_bytes, world.config.replicas);
        let masters = world
            .masters
            .iter()
            .map(|&id| {
                let clock = world.clock.clone();
                let mut master = SimMaster::new(id, table, (segment_bytes, replicas), clock);
                let own: Vec<_> = tablets.iter().filter(|t| t.owner == id).copied().collect();
                master.take_tablets(&own, 0);
                master
            })
            .collect();
        Ok(Cluster {
            masters,
            history: History::default(),
            table,
            crashes: Vec::new(),
            partitions_recovered: 0,
            pending: Vec::new(),
            next_seq: 1,
            retries_answered: 0,
            retries_from_record: 0,
            workload: Workload::new(&world.config),
            partition_tries_failed: 0,
            batches_served: 0,
            holders: BTreeSet::new(),
        })
    }

    /// Runs the workload, recovering every crash, then crashes one more master if none
    /// crashed, and checks every key at its owner. The first violation, described.
    pub fn run(&mut self, world: &mut World) -> Result<(), String> {
        for i in 0..self.masters.len() {
            self.act(world, i, |master, world, _| master.start(world))?;
            self.recover_stopped(world)?;
        }
        for batch in 0..world.config.batches {
            for master in &mut self.masters {
                master.renew_lease(world);
            }
            self.maybe_kill_idle(world);
            self.recover_stopped(world)?;
            if world.config.split_p > 0.0 && world.chance(world.config.split_p) {
                self.split_a_tablet(world);
            }
            let Some(target) = self.target(world) else {
                // Every lease lapsed (no coordinator leader for longer than a lease):
                // clients wait.
                world.note("no master takes writes");
                world.wait(10_000);
                continue;
            };
            let ops = self.draw_ops(world, target, batch);
            let ops = self.identify(ops);
            if !ops.is_empty() {
                let cleaning = world.draw_cleaning();
                let mut pending = Vec::new();
                let done = self.act(world, target, |master, world, history| {
                    master.write_batch(world, &ops, history, &mut pending)?;
                    master.clean(world, cleaning)?;
                    master.tick(world)
                });
                self.pending.extend(pending);
                done?;
            }
            self.recover_stopped(world)?;
            self.retry_pending(world)?;
            for _ in 0..world.config.reads_per_batch {
                let key = world.draw(0..world.config.key_count());
                self.client_read(world, key)?;
            }
        }
        match world.crashed {
            // A zombie still running stops with the workload.
            Some((id, _)) => {
                if let Some(master) = self.masters.iter_mut().find(|m| m.id == id) {
                    master.stopped.get_or_insert(Stop::Killed);
                }
            }
            // Every run recovers at least one crash.
            None if self.crashes.is_empty() => self.kill_one(world),
            None => {}
        }
        self.recover_stopped(world)?;
        self.retry_pending(world)?;
        self.check_every_key(world)?;
        self.history.check_linearizable()
    }

    /// Gives the client's writes their exactly-once identities: the next numbers, and
    /// the acknowledgement of every number below the oldest whose outcome it has not
    /// learned.
    fn identify(&mut self, ops: Vec<Draw>) -> Vec<ClientWrite> {
        identify(&self.pending, &mut self.next_seq, ops)
    }

    /// Retries the writes of unknown outcome, each on the master that serves its key
    /// now (when it takes writes), as a client does once the tablet map names it: a
    /// write that applied before — on the crashed master, replayed here with its
    /// completion record — must be answered from the record, not applied again.
    fn retry_pending(&mut self, world: &mut World) -> Result<(), String> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut by_owner: BTreeMap<usize, Vec<Pending>> = BTreeMap::new();
        for op in std::mem::take(&mut self.pending) {
            match self.owner(world, op.write.key) {
                Some(i) if self.masters[i].takes_writes() => {
                    by_owner.entry(i).or_default().push(op)
                }
                _ => self.pending.push(op),
            }
        }
        for (i, ops) in by_owner {
            let (mut again, mut from_record) = (Vec::new(), 0);
            let done = self.act(world, i, |master, world, history| {
                master.retry_batch(world, &ops, history, &mut again, &mut from_record)
            });
            self.retries_answered += ops.len() - again.len();
            self.retries_from_record += from_record;
            self.pending.extend(again);
            done?;
            self.recover_stopped(world)?;
        }
        Ok(())
    }

    /// Objects the live masters serve.
    pub fn objects(&self, world: &World) -> usize {
        (0..world.config.key_count())
            .filter(|&key| {
                self.owner(world, key)
                    .and_then(|i| self.masters[i].read(key).ok())
                    .is_some_and(|state| state.is_some())
            })
            .count()
    }

    /// Runs `f` on master `i` as the active master; a stop is recorded (a master that
    /// stopped itself while not declared crashed is a violation).
    fn act(
        &mut self,
        world: &mut World,
        i: usize,
        f: impl FnOnce(&mut SimMaster, &mut World, &mut History) -> Result<(), Stop>,
    ) -> Result<(), String> {
        let master = &mut self.masters[i];
        world.active = master.id;
        let Err(stop) = f(master, world, &mut self.history) else {
            return Ok(());
        };
        world.note(format!("master {} stopped: {stop:?}", master.id));
        // Declared crashed: its recovery is pending, or done while it runs on.
        let declared = !is_up(world, master.id);
        if let Stop::Fatal(why) = &stop {
            if !declared {
                return Err(format!("live master {} stopped itself: {why}", master.id));
            }
        }
        master.stopped = Some(stop);
        Ok(())
    }

    /// Between batches a master may be killed while idle: sometimes one that owns a
    /// partition it had abandoned a try of (`SimConfig::kill_holder_p`), else any.
    fn maybe_kill_idle(&mut self, world: &mut World) {
        let p = world.config.kill_holder_p;
        if p > 0.0 && world.may_crash() && !self.holders.is_empty() && world.chance(p) {
            let holders = std::mem::take(&mut self.holders);
            self.kill_among(world, |id| holders.contains(&id));
            return;
        }
        if world.may_crash() && world.chance(world.config.master_crash_p * 4.0) {
            self.kill_one(world);
        }
    }

    /// Splits the tablet holding a hash drawn at random, as `rampart tablet split` does:
    /// the coordinators commit it (the real `CoordinatorState`), then the owner pulls
    /// its whole tablet set (`SyncTablets`, applied by the real `ObjectStore`), unless
    /// the push is lost and the owner serves the tablet whole until a later change.
    ///
    /// At most [`SPLIT_TABLETS_MAX`] tablets: the simulation has no wills, so each
    /// tablet is a partition of its own in a recovery, and dozens of partitions, each
    /// abandoned and tried again (`SimConfig::abandon_p`), fill the bounded backups
    /// with the attempts' segments (4 of 200 seeds, uncapped: writes wait for backups
    /// for good). A real recovery groups a master's tablets into partitions by size.
    fn split_a_tablet(&mut self, world: &mut World) {
        let tablets = world
            .coordinator
            .table(self.table)
            .map_or(0, |table| table.tablets.len());
        if tablets >= SPLIT_TABLETS_MAX {
            return;
        }
        let at = world.draw(1..u64::MAX);
        let result = world.coordinator.apply(&Command::SplitTablet {
            table: self.table,
            at,
        });
        let CommandResult::TabletSplit {
            split: true,
            epochs,
            tablets,
        } = result
        else {
            world.note(format!("no split at {at:#x}: {result:?}"));
            return;
        };
        world.note(format!("split at {at:#x}: {tablets:?}"));
        if world.chance(0.25) {
            world.note("the split's push is lost");
            return;
        }
        for (owner, epoch) in epochs {
            let owned = world.coordinator.tablets_of(owner);
            if let Some(master) = self
                .masters
                .iter_mut()
                .find(|m| m.id == owner && m.running())
            {
                master.sync_tablets(epoch, &owned);
            }
        }
    }

    /// Kills a running master listed Up, drawn at random, while it is idle.
    fn kill_one(&mut self, world: &mut World) {
        self.kill_among(world, |_| true);
    }

    /// Kills a running master listed Up that `among` accepts, drawn at random, while it
    /// is idle.
    fn kill_among(&mut self, world: &mut World, among: impl Fn(ServerId) -> bool) {
        let running: Vec<usize> = (0..self.masters.len())
            .filter(|&i| self.masters[i].running() && is_up(world, self.masters[i].id))
            .filter(|&i| among(self.masters[i].id))
            .collect();
        if running.is_empty() {
            return;
        }
        let i = running[world.draw(0..running.len() as u64) as usize];
        let id = self.masters[i].id;
        world.declare_crashed(id, Crash::Killed);
        self.masters[i].stopped = Some(Stop::Killed);
    }

    /// The master the next batch goes to: sometimes a zombie while it serves (clients
    /// with a stale tablet map), else a master listed Up that takes writes.
    fn target(&mut self, world: &mut World) -> Option<usize> {
        // Clients with a stale map still reach a zombie, before its tablets went
        // elsewhere and after.
        let zombies: Vec<usize> = (0..self.masters.len())
            .filter(|&i| self.masters[i].takes_writes() && !is_up(world, self.masters[i].id))
            .collect();
        if !zombies.is_empty() && world.chance(STALE_READ_P) {
            return Some(zombies[world.draw(0..zombies.len() as u64) as usize]);
        }
        let up: Vec<usize> = (0..self.masters.len())
            .filter(|&i| self.masters[i].takes_writes() && is_up(world, self.masters[i].id))
            .collect();
        if up.is_empty() {
            return None;
        }
        Some(up[world.draw(0..up.len() as u64) as usize])
    }

    /// A batch of writes and removes of keys master `target` serves ([`Workload`]).
    fn draw_ops(&mut self, world: &mut World, target: usize, batch: usize) -> Vec<Draw> {
        let master = &self.masters[target];
        let busy: BTreeSet<u64> = self.pending.iter().map(|p| p.write.key).collect();
        self.workload
            .draw_batch(world, |key| master.owns(key), &busy, batch)
    }

    /// The crashed master, once it stopped, is recovered: its recovery runs to its
    /// end, each of its partitions is replayed by a recovery master and handed over,
    /// and every key is read back from its owner.
    fn recover_stopped(&mut self, world: &mut World) -> Result<(), String> {
        let Some((crashed, how)) = world.crashed else {
            return Ok(());
        };
        let zombie_writes = self
            .masters
            .iter()
            .any(|m| m.id == crashed && m.takes_writes());
        let read_all = world.recovery.as_ref().is_some_and(Recovery::read_all);
        if zombie_writes && !read_all {
            // The recovery runs beside the zombie until it has read the log.
            return Ok(());
        }
        let Some(mut recovery) = world.recovery.take() else {
            return Err(format!("crashed master {crashed} has no recovery"));
        };
        let mut steps = 0;
        while !recovery.ended() {
            steps += 1;
            if steps > RECOVERY_STEPS_MAX {
                return Err(format!("the recovery of {crashed} never ended"));
            }
            world.pass_time();
            recovery.advance(&mut world.reach());
        }
        if let Some(why) = recovery.failure() {
            return Err(format!("recovery of {crashed} failed: {why}"));
        }
        // The crashed master's lease must have run out before its tablets go live
        // elsewhere, or its death be proven (the coordinator's `lease_end`): until
        // then a zombie may still serve reads.
        let (live_after, why) = lease_end(
            Duration::from_micros(world.declared_at_us),
            Duration::from_micros(LEASE_US),
            world.proofs.of(crashed),
        );
        let live_after = live_after.as_micros() as u64;
        world.note(format!(
            "{crashed}'s tablets may go live at {live_after} µs: {why}"
        ));
        while world.now_us < live_after {
            world.pass_time();
        }
        world.crash_allowed = false;
        let owned = world.coordinator.tablets_of(crashed);
        // As the coordinator does: the will's partitions, halved while masters would idle
        // (never, at the simulation's sizes: none reaches 2 × `SPLIT_BYTES_MIN`).
        let masters = world
            .coordinator
            .up_servers()
            .iter()
            .filter(|s| s.services.master && s.id != crashed)
            .count();
        let partitions = spread_over(
            partitions_for(world.coordinator.will(crashed), &owned),
            masters,
        );
        let mut waiting = VecDeque::new();
        for (ranges, _) in partitions {
            let pieces = recovery.pieces(&ranges)?;
            waiting.push_back(PartitionTries::new(ranges, pieces));
        }
        while let Some(mut partition) = waiting.pop_front() {
            let Some(i) = self.try_partition(world, crashed, &mut partition)? else {
                // Tried again once the others had their try.
                waiting.push_back(partition);
                continue;
            };
            let (ranges, owner) = (partition.ranges, self.masters[i].id);
            let result = world.coordinator.apply(&Command::RecoveredPartition {
                crashed,
                ranges: ranges.clone(),
                owner,
            });
            let CommandResult::PartitionRecovered { tablets, .. } = result else {
                return Err(format!(
                    "RecoveredPartition {ranges:?} to {owner}: {result:?}"
                ));
            };
            world.note(format!("{owner} took {tablets:?} of {crashed}"));
            if partition.failed_on.contains(&owner) {
                // Its log may still hold what it replayed of it before.
                self.holders.insert(owner);
            }
            let ceiling = world.coordinator.version_ceiling(owner);
            self.masters[i].take_tablets(&tablets, ceiling);
            self.partitions_recovered += 1;
        }
        world.crash_allowed = true;
        world.crashed = None;
        self.crashes.push(how);
        self.check_every_key(world)
    }

    /// The next try of `partition` of `crashed` (module doc, "Abandoned attempts"): the
    /// recovery master that replayed it all, or `None` if this try failed.
    fn try_partition(
        &mut self,
        world: &mut World,
        crashed: ServerId,
        partition: &mut PartitionTries,
    ) -> Result<Option<usize>, String> {
        let tries = partition
            .candidates
            .len()
            .min(PARTITION_ATTEMPTS_MAX as usize);
        if partition.tried >= tries {
            if partition.rounds >= PARTITION_ROUNDS_MAX {
                return Err(format!(
                    "partition {:?} of {crashed} never replayed in {PARTITION_ROUNDS_MAX} rounds",
                    partition.ranges
                ));
            }
            partition.rounds += 1;
            (partition.candidates, partition.first) = self.recovery_masters(world, crashed)?;
            partition.tried = 0;
        }
        let candidates = &partition.candidates;
        let i = candidates[(partition.first + partition.tried) % candidates.len()];
        partition.tried += 1;
        let pieces = &partition.pieces;
        let abandon_after = (partition.abandons < ABANDONS_PER_PARTITION_MAX
            && world.config.abandon_p > 0.0
            && world.chance(world.config.abandon_p))
        .then(|| world.draw(0..pieces.len() as u64 + 1) as usize);
        let (master, ranges) = (&mut self.masters[i], &partition.ranges);
        world.active = master.id;
        // Its own clients' batches, while it recovers: drawn and identified as the
        // workload's, numbered after the workload's batches.
        let (workload, history) = (&mut self.workload, &mut self.history);
        let (pending, next_seq) = (&mut self.pending, &mut self.next_seq);
        let served = &mut self.batches_served;
        let mut serve = |master: &mut SimMaster, world: &mut World| -> Result<(), Stop> {
            let busy: BTreeSet<u64> = pending.iter().map(|p| p.write.key).collect();
            let batch = world.config.batches + *served;
            *served += 1;
            let ops = workload.draw_batch(world, |key| master.owns(key), &busy, batch);
            let ops = identify(pending, next_seq, ops);
            if ops.is_empty() {
                return Ok(());
            }
            world.note(format!("{} serves a batch while it recovers", master.id));
            match master.write_batch(world, &ops, history, pending) {
                // Its log is full: its later batches are refused, the replay goes on.
                Err(Stop::LogFull) => {
                    master.stopped = Some(Stop::LogFull);
                    Ok(())
                }
                done => done,
            }
        };
        match master.recover(world, ranges, pieces, abandon_after, &mut serve) {
            Ok(Recovered::Replayed) => Ok(Some(i)),
            Ok(Recovered::Failed(why)) => {
                partition.failed_on.insert(master.id);
                world.note(format!(
                    "{}: partition {ranges:?} of {crashed} failed: {why}",
                    master.id
                ));
                partition.abandons += usize::from(abandon_after.is_some());
                self.partition_tries_failed += 1;
                Ok(None)
            }
            Err(stop) => Err(format!(
                "recovery master {} failed replaying {ranges:?}: {stop:?}",
                master.id
            )),
        }
    }

    /// Masters to replay a partition of `crashed` on, and the one to try first: those
    /// listed Up that take writes, else a spare enlisted and started for it.
    fn recovery_masters(
        &mut self,
        world: &mut World,
        crashed: ServerId,
    ) -> Result<(Vec<usize>, usize), String> {
        let up: Vec<usize> = (0..self.masters.len())
            .filter(|&i| {
                let m = &self.masters[i];
                m.id != crashed && m.writable() && is_up(world, m.id)
            })
            .collect();
        if !up.is_empty() {
            let first = world.draw(0..up.len() as u64) as usize;
            return Ok((up, first));
        }
        let id = world.enlist_master();
        let shape = (world.config.segment_bytes, world.config.replicas);
        let mut spare = SimMaster::new(id, self.table, shape, world.clock.clone());
        world.active = id;
        spare
            .start(world)
            .map_err(|stop| format!("spare master {id} did not start: {stop:?}"))?;
        self.masters.push(spare);
        Ok((vec![self.masters.len() - 1], 0))
    }

    /// The master the coordinators name as the owner of `key`, if it is running (a
    /// zombie included: the map names it until its tablets are recovered).
    fn owner(&self, world: &World, key: u64) -> Option<usize> {
        let hash = key_hash(&key_bytes(key)).0;
        let tablet = world
            .coordinator
            .table(self.table)?
            .tablets
            .iter()
            .find(|t| t.start_hash <= hash && hash <= t.end_hash)?;
        self.masters
            .iter()
            .position(|m| m.id == tablet.owner && m.running())
    }

    /// A client reads `key` and checks what it got: mostly from the owner the
    /// coordinators name, sometimes from a zombie or any running master (a client whose
    /// tablet map is stale: a zombie still serves its old tablets while its lease
    /// holds). A master
    /// without its lease, or one that does not own the key, answers nothing to check
    /// (the client retries).
    fn client_read(&mut self, world: &mut World, key: u64) -> Result<(), String> {
        let target = if world.chance(STALE_READ_P) {
            // A zombie if there is one (where a stale map hurts), else any master.
            let running = |zombie: bool| -> Vec<usize> {
                (0..self.masters.len())
                    .filter(|&i| self.masters[i].running())
                    .filter(|&i| !zombie || !is_up(world, self.masters[i].id))
                    .collect()
            };
            let zombies = running(true);
            let candidates = if zombies.is_empty() {
                running(false)
            } else {
                zombies
            };
            if candidates.is_empty() {
                return Ok(());
            }
            Some(candidates[world.draw(0..candidates.len() as u64) as usize])
        } else {
            self.owner(world, key)
        };
        let Some(i) = target else {
            return Ok(());
        };
        let master = &self.masters[i];
        if !master.serves() {
            return Ok(());
        }
        match master.read(key) {
            Ok(state) => {
                self.history.record_read(key, &state, world.now_us);
                self.history
                    .check_read(key, &state)
                    .map_err(|why| format!("read at {}: {why}", master.id))
            }
            Err(Status::UnknownTablet) => Ok(()),
            Err(status) => Err(format!("key {key}: read at {}: {status:?}", master.id)),
        }
    }

    /// Every key is served by the live master the coordinators name, with nothing
    /// acknowledged missing (read from its store: a lease lapsed in a window without
    /// a coordinator leader is a pause, not a loss).
    fn check_every_key(&mut self, world: &mut World) -> Result<(), String> {
        if world.crashed.is_some() {
            return Ok(());
        }
        for key in 0..world.config.key_count() {
            let Some(i) = self
                .owner(world, key)
                .filter(|&i| is_up(world, self.masters[i].id))
            else {
                return Err(format!("key {key}: no live master serves its tablet"));
            };
            let master = &self.masters[i];
            match master.read(key) {
                Ok(state) => {
                    self.history.record_read(key, &state, world.now_us);
                    self.history
                        .check_read(key, &state)
                        .map_err(|why| format!("read at {}: {why}", master.id))?;
                }
                Err(Status::UnknownTablet) => {
                    return Err(format!(
                        "key {key}: {} owns its tablet but does not serve it",
                        master.id
                    ))
                }
                Err(status) => return Err(format!("key {key}: read at {}: {status:?}", master.id)),
            }
        }
        Ok(())
    }
}

/// One partition of a recovery and its tries, as the coordinator's `PartitionTries`
/// keeps them: rounds over up to `PARTITION_ATTEMPTS_MAX` candidates each.
#[derive(Debug)]
struct PartitionTries {
    ranges: PartitionRanges,
    /// Its pieces of the copies the recovery read.
    pieces: Vec<RecoveryPiece>,
    /// The recovery masters of this round (indexes into `Cluster::masters`), tried from
    /// `first` on; none before the first round.
    candidates: Vec<usize>,
    first: usize,
    /// Candidates of this round tried so far.
    tried: usize,
    rounds: usize,
    /// Tries abandoned so far.
    abandons: usize,
    /// Masters whose try of it failed: they forgot what they replayed of it.
    failed_on: BTreeSet<ServerId>,
}

impl PartitionTries {
    fn new(ranges: PartitionRanges, pieces: Vec<RecoveryPiece>) -> PartitionTries {
        PartitionTries {
            ranges,
            pieces,
            candidates: Vec::new(),
            first: 0,
            tried: 0,
            rounds: 0,
            abandons: 0,
            failed_on: BTreeSet::new(),
        }
    }
}

fn is_up(world: &World, id: ServerId) -> bool {
    world
        .coordinator
        .server(id)
        .is_some_and(|s| s.status == ServerStatus::Up)
}
