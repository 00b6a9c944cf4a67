//! [`Mapping`]: the `mmap` wrapper every side of the frame file goes through, and all
//! of its `unsafe` — mapping, populating and allocating the file's memory, the atomic
//! header words, raw copies in and out, and the write protocol's one implementation
//! ([`Mapping::write_slot`]). "The module doc" below is the `shm` overview (`mod.rs`).

use super::header::{FENCE_WORD_OFFSET, OWNER_WORD_OFFSET, SLOT_HEADER_BYTES, WORD_ALIGN_BYTES};
use crate::ids::FrameHandle;
use crate::onesided::{FrameWriteError, TAIL_BYTES};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{self, AtomicU64, Ordering};

/// `statfs` type of a memory file system (`tmpfs`, Linux's `TMPFS_MAGIC`).
#[cfg(target_os = "linux")]
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// How [`Mapping::populate`] maps pages of `file` in (module doc: "populated as it
/// goes").
#[cfg(target_os = "linux")]
pub(super) fn populate_advice(file: &File) -> libc::c_int {
    // SAFETY: fstatfs fills the zeroed struct it is given, from our own open descriptor.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let result = unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) };
    // `f_type` is an `i64` on x86-64 but narrower on other targets.
    #[allow(clippy::useless_conversion)]
    let memory = result == 0 && i64::from(fs.f_type) == TMPFS_MAGIC;
    if memory {
        libc::MADV_POPULATE_READ
    } else {
        libc::MADV_POPULATE_WRITE
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn populate_advice(_file: &File) -> libc::c_int {
    0
}

/// `mmap` flag: fault the whole mapping in at once (Linux); elsewhere pages fault in on
/// first access.
#[cfg(target_os = "linux")]
const MAP_POPULATE: libc::c_int = libc::MAP_POPULATE;
#[cfg(not(target_os = "linux"))]
const MAP_POPULATE: libc::c_int = 0;

/// A `MAP_SHARED`, read-write mapping of a whole file; unmapped on drop.
#[derive(Debug)]
pub(super) struct Mapping {
    /// Start of the mapping (page-aligned, as `mmap` returns it).
    pub(super) base: NonNull<u8>,
    /// Its length in bytes. Invariant: > 0, fits in `usize`, and the mapped file is at
    /// least this long for the mapping's life (no one truncates it: module doc).
    pub(super) len: u64,
}

// SAFETY: `Mapping` is a pointer to shared memory that every holder accesses only by
// atomics (header words) or by raw copies whose races are part of the protocol (module
// doc "Memory model"); nothing about it is tied to the thread that created it.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` gives no access that is not already shared with other
// processes.
unsafe impl Sync for Mapping {}

/// Whether a new mapping's pages are faulted in (and, for a file's holes, allocated) by
/// `mmap` itself, once, rather than one page fault at a time by their first access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Populate {
    Yes,
    No,
}

/// Allocates every byte of `file`'s first `len` bytes (`fallocate`), so that the memory
/// exists before anyone maps it: a memory file system that is too small says so here
/// (`StorageFull`), not by a `SIGBUS` on a later write through a mapping. A file system
/// that cannot allocate ahead (`EOPNOTSUPP`) is left sparse.
#[cfg(target_os = "linux")]
pub(super) fn allocate(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| invalid_input(format!("a file of {len} bytes is too large")))?;
    // SAFETY: FFI on our own open descriptor; mode 0 only allocates (the file is at
    // least `len` long already, so its size does not change).
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if result == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Ok(()),
        _ => Err(io::Error::new(
            error.kind(),
            format!("cannot allocate the frame file's {len} bytes: {error}"),
        )),
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn allocate(_file: &File, _len: u64) -> io::Result<()> {
    Ok(())
}

impl Mapping {
    /// Maps the first `len` bytes of `file`, which must be at least that long.
    pub(super) fn map(file: &File, len: u64, populate: Populate) -> io::Result<Mapping> {
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
                match populate {
                    Populate::Yes => libc::MAP_SHARED | MAP_POPULATE,
                    Populate::No => libc::MAP_SHARED,
                },
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
    pub(super) fn word(&self, at: u64) -> Option<&AtomicU64> {
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
    pub(super) fn copy_in(&self, at: u64, bytes: &[u8]) {
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

    /// Panics unless `len` bytes at byte `at` lie inside the mapping.
    fn assert_inside(&self, at: u64, len: usize) {
        let end = at.checked_add(len as u64);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "read of {len} bytes at {at} passes the mapping's end ({})",
            self.len
        );
    }

    /// Copies `len` bytes at byte `at` to `target`. Panics if the range is not inside
    /// the mapping. Bytes a peer is writing meanwhile may be read torn (module doc
    /// "Memory model").
    ///
    /// # Safety
    /// `target` must be valid for writes of `len` bytes and must not overlap the
    /// mapping.
    unsafe fn copy_out_raw(&self, at: u64, target: *mut u8, len: usize) {
        self.assert_inside(at, len);
        // SAFETY: the source lies inside the mapping (checked above); the caller
        // vouches for the target, memory of its own, which cannot overlap a mapping we
        // never hand out references into.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(at as usize), target, len);
        }
    }

    /// A copy of `len` bytes at byte `at`. Panics if the range is not inside the
    /// mapping.
    pub(super) fn copy_out(&self, at: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.copy_out_into(at, len, &mut out);
        out
    }

    /// Replaces `out`'s contents with a copy of `len` bytes at byte `at`, reusing its
    /// capacity and writing each byte once (no zeroing first). Panics if the range is not
    /// inside the mapping.
    pub(super) fn copy_out_into(&self, at: u64, len: usize, out: &mut Vec<u8>) {
        // Before reserving: an out-of-range `len` panics here rather than allocating.
        self.assert_inside(at, len);
        out.clear();
        out.reserve(len);
        // SAFETY: `out` has room for `len` bytes; `set_len` follows the copy that
        // initialised them (the copy panics before writing if the range is outside).
        unsafe {
            self.copy_out_raw(at, out.as_mut_ptr(), len);
            out.set_len(len);
        }
    }

    /// Fills `out` with a copy of the bytes from byte `at`. Panics if the range is not
    /// inside the mapping.
    pub(super) fn copy_out_to(&self, at: u64, out: &mut [u8]) {
        // SAFETY: `out` is valid for writes of its length.
        unsafe { self.copy_out_raw(at, out.as_mut_ptr(), out.len()) }
    }

    /// Sets `len` bytes at byte `at` to zero. Panics if the range is not inside the
    /// mapping.
    pub(super) fn fill_zero(&self, at: u64, len: u64) {
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
    pub(super) fn write_slot(
        &self,
        slot_offset: u64,
        slot_capacity: u32,
        owner: FrameHandle,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FrameWriteError> {
        let owner = owner.0; // as the owner word holds it
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

impl Mapping {
    /// Maps in the pages of bytes `at..at + len` (`madvise` with `advice`, one of the
    /// `MADV_POPULATE_*`), ignoring failure: a page not mapped in now faults in at its
    /// first access.
    #[cfg(target_os = "linux")]
    pub(super) fn populate(&self, at: u64, len: u64, advice: libc::c_int) {
        let page = page_bytes();
        let start = at / page * page;
        let end = at.saturating_add(len).min(self.len);
        if start >= end {
            return;
        }
        // SAFETY: `start..end` lies inside the mapping (`end ≤ len`, `start` rounded
        // down to a page from a smaller `at`), which lives as long as `&self`; populating
        // reads nothing into Rust-visible memory and changes no byte.
        let result = unsafe {
            libc::madvise(
                self.base.as_ptr().add(start as usize).cast(),
                (end - start) as usize,
                advice,
            )
        };
        if result != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "cannot populate a frame file mapping");
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn populate(&self, _at: u64, _len: u64, _advice: libc::c_int) {}
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
pub(super) fn page_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

pub(super) fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Opens the file at `path` read-write and maps all of it (`MAP_SHARED`); errors name
/// the path.
pub(super) fn map_whole_file(path: &Path, populate: Populate) -> io::Result<(File, Mapping)> {
    let context = |error: io::Error| {
        io::Error::new(
            error.kind(),
            format!("cannot map frame file {}: {error}", path.display()),
        )
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(context)?;
    let len = file.metadata().map_err(context)?.len();
    let map = Mapping::map(&file, len, populate).map_err(context)?;
    Ok((file, map))
}
