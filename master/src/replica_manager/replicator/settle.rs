//! `settle`: carries out what `Settling::next` asks (confirm alive, place, bump,
//! record) until every replica of a segment is live and current, waiting for backups
//! or coordinators as its [`Patience`] allows.

use bytes::Bytes;
use rampart_common::backoff::Backoff;
use rampart_common::ids::SegmentId;
use std::time::Duration;
use tokio::time::Instant;

use super::state::{
    Fatal, Replicator, SHORTAGE_SAID_AFTER, WAIT_BACKOFF_MAX, WAIT_BACKOFF_MIN, WAIT_WARN_INTERVAL,
};
use crate::replica_manager::settling::{Effect, Patience, Settling};

/// Progress of a wait in [`Replicator::settle`]: for backups to place replicas on, or
/// for a coordinator to record an epoch.
pub(super) struct Waiting {
    since: Option<Instant>,
    last_warn: Option<Instant>,
    backoff: Backoff,
}

impl Waiting {
    pub(super) fn new() -> Waiting {
        Waiting {
            since: None,
            last_warn: None,
            backoff: Backoff::new(WAIT_BACKOFF_MIN, WAIT_BACKOFF_MAX),
        }
    }

    /// How long this wait has lasted, starting it now if it had not started.
    pub(super) fn waited(&mut self, now: Instant) -> Duration {
        now - *self.since.get_or_insert(now)
    }

    /// Whether to warn now (at most every [`WAIT_WARN_INTERVAL`]); records it if so.
    pub(super) fn warn_due(&mut self, now: Instant) -> bool {
        let due = self
            .last_warn
            .map_or(true, |t| now - t >= WAIT_WARN_INTERVAL);
        if due {
            self.last_warn = Some(now);
        }
        due
    }

    /// Sleeps the next pause of the shared jittered [`Backoff`]: its step doubles from
    /// [`WAIT_BACKOFF_MIN`] to [`WAIT_BACKOFF_MAX`], so masters that began waiting at
    /// the same moment (for a backup that rejoined, for a new coordinator leader) come
    /// back spread out.
    pub(super) async fn pause(&mut self) {
        tokio::time::sleep(self.backoff.next_pause()).await;
    }
}

impl Replicator {
    /// Carries out what [`Settling::next`] asks until every replica of `id` is live and
    /// current: confirms this master is Up before an open segment that lost every
    /// replica goes on, places replicas in empty slots (holding the segment's bytes so
    /// far), bumps the survivors of a loss to the new epoch, records it at the
    /// coordinator. With [`Patience::UntilDone`] waits, refreshing the server list and
    /// freeing abandoned copies, while not enough backups exist, and retries while no
    /// coordinator answers; with [`Patience::OneAttempt`] returns after one placement
    /// round or one failed round.
    pub(super) async fn settle(
        &mut self,
        id: SegmentId,
        log_bytes: Option<&Bytes>,
        patience: Patience,
    ) -> Result<(), Fatal> {
        let mut for_backups = Waiting::new();
        let mut for_record = Waiting::new();
        let mut settling = Settling::new(patience);
        loop {
            let Some(segment) = self.segments.get_mut(&id) else {
                return Ok(());
            };
            match settling.next(segment) {
                Effect::Done => return Ok(()),
                Effect::ConfirmAlive => {
                    self.confirm_alive().await?;
                    settling.alive();
                }
                Effect::Place { slots, fresh } => {
                    self.refresh_servers(false).await;
                    let exclude = self.excluded();
                    match self.place(id, &slots, fresh, &exclude) {
                        Ok(targets) => {
                            settling.placing();
                            let refused =
                                self.create_replicas(id, targets, fresh, log_bytes).await?;
                            // Over once the replicas exist: a placement whose backups then
                            // refused (full) is not the end of it.
                            if !refused && self.shortage.set(None) {
                                tracing::info!(segment = %id, "backups are enough again: writes go on");
                            }
                        }
                        Err(shortage) => {
                            let now = Instant::now();
                            let waited = for_backups.waited(now);
                            // The first failures are often a list fetched while servers
                            // were still enlisting (a cluster starting): said only once
                            // it lasts, and once per change, not per attempt.
                            if waited >= SHORTAGE_SAID_AFTER {
                                let explained = shortage.explain();
                                if self.shortage.set(Some(shortage)) {
                                    tracing::warn!(segment = %id, ?waited, "{explained}");
                                }
                            }
                            if !settling.short_of_backups() {
                                return Ok(());
                            }
                        }
                    }
                }
                Effect::FreeAbandoned => {
                    self.failures.expire(Instant::now());
                    self.free_abandoned().await;
                    for_backups.pause().await;
                    self.refresh_servers(true).await;
                }
                Effect::Bump { epoch, bumps } => {
                    // A survivor whose bump fails is lost: the next step replaces it.
                    let failures = self.bump_epochs(id, epoch, &bumps).await;
                    self.apply_failures(id, failures)?;
                }
                Effect::Record { epoch } => {
                    if let Err(error) = self.record_open_epoch(id, epoch).await? {
                        if for_record.warn_due(Instant::now()) {
                            tracing::warn!(segment = %id, %epoch, %error, "open segment epoch not recorded; writes wait for the coordinators");
                        }
                        if !settling.waits() {
                            return Ok(());
                        }
                        for_record.pause().await;
                    }
                }
            }
        }
    }
}
