//! `Frames`: the backup's frames — the [`FrameTable`] under its lock, and the frame file
//! holding their bytes — shared by the service, the closes in flight and the soft-NIC
//! ([`crate::service::BackupNic`]).
//!
//! This is the driver of the table: it carries out on the [`FrameFile`] what the table
//! decides (stamp a slot, relabel it, release it) and copies bytes in and out of slots.
//! Copies happen outside the table's lock: a write checks under it and copies after,
//! the slot's owner word (checked by the copy itself) stopping a write to a slot that
//! changed hands meanwhile; a read copies without pinning the slot and checks
//! afterwards, under the lock, that its frame is still in the table
//! ([`FrameTable::still_holds`]); a copy that lost that race is discarded.
//!
//! Lock order: only the frame file's per-slot locks are taken while the table's lock is
//! held (by `assign`), never the other way round.

use parking_lot::Mutex;
use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::log::scan;
use rampart_common::onesided::shm::{FrameFile, SlotLabel};
use rampart_common::onesided::FrameWriteError;
use rampart_common::protocol::backup::{OpenReplicaReply, ReplicaInfo, ShmFrame};
use rampart_common::status::Status;

use crate::frame_table::{FrameRef, FrameTable, Refusal, Release, ReplicaKey};
use crate::lifecycle::{FrameAccess, TableAccess};
use crate::segment_store::{ReplicaFiles, ReplicaMeta};

/// First read of an open frame when listing or reading it (see `read_written`).
const SCAN_READ_BYTES_MIN: u32 = 256 * 1024;

/// The frames and their bytes. See the module doc.
#[derive(Debug)]
pub(crate) struct Frames {
    /// The frame table. Never held across I/O, and never while waiting for the store's
    /// lock (lock order: the store before the table).
    pub table: Mutex<FrameTable>,
    /// The frames' bytes.
    pub file: FrameFile,
    /// What `OpenReplica` replies say of the file: this host's identity and the file's
    /// absolute path.
    host: String,
    path: String,
    /// Names the store's replica files, for reads without the store lock.
    pub files: ReplicaFiles,
    /// The soft-NIC's address, reported in `OpenReplica` replies.
    nic_addr: Mutex<Option<String>>,
}

impl FrameRef {
    /// The replica this frame holds, `length` bytes of it.
    pub fn info(&self, length: u32) -> ReplicaInfo {
        ReplicaInfo {
            master: self.master,
            segment: self.segment,
            epoch: self.epoch,
            length,
            closed: false,
        }
    }
}

/// An open frame's valid prefix, copied out of its slot.
#[derive(Debug)]
pub(crate) struct ScannedFrame {
    pub frame: FrameRef,
    /// The valid prefix (no more than the fenced length), `length` bytes.
    pub bytes: Vec<u8>,
    pub length: u32,
}

impl ScannedFrame {
    /// The replica as lists and reads report it.
    pub fn info(&self) -> ReplicaInfo {
        self.frame.info(self.length)
    }
}

impl Frames {
    pub fn new(
        table: FrameTable,
        file: FrameFile,
        host: String,
        path: String,
        files: ReplicaFiles,
    ) -> Frames {
        Frames {
            table: Mutex::new(table),
            file,
            host,
            path,
            files,
            nic_addr: Mutex::new(None),
        }
    }

    /// Records where the soft-NIC listens.
    pub fn set_nic_addr(&self, addr: String) {
        *self.nic_addr.lock() = Some(addr);
    }

    /// Opens a frame ([`FrameTable::open`]) and stamps its slot, under the table's lock:
    /// the slot is the new frame's before any other request can name it. A frame that
    /// replaces one of the same replica keeps the slot's bytes
    /// ([`crate::frame_table::Opened::keeps_bytes`]); any other is zeroed.
    pub fn open(
        &self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        capacity: u32,
    ) -> Result<OpenReplicaReply, Refusal> {
        let label = SlotLabel {
            master,
            segment,
            epoch,
            capacity,
        };
        let opened = {
            let mut table = self.table.lock();
            let opened = table.open(label)?;
            if let Some(label) = opened.assign {
                let (slot, handle) = (opened.frame.slot, opened.frame.handle);
                if opened.keeps_bytes {
                    // The replaced frame's bytes: a prefix of this frame's stream (the
                    // table's module doc, "Replacing a frame").
                    self.file.assign_keeping_data(slot, handle, label);
                } else {
                    self.file.assign(slot, handle, label);
                }
            }
            opened
        };
        let frame = opened.frame;
        Ok(OpenReplicaReply {
            handle: frame.handle,
            shm: Some(ShmFrame {
                host: self.host.clone(),
                path: self.path.clone(),
                pid: std::process::id(),
                slot_offset: self.file.slot_offset(frame.slot),
                // The frame's own capacity: one-sided writes past the frame's end are
                // refused like `WriteReplica`s, not merely those past the slot's.
                slot_capacity: frame.capacity,
            }),
            nic: self.nic_addr.lock().clone(),
        })
    }

    /// Moves a frame to a newer epoch ([`FrameTable::bump_epoch`]), in the table and in
    /// its slot's label, before the answer.
    pub fn bump_epoch(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        new_epoch: Epoch,
    ) -> Result<(), Refusal> {
        let mut table = self.table.lock();
        if let Some(slot) = table.bump_epoch(handle, epoch, new_epoch)? {
            self.file.set_epoch(slot, new_epoch);
        }
        Ok(())
    }

    /// Copies rpc or soft-NIC bytes into frame `handle` (the checks under the table's
    /// lock, the copy outside it).
    pub fn write(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), Refusal> {
        let slot = self
            .table
            .lock()
            .writable(handle, epoch, offset, bytes.len() as u64)?;
        self.file
            .write(slot, handle, offset, bytes)
            .map_err(|error| match error {
                FrameWriteError::Fenced => Refusal::new(
                    Status::Fenced,
                    format!("frame {handle} is fenced: recovery of its master has begun"),
                ),
                FrameWriteError::FrameGone => self.table.lock().gone_during_write(handle),
                FrameWriteError::OutOfBounds { .. } => {
                    Refusal::new(Status::InvalidArgument, format!("frame {handle}: {error}"))
                }
                other => Refusal::new(Status::Internal, format!("frame {handle}: {other}")),
            })
    }

    /// Releases a slot the table gave back, in the file, then returns it to the table.
    /// Called without the table's lock held.
    pub fn release(&self, release: Release) {
        self.file.release(release.slot);
        self.table.lock().returned(release);
    }

    /// [`Frames::release`] of a slot holding nothing to keep.
    pub fn release_slot(&self, slot: usize) {
        self.release(Release { slot, kept: None });
    }

    /// The stored replica `key` from the free slot that still holds it, checked against
    /// the store's checksum, copied into `bytes`; `None` if no slot does (any more),
    /// and then `bytes` holds nothing to use.
    pub fn read_kept(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta> {
        let (slot, meta) = self.table.lock().kept(key)?;
        if meta.length > self.file.slot_capacity() {
            // Stored from a frame larger than this file's slots: no slot holds it whole.
            return None;
        }
        self.file.read_into(slot, meta.length, bytes);
        // A slot assigned meanwhile was zeroed and written by another frame: its bytes
        // no longer match, and the entry is gone.
        let intact = crc32fast::hash(bytes) == meta.content_crc32
            && self.table.lock().kept(key) == Some((slot, meta));
        intact.then_some(meta)
    }

    /// The written part of `frame` (at least its valid prefix) and the valid prefix's
    /// length. One-sided writers do not say how far they wrote, so this reads a first
    /// [`SCAN_READ_BYTES_MIN`] and grows ×4 until the bytes past the valid prefix are
    /// all zero (the frame was zeroed at open) or the whole capacity is read: listing an
    /// almost empty 8 MiB frame costs a 256 KiB copy, not 8 MiB. A frame that kept the
    /// bytes of the one it replaced ([`crate::frame_table::Opened::keeps_bytes`]) was
    /// not zeroed: past its valid prefix it may hold a torn write of the old frame, and
    /// then this only reads more (up to the whole capacity) before it stops, and the
    /// scan of what it read still ends where the stream's valid bytes end.
    fn read_written(&self, frame: &FrameRef) -> (Vec<u8>, u32) {
        let mut len = SCAN_READ_BYTES_MIN.min(frame.capacity);
        loop {
            let bytes = self.file.read(frame.slot, len);
            let valid = scan(&bytes).valid_bytes;
            let rest_is_zero = bytes
                .get(valid as usize..)
                .is_some_and(|rest| rest.iter().all(|&b| b == 0));
            if len >= frame.capacity || (valid < len && rest_is_zero) {
                return (bytes, valid);
            }
            len = len.saturating_mul(4).min(frame.capacity);
        }
    }

    /// Whether `frame` (scanned) hides the stored copy of its replica from lists and
    /// reads ([`FrameTable::shadows_stored`]). The frame's bytes are scanned again, for
    /// its footer, only when the store holds a closed copy of the replica: the common
    /// case costs one lookup.
    pub fn shadows_stored(&self, frame: &ScannedFrame) -> bool {
        let key = frame.frame.key();
        if self.table.lock().shadows_stored(key, false) {
            return true;
        }
        let has_footer = scan(&frame.bytes).successor.is_some();
        self.table.lock().shadows_stored(key, has_footer)
    }

    /// Copies each frame out of its slot and scans it for its valid prefix, then keeps
    /// those still in the table (a frame that left it meanwhile may have had its slot
    /// reused: that copy is discarded). Blocks for the copies and scans.
    pub fn scan(&self, frames: Vec<FrameRef>) -> Vec<ScannedFrame> {
        let scanned: Vec<ScannedFrame> = frames
            .into_iter()
            .map(|frame| {
                let (mut bytes, scanned) = self.read_written(&frame);
                // The fenced length ends at a checksum that the later scan also passes
                // (writers only append), so the cut prefix is still valid.
                let length = frame
                    .fenced_length
                    .map_or(scanned, |fenced| fenced.min(scanned));
                bytes.truncate(length as usize);
                ScannedFrame {
                    frame,
                    bytes,
                    length,
                }
            })
            .collect();
        let table = self.table.lock();
        scanned
            .into_iter()
            .filter(|scanned| table.still_holds(&scanned.frame))
            .collect()
    }
}
/// The table under its lock, for [`crate::lifecycle`]'s steps.
impl TableAccess for &Frames {
    fn with_table<R>(&mut self, act: impl FnOnce(&mut FrameTable) -> R) -> R {
        act(&mut self.table.lock())
    }
}

/// [`Frames::release`], for [`crate::lifecycle`]'s steps.
impl FrameAccess for &Frames {
    fn release(&mut self, release: Release) {
        Frames::release(self, release);
    }
}
