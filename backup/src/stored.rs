//! `StoreHandle`: the backup's [`SegmentStore`] behind its lock, keeping the frame
//! table's mirror of the store's metadata in step with every change.
//!
//! Opens and lists answer from the frame table without the store's lock (it is held
//! across fsyncs), so the table mirrors what the store holds
//! ([`FrameTable::stored`](crate::frame_table::FrameTable::stored)). Every store call
//! goes through this handle, which updates the mirror of the replicas it touched while
//! it still holds the store's lock — also after a failed call (a write whose directory
//! sync failed is indexed, a corrupt read is forgotten). Hence the mirror equals the
//! store whenever the store's lock is free, may lag it while the lock is held, and
//! never leads it.
//!
//! Lock order: the store's lock before the table's. Every call here blocks on the
//! disk, or on a call that does: run them on blocking threads, never on the reactor.

use parking_lot::{Mutex, MutexGuard};
use rampart_common::ids::{Epoch, FrameHandle, ServerId};
use std::sync::Arc;

use crate::frame_table::ReplicaKey;
use crate::frames::Frames;
use crate::lifecycle::{self, CloseFailure, ReplicaStore};
use crate::segment_store::{PreparedReplica, ReplicaMeta, SegmentStore, StoreError};

/// The store and the mirror it keeps. See the module doc.
#[derive(Debug)]
pub(crate) struct StoreHandle {
    store: Mutex<SegmentStore>,
    frames: Arc<Frames>,
}

impl StoreHandle {
    /// `store`, whose metadata `frames`' table mirrors already.
    pub fn new(store: SegmentStore, frames: Arc<Frames>) -> StoreHandle {
        StoreHandle {
            store: Mutex::new(store),
            frames,
        }
    }

    /// Runs `f` on the store, then mirrors what it holds of `keys`.
    fn changing<R>(&self, keys: &[ReplicaKey], f: impl FnOnce(&mut SegmentStore) -> R) -> R {
        let mut store = self.store.lock();
        let result = f(&mut store);
        self.mirror(&store, keys);
        result
    }

    fn mirror(&self, store: &MutexGuard<'_, SegmentStore>, keys: &[ReplicaKey]) {
        let mut table = self.frames.table.lock();
        for &key in keys {
            table.set_stored(key, store.meta(key.0, key.1));
        }
    }

    /// Reads replica `key`, verified (a corrupt one is quarantined, reported as
    /// [`StoreError::Corrupt`] and no longer held), with what the store holds of it.
    pub fn read(&self, key: ReplicaKey) -> Result<Option<(Vec<u8>, ReplicaMeta)>, StoreError> {
        self.changing(&[key], |store| {
            let bytes = store.read_replica(key.0, key.1)?;
            Ok(bytes.zip(store.meta(key.0, key.1)))
        })
    }

    /// Writes `bytes` as replica `key` at `epoch`, open (not closed): a graceful stop's
    /// flush of an open frame. A copy the store holds at the same or a newer epoch is
    /// kept ([`SegmentStore::write_replica`]).
    pub fn write_open(
        &self,
        key: ReplicaKey,
        epoch: Epoch,
        bytes: &[u8],
    ) -> Result<ReplicaMeta, StoreError> {
        self.changing(&[key], |store| {
            store.write_replica(key.0, key.1, epoch, false, bytes)
        })
    }

    /// Frees replica `key` unless the store holds it at an epoch newer than
    /// `epoch_max` (a replacement placed after the free was decided). Whether a copy
    /// was freed.
    pub fn free(&self, key: ReplicaKey, epoch_max: Epoch) -> Result<bool, StoreError> {
        self.changing(&[key], |store| {
            lifecycle::free_stored(store, key, epoch_max)
        })
    }

    /// Frees every replica of `master`; returns those the store held.
    pub fn free_master(&self, master: ServerId) -> (Result<usize, StoreError>, Vec<ReplicaKey>) {
        let mut store = self.store.lock();
        let held: Vec<ReplicaKey> = store
            .list(Some(master))
            .iter()
            .map(|meta| (meta.master, meta.segment))
            .collect();
        let result = store.free_master(master);
        self.mirror(&store, &held);
        (result, held)
    }

    /// [`lifecycle::commit_close`] under the store's lock: commits the close of frame
    /// `handle` if the frame is still in the table and, in the same critical section of
    /// the table as the mirror's update, takes the frame out of the table (parked in
    /// `retiring` while the close is in flight). A prepared replica not committed is
    /// removed as it drops.
    pub fn commit_close(
        &self,
        handle: FrameHandle,
        key: ReplicaKey,
        prepared: PreparedReplica,
    ) -> Result<ReplicaMeta, CloseFailure> {
        let mut store = self.store.lock();
        lifecycle::commit_close(&mut *store, &mut &*self.frames, (handle, key), prepared)
    }
}

/// The store, as [`lifecycle`]'s steps see it.
impl ReplicaStore for SegmentStore {
    type Prepared = PreparedReplica;

    fn meta(&self, key: ReplicaKey) -> Option<ReplicaMeta> {
        SegmentStore::meta(self, key.0, key.1)
    }

    fn commit(&mut self, prepared: PreparedReplica) -> Result<ReplicaMeta, StoreError> {
        SegmentStore::commit(self, prepared)
    }

    fn remove(&mut self, key: ReplicaKey) -> Result<bool, StoreError> {
        SegmentStore::free(self, key.0, key.1)
    }
}
