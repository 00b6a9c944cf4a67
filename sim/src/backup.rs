//! `SimBackup`: a backup as the simulated masters and recoveries see it — open frames
//! written in place, closed replicas on "disk", fences — whose every decision about a
//! frame is the real backup's: each `SimBackup` drives a real [`FrameTable`]
//! (`rampart-backup`'s frame table) the way the backup's own drivers do, over bytes held
//! in memory, and lists and reads its replicas back with the real backup's own
//! functions ([`held_replicas`]). A regression in the table (which open keeps a slot's
//! bytes, which frame shadows a stored copy, what a fence refuses, what a free removes,
//! which epoch is stale) or in those functions (which copy a read serves, what
//! `StartRecovery` reports) changes what the simulated recoveries find, and fails seeds.
//!
//! # What is the real backup's, and what stands in for the rest
//! * Real: the [`FrameTable`]; the steps of a fence, a close and a free ([`fencing`],
//!   [`lifecycle`]); and [`held_replicas::recovery_replicas`] (the
//!   `StartRecovery` listing) and [`held_replicas::read_held`] (a replica as reads see
//!   it: the visible frame if it shadows the stored copy, else the slot a stored
//!   replica was flushed from while it keeps it, else its file, else the store), which
//!   `SimBackup` runs over itself as their [`HeldReplicas`]: lookups in the table, copies
//!   of its slots and its store, nothing decided.
//! * The *frame file* is `slots`: one `Vec<u8>` of the frame capacity per slot, zeroed
//!   when the table assigns it unless `Opened::keeps_bytes` (as `Frames::open` does
//!   with `FrameFile::assign` / `assign_keeping_data`), released keeping its bytes.
//! * The *store* is a map of closed replicas, bytes and [`ReplicaMeta`], whose write
//!   and free rules are the real store's ([`check_write`],
//!   [`ReplicaMeta::outlives_free`]); the table's mirror of it is updated by the
//!   close's commit ([`lifecycle::commit_close`]) and right after a free, as
//!   `StoreHandle` does under the store's lock. Its files are its entries: a read of "the file" finds the stored
//!   copy.
//! * Each request follows its handler in the backup's `service/`, through the real
//!   backup's steps: a write checks [`FrameTable::writable`] (the checks of
//!   `WriteReplica` and the soft-NIC: the frame open, at the writer's epoch, not fenced,
//!   not closing, in bounds), then copies; a close is claimed, then runs
//!   [`lifecycle::run_close`] and [`lifecycle::end_close`] (as a `CloseJob` does); a
//!   free is [`lifecycle::free`]; `StartRecovery` runs [`fencing::fence`], then
//!   `recovery_replicas`; a recovery read runs [`fencing::fence_before_reading`], then
//!   `read_held`. `SimBackup` gives those steps what a backup gives them
//!   ([`FenceTarget`], [`CloseTarget`], [`FreeTarget`]): lookups in and changes to its
//!   table, copies of its slots, its store.
//!
//! The real drivers' concurrency — copies outside the table's lock, closes in flight
//! on flush threads, slots re-checked with [`FrameTable::still_holds`] after a copy —
//! collapses here: every request runs to its end before the next, so a close is never
//! in flight when another request arrives, and a copy never races a change of its slot.
//! Transports are not told apart: every write is checked as `WriteReplica` checks it
//! (a one-sided `shm` write checks the same owner and fence words, not the epoch).
//!
//! A *down* backup answers nothing but keeps everything (a partition, a hung process, or
//! a kill with its shared-memory frames outliving it); a *lost* one is gone with its
//! frames and disk. A backup's restart (reading its frame file back) is not simulated.

use rampart_backup::fencing::{self, FenceTarget, SlotWords};
use rampart_backup::frame_table::{
    Closing, FrameLimits, FrameRef, FrameTable, Refusal as TableRefusal, Release, ReplicaKey,
};
use rampart_backup::held_replicas::{self, HeldFrame, HeldReplicas};
use rampart_backup::lifecycle::{
    self, CloseFailure, CloseTarget, FrameAccess, FreeTarget, ReplicaStore, TableAccess,
};
use rampart_backup::segment_store::{check_write, ReplicaMeta, StoreError};
use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::log::scan;
use rampart_common::onesided::shm::SlotLabel;
use rampart_common::protocol::backup::RecoveryReplica;
use rampart_common::status::Status;
use std::collections::BTreeMap;

/// Frames open at once on one backup. A master holds one or two segments open and
/// places R replicas of each on distinct backups, so a backup holds a few frames: no
/// normal run meets this bound. A `BackupFull` past it is refused like any replica
/// (the master places the replica elsewhere), as the real master does.
const FRAMES_MAX: usize = 48;

/// Slots beyond [`FRAMES_MAX`]: they keep flushed replicas readable from memory (the
/// table's `kept` slots), as a real backup's `extra_slots` do.
const EXTRA_SLOTS: usize = 16;

/// Why a backup refused a request: the status of the real table's refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The master was fenced here: its recovery began.
    Fenced,
    /// No open frame with this handle (freed, replaced, closing, or never opened).
    UnknownFrame,
    /// An epoch older than a copy held here, or than the frame's.
    StaleEpoch,
    /// No room for another frame.
    BackupFull,
    /// Any other status (`InvalidArgument`, `Internal`): a request the simulated master
    /// should not have sent.
    Other(Status),
}

impl From<TableRefusal> for Refusal {
    fn from(refusal: TableRefusal) -> Refusal {
        match refusal.status {
            Status::Fenced => Refusal::Fenced,
            Status::UnknownFrame => Refusal::UnknownFrame,
            Status::StaleEpoch => Refusal::StaleEpoch,
            Status::BackupFull => Refusal::BackupFull,
            other => Refusal::Other(other),
        }
    }
}

/// Whether a backup answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Answers.
    Up,
    /// Answers nothing until this simulated time (µs), then comes back with everything
    /// it held.
    DownUntil(u64),
    /// Gone for good, with its frames and disk.
    Lost,
}

/// A replica on the simulated disk, or prepared for it.
#[derive(Clone, Debug)]
pub struct StoredReplica {
    meta: ReplicaMeta,
    /// `meta.length` bytes.
    bytes: Vec<u8>,
}

/// A simulated backup.
#[derive(Debug)]
pub struct SimBackup {
    pub id: ServerId,
    pub liveness: Liveness,
    /// Bytes of each slot: the largest frame capacity the table accepts.
    slot_bytes: u32,
    /// The real frame table: every decision about frames.
    table: FrameTable,
    /// The frame file: the bytes of each slot, `slot_bytes` of them from the slot's
    /// first assignment on (empty before). Invariant: a slot is written only by a write
    /// the table found `writable` into it, or zeroed by an open the table assigned it.
    slots: Vec<Vec<u8>>,
    /// The disk. Invariant: the table's mirror (`FrameTable::stored`) equals its
    /// metadata after every request.
    store: SimStore,
}

/// The simulated disk: closed replicas, bytes and metadata, kept under the real store's
/// write rule ([`check_write`]).
#[derive(Debug, Default)]
pub struct SimStore {
    replicas: BTreeMap<ReplicaKey, StoredReplica>,
}

/// `SegmentStore` as `lifecycle`'s steps see it.
impl ReplicaStore for SimStore {
    type Prepared = StoredReplica;

    fn meta(&self, key: ReplicaKey) -> Option<ReplicaMeta> {
        self.replicas.get(&key).map(|stored| stored.meta)
    }

    /// `SegmentStore::commit`: stored unless the real store's rule ([`check_write`])
    /// refuses it.
    fn commit(&mut self, prepared: StoredReplica) -> Result<ReplicaMeta, StoreError> {
        let meta = prepared.meta;
        let key = (meta.master, meta.segment);
        let held = self.replicas.get(&key).map(|stored| &stored.meta);
        check_write(held, key, (meta.epoch, meta.length, meta.closed))?;
        self.replicas.insert(key, prepared);
        Ok(meta)
    }

    fn remove(&mut self, key: ReplicaKey) -> Result<bool, StoreError> {
        Ok(self.replicas.remove(&key).is_some())
    }
}

impl SimBackup {
    /// A backup `id` whose frames hold up to `slot_bytes` bytes (the segment size).
    pub fn new(id: ServerId, slot_bytes: u32) -> SimBackup {
        SimBackup {
            id,
            liveness: Liveness::Up,
            slot_bytes,
            table: Self::empty_table(slot_bytes),
            slots: vec![Vec::new(); FRAMES_MAX + EXTRA_SLOTS],
            store: SimStore::default(),
        }
    }

    fn empty_table(slot_bytes: u32) -> FrameTable {
        let limits = FrameLimits {
            frames_max: FRAMES_MAX,
            frame_bytes_max: slot_bytes,
        };
        // A real backup starts its handles at a random point; one fixed start keeps
        // the run a function of its seed (handles are per backup, as the masters use
        // them).
        FrameTable::new(limits, FRAMES_MAX + EXTRA_SLOTS, [], FrameHandle(1))
    }

    /// Whether it answers at `now_us` (a down backup whose time is over comes back).
    pub fn answers(&mut self, now_us: u64) -> bool {
        match self.liveness {
            Liveness::Up => true,
            Liveness::DownUntil(until) if until <= now_us => {
                self.liveness = Liveness::Up;
                true
            }
            Liveness::DownUntil(_) | Liveness::Lost => false,
        }
    }

    /// Gone for good: everything it held is lost.
    pub fn lose(&mut self) {
        self.liveness = Liveness::Lost;
        self.table = Self::empty_table(self.slot_bytes);
        self.slots.iter_mut().for_each(Vec::clear);
        self.store.replicas.clear();
    }

    /// `OpenReplica` (`Frames::open`): a frame of `capacity` bytes for (master,
    /// segment) at `epoch`, its slot stamped as the table decided; its handle.
    pub fn open(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        capacity: u32,
    ) -> Result<FrameHandle, Refusal> {
        let opened = self.table.open(SlotLabel {
            master,
            segment,
            epoch,
            capacity,
        })?;
        if opened.assign.is_some() {
            let slot = &mut self.slots[opened.frame.slot];
            if slot.is_empty() {
                *slot = vec![0; self.slot_bytes as usize];
            } else if !opened.keeps_bytes {
                slot.fill(0);
            }
            // else: the replaced frame's bytes, a prefix of this frame's stream.
        }
        Ok(opened.frame.handle)
    }

    /// A write of `bytes` at `offset` into frame `handle` at `epoch`, checked as
    /// `WriteReplica` checks it. `applied` bytes of it land (fewer than all when the
    /// writer died mid-copy).
    pub fn write(
        &mut self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u32,
        bytes: &[u8],
        applied: usize,
    ) -> Result<(), Refusal> {
        let slot = self
            .table
            .writable(handle, epoch, u64::from(offset), bytes.len() as u64)?;
        let start = offset as usize;
        let landed = &bytes[..applied.min(bytes.len())];
        self.slots[slot][start..start + landed.len()].copy_from_slice(landed);
        Ok(())
    }

    /// `BumpEpoch`: frame `handle` moves from `epoch` to `new_epoch`.
    pub fn bump(
        &mut self,
        handle: FrameHandle,
        epoch: Epoch,
        new_epoch: Epoch,
    ) -> Result<(), Refusal> {
        // The slot's label would be rewritten here; only a restart reads it.
        self.table.bump_epoch(handle, epoch, new_epoch)?;
        Ok(())
    }

    /// `CloseReplica` (a `CloseJob`): the frame claimed, then [`lifecycle::run_close`]
    /// and [`lifecycle::end_close`] — the first `length` bytes of frame `handle` go to
    /// disk as its replica, closed, and the frame leaves the table.
    pub fn close(&mut self, handle: FrameHandle, epoch: Epoch, length: u32) -> Result<(), Refusal> {
        let closing = self.table.claim_close(handle, epoch, length)?;
        let stored = lifecycle::run_close(self, &closing);
        lifecycle::end_close(self, closing.handle);
        match stored {
            Ok(_) => Ok(()),
            Err(CloseFailure::FrameGone) => Err(Refusal::UnknownFrame),
            // The store's refusals (`StaleEpoch`, `Regressed`) are both answered
            // `StaleEpoch`; the simulated store fails nothing else.
            Err(CloseFailure::Store(_)) => Err(Refusal::StaleEpoch),
        }
    }

    /// The table's mirror of what the store holds of `key` (`StoreHandle::mirror`).
    fn mirror(&mut self, key: ReplicaKey) {
        let meta = self.store.meta(key);
        self.table.set_stored(key, meta);
    }

    /// `FreeReplica { epoch_max }` ([`lifecycle::free`]): the frame, then the stored
    /// copy, of (master, segment), each only if it is at most at `epoch_max`.
    pub fn free(&mut self, master: ServerId, segment: SegmentId, epoch_max: Epoch) {
        if let Err(error) = lifecycle::free(self, (master, segment), epoch_max) {
            unreachable!("the simulated store failed a free: {error}");
        }
    }

    /// `StartRecovery`: fences `master` (`fencing::fence`) and lists every copy of its
    /// log held here ([`held_replicas::recovery_replicas`], the real backup's listing).
    pub fn fence_and_list(&mut self, master: ServerId) -> Vec<RecoveryReplica> {
        self.fence(master);
        held_replicas::recovery_replicas(self, master)
    }

    /// [`fencing::fence`], the real backup's steps.
    fn fence(&mut self, master: ServerId) {
        fencing::fence(self, master);
    }

    /// `Frames::scan` of one frame: its valid prefix, cut at its fenced length.
    fn scan_frame(&self, frame: &FrameRef) -> Vec<u8> {
        let held = &self.slots[frame.slot][..frame.capacity as usize];
        let valid = scan(held).valid_bytes;
        let length = frame
            .fenced_length
            .map_or(valid, |fenced| fenced.min(valid));
        held[..length as usize].to_vec()
    }

    /// `RecoveryRead`: the first `length` bytes of the copy of (master, segment) that
    /// was listed at `epoch` (open or `closed`), if what a read finds is still that copy
    /// with at least `length` bytes.
    pub fn read(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        closed: bool,
        length: u32,
    ) -> Option<Vec<u8>> {
        let key = (master, segment);
        // Never serve bytes a running master could change.
        fencing::fence_before_reading(self, key);
        // `read_held`, the real backup's read-back. The simulated store never fails a
        // read.
        let mut held = held_replicas::read_held(self, key, Vec::new())
            .unwrap_or_else(|error| unreachable!("a simulated store read failed: {error}"))?;
        let same = held.info.epoch == epoch && held.info.closed == closed;
        if !same || held.bytes.len() < length as usize {
            return None;
        }
        held.bytes.truncate(length as usize);
        Some(held.bytes)
    }
}

/// What [`held_replicas`]' listing and read-back are given: the real table's answers, the
/// simulated slots' bytes and the simulated store — lookups and copies, no decision.
/// Every request runs to its end before the next, so nothing changes between two calls:
/// no frame leaves the table during a copy, and the table's mirror equals the store.
impl HeldReplicas for SimBackup {
    fn with_table<R>(&self, look: impl FnOnce(&FrameTable) -> R) -> R {
        look(&self.table)
    }

    /// `Frames::scan`, each frame still in the table.
    fn scan_frames(&self, frames: Vec<FrameRef>) -> Vec<HeldFrame> {
        frames
            .into_iter()
            .map(|frame| HeldFrame {
                bytes: self.scan_frame(&frame),
                frame,
            })
            .collect()
    }

    /// `Frames::read_kept`: the kept slot's bytes, checked against the stored checksum.
    fn read_kept(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta> {
        let (slot, meta) = self.table.kept(key)?;
        let kept = self.slots[slot].get(..meta.length as usize)?;
        bytes.clear();
        bytes.extend_from_slice(kept);
        (crc32fast::hash(bytes) == meta.content_crc32).then_some(meta)
    }

    /// The file the table's mirror names: the store's copy, if it is still that one.
    fn read_file(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta> {
        let meta = self.table.stored(key)?;
        let stored = self
            .store
            .replicas
            .get(&key)
            .filter(|stored| stored.meta == meta)?;
        bytes.clear();
        bytes.extend_from_slice(&stored.bytes);
        Some(meta)
    }

    fn read_stored(&self, key: ReplicaKey) -> Result<Option<(Vec<u8>, ReplicaMeta)>, StoreError> {
        Ok(self
            .store
            .replicas
            .get(&key)
            .map(|stored| (stored.bytes.clone(), stored.meta)))
    }
}

/// The real fence's steps ([`fencing::fence`]) over the simulated frames: a slot's
/// fence word is the table's `fenced` here, and no restart reads a slot's header, so
/// the words are the table's alone; there is no RDMA.
impl FenceTarget for SimBackup {
    fn with_table_words<R>(
        &mut self,
        act: impl FnOnce(&mut FrameTable, &mut dyn SlotWords) -> R,
    ) -> R {
        act(&mut self.table, &mut NoWords)
    }

    fn revoke(&mut self, _master: ServerId) {}

    fn scan(&mut self, frames: Vec<FrameRef>) -> Vec<(FrameRef, u32)> {
        frames
            .into_iter()
            .map(|frame| {
                let length = self.scan_frame(&frame).len() as u32;
                (frame, length)
            })
            .collect()
    }
}

/// The frame file's words, which the simulated slots do not have.
struct NoWords;

impl SlotWords for NoWords {
    fn fence(&mut self, _slot: usize) {}

    fn record_fenced_length(&mut self, _slot: usize, _length: u32) {}
}

impl TableAccess for SimBackup {
    fn with_table<R>(&mut self, act: impl FnOnce(&mut FrameTable) -> R) -> R {
        act(&mut self.table)
    }
}

/// `Frames::release`: the slot keeps its bytes (the next open zeroes it) and goes back
/// to the table.
impl FrameAccess for SimBackup {
    fn release(&mut self, release: Release) {
        self.table.returned(release);
    }
}

/// A close's steps over the simulated slots and store.
impl CloseTarget for SimBackup {
    type Prepared = StoredReplica;

    /// `CloseJob`'s copy of the slot and `ReplicaWriter::prepare_image`: the replica,
    /// not yet on the disk.
    fn prepare(&mut self, closing: &Closing) -> Result<StoredReplica, StoreError> {
        let length = closing.length.min(self.slot_bytes) as usize;
        let bytes = self.slots[closing.slot][..length].to_vec();
        let meta = ReplicaMeta {
            master: closing.key.0,
            segment: closing.key.1,
            epoch: closing.epoch,
            length: bytes.len() as u32,
            closed: true,
            content_crc32: crc32fast::hash(&bytes),
        };
        Ok(StoredReplica { meta, bytes })
    }

    /// `StoreHandle::commit_close`.
    fn commit(
        &mut self,
        closing: &Closing,
        prepared: StoredReplica,
    ) -> Result<ReplicaMeta, CloseFailure> {
        lifecycle::commit_close(
            &mut self.store,
            &mut self.table,
            (closing.handle, closing.key),
            prepared,
        )
    }
}

impl FreeTarget for SimBackup {
    /// `StoreHandle::free`: the real rule, then the mirror.
    fn free_stored(&mut self, key: ReplicaKey, epoch_max: Epoch) -> Result<bool, StoreError> {
        let freed = lifecycle::free_stored(&mut self.store, key, epoch_max);
        self.mirror(key);
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::{TableId, Version};
    use rampart_common::log::SegmentWriter;
    use rampart_common::protocol::backup::ReplicaInfo;

    const M: ServerId = ServerId(1);
    const S: SegmentId = SegmentId(1);
    const CAPACITY: u32 = 4096;

    fn backup() -> SimBackup {
        SimBackup::new(ServerId(9), CAPACITY)
    }

    /// Segment S of M: `batches` sealed batches, closed (footer naming segment 2) if
    /// `closed`; its bytes and the end of each batch.
    fn segment(batches: u64, closed: bool) -> (Vec<u8>, Vec<u32>) {
        let mut writer = SegmentWriter::open(M, S, CAPACITY, &[S]).expect("opens");
        let mut ends = Vec::new();
        for batch in 0..batches {
            writer
                .append_object(TableId(1), Version(batch + 1), b"key", &[batch as u8; 100])
                .expect("fits");
            ends.push(writer.seal_batch());
        }
        if closed {
            ends.push(writer.close(SegmentId(2)));
        }
        (writer.bytes().to_vec(), ends)
    }

    fn listed(backup: &mut SimBackup) -> Vec<ReplicaInfo> {
        backup
            .fence_and_list(M)
            .into_iter()
            .map(|r| r.info)
            .collect()
    }

    fn info(epoch: u64, length: u32, closed: bool) -> ReplicaInfo {
        ReplicaInfo {
            master: M,
            segment: S,
            epoch: Epoch(epoch),
            length,
            closed,
        }
    }

    #[test]
    fn a_fenced_frame_refuses_writes_and_its_master_opens_nothing() {
        let mut backup = backup();
        let handle = backup.open(M, S, Epoch(1), CAPACITY).expect("opens");
        backup.fence_and_list(M);
        assert_eq!(
            backup.write(handle, Epoch(1), 0, &[1; 8], 8),
            Err(Refusal::Fenced)
        );
        assert_eq!(
            backup.open(M, SegmentId(2), Epoch(1), CAPACITY),
            Err(Refusal::Fenced)
        );
        backup.free(M, S, Epoch(1));
        assert_eq!(
            backup.bump(handle, Epoch(1), Epoch(2)),
            Err(Refusal::Fenced),
            "a freed fenced frame still answers Fenced"
        );
    }

    #[test]
    fn an_open_at_an_older_epoch_is_stale_and_a_newer_one_replaces_the_frame() {
        let mut backup = backup();
        let first = backup.open(M, S, Epoch(2), CAPACITY).expect("opens");
        assert_eq!(backup.open(M, S, Epoch(2), CAPACITY), Ok(first));
        assert_eq!(
            backup.open(M, S, Epoch(1), CAPACITY),
            Err(Refusal::StaleEpoch)
        );
        let second = backup.open(M, S, Epoch(3), CAPACITY).expect("replaces");
        assert_ne!(first, second);
        assert_eq!(
            backup.write(first, Epoch(2), 0, &[1], 1),
            Err(Refusal::UnknownFrame)
        );
        assert_eq!(
            backup.write(second, Epoch(2), 0, &[1], 1),
            Err(Refusal::StaleEpoch)
        );
    }

    #[test]
    fn a_free_spares_a_copy_newer_than_its_epoch_max() {
        let mut backup = backup();
        backup.open(M, S, Epoch(3), CAPACITY).expect("opens");
        backup.free(M, S, Epoch(2));
        assert_eq!(backup.fence_and_list(M).len(), 1);
        backup.free(M, S, Epoch(3));
        assert!(backup.fence_and_list(M).is_empty());
    }

    #[test]
    fn a_close_stores_the_frame_and_a_read_returns_it_as_listed() {
        let mut backup = backup();
        let (bytes, _) = segment(3, true);
        let length = bytes.len() as u32;
        let handle = backup.open(M, S, Epoch(1), CAPACITY).expect("opens");
        backup
            .write(handle, Epoch(1), 0, &bytes, bytes.len())
            .expect("writes");
        backup.close(handle, Epoch(1), length).expect("closes");
        assert_eq!(
            backup.write(handle, Epoch(1), 0, &[1], 1),
            Err(Refusal::UnknownFrame)
        );
        assert_eq!(listed(&mut backup), vec![info(1, length, true)]);
        assert_eq!(backup.read(M, S, Epoch(1), true, length), Some(bytes));
        assert_eq!(backup.read(M, S, Epoch(1), false, length), None);
    }

    #[test]
    fn a_replacing_open_cut_short_keeps_what_the_replaced_frame_held() {
        // Seeds 1853, 2815, 3383, 3941: the real table keeps the slot's bytes.
        let mut backup = backup();
        let (bytes, ends) = segment(3, false);
        let old = backup.open(M, S, Epoch(1), CAPACITY).expect("opens");
        backup
            .write(old, Epoch(1), 0, &bytes, bytes.len())
            .expect("writes");
        let new = backup.open(M, S, Epoch(2), CAPACITY).expect("replaces");
        backup
            .write(
                new,
                Epoch(2),
                0,
                &bytes[..ends[0] as usize],
                ends[0] as usize,
            )
            .expect("writes");
        let whole = bytes.len() as u32;
        assert_eq!(listed(&mut backup), vec![info(2, whole, false)]);
        assert_eq!(backup.read(M, S, Epoch(2), false, whole), Some(bytes));
    }

    #[test]
    fn a_re_created_frame_without_footer_does_not_hide_the_closed_copy() {
        // Seed 35: the real table's `shadows_stored`.
        let mut backup = backup();
        let (bytes, ends) = segment(3, true);
        let whole = bytes.len() as u32;
        let handle = backup.open(M, S, Epoch(1), CAPACITY).expect("opens");
        backup
            .write(handle, Epoch(1), 0, &bytes, bytes.len())
            .expect("writes");
        backup.close(handle, Epoch(1), whole).expect("closes");
        let again = backup.open(M, S, Epoch(2), CAPACITY).expect("re-creates");
        backup
            .write(
                again,
                Epoch(2),
                0,
                &bytes[..ends[0] as usize],
                ends[0] as usize,
            )
            .expect("writes");
        assert_eq!(listed(&mut backup), vec![info(1, whole, true)]);
        assert_eq!(backup.read(M, S, Epoch(1), true, whole), Some(bytes));
    }
}
