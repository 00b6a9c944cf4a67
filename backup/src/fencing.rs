//! Fencing a crashed master's frames (docs/design.md §5 "Fencing"): the step after which a
//! backup acknowledges no more of that master's writes, by any transport, and reports
//! what it holds with lengths that are final.
//!
//! # Guarantee
//! After [`fence`] returns, no write to the fenced frames is acknowledged (`Fenced`), and
//! every write acknowledged before it lies within the lengths it reported. The steps, in
//! order:
//! 1. Under the table's lock, the master is fenced in the [`FrameTable`] (it may open no
//!    new frame; its frames refuse writes, closes and bumps on the RPC paths) and each of
//!    its frames' slots has its fence word raised: a one-sided `shm` or soft-NIC writer
//!    checks that word after its copy (the Dekker pair of `rampart_common::onesided::shm`),
//!    so a write it acknowledges was copied before the fence and is seen by the scan.
//! 2. The master's RDMA key is revoked: RDMA WRITEs are acknowledged by the NIC without
//!    looking at the fence word. After the frames are marked, so that a master whose
//!    write fails at its NIC, and then asks with an empty `WriteReplica`, hears `Fenced`.
//! 3. The frames are scanned for their valid prefixes, and the first fence's length of
//!    each is recorded — in the table and in the slot's header, so that a backup killed
//!    now reads no more of it back. A write in flight during the fence may land past it,
//!    unacknowledged: every later list, read and fence serves exactly that prefix.
//!
//! [`FrameTable`]: crate::frame_table::FrameTable
//!
//! # Cost
//! One copy and scan of each open frame of the master (≈ 1–5 ms per 8 MiB frame): call
//! it on a blocking thread.

use rampart_common::ids::ServerId;
use rampart_common::protocol::backup::ReplicaInfo;

use crate::frame_table::ReplicaKey;
use crate::frames::Frames;
use crate::rdma::RdmaTarget;

/// Fences every open frame of `master` and reports each one with its final length. See
/// the module doc. Idempotent: a later fence reports the first one's lengths.
pub(crate) fn fence(frames: &Frames, rdma: &RdmaTarget, master: ServerId) -> Vec<ReplicaInfo> {
    let fenced = {
        let mut table = frames.table.lock();
        let fenced = table.fence_master(master);
        for frame in &fenced {
            // Under the table's lock: the slot is this frame's (slots change hands only
            // after their frame left the table).
            frames.file.fence(frame.slot);
        }
        fenced
    };
    rdma.revoke(master);
    let scanned = frames.scan(fenced);
    let mut table = frames.table.lock();
    let reported: Vec<ReplicaInfo> = scanned
        .into_iter()
        .filter_map(|scanned| {
            // Gone since the scan: freed by recovery already, nothing to report.
            let (slot, length) = table.fenced_length(scanned.frame.handle, scanned.length)?;
            frames.file.record_fenced_length(slot, length);
            Some(scanned.frame.info(length))
        })
        .collect();
    drop(table);
    tracing::info!(%master, frames = reported.len(), "open frames fenced");
    reported
}

/// Fences `master` before a recovery read of `key` unless that was done and the
/// replica's frame (if any) has its final length: bytes a still-running master could
/// change are never served to recovery (`StartRecovery` may not have reached this
/// backup, or its fence may still be under way).
pub(crate) fn fence_before_reading(frames: &Frames, rdma: &RdmaTarget, key: ReplicaKey) {
    let needed = frames.table.lock().needs_fence(key.0, key);
    if needed {
        fence(frames, rdma, key.0);
    }
}
