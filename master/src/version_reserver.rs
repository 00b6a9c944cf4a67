//! `VersionReserver`: keeps this master's version ceiling ahead of the versions it hands
//! out (see `object_store`, "Versions").
//!
//! The store answers `Retry` to a write that would need a version at or above its
//! ceiling. This task reserves the next range at the coordinator (`ReserveVersions`, a
//! Raft commit) whenever fewer than [`VERSION_LOW_WATER`] versions are left — checked
//! every [`RESERVE_CHECK_INTERVAL`], so with a reservation of [`VERSION_RESERVATION`]
//! writes never meet the ceiling in steady operation: only the first writes after start,
//! and the first overwrites of keys a recovery replayed here with high versions, wait
//! for one reservation. Lease renewals also report the ceiling the coordinator holds
//! ([`VersionReserver::note_ceiling`]), which a recovered partition may have raised.
//!
//! Nothing is reserved before the opening of the log's first segment is on R backups: a
//! master whose ceiling at the coordinator is still 0 never handed out a version, hence
//! never acknowledged a write, and a recovery that finds no replica of its log may bring
//! its tablets back empty without waiting (`coordinator::recovery_plan::check_log`);
//! one with a ceiling has a log on backups to wait for.
//!
//! The pure decision is [`ObjectStore::ceiling_wanted`]; this is its driver.
//!
//! # Failure handling
//! * No coordinator answers: the reservation is tried again at the next check; writes
//!   that need the reserved versions wait (answered `Retry`, which clients retry).
//! * `ServerCrashed`: this master was declared crashed; the task ends (the lease renewal
//!   stops the process).
//!
//! [`VERSION_LOW_WATER`]: crate::object_store::VERSION_LOW_WATER
//! [`VERSION_RESERVATION`]: crate::object_store::VERSION_RESERVATION

use parking_lot::Mutex;
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::{ServerId, Version};
use rampart_common::protocol::coordinator::{ReserveVersions, ReserveVersionsRequest};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::status::Status;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::appender::AppenderStatus;
use crate::object_store::ObjectStore;
use std::sync::atomic::Ordering;

/// How often the reserver checks whether a reservation is due. A reservation covers
/// billions of versions; the check is a lock and two loads.
pub const RESERVE_CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// How long one reservation may take (the coordinators tried, following leader hints).
pub const RESERVE_TIMEOUT: Duration = Duration::from_secs(2);

/// While reservations fail, at most one warning per this long.
pub const RESERVE_WARN_INTERVAL: Duration = Duration::from_secs(2);

/// Reserves version ranges for a master at the coordinators; see the module doc.
#[derive(Debug)]
pub struct VersionReserver {
    id: ServerId,
    store: Arc<Mutex<ObjectStore>>,
    /// Whose `log_started` says the log's opening is on R backups: nothing is reserved
    /// before (see [`AppenderStatus::log_started`]).
    status: Arc<AppenderStatus>,
    coordinators: CoordinatorSet,
    pool: RpcPool,
}

/// Why a reservation did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// The coordinators answered that this master was declared crashed.
    #[error("declared crashed: no versions are reserved for it any more")]
    Crashed,
    /// No coordinator served the reservation.
    #[error("versions not reserved: {0}")]
    Unavailable(String),
}

impl VersionReserver {
    /// The reserver of master `id`, whose store must enforce its ceiling
    /// ([`ObjectStore::enforce_version_ceiling`]) and whose appender reports into
    /// `status`.
    pub fn new(
        id: ServerId,
        store: Arc<Mutex<ObjectStore>>,
        status: Arc<AppenderStatus>,
        coordinators: &[String],
    ) -> Self {
        VersionReserver {
            id,
            store,
            status,
            coordinators: CoordinatorSet::new(coordinators),
            pool: RpcPool::new(),
        }
    }

    /// The coordinators hold `ceiling` for this master (a lease renewal said so).
    pub fn note_ceiling(&self, ceiling: u64) {
        self.store.lock().raise_version_ceiling(Version(ceiling));
    }

    /// Reserves the next range if one is due; returns whether it reserved.
    ///
    /// # Errors
    /// [`ReserveError`] when the coordinators did not reserve it.
    pub async fn reserve_if_due(&self) -> Result<bool, ReserveError> {
        if !self.status.log_started.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let Some(wanted) = self.store.lock().ceiling_wanted() else {
            return Ok(false);
        };
        let request = ReserveVersionsRequest {
            server: self.id,
            ceiling: wanted.0,
        };
        let deadline = Instant::now() + RESERVE_TIMEOUT;
        match self
            .coordinators
            .call::<ReserveVersions>(&self.pool, &request, deadline)
            .await
        {
            Ok(reply) => {
                self.store
                    .lock()
                    .raise_version_ceiling(Version(reply.ceiling));
                tracing::debug!(master = %self.id, ceiling = reply.ceiling, "versions reserved");
                Ok(true)
            }
            Err(CoordinatorCallError::Rpc(RpcError::Status {
                status: Status::ServerCrashed,
                ..
            })) => Err(ReserveError::Crashed),
            Err(error) => Err(ReserveError::Unavailable(error.to_string())),
        }
    }

    /// Reserves whenever a reservation is due, until `shutdown` completes or this master
    /// is declared crashed.
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut warned: Option<Instant> = None;
        loop {
            match self.reserve_if_due().await {
                Ok(_) => warned = None,
                Err(ReserveError::Crashed) => return,
                Err(error) => {
                    if warned.map_or(true, |at| at.elapsed() >= RESERVE_WARN_INTERVAL) {
                        tracing::warn!(master = %self.id, %error, "version reservation failed; writes past the ceiling wait");
                        warned = Some(Instant::now());
                    }
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(RESERVE_CHECK_INTERVAL) => {}
            }
        }
    }
}
