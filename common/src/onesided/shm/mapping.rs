//! [`Mapping`]: the mapping every side of the frame file goes through, and all of its
//! `unsafe` — the atomic header words and the raw copies in and out — with the write
//! protocol's one implementation ([`Mapping::write_slot`]). Mapping, populating and
//! unmapping are `memmap2`'s ([`MmapRaw`]), allocating and the file-system check
//! `rustix`'s: no `unsafe` of ours. "The module doc" below is the `shm` overview
//! (`mod.rs`).

use super::header::{FENCE_WORD_OFFSET, OWNER_WORD_OFFSET, SLOT_HEADER_BYTES, WORD_ALIGN_BYTES};
use crate::ids::FrameHandle;
use crate::onesided::{FrameWriteError, TAIL_BYTES};
use memmap2::{Advice, MmapOptions, MmapRaw};
use std::fs::{File, OpenOptions};
use std::io;
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::atomic::{self, AtomicU64, Ordering};

/// `statfs` type of a memory file system (`tmpfs`, Linux's `TMPFS_MAGIC`).
#[cfg(target_os = "linux")]
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// How [`Mapping::populate`] maps pages of `file` in (module doc: "populated as it
/// goes"): `MADV_POPULATE_READ` in a memory file system, `MADV_POPULATE_WRITE` on a
/// disk's; `None` off Linux. A kernel before 5.14 refuses both, and
/// [`Mapping::populate`] only logs that.
#[cfg(target_os = "linux")]
pub(super) fn populate_advice(file: &File) -> Option<Advice> {
    // `f_type` is an `i64` on x86-64 but narrower on other targets.
    #[allow(clippy::useless_conversion)]
    let memory = rustix::fs::fstatfs(file).is_ok_and(|fs| i64::from(fs.f_type) == TMPFS_MAGIC);
    Some(if memory {
        Advice::PopulateRead
    } else {
        Advice::PopulateWrite
    })
}

#[cfg(not(target_os = "linux"))]
pub(super) fn populate_advice(_file: &File) -> Option<Advice> {
    None
}

/// A `MAP_SHARED`, read-write mapping of a whole file (`memmap2`'s [`MmapRaw`], from
/// offset 0); unmapped on drop. `Send` and `Sync` as [`MmapRaw`] is: every holder
/// accesses the memory only by atomics (header words) or by raw copies whose races are
/// part of the protocol (module doc "Memory model").
#[derive(Debug)]
pub(super) struct Mapping {
    /// The mapping: its start is page-aligned (`mmap`'s result, offset 0), and it stays
    /// mapped until this drops.
    raw: MmapRaw,
    /// Its length in bytes, `raw.len()`. Invariant: > 0, fits in `usize`, and the mapped
    /// file is at least this long for the mapping's life (no one truncates it: module
    /// doc).
    pub(super) len: u64,
}

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
    use rustix::fs::FallocateFlags;
    use rustix::io::Errno;
    // `fallocate` takes a signed `off_t`.
    if i64::try_from(len).is_err() {
        return Err(invalid_input(format!("a file of {len} bytes is too large")));
    }
    // Mode 0 only allocates (the file is at least `len` long already, so its size does
    // not change).
    match rustix::fs::fallocate(file, FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(errno) if errno == Errno::OPNOTSUPP => Ok(()),
        Err(errno) => {
            let error = io::Error::from(errno);
            Err(io::Error::new(
                error.kind(),
                format!("cannot allocate the frame file's {len} bytes: {error}"),
            ))
        }
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
        // `PROT_READ | PROT_WRITE`, `MAP_SHARED`, plus `MAP_POPULATE` (Linux; elsewhere
        // pages fault in on first access) when asked, at offset 0 of the file.
        let mut options = MmapOptions::new();
        options.len(len_usize);
        if populate == Populate::Yes {
            options.populate();
        }
        let raw = options.map_raw(file)?;
        Ok(Mapping { raw, len })
    }

    /// Maps all `len` bytes of `file` (at least that long) read-only: every write
    /// through it faults. Only loads and copies out may use it.
    pub(super) fn map_read_only(file: &File, len: u64) -> io::Result<Mapping> {
        let len_usize = usize::try_from(len).map_err(|_| {
            invalid_input(format!(
                "a mapping of {len} bytes does not fit in the address space"
            ))
        })?;
        if len == 0 {
            return Err(invalid_input("cannot map an empty file".to_string()));
        }
        let raw = MmapOptions::new().len(len_usize).map_raw_read_only(file)?;
        Ok(Mapping { raw, len })
    }

    /// Start of the mapping (page-aligned). Valid for `len` bytes while `self` lives.
    #[inline]
    pub(super) fn base(&self) -> *mut u8 {
        self.raw.as_mut_ptr()
    }

    /// The atomic word at byte `at`, or `None` if it is not inside the mapping or not
    /// 8-byte aligned.
    pub(super) fn word(&self, at: u64) -> Option<&AtomicU64> {
        if at % WORD_ALIGN_BYTES != 0 || at.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `at + 8 ≤ len`, so the 8 bytes lie inside the mapping, which stays
        // mapped as long as `&self` (its `MmapRaw` unmaps it only when dropped); `base`
        // is page-aligned and `at` a multiple of 8, so the pointer is aligned for
        // `AtomicU64`, which has the layout of `u64`. Every process accesses header
        // words only atomically (module doc), and an `AtomicU64` may be mutated through a
        // shared reference.
        Some(unsafe { &*self.base().add(at as usize).cast::<AtomicU64>() })
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
                self.base().add(at as usize),
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

    /// Fills `out` with a copy of the bytes from byte `at`. Panics if the range is not
    /// inside the mapping. Bytes a peer is writing meanwhile may be read torn (module
    /// doc "Memory model").
    fn copy_out_uninit(&self, at: u64, out: &mut [MaybeUninit<u8>]) {
        self.assert_inside(at, out.len());
        // SAFETY: the source lies inside the mapping (checked above); the target is
        // `out`, valid for writes of its length (any bytes are valid `MaybeUninit<u8>`),
        // and a Rust slice cannot overlap a mapping we never hand out references into.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base().add(at as usize),
                out.as_mut_ptr().cast::<u8>(),
                out.len(),
            );
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
        self.copy_out_uninit(at, &mut out.spare_capacity_mut()[..len]);
        // SAFETY: `out` has room for `len` bytes (reserved above), all of them
        // initialised by the copy just made.
        unsafe { out.set_len(len) };
    }

    /// Appends to `out` a copy of `len` bytes at byte `at`, writing each byte once.
    /// Panics if the range is not inside the mapping.
    pub(super) fn append_out(&self, at: u64, len: usize, out: &mut Vec<u8>) {
        self.assert_inside(at, len);
        let start = out.len();
        out.reserve(len);
        self.copy_out_uninit(at, &mut out.spare_capacity_mut()[..len]);
        // SAFETY: `out` has room for `len` more bytes (reserved above), all of them
        // initialised by the copy just made.
        unsafe { out.set_len(start + len) };
    }

    /// Fills `out` with a copy of the bytes from byte `at`. Panics if the range is not
    /// inside the mapping.
    pub(super) fn copy_out_to(&self, at: u64, out: &mut [u8]) {
        self.assert_inside(at, out.len());
        // SAFETY: the source lies inside the mapping (checked above); `out` is valid for
        // writes of its length, and a Rust slice cannot overlap a mapping we never hand
        // out references into.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base().add(at as usize),
                out.as_mut_ptr(),
                out.len(),
            );
        }
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
            std::ptr::write_bytes(self.base().add(at as usize), 0, len as usize);
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
    /// `MADV_POPULATE_*`; nothing without one), ignoring failure: a page not mapped in
    /// now faults in at its first access.
    pub(super) fn populate(&self, at: u64, len: u64, advice: Option<Advice>) {
        let Some(advice) = advice else {
            return;
        };
        let page = page_bytes();
        let start = at / page * page;
        let end = at.saturating_add(len).min(self.len);
        if start >= end {
            return;
        }
        // `start..end` lies inside the mapping (`end ≤ len`, `start` rounded down to a
        // page from a smaller `at`), and `start` is page-aligned, as `madvise` wants it.
        if let Err(error) = self
            .raw
            .advise_range(advice, start as usize, (end - start) as usize)
        {
            tracing::debug!(%error, "cannot populate a frame file mapping");
        }
    }
}

/// The system's page size.
pub(super) fn page_bytes() -> u64 {
    rustix::param::page_size() as u64
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
