//! `Appender`: the single writer of a master's log, with group commit.
//!
//! Every write-type request becomes a job on a bounded queue. One task takes a job,
//! then every job already waiting (up to [`BATCH_OPS_MAX`] operations or
//! [`BATCH_BYTES_MAX`] bytes), and processes them as one batch:
//!
//! 1. **stage** — under the store lock, check and append each operation
//!    ([`ObjectStore::stage`]), then seal the batch with one Tailwind checksum;
//! 2. **replicate** — hand the sealed byte ranges to the [`Replicator`] and wait until
//!    every replica holds them (the lock is not held: reads continue meanwhile);
//! 3. **publish** — under the lock, make the batch visible to reads;
//! 4. **reply** — complete every job of the batch.
//!
//! Requests that arrive while a batch is in steps 1–3 queue up and form the next batch,
//! so under load many writes share one replication round trip.
//!
//! Recovery replay ([`Appender::replay`]) travels on the same queue: consecutive replay
//! jobs form a batch of their own (never mixed with client writes, whose publish checks
//! ownership), staged piece by piece with
//! [`ObjectStore::stage_replay`] — the store lock is taken once per piece, so reads
//! wait at most one piece's staging — then sealed, replicated and published with
//! [`ObjectStore::publish_recovered`]. Forgetting a failed recovery's objects
//! ([`Appender::forget_unowned`]) is ordered after every replay job queued before it,
//! and logged: it cleans every segment holding an entry of that recovery out of the
//! log, so that none of them comes back should this master own the range later and
//! crash, and replicates the cleaning before it answers.
//!
//! So the queue carries two kinds of work. *Logged* jobs (writes, replays) are batched,
//! replicated, published and answered as above (a forget runs alone, and is replicated
//! before its answer). *Store jobs* log nothing: each is a
//! closure run alone under the store's lock, between batches, in submission order,
//! that answers its submitter itself (`Appender::on_store`). A new change of the store
//! that needs ordering with writes (and no replication) is a new method over
//! `on_store`, not a new case of the task's loop.
//!
//! Before its first job the task replicates the opening of the log's first segment, so
//! that a master is on R backups before it serves anything (docs/design.md §6: a master that
//! never wrote must still be recoverable).
//!
//! Tablet ownership changes (numbered by the coordinator: [`TabletChange`]) travel on the
//! same queue and are applied between batches,
//! so they are ordered with the writes around them. Every [`UPKEEP_INTERVAL`], between
//! batches and whether or not the queue is empty, the task gives the replicator time for
//! upkeep (background closes, probing backups, re-creating lost replicas, pulling the
//! server list). A `ServerListChanged` push of a newer list pokes the replicator's
//! [`ServerListWatch`](crate::replica_manager::ServerListWatch), and the task runs that
//! upkeep at once — between two batches under load, or woken when idle — so the new list
//! is pulled without waiting for the interval.
//!
//! # Cleaning
//! The log cleaner's steps run on this task, between batches ([`crate::cleaner`] says
//! why: ordered with stage-and-publish, and replicated by the same replicator). The
//! driver here is thin: it asks the policy how urgent cleaning is, plans a pass when
//! none is running, runs one bounded step ([`ObjectStore::clean_step`]) and replicates
//! it, and commits when a survivor closed: the commit's digest goes to the head's
//! replicas, and only then are the cleaned segments freed in memory and on their
//! backups ([`Replicator::free_segments`]).
//! * *Urgent* (free buffers down to the cleaner's reserve plus one): steps run before
//!   the next batch, as long as they make progress, so writes find room.
//! * *Background* (free buffers down to the low-water mark, or a pass under way): one
//!   step after each batch. Once the queue has been empty for [`IDLE_CLEAN_AFTER`],
//!   steps run back to back from the threshold on (`--cleaner-threshold`, 90 % of the
//!   segments in use by default), until a job arrives
//!   ([`CleanerPolicy::urgency`] says why load and idleness differ).
//!
//! A write that still finds no room is answered `Retry` while the cleaner can free
//! something (the client library retries), and `NoSpace` when nothing can be freed:
//! the live data fills the memory.
//!
//! # Forgetting a range moved away
//! A change of tablets that narrows them (a move committed away) only queues the range's
//! objects to be forgotten ([`ObjectStore::forget_step`]): one step of
//! [`FORGET_STEP_OBJECTS`] after each batch, back to back while the queue is empty, so
//! that the store lock is never held for a whole tablet. The steps taint what they
//! forget; once the last is done, a tainted head is closed (the cleaner never takes the
//! head) and the cleaner takes the tainted segments first. A forget job, which opens a
//! recovery's replay, finishes the forgetting first, since replays wait for it.
//!
//! # Failure handling
//! The queue is bounded ([`APPENDER_QUEUE_MAX`]): when it is full, submitters wait
//! (back-pressure to the RPC layer, which stops reading from connections past its own
//! in-flight limit). If a submitter goes away, its job still completes atomically.
//! A [`Fatal`] replication error (this master was fenced) stops the appender for good:
//! the batch in hand and every later job are never answered, and the reason is
//! published in [`AppenderStatus`] so the process can exit.

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::ids::TabletEpoch;
use rampart_common::tablet::{HashRange, Tablet};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

use crate::cleaner::{
    CleanerPolicy, CleaningPass, PassCounts, StepEnd, Urgency, PASS_SURVIVORS_MAX, STEP_BYTES,
};
use crate::object_store::{Batch, ObjectStore, OpOutcome, WriteOp};
use crate::replay::{RecoveryPiece, ReplayState};
use crate::replica_manager::{Fatal, ReplicationConfig, ReplicationStats, Replicator};
use crate::segmented_log::NoSpace;
use crate::segmented_log::SealedRange;
use crate::tablets::EpochStep;
use rampart_common::status::Status;

/// Jobs that may wait for the appender. Beyond it, submitters wait.
pub const APPENDER_QUEUE_MAX: usize = 4096;

/// Most operations in one batch: bounds the time the store lock is held while staging.
pub const BATCH_OPS_MAX: usize = 1024;

/// Most payload bytes in one batch: bounds one replication round.
pub const BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The appender task is gone (the master is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the master is shutting down")]
pub struct AppenderClosed;

/// What the appender is asked to do. Ops and replays are *logged*: batched, replicated,
/// then published and answered; so is a forget, alone. Anything else is a [`StoreJob`]: it runs alone, between
/// batches, in submission order; a new kind of it is a new [`Appender`] method, not a
/// new arm here.
enum Job {
    Ops {
        ops: Vec<WriteOp>,
        reply: oneshot::Sender<Vec<OpOutcome>>,
    },
    Replay {
        piece: RecoveryPiece,
        /// The recovery's state. Lock order: the store, then this.
        state: Arc<Mutex<ReplayState>>,
        reply: oneshot::Sender<Result<(), NoSpace>>,
    },
    /// Forget what a failed recovery replayed into `ranges` and clean it out of the log
    /// ([`ObjectStore::forget_unowned`]); logged: the cleaning is replicated before the
    /// answer.
    Forget {
        ranges: Vec<HashRange>,
        reply: oneshot::Sender<u64>,
    },
    Store(StoreJob),
}

/// A change of the store that logs nothing (a change of tablets, forgetting unowned
/// objects), ordered after every job submitted before it. Runs under the store's lock
/// and answers its submitter itself.
struct StoreJob {
    /// For logs and `Debug`.
    name: &'static str,
    run: Box<dyn FnOnce(&mut ObjectStore) + Send>,
}

/// A numbered change of this master's tablets from the coordinator (see
/// [`OwnedTablets::step`](crate::tablets::OwnedTablets::step)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TabletChange {
    /// Change number `epoch`: take `tablets`.
    Take {
        /// The change's number.
        epoch: TabletEpoch,
        /// The tablets.
        tablets: Vec<Tablet>,
    },
    /// Change number `epoch`: drop `tablets` and forget their objects.
    Drop {
        /// The change's number.
        epoch: TabletEpoch,
        /// The tablets.
        tablets: Vec<Tablet>,
    },
    /// Serve exactly `tablets`, this master's whole set as of change `epoch` (pulled
    /// from the committed map).
    Replace {
        /// The number of the last change they reflect.
        epoch: TabletEpoch,
        /// The tablets.
        tablets: Vec<Tablet>,
    },
}

/// Handle to submit work to the appender task.
#[derive(Debug, Clone)]
pub struct Appender {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Ops { ops, .. } => write!(f, "Ops({})", ops.len()),
            Job::Replay { piece, .. } => write!(f, "Replay({})", piece.segment()),
            Job::Forget { ranges, .. } => write!(f, "Forget({})", ranges.len()),
            Job::Store(job) => write!(f, "Store({})", job.name),
        }
    }
}

/// What the appender reports about replication, for `Ping` and tests.
#[derive(Debug, Default)]
pub struct AppenderStatus {
    /// The replicator's counts after the last batch or upkeep tick.
    pub replication: Mutex<ReplicationStats>,
    /// Set once the opening of the log's first segment is on R backups (before any job
    /// is served). Versions are reserved only after it (`VersionReserver`), so a master
    /// the coordinator holds a version ceiling for has a log a recovery can find.
    pub log_started: std::sync::atomic::AtomicBool,
    /// What the cleaner did so far.
    pub cleaner: Mutex<CleanerStats>,
    /// Set once, when the appender stopped for good (e.g. fenced); the reason.
    pub fatal: Mutex<Option<String>>,
    /// Woken when `fatal` is set.
    pub fatal_notify: tokio::sync::Notify,
}

/// What the cleaner did since the master started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanerStats {
    /// Passes planned.
    pub passes: u64,
    /// Steps run.
    pub steps: u64,
    /// Commits whose digest reached every replica.
    pub commits: u64,
    /// Totals of every pass (finished or not).
    pub totals: PassCounts,
    /// Writes answered `Retry` or `NoSpace` for want of room.
    pub writes_refused: u64,
}

impl CleanerStats {
    /// Bytes copied per byte freed (LFS's write cost less its one), over all passes:
    /// `relocated / (cleaned segments · segment size − relocated)`; 0 before any freeing.
    pub fn write_cost(&self, segment_bytes: u64) -> f64 {
        let cleaned = self.totals.segments_cleaned * segment_bytes;
        let freed = cleaned.saturating_sub(self.totals.bytes_relocated);
        if freed == 0 {
            return 0.0;
        }
        self.totals.bytes_relocated as f64 / freed as f64
    }
}

impl Appender {
    /// Starts the appender task over `store` without replication (R = 0). The task ends
    /// when every handle is dropped.
    pub fn spawn(store: Arc<Mutex<ObjectStore>>) -> Appender {
        let own = store.lock().log().log_id();
        let replicator = Replicator::new(own, ReplicationConfig::none());
        Appender::spawn_replicated(store, replicator, Arc::default())
    }

    /// Starts the appender task over `store`, replicating every batch with
    /// `replicator` before it is acknowledged, and reporting into `status`.
    pub fn spawn_replicated(
        store: Arc<Mutex<ObjectStore>>,
        replicator: Replicator,
        status: Arc<AppenderStatus>,
    ) -> Appender {
        let (jobs, queue) = mpsc::channel(APPENDER_QUEUE_MAX);
        tokio::spawn(run(store, queue, replicator, status));
        Appender { jobs }
    }

    /// Queues the job `job` builds around its reply channel, and waits for the reply.
    async fn call<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<T>) -> Job,
    ) -> Result<T, AppenderClosed> {
        let (reply, done) = oneshot::channel();
        self.jobs
            .send(job(reply))
            .await
            .map_err(|_| AppenderClosed)?;
        done.await.map_err(|_| AppenderClosed)
    }

    /// Runs `change` on the store as a [`StoreJob`] and returns what it returned.
    async fn on_store<T: Send + 'static>(
        &self,
        name: &'static str,
        change: impl FnOnce(&mut ObjectStore) -> T + Send + 'static,
    ) -> Result<T, AppenderClosed> {
        self.call(|reply| {
            Job::Store(StoreJob {
                name,
                run: Box::new(move |store| {
                    let _ = reply.send(change(store));
                }),
            })
        })
        .await
    }

    /// Applies `ops` (in order, each on its own) and returns their outcomes once they
    /// are durable and visible.
    pub async fn submit(&self, ops: Vec<WriteOp>) -> Result<Vec<OpOutcome>, AppenderClosed> {
        self.call(|reply| Job::Ops { ops, reply }).await
    }

    /// Replays one recovery piece into the log; completes once its survivors are
    /// replicated and published (still invisible until their tablets are taken). Err
    /// inside when the log is full. Once queued, the job completes even if the caller
    /// goes away.
    pub async fn replay(
        &self,
        piece: RecoveryPiece,
        state: Arc<Mutex<ReplayState>>,
    ) -> Result<Result<(), NoSpace>, AppenderClosed> {
        self.call(|reply| Job::Replay {
            piece,
            state,
            reply,
        })
        .await
    }

    /// Applies a numbered change of this master's tablets, ordered after every write
    /// submitted before; returns where it stood ([`EpochStep::Gap`]: nothing was applied,
    /// pull the whole set). A `Replace` answers `Next` when applied, `Held` when what is
    /// served reflects its epoch already.
    pub async fn change_tablets(&self, change: TabletChange) -> Result<EpochStep, AppenderClosed> {
        self.on_store("ChangeTablets", move |store| match change {
            TabletChange::Take { epoch, tablets } => store.take_tablets_at(epoch, &tablets),
            TabletChange::Drop { epoch, tablets } => store.drop_tablets_at(epoch, &tablets),
            TabletChange::Replace { epoch, tablets } => {
                if store.replace_tablets(epoch, &tablets) {
                    EpochStep::Next
                } else {
                    EpochStep::Held
                }
            }
        })
        .await
    }

    /// Freezes move `id`'s range on this master, its source, ordered after every write
    /// submitted before: each write acknowledged before the freeze is in the move's
    /// dirty set ([`ObjectStore::freeze_move_out`]). Returns how much still waits.
    pub async fn freeze_move_out(
        &self,
        id: rampart_common::ids::MoveId,
    ) -> Result<Result<u64, Status>, AppenderClosed> {
        self.on_store("FreezeMoveOut", move |store| {
            store.freeze_move_out(id, std::time::Instant::now())
        })
        .await
    }

    /// Forgets every object in `ranges` this master does not own and cleans the segments
    /// holding that recovery's entries out of the log (see
    /// [`ObjectStore::forget_unowned`]), ordered after every job submitted before;
    /// returns how many objects, once the cleaning is on every replica. Segments not
    /// cleaned within [`FORGET_CLEAN_STEPS_MAX`] steps are cleaned between later
    /// batches, and replays are refused until they are.
    pub async fn forget_unowned(&self, ranges: Vec<HashRange>) -> Result<u64, AppenderClosed> {
        self.call(|reply| Job::Forget { ranges, reply }).await
    }
}

/// Cleaning steps a forget job runs at most to clean the segments holding the entries
/// it forgot out of the log ([`ObjectStore::forget_unowned`]): 4 GiB walked
/// ([`STEP_BYTES`] each), far more than one recovery partition and the writes
/// interleaved with it. Bounded, so that a log that cannot be cleaned does not hold the
/// queue; the rest is cleaned between later batches.
pub const FORGET_CLEAN_STEPS_MAX: usize = 4096;

/// Objects one step of forgetting a range moved away forgets, under one hold of the
/// store lock ([`ObjectStore::forget_step`]): about 3 ms on the 2-core VM, where the
/// whole of a 1 GiB tablet at once held every read, write and ping for 0.8 s.
pub const FORGET_STEP_OBJECTS: usize = 4096;

/// How long the queue stays empty before the master counts as idle and the cleaner
/// runs from its threshold (module doc, "Cleaning").
pub const IDLE_CLEAN_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// How often the appender gives the replicator time for upkeep when idle.
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Upkeep between batches: [`Replicator::tick`], then the re-creation of the lost
/// replicas of the closed segment it names, from the log's copy of that segment.
async fn upkeep(store: &Mutex<ObjectStore>, replicator: &mut Replicator) -> Result<(), Fatal> {
    let Some(id) = replicator.tick().await? else {
        return Ok(());
    };
    let bytes = store
        .lock()
        .log()
        .segment_bytes(id)
        .map(Bytes::copy_from_slice);
    match bytes {
        Some(bytes) => replicator.recreate(id, bytes).await,
        None => Err(Fatal::MissingBytes(id)),
    }
}

/// The cleaner's driver state (module doc, "Cleaning").
struct Cleaning {
    policy: CleanerPolicy,
    pass: Option<CleaningPass>,
    /// Totals of the passes that ended.
    ended: PassCounts,
    stats: CleanerStats,
    /// Whether the last step made progress; reset when a batch changed the log. Idle
    /// cleaning stops when it does not, rather than spin.
    progressing: bool,
    /// Segments freed by commits so far.
    freed: u64,
}

impl Cleaning {
    fn new(policy: CleanerPolicy) -> Cleaning {
        Cleaning {
            policy,
            pass: None,
            ended: PassCounts::default(),
            stats: CleanerStats::default(),
            progressing: true,
            freed: 0,
        }
    }

    /// How pressing cleaning is, with the master `idle` or not: a pass under way is
    /// finished in the background at least.
    fn urgency(&self, store: &ObjectStore, idle: bool) -> Urgency {
        let urgency = self.policy.urgency(&store.log().usage(), idle);
        // Tainted segments (a failed recovery's leftovers) hold up replays until gone;
        // those of a range still being forgotten wait for the last step, or the cleaner
        // would move objects the next steps forget.
        if self.pass.is_some() || (store.tainted_to_clean() && !store.forgetting()) {
            urgency.max(Urgency::Background)
        } else {
            urgency
        }
    }

    /// Whether cleaning could free anything now.
    fn can_free(&self, store: &ObjectStore) -> bool {
        self.pass.is_some() || store.plan_cleaning(PASS_SURVIVORS_MAX).is_some()
    }

    fn publish(&mut self, status: &AppenderStatus) {
        let current = self
            .pass
            .as_ref()
            .map(CleaningPass::counts)
            .unwrap_or_default();
        self.stats.totals = PassCounts {
            bytes_relocated: self.ended.bytes_relocated + current.bytes_relocated,
            bytes_dropped: self.ended.bytes_dropped + current.bytes_dropped,
            segments_cleaned: self.ended.segments_cleaned + current.segments_cleaned,
            survivors: self.ended.survivors + current.survivors,
        };
        *status.cleaner.lock() = self.stats;
    }
}

/// Runs one cleaning step (planning a pass first when none is under way), replicates
/// it, and commits when it ends with a survivor closed, the pass done or no buffer.
/// Returns whether it made progress: false when nothing is worth cleaning, or when no
/// buffer is free and the commit freed nothing.
async fn clean_once(
    store: &Mutex<ObjectStore>,
    replicator: &mut Replicator,
    cleaning: &mut Cleaning,
    status: &AppenderStatus,
) -> Result<bool, Fatal> {
    if cleaning.pass.is_none() {
        cleaning.pass = store.lock().plan_cleaning(PASS_SURVIVORS_MAX);
        if cleaning.pass.is_none() {
            cleaning.progressing = false;
            return Ok(false);
        }
        cleaning.stats.passes += 1;
    }
    let Some(pass) = cleaning.pass.as_mut() else {
        cleaning.progressing = false;
        return Ok(false);
    };
    let (end, ranges) = {
        let mut store = store.lock();
        let end = store.clean_step(pass, STEP_BYTES);
        (end, store.seal())
    };
    cleaning.stats.steps += 1;
    // The survivors' bytes are on every replica before any digest names them.
    replicator.replicate(&ranges).await?;
    let progress = match end {
        StepEnd::Budget => true,
        StepEnd::SurvivorClosed | StepEnd::Done | StepEnd::NoBuffer => {
            let (committed, ranges) = {
                let mut store = store.lock();
                let committed = store.commit_cleaning(pass);
                (committed, store.seal())
            };
            // The digest without the cleaned segments is on every replica of the head
            // before they are freed anywhere.
            replicator.replicate(&ranges).await?;
            match committed {
                Ok(_) => {
                    cleaning.stats.commits += 1;
                    let freed = store.lock().free_cleaned();
                    cleaning.freed += freed.len() as u64;
                    replicator.free_segments(&freed);
                    end != StepEnd::NoBuffer || !freed.is_empty()
                }
                // No room for the digest: nothing was freed, and trying again at once
                // would find none either.
                Err(NoSpace) => false,
            }
        }
    };
    if pass.is_done() {
        let counts = pass.counts();
        cleaning.ended.bytes_relocated += counts.bytes_relocated;
        cleaning.ended.bytes_dropped += counts.bytes_dropped;
        cleaning.ended.segments_cleaned += counts.segments_cleaned;
        cleaning.ended.survivors += counts.survivors;
        cleaning.pass = None;
    }
    cleaning.progressing = progress;
    cleaning.publish(status);
    Ok(progress)
}

/// Cleans before a batch while writes are about to stop and cleaning makes progress,
/// until a commit frees a segment: then the batch gets its chance (writes that still
/// find no room are answered `Retry`). A master whose live data keeps it short of free
/// segments stays urgent after every commit; cleaning on until it is not would hold
/// the batch — and upkeep, with the backups' frees of what was cleaned — for as long
/// as the load lasts. Upkeep due meanwhile runs between steps.
async fn clean_urgently(
    store: &Mutex<ObjectStore>,
    replicator: &mut Replicator,
    cleaning: &mut Cleaning,
    status: &AppenderStatus,
    next_upkeep: &mut tokio::time::Instant,
) -> Result<(), Fatal> {
    let freed_before = cleaning.freed;
    while cleaning.urgency(&store.lock(), false) == Urgency::Urgent {
        if !clean_once(store, replicator, cleaning, status).await? {
            break;
        }
        if tokio::time::Instant::now() >= *next_upkeep {
            let result = upkeep(store, replicator).await;
            *status.replication.lock() = replicator.stats();
            result?;
            *next_upkeep = tokio::time::Instant::now() + UPKEEP_INTERVAL;
        }
        if cleaning.freed > freed_before {
            break;
        }
    }
    Ok(())
}

async fn run(
    store: Arc<Mutex<ObjectStore>>,
    mut queue: mpsc::Receiver<Job>,
    mut replicator: Replicator,
    status: Arc<AppenderStatus>,
) {
    // The log's first segment (its header, digest and safe version) goes to R backups
    // before any job — a tablet taken, a write, a replay — is served: a master that
    // crashed before its first write must leave a log that recovery finds, or its
    // tablets would never come back. Jobs queue meanwhile (bounded).
    let opening = store.lock().seal();
    if let Err(fatal) = replicator.replicate(&opening).await {
        return stop(fatal, &status, queue, Vec::new()).await;
    }
    *status.replication.lock() = replicator.stats();
    status
        .log_started
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut next_upkeep = tokio::time::Instant::now() + UPKEEP_INTERVAL;
    let mut carried: Option<Job> = None;
    let server_list = replicator.server_list_watch();
    let mut cleaning = Cleaning::new(CleanerPolicy::of(store.lock().config()));
    let mut last_job = tokio::time::Instant::now();
    loop {
        // Upkeep runs every UPKEEP_INTERVAL whether or not jobs keep coming: under
        // steady load the queue is never empty, and lost closed replicas, probes and
        // frees must not wait for a lull. A pushed server list runs it at once.
        let poked = server_list.take_poke();
        if poked || tokio::time::Instant::now() >= next_upkeep {
            let result = upkeep(&store, &mut replicator).await;
            *status.replication.lock() = replicator.stats();
            if let Err(fatal) = result {
                return stop(fatal, &status, queue, Vec::new()).await;
            }
            next_upkeep = tokio::time::Instant::now() + UPKEEP_INTERVAL;
        }
        let first = match carried.take() {
            Some(job) => job,
            None => {
                // Idle (no job for IDLE_CLEAN_AFTER) with cleaning to do: one step, then
                // look at the queue again. A queue empty only between two batches of a
                // busy master is not idle: its clients are about to send more.
                let idle_wanted = queue.is_empty()
                    && cleaning.progressing
                    && cleaning.urgency(&store.lock(), true) != Urgency::Idle;
                let idle_from = last_job + IDLE_CLEAN_AFTER;
                if queue.is_empty() && store.lock().forgetting() {
                    if let Err(fatal) =
                        forget_moved_away(&store, &mut replicator, &mut cleaning).await
                    {
                        return stop(fatal, &status, queue, Vec::new()).await;
                    }
                    // Room for the reactor's other tasks between steps.
                    tokio::task::yield_now().await;
                    continue;
                }
                if idle_wanted && tokio::time::Instant::now() >= idle_from {
                    if let Err(fatal) =
                        clean_once(&store, &mut replicator, &mut cleaning, &status).await
                    {
                        return stop(fatal, &status, queue, Vec::new()).await;
                    }
                    continue;
                }
                let job = tokio::select! {
                    biased;
                    job = queue.recv() => job,
                    _ = tokio::time::sleep_until(next_upkeep) => continue,
                    _ = server_list.poked() => continue,
                    _ = tokio::time::sleep_until(idle_from), if idle_wanted => continue,
                };
                match job {
                    Some(job) => job,
                    None => return,
                }
            }
        };
        last_job = tokio::time::Instant::now();
        // Gather a batch of ops jobs, or of replay jobs; a job of another kind ends the
        // batch and runs after it (a store job alone, a logged one as the next batch).
        let mut ops_jobs = Vec::new();
        let mut replay_jobs = Vec::new();
        let mut alone = None;
        let (mut ops, mut bytes) = (0usize, 0usize);
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                Job::Ops {
                    ops: job_ops,
                    reply,
                } if replay_jobs.is_empty() => {
                    ops += job_ops.len();
                    bytes += job_ops.iter().map(WriteOp::bytes).sum::<usize>();
                    ops_jobs.push((job_ops, reply));
                }
                Job::Replay {
                    piece,
                    state,
                    reply,
                } if ops_jobs.is_empty() => {
                    ops += piece.entries().len();
                    bytes += piece.bytes();
                    replay_jobs.push(ReplayJob {
                        piece,
                        state,
                        reply,
                    });
                }
                other => {
                    alone = Some(other);
                    break;
                }
            }
            if ops >= BATCH_OPS_MAX || bytes >= BATCH_BYTES_MAX {
                break;
            }
            next = queue.try_recv().ok();
        }
        if !ops_jobs.is_empty() || !replay_jobs.is_empty() {
            // Room for the batch first, when writes are about to stop.
            if let Err(fatal) = clean_urgently(
                &store,
                &mut replicator,
                &mut cleaning,
                &status,
                &mut next_upkeep,
            )
            .await
            {
                let mut parked: Parked = ops_jobs
                    .into_iter()
                    .map(|(_, reply)| ParkedReply::Ops(reply))
                    .collect();
                parked.extend(
                    replay_jobs
                        .into_iter()
                        .map(|job| ParkedReply::Replay(job.reply)),
                );
                return stop(fatal, &status, queue, parked).await;
            }
            cleaning.progressing = true;
        }
        if !ops_jobs.is_empty() {
            let result = write_batch(&store, ops_jobs, &mut replicator, &mut cleaning).await;
            // Counting under-replicated segments walks them all: only when a replica
            // changed, not after every batch.
            if let Some(stats) = replicator.take_changed_stats() {
                *status.replication.lock() = stats;
            }
            if let Err((fatal, parked)) = result {
                return stop(fatal, &status, queue, parked).await;
            }
        }
        if !replay_jobs.is_empty() {
            let result = replay_batch(&store, replay_jobs, &mut replicator).await;
            if let Some(stats) = replicator.take_changed_stats() {
                *status.replication.lock() = stats;
            }
            if let Err((fatal, parked)) = result {
                return stop(fatal, &status, queue, parked).await;
            }
        }
        // Past the threshold (or a pass under way): one step between batches.
        if cleaning.urgency(&store.lock(), false) != Urgency::Idle && cleaning.progressing {
            if let Err(fatal) = clean_once(&store, &mut replicator, &mut cleaning, &status).await {
                let parked = match alone {
                    Some(Job::Ops { reply, .. }) => vec![ParkedReply::Ops(reply)],
                    Some(Job::Replay { reply, .. }) => vec![ParkedReply::Replay(reply)],
                    Some(Job::Forget { reply, .. }) => vec![ParkedReply::Forget(reply)],
                    _ => Vec::new(),
                };
                return stop(fatal, &status, queue, parked).await;
            }
        }
        if store.lock().forgetting() {
            if let Err(fatal) = forget_moved_away(&store, &mut replicator, &mut cleaning).await {
                let parked = match alone {
                    Some(Job::Ops { reply, .. }) => vec![ParkedReply::Ops(reply)],
                    Some(Job::Replay { reply, .. }) => vec![ParkedReply::Replay(reply)],
                    Some(Job::Forget { reply, .. }) => vec![ParkedReply::Forget(reply)],
                    _ => Vec::new(),
                };
                return stop(fatal, &status, queue, parked).await;
            }
        }
        match alone {
            Some(Job::Store(job)) => {
                let tainted = store.lock().tainted_held();
                (job.run)(&mut store.lock());
                // A change of tablets that narrowed them (a move committed away) tainted
                // what it forgot, spread over most of the log: the cleaner takes those
                // segments first, in the background (a step after each batch, back to
                // back when idle), and the head, which it never takes, closes now, so
                // that a range moving in again waits for the cleaner, not for a rollover
                // of an idle head. Cleaning it all here would hold every write.
                // (With objects still to forget, the last step closes it instead.)
                let narrowed = {
                    let store = store.lock();
                    store.tainted_held() > tainted && !store.forgetting()
                };
                if narrowed {
                    let ranges = {
                        let mut store = store.lock();
                        // A head that cannot close now closes at its next rollover.
                        let _ = store.close_tainted_head();
                        store.seal()
                    };
                    cleaning.progressing = true;
                    if let Err(fatal) = replicator.replicate(&ranges).await {
                        return stop(fatal, &status, queue, Vec::new()).await;
                    }
                }
            }
            Some(Job::Forget { ranges, reply }) => {
                let result =
                    forget_batch(&store, &ranges, &mut replicator, &mut cleaning, &status).await;
                match result {
                    Ok(forgotten) => {
                        let _ = reply.send(forgotten);
                    }
                    Err(fatal) => {
                        let parked = vec![ParkedReply::Forget(reply)];
                        return stop(fatal, &status, queue, parked).await;
                    }
                }
            }
            Some(job @ (Job::Ops { .. } | Job::Replay { .. })) => carried = Some(job),
            None => {}
        }
    }
}

/// A reply of a batch that must never be answered. Held, never read: dropping it would
/// tell its submitter the appender is gone.
#[allow(dead_code)]
enum ParkedReply {
    Ops(oneshot::Sender<Vec<OpOutcome>>),
    Replay(oneshot::Sender<Result<(), NoSpace>>),
    Forget(oneshot::Sender<u64>),
}

/// Replies of a batch that must never be answered.
type Parked = Vec<ParkedReply>;

/// One queued replay job.
struct ReplayJob {
    piece: RecoveryPiece,
    state: Arc<Mutex<ReplayState>>,
    reply: oneshot::Sender<Result<(), NoSpace>>,
}

/// The appender stops for good: it reports `fatal` and never answers the parked jobs
/// nor any later one, so no client sees a write acknowledged (their calls time out, and
/// the client library reports them as indeterminate). The master process exits on the
/// report (`MasterService::failed`).
async fn stop(fatal: Fatal, status: &AppenderStatus, queue: mpsc::Receiver<Job>, parked: Parked) {
    tracing::error!(%fatal, "appender stopped; this master serves no more writes");
    *status.fatal.lock() = Some(fatal.to_string());
    status.fatal_notify.notify_waiters();
    status.fatal_notify.notify_one();
    // Holding the queue and the parked replies keeps every submitter waiting.
    let _held = (queue, parked);
    std::future::pending::<()>().await;
}

/// Stages, replicates, publishes and acknowledges one batch.
async fn write_batch(
    store: &Mutex<ObjectStore>,
    jobs: Vec<(Vec<WriteOp>, oneshot::Sender<Vec<OpOutcome>>)>,
    replicator: &mut Replicator,
    cleaning: &mut Cleaning,
) -> Result<(), (Fatal, Parked)> {
    let mut batch = Batch::new();
    let (outcomes, ranges): (Vec<Vec<OpOutcome>>, Vec<SealedRange>) = {
        let mut store = store.lock();
        let mut outcomes: Vec<Vec<OpOutcome>> = jobs
            .iter()
            .map(|(ops, _)| ops.iter().map(|op| store.stage(&mut batch, op)).collect())
            .collect();
        let refused = outcomes
            .iter()
            .flatten()
            .filter(|o| o.status == Status::NoSpace)
            .count();
        if refused > 0 {
            cleaning.stats.writes_refused += refused as u64;
            // Back-pressure, not an error, while the cleaner can still free room.
            if cleaning.can_free(&store) {
                for outcome in outcomes.iter_mut().flatten() {
                    if outcome.status == Status::NoSpace {
                        outcome.status = Status::Retry;
                    }
                }
            }
        }
        (outcomes, store.seal())
    };

    // Replication point: until every replica holds the batch's ranges (in order: a new
    // head's header and digest before the old head's footer), nothing below runs, so
    // nothing is visible or acknowledged. With R = 0 the batch is durable once sealed
    // in DRAM.
    if let Err(fatal) = replicator.replicate(&ranges).await {
        let parked = jobs
            .into_iter()
            .map(|(_, reply)| ParkedReply::Ops(reply))
            .collect();
        return Err((fatal, parked));
    }

    if !batch.is_empty() {
        store.lock().publish(batch);
    }
    for ((_, reply), outcome) in jobs.into_iter().zip(outcomes) {
        // A submitter that went away still had its writes applied atomically.
        let _ = reply.send(outcome);
    }
    Ok(())
}

/// Forgets what a failed recovery left in `ranges` ([`ObjectStore::forget_unowned`])
/// and cleans the segments that hold its entries out of the log, so that none of them
/// can come back; returns how many objects were forgotten. Steps are bounded
/// ([`FORGET_CLEAN_STEPS_MAX`]); what is left is cleaned between later batches.
async fn forget_batch(
    store: &Mutex<ObjectStore>,
    ranges: &[HashRange],
    replicator: &mut Replicator,
    cleaning: &mut Cleaning,
    status: &AppenderStatus,
) -> Result<u64, Fatal> {
    while store.lock().forgetting() {
        store.lock().forget_step(FORGET_STEP_OBJECTS);
        tokio::task::yield_now().await;
    }
    let forgotten = store.lock().forget_unowned(ranges);
    clean_tainted(store, replicator, cleaning, status).await?;
    Ok(forgotten)
}

/// One step of forgetting the ranges moved away ([`ObjectStore::forget_step`]); after
/// the last, closes a tainted head, so that the cleaner can take it, and replicates
/// the head opened instead.
async fn forget_moved_away(
    store: &Mutex<ObjectStore>,
    replicator: &mut Replicator,
    cleaning: &mut Cleaning,
) -> Result<(), Fatal> {
    let ranges = {
        let mut store = store.lock();
        store.forget_step(FORGET_STEP_OBJECTS);
        if store.forgetting() {
            return Ok(());
        }
        // A head that cannot close now closes at its next rollover.
        let _ = store.close_tainted_head();
        store.seal()
    };
    cleaning.progressing = true;
    replicator.replicate(&ranges).await
}

/// Cleans the tainted segments out of the log (closing a tainted head first), in at
/// most [`FORGET_CLEAN_STEPS_MAX`] steps, and replicates a new head opened meanwhile;
/// what is left is cleaned between later batches.
async fn clean_tainted(
    store: &Mutex<ObjectStore>,
    replicator: &mut Replicator,
    cleaning: &mut Cleaning,
    status: &AppenderStatus,
) -> Result<(), Fatal> {
    for _ in 0..FORGET_CLEAN_STEPS_MAX {
        let tainted = {
            let mut store = store.lock();
            // A head that cannot close now closes at its next rollover.
            let _ = store.close_tainted_head();
            store.tainted_held()
        };
        if tainted == 0 || !clean_once(store, replicator, cleaning, status).await? {
            break;
        }
    }
    let tainted = store.lock().tainted_held();
    if tainted > 0 {
        tracing::warn!(
            tainted,
            "segments with entries of ranges not owned here are still in the log; replays wait for the cleaner"
        );
    }
    // A new head opened above, if any, goes to the backups before the answer.
    let ranges = store.lock().seal();
    replicator.replicate(&ranges).await
}

/// Stages, replicates and publishes one batch of recovery pieces, then answers them.
async fn replay_batch(
    store: &Mutex<ObjectStore>,
    jobs: Vec<ReplayJob>,
    replicator: &mut Replicator,
) -> Result<(), (Fatal, Parked)> {
    let mut batch = Batch::new();
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in &jobs {
        // One piece per lock hold: reads on this master wait for one piece at most.
        let mut store = store.lock();
        let mut state = job.state.lock();
        outcomes.push(store.stage_replay(&mut batch, &mut state, &job.piece));
    }
    let ranges = store.lock().seal();
    // The same replication point as for writes: the pieces are in this master's
    // replicas before the recovery that sent them may report success.
    if let Err(fatal) = replicator.replicate(&ranges).await {
        let parked = jobs
            .into_iter()
            .map(|job| ParkedReply::Replay(job.reply))
            .collect();
        return Err((fatal, parked));
    }
    if !batch.is_empty() {
        store.lock().publish_recovered(batch);
    }
    for (job, outcome) in jobs.into_iter().zip(outcomes) {
        let _ = job.reply.send(outcome);
    }
    Ok(())
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::object_store::ReadResult;
    use bytes::Bytes;
    use rampart_common::config::MasterConfig;
    use rampart_common::ids::{ServerId, TableId, Version};
    use rampart_common::log::{decode_entry, Entry};
    use rampart_common::reject::RejectRules;
    use rampart_common::status::Status;
    use std::future::Future;
    use std::task::{Context, Poll, Wake, Waker};

    const TABLE: TableId = TableId(1);

    fn whole_table() -> Tablet {
        Tablet {
            table: TABLE,
            start_hash: 0,
            end_hash: u64::MAX,
            owner: ServerId(1),
        }
    }

    /// A store of 8 × 128 KiB segments that owns all of `TABLE`.
    fn store() -> Arc<Mutex<ObjectStore>> {
        let config = MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 1024 * 1024,
            value_bytes_max: 1024,
            ..Default::default()
        };
        let mut store = ObjectStore::new(ServerId(1), config);
        store.take_tablets(&[whole_table()]);
        Arc::new(Mutex::new(store))
    }

    fn write(key: &str, value: &str) -> WriteOp {
        WriteOp::Write {
            table: TABLE,
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            rules: RejectRules::default(),
            rifl: rampart_common::rifl::Rifl::NONE,
        }
    }

    /// `Checksum` entries in the whole log: one per sealed batch, plus one per segment
    /// opening and one per footer.
    fn checksum_entries(store: &ObjectStore) -> usize {
        let log = store.log();
        let mut count = 0;
        for id in log.segment_ids() {
            let bytes = log.segment_bytes(id).unwrap();
            let mut offset = 0;
            while let Some((entry, next)) = decode_entry(bytes, offset).unwrap() {
                count += usize::from(matches!(entry, Entry::Checksum(_)));
                offset = next;
            }
        }
        count
    }

    struct NoopWake;

    impl Wake for NoopWake {
        fn wake(self: Arc<Self>) {}
    }

    /// Polls `future` once, outside the runtime's cooperative budget, so that a submit
    /// gets its job onto the queue (the queue has room) and then waits for the reply.
    /// Lets a test fix the queue order without racing the appender task.
    fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let waker = Waker::from(Arc::new(NoopWake));
        std::pin::Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_submits_all_complete_and_are_readable() {
        let store = store();
        let appender = Appender::spawn(Arc::clone(&store));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200 {
            let appender = appender.clone();
            tasks.spawn(async move {
                let outcomes = appender
                    .submit(vec![write(&format!("key-{i}"), &format!("value-{i}"))])
                    .await
                    .unwrap();
                (i, outcomes)
            });
        }
        let mut done = 0;
        while let Some(joined) = tasks.join_next().await {
            let (i, outcomes) = joined.unwrap();
            assert_eq!(outcomes.len(), 1);
            assert_eq!(outcomes[0].status, Status::Ok, "write {i}");
            done += 1;
        }
        assert_eq!(done, 200);
        let store = store.lock();
        assert_eq!(store.object_count(), 200);
        for i in 0..200 {
            let read = store.read(TABLE, format!("key-{i}").as_bytes());
            assert_eq!(read.status(), Status::Ok);
            assert_eq!(read.version(), Version::FIRST);
            assert_eq!(read.value(), format!("value-{i}").into_bytes());
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn group_commit_seals_many_queued_jobs_with_few_checksums() {
        const JOBS: usize = 100;
        let store = store();
        let appender = Appender::spawn(Arc::clone(&store));
        let before = checksum_entries(&store.lock());
        // On a current-thread runtime none of these runs until this task awaits, so
        // every job is queued before the appender wakes.
        let tasks: Vec<_> = (0..JOBS)
            .map(|i| {
                let appender = appender.clone();
                tokio::spawn(async move {
                    appender
                        .submit(vec![write(&format!("key-{i}"), "v")])
                        .await
                        .unwrap()
                })
            })
            .collect();
        for task in tasks {
            let outcomes = task.await.unwrap();
            assert_eq!(outcomes[0].status, Status::Ok);
        }
        let store = store.lock();
        assert_eq!(store.object_count(), JOBS as u64);
        assert_eq!(
            store.log().segment_ids().count(),
            1,
            "no rollover to muddle the count"
        );
        let sealed = checksum_entries(&store) - before;
        // One batch per job would seal JOBS times.
        assert!(sealed >= 1);
        assert!(sealed < JOBS / 4, "{sealed} batches for {JOBS} queued jobs");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn drop_tablets_is_ordered_after_writes_submitted_before_it() {
        const WRITES: usize = 50;
        let store = store();
        let appender = Appender::spawn(Arc::clone(&store));
        let mut writes: Vec<_> = (0..WRITES)
            .map(|i| {
                Box::pin(tokio::task::unconstrained(
                    appender.submit(vec![write(&format!("key-{i}"), "v")]),
                ))
            })
            .collect();
        for write in &mut writes {
            assert!(poll_once(write).is_pending());
        }
        let mut drop = Box::pin(tokio::task::unconstrained(appender.change_tablets(
            TabletChange::Drop {
                epoch: TabletEpoch(1),
                tablets: vec![whole_table()],
            },
        )));
        assert!(poll_once(&mut drop).is_pending());
        let mut late = Box::pin(tokio::task::unconstrained(
            appender.submit(vec![write("late", "v")]),
        ));
        assert!(poll_once(&mut late).is_pending());

        for write in writes {
            let outcomes = write.await.unwrap();
            assert_eq!(outcomes[0].status, Status::Ok);
        }
        assert_eq!(drop.await.expect("the drop task ends"), EpochStep::Next);
        let late = late.await.unwrap();
        assert_eq!(late[0].status, Status::UnknownTablet);

        assert_eq!(store.lock().object_count(), 0);
        assert_eq!(
            store.lock().read(TABLE, b"key-0").status(),
            Status::UnknownTablet
        );
        let take = TabletChange::Take {
            epoch: TabletEpoch(2),
            tablets: vec![whole_table()],
        };
        assert_eq!(
            appender
                .change_tablets(take)
                .await
                .expect("the appender runs"),
            EpochStep::Next
        );
        for i in 0..WRITES {
            let read = store.lock().read(TABLE, format!("key-{i}").as_bytes());
            assert_eq!(read.status(), Status::ObjectDoesntExist, "key-{i} is gone");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_range_moved_away_is_forgotten_in_steps_between_writes_then_cleaned_out() {
        use rampart_common::ids::key_hash;
        const KEYS: usize = 40_000;
        let config = MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 32 * 1024 * 1024,
            value_bytes_max: 1024,
            ..Default::default()
        };
        let mut store = ObjectStore::new(ServerId(1), config);
        store.take_tablets(&[whole_table()]);
        let store = Arc::new(Mutex::new(store));
        let appender = Appender::spawn(Arc::clone(&store));
        let keys: Vec<String> = (0..KEYS).map(|i| format!("key-{i}")).collect();
        for chunk in keys.chunks(256) {
            let ops = chunk.iter().map(|k| write(k, "v")).collect();
            let outcomes = appender.submit(ops).await.expect("the appender runs");
            assert!(outcomes.iter().all(|o| o.status == Status::Ok));
        }
        let split = u64::MAX / 2;
        let low = |key: &str| key_hash(key.as_bytes()).0 <= split;
        let kept = keys.iter().filter(|k| low(k)).count() as u64;
        assert!(KEYS as u64 - kept > 4 * FORGET_STEP_OBJECTS as u64);
        let lower = Tablet {
            end_hash: split,
            ..whole_table()
        };
        let change = TabletChange::Replace {
            epoch: TabletEpoch(1),
            tablets: vec![lower],
        };
        assert_eq!(
            appender
                .change_tablets(change)
                .await
                .expect("the appender runs until dropped"),
            EpochStep::Next
        );
        // A write right after is served between two steps, not after the whole range.
        let key = keys
            .iter()
            .find(|k| low(k))
            .expect("a key in the lower half");
        let outcomes = appender
            .submit(vec![write(key, "w")])
            .await
            .expect("the appender runs until dropped");
        assert_eq!(outcomes[0].status, Status::Ok);
        assert!(
            store.lock().forgetting(),
            "the range was forgotten before a write submitted right after the change"
        );
        let settled = async {
            loop {
                {
                    let store = store.lock();
                    if !store.forgetting() && store.tainted_held() == 0 {
                        return;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), settled)
            .await
            .expect("the range was forgotten and its segments cleaned out");
        let store = store.lock();
        assert_eq!(store.object_count(), kept);
        for key in &keys {
            let status = store.read(TABLE, key.as_bytes()).status();
            let expected = if low(key) {
                Status::Ok
            } else {
                Status::UnknownTablet
            };
            assert_eq!(status, expected, "{key}");
        }
    }

    /// Segments the cleaner freed after a master of 8 segments, configured with
    /// `threshold_pct`, overwrote one key until half its segments were in use and then
    /// stayed idle.
    async fn cleaned_when_idle_at_half_full(threshold_pct: u8) -> u64 {
        let config = MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 1024 * 1024,
            value_bytes_max: 1024,
            cleaner_threshold_pct: threshold_pct,
        };
        let mut store = ObjectStore::new(ServerId(1), config);
        store.take_tablets(&[whole_table()]);
        let store = Arc::new(Mutex::new(store));
        let own = store.lock().log().log_id();
        let status = Arc::new(AppenderStatus::default());
        let replicator = Replicator::new(own, ReplicationConfig::none());
        let appender =
            Appender::spawn_replicated(Arc::clone(&store), replicator, Arc::clone(&status));
        let value = "v".repeat(1000);
        // About 2.7 segments of versions of one key: 3 or 4 of 8 segments in use,
        // above the low-water mark (3 free), so nothing is cleaned under load.
        for _ in 0..350 {
            let outcomes = appender
                .submit(vec![write("k", &value)])
                .await
                .expect("the appender runs");
            assert_eq!(outcomes[0].status, Status::Ok);
        }
        assert_eq!(status.cleaner.lock().totals.segments_cleaned, 0);
        // Idle for a second at most (fifty times what makes a master idle), however
        // slowly a loaded machine runs this task.
        let mut cleaned = 0;
        for _ in 0..50 {
            tokio::time::sleep(IDLE_CLEAN_AFTER).await;
            cleaned = status.cleaner.lock().totals.segments_cleaned;
            if cleaned > 0 {
                break;
            }
        }
        drop(appender);
        cleaned
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_idle_master_cleans_from_its_configured_threshold() {
        assert!(cleaned_when_idle_at_half_full(40).await > 0);
        assert_eq!(cleaned_when_idle_at_half_full(90).await, 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_master_that_stays_short_of_free_segments_still_takes_writes() {
        // Live data leaves at most the reserve and one segment free: cleaning is urgent
        // before every batch and never stops being so. Each batch must still get in
        // after some cleaning (or be told to retry), not wait for cleaning that never
        // ends (upkeep, and so the backups' frees, would wait with it).
        let config = MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 16 * 128 * 1024,
            value_bytes_max: 1024,
            ..Default::default()
        };
        let mut store = ObjectStore::new(ServerId(1), config);
        store.take_tablets(&[whole_table()]);
        let store = Arc::new(Mutex::new(store));
        let appender = Appender::spawn(Arc::clone(&store));
        let value = "v".repeat(1000);
        let keys = 1550;
        for chunk in (0..keys).collect::<Vec<_>>().chunks(64) {
            let ops = chunk
                .iter()
                .map(|k| write(&format!("k{k}"), &value))
                .collect();
            let outcomes = appender.submit(ops).await.expect("the appender runs");
            assert!(outcomes.iter().all(|o| o.status == Status::Ok));
        }
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(7);
        let overwrites = async {
            let (mut ok, mut retry) = (0, 0);
            for _ in 0..3000 {
                let k = rand::Rng::gen_range(&mut rng, 0..keys);
                let outcomes = appender.submit(vec![write(&format!("k{k}"), &value)]).await;
                match outcomes.expect("the appender runs")[0].status {
                    Status::Ok => ok += 1,
                    Status::Retry => retry += 1,
                    other => panic!("overwrite refused: {other}"),
                }
            }
            (ok, retry)
        };
        let (ok, retry) = tokio::time::timeout(std::time::Duration::from_secs(60), overwrites)
            .await
            .expect("overwrites kept waiting for the cleaner");
        assert!(ok > 2000, "{ok} overwrites applied, {retry} told to retry");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn forgetting_a_failed_replay_cleans_its_segments_out_of_the_log() {
        use crate::replay::{PieceEntry, RecoveryPiece, ReplayState};
        use rampart_common::ids::{key_hash, SegmentId};
        let other = TableId(9);
        let store = store();
        let appender = Appender::spawn(Arc::clone(&store));
        appender.submit(vec![write("mine", "v")]).await.unwrap();
        let entries = (0..20u64)
            .map(|i| PieceEntry::Object {
                table: other,
                hash: key_hash(format!("k{i}").as_bytes()),
                version: Version(3),
                key: Bytes::from(format!("k{i}")),
                value: Bytes::from(vec![b'x'; 900]),
            })
            .collect();
        let piece = RecoveryPiece::from_entries(SegmentId(1), Version(0), entries);
        let state = Arc::new(Mutex::new(ReplayState::new()));
        appender
            .replay(piece, Arc::clone(&state))
            .await
            .unwrap()
            .unwrap();
        let replayed_in = store.lock().log().head();
        let forgotten = appender
            .forget_unowned(vec![HashRange::whole(other)])
            .await
            .unwrap();
        assert_eq!(forgotten, 20);
        let store = store.lock();
        assert_eq!(store.tainted_held(), 0);
        assert!(
            !store.log().holds(replayed_in),
            "the segment that holds the failed replay's entries left the log"
        );
        assert_eq!(store.read(TABLE, b"mine").status(), Status::Ok);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn abandoned_submit_is_still_applied() {
        let store = store();
        let appender = Appender::spawn(Arc::clone(&store));
        let mut abandoned = Box::pin(tokio::task::unconstrained(
            appender.submit(vec![write("abandoned", "v")]),
        ));
        assert!(poll_once(&mut abandoned).is_pending());
        drop(abandoned);
        let outcomes = appender.submit(vec![write("after", "v")]).await.unwrap();
        assert_eq!(outcomes[0].status, Status::Ok);
        let store = store.lock();
        assert_eq!(store.read(TABLE, b"abandoned").status(), Status::Ok);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_job_larger_than_a_batch_is_applied_whole_and_in_order() {
        let store = store();
        let appender = Appender::spawn(Arc::clone(&store));
        let ops: Vec<WriteOp> = (0..BATCH_OPS_MAX + 10)
            .map(|i| write(&format!("key-{}", i % 100), &format!("{i}")))
            .collect();
        let outcomes = appender.submit(ops).await.unwrap();
        assert_eq!(outcomes.len(), BATCH_OPS_MAX + 10);
        assert!(outcomes.iter().all(|o| o.status == Status::Ok));
        let store = store.lock();
        let last = BATCH_OPS_MAX + 9;
        let read = store.read(TABLE, format!("key-{}", last % 100).as_bytes());
        assert_eq!(read.value(), format!("{last}").into_bytes());
    }
}
