//! The `shm` transport: a backup's frames in a shared-memory *frame file* that masters on
//! the same host map and copy into (DESIGN.md §5 "One-sided writes", "Backups").
//!
//! * [`FrameFile`] — the backup's side. It creates the file (sparse), maps it, hands its
//!   slots to frames ([`FrameFile::assign`]), fences them for recovery
//!   ([`FrameFile::fence`]), reads them back and returns their memory
//!   ([`FrameFile::release`]). It also serves the backup's own writers (the `rpc`
//!   handler and the soft-NIC) with the same protocol as a master's.
//! * [`ShmMapping`] — the master's side: a mapping of a backup's frame file, and
//!   [`ShmMapping::write`], the one-sided write.
//!
//! # Layout
//! The file is `slots` slots of equal *stride* (the slot's header plus its capacity,
//! rounded up to the page size, so that a slot's pages can be returned to the kernel on
//! their own). A slot starts with a [`SLOT_HEADER_BYTES`]-byte header:
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | fence word, `AtomicU64`: 0 open, non-zero fenced |
//! | 8      | 8    | owner, `AtomicU64`: the handle of the frame the slot holds, 0 free |
//! | 16     | 48   | reserved (zero) |
//!
//! and the frame's data follows at offset [`SLOT_HEADER_BYTES`]. The header words are
//! only ever accessed atomically, by every process. Integers are in the host's byte
//! order: the file is shared only between processes of one host.
//!
//! # Write protocol
//! [`ShmMapping::write`] and [`FrameFile::write`] share one implementation:
//! 1. bounds, in 64-bit arithmetic: the slot lies inside the mapping and
//!    `offset + len ≤ capacity`, else [`FrameWriteError::OutOfBounds`];
//! 2. the owner must be the writer's handle, never 0 ([`FrameWriteError::FrameGone`]),
//!    and the fence word 0 ([`FrameWriteError::Fenced`]);
//! 3. copy all but the last [`TAIL_BYTES`], SeqCst fence, copy the tail (Tailwind: a
//!    visible checksum implies visible entries);
//! 4. SeqCst fence, then load the fence word and the owner again: fenced →
//!    [`FrameWriteError::Fenced`], owner changed → [`FrameWriteError::FrameGone`], else
//!    the write may be acknowledged.
//!
//! Step 4 against [`FrameFile::fence`] (fence word := 1, SeqCst fence, then the backup
//! scans) is Dekker's pattern: either the writer's load sees the fence and the write is
//! never acknowledged, or the backup's scan sees the whole write.
//!
//! # Memory model
//! The data bytes are plain memory shared with other processes, written and read with
//! `ptr::copy_nonoverlapping` while a peer may be writing them: a reader can see a torn
//! or half-written batch, which is what the valid-prefix scan
//! ([`crate::log::scanner::scan`]) is for. The ordering guarantees come only from the
//! atomic header words and the SeqCst fences around the copies (on x86-64 an `mfence`,
//! on AArch64 a `dmb ish`), which order the plain copies at the hardware level. Inside
//! one process this is the seqlock idiom, formally outside Rust's memory model; no
//! reference into the data is ever created, only raw-pointer copies in and out.
//!
//! # Guarantees and their limits
//! * A slot's data is zero when it is assigned, and its pages go back to the kernel when
//!   it is released (`fallocate(PUNCH_HOLE)`, or a `memset` where the file system cannot
//!   punch holes). A fresh frame therefore costs page faults on first touch (≈ 5 ms per
//!   8 MiB, paid by the first writer), the price of not pinning `slots × capacity` bytes.
//! * The backup's own writers ([`FrameFile::write`]) hold the slot's lock from their
//!   owner check to their final check, and [`FrameFile::assign`] and
//!   [`FrameFile::release`] take it exclusively, so an in-process write never lands in a
//!   slot after it changed hands.
//! * A master's write ([`ShmMapping::write`]) takes no lock across processes. A master
//!   preempted between its owner check and its copy for as long as it takes the backup to
//!   release the slot and assign it again would scribble into the next frame (and then
//!   report [`FrameWriteError::FrameGone`]); the next frame's scan then sees a torn
//!   batch. Masters never write after sending close or free, so only a master that is
//!   itself being recovered (fenced, then freed) can hit this; backups reuse slots in
//!   FIFO order to make the window as long as possible.
//! * The file never shrinks while it may be mapped: a master touching a page past the
//!   end of a truncated file would take `SIGBUS`. [`FrameFile::create`] therefore builds
//!   a new file and renames it over the path (a master still mapping a dead backup's file
//!   keeps the old inode), and nothing truncates a file in place.
//! * [`FrameFile::create`] takes an exclusive `flock` on its file and refuses a path
//!   whose file another live backup holds.
//!
//! Cost: a write is two `memcpy`s and two fences (≈ 100 µs per MiB at memory speed, ≈ 50
//! ns for a small batch); the backup's CPU does nothing.

use super::{FrameWriteError, TAIL_BYTES};
use parking_lot::RwLock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{self, AtomicU64, Ordering};

/// Bytes of a slot's header: the fence word at +0, the owner at +8, the rest reserved.
/// The frame's data follows. A cache line, so the header words never share one with data.
pub const SLOT_HEADER_BYTES: u64 = 64;

/// Where the fence word lies in a slot header.
const FENCE_WORD_OFFSET: u64 = 0;

/// Where the owner word lies in a slot header.
const OWNER_WORD_OFFSET: u64 = 8;

/// Alignment the header words need (`AtomicU64`), hence of every slot offset.
const WORD_ALIGN_BYTES: u64 = 8;

/// Largest frame file, in bytes: the file is sparse and costs only address space until
/// written, but a misconfigured `slots × capacity` should fail at start-up with a clear
/// error rather than reserve absurd amounts of it (1 TiB holds 131072 frames of 8 MiB).
pub const FRAME_FILE_BYTES_MAX: u64 = 1 << 40;

const _: () = assert!(OWNER_WORD_OFFSET + 8 <= SLOT_HEADER_BYTES);
const _: () = assert!(FENCE_WORD_OFFSET % WORD_ALIGN_BYTES == 0);
const _: () = assert!(OWNER_WORD_OFFSET % WORD_ALIGN_BYTES == 0);
const _: () = assert!(SLOT_HEADER_BYTES % WORD_ALIGN_BYTES == 0);

/// A `MAP_SHARED`, read-write mapping of a whole file; unmapped on drop.
#[derive(Debug)]
struct Mapping {
    /// Start of the mapping (page-aligned, as `mmap` returns it).
    base: NonNull<u8>,
    /// Its length in bytes. Invariant: > 0, fits in `usize`, and the mapped file is at
    /// least this long for the mapping's life (no one truncates it: module doc).
    len: u64,
}

// SAFETY: `Mapping` is a pointer to shared memory that every holder accesses only by
// atomics (header words) or by raw copies whose races are part of the protocol (module
// doc "Memory model"); nothing about it is tied to the thread that created it.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` gives no access that is not already shared with other
// processes.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file`, which must be at least that long.
    fn map(file: &File, len: u64) -> io::Result<Mapping> {
        let len_usize = usize::try_from(len).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a mapping of {len} bytes does not fit in the address space"),
            )
        })?;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map an empty frame file",
            ));
        }
        // SAFETY: a fresh mapping chosen by the kernel (null hint), of a valid open file
        // descriptor; the result is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { base, len })
    }

    /// The atomic word at byte `at`, or `None` if it is not inside the mapping or not
    /// 8-byte aligned.
    fn word(&self, at: u64) -> Option<&AtomicU64> {
        if at % WORD_ALIGN_BYTES != 0 || at.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `at + 8 ≤ len`, so the 8 bytes lie inside the mapping, which lives as
        // long as `&self`; `base` is page-aligned and `at` a multiple of 8, so the
        // pointer is aligned for `AtomicU64`, which has the layout of `u64`. Every
        // process accesses header words only atomically (module doc), and an
        // `AtomicU64` may be mutated through a shared reference.
        Some(unsafe { &*self.base.as_ptr().add(at as usize).cast::<AtomicU64>() })
    }

    /// Copies `bytes` to byte `at`. Panics if the range is not inside the mapping (a
    /// programmer error: callers check bounds first).
    fn copy_in(&self, at: u64, bytes: &[u8]) {
        let end = at.checked_add(bytes.len() as u64);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "copy of {} bytes at {at} passes the mapping's end ({})",
            bytes.len(),
            self.len
        );
        // SAFETY: `at + len ≤ self.len` (checked above), so the target lies inside the
        // mapping; `bytes` is a Rust slice and cannot overlap a mapping we never hand out
        // references into. Concurrent access by other writers and readers is plain
        // shared memory, ordered by the protocol's fences (module doc "Memory model").
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.as_ptr().add(at as usize),
                bytes.len(),
            );
        }
    }

    /// A copy of `len` bytes at byte `at`. Panics if the range is not inside the
    /// mapping.
    fn copy_out(&self, at: u64, len: usize) -> Vec<u8> {
        let end = at.checked_add(len as u64);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "read of {len} bytes at {at} passes the mapping's end ({})",
            self.len
        );
        let mut out = vec![0u8; len];
        // SAFETY: the source lies inside the mapping (checked above) and the target is a
        // fresh vector of `len` bytes; they cannot overlap. Bytes a peer is writing
        // meanwhile may be read torn (module doc "Memory model").
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(at as usize),
                out.as_mut_ptr(),
                len,
            );
        }
        out
    }

    /// Sets `len` bytes at byte `at` to zero. Panics if the range is not inside the
    /// mapping.
    fn fill_zero(&self, at: u64, len: u64) {
        let end = at.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "zeroing of {len} bytes at {at} passes the mapping's end ({})",
            self.len
        );
        // SAFETY: inside the mapping (checked above; `len ≤ self.len` fits in usize).
        unsafe {
            std::ptr::write_bytes(self.base.as_ptr().add(at as usize), 0, len as usize);
        }
    }

    /// The write protocol of the module doc, into the slot whose header is at
    /// `slot_offset` and whose data holds `slot_capacity` bytes.
    fn write_slot(
        &self,
        slot_offset: u64,
        slot_capacity: u32,
        owner: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FrameWriteError> {
        let len = bytes.len() as u64;
        let out_of_bounds = |capacity: u64| FrameWriteError::OutOfBounds {
            offset,
            len,
            capacity,
        };
        let capacity = u64::from(slot_capacity);
        // 1. Bounds. A slot that is misaligned or does not lie inside the mapping has no
        //    reachable bytes at all: reported as a capacity of 0.
        let data_start = slot_offset.checked_add(SLOT_HEADER_BYTES);
        let slot_fits = data_start
            .and_then(|start| start.checked_add(capacity))
            .is_some_and(|end| end <= self.len);
        let (Some(data_start), true, Some(fence_word), Some(owner_word)) = (
            data_start,
            slot_fits,
            self.word(slot_offset.wrapping_add(FENCE_WORD_OFFSET)),
            self.word(slot_offset.wrapping_add(OWNER_WORD_OFFSET)),
        ) else {
            return Err(out_of_bounds(0));
        };
        if offset.checked_add(len).map_or(true, |end| end > capacity) {
            return Err(out_of_bounds(capacity));
        }
        // 2. Checks before copying: never write into a slot that is not ours. Owner 0
        //    names no frame (it marks a free slot).
        if owner == 0 || owner_word.load(Ordering::SeqCst) != owner {
            return Err(FrameWriteError::FrameGone);
        }
        if fence_word.load(Ordering::SeqCst) != 0 {
            return Err(FrameWriteError::Fenced);
        }
        // 3. Body, fence, tail. `data_start + offset + len ≤ data_start + capacity ≤ len`.
        let at = data_start + offset;
        let split = bytes.len().saturating_sub(TAIL_BYTES);
        let (body, tail) = bytes.split_at(split);
        self.copy_in(at, body);
        atomic::fence(Ordering::SeqCst);
        self.copy_in(at + split as u64, tail);
        // 4. Dekker: the copies before this fence, the fence word's load after it.
        atomic::fence(Ordering::SeqCst);
        if fence_word.load(Ordering::SeqCst) != 0 {
            return Err(FrameWriteError::Fenced);
        }
        if owner_word.load(Ordering::SeqCst) != owner {
            return Err(FrameWriteError::FrameGone);
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned and were never unmapped;
        // no reference into the mapping outlives `&self` borrows, which have ended.
        let result = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len as usize) };
        if result != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "munmap of a frame file failed");
        }
    }
}

/// The system's page size.
fn page_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// A backup's shared-memory frame file: `slots` slots of `slot_capacity` data bytes. See
/// the [module doc](self). Removed from the file system when dropped.
#[derive(Debug)]
pub struct FrameFile {
    /// Absolute, canonical path: what masters on this host open.
    path: PathBuf,
    /// Keeps the `flock` for the file's life and serves `fallocate`.
    file: File,
    map: Mapping,
    slots: usize,
    slot_capacity: u32,
    /// Bytes from one slot header to the next: `SLOT_HEADER_BYTES + slot_capacity`
    /// rounded up to `page_bytes`. Invariant: `slots × stride = map.len`.
    stride: u64,
    page_bytes: u64,
    /// One per slot. Shared by the backup's in-process writers from their owner check
    /// to their final check; exclusive for `assign` and `release`. Never held by
    /// anything that waits.
    slot_locks: Box<[RwLock<()>]>,
    /// Once set, slots are zeroed in place and never hole-punched: a region registered
    /// with an RDMA NIC pins the file's pages, and a punched page would be replaced by
    /// a fresh one the NIC never writes to.
    keep_pages: std::sync::atomic::AtomicBool,
}

impl FrameFile {
    /// Creates the frame file at `path` with `slots` slots of `slot_capacity` data bytes,
    /// sparse (`ftruncate`), and maps it. A file already at `path` is replaced, not
    /// truncated (see the module doc), unless a live backup holds it: then the error is
    /// `WouldBlock`. Errors are `InvalidInput` for zero slots or a file larger than
    /// [`FRAME_FILE_BYTES_MAX`], else the operating system's.
    pub fn create(path: &Path, slots: usize, slot_capacity: u32) -> io::Result<FrameFile> {
        if slots == 0 {
            return Err(invalid_input(format!(
                "frame file {}: needs at least one slot",
                path.display()
            )));
        }
        let page = page_bytes();
        let slot_bytes = SLOT_HEADER_BYTES + u64::from(slot_capacity);
        let stride = slot_bytes.div_ceil(page) * page;
        let file_bytes = (slots as u64)
            .checked_mul(stride)
            .filter(|&bytes| bytes <= FRAME_FILE_BYTES_MAX)
            .ok_or_else(|| {
                invalid_input(format!(
                    "frame file {}: {slots} slots of {stride} bytes exceed the limit of \
                     {FRAME_FILE_BYTES_MAX} bytes",
                    path.display()
                ))
            })?;
        // Refuse a file another live backup holds. A sweep of stale files
        // (`remove_stale_frame_files`) holds a lock for an instant: retry briefly.
        if let Ok(existing) = File::open(path) {
            let mut attempts = 0;
            while let Err(error) = lock_exclusive(&existing, path) {
                attempts += 1;
                if error.kind() != io::ErrorKind::WouldBlock || attempts >= LOCK_ATTEMPTS {
                    return Err(error);
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
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
        let built = lock_exclusive(&file, &temp)
            .and_then(|()| file.set_len(file_bytes))
            .and_then(|()| Mapping::map(&file, file_bytes))
            .and_then(|map| {
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
            keep_pages: std::sync::atomic::AtomicBool::new(false),
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
        (slot as u64).saturating_mul(self.stride)
    }

    fn slot_lock(&self, slot: usize) -> &RwLock<()> {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        &self.slot_locks[slot]
    }

    fn fence_word(&self, slot: usize) -> &AtomicU64 {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        self.map
            .word(self.slot_offset(slot) + FENCE_WORD_OFFSET)
            .expect("slot headers lie inside the mapping, aligned (stride is a page multiple)")
    }

    fn owner_word(&self, slot: usize) -> &AtomicU64 {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        self.map
            .word(self.slot_offset(slot) + OWNER_WORD_OFFSET)
            .expect("slot headers lie inside the mapping, aligned (stride is a page multiple)")
    }

    /// Hands slot `slot` to frame `owner` (non-zero): owner cleared, data zeroed, fence
    /// word cleared, then the owner stored last (SeqCst), so a writer that sees `owner`
    /// sees a zeroed, unfenced slot. Panics if `slot ≥ slots` or `owner == 0`.
    pub fn assign(&self, slot: usize, owner: u64) {
        assert_ne!(owner, 0, "owner 0 marks a free slot");
        let _exclusive = self.slot_lock(slot).write();
        self.owner_word(slot).store(0, Ordering::SeqCst);
        self.zero_data(slot);
        self.fence_word(slot).store(0, Ordering::SeqCst);
        self.owner_word(slot).store(owner, Ordering::SeqCst);
    }

    /// Frees slot `slot`: owner 0 first (every later write fails its check), then the
    /// data zeroed and its memory returned to the kernel. Panics if `slot ≥ slots`.
    pub fn release(&self, slot: usize) {
        let _exclusive = self.slot_lock(slot).write();
        self.owner_word(slot).store(0, Ordering::SeqCst);
        self.zero_data(slot);
    }

    /// Zeroes everything of `slot` after its header: the rest of the header's page by
    /// `memset`, whole pages by punching a hole (which also returns their memory),
    /// falling back to `memset` where the file system cannot.
    fn zero_data(&self, slot: usize) {
        let start = self.slot_offset(slot);
        let first_page_end = start + self.page_bytes.min(self.stride);
        self.map.fill_zero(
            start + SLOT_HEADER_BYTES,
            first_page_end - (start + SLOT_HEADER_BYTES),
        );
        let rest = self.stride - (first_page_end - start);
        let keep = self.keep_pages.load(Ordering::SeqCst);
        if rest > 0 && (keep || !self.punch_hole(first_page_end, rest)) {
            self.map.fill_zero(first_page_end, rest);
        }
        // The zeroes must be visible before the owner or the fence word change.
        atomic::fence(Ordering::SeqCst);
    }

    #[cfg(target_os = "linux")]
    fn punch_hole(&self, at: u64, len: u64) -> bool {
        let (Ok(at), Ok(len)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) else {
            return false;
        };
        // SAFETY: FFI on our own open descriptor; KEEP_SIZE never changes the file's
        // size, so no mapping of it can lose pages (the hole reads as zeroes).
        let result = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at,
                len,
            )
        };
        result == 0
    }

    #[cfg(not(target_os = "linux"))]
    fn punch_hole(&self, _at: u64, _len: u64) -> bool {
        false
    }

    /// From now on, zero released slots in place instead of punching holes (see the
    /// `keep_pages` field). Returns once no hole-punch is still running, so a caller may
    /// register the file's pages with a NIC right after.
    pub fn keep_pages(&self) {
        self.keep_pages.store(true, Ordering::SeqCst);
        for lock in self.slot_locks.iter() {
            // `assign` and `release` punch under the exclusive lock: taking each once
            // waits out any punch that started before the flag was set.
            drop(lock.write());
        }
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

    /// The handle of the frame slot `slot` holds; 0 when free. Panics if `slot ≥ slots`.
    pub fn owner(&self, slot: usize) -> u64 {
        self.owner_word(slot).load(Ordering::SeqCst)
    }

    /// Writes `bytes` at `offset` into slot `slot` if frame `owner` still holds it and
    /// it is not fenced — the protocol of [`ShmMapping::write`], for the backup's own
    /// writers. A slot past the end is [`FrameWriteError::OutOfBounds`].
    pub fn write(
        &self,
        slot: usize,
        owner: u64,
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
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        let len = len.min(self.slot_capacity);
        self.map
            .copy_out(self.slot_offset(slot) + SLOT_HEADER_BYTES, len as usize)
    }
}

impl Drop for FrameFile {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove the frame file");
        }
    }
}

/// Takes an exclusive, non-blocking `flock` on `file`; `WouldBlock` names the holder.
fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    // SAFETY: FFI on an open descriptor.
    let result = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if result == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.kind() == io::ErrorKind::WouldBlock {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("frame file {} is in use by another backup", path.display()),
        ));
    }
    Err(error)
}

/// Tries of the lock check in [`FrameFile::create`] before a file counts as held.
const LOCK_ATTEMPTS: u32 = 10;

/// Removes the frame files in `dir` whose names start with `prefix` (temporary `.new`
/// files excepted) that no live backup holds: a backup killed with SIGKILL cannot remove
/// its own, and each keeps the pages its open frames had written. A file is removed only
/// while this call holds its `flock`, so a file whose backup runs is never touched.
/// Returns the removed paths; errors on single files are skipped.
pub fn remove_stale_frame_files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(prefix) || name.contains('.') {
            continue;
        }
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if lock_exclusive(&file, &path).is_ok() && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// A master's mapping of a backup's frame file: the `shm` transport. See the
/// [module doc](self).
#[derive(Debug)]
pub struct ShmMapping {
    path: PathBuf,
    map: Mapping,
}

impl ShmMapping {
    /// Opens the frame file at `path` read-write and maps all of it (`MAP_SHARED`).
    pub fn open(path: &Path) -> io::Result<ShmMapping> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        let map = Mapping::map(&file, len).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("cannot map frame file {}: {error}", path.display()),
            )
        })?;
        Ok(ShmMapping {
            path: path.to_path_buf(),
            map,
        })
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes mapped (the file's size when opened).
    pub fn len_bytes(&self) -> u64 {
        self.map.len
    }

    /// Writes `bytes` at `offset` into the frame whose slot header is at `slot_offset`
    /// (of `slot_capacity` data bytes), if frame `owner` still holds the slot and it is
    /// not fenced; `Ok` means the write may be acknowledged. The protocol is the module
    /// doc's. `slot_offset`/`slot_capacity` come from the backup's `OpenReplica` reply
    /// and are checked against the mapping.
    pub fn write(
        &self,
        slot_offset: u64,
        slot_capacity: u32,
        owner: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FrameWriteError> {
        self.map
            .write_slot(slot_offset, slot_capacity, owner, offset, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tempfile::TempDir;

    const CAPACITY: u32 = 64 * 1024;

    fn frame_file(dir: &TempDir, slots: usize, capacity: u32) -> FrameFile {
        FrameFile::create(&dir.path().join("frames"), slots, capacity).expect("create")
    }

    #[test]
    fn a_write_through_a_mapping_is_visible_in_the_frame_file() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 3, CAPACITY);
        file.assign(1, 42);
        let mapping = ShmMapping::open(file.path()).expect("map");
        assert_eq!(mapping.len_bytes(), 3 * file.slot_offset(1));
        let data: Vec<u8> = (0..100u8).collect();
        mapping
            .write(file.slot_offset(1), file.slot_capacity(), 42, 10, &data)
            .expect("write");
        let read = file.read(1, 200);
        assert_eq!(&read[10..110], &data[..]);
        assert!(read[..10].iter().chain(&read[110..]).all(|&b| b == 0));
        // Neighbouring slots are untouched.
        assert!(file.read(0, CAPACITY).iter().all(|&b| b == 0));
        assert!(file.read(2, CAPACITY).iter().all(|&b| b == 0));
        // The backup's own writers use the same protocol.
        file.write(1, 42, 0, b"head").expect("in-process write");
        assert_eq!(&file.read(1, 4)[..], b"head");
        // Reads clamp to the capacity.
        assert_eq!(file.read(1, u32::MAX).len(), CAPACITY as usize);
    }

    #[test]
    fn writes_out_of_bounds_to_a_wrong_owner_or_a_fenced_slot_are_refused() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(0, 7);
        let mapping = ShmMapping::open(file.path()).expect("map");
        let at = file.slot_offset(0);
        let cap = file.slot_capacity();
        mapping
            .write(at, cap, 7, u64::from(CAPACITY) - 4, b"edge")
            .expect("fits exactly");
        for (offset, len) in [(u64::from(CAPACITY) - 3, 4), (u64::MAX, 1)] {
            let error = mapping
                .write(at, cap, 7, offset, &vec![1; len])
                .expect_err("past the end");
            assert!(
                matches!(error, FrameWriteError::OutOfBounds { capacity, .. } if capacity == u64::from(CAPACITY)),
                "{error:?}"
            );
        }
        // A slot outside the mapping, or misaligned, or claiming too much capacity.
        let total = mapping.len_bytes();
        for (slot_offset, capacity) in
            [(total, 0), (u64::MAX - 8, 16), (at + 4, 16), (at, u32::MAX)]
        {
            let error = mapping
                .write(slot_offset, capacity, 7, 0, b"x")
                .expect_err("bad slot");
            assert!(
                matches!(error, FrameWriteError::OutOfBounds { capacity: 0, .. }),
                "{slot_offset} {capacity}: {error:?}"
            );
        }
        assert!(matches!(
            file.write(2, 7, 0, b"x"),
            Err(FrameWriteError::OutOfBounds { capacity: 0, .. })
        ));
        // Wrong owner, free slot: nothing is copied.
        assert!(matches!(
            mapping.write(at, cap, 8, 0, b"thief"),
            Err(FrameWriteError::FrameGone)
        ));
        assert!(matches!(
            mapping.write(file.slot_offset(1), cap, 0, 0, b"free"),
            Err(FrameWriteError::FrameGone)
        ));
        assert!(file.read(0, 5).iter().all(|&b| b == 0));
        // Fenced: refused before copying.
        assert!(!file.is_fenced(0));
        file.fence(0);
        assert!(file.is_fenced(0));
        assert!(matches!(
            mapping.write(at, cap, 7, 0, b"late"),
            Err(FrameWriteError::Fenced)
        ));
        assert!(matches!(
            file.write(0, 7, 0, b"late"),
            Err(FrameWriteError::Fenced)
        ));
        assert!(file.read(0, 4).iter().all(|&b| b == 0));
        assert_eq!(file.owner(0), 7);
    }

    #[test]
    fn assign_zeroes_the_data_and_clears_the_fence() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(0, 1);
        let full = vec![0xAB; CAPACITY as usize];
        file.write(0, 1, 0, &full).expect("fill");
        file.fence(0);
        // Re-assigning an owned, fenced slot (no release in between) still zeroes it.
        file.assign(0, 2);
        assert_eq!(file.owner(0), 2);
        assert!(!file.is_fenced(0));
        assert!(file.read(0, CAPACITY).iter().all(|&b| b == 0));
        file.write(0, 2, 0, b"ok").expect("write to the new owner");
        assert!(matches!(
            file.write(0, 1, 0, b"old"),
            Err(FrameWriteError::FrameGone)
        ));
    }

    #[test]
    fn release_then_assign_gives_a_zeroed_slot() {
        let dir = TempDir::new().expect("tempdir");
        // A capacity that is not a page multiple, so both the header's page (memset) and
        // whole pages (hole punched) are exercised.
        let capacity = 3 * 4096 + 100;
        let file = frame_file(&dir, 2, capacity);
        file.assign(1, 5);
        file.write(1, 5, 0, &vec![0xCD; capacity as usize])
            .expect("fill");
        file.release(1);
        assert_eq!(file.owner(1), 0);
        assert!(matches!(
            file.write(1, 5, 0, b"x"),
            Err(FrameWriteError::FrameGone)
        ));
        assert!(file.read(1, capacity).iter().all(|&b| b == 0));
        file.assign(1, 6);
        assert!(file.read(1, capacity).iter().all(|&b| b == 0));
        assert_eq!(file.owner(1), 6);
        assert_eq!(file.owner(0), 0);
    }

    #[test]
    fn create_refuses_bad_sizes_and_a_file_held_by_a_live_backup_and_drop_removes_it() {
        let dir = TempDir::new().expect("tempdir");
        let path = dir.path().join("frames");
        let error = FrameFile::create(&path, 0, CAPACITY).expect_err("no slots");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let error = FrameFile::create(&path, usize::MAX, u32::MAX).expect_err("too large");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("exceed the limit"), "{error}");

        let file = FrameFile::create(&path, 1, CAPACITY).expect("create");
        assert!(file.path().is_absolute());
        let error = FrameFile::create(&path, 1, CAPACITY).expect_err("in use");
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        // The live backup's file is intact.
        file.assign(0, 1);
        file.write(0, 1, 0, b"still here").expect("write");
        drop(file);
        assert!(!path.exists());
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("list").count(),
            0,
            "no temporary file left behind"
        );
    }

    #[test]
    fn create_replaces_a_dead_backups_file_without_truncating_it_under_its_mappings() {
        let dir = TempDir::new().expect("tempdir");
        let path = dir.path().join("frames");
        let old = FrameFile::create(&path, 2, CAPACITY).expect("create");
        old.assign(1, 9);
        let old_slot = old.slot_offset(1);
        let mapping = ShmMapping::open(&path).expect("map");
        // A killed backup leaves its file behind, and the kernel drops its lock.
        // SAFETY: FFI on the frame file's open descriptor.
        assert_eq!(
            unsafe { libc::flock(old.file.as_raw_fd(), libc::LOCK_UN) },
            0
        );
        std::mem::forget(old);
        let new = FrameFile::create(&path, 1, 100).expect("replace");
        // The master's mapping still holds the old, full-sized file: no SIGBUS.
        mapping
            .write(old_slot, CAPACITY, 9, u64::from(CAPACITY) - 8, b"old file")
            .expect("the old mapping keeps working");
        assert!(new.read(0, 100).iter().all(|&b| b == 0));
        let remapped = ShmMapping::open(&path).expect("map the new file");
        assert_eq!(remapped.len_bytes(), page_bytes());
    }

    /// Dekker: a writer loop and a fencer race; every write acknowledged to the writer
    /// must be visible to the fencer's scan after its fence. Without the check after the
    /// copy (step 4 of the protocol) the write in flight when the fence lands is
    /// acknowledged yet missed by the scan, and this test fails (checked by removing it).
    #[test]
    fn every_write_acknowledged_around_a_fence_is_seen_by_the_scan_after_it() {
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
                match mapping.write(slot_offset, capacity, owner, offset, pattern) {
                    Ok(()) => acked.push(region),
                    Err(FrameWriteError::Fenced) => break,
                    Err(error) => panic!("unexpected {error:?}"),
                }
            }
        };
        // How long an unfenced pass into a fresh frame takes (the fastest of a few): the
        // fence lands uniformly inside it.
        let pass_nanos = (0..5)
            .map(|_| {
                file.assign(0, u64::MAX);
                let started = std::time::Instant::now();
                write_all(u64::MAX, &mut Vec::new());
                started.elapsed().as_nanos().max(1) as u64
            })
            .min()
            .unwrap_or(1);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64 | 1)
            .unwrap_or(1);
        eprintln!("dekker seed {seed}, pass {pass_nanos} ns");
        let mut rng = seed;
        let mut fenced_mid_pass = 0;
        for owner in 1..=ROUNDS {
            file.assign(0, owner);
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
                file.fence(0);
                // The scan: each region's tail (its commit marker), last region first,
                // so it reaches a region still being copied as early as possible.
                let base = slot_offset + SLOT_HEADER_BYTES;
                let mut scan = vec![[0u8; TAIL_BYTES]; REGIONS];
                for region in (0..REGIONS).rev() {
                    let tail_at = base + ((region + 1) * REGION_BYTES - TAIL_BYTES) as u64;
                    // SAFETY: inside the slot's data; only this thread reads it, the
                    // writer's concurrent stores are the race under test.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            file.map.base.as_ptr().add(tail_at as usize),
                            scan[region].as_mut_ptr(),
                            TAIL_BYTES,
                        );
                    }
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
                     the scan after the fence saw {:?}",
                    scan[region]
                );
            }
        }
        eprintln!("{fenced_mid_pass} of {ROUNDS} rounds fenced the writer mid-pass");
    }

    #[test]
    fn only_frame_files_no_backup_holds_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live =
            FrameFile::create(&dir.path().join("rampart-frames-live"), 1, 4096).expect("create");
        std::fs::write(
            dir.path().join("rampart-frames-dead"),
            b"left by a killed backup",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("rampart-frames-x.123.new"),
            b"being created",
        )
        .expect("write");
        std::fs::write(dir.path().join("other"), b"not ours").expect("write");
        let removed = remove_stale_frame_files(dir.path(), "rampart-frames-");
        assert_eq!(removed, vec![dir.path().join("rampart-frames-dead")]);
        assert!(live.path().exists());
        assert!(dir.path().join("rampart-frames-x.123.new").exists());
        assert!(dir.path().join("other").exists());
    }
}
