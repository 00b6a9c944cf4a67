//! [`RecoveryRegion`]: a backup's shared memory for the pieces it cuts out of replicas
//! for recovery, and [`RegionReader`], a recovery master's read-only view of it on the
//! same host (docs/design.md §6, "One-sided recovery reads"). "The module doc" below is
//! the `shm` overview (`mod.rs`).
//!
//! A backup splits each replica it reads for a recovery into one piece per partition.
//! Sent inside a `RecoveryData` reply, a piece is copied into the reply, into the
//! backup's socket, out of the recovery master's socket, and decoded there. Written into
//! a slot of this region instead, it is copied once more, by the recovery master, out
//! of its own mapping of the region: the reply names the runs of bytes
//! ([`RegionRun`], one per slot the piece fills), not the bytes.
//!
//! # Layout
//! An anonymous memory file (`memfd_create`): it has no name in any file system, so
//! nothing is left behind when its backup dies; a master on the same host opens it
//! through the backup's `/proc/PID/fd/FD` ([`RecoveryRegion::path`]). One page of file
//! header, then `slots` slots of equal stride (a [`SLOT_HEADER_BYTES`] header, then the
//! data, rounded up to the page size):
//!
//! | offset | size | file header field |
//! |--------|------|-------|
//! | 0 | 8 | magic `RMPRECOV` |
//! | 8 | 8 | nonce: random, drawn when the region is made |
//! | 16 | 8 | slots |
//! | 24 | 8 | slot capacity in data bytes |
//! | 32 | 8 | stride |
//!
//! A slot's header holds one word, at +0: its *generation*, odd while the backup fills
//! the slot, even while it holds a piece that may be read.
//!
//! # Protocol (a seqlock)
//! The backup [`takes`](RecoveryRegion::take) a slot (generation := odd, SeqCst fence),
//! copies a piece's bytes in, and [`seals`](RegionSlot::seal) it (SeqCst fence,
//! generation := the next even number). A reply names (slot, generation, length) for
//! each slot of the piece. The reader
//! loads the generation and refuses a run whose generation differs; copies; SeqCst
//! fence; loads the generation again and discards the copy unless it is unchanged
//! ([`RunError::Stale`]). A slot taken again after the reply was sent has a newer
//! generation from before its first new byte was written, so a copy that overlapped a
//! refill, even partly, is always discarded: a reader never takes another replica's
//! entries — each with a valid CRC — for the ones it asked for. A reader that loses
//! the race asks for the piece again inside a reply.
//!
//! The nonce tells a region from whatever else a reused pid and fd number might name:
//! [`RegionReader::open`] refuses a file whose header does not carry the nonce the
//! reply named.
//!
//! # Slot reuse
//! A sealed slot goes back to the region when its [`SealedSlot`] is dropped: the backup
//! drops a piece's slots once the piece was handed out (or its recovery ended). A
//! reader copies right after the reply reaches it, so a freed slot *cools* for
//! `cool` before it is taken again (oldest freed first), and a slot never touched is
//! taken before a warm one that has not cooled yet. With no slot to take, the caller
//! keeps its pieces in its own memory and sends them inside replies, as before.
//! [`RecoveryRegion::trim`] gives the memory of the slots free at that moment back to
//! the kernel (the backup calls it when no recovery is under way; a slot an ended
//! attempt's reader gives back later keeps its pages until the next trim).
//!
//! # Memory
//! The region is sparse: a slot's pages are allocated on its first fill and stay until
//! [`RecoveryRegion::trim`]. Its size bounds the memory it holds.

use super::header::SLOT_HEADER_BYTES;
use super::mapping::{page_bytes, populate_advice, Mapping, Populate};
use memmap2::Advice;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::sync::atomic::{self, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First bytes of every recovery region.
const REGION_MAGIC: [u8; 8] = *b"RMPRECOV";

/// Where the file header's words lie.
const MAGIC_OFFSET: u64 = 0;
const NONCE_OFFSET: u64 = 8;
const SLOTS_OFFSET: u64 = 16;
const CAPACITY_OFFSET: u64 = 24;
const STRIDE_OFFSET: u64 = 32;

/// Largest region: it is sparse, but a misconfiguration should fail with a clear error
/// rather than reserve absurd amounts of address space.
pub const RECOVERY_REGION_BYTES_MAX: u64 = 1 << 40;

/// How long a freed slot cools before it is filled again, by default: many times the
/// time a recovery master takes from a reply's arrival to the end of its copy (well
/// under a millisecond for 8 MiB), so that reads are rarely lost to a refill, yet
/// short enough that a backup reading a log fills the same few slots again: a slot
/// never filled costs a page fault and the zeroing of each of its pages, ≈ 6 ms per
/// 8 MiB here.
pub const REGION_COOL_DEFAULT: Duration = Duration::from_millis(20);

/// A run of bytes in a region: `len` bytes at `offset` of the data of `slot`, valid
/// while the slot's generation is `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionRun {
    pub slot: u32,
    pub generation: u64,
    pub offset: u32,
    pub len: u32,
}

/// Why a run could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The run does not lie inside a slot of the region, or names a slot another run
    /// of the piece named.
    #[error(
        "run of {len} bytes at {offset} of slot {slot} lies outside the region or repeats its slot"
    )]
    OutOfBounds { slot: u32, offset: u32, len: u32 },
    /// The slot was refilled (or is being filled) since the run was named: the copy is
    /// discarded.
    #[error("slot {slot} moved from generation {expected} to {found}")]
    Stale {
        slot: u32,
        expected: u64,
        found: u64,
    },
}

/// The backup's side: the region and its free slots. Cloning shares it.
#[derive(Debug, Clone)]
pub struct RecoveryRegion {
    inner: Arc<Region>,
}

#[derive(Debug)]
struct Region {
    /// Keeps the memory file open (the mapping alone would keep its pages, but `path`
    /// names the descriptor).
    file: File,
    map: Mapping,
    nonce: u64,
    geometry: Geometry,
    path: String,
    cool: Duration,
    free: Mutex<FreeSlots>,
}

/// Where slots lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    slots: u32,
    slot_capacity: u32,
    stride: u64,
}

impl Geometry {
    fn slot_offset(&self, slot: u32) -> u64 {
        page_bytes() + u64::from(slot) * self.stride
    }

    fn file_bytes(&self) -> u64 {
        page_bytes() + u64::from(self.slots) * self.stride
    }

    /// Where the run's bytes start in the file, if it lies inside its slot.
    fn run_start(&self, run: &RegionRun) -> Option<u64> {
        let end = u64::from(run.offset) + u64::from(run.len);
        (run.slot < self.slots && end <= u64::from(self.slot_capacity))
            .then(|| self.slot_offset(run.slot) + SLOT_HEADER_BYTES + u64::from(run.offset))
    }
}

/// Invariant: every slot not held by a [`RegionSlot`] or a [`SealedSlot`] is in
/// exactly one of the two lists, or in the hands of a [`RecoveryRegion::trim`].
#[derive(Debug, Default)]
struct FreeSlots {
    /// Slots filled before, oldest freed first, with when.
    warm: VecDeque<(u32, Instant)>,
    /// Slots whose pages the region does not hold.
    cold: Vec<u32>,
}

impl RecoveryRegion {
    /// A region of `slots` slots of `slot_capacity` data bytes each, whose freed slots
    /// cool for `cool` before they are filled again. Linux only (`memfd_create`).
    pub fn create(slots: u32, slot_capacity: u32, cool: Duration) -> io::Result<RecoveryRegion> {
        let page = page_bytes();
        let stride = (SLOT_HEADER_BYTES + u64::from(slot_capacity)).div_ceil(page) * page;
        let geometry = Geometry {
            slots,
            slot_capacity,
            stride,
        };
        let bytes = geometry.file_bytes();
        if slots == 0 || slot_capacity == 0 || bytes > RECOVERY_REGION_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a recovery region of {slots} slots of {slot_capacity} bytes is not \
                     between one slot and {RECOVERY_REGION_BYTES_MAX} bytes"
                ),
            ));
        }
        let fd = rustix::fs::memfd_create("rampart-recovery", rustix::fs::MemfdFlags::CLOEXEC)?;
        let file = File::from(fd);
        file.set_len(bytes)?;
        let map = Mapping::map(&file, bytes, Populate::No)?;
        let nonce = rand::random::<u64>();
        let words = [
            (MAGIC_OFFSET, u64::from_ne_bytes(REGION_MAGIC)),
            (NONCE_OFFSET, nonce),
            (SLOTS_OFFSET, u64::from(slots)),
            (CAPACITY_OFFSET, u64::from(slot_capacity)),
            (STRIDE_OFFSET, stride),
        ];
        for (at, value) in words {
            header_word(&map, at)?.store(value, Ordering::SeqCst);
        }
        use std::os::fd::AsRawFd;
        let path = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
        Ok(RecoveryRegion {
            inner: Arc::new(Region {
                file,
                map,
                nonce,
                geometry,
                path,
                cool,
                free: Mutex::new(FreeSlots {
                    warm: VecDeque::new(),
                    cold: (0..slots).rev().collect(),
                }),
            }),
        })
    }

    /// Where a reader on this host opens the region.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// What a reader checks the region by.
    pub fn nonce(&self) -> u64 {
        self.inner.nonce
    }

    /// Data bytes of each slot.
    pub fn slot_capacity(&self) -> u32 {
        self.inner.geometry.slot_capacity
    }

    /// A free slot to fill: the oldest freed one if it has cooled, else one never
    /// filled (or trimmed), else none.
    pub fn take(&self) -> Option<RegionSlot> {
        let slot = {
            let mut free = self.inner.free.lock();
            match free.warm.front() {
                Some(&(slot, freed)) if freed.elapsed() >= self.inner.cool => {
                    free.warm.pop_front();
                    slot
                }
                _ => free.cold.pop()?,
            }
        };
        let word = self.inner.generation_word(slot);
        // Odd: being filled. A reader's second load sees this (or a later value) if its
        // copy overlapped any byte written from here on.
        let generation = word.fetch_add(1, Ordering::SeqCst) + 1;
        atomic::fence(Ordering::SeqCst);
        debug_assert!(generation % 2 == 1, "a free slot's generation is even");
        Some(RegionSlot {
            region: Arc::clone(&self.inner),
            slot,
            sealed: false,
        })
    }

    /// Gives the memory of every free slot back to the kernel; they are taken again as
    /// if never filled. Errors are logged: the memory then stays, which is harmless.
    /// Blocks (a system call per slot; not under the free list's lock, so that
    /// [`RecoveryRegion::take`] meanwhile finds the cold slots).
    pub fn trim(&self) {
        let warm: Vec<u32> = {
            let mut free = self.inner.free.lock();
            free.warm.drain(..).map(|(slot, _)| slot).collect()
        };
        let geometry = self.inner.geometry;
        for &slot in &warm {
            // A new generation (still even: free) before the bytes go, so that a run
            // named before is refused rather than read as zeros.
            self.inner
                .generation_word(slot)
                .fetch_add(2, Ordering::SeqCst);
            atomic::fence(Ordering::SeqCst);
            let data = geometry.slot_offset(slot) + SLOT_HEADER_BYTES;
            if let Err(error) =
                punch_hole(&self.inner.file, data, geometry.stride - SLOT_HEADER_BYTES)
            {
                tracing::debug!(%error, slot, "cannot give a recovery slot's memory back");
            }
        }
        self.inner.free.lock().cold.extend(warm);
    }

    /// Slots free now (warm or cold), for tests and metrics.
    pub fn free_slots(&self) -> usize {
        let free = self.inner.free.lock();
        free.warm.len() + free.cold.len()
    }
}

impl Region {
    fn generation_word(&self, slot: u32) -> &AtomicU64 {
        self.map
            .word(self.geometry.slot_offset(slot))
            .expect("slots lie inside the region, page-aligned")
    }

    fn give_back(&self, slot: u32) {
        self.free.lock().warm.push_back((slot, Instant::now()));
    }
}

/// A slot being filled; only its holder writes it. Dropped unsealed, the slot goes back
/// to the region.
#[derive(Debug)]
pub struct RegionSlot {
    region: Arc<Region>,
    slot: u32,
    sealed: bool,
}

impl RegionSlot {
    /// Data bytes the slot holds.
    pub fn capacity(&self) -> u32 {
        self.region.geometry.slot_capacity
    }

    /// Copies `bytes` to `offset` of the slot's data. Panics if they do not fit (a
    /// programmer error: the caller sizes what it writes by [`RegionSlot::capacity`]).
    pub fn write(&mut self, offset: u32, bytes: &[u8]) {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let run = RegionRun {
            slot: self.slot,
            generation: 0,
            offset,
            len,
        };
        let at = self
            .region
            .geometry
            .run_start(&run)
            .expect("a write into a recovery slot fits its capacity");
        self.region.map.copy_in(at, bytes);
    }

    /// Ends the fill: from now on the slot's bytes may be read, until the handle is
    /// dropped.
    pub fn seal(mut self) -> SealedSlot {
        atomic::fence(Ordering::SeqCst);
        let generation = self
            .region
            .generation_word(self.slot)
            .fetch_add(1, Ordering::SeqCst)
            + 1;
        self.sealed = true;
        SealedSlot {
            region: Arc::clone(&self.region),
            slot: self.slot,
            generation,
        }
    }
}

impl Drop for RegionSlot {
    fn drop(&mut self) {
        if !self.sealed {
            // Back to even, so that the next take makes it odd again.
            self.region
                .generation_word(self.slot)
                .fetch_add(1, Ordering::SeqCst);
            self.region.give_back(self.slot);
        }
    }
}

/// A filled slot; its bytes stay as they are while it lives.
#[derive(Debug)]
pub struct SealedSlot {
    region: Arc<Region>,
    slot: u32,
    generation: u64,
}

impl SealedSlot {
    /// The run of `len` bytes at `offset`, as a reader asks for it.
    pub fn run(&self, offset: u32, len: u32) -> RegionRun {
        RegionRun {
            slot: self.slot,
            generation: self.generation,
            offset,
            len,
        }
    }

    /// Appends to `out` a copy of `len` bytes at `offset`, for a reader on another
    /// host. Panics outside the slot (a programmer error, as for [`RegionSlot::write`]).
    pub fn append_to(&self, offset: u32, len: u32, out: &mut Vec<u8>) {
        let at = self
            .region
            .geometry
            .run_start(&self.run(offset, len))
            .expect("a run of a recovery slot lies inside it");
        self.region.map.append_out(at, len as usize, out);
    }
}

impl Drop for SealedSlot {
    fn drop(&mut self) {
        self.region.give_back(self.slot);
    }
}

/// A recovery master's view of a backup's region on the same host.
#[derive(Debug)]
pub struct RegionReader {
    _file: File,
    map: Mapping,
    geometry: Geometry,
    nonce: u64,
    /// Maps a run's pages in before it is copied ([`populate_advice`]).
    advice: Option<Advice>,
}

impl RegionReader {
    /// Maps the region at `path`, read-only, and checks that its header is a region's,
    /// with nonce `nonce` and a layout that fits the file. `path` must name a process's
    /// descriptor (`/proc/PID/fd/FD`, as [`RecoveryRegion::path`] gives it), and the
    /// file must be at most [`RECOVERY_REGION_BYTES_MAX`] long: a peer's reply names it.
    pub fn open(path: &str, nonce: u64) -> io::Result<RegionReader> {
        let bad = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} is not the recovery region named: {what}"),
            )
        };
        if !is_descriptor_path(path) {
            return Err(bad("not a /proc/PID/fd/FD path".to_string()));
        }
        let file = OpenOptions::new().read(true).open(path)?;
        let len = file.metadata()?.len();
        if len < page_bytes() || len > RECOVERY_REGION_BYTES_MAX {
            return Err(bad(format!("{len} bytes")));
        }
        let map = Mapping::map_read_only(&file, len)?;
        let word = |at| header_word(&map, at).map(|word| word.load(Ordering::SeqCst));
        if word(MAGIC_OFFSET)? != u64::from_ne_bytes(REGION_MAGIC) {
            return Err(bad("no region magic".to_string()));
        }
        let found = word(NONCE_OFFSET)?;
        if found != nonce {
            return Err(bad(format!("nonce {found:#x}, not {nonce:#x}")));
        }
        let (slots, capacity, stride) = (
            word(SLOTS_OFFSET)?,
            word(CAPACITY_OFFSET)?,
            word(STRIDE_OFFSET)?,
        );
        let geometry = Geometry {
            slots: u32::try_from(slots).map_err(|_| bad(format!("{slots} slots")))?,
            slot_capacity: u32::try_from(capacity)
                .map_err(|_| bad(format!("capacity {capacity}")))?,
            stride,
        };
        let fits = stride >= SLOT_HEADER_BYTES + capacity
            && stride % page_bytes() == 0
            && stride
                .checked_mul(slots)
                .and_then(|slots_bytes| slots_bytes.checked_add(page_bytes()))
                .is_some_and(|end| end <= len);
        if !fits {
            return Err(bad(format!(
                "{slots} slots of stride {stride} and capacity {capacity} in {len} bytes"
            )));
        }
        Ok(RegionReader {
            advice: populate_advice(&file),
            _file: file,
            map,
            geometry,
            nonce,
        })
    }

    /// The nonce the region was opened with.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Replaces `out`'s contents with the run's bytes, checked against a refill (module
    /// doc, "Protocol"); on an error `out` holds nothing usable.
    pub fn copy_run(&self, run: &RegionRun, out: &mut Vec<u8>) -> Result<(), RunError> {
        self.copy_runs(std::slice::from_ref(run), out)
    }

    /// The bytes the runs hold together, once each is checked to lie inside a slot of
    /// its own (no slot twice): so the sum is at most the region's data, whatever the
    /// runs say.
    pub fn runs_len(&self, runs: &[RegionRun]) -> Result<usize, RunError> {
        let mut len = 0usize;
        let mut slots = std::collections::HashSet::with_capacity(runs.len());
        for run in runs {
            if self.geometry.run_start(run).is_none() || !slots.insert(run.slot) {
                return Err(RunError::OutOfBounds {
                    slot: run.slot,
                    offset: run.offset,
                    len: run.len,
                });
            }
            len += run.len as usize;
        }
        Ok(len)
    }

    /// Replaces `out`'s contents with the runs' bytes, one after another, each checked
    /// against a refill; on an error `out` holds nothing usable.
    pub fn copy_runs(&self, runs: &[RegionRun], out: &mut Vec<u8>) -> Result<(), RunError> {
        out.clear();
        out.reserve(self.runs_len(runs)?);
        for run in runs {
            if let Err(error) = self.append_run(run, out) {
                out.clear();
                return Err(error);
            }
        }
        Ok(())
    }

    fn append_run(&self, run: &RegionRun, out: &mut Vec<u8>) -> Result<(), RunError> {
        self.append_run_then(run, out, || {})
    }

    /// [`RegionReader::append_run`], calling `after_copy` between the copy and the
    /// second check: tests refill the slot there, as a backup may at that moment.
    fn append_run_then(
        &self,
        run: &RegionRun,
        out: &mut Vec<u8>,
        after_copy: impl FnOnce(),
    ) -> Result<(), RunError> {
        let at = self.geometry.run_start(run).ok_or(RunError::OutOfBounds {
            slot: run.slot,
            offset: run.offset,
            len: run.len,
        })?;
        let word = self
            .map
            .word(self.geometry.slot_offset(run.slot))
            .expect("the run's slot lies inside the region");
        let stale = |found| RunError::Stale {
            slot: run.slot,
            expected: run.generation,
            found,
        };
        let before = word.load(Ordering::SeqCst);
        if before != run.generation || before % 2 == 1 {
            return Err(stale(before));
        }
        // One call maps in the run's pages that this mapping has not met yet, rather
        // than a page fault per 4 KiB (the `shm` module doc, "populated as it goes").
        self.map
            .populate(at, u64::from(run.len), self.advice.filter(|_| run.len > 0));
        self.map.append_out(at, run.len as usize, out);
        after_copy();
        atomic::fence(Ordering::SeqCst);
        let after = word.load(Ordering::SeqCst);
        if after != run.generation {
            return Err(stale(after));
        }
        Ok(())
    }
}

/// Whether `path` has the form `/proc/PID/fd/FD`.
fn is_descriptor_path(path: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(), ["", "proc", pid, "fd", fd] if digits(pid) && digits(fd))
}

fn header_word(map: &Mapping, at: u64) -> io::Result<&AtomicU64> {
    map.word(at).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the recovery region is shorter than its header",
        )
    })
}

#[cfg(target_os = "linux")]
fn punch_hole(file: &File, at: u64, len: u64) -> io::Result<()> {
    use rustix::fs::FallocateFlags;
    rustix::fs::fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        at,
        len,
    )?;
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn punch_hole(_file: &File, _at: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(slots: u32, cool: Duration) -> RecoveryRegion {
        RecoveryRegion::create(slots, 64 * 1024, cool).expect("region")
    }

    fn fill(region: &RecoveryRegion, bytes: &[u8]) -> SealedSlot {
        let mut slot = region.take().expect("a free slot");
        slot.write(0, bytes);
        slot.seal()
    }

    #[test]
    fn a_reader_copies_what_the_backup_sealed() {
        let region = region(2, Duration::ZERO);
        let sealed = fill(&region, b"entries of partition one");
        let reader = RegionReader::open(region.path(), region.nonce()).expect("opens");
        let mut out = Vec::new();
        reader
            .copy_run(&sealed.run(11, 9), &mut out)
            .expect("reads");
        assert_eq!(out, b"partition");
        let mut local = b"the ".to_vec();
        sealed.append_to(11, 9, &mut local);
        assert_eq!(local, b"the partition");
        // A piece over two slots.
        let other = fill(&region, b"one, two");
        reader
            .copy_runs(&[sealed.run(0, 7), other.run(4, 4)], &mut out)
            .expect("reads");
        assert_eq!(out, b"entries two");
    }

    /// The seqlock: a run named before its slot was filled again is never read as the
    /// new bytes, though they lie at the same place.
    #[test]
    fn a_run_of_a_refilled_slot_is_refused() {
        let region = region(1, Duration::ZERO);
        let reader = RegionReader::open(region.path(), region.nonce()).expect("opens");
        let old = fill(&region, b"old piece");
        let run = old.run(0, 9);
        drop(old);
        let mut refill = region.take().expect("the freed slot");
        refill.write(0, b"new piece");
        let mut out = Vec::new();
        // While it is being filled, and after.
        assert!(matches!(
            reader.copy_run(&run, &mut out),
            Err(RunError::Stale { .. })
        ));
        let new = refill.seal();
        assert!(matches!(
            reader.copy_run(&run, &mut out),
            Err(RunError::Stale { .. })
        ));
        reader
            .copy_run(&new.run(0, 9), &mut out)
            .expect("the new run reads");
        assert_eq!(out, b"new piece");
    }

    /// The second check: a refill that starts after the reader's first check, while it
    /// copies, is caught after the copy.
    #[test]
    fn a_refill_during_the_copy_is_caught_after_it() {
        let region = region(1, Duration::ZERO);
        let reader = RegionReader::open(region.path(), region.nonce()).expect("opens");
        let old = fill(&region, b"old piece");
        let run = old.run(0, 9);
        let mut old = Some(old);
        let mut refill = None;
        let mut out = Vec::new();
        let read = reader.append_run_then(&run, &mut out, || {
            drop(old.take());
            let mut slot = region.take().expect("the freed slot");
            slot.write(0, b"new piece");
            refill = Some(slot);
        });
        assert!(matches!(read, Err(RunError::Stale { .. })), "{read:?}");
        drop(refill);
    }

    #[test]
    fn a_freed_slot_cools_before_it_is_filled_again() {
        let region = region(2, Duration::from_secs(3600));
        let first = fill(&region, b"a");
        let second = fill(&region, b"b");
        assert!(region.take().is_none(), "both slots hold pieces");
        let first_run = first.run(0, 1);
        drop(first);
        assert!(region.take().is_none(), "the freed slot has not cooled");
        assert_eq!(region.free_slots(), 1);
        let reader = RegionReader::open(region.path(), region.nonce()).expect("opens");
        let mut out = Vec::new();
        let run = second.run(0, 1);
        reader.copy_run(&run, &mut out).expect("a held slot reads");
        region.trim();
        reader
            .copy_run(&run, &mut out)
            .expect("trim leaves held slots");
        assert!(
            matches!(
                reader.copy_run(&first_run, &mut out),
                Err(RunError::Stale { .. })
            ),
            "a trimmed slot's old run is refused, not read as zeros"
        );
        let third = region
            .take()
            .expect("a trimmed slot is cold, taken at once");
        drop((second, third));
        assert_eq!(region.free_slots(), 2);
    }

    #[test]
    fn an_unsealed_slot_goes_back_and_reads_nothing() {
        let region = region(1, Duration::ZERO);
        let reader = RegionReader::open(region.path(), region.nonce()).expect("opens");
        let sealed = fill(&region, b"kept");
        let run = sealed.run(0, 4);
        drop(sealed);
        drop(region.take().expect("the slot"));
        let again = fill(&region, b"next");
        let mut out = Vec::new();
        assert!(reader.copy_run(&run, &mut out).is_err());
        reader.copy_run(&again.run(0, 4), &mut out).expect("reads");
        assert_eq!(out, b"next");
    }

    #[test]
    fn a_reader_refuses_another_region_and_runs_outside_it() {
        let region = region(1, Duration::ZERO);
        let error = RegionReader::open(region.path(), region.nonce() ^ 1).unwrap_err();
        assert!(error.to_string().contains("nonce"), "{error}");
        let file = tempfile::NamedTempFile::new().expect("temp file");
        file.as_file().set_len(1 << 16).expect("sized");
        let path = file.path().to_str().expect("utf-8").to_string();
        let error = RegionReader::open(&path, 0).unwrap_err();
        assert!(error.to_string().contains("/proc/PID/fd/FD"), "{error}");
        use std::os::fd::AsRawFd;
        let by_descriptor = format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            file.as_file().as_raw_fd()
        );
        let error = RegionReader::open(&by_descriptor, 0).unwrap_err();
        assert!(error.to_string().contains("magic"), "{error}");
        let reader = RegionReader::open(region.path(), region.nonce()).expect("opens");
        let sealed = fill(&region, b"x");
        let mut out = Vec::new();
        let outside = RegionRun {
            len: region.slot_capacity(),
            ..sealed.run(1, 0)
        };
        assert!(matches!(
            reader.copy_run(&outside, &mut out),
            Err(RunError::OutOfBounds { .. })
        ));
        let no_slot = RegionRun {
            slot: 1,
            ..sealed.run(0, 1)
        };
        assert!(matches!(
            reader.copy_run(&no_slot, &mut out),
            Err(RunError::OutOfBounds { .. })
        ));
        // One slot named twice would let a reply ask for more than the region holds.
        let run = sealed.run(0, 1);
        assert!(matches!(
            reader.copy_runs(&[run, run], &mut out),
            Err(RunError::OutOfBounds { .. })
        ));
    }
}
