//! `FrozenWatch`: a source frozen for a move, or a target holding a copy for one, that
//! hears nothing of the move's end asks the coordinators how it ended (docs/design.md
//! §7, "Moving a tablet").
//!
//! A frozen range answers `Retry` until the move ends here: the commit reaches this
//! master as a change of its tablets (a push, or its next lease renewal, which pulls its
//! whole set), and the abort as `EndMove`. The leader sends `EndMove` only once the abort
//! is committed, and again for a while; but a leader that dies then, or a master cut off
//! meanwhile, leaves the range frozen with nobody to tell it. So every
//! [`CHECK_INTERVAL`], a range frozen for longer than [`ASK_AFTER`], or a move open and
//! not frozen for longer than [`ASK_OPEN_AFTER`] (noting the range's changes for good,
//! and refusing overlapping moves), has its move looked up (`GetMove`, linearizable):
//! * aborted: the move ends here, and a frozen range is served again;
//! * open, or committed: nothing; the leader ends an open one, and a commit narrows
//!   the tablets here;
//! * unknown (ended before the newest 1,024): nothing but a warning. A commit that this
//!   master has not applied yet would be unknown too, and serving the range then would
//!   take writes the target owns.
//!
//! Only a committed outcome unfreezes a range: a move that may still commit stays
//! frozen.
//!
//! A target's copy is held until the commit gives it the range or `EndMove` forgets it,
//! and a lost `EndMove` would leave it for good: memory held, later moves into the
//! range refused, and the copy underneath a later recovery of the range. So every move
//! registered here and not running (its `MoveIn` ended) for a round is looked up the
//! same way, and forgotten once its abort is committed (as `EndMove` does); a commit
//! reaches this master as a change of its tablets, which ends the registration.
//!
//! # Failure handling
//! No coordinator answers: asked again at the next round.

use parking_lot::Mutex;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{GetMove, MoveIdRequest, MoveState};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::HashRange;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::move_in::MoveIn;
use crate::object_store::ObjectStore;
use rampart_common::ids::MoveId;
use rampart_common::protocol::master::EndMoveRequest;
use std::collections::HashSet;

/// How often the watch looks at the frozen ranges.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// How long a range stays frozen before its move is looked up: a move's last tail and
/// commit take milliseconds.
pub const ASK_AFTER: Duration = Duration::from_secs(2);

/// How long a move stays open here, not frozen, before it is looked up: a copy of a
/// gigabyte takes seconds, and a move whose drive died and whose abort never came
/// would note the range's changes for good.
pub const ASK_OPEN_AFTER: Duration = Duration::from_secs(30);

/// Deadline of one question.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// See the module doc.
#[derive(Debug)]
pub struct FrozenWatch {
    id: ServerId,
    store: Arc<Mutex<ObjectStore>>,
    move_in: Arc<MoveIn>,
    coordinators: Arc<CoordinatorSet>,
    pool: Arc<RpcPool>,
    /// Moves into this master seen registered and not running at the last round.
    idle_in: Mutex<HashSet<MoveId>>,
}

impl FrozenWatch {
    /// The watch of master `id`'s `store` and its moves in (`move_in`), asking
    /// `coordinators`.
    pub fn new(
        id: ServerId,
        store: Arc<Mutex<ObjectStore>>,
        move_in: Arc<MoveIn>,
        coordinators: Arc<CoordinatorSet>,
        pool: Arc<RpcPool>,
    ) -> FrozenWatch {
        FrozenWatch {
            id,
            store,
            move_in,
            coordinators,
            pool,
            idle_in: Mutex::new(HashSet::new()),
        }
    }

    /// Where move `id` stands, or `None` if no coordinator answered.
    async fn ask(&self, id: MoveId) -> Option<MoveState> {
        let deadline = tokio::time::Instant::now() + ASK_TIMEOUT;
        match self
            .coordinators
            .call::<GetMove>(&self.pool, &MoveIdRequest { id }, deadline)
            .await
        {
            Ok(state) => Some(state),
            Err(error) => {
                tracing::debug!(master = %self.id, %id, %error, "move not looked up; again at the next round");
                None
            }
        }
    }

    /// The moves into this master that stayed registered and idle for a whole round:
    /// forgotten once their aborts are committed.
    async fn check_moves_in(&self) {
        let idle: HashSet<(MoveId, HashRange)> = self
            .store
            .lock()
            .moves_in()
            .into_iter()
            .filter(|&(id, _)| !self.move_in.running(id))
            .collect();
        let seen = std::mem::replace(
            &mut *self.idle_in.lock(),
            idle.iter().map(|&(id, _)| id).collect(),
        );
        for (id, range) in idle.into_iter().filter(|(id, _)| seen.contains(id)) {
            if self.ask(id).await != Some(MoveState::Aborted) {
                continue;
            }
            match self.move_in.end_move(EndMoveRequest { id, range }).await {
                Ok(forgotten) => {
                    tracing::warn!(master = %self.id, %id, ?range, forgotten, "a move's abort never arrived: its copy here is forgotten")
                }
                Err(error) => {
                    tracing::warn!(master = %self.id, %id, %error, "a move's copy not forgotten; again at the next round")
                }
            }
        }
    }

    /// Runs until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(CHECK_INTERVAL) => {}
            }
            self.check(Instant::now()).await;
        }
    }

    /// One round at `now`.
    pub async fn check(&self, now: Instant) {
        let asked: Vec<_> = self
            .store
            .lock()
            .moves_out()
            .into_iter()
            .filter(|&(_, _, opened, frozen)| match frozen {
                Some(since) => now.duration_since(since) >= ASK_AFTER,
                None => now.duration_since(opened) >= ASK_OPEN_AFTER,
            })
            .map(|(id, range, _, _)| (id, range))
            .collect();
        for (id, range) in asked {
            let Some(state) = self.ask(id).await else {
                continue;
            };
            match state {
                MoveState::Aborted => {
                    self.store.lock().end_move_out(id);
                    tracing::warn!(master = %self.id, %id, ?range, "a move's abort never arrived: it ends here, and a frozen range is served again");
                }
                // Ended long ago, one way or the other: a commit reaches this master as
                // a change of its tablets (its lease renewals pull them), so a range still
                // frozen here is most likely aborted, but nothing proves it.
                MoveState::Unknown => {
                    tracing::warn!(master = %self.id, %id, ?range, "a frozen move's outcome is no longer known: the range stays frozen until this master's tablets show it moved, or a restart");
                }
                MoveState::Open | MoveState::Committed => {}
            }
        }
        self.check_moves_in().await;
    }
}
