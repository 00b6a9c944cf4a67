//! `Effect::Bump`, `Effect::Record` and `Effect::ConfirmAlive` of `Settling`: moving
//! the survivors of a loss to the new epoch (`BumpEpoch`), recording it at the
//! coordinator (`SetOpenEpoch`), and confirming this master is still Up before an open
//! segment that lost every replica goes on.

use futures::future::join_all;
use rampart_common::coordinator_set::CoordinatorCallError;
use rampart_common::ids::{Epoch, SegmentId};
use rampart_common::protocol::backup::{BumpEpoch, BumpEpochRequest};
use rampart_common::protocol::coordinator::{SetOpenEpoch, SetOpenEpochRequest};
use rampart_common::rpc::RpcError;
use rampart_common::status::Status;
use rampart_common::tablet::ServerStatus;
use std::sync::Arc;
use tokio::time::Instant;

use super::settle::Waiting;
use super::state::{Fatal, Replicator, ServerSource, SERVER_LIST_FETCH_TIMEOUT};
use crate::replica_manager::settling::Bump;
use crate::replica_manager::transport::{classify_rpc, Failure, REPLICA_IO_TIMEOUT};

impl Replicator {
    /// Sends `bumps` of replicas of `id` to `epoch` (`BumpEpoch`, all at once); returns
    /// the failures by slot.
    pub(super) async fn bump_epochs(
        &mut self,
        id: SegmentId,
        epoch: Epoch,
        bumps: &[Bump],
    ) -> Vec<(usize, Failure)> {
        let Some(segment) = self.segments.get(&id) else {
            return Vec::new();
        };
        let mut calls = Vec::new();
        for bump in bumps {
            let Some(replica) = segment.replica(bump.slot) else {
                continue;
            };
            let request = BumpEpochRequest {
                handle: bump.handle,
                epoch: bump.from,
                new_epoch: epoch,
            };
            let (pool, addr, slot) = (Arc::clone(&self.pool), replica.link.addr.clone(), bump.slot);
            calls.push(async move {
                let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
                let result = pool.call::<BumpEpoch>(&addr, &request, deadline).await;
                (slot, result)
            });
        }
        let results = join_all(calls).await;
        let mut failures = Vec::new();
        for (slot, result) in results {
            match result {
                Ok(()) => {
                    if let Some(segment) = self.segments.get_mut(&id) {
                        segment.bumped(slot, epoch);
                    }
                }
                Err(error) => failures.push((slot, classify_rpc(&error))),
            }
        }
        failures
    }

    /// Records `epoch` of the open segment `id` at the coordinator (`SetOpenEpoch`),
    /// one round over the coordinators: `Ok(Err(why))` when none answered.
    /// [`Fatal::DeclaredDead`] when the coordinator answers that this master was
    /// declared crashed. A fixed server list (tests, benchmarks) has no coordinator to
    /// tell: the epoch counts as recorded.
    pub(super) async fn record_open_epoch(
        &mut self,
        id: SegmentId,
        epoch: Epoch,
    ) -> Result<Result<(), CoordinatorCallError>, Fatal> {
        if !matches!(self.config.servers, ServerSource::Fixed(_)) {
            let request = SetOpenEpochRequest {
                server: self.own,
                segment: id,
                epoch,
            };
            let deadline = Instant::now() + SERVER_LIST_FETCH_TIMEOUT;
            let result = self
                .coordinators
                .call_round::<SetOpenEpoch>(&self.pool, &request, deadline)
                .await;
            match result {
                Ok(()) => tracing::info!(segment = %id, %epoch, "open segment epoch recorded"),
                Err(CoordinatorCallError::Rpc(RpcError::Status {
                    status: Status::ServerCrashed,
                    ..
                })) => return Err(Fatal::DeclaredDead(self.own)),
                Err(error) => return Ok(Err(error)),
            }
        }
        self.segment_mut(id)?.recorded(epoch);
        Ok(Ok(()))
    }

    /// Returns once the server list shows this master Up; [`Fatal::DeclaredDead`] when
    /// it shows it otherwise. Waits while no coordinator answers. A master absent
    /// from a [`ServerSource::Fixed`] list (tests) counts as Up.
    pub(super) async fn confirm_alive(&mut self) -> Result<(), Fatal> {
        let mut waiting = Waiting::new();
        loop {
            match self.fetch_servers().await {
                Some((_, servers)) => {
                    let own = servers.iter().find(|s| s.id == self.own);
                    return match own {
                        Some(server) if server.status != ServerStatus::Up => {
                            Err(Fatal::DeclaredDead(self.own))
                        }
                        None if matches!(self.config.servers, ServerSource::Coordinators(_)) => {
                            Err(Fatal::DeclaredDead(self.own))
                        }
                        _ => Ok(()),
                    };
                }
                None => {
                    tracing::warn!("no coordinator answers; the open segment waits for it");
                    waiting.pause().await;
                }
            }
        }
    }
}
