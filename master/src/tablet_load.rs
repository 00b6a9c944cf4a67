//! `LoadCounter`: the reads and writes this master serves, by table and slice of the
//! hash space, and the load of each tablet it reports from them (docs/design.md §7,
//! "Rebalancing").
//!
//! Each table the master owns any of has [`LOAD_BUCKETS`] counters, one per equal slice
//! of the hash space (the top [`LOAD_BUCKET_BITS`] bits of a key's hash). A read or
//! write served adds one to its key's bucket: a relaxed atomic add, made under the
//! store's lock already held for the operation. A report sums the buckets each tablet
//! covers — a bucket it covers in part counts in proportion: keys hash uniformly, so a
//! tablet's share of a bucket's operations is about its share of the bucket's hashes —
//! and starts every count again from zero.
//!
//! The buckets also say where a hot tablet could be split: at the bucket boundary inside
//! it that halves its operations most evenly ([`TabletLoad::split_at`]). A tablet inside
//! one bucket (1/1,024 of a table) has no such boundary: past that, a split would cut a
//! handful of hot keys, which a split cannot spread anyway.

use rampart_common::ids::{KeyHash, TableId};
use rampart_common::tablet::{HashRange, TabletLoad};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of the key hash that pick a load bucket.
pub const LOAD_BUCKET_BITS: u32 = 10;

/// Load buckets per table (8 KiB of counters).
pub const LOAD_BUCKETS: usize = 1 << LOAD_BUCKET_BITS;

/// Hashes per bucket.
const BUCKET_WIDTH: u128 = 1 << (64 - LOAD_BUCKET_BITS);

/// Operations served, by table and hash bucket, since the last report.
#[derive(Debug, Default)]
pub struct LoadCounter {
    tables: HashMap<TableId, Box<[AtomicU64]>>,
}

impl LoadCounter {
    /// A counter of nothing yet.
    pub fn new() -> LoadCounter {
        LoadCounter::default()
    }

    /// Counts the operations on `table` from now on (a tablet of it was taken).
    pub fn track(&mut self, table: TableId) {
        self.tables
            .entry(table)
            .or_insert_with(|| (0..LOAD_BUCKETS).map(|_| AtomicU64::new(0)).collect());
    }

    /// One operation served on the key of `table` with hash `hash`; nothing if `table`
    /// is not tracked.
    pub fn count(&self, table: TableId, hash: KeyHash) {
        if let Some(buckets) = self.tables.get(&table) {
            buckets[bucket(hash.0)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The load of each of `tablets` (each with its log bytes, from `bytes`) since the
    /// last report, in their order; every count starts again from zero, and a table none
    /// of `tablets` is of is no longer tracked.
    pub fn report(
        &mut self,
        tablets: &[HashRange],
        bytes: impl Fn(&HashRange) -> u64,
    ) -> Vec<TabletLoad> {
        self.tables
            .retain(|table, _| tablets.iter().any(|t| t.table == *table));
        let counts: HashMap<TableId, Vec<u64>> = self
            .tables
            .iter()
            .map(|(&table, buckets)| {
                let taken = buckets.iter().map(|b| b.swap(0, Ordering::Relaxed));
                (table, taken.collect())
            })
            .collect();
        tablets
            .iter()
            .map(|range| {
                let (ops, split_at) = match counts.get(&range.table) {
                    Some(counts) => (
                        ops_in(counts, range.start, range.end),
                        split_point(counts, range.start, range.end),
                    ),
                    None => (0, None),
                };
                TabletLoad {
                    range: *range,
                    ops,
                    bytes: bytes(range),
                    split_at,
                }
            })
            .collect()
    }
}

/// The bucket of `hash`.
fn bucket(hash: u64) -> usize {
    (hash >> (64 - LOAD_BUCKET_BITS)) as usize
}

/// The first hash of bucket `i`.
fn bucket_start(i: usize) -> u64 {
    (i as u64) << (64 - LOAD_BUCKET_BITS)
}

/// The operations counted in hashes `start..=end`: whole buckets in full, partly
/// covered ones in proportion to the hashes covered.
fn ops_in(counts: &[u64], start: u64, end: u64) -> u64 {
    let mut total = 0u128;
    let (first_bucket, last_bucket) = (bucket(start), bucket(end));
    for (i, &count) in counts
        .iter()
        .enumerate()
        .take(last_bucket + 1)
        .skip(first_bucket)
    {
        let first = u128::from(bucket_start(i));
        let last = first + BUCKET_WIDTH - 1;
        let covered = last.min(u128::from(end)) - first.max(u128::from(start)) + 1;
        total += u128::from(count) * covered / BUCKET_WIDTH;
    }
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// The bucket boundary in `start + 1..=end` that cuts the operations of `start..=end`
/// most evenly; `None` without one, or without operations.
fn split_point(counts: &[u64], start: u64, end: u64) -> Option<u64> {
    let total = ops_in(counts, start, end);
    if total == 0 {
        return None;
    }
    (bucket(start) + 1..=bucket(end))
        .map(bucket_start)
        .filter(|&at| at > start)
        .min_by_key(|&at| {
            let below = ops_in(counts, start, at - 1);
            below.abs_diff(total - below.min(total))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: TableId = TableId(1);

    fn at_bucket(i: usize) -> KeyHash {
        KeyHash(bucket_start(i) + 12_345)
    }

    #[test]
    fn operations_count_in_the_tablets_that_hold_their_keys_and_start_again() {
        let mut counter = LoadCounter::new();
        counter.track(TABLE);
        for _ in 0..30 {
            counter.count(TABLE, at_bucket(3));
        }
        for _ in 0..10 {
            counter.count(TABLE, at_bucket(900));
        }
        // Not tracked: not counted.
        counter.count(TableId(2), at_bucket(3));
        let half = bucket_start(LOAD_BUCKETS / 2);
        let tablets = [
            HashRange::new(TABLE, 0, half - 1),
            HashRange::new(TABLE, half, u64::MAX),
        ];
        let report = counter.report(&tablets, |r| r.start / 1_000_000_000_000);
        assert_eq!(
            report.iter().map(|l| l.ops).collect::<Vec<_>>(),
            vec![30, 10]
        );
        assert_eq!(report[1].bytes, half / 1_000_000_000_000);
        let again = counter.report(&tablets, |_| 0);
        assert!(again.iter().all(|l| l.ops == 0 && l.split_at.is_none()));
    }

    #[test]
    fn a_bucket_covered_in_part_counts_in_proportion() {
        let mut counter = LoadCounter::new();
        counter.track(TABLE);
        for _ in 0..100 {
            counter.count(TABLE, at_bucket(5));
        }
        let middle = bucket_start(5) + (BUCKET_WIDTH / 4) as u64;
        let tablets = [
            HashRange::new(TABLE, 0, middle - 1),
            HashRange::new(TABLE, middle, u64::MAX),
        ];
        let report = counter.report(&tablets, |_| 0);
        assert_eq!(report[0].ops, 25);
        assert_eq!(report[1].ops, 75);
    }

    #[test]
    fn the_split_point_halves_the_operations_at_a_bucket_boundary() {
        let mut counter = LoadCounter::new();
        counter.track(TABLE);
        for (i, n) in [(10, 40), (11, 10), (12, 30), (600, 20)] {
            for _ in 0..n {
                counter.count(TABLE, at_bucket(i));
            }
        }
        let whole = [HashRange::whole(TABLE)];
        let report = counter.report(&whole, |_| 0);
        // 40 | 10 + 30 + 20: off by 20; 40 + 10 | 30 + 20: even.
        assert_eq!(report[0].split_at, Some(bucket_start(11 + 1)));
        // A tablet inside one bucket has no boundary to split at.
        counter.count(TABLE, at_bucket(10));
        let inside = [HashRange::new(
            TABLE,
            bucket_start(10),
            bucket_start(11) - 1,
        )];
        assert_eq!(counter.report(&inside, |_| 0)[0].split_at, None);
    }

    #[test]
    fn a_table_no_longer_owned_is_no_longer_counted() {
        let mut counter = LoadCounter::new();
        counter.track(TABLE);
        counter.report(&[], |_| 0);
        counter.count(TABLE, at_bucket(1));
        let report = counter.report(&[HashRange::whole(TABLE)], |_| 0);
        assert_eq!(report[0].ops, 0);
    }
}
