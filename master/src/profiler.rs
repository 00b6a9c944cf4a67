//! `Profiler` and `TabletProfiler`: where in the key-hash space of each owned tablet this
//! master's bytes and records lie, and the **will** computed from that — how to cut the
//! master's tablets into partitions that recovery masters can each replay in bounded
//! time (docs/design.md §5 "Tablet profiles and wills", §6 step 1). After RAMCloud's
//! `TabletProfiler`.
//!
//! Callers see four operations: [`Profiler::track`] one log entry (every append),
//! [`Profiler::untrack`] one (the cleaner, when it frees an entry), take and drop
//! tablets, and [`Profiler::will`]: partitions of at most `bytes_max` bytes and
//! `records_max` records that cover every profiled tablet exactly once. The module is
//! pure and deterministic: no clock, no randomness, no I/O, no locks.
//!
//! # What it hides
//! Each tablet is one *top bucket* over its whole range. A bucket counts bytes and
//! records; once its counts reach the split threshold ([`ProfilerConfig::split_bytes`]
//! or [`ProfilerConfig::split_records`]) it gets a child array of
//! [`BUCKETS_PER_ARRAY`] buckets splitting its range evenly, and later tracking in that
//! range goes to the child. The bucket keeps what it counted before: those records lie
//! *somewhere* in its range, nobody knows where (the "unknown" part). So dense hash
//! ranges are refined, sparse ones are not, and memory follows the data: at most
//! [`ProfilerConfig::arrays_max`] arrays in all; past the cap, buckets just keep counting.
//! A tiny table costs one top bucket, no array.
//!
//! # Guarantees of a will
//! For `will(bytes_max, records_max)` — call them P and N — where every entry in the
//! master's log was tracked once, when appended, and is untracked at most once, when the
//! cleaner frees it (recovery replays dead entries too, so they count until then):
//! 1. *Coverage.* Every (table, hash) of every profiled tablet lies in exactly one
//!    partition; partitions are in (table, hash) order, and adjacent ranges of one table
//!    inside a partition are merged. Empty ranges are covered like any other.
//! 2. *Upper bounds.* A partition's `bytes` and `records` are at least the bytes and
//!    records tracked (and not untracked) with a hash inside it. The counts of an
//!    ancestor bucket (one with a child) are added in full to every partition its range
//!    meets: when the depth-first scan enters its range, and again to a partition opened
//!    while still inside it.
//! 3. *Limits.* A partition's bounds are ≤ P and ≤ N, except for a partition that covers
//!    a single leaf bucket (one without a child) whose own counts plus those of its
//!    ancestors already pass a limit: a hot key (a bucket of one hash cannot split), a
//!    bucket refused a child by the arrays cap, or pessimism over deep ancestors.
//! 4. *Uncertainty.* A partition's reported bound exceeds its true count by at most the
//!    counts of the ancestor buckets whose ranges straddle its first or last hash, at
//!    most [`LEVELS_MAX`] at each end. An ancestor's counts froze when it split, just
//!    past the threshold, so with a tree of depth d at the partition's two ends:
//!    `reported − true ≤ 2·d·(split + largest entry)` (bytes; `2·d·split_records` for
//!    records). Two things can freeze more: counts a tablet inherited when it replaced
//!    an overlapping tablet ([`Profiler::take_tablet`]) sit in its top bucket, and a
//!    leaf that the arrays cap kept from splitting splits later, with all it counted
//!    meanwhile, if arrays are freed (a tablet dropped).
//! 5. *Balance.* A partition is closed only when the next bucket would push it past a
//!    limit, and a splittable leaf holds less than one split threshold, so every partition
//!    except the last and those next to a hot bucket holds truly more than
//!    `P − (2·d + 1)·(split + largest entry)` bytes or `N − (2·d + 1)·split_records`
//!    records. With [`ProfilerConfig::for_partitions`] (split = limit / 64) and uniform
//!    keys, d = 1 up to 4 partitions' worth of data in a tablet and d = 2 up to 1,024,
//!    so partitions are at least 95 % and 92 % full. Keys packed into a narrow hash
//!    range deepen the tree where they are: at the full depth d = 8 the bound falls to
//!    `P − 17·split` (73 %), and every partition opened inside that range starts with up
//!    to `8·split` (1/8 of P) of unknown counts.
//!
//! # Cost
//! `track` binary-searches the tablet, then walks at most [`LEVELS_MAX`] arrays with one
//! subtraction, one shift and one memory access each (bucket widths are powers of two
//! and all of a tablet's arrays lie in one allocation). Measured with a throwaway
//! release-build loop over 4 M random hashes on the 2-core development VM (Xeon):
//! `Profiler::track` 25–35 ns on one tablet with a tree of 257–1,024 arrays (depth 2–3),
//! 70–80 ns on a depth-8 tree (all keys in a 2^20-hash range); about 170 ns when writes
//! land at random over 1,000 tablets that each have arrays, where 6 MiB of buckets no
//! longer fit in cache. A will costs one pass over the buckets in use,
//! `tablets + 256·arrays` steps: about 3 ms at the default cap.

use rampart_common::ids::{KeyHash, TableId};
use rampart_common::tablet::{HashRange, Tablet};
pub use rampart_common::will::{push_range, Partition, Will};

/// Buckets in each array. 256 = 8 bits of hash per level, as in RAMCloud: wide enough
/// that a uniform tablet needs one level per 256× growth, small enough (6 KiB) that a
/// split is cheap.
pub const BUCKETS_PER_ARRAY: usize = 256;

/// How many arrays a path from a tablet's top bucket to a leaf can cross: bucket widths
/// are powers of two, at most 2^56 in a root array and 256 times narrower each level
/// down, so the eighth level has buckets one hash wide, which cannot split. A leaf thus
/// has at most `LEVELS_MAX` ancestors (the top bucket and one bucket in each array above
/// its own).
pub const LEVELS_MAX: usize = 8;

const _: () = assert!((BUCKETS_PER_ARRAY as u128).pow(LEVELS_MAX as u32) == 1u128 << 64);

/// Bits of hash resolved by one array level.
const BITS_PER_LEVEL: u32 = BUCKETS_PER_ARRAY.trailing_zeros();

const _: () = assert!(BUCKETS_PER_ARRAY.is_power_of_two());

/// [`ProfilerConfig::for_partitions`] splits a bucket at 1/64 of a partition's limits.
/// Smaller splits sharpen the will (leaves and frozen ancestors are smaller, see the
/// module's *Balance*) at the price of more arrays. At 1/64, partitions over uniform keys
/// are ≥ 95 % full at depth 1, and even a narrow hot range refined to the full depth
/// carries at most 8/64 of a partition as unknown; a uniform tablet needs 257 arrays once
/// it holds 4 partitions' worth (the root and one level below), an adversarial key
/// pattern at most 64 per partition's worth of bytes and 64 per partition's worth of
/// records, until [`ARRAYS_MAX`] stops it.
pub const SPLIT_DIVISOR: u64 = 64;

/// Default cap on bucket arrays per [`Profiler`] (all tablets together): 1,024 arrays of
/// 256 × 24-byte buckets = 6 MiB (at most twice that reserved while growing), well under
/// 1 % of a master's log. Without the cleaner
/// untracking, counts grow with every overwrite, so the cap is what bounds memory.
pub const ARRAYS_MAX: u32 = 1024;

/// Default byte limit of a will's partitions: what one recovery master replays in about
/// half a second (issue 5) on the 2-core development VM, where a recovery master replays
/// and re-replicates (R = 3) about 100 MB/s of 1 KiB objects while backups read and
/// split beside it (`rampart bench recovery`, 64 MB in one partition: 610 ms). Smaller
/// partitions also spread one crashed master over more recovery masters.
pub const PARTITION_BYTES_DEFAULT: u64 = 48 * 1024 * 1024;

/// Default record limit of a will's partitions: small objects cost per entry, not per
/// byte (index insert, append, CRC): replay stages about 0.47 M objects/s of 100-byte
/// objects on one core before replication, so 200,000 records take about half a second
/// with replication and the backups' work beside it.
pub const PARTITION_RECORDS_DEFAULT: u64 = 200_000;

/// The limits a master cuts its will to (see [`Profiler::will`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionLimits {
    /// Most log bytes in one partition.
    pub bytes_max: u64,
    /// Most log entries in one partition.
    pub records_max: u64,
}

impl Default for PartitionLimits {
    fn default() -> PartitionLimits {
        PartitionLimits {
            bytes_max: PARTITION_BYTES_DEFAULT,
            records_max: PARTITION_RECORDS_DEFAULT,
        }
    }
}

/// A bucket's `child` when it has none.
const NO_CHILD: u32 = u32::MAX;

const _: () = assert!(ARRAYS_MAX < NO_CHILD);

/// When buckets split, and how many arrays they may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfilerConfig {
    /// A bucket whose bytes reach this gets a child array (if the cap allows).
    pub split_bytes: u64,
    /// A bucket whose records reach this gets a child array (if the cap allows).
    pub split_records: u64,
    /// Cap on bucket arrays: for a [`Profiler`], over all its tablets; for a lone
    /// [`TabletProfiler`], its own. `u32::MAX` acts as `u32::MAX − 1`.
    pub arrays_max: u32,
}

impl ProfilerConfig {
    /// Splits at 1/[`SPLIT_DIVISOR`] of the partition limits the wills will use, with
    /// the default cap [`ARRAYS_MAX`].
    pub fn for_partitions(partition_bytes_max: u64, partition_records_max: u64) -> Self {
        ProfilerConfig {
            split_bytes: (partition_bytes_max / SPLIT_DIVISOR).max(1),
            split_records: (partition_records_max / SPLIT_DIVISOR).max(1),
            arrays_max: ARRAYS_MAX,
        }
    }
}

/// Bytes and records, as counted by a bucket or summed over many.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Log bytes.
    pub bytes: u64,
    /// Log entries.
    pub records: u64,
}

impl Counts {
    /// Nothing.
    pub const ZERO: Counts = Counts {
        bytes: 0,
        records: 0,
    };

    fn plus(self, other: Counts) -> Counts {
        Counts {
            bytes: self.bytes.saturating_add(other.bytes),
            records: self.records.saturating_add(other.records),
        }
    }

    fn reaches_split(self, config: &ProfilerConfig) -> bool {
        self.bytes >= config.split_bytes || self.records >= config.split_records
    }
}

/// One bucket: what was tracked in its range while it had no child.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    counts: Counts,
    /// Which array of the tablet splits this bucket's range, or `NO_CHILD`.
    child: u32,
}

impl Bucket {
    const EMPTY: Bucket = Bucket {
        counts: Counts::ZERO,
        child: NO_CHILD,
    };
}

/// Where an array's buckets lie in the hash space: the array covers `[lo, hi]`, and
/// bucket i covers `[lo + i·2^shift, min(lo + (i + 1)·2^shift − 1, hi)]`. Widths are
/// powers of two so that finding a bucket is a shift, not a division. Buckets past
/// `(hi − lo) >> shift` are never used; they stay empty.
#[derive(Clone, Copy, Debug)]
struct Span {
    lo: u64,
    hi: u64,
    shift: u32,
}

impl Span {
    /// The root array of `[lo, hi]`: the narrowest power-of-two buckets that fit the
    /// range into `BUCKETS_PER_ARRAY` of them (2^56 for the whole hash space).
    fn root(lo: u64, hi: u64) -> Span {
        let bits = u64::BITS - (hi - lo).leading_zeros();
        Span {
            lo,
            hi,
            shift: bits.saturating_sub(BITS_PER_LEVEL),
        }
    }

    fn index(&self, hash: u64) -> usize {
        ((hash - self.lo) >> self.shift) as usize
    }

    fn used(&self) -> usize {
        self.index(self.hi) + 1
    }

    /// The span of the array splitting bucket `i`: its range, buckets 256 times
    /// narrower (or one hash wide).
    fn child(&self, i: usize) -> Span {
        let lo = self.lo + ((i as u64) << self.shift);
        Span {
            lo,
            hi: lo.saturating_add((1u64 << self.shift) - 1).min(self.hi),
            shift: self.shift.saturating_sub(BITS_PER_LEVEL),
        }
    }
}

/// A bucket's place in a tablet's tree: the top bucket, or an index into `buckets`.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Top,
    At(usize),
}

/// What a track did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tracked {
    Outside,
    Counted,
    CountedAndSplit,
}

/// The profile of one tablet: a tree of bucket arrays over `[start_hash, end_hash]`.
#[derive(Debug)]
pub struct TabletProfiler {
    table: TableId,
    /// First key hash of the tablet.
    start_hash: u64,
    /// Last key hash of the tablet (inclusive); `start_hash ≤ end_hash`.
    end_hash: u64,
    /// The bucket of the whole range `[start_hash, end_hash]`. Its child, if any, is the
    /// root array, of span `Span::root(start_hash, end_hash)`.
    top: Bucket,
    /// The arrays, `BUCKETS_PER_ARRAY` buckets each, one after another: array k is
    /// `buckets[k·256 .. (k + 1)·256]`. One allocation, and one memory access per level
    /// on the hot path (no array header to load: spans are computed on the way down).
    /// Invariants:
    /// 1. `buckets.len()` is a multiple of 256; every `child` (top's included) is
    ///    `NO_CHILD` or an array index `< buckets.len() / 256`, and each array is the
    ///    child of exactly one bucket, created after it: so walks terminate;
    /// 2. a child array covers exactly its parent bucket's range (`Span::child`);
    /// 3. `track` only ever counts into leaves (buckets without a child); an ancestor's
    ///    counts are frozen except that `untrack` may lower them;
    /// 4. a path from top to a leaf crosses at most `LEVELS_MAX` arrays (the shift
    ///    drops by 8 per level from at most 56, and a one-hash bucket never splits).
    buckets: Vec<Bucket>,
    config: ProfilerConfig,
}

impl TabletProfiler {
    /// An empty profile of `[start_hash, end_hash]` of `table`.
    ///
    /// # Panics
    /// If `start_hash > end_hash` (a programmer error: tablets come validated).
    pub fn new(
        table: TableId,
        start_hash: u64,
        end_hash: u64,
        config: ProfilerConfig,
    ) -> TabletProfiler {
        assert!(start_hash <= end_hash, "a tablet is a non-empty range");
        TabletProfiler {
            table,
            start_hash,
            end_hash,
            top: Bucket::EMPTY,
            buckets: Vec::new(),
            config,
        }
    }

    /// The table profiled.
    pub fn table(&self) -> TableId {
        self.table
    }

    /// First key hash of the range profiled.
    pub fn start_hash(&self) -> u64 {
        self.start_hash
    }

    /// Last key hash of the range profiled (inclusive).
    pub fn end_hash(&self) -> u64 {
        self.end_hash
    }

    /// Whether `hash` is in the profiled range.
    pub fn contains(&self, hash: KeyHash) -> bool {
        self.start_hash <= hash.0 && hash.0 <= self.end_hash
    }

    /// Counts one log entry of `bytes` with key hash `hash`. Returns false, counting
    /// nothing, when `hash` is outside the tablet. Never panics; counts saturate.
    pub fn track(&mut self, hash: KeyHash, bytes: u64) -> bool {
        let cap = self.config.arrays_max as usize;
        self.track_capped(hash.0, bytes, cap) != Tracked::Outside
    }

    /// Uncounts one log entry of `bytes` with key hash `hash` (the cleaner freed it).
    /// Returns false, changing nothing, when `hash` is outside the tablet.
    ///
    /// The entry was counted in some bucket on the path to `hash`'s leaf, but which one
    /// depends on when it was tracked. Its counts are taken from the deepest bucket
    /// first, then from its ancestors: whatever a deeper bucket loses this way an
    /// ancestor holds for it, so the will's upper bounds still hold. Saturates at zero;
    /// never panics.
    pub fn untrack(&mut self, hash: KeyHash, bytes: u64) -> bool {
        if !self.contains(hash) {
            return false;
        }
        let mut path = [Slot::Top; LEVELS_MAX + 1];
        let mut len = 1;
        let mut span = Span::root(self.start_hash, self.end_hash);
        let mut child = self.top.child;
        while child != NO_CHILD && len < path.len() {
            let i = span.index(hash.0);
            let at = child as usize * BUCKETS_PER_ARRAY + i;
            path[len] = Slot::At(at);
            len += 1;
            span = span.child(i);
            child = self.buckets[at].child;
        }
        let mut left = Counts { bytes, records: 1 };
        for slot in path[..len].iter().rev() {
            let counts = &mut self.bucket_mut(*slot).counts;
            let bytes = counts.bytes.min(left.bytes);
            let records = counts.records.min(left.records);
            counts.bytes -= bytes;
            counts.records -= records;
            left.bytes -= bytes;
            left.records -= records;
            if left == Counts::ZERO {
                break;
            }
        }
        true
    }

    /// Everything counted in the tablet.
    pub fn totals(&self) -> Counts {
        self.buckets
            .iter()
            .fold(self.top.counts, |sum, bucket| sum.plus(bucket.counts))
    }

    /// Bucket arrays in use (each about 6 KiB).
    pub fn arrays(&self) -> usize {
        self.buckets.len() / BUCKETS_PER_ARRAY
    }

    /// The most arrays on any path from the top bucket to a leaf: 0 while the tablet is
    /// a single bucket. A leaf has this many ancestors at most.
    pub fn depth(&self) -> usize {
        let mut depth = 0;
        self.visit(&mut |visit| depth = depth.max(visit.depth));
        depth
    }

    /// The hot path: find the leaf of `hash`, count, and split the leaf if it reached the
    /// threshold and the tablet may hold another array (`arrays() < arrays_cap`).
    fn track_capped(&mut self, hash: u64, bytes: u64, arrays_cap: usize) -> Tracked {
        if !self.contains(KeyHash(hash)) {
            return Tracked::Outside;
        }
        let mut leaf = Slot::Top;
        let (mut lo, mut hi) = (self.start_hash, self.end_hash);
        let mut span = Span::root(lo, hi);
        let mut child = self.top.child;
        while child != NO_CHILD {
            let i = span.index(hash);
            let at = child as usize * BUCKETS_PER_ARRAY + i;
            span = span.child(i);
            (lo, hi) = (span.lo, span.hi);
            leaf = Slot::At(at);
            child = self.buckets[at].child;
        }
        let config = self.config;
        let bucket = self.bucket_mut(leaf);
        bucket.counts = bucket.counts.plus(Counts { bytes, records: 1 });
        if !bucket.counts.reaches_split(&config)
            || lo == hi // One hash: a hot key. Nothing finer to learn.
            || self.arrays() >= arrays_cap.min(NO_CHILD as usize)
        {
            return Tracked::Counted;
        }
        let child = self.arrays() as u32;
        self.grow(arrays_cap);
        self.bucket_mut(leaf).child = child;
        Tracked::CountedAndSplit
    }

    /// Appends one empty array. Capacity grows by doubling (so at most twice the arrays
    /// in use are reserved) and never past `arrays_cap` arrays.
    fn grow(&mut self, arrays_cap: usize) {
        if self.buckets.len() == self.buckets.capacity() {
            let arrays = self.arrays();
            let more = arrays.clamp(1, arrays_cap.saturating_sub(arrays).max(1));
            self.buckets.reserve_exact(more * BUCKETS_PER_ARRAY);
        }
        self.buckets
            .extend_from_slice(&[Bucket::EMPTY; BUCKETS_PER_ARRAY]);
    }

    fn bucket_mut(&mut self, slot: Slot) -> &mut Bucket {
        match slot {
            Slot::Top => &mut self.top,
            Slot::At(at) => &mut self.buckets[at],
        }
    }

    /// Calls `f` on every bucket in use, depth-first in hash order, each before its
    /// children.
    fn visit(&self, f: &mut impl FnMut(Visit<'_>)) {
        let root = Span::root(self.start_hash, self.end_hash);
        self.visit_below(&self.top, root, Counts::ZERO, 0, f);
    }

    /// `span`: `bucket`'s range, and the layout of its child array if it has one.
    fn visit_below(
        &self,
        bucket: &Bucket,
        span: Span,
        ancestors: Counts,
        depth: usize,
        f: &mut impl FnMut(Visit<'_>),
    ) {
        f(Visit {
            bucket,
            lo: span.lo,
            hi: span.hi,
            ancestors,
            depth,
        });
        if bucket.child == NO_CHILD {
            return;
        }
        let ancestors = ancestors.plus(bucket.counts);
        let first = bucket.child as usize * BUCKETS_PER_ARRAY;
        for i in 0..span.used() {
            let child = &self.buckets[first + i];
            self.visit_below(child, span.child(i), ancestors, depth + 1, f);
        }
    }

    /// The counts of every bucket whose range meets `[start, end]`: an upper bound on
    /// what was tracked there.
    fn counts_meeting(&self, start: u64, end: u64) -> Counts {
        let mut sum = Counts::ZERO;
        self.visit(&mut |visit| {
            if visit.lo <= end && start <= visit.hi {
                sum = sum.plus(visit.bucket.counts);
            }
        });
        sum
    }

    /// Feeds the tablet's buckets to `collector` depth-first, in hash order.
    fn walk(&self, collector: &mut Collector) {
        collector.begin_tablet(self.table, self.start_hash);
        self.visit(&mut |visit| collector.add(visit.lo, visit.bucket.counts, visit.ancestors));
        collector.end_tablet(self.end_hash);
    }
}

/// One bucket as [`TabletProfiler::visit`] shows it.
struct Visit<'a> {
    bucket: &'a Bucket,
    /// Its range, inclusive.
    lo: u64,
    hi: u64,
    /// The summed counts of the buckets above it.
    ancestors: Counts,
    /// How many arrays lie above it: 0 for the top bucket.
    depth: usize,
}

/// The profiles of every tablet this master owns.
#[derive(Debug)]
pub struct Profiler {
    config: ProfilerConfig,
    /// The range of each profiled tablet, sorted: the index that
    /// `track` binary-searches (24 bytes an entry, so a thousand tablets stay in cache).
    /// Invariants: `profiles[i]` profiles `ranges[i]`; ranges never overlap (taking a
    /// tablet replaces the profiles it overlaps, as `OwnedTablets::take` does).
    ranges: Vec<HashRange>,
    profiles: Vec<TabletProfiler>,
    /// Arrays of all tablets together.
    /// Invariant: equals the sum of `arrays()` over `profiles`, and new arrays are made
    /// only while it is below `config.arrays_max`.
    arrays: usize,
}

impl Profiler {
    /// Profiles nothing yet.
    pub fn new(config: ProfilerConfig) -> Profiler {
        Profiler {
            config,
            ranges: Vec::new(),
            profiles: Vec::new(),
            arrays: 0,
        }
    }

    /// Starts profiling `tablet` (its owner is ignored). Taking a tablet already
    /// profiled with the same range keeps its profile. Profiles the new range overlaps
    /// are dropped, but what they counted inside it is kept as counts of the new
    /// tablet's top bucket — an ancestor of its whole range — so the will's upper bounds
    /// still hold for objects that stay (pessimistically: the will cannot tell where in
    /// the tablet they lie).
    ///
    /// Take a tablet *before* tracking its objects (before recovery replays into it).
    pub fn take_tablet(&mut self, tablet: &Tablet) {
        self.take_tablets(std::slice::from_ref(tablet));
    }

    /// Takes `tablets` (which do not overlap one another) together, as
    /// [`take_tablet`](Self::take_tablet) takes one. Each inherits from the profiles as
    /// they stood before any of them was taken, so the halves of a split tablet both
    /// inherit what the whole counted inside them; taken one after the other, the
    /// second half would find the whole's profile gone with the first.
    pub fn take_tablets(&mut self, tablets: &[Tablet]) {
        debug_assert!(
            tablets.iter().enumerate().all(|(i, a)| tablets[i + 1..]
                .iter()
                .all(|b| a.table != b.table
                    || a.end_hash < b.start_hash
                    || b.end_hash < a.start_hash)),
            "tablets taken together overlap: {tablets:?}"
        );
        let inherited: Vec<(HashRange, Counts)> = tablets
            .iter()
            .map(Tablet::range)
            .filter(|range| self.ranges.binary_search(range).is_err())
            .map(|range| {
                let counts = self.profiles[self.overlapping(&range)]
                    .iter()
                    .fold(Counts::ZERO, |sum, old| {
                        sum.plus(old.counts_meeting(range.start, range.end))
                    });
                (range, counts)
            })
            .collect();
        for (range, counts) in inherited {
            self.remove_overlapping(&range);
            let mut profile = TabletProfiler::new(range.table, range.start, range.end, self.config);
            profile.top.counts = counts;
            let at = self.ranges.partition_point(|r| *r < range);
            self.ranges.insert(at, range);
            self.profiles.insert(at, profile);
        }
    }

    /// Stops profiling every tablet that overlaps `tablet`'s range; returns how many.
    pub fn drop_tablet(&mut self, tablet: &Tablet) -> usize {
        self.remove_overlapping(&tablet.range()).len()
    }

    /// The indexes of the profiles whose ranges overlap `range`.
    fn overlapping(&self, range: &HashRange) -> std::ops::Range<usize> {
        let first = self
            .ranges
            .partition_point(|&HashRange { table, end, .. }| {
                (table, end) < (range.table, range.start)
            });
        let last = self
            .ranges
            .partition_point(|&HashRange { table, start, .. }| {
                (table, start) <= (range.table, range.end)
            });
        first..last.max(first)
    }

    fn remove_overlapping(&mut self, range: &HashRange) -> Vec<TabletProfiler> {
        let span = self.overlapping(range);
        self.ranges.drain(span.clone());
        let removed: Vec<TabletProfiler> = self.profiles.drain(span).collect();
        for profile in &removed {
            self.arrays -= profile.arrays();
        }
        removed
    }

    /// The index of the profile holding `hash` of `table`.
    fn find(&self, table: TableId, hash: KeyHash) -> Option<usize> {
        let after = self.ranges.partition_point(
            |&HashRange {
                 table: t, start, ..
             }| (t, start) <= (table, hash.0),
        );
        let at = after.checked_sub(1)?;
        let HashRange { table: t, end, .. } = self.ranges[at];
        (t == table && hash.0 <= end).then_some(at)
    }

    /// Counts one log entry (object or tombstone) of `bytes` in `table` with key hash
    /// `hash`. Returns false, counting nothing, when no profiled tablet holds it (the
    /// caller's tablets and the profiler's disagree).
    pub fn track(&mut self, table: TableId, hash: KeyHash, bytes: u64) -> bool {
        let Some(at) = self.find(table, hash) else {
            return false;
        };
        let profile = &mut self.profiles[at];
        // The arrays this tablet may hold: its own plus what the whole profiler has left.
        let cap = profile.arrays() + (self.config.arrays_max as usize).saturating_sub(self.arrays);
        match profile.track_capped(hash.0, bytes, cap) {
            Tracked::Outside => false,
            Tracked::Counted => true,
            Tracked::CountedAndSplit => {
                self.arrays += 1;
                true
            }
        }
    }

    /// Uncounts one log entry (see [`TabletProfiler::untrack`]). Returns false, changing
    /// nothing, when no profiled tablet holds it.
    pub fn untrack(&mut self, table: TableId, hash: KeyHash, bytes: u64) -> bool {
        match self.find(table, hash) {
            Some(at) => self.profiles[at].untrack(hash, bytes),
            None => false,
        }
    }

    /// The profile of the tablet of `table` holding `hash`.
    pub fn tablet(&self, table: TableId, hash: KeyHash) -> Option<&TabletProfiler> {
        self.find(table, hash).map(|at| &self.profiles[at])
    }

    /// Every profiled tablet, in (table, hash) order.
    pub fn tablets(&self) -> impl Iterator<Item = &TabletProfiler> {
        self.profiles.iter()
    }

    /// Everything counted, over all tablets.
    pub fn totals(&self) -> Counts {
        self.profiles
            .iter()
            .fold(Counts::ZERO, |sum, profile| sum.plus(profile.totals()))
    }

    /// Bucket arrays in use over all tablets (at most `arrays_max`).
    pub fn arrays(&self) -> usize {
        self.arrays
    }

    /// The will: partitions of at most `bytes_max` bytes and `records_max` records (see
    /// the module's *Guarantees of a will*), by a depth-first scan of every tablet in
    /// (table, hash) order.
    pub fn will(&self, bytes_max: u64, records_max: u64) -> Will {
        let mut collector = Collector::new(bytes_max, records_max);
        for profile in &self.profiles {
            profile.walk(&mut collector);
        }
        Will {
            bytes_max,
            records_max,
            partitions: collector.finish(),
        }
    }
}

/// Cuts the buckets fed to it in hash order into partitions (RAMCloud's
/// `PartitionCollector`).
#[derive(Debug)]
struct Collector {
    bytes_max: u64,
    records_max: u64,
    /// Closed partitions, in order.
    partitions: Vec<Partition>,
    /// The open partition: its closed ranges and its bounds so far.
    current: Partition,
    /// The tablet being walked.
    table: TableId,
    /// Where the open partition's range in the tablet being walked starts.
    /// Invariant: ≤ the `lo` of every bucket still to come in this tablet.
    range_start: u64,
}

impl Collector {
    fn new(bytes_max: u64, records_max: u64) -> Collector {
        Collector {
            bytes_max,
            records_max,
            partitions: Vec::new(),
            current: Partition {
                tablets: Vec::new(),
                bytes: 0,
                records: 0,
            },
            table: TableId(0),
            range_start: 0,
        }
    }

    fn begin_tablet(&mut self, table: TableId, start: u64) {
        self.table = table;
        self.range_start = start;
    }

    fn end_tablet(&mut self, end: u64) {
        let range = HashRange::new(self.table, self.range_start, end);
        push_range(&mut self.current.tablets, range);
    }

    /// Adds a bucket whose range starts at `lo`, with `counts`; `ancestors` is the sum of
    /// the buckets above it, which any partition opened here must carry. The open
    /// partition is closed first if the bucket would push it past a limit — unless it
    /// covers nothing yet: then the bucket stays, over the limits (a hot bucket, or
    /// ancestors too heavy).
    fn add(&mut self, lo: u64, counts: Counts, ancestors: Counts) {
        let fits = self.current.bytes.saturating_add(counts.bytes) <= self.bytes_max
            && self.current.records.saturating_add(counts.records) <= self.records_max;
        let covers_something = !self.current.tablets.is_empty() || lo > self.range_start;
        if !fits && covers_something {
            if lo > self.range_start {
                let range = HashRange::new(self.table, self.range_start, lo - 1);
                push_range(&mut self.current.tablets, range);
            }
            let next = Partition {
                tablets: Vec::new(),
                bytes: ancestors.bytes,
                records: ancestors.records,
            };
            self.partitions
                .push(std::mem::replace(&mut self.current, next));
            self.range_start = lo;
        }
        self.current.bytes = self.current.bytes.saturating_add(counts.bytes);
        self.current.records = self.current.records.saturating_add(counts.records);
    }

    fn finish(mut self) -> Vec<Partition> {
        if !self.current.tablets.is_empty() {
            self.partitions.push(self.current);
        }
        self.partitions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rampart_common::ids::ServerId;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// One tracked log entry: (table, key hash, bytes).
    type Record = (TableId, u64, u64);

    fn tablet(table: u64, start_hash: u64, end_hash: u64) -> Tablet {
        Tablet {
            table: TableId(table),
            start_hash,
            end_hash,
            owner: ServerId(1),
        }
    }

    fn config(split_bytes: u64, split_records: u64, arrays_max: u32) -> ProfilerConfig {
        ProfilerConfig {
            split_bytes,
            split_records,
            arrays_max,
        }
    }

    fn track_all(profiler: &mut Profiler, records: &[Record]) {
        for &(table, hash, bytes) in records {
            assert!(profiler.track(table, KeyHash(hash), bytes));
        }
    }

    /// Checks the will's guarantees that hold for any profile: exact coverage of
    /// `tablets`, ranges in order and disjoint, reported bounds at least the true counts,
    /// only single-range partitions over a limit, and the uncertainty bound (no tablet
    /// here inherited counts). Returns the true counts per partition.
    fn check_will(
        will: &Will,
        tablets: &[HashRange],
        records: &[Record],
        config: &ProfilerConfig,
    ) -> Vec<Counts> {
        let mut expected = tablets.to_vec();
        expected.sort_unstable();
        let mut merged = Vec::new();
        for range in expected {
            push_range(&mut merged, range);
        }
        assert_eq!(
            will.coverage(),
            merged,
            "the will covers exactly the tablets"
        );

        let ranges: Vec<(TableId, u64, u64, usize)> = will
            .partitions
            .iter()
            .enumerate()
            .flat_map(|(i, p)| p.tablets.iter().map(move |r| (r.table, r.start, r.end, i)))
            .collect();
        for &(_, start, end, _) in &ranges {
            assert!(start <= end);
        }
        for pair in ranges.windows(2) {
            let ((t0, _, e0, _), (t1, s1, _, _)) = (pair[0], pair[1]);
            assert!(
                t0 < t1 || (t0 == t1 && e0 < s1),
                "ranges in order, disjoint"
            );
        }

        let mut truth = vec![Counts::ZERO; will.partitions.len()];
        for &(table, hash, bytes) in records {
            let at = ranges.partition_point(|&(t, _, e, _)| (t, e) < (table, hash));
            let (t, start, _, i) = ranges[at];
            assert!(
                t == table && start <= hash,
                "record {table:?}/{hash:#x} is covered"
            );
            truth[i].bytes += bytes;
            truth[i].records += 1;
        }
        let entry_max = records.iter().map(|r| r.2).max().unwrap_or(0);
        let slack_bytes = 2 * LEVELS_MAX as u64 * (config.split_bytes + entry_max);
        let slack_records = 2 * LEVELS_MAX as u64 * config.split_records;
        for (partition, truth) in will.partitions.iter().zip(&truth) {
            assert!(partition.bytes >= truth.bytes, "{partition:?} vs {truth:?}");
            assert!(
                partition.records >= truth.records,
                "{partition:?} vs {truth:?}"
            );
            assert!(partition.bytes - truth.bytes <= slack_bytes);
            assert!(partition.records - truth.records <= slack_records);
            if partition.bytes > will.bytes_max || partition.records > will.records_max {
                assert_eq!(partition.tablets.len(), 1, "over a limit: one bucket only");
            }
        }
        let sum = truth.iter().fold(Counts::ZERO, |a, b| a.plus(*b));
        assert_eq!(sum.records, records.len() as u64);
        assert_eq!(sum.bytes, records.iter().map(|r| r.2).sum::<u64>());
        truth
    }

    /// Checks *Balance*: every partition but the last holds truly more than
    /// `limit − (2·d + 1)·(split + largest entry)` bytes or the records equivalent.
    fn check_balanced(will: &Will, truth: &[Counts], depth: usize, config: &ProfilerConfig) {
        let d = depth as u64;
        let entry_max = 100;
        let bytes_floor = will
            .bytes_max
            .saturating_sub((2 * d + 1) * (config.split_bytes + entry_max));
        let records_floor = will
            .records_max
            .saturating_sub((2 * d + 1) * config.split_records);
        for truth in &truth[..truth.len() - 1] {
            assert!(
                truth.bytes > bytes_floor || truth.records > records_floor,
                "{truth:?} under {bytes_floor} bytes / {records_floor} records"
            );
        }
    }

    fn uniform_records(seed: u64, table: TableId, count: usize) -> Vec<Record> {
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..count).map(|_| (table, rng.gen(), 100)).collect()
    }

    #[test]
    fn will_over_uniform_keys_is_balanced_within_the_bound() {
        const P: u64 = 1 << 20;
        let cfg = ProfilerConfig::for_partitions(P, u64::MAX);
        // 40 MiB of 100-byte entries: deep enough for a second level (root buckets of
        // 160 KiB pass the 16 KiB split).
        let records = uniform_records(1, TableId(7), 40 * (1 << 20) / 100);
        let mut profiler = Profiler::new(cfg);
        profiler.take_tablet(&tablet(7, 0, u64::MAX));
        track_all(&mut profiler, &records);
        let depth = profiler.tablets().map(TabletProfiler::depth).max().unwrap();
        assert_eq!(depth, 2);
        assert_eq!(profiler.arrays(), 257);

        let will = profiler.will(P, u64::MAX);
        let truth = check_will(&will, &[HashRange::whole(TableId(7))], &records, &cfg);
        check_balanced(&will, &truth, depth, &cfg);
        let total: u64 = records.iter().map(|r| r.2).sum();
        let optimum = total.div_ceil(P) as usize;
        assert!(
            will.partitions.len() <= optimum * 105 / 100 + 1,
            "{}",
            will.partitions.len()
        );
        for partition in &will.partitions {
            assert!(partition.bytes <= P);
        }
    }

    #[test]
    fn will_over_keys_in_one_narrow_hash_range_refines_that_range() {
        const P: u64 = 1 << 20;
        let cfg = ProfilerConfig::for_partitions(P, u64::MAX);
        let base = 0x1234_5678_9abc_0000u64;
        let mut rng = SmallRng::seed_from_u64(2);
        let records: Vec<Record> = (0..8 * (1 << 20) / 100)
            .map(|_| (TableId(1), base + rng.gen_range(0..1u64 << 20), 100))
            .collect();
        let mut profiler = Profiler::new(cfg);
        profiler.take_tablet(&tablet(1, 0, u64::MAX));
        track_all(&mut profiler, &records);
        let depth = profiler.tablets().map(TabletProfiler::depth).max().unwrap();
        assert_eq!(depth, LEVELS_MAX - 1, "refined down to 256-hash buckets");

        let will = profiler.will(P, u64::MAX);
        let truth = check_will(&will, &[HashRange::whole(TableId(1))], &records, &cfg);
        check_balanced(&will, &truth, depth, &cfg);
        for partition in &will.partitions {
            assert!(partition.bytes <= P);
        }
        // The unknown counts cost some partitions, not many: 8 MiB in at most 10.
        assert!(will.partitions.len() <= 10, "{}", will.partitions.len());
        // All the data lies in [base, base + 2^20): the partitions cut that range.
        let cuts = will
            .partitions
            .iter()
            .filter(|p| {
                p.tablets.iter().any(
                    |&HashRange {
                         start: s, end: e, ..
                     }| s <= base + (1 << 20) && e >= base,
                )
            })
            .count();
        assert!(cuts >= 8);
    }

    #[test]
    fn will_packs_many_tiny_tables_into_few_partitions() {
        const P: u64 = 64 * 1024;
        let cfg = ProfilerConfig::for_partitions(P, 1_000_000);
        let mut profiler = Profiler::new(cfg);
        let mut records = Vec::new();
        let mut tablets = Vec::new();
        let mut rng = SmallRng::seed_from_u64(3);
        for table in 1..=1000u64 {
            profiler.take_tablet(&tablet(table, 0, u64::MAX));
            tablets.push(HashRange::whole(TableId(table)));
            for _ in 0..3 {
                records.push((TableId(table), rng.gen(), 100));
            }
        }
        track_all(&mut profiler, &records);
        assert_eq!(profiler.arrays(), 0, "a tiny table costs no array");

        let will = profiler.will(P, 1_000_000);
        let truth = check_will(&will, &tablets, &records, &cfg);
        check_balanced(&will, &truth, 0, &cfg);
        // 300 KB in 64 KiB partitions: 5, each holding ~200 whole tables.
        assert_eq!(will.partitions.len(), 5);
        for partition in &will.partitions[..4] {
            assert!(
                partition.tablets.len() >= 200,
                "{}",
                partition.tablets.len()
            );
            assert!(partition.tablets.iter().all(
                |&HashRange {
                     start: s, end: e, ..
                 }| s == 0 && e == u64::MAX
            ));
        }
    }

    #[test]
    fn will_splits_one_huge_table_and_keeps_small_ones_whole() {
        const P: u64 = 1 << 20;
        const N: u64 = 5_000;
        let cfg = ProfilerConfig::for_partitions(P, N);
        let mut profiler = Profiler::new(cfg);
        let mut tablets = vec![HashRange::whole(TableId(1))];
        profiler.take_tablet(&tablet(1, 0, u64::MAX));
        let mut records = uniform_records(4, TableId(1), 100_000);
        for table in 2..=50u64 {
            profiler.take_tablet(&tablet(table, 0, u64::MAX));
            tablets.push(HashRange::whole(TableId(table)));
            records.extend(uniform_records(table, TableId(table), 10));
        }
        track_all(&mut profiler, &records);

        let will = profiler.will(P, N);
        let truth = check_will(&will, &tablets, &records, &cfg);
        let depth = profiler.tablets().map(TabletProfiler::depth).max().unwrap();
        check_balanced(&will, &truth, depth, &cfg);
        // 100,000 records of the big table at ≤ 5,000 per partition: records bind.
        assert!(will.partitions.len() >= 20 && will.partitions.len() <= 23);
        for partition in &will.partitions {
            assert!(partition.records <= N && partition.bytes <= P);
        }
        // The small tables share the last partition, each whole.
        let last = &will.partitions[will.partitions.len() - 1];
        for table in 2..=50u64 {
            assert!(last.tablets.contains(&HashRange::whole(TableId(table))));
        }
    }

    #[test]
    fn will_gives_a_hot_key_its_own_partition() {
        const P: u64 = 1 << 20;
        let cfg = ProfilerConfig::for_partitions(P, u64::MAX);
        let hot = 0xdead_beef_0000_0042u64;
        let mut records = uniform_records(5, TableId(1), 40_000);
        records.extend((0..2_000).map(|_| (TableId(1), hot, 1_000)));
        let mut profiler = Profiler::new(cfg);
        profiler.take_tablet(&tablet(1, 0, u64::MAX));
        track_all(&mut profiler, &records);

        let will = profiler.will(P, u64::MAX);
        check_will(&will, &[HashRange::whole(TableId(1))], &records, &cfg);
        let alone: Vec<&Partition> = will
            .partitions
            .iter()
            .filter(|p| p.tablets == [HashRange::new(TableId(1), hot, hot)])
            .collect();
        assert_eq!(alone.len(), 1, "{will:?}");
        assert!(alone[0].bytes >= 2_000_000);
        // Every other partition keeps to the limit.
        for partition in &will.partitions {
            assert!(
                partition.bytes <= P || partition.tablets == [HashRange::new(TableId(1), hot, hot)]
            );
        }
    }

    #[test]
    fn will_merges_adjacent_tablets_of_one_table() {
        let cfg = ProfilerConfig::for_partitions(1 << 20, 1 << 20);
        let mut profiler = Profiler::new(cfg);
        for (start, end) in Tablet::split_hash_space(4) {
            profiler.take_tablet(&tablet(3, start, end));
        }
        // A gap: table 4 owns only its upper half, which must not merge with table 3.
        profiler.take_tablet(&tablet(4, 1 << 63, u64::MAX));
        let will = profiler.will(1 << 20, 1 << 20);
        assert_eq!(
            will.partitions,
            vec![Partition {
                tablets: vec![
                    HashRange::whole(TableId(3)),
                    HashRange::new(TableId(4), 1 << 63, u64::MAX)
                ],
                bytes: 0,
                records: 0,
            }]
        );
    }

    #[test]
    fn will_of_nothing_is_empty() {
        let profiler = Profiler::new(ProfilerConfig::for_partitions(100, 100));
        assert!(profiler.will(100, 100).partitions.is_empty());
    }

    #[test]
    fn track_outside_every_tablet_counts_nothing() {
        let mut profiler = Profiler::new(ProfilerConfig::for_partitions(100, 100));
        profiler.take_tablet(&tablet(2, 100, 200));
        assert!(!profiler.track(TableId(2), KeyHash(99), 1));
        assert!(!profiler.track(TableId(2), KeyHash(201), 1));
        assert!(!profiler.track(TableId(1), KeyHash(150), 1));
        assert!(!profiler.track(TableId(3), KeyHash(150), 1));
        assert!(!profiler.untrack(TableId(3), KeyHash(150), 1));
        assert!(profiler.track(TableId(2), KeyHash(200), 1));
        assert_eq!(
            profiler.totals(),
            Counts {
                bytes: 1,
                records: 1
            }
        );
    }

    #[test]
    fn untrack_restores_counts() {
        let cfg = config(1_000, 10, ARRAYS_MAX);
        let mut profiler = Profiler::new(cfg);
        profiler.take_tablet(&tablet(1, 0, u64::MAX));
        let before = uniform_records(6, TableId(1), 500);
        track_all(&mut profiler, &before);
        let totals = profiler.totals();

        // More records, clustered so that they split buckets (and so are counted at
        // other depths than the ones they are untracked from), then untracked in
        // another order.
        let mut rng = SmallRng::seed_from_u64(7);
        let mut extra: Vec<Record> = (0..2_000)
            .map(|_| {
                (
                    TableId(1),
                    rng.gen_range(0..1u64 << 24),
                    rng.gen_range(1..300),
                )
            })
            .collect();
        track_all(&mut profiler, &extra);
        assert!(profiler.arrays() > 1);
        extra.reverse();
        for &(table, hash, bytes) in &extra {
            assert!(profiler.untrack(table, KeyHash(hash), bytes));
        }
        assert_eq!(profiler.totals(), totals);
        check_will(
            &profiler.will(10_000, 100),
            &[HashRange::whole(TableId(1))],
            &before,
            &cfg,
        );

        for &(table, hash, bytes) in &before {
            assert!(profiler.untrack(table, KeyHash(hash), bytes));
        }
        assert_eq!(profiler.totals(), Counts::ZERO);
        let will = profiler.will(10_000, 100);
        assert_eq!(will.partitions.len(), 1);
        assert_eq!(
            (will.partitions[0].bytes, will.partitions[0].records),
            (0, 0)
        );
    }

    #[test]
    fn untrack_of_what_was_never_tracked_saturates() {
        let mut profile = TabletProfiler::new(TableId(1), 0, u64::MAX, config(10, 10, 8));
        assert!(profile.untrack(KeyHash(5), 1_000));
        assert_eq!(profile.totals(), Counts::ZERO);
        assert!(profile.track(KeyHash(5), 3));
        assert!(profile.untrack(KeyHash(5), u64::MAX));
        assert_eq!(profile.totals(), Counts::ZERO);
        assert!(profile.track(KeyHash(5), u64::MAX));
        assert!(profile.track(KeyHash(5), u64::MAX));
        assert_eq!(profile.totals().bytes, u64::MAX);
    }

    #[test]
    fn arrays_cap_stops_refinement_but_not_counting() {
        let cfg = config(100, 1, 5);
        let mut profiler = Profiler::new(cfg);
        profiler.take_tablet(&tablet(1, 0, u64::MAX));
        profiler.take_tablet(&tablet(2, 0, u64::MAX));
        let mut records = uniform_records(8, TableId(1), 3_000);
        records.extend(uniform_records(9, TableId(2), 3_000));
        track_all(&mut profiler, &records);
        assert_eq!(
            profiler.arrays(),
            5,
            "the cap holds over all tablets together"
        );
        let arrays: usize = profiler.tablets().map(TabletProfiler::arrays).sum();
        assert_eq!(arrays, 5);
        assert_eq!(profiler.totals().records, 6_000);
        let tablets = [HashRange::whole(TableId(1)), HashRange::whole(TableId(2))];
        check_will(&profiler.will(2_000, 20), &tablets, &records, &cfg);

        // Dropping a tablet frees its arrays for the others.
        assert_eq!(profiler.drop_tablet(&tablet(2, 5, 6)), 1);
        let arrays: usize = profiler.tablets().map(TabletProfiler::arrays).sum();
        assert_eq!(profiler.arrays(), arrays);
    }

    #[test]
    fn take_tablet_keeps_the_profile_of_the_same_range() {
        let mut profiler = Profiler::new(ProfilerConfig::for_partitions(1000, 1000));
        profiler.take_tablet(&tablet(1, 10, 20));
        assert!(profiler.track(TableId(1), KeyHash(15), 7));
        profiler.take_tablet(&tablet(1, 10, 20));
        assert_eq!(
            profiler.totals(),
            Counts {
                bytes: 7,
                records: 1
            }
        );
        assert_eq!(profiler.drop_tablet(&tablet(1, 0, 9)), 0);
        assert_eq!(profiler.drop_tablet(&tablet(1, 20, 30)), 1);
        assert_eq!(profiler.totals(), Counts::ZERO);
    }

    #[test]
    fn take_tablet_narrowing_a_range_keeps_an_upper_bound_on_what_stays() {
        let cfg = config(2_000, 20, ARRAYS_MAX);
        let mut profiler = Profiler::new(cfg);
        profiler.take_tablet(&tablet(1, 0, u64::MAX));
        let records = uniform_records(10, TableId(1), 5_000);
        track_all(&mut profiler, &records);

        // The master keeps only the lower half (as `ObjectStore::take_tablets` does).
        let half = u64::MAX / 2;
        profiler.take_tablet(&tablet(1, 0, half));
        let kept: Vec<Record> = records.iter().copied().filter(|r| r.1 <= half).collect();
        let will = profiler.will(50_000, 500);
        let truth: Counts = kept.iter().fold(Counts::ZERO, |sum, r| {
            sum.plus(Counts {
                bytes: r.2,
                records: 1,
            })
        });
        let reported = will.partitions.iter().fold(Counts::ZERO, |sum, p| {
            sum.plus(Counts {
                bytes: p.bytes,
                records: p.records,
            })
        });
        assert!(reported.bytes >= truth.bytes && reported.records >= truth.records);
        // The inherited counts are an ancestor of the whole tablet: each partition's
        // bound covers all of them.
        for partition in &will.partitions {
            assert!(partition.records >= truth.records);
        }
        assert_eq!(will.coverage(), vec![HashRange::new(TableId(1), 0, half)]);
        assert_eq!(profiler.arrays(), 0);
    }

    fn will_of(partitions: &[(u64, u64, u64)]) -> Will {
        Will {
            bytes_max: 1_000,
            records_max: 100,
            partitions: partitions
                .iter()
                .map(|&(end, bytes, records)| Partition {
                    tablets: vec![HashRange::new(TableId(1), end.saturating_sub(9), end)],
                    bytes,
                    records,
                })
                .collect(),
        }
    }

    #[test]
    fn changed_materially_compares_counts_against_the_limits() {
        let old = will_of(&[(9, 500, 50), (19, 10, 1)]);
        assert!(!old.changed_materially(&old, 0.1));
        assert!(!will_of(&[(9, 590, 50), (19, 100, 10)]).changed_materially(&old, 0.1));
        assert!(will_of(&[(9, 601, 50), (19, 10, 1)]).changed_materially(&old, 0.1));
        assert!(will_of(&[(9, 500, 61), (19, 10, 1)]).changed_materially(&old, 0.1));
        assert!(will_of(&[(9, 500, 50), (19, 10, 1), (29, 0, 0)]).changed_materially(&old, 0.1));
        assert!(will_of(&[(19, 510, 51)]).changed_materially(&old, 0.1));
        let mut other_limit = old.clone();
        other_limit.bytes_max = 2_000;
        assert!(other_limit.changed_materially(&old, 0.1));
        // A boundary that moved within the fraction is not material ...
        let mut moved = old.clone();
        moved.partitions[0].tablets = vec![HashRange::new(TableId(1), 0, 7)];
        moved.partitions[1].tablets = vec![HashRange::new(TableId(1), 8, 19)];
        assert!(!moved.changed_materially(&old, 0.1));
        // ... other coverage is.
        let mut other_table = old.clone();
        other_table.partitions[1].tablets = vec![HashRange::new(TableId(2), 10, 19)];
        assert!(other_table.changed_materially(&old, 0.1));
    }

    #[test]
    fn will_survives_the_wire_encoding() {
        use rampart_common::rpc::message::{decode_bincode, encode_bincode};
        let mut profiler = Profiler::new(config(500, 5, 16));
        profiler.take_tablet(&tablet(1, 0, u64::MAX));
        profiler.take_tablet(&tablet(9, 100, 1_000));
        track_all(&mut profiler, &uniform_records(11, TableId(1), 300));
        let will = profiler.will(5_000, 50);
        let mut encoded = bytes::BytesMut::new();
        encode_bincode(&will, &mut encoded);
        assert_eq!(decode_bincode::<Will>(&encoded), Ok(will));
    }

    /// Tablets of up to 3 tables, each table cut at random points, some pieces not
    /// owned; records with uniform, clustered and extreme hashes.
    fn arb_case() -> impl Strategy<Value = (Vec<Tablet>, Vec<Record>, Vec<usize>)> {
        let cuts = proptest::collection::vec(any::<u64>(), 0..3);
        let owned = proptest::collection::vec(any::<bool>(), 4);
        let tables = proptest::collection::vec((cuts, owned), 1..4);
        let hash = prop_oneof![
            any::<u64>(),
            (0u64..4, 0u64..5_000).prop_map(|(base, off)| (base << 62) + off),
            Just(0u64),
            Just(u64::MAX),
        ];
        let records = proptest::collection::vec((0u64..4, hash, 1u64..3_000), 0..400);
        let untracks = proptest::collection::vec(any::<usize>(), 0..100);
        (tables, records, untracks).prop_map(|(tables, records, untracks)| {
            let mut tablets = Vec::new();
            for (table, (mut cuts, owned)) in tables.into_iter().enumerate() {
                cuts.retain(|&c| c > 0);
                cuts.sort_unstable();
                cuts.dedup();
                let mut start = 0u64;
                for (i, end) in cuts.iter().map(|c| c - 1).chain([u64::MAX]).enumerate() {
                    if owned[i] || i == 0 {
                        tablets.push(tablet(table as u64, start, end));
                    }
                    start = end.wrapping_add(1);
                }
            }
            let records = records
                .into_iter()
                .map(|(table, hash, bytes)| (TableId(table), hash, bytes))
                .collect();
            (tablets, records, untracks)
        })
    }

    proptest::proptest! {
        #[test]
        fn will_covers_every_tablet_once_and_bounds_every_partition(
            (tablets, records, untracks) in arb_case(),
            split_bytes in 1u64..5_000,
            split_records in 1u64..40,
            arrays_max in 0u32..40,
            bytes_max in 0u64..60_000,
            records_max in 0u64..300,
        ) {
            let cfg = config(split_bytes, split_records, arrays_max);
            let mut profiler = Profiler::new(cfg);
            for tablet in &tablets {
                profiler.take_tablet(tablet);
            }
            let mut live = Vec::new();
            for &(table, hash, bytes) in &records {
                let owned = tablets.iter().any(|t| t.contains(table, KeyHash(hash)));
                prop_assert_eq!(profiler.track(table, KeyHash(hash), bytes), owned);
                if owned {
                    live.push((table, hash, bytes));
                }
            }
            for pick in untracks {
                if live.is_empty() {
                    break;
                }
                let (table, hash, bytes) = live.swap_remove(pick % live.len());
                prop_assert!(profiler.untrack(table, KeyHash(hash), bytes));
            }
            prop_assert!(profiler.arrays() <= arrays_max as usize);
            let totals = profiler.totals();
            prop_assert_eq!(totals.records, live.len() as u64);
            prop_assert_eq!(totals.bytes, live.iter().map(|r| r.2).sum::<u64>());

            let will = profiler.will(bytes_max, records_max);
            let ranges: Vec<_> = tablets.iter().map(Tablet::range).collect();
            check_will(&will, &ranges, &live, &cfg);
        }
    }
}
