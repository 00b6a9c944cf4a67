//! `TabletSync`: keeps the tablets this master serves equal to the committed map
//! (docs/design.md §6: "the tablets a server serves converge to the committed map even when a
//! push is lost or a leader dies mid-step").
//!
//! The coordinator pushes every change of this master's tablets (`TakeTablets`,
//! `DropTablets`) numbered by the master's *tablet epoch*; the appender applies the next
//! one and reports a gap for a later one ([`OwnedTablets::step`], the pure decision).
//! Pushes get lost — a leader dies between its commit and its push, the master is
//! unreachable for a moment — so they are only the fast path. The mechanism is this: every
//! lease renewal answers the epoch the committed map is at, and whenever this master is
//! behind it pulls its whole set (`GetOwnedTablets`, a linearizable read) and serves
//! exactly that ([`TabletChange::Replace`]). A pull happens on a gap in a push
//! ([`TabletSync::catch_up`], which the push's handler awaits) and after a renewal
//! reported a newer epoch ([`TabletSync::run`]). A lost push costs at most one renewal
//! interval (150 ms by default).
//!
//! # Failure handling
//! * No coordinator answers within [`PULL_TIMEOUT`]: `catch_up` fails (a push is then
//!   answered `Retry`); `run` tries again after [`PULL_RETRY_PAUSE`] while it is behind.
//! * `ServerCrashed`: this master was declared crashed; nothing is pulled (its lease
//!   renewal revokes the lease, and the process exits).
//! * A master without coordinators (tests, benchmarks) cannot pull: a gap is an error.
//!
//! # Concurrency
//! One pull at a time (`pulling`), so replies apply in order; the appender orders the
//! replacement with the writes and tablet changes around it.
//!
//! [`OwnedTablets::step`]: crate::tablets::OwnedTablets::step

use parking_lot::Mutex;
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::{ServerId, TabletEpoch};
use rampart_common::protocol::coordinator::{GetOwnedTablets, ServerIdRequest};
use rampart_common::rpc::RpcPool;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::appender::{Appender, TabletChange};
use crate::object_store::ObjectStore;

/// How long one pull may take (the coordinators tried, following leader hints).
pub const PULL_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause before pulling again after a failed pull, while still behind.
pub const PULL_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// While pulls fail, at most one warning per this long.
pub const PULL_WARN_INTERVAL: Duration = Duration::from_secs(2);

/// Why this master could not catch up with its tablets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// No coordinators to pull from (a master built without them).
    #[error("this master has no coordinators to pull its tablets from")]
    NoCoordinators,
    /// The coordinators did not serve the pull.
    #[error("tablets not pulled: {0}")]
    Pull(String),
    /// The coordinators answered an older epoch than the one wanted.
    #[error("pulled tablet epoch {pulled}, but epoch {wanted} was announced")]
    Behind {
        /// The epoch pulled.
        pulled: TabletEpoch,
        /// The epoch wanted.
        wanted: TabletEpoch,
    },
    /// The coordinators answered with tablets of another server (a bug).
    #[error("pulled tablets name another owner than {0}")]
    WrongOwner(ServerId),
    /// The master is shutting down.
    #[error("the master is shutting down")]
    ShuttingDown,
}

/// Keeps this master's tablets equal to the committed map; see the module doc.
#[derive(Debug)]
pub struct TabletSync {
    id: ServerId,
    store: Arc<Mutex<ObjectStore>>,
    appender: Appender,
    /// Where to pull from; `None` for a master without coordinators.
    coordinators: Option<CoordinatorSet>,
    pool: RpcPool,
    /// One pull at a time: an async mutex, held across the pull's calls.
    pulling: tokio::sync::Mutex<()>,
    /// The newest tablet epoch the committed map was reported at (lease renewals).
    reported: watch::Sender<TabletEpoch>,
}

impl TabletSync {
    /// The sync of master `id`, applying through `appender` to `store`, pulling from
    /// `coordinators` (none: it cannot pull).
    pub fn new(
        id: ServerId,
        store: Arc<Mutex<ObjectStore>>,
        appender: Appender,
        coordinators: Option<&[String]>,
    ) -> TabletSync {
        TabletSync {
            id,
            store,
            appender,
            coordinators: coordinators.map(CoordinatorSet::new),
            pool: RpcPool::new(),
            pulling: tokio::sync::Mutex::new(()),
            reported: watch::Sender::new(TabletEpoch::default()),
        }
    }

    /// The number of the last change of this master's tablets it serves.
    pub fn applied(&self) -> TabletEpoch {
        self.store.lock().tablets_epoch()
    }

    /// Records that the committed map holds this master's tablets at tablet epoch
    /// `epoch` (a lease renewal said so); [`run`](Self::run) catches up if behind.
    pub fn report(&self, epoch: TabletEpoch) {
        self.reported.send_if_modified(|held| {
            let newer = epoch > *held;
            if newer {
                *held = epoch;
            }
            newer
        });
    }

    /// Returns once what this master serves reflects tablet epoch `epoch` or a later
    /// one, pulling its whole set if it does not yet.
    ///
    /// # Errors
    /// [`SyncError`] when the pull failed; nothing was changed then.
    pub async fn catch_up(&self, epoch: TabletEpoch) -> Result<(), SyncError> {
        let _one = self.pulling.lock().await;
        if self.applied() >= epoch {
            return Ok(());
        }
        let Some(coordinators) = &self.coordinators else {
            return Err(SyncError::NoCoordinators);
        };
        let request = ServerIdRequest { server: self.id };
        let deadline = Instant::now() + PULL_TIMEOUT;
        let reply = coordinators
            .call::<GetOwnedTablets>(&self.pool, &request, deadline)
            .await
            .map_err(|error| match error {
                CoordinatorCallError::Rpc(error) => SyncError::Pull(error.to_string()),
                other => SyncError::Pull(other.to_string()),
            })?;
        if reply.tablets.iter().any(|t| t.owner != self.id) {
            return Err(SyncError::WrongOwner(self.id));
        }
        let (pulled, tablets) = (reply.epoch, reply.tablets.len());
        let step = self
            .appender
            .change_tablets(TabletChange::Replace {
                epoch: pulled,
                tablets: reply.tablets,
            })
            .await
            .map_err(|_| SyncError::ShuttingDown)?;
        tracing::info!(master = %self.id, epoch = %pulled, tablets, ?step, "tablets pulled from the committed map");
        if pulled < epoch {
            return Err(SyncError::Behind {
                pulled,
                wanted: epoch,
            });
        }
        Ok(())
    }

    /// Catches up whenever a reported epoch is ahead of what is served, until
    /// `shutdown` completes.
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut reports = self.reported.subscribe();
        let mut warned: Option<Instant> = None;
        loop {
            let wanted = *reports.borrow_and_update();
            if wanted > self.applied() {
                match self.catch_up(wanted).await {
                    Ok(()) => {
                        warned = None;
                        continue;
                    }
                    Err(error) => {
                        if warned.map_or(true, |at| at.elapsed() >= PULL_WARN_INTERVAL) {
                            tracing::warn!(master = %self.id, %wanted, %error, "behind the committed map's tablets; pulling again");
                            warned = Some(Instant::now());
                        }
                        tokio::select! {
                            _ = &mut shutdown => return,
                            _ = tokio::time::sleep(PULL_RETRY_PAUSE) => continue,
                        }
                    }
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                changed = reports.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
