//! `SimMaster`: a master over the real cores — its store is a real [`ObjectStore`]
//! (staging with versions below a reserved ceiling, tablets, reads, tombstones, the
//! recovery replay; its log real entries, checksums, digests and footers), each
//! segment's replicas a real [`SegmentReplicas`] — driven the way the appender and
//! `Replicator` drive them, with every call to a backup or the coordinators going
//! through the [`World`].
//!
//! # Replication: the real decisions, a stand-in loop
//! Each settle of a segment is a real [`Settling`] (confirm alive, place, bump, record,
//! when to give up) and each failed call goes to a real [`ReplicaFailures`] (what it
//! loses, which backups are left out a while, which copies given up on are freed when).
//! Each placement's backups come from the real [`placement`] through a real
//! `BackupSelector` (each simulated backup its own failure domain), which keeps its
//! primary counts as replicas come and go. Only the loop carrying out their effects
//! through the [`World`] stands in for `Replicator`, and: the server list, read from the
//! world (no cache, no probes: a backup no longer listed fails at the next tick); closes
//! sent inline, not in the background; exclusions on the simulation's time scale
//! (`FAILED_BACKUP_EXCLUSION_US`).
//!
//! The driver is synchronous: one call at a time, each a boundary where the world moves
//! on (a real master writes the R replicas of a range concurrently; here they go one
//! after the other, and a crash can fall between any two of them, which covers the
//! states concurrency leaves behind). A fill of a new replica goes in chunks, so a crash
//! can leave it part written.

use bytes::Bytes;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId, TableId, Version};
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, Tablet};
use rampart_master::appender::FORGET_CLEAN_STEPS_MAX;
use rampart_master::cleaner::{CleaningPass, StepEnd, PASS_SURVIVORS_MAX, STEP_BYTES};
use rampart_master::lease::{Clock, Lease};
use rampart_master::object_store::{Batch, ObjectStore, WriteOp};
use rampart_master::replay::{RecoveryPiece, ReplayState};
use rampart_master::replica_manager::backup_selector::{BackupInfo, BackupSelector};
use rampart_master::replica_manager::placement;
use rampart_master::replica_manager::replica_failures::{Call, Cause, Loss, ReplicaFailures};
use rampart_master::replica_manager::segment_replicas::{Replica, SegmentReplicas};
use rampart_master::replica_manager::settling::{Bump, Effect, Patience, Settling};
use rampart_master::segmented_log::SegmentRange;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::backup::Refusal;
use crate::checker::{key_bytes, tag, History, KeyState, Op, OpIndex};
use crate::world::{CoordinatorAnswer, Delivery, Request, Stop, World, LEASE_US};
use rampart_check::{Input, Operation, Output};

/// Largest value a simulated master takes (above what the workload writes).
pub const VALUE_BYTES_MAX: usize = 16 * 1024;

/// A backup that failed, or refused an open or a close, is not chosen again for this
/// long (µs): the simulation's time scale, where the replicator's are seconds.
const FAILED_BACKUP_EXCLUSION_US: u64 = 50_000;

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
    table: TableId,
    store: ObjectStore,
    segment_bytes: u32,
    replicas: usize,
    segments: BTreeMap<SegmentId, SegmentReplicas<()>>,
    /// The real core deciding what each failed call loses, which backups are
    /// excluded, and which copies given up on to free when; on simulated time.
    failures: ReplicaFailures<Duration>,
    /// The real backup selector, seeded from the world at the first placement.
    selector: Option<BackupSelector>,
    /// Why it stopped (killed, fatal, or its log full), once it did.
    pub stopped: Option<Stop>,
    /// The real lease, on simulated time: it serves reads and takes writes only while
    /// the lease holds (`MasterService` checks it when a request arrives).
    lease: Lease,
    /// The cleaning pass under way, if any (as the appender holds it).
    pass: Option<CleaningPass>,
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

    /// Between batches: frees abandoned copies and re-creates one lost replica of a
    /// closed segment (as `Replicator::tick`).
    pub fn tick(&mut self, world: &mut World) -> Result<(), Stop> {
        self.free_abandoned(world)?;
        // Backups the server list no longer shows Up fail at once.
        let listed: BTreeSet<ServerId> = world.listed_backups().into_iter().collect();
        let holding: BTreeSet<ServerId> = self
            .segments
            .values()
            .flat_map(|s| s.backups().collect::<Vec<_>>())
            .collect();
        for backup in holding.difference(&listed) {
            self.backup_failed(world, *backup);
        }
        self.failures.expire(sim_now(world));
        let under = self
            .segments
            .iter()
            .find(|(_, s)| s.is_closed() && s.missing() > 0)
            .map(|(id, _)| *id);
        if let Some(id) = under {
            self.settle(world, id, Patience::OneAttempt)?;
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

    /// The log freed `id`: its replicas are abandoned at every epoch, freed by `tick`.
    fn free_segment(&mut self, id: SegmentId) {
        if let Some(segment) = self.segments.remove(&id) {
            let freed = self.failures.segment_freed(id, &segment);
            self.placement_lost(|selector| {
                placement::lost(selector, freed.iter().map(|(lost, _)| lost));
            });
        }
    }

    fn replicate(&mut self, world: &mut World, range: &SegmentRange) -> Result<(), Stop> {
        let id = range.segment;
        let replicas = self.replicas;
        self.segments
            .entry(id)
            .or_insert_with(|| SegmentReplicas::new(id, replicas, range.start));
        self.settle(world, id, Patience::UntilDone)?;
        if !self.segment(id).writable(range.start) {
            return Err(Stop::Fatal(format!("{id} not writable at {}", range.start)));
        }
        let bytes = self.bytes(id, range.start, range.end);
        let live: Vec<(usize, ServerId, FrameHandle, Epoch)> = self
            .segment(id)
            .live()
            .map(|(slot, r)| (slot, r.backup, r.handle, r.epoch))
            .collect();
        let mut lost_any = false;
        for (slot, backup, handle, epoch) in live {
            let written = self.write(world, backup, (handle, epoch), range.start, &bytes);
            if let Err(failure) = written {
                lost_any = true;
                self.apply_failure(world, id, (Call::Update { slot }, backup), failure)?;
            }
        }
        self.segment_mut(id).wrote(range.end);
        if lost_any {
            self.settle(world, id, Patience::UntilDone)?;
        }
        if range.closes {
            for slot in self.segment_mut(id).close() {
                self.close(world, id, slot)?;
            }
        }
        Ok(())
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

    /// Opens replicas on `targets` at a new epoch, fills each with the segment's bytes
    /// so far (in chunks) and closes it if the segment is closed.
    fn create_replicas(
        &mut self,
        world: &mut World,
        id: SegmentId,
        targets: Vec<(usize, ServerId)>,
        fresh: bool,
    ) -> Result<(), Stop> {
        let segment = self.segment_mut(id);
        let epoch = segment.take_epoch();
        let (len, closed) = (segment.len(), segment.is_closed());
        let bytes = self.bytes(id, 0, len);
        for (slot, backup) in targets {
            match self.create_replica(world, id, backup, epoch, &bytes, closed) {
                Ok(handle) => {
                    world.note(format!(
                        "{}: {id} placed on {backup} (slot {slot}) at epoch {epoch}, {len} bytes{}",
                        self.id,
                        if fresh { ", fresh" } else { "" }
                    ));
                    self.segment_mut(id)
                        .placed(slot, Replica::new(backup, handle, epoch, ()));
                }
                // Refused (an older copy here is newer than this epoch), the backup
                // excluded a while: the next round tries another.
                Err(failure) => {
                    self.placement_lost(|selector| placement::open_failed(selector, slot, backup));
                    self.apply_failure(world, id, (Call::Open, backup), failure)?;
                }
            }
        }
        Ok(())
    }

    /// Opens a replica of `id` on `backup` at `epoch`, fills it and closes it if the
    /// segment is closed (as `Replicator::create_replica`). A failure after the open
    /// may have reached the backup leaves a frame there: it is abandoned (freed by
    /// `tick`, bounded by `epoch`, which no later copy reuses), or it would hold one of
    /// the backup's frames for good.
    fn create_replica(
        &mut self,
        world: &mut World,
        id: SegmentId,
        backup: ServerId,
        epoch: Epoch,
        bytes: &[u8],
        closed: bool,
    ) -> Result<FrameHandle, Failure> {
        let created = self.open_and_fill(world, id, backup, epoch, bytes, closed);
        if created.is_err() {
            self.failures.open_failed(id, backup, epoch);
        }
        created
    }

    /// The open, the fill in chunks and, for a closed segment, the close.
    fn open_and_fill(
        &mut self,
        world: &mut World,
        id: SegmentId,
        backup: ServerId,
        epoch: Epoch,
        bytes: &[u8],
        closed: bool,
    ) -> Result<FrameHandle, Failure> {
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
        let chunk = world.config.fill_chunk_bytes.max(1) as usize;
        for (n, piece) in bytes.chunks(chunk).enumerate() {
            self.write(world, backup, (handle, epoch), (n * chunk) as u32, piece)?;
        }
        if closed {
            let length = bytes.len() as u32;
            self.close_replica(world, backup, (handle, epoch), length)?;
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

    fn bytes(&self, id: SegmentId, start: u32, end: u32) -> Vec<u8> {
        self.store
            .log()
            .segment_bytes(id)
            .and_then(|b| b.get(start as usize..end as usize))
            .expect("a replicated range lies in the log")
            .to_vec()
    }
}

/// The simulated time as the real cores take it.
fn sim_now(world: &World) -> Duration {
    Duration::from_micros(world.now_us)
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
            let created =
                master.create_replica(&mut world, SegmentId(segment), backup, Epoch(1), &[], false);
            assert!(matches!(created, Err(Failure::Backup)));
        }
        assert!(
            world.trace.iter().any(|line| line.contains("(Unanswered)")),
            "an open reached the backup"
        );
        world.config.drop_p = 0.0;
        master.tick(&mut world).expect("nothing fences or kills it");
        assert!(
            world.backups[0].fence_and_list(master.id).is_empty(),
            "every frame the master gave up on was freed"
        );
    }
}
