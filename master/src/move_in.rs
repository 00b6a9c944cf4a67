//! The target's side of a move of tablets (docs/design.md §7, "Moving a tablet"): the
//! driver of `MoveIn`, which takes a range from its source ahead of the commit that gives
//! it here, and of `EndMove`, which forgets what an aborted move left.
//!
//! # The steps
//! 1. Register the move ([`ObjectStore::begin_move_in`]: none of the range is owned
//!    here), after the cleaner took out any tainted segment (a replay waits for them).
//! 2. **Copy.** Ask the source (`MoveOut`) for the range's live objects piece by piece,
//!    by hash; each reply is checked against the range off the reactor
//!    ([`RecoveryPiece::parse`]) and replayed through the appender as a recovery piece is
//!    (staged, replicated, published; invisible until the range is taken). The next
//!    piece is fetched while the last is replayed.
//! 3. **Tails.** Ask for what changed meanwhile until little waits
//!    ([`FREEZE_AT`]) or [`TAILS_MAX`] rounds were taken (a range written faster than it
//!    copies never gets small: it then freezes anyway, for longer).
//! 4. **Freeze and the last tail.** The source freezes the range (its reads and writes
//!    answer `Retry`) and sends what still waits; once that is replayed here, it is on
//!    this master's backups, and the answer goes back. The coordinators then commit the
//!    move, and the tablets come here as any change of tablets does.
//!
//! One [`ReplayState`] covers every step, so a tail's tombstone masks the copy's older
//! object of its key, and a later object of it survives the tombstone.
//!
//! # Failure handling
//! Any failure — the source unreachable or refusing, a piece that does not check, the
//! log full — fails the `MoveIn` (the coordinators then abort the move); what was
//! replayed stays, invisible, until `EndMove` forgets it. `EndMove` of a move still
//! running here first stops it (between two steps) and waits for it, so nothing it
//! replays comes after the forgetting.

use parking_lot::Mutex;
use rampart_common::failpoints;
use rampart_common::ids::{MoveId, SegmentId};
use rampart_common::protocol::master::{
    EndMoveRequest, MoveInReply, MoveInRequest, MoveOut, MoveOutReply, MoveOutRequest, MoveStep,
    MOVE_IN_TIMEOUT,
};
use rampart_common::rpc::RpcPool;
use rampart_common::status::Status;
use rampart_common::tablet::HashRange;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::appender::Appender;
use crate::object_store::ObjectStore;
use crate::replay::{PieceBytes, RecoveryPiece, ReplayState};

/// Bytes the target asks for per piece: a memcpy of this under the source's store lock
/// (≈ 0.1 ms) is the longest a move holds the source's reads and writes.
pub const MOVE_PIECE_BYTES: u32 = 1 << 20;

/// The tails stop, and the range freezes, once at most this many keys and records wait.
pub const FREEZE_AT: u64 = 1024;

/// The most tails taken before the freeze, however many wait.
pub const TAILS_MAX: u32 = 16;

/// How long a move waits for the cleaner to take the tainted segments out of this log
/// before it starts (a replay refuses while any is left).
pub const TAINTED_WAIT: Duration = Duration::from_secs(30);

/// Deadline of one `MoveOut` call.
const MOVE_OUT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a move into this master failed.
#[derive(Debug, thiserror::Error)]
pub enum MoveInError {
    /// The request cannot be served here.
    #[error("{0}")]
    Refused(String, Status),
    /// The source did not answer, or answered with an error.
    #[error("the source {source_addr}: {error}")]
    Source {
        /// Where it listens.
        source_addr: String,
        /// What happened.
        error: String,
    },
    /// A piece from the source does not check against the range.
    #[error("a piece from the source does not check: {0}")]
    BadPiece(String),
    /// The log is full.
    #[error("the log is full: no room for the range")]
    NoSpace,
    /// `EndMove` stopped it, or the master is shutting down.
    #[error("stopped: {0}")]
    Stopped(&'static str),
}

impl MoveInError {
    /// The wire status of the failure.
    pub fn status(&self) -> Status {
        match self {
            MoveInError::Refused(_, status) => *status,
            MoveInError::NoSpace => Status::NoSpace,
            _ => Status::Retry,
        }
    }
}

/// Takes ranges into one master; see the module doc.
#[derive(Debug)]
pub struct MoveIn {
    store: Arc<Mutex<ObjectStore>>,
    appender: Appender,
    pool: RpcPool,
    /// The moves running here, each with the sender that stops it.
    running: Mutex<HashMap<MoveId, watch::Sender<bool>>>,
}

/// Counts of one move, for its reply.
#[derive(Default)]
struct Taken {
    entries: u64,
    bytes: u64,
}

impl MoveIn {
    /// The driver of moves into the master of `store`, replaying through `appender`.
    pub fn new(store: Arc<Mutex<ObjectStore>>, appender: Appender) -> MoveIn {
        MoveIn {
            store,
            appender,
            pool: RpcPool::new(),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// `MoveIn`: takes `request.range` from its source (module doc).
    pub async fn move_in(&self, request: MoveInRequest) -> Result<MoveInReply, MoveInError> {
        let started = Instant::now();
        let deadline = started + MOVE_IN_TIMEOUT;
        let (stop, stopped) = watch::channel(false);
        {
            let mut running = self.running.lock();
            if running.contains_key(&request.id) {
                return Err(MoveInError::Refused(
                    format!("{} is running here already", request.id),
                    Status::Retry,
                ));
            }
            running.insert(request.id, stop);
        }
        let result = self.run(&request, started, deadline, stopped).await;
        self.running.lock().remove(&request.id);
        match &result {
            Ok(reply) => tracing::info!(
                id = %request.id, range = ?request.range, source = %request.source,
                entries = reply.entries, bytes = reply.bytes, tails = reply.tails,
                copy_ms = reply.copy_ms, frozen_ms = reply.frozen_ms,
                "range taken; waiting for the commit"
            ),
            Err(error) => tracing::warn!(
                id = %request.id, range = ?request.range, source = %request.source, %error,
                "move in failed"
            ),
        }
        result
    }

    async fn run(
        &self,
        request: &MoveInRequest,
        started: Instant,
        deadline: Instant,
        stopped: watch::Receiver<bool>,
    ) -> Result<MoveInReply, MoveInError> {
        self.wait_untainted(deadline.min(Instant::now() + TAINTED_WAIT))
            .await?;
        self.store
            .lock()
            .begin_move_in(request.id, request.range)
            .map_err(|status| {
                MoveInError::Refused(
                    format!(
                        "cannot take {:?}: {status:?} (owned here in part, or another move \
                         into it runs)",
                        request.range
                    ),
                    status,
                )
            })?;
        let state = Arc::new(Mutex::new(ReplayState::new()));
        let step = Stepper {
            driver: self,
            request,
            state: &state,
            stopped,
            deadline,
        };
        let mut taken = Taken::default();
        // Copy, fetching the next piece while the last replays; under a cap, no faster
        // than `bytes_per_s`.
        let mut replaying: Option<tokio::task::JoinHandle<Result<(), MoveInError>>> = None;
        let copy_began = Instant::now();
        let copied = async {
            let mut from = Some(request.range.start);
            while let Some(at) = from {
                step.pace(copy_began, taken.bytes, at).await?;
                let reply = step.ask(MoveStep::Copy { from: at }).await?;
                from = reply.next;
                let piece = step.parse(reply, &mut taken).await?;
                if let Some(last) = replaying.take() {
                    joined(last).await?;
                }
                replaying = Some(step.spawn_replay(piece));
            }
            Ok::<(), MoveInError>(())
        }
        .await;
        // Whatever happened, the replay in flight ends before this does: an `EndMove`
        // waiting for this run must forget after it, not before.
        let last = match replaying.take() {
            Some(last) => joined(last).await,
            None => Ok(()),
        };
        copied?;
        last?;
        // Tails, until little waits.
        let mut tails = 0;
        loop {
            let reply = step.ask(MoveStep::Tail).await?;
            let left = reply.left;
            step.replay(reply, &mut taken).await?;
            tails += 1;
            if left <= FREEZE_AT || tails >= TAILS_MAX {
                break;
            }
        }
        // The freeze and the last tail.
        let frozen = Instant::now();
        let mut reply = step.ask(MoveStep::Freeze).await?;
        if let Some(hold) = failpoints::hold(failpoints::MOVE_IN_HOLDS_AFTER_FREEZE) {
            tokio::time::sleep(hold).await;
        }
        if failpoints::active(failpoints::MOVE_IN_FAILS_AFTER_FREEZE) {
            return Err(MoveInError::Stopped("failpoint: failed after the freeze"));
        }
        loop {
            let left = reply.left;
            step.replay(reply, &mut taken).await?;
            if left == 0 {
                break;
            }
            reply = step.ask(MoveStep::Tail).await?;
        }
        Ok(MoveInReply {
            entries: taken.entries,
            bytes: taken.bytes,
            tails,
            copy_ms: millis(frozen - started),
            frozen_ms: millis(frozen.elapsed()),
        })
    }

    /// `EndMove`: stops move `request.id` if it runs here and forgets what it replayed
    /// (a target), or serves its range again (a source). Either ignores a move it does
    /// not hold.
    pub async fn end_move(&self, request: EndMoveRequest) -> Result<u64, MoveInError> {
        let stop = self.running.lock().get(&request.id).cloned();
        if let Some(stop) = stop {
            stop.send_replace(true);
            stop.closed().await;
        }
        let ended = {
            let mut store = self.store.lock();
            if !failpoints::active(failpoints::IGNORE_END_MOVE) {
                store.end_move_out(request.id);
            }
            store.end_move_in(request.id)
        };
        let Some(range) = ended else {
            return Ok(0);
        };
        let forgotten = self
            .appender
            .forget_unowned(vec![range])
            .await
            .map_err(|_| MoveInError::Stopped("the master is shutting down"))?;
        tracing::info!(id = %request.id, ?range, forgotten, "move aborted; its copy here is forgotten");
        Ok(forgotten)
    }

    /// Whether move `id` runs here now.
    pub fn running(&self, id: MoveId) -> bool {
        self.running.lock().contains_key(&id)
    }

    /// Waits until no tainted segment is left in this log (the appender's cleaner
    /// takes them first) and no range moved away is left to forget, or fails at
    /// `until`.
    async fn wait_untainted(&self, until: Instant) -> Result<(), MoveInError> {
        loop {
            let (tainted, forgetting) = {
                let store = self.store.lock();
                (store.tainted_held(), store.forgetting())
            };
            if tainted == 0 && !forgetting {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(MoveInError::Refused(
                    format!(
                        "{tainted} segments of an abandoned recovery or of a range moved away \
                         are still being cleaned out of this log{}",
                        if forgetting {
                            ", and a range moved away is still being forgotten"
                        } else {
                            ""
                        }
                    ),
                    Status::Retry,
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The steps of one move, with what they share.
struct Stepper<'a> {
    driver: &'a MoveIn,
    request: &'a MoveInRequest,
    state: &'a Arc<Mutex<ReplayState>>,
    stopped: watch::Receiver<bool>,
    deadline: Instant,
}

impl Stepper<'_> {
    /// One `MoveOut` call to the source, unless the move was stopped or ran out of time.
    async fn ask(&self, step: MoveStep) -> Result<MoveOutReply, MoveInError> {
        if *self.stopped.borrow() {
            return Err(MoveInError::Stopped("ended by the coordinators"));
        }
        if Instant::now() >= self.deadline {
            return Err(MoveInError::Stopped("out of time"));
        }
        let request = MoveOutRequest {
            id: self.request.id,
            range: self.request.range,
            step,
            bytes_max: MOVE_PIECE_BYTES,
        };
        let deadline = self.deadline.min(Instant::now() + MOVE_OUT_CALL_TIMEOUT);
        self.driver
            .pool
            .call::<MoveOut>(&self.request.source_addr, &request, deadline)
            .await
            .map_err(|error| MoveInError::Source {
                source_addr: self.request.source_addr.clone(),
                error: error.to_string(),
            })
    }

    /// Under a cap of `bytes_per_s`, waits until `bytes` copied since `began` (the
    /// walk of the range's hashes now at `at`) are within it; a stop ends the wait. Fails
    /// at once when the whole copy, projected from the share of the hashes walked (keys
    /// hash uniformly), could not end before the move's deadline under the cap.
    async fn pace(&self, began: Instant, bytes: u64, at: u64) -> Result<(), MoveInError> {
        let rate = self.request.bytes_per_s as f64;
        if rate == 0.0 {
            return Ok(());
        }
        let HashRange { start, end, .. } = self.request.range;
        let walked = (at - start) as f64 / ((end - start) as f64 + 1.0);
        // From a hundredth of the hashes on, the projection is steady enough.
        if walked >= 0.01 {
            let total = bytes as f64 / walked;
            if began + Duration::from_secs_f64(total / rate) > self.deadline {
                return Err(MoveInError::Stopped(
                    "the copy cannot finish in the move's time under the bandwidth cap",
                ));
            }
        }
        let due = began + Duration::from_secs_f64(bytes as f64 / rate);
        let mut stopped = self.stopped.clone();
        tokio::select! {
            () = tokio::time::sleep_until(due) => Ok(()),
            _ = stopped.wait_for(|stopped| *stopped) => {
                Err(MoveInError::Stopped("ended by the coordinators"))
            }
        }
    }

    /// Checks a reply against the range, off the reactor (a CRC over every entry).
    async fn parse(
        &self,
        reply: MoveOutReply,
        taken: &mut Taken,
    ) -> Result<RecoveryPiece, MoveInError> {
        taken.entries += u64::from(reply.count);
        taken.bytes += reply.entries.len() as u64;
        let range: HashRange = self.request.range;
        let bytes = PieceBytes {
            safe_version: reply.safe_version,
            entries: reply.entries,
            count: reply.count,
        };
        tokio::task::spawn_blocking(move || RecoveryPiece::parse(SegmentId(0), bytes, &[range]))
            .await
            .map_err(|error| MoveInError::BadPiece(error.to_string()))?
            .map_err(|error| MoveInError::BadPiece(error.to_string()))
    }

    /// Replays `piece` through the appender as a task of its own.
    fn spawn_replay(
        &self,
        piece: RecoveryPiece,
    ) -> tokio::task::JoinHandle<Result<(), MoveInError>> {
        let appender = self.driver.appender.clone();
        let state = Arc::clone(self.state);
        tokio::spawn(async move { replay(&appender, piece, state).await })
    }

    /// Checks and replays one reply, in order.
    async fn replay(&self, reply: MoveOutReply, taken: &mut Taken) -> Result<(), MoveInError> {
        if reply.count == 0 && reply.entries.is_empty() {
            return Ok(());
        }
        let piece = self.parse(reply, taken).await?;
        replay(&self.driver.appender, piece, Arc::clone(self.state)).await
    }
}

async fn replay(
    appender: &Appender,
    piece: RecoveryPiece,
    state: Arc<Mutex<ReplayState>>,
) -> Result<(), MoveInError> {
    appender
        .replay(piece, state)
        .await
        .map_err(|_| MoveInError::Stopped("the master is shutting down"))?
        .map_err(|_| MoveInError::NoSpace)
}

async fn joined(
    handle: tokio::task::JoinHandle<Result<(), MoveInError>>,
) -> Result<(), MoveInError> {
    handle
        .await
        .map_err(|_| MoveInError::Stopped("a replay task failed"))?
}

fn millis(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}
