//! `SegmentedLog`: the master's log-structured memory (docs/design.md §4).
//!
//! All objects, tombstones and completion records live in one append-only log divided
//! into fixed-size
//! segments; the memory limit is a number of segments. Appends go to the *head*
//! segment. When an entry does not fit, the log rolls over following the
//! digest-and-footer protocol: open segment n+1 with its header, a digest of every live
//! segment (n+1 included) and the safe-version floor, sealed; then close segment n with
//! `SegmentFooter{n+1}`; only then append data to n+1. Replicas therefore never need an
//! update in place, and recovery can tell a complete log from an incomplete one.
//!
//! # Replication hand-off
//! Every byte range appended since the last [`SegmentedLog::take_unreplicated`] is
//! remembered in append order. The write path takes those ranges after each sealed
//! batch, with a copy of their bytes ([`SealedRange`]), and hands them to replication
//! before acknowledging (see `appender`).
//!
//! # Space and cleaning
//! The memory holds `segments_max` segment buffers. A rollover may take a free buffer
//! only while more than [`CLEANER_RESERVE_SEGMENTS`] are free: the rest is the cleaner's
//! reserve, so that the cleaner can always open a survivor and free space when the log
//! is full. A full log refuses the append with [`NoSpace`]; nothing already written is
//! touched.
//!
//! The cleaner (`crate::cleaner`, driven through `ObjectStore`) works on this log in
//! three moves, each a method here:
//! 1. **relocate** — copy live entries of cleaned segments into *survivor* segments
//!    ([`SegmentedLog::open_survivor`], [`SegmentedLog::relocate_object`]): ids from
//!    `SegmentId::SURVIVOR_FIRST` up, no digest, readable at once (the index may point
//!    into them) but not yet part of the log's digest; their ranges are replicated like
//!    any, and [`SegmentedLog::close_survivor`] writes the footer.
//! 2. **commit** — [`SegmentedLog::commit_cleaning`]: the closed survivors join the log,
//!    the cleaned segments leave it (*retired*: still in memory), and a new digest is
//!    appended to the head (a rollover when it does not fit). Every head keeps room for
//!    such a digest ([`SegmentedLog::digest_room`]), so a commit needs no new buffer.
//! 3. **free** — once the commit's range is on every replica,
//!    [`SegmentedLog::free_retired`] gives the retired buffers back to the pool and
//!    names the segments whose replicas the backups may now free.
//!
//! # Memory
//! `--memory` covers the segments and the object index: the store lowers the number of
//! segments the log may hold as the index grows ([`SegmentedLog::set_segments_limit`],
//! `INDEX_BYTES_PER_OBJECT` per object), and pooled buffers beyond it are given back
//! to the system; it admits a new key only while the index and the segments held, the
//! cleaner's reserve included, fit (`ObjectStore::stage`).
//!
//! # Accounting
//! Each segment counts its *live bytes* — object, tombstone and completion-record entries
//! appended and not yet known dead ([`SegmentedLog::note_dead`], called by the store when
//! the index lets go of an object or a record is acknowledged) — and a *stamp*, the log clock (bytes ever appended) at its last
//! append: the `u` and `age` of the cleaner's cost-benefit choice. A tombstone counts as
//! live until the segment of the version it kills is freed: one per overwrite that
//! lands in another segment (`ObjectStore`'s module doc, "Removals"), so counting them
//! live until cleaned would make segments look fuller than they are.
//!
//! # Memory
//! The log's memory is allocated and touched once, when the log is created: a
//! [`SegmentPool`] of `memory / segment_bytes` buffers, every page faulted in
//! (`MADV_POPULATE_WRITE`, else by writing zeros). New segments take their buffer from
//! the pool, so neither a write nor a recovery replaying into this log pays a page fault
//! or the kernel's zeroing of a fresh page (1.2–1.6 GB/s on the development VM, slower
//! than every other step of replay). The cost moves to start-up: ≈ 0.4 s per GiB there,
//! and the whole `--memory` is resident from the start, as in RAMCloud.

use bytes::Bytes;
use rampart_common::buffer_pool;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{SegmentId, ServerId, TableId, Version};
use rampart_common::limits::KEY_BYTES_MAX;
use rampart_common::log::{
    decode_object_trusted, digest_entry_bytes, object_entry_bytes, tombstone_entry_bytes,
    CompletionEntry, LogFull, ObjectEntry, SegmentWriter, COMPLETION_ENTRY_BYTES,
    ENTRY_HEADER_BYTES, SAFE_VERSION_ENTRY_BYTES,
};
use std::collections::BTreeMap;

use crate::object_index::LogRef;

/// Segment buffers a rollover leaves free for the cleaner: one survivor (a commit needs
/// no buffer, see the module doc).
pub const CLEANER_RESERVE_SEGMENTS: u64 = 1;

/// The log has no room for the entry and no free segment to roll over to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("log memory is full")]
pub struct NoSpace;

/// Bytes `[start, end)` of one segment, appended but not yet handed to replication
/// ([`SegmentedLog::take_unreplicated`]); the replicator sends exactly these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRange {
    /// The segment.
    pub segment: SegmentId,
    /// First byte.
    pub start: u32,
    /// One past the last byte.
    pub end: u32,
    /// Whether the segment was closed by this range (its footer is inside).
    pub closes: bool,
}

/// A sealed range with its bytes, copied out of the log when it was taken
/// ([`SegmentedLog::take_unreplicated`]): what the replicator writes, with no way back
/// into the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedRange {
    /// Where the bytes lie.
    pub range: SegmentRange,
    /// Bytes `[range.start, range.end)` of the segment.
    pub bytes: Bytes,
    /// Bytes every segment of this log (hence every frame of it) holds.
    pub capacity: u32,
}

/// An older version of a key that an append makes dead, and the segment holding it:
/// the append writes a tombstone for it (`ObjectStore`'s module doc, "Removals").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superseded {
    /// The older version.
    pub version: Version,
    /// The segment that holds it.
    pub segment: SegmentId,
}

/// Where a group append ([`SegmentedLog::append_object_completing`]) put its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The object (or the removal's tombstone).
    pub at: LogRef,
    /// The completion record, when one was given.
    pub record_at: Option<LogRef>,
    /// Bytes of the tombstone written for the superseded version; 0 when none was
    /// needed (no older version, or one in the same segment).
    pub tombstone_bytes: u64,
}

/// One segment in memory with its cleaning facts.
#[derive(Debug)]
struct LogSegment {
    writer: SegmentWriter,
    /// Bytes of object and tombstone entries not known dead (module doc, "Accounting").
    live_bytes: u64,
    /// The log clock at its last append.
    stamp: u64,
}

impl LogSegment {
    fn new(writer: SegmentWriter, stamp: u64) -> LogSegment {
        LogSegment {
            writer,
            live_bytes: 0,
            stamp,
        }
    }
}

/// What the cleaner's choice needs of one closed segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentUsage {
    /// The segment.
    pub segment: SegmentId,
    /// Bytes of entries not known dead.
    pub live_bytes: u64,
    /// The log clock at its last append.
    pub stamp: u64,
}

/// Where the log's memory stands, for the cleaner's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogUsage {
    /// Segments the memory may hold now (less what the object index takes).
    pub segments_max: u64,
    /// Buffers not holding a segment (the cleaner's reserve included).
    pub segments_free: u64,
    /// Live bytes in every segment (survivors included).
    pub live_bytes: u64,
    /// Bytes each segment holds.
    pub segment_bytes: u32,
    /// The log clock: bytes appended since the log began.
    pub clock: u64,
}

/// A master's log in DRAM.
#[derive(Debug)]
pub struct SegmentedLog {
    log_id: ServerId,
    segment_bytes: u32,
    segments_max: u64,
    /// The log: every segment the head's last digest names, by id.
    /// Invariants: 1. exactly one segment (the head) is open; every other is closed (a
    /// head-chain one with a footer naming its successor). 2. `segments.len() +
    /// survivors.len() + retired.len() + pool.len() <= segments_max` for a pool built
    /// for the configuration (equal until the index's growth trims the pool; a segment
    /// opened with the pool empty takes a fresh buffer).
    segments: BTreeMap<SegmentId, LogSegment>,
    head: SegmentId,
    /// Survivor segments the cleaner is writing or has closed, not yet in a digest.
    /// Readable (the index may point into them).
    survivors: BTreeMap<SegmentId, LogSegment>,
    /// Segments a digest dropped, kept in memory until that digest is on every replica.
    /// Nothing in the index points into them.
    retired: BTreeMap<SegmentId, LogSegment>,
    /// The number of the next survivor segment.
    next_survivor: u64,
    /// Bytes of entries ever appended (the log clock for segment ages).
    clock: u64,
    /// Ranges appended since the last `take_unreplicated`, in append order.
    /// Invariant: a new head's header and digest range precedes the old head's closing
    /// range, as the digest-and-footer protocol requires.
    unreplicated: Vec<SegmentRange>,
    /// Where the last handed-off range of each segment ended (its replicated length).
    handed_off: BTreeMap<SegmentId, u32>,
    /// Bytes of tombstones by (segment of the version they kill, segment holding them):
    /// once the first is freed they are dead, and the second's live bytes drop
    /// (module doc, "Accounting"). Invariant: the pairs of every tombstone in the log,
    /// as far as the first segment is held; a pair goes when its first segment is freed.
    tombstone_bytes: BTreeMap<(SegmentId, SegmentId), u64>,
    /// Buffers for the segments still to open. A failed opening gives its buffer back.
    pool: SegmentPool,
    /// Segments the memory may hold now: `segments_max` less what the object index
    /// takes (`ObjectStore` sets it, [`SegmentedLog::set_segments_limit`]).
    segments_limit: u64,
    /// The largest group of entries one append puts in one segment: what
    /// `MasterConfig::validate` makes sure a fresh segment holds beside its digest.
    group_bytes_max: usize,
}

/// Segment buffers allocated and touched ahead of use (module doc, "Memory").
#[derive(Debug)]
pub struct SegmentPool {
    free: Vec<Vec<u8>>,
    segment_bytes: usize,
}

impl SegmentPool {
    /// The whole memory of a log configured as `config`, touched.
    pub fn for_config(config: &MasterConfig) -> SegmentPool {
        SegmentPool::touched(config.segments_max(), config.segment_bytes)
    }

    /// `segments` buffers of `segment_bytes` each, every page of them faulted in.
    pub fn touched(segments: u64, segment_bytes: u32) -> SegmentPool {
        let segment_bytes = segment_bytes as usize;
        let free = (0..segments)
            .map(|_| {
                let mut buffer = Vec::with_capacity(segment_bytes);
                touch_spare_capacity(&mut buffer);
                buffer
            })
            .collect();
        SegmentPool {
            free,
            segment_bytes,
        }
    }

    /// A buffer of at least the segment size: a touched one while any is left, else a
    /// fresh allocation (never needed while the log respects its bound).
    pub fn take(&mut self) -> Vec<u8> {
        self.free
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.segment_bytes))
    }

    /// Returns a segment's buffer for reuse (its contents are discarded on reuse).
    pub fn give_back(&mut self, buffer: Vec<u8>) {
        if buffer.capacity() >= self.segment_bytes {
            self.free.push(buffer);
        }
    }

    /// Keeps at most `keep` buffers, giving the others back to the system.
    pub fn trim(&mut self, keep: usize) {
        self.free.truncate(keep);
    }

    /// Buffers ready for new segments.
    pub fn len(&self) -> usize {
        self.free.len()
    }

    /// Whether no buffer is left.
    pub fn is_empty(&self) -> bool {
        self.free.is_empty()
    }
}

/// Faults in every page of `buffer`'s spare capacity, writable, without changing its
/// length. `MADV_POPULATE_WRITE` (Linux 5.14) does it in one call, about twice as fast
/// as writing each page (measured on the development VM: 2.4 against 1.3 GB/s); where
/// it is refused, zeros are written. The partial pages at either end are written.
fn touch_spare_capacity(buffer: &mut Vec<u8>) {
    let spare = buffer.spare_capacity_mut();
    if spare.is_empty() {
        return;
    }
    let page = page_bytes();
    let start = spare.as_ptr() as usize;
    let end = start + spare.len();
    let (inner_start, inner_end) = (start.next_multiple_of(page), end / page * page);
    let populated = inner_end > inner_start && populate_write(inner_start, inner_end - inner_start);
    if populated {
        let (head, rest) = spare.split_at_mut(inner_start - start);
        head.fill(std::mem::MaybeUninit::new(0));
        let tail_at = inner_end - inner_start;
        rest[tail_at..].fill(std::mem::MaybeUninit::new(0));
    } else {
        spare.fill(std::mem::MaybeUninit::new(0));
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn populate_write(start: usize, len: usize) -> bool {
    // SAFETY: `[start, start + len)` is page-aligned memory inside one live allocation
    // we hold mutably; MADV_POPULATE_WRITE only faults its pages in (as a write of
    // their current contents would), it never changes what they hold.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn populate_write(_start: usize, _len: usize) -> bool {
    false
}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

impl SegmentedLog {
    /// A log for master `log_id` with its first segment open.
    ///
    /// # Panics
    /// If `config` was not validated (a segment too small for its own header).
    pub fn new(log_id: ServerId, config: &MasterConfig, safe_version: Version) -> SegmentedLog {
        let pool = SegmentPool::for_config(config);
        SegmentedLog::with_pool(log_id, config, safe_version, pool)
    }

    /// [`SegmentedLog::new`] in the buffers of `pool` (built for `config` beforehand,
    /// e.g. before a server announces itself, since touching takes time).
    ///
    /// # Panics
    /// As [`SegmentedLog::new`].
    pub fn with_pool(
        log_id: ServerId,
        config: &MasterConfig,
        safe_version: Version,
        pool: SegmentPool,
    ) -> SegmentedLog {
        let first = SegmentId(1);
        let mut log = SegmentedLog {
            log_id,
            segment_bytes: config.segment_bytes,
            segments_max: config.segments_max(),
            segments: BTreeMap::new(),
            head: first,
            survivors: BTreeMap::new(),
            retired: BTreeMap::new(),
            next_survivor: 0,
            clock: 0,
            unreplicated: Vec::new(),
            handed_off: BTreeMap::new(),
            tombstone_bytes: BTreeMap::new(),
            pool,
            segments_limit: config.segments_max(),
            group_bytes_max: object_entry_bytes(KEY_BYTES_MAX, config.value_bytes_max)
                + COMPLETION_ENTRY_BYTES,
        };
        let head = log
            .open_segment(first, safe_version)
            .expect("a validated config holds a first segment");
        log.segments.insert(first, LogSegment::new(head, 0));
        log.note_appended(first);
        log
    }

    fn open_segment(
        &mut self,
        id: SegmentId,
        safe_version: Version,
    ) -> Result<SegmentWriter, NoSpace> {
        let digest: Vec<SegmentId> = self
            .segments
            .keys()
            .copied()
            .chain(std::iter::once(id))
            .collect();
        // A buffer that does not become a segment goes back to the pool: the log's memory
        // bound counts on every buffer (a configuration that validates never fails here).
        let buffer = self.pool.take();
        let mut segment =
            match SegmentWriter::open_in(buffer, self.log_id, id, self.segment_bytes, &digest) {
                Ok(segment) => segment,
                Err((_, buffer)) => {
                    self.pool.give_back(buffer);
                    return Err(NoSpace);
                }
            };
        if segment.append_safe_version(safe_version).is_err() {
            self.pool.give_back(segment.into_buffer());
            return Err(NoSpace);
        }
        segment.seal_batch();
        Ok(segment)
    }

    fn head_mut(&mut self) -> &mut SegmentWriter {
        &mut self
            .segments
            .get_mut(&self.head)
            .expect("the head segment is always live")
            .writer
    }

    /// Bytes every head keeps free for a digest of the whole memory's segments, so that
    /// the cleaner's commit ([`SegmentedLog::commit_cleaning`]) never needs a new buffer.
    pub fn digest_room(&self) -> usize {
        digest_entry_bytes(usize::try_from(self.segments_max).unwrap_or(usize::MAX))
    }

    /// Appends an object; rolls over to a new segment when the head is full.
    pub fn append_object(
        &mut self,
        table: TableId,
        version: Version,
        key: &[u8],
        value: &[u8],
        safe_version: Version,
    ) -> Result<LogRef, NoSpace> {
        let bytes = object_entry_bytes(key.len(), value.len());
        let at = self.append_with(safe_version, bytes, |_, segment| {
            segment.append_object(table, version, key, value)
        })?;
        self.count_live(at.segment, bytes as u64);
        Ok(at)
    }

    /// Appends a tombstone for the object `version` of `key` that lives in `segment`.
    pub fn append_tombstone(
        &mut self,
        table: TableId,
        version: Version,
        object_segment: SegmentId,
        key: &[u8],
        safe_version: Version,
    ) -> Result<LogRef, NoSpace> {
        let bytes = tombstone_entry_bytes(key.len());
        let at = self.append_with(safe_version, bytes, |_, segment| {
            segment.append_tombstone(table, version, object_segment, key)
        })?;
        self.count_live(at.segment, bytes as u64);
        self.note_tombstone(object_segment, at.segment, bytes as u64);
        Ok(at)
    }

    /// Appends an object, then — when `superseded` names an older version of the key
    /// in another segment — a tombstone for that version, then, when `record` is given,
    /// its completion record, in one append: all land in the same segment (a rollover
    /// comes before the group, never inside it), so they are sealed, replicated and
    /// recovered together (`rampart_common::rifl`). The object comes first: a prefix of
    /// the group that a crash keeps never kills the old version without the new one.
    /// Returns where the entries are.
    #[allow(clippy::too_many_arguments)]
    pub fn append_object_completing(
        &mut self,
        table: TableId,
        version: Version,
        key: &[u8],
        value: &[u8],
        superseded: Option<Superseded>,
        record: Option<&CompletionEntry>,
        safe_version: Version,
    ) -> Result<Appended, NoSpace> {
        let object_bytes = object_entry_bytes(key.len(), value.len());
        self.append_group(
            safe_version,
            object_bytes,
            (table, key, superseded),
            record,
            |segment| segment.append_object(table, version, key, value),
        )
    }

    /// [`append_object_completing`](Self::append_object_completing) for a tombstone of
    /// the version it removes (which needs no second tombstone).
    pub fn append_tombstone_completing(
        &mut self,
        table: TableId,
        version: Version,
        object_segment: SegmentId,
        key: &[u8],
        record: Option<&CompletionEntry>,
        safe_version: Version,
    ) -> Result<Appended, NoSpace> {
        let tombstone_bytes = tombstone_entry_bytes(key.len());
        let appended = self.append_group(
            safe_version,
            tombstone_bytes,
            (table, key, None),
            record,
            |segment| segment.append_tombstone(table, version, object_segment, key),
        )?;
        self.note_tombstone(object_segment, appended.at.segment, tombstone_bytes as u64);
        Ok(appended)
    }

    /// Appends an entry of `entry_bytes` with `append`, then the tombstone of
    /// `superseded` (unless it lies in the segment the entry lands in), then `record`,
    /// in one segment: the group is checked against the segment's room before any of it
    /// is written, so a segment never holds the entry without the rest.
    fn append_group(
        &mut self,
        safe_version: Version,
        entry_bytes: usize,
        (table, key, superseded): (TableId, &[u8], Option<Superseded>),
        record: Option<&CompletionEntry>,
        append: impl Fn(&mut SegmentWriter) -> Result<u32, LogFull>,
    ) -> Result<Appended, NoSpace> {
        let record_bytes = if record.is_some() {
            COMPLETION_ENTRY_BYTES
        } else {
            0
        };
        let tombstone_bytes = tombstone_entry_bytes(key.len());
        // Room for the tombstone is asked for even where it turns out not to be needed.
        let most = entry_bytes + superseded.map_or(0, |_| tombstone_bytes) + record_bytes;
        if most > self.group_bytes_max {
            return self.append_split(
                safe_version,
                entry_bytes,
                (table, key, superseded),
                record,
                append,
            );
        }
        let at = self.append_with(safe_version, most, |id, segment| {
            if segment.free_bytes() < most {
                return Err(LogFull);
            }
            let offset = append(segment)?;
            if let Some(old) = superseded.filter(|old| old.segment != id) {
                segment.append_tombstone(table, old.version, old.segment, key)?;
            }
            if let Some(record) = record {
                segment.append_completion(record)?;
            }
            Ok(offset)
        })?;
        let tombstone_bytes = match superseded {
            Some(old) if old.segment != at.segment => {
                self.note_tombstone(old.segment, at.segment, tombstone_bytes as u64);
                tombstone_bytes
            }
            _ => 0,
        };
        self.count_live(at.segment, (entry_bytes + tombstone_bytes) as u64);
        let record_at = record.map(|_| {
            let record_at = LogRef {
                segment: at.segment,
                offset: at.offset + (entry_bytes + tombstone_bytes) as u32,
            };
            self.count_live(at.segment, record_bytes as u64);
            record_at
        });
        Ok(Appended {
            at,
            record_at,
            tombstone_bytes: tombstone_bytes as u64,
        })
    }

    /// [`append_group`](Self::append_group) for a group no fresh segment is sure to hold
    /// (a key and value near their limits, and a tombstone for the older version): the
    /// entry and its record, then the tombstone in the next segment. A crash between them
    /// keeps the new version without the tombstone, which is safe (the new version masks
    /// the old one; it was not acknowledged). Both rollovers are checked first, so the
    /// tombstone never fails once the entry is in.
    fn append_split(
        &mut self,
        safe_version: Version,
        entry_bytes: usize,
        (table, key, superseded): (TableId, &[u8], Option<Superseded>),
        record: Option<&CompletionEntry>,
        append: impl Fn(&mut SegmentWriter) -> Result<u32, LogFull>,
    ) -> Result<Appended, NoSpace> {
        if self.segments_free() <= CLEANER_RESERVE_SEGMENTS + 1 {
            return Err(NoSpace);
        }
        let mut appended = self.append_group(
            safe_version,
            entry_bytes,
            (table, key, None),
            record,
            append,
        )?;
        if let Some(old) = superseded.filter(|old| old.segment != appended.at.segment) {
            self.append_tombstone(table, old.version, old.segment, key, safe_version)?;
            appended.tombstone_bytes = tombstone_entry_bytes(key.len()) as u64;
        }
        Ok(appended)
    }

    /// Appends a completion record alone: a recovery replaying one (the object it came
    /// with is replayed on its own).
    pub fn append_completion(
        &mut self,
        record: &CompletionEntry,
        safe_version: Version,
    ) -> Result<LogRef, NoSpace> {
        let at = self.append_with(safe_version, COMPLETION_ENTRY_BYTES, |_, segment| {
            segment.append_completion(record)
        })?;
        self.count_live(at.segment, COMPLETION_ENTRY_BYTES as u64);
        Ok(at)
    }

    /// A tombstone of `bytes` in `holder` kills a version in `target`.
    fn note_tombstone(&mut self, target: SegmentId, holder: SegmentId, bytes: u64) {
        *self.tombstone_bytes.entry((target, holder)).or_default() += bytes;
    }

    /// The cleaner moved a tombstone of `bytes` that kills a version in `target` from
    /// `from` into `to`.
    pub fn tombstone_moved(
        &mut self,
        target: SegmentId,
        from: SegmentId,
        to: SegmentId,
        bytes: u64,
    ) {
        if let Some(held) = self.tombstone_bytes.get_mut(&(target, from)) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                self.tombstone_bytes.remove(&(target, from));
            }
        }
        self.note_tombstone(target, to, bytes);
    }

    fn count_live(&mut self, segment: SegmentId, bytes: u64) {
        self.clock += bytes;
        let clock = self.clock;
        if let Some(segment) = self.segments.get_mut(&segment) {
            segment.live_bytes += bytes;
            segment.stamp = clock;
        }
    }

    fn append_with(
        &mut self,
        safe_version: Version,
        bytes: usize,
        append: impl Fn(SegmentId, &mut SegmentWriter) -> Result<u32, LogFull>,
    ) -> Result<LogRef, NoSpace> {
        // The head keeps room for a digest (`digest_room`) after every append.
        let room = self.digest_room();
        let head = self.head;
        if self.head_mut().free_bytes() >= bytes.saturating_add(room) {
            if let Ok(offset) = append(head, self.head_mut()) {
                return Ok(LogRef {
                    segment: self.head,
                    offset,
                });
            }
        }
        self.roll_over(safe_version, CLEANER_RESERVE_SEGMENTS)?;
        // A fresh head takes the largest entry (`MasterConfig::validate`), even where
        // the digest room does not fit beside it.
        let head = self.head;
        let offset = append(head, self.head_mut()).map_err(|_| NoSpace)?;
        Ok(LogRef {
            segment: self.head,
            offset,
        })
    }

    /// Opens a new head and closes the old one, in the order docs/design.md §4 requires,
    /// leaving at least `reserve` buffers free.
    fn roll_over(&mut self, safe_version: Version, reserve: u64) -> Result<(), NoSpace> {
        if self.segments_free() <= reserve {
            return Err(NoSpace);
        }
        let old = self.head;
        let new = SegmentId(old.0 + 1);
        let segment = self.open_segment(new, safe_version)?;
        self.segments
            .insert(new, LogSegment::new(segment, self.clock));
        self.note_appended(new);
        self.head = new;
        let old_segment = self.segments.get_mut(&old).expect("the old head is live");
        old_segment.writer.close(new);
        self.note_appended(old);
        Ok(())
    }

    /// Closes the head and opens a new one now, leaving the cleaner's reserve free
    /// (for a segment the cleaner must take at once: a closed segment is one it can).
    ///
    /// # Errors
    /// [`NoSpace`] when no buffer beyond the reserve is free.
    pub fn roll_over_now(&mut self, safe_version: Version) -> Result<(), NoSpace> {
        self.roll_over(safe_version, CLEANER_RESERVE_SEGMENTS)
    }

    /// Appends a `SafeVersion` floor to the head (rolling over when it is full), so that
    /// the log itself records a floor raised by recovery: replaying this log later must
    /// not hand out versions the crashed master already used.
    pub fn append_safe_version(&mut self, safe_version: Version) -> Result<(), NoSpace> {
        self.append_with(safe_version, SAFE_VERSION_ENTRY_BYTES, |_, segment| {
            segment.append_safe_version(safe_version)
        })
        .map(|_| ())
    }

    /// Closes the current append batch with a Tailwind checksum.
    pub fn seal_batch(&mut self) {
        self.head_mut().seal_batch();
        let head = self.head;
        self.note_appended(head);
    }

    /// Records the bytes of `segment` past what was handed off as unreplicated.
    fn note_appended(&mut self, segment: SegmentId) {
        let Some(writer) = self.writer(segment) else {
            return;
        };
        let end = writer.committed_len();
        let closes = writer.is_closed();
        let start = self.handed_off.get(&segment).copied().unwrap_or(0);
        if end > start {
            self.unreplicated.push(SegmentRange {
                segment,
                start,
                end,
                closes,
            });
            self.handed_off.insert(segment, end);
        }
    }

    /// The sealed ranges appended since the last call, in the order they must reach
    /// the replicas, each with a copy of its bytes (a large copy in a buffer of the
    /// process's `buffer_pool`: a recovery's batches of megabytes reuse memory already
    /// touched).
    pub fn take_unreplicated(&mut self) -> Vec<SealedRange> {
        std::mem::take(&mut self.unreplicated)
            .into_iter()
            .map(|range| {
                let bytes = self
                    .segment_bytes(range.segment)
                    .and_then(|bytes| bytes.get(range.start as usize..range.end as usize))
                    .expect("an unreplicated range lies in a live segment: none is freed first");
                SealedRange {
                    range,
                    bytes: buffer_pool::shared().copy(bytes),
                    capacity: self.segment_bytes,
                }
            })
            .collect()
    }

    /// The segment `id` wherever it is held: the log, the survivors, the retired.
    fn writer(&self, id: SegmentId) -> Option<&SegmentWriter> {
        self.segments
            .get(&id)
            .or_else(|| self.survivors.get(&id))
            .or_else(|| self.retired.get(&id))
            .map(|s| &s.writer)
    }

    /// The object entry at `at`, decoded without re-verifying its CRC: this is the
    /// read path, and the bytes were checksummed when this master wrote them.
    ///
    /// # Panics
    /// If `at` does not point at an object entry: index references always do
    /// (invariant of `ObjectIndex`), so this is a programmer error.
    pub fn object(&self, at: LogRef) -> ObjectEntry<'_> {
        let segment = self
            .writer(at.segment)
            .expect("index references live segments");
        decode_object_trusted(segment.bytes(), at.offset as usize)
            .unwrap_or_else(|| panic!("log reference {at:?} is not an object entry"))
    }

    /// The whole entry at `at` (an object or a completion record the index or the
    /// records point at), its header and CRC included: the bytes another master
    /// replays, copied as they are.
    ///
    /// # Panics
    /// If `at` does not point at an entry of a held segment (a programmer error, as for
    /// [`object`](Self::object)).
    pub fn entry_bytes(&self, at: LogRef) -> &[u8] {
        let bytes = self
            .writer(at.segment)
            .expect("references point into held segments")
            .bytes();
        let start = at.offset as usize;
        let stated = bytes
            .get(start + 1..start + ENTRY_HEADER_BYTES)
            .and_then(|len| <[u8; 4]>::try_from(len).ok())
            .map(u32::from_le_bytes)
            .unwrap_or_else(|| panic!("log reference {at:?} is past its segment"));
        &bytes[start..start + ENTRY_HEADER_BYTES + stated as usize]
    }

    /// The key of the object entry at `at`.
    pub fn key(&self, at: LogRef) -> &[u8] {
        self.object(at).key
    }

    /// The bytes of one segment (what its replicas hold): of the log, a survivor not yet
    /// committed, or a retired segment not yet freed.
    pub fn segment_bytes(&self, id: SegmentId) -> Option<&[u8]> {
        self.writer(id).map(SegmentWriter::bytes)
    }

    /// Whether `id` is part of the log (named by the head's last digest) or a survivor
    /// about to be: what a tombstone for an object in `id` must outlive.
    pub fn holds(&self, id: SegmentId) -> bool {
        self.segments.contains_key(&id) || self.survivors.contains_key(&id)
    }

    /// Whose log this is.
    pub fn log_id(&self) -> ServerId {
        self.log_id
    }

    /// Bytes each segment holds.
    pub fn segment_capacity(&self) -> u32 {
        self.segment_bytes
    }

    /// The head segment's id.
    pub fn head(&self) -> SegmentId {
        self.head
    }

    /// Ids of every segment of the log (what the head's last digest names).
    pub fn segment_ids(&self) -> impl Iterator<Item = SegmentId> + '_ {
        self.segments.keys().copied()
    }

    /// Bytes of memory the log holds (whole segments: the log's, survivors, retired).
    pub fn bytes_used(&self) -> u64 {
        self.segments_held() * u64::from(self.segment_bytes)
    }

    /// Bytes of memory the log may hold.
    pub fn bytes_max(&self) -> u64 {
        self.segments_max * u64::from(self.segment_bytes)
    }

    /// Segments held in memory: the log's, survivors and retired ones.
    pub fn segments_held(&self) -> u64 {
        (self.segments.len() + self.survivors.len() + self.retired.len()) as u64
    }

    /// Segments that may still open within the memory (the cleaner's reserve included).
    pub fn segments_free(&self) -> u64 {
        self.segments_max
            .min(self.segments_limit)
            .saturating_sub(self.segments_held())
    }

    /// The memory may hold `limit` segments now (the rest of it holds the object
    /// index). Pooled buffers beyond what may still open are given back to the system;
    /// segments already held stay (no new one opens until enough are freed).
    pub fn set_segments_limit(&mut self, limit: u64) {
        self.segments_limit = limit;
        let keep = usize::try_from(self.segments_free()).unwrap_or(usize::MAX);
        self.pool.trim(keep);
    }

    /// Buffers allocated and waiting in the pool.
    pub fn segments_pooled(&self) -> u64 {
        self.pool.len() as u64
    }

    /// Where the memory stands (module doc, "Accounting").
    pub fn usage(&self) -> LogUsage {
        let live_bytes = self
            .segments
            .values()
            .chain(self.survivors.values())
            .map(|s| s.live_bytes)
            .sum();
        LogUsage {
            segments_max: self.segments_max.min(self.segments_limit),
            segments_free: self.segments_free(),
            live_bytes,
            segment_bytes: self.segment_bytes,
            clock: self.clock,
        }
    }

    /// The closed segments of the log, which the cleaner may choose from.
    pub fn closed_segments(&self) -> Vec<SegmentUsage> {
        self.segments
            .iter()
            .filter(|(id, s)| **id != self.head && s.writer.is_closed())
            .map(|(id, s)| SegmentUsage {
                segment: *id,
                live_bytes: s.live_bytes,
                stamp: s.stamp,
            })
            .collect()
    }

    /// The entry of `bytes` bytes at `at` is dead (the index let go of it, or it never
    /// got there): it no longer counts as live in its segment.
    pub fn note_dead(&mut self, at: LogRef, bytes: u64) {
        if let Some(segment) = self
            .segments
            .get_mut(&at.segment)
            .or_else(|| self.survivors.get_mut(&at.segment))
        {
            segment.live_bytes = segment.live_bytes.saturating_sub(bytes);
        }
    }

    /// Opens a new survivor segment for the cleaner, in any free buffer (the cleaner's
    /// reserve included); it carries the log clock `stamp` of the data it will hold.
    ///
    /// # Errors
    /// [`NoSpace`] when no buffer is free.
    pub fn open_survivor(&mut self, stamp: u64) -> Result<SegmentId, NoSpace> {
        if self.segments_free() == 0 {
            return Err(NoSpace);
        }
        let id = SegmentId::survivor(self.next_survivor);
        let buffer = self.pool.take();
        let writer =
            match SegmentWriter::open_survivor_in(buffer, self.log_id, id, self.segment_bytes) {
                Ok(writer) => writer,
                Err((_, buffer)) => {
                    self.pool.give_back(buffer);
                    return Err(NoSpace);
                }
            };
        self.next_survivor += 1;
        self.survivors.insert(id, LogSegment::new(writer, stamp));
        self.note_appended(id);
        Ok(id)
    }

    /// Copies the entry at bytes `[start, end)` of segment `from` (an object or a
    /// tombstone of the log) into the open survivor `survivor`, as it is; returns its
    /// new place. [`LogFull`] when it does not fit (close the survivor, open another).
    ///
    /// # Panics
    /// If `from` is not a segment of the log, the range not an entry of it, or
    /// `survivor` not an open survivor (programmer errors).
    pub fn copy_entry(
        &mut self,
        from: SegmentId,
        (start, end): (u32, u32),
        survivor: SegmentId,
    ) -> Result<LogRef, LogFull> {
        let source = &self
            .segments
            .get(&from)
            .unwrap_or_else(|| panic!("{from} is not a segment of the log"))
            .writer;
        let entry = &source.bytes()[start as usize..end as usize];
        let segment = self
            .survivors
            .get_mut(&survivor)
            .unwrap_or_else(|| panic!("{survivor} is not a survivor being written"));
        let offset = segment.writer.append_copy(entry)?;
        segment.live_bytes += u64::from(end - start);
        Ok(LogRef {
            segment: survivor,
            offset,
        })
    }

    /// Copies the object entry `object` into the open survivor `survivor`; returns its
    /// new place. [`LogFull`] when it does not fit (close the survivor, open another).
    ///
    /// # Panics
    /// If `survivor` is not an open survivor (a programmer error).
    pub fn relocate_object(
        &mut self,
        survivor: SegmentId,
        table: TableId,
        version: Version,
        key: &[u8],
        value: &[u8],
    ) -> Result<LogRef, LogFull> {
        let bytes = object_entry_bytes(key.len(), value.len()) as u64;
        let segment = self.survivor_mut(survivor);
        let offset = segment.writer.append_object(table, version, key, value)?;
        segment.live_bytes += bytes;
        Ok(LogRef {
            segment: survivor,
            offset,
        })
    }

    /// Copies a tombstone into the open survivor `survivor` (see
    /// [`SegmentedLog::relocate_object`]).
    ///
    /// # Panics
    /// As [`SegmentedLog::relocate_object`].
    pub fn relocate_tombstone(
        &mut self,
        survivor: SegmentId,
        table: TableId,
        version: Version,
        object_segment: SegmentId,
        key: &[u8],
    ) -> Result<(), LogFull> {
        let bytes = tombstone_entry_bytes(key.len()) as u64;
        let segment = self.survivor_mut(survivor);
        segment
            .writer
            .append_tombstone(table, version, object_segment, key)?;
        segment.live_bytes += bytes;
        Ok(())
    }

    fn survivor_mut(&mut self, survivor: SegmentId) -> &mut LogSegment {
        self.survivors
            .get_mut(&survivor)
            .unwrap_or_else(|| panic!("{survivor} is not a survivor being written"))
    }

    /// Seals what was relocated into the open survivor `survivor` as one batch, for
    /// replication.
    pub fn seal_survivor(&mut self, survivor: SegmentId) {
        self.survivor_mut(survivor).writer.seal_batch();
        self.note_appended(survivor);
    }

    /// Closes the survivor `survivor` (its pending entries sealed with the footer). A
    /// survivor's footer names no successor in the log; it is written as the next id,
    /// what a closed replica reports, and recovery ignores it.
    pub fn close_survivor(&mut self, survivor: SegmentId) {
        let segment = self.survivor_mut(survivor);
        if !segment.writer.is_closed() {
            segment.writer.close(SegmentId(survivor.0 + 1));
        }
        self.note_appended(survivor);
    }

    /// The cleaner's commit (module doc, "Space and cleaning"): every closed survivor
    /// joins the log, `cleaned` leave it for the retired set, and a digest of the log's
    /// segments is appended to the head and sealed (a rollover when it does not fit).
    /// Ids in `cleaned` that are not closed segments of the log are ignored.
    ///
    /// # Errors
    /// [`NoSpace`] when the digest fits neither in the head nor in a new head (no free
    /// buffer): nothing changed.
    pub fn commit_cleaning(
        &mut self,
        cleaned: &[SegmentId],
        safe_version: Version,
    ) -> Result<(), NoSpace> {
        let closed: Vec<SegmentId> = self
            .survivors
            .iter()
            .filter(|(_, s)| s.writer.is_closed())
            .map(|(id, _)| *id)
            .collect();
        let cleaned: Vec<SegmentId> = cleaned
            .iter()
            .copied()
            .filter(|id| {
                *id != self.head && self.segments.get(id).is_some_and(|s| s.writer.is_closed())
            })
            .collect();
        let digest: Vec<SegmentId> = self
            .segments
            .keys()
            .copied()
            .filter(|id| !cleaned.contains(id))
            .chain(closed.iter().copied())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let fits = self.head_mut().append_digest(&digest).is_ok();
        if !fits {
            // Whatever was appended to the head is sealed first: the new head's digest,
            // written by the rollover from `segments`, must see the change made below.
            self.seal_batch();
            if self.segments_free() == 0 {
                return Err(NoSpace);
            }
        }
        move_segments(&closed, &mut self.survivors, &mut self.segments);
        move_segments(&cleaned, &mut self.segments, &mut self.retired);
        if !fits {
            if let Err(full) = self.roll_over(safe_version, 0) {
                // Undone: the cleaned segments stay in the log, the survivors wait.
                move_segments(&cleaned, &mut self.retired, &mut self.segments);
                move_segments(&closed, &mut self.segments, &mut self.survivors);
                return Err(full);
            }
        }
        self.seal_batch();
        Ok(())
    }

    /// Frees the retired segments (their digest is on every replica): buffers back to
    /// the pool. Returns their ids, whose replicas the backups may now free.
    pub fn free_retired(&mut self) -> Vec<SegmentId> {
        let retired = std::mem::take(&mut self.retired);
        let mut freed = Vec::with_capacity(retired.len());
        for (id, segment) in retired {
            self.handed_off.remove(&id);
            self.pool.give_back(segment.writer.into_buffer());
            freed.push(id);
        }
        // The tombstones that killed versions in the freed segments are dead now.
        for &id in &freed {
            let pairs: Vec<((SegmentId, SegmentId), u64)> = self
                .tombstone_bytes
                .range((id, SegmentId(0))..=(id, SegmentId(u64::MAX)))
                .map(|(&pair, &bytes)| (pair, bytes))
                .collect();
            for ((target, holder), bytes) in pairs {
                self.tombstone_bytes.remove(&(target, holder));
                if let Some(segment) = self
                    .segments
                    .get_mut(&holder)
                    .or_else(|| self.survivors.get_mut(&holder))
                {
                    segment.live_bytes = segment.live_bytes.saturating_sub(bytes);
                }
            }
        }
        freed
    }

    /// Survivors being written or closed, not yet committed.
    pub fn survivor_ids(&self) -> impl Iterator<Item = SegmentId> + '_ {
        self.survivors.keys().copied()
    }
}

/// Moves the segments `ids` held in `from` to `to`.
fn move_segments(
    ids: &[SegmentId],
    from: &mut BTreeMap<SegmentId, LogSegment>,
    to: &mut BTreeMap<SegmentId, LogSegment>,
) {
    for id in ids {
        if let Some(segment) = from.remove(id) {
            to.insert(*id, segment);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::log::scanner::scan;

    fn small_config(segments: u64) -> MasterConfig {
        MasterConfig {
            segment_bytes: 4096,
            memory_bytes: 4096 * segments,
            value_bytes_max: 512,
            ..Default::default()
        }
    }

    /// Whether every whole page of `buffer`'s allocation is resident (`mincore`).
    fn resident(buffer: &[u8], capacity: usize) -> bool {
        let page = page_bytes();
        let start = (buffer.as_ptr() as usize).next_multiple_of(page);
        let end = (buffer.as_ptr() as usize + capacity) / page * page;
        let pages = (end - start) / page;
        let mut flags = vec![0u8; pages];
        // SAFETY: `[start, end)` is page-aligned and inside a live allocation; `flags`
        // has one byte per page, as mincore requires.
        let result =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, flags.as_mut_ptr()) };
        result == 0 && pages > 0 && flags.iter().all(|f| f & 1 == 1)
    }

    #[test]
    fn the_log_memory_is_touched_at_creation_and_segments_open_in_it() {
        const SEGMENT: u32 = 64 * 1024;
        let config = MasterConfig {
            segment_bytes: SEGMENT,
            memory_bytes: u64::from(SEGMENT) * 8,
            value_bytes_max: 4096,
            ..Default::default()
        };
        let mut log = SegmentedLog::new(ServerId(7), &config, Version(1));
        // The first segment took one buffer; the other seven wait, every page resident.
        assert_eq!(log.pool.len(), 7);
        let pooled: Vec<*const u8> = log.pool.free.iter().map(|b| b.as_ptr()).collect();
        for buffer in &log.pool.free {
            assert!(
                resident(buffer, buffer.capacity()),
                "a pooled buffer is not touched"
            );
        }
        let value = [7u8; 4000];
        while log
            .append_object(TableId(1), Version(1), b"k", &value, Version(1))
            .is_ok()
        {
            log.seal_batch();
        }
        // Full after the eight segments less the cleaner's reserve, each in a pooled
        // buffer; the reserve stays in the pool.
        assert_eq!(log.pool.len() as u64, CLEANER_RESERVE_SEGMENTS);
        assert_eq!(
            log.segment_ids().count() as u64,
            8 - CLEANER_RESERVE_SEGMENTS
        );
        for id in log.segment_ids().skip(1) {
            let at = log
                .segment_bytes(id)
                .expect("every listed segment has bytes")
                .as_ptr();
            assert!(
                pooled.contains(&at),
                "{id} was not opened in a pooled buffer"
            );
        }
    }

    #[test]
    fn a_buffer_given_back_to_the_pool_is_reused() {
        let mut pool = SegmentPool::touched(1, 4096);
        let first = pool.take();
        assert!(pool.is_empty());
        let memory = first.as_ptr();
        pool.give_back(first);
        let again = pool.take();
        assert_eq!(again.as_ptr(), memory);
        // A buffer too small for a segment is not kept.
        pool.give_back(Vec::with_capacity(100));
        assert!(pool.is_empty());
    }

    #[test]
    fn a_segment_that_cannot_open_gives_its_buffer_back() {
        // Segments too small for the digest of every segment the memory allows (a
        // configuration `validate` refuses): openings fail once the digest outgrows them.
        const SEGMENT: u32 = 512;
        let config = MasterConfig {
            segment_bytes: SEGMENT,
            memory_bytes: u64::from(SEGMENT) * 200,
            value_bytes_max: 64,
            ..Default::default()
        };
        assert!(config.validate().is_err());
        let mut log = SegmentedLog::new(ServerId(7), &config, Version(1));
        while log
            .append_object(TableId(1), Version(1), b"k", &[7; 64], Version(1))
            .is_ok()
        {
            log.seal_batch();
        }
        // Each later append opens a segment whose digest leaves no room for the object,
        // or fails to open one at all.
        for _ in 0..300 {
            assert!(log
                .append_object(TableId(1), Version(1), b"k", &[7; 64], Version(1))
                .is_err());
        }
        let segments = log.segment_ids().count();
        assert!(segments < 200, "openings failed before the bound");
        assert_eq!(
            segments + log.pool.len(),
            200,
            "every failed opening gave its buffer back"
        );
    }

    #[test]
    fn rollover_writes_digest_before_closing_the_old_head() {
        let mut log = SegmentedLog::new(ServerId(7), &small_config(4), Version(1));
        log.take_unreplicated();
        let value = [7u8; 500];
        let mut refs = Vec::new();
        while log.head() == SegmentId(1) {
            refs.push(
                log.append_object(TableId(1), Version(1), b"k", &value, Version(1))
                    .unwrap(),
            );
            log.seal_batch();
        }
        let ranges: Vec<SegmentRange> = log.take_unreplicated().iter().map(|r| r.range).collect();
        let new_head = ranges
            .iter()
            .position(|r| r.segment == SegmentId(2) && r.start == 0);
        let close_old = ranges
            .iter()
            .position(|r| r.segment == SegmentId(1) && r.closes);
        assert!(new_head.unwrap() < close_old.unwrap());

        let old = scan(log.segment_bytes(SegmentId(1)).unwrap());
        assert!(old.closed);
        assert_eq!(old.successor, Some(SegmentId(2)));
        let new = scan(log.segment_bytes(SegmentId(2)).unwrap());
        assert_eq!(new.digest, Some(vec![SegmentId(1), SegmentId(2)]));
        for r in refs {
            assert_eq!(log.object(r).value, &value[..]);
        }
    }

    #[test]
    fn full_log_refuses_appends_and_keeps_its_data() {
        let mut log = SegmentedLog::new(ServerId(1), &small_config(3), Version(1));
        let value = [1u8; 500];
        let mut written = 0;
        let first = log
            .append_object(TableId(1), Version(1), b"first", &value, Version(1))
            .unwrap();
        while log
            .append_object(TableId(1), Version(2), b"k", &value, Version(1))
            .is_ok()
        {
            written += 1;
            log.seal_batch();
        }
        assert!(written > 8);
        // Full up to the cleaner's reserve, which a write never takes.
        assert_eq!(
            log.bytes_used(),
            log.bytes_max() - CLEANER_RESERVE_SEGMENTS * 4096
        );
        assert_eq!(log.segments_free(), CLEANER_RESERVE_SEGMENTS);
        assert_eq!(log.object(first).key, b"first");
        assert_eq!(
            log.append_object(TableId(1), Version(3), b"k", &value, Version(1)),
            Err(NoSpace)
        );
    }

    #[test]
    fn a_commit_names_the_survivors_and_frees_the_cleaned_only_when_asked() {
        let mut log = SegmentedLog::new(ServerId(1), &small_config(8), Version(1));
        let value = [3u8; 500];
        let first = log
            .append_object(TableId(1), Version(1), b"a", &value, Version(1))
            .unwrap();
        while log.head() == SegmentId(1) {
            log.append_object(TableId(1), Version(2), b"b", &value, Version(1))
                .unwrap();
            log.seal_batch();
        }
        log.take_unreplicated();
        let free = log.segments_free();
        // The cleaner copies `a` into a survivor and closes it.
        let survivor = log.open_survivor(7).unwrap();
        assert!(survivor.is_survivor());
        let bytes = log.segment_bytes(SegmentId(1)).unwrap();
        let end = first.offset + object_entry_bytes(1, value.len()) as u32;
        assert_eq!(bytes[first.offset as usize], 3, "an object entry");
        let moved = log
            .copy_entry(SegmentId(1), (first.offset, end), survivor)
            .unwrap();
        assert_eq!(log.object(moved).key, b"a");
        log.close_survivor(survivor);
        assert_eq!(log.segments_free(), free - 1);
        // Survivors are not in the log until the commit; then segment 1 is retired.
        assert!(!log.segment_ids().any(|s| s == survivor));
        log.commit_cleaning(&[SegmentId(1)], Version(1)).unwrap();
        let ids: Vec<SegmentId> = log.segment_ids().collect();
        assert_eq!(ids, vec![SegmentId(2), survivor]);
        let head = scan(log.segment_bytes(log.head()).unwrap());
        assert_eq!(head.digest, Some(vec![SegmentId(2), survivor]));
        // The survivor's ranges, then the digest's, in that order.
        let ranges: Vec<SegmentRange> = log.take_unreplicated().iter().map(|r| r.range).collect();
        let survivor_closed = ranges
            .iter()
            .position(|r| r.segment == survivor && r.closes);
        let digest = ranges.iter().position(|r| r.segment == SegmentId(2));
        assert!(survivor_closed.unwrap() < digest.unwrap());
        // Retired: still readable, still holding its buffer.
        assert!(log.segment_bytes(SegmentId(1)).is_some());
        assert_eq!(log.segments_free(), free - 1);
        assert_eq!(log.free_retired(), vec![SegmentId(1)]);
        assert!(log.segment_bytes(SegmentId(1)).is_none());
        assert_eq!(log.segments_free(), free);
        assert_eq!(log.object(moved).key, b"a");
    }

    #[test]
    fn unreplicated_ranges_cover_every_byte_once() {
        let mut log = SegmentedLog::new(ServerId(1), &small_config(8), Version(1));
        let mut covered: BTreeMap<SegmentId, u32> = BTreeMap::new();
        for i in 0..100u32 {
            let value = vec![i as u8; (i as usize * 13) % 400];
            log.append_object(
                TableId(1),
                Version(u64::from(i) + 1),
                b"key",
                &value,
                Version(1),
            )
            .unwrap();
            if i % 3 == 0 {
                log.seal_batch();
                for sealed in log.take_unreplicated() {
                    let range = sealed.range;
                    let end = covered.entry(range.segment).or_insert(0);
                    assert_eq!(*end, range.start, "ranges are contiguous");
                    let bytes = log.segment_bytes(range.segment).unwrap();
                    assert_eq!(
                        sealed.bytes,
                        bytes[range.start as usize..range.end as usize],
                        "a range carries its own bytes"
                    );
                    *end = range.end;
                }
            }
        }
        for (segment, end) in covered {
            let bytes = log.segment_bytes(segment).unwrap();
            assert_eq!(scan(bytes).valid_bytes, end);
        }
    }
}
