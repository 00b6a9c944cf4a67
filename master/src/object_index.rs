//! `ObjectIndex`: from (table, key) to the object's place in the log.
//!
//! The index stores only log references, keyed by (table, key hash); keys are compared
//! by reading them from the log entry the reference points at, as RAMCloud's hash table
//! does, so no key is held twice in memory.
//!
//! It is an ordered map (a B-tree), not a hash table, on purpose: enumerate walks a
//! table in key-hash order with a resumable hash cursor, and dropping or (later)
//! migrating and recovering a tablet touches one contiguous range of hashes. A hash
//! table would need a full scan for each. A lookup costs O(log n) comparisons of two
//! u64s (≈ 0.2–0.4 µs at a million objects), small beside a ~30 µs loopback round trip.
//!
//! Several keys may share one 64-bit hash; a [`Bucket`] then holds several references.

use rampart_common::ids::{KeyHash, SegmentId, TableId};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// Bytes of memory one indexed object costs, counted against the master's `--memory`
/// (`ObjectStore`). Measured with a counting allocator over 10,000 and 1,000,000
/// distinct keys: 62–63 bytes of B-tree nodes per object (16-byte keys and 32-byte
/// buckets, nodes about two-thirds full); rounded up for the allocator's own overhead
/// and colliding hashes (`tests/index_memory.rs` checks the bound).
pub const INDEX_BYTES_PER_OBJECT: u64 = 72;

/// Where an object entry starts in the master's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogRef {
    /// The segment holding the entry.
    pub segment: SegmentId,
    /// Byte offset of the entry in that segment.
    pub offset: u32,
}

/// The references of every live object whose key has one hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bucket {
    /// The common case: one object with this hash.
    One(LogRef),
    /// Colliding keys (rare with 64-bit hashes): at least two references.
    Many(Vec<LogRef>),
}

impl Bucket {
    /// The references in this bucket.
    pub fn refs(&self) -> &[LogRef] {
        match self {
            Bucket::One(r) => std::slice::from_ref(r),
            Bucket::Many(refs) => refs,
        }
    }
}

/// The index of live objects. Methods take a `key_of` closure that reads the key of
/// the entry at a reference from the log, so the index never stores keys.
#[derive(Debug, Default)]
pub struct ObjectIndex {
    /// Invariant: every reference points at a live object entry whose table is the key's
    /// table and whose key hashes to the key's hash; no two references in a bucket
    /// point at entries with equal keys.
    map: BTreeMap<(TableId, KeyHash), Bucket>,
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
        let bucket = self.map.get(&(table, hash))?;
        bucket.refs().iter().copied().find(|r| key_of(*r) == key)
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
        use std::collections::btree_map::Entry;
        match self.map.entry((table, hash)) {
            Entry::Vacant(slot) => {
                slot.insert(Bucket::One(new));
                self.len += 1;
                None
            }
            Entry::Occupied(mut slot) => {
                let bucket = slot.get_mut();
                let refs: &mut [LogRef] = match bucket {
                    Bucket::One(r) => std::slice::from_mut(r),
                    Bucket::Many(refs) => refs,
                };
                if let Some(existing) = refs.iter_mut().find(|r| key_of(**r) == key) {
                    return Some(std::mem::replace(existing, new));
                }
                let mut all = refs.to_vec();
                all.push(new);
                *bucket = Bucket::Many(all);
                self.len += 1;
                None
            }
        }
    }

    /// The index's reference to the object at `at`, of `table` with key hash `hash`,
    /// if it is indexed: the cleaner moves it when it moves the entry (one lookup for
    /// both the liveness check and the move). No key is read.
    pub fn ref_mut(&mut self, table: TableId, hash: KeyHash, at: LogRef) -> Option<&mut LogRef> {
        let refs: &mut [LogRef] = match self.map.get_mut(&(table, hash))? {
            Bucket::One(r) => std::slice::from_mut(r),
            Bucket::Many(refs) => refs,
        };
        refs.iter_mut().find(|r| **r == at)
    }

    /// Removes `key`; returns its reference if it was indexed.
    pub fn remove<'a>(
        &mut self,
        table: TableId,
        hash: KeyHash,
        key: &[u8],
        key_of: impl Fn(LogRef) -> &'a [u8],
    ) -> Option<LogRef> {
        let bucket = self.map.get_mut(&(table, hash))?;
        let removed = match bucket {
            Bucket::One(r) if key_of(*r) == key => {
                let removed = *r;
                self.map.remove(&(table, hash));
                removed
            }
            Bucket::One(_) => return None,
            Bucket::Many(refs) => {
                let at = refs.iter().position(|r| key_of(*r) == key)?;
                let removed = refs.swap_remove(at);
                if refs.len() == 1 {
                    *bucket = Bucket::One(refs[0]);
                }
                removed
            }
        };
        self.len -= 1;
        Some(removed)
    }

    /// The buckets of `table` with hashes in `range`, in hash order.
    pub fn range(
        &self,
        table: TableId,
        range: RangeInclusive<u64>,
    ) -> impl Iterator<Item = (KeyHash, &Bucket)> + '_ {
        let (start, end) = range.into_inner();
        self.map
            .range((table, KeyHash(start))..=(table, KeyHash(end)))
            .map(|((_, hash), bucket)| (*hash, bucket))
    }

    /// Removes every object of `table` with a hash in `range`; returns their references.
    pub fn remove_range(&mut self, table: TableId, range: RangeInclusive<u64>) -> Vec<LogRef> {
        let keys: Vec<(TableId, KeyHash)> = self
            .range(table, range)
            .map(|(hash, _)| (table, hash))
            .collect();
        let mut removed = Vec::new();
        for key in keys {
            if let Some(bucket) = self.map.remove(&key) {
                removed.extend_from_slice(bucket.refs());
            }
        }
        self.len -= removed.len() as u64;
        removed
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
}
