//! The recovery master (docs/design.md §6 step 2): replays one partition of a crashed
//! master's log into this master's own log, so that the coordinator can then hand it the
//! partition's tablets.
//!
//! # What callers see
//! [`RecoveryMaster::recover`] serves the `Recover` RPC, [`RecoveryMaster::abandon`]
//! serves `AbandonRecovery` and [`RecoveryMaster::finish`] serves `FinishRecovery`. A
//! successful `recover` returns once every entry of the partition that survives replay
//! is in this master's log, replicated to its backups and published in its index. The objects stay invisible — reads of their keys answer
//! `UnknownTablet` — until `TakeTablets` gives this master their ranges.
//!
//! # The pipeline
//! For every segment of the crashed master's log, in the order the coordinator sent them
//! (the order the backups read them), the driver asks the segment's first backup for the
//! partition's entries (`RecoveryData`), keeping [`RECOVERY_FETCHES_IN_FLIGHT`] requests
//! outstanding. A backup on this host answers with where the piece lies in its shared
//! recovery region, and the piece is copied out of it here ([`crate::shared_pieces`]);
//! one on another host, or one whose region cannot be mapped here, sends the bytes. A
//! reply is checked and decoded into a [`RecoveryPiece`] off the reactor
//! (`spawn_blocking`: it checksums every entry), then handed to the [`Appender`] as a
//! replay job. The appender stages it under the store lock
//! ([`ObjectStore::stage_replay`](crate::object_store::ObjectStore::stage_replay)),
//! seals, replicates and publishes it like any batch, so fetching piece n+1, replaying
//! piece n and re-replicating piece n−1 overlap. Each in-flight slot covers a piece from
//! its request to its publish, so at most [`RECOVERY_FETCHES_IN_FLIGHT`] pieces are held
//! in memory at once.
//!
//! # Replay rules
//! See [`replay`](crate::replay): the rules and their state are a core of their own;
//! this driver feeds it pieces.
//!
//! # Failure handling
//! A segment's backups are tried in order. A transport error, `ObjectDoesntExist`
//! (replica not held), `Internal` (replica unreadable) or a reply that does not decode
//! moves on to the next backup; a piece in shared memory that cannot be read (its slot
//! reused, the region not mappable) is asked for again from the same backup inside a
//! reply, with a `Retry` window of its own; `Retry` asks the same backup again after
//! [`RecoveryConfig::retry_pause`], for at most [`RecoveryConfig::retry_for`]. When
//! every backup of a segment failed, when the log is full, when an `AbandonRecovery`
//! of the ranges arrives meanwhile, or when it is not done
//! [`RecoveryConfig::answer_within`] after it arrived (the coordinator has given the
//! partition to another master by then), the recovery stops, forgets every object it
//! published (through the appender, ordered after replay jobs still queued) and fails
//! with `RecoveryFailed`, naming the segment and each backup's error.
//!
//! # Concurrency
//! Recoveries of disjoint ranges may be in progress at once (two partitions of one crash,
//! or two crashes), of which [`RecoveryConfig::partitions_at_once`] replay while the
//! others wait their turn, first come first served; a `Recover` whose ranges overlap
//! one in progress here is refused with `Retry` — unless that one belongs to an older
//! attempt at the same crash: a `Recover` of a newer attempt first cancels every
//! recovery here of an older attempt of its crashed master, running or waiting (see
//! `cancel_superseded` for why their outcome can never be committed). `AbandonRecovery`
//! of ranges in progress cancels that recovery and waits for it to clean up before
//! forgetting the ranges itself; while it forgets, it is registered like a recovery of
//! its attempt, so that a newer attempt's `Recover` waits for it rather than have its
//! replay erased by it. A `Recover` that arrives after an `AbandonRecovery` of its
//! attempt and ranges (it was delayed on its way; the coordinator gave the partition
//! up here) is refused with `RecoveryFailed` rather than replayed for nobody. A `Recover` of ranges this master
//! owns, even in part, is refused with `InvalidArgument`: replaying into live tablets
//! could resurrect keys deleted here since. A `Recover` of a partition already recovered
//! here but not yet taken (the coordinator resending it) forgets the earlier result and
//! replays again: the answer is the same, the work is repeated. Attempts are numbered
//! (their ids grow across leaders): a `Recover` or `AbandonRecovery` of an attempt older
//! than the newest `Recover` seen for the same crashed master is refused or ignored, as
//! it comes from a deposed leader, and forgetting what the newer attempt replayed could
//! erase a partition the committed map already gives this master. A `Recover` is
//! checked when it arrives and again when it registers (after waiting for older
//! attempts to clean up, during which a newer one may arrive, replay and finish); these
//! decisions are the synchronous `Attempts`, under one lock.
//!
//! # Nothing replayed stays stranded
//! An abandon can be lost with the `Recover` reply it follows, and a leader deposed
//! mid-recovery abandons nothing (its proposal may still commit). Objects replayed for
//! nobody would then hold memory for good, and would come back to life if their range
//! were ever given to this master without a `Recover` (take-tablets keeps replayed
//! objects: that is how they become visible). So once the crashed master owns nothing,
//! the coordinator sends every master `FinishRecovery`. The master first catches up
//! with its tablets, then cancels what still runs of that recovery here, forgets the
//! unowned objects of every range any of its replays registered, and refuses every
//! later `Recover` of it (the last `FINISHED_KEPT` crashed masters are remembered).
//! Forgetting, for an abandon as for a finish, is registered like a replay, so that a
//! `Recover` overlapping it waits; and it leaves out every range that another crashed
//! master's replay registered here, which may be done and not yet taken (a second
//! crash, of the master the first recovery gave those ranges to): that one's own
//! `FinishRecovery` forgets them.
//!
//! # Cost
//! Measured with a throwaway release-build loop on the 2-core development VM (AMD EPYC),
//! staging, sealing and publishing 8 MiB pieces of distinct keys with R = 0: 1 KiB
//! objects at 0.38 M objects/s (≈ 400 MB/s), 100-byte objects at 0.47 M objects/s
//! (≈ 70 MB/s). About 40 % of it was the index's lookup and insert (cache misses at a
//! million keys; measured with the B-tree that preceded today's hashed directory), as on
//! the write path; the rest is the batch's hash map, the
//! append and the CRC check of `parse`. So one recovery master replays a default
//! partition (128 MiB, 800,000 records) in well under 2 s of CPU, and with R > 0
//! replication and the network set the pace.

use futures::StreamExt;
use parking_lot::Mutex;
use rampart_common::ids::{SegmentId, ServerId, Version};
use rampart_common::protocol::backup::{PartitionRanges, RecoveryData, RecoveryDataRequest};
use rampart_common::protocol::master::{
    RecoverReply, RecoverRequest, RecoverySource, RECOVER_TIMEOUT,
};
use rampart_common::rpc::RpcPool;
use rampart_common::status::Status;
use rampart_common::tablet::HashRange;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::appender::Appender;
use crate::object_store::ObjectStore;
use crate::replay::{PieceBytes, RecoveryPiece, ReplayState};
use crate::shared_pieces::{SharedPieces, SharedReadError};

/// `RecoveryData` requests a recovery keeps outstanding. A backup answers a request for a
/// segment it has not read yet only once it has, so a few requests in flight keep every
/// stage of the pipeline busy while bounding the pieces held in memory (each slot holds
/// one piece until it is published).
pub const RECOVERY_FETCHES_IN_FLIGHT: usize = 4;

/// Partitions a recovery master replays at once; further `Recover`s wait their turn
/// (in arrival order). A partition is live only once all of it is replayed, and the
/// machine's cores are shared by everything replaying: replayed side by side, every
/// partition of a crash finished at the end, together; one at a time, the first goes
/// live after its own share of the work, and the median key comes back about halfway.
/// The backups read every segment ahead regardless (their piece cache holds what is
/// not fetched yet), so a waiting partition finds its pieces ready.
pub const RECOVERY_PARTITIONS_AT_ONCE: usize = 1;

/// Deadline of one `RecoveryData` call: a backup may wait up to about 30 s for its disk
/// to reach the segment before it answers, then the piece crosses the network.
pub const RECOVERY_DATA_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause before asking a backup that answered `Retry` again.
pub const RECOVERY_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// How long one backup may keep answering `Retry` for one segment before the recovery
/// falls back to the next backup. A backup answers `Retry` when its disk has not reached
/// the segment yet (after waiting about 2 s itself); reaching the last of its segments
/// may take about 30 s, so twice that before giving up on a backup that is alive.
pub const RECOVERY_RETRY_FOR: Duration = Duration::from_secs(60);

/// Timing of the fetch pipeline (defaults from the constants above; tests shorten them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// `RecoveryData` requests outstanding, per partition.
    pub fetches_in_flight: usize,
    /// Partitions replayed at once ([`RECOVERY_PARTITIONS_AT_ONCE`]).
    pub partitions_at_once: usize,
    /// Deadline of one `RecoveryData` call.
    pub call_timeout: Duration,
    /// Pause after a `Retry` answer.
    pub retry_pause: Duration,
    /// How long `Retry` answers are tolerated per backup and segment.
    pub retry_for: Duration,
    /// How long after its arrival a `Recover` is cancelled here if it has not been
    /// answered ([`RECOVER_TIMEOUT`], the coordinator's deadline for it).
    pub answer_within: Duration,
    /// Whether backups on this host may answer with where a piece lies in their
    /// shared memory rather than with its bytes (module doc, *The pipeline*).
    pub shared_reads: bool,
}

impl Default for RecoveryConfig {
    fn default() -> RecoveryConfig {
        RecoveryConfig {
            fetches_in_flight: RECOVERY_FETCHES_IN_FLIGHT,
            partitions_at_once: RECOVERY_PARTITIONS_AT_ONCE,
            call_timeout: RECOVERY_DATA_TIMEOUT,
            retry_pause: RECOVERY_RETRY_PAUSE,
            retry_for: RECOVERY_RETRY_FOR,
            answer_within: RECOVER_TIMEOUT,
            shared_reads: true,
        }
    }
}

/// Why one backup gave no usable piece.
enum FetchFailure {
    /// The backup failed, refused, or sent a bad piece: try the next backup.
    Backup(String),
    /// The piece it left in shared memory could not be read: ask it again for the bytes.
    Shared(SharedReadError),
}

impl FetchFailure {
    fn into_message(self) -> String {
        match self {
            FetchFailure::Backup(message) => message,
            FetchFailure::Shared(error) => error.to_string(),
        }
    }
}

/// Why a recovery (or abandoning one) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    /// Asked to recover itself.
    #[error("server {0} cannot recover its own log")]
    CrashedIsSelf(ServerId),
    /// The ranges are empty, reversed, unsorted or overlapping.
    #[error("partition ranges must be non-empty, sorted and disjoint")]
    BadRanges,
    /// This master owns part of the ranges.
    #[error("this master already owns part of the partition's ranges")]
    OwnsRanges,
    /// A recovery of overlapping ranges is running here.
    #[error("a recovery of overlapping ranges is in progress on this master")]
    InProgress,
    /// Every backup of a segment failed.
    #[error("{segment}: every backup failed: {errors}")]
    SegmentFailed {
        /// The segment.
        segment: SegmentId,
        /// Each backup's error, in the order tried.
        errors: String,
    },
    /// This master's log is full.
    #[error("log memory full during replay")]
    NoSpace,
    /// `AbandonRecovery` of the ranges arrived meanwhile.
    #[error("abandoned")]
    Abandoned,
    /// Not done within [`RecoveryConfig::answer_within`] of its arrival: the caller has
    /// given up on it.
    #[error("not done within {0:?} of its arrival; the caller has given up on it")]
    TooLate(Duration),
    /// The master is shutting down.
    #[error("the master is shutting down")]
    ShuttingDown,
    /// A newer attempt at recovering the same crashed master reached this master.
    #[error("recovery attempt {recovery} is older than attempt {newest}, seen here already")]
    Superseded {
        /// The attempt refused.
        recovery: u64,
        /// The newest attempt seen.
        newest: u64,
    },
    /// The coordinator said the recovery of this crashed master is over
    /// (`FinishRecovery`): a `Recover` of it now comes from a deposed leader.
    #[error("the recovery of {0} is over")]
    Finished(ServerId),
}

impl RecoveryError {
    /// The wire status for this error.
    pub fn status(&self) -> Status {
        match self {
            RecoveryError::CrashedIsSelf(_)
            | RecoveryError::BadRanges
            | RecoveryError::OwnsRanges => Status::InvalidArgument,
            RecoveryError::Superseded { .. } | RecoveryError::Finished(_) => Status::RecoveryFailed,
            RecoveryError::InProgress => Status::Retry,
            RecoveryError::SegmentFailed { .. }
            | RecoveryError::NoSpace
            | RecoveryError::Abandoned
            | RecoveryError::TooLate(_) => Status::RecoveryFailed,
            RecoveryError::ShuttingDown => Status::ShuttingDown,
        }
    }
}

/// Checks that `ranges` are non-empty, each start ≤ end, sorted and disjoint.
fn check_ranges(ranges: &[HashRange]) -> Result<(), RecoveryError> {
    let well_formed = !ranges.is_empty()
        && ranges
            .iter()
            .all(|&HashRange { start, end, .. }| start <= end)
        && ranges
            .windows(2)
            .all(|w| (w[0].table, w[0].end) < (w[1].table, w[1].start));
    if well_formed {
        Ok(())
    } else {
        Err(RecoveryError::BadRanges)
    }
}

/// Adds to `record` each of `ranges` it does not hold yet.
fn remember(record: &mut PartitionRanges, ranges: &[HashRange]) {
    for range in ranges {
        if !record.contains(range) {
            record.push(*range);
        }
    }
}

/// Whether two sorted range lists share a hash.
fn overlap(a: &[HashRange], b: &[HashRange]) -> bool {
    a.iter()
        .any(|range| b.iter().any(|other| range.overlaps(other)))
}

/// A recovery running here.
#[derive(Debug)]
struct InFlight {
    id: u64,
    /// The crashed master and the attempt (`RecoverRequest::recovery`) it belongs to.
    crashed: ServerId,
    attempt: u64,
    ranges: PartitionRanges,
    /// Set to true to cancel it; closed once it has cleaned up (its receiver dropped).
    cancel: Arc<watch::Sender<bool>>,
}

/// Which attempts this master has seen and which recoveries run here: the decisions
/// about `Recover` and `AbandonRecovery` that must be taken together, under one lock
/// (the driver, [`RecoveryMaster`], does the waiting between them). Synchronous.
#[derive(Debug, Default)]
struct Attempts {
    /// Per crashed master, the newest attempt a `Recover` arrived for (ids grow across
    /// leaders: the term is their high half).
    newest: std::collections::BTreeMap<ServerId, u64>,
    /// Recoveries registered and not finished. Invariant: their ranges are pairwise
    /// disjoint.
    in_flight: Vec<InFlight>,
    /// The next registration's id.
    next_id: u64,
    /// Abandons accepted for the newest attempt of their crashed master, oldest first;
    /// at most [`ABANDONS_KEPT`]. A `Recover` of the same attempt and overlapping ranges
    /// arriving after its abandon (it was delayed on its way here) is refused.
    abandoned: std::collections::VecDeque<(ServerId, u64, PartitionRanges)>,
    /// Per crashed master, every range a `Recover` of it registered here, until its
    /// `FinishRecovery` has forgotten what is unowned of them.
    replayed: std::collections::BTreeMap<ServerId, PartitionRanges>,
    /// Crashed masters whose recovery is over, oldest first; at most [`FINISHED_KEPT`].
    /// Their `Recover`s are refused and their abandons ignored.
    finished: std::collections::VecDeque<ServerId>,
}

/// Abandons remembered by a recovery master ([`Attempts`]): a few per partition it was
/// given in the current attempts; beyond it the oldest are forgotten (their `Recover`,
/// if it still comes, replays and is forgotten by the next `Recover` of its ranges).
const ABANDONS_KEPT: usize = 1024;

/// Crashed masters whose end a recovery master remembers ([`Attempts`]). Beyond it the
/// oldest is forgotten: a deposed leader's `Recover` of it, arriving later still than
/// a thousand recoveries, would replay objects that only a restart frees.
const FINISHED_KEPT: usize = 1024;

/// What a registration in [`Attempts`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// Replaying a partition (`Recover`).
    Replay,
    /// Forgetting what a recovery left (`AbandonRecovery`).
    Forget,
    /// Forgetting what a recovery that is over left (`FinishRecovery`): registered
    /// although its crashed master is finished.
    Finish,
}

impl Attempts {
    /// A `Recover` of `attempt` at `crashed` arrives: refused if a newer attempt arrived
    /// before it (a deposed leader's, late); otherwise it is the newest.
    fn arrive(&mut self, crashed: ServerId, attempt: u64) -> Result<(), RecoveryError> {
        self.check_not_finished(crashed)?;
        let newest = self.newest.entry(crashed).or_insert(0);
        if attempt < *newest {
            return Err(RecoveryError::Superseded {
                recovery: attempt,
                newest: *newest,
            });
        }
        if attempt > *newest {
            *newest = attempt;
            self.abandoned
                .retain(|&(c, a, _)| c != crashed || a >= attempt);
        }
        Ok(())
    }

    /// The recoveries of attempts at `crashed` older than `attempt`, to cancel.
    fn superseded(&self, crashed: ServerId, attempt: u64) -> Vec<Arc<watch::Sender<bool>>> {
        self.in_flight
            .iter()
            .filter(|f| f.crashed == crashed && f.attempt < attempt)
            .map(|f| Arc::clone(&f.cancel))
            .collect()
    }

    /// Registers `work` of `attempt` at `crashed` on `ranges`, cancelled through
    /// `cancel`; returns its id and the ranges it may touch. Refused when a newer attempt
    /// arrived since this one did (it may have replayed the ranges here already, its
    /// commit perhaps under way: this attempt's clean-up would erase them), when the
    /// recovery of `crashed` is over (except its [`Work::Finish`]), when the ranges
    /// overlap work registered here, and — a replay — when an abandon of its attempt and
    /// ranges came first. A replay's ranges are remembered for the recovery's
    /// [`end`](Self::end).
    ///
    /// Forgetting leaves out every range that overlaps a range another crashed master's
    /// replay registered here: that replay may be done and not yet taken (its commit
    /// under way), and forgetting unowned objects there would erase it. Such a range is
    /// handed to that crashed master's record instead, and forgotten at its own
    /// `FinishRecovery`, once this master has caught up with the tablets its recovery
    /// committed.
    fn register(
        &mut self,
        work: Work,
        crashed: ServerId,
        attempt: u64,
        ranges: &PartitionRanges,
        cancel: Arc<watch::Sender<bool>>,
    ) -> Result<(u64, PartitionRanges), RecoveryError> {
        if work != Work::Finish {
            self.check_not_finished(crashed)?;
            let newest = self.newest.get(&crashed).copied().unwrap_or(0);
            if attempt < newest {
                return Err(RecoveryError::Superseded {
                    recovery: attempt,
                    newest,
                });
            }
        }
        if self.in_flight.iter().any(|f| overlap(&f.ranges, ranges)) {
            return Err(RecoveryError::InProgress);
        }
        let mut ranges = ranges.clone();
        match work {
            Work::Replay => {
                let abandoned = self
                    .abandoned
                    .iter()
                    .any(|(c, a, r)| (*c, *a) == (crashed, attempt) && overlap(r, &ranges));
                if abandoned {
                    return Err(RecoveryError::Abandoned);
                }
                remember(self.replayed.entry(crashed).or_default(), &ranges);
            }
            // An abandon was remembered already, when `abandon` accepted it.
            Work::Forget | Work::Finish => {
                for (other, replayed) in &mut self.replayed {
                    if *other == crashed {
                        continue;
                    }
                    let (theirs, rest): (PartitionRanges, PartitionRanges) = ranges
                        .iter()
                        .partition(|&&range| overlap(replayed, &[range]));
                    remember(replayed, &theirs);
                    ranges = rest;
                }
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight.push(InFlight {
            id,
            crashed,
            attempt,
            ranges: ranges.clone(),
            cancel,
        });
        Ok((id, ranges))
    }

    /// Recovery `id` finished (or never started replaying).
    fn finish(&mut self, id: u64) {
        self.in_flight.retain(|f| f.id != id);
    }

    /// An `AbandonRecovery` of `attempt` at `crashed` for `ranges`: the recoveries to
    /// cancel before forgetting the ranges, or `None` when it is ignored (a `Recover` of
    /// a newer attempt arrived since).
    ///
    /// An accepted abandon is remembered here, at once: a `Recover` of its attempt and
    /// ranges that registers while the driver waits for the cancelled ones to clean up
    /// (a retried or duplicated request) is refused, instead of replaying the ranges
    /// for nobody and making the forgetting fail on its overlap.
    fn abandon(
        &mut self,
        crashed: ServerId,
        attempt: u64,
        ranges: &PartitionRanges,
    ) -> Option<Vec<Arc<watch::Sender<bool>>>> {
        if attempt < self.newest.get(&crashed).copied().unwrap_or(0)
            || self.finished.contains(&crashed)
        {
            return None;
        }
        let known = self
            .abandoned
            .iter()
            .any(|(c, a, r)| (*c, *a, r) == (crashed, attempt, ranges));
        if !known {
            // A duplicated abandon is remembered once, not at the cost of another.
            if self.abandoned.len() >= ABANDONS_KEPT {
                self.abandoned.pop_front();
            }
            self.abandoned.push_back((crashed, attempt, ranges.clone()));
        }
        let running = self.in_flight.iter().filter(|f| overlap(&f.ranges, ranges));
        Some(running.map(|f| Arc::clone(&f.cancel)).collect())
    }

    /// `FinishRecovery` of `crashed`: from now on its `Recover`s are refused and its
    /// abandons ignored. Returns the work on it still registered here (a deposed
    /// leader's replay, an abandon forgetting, an earlier `FinishRecovery` whose answer
    /// was lost), to cancel and wait for before [`finishing`](Self::finishing).
    fn end(&mut self, crashed: ServerId) -> Vec<Arc<watch::Sender<bool>>> {
        if !self.finished.contains(&crashed) {
            if self.finished.len() >= FINISHED_KEPT {
                self.finished.pop_front();
            }
            self.finished.push_back(crashed);
            self.newest.remove(&crashed);
            self.abandoned.retain(|&(c, _, _)| c != crashed);
        }
        let running = self
            .in_flight
            .iter()
            .filter(|f| f.crashed == crashed)
            .map(|f| Arc::clone(&f.cancel))
            .collect();
        running
    }

    /// Registers the forgetting of what the ended recovery of `crashed` left: every
    /// range its replays registered here (less those another recovery's replays hold,
    /// see [`register`](Self::register)). The ranges stay remembered until
    /// [`forgotten`](Self::forgotten): a repeated `FinishRecovery` forgets them again.
    fn finishing(
        &mut self,
        crashed: ServerId,
        cancel: Arc<watch::Sender<bool>>,
    ) -> Result<(u64, PartitionRanges), RecoveryError> {
        let ranges = self.replayed.get(&crashed).cloned().unwrap_or_default();
        self.register(Work::Finish, crashed, 0, &ranges, cancel)
    }

    /// The unowned objects of every range `crashed`'s replays registered here are
    /// forgotten: nothing of its recovery is left to forget.
    fn forgotten(&mut self, crashed: ServerId) {
        self.replayed.remove(&crashed);
    }

    /// Refuses work on a crashed master whose recovery is over.
    fn check_not_finished(&self, crashed: ServerId) -> Result<(), RecoveryError> {
        if self.finished.contains(&crashed) {
            return Err(RecoveryError::Finished(crashed));
        }
        Ok(())
    }
}

/// Work registered in [`Attempts`]: unregistered when dropped, and only then (fields
/// drop after `drop` runs) is its cancel receiver dropped, which tells whoever
/// cancelled it that it has cleaned up: woken, they never find it still registered.
struct Registration<'a> {
    master: &'a RecoveryMaster,
    id: u64,
    /// The ranges it may touch (see [`Attempts::register`]).
    ranges: PartitionRanges,
    cancelled: watch::Receiver<bool>,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.master.attempts.lock().finish(self.id);
    }
}

/// What fetching and replaying one segment did.
#[derive(Clone, Copy, Debug, Default)]
struct PieceDone {
    fallback: bool,
    fetch: Duration,
    replay: Duration,
}

/// The recovery-master role of a master: serves `Recover`, `AbandonRecovery` and
/// `FinishRecovery`.
#[derive(Debug)]
pub struct RecoveryMaster {
    id: ServerId,
    store: Arc<Mutex<ObjectStore>>,
    appender: Appender,
    /// Connections to backups, shared by every recovery.
    backups: RpcPool,
    config: RecoveryConfig,
    /// Turns to replay: [`RecoveryConfig::partitions_at_once`] permits.
    turns: tokio::sync::Semaphore,
    /// Attempts seen and recoveries running here.
    attempts: Mutex<Attempts>,
    /// What this master replayed so far (for metrics).
    totals: Mutex<RecoveryTotals>,
    /// Pieces read from backups' shared memory on this host; `None` when
    /// [`RecoveryConfig::shared_reads`] is off.
    shared: Option<SharedPieces>,
}

/// What a recovery master replayed since it started, over every partition it took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RecoveryTotals {
    /// Partitions replayed to the end.
    pub partitions: u64,
    /// Partitions that failed or were abandoned here.
    pub partitions_failed: u64,
    /// Live objects they held.
    pub objects: u64,
    /// Bytes appended to this log for them.
    pub bytes: u64,
    /// Entries received from backups.
    pub entries: u64,
    /// Seconds from the request to the end of replay, summed.
    pub replay_seconds: f64,
    /// Pieces copied out of a backup's shared memory on this host.
    pub shared_pieces: u64,
    /// Pieces left in shared memory that could not be read there (the slot reused,
    /// the region not mappable) and were asked for again inside a reply.
    pub shared_pieces_refetched: u64,
}

impl RecoveryMaster {
    /// The recovery master of server `id`, replaying into `store` through `appender`.
    pub fn new(
        id: ServerId,
        store: Arc<Mutex<ObjectStore>>,
        appender: Appender,
        config: RecoveryConfig,
    ) -> RecoveryMaster {
        RecoveryMaster {
            id,
            store,
            appender,
            backups: RpcPool::new(),
            turns: tokio::sync::Semaphore::new(config.partitions_at_once.max(1)),
            shared: config
                .shared_reads
                .then(|| SharedPieces::new(rampart_common::onesided::host_id())),
            config,
            attempts: Mutex::new(Attempts::default()),
            totals: Mutex::new(RecoveryTotals::default()),
        }
    }

    /// What this master replayed so far.
    pub fn totals(&self) -> RecoveryTotals {
        *self.totals.lock()
    }

    fn register(
        &self,
        work: Work,
        crashed: ServerId,
        attempt: u64,
        ranges: &PartitionRanges,
    ) -> Result<Registration<'_>, RecoveryError> {
        let (cancel, cancelled) = watch::channel(false);
        let (id, ranges) =
            self.attempts
                .lock()
                .register(work, crashed, attempt, ranges, Arc::new(cancel))?;
        Ok(Registration {
            master: self,
            id,
            ranges,
            cancelled,
        })
    }

    /// Serves `Recover`: replays the partition and returns what was replayed (see the
    /// module doc).
    pub async fn recover(&self, request: RecoverRequest) -> Result<RecoverReply, RecoveryError> {
        let started = Instant::now();
        if request.crashed == self.id {
            return Err(RecoveryError::CrashedIsSelf(self.id));
        }
        check_ranges(&request.ranges)?;
        // A `Recover` forgets what an earlier attempt left in its ranges: one from a
        // deposed leader, arriving after a newer attempt replayed (and perhaps had
        // committed) the same ranges here, must not. Checked again when it registers:
        // a newer attempt may arrive while this one waits for older ones to clean up.
        self.attempts
            .lock()
            .arrive(request.crashed, request.recovery)?;
        self.cancel_superseded(request.crashed, request.recovery)
            .await;
        let mut registration = self.register(
            Work::Replay,
            request.crashed,
            request.recovery,
            &request.ranges,
        )?;
        if self.store.lock().owns_any(&request.ranges) {
            return Err(RecoveryError::OwnsRanges);
        }
        // Leftovers of an earlier attempt would take part in "highest version wins"
        // without the tombstones that killed them.
        let leftovers = self
            .appender
            .forget_unowned(request.ranges.clone())
            .await
            .map_err(|_| RecoveryError::ShuttingDown)?;
        let state = Arc::new(Mutex::new(ReplayState::with_version_floor(
            request.version_floor,
        )));
        let result = tokio::select! {
            result = async {
                // Waiting for a turn is cancelled by an abandon like the replay itself.
                let _turn = self.turns.acquire().await.map_err(|_| RecoveryError::ShuttingDown)?;
                self.replay_all(&request, &state).await
            } => result,
            Ok(_) = registration.cancelled.wait_for(|cancel| *cancel) => {
                Err(RecoveryError::Abandoned)
            }
            // Left running, it would hold its turn and its memory for an answer the
            // coordinator no longer waits for (it gave the partition to another master).
            () = tokio::time::sleep_until(started + self.config.answer_within) => {
                Err(RecoveryError::TooLate(self.config.answer_within))
            }
        };
        let pieces = match result {
            Ok(pieces) => pieces,
            Err(error) => {
                // Ordered after every replay job already queued, so nothing of this
                // attempt stays visible to a later TakeTablets.
                let forgotten = self
                    .appender
                    .forget_unowned(request.ranges.clone())
                    .await
                    .unwrap_or(0);
                tracing::warn!(
                    master = %self.id, crashed = %request.crashed, recovery = request.recovery,
                    partition = request.partition, %error, forgotten, "recovery failed"
                );
                drop(registration);
                self.totals.lock().partitions_failed += 1;
                return Err(error);
            }
        };
        drop(registration);
        let counts = state.lock().counts();
        let elapsed = started.elapsed();
        {
            let mut totals = self.totals.lock();
            totals.partitions += 1;
            totals.objects += counts.objects_live;
            totals.bytes += counts.bytes_appended;
            totals.entries += counts.entries_received;
            totals.replay_seconds += elapsed.as_secs_f64();
        }
        let fallbacks = pieces.iter().filter(|p| p.fallback).count();
        let fetch: Duration = pieces.iter().map(|p| p.fetch).sum();
        let replay: Duration = pieces.iter().map(|p| p.replay).sum();
        let reply = RecoverReply {
            objects: counts.objects_live,
            tombstones: counts.tombstones_appended,
            bytes: counts.bytes_appended,
            entries_received: counts.entries_received,
            fallbacks: u32::try_from(fallbacks).unwrap_or(u32::MAX),
            replay_ms: u32::try_from(elapsed.as_millis()).unwrap_or(u32::MAX),
        };
        tracing::info!(
            master = %self.id,
            crashed = %request.crashed,
            recovery = request.recovery,
            partition = request.partition,
            segments = pieces.len(),
            entries = counts.entries_received,
            objects = counts.objects_live,
            dropped = counts.objects_dropped,
            tombstones = counts.tombstones_appended,
            bytes = counts.bytes_appended,
            fallbacks,
            leftovers,
            elapsed_ms = elapsed.as_millis() as u64,
            fetch_ms_summed = fetch.as_millis() as u64,
            replay_ms_summed = replay.as_millis() as u64,
            "partition recovered"
        );
        Ok(reply)
    }

    /// Cancels every recovery here of an attempt at `crashed` older than `attempt`, and
    /// waits until each has cleaned up. Their outcome can never be committed: a newer
    /// attempt exists only once the leader that sent them was deposed (a leader starts
    /// its next attempt only after every partition of the last one ended), and a deposed
    /// leader's proposal cannot commit. Left running — or waiting for a turn — they
    /// would hold this master's turns, and the ranges the newer attempt asks for.
    async fn cancel_superseded(&self, crashed: ServerId, attempt: u64) {
        let superseded = self.attempts.lock().superseded(crashed, attempt);
        for cancel in superseded {
            cancel.send_replace(true);
            cancel.closed().await;
        }
    }

    /// The same recovery master, with `config`. Only before it serves requests: the
    /// turns are counted afresh.
    pub fn with_config(self, config: RecoveryConfig) -> RecoveryMaster {
        RecoveryMaster::new(self.id, self.store, self.appender, config)
    }

    /// Fetches and replays every segment, [`RecoveryConfig::fetches_in_flight`] at once.
    async fn replay_all(
        &self,
        request: &RecoverRequest,
        state: &Arc<Mutex<ReplayState>>,
    ) -> Result<Vec<PieceDone>, RecoveryError> {
        let ranges = Arc::new(request.ranges.clone());
        // By index: a closure over `&RecoverySource` would make the stream's futures
        // generic over that borrow's lifetime, which the `Send` check of the RPC
        // handler's future cannot prove.
        let mut pieces = futures::stream::iter(
            (0..request.segments.len())
                .map(|i| self.fetch_and_replay(request, &request.segments[i], &ranges, state)),
        )
        .buffer_unordered(self.config.fetches_in_flight.max(1));
        let mut done = Vec::with_capacity(request.segments.len());
        while let Some(piece) = pieces.next().await {
            done.push(piece?);
        }
        if request.version_floor > 0 {
            // A recovery that may have lost data raises this master's safe version to the
            // floor even when nothing was replayed: a key written only in what was lost,
            // written again here, must still get a version above every one it had.
            let empty = RecoveryPiece::from_entries(SegmentId(0), Version(0), Vec::new());
            self.appender
                .replay(empty, Arc::clone(state))
                .await
                .map_err(|_| RecoveryError::ShuttingDown)?
                .map_err(|_| RecoveryError::NoSpace)?;
        }
        Ok(done)
    }

    async fn fetch_and_replay(
        &self,
        request: &RecoverRequest,
        source: &RecoverySource,
        ranges: &Arc<PartitionRanges>,
        state: &Arc<Mutex<ReplayState>>,
    ) -> Result<PieceDone, RecoveryError> {
        let started = Instant::now();
        let (piece, fallback) = self.fetch(request, source, ranges).await?;
        let fetched = Instant::now();
        self.appender
            .replay(piece, Arc::clone(state))
            .await
            .map_err(|_| RecoveryError::ShuttingDown)?
            .map_err(|_| RecoveryError::NoSpace)?;
        Ok(PieceDone {
            fallback,
            fetch: fetched - started,
            replay: fetched.elapsed(),
        })
    }

    /// One segment's piece, from the first backup that gives a usable one; whether it
    /// came from a fallback.
    async fn fetch(
        &self,
        request: &RecoverRequest,
        source: &RecoverySource,
        ranges: &Arc<PartitionRanges>,
    ) -> Result<(RecoveryPiece, bool), RecoveryError> {
        let data_request = RecoveryDataRequest {
            master: request.crashed,
            recovery: request.recovery,
            segment: source.segment,
            partition: request.partition,
            ranges: request.ranges.clone(),
            shared_host: self.shared.as_ref().map(|shared| shared.host().to_string()),
        };
        let mut errors = Vec::new();
        for (i, backup) in source.backups.iter().enumerate() {
            match self.fetch_from(backup, &data_request, ranges).await {
                Ok(piece) => {
                    if i > 0 {
                        tracing::info!(
                            segment = %source.segment, %backup, failed = %errors.join("; "),
                            "recovery data from a fallback backup"
                        );
                    }
                    return Ok((piece, i > 0));
                }
                Err(error) => errors.push(format!("{backup}: {error}")),
            }
        }
        if errors.is_empty() {
            errors.push("no backup holds it".to_string());
        }
        Err(RecoveryError::SegmentFailed {
            segment: source.segment,
            errors: errors.join("; "),
        })
    }

    /// One segment's piece from `backup`. A piece left in the backup's shared memory
    /// that cannot be read there (its slot reused meanwhile, the region not mappable) is
    /// asked for again inside a reply; a backup whose region cannot be mapped is asked
    /// inside replies from then on.
    async fn fetch_from(
        &self,
        backup: &str,
        request: &RecoveryDataRequest,
        ranges: &Arc<PartitionRanges>,
    ) -> Result<RecoveryPiece, String> {
        let unmappable = self
            .shared
            .as_ref()
            .is_some_and(|shared| shared.unmappable(backup));
        let inline_only;
        let request = if unmappable && request.shared_host.is_some() {
            inline_only = RecoveryDataRequest {
                shared_host: None,
                ..request.clone()
            };
            &inline_only
        } else {
            request
        };
        match self.fetch_once(backup, request, ranges).await {
            Err(FetchFailure::Shared(error)) => {
                self.totals.lock().shared_pieces_refetched += 1;
                match &error {
                    SharedReadError::Unmappable(reason) => {
                        if self.shared.as_ref().is_some_and(|s| s.give_up_on(backup)) {
                            tracing::warn!(
                                %backup, %reason,
                                "cannot map the backup's recovery region: its pieces come inside replies"
                            );
                        }
                    }
                    SharedReadError::Unreadable(reason) => tracing::debug!(
                        segment = %request.segment, %backup, %reason,
                        "shared piece unreadable: asking for it inside a reply"
                    ),
                }
                let inline = RecoveryDataRequest {
                    shared_host: None,
                    ..request.clone()
                };
                self.fetch_once(backup, &inline, ranges)
                    .await
                    .map_err(FetchFailure::into_message)
            }
            other => other.map_err(FetchFailure::into_message),
        }
    }

    async fn fetch_once(
        &self,
        backup: &str,
        request: &RecoveryDataRequest,
        ranges: &Arc<PartitionRanges>,
    ) -> Result<RecoveryPiece, FetchFailure> {
        let retry_until = Instant::now() + self.config.retry_for;
        let reply = loop {
            let deadline = Instant::now() + self.config.call_timeout;
            match self
                .backups
                .call::<RecoveryData>(backup, request, deadline)
                .await
            {
                Ok(reply) => break reply,
                Err(error)
                    if error.status() == Some(Status::Retry) && Instant::now() < retry_until =>
                {
                    tokio::time::sleep(self.config.retry_pause).await;
                }
                Err(error) if error.status() == Some(Status::Retry) => {
                    let waited = self.config.retry_for.as_secs();
                    return Err(FetchFailure::Backup(format!(
                        "{error} (still after {waited} s)"
                    )));
                }
                Err(error) => return Err(FetchFailure::Backup(error.to_string())),
            }
        };
        let segment = request.segment;
        let ranges = Arc::clone(ranges);
        // A shared piece only if this master asked for one.
        let shared = match (reply.shared, &self.shared) {
            (None, _) => None,
            (Some(piece), Some(reads)) if request.shared_host.is_some() => {
                Some((piece, reads.clone()))
            }
            (Some(_), _) => {
                return Err(FetchFailure::Backup(
                    "a shared piece this master did not ask for".to_string(),
                ))
            }
        };
        let (safe_version, count, entries) = (reply.safe_version, reply.count, reply.entries);
        let from_shared_memory = shared.is_some();
        let piece = tokio::task::spawn_blocking(move || {
            let entries = match shared {
                Some((piece, reads)) => reads.read(&piece).map_err(FetchFailure::Shared)?,
                None => entries,
            };
            let bytes = PieceBytes {
                safe_version,
                entries,
                count,
            };
            RecoveryPiece::parse(segment, bytes, &ranges)
                .map_err(|e| FetchFailure::Backup(format!("bad piece: {e}")))
        })
        .await
        .map_err(|e| FetchFailure::Backup(format!("decoding the piece failed: {e}")))??;
        if from_shared_memory {
            self.totals.lock().shared_pieces += 1;
        }
        Ok(piece)
    }

    /// Serves `AbandonRecovery` of attempt `recovery` of `crashed`: cancels a recovery
    /// of overlapping ranges running here and waits for it to clean up, then forgets
    /// every object in `ranges` this master does not own. Returns how many objects were
    /// forgotten; `None` when ignored: a `Recover` of a newer attempt of `crashed` arrived
    /// here since, so what this master holds may be what a commit it has not heard of
    /// yet gave it (an abandon delayed in the network must not erase it).
    pub async fn abandon(
        &self,
        crashed: ServerId,
        recovery: u64,
        ranges: &PartitionRanges,
    ) -> Result<Option<u64>, RecoveryError> {
        check_ranges(ranges)?;
        let Some(running) = self.attempts.lock().abandon(crashed, recovery, ranges) else {
            return Ok(None);
        };
        for cancel in running {
            cancel.send_replace(true);
            cancel.closed().await;
        }
        // Registered while it forgets, like a recovery of its attempt: a `Recover` of a
        // newer attempt arriving meanwhile waits for the forgetting to end (it waits for
        // older attempts to clean up) instead of having its replay erased by it; one
        // that arrived since the check above makes this abandon ignored. The check
        // remembered the abandon, so that a `Recover` of its attempt and ranges that
        // arrives after it (delayed, or a duplicate) does not replay them for nobody.
        let registration = match self.register(Work::Forget, crashed, recovery, ranges) {
            Ok(registration) => registration,
            Err(RecoveryError::Superseded { .. }) => return Ok(None),
            Err(error) => return Err(error),
        };
        if registration.ranges.is_empty() {
            return Ok(Some(0));
        }
        let forgotten = self
            .appender
            .forget_unowned(registration.ranges.clone())
            .await;
        drop(registration);
        forgotten.map(Some).map_err(|_| RecoveryError::ShuttingDown)
    }

    /// Serves `FinishRecovery` of `crashed`, once the caller made sure this master
    /// serves every tablet the committed map gives it: cancels any work on `crashed`
    /// still running here and waits for it to clean up, then forgets every object this
    /// master replayed for `crashed` and does not own. From now on a `Recover` of
    /// `crashed` is refused and an `AbandonRecovery` of it ignored. Returns how many
    /// objects were forgotten.
    pub async fn finish(&self, crashed: ServerId) -> Result<u64, RecoveryError> {
        let running = self.attempts.lock().end(crashed);
        for cancel in running {
            cancel.send_replace(true);
            cancel.closed().await;
        }
        let (cancel, cancelled) = watch::channel(false);
        let (id, ranges) = self.attempts.lock().finishing(crashed, Arc::new(cancel))?;
        let registration = Registration {
            master: self,
            id,
            ranges,
            cancelled,
        };
        let forgotten = if registration.ranges.is_empty() {
            0
        } else {
            self.appender
                .forget_unowned(registration.ranges.clone())
                .await
                .map_err(|_| RecoveryError::ShuttingDown)?
        };
        self.attempts.lock().forgotten(crashed);
        drop(registration);
        Ok(forgotten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::TableId;

    const T: TableId = TableId(1);

    #[test]
    fn ranges_must_be_sorted_disjoint_and_non_empty() {
        assert_eq!(check_ranges(&[]), Err(RecoveryError::BadRanges));
        assert_eq!(
            check_ranges(&[HashRange::new(T, 5, 4)]),
            Err(RecoveryError::BadRanges)
        );
        assert_eq!(
            check_ranges(&[HashRange::new(T, 0, 10), HashRange::new(T, 10, 20)]),
            Err(RecoveryError::BadRanges)
        );
        assert_eq!(
            check_ranges(&[HashRange::new(T, 20, 30), HashRange::new(T, 0, 10)]),
            Err(RecoveryError::BadRanges)
        );
        assert_eq!(
            check_ranges(&[HashRange::new(T, 0, 10), HashRange::new(T, 11, 20)]),
            Ok(())
        );
        assert_eq!(
            check_ranges(&[HashRange::whole(T), HashRange::new(TableId(2), 0, 0)]),
            Ok(())
        );
    }

    const CRASHED: ServerId = ServerId(7);

    fn cancel() -> Arc<watch::Sender<bool>> {
        Arc::new(watch::channel(false).0)
    }

    /// `attempt` at `crashed` arrives, the newest yet.
    fn arrives(attempts: &mut Attempts, crashed: ServerId, attempt: u64) {
        attempts
            .arrive(crashed, attempt)
            .expect("no newer attempt of that crash arrived before");
    }

    /// Registers `work` that nothing refuses; returns its id.
    fn registers(
        attempts: &mut Attempts,
        work: Work,
        crashed: ServerId,
        attempt: u64,
        ranges: &PartitionRanges,
    ) -> u64 {
        attempts
            .register(work, crashed, attempt, ranges, cancel())
            .expect("the newest attempt, on ranges nothing registered overlaps or abandoned")
            .0
    }

    #[test]
    fn an_attempt_overtaken_while_it_waited_is_refused_when_it_registers() {
        // Attempt 2 arrives and waits for older ones to clean up; meanwhile attempt 3
        // arrives, replays and finishes here (its commit under way). Attempt 2 must not
        // register: it would forget what attempt 3 replayed.
        let mut attempts = Attempts::default();
        let ranges = vec![HashRange::whole(T)];
        arrives(&mut attempts, CRASHED, 2);
        arrives(&mut attempts, CRASHED, 3);
        let newer = registers(&mut attempts, Work::Replay, CRASHED, 3, &ranges);
        attempts.finish(newer);
        assert_eq!(
            attempts.register(Work::Replay, CRASHED, 2, &ranges, cancel()),
            Err(RecoveryError::Superseded {
                recovery: 2,
                newest: 3
            })
        );
        assert!(matches!(
            attempts.arrive(CRASHED, 2),
            Err(RecoveryError::Superseded { .. })
        ));
        // Another crashed master's attempts are not compared.
        arrives(&mut attempts, ServerId(8), 1);
        registers(
            &mut attempts,
            Work::Replay,
            ServerId(8),
            1,
            &vec![HashRange::new(TableId(2), 0, 5)],
        );
    }

    #[test]
    fn overlapping_work_is_refused_and_superseded_work_is_found() {
        let mut attempts = Attempts::default();
        arrives(&mut attempts, CRASHED, 2);
        let low = registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 0, 99)],
        );
        registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 100, 199)],
        );
        assert_eq!(
            attempts.register(
                Work::Replay,
                CRASHED,
                2,
                &vec![HashRange::new(T, 50, 150)],
                cancel()
            ),
            Err(RecoveryError::InProgress)
        );
        assert_eq!(attempts.superseded(CRASHED, 2).len(), 0);
        assert_eq!(attempts.superseded(CRASHED, 3).len(), 2);
        assert_eq!(attempts.superseded(ServerId(8), 3).len(), 0);
        attempts.finish(low);
        assert_eq!(attempts.superseded(CRASHED, 3).len(), 1);
        registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 0, 99)],
        );
    }

    #[test]
    fn an_abandon_of_an_overtaken_attempt_is_ignored_and_a_current_one_waits_for_its_work() {
        let mut attempts = Attempts::default();
        arrives(&mut attempts, CRASHED, 2);
        registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 0, 99)],
        );
        let running = attempts.abandon(CRASHED, 2, &vec![HashRange::new(T, 50, 150)]);
        assert_eq!(running.map(|r| r.len()), Some(1));
        assert_eq!(
            attempts
                .abandon(CRASHED, 2, &vec![HashRange::new(T, 100, 150)])
                .map(|r| r.len()),
            Some(0)
        );
        arrives(&mut attempts, CRASHED, 3);
        assert!(attempts
            .abandon(CRASHED, 2, &vec![HashRange::new(T, 0, 99)])
            .is_none());
        // An abandon of attempt 3 registered while it forgets is superseded work for a
        // later attempt 4, which therefore waits for it.
        assert_eq!(
            attempts
                .abandon(CRASHED, 3, &vec![HashRange::new(T, 200, 299)])
                .map(|r| r.len()),
            Some(0)
        );
        let forget = registers(
            &mut attempts,
            Work::Forget,
            CRASHED,
            3,
            &vec![HashRange::new(T, 200, 299)],
        );
        assert_eq!(attempts.superseded(CRASHED, 4).len(), 2);
        // A `Recover` of attempt 3 that arrives after its abandon does not replay.
        attempts.finish(forget);
        arrives(&mut attempts, CRASHED, 3);
        assert_eq!(
            attempts.register(
                Work::Replay,
                CRASHED,
                3,
                &vec![HashRange::new(T, 250, 260)],
                cancel()
            ),
            Err(RecoveryError::Abandoned)
        );
        registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            3,
            &vec![HashRange::new(T, 300, 399)],
        );
        // Forgotten once a newer attempt arrives.
        arrives(&mut attempts, CRASHED, 4);
        assert!(attempts.abandoned.is_empty());
        registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            4,
            &vec![HashRange::new(T, 250, 260)],
        );
    }

    #[test]
    fn a_recover_registering_while_its_abandon_waits_for_clean_up_is_refused() {
        let mut attempts = Attempts::default();
        arrives(&mut attempts, CRASHED, 2);
        let replay = registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 0, 99)],
        );
        let running = attempts.abandon(CRASHED, 2, &vec![HashRange::new(T, 0, 99)]);
        assert_eq!(running.map(|r| r.len()), Some(1));
        // The cancelled replay cleans up; a duplicate `Recover` of the same attempt
        // arrives before the abandon registers its forgetting.
        attempts.finish(replay);
        arrives(&mut attempts, CRASHED, 2);
        assert_eq!(
            attempts.register(
                Work::Replay,
                CRASHED,
                2,
                &vec![HashRange::new(T, 0, 99)],
                cancel()
            ),
            Err(RecoveryError::Abandoned)
        );
        // So the forgetting registers and nothing is left replayed for nobody.
        registers(
            &mut attempts,
            Work::Forget,
            CRASHED,
            2,
            &vec![HashRange::new(T, 0, 99)],
        );
        // A duplicate of the abandon is remembered once.
        attempts.abandon(CRASHED, 2, &vec![HashRange::new(T, 0, 99)]);
        assert_eq!(attempts.abandoned.len(), 1);
    }

    /// Registers the forgetting of what the ended recovery of `crashed` left; returns its
    /// id and the ranges to forget.
    fn finishes(attempts: &mut Attempts, crashed: ServerId) -> (u64, PartitionRanges) {
        attempts
            .finishing(crashed, cancel())
            .expect("no work registered here overlaps what the recovery left")
    }

    #[test]
    fn a_finished_recovery_hands_back_every_range_replayed_and_refuses_later_work() {
        let mut attempts = Attempts::default();
        arrives(&mut attempts, CRASHED, 2);
        let done = registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 0, 99)],
        );
        attempts.finish(done);
        // A deposed leader's attempt, still replaying here.
        registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 100, 199)],
        );
        registers(
            &mut attempts,
            Work::Replay,
            CRASHED,
            2,
            &vec![HashRange::new(T, 0, 99)],
        );
        // Another crash's recovery is not touched.
        arrives(&mut attempts, ServerId(8), 1);
        registers(
            &mut attempts,
            Work::Replay,
            ServerId(8),
            1,
            &vec![HashRange::new(TableId(2), 0, 5)],
        );
        let running = attempts.end(CRASHED);
        assert_eq!(running.len(), 2, "the replays still running");
        // The driver cancels them and waits for them to clean up.
        let ids: Vec<u64> = attempts
            .in_flight
            .iter()
            .filter(|f| f.crashed == CRASHED)
            .map(|f| f.id)
            .collect();
        for id in ids {
            attempts.finish(id);
        }
        let (finishing, ranges) = finishes(&mut attempts, CRASHED);
        assert_eq!(
            ranges,
            vec![HashRange::new(T, 0, 99), HashRange::new(T, 100, 199)],
            "each range once"
        );
        attempts.finish(finishing);
        // Nothing of it registers again, and an abandon of it has nothing to do.
        assert_eq!(
            attempts.arrive(CRASHED, 3),
            Err(RecoveryError::Finished(CRASHED))
        );
        assert_eq!(
            attempts.register(
                Work::Replay,
                CRASHED,
                3,
                &vec![HashRange::new(T, 300, 399)],
                cancel()
            ),
            Err(RecoveryError::Finished(CRASHED))
        );
        assert!(attempts
            .abandon(CRASHED, 3, &vec![HashRange::new(T, 0, 99)])
            .is_none());
        // A repeated end hands the ranges back until they are forgotten.
        assert!(attempts.end(CRASHED).is_empty());
        let (again, ranges) = finishes(&mut attempts, CRASHED);
        assert_eq!(ranges.len(), 2);
        attempts.finish(again);
        attempts.forgotten(CRASHED);
        assert_eq!(finishes(&mut attempts, CRASHED).1, Vec::new());
        assert_eq!(attempts.finished.len(), 1);
    }

    #[test]
    fn forgetting_leaves_out_what_another_crashed_masters_replay_holds() {
        // X's replay of T here was lost on its way back, and T went to Y; Y crashed, and
        // Y's recovery replayed T here too, not yet taken (its commit under way) when X's
        // recovery ends. Forgetting T now would erase Y's replay.
        const X: ServerId = CRASHED;
        const Y: ServerId = ServerId(8);
        let t = vec![HashRange::new(T, 0, 99)];
        let mut attempts = Attempts::default();
        arrives(&mut attempts, X, 1);
        let replay = registers(&mut attempts, Work::Replay, X, 1, &t);
        attempts.finish(replay);
        arrives(&mut attempts, Y, 1);
        let replay = registers(&mut attempts, Work::Replay, Y, 1, &t);
        // While Y's replay runs, nothing overlapping it is forgotten: asked again later.
        assert!(attempts.end(X).is_empty());
        assert_eq!(
            attempts.finishing(X, cancel()),
            Err(RecoveryError::InProgress)
        );
        assert_eq!(
            attempts.register(Work::Forget, X, 1, &t, cancel()),
            Err(RecoveryError::Finished(X))
        );
        attempts.finish(replay);
        // Done, not taken: left to Y's own end, after Y's commits are caught up with.
        let (id, ranges) = finishes(&mut attempts, X);
        assert_eq!(ranges, Vec::new());
        attempts.finish(id);
        attempts.forgotten(X);
        assert!(attempts.end(Y).is_empty());
        assert_eq!(finishes(&mut attempts, Y).1, t);
        // An abandon leaves it out just the same.
        let mut attempts = Attempts::default();
        arrives(&mut attempts, X, 1);
        arrives(&mut attempts, Y, 1);
        let replay = registers(&mut attempts, Work::Replay, Y, 1, &t);
        attempts.finish(replay);
        assert!(attempts.abandon(X, 1, &t).is_some());
        let (_, ranges) = attempts
            .register(
                Work::Forget,
                X,
                1,
                &vec![HashRange::new(T, 0, 99), HashRange::new(T, 200, 299)],
                cancel(),
            )
            .expect("the abandon of X's newest attempt, overlapping no running work");
        assert_eq!(ranges, vec![HashRange::new(T, 200, 299)]);
    }

    #[test]
    fn overlapping_range_lists_are_detected() {
        assert!(overlap(
            &[HashRange::new(T, 0, 10)],
            &[HashRange::new(T, 10, 20)]
        ));
        assert!(!overlap(
            &[HashRange::new(T, 0, 10)],
            &[HashRange::new(T, 11, 20)]
        ));
        assert!(!overlap(
            &[HashRange::new(T, 0, 10)],
            &[HashRange::new(TableId(2), 0, 10)]
        ));
    }
}
