//! The backups: the server list, pulled from the coordinators' leader (or read from a
//! fixed list) and refreshed when stale or announced newer; the backups heard from;
//! and failures — a replica lost, a backup failed (every replica on it lost), a fence
//! (the master must stop) — with the copies given up on, kept to be freed: what each
//! loses is `ReplicaFailures`'s to decide (`replica_failures`), and this file carries
//! it out (counts, logs, the selector's primaries).

use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::coordinator::{GetTabletMap, TabletMapRequest};
use rampart_common::tablet::{ServerInfo, ServerStatus};
use std::collections::HashMap;
use tokio::time::Instant;

use super::state::{
    Fatal, KnownBackup, Replicator, ServerSource, SERVER_LIST_FETCH_TIMEOUT, SERVER_LIST_REFRESH,
};
use crate::replica_manager::backup_selector::BackupInfo;
use crate::replica_manager::placement;
use crate::replica_manager::replica_failures::{Call, Cause, Loss};
use crate::replica_manager::segment_replicas::{unneeded_on, Abandoned};
use crate::replica_manager::server_list_watch::Evacuation;
use crate::replica_manager::transport::Failure;

impl Replicator {
    pub(super) fn heard(&mut self, backup: ServerId) {
        if let Some(known) = self.backups.get_mut(&backup) {
            known.heard = Instant::now();
        }
    }

    /// The server list from its source with its version; `None` when no coordinator
    /// served it within one round ([`SERVER_LIST_FETCH_TIMEOUT`]).
    pub(super) async fn fetch_servers(&self) -> Option<(u64, Vec<ServerInfo>)> {
        match &self.config.servers {
            // Read the version first: a push after it is then pulled again, not lost.
            ServerSource::Fixed(list) => Some((self.server_list.pushed(), list.lock().clone())),
            ServerSource::Coordinators(_) => {
                let deadline = Instant::now() + SERVER_LIST_FETCH_TIMEOUT;
                match self
                    .coordinators
                    .call_round::<GetTabletMap>(&self.pool, &TabletMapRequest {}, deadline)
                    .await
                {
                    Ok(map) => Some((map.version, map.servers)),
                    Err(error) => {
                        tracing::debug!(%error, "server list unavailable");
                        None
                    }
                }
            }
        }
    }

    /// Re-reads the server list when it is older than [`SERVER_LIST_REFRESH`], when a
    /// push announced a newer version than the one held, or always with `force`. A
    /// backup that is no longer Up is failed.
    pub(super) async fn refresh_servers(&mut self, force: bool) {
        let stale = self
            .list_fetched
            .map_or(true, |at| at.elapsed() >= SERVER_LIST_REFRESH);
        let announced = self.server_list.is_newer_than(self.list_version);
        let evacuation = self.server_list.take_evacuation_news();
        if !force && !stale && !announced && !evacuation {
            return;
        }
        let fetched = self.fetch_servers().await;
        self.list_fetched = Some(Instant::now());
        let Some((version, servers)) = fetched else {
            if evacuation {
                // Not applied: the next upkeep tries again.
                self.server_list.keep_evacuation_news();
            }
            return;
        };
        if announced {
            tracing::debug!(
                held = self.list_version,
                pushed = self.server_list.pushed(),
                fetched = version,
                "server list pulled after a push"
            );
        }
        self.list_version = version;
        // A backup being drained is left out, as if gone from the list (the
        // `server_list_watch` module doc), until the list no longer shows it Up.
        self.server_list.retain_evacuating(|id| {
            servers
                .iter()
                .any(|s| s.id == id && s.status == ServerStatus::Up)
        });
        let evacuating = self.server_list.evacuating();
        self.evacuated.clone_from(&evacuating);
        let servers: Vec<ServerInfo> = servers
            .into_iter()
            .filter(|s| !evacuating.contains(&s.id))
            .collect();
        let infos: Vec<BackupInfo> = servers.iter().filter_map(BackupInfo::from_server).collect();
        let now = Instant::now();
        let mut backups = HashMap::new();
        for server in &servers {
            if server.status == ServerStatus::Up && server.services.backup && server.id != self.own
            {
                let heard = self.backups.get(&server.id).map_or(now, |b| b.heard);
                backups.insert(
                    server.id,
                    KnownBackup {
                        addr: server.addr.clone(),
                        heard,
                    },
                );
            }
        }
        let gone: Vec<ServerId> = self
            .segments
            .values()
            .flat_map(|s| s.backups())
            .filter(|id| !backups.contains_key(id))
            .collect();
        self.backups = backups;
        self.selector.update_backups(&infos);
        for id in gone {
            if evacuating.contains(&id) {
                // An operator's drain, not a failure: said at info.
                self.transports.forget_dead();
                let loss = self
                    .failures
                    .backup_failed(&mut self.segments, id, Instant::now());
                if loss.newly_failed {
                    tracing::info!(backup = %id, lost = loss.lost.len(), "leaving a backup being drained; re-creating its replicas elsewhere");
                }
                self.changed = true;
                self.book(loss);
            } else {
                self.backup_failed(id, "no longer Up in the server list");
            }
        }
    }

    /// Answers the collector's questions waiting in the watch: which copies on a backup
    /// this log no longer needs there ([`unneeded_on`]).
    pub(super) fn answer_unneeded(&self) {
        for question in self.server_list.take_questions() {
            let unneeded = unneeded_on(&self.segments, question.backup, &question.segments);
            // The asker may have given up; nothing to do then.
            let _ = question.reply.send(unneeded);
        }
    }

    /// Reports to the watch, for each backup being drained, how many segments still
    /// have a replica there and how many are not whole.
    pub(super) fn report_evacuations(&self) {
        for &backup in &self.evacuated {
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            let on_backup = self
                .segments
                .values()
                .filter(|s| s.backups().any(|b| b == backup))
                .count();
            let not_whole = self.segments.values().filter(|s| !s.whole()).count();
            self.server_list.report(
                backup,
                Evacuation {
                    on_backup: count(on_backup),
                    not_whole: count(not_whole),
                },
            );
        }
    }

    /// Marks the failed replicas of `id` lost (and their backups failed when the failure
    /// was the backup's).
    pub(super) fn apply_failures(
        &mut self,
        id: SegmentId,
        failures: Vec<(usize, Failure)>,
    ) -> Result<(), Fatal> {
        for (slot, failure) in failures {
            let Some(backup) = self
                .segments
                .get(&id)
                .and_then(|s| s.replica(slot))
                .map(|r| r.backup)
            else {
                continue;
            };
            let call = Call::Update { slot };
            if let Some((detail, loss)) = self.call_failed(id, backup, call, failure)? {
                tracing::warn!(segment = %id, %backup, %detail, "replica lost");
                self.book(loss);
            }
        }
        Ok(())
    }

    /// Applies what `failure` of a `call` to `backup` for a replica of `id` loses
    /// ([`ReplicaFailures::call_failed`]): `Fenced` stops the master ([`Fatal::Fenced`]);
    /// a failed backup loses every replica on it. Returns a refusal of that replica
    /// alone — its detail and what it lost — which each caller reports its own way and
    /// then [`book`](Self::book)s.
    ///
    /// [`ReplicaFailures::call_failed`]: crate::replica_manager::replica_failures::ReplicaFailures::call_failed
    pub(super) fn call_failed(
        &mut self,
        id: SegmentId,
        backup: ServerId,
        call: Call,
        failure: Failure,
    ) -> Result<Option<(String, Loss)>, Fatal> {
        let (cause, detail) = match failure {
            Failure::Fenced => (Cause::Fenced, String::new()),
            Failure::Backup(detail) => (Cause::Backup, detail),
            Failure::Replica(detail) => (Cause::Replica, detail),
        };
        if cause == Cause::Backup {
            self.transports.forget_dead();
        }
        let now = Instant::now();
        let loss = self
            .failures
            .call_failed(&mut self.segments, (id, backup), call, cause, now)?;
        if cause == Cause::Backup {
            self.booked_backup_failure(backup, &detail, loss);
            return Ok(None);
        }
        Ok(Some((detail, loss)))
    }

    /// Books what a failure lost: the selector's primary count of each lost replica,
    /// and the abandoned copies forgotten (too many to keep).
    pub(super) fn book(&mut self, loss: Loss) {
        if !loss.lost.is_empty() {
            self.changed = true;
        }
        placement::lost(&mut self.selector, &loss.lost);
        for forgotten in loss.forgotten {
            said_forgotten(forgotten);
        }
    }

    /// Marks `backup` failed: every replica on it is lost (and, if the backup was only
    /// thought dead, its copies freed later).
    pub(super) fn backup_failed(&mut self, backup: ServerId, detail: &str) {
        self.transports.forget_dead();
        let loss = self
            .failures
            .backup_failed(&mut self.segments, backup, Instant::now());
        self.booked_backup_failure(backup, detail, loss);
    }

    /// Counts and reports a backup failure (once per backup until its exclusion ends),
    /// and books what it lost.
    pub(super) fn booked_backup_failure(&mut self, backup: ServerId, detail: &str, loss: Loss) {
        self.changed = true;
        if loss.newly_failed {
            self.stats.backups_failed += 1;
            tracing::warn!(%backup, %detail, "backup failed; re-creating its replicas elsewhere");
        }
        self.book(loss);
    }
}

/// Says that `forgotten` will not be freed: more than [`ABANDONED_MAX`] abandoned
/// copies would be kept.
///
/// [`ABANDONED_MAX`]: crate::replica_manager::replica_failures::ABANDONED_MAX
pub(super) fn said_forgotten(forgotten: Abandoned) {
    tracing::warn!(backup = %forgotten.backup, segment = %forgotten.segment, "too many abandoned replicas; one is not freed");
}
