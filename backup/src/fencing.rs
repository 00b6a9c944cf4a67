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
//! The steps are [`fence`], a plain function over what a backup gives it
//! ([`FenceTarget`]): the backup's frames and the simulation's both run it.
//!
//! # Cost
//! One copy and scan of each open frame of the master (≈ 1–5 ms per 8 MiB frame): call
//! it on a blocking thread.

use rampart_common::ids::ServerId;
use rampart_common::protocol::backup::ReplicaInfo;

use crate::frame_table::{FrameRef, FrameTable, ReplicaKey};
use crate::frames::Frames;
use crate::rdma::RdmaTarget;

/// What a fence needs of a backup: its frame table under the table's lock with the
/// frame file's per-slot words beside it, its RDMA keys, and the scan of frames. The
/// backup's frames implement it (over `Frames` and the `RdmaTarget`); so does the
/// simulation's backup (`rampart-sim`), over bytes in memory. Each method looks up,
/// copies or marks; the order of the steps — the guarantee — is [`fence`]'s.
pub trait FenceTarget {
    /// `act` on the frame table under its lock, with the slots' words.
    fn with_table_words<R>(
        &mut self,
        act: impl FnOnce(&mut FrameTable, &mut dyn SlotWords) -> R,
    ) -> R;

    /// Revokes `master`'s RDMA key: the NIC acknowledges none of its RDMA writes any
    /// more.
    fn revoke(&mut self, master: ServerId);

    /// The length of each frame's valid prefix, cut at its fenced length, scanned
    /// outside the table's lock; a frame that left the table meanwhile is left out.
    fn scan(&mut self, frames: Vec<FrameRef>) -> Vec<(FrameRef, u32)>;
}

/// The frame file's words of each slot that a fence sets (under the table's lock).
pub trait SlotWords {
    /// Raises the slot's fence word: a one-sided writer that checks it after its copy
    /// acknowledges nothing more.
    fn fence(&mut self, slot: usize);

    /// Records the fenced `length` in the slot's header: a backup restarted on the
    /// frame file reads no more of the frame back.
    fn record_fenced_length(&mut self, slot: usize, length: u32);
}

/// Fences every open frame of `master` and reports each one with its final length. See
/// the module doc. Idempotent: a later fence reports the first one's lengths.
pub fn fence<T: FenceTarget + ?Sized>(target: &mut T, master: ServerId) -> Vec<ReplicaInfo> {
    let fenced = target.with_table_words(|table, words| {
        let fenced = table.fence_master(master);
        for frame in &fenced {
            // Under the table's lock: the slot is this frame's (slots change hands only
            // after their frame left the table).
            words.fence(frame.slot);
        }
        fenced
    });
    target.revoke(master);
    let scanned = target.scan(fenced);
    let reported: Vec<ReplicaInfo> = target.with_table_words(|table, words| {
        scanned
            .into_iter()
            .filter_map(|(frame, scanned)| {
                // Gone since the scan: freed by recovery already, nothing to report.
                let (slot, length) = table.fenced_length(frame.handle, scanned)?;
                words.record_fenced_length(slot, length);
                Some(frame.info(length))
            })
            .collect()
    });
    tracing::info!(%master, frames = reported.len(), "open frames fenced");
    reported
}

/// Fences `master` before a recovery read of `key` unless that was done and the
/// replica's frame (if any) has its final length: bytes a still-running master could
/// change are never served to recovery (`StartRecovery` may not have reached this
/// backup, or its fence may still be under way).
pub fn fence_before_reading<T: FenceTarget + ?Sized>(target: &mut T, key: ReplicaKey) {
    let needed = target.with_table_words(|table, _| table.needs_fence(key.0, key));
    if needed {
        fence(target, key.0);
    }
}

/// The backup's own frames and RDMA keys, as [`fence`] uses them.
pub(crate) struct LiveFrames<'a> {
    pub frames: &'a Frames,
    pub rdma: &'a RdmaTarget,
}

/// The frame file's words, set through its shared mapping.
struct FileWords<'a>(&'a Frames);

impl SlotWords for FileWords<'_> {
    fn fence(&mut self, slot: usize) {
        self.0.file.fence(slot);
    }

    fn record_fenced_length(&mut self, slot: usize, length: u32) {
        self.0.file.record_fenced_length(slot, length);
    }
}

impl FenceTarget for LiveFrames<'_> {
    fn with_table_words<R>(
        &mut self,
        act: impl FnOnce(&mut FrameTable, &mut dyn SlotWords) -> R,
    ) -> R {
        let mut table = self.frames.table.lock();
        act(&mut table, &mut FileWords(self.frames))
    }

    fn revoke(&mut self, master: ServerId) {
        self.rdma.revoke(master);
    }

    /// [`Frames::scan`]: copies and scans outside the table's lock, then keeps the
    /// frames still in the table.
    fn scan(&mut self, frames: Vec<FrameRef>) -> Vec<(FrameRef, u32)> {
        self.frames
            .scan(frames)
            .into_iter()
            .map(|scanned| (scanned.frame, scanned.length))
            .collect()
    }
}

/// [`fence`] on the backup's own frames.
pub(crate) fn fence_frames(
    frames: &Frames,
    rdma: &RdmaTarget,
    master: ServerId,
) -> Vec<ReplicaInfo> {
    fence(&mut LiveFrames { frames, rdma }, master)
}

/// [`fence_before_reading`] on the backup's own frames.
pub(crate) fn fence_frames_before_reading(frames: &Frames, rdma: &RdmaTarget, key: ReplicaKey) {
    fence_before_reading(&mut LiveFrames { frames, rdma }, key);
}
