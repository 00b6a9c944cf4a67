//! How a replica leaves its frame: the steps of a close, from the frame to the store
//! ([`run_close`], [`commit_close`], [`end_close`]), and of a free ([`free`],
//! [`free_stored`]) — plain functions over what a backup gives them: its frame table
//! under the table's lock, the frame file's slots, its store of replicas. Every decision
//! is the [`FrameTable`]'s or the store's rules' ([`check_write`],
//! [`ReplicaMeta::outlives_free`]); the order of the steps, which the concurrency
//! arguments rest on, is here. The backup's drivers run these functions over its
//! frames and store (the close on a flush thread, `service/close_job.rs`); the
//! simulation (`rampart-sim`'s `SimBackup`) over bytes in memory.
//!
//! # A close
//! 1. Claimed ([`FrameTable::claim_close`], by the caller): the frame refuses writes and
//!    its slot stays pinned until the close ends.
//! 2. [`run_close`]: the frame's first `length` bytes are copied out of its slot and
//!    written as the closed replica outside every lock ([`CloseTarget::prepare`]), then
//!    committed under the store's lock ([`commit_close`]) — if the frame is still in
//!    the table: a free that came first (it takes the frame out of the table before it
//!    touches the store) wins, and nothing it freed comes back. The table's mirror of
//!    the store and the frame's leaving the table change in one critical section of the
//!    table: the replica is never invisible while it moves from frame to disk.
//! 3. [`end_close`]: the claim ends. A frame still open takes writes again; the slot of
//!    one that left the table is released, keeping its bytes for reads if they are the
//!    stored replica.
//!
//! # A free
//! [`free`]: the frame first (out of the table, its slot released), then the stored
//! copy ([`free_stored`]), each only if no newer than the free's `epoch_max`.
//!
//! [`check_write`]: crate::segment_store::check_write

use rampart_common::ids::{Epoch, FrameHandle};

use crate::frame_table::{Closing, FrameTable, Release, ReplicaKey};
use crate::segment_store::{ReplicaMeta, StoreError};

/// The frame table, under its lock.
pub trait TableAccess {
    /// `act` on the frame table, under its lock held for that alone.
    fn with_table<R>(&mut self, act: impl FnOnce(&mut FrameTable) -> R) -> R;
}

/// The table owned outright (the simulation's), without a lock.
impl TableAccess for FrameTable {
    fn with_table<R>(&mut self, act: impl FnOnce(&mut FrameTable) -> R) -> R {
        act(self)
    }
}

/// The frame table and the slots of the frame file.
pub trait FrameAccess: TableAccess {
    /// Releases the slot `release` names in the frame file, then gives it back to the
    /// table ([`FrameTable::returned`]). Called without the table's lock held.
    fn release(&mut self, release: Release);
}

/// A backup's store of replicas, as a close's commit and a free see it, under the
/// store's lock.
pub trait ReplicaStore {
    /// A replica written and ready to commit.
    type Prepared;

    /// What the store holds of `key`.
    fn meta(&self, key: ReplicaKey) -> Option<ReplicaMeta>;

    /// Stores `prepared` as its replica, unless the store's write rule
    /// ([`check_write`](crate::segment_store::check_write)) refuses it.
    fn commit(&mut self, prepared: Self::Prepared) -> Result<ReplicaMeta, StoreError>;

    /// Removes replica `key`; whether the store held it.
    fn remove(&mut self, key: ReplicaKey) -> Result<bool, StoreError>;
}

/// Why a close did not store its replica.
#[derive(Debug)]
pub enum CloseFailure {
    /// The frame was freed or replaced before the close reached the store.
    FrameGone,
    /// The store refused or failed.
    Store(StoreError),
}

/// What a close needs beyond the table and the slots.
pub trait CloseTarget: FrameAccess {
    /// A replica written and ready to commit.
    type Prepared;

    /// The first `closing.length` bytes of `closing.slot` (the frame's), copied out
    /// and written as the closed replica, ready to commit: outside every lock (the
    /// disk's write and fsync).
    fn prepare(&mut self, closing: &Closing) -> Result<Self::Prepared, StoreError>;

    /// [`commit_close`] of `prepared` under the store's lock.
    fn commit(
        &mut self,
        closing: &Closing,
        prepared: Self::Prepared,
    ) -> Result<ReplicaMeta, CloseFailure>;
}

/// Step 2 of a close (module doc): writes the claimed frame's replica and commits it;
/// what was stored, or why nothing was.
///
/// # Errors
/// [`CloseFailure::FrameGone`] when the frame left the table (freed, replaced) first;
/// [`CloseFailure::Store`] when the store refused the replica or failed.
pub fn run_close<T: CloseTarget + ?Sized>(
    target: &mut T,
    closing: &Closing,
) -> Result<ReplicaMeta, CloseFailure> {
    // Not needed for safety (the check under the store's lock is), but a frame freed
    // while its close was queued is not written at all.
    if !target.with_table(|table| table.is_open(closing.handle)) {
        return Err(CloseFailure::FrameGone);
    }
    let prepared = target.prepare(closing).map_err(CloseFailure::Store)?;
    target.commit(closing, prepared)
}

/// The commit of a close, under the store's lock: if frame `handle` is still in the
/// table, `store` commits `prepared`; then, in one critical section of the table, the
/// table's mirror takes what the store holds of `key` and a committed frame leaves the
/// table (parked until the last close of it ends). A prepared replica not committed is
/// dropped here (the store removes its file as it drops).
///
/// # Errors
/// As [`run_close`].
pub fn commit_close<S: ReplicaStore + ?Sized, A: TableAccess + ?Sized>(
    store: &mut S,
    table: &mut A,
    (handle, key): (FrameHandle, ReplicaKey),
    prepared: S::Prepared,
) -> Result<ReplicaMeta, CloseFailure> {
    if !table.with_table(|table| table.is_open(handle)) {
        return Err(CloseFailure::FrameGone);
    }
    let result = store.commit(prepared);
    let held = store.meta(key);
    table.with_table(|table| {
        table.set_stored(key, held);
        if let Ok(meta) = &result {
            table.closed(handle, *meta);
        }
    });
    result.map_err(CloseFailure::Store)
}

/// Step 3 of a close: the claim on frame `handle` ends; the slot of a frame that left
/// the table is released, unless another close of it is still under way.
pub fn end_close<T: FrameAccess + ?Sized>(target: &mut T, handle: FrameHandle) {
    if let Some(release) = target.with_table(|table| table.close_ended(handle)) {
        target.release(release);
    }
}

/// What a free removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Freed {
    /// The replica's open frame.
    pub frame: bool,
    /// Its stored copy.
    pub stored: bool,
}

/// What a free needs beyond the table and the slots.
pub trait FreeTarget: FrameAccess {
    /// [`free_stored`] under the store's lock, the table's mirror updated.
    fn free_stored(&mut self, key: ReplicaKey, epoch_max: Epoch) -> Result<bool, StoreError>;
}

/// `FreeReplica { epoch_max }`: the frame of `key` (its slot released), then its stored
/// copy, each only if it is at most at `epoch_max` (a copy placed after the free was
/// decided stays). The frame goes first, so that a close in flight finds it gone and
/// stores nothing ([`commit_close`]).
///
/// # Errors
/// The store's, freeing the stored copy (the frame is freed all the same).
pub fn free<T: FreeTarget + ?Sized>(
    target: &mut T,
    key: ReplicaKey,
    epoch_max: Epoch,
) -> Result<Freed, StoreError> {
    let (frame, slot) = target.with_table(|table| table.free(key, epoch_max));
    if let Some(slot) = slot {
        target.release(Release { slot, kept: None });
    }
    let stored = target.free_stored(key, epoch_max)?;
    Ok(Freed { frame, stored })
}

/// The store's part of a free: replica `key` is removed unless the store holds it at an
/// epoch newer than `epoch_max` ([`ReplicaMeta::outlives_free`]). Whether it was.
///
/// # Errors
/// The store's.
pub fn free_stored<S: ReplicaStore + ?Sized>(
    store: &mut S,
    key: ReplicaKey,
    epoch_max: Epoch,
) -> Result<bool, StoreError> {
    match store.meta(key) {
        Some(meta) if meta.outlives_free(epoch_max) => Ok(false),
        _ => store.remove(key),
    }
}
