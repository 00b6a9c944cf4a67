//! What a killed backup left in its frame file ([`LeftBehind`], [`LeftFrames`],
//! [`LeftSlot`]: the `shm` module doc, "Frames outlive their backup"), and the `flock`
//! that tells a live backup's file from a file left behind. "The module doc" below is the
//! `shm` overview (`mod.rs`).

use super::header::{
    slot_offset, FileHeader, SlotLabel, CAPACITY_WORD_OFFSET, EPOCH_WORD_OFFSET,
    FENCED_LENGTH_WORD_OFFSET, FENCE_WORD_OFFSET, MASTER_WORD_OFFSET, OWNER_WORD_OFFSET,
    SEGMENT_WORD_OFFSET, SLOT_HEADER_BYTES,
};
use super::mapping::Mapping;
use crate::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;

/// What [`FrameFile::read_back`] found at a path.
///
/// [`FrameFile::read_back`]: super::frame_file::FrameFile::read_back
#[derive(Debug)]
pub enum LeftBehind {
    /// No file.
    Nothing,
    /// A file that is not a frame file of this format; nothing in it can be read.
    Unreadable(String),
    /// A frame file tagged for another owner (its tag).
    Foreign(String),
    /// A frame file of ours, locked while this lives.
    Frames(LeftFrames),
}

/// A dead backup's frame file, mapped and locked (see [`FrameFile::read_back`]).
///
/// [`FrameFile::read_back`]: super::frame_file::FrameFile::read_back
#[derive(Debug)]
pub struct LeftFrames {
    /// Holds the `flock` while the frames are read.
    pub(super) _file: File,
    pub(super) map: Mapping,
    pub(super) header: FileHeader,
    pub(super) page_bytes: u64,
}

/// A slot of a dead backup's frame file that a frame held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeftSlot {
    /// Which slot.
    pub slot: usize,
    /// The handle of the frame that held it, [`SEALED_OWNER`] if a graceful stop that
    /// could not flush everything sealed it.
    ///
    /// [`SEALED_OWNER`]: super::header::SEALED_OWNER
    pub owner: FrameHandle,
    /// What the frame was (its capacity clamped to the slot's).
    pub label: SlotLabel,
    /// Whether its master's recovery had fenced it.
    pub fenced: bool,
    /// The valid prefix the fence reported, when it was recorded: the most of the frame
    /// that may be served.
    pub fenced_length: Option<u32>,
}

impl LeftFrames {
    /// The held slots, in slot order.
    pub fn held(&self) -> Vec<LeftSlot> {
        (0..self.header.slots)
            .filter_map(|slot| left_slot(&self.map, &self.header, self.page_bytes, slot))
            .collect()
    }

    /// A copy of the first `label.capacity` data bytes of `slot`. A master that still
    /// maps the file may be writing them (an unacknowledged write: its master sees this
    /// backup's process gone): scan the copy for its valid prefix.
    pub fn read(&self, slot: &LeftSlot) -> Vec<u8> {
        let at = slot_offset(self.page_bytes, self.header.stride, slot.slot);
        self.map.copy_out(
            at + SLOT_HEADER_BYTES,
            slot.label.capacity.min(self.header.slot_capacity) as usize,
        )
    }
}

/// What a reader after a kill learns of slot `slot` (see [`LeftFrames::held`]).
fn left_slot(map: &Mapping, header: &FileHeader, page: u64, slot: usize) -> Option<LeftSlot> {
    let at = slot_offset(page, header.stride, slot);
    let load = |offset: u64| {
        map.word(at + offset)
            .map_or(0, |word| word.load(Ordering::SeqCst))
    };
    let owner = load(OWNER_WORD_OFFSET);
    if owner == 0 {
        return None;
    }
    let capacity = u32::try_from(load(CAPACITY_WORD_OFFSET))
        .unwrap_or(u32::MAX)
        .min(header.slot_capacity);
    let fenced_length = load(FENCED_LENGTH_WORD_OFFSET)
        .checked_sub(1)
        .map(|length| u32::try_from(length).unwrap_or(u32::MAX).min(capacity));
    Some(LeftSlot {
        slot,
        owner: FrameHandle(owner),
        label: SlotLabel {
            master: ServerId(load(MASTER_WORD_OFFSET)),
            segment: SegmentId(load(SEGMENT_WORD_OFFSET)),
            epoch: Epoch(load(EPOCH_WORD_OFFSET)),
            capacity,
        },
        fenced: load(FENCE_WORD_OFFSET) != 0,
        fenced_length,
    })
}

/// Whether `path` still names the open `file` (same device and inode).
pub(super) fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
        _ => false,
    }
}

/// Opens the file at `path` and takes its exclusive `flock`, or `None` if there is no
/// file. A live backup's file is `WouldBlock`. A sweep of stale files
/// ([`remove_stale_frame_files`]) holds a lock for an instant: retried briefly.
///
/// [`remove_stale_frame_files`]: super::paths::remove_stale_frame_files
pub(super) fn lock_existing(path: &Path) -> io::Result<Option<File>> {
    let existing = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut attempts = 0;
    while let Err(error) = lock_exclusive(&existing, path) {
        attempts += 1;
        if error.kind() != io::ErrorKind::WouldBlock || attempts >= LOCK_ATTEMPTS {
            return Err(error);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(Some(existing))
}

/// Takes an exclusive, non-blocking `flock` on `file`; `WouldBlock` names the holder.
pub(super) fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    let Err(errno) = rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
    else {
        return Ok(());
    };
    let error = io::Error::from(errno);
    if error.kind() == io::ErrorKind::WouldBlock {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("frame file {} is in use by another backup", path.display()),
        ));
    }
    Err(error)
}

/// Tries of the lock check in [`FrameFile::create`] before a file counts as held.
///
/// [`FrameFile::create`]: super::frame_file::FrameFile::create
const LOCK_ATTEMPTS: u32 = 10;
