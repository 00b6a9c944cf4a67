//! [`FrameFile`]: the backup's side of the frame file — created as an allocated, mapped
//! pool of slots, handed to frames, fenced, read, released, and kept at drop while it
//! holds frames — and [`FrameFile::read_back`], what a dead backup left at its path.
//! "The module doc" below is the `shm` overview (`mod.rs`).

use super::header::{
    slot_offset, FileHeader, SlotLabel, CAPACITY_WORD_OFFSET, EPOCH_WORD_OFFSET,
    FENCED_LENGTH_WORD_OFFSET, FENCE_WORD_OFFSET, FILE_HEADER_FIXED_BYTES, FRAME_FILE_BYTES_MAX,
    MASTER_WORD_OFFSET, OWNER_WORD_OFFSET, SEALED_OWNER, SEGMENT_WORD_OFFSET, SLOT_HEADER_BYTES,
};
use super::left_behind::{lock_exclusive, lock_existing, same_file, LeftBehind, LeftFrames};
use super::mapping::{allocate, invalid_input, page_bytes, Mapping, Populate};
use crate::ids::{Epoch, FrameHandle};
use crate::onesided::FrameWriteError;
use parking_lot::RwLock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{self, AtomicU64, Ordering};

/// A backup's shared-memory frame file: `slots` slots of `slot_capacity` data bytes. See
/// the [module doc](super). Removed from the file system when dropped.
#[derive(Debug)]
pub struct FrameFile {
    /// Absolute, canonical path: what masters on this host open.
    path: PathBuf,
    /// Keeps the `flock` for the file's life; gives free slots back when a file that
    /// holds frames is kept (drop).
    file: File,
    map: Mapping,
    slots: usize,
    slot_capacity: u32,
    /// Bytes from one slot header to the next: `SLOT_HEADER_BYTES + slot_capacity`
    /// rounded up to `page_bytes`. Invariant: `page_bytes + slots × stride = map.len`
    /// (the file header takes the first page).
    stride: u64,
    page_bytes: u64,
    /// One per slot. Shared by the backup's in-process writers from their owner check
    /// to their final check; exclusive for `assign` and `release`. Never held by
    /// anything that waits.
    slot_locks: Box<[RwLock<()>]>,
}

impl FrameFile {
    /// Creates the frame file at `path` with `slots` slots of `slot_capacity` data bytes,
    /// all of it allocated and mapped (module doc, "The file is a pool"), tagged `tag` (its owner, for [`FrameFile::read_back`] and
    /// [`remove_stale_frame_files`]), and maps it. A file already at `path` is replaced,
    /// not truncated (see the module doc), unless a live backup holds it: then the error
    /// is `WouldBlock`. Read what a dead backup left there first. Errors are
    /// `InvalidInput` for zero slots, a tag longer than a page less 64 bytes or a file
    /// larger than [`FRAME_FILE_BYTES_MAX`], else the operating system's (`StorageFull`
    /// when the file system has no room for the file's memory).
    ///
    /// [`remove_stale_frame_files`]: super::paths::remove_stale_frame_files
    pub fn create(
        path: &Path,
        slots: usize,
        slot_capacity: u32,
        tag: &str,
    ) -> io::Result<FrameFile> {
        if slots == 0 {
            return Err(invalid_input(format!(
                "frame file {}: needs at least one slot",
                path.display()
            )));
        }
        let page = page_bytes();
        if tag.len() as u64 > page - FILE_HEADER_FIXED_BYTES {
            return Err(invalid_input(format!(
                "frame file {}: its tag of {} bytes exceeds {}",
                path.display(),
                tag.len(),
                page - FILE_HEADER_FIXED_BYTES
            )));
        }
        let slot_bytes = SLOT_HEADER_BYTES + u64::from(slot_capacity);
        let stride = slot_bytes.div_ceil(page) * page;
        let file_bytes = (slots as u64)
            .checked_mul(stride)
            .and_then(|bytes| bytes.checked_add(page))
            .filter(|&bytes| bytes <= FRAME_FILE_BYTES_MAX)
            .ok_or_else(|| {
                invalid_input(format!(
                    "frame file {}: {slots} slots of {stride} bytes exceed the limit of \
                     {FRAME_FILE_BYTES_MAX} bytes",
                    path.display()
                ))
            })?;
        // Refuse a file another live backup holds.
        drop(lock_existing(path)?);
        let file_name = path.file_name().ok_or_else(|| {
            invalid_input(format!(
                "frame file path {} has no file name",
                path.display()
            ))
        })?;
        let mut temp_name = file_name.to_os_string();
        temp_name.push(format!(".{}.new", std::process::id()));
        let temp = path.with_file_name(temp_name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        let header = FileHeader {
            slots,
            slot_capacity,
            stride,
            tag: tag.to_string(),
        };
        let built = lock_exclusive(&file, &temp)
            .and_then(|()| file.set_len(file_bytes))
            .and_then(|()| allocate(&file, file_bytes))
            .and_then(|()| Mapping::map(&file, file_bytes, Populate::Yes))
            .and_then(|map| {
                // Before the file has its name: no reader ever sees it without a header.
                map.copy_in(0, &header.encode());
                std::fs::rename(&temp, path)?;
                Ok(map)
            });
        let map = match built {
            Ok(map) => map,
            Err(error) => {
                let _ = std::fs::remove_file(&temp);
                return Err(error);
            }
        };
        let path = match std::fs::canonicalize(path) {
            Ok(path) => path,
            Err(error) => {
                let _ = std::fs::remove_file(path);
                return Err(error);
            }
        };
        let slot_locks = (0..slots).map(|_| RwLock::new(())).collect();
        Ok(FrameFile {
            path,
            file,
            map,
            slots,
            slot_capacity,
            stride,
            page_bytes: page,
            slot_locks,
        })
    }

    /// The file's absolute, canonical path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many slots the file holds.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Data bytes of each slot.
    pub fn slot_capacity(&self) -> u32 {
        self.slot_capacity
    }

    /// Byte offset of slot `slot`'s header in the file (past the end for `slot ≥ slots`).
    pub fn slot_offset(&self, slot: usize) -> u64 {
        slot_offset(self.page_bytes, self.stride, slot)
    }

    fn slot_lock(&self, slot: usize) -> &RwLock<()> {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        &self.slot_locks[slot]
    }

    /// The header word at `offset` of slot `slot`. Panics if `slot ≥ slots`.
    fn word(&self, slot: usize, offset: u64) -> &AtomicU64 {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        self.map
            .word(self.slot_offset(slot) + offset)
            .expect("slot headers lie inside the mapping, aligned (stride is a page multiple)")
    }

    fn fence_word(&self, slot: usize) -> &AtomicU64 {
        self.word(slot, FENCE_WORD_OFFSET)
    }

    fn owner_word(&self, slot: usize) -> &AtomicU64 {
        self.word(slot, OWNER_WORD_OFFSET)
    }

    /// Hands slot `slot` to frame `owner` (non-zero), labelled `label`: owner cleared,
    /// data zeroed, fence word and fenced length cleared, label written, then the owner
    /// stored last (SeqCst), so a writer that sees `owner` sees a zeroed, unfenced slot
    /// and a reader after a kill sees the label of every held slot. Panics if
    /// `slot ≥ slots` or `owner == 0`.
    pub fn assign(&self, slot: usize, owner: FrameHandle, label: SlotLabel) {
        self.hand_over(slot, owner, label, true);
    }

    /// [`FrameFile::assign`] without zeroing the data: slot `slot` goes to frame `owner`
    /// (non-zero), labelled `label`, keeping the bytes it holds. Only for a slot whose
    /// bytes are a prefix of the stream the new frame receives — the replaced frame of
    /// the same replica (module doc, "Guarantees and their limits"): the new frame's
    /// writes then agree with them wherever both exist. The same ordering as `assign`: a
    /// writer that sees `owner` sees an unfenced slot, a reader after a kill sees the new
    /// label. Panics if `slot ≥ slots` or `owner == 0`.
    pub fn assign_keeping_data(&self, slot: usize, owner: FrameHandle, label: SlotLabel) {
        self.hand_over(slot, owner, label, false);
    }

    /// [`FrameFile::assign`] and [`FrameFile::assign_keeping_data`]: the data is zeroed
    /// only if `zero`.
    fn hand_over(&self, slot: usize, owner: FrameHandle, label: SlotLabel, zero: bool) {
        assert_ne!(owner.0, 0, "owner 0 marks a free slot");
        assert_ne!(owner, SEALED_OWNER, "SEALED_OWNER marks a sealed slot");
        let _exclusive = self.slot_lock(slot).write();
        self.owner_word(slot).store(0, Ordering::SeqCst);
        if zero {
            self.zero_data(slot);
        }
        self.fence_word(slot).store(0, Ordering::SeqCst);
        self.word(slot, FENCED_LENGTH_WORD_OFFSET)
            .store(0, Ordering::SeqCst);
        self.word(slot, MASTER_WORD_OFFSET)
            .store(label.master.0, Ordering::SeqCst);
        self.word(slot, SEGMENT_WORD_OFFSET)
            .store(label.segment.0, Ordering::SeqCst);
        self.word(slot, EPOCH_WORD_OFFSET)
            .store(label.epoch.0, Ordering::SeqCst);
        self.word(slot, CAPACITY_WORD_OFFSET)
            .store(u64::from(label.capacity), Ordering::SeqCst);
        self.owner_word(slot).store(owner.0, Ordering::SeqCst);
    }

    /// Records that the frame in slot `slot` moved to epoch `epoch`; call it before
    /// answering the bump. Panics if `slot ≥ slots`.
    pub fn set_epoch(&self, slot: usize, epoch: Epoch) {
        self.word(slot, EPOCH_WORD_OFFSET)
            .store(epoch.0, Ordering::SeqCst);
    }

    /// Records the valid prefix the fence of slot `slot` reported (final from then on:
    /// [`FrameFile::read_back`] serves no more of it). Panics if `slot ≥ slots`.
    pub fn record_fenced_length(&self, slot: usize, length: u32) {
        self.word(slot, FENCED_LENGTH_WORD_OFFSET)
            .store(u64::from(length) + 1, Ordering::SeqCst);
    }

    /// Whether any slot is held by a frame (its bytes are not yet anywhere else).
    fn holds_frames(&self) -> bool {
        (0..self.slots).any(|slot| self.owner(slot).is_some())
    }

    /// Reads the frame file a dead backup left at `path`, if any, for the backup tagged
    /// `tag` (module doc, "Frames outlive their backup"). The file stays locked while the
    /// returned [`LeftFrames`] lives: read it, store what it holds, drop it, then
    /// [`FrameFile::create`] replaces the file. A file a live backup holds is
    /// `WouldBlock`; a file this format cannot read is [`LeftBehind::Unreadable`], one
    /// tagged for someone else [`LeftBehind::Foreign`]. Other errors are the operating
    /// system's.
    pub fn read_back(path: &Path, tag: &str) -> io::Result<LeftBehind> {
        let Some(file) = lock_existing(path)? else {
            return Ok(LeftBehind::Nothing);
        };
        let page = page_bytes();
        let header = match FileHeader::read(&file, page) {
            Ok(header) => header,
            Err(why) => return Ok(LeftBehind::Unreadable(why)),
        };
        if header.tag != tag {
            return Ok(LeftBehind::Foreign(header.tag));
        }
        let map = Mapping::map(&file, header.file_bytes(page), Populate::No)?;
        Ok(LeftBehind::Frames(LeftFrames {
            _file: file,
            map,
            header,
            page_bytes: page,
        }))
    }

    /// Frees slot `slot` for the next frame: owner 0 (every later write fails its
    /// check). Its bytes stay in place, its memory allocated and mapped, until the next
    /// [`FrameFile::assign`] zeroes them; meanwhile the backup may serve the replica
    /// they hold (flushed to its store already) from memory. Panics if `slot ≥ slots`.
    pub fn release(&self, slot: usize) {
        let _exclusive = self.slot_lock(slot).write();
        self.owner_word(slot).store(0, Ordering::SeqCst);
    }

    /// Returns the memory of free slot `slot` after its header's page to the kernel
    /// (the range then reads as zeros); whether the file system did.
    #[cfg(target_os = "linux")]
    fn punch_hole(&self, slot: usize) -> bool {
        use rustix::fs::FallocateFlags;
        let at = self.slot_offset(slot) + self.page_bytes;
        let len = self.stride.saturating_sub(self.page_bytes);
        // `fallocate` takes a signed `off_t`.
        if i64::try_from(at).is_err() || i64::try_from(len).is_err() {
            return false;
        }
        // KEEP_SIZE never changes the file's size, so no mapping of it can lose pages (a
        // hole reads as zeroes).
        let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        let result = rustix::fs::fallocate(&self.file, mode, at, len);
        len > 0 && result.is_ok()
    }

    #[cfg(not(target_os = "linux"))]
    fn punch_hole(&self, _slot: usize) -> bool {
        false
    }

    /// Zeroes everything of `slot` after its header, in place.
    fn zero_data(&self, slot: usize) {
        let start = self.slot_offset(slot);
        self.map
            .fill_zero(start + SLOT_HEADER_BYTES, self.stride - SLOT_HEADER_BYTES);
        // The zeroes must be visible before the owner or the fence word change.
        atomic::fence(Ordering::SeqCst);
    }

    /// Fences slot `slot`: fence word := 1, then a SeqCst fence. Call it *before*
    /// scanning the slot: a write acknowledged after this returns never happened, one
    /// acknowledged before is visible to the scan. Panics if `slot ≥ slots`.
    pub fn fence(&self, slot: usize) {
        self.fence_word(slot).store(1, Ordering::SeqCst);
        atomic::fence(Ordering::SeqCst);
    }

    /// Whether slot `slot` is fenced. Panics if `slot ≥ slots`.
    pub fn is_fenced(&self, slot: usize) -> bool {
        self.fence_word(slot).load(Ordering::SeqCst) != 0
    }

    /// The handle of the frame slot `slot` holds; `None` when free (owner word 0),
    /// [`SEALED_OWNER`] when sealed. Panics if `slot ≥ slots`.
    pub fn owner(&self, slot: usize) -> Option<FrameHandle> {
        match self.owner_word(slot).load(Ordering::SeqCst) {
            0 => None,
            owner => Some(FrameHandle(owner)),
        }
    }

    /// Writes `bytes` at `offset` into slot `slot` if frame `owner` still holds it and
    /// it is not fenced — the protocol of [`ShmMapping::write`], for the backup's own
    /// writers. A slot past the end is [`FrameWriteError::OutOfBounds`].
    ///
    /// [`ShmMapping::write`]: super::device::ShmMapping::write
    pub fn write(
        &self,
        slot: usize,
        owner: FrameHandle,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FrameWriteError> {
        let Some(lock) = self.slot_locks.get(slot) else {
            return Err(FrameWriteError::OutOfBounds {
                offset,
                len: bytes.len() as u64,
                capacity: 0,
            });
        };
        let _shared = lock.read();
        self.map.write_slot(
            self.slot_offset(slot),
            self.slot_capacity,
            owner,
            offset,
            bytes,
        )
    }

    /// A copy of slot `slot`'s first `len` data bytes (`len` clamped to the capacity).
    /// Bytes a writer is copying meanwhile may be seen torn. Panics if `slot ≥ slots`.
    pub fn read(&self, slot: usize, len: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.read_into(slot, len, &mut out);
        out
    }

    /// Replaces `out`'s contents with slot `slot`'s first `len` data bytes (`len` clamped
    /// to the capacity), as [`FrameFile::read`] reads them, reusing `out`'s capacity.
    /// Panics if `slot ≥ slots`.
    pub fn read_into(&self, slot: usize, len: u32, out: &mut Vec<u8>) {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        let len = len.min(self.slot_capacity);
        self.map.copy_out_into(
            self.slot_offset(slot) + SLOT_HEADER_BYTES,
            len as usize,
            out,
        );
    }

    /// Fills `out` with the first `out.len()` bytes of `slot`'s data, as
    /// [`FrameFile::read`] reads them. Panics if `out` is longer than a slot's capacity.
    pub fn read_to(&self, slot: usize, out: &mut [u8]) {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        assert!(
            out.len() <= self.slot_capacity as usize,
            "a read of {} bytes from a slot of {}",
            out.len(),
            self.slot_capacity
        );
        self.map
            .copy_out_to(self.slot_offset(slot) + SLOT_HEADER_BYTES, out);
    }
}

impl Drop for FrameFile {
    fn drop(&mut self) {
        // Held slots hold bytes that may be nowhere else: leave them for the next
        // backup on this data directory (module doc, "Frames outlive their backup").
        if self.holds_frames() {
            // Only the held slots' memory stays taken: the pool's free slots go back to
            // the kernel (a kept file would otherwise pin all of it until a restart).
            let freed = (0..self.slots)
                .filter(|&slot| self.owner(slot).is_none() && self.punch_hole(slot))
                .count();
            tracing::info!(
                path = %self.path.display(), free_slots_returned = freed,
                "frame file kept: it holds frames"
            );
            return;
        }
        // Only while the path still names this file: a graceful stop may have removed it
        // already ([`SealedFrames::remove`]), and a path removed can be taken again by
        // another backup's new file.
        if !same_file(&self.file, &self.path) {
            return;
        }
        if let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove the frame file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onesided::shm::device::ShmMapping;
    use crate::onesided::shm::left_behind::LeftSlot;
    use crate::onesided::shm::sealed::SealedFrames;
    use crate::onesided::shm::test_support::{frame_file, label, labelled, CAPACITY, TAG};
    use crate::onesided::TAIL_BYTES;
    use std::sync::atomic::AtomicBool;
    use tempfile::TempDir;

    #[test]
    fn assign_keeping_data_keeps_the_bytes_clears_the_fence_and_relabels() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(0, FrameHandle(1), labelled(3, 4, 1, CAPACITY));
        let full = vec![0xAB; CAPACITY as usize];
        file.write(0, FrameHandle(1), 0, &full).expect("fill");
        file.fence(0);
        file.record_fenced_length(0, 100);
        file.assign_keeping_data(0, FrameHandle(2), labelled(3, 4, 2, CAPACITY));
        assert_eq!(file.owner(0), Some(FrameHandle(2)));
        assert!(!file.is_fenced(0));
        assert_eq!(file.read(0, CAPACITY), full, "the bytes are kept");
        assert_eq!(
            file.word(0, FENCED_LENGTH_WORD_OFFSET)
                .load(Ordering::SeqCst),
            0,
            "no fenced length"
        );
        assert_eq!(
            file.word(0, EPOCH_WORD_OFFSET).load(Ordering::SeqCst),
            2,
            "the new label"
        );
        file.write(0, FrameHandle(2), 0, b"ok")
            .expect("write to the new owner");
        assert!(matches!(
            file.write(0, FrameHandle(1), 0, b"old"),
            Err(FrameWriteError::FrameGone)
        ));
    }

    #[test]
    fn assign_zeroes_the_data_and_clears_the_fence() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(0, FrameHandle(1), label());
        let full = vec![0xAB; CAPACITY as usize];
        file.write(0, FrameHandle(1), 0, &full).expect("fill");
        file.fence(0);
        // Re-assigning an owned, fenced slot (no release in between) still zeroes it.
        file.assign(0, FrameHandle(2), label());
        assert_eq!(file.owner(0), Some(FrameHandle(2)));
        assert!(!file.is_fenced(0));
        assert!(file.read(0, CAPACITY).iter().all(|&b| b == 0));
        file.write(0, FrameHandle(2), 0, b"ok")
            .expect("write to the new owner");
        assert!(matches!(
            file.write(0, FrameHandle(1), 0, b"old"),
            Err(FrameWriteError::FrameGone)
        ));
    }

    /// Bytes of `path` backed by memory or disk (a hole is not).
    fn allocated_bytes(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).expect("stat").blocks() * 512
    }

    #[test]
    fn release_then_assign_gives_a_zeroed_slot_and_the_memory_stays_allocated() {
        let dir = TempDir::new().expect("tempdir");
        // A capacity that is not a page multiple: the zeroing covers the partial page.
        let capacity = 3 * 4096 + 100;
        let file = frame_file(&dir, 2, capacity);
        // The pool: every byte allocated at creation, and none given back on release
        // (a hole would be faulted in and zeroed again by the next frame's writer).
        let size = std::fs::metadata(file.path()).expect("stat").len();
        assert!(allocated_bytes(file.path()) >= size);
        file.assign(1, FrameHandle(5), label());
        file.write(1, FrameHandle(5), 0, &vec![0xCD; capacity as usize])
            .expect("fill");
        file.release(1);
        assert_eq!(file.owner(1), None);
        assert!(matches!(
            file.write(1, FrameHandle(5), 0, b"x"),
            Err(FrameWriteError::FrameGone)
        ));
        // A master that passed its owner check before the release lands its copy after
        // it: the next frame must not see those bytes.
        let data = file.slot_offset(1) + SLOT_HEADER_BYTES;
        file.map.copy_in(data + 4096, &[0xEE; 200]);
        assert!(allocated_bytes(file.path()) >= size);
        file.assign(1, FrameHandle(6), label());
        assert!(file.read(1, capacity).iter().all(|&b| b == 0));
        assert_eq!(file.owner(1), Some(FrameHandle(6)));
        assert_eq!(file.owner(0), None);
    }

    #[test]
    fn a_released_slot_keeps_its_bytes_closed_to_writers_until_assigned() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 1, CAPACITY);
        file.assign(0, FrameHandle(5), label());
        file.write(0, FrameHandle(5), 0, b"flushed replica")
            .expect("write");
        file.release(0);
        assert_eq!(file.owner(0), None);
        assert!(matches!(
            file.write(0, FrameHandle(5), 0, b"x"),
            Err(FrameWriteError::FrameGone)
        ));
        assert_eq!(file.read(0, 15), b"flushed replica", "the bytes stay");
        file.assign(0, FrameHandle(6), label());
        assert!(file.read(0, CAPACITY).iter().all(|&b| b == 0));
    }

    #[test]
    fn read_to_and_read_into_copy_from_the_slots_start() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 1, CAPACITY);
        file.assign(0, FrameHandle(1), label());
        file.write(0, FrameHandle(1), 0, b"abcdef").expect("write");
        assert_eq!(file.read(0, 6), b"abcdef");
        let mut slice = [9u8; 5];
        file.read_to(0, &mut slice);
        assert_eq!(&slice, b"abcde");
        let mut reused = vec![7u8; 100];
        file.read_into(0, 4, &mut reused);
        assert_eq!(reused, b"abcd", "the old contents are replaced, not kept");
        assert!(reused.capacity() >= 100, "the buffer's capacity is reused");
    }

    #[test]
    fn create_refuses_bad_sizes_and_a_file_held_by_a_live_backup() {
        let dir = TempDir::new().expect("tempdir");
        let path = dir.path().join("frames");
        let error = FrameFile::create(&path, 0, CAPACITY, TAG).expect_err("no slots");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let error = FrameFile::create(&path, usize::MAX, u32::MAX, TAG).expect_err("too large");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("exceed the limit"), "{error}");

        let file = FrameFile::create(&path, 1, CAPACITY, TAG).expect("create");
        assert!(file.path().is_absolute());
        let error = FrameFile::create(&path, 1, CAPACITY, TAG).expect_err("in use");
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        // The live backup's file is intact.
        file.assign(0, FrameHandle(1), label());
        file.write(0, FrameHandle(1), 0, b"still here")
            .expect("write");
        assert_eq!(&file.read(0, 10)[..], b"still here");
        let error = FrameFile::create(&path, 1, CAPACITY, &"x".repeat(5000)).expect_err("tag");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        file.release(0);
        drop(file);
        assert!(
            !path.exists(),
            "a file holding no frame goes with its backup"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("list").count(),
            0,
            "no temporary file left behind"
        );
    }

    /// Issue 12, item 6: a killed backup's frames are read back by its successor. Without
    /// the slot labels and the file kept at drop, nothing here could be found.
    #[test]
    fn a_dead_backups_frames_are_read_back_with_their_labels_and_fenced_lengths() {
        let dir = TempDir::new().expect("tempdir");
        let path = dir.path().join("frames");
        let file = FrameFile::create(&path, 4, CAPACITY, TAG).expect("create");
        file.assign(1, FrameHandle(11), labelled(3, 4, 1, 1000));
        file.write(1, FrameHandle(11), 0, b"segment four")
            .expect("write");
        file.set_epoch(1, Epoch(2));
        file.assign(2, FrameHandle(12), labelled(3, 5, 7, CAPACITY));
        file.write(2, FrameHandle(12), 0, b"fenced frame")
            .expect("write");
        file.fence(2);
        file.record_fenced_length(2, 6);
        file.assign(3, FrameHandle(13), labelled(9, 1, 1, CAPACITY));
        file.release(3);
        let size = std::fs::metadata(&path).expect("stat").len();
        // Slots 0 and 3 are free: all but their header's page goes back.
        let returned = 2 * (file.stride - file.page_bytes);
        // SIGKILL: the backup's lock goes with its process, the file stays.
        drop(file);
        assert!(path.exists(), "a file holding frames outlives its backup");
        // Only the held slots (and every slot's header) keep their memory.
        assert!(
            allocated_bytes(&path) <= size - returned,
            "free slots were given back"
        );

        let LeftBehind::Frames(left) = FrameFile::read_back(&path, TAG).expect("read") else {
            panic!("our frames");
        };
        let held = left.held();
        assert_eq!(
            held,
            vec![
                LeftSlot {
                    slot: 1,
                    owner: FrameHandle(11),
                    label: labelled(3, 4, 2, 1000),
                    fenced: false,
                    fenced_length: None,
                },
                LeftSlot {
                    slot: 2,
                    owner: FrameHandle(12),
                    label: labelled(3, 5, 7, CAPACITY),
                    fenced: true,
                    fenced_length: Some(6),
                },
            ]
        );
        let bytes = left.read(&held[0]);
        assert_eq!(bytes.len(), 1000);
        assert_eq!(&bytes[..12], b"segment four");
        assert!(bytes[12..].iter().all(|&b| b == 0));
        assert_eq!(&left.read(&held[1])[..12], b"fenced frame");
        // Locked while it is read: neither a second reader nor a new backup gets in.
        let busy = FrameFile::read_back(&path, TAG).expect_err("locked");
        assert_eq!(busy.kind(), io::ErrorKind::WouldBlock);
        let busy = FrameFile::create(&path, 1, CAPACITY, TAG).expect_err("locked");
        assert_eq!(busy.kind(), io::ErrorKind::WouldBlock);
        drop(left);

        // Someone else's file, an unreadable one, none.
        match FrameFile::read_back(&path, "/another/backup").expect("read") {
            LeftBehind::Foreign(tag) => assert_eq!(tag, TAG),
            other => panic!("{other:?}"),
        }
        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, vec![7u8; 3 * page_bytes() as usize]).expect("write");
        assert!(matches!(
            FrameFile::read_back(&garbage, TAG).expect("read"),
            LeftBehind::Unreadable(why) if why.contains("magic")
        ));
        assert!(matches!(
            FrameFile::read_back(&dir.path().join("none"), TAG).expect("read"),
            LeftBehind::Nothing
        ));
        // Then the new backup replaces it: an empty file again.
        let new = FrameFile::create(&path, 2, CAPACITY, TAG).expect("replace");
        drop(new);
        assert!(!path.exists());
    }

    #[test]
    fn create_replaces_a_dead_backups_file_without_truncating_it_under_its_mappings() {
        let dir = TempDir::new().expect("tempdir");
        let path = dir.path().join("frames");
        let old = FrameFile::create(&path, 2, CAPACITY, TAG).expect("create");
        old.assign(1, FrameHandle(9), label());
        let old_slot = old.slot_offset(1);
        let mapping = ShmMapping::open(&path).expect("map");
        // A killed backup leaves its file behind, and the kernel drops its lock.
        rustix::fs::flock(&old.file, rustix::fs::FlockOperation::Unlock).expect("unlock");
        std::mem::forget(old);
        let new = FrameFile::create(&path, 1, 100, TAG).expect("replace");
        // The master's mapping still holds the old, full-sized file: no SIGBUS.
        mapping
            .write(
                old_slot,
                CAPACITY,
                FrameHandle(9),
                u64::from(CAPACITY) - 8,
                b"old file",
            )
            .expect("the old mapping keeps working");
        assert!(new.read(0, 100).iter().all(|&b| b == 0));
        let remapped = ShmMapping::open(&path).expect("map the new file");
        assert_eq!(
            remapped.len_bytes(),
            2 * page_bytes(),
            "the header's page and a slot"
        );
    }

    /// Dekker: a writer loop and a fencer race; every write acknowledged to the writer
    /// must be visible to the fencer's scan after its fence. Without the check after the
    /// copy (step 4 of the protocol) the write in flight when the fence lands is
    /// acknowledged yet missed by the scan, and this test fails (checked by removing it).
    #[test]
    fn every_write_acknowledged_around_a_fence_is_seen_by_the_scan_after_it() {
        writes_acknowledged_around_a_stop_are_seen_by_the_scan_after_it(
            "fence",
            |file| file.fence(0),
            |error| matches!(error, FrameWriteError::Fenced),
        );
    }

    #[test]
    fn every_write_acknowledged_around_a_seal_is_seen_by_the_scan_after_it() {
        writes_acknowledged_around_a_stop_are_seen_by_the_scan_after_it(
            "seal",
            |file| {
                let sealed = SealedFrames::seal(file.path()).expect("seal");
                assert_eq!(sealed.count(), 1);
            },
            |error| matches!(error, FrameWriteError::FrameGone),
        );
    }

    /// Dekker's pattern of the write protocol: a writer fills a slot region by region
    /// while `stop` (a fence or a seal) lands at a random point of its pass; every region
    /// acknowledged must be seen by a scan after `stop`, and the writer stops at the first
    /// refusal (`refused`).
    fn writes_acknowledged_around_a_stop_are_seen_by_the_scan_after_it(
        what: &str,
        stop: impl Fn(&FrameFile) + Sync,
        refused: impl Fn(&FrameWriteError) -> bool + Sync,
    ) {
        // Few, large regions: a region's copy takes long against the scan of the tails,
        // so the fence often lands inside a copy and the scan gets there first.
        const REGION_BYTES: usize = 256 * 1024;
        const REGIONS: usize = 8;
        const ROUNDS: u64 = 200;
        let capacity = (REGION_BYTES * REGIONS) as u32;
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 1, capacity);
        let mapping = ShmMapping::open(file.path()).expect("map");
        let slot_offset = file.slot_offset(0);
        let patterns: Vec<Vec<u8>> = (0..REGIONS)
            .map(|region| vec![region as u8 + 1; REGION_BYTES])
            .collect();
        let write_all = |owner: u64, acked: &mut Vec<usize>| {
            for (region, pattern) in patterns.iter().enumerate() {
                let offset = (region * REGION_BYTES) as u64;
                match mapping.write(slot_offset, capacity, FrameHandle(owner), offset, pattern) {
                    Ok(()) => acked.push(region),
                    Err(error) if refused(&error) => break,
                    Err(error) => panic!("unexpected {error:?}"),
                }
            }
        };
        // How long an unfenced pass into a fresh frame takes (the fastest of a few): the
        // fence lands uniformly inside it.
        let pass_nanos = (0..5)
            .map(|_| {
                file.assign(0, FrameHandle(u64::MAX - 1), label());
                let started = std::time::Instant::now();
                write_all(u64::MAX - 1, &mut Vec::new());
                started.elapsed().as_nanos().max(1) as u64
            })
            .min()
            .unwrap_or(1);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64 | 1)
            .unwrap_or(1);
        eprintln!("dekker ({what}) seed {seed}, pass {pass_nanos} ns");
        let mut rng = seed;
        let mut fenced_mid_pass = 0;
        for owner in 1..=ROUNDS {
            file.assign(0, FrameHandle(owner), label());
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let delay = std::time::Duration::from_nanos(rng % pass_nanos);
            let writing = AtomicBool::new(false);
            let (acked, scan) = std::thread::scope(|scope| {
                let writer = scope.spawn(|| {
                    let mut acked = Vec::new();
                    writing.store(true, Ordering::SeqCst);
                    write_all(owner, &mut acked);
                    acked
                });
                while !writing.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                let start = std::time::Instant::now();
                while start.elapsed() < delay {
                    std::hint::spin_loop();
                }
                stop(&file);
                // The scan: each region's tail (its commit marker), last region first,
                // so it reaches a region still being copied as early as possible.
                let base = slot_offset + SLOT_HEADER_BYTES;
                let mut scan = vec![[0u8; TAIL_BYTES]; REGIONS];
                for region in (0..REGIONS).rev() {
                    let tail_at = base + ((region + 1) * REGION_BYTES - TAIL_BYTES) as u64;
                    // Inside the slot's data; the writer's concurrent stores are the
                    // race under test.
                    file.map.copy_out_to(tail_at, &mut scan[region]);
                }
                (writer.join().expect("writer"), scan)
            });
            if acked.len() < REGIONS {
                fenced_mid_pass += 1;
            }
            for region in acked {
                assert!(
                    scan[region].iter().all(|&b| b == region as u8 + 1),
                    "round {owner} (seed {seed}): region {region} was acknowledged but \
                     the scan after the {what} saw {:?}",
                    scan[region]
                );
            }
        }
        eprintln!("{fenced_mid_pass} of {ROUNDS} rounds stopped the writer mid-pass ({what})");
    }
}
