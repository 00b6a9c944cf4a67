//! Replies for what the handlers meet — a refusal of the frame table, a store error, a
//! replica not held — and the blocking threads the slow handlers run on; with a
//! replica's facts on the wire ([`ReplicaInfo`] from a [`ReplicaMeta`]).

use rampart_common::protocol::backup::ReplicaInfo;
use rampart_common::rpc::Reply;
use rampart_common::status::Status;

use crate::frame_table::{Refusal, ReplicaKey};
use crate::segment_store::{ReplicaMeta, StoreError};

/// A replica's facts on the wire (also what `rampart-sim`'s backups report).
impl From<&ReplicaMeta> for ReplicaInfo {
    fn from(meta: &ReplicaMeta) -> ReplicaInfo {
        ReplicaInfo {
            master: meta.master,
            segment: meta.segment,
            epoch: meta.epoch,
            length: meta.length,
            closed: meta.closed,
        }
    }
}

/// The reply for a refusal of the frame table.
pub(super) fn refused(refusal: Refusal) -> Reply {
    Reply::error(refusal.status, refusal.detail)
}

/// The reply for a store error.
pub(super) fn store_error_reply(error: StoreError) -> Reply {
    let status = match &error {
        StoreError::Full { .. } => Status::BackupFull,
        StoreError::StaleEpoch { .. } | StoreError::Regressed { .. } => Status::StaleEpoch,
        StoreError::Corrupt { .. } | StoreError::InUse { .. } | StoreError::Io { .. } => {
            Status::Internal
        }
    };
    Reply::error(status, error)
}

/// Runs `f` on a blocking thread (it takes the store lock, or copies and scans frames).
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Reply> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Reply::error(Status::Internal, format!("backup store task failed: {e}")))
}

pub(super) fn not_held(key: ReplicaKey) -> Reply {
    Reply::error(
        Status::ObjectDoesntExist,
        format!("no replica of {}/{} on this backup", key.0, key.1),
    )
}
