//! The simulated master itself: its store, lease, writes, reads, recovery replay and
//! cleaning, over the real cores; `replication` drives its segments' replicas. The
//! `master` module doc says what is real and what stands in.

use bytes::Bytes;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{SegmentId, ServerId, TableId, TabletEpoch, Version};
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, Tablet};
use rampart_master::appender::FORGET_CLEAN_STEPS_MAX;
use rampart_master::cleaner::{CleaningPass, StepEnd, PASS_SURVIVORS_MAX, STEP_BYTES};
use rampart_master::lease::{Clock, Lease};
use rampart_master::object_store::{Batch, ObjectStore, WriteOp};
use rampart_master::replay::{RecoveryPiece, ReplayState};
use rampart_master::replica_manager::backup_selector::BackupSelector;
use rampart_master::replica_manager::replica_failures::ReplicaFailures;
use rampart_master::replica_manager::segment_replicas::SegmentReplicas;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::checker::{key_bytes, tag, History, KeyState, Op, OpIndex};
use crate::world::{CoordinatorAnswer, Stop, World, LEASE_US};
use rampart_check::{Input, Operation, Output};

/// Largest value a simulated master takes (above what the workload writes).
pub const VALUE_BYTES_MAX: usize = 16 * 1024;

/// A backup that failed, or refused an open or a close, is not chosen again for this
/// long (µs): the simulation's time scale, where the replicator's are seconds.
pub(super) const FAILED_BACKUP_EXCLUSION_US: u64 = 50_000;

/// What one cleaner step came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cleaned {
    /// No pass under way and none worth planning.
    Nothing,
    /// A step ran, and a commit after it (if any) freed segments or had no reason to.
    Progress,
    /// A step ran, but its commit found no room, or no buffer freed nothing: trying
    /// again at once would find the same.
    Stuck,
}

/// Writes a batch of a recovery master's own clients while it recovers
/// ([`SimMaster::recover`]): drawn and checked by the cluster.
pub type Serve<'a> = dyn FnMut(&mut SimMaster, &mut World) -> Result<(), Stop> + 'a;

/// How a `Recover` of one partition ended on a recovery master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// Every piece replayed, replicated and published: the partition may be handed over.
    Replayed,
    /// Refused or abandoned (why): what it replayed is forgotten, and the partition is
    /// tried again.
    Failed(String),
}

/// One client write (`value: Some`) or remove (`None`) of a key, with its exactly-once
/// identity (`rampart_common::rifl`), kept by every retry.
#[derive(Clone, Debug)]
pub struct ClientWrite {
    pub key: u64,
    pub value: Option<Vec<u8>>,
    pub rifl: Rifl,
}

/// A client write whose outcome its client did not learn (the batch stopped after
/// staging it), to retry with the same identity on whoever serves its key next.
#[derive(Clone, Debug)]
pub struct Pending {
    pub write: ClientWrite,
    /// Its operation in the recorded client history.
    pub recorded: usize,
    /// Its append in the history of appends, if an attempt appended it.
    pub appended: Option<OpIndex>,
}

/// What one op of a batch came to.
#[derive(Clone, Debug)]
struct Done {
    /// What its client is answered once the batch is acknowledged.
    output: Output,
    /// Staged (appended) in this batch.
    staged: bool,
    /// Answered from its completion record.
    from_record: bool,
    /// Its append, by this attempt or an earlier one.
    appended: Option<OpIndex>,
}

impl Default for Done {
    fn default() -> Done {
        Done {
            output: Output::Failed("not staged".into()),
            staged: false,
            from_record: false,
            appended: None,
        }
    }
}

impl Done {
    /// The op to retry if the batch stopped (`result`) once it was staged or answered:
    /// its client never heard.
    fn unknown(
        &self,
        result: &Result<(), Stop>,
        write: &ClientWrite,
        recorded: usize,
    ) -> Option<Pending> {
        let answered = matches!(self.output, Output::Written(_) | Output::Removed(_));
        (result.is_err() && answered).then(|| Pending {
            write: write.clone(),
            recorded,
            appended: self.appended,
        })
    }
}

/// A simulated master: the real `ObjectStore` (its log, index, tablets, versions and
/// replay), replicated by a synchronous loop over the replicator's cores (module doc).
#[derive(Debug)]
pub struct SimMaster {
    pub id: ServerId,
    pub(super) table: TableId,
    pub(super) store: ObjectStore,
    pub(super) segment_bytes: u32,
    pub(super) replicas: usize,
    pub(super) segments: BTreeMap<SegmentId, SegmentReplicas<()>>,
    /// The real core deciding what each failed call loses, which backups are
    /// excluded, and which copies given up on to free when; on simulated time.
    pub(super) failures: ReplicaFailures<Duration>,
    /// The real backup selector, seeded from the world at the first placement.
    pub(super) selector: Option<BackupSelector>,
    /// Why it stopped (killed, fatal, or its log full), once it did.
    pub stopped: Option<Stop>,
    /// The real lease, on simulated time: it serves reads and takes writes only while
    /// the lease holds (`MasterService` checks it when a request arrives).
    pub(super) lease: Lease,
    /// The cleaning pass under way, if any (as the appender holds it).
    pub(super) pass: Option<CleaningPass>,
}

impl SimMaster {
    /// A master `id` of table `table` whose log has segments of `segment_bytes`; it
    /// hands out versions only below a ceiling reserved at the coordinators.
    pub fn new(
        id: ServerId,
        table: TableId,
        (segment_bytes, replicas): (u32, usize),
        clock: Arc<dyn Clock>,
    ) -> SimMaster {
        let config = MasterConfig {
            segment_bytes,
            memory_bytes: u64::from(segment_bytes) * 256,
            value_bytes_max: VALUE_BYTES_MAX,
            ..Default::default()
        };
        let mut store = ObjectStore::new(id, config);
        store.enforce_version_ceiling();
        let exclusion = Duration::from_micros(FAILED_BACKUP_EXCLUSION_US);
        SimMaster {
            id,
            table,
            store,
            segment_bytes,
            replicas,
            segments: BTreeMap::new(),
            failures: ReplicaFailures::new(exclusion, exclusion),
            selector: None,
            stopped: None,
            lease: Lease::with_clock(clock),
            pass: None,
        }
    }

    /// Renews the lease once half of it is left, as `LeaseRenewer` does: granted from
    /// when the request was sent; a master told it was declared crashed revokes its
    /// lease and exits.
    pub fn renew_lease(&mut self, world: &mut World) {
        if !self.running() {
            return;
        }
        let half = Duration::from_micros(LEASE_US / 2);
        if self.lease.remaining().is_some_and(|left| left > half) {
            return;
        }
        let sent = self.lease.now();
        match world.renew_lease(self.id) {
            CoordinatorAnswer::Ok => self.lease.grant(sent, Duration::from_micros(LEASE_US)),
            CoordinatorAnswer::Crashed => {
                self.lease.revoke("declared crashed");
                world.note(format!(
                    "{}: lease revoked: declared crashed; it exits",
                    self.id
                ));
                self.stopped = Some(Stop::Fatal("RenewLease: declared crashed".into()));
            }
            CoordinatorAnswer::Silent => {}
        }
    }

    /// Whether it serves clients now: running, with its lease.
    pub fn serves(&self) -> bool {
        self.running() && self.lease.valid()
    }

    /// Whether it takes a batch of writes now: writable, with its lease.
    pub fn takes_writes(&self) -> bool {
        self.writable() && self.lease.valid()
    }

    /// Whether it still serves: not killed, not stopped by a fatal error.
    pub fn running(&self) -> bool {
        matches!(self.stopped, None | Some(Stop::LogFull))
    }

    /// Whether it takes writes.
    pub fn writable(&self) -> bool {
        self.stopped.is_none()
    }

    /// Replicates the log's first segment before anything is served.
    pub fn start(&mut self, world: &mut World) -> Result<(), Stop> {
        for range in self.store.seal() {
            self.replicate(world, &range.range)?;
        }
        Ok(())
    }

    /// Serves `tablets` (given by the coordinators); a recovered partition also raises
    /// the version ceiling to what the coordinators hold for this master.
    pub fn take_tablets(&mut self, tablets: &[Tablet], ceiling: u64) {
        self.store.take_tablets(tablets);
        self.store.raise_version_ceiling(Version(ceiling));
    }

    /// Serves exactly `tablets`, its whole set as of its tablet epoch `epoch` (a pull
    /// after `SyncTablets`).
    pub fn sync_tablets(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) {
        self.store.replace_tablets(epoch, tablets);
    }

    /// Whether its store serves `key` (its own view, which a zombie keeps).
    pub fn owns(&self, key: u64) -> bool {
        self.store.read(self.table, &key_bytes(key)) != Err(Status::UnknownTablet)
    }

    /// A client's read of `key`: what the store serves, or why not.
    pub fn read(&self, key: u64) -> Result<KeyState, Status> {
        match self.store.read(self.table, &key_bytes(key)) {
            Ok(object) => Ok(Some((object.version, object.value.to_vec()))),
            Err(Status::ObjectDoesntExist) => Ok(None),
            Err(status) => Err(status),
        }
    }

    /// Reserves versions at the coordinators when the store wants more (as
    /// `VersionReserver`, before the batch rather than beside it).
    fn reserve_versions(&mut self, world: &mut World) -> Result<(), Stop> {
        let Some(ceiling) = self.store.ceiling_wanted() else {
            return Ok(());
        };
        loop {
            world.boundary()?;
            match world.reserve_versions(self.id, ceiling.0) {
                CoordinatorAnswer::Ok => break,
                CoordinatorAnswer::Crashed => {
                    return Err(Stop::Fatal("ReserveVersions: declared crashed".into()))
                }
                CoordinatorAnswer::Silent => world.wait(20_000),
            }
        }
        self.store.raise_version_ceiling(ceiling);
        Ok(())
    }

    /// Stages a batch of writes and removes in the real store, replicates it, publishes
    /// it and acknowledges it in `history` once every replica holds it. Each applied op
    /// is in `history` from the moment it was appended: it may surface in a recovery
    /// whether acknowledged or not. Ops the store refuses (a key it does not own) are
    /// not appended. Every op is also recorded for the linearizability check, as its
    /// client would see it: answered when the batch is acknowledged, failed when it was
    /// never staged, and of unknown outcome when the batch stopped after staging it —
    /// those go to `pending`, for the client to retry with the same identity
    /// ([`retry_batch`](Self::retry_batch)).
    pub fn write_batch(
        &mut self,
        world: &mut World,
        ops: &[ClientWrite],
        history: &mut History,
        pending: &mut Vec<Pending>,
    ) -> Result<(), Stop> {
        let call_us = history.stamp(world.now_us);
        let mut done = vec![Done::default(); ops.len()];
        let result = self.stage_and_replicate(world, ops, history, &mut done);
        let return_us = history.stamp(world.now_us);
        for (op, done) in ops.iter().zip(done) {
            let recorded = history.record(Operation {
                client: self.id.0 as u32,
                key: key_bytes(op.key),
                call_us,
                return_us,
                input: match &op.value {
                    Some(value) => Input::Write {
                        value: tag(value),
                        rules: RejectRules::default(),
                    },
                    None => Input::Remove {
                        rules: RejectRules::default(),
                    },
                },
                output: done.output.clone(),
            });
            if let Some(pending_op) = done.unknown(&result, op, recorded) {
                history.resolve(recorded, Output::Unknown(format!("{result:?}")), return_us);
                pending.push(pending_op);
            }
        }
        result
    }

    /// Retries `ops` (each of unknown outcome, keys this master serves) as one batch
    /// with their identities: one that completed here or on the master this one
    /// recovered from is answered from its completion record, without applying again;
    /// the others apply now. Answered ones resolve their recorded operation; those
    /// whose outcome is still unknown (this master stopped too) go back to `pending`.
    /// `from_record` counts those answered from a record.
    pub fn retry_batch(
        &mut self,
        world: &mut World,
        ops: &[Pending],
        history: &mut History,
        pending: &mut Vec<Pending>,
        from_record: &mut usize,
    ) -> Result<(), Stop> {
        let writes: Vec<ClientWrite> = ops.iter().map(|p| p.write.clone()).collect();
        let mut done: Vec<Done> = ops
            .iter()
            .map(|p| Done {
                appended: p.appended,
                ..Done::default()
            })
            .collect();
        let result = self.stage_and_replicate(world, &writes, history, &mut done);
        let return_us = history.stamp(world.now_us);
        for (op, done) in ops.iter().zip(done) {
            match (&result, &done.output) {
                (Ok(()), Output::Written(_) | Output::Removed(_)) => {
                    *from_record += usize::from(done.from_record);
                    history.resolve(op.recorded, done.output, return_us);
                }
                // Stopped, or refused this time (an earlier attempt may still have
                // applied): unknown yet, tried again later.
                _ => pending.push(Pending {
                    write: op.write.clone(),
                    recorded: op.recorded,
                    appended: done.appended,
                }),
            }
        }
        result
    }

    /// [`write_batch`](Self::write_batch)'s work; `done` says what each op answers once
    /// the batch is acknowledged, and which append it is.
    fn stage_and_replicate(
        &mut self,
        world: &mut World,
        ops: &[ClientWrite],
        history: &mut History,
        done: &mut [Done],
    ) -> Result<(), Stop> {
        self.reserve_versions(world)?;
        let mut batch = Batch::new();
        let mut answered = false;
        for (write, done) in ops.iter().zip(done.iter_mut()) {
            let key = write.key;
            let (table, key_bytes) = (self.table, Bytes::from(key_bytes(key)));
            if let Some(version) = self.store.completed(write.rifl) {
                // A retry of an operation that completed: answered from its record,
                // appending nothing (its append, if any, is the first attempt's).
                done.output = match write.value {
                    Some(_) => Output::Written(version.0),
                    None => Output::Removed(Some(version.0)),
                };
                done.from_record = true;
                answered = true;
                continue;
            }
            let op = match &write.value {
                Some(value) => WriteOp::Write {
                    table,
                    key: key_bytes,
                    value: Bytes::from(value.clone()),
                    rules: RejectRules::default(),
                    rifl: write.rifl,
                },
                None => WriteOp::Remove {
                    table,
                    key: key_bytes,
                    rules: RejectRules::default(),
                    rifl: write.rifl,
                },
            };
            let outcome = self.store.stage(&mut batch, &op);
            match outcome.status {
                // A remove of nothing appends nothing.
                Status::Ok if write.value.is_none() && outcome.version == Version(0) => {
                    done.output = Output::Removed(None);
                    answered = true;
                }
                Status::Ok => {
                    done.output = match write.value {
                        Some(_) => Output::Written(outcome.version.0),
                        None => Output::Removed(Some(outcome.version.0)),
                    };
                    done.appended = Some(history.append(Op {
                        key,
                        version: outcome.version,
                        value: write.value.clone(),
                    }));
                    done.staged = true;
                }
                Status::NoSpace => return Err(Stop::LogFull),
                status => {
                    done.output = Output::Failed(format!("{status:?}"));
                    world.note(format!("{}: key {key} refused: {status:?}", self.id));
                }
            }
        }
        if !done.iter().any(|d| d.staged) && !answered {
            return Ok(());
        }
        for range in self.store.seal() {
            self.replicate(world, &range.range)?;
        }
        self.store.publish(batch);
        for d in done.iter().filter(|d| d.staged || d.from_record) {
            if let Some(op) = d.appended {
                history.acknowledge(op);
            }
        }
        world.note(format!(
            "{}: batch of {} acknowledged",
            self.id,
            done.iter().filter(|d| d.staged).count()
        ));
        Ok(())
    }

    /// Serves a `Recover` of partition `ranges` as `MasterRecovery::recover` does:
    /// forgets what an earlier attempt left in those ranges, replays `pieces`, and
    /// forgets what it replayed if the replay is refused or — `abandon_after` — the
    /// coordinator abandons the try once that many pieces are replayed.
    ///
    /// `serve` writes a batch of this master's own clients
    /// (`SimConfig::serve_during_replay_p`): drawn between two pieces, and after a
    /// failed try.
    pub fn recover(
        &mut self,
        world: &mut World,
        ranges: &[HashRange],
        pieces: &[RecoveryPiece],
        abandon_after: Option<usize>,
        serve: &mut Serve<'_>,
    ) -> Result<Recovered, Stop> {
        self.forget_unowned(world, ranges)?;
        let replayed = pieces.len().min(abandon_after.unwrap_or(usize::MAX));
        let refused = !self.replay(world, &pieces[..replayed], serve)?;
        let why = if refused {
            "the replay was refused (NoSpace)"
        } else if abandon_after.is_some() {
            "abandoned"
        } else {
            return Ok(Recovered::Replayed);
        };
        let forgotten = self.forget_unowned(world, ranges)?;
        self.maybe_serve(world, serve)?;
        Ok(Recovered::Failed(format!(
            "{why} after {replayed} of {} pieces; {forgotten} objects forgotten, {} tainted \
             segment(s) left",
            pieces.len(),
            self.store.tainted_held()
        )))
    }

    /// Replays `pieces` of a crashed master's partition with the real
    /// `ObjectStore::stage_replay`, replicates what it appended and publishes it (its
    /// keys stay unserved until [`take_tablets`](Self::take_tablets)), as the
    /// appender's replay batch does. False when the store refused a piece (`NoSpace`:
    /// its log is full, or holds segments of an abandoned attempt): what it staged
    /// until then is replicated and published all the same (its bytes are in the log),
    /// and the recovery must fail.
    ///
    /// Between two pieces its batch may end (`SimConfig::replay_clean_p`) and the
    /// cleaner run, as the appender cleans between its batches: it may then move
    /// objects just replayed into a survivor.
    ///
    /// Between two pieces its clients' batches may come in too (`serve`).
    fn replay(
        &mut self,
        world: &mut World,
        pieces: &[RecoveryPiece],
        serve: &mut Serve<'_>,
    ) -> Result<bool, Stop> {
        let mut batch = Batch::new();
        let mut state = ReplayState::new();
        let mut staged = true;
        for (n, piece) in pieces.iter().enumerate() {
            if self
                .store
                .stage_replay(&mut batch, &mut state, piece)
                .is_err()
            {
                staged = false;
                break;
            }
            let last = n + 1 == pieces.len();
            let p = world.config.replay_clean_p;
            if !last && p > 0.0 && world.chance(p) {
                self.publish_replayed(world, std::mem::take(&mut batch))?;
                let cleaning = world.draw_cleaning();
                self.clean(world, cleaning)?;
            }
            let p = world.config.serve_during_replay_p;
            if !last && p > 0.0 && world.chance(p) {
                self.publish_replayed(world, std::mem::take(&mut batch))?;
                serve(self, world)?;
            }
        }
        self.publish_replayed(world, batch)?;
        let counts = state.counts();
        world.note(format!(
            "{} replayed {} pieces{}: {counts:?}",
            self.id,
            pieces.len(),
            if staged { "" } else { ", refused" }
        ));
        Ok(staged)
    }

    /// After a failed try: a batch of this master's own clients, drawn as between two
    /// pieces of a replay.
    fn maybe_serve(&mut self, world: &mut World, serve: &mut Serve<'_>) -> Result<(), Stop> {
        let p = world.config.serve_during_replay_p;
        if p > 0.0 && world.chance(p) {
            serve(self, world)?;
        }
        Ok(())
    }

    /// Replicates what a replay staged in `batch`, then publishes it.
    fn publish_replayed(&mut self, world: &mut World, batch: Batch) -> Result<(), Stop> {
        for range in self.store.seal() {
            self.replicate(world, &range.range)?;
        }
        if !batch.is_empty() {
            self.store.publish_recovered(batch);
        }
        Ok(())
    }

    /// Forgets every object in `ranges` this master does not own (what an abandoned
    /// attempt replayed) and cleans the segments holding that attempt's entries out of
    /// the log, as the appender's forget job does (`forget_batch`): the real
    /// `ObjectStore::forget_unowned` taints them, `close_tainted_head` closes the head
    /// if it is one of them, and cleaner steps run — tainted segments first — until none
    /// is left or `SimConfig::forget_clean_steps_max` steps ran (the rest is cleaned
    /// between later batches, and replays are refused until then). Returns how many
    /// objects were forgotten.
    pub fn forget_unowned(&mut self, world: &mut World, ranges: &[HashRange]) -> Result<u64, Stop> {
        let forgotten = self.store.forget_unowned(ranges);
        self.clean_tainted(world, world.config.forget_clean_steps_max)?;
        if forgotten > 0 {
            world.note(format!(
                "{}: forgot {forgotten} objects of {ranges:?}, {} tainted segment(s) left",
                self.id,
                self.store.tainted_held()
            ));
        }
        Ok(forgotten)
    }

    /// Cleans tainted segments out of the log, `steps_max` steps at most, and
    /// replicates what that appended (as `forget_batch`).
    fn clean_tainted(&mut self, world: &mut World, steps_max: usize) -> Result<(), Stop> {
        for _ in 0..steps_max {
            // A head that cannot close now closes at its next rollover.
            let _ = self.store.close_tainted_head();
            if self.store.tainted_held() == 0
                || self.clean_once(world, STEP_BYTES, PASS_SURVIVORS_MAX)? != Cleaned::Progress
            {
                break;
            }
        }
        for range in self.store.seal() {
            self.replicate(world, &range.range)?;
        }
        Ok(())
    }

    /// Cleans as the appender does between batches: up to `steps` steps of a pass
    /// (planned when none is under way), each of at most `step_bytes` and replicated,
    /// and a commit whenever a step ends with a survivor closed, the pass done or no
    /// buffer: its digest replicated, then the cleaned segments freed in memory and
    /// their replicas freed on the backups (`Replicator::free_segments`).
    ///
    /// While segments of an abandoned recovery attempt are still in the log, they are
    /// cleaned first, as the appender's cleaner does whatever its threshold says.
    pub fn clean(
        &mut self,
        world: &mut World,
        (steps, step_bytes, survivors_max): (usize, usize, u64),
    ) -> Result<(), Stop> {
        if self.store.tainted_held() > 0 {
            self.clean_tainted(world, FORGET_CLEAN_STEPS_MAX)?;
        }
        for _ in 0..steps {
            if self.clean_once(world, step_bytes, survivors_max)? == Cleaned::Nothing {
                break;
            }
        }
        Ok(())
    }

    /// One cleaner step, as the appender's `clean_once`: of the pass under way, or of
    /// one planned now; replicated, and committed whenever the step ends with a
    /// survivor closed, the pass done or no buffer (its digest replicated, then the
    /// cleaned segments freed in memory and their replicas freed on the backups).
    fn clean_once(
        &mut self,
        world: &mut World,
        step_bytes: usize,
        survivors_max: u64,
    ) -> Result<Cleaned, Stop> {
        let mut pass = match self.pass.take() {
            Some(pass) => pass,
            None => match self.store.plan_cleaning(survivors_max) {
                Some(pass) => {
                    world.note(format!("{}: cleaning pass planned", self.id));
                    pass
                }
                None => return Ok(Cleaned::Nothing),
            },
        };
        let end = self.store.clean_step(&mut pass, step_bytes);
        // Kept before any call: a crash inside leaves the pass where a real master's
        // memory would be (gone with it).
        self.pass = Some(pass);
        for range in self.store.seal() {
            self.replicate(world, &range.range)?;
        }
        let mut progress = true;
        if end != StepEnd::Budget {
            let Some(mut pass) = self.pass.take() else {
                return Ok(Cleaned::Nothing);
            };
            let committed = self.store.commit_cleaning(&mut pass);
            self.pass = Some(pass);
            for range in self.store.seal() {
                self.replicate(world, &range.range)?;
            }
            progress = match committed {
                Ok(_) => {
                    let freed = self.store.free_cleaned();
                    world.segments_cleaned += freed.len();
                    world.note(format!(
                        "{}: cleaning committed, {} segment(s) freed",
                        self.id,
                        freed.len()
                    ));
                    let any = !freed.is_empty();
                    for id in freed {
                        self.free_segment(id);
                    }
                    end != StepEnd::NoBuffer || any
                }
                // No room for the digest: trying again at once would find none either.
                Err(_) => false,
            };
        }
        if self.pass.as_ref().is_some_and(CleaningPass::is_done) {
            self.pass = None;
        }
        Ok(if progress {
            Cleaned::Progress
        } else {
            Cleaned::Stuck
        })
    }
}

/// The simulated time as the real cores take it.
pub(super) fn sim_now(world: &World) -> Duration {
    Duration::from_micros(world.now_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimConfig;

    /// A master of a quiet world (no faults), started, that owns nothing.
    fn quiet_master(forget_clean_steps_max: usize) -> (World, SimMaster) {
        let config = SimConfig {
            masters: 1,
            backups: 3,
            replicas: 2,
            drop_p: 0.0,
            backup_down_p: 0.0,
            backup_lost_p: 0.0,
            coordinator_silent_p: 0.0,
            master_crash_p: 0.0,
            late_p: 0.0,
            replay_clean_p: 0.0,
            forget_clean_steps_max,
            ..SimConfig::for_seed(0)
        };
        let mut world = World::new(config.clone(), 0);
        let mut master = SimMaster::new(
            world.masters[0],
            TableId(1),
            (config.segment_bytes, config.replicas),
            world.clock.clone(),
        );
        master
            .start(&mut world)
            .expect("nothing fails in a quiet world");
        (world, master)
    }

    /// One piece of a crashed master's segment 1: `key` at version 5.
    fn piece(key: u64) -> RecoveryPiece {
        let key = Bytes::from(key_bytes(key));
        let entry = rampart_master::replay::PieceEntry::Object {
            table: TableId(1),
            hash: rampart_common::ids::key_hash(&key),
            version: Version(5),
            key,
            value: Bytes::from_static(b"old"),
        };
        RecoveryPiece::from_entries(SegmentId(1), Version(0), vec![entry])
    }

    #[test]
    fn a_replay_beside_an_abandoned_attempts_segments_fails_its_try_until_they_are_cleaned() {
        let (mut world, mut master) = quiet_master(0);
        let whole = [HashRange {
            table: TableId(1),
            start: 0,
            end: u64::MAX,
        }];
        let pieces = [piece(1)];
        let abandoned = master.recover(&mut world, &whole, &pieces, Some(1), &mut |_, _| Ok(()));
        assert!(
            matches!(abandoned, Ok(Recovered::Failed(_))),
            "{abandoned:?}"
        );
        assert!(
            master.store.tainted_held() > 0,
            "its forget may not clean (no steps): the attempt's segment stays"
        );
        // The next try is refused by the real `stage_replay`: a failed try, not a
        // stopped master.
        let refused = master.recover(&mut world, &whole, &pieces, None, &mut |_, _| Ok(()));
        assert!(
            matches!(&refused, Ok(Recovered::Failed(why)) if why.contains("refused")),
            "{refused:?}"
        );
        // Its forget cleans the attempt's segments out first once it may, as the
        // appender's does, and the try goes through.
        world.config.forget_clean_steps_max = FORGET_CLEAN_STEPS_MAX;
        let replayed = master.recover(&mut world, &whole, &pieces, None, &mut |_, _| Ok(()));
        assert_eq!(replayed, Ok(Recovered::Replayed));
        assert_eq!(master.store.tainted_held(), 0);
        master.take_tablets(
            &[Tablet {
                table: TableId(1),
                start_hash: 0,
                end_hash: u64::MAX,
                owner: master.id,
            }],
            0,
        );
        assert_eq!(master.read(1), Ok(Some((Version(5), b"old".to_vec()))));
    }
}
