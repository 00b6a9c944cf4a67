//! `Effect::Place` of `Settling`: backups for a segment's empty slots (`placement`),
//! and opening a replica on each at a new epoch, filled with the segment's bytes so far
//! (and closed, if the segment is).

use bytes::Bytes;
use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::backup::{OpenReplica, OpenReplicaRequest};
use std::collections::HashSet;
use tokio::time::Instant;

use super::backups::said_forgotten;
use super::close::close_replica;
use super::state::{Fatal, Link, Replicator};
use crate::replica_manager::backup_selector::NotEnoughBackups;
use crate::replica_manager::placement;
use crate::replica_manager::replica_failures::Call;
use crate::replica_manager::segment_replicas::Replica;
use crate::replica_manager::sequencing::{CreateStep, Creation};
use crate::replica_manager::transport::{classify_rpc, Failure, REPLICA_IO_TIMEOUT};

impl Replicator {
    /// The backups not to choose now: failed or refused lately.
    pub(super) fn excluded(&self) -> HashSet<ServerId> {
        self.failures.excluded(Instant::now())
    }

    /// Backups for the empty `slots` of `id` ([`placement::targets`]).
    pub(super) fn place(
        &mut self,
        id: SegmentId,
        slots: &[usize],
        fresh: bool,
        exclude: &HashSet<ServerId>,
    ) -> Result<Vec<(usize, ServerId)>, NotEnoughBackups> {
        let replicas = self.config.replicas;
        let Some(segment) = self.segments.get(&id) else {
            return Ok(Vec::new());
        };
        placement::targets(
            &mut self.selector,
            segment,
            (slots, fresh, replicas),
            exclude,
        )
    }

    /// Opens replicas of `id` on `targets` (slot, backup) at a new epoch, each holding
    /// the segment's bytes so far (and closed, if the segment is): a [`Creation`]. A
    /// backup that fails is marked failed; one that refuses is left out for
    /// [`REFUSED_BACKUP_EXCLUSION`] (`ReplicaFailures`). Returns whether a backup
    /// refused.
    ///
    /// [`REFUSED_BACKUP_EXCLUSION`]: super::state::REFUSED_BACKUP_EXCLUSION
    pub(super) async fn create_replicas(
        &mut self,
        id: SegmentId,
        targets: Vec<(usize, ServerId)>,
        fresh: bool,
        log_bytes: Option<&Bytes>,
    ) -> Result<bool, Fatal> {
        let creation = Creation::begin(self.segment_mut(id)?);
        let bytes = self.fill(id, creation.len, log_bytes)?;
        let mut refused = false;
        for (slot, backup) in targets {
            match self.create_replica(&creation, backup, bytes.as_ref()).await {
                Ok(replica) => {
                    if !fresh || creation.len > 0 {
                        self.stats.replicas_recreated += 1;
                        tracing::info!(segment = %id, %backup, epoch = %creation.epoch, bytes = creation.len, "replica re-created");
                    }
                    creation.created(self.segment_mut(id)?, slot, replica);
                    self.changed = true;
                }
                Err(failure) => {
                    let selector = Some(&mut self.selector);
                    if let Some(forgotten) =
                        creation.failed(&mut self.failures, selector, (slot, backup))
                    {
                        said_forgotten(forgotten);
                    }
                    if let Some((detail, loss)) =
                        self.call_failed(id, backup, Call::Open, failure)?
                    {
                        tracing::warn!(segment = %id, %backup, %detail, "backup refused a replica; trying another");
                        refused = true;
                        self.book(loss);
                    }
                }
            }
        }
        Ok(refused)
    }

    /// Opens a replica of the `creation`'s segment on `backup` at its epoch, then takes
    /// the creation's steps after the open: `bytes` (the fill, from offset 0), the
    /// close.
    async fn create_replica(
        &mut self,
        creation: &Creation,
        backup: ServerId,
        bytes: Option<&Bytes>,
    ) -> Result<Replica<Link>, Failure> {
        let addr = self
            .backups
            .get(&backup)
            .map(|b| b.addr.clone())
            .ok_or_else(|| Failure::Replica(format!("{backup} left the server list")))?;
        let (id, epoch) = (creation.segment, creation.epoch);
        let request = OpenReplicaRequest {
            master: self.own,
            segment: id,
            epoch,
            capacity: self.segment_capacity,
        };
        let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
        let reply = self
            .pool
            .call::<OpenReplica>(&addr, &request, deadline)
            .await
            .map_err(|e| classify_rpc(&e))?;
        self.heard(backup);
        let transport = self.transports.open(&addr, &reply).await?;
        tracing::debug!(
            segment = %id, %backup, %epoch, handle = %reply.handle, transport = %transport.kind(),
            "replica opened"
        );
        let mut replica = Replica::new(backup, reply.handle, epoch, Link { addr, transport });
        for step in creation.after_open() {
            match step {
                CreateStep::Fill { len } => {
                    let bytes = bytes
                        .filter(|b| b.len() == len as usize)
                        .ok_or_else(|| Failure::Replica(format!("{id}: no {len} bytes to fill")))?;
                    replica
                        .link
                        .transport
                        .write(replica.handle, epoch, 0, bytes.clone())
                        .await?;
                }
                CreateStep::Close { length } => {
                    close_replica(&self.pool, &replica, length)
                        .await
                        .map_err(|e| classify_rpc(&e))?;
                    replica.closed = true;
                }
            }
        }
        Ok(replica)
    }
}
