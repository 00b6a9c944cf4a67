//! The `shm` transport: a backup's frames in a shared-memory *frame file* that masters on
//! the same host map and copy into (docs/design.md §5 "One-sided writes", "Backups").
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
//! # Files
//! * `header.rs` — the format of the layout below: the slot header's words, [`SlotLabel`],
//!   [`SEALED_OWNER`], the file header and where each slot lies.
//! * `mapping.rs` — the mapping (`memmap2`'s `MmapRaw`) and all of the transport's
//!   `unsafe` outside tests: header words and copies; also allocating and populating the
//!   file's memory (`rustix`, `memmap2`), and the write protocol.
//! * `frame_file.rs` — [`FrameFile`], the backup's side, and [`FrameFile::read_back`].
//! * `left_behind.rs` — what a killed backup left ([`LeftBehind`], [`LeftFrames`],
//!   [`LeftSlot`]) and the `flock` that tells a live backup's file from it.
//! * `sealed.rs` — [`SealedFrames`], a graceful stop's seal on its backup's file.
//! * `paths.rs` — default frame-file paths ([`default_frame_file`]) and the removal of
//!   files no backup needs ([`remove_default_frame_files_under`],
//!   [`remove_stale_frame_files`]).
//! * `recovery_region.rs` — [`RecoveryRegion`], a backup's shared memory for recovery
//!   pieces, and [`RegionReader`], a recovery master's view of it (its own doc).
//! * `device.rs` — the file mapped by others: [`ShmMapping`], a master's, and
//!   [`DeviceMapping`], for an RDMA device.
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
//!   (docs/design.md §5): dropping a [`FrameFile`] removes it only when no slot is held (else
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
//!
//! [`FrameWriteError::OutOfBounds`]: super::FrameWriteError::OutOfBounds
//! [`FrameWriteError::FrameGone`]: super::FrameWriteError::FrameGone
//! [`FrameWriteError::Fenced`]: super::FrameWriteError::Fenced
//! [`TAIL_BYTES`]: super::TAIL_BYTES

mod device;
mod frame_file;
mod header;
mod left_behind;
mod mapping;
mod paths;
mod recovery_region;
mod sealed;
#[cfg(test)]
mod test_support;

pub use device::{DeviceMapping, ShmMapping, POPULATE_CHUNK_BYTES};
pub use frame_file::FrameFile;
pub use header::{SlotLabel, FRAME_FILE_BYTES_MAX, SEALED_OWNER, SLOT_HEADER_BYTES};
pub use left_behind::{LeftBehind, LeftFrames, LeftSlot};
pub use paths::{
    default_frame_file, remove_default_frame_files_under, remove_stale_frame_files,
    DEFAULT_FRAME_FILE_PREFIX,
};
pub use recovery_region::{
    RecoveryRegion, RegionReader, RegionRun, RegionSlot, RunError, SealedSlot,
    RECOVERY_REGION_BYTES_MAX, REGION_COOL_DEFAULT,
};
pub use sealed::SealedFrames;
