//! The backups: the server list, pulled from the coordinators' leader (or read from a
//! fixed list) and refreshed when stale or announced newer; the backups heard from;
//! and failures — a replica lost, a backup failed (every replica on it lost), a fence
//! (the master must stop) — with the copies given up on, kept to be freed.

use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::coordinator::{GetTabletMap, TabletMapRequest};
use rampart_common::tablet::{ServerInfo, ServerStatus};
use std::collections::HashMap;
use tokio::time::Instant;

use super::state::{
    Fatal, KnownBackup, Replicator, ServerSource, ABANDONED_MAX, SERVER_LIST_FETCH_TIMEOUT,
    SERVER_LIST_REFRESH,
};
use crate::replica_manager::backup_selector::BackupInfo;
use crate::replica_manager::segment_replicas::{Abandoned, Lost};
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
        if !force && !stale && !announced {
            return;
        }
        let fetched = self.fetch_servers().await;
        self.list_fetched = Some(Instant::now());
        let Some((version, servers)) = fetched else {
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
            self.backup_failed(id, "no longer Up in the server list");
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
            if let Some(detail) = self.failed_beyond_replica(id, backup, failure)? {
                tracing::warn!(segment = %id, %backup, %detail, "replica lost");
                self.lose_replica(id, slot);
            }
        }
        Ok(())
    }

    /// Applies what `failure` of a replica of `id` on `backup` loses beyond that
    /// replica: `Fenced` stops the master ([`Fatal::Fenced`]); a failed backup loses
    /// every replica on it. Returns the detail of a failure of that replica alone, which
    /// each caller handles its own way.
    pub(super) fn failed_beyond_replica(
        &mut self,
        id: SegmentId,
        backup: ServerId,
        failure: Failure,
    ) -> Result<Option<String>, Fatal> {
        match failure {
            Failure::Fenced => Err(Fatal::Fenced {
                segment: id,
                backup,
            }),
            Failure::Backup(detail) => {
                self.backup_failed(backup, &detail);
                Ok(None)
            }
            Failure::Replica(detail) => Ok(Some(detail)),
        }
    }

    pub(super) fn lose_replica(&mut self, id: SegmentId, slot: usize) {
        self.changed = true;
        let lost = self.segments.get_mut(&id).and_then(|s| s.lose(slot));
        if let Some(lost) = lost {
            self.forget(lost);
        }
    }

    /// Books a lost replica: the selector's primary count, and its copy to free.
    fn forget(&mut self, lost: Lost) {
        if lost.primary {
            self.selector.primary_freed(lost.abandoned.backup);
        }
        self.abandon(lost.abandoned);
    }

    /// Remembers a copy to free, forgetting the oldest beyond [`ABANDONED_MAX`].
    pub(super) fn abandon(&mut self, abandoned: Abandoned) {
        if self.abandoned.len() >= ABANDONED_MAX {
            let forgotten = self.abandoned.remove(0);
            tracing::warn!(backup = %forgotten.backup, segment = %forgotten.segment, "too many abandoned replicas; one is not freed");
        }
        self.abandoned.push(abandoned);
    }

    /// Marks `backup` failed: every replica on it is lost (and, if the backup was only
    /// thought dead, its copies freed later).
    pub(super) fn backup_failed(&mut self, backup: ServerId, detail: &str) {
        self.changed = true;
        self.transports.forget_dead();
        if self.failed.insert(backup, Instant::now()).is_none() {
            self.stats.backups_failed += 1;
            tracing::warn!(%backup, %detail, "backup failed; re-creating its replicas elsewhere");
        }
        let lost: Vec<Lost> = self
            .segments
            .values_mut()
            .flat_map(|segment| segment.lose_backup(backup))
            .collect();
        for lost in lost {
            self.forget(lost);
        }
    }
}
