//! Closing replicas: `CloseReplica` to every replica of a segment whose footer was
//! written, in the background, and what its answer means.

use rampart_common::ids::SegmentId;
use rampart_common::protocol::backup::{CloseReplica, CloseReplicaRequest};
use rampart_common::rpc::{RpcError, RpcPool};
use std::sync::Arc;
use tokio::time::Instant;

use super::state::{CloseDone, Link, Replicator};
use crate::replica_manager::replica_failures::Call;
use crate::replica_manager::segment_replicas::Replica;
use crate::replica_manager::transport::{classify_rpc, REPLICA_IO_TIMEOUT};

impl Replicator {
    /// Sends `CloseReplica` to the replicas of the closed segment `id` in `slots`, in
    /// the background.
    pub(super) fn start_closes(&mut self, id: SegmentId, slots: Vec<usize>) {
        self.changed = true;
        let Some(segment) = self.segments.get(&id) else {
            return;
        };
        let length = segment.len();
        for slot in slots {
            let Some(replica) = segment.replica(slot) else {
                continue;
            };
            let (pool, replica) = (Arc::clone(&self.pool), replica.clone());
            self.closes.spawn(async move {
                let result = close_replica(&pool, &replica, length).await;
                CloseDone {
                    segment: id,
                    slot,
                    handle: replica.handle,
                    result,
                }
            });
        }
    }

    /// Takes the outcomes of finished background closes.
    pub(super) fn drain_closes(&mut self) {
        while let Some(done) = self.closes.try_join_next() {
            let Ok(done) = done else { continue };
            self.close_finished(done);
        }
    }

    fn close_finished(&mut self, done: CloseDone) {
        self.changed = true;
        let Some(backup) = self
            .segments
            .get_mut(&done.segment)
            .and_then(|s| s.close_answered(done.slot, done.handle, done.result.is_ok()))
        else {
            return;
        };
        let Err(error) = done.result else {
            self.heard(backup);
            return;
        };
        // A fence is reported by the next `replicate` or `tick`.
        let call = Call::Close { slot: done.slot };
        match self.call_failed(done.segment, backup, call, classify_rpc(&error)) {
            Err(fatal) => self.fenced = Some(fatal),
            Ok(None) => {}
            Ok(Some((detail, loss))) => {
                tracing::warn!(segment = %done.segment, %backup, %detail, "close failed; replica lost");
                self.book(loss);
            }
        }
    }
}

/// Sends `CloseReplica` for `replica`, `length` bytes long.
pub(super) async fn close_replica(
    pool: &RpcPool,
    replica: &Replica<Link>,
    length: u32,
) -> Result<(), RpcError> {
    let request = CloseReplicaRequest {
        handle: replica.handle,
        epoch: replica.epoch,
        length,
    };
    // A close writes the replica to disk: allow for a slow disk.
    let deadline = Instant::now() + REPLICA_IO_TIMEOUT * 5;
    pool.call::<CloseReplica>(&replica.link.addr, &request, deadline)
        .await
        .map(|_| ())
}
