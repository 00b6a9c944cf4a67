//! `FrozenWatch`: a source frozen for a move that hears nothing of its end asks the
//! coordinators how it ended (docs/design.md §7, "Moving a tablet").
//!
//! A frozen range answers `Retry` until the move ends here: the commit reaches this
//! master as a change of its tablets (a push, or its next lease renewal, which pulls its
//! whole set), and the abort as `EndMove`. The leader sends `EndMove` only once the abort
//! is committed, and again for a while; but a leader that dies then, or a master cut off
//! meanwhile, leaves the range frozen with nobody to tell it. So every
//! [`CHECK_INTERVAL`], a range frozen for longer than [`ASK_AFTER`] has its move looked
//! up (`GetMove`, linearizable):
//! * aborted, or unknown (ended among the oldest, which no committed map of this
//!   master's tablets reflects, since the range is still served here): the range is
//!   served again;
//! * open, or committed: nothing; the leader ends an open one, and a commit narrows
//!   the tablets here.
//!
//! Only a committed outcome unfreezes a range: a move that may still commit stays
//! frozen.
//!
//! # Failure handling
//! No coordinator answers: asked again at the next round.

use parking_lot::Mutex;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{GetMove, MoveIdRequest, MoveState};
use rampart_common::rpc::RpcPool;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::object_store::ObjectStore;

/// How often the watch looks at the frozen ranges.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// How long a range stays frozen before its move is looked up: a move's last tail and
/// commit take milliseconds.
pub const ASK_AFTER: Duration = Duration::from_secs(2);

/// Deadline of one question.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// See the module doc.
#[derive(Debug)]
pub struct FrozenWatch {
    id: ServerId,
    store: Arc<Mutex<ObjectStore>>,
    coordinators: Arc<CoordinatorSet>,
    pool: Arc<RpcPool>,
}

impl FrozenWatch {
    /// The watch of master `id`'s `store`, asking `coordinators`.
    pub fn new(
        id: ServerId,
        store: Arc<Mutex<ObjectStore>>,
        coordinators: Arc<CoordinatorSet>,
        pool: Arc<RpcPool>,
    ) -> FrozenWatch {
        FrozenWatch {
            id,
            store,
            coordinators,
            pool,
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
        let frozen: Vec<_> = self
            .store
            .lock()
            .moves_out()
            .into_iter()
            .filter(|(_, _, since)| {
                since.is_some_and(|since| now.duration_since(since) >= ASK_AFTER)
            })
            .collect();
        for (id, range, _) in frozen {
            let deadline = tokio::time::Instant::now() + ASK_TIMEOUT;
            let state = match self
                .coordinators
                .call::<GetMove>(&self.pool, &MoveIdRequest { id }, deadline)
                .await
            {
                Ok(state) => state,
                Err(error) => {
                    tracing::debug!(master = %self.id, %id, %error, "frozen move not looked up; again at the next round");
                    continue;
                }
            };
            if matches!(state, MoveState::Aborted | MoveState::Unknown) {
                self.store.lock().end_move_out(id);
                tracing::warn!(master = %self.id, %id, ?range, ?state, "a frozen move's end never arrived: the range is served again");
            }
        }
    }
}
