//! The simulated master's replication: the replicator's own cores (`RangeWrite`,
//! `Creation` and `Upkeep` for the order of its calls, `Settling`, `ReplicaFailures`,
//! `placement` with a `BackupSelector`) carried out through the [`World`], one call at
//! a time. The `master`
//! module doc says what stands in for `Replicator`.

use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_master::replica_manager::backup_selector::{BackupInfo, BackupSelector};
use rampart_master::replica_manager::placement;
use rampart_master::replica_manager::replica_failures::{Call, Cause, Loss};
use rampart_master::replica_manager::segment_replicas::{Replica, SegmentReplicas};
use rampart_master::replica_manager::sequencing::{
    CreateStep, Creation, NotWritable, RangeStep, RangeWrite, Upkeep, UpkeepStep,
};
use rampart_master::replica_manager::settling::{Bump, Effect, Patience, Settling};
use rampart_master::segmented_log::SegmentRange;
use std::collections::BTreeSet;

use super::sim_master::{sim_now, SimMaster};
use crate::backup::Refusal;
use crate::world::{CoordinatorAnswer, Delivery, Request, Stop, World};

/// Settling a segment gives up (a livelock, reported as a violation) after this many
/// steps.
const SETTLE_STEPS_MAX: usize = 100_000;

/// How a call to a replica failed.
enum Failure {
    /// The backup did not answer: every replica on it is lost.
    Backup,
    /// The backup refused this replica alone.
    Replica,
    /// This master was fenced: it must stop.
    Fenced,
    /// This master was killed during the call.
    Killed,
}

impl SimMaster {
    /// Between batches: the steps of the replicator's [`Upkeep`] round (as
    /// `Replicator::tick`, with the closed segment's re-creation it hands the appender
    /// carried out here, from the log).
    pub fn tick(&mut self, world: &mut World) -> Result<(), Stop> {
        let mut upkeep = Upkeep::new();
        while let Some(step) = upkeep.next(&self.segments) {
            match step {
                UpkeepStep::RefreshServers => {
                    // Backups the server list no longer shows Up fail at once.
                    let listed: BTreeSet<ServerId> = world.listed_backups().into_iter().collect();
                    let holding: BTreeSet<ServerId> =
                        self.segments.values().flat_map(|s| s.backups()).collect();
                    for backup in holding.difference(&listed) {
                        self.backup_failed(world, *backup);
                    }
                }
                // Nothing is quiet here: every call a simulated master makes reaches its
                // backup at once or fails it, and upkeep runs between any two batches.
                UpkeepStep::ProbeQuiet => {}
                UpkeepStep::FreeAbandoned => self.free_abandoned(world)?,
                UpkeepStep::Expire => self.failures.expire(sim_now(world)),
                UpkeepStep::SettleOpen(id) | UpkeepStep::Recreate(id) => {
                    self.settle(world, id, Patience::OneAttempt)?;
                }
            }
        }
        Ok(())
    }

    /// Frees the abandoned copies `ReplicaFailures::take_frees` gives (as the
    /// replicator's `free_abandoned`): an unanswered free fails its backup and keeps the
    /// copy.
    fn free_abandoned(&mut self, world: &mut World) -> Result<(), Stop> {
        let listed: BTreeSet<ServerId> = world.listed_backups().into_iter().collect();
        let frees = self
            .failures
            .take_frees(|backup| listed.contains(&backup), &self.segments);
        for abandoned in frees {
            world.boundary()?;
            let request = Request::Free {
                master: self.id,
                segment: abandoned.segment,
                epoch_max: abandoned.epoch_max,
            };
            let (delivery, _) = world.call(abandoned.backup, request);
            world.note(format!(
                "{}: free {} on {} up to epoch {}: {delivery:?}",
                self.id, abandoned.segment, abandoned.backup, abandoned.epoch_max
            ));
            if delivery != Delivery::Answered {
                let loss =
                    self.failures
                        .free_unanswered(&mut self.segments, abandoned, sim_now(world));
                self.placement_lost(|selector| placement::lost(selector, &loss.lost));
                self.noted_backup_failure(world, abandoned.backup, &loss);
            }
        }
        Ok(())
    }

    /// The log freed `id`: its replicas are abandoned at every epoch, freed by `tick`.
    pub(super) fn free_segment(&mut self, id: SegmentId) {
        if let Some(segment) = self.segments.remove(&id) {
            let freed = self.failures.segment_freed(id, &segment);
            self.placement_lost(|selector| {
                placement::lost(selector, freed.iter().map(|(lost, _)| lost));
            });
        }
    }

    /// Writes `range` to every replica of its segment: the steps of the replicator's
    /// [`RangeWrite`], the replicas written one after another and closed inline.
    pub(super) fn replicate(
        &mut self,
        world: &mut World,
        range: &SegmentRange,
    ) -> Result<(), Stop> {
        let mut write = RangeWrite::begin(&mut self.segments, range, self.replicas);
        let id = write.segment();
        loop {
            let step = write
                .next(self.segment_mut(id))
                .map_err(|NotWritable(id)| {
                    Stop::Fatal(format!("{id} not writable at {}", range.start))
                })?;
            match step {
                RangeStep::Settle => self.settle(world, id, Patience::UntilDone)?,
                RangeStep::Write { offset } => {
                    let bytes = self.bytes(id, offset, range.end);
                    let live: Vec<(usize, ServerId, FrameHandle, Epoch)> = self
                        .segment(id)
                        .live()
                        .map(|(slot, r)| (slot, r.backup, r.handle, r.epoch))
                        .collect();
                    let mut lost_any = false;
                    for (slot, backup, handle, epoch) in live {
                        let written = self.write(world, backup, (handle, epoch), offset, &bytes);
                        if let Err(failure) = written {
                            lost_any = true;
                            self.apply_failure(
                                world,
                                id,
                                (Call::Update { slot }, backup),
                                failure,
                            )?;
                        }
                    }
                    write.written(lost_any);
                }
                RangeStep::Close { slots } => {
                    for slot in slots {
                        self.close(world, id, slot)?;
                    }
                }
                RangeStep::Done => return Ok(()),
            }
        }
    }

    /// One write to a replica, frame `handle` at `epoch`: a boundary, then the copy (part
    /// of it, if this master dies during it).
    fn write(
        &mut self,
        world: &mut World,
        backup: ServerId,
        (handle, epoch): (FrameHandle, Epoch),
        offset: u32,
        bytes: &[u8],
    ) -> Result<(), Failure> {
        let killed = world.boundary().is_err();
        // A master that dies during the copy leaves part of it.
        let applied = if killed {
            world.draw(0..bytes.len() as u64 + 1) as usize
        } else {
            bytes.len()
        };
        let request = Request::Write {
            handle,
            epoch,
            offset,
            bytes: bytes[..applied].to_vec(),
        };
        let (delivery, result) = world.call(backup, request);
        if killed {
            return Err(Failure::Killed);
        }
        outcome(delivery, result).map(|_| ())
    }

    /// Applies what a failed `call` to `backup` for a replica of `id` loses (the real
    /// `ReplicaFailures::call_failed`).
    fn apply_failure(
        &mut self,
        world: &mut World,
        id: SegmentId,
        (call, backup): (Call, ServerId),
        failure: Failure,
    ) -> Result<(), Stop> {
        let cause = match failure {
            Failure::Killed => return Err(Stop::Killed),
            Failure::Fenced => Cause::Fenced,
            Failure::Backup => Cause::Backup,
            Failure::Replica => Cause::Replica,
        };
        let now = sim_now(world);
        match self
            .failures
            .call_failed(&mut self.segments, (id, backup), call, cause, now)
        {
            Err(_) => {
                let doing = if call == Call::Open {
                    "opening"
                } else {
                    "writing"
                };
                Err(Stop::Fatal(format!("fenced by {backup} {doing} {id}")))
            }
            Ok(loss) => {
                self.placement_lost(|selector| placement::lost(selector, &loss.lost));
                if cause == Cause::Backup {
                    self.noted_backup_failure(world, backup, &loss);
                }
                Ok(())
            }
        }
    }

    fn backup_failed(&mut self, world: &mut World, backup: ServerId) {
        let loss = self
            .failures
            .backup_failed(&mut self.segments, backup, sim_now(world));
        self.placement_lost(|selector| placement::lost(selector, &loss.lost));
        self.noted_backup_failure(world, backup, &loss);
    }

    /// Gives the selector back what `give_back` says (primaries of replicas that are
    /// gone), if it has chosen anything yet.
    fn placement_lost(&mut self, give_back: impl FnOnce(&mut BackupSelector)) {
        if let Some(selector) = &mut self.selector {
            give_back(selector);
        }
    }

    fn noted_backup_failure(&self, world: &mut World, backup: ServerId, loss: &Loss) {
        if !loss.lost.is_empty() {
            world.note(format!(
                "{}: backup {backup} failed: {} replica(s) lost",
                self.id,
                loss.lost.len()
            ));
        }
    }

    /// Carries out what the real `Settling::next` asks until the segment is ready (or,
    /// for upkeep, after one placement round).
    fn settle(&mut self, world: &mut World, id: SegmentId, patience: Patience) -> Result<(), Stop> {
        let mut settling = Settling::new(patience);
        for _ in 0..SETTLE_STEPS_MAX {
            match settling.next(self.segment_mut(id)) {
                Effect::Done => return Ok(()),
                Effect::ConfirmAlive => {
                    self.confirm_alive(world)?;
                    settling.alive();
                }
                Effect::Place { slots, fresh } => {
                    let Some(targets) = self.choose(world, id, (&slots, fresh)) else {
                        if !settling.short_of_backups() {
                            return Ok(());
                        }
                        world.note(format!("{}: {id}: writes wait for backups", self.id));
                        continue;
                    };
                    settling.placing();
                    self.create_replicas(world, id, targets, fresh)?;
                }
                Effect::FreeAbandoned => {
                    self.failures.expire(sim_now(world));
                    self.free_abandoned(world)?;
                    world.boundary()?;
                    world.wait(10_000);
                }
                Effect::Bump { epoch, bumps } => {
                    for bump in bumps {
                        self.bump(world, id, (epoch, bump))?;
                    }
                }
                Effect::Record { epoch } => {
                    world.boundary()?;
                    match world.record_open_epoch(self.id, id, epoch) {
                        CoordinatorAnswer::Ok => self.segment_mut(id).recorded(epoch),
                        CoordinatorAnswer::Crashed => {
                            return Err(Stop::Fatal("SetOpenEpoch: declared crashed".into()))
                        }
                        CoordinatorAnswer::Silent => {
                            if !settling.waits() {
                                return Ok(());
                            }
                            world.wait(20_000);
                        }
                    }
                }
            }
        }
        Err(Stop::Fatal(format!(
            "{id} never settled in {SETTLE_STEPS_MAX} steps"
        )))
    }

    /// One `BumpEpoch` of a survivor (already marked bumping).
    fn bump(
        &mut self,
        world: &mut World,
        id: SegmentId,
        (epoch, bump): (Epoch, Bump),
    ) -> Result<(), Stop> {
        let (slot, backup) = (bump.slot, bump.backup);
        world.boundary()?;
        let request = Request::Bump {
            handle: bump.handle,
            epoch: bump.from,
            new_epoch: epoch,
        };
        let (delivery, result) = world.call(backup, request);
        let result = outcome(delivery, result).map(|_| ());
        world.note(format!(
            "{}: bump {id} on {backup} to {epoch}: ok={}",
            self.id,
            result.is_ok()
        ));
        match result {
            Ok(()) => {
                self.segment_mut(id).bumped(slot, epoch);
                Ok(())
            }
            Err(failure) => self.apply_failure(world, id, (Call::Update { slot }, backup), failure),
        }
    }

    fn confirm_alive(&mut self, world: &mut World) -> Result<(), Stop> {
        loop {
            world.boundary()?;
            match world.confirm_alive(self.id) {
                CoordinatorAnswer::Ok => return Ok(()),
                CoordinatorAnswer::Crashed => {
                    return Err(Stop::Fatal("the server list shows it crashed".into()))
                }
                CoordinatorAnswer::Silent => world.wait(20_000),
            }
        }
    }

    /// Backups for `slots` ([`placement::targets`], through a real `BackupSelector` fed
    /// the backups the world lists Up, each its own failure domain), none excluded by
    /// `ReplicaFailures`; `None` when there are too few.
    fn choose(
        &mut self,
        world: &mut World,
        id: SegmentId,
        (slots, fresh): (&[usize], bool),
    ) -> Option<Vec<(usize, ServerId)>> {
        let own = self.id;
        let selector = self
            .selector
            .get_or_insert_with(|| BackupSelector::new(own, world.draw(0..u64::MAX)));
        let listed: Vec<BackupInfo> = world
            .listed_backups()
            .into_iter()
            .map(|backup| BackupInfo {
                id: backup,
                failure_domain: backup.to_string(),
                disk_read_mbps: 0,
            })
            .collect();
        selector.update_backups(&listed);
        let excluded = self.failures.excluded(sim_now(world));
        let segment = self.segments.get(&id)?;
        placement::targets(selector, segment, (slots, fresh, self.replicas), &excluded).ok()
    }

    /// Opens replicas on `targets` at a new epoch, each filled with the segment's bytes
    /// so far (in chunks) and closed if the segment is: a [`Creation`].
    fn create_replicas(
        &mut self,
        world: &mut World,
        id: SegmentId,
        targets: Vec<(usize, ServerId)>,
        fresh: bool,
    ) -> Result<(), Stop> {
        let creation = Creation::begin(self.segment_mut(id));
        let bytes = self.bytes(id, 0, creation.len);
        for (slot, backup) in targets {
            match self.create_replica(world, &creation, backup, &bytes) {
                Ok(handle) => {
                    world.note(format!(
                        "{}: {id} placed on {backup} (slot {slot}) at epoch {}, {} bytes{}",
                        self.id,
                        creation.epoch,
                        creation.len,
                        if fresh { ", fresh" } else { "" }
                    ));
                    let replica = Replica::new(backup, handle, creation.epoch, ());
                    creation.created(self.segment_mut(id), slot, replica);
                }
                // Refused (an older copy here is newer than this epoch), the backup
                // excluded a while: the next round tries another.
                Err(failure) => {
                    creation.failed(&mut self.failures, self.selector.as_mut(), (slot, backup));
                    self.apply_failure(world, id, (Call::Open, backup), failure)?;
                }
            }
        }
        Ok(())
    }

    /// Opens a replica of the `creation`'s segment on `backup` at its epoch, then takes
    /// the creation's steps after the open: the fill (of `bytes`, in chunks), the close.
    fn create_replica(
        &mut self,
        world: &mut World,
        creation: &Creation,
        backup: ServerId,
        bytes: &[u8],
    ) -> Result<FrameHandle, Failure> {
        let (id, epoch) = (creation.segment, creation.epoch);
        if world.boundary().is_err() {
            return Err(Failure::Killed);
        }
        let request = Request::Open {
            master: self.id,
            segment: id,
            epoch,
            capacity: self.segment_bytes,
        };
        let (delivery, opened) = world.call(backup, request);
        world.note(format!(
            "{}: open {id} on {backup} at epoch {epoch}: {opened:?} ({delivery:?})",
            self.id
        ));
        let handle = outcome(delivery, opened)?.ok_or(Failure::Replica)?;
        for step in creation.after_open() {
            match step {
                CreateStep::Fill { len } => {
                    let chunk = world.config.fill_chunk_bytes.max(1) as usize;
                    for (n, piece) in bytes[..len as usize].chunks(chunk).enumerate() {
                        self.write(world, backup, (handle, epoch), (n * chunk) as u32, piece)?;
                    }
                }
                CreateStep::Close { length } => {
                    self.close_replica(world, backup, (handle, epoch), length)?;
                }
            }
        }
        Ok(handle)
    }

    fn close(&mut self, world: &mut World, id: SegmentId, slot: usize) -> Result<(), Stop> {
        let Some(replica) = self.segment(id).replica(slot) else {
            return Ok(());
        };
        let (backup, handle, epoch) = (replica.backup, replica.handle, replica.epoch);
        // `Replicator::start_closes`: every replica holds the segment's bytes.
        let length = self.segment(id).len();
        match self.close_replica(world, backup, (handle, epoch), length) {
            Ok(()) => {
                self.segment_mut(id).close_answered(slot, handle, true);
                Ok(())
            }
            Err(failure) => {
                self.segment_mut(id).close_answered(slot, handle, false);
                self.apply_failure(world, id, (Call::Close { slot }, backup), failure)
            }
        }
    }

    /// `CloseReplica` of frame `handle` at `epoch`: its first `length` bytes are the
    /// replica.
    fn close_replica(
        &mut self,
        world: &mut World,
        backup: ServerId,
        (handle, epoch): (FrameHandle, Epoch),
        length: u32,
    ) -> Result<(), Failure> {
        if world.boundary().is_err() {
            return Err(Failure::Killed);
        }
        let request = Request::Close {
            handle,
            epoch,
            length,
        };
        let (delivery, result) = world.call(backup, request);
        outcome(delivery, result).map(|_| ())
    }

    fn segment(&self, id: SegmentId) -> &SegmentReplicas<()> {
        self.segments
            .get(&id)
            .expect("a segment being replicated is tracked")
    }

    fn segment_mut(&mut self, id: SegmentId) -> &mut SegmentReplicas<()> {
        self.segments
            .get_mut(&id)
            .expect("a segment being replicated is tracked")
    }

    /// Bytes `start..end` of segment `id` in the log (none, for an empty range).
    fn bytes(&self, id: SegmentId, start: u32, end: u32) -> Vec<u8> {
        if start == end {
            return Vec::new();
        }
        self.store
            .log()
            .segment_bytes(id)
            .and_then(|b| b.get(start as usize..end as usize))
            .expect("a replicated range lies in the log")
            .to_vec()
    }
}

/// What the master makes of a call: the reply if one came back, else the backup's
/// failure (a lost request and a lost reply look the same to it).
fn outcome(
    delivery: Delivery,
    result: Option<Result<Option<FrameHandle>, Refusal>>,
) -> Result<Option<FrameHandle>, Failure> {
    match (delivery, result) {
        (Delivery::Answered, Some(Ok(handle))) => Ok(handle),
        (Delivery::Answered, Some(Err(Refusal::Fenced))) => Err(Failure::Fenced),
        (Delivery::Answered, Some(Err(_))) => Err(Failure::Replica),
        _ => Err(Failure::Backup),
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim_master::FAILED_BACKUP_EXCLUSION_US;
    use super::*;
    use crate::config::SimConfig;
    use rampart_common::ids::{SegmentId, TableId};

    #[test]
    fn a_replica_whose_open_went_unanswered_is_freed() {
        // Seed 2413: every open whose reply was lost, or whose fill failed, left a
        // frame on its backup that no free ever named, until every backup held
        // `FRAMES_MAX` of them and answered `BackupFull` to every open.
        let config = SimConfig {
            masters: 1,
            backups: 1,
            replicas: 1,
            drop_p: 1.0,
            backup_down_p: 0.0,
            backup_lost_p: 0.0,
            coordinator_silent_p: 0.0,
            master_crash_p: 0.0,
            late_p: 0.0,
            ..SimConfig::for_seed(0)
        };
        let mut world = World::new(config.clone(), 0);
        let backup = world.backups[0].id;
        let mut master = SimMaster::new(
            world.masters[0],
            TableId(1),
            (config.segment_bytes, config.replicas),
            world.clock.clone(),
        );
        // Every call fails, half of them only on the way back: those opens landed.
        for segment in 1..=16 {
            let id = SegmentId(segment);
            master.segments.insert(id, SegmentReplicas::new(id, 1, 0));
            master
                .create_replicas(&mut world, id, vec![(0, backup)], true)
                .expect("a backup's failure is not the master's");
            assert_eq!(master.segment(id).missing(), 1);
        }
        assert!(
            world.trace.iter().any(|line| line.contains("(Unanswered)")),
            "an open reached the backup"
        );
        // The log frees them (their copies were never placed: nothing of theirs is
        // abandoned but what the failed creations left), and the backup's exclusion
        // ends.
        for segment in 1..=16 {
            master.free_segment(SegmentId(segment));
        }
        world.wait(FAILED_BACKUP_EXCLUSION_US + 1);
        world.config.drop_p = 0.0;
        // The first round's frees find the backup still failed: the exclusion ends after
        // them (`Upkeep`'s order, the replicator's); the second round frees.
        for _ in 0..2 {
            master.tick(&mut world).expect("nothing fences or kills it");
        }
        assert!(
            world.backups[0].fence_and_list(master.id).is_empty(),
            "every frame the master gave up on was freed"
        );
    }
}
