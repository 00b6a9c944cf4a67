//! Upkeep between batches ([`Replicator::tick`]): finished closes, probes of quiet
//! backups, frees of abandoned copies, the open segments' lost replicas; and the
//! closed segments' re-replication from the log ([`Replicator::recreate`]) and their
//! freeing ([`Replicator::free_segments`]).

use bytes::Bytes;
use futures::future::join_all;
use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::backup::{FreeReplica, FreeReplicaRequest};
use rampart_common::protocol::master::{Ping, PingRequest};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::time::Instant;

use super::backups::said_forgotten;
use super::state::{Fatal, Replicator, PROBE_INTERVAL, PROBE_TIMEOUT};
use crate::replica_manager::placement;
use crate::replica_manager::sequencing::{Upkeep, UpkeepStep};
use crate::replica_manager::server_list_watch::Evacuation;
use crate::replica_manager::settling::Patience;

impl Replicator {
    /// Background upkeep between batches: finished closes, then the steps of an
    /// [`Upkeep`] round — the server list, probes of quiet backups, frees of abandoned
    /// copies, exclusions over, and the open segments' lost replicas and unrecorded
    /// epochs. Returns a closed segment that lost replicas, if any: the
    /// caller reads its bytes from the log and hands them to
    /// [`Replicator::recreate`] (one segment per tick, so that writes interleave with
    /// re-replication).
    ///
    /// # Errors
    /// [`Fatal`] as for [`Replicator::replicate`].
    pub async fn tick(&mut self) -> Result<Option<SegmentId>, Fatal> {
        if self.config.replicas == 0 {
            // No replicas anywhere: a backup being drained holds nothing of this log,
            // and nothing on a backup is this log's (kept: not this log's to judge).
            for backup in self.server_list.evacuating() {
                self.server_list.report(backup, Evacuation::default());
            }
            for question in self.server_list.take_questions() {
                let _ = question.reply.send(Vec::new());
            }
            return Ok(None);
        }
        self.drain_closes();
        if let Some(fatal) = &self.fenced {
            return Err(fatal.clone());
        }
        self.report_evacuations();
        self.answer_unneeded();
        let mut upkeep = Upkeep::new();
        while let Some(step) = upkeep.next(&self.segments) {
            match step {
                UpkeepStep::RefreshServers => self.refresh_servers(false).await,
                UpkeepStep::ProbeQuiet => self.probe_quiet_backups().await,
                UpkeepStep::FreeAbandoned => self.free_abandoned().await,
                UpkeepStep::Expire => self.failures.expire(Instant::now()),
                UpkeepStep::SettleOpen(id) => self.settle(id, None, Patience::OneAttempt).await?,
                UpkeepStep::Recreate(id) => return Ok(Some(id)),
            }
        }
        Ok(None)
    }

    /// One placement round for the lost replicas of the closed segment `id` (named by
    /// [`Replicator::tick`]), filled with `bytes`, the segment as the log holds it.
    ///
    /// # Errors
    /// [`Fatal`] as for [`Replicator::replicate`].
    pub async fn recreate(&mut self, id: SegmentId, bytes: Bytes) -> Result<(), Fatal> {
        self.settle(id, Some(&bytes), Patience::OneAttempt).await
    }

    /// The log no longer holds `segments` (the cleaner freed them, after a digest
    /// without them reached every replica of the head): forgets them — no more
    /// re-replication — and frees every copy of them on its backup at the next
    /// [`Replicator::tick`] (`FreeReplica` at any epoch).
    pub fn free_segments(&mut self, segments: &[SegmentId]) {
        for id in segments {
            self.open_bytes.remove(id);
            let Some(segment) = self.segments.remove(id) else {
                continue;
            };
            self.changed = true;
            for (lost, forgotten) in self.failures.segment_freed(*id, &segment) {
                placement::lost(&mut self.selector, [&lost]);
                if let Some(forgotten) = forgotten {
                    said_forgotten(forgotten);
                }
            }
        }
    }

    /// Whether the replicator has upkeep to do soon (lost replicas or closes in flight).
    pub fn busy(&self) -> bool {
        !self.closes.is_empty() || self.segments.values().any(|s| s.missing() > 0)
    }

    /// Frees abandoned copies on backups that are Up and not failed, of segments whole
    /// again (every replica live, on disk or at a recorded epoch); forgets those
    /// whose backup left the server list (its replicas went with it).
    pub(super) async fn free_abandoned(&mut self) {
        let backups = &self.backups;
        let ready = self
            .failures
            .take_frees(|backup| backups.contains_key(&backup), &self.segments);
        if ready.is_empty() {
            return;
        }
        let own = self.own;
        let frees = ready.into_iter().filter_map(|a| {
            let addr = self.backups.get(&a.backup)?.addr.clone();
            let pool = Arc::clone(&self.pool);
            Some(async move {
                let request = FreeReplicaRequest {
                    master: own,
                    segment: a.segment,
                    epoch_max: a.epoch_max,
                };
                let deadline = Instant::now() + PROBE_TIMEOUT;
                let result = pool.call::<FreeReplica>(&addr, &request, deadline).await;
                (a, result)
            })
        });
        for (a, result) in join_all(frees).await {
            match result {
                Ok(_) => {}
                // Unreachable: the backup counts as failed (so upkeep does not wait on
                // it every tick); the free is tried again once its exclusion ends.
                Err(error) if error.is_transport() => {
                    self.transports.forget_dead();
                    let now = Instant::now();
                    let loss = self.failures.free_unanswered(&mut self.segments, a, now);
                    self.booked_backup_failure(a.backup, &error.to_string(), loss);
                }
                Err(error) => {
                    tracing::debug!(backup = %a.backup, segment = %a.segment, %error, "free of an abandoned replica refused");
                }
            }
        }
    }

    /// Probes backups holding replicas of this master that were quiet for
    /// [`PROBE_INTERVAL`].
    async fn probe_quiet_backups(&mut self) {
        let now = Instant::now();
        let holding: HashSet<ServerId> = self.segments.values().flat_map(|s| s.backups()).collect();
        let quiet: Vec<(ServerId, String)> = holding
            .into_iter()
            .filter_map(|id| {
                let known = self.backups.get(&id)?;
                (now - known.heard >= PROBE_INTERVAL).then(|| (id, known.addr.clone()))
            })
            .collect();
        let probes = quiet.into_iter().map(|(id, addr)| {
            let pool = Arc::clone(&self.pool);
            async move {
                // `Ping` is answered from memory by the storage server's connection
                // task; `ListReplicas` would make the backup scan our open frames.
                let deadline = Instant::now() + PROBE_TIMEOUT;
                let result = pool.call::<Ping>(&addr, &PingRequest {}, deadline).await;
                (id, result)
            }
        });
        for (id, result) in join_all(probes).await {
            match result {
                Ok(_) => self.heard(id),
                Err(error) if error.is_transport() => self.backup_failed(id, &error.to_string()),
                Err(_) => self.heard(id),
            }
        }
    }
}
