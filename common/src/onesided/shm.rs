//! The `shm` transport: a backup's frames in a shared-memory *frame file* that masters on
//! the same host map and copy into (DESIGN.md §5 "One-sided writes", "Backups").
//!
//! * [`FrameFile`] — the backup's side. It creates the file with all its memory allocated
//!   and mapped (the backup's pool of frames), hands its slots to frames, zeroed
//!   ([`FrameFile::assign`]) or, for a frame replacing one of the same replica, keeping
//!   their bytes ([`FrameFile::assign_keeping_data`]), fences them for recovery
//!   ([`FrameFile::fence`]), reads them back and frees them for the next frame
//!   ([`FrameFile::release`]). It also serves the backup's own writers (the `rpc`
//!   handler and the soft-NIC) with the same protocol as a master's.
//! * [`FrameFile::read_back`] — what a killed backup left: the frames its file still
//!   holds ([`LeftFrames`]), read by the backup restarted on the same data directory
//!   before it replaces the file.
//! * [`ShmMapping`] — the master's side: a mapping of a backup's frame file, and
//!   [`ShmMapping::write`], the one-sided write.
//!
//! # Layout
//! The file starts with a one-page *file header*, written before the file gets its name
//! and never changed:
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | magic `RMPFRAME` |
//! | 8      | 4    | format version (2) |
//! | 12     | 4    | tag length in bytes (≤ one page − 64) |
//! | 16     | 8    | slots |
//! | 24     | 8    | slot capacity in data bytes |
//! | 32     | 8    | stride |
//! | 64     | tag length | the *tag*: who owns the file (a backup's data directory) |
//!
//! Then `slots` slots of equal *stride* (the slot's header plus its capacity, rounded up
//! to the page size, so that every slot header is page-aligned).
//! A slot starts with a [`SLOT_HEADER_BYTES`]-byte header:
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | fence word, `AtomicU64`: 0 open, non-zero fenced |
//! | 8      | 8    | owner, `AtomicU64`: the handle of the frame the slot holds, 0 free, [`SEALED_OWNER`] sealed |
//! | 16     | 8    | the frame's master (server id) |
//! | 24     | 8    | the frame's segment id |
//! | 32     | 8    | the frame's epoch |
//! | 40     | 8    | the frame's capacity in bytes (≤ the slot's) |
//! | 48     | 8    | fenced length + 1: the valid prefix the first fence reported; 0 none |
//! | 56     | 8    | reserved (zero) |
//!
//! and the frame's data follows at offset [`SLOT_HEADER_BYTES`]. The *label* words
//! (16–55, [`SlotLabel`]) are written only by the backup, before the owner word (assign)
//! or before it answers the request that changed them (a new epoch, a fence), so that
//! a file whose backup was killed says what each held slot is. The header words are
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
//! * **The file is a pool of touched memory.** [`FrameFile::create`] allocates all of
//!   it (`fallocate`) and maps it populated (`MAP_POPULATE`), once, at start-up; slots
//!   are recycled, never returned to the kernel. A slot is zeroed in place when it is
//!   assigned (`memset`, ≈ 0.4 ms per 8 MiB of touched memory), not when it is
//!   released: until then a released slot keeps the bytes of its last frame (the backup
//!   serves a flushed replica from them), and whatever a late writer put there after
//!   the release (below) is wiped too. Fresh memory would cost a page fault and the zeroing of every 4 KiB page
//!   on the write path instead (1.2–1.6 GB/s on the development VM, ≈ 6 ms per 8 MiB
//!   frame, paid by the master's one-sided copy); the price is that the backup holds
//!   `slots × stride` bytes from its start, and a `/dev/shm` too small for them fails
//!   the start with a clear error instead of a master's `SIGBUS` later.
//! * **One exception to the zeroing: a replica's own slot.** When a master re-creates
//!   the open replica of a segment at a newer epoch on the backup that holds it (it took
//!   the backup for failed), the new frame takes the old one's slot straight from it,
//!   never released, with [`FrameFile::assign_keeping_data`]. Every copy of a segment is
//!   a prefix of the one append-only stream its master writes, so the old bytes and the
//!   new fill agree wherever both exist; zeroing would leave the backup holding only
//!   the new fill — less than the acknowledged bytes it held — if the master crashes
//!   before the fill catches up. The valid-prefix scan still ends where the stream's
//!   bytes end. A released slot is always zeroed at its next assign.
//! * The backup's own writers ([`FrameFile::write`]) hold the slot's lock from their
//!   owner check to their final check, and [`FrameFile::assign`],
//!   [`FrameFile::assign_keeping_data`] and [`FrameFile::release`] take it exclusively,
//!   so an in-process write never lands in a slot after it changed hands.
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
//! * **Frames outlive their backup.** The file is the backups' non-volatile buffer
//!   (DESIGN.md §5): dropping a [`FrameFile`] removes it only when no slot is held (else
//!   it keeps the file, giving the free slots' memory back to the kernel), and a killed
//!   backup's file stays, all of its memory with it, until the backup restarts on its
//!   data directory or a start-up sweep finds that directory gone (next section). The
//!   backup restarted on the same data directory reads
//!   it back ([`FrameFile::read_back`], under the file's lock), stores what the held
//!   slots hold, and only then replaces the file. A host that loses power loses the
//!   file (it lives in memory, `/dev/shm`): only what was flushed to the store survives.
//! * [`FrameFile::create`] takes an exclusive `flock` on its file and refuses a path
//!   whose file another live backup holds.
//!
//! # A file outlives its backup only while a cold start needs it
//! A frame file is 512 MiB of memory by default, resident in `/dev/shm` until removed,
//! so every way a backup ends must leave the file only when a backup restarted on the
//! same data directory would read something back from it — that is, when a slot is
//! *held* (owner word non-zero: [`FrameFile::read_back`] reads those and nothing else).
//! * **A graceful stop** ([`SealedFrames`]): once the backup takes no more requests, its
//!   server *seals* every held slot (owner word := [`SEALED_OWNER`], then a SeqCst
//!   fence), writes every open frame to its store, and, if all of them were written,
//!   *releases* the sealed slots (owner 0) and removes the file. Sealing is what makes
//!   the flush final: a writer — a master in another process, or the backup's own — whose
//!   check after its copy sees the sealed owner reports [`FrameWriteError::FrameGone`]
//!   and never acknowledges (the Dekker pair of the write protocol, with the owner word
//!   in the fence word's place), and one whose check came first wrote before the seal,
//!   visible to the flush's scan. Without the seal, a master's shared-memory write
//!   acknowledged between the flush and the process's exit (its check is that the
//!   backup's process still runs) would be in the frame file only, and lost with it. A
//!   sealed slot stays held: if anything could not be written, the file stays and the
//!   restarted backup reads the sealed slots back like any killed backup's. So does a
//!   file that masters may write into by RDMA: the NIC places and acknowledges those
//!   writes without looking at the owner word, so no seal stops them.
//!   A sealed slot is not fenced, so a master writing to it learns only that the backup
//!   is gone (it asks the backup, which no longer answers) and re-creates the replica
//!   elsewhere, as after any backup crash; a fence would have stopped that master.
//! * **A kill** leaves the file with its held slots, for the restart.
//! * **A start-up sweep** ([`remove_stale_frame_files`], run by every server starting on
//!   the host) removes a file no live backup holds (its `flock` is free) whose data
//!   directory is gone, or which holds no frame (a graceful stop killed between its
//!   release and the removal, a backup killed with no frame open), and the temporary
//!   file of a [`FrameFile::create`] whose process died. A killed backup's file whose
//!   data directory still exists and whose slots are held is never removed: the cold
//!   start of that directory needs it, however long that takes. "Not locked by a live
//!   backup" alone is not enough to remove a file — a killed backup's is not locked
//!   either. The file's own header names its owner (the tag: the data directory's
//!   identity and path, written before the file has its name), so no side file can
//!   disagree with it. The sweep decides under the file's `flock` and removes only the
//!   file it locked: a running backup holds that lock from before its file has a name
//!   (the temporary file, named with its creator's pid) to its exit, so a backup
//!   starting beside the sweep never loses its file to it.
//!
//! Cost: a write is two `memcpy`s and two fences (≈ 100 µs per MiB at memory speed, ≈ 50
//! ns for a small batch); the backup's CPU does nothing.
//!
//! **A master's mapping is populated as it goes.** The backup's memory is touched (the
//! file is a pool), but a master's fresh mapping of it has no page-table entries: its
//! first write to each 4 KiB page takes a page fault, ≈ 0.4 ms per MiB on the
//! development VM, four times the copy itself. A recovery master that had written
//! nothing before paid that for every byte it re-replicated (11 % of all CPU in a 1 GiB
//! recovery, issue 12). Populating the whole mapping when it is opened would cost
//! 50 ms per 512 MiB file, most of it for slots this master never writes, so
//! [`ShmMapping::write`] populates the [`POPULATE_CHUNK_BYTES`] chunks it is about to
//! write the first time it meets them. In a memory file system (`/dev/shm`) that is
//! `MADV_POPULATE_READ`: the pages exist, so this only maps them, writable, with
//! fault-around, at ≈ 0.09 ms per MiB. A file on a disk's file system tracks dirty pages,
//! so a page mapped by a read still faults at its first write: there it is
//! `MADV_POPULATE_WRITE` (≈ 0.23 ms per MiB on tmpfs). A kernel without either (before
//! Linux 5.14) leaves the pages to fault in, as before.

use super::{FrameWriteError, TAIL_BYTES};
use crate::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use parking_lot::RwLock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{self, AtomicBool, AtomicU64, Ordering};

/// Bytes of a slot's header: the fence word at +0, the owner at +8, the rest reserved.
/// The frame's data follows. A cache line, so the header words never share one with data.
pub const SLOT_HEADER_BYTES: u64 = 64;

/// Where the fence word lies in a slot header.
const FENCE_WORD_OFFSET: u64 = 0;

/// Where the owner word lies in a slot header.
const OWNER_WORD_OFFSET: u64 = 8;

/// Where the label words lie in a slot header ([`SlotLabel`], module doc "Layout").
const MASTER_WORD_OFFSET: u64 = 16;
const SEGMENT_WORD_OFFSET: u64 = 24;
const EPOCH_WORD_OFFSET: u64 = 32;
const CAPACITY_WORD_OFFSET: u64 = 40;
/// The fenced length plus one; 0 while none was recorded.
const FENCED_LENGTH_WORD_OFFSET: u64 = 48;

/// The owner word of a *sealed* slot ([`SealedFrames`]): held, so a backup restarted on
/// the file reads it back, but by no frame, so every write to it fails its owner check.
/// No frame has this handle: backups draw their first handle below 2^62 and count up by
/// one (and [`FrameFile::assign`] refuses it).
pub const SEALED_OWNER: FrameHandle = FrameHandle(u64::MAX);

/// The unit in which a master's mapping is populated ahead of its writes (module doc).
pub const POPULATE_CHUNK_BYTES: u64 = 2 << 20;

/// `statfs` type of a memory file system (`tmpfs`, Linux's `TMPFS_MAGIC`).
#[cfg(target_os = "linux")]
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// How [`Mapping::populate`] maps pages of `file` in (module doc: "populated as it
/// goes").
#[cfg(target_os = "linux")]
fn populate_advice(file: &File) -> libc::c_int {
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
fn populate_advice(_file: &File) -> libc::c_int {
    0
}

/// First bytes of every frame file.
const FILE_MAGIC: [u8; 8] = *b"RMPFRAME";

/// `mmap` flag: fault the whole mapping in at once (Linux); elsewhere pages fault in on
/// first access.
#[cfg(target_os = "linux")]
const MAP_POPULATE: libc::c_int = libc::MAP_POPULATE;
#[cfg(not(target_os = "linux"))]
const MAP_POPULATE: libc::c_int = 0;

/// Version of the frame file format of the module doc. Files of another version are
/// unreadable to this one (version 1 had no file header and no slot labels).
const FILE_FORMAT_VERSION: u32 = 2;

/// Bytes of the file header before the tag.
const FILE_HEADER_FIXED_BYTES: u64 = 64;

/// Alignment the header words need (`AtomicU64`), hence of every slot offset.
const WORD_ALIGN_BYTES: u64 = 8;

/// Largest frame file, in bytes: the file is sparse and costs only address space until
/// written, but a misconfigured `slots × capacity` should fail at start-up with a clear
/// error rather than reserve absurd amounts of it (1 TiB holds 131072 frames of 8 MiB).
pub const FRAME_FILE_BYTES_MAX: u64 = 1 << 40;

const _: () = assert!(OWNER_WORD_OFFSET + 8 <= SLOT_HEADER_BYTES);
const _: () = assert!(FENCED_LENGTH_WORD_OFFSET + 8 <= SLOT_HEADER_BYTES);
const _: () = assert!(FENCE_WORD_OFFSET % WORD_ALIGN_BYTES == 0);
const _: () = assert!(OWNER_WORD_OFFSET % WORD_ALIGN_BYTES == 0);
const _: () = assert!(SLOT_HEADER_BYTES % WORD_ALIGN_BYTES == 0);

/// What a slot's header says of the frame it holds (module doc "Layout"): enough for a
/// backup restarted after a kill to tell which replica the bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLabel {
    /// The master whose log the frame copies.
    pub master: ServerId,
    /// The segment of that log.
    pub segment: SegmentId,
    /// The frame's epoch (Tailwind).
    pub epoch: Epoch,
    /// The frame's capacity in bytes (≤ the slot's).
    pub capacity: u32,
}

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

/// Whether a new mapping's pages are faulted in (and, for a file's holes, allocated) by
/// `mmap` itself, once, rather than one page fault at a time by their first access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Populate {
    Yes,
    No,
}

/// Allocates every byte of `file`'s first `len` bytes (`fallocate`), so that the memory
/// exists before anyone maps it: a memory file system that is too small says so here
/// (`StorageFull`), not by a `SIGBUS` on a later write through a mapping. A file system
/// that cannot allocate ahead (`EOPNOTSUPP`) is left sparse.
#[cfg(target_os = "linux")]
fn allocate(file: &File, len: u64) -> io::Result<()> {
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
fn allocate(_file: &File, _len: u64) -> io::Result<()> {
    Ok(())
}

impl Mapping {
    /// Maps the first `len` bytes of `file`, which must be at least that long.
    fn map(file: &File, len: u64, populate: Populate) -> io::Result<Mapping> {
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
    fn copy_out(&self, at: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.copy_out_into(at, len, &mut out);
        out
    }

    /// Replaces `out`'s contents with a copy of `len` bytes at byte `at`, reusing its
    /// capacity and writing each byte once (no zeroing first). Panics if the range is not
    /// inside the mapping.
    fn copy_out_into(&self, at: u64, len: usize, out: &mut Vec<u8>) {
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
    fn copy_out_to(&self, at: u64, out: &mut [u8]) {
        // SAFETY: `out` is valid for writes of its length.
        unsafe { self.copy_out_raw(at, out.as_mut_ptr(), out.len()) }
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
    fn populate(&self, at: u64, len: u64, advice: libc::c_int) {
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
    fn populate(&self, _at: u64, _len: u64, _advice: libc::c_int) {}
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
        let at = self.slot_offset(slot) + self.page_bytes;
        let len = self.stride.saturating_sub(self.page_bytes);
        let (Ok(at), Ok(len)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) else {
            return false;
        };
        // SAFETY: FFI on our own open descriptor; KEEP_SIZE never changes the file's
        // size, so no mapping of it can lose pages (a hole reads as zeroes).
        let result = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at,
                len,
            )
        };
        len > 0 && result == 0
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

/// A graceful stop's hold on its backup's own frame file, by path: the file's held slots
/// sealed, so that nothing written to them after [`SealedFrames::seal`] is ever
/// acknowledged (module doc, "A file outlives its backup only while a cold start needs
/// it"). The stopping server writes the open frames to its store, then either
/// [`releases`](SealedFrames::release) the sealed slots and
/// [`removes`](SealedFrames::remove) the file, or keeps it as it is for the restart.
///
/// It maps the file a second time (as a master does) rather than going through the
/// backup's [`FrameFile`]: the server that stops holds the backup, not its file, and
/// touches only the owner words, which every process accesses atomically.
#[derive(Debug)]
pub struct SealedFrames {
    /// As given to [`SealedFrames::seal`].
    path: PathBuf,
    /// The file mapped, to tell it from another at the same path before removing it.
    file: File,
    map: Mapping,
    header: FileHeader,
    page_bytes: u64,
    /// Slots held when sealed (each now [`SEALED_OWNER`] unless released since).
    sealed: Vec<usize>,
}

impl SealedFrames {
    /// Seals every held slot of the frame file at `path`: its owner word becomes
    /// [`SEALED_OWNER`], then a SeqCst fence. From then on no write to those slots is
    /// acknowledged by any writer that checks the owner word (`shm`, `rpc`, `tcp`; not
    /// `rdma`, whose NIC does not), and every write acknowledged before is visible to a
    /// read after this returns. Call it on the file of a backup that serves no more
    /// requests (an open after this would hand out a slot unsealed). Errors are the
    /// operating system's, or `InvalidData` for a file that is not a frame file of this
    /// format.
    pub fn seal(path: &Path) -> io::Result<SealedFrames> {
        let (file, map) = map_whole_file(path, Populate::No)?;
        let page = page_bytes();
        let header = FileHeader::read(&file, page).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame file {}: {why}", path.display()),
            )
        })?;
        let mut frames = SealedFrames {
            path: path.to_path_buf(),
            file,
            map,
            header,
            page_bytes: page,
            sealed: Vec::new(),
        };
        let mut held = Vec::new();
        for slot in 0..frames.header.slots {
            let word = frames.owner_word(slot);
            // The swap, not a store: a slot released meanwhile (a close ending) stays free.
            let mut owner = word.load(Ordering::SeqCst);
            while owner != 0 {
                match word.compare_exchange(
                    owner,
                    SEALED_OWNER.0,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => {
                        held.push(slot);
                        break;
                    }
                    Err(now) => owner = now,
                }
            }
        }
        // Dekker with the writers' final check (module doc, "Write protocol", step 4):
        // the owner words before this fence, the caller's reads of the data after it.
        atomic::fence(Ordering::SeqCst);
        frames.sealed = held;
        Ok(frames)
    }

    /// The owner word of `slot`. `FileHeader::read` checked that the file, hence the
    /// mapping, is as long as its slots.
    fn owner_word(&self, slot: usize) -> &AtomicU64 {
        let at = slot_offset(self.page_bytes, self.header.stride, slot) + OWNER_WORD_OFFSET;
        self.map
            .word(at)
            .expect("every slot lies inside the mapping: the header matched the file's length")
    }

    /// How many slots were held when sealed.
    pub fn count(&self) -> usize {
        self.sealed.len()
    }

    /// Frees the sealed slots (owner word [`SEALED_OWNER`] → 0): call it once every
    /// frame they held is in the store, and nothing else. A slot whose owner changed
    /// since it was sealed is left as it is.
    pub fn release(&self) {
        for &slot in &self.sealed {
            let _ = self.owner_word(slot).compare_exchange(
                SEALED_OWNER.0,
                0,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    /// Whether any slot of the file is held (sealed or not): then a restarted backup
    /// would read it back, and the file must stay.
    pub fn holds_frames(&self) -> bool {
        (0..self.header.slots).any(|slot| self.owner_word(slot).load(Ordering::SeqCst) != 0)
    }

    /// Removes the file if no slot is held and the path still names the file sealed;
    /// whether it did. A master that still maps the file keeps its pages until it
    /// unmaps them; its writes fail their owner check.
    pub fn remove(self) -> io::Result<bool> {
        if self.holds_frames() || !same_file(&self.file, &self.path) {
            return Ok(false);
        }
        std::fs::remove_file(&self.path)?;
        Ok(true)
    }
}

/// Byte offset of slot `slot`'s header in a file of `stride`-byte slots after a
/// `page`-byte file header (saturating past the end).
fn slot_offset(page: u64, stride: u64, slot: usize) -> u64 {
    (slot as u64).saturating_mul(stride).saturating_add(page)
}

/// A frame file's header (module doc "Layout").
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileHeader {
    slots: usize,
    slot_capacity: u32,
    stride: u64,
    tag: String,
}

impl FileHeader {
    /// The header's bytes: at most a page (the tag's length is checked by the caller).
    fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(FILE_HEADER_FIXED_BYTES as usize + self.tag.len());
        bytes.extend_from_slice(&FILE_MAGIC);
        bytes.extend_from_slice(&FILE_FORMAT_VERSION.to_ne_bytes());
        bytes.extend_from_slice(&(self.tag.len() as u32).to_ne_bytes());
        bytes.extend_from_slice(&(self.slots as u64).to_ne_bytes());
        bytes.extend_from_slice(&u64::from(self.slot_capacity).to_ne_bytes());
        bytes.extend_from_slice(&self.stride.to_ne_bytes());
        bytes.resize(FILE_HEADER_FIXED_BYTES as usize, 0);
        bytes.extend_from_slice(self.tag.as_bytes());
        bytes
    }

    /// Reads and checks the header of `file` (whose first `page` bytes hold it); the
    /// error says why it is not a frame file of this format.
    fn read(file: &File, page: u64) -> Result<FileHeader, String> {
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if len < page {
            return Err(format!("{len} bytes: shorter than its header"));
        }
        let mut bytes = vec![0u8; page as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| format!("cannot read its header: {e}"))?;
        let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        if bytes[..8] != FILE_MAGIC {
            return Err("no frame file magic".to_string());
        }
        let version = u32_at(8);
        if version != FILE_FORMAT_VERSION {
            return Err(format!(
                "format version {version}, not {FILE_FORMAT_VERSION}"
            ));
        }
        let tag_len = u64::from(u32_at(12));
        if tag_len > page - FILE_HEADER_FIXED_BYTES {
            return Err(format!("a tag of {tag_len} bytes"));
        }
        let start = FILE_HEADER_FIXED_BYTES as usize;
        let tag = std::str::from_utf8(&bytes[start..start + tag_len as usize])
            .map_err(|_| "a tag that is not UTF-8".to_string())?
            .to_string();
        let header = FileHeader {
            slots: usize::try_from(u64_at(16)).unwrap_or(usize::MAX),
            slot_capacity: u32::try_from(u64_at(24)).unwrap_or(u32::MAX),
            stride: u64_at(32),
            tag,
        };
        let sane = header.stride % page == 0
            && header.stride >= SLOT_HEADER_BYTES + u64::from(header.slot_capacity)
            && header.slots > 0;
        if !sane || header.file_bytes(page) != len {
            return Err(format!(
                "{} slots of {} bytes at a stride of {} do not make its {len} bytes",
                header.slots, header.slot_capacity, header.stride
            ));
        }
        Ok(header)
    }

    /// The file's size: the header's page, then the slots (saturating).
    fn file_bytes(&self, page: u64) -> u64 {
        slot_offset(page, self.stride, self.slots)
    }
}

/// What [`FrameFile::read_back`] found at a path.
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
#[derive(Debug)]
pub struct LeftFrames {
    /// Holds the `flock` while the frames are read.
    _file: File,
    map: Mapping,
    header: FileHeader,
    page_bytes: u64,
}

/// A slot of a dead backup's frame file that a frame held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeftSlot {
    /// Which slot.
    pub slot: usize,
    /// The handle of the frame that held it, [`SEALED_OWNER`] if a graceful stop that
    /// could not flush everything sealed it.
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
            .filter_map(|slot| FrameFile::left_slot(&self.map, &self.header, self.page_bytes, slot))
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

/// Whether `path` still names the open `file` (same device and inode).
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
        _ => false,
    }
}

/// Opens the file at `path` and takes its exclusive `flock`, or `None` if there is no
/// file. A live backup's file is `WouldBlock`. A sweep of stale files
/// ([`remove_stale_frame_files`]) holds a lock for an instant: retried briefly.
fn lock_existing(path: &Path) -> io::Result<Option<File>> {
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

/// Names of default frame files ([`default_frame_file`]) start with this.
pub const DEFAULT_FRAME_FILE_PREFIX: &str = "rampart-frames-";

/// The frame file a server whose data directory is `data_dir` uses unless told
/// otherwise (`rampart server --frame-file`): `/dev/shm/rampart-frames-HASH`, HASH
/// naming the canonical data directory, so that a restarted server finds its frames;
/// `data_dir/frames` where there is no `/dev/shm`.
pub fn default_frame_file(data_dir: &Path) -> PathBuf {
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let hash = crate::ids::key_hash(canonical.as_os_str().as_encoded_bytes()).0;
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join(format!("{DEFAULT_FRAME_FILE_PREFIX}{hash:016x}"))
    } else {
        data_dir.join("frames")
    }
}

/// Removes the default frame file of every data directory in the tree `root` (itself
/// included) whose servers have stopped, before the tree itself is removed: those in
/// `/dev/shm` would otherwise outlive it, holding memory until a server started later
/// finds them stale. Returns whether `root` is a directory; a link is not followed (the
/// tree it names is not the caller's). Best effort.
pub fn remove_default_frame_files_under(root: &Path) -> bool {
    let is_dir = std::fs::symlink_metadata(root).is_ok_and(|meta| meta.is_dir());
    let mut dirs = if is_dir {
        vec![root.to_path_buf()]
    } else {
        Vec::new()
    };
    while let Some(dir) = dirs.pop() {
        let frames = default_frame_file(&dir);
        if !frames.starts_with(&dir) {
            let _ = std::fs::remove_file(&frames);
        }
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                dirs.push(entry.path());
            }
        }
    }
    is_dir
}

/// Removes the frame files in `dir` whose names start with `prefix` that no live backup
/// holds and no backup will read back (module doc, "A file outlives its backup only
/// while a cold start needs it"):
/// * those whose tag `keep` refuses (the owner's data directory is gone);
/// * those that hold no frame (no slot's owner word is set: a restarted backup reads
///   nothing back from them);
/// * those this format cannot read;
/// * the temporary files of [`FrameFile::create`] (`NAME.PID.new`) whose process `PID`
///   is gone (killed while it created the file: nobody will rename it).
///
/// A killed backup's file that holds frames and whose owner is still there is kept for
/// the backup that restarts on it, however long that takes: a free `flock` says only
/// that no backup runs on the file, not that its frames are not needed. A file is
/// removed only while this call holds its `flock`, and only if the path still names the
/// file locked (a backup may have renamed its new file over the path meanwhile), so a
/// file whose backup runs — or is being created — is never touched. Returns the removed
/// paths; errors on single files are skipped (the file stays).
pub fn remove_stale_frame_files(
    dir: &Path,
    prefix: &str,
    keep: impl Fn(&str) -> bool,
) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let creator = match rest.split('.').collect::<Vec<_>>().as_slice() {
            [_] => None,
            [_, pid, "new"] => match pid.parse::<u32>() {
                Ok(pid) => Some(pid),
                Err(_) => continue,
            },
            _ => continue,
        };
        if creator.is_some_and(process_exists) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if lock_exclusive(&file, &path).is_err() {
            continue;
        }
        let page = page_bytes();
        let orphaned = creator.is_some()
            || match FileHeader::read(&file, page) {
                Ok(header) => !keep(&header.tag) || !holds_frames_at(&file, &header, page),
                Err(_) => true,
            };
        if orphaned && same_file(&file, &path) && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// Whether any slot of the frame file `file` (of `header`) is held, read from its owner
/// words without mapping it. Call it with the file's `flock` held and no backup on it: a
/// master writes data, never owner words. A word that cannot be read counts as held.
fn holds_frames_at(file: &File, header: &FileHeader, page: u64) -> bool {
    (0..header.slots).any(|slot| {
        let at = slot_offset(page, header.stride, slot) + OWNER_WORD_OFFSET;
        let mut word = [0u8; 8];
        file.read_exact_at(&mut word, at).is_err() || u64::from_ne_bytes(word) != 0
    })
}

/// Whether process `pid` exists (in this PID namespace). A process of another user
/// exists too (`EPERM`).
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Opens the file at `path` read-write and maps all of it (`MAP_SHARED`); errors name
/// the path.
fn map_whole_file(path: &Path, populate: Populate) -> io::Result<(File, Mapping)> {
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

/// A second read-write `MAP_SHARED` mapping of a whole frame file, its pages not
/// populated, for memory that this process hands to a device and never reads or writes
/// itself (the backup's RDMA registrations: `rampart_backup::rdma`). Two shared mappings
/// of one file share its page-cache pages, so what the device places through this one
/// is what [`FrameFile`] reads. Unmapped on drop.
#[derive(Debug)]
pub struct DeviceMapping {
    map: Mapping,
}

impl DeviceMapping {
    /// Maps all of the frame file at `path`, which must be `expected_bytes` long (the
    /// file its [`FrameFile`] created and holds locked).
    pub fn open(path: &Path, expected_bytes: u64) -> io::Result<DeviceMapping> {
        let (_file, map) = map_whole_file(path, Populate::No)?;
        if map.len != expected_bytes {
            return Err(io::Error::other(format!(
                "frame file {} holds {} bytes, not {expected_bytes}",
                path.display(),
                map.len
            )));
        }
        Ok(DeviceMapping { map })
    }

    /// Start of the mapping (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.base.as_ptr()
    }

    /// Its length in bytes: the whole file, > 0.
    pub fn bytes(&self) -> usize {
        // `Mapping` invariant: its length fits in `usize`.
        self.map.len as usize
    }
}

/// A master's mapping of a backup's frame file: the `shm` transport. See the
/// [module doc](self).
#[derive(Debug)]
pub struct ShmMapping {
    path: PathBuf,
    map: Mapping,
    /// Per [`POPULATE_CHUNK_BYTES`] of the mapping: whether it was populated already.
    populated: Box<[AtomicBool]>,
    /// The `madvise` advice that populates it ([`populate_advice`]).
    advice: libc::c_int,
}

impl ShmMapping {
    /// Opens the frame file at `path` read-write and maps all of it (`MAP_SHARED`).
    pub fn open(path: &Path) -> io::Result<ShmMapping> {
        let (file, map) = map_whole_file(path, Populate::No)?;
        let len = map.len;
        let chunks = usize::try_from(len.div_ceil(POPULATE_CHUNK_BYTES)).unwrap_or(0);
        Ok(ShmMapping {
            path: path.to_path_buf(),
            map,
            populated: (0..chunks).map(|_| AtomicBool::new(false)).collect(),
            advice: populate_advice(&file),
        })
    }

    /// Maps in, once per chunk, the chunks of the mapping that bytes `at..at + len` fall
    /// in (module doc: "populated as it goes"). Best effort: a chunk the kernel cannot
    /// populate is left to fault in page by page.
    fn populate(&self, at: u64, len: u64) {
        let end = at.saturating_add(len).min(self.map.len);
        if at >= end {
            return;
        }
        let first = at / POPULATE_CHUNK_BYTES;
        let last = (end - 1) / POPULATE_CHUNK_BYTES;
        for chunk in first..=last {
            let Some(done) = usize::try_from(chunk)
                .ok()
                .and_then(|chunk| self.populated.get(chunk))
            else {
                return;
            };
            if done.swap(true, Ordering::Relaxed) {
                continue;
            }
            let start = chunk * POPULATE_CHUNK_BYTES;
            let len = POPULATE_CHUNK_BYTES.min(self.map.len - start);
            self.map.populate(start, len, self.advice);
        }
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
        owner: FrameHandle,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FrameWriteError> {
        self.populate(
            slot_offset
                .saturating_add(SLOT_HEADER_BYTES)
                .saturating_add(offset),
            bytes.len() as u64,
        );
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

    /// The tag of the test files.
    const TAG: &str = "/data/of/a/backup";

    fn label() -> SlotLabel {
        labelled(1, 1, 1, CAPACITY)
    }

    fn labelled(master: u64, segment: u64, epoch: u64, capacity: u32) -> SlotLabel {
        SlotLabel {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
            capacity,
        }
    }

    fn frame_file(dir: &TempDir, slots: usize, capacity: u32) -> FrameFile {
        FrameFile::create(&dir.path().join("frames"), slots, capacity, TAG).expect("create")
    }

    #[test]
    fn a_device_mapping_covers_the_whole_frame_file_and_refuses_another_length() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        let path = dir.path().join("frames");
        let bytes = std::fs::metadata(&path).expect("metadata").len();
        let mapping = DeviceMapping::open(&path, bytes).expect("map");
        assert_eq!(mapping.bytes() as u64, bytes);
        assert!(DeviceMapping::open(&path, bytes + 4096).is_err());
        // A byte placed through the second mapping is the frame file's byte.
        let at = file.slot_offset(0) as usize;
        // SAFETY: `at` is inside the mapping (the first slot), and nothing else touches
        // the byte while the test runs.
        unsafe { mapping.as_ptr().add(at).write(0xA5) };
        let mut read = [0u8; 1];
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&path)
            .expect("open")
            .read_exact_at(&mut read, at as u64)
            .expect("read");
        assert_eq!(read, [0xA5]);
    }

    #[test]
    fn removing_the_frame_files_under_a_tree_takes_only_its_servers_files() {
        let root = tempfile::TempDir::new().expect("tempdir");
        let servers = [
            root.path().join("server-1"),
            root.path().join("rpc/server-2"),
        ];
        let mut files = Vec::new();
        for data_dir in &servers {
            std::fs::create_dir_all(data_dir).expect("data dir");
            let frames = default_frame_file(data_dir);
            std::fs::write(&frames, b"frames").expect("frame file");
            files.push(frames);
        }
        // A server elsewhere, reached through a link in the tree, keeps its file.
        let elsewhere = tempfile::TempDir::new().expect("tempdir");
        let kept = default_frame_file(elsewhere.path());
        std::fs::write(&kept, b"frames").expect("frame file");
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("link")).expect("link");
        assert!(remove_default_frame_files_under(root.path()));
        for file in files {
            assert!(!file.exists(), "{} left behind", file.display());
        }
        assert!(kept.exists());
        assert!(!remove_default_frame_files_under(&root.path().join("link")));
        assert!(kept.exists(), "a link given as the root is not followed");
        let _ = std::fs::remove_file(kept);
    }

    #[test]
    fn a_write_through_a_mapping_is_visible_in_the_frame_file() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 3, CAPACITY);
        file.assign(1, FrameHandle(42), label());
        let mapping = ShmMapping::open(file.path()).expect("map");
        assert_eq!(mapping.len_bytes(), file.slot_offset(3));
        let data: Vec<u8> = (0..100u8).collect();
        mapping
            .write(
                file.slot_offset(1),
                file.slot_capacity(),
                FrameHandle(42),
                10,
                &data,
            )
            .expect("write");
        let read = file.read(1, 200);
        assert_eq!(&read[10..110], &data[..]);
        assert!(read[..10].iter().chain(&read[110..]).all(|&b| b == 0));
        // Neighbouring slots are untouched.
        assert!(file.read(0, CAPACITY).iter().all(|&b| b == 0));
        assert!(file.read(2, CAPACITY).iter().all(|&b| b == 0));
        // The backup's own writers use the same protocol.
        file.write(1, FrameHandle(42), 0, b"head")
            .expect("in-process write");
        assert_eq!(&file.read(1, 4)[..], b"head");
        // Reads clamp to the capacity.
        assert_eq!(file.read(1, u32::MAX).len(), CAPACITY as usize);
    }

    #[test]
    fn writes_out_of_bounds_to_a_wrong_owner_or_a_fenced_slot_are_refused() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(0, FrameHandle(7), label());
        let mapping = ShmMapping::open(file.path()).expect("map");
        let at = file.slot_offset(0);
        let cap = file.slot_capacity();
        mapping
            .write(at, cap, FrameHandle(7), u64::from(CAPACITY) - 4, b"edge")
            .expect("fits exactly");
        for (offset, len) in [(u64::from(CAPACITY) - 3, 4), (u64::MAX, 1)] {
            let error = mapping
                .write(at, cap, FrameHandle(7), offset, &vec![1; len])
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
                .write(slot_offset, capacity, FrameHandle(7), 0, b"x")
                .expect_err("bad slot");
            assert!(
                matches!(error, FrameWriteError::OutOfBounds { capacity: 0, .. }),
                "{slot_offset} {capacity}: {error:?}"
            );
        }
        assert!(matches!(
            file.write(2, FrameHandle(7), 0, b"x"),
            Err(FrameWriteError::OutOfBounds { capacity: 0, .. })
        ));
        // Wrong owner, free slot: nothing is copied.
        assert!(matches!(
            mapping.write(at, cap, FrameHandle(8), 0, b"thief"),
            Err(FrameWriteError::FrameGone)
        ));
        assert!(matches!(
            mapping.write(file.slot_offset(1), cap, FrameHandle(0), 0, b"free"),
            Err(FrameWriteError::FrameGone)
        ));
        assert!(file.read(0, 5).iter().all(|&b| b == 0));
        // Fenced: refused before copying.
        assert!(!file.is_fenced(0));
        file.fence(0);
        assert!(file.is_fenced(0));
        assert!(matches!(
            mapping.write(at, cap, FrameHandle(7), 0, b"late"),
            Err(FrameWriteError::Fenced)
        ));
        assert!(matches!(
            file.write(0, FrameHandle(7), 0, b"late"),
            Err(FrameWriteError::Fenced)
        ));
        assert!(file.read(0, 4).iter().all(|&b| b == 0));
        assert_eq!(file.owner(0), Some(FrameHandle(7)));
    }

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

    /// Minor page faults this thread has taken so far.
    #[cfg(target_os = "linux")]
    fn thread_minor_faults() -> i64 {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer; RUSAGE_THREAD needs nothing else.
        let result = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(result, 0, "getrusage");
        usage.ru_minflt
    }

    /// On a disk's file system (the temp directory) and, where there is one, in memory
    /// (`/dev/shm`, where frame files live): the two populate differently.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_masters_first_write_into_a_chunk_maps_all_of_it_in() {
        a_first_write_maps_its_chunk_in(TempDir::new().expect("tempdir"));
        if Path::new("/dev/shm").is_dir() {
            a_first_write_maps_its_chunk_in(TempDir::new_in("/dev/shm").expect("tempdir"));
        }
    }

    #[cfg(target_os = "linux")]
    fn a_first_write_maps_its_chunk_in(dir: TempDir) {
        let capacity = 4 << 20;
        let file = frame_file(&dir, 2, capacity);
        file.assign(1, FrameHandle(9), labelled(1, 1, 1, capacity));
        let mapping = ShmMapping::open(file.path()).expect("map");
        let (slot, page) = (file.slot_offset(1), page_bytes());
        // The slot's data, from its first whole chunk on (so that the writes below stay
        // inside one chunk of the mapping).
        let chunk_start = (slot + SLOT_HEADER_BYTES).next_multiple_of(POPULATE_CHUNK_BYTES);
        let offset = chunk_start - slot - SLOT_HEADER_BYTES;
        mapping
            .write(slot, capacity, FrameHandle(9), offset, &[1; 64])
            .expect("first write");
        // The rest of the chunk: every page of it is mapped in already.
        let rest = vec![2u8; (POPULATE_CHUNK_BYTES - page) as usize];
        let before = thread_minor_faults();
        mapping
            .write(slot, capacity, FrameHandle(9), offset + page, &rest)
            .expect("second write");
        let faults = thread_minor_faults() - before;
        let pages = rest.len() as u64 / page;
        assert!(
            faults < 8,
            "{faults} page faults writing {pages} pages of a chunk already populated in {}",
            dir.path().display()
        );
        assert_eq!(file.read(1, capacity)[(offset + page) as usize], 2);
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
        // SAFETY: FFI on the frame file's open descriptor.
        assert_eq!(
            unsafe { libc::flock(old.file.as_raw_fd(), libc::LOCK_UN) },
            0
        );
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
                     the scan after the {what} saw {:?}",
                    scan[region]
                );
            }
        }
        eprintln!("{fenced_mid_pass} of {ROUNDS} rounds stopped the writer mid-pass ({what})");
    }

    #[test]
    fn only_frame_files_no_backup_holds_or_will_read_back_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live = FrameFile::create(&dir.path().join("rampart-frames-live"), 1, 4096, TAG)
            .expect("create");
        std::fs::write(
            dir.path().join("rampart-frames-dead"),
            b"not a frame file of this format",
        )
        .expect("write");
        // Files of stopped backups, each holding a frame when its backup went (so the
        // drop keeps it, as a SIGKILL would): one whose data directory is there, one
        // whose is gone, one whose frame a graceful stop sealed and could not flush, and
        // one whose graceful stop released its sealed frame but did not get to remove
        // the file: it holds no frame.
        let kept_tag = dir.path().to_str().expect("utf-8").to_string();
        for (name, tag) in [
            ("kept", kept_tag.as_str()),
            ("orphan", "/no/such/dir"),
            ("sealed", kept_tag.as_str()),
            ("released", kept_tag.as_str()),
        ] {
            let path = dir.path().join(format!("rampart-frames-{name}"));
            let file = FrameFile::create(&path, 2, 4096, tag).expect("create");
            file.assign(0, FrameHandle(1), labelled(1, 1, 1, 4096));
            let sealed = (name != "kept" && name != "orphan")
                .then(|| SealedFrames::seal(&path).expect("seal"));
            drop(file);
            if name == "released" {
                sealed.expect("sealed").release();
            }
        }
        // Temporary files of `create`: one whose process runs (this one), one whose
        // process is gone.
        let creating = format!("rampart-frames-x.{}.new", std::process::id());
        std::fs::write(dir.path().join(&creating), b"being created").expect("write");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead_pid = child.id();
        child.wait().expect("wait");
        let abandoned = format!("rampart-frames-y.{dead_pid}.new");
        std::fs::write(dir.path().join(&abandoned), b"never renamed").expect("write");
        std::fs::write(dir.path().join("other"), b"not ours").expect("write");
        let mut removed =
            remove_stale_frame_files(dir.path(), "rampart-frames-", |tag| Path::new(tag).exists());
        removed.sort();
        assert_eq!(
            removed,
            vec![
                dir.path().join("rampart-frames-dead"),
                dir.path().join("rampart-frames-orphan"),
                dir.path().join("rampart-frames-released"),
                dir.path().join(&abandoned),
            ]
        );
        assert!(dir.path().join("rampart-frames-kept").exists());
        assert!(dir.path().join("rampart-frames-sealed").exists());
        assert!(live.path().exists());
        assert!(dir.path().join(&creating).exists());
        assert!(dir.path().join("other").exists());
    }

    #[test]
    fn a_sealed_slot_refuses_every_writer_and_the_released_file_is_removed() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 3, CAPACITY);
        file.assign(0, FrameHandle(7), label());
        file.assign(1, FrameHandle(8), labelled(1, 2, 1, CAPACITY));
        file.assign(2, FrameHandle(9), labelled(1, 3, 1, CAPACITY));
        file.release(2);
        let mapping = ShmMapping::open(file.path()).expect("map");
        let (at, capacity) = (file.slot_offset(0), file.slot_capacity());
        mapping
            .write(at, capacity, FrameHandle(7), 0, b"before")
            .expect("an open frame takes writes");

        let sealed = SealedFrames::seal(file.path()).expect("seal");
        assert_eq!(sealed.count(), 2, "the held slots, not the free one");
        assert!(
            matches!(
                mapping.write(at, capacity, FrameHandle(7), 6, b"after"),
                Err(FrameWriteError::FrameGone)
            ),
            "a master's write after the seal"
        );
        assert!(
            matches!(
                file.write(1, FrameHandle(8), 0, b"after"),
                Err(FrameWriteError::FrameGone)
            ),
            "the backup's own writer after the seal"
        );
        assert_eq!(&file.read(0, 6)[..], b"before");
        assert!(sealed.holds_frames());

        sealed.release();
        assert!(!sealed.holds_frames());
        let path = file.path().to_path_buf();
        assert!(sealed.remove().expect("remove"), "nothing held: removed");
        assert!(!path.exists());
        // A new backup's file at the path outlives the old one's drop.
        let next = FrameFile::create(&path, 1, CAPACITY, TAG).expect("create again");
        drop(file);
        assert!(path.exists(), "the old file's drop left the new one alone");
        drop(next);
        assert!(!path.exists());
    }

    #[test]
    fn a_sealed_file_not_released_stays_and_is_read_back_whole() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(1, FrameHandle(11), labelled(3, 4, 2, 1000));
        file.write(1, FrameHandle(11), 0, b"segment four")
            .expect("write");
        let sealed = SealedFrames::seal(file.path()).expect("seal");
        assert!(!sealed.remove().expect("remove"), "a held slot keeps it");
        let path = file.path().to_path_buf();
        drop(file);
        assert!(path.exists(), "sealed frames are frames: the file stays");
        let LeftBehind::Frames(left) = FrameFile::read_back(&path, TAG).expect("read") else {
            panic!("our frames");
        };
        let held = left.held();
        assert_eq!(
            held,
            vec![LeftSlot {
                slot: 1,
                owner: SEALED_OWNER,
                label: labelled(3, 4, 2, 1000),
                fenced: false,
                fenced_length: None,
            }]
        );
        assert_eq!(&left.read(&held[0])[..12], b"segment four");
    }
}
