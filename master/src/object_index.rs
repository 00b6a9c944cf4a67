//! `ObjectIndex`: from (table, key) to the object's place in the log.
//!
//! The index stores only log references, keyed by (table, key hash); keys are compared
//! by reading them from the log entry the reference points at, as RAMCloud's hash table
//! does, so no key is held twice in memory.
//!
//! # Layout: extendible hashing on the hash's top bits
//! Each table has a `Directory`: `2^depth` entries, indexed by the top `depth` bits of
//! the key hash, each naming a bucket; a bucket of *local* depth `d ≤ depth` holds every
//! hash whose top `d` bits are its prefix (so `2^(depth − d)` consecutive entries name
//! it), sorted by hash in a small array. A lookup is a shift, one directory entry and a
//! short binary search: two or three cache misses, independent from one lookup to the
//! next, where the B-tree this replaces chained six or more dependent ones per lookup
//! (at a million objects the cleaner spent nine tenths of its time descending it).
//!
//! A bucket that overflows [`BUCKET_SLOTS_MAX`] splits in two on its next bit (the
//! directory doubles first when the bucket's depth is the directory's), and a bucket
//! whose buddy is light enough merges back into it after a removal: growth and
//! shrinking are one bucket at a time, never a rehash of the whole table under the
//! store's lock.
//!
//! Because buckets split on the *top* bits, the directory is in hash order, which is
//! what the master needs besides point lookups: enumerate walks a table in key-hash
//! order with a resumable hash cursor, and dropping (or migrating, or recovering) a
//! tablet touches one contiguous range of hashes.
//!
//! Several keys may share one 64-bit hash: they are adjacent slots of one bucket (a
//! bucket of depth 64 may then exceed the slot bound: it cannot split).

use rampart_common::ids::{KeyHash, SegmentId, TableId};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// Bytes of memory one indexed object costs, counted against the master's `--memory`
/// (`ObjectStore`): a 24-byte slot in a bucket of [`BUCKET_SLOTS_MAX`] + 1 slots, about
/// two-thirds full, with the bucket's header and its directory entries. Measured with a
/// counting allocator as the index grows from 2,000 to 370,000 objects: 41–44 bytes
/// (`tests/index_memory.rs` checks the bound along the way). Removals can leave buckets
/// emptier than growth does (buddies merge only when light): after removing most keys
/// at random, about 60 bytes per remaining object were measured.
pub const INDEX_BYTES_PER_OBJECT: u64 = 48;

/// Slots a bucket holds before it splits. Small enough that a binary search stays in a
/// few cache lines, large enough that the directory and the bucket headers are a small
/// share of the memory.
pub const BUCKET_SLOTS_MAX: usize = 16;

/// Two buddy buckets merge when together they hold at most this many slots: below
/// [`BUCKET_SLOTS_MAX`], so that a key added and removed at the boundary does not split
/// and merge the same bucket over and over.
const MERGE_SLOTS_MAX: usize = BUCKET_SLOTS_MAX * 3 / 4;

/// Slots of a bucket that a lookup counts in one pass rather than binary-searches
/// (`Directory::find`): every bucket that can split (at most [`BUCKET_SLOTS_MAX`] + 1
/// slots, while it is being split).
const SCANNED_SLOTS_MAX: usize = BUCKET_SLOTS_MAX + 1;

/// Where an object entry starts in the master's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogRef {
    /// The segment holding the entry.
    pub segment: SegmentId,
    /// Byte offset of the entry in that segment.
    pub offset: u32,
}

/// Where one reference sits in the index ([`ObjectIndex::locate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotAt {
    table: TableId,
    bucket: usize,
    position: usize,
}

/// One indexed object: its key's hash and where its entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    hash: u64,
    at: LogRef,
}

/// Every indexed hash whose top `depth` bits are this bucket's prefix, in hash order.
#[derive(Debug, Default)]
struct Bucket {
    /// Local depth.
    depth: u32,
    /// Sorted by hash; colliding keys are adjacent. Holds `BUCKET_SLOTS_MAX + 1` slots
    /// of memory once anything was inserted, none while empty.
    slots: Vec<Slot>,
}

/// The top `depth` bits of `hash`.
fn prefix(hash: u64, depth: u32) -> usize {
    if depth == 0 {
        0
    } else {
        (hash >> (64 - depth)) as usize
    }
}

/// One table's index (module doc, "Layout").
#[derive(Debug)]
struct Directory {
    /// Global depth: `entries` has `2^depth` entries.
    depth: u32,
    /// For each `depth`-bit prefix, the bucket holding its hashes. Invariant: the
    /// entries naming a bucket of local depth `d` are the `2^(depth − d)` consecutive
    /// ones under its prefix.
    entries: Vec<u32>,
    buckets: Vec<Bucket>,
    /// Buckets merged away, reused by the next split.
    free: Vec<u32>,
    /// Slots held.
    len: u64,
}

impl Directory {
    fn new() -> Directory {
        Directory {
            depth: 0,
            entries: vec![0],
            buckets: vec![Bucket::default()],
            free: Vec::new(),
            len: 0,
        }
    }

    /// The bucket holding `hash`, and the positions of the slots with that hash in it.
    fn find(&self, hash: u64) -> (usize, std::ops::Range<usize>) {
        let b = self.entries[prefix(hash, self.depth)] as usize;
        let slots = &self.buckets[b].slots;
        // A bucket that may split is counted, not binary-searched: its slots span about
        // seven cache lines, which a binary search reads one after the other (each
        // load's address depends on the last compare: three or four misses in a row
        // when the bucket is cold, as in a write to a random key of a large table),
        // while a count's loads are independent, so the processor has them all in
        // flight at once — one miss's wait for the bucket instead of four. A bucket
        // past the bound (one that cannot split) is searched.
        let (start, equal) = if slots.len() <= SCANNED_SLOTS_MAX {
            let below = slots.iter().filter(|s| s.hash < hash).count();
            let equal = slots.iter().filter(|s| s.hash == hash).count();
            (below, equal)
        } else {
            let start = slots.partition_point(|s| s.hash < hash);
            let equal = slots[start..].iter().take_while(|s| s.hash == hash).count();
            (start, equal)
        };
        (b, start..start + equal)
    }

    /// Inserts `slot` at `position` of bucket `b` (where its hash sorts).
    fn insert(&mut self, b: usize, position: usize, slot: Slot) {
        let slots = &mut self.buckets[b].slots;
        if slots.len() <= BUCKET_SLOTS_MAX && slots.len() == slots.capacity() {
            // Grow to the split size at once (not by doubling): buckets stay one size.
            slots.reserve_exact(BUCKET_SLOTS_MAX + 1 - slots.len());
        }
        // Past it (a bucket that cannot split: one hash, or the directory at its
        // bound), `insert` grows the slots by doubling.
        slots.insert(position, slot);
        self.len += 1;
        if slots.len() > BUCKET_SLOTS_MAX {
            self.split(b);
        }
    }

    /// Whether the directory may double: at most about two entries per object, so that
    /// hashes sharing long prefixes (crafted keys) cannot blow it up. Past it, a full
    /// bucket grows instead of splitting.
    fn may_double(&self) -> bool {
        2 * self.entries.len() as u64 <= 2 * self.len + 1024
    }

    /// Splits bucket `b` on its next bit, again while the half holding most is over
    /// the bound, unless its slots all share one hash (depth 64).
    fn split(&mut self, mut b: usize) {
        while self.buckets[b].slots.len() > BUCKET_SLOTS_MAX && self.buckets[b].depth < 64 {
            let depth = self.buckets[b].depth;
            if depth == self.depth {
                if !self.may_double() {
                    return;
                }
                self.entries = self.entries.iter().flat_map(|&e| [e, e]).collect();
                self.depth += 1;
            }
            let slots = &mut self.buckets[b].slots;
            let p = prefix(slots[0].hash, depth);
            let bit = 63 - depth;
            let upper_at = slots.partition_point(|s| (s.hash >> bit) & 1 == 0);
            let mut upper = Vec::with_capacity((slots.len() - upper_at).max(BUCKET_SLOTS_MAX + 1));
            upper.extend(slots.drain(upper_at..));
            let heavier_is_upper = upper.len() > slots.len();
            let new = match self.free.pop() {
                Some(id) => id as usize,
                None => {
                    self.buckets.push(Bucket::default());
                    self.buckets.len() - 1
                }
            };
            self.buckets[b].depth = depth + 1;
            self.buckets[new] = Bucket {
                depth: depth + 1,
                slots: upper,
            };
            let shift = self.depth - depth - 1;
            let upper_first = (2 * p + 1) << shift;
            for entry in &mut self.entries[upper_first..upper_first + (1 << shift)] {
                *entry = new as u32;
            }
            if heavier_is_upper {
                b = new;
            }
        }
    }

    /// Removes the slot at `position` of bucket `b`; merges the bucket with its buddy
    /// while together they are light, and gives an empty bucket's memory back.
    fn remove_at(&mut self, b: usize, position: usize) -> LogRef {
        let slot = self.buckets[b].slots.remove(position);
        self.len -= 1;
        let mut b = b;
        loop {
            let depth = self.buckets[b].depth;
            if depth == 0 {
                break;
            }
            let p = prefix(slot.hash, depth);
            let shift = self.depth - depth;
            let buddy = self.entries[(p ^ 1) << shift] as usize;
            if self.buckets[buddy].depth != depth
                || self.buckets[b].slots.len() + self.buckets[buddy].slots.len() > MERGE_SLOTS_MAX
            {
                break;
            }
            // The lower prefix keeps the merged slots, in order.
            let (keep, gone) = if p & 1 == 0 { (b, buddy) } else { (buddy, b) };
            let moved = std::mem::take(&mut self.buckets[gone].slots);
            let kept = &mut self.buckets[keep].slots;
            if kept.capacity() == 0 {
                *kept = moved;
            } else {
                kept.extend(moved);
            }
            self.buckets[keep].depth = depth - 1;
            self.buckets[gone].depth = 0;
            self.free.push(gone as u32);
            let first = (p >> 1) << (shift + 1);
            for entry in &mut self.entries[first..first + (1 << (shift + 1))] {
                *entry = keep as u32;
            }
            b = keep;
        }
        // A bucket left mostly empty (its buddy too full to merge) gives memory back.
        let slots = &mut self.buckets[b].slots;
        if slots.len() * 4 <= slots.capacity() {
            slots.shrink_to(slots.len() * 2);
        }
        slot.at
    }

    /// The slots with hashes in `start..=end`, in hash order.
    fn range(&self, start: u64, end: u64) -> impl Iterator<Item = (KeyHash, LogRef)> + '_ {
        let (first, last) = (prefix(start, self.depth), prefix(end, self.depth));
        (first..=last)
            // A bucket's entries are consecutive: visit it at its first one in range.
            .filter(move |&i| i == first || self.entries[i] != self.entries[i - 1])
            .flat_map(move |i| {
                let slots = &self.buckets[self.entries[i] as usize].slots;
                let from = slots.partition_point(|s| s.hash < start);
                slots[from..]
                    .iter()
                    .take_while(move |s| s.hash <= end)
                    .map(|s| (KeyHash(s.hash), s.at))
            })
    }
}

/// The index of live objects. Methods take a `key_of` closure that reads the key of
/// the entry at a reference from the log, so the index never stores keys.
#[derive(Debug, Default)]
pub struct ObjectIndex {
    /// Invariant: every reference points at a live object entry whose table is the
    /// directory's table and whose key hashes to the slot's hash; no two slots of one
    /// hash point at entries with equal keys. A table with no object has no directory.
    tables: BTreeMap<TableId, Directory>,
    /// Number of references held (live objects).
    len: u64,
}

impl ObjectIndex {
    /// An empty index.
    pub fn new() -> ObjectIndex {
        ObjectIndex::default()
    }

    /// Live objects indexed.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no object is indexed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The reference of the object with `key`, if any.
    pub fn lookup<'a>(
        &self,
        table: TableId,
        hash: KeyHash,
        key: &[u8],
        key_of: impl Fn(LogRef) -> &'a [u8],
    ) -> Option<LogRef> {
        let directory = self.tables.get(&table)?;
        let (b, found) = directory.find(hash.0);
        directory.buckets[b].slots[found]
            .iter()
            .map(|s| s.at)
            .find(|at| key_of(*at) == key)
    }

    /// Points `key` at `new`, replacing the reference of an older object with the same
    /// key. Returns the replaced reference.
    pub fn upsert<'a>(
        &mut self,
        table: TableId,
        hash: KeyHash,
        key: &[u8],
        new: LogRef,
        key_of: impl Fn(LogRef) -> &'a [u8],
    ) -> Option<LogRef> {
        let directory = self.tables.entry(table).or_insert_with(Directory::new);
        let (b, found) = directory.find(hash.0);
        let slots = &mut directory.buckets[b].slots[found.clone()];
        if let Some(existing) = slots.iter_mut().find(|s| key_of(s.at) == key) {
            return Some(std::mem::replace(&mut existing.at, new));
        }
        directory.insert(
            b,
            found.end,
            Slot {
                hash: hash.0,
                at: new,
            },
        );
        self.len += 1;
        None
    }

    /// The index's reference to the object at `at`, of `table` with key hash `hash`,
    /// if it is indexed: the cleaner moves it when it moves the entry (one lookup for
    /// both the liveness check and the move). No key is read.
    pub fn ref_mut(&mut self, table: TableId, hash: KeyHash, at: LogRef) -> Option<&mut LogRef> {
        let directory = self.tables.get_mut(&table)?;
        let (b, found) = directory.find(hash.0);
        directory.buckets[b].slots[found]
            .iter_mut()
            .find(|s| s.at == at)
            .map(|s| &mut s.at)
    }

    /// Brings into the cache what looking up each of `keys` will read (its bucket's
    /// header and the middle of its slots), in a loop so short that the processor has
    /// many of these independent loads in flight at once; the lookups that follow then
    /// find them cached instead of waiting out two or three misses each in turn.
    pub fn warm(&self, keys: &[(TableId, KeyHash)]) {
        let mut last: Option<(TableId, &Directory)> = None;
        let mut sink = 0u64;
        for &(table, hash) in keys {
            let directory = match last {
                Some((t, directory)) if t == table => directory,
                _ => match self.tables.get(&table) {
                    Some(directory) => {
                        last = Some((table, directory));
                        directory
                    }
                    None => continue,
                },
            };
            let b = directory.entries[prefix(hash.0, directory.depth)] as usize;
            let slots = &directory.buckets[b].slots;
            if let Some(middle) = slots.get(slots.len() / 2) {
                sink ^= middle.hash;
            }
        }
        std::hint::black_box(sink);
    }

    /// Where the index holds the reference `at` (of `table`, key hash `hash`), if it
    /// does: the cleaner locates a run of entries first, in a tight loop whose lookups
    /// are independent (so the processor overlaps their cache misses), then moves the
    /// live ones with [`repoint`](Self::repoint). Valid until the index next gains or
    /// loses a reference; repointing does not move slots.
    pub fn locate(&self, table: TableId, hash: KeyHash, at: LogRef) -> Option<SlotAt> {
        let directory = self.tables.get(&table)?;
        let (b, found) = directory.find(hash.0);
        let position = found.start
            + directory.buckets[b].slots[found]
                .iter()
                .position(|s| s.at == at)?;
        Some(SlotAt {
            table,
            bucket: b,
            position,
        })
    }

    /// Points the reference at `slot` (from [`locate`](Self::locate)) from `from` to
    /// `to`. False, changing nothing, when `slot` does not hold `from`: the index
    /// changed since it was located.
    pub fn repoint(&mut self, slot: SlotAt, from: LogRef, to: LogRef) -> bool {
        let held = self
            .tables
            .get_mut(&slot.table)
            .and_then(|d| d.buckets.get_mut(slot.bucket))
            .and_then(|b| b.slots.get_mut(slot.position));
        match held {
            Some(held) if held.at == from => {
                held.at = to;
                true
            }
            _ => false,
        }
    }

    /// Removes `key`; returns its reference if it was indexed.
    pub fn remove<'a>(
        &mut self,
        table: TableId,
        hash: KeyHash,
        key: &[u8],
        key_of: impl Fn(LogRef) -> &'a [u8],
    ) -> Option<LogRef> {
        let directory = self.tables.get_mut(&table)?;
        let (b, found) = directory.find(hash.0);
        let position = found.start
            + directory.buckets[b].slots[found]
                .iter()
                .position(|s| key_of(s.at) == key)?;
        let removed = directory.remove_at(b, position);
        if directory.len == 0 {
            self.tables.remove(&table);
        }
        self.len -= 1;
        Some(removed)
    }

    /// The objects of `table` with hashes in `range`, in hash order (colliding keys
    /// adjacent): their hashes and references.
    pub fn range(
        &self,
        table: TableId,
        range: RangeInclusive<u64>,
    ) -> impl Iterator<Item = (KeyHash, LogRef)> + '_ {
        let (start, end) = range.into_inner();
        self.tables
            .get(&table)
            .filter(|_| start <= end)
            .into_iter()
            .flat_map(move |directory| directory.range(start, end))
    }

    /// Removes every object of `table` with a hash in `range`; returns their references.
    pub fn remove_range(&mut self, table: TableId, range: RangeInclusive<u64>) -> Vec<LogRef> {
        self.remove_range_up_to(table, range, usize::MAX).0
    }

    /// Removes the objects of `table` with a hash in `range`, in hash order, `max` of
    /// them or a few more: every object of the last hash removed goes, so that what is
    /// left starts at a hash of its own. Returns their references, and the hash the
    /// rest starts at (`None` when the range is empty now).
    pub fn remove_range_up_to(
        &mut self,
        table: TableId,
        range: RangeInclusive<u64>,
        max: usize,
    ) -> (Vec<LogRef>, Option<u64>) {
        let mut doomed: Vec<(KeyHash, LogRef)> = Vec::new();
        let mut rest = None;
        for (hash, at) in self.range(table, range) {
            if doomed.len() >= max && doomed.last().is_some_and(|&(last, _)| last != hash) {
                rest = Some(hash.0);
                break;
            }
            doomed.push((hash, at));
        }
        let Some(directory) = self.tables.get_mut(&table) else {
            return (Vec::new(), None);
        };
        for (hash, at) in &doomed {
            let (b, found) = directory.find(hash.0);
            let slots = &directory.buckets[b].slots[found.clone()];
            if let Some(position) = slots.iter().position(|s| s.at == *at) {
                directory.remove_at(b, found.start + position);
            }
        }
        if directory.len == 0 {
            self.tables.remove(&table);
        }
        self.len -= doomed.len() as u64;
        (doomed.into_iter().map(|(_, at)| at).collect(), rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A fake log: references map to keys.
    fn log(entries: &[(u32, &'static [u8])]) -> HashMap<u32, &'static [u8]> {
        entries.iter().copied().collect()
    }

    fn at(offset: u32) -> LogRef {
        LogRef {
            segment: SegmentId(1),
            offset,
        }
    }

    #[test]
    fn colliding_keys_share_a_bucket_and_stay_distinct() {
        let keys = log(&[(1, b"a"), (2, b"b"), (3, b"a2")]);
        let key_of = |r: LogRef| keys[&r.offset];
        let (t, h) = (TableId(1), KeyHash(7));
        let mut index = ObjectIndex::new();
        assert_eq!(index.upsert(t, h, b"a", at(1), key_of), None);
        assert_eq!(index.upsert(t, h, b"b", at(2), key_of), None);
        assert_eq!(index.len(), 2);
        assert_eq!(index.lookup(t, h, b"a", key_of), Some(at(1)));
        assert_eq!(index.lookup(t, h, b"b", key_of), Some(at(2)));
        assert_eq!(index.lookup(t, h, b"c", key_of), None);
        assert_eq!(index.remove(t, h, b"a", key_of), Some(at(1)));
        assert_eq!(index.lookup(t, h, b"b", key_of), Some(at(2)));
        assert_eq!(index.len(), 1);
        assert_eq!(index.remove(t, h, b"a", key_of), None);
    }

    #[test]
    fn upsert_replaces_the_same_key() {
        let keys = log(&[(1, b"a"), (2, b"a")]);
        let key_of = |r: LogRef| keys[&r.offset];
        let mut index = ObjectIndex::new();
        index.upsert(TableId(1), KeyHash(5), b"a", at(1), key_of);
        assert_eq!(
            index.upsert(TableId(1), KeyHash(5), b"a", at(2), key_of),
            Some(at(1))
        );
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn remove_range_drops_only_that_table_and_range() {
        let keys = log(&[(1, b"a"), (2, b"b"), (3, b"c")]);
        let key_of = |r: LogRef| keys[&r.offset];
        let mut index = ObjectIndex::new();
        index.upsert(TableId(1), KeyHash(10), b"a", at(1), key_of);
        index.upsert(TableId(1), KeyHash(20), b"b", at(2), key_of);
        index.upsert(TableId(2), KeyHash(10), b"c", at(3), key_of);
        assert_eq!(index.remove_range(TableId(1), 0..=15), vec![at(1)]);
        assert_eq!(index.len(), 2);
        assert_eq!(index.range(TableId(1), 0..=u64::MAX).count(), 1);
        assert_eq!(index.range(TableId(2), 0..=u64::MAX).count(), 1);
    }

    #[test]
    fn removing_a_range_in_steps_never_cuts_between_colliding_keys() {
        let keys = log(&[(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d"), (5, b"e")]);
        let key_of = |r: LogRef| keys[&r.offset];
        let t = TableId(1);
        let mut index = ObjectIndex::new();
        index.upsert(t, KeyHash(10), b"a", at(1), key_of);
        index.upsert(t, KeyHash(20), b"b", at(2), key_of);
        index.upsert(t, KeyHash(20), b"c", at(3), key_of);
        index.upsert(t, KeyHash(30), b"d", at(4), key_of);
        index.upsert(t, KeyHash(99), b"e", at(5), key_of);
        // Two asked for: the second is one of two keys of hash 20, and both go.
        let (mut gone, rest) = index.remove_range_up_to(t, 0..=50, 2);
        gone.sort_by_key(|r| r.offset);
        assert_eq!(gone, vec![at(1), at(2), at(3)]);
        assert_eq!(rest, Some(30));
        assert_eq!(index.remove_range_up_to(t, 30..=50, 2), (vec![at(4)], None));
        assert_eq!(index.remove_range_up_to(t, 0..=50, 2), (vec![], None));
        assert_eq!(index.len(), 1);
    }

    /// Hashes for the model test: few distinct top bits so buckets split deep, and some
    /// exact collisions.
    fn crowded_hash(rng: &mut impl rand::Rng) -> u64 {
        match rng.gen_range(0..4) {
            0 => rng.gen_range(0..64) << 40,
            1 => 0xABCD_0000_0000_0000 | rng.gen_range(0..1 << 20),
            _ => rng.gen(),
        }
    }

    #[test]
    fn agrees_with_an_ordered_map_through_splits_merges_and_range_drops() {
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeMap;
        for seed in 0..20u64 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            // Keys are u32 "names"; the fake log maps a reference's offset to its key.
            let mut keys: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut model: BTreeMap<(u64, u64, Vec<u8>), LogRef> = BTreeMap::new();
            let mut index = ObjectIndex::new();
            let mut names: HashMap<u32, Vec<u8>> = HashMap::new();
            let mut next = 0u32;
            for _ in 0..4000 {
                let table = rng.gen_range(1..3u64);
                match rng.gen_range(0..10) {
                    0..=5 => {
                        // Upsert a new or an existing key.
                        let (hash, key) = if keys.is_empty() || rng.gen_bool(0.6) {
                            let key = format!("k{}", keys.len()).into_bytes();
                            keys.push((crowded_hash(&mut rng), key));
                            keys.last().cloned().unwrap_or_default()
                        } else {
                            keys[rng.gen_range(0..keys.len())].clone()
                        };
                        next += 1;
                        names.insert(next, key.clone());
                        let key_of = |r: LogRef| names[&r.offset].as_slice();
                        let old =
                            index.upsert(TableId(table), KeyHash(hash), &key, at(next), key_of);
                        assert_eq!(old, model.insert((table, hash, key), at(next)));
                    }
                    6..=7 if !keys.is_empty() => {
                        let (hash, key) = keys[rng.gen_range(0..keys.len())].clone();
                        let key_of = |r: LogRef| names[&r.offset].as_slice();
                        let removed = index.remove(TableId(table), KeyHash(hash), &key, key_of);
                        assert_eq!(removed, model.remove(&(table, hash, key)));
                    }
                    8 => {
                        let a: u64 = rng.gen();
                        let b = a.saturating_add(rng.gen_range(0..1 << 62));
                        // Whole, or in steps of a few as a narrowed range is forgotten.
                        let mut removed = if rng.gen() {
                            index.remove_range(TableId(table), a..=b)
                        } else {
                            let step = rng.gen_range(1..8);
                            let (mut removed, mut from) = (Vec::new(), Some(a));
                            while let Some(start) = from {
                                let (gone, rest) =
                                    index.remove_range_up_to(TableId(table), start..=b, step);
                                removed.extend(gone);
                                from = rest;
                            }
                            removed
                        };
                        let mut expected: Vec<LogRef> = model
                            .iter()
                            .filter(|((t, h, _), _)| *t == table && (a..=b).contains(h))
                            .map(|(_, at)| *at)
                            .collect();
                        model.retain(|(t, h, _), _| !(*t == table && (a..=b).contains(h)));
                        removed.sort_by_key(|r| r.offset);
                        expected.sort_by_key(|r| r.offset);
                        assert_eq!(removed, expected);
                    }
                    _ => {
                        // The cleaner's move: find by reference, repoint.
                        let Some(((t, h, key), old)) = model
                            .iter()
                            .nth(rng.gen_range(0..model.len().max(1)))
                            .map(|(k, v)| (k.clone(), *v))
                        else {
                            continue;
                        };
                        next += 1;
                        names.insert(next, key.clone());
                        let slot = index.ref_mut(TableId(t), KeyHash(h), old);
                        *slot.expect("indexed") = at(next);
                        model.insert((t, h, key), at(next));
                    }
                }
                assert_eq!(index.len(), model.len() as u64);
            }
            // Every key is found, and each table's walk is in hash order and complete.
            let key_of = |r: LogRef| names[&r.offset].as_slice();
            for ((t, h, key), expected) in &model {
                assert_eq!(
                    index.lookup(TableId(*t), KeyHash(*h), key, key_of),
                    Some(*expected)
                );
            }
            for table in 1..3u64 {
                let walked: Vec<(u64, LogRef)> = index
                    .range(TableId(table), 0..=u64::MAX)
                    .map(|(h, r)| (h.0, r))
                    .collect();
                let mut hashes: Vec<u64> = walked.iter().map(|(h, _)| *h).collect();
                assert!(
                    hashes.windows(2).all(|w| w[0] <= w[1]),
                    "seed {seed}: out of order"
                );
                hashes.dedup();
                let expected = model.keys().filter(|(t, _, _)| *t == table).count();
                assert_eq!(walked.len(), expected, "seed {seed}");
                // A partial range is exactly the model's.
                let (a, b) = (1u64 << 62, 3u64 << 62);
                let part = index.range(TableId(table), a..=b).count();
                let expected = model
                    .keys()
                    .filter(|(t, h, _)| *t == table && (a..=b).contains(h))
                    .count();
                assert_eq!(part, expected, "seed {seed}");
            }
        }
    }

    #[test]
    fn a_located_reference_is_repointed_only_while_it_is_still_there() {
        let mut index = ObjectIndex::new();
        let key_of = |r: LogRef| {
            if r.offset < 100 {
                b"a".as_slice()
            } else {
                b"b"
            }
        };
        let (t, h) = (TableId(1), KeyHash(9));
        index.upsert(t, h, b"a", at(1), key_of);
        index.upsert(t, h, b"b", at(101), key_of);
        assert_eq!(index.locate(t, h, at(2)), None);
        let slot = index.locate(t, h, at(1)).expect("indexed");
        index.warm(&[(t, h), (TableId(7), h)]);
        assert!(index.repoint(slot, at(1), at(3)));
        assert_eq!(index.lookup(t, h, b"a", key_of), Some(at(3)));
        // The slot no longer holds at(1): nothing changes.
        assert!(!index.repoint(slot, at(1), at(4)));
        assert_eq!(index.lookup(t, h, b"a", key_of), Some(at(3)));
        assert_eq!(index.lookup(t, h, b"b", key_of), Some(at(101)));
    }

    #[test]
    fn emptied_tables_and_buckets_give_their_memory_back() {
        let mut index = ObjectIndex::new();
        let key_of = |_: LogRef| b"".as_slice();
        for i in 0..10_000u64 {
            let hash = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            index.upsert(
                TableId(1),
                KeyHash(hash),
                &i.to_le_bytes(),
                at(i as u32),
                |_| b"x",
            );
        }
        let buckets = index.tables[&TableId(1)].buckets.len();
        assert!(buckets > 10_000 / BUCKET_SLOTS_MAX, "{buckets} buckets");
        // Dropping most of the range merges buckets back together.
        index.remove_range(TableId(1), 0..=u64::MAX / 16 * 15);
        let directory = &index.tables[&TableId(1)];
        let in_use = directory.buckets.len() - directory.free.len();
        assert!(in_use < buckets / 4, "{in_use} of {buckets} buckets in use");
        index.remove_range(TableId(1), 0..=u64::MAX);
        assert!(index.is_empty());
        assert!(index.tables.is_empty());
        assert_eq!(index.lookup(TableId(1), KeyHash(1), b"", key_of), None);
    }

    #[test]
    fn a_hash_shared_by_many_keys_does_not_split_forever() {
        let names: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().to_vec()).collect();
        let key_of = |r: LogRef| names[r.offset as usize].as_slice();
        let mut index = ObjectIndex::new();
        for (i, key) in names.iter().enumerate() {
            index.upsert(TableId(1), KeyHash(42), key, at(i as u32), key_of);
        }
        assert_eq!(index.len(), 100);
        for (i, key) in names.iter().enumerate() {
            assert_eq!(
                index.lookup(TableId(1), KeyHash(42), key, key_of),
                Some(at(i as u32))
            );
        }
        // The directory stayed bounded (about two entries per object at most).
        assert!(index.tables[&TableId(1)].entries.len() <= 2 * 100 + 1024);
        assert_eq!(index.range(TableId(1), 42..=42).count(), 100);
    }
}
