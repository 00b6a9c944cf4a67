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
        // The hashes of each bucket that the tablets here cover: only this master's
        // operations were counted in a bucket it shares with another master's tablet,
        // so they are spread over its own part of the bucket, not the whole width.
        let mut owned: HashMap<(TableId, usize), u128> = HashMap::new();
        for range in tablets {
            for i in bucket(range.start)..=bucket(range.end) {
                *owned.entry((range.table, i)).or_default() += covered(i, range.start, range.end);
            }
        }
        tablets
            .iter()
            .map(|range| {
                let shares: Vec<(usize, u64)> = match counts.get(&range.table) {
                    Some(counts) => (bucket(range.start)..=bucket(range.end))
                        .map(|i| {
                            let part = covered(i, range.start, range.end);
                            let whole = owned.get(&(range.table, i)).copied().unwrap_or(part);
                            let share = u128::from(counts[i]) * part / whole.max(1);
                            (i, u64::try_from(share).unwrap_or(u64::MAX))
                        })
                        .collect(),
                    None => Vec::new(),
                };
                TabletLoad {
                    range: *range,
                    ops: shares.iter().map(|&(_, ops)| ops).sum(),
                    bytes: bytes(range),
                    split_at: split_point(&shares),
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

/// How many hashes of bucket `i` lie in `start..=end`.
fn covered(i: usize, start: u64, end: u64) -> u128 {
    let first = u128::from(bucket_start(i));
    let last = first + BUCKET_WIDTH - 1;
    (last.min(u128::from(end)) + 1).saturating_sub(first.max(u128::from(start)))
}

/// Of a tablet's operations by bucket (in bucket order), the first hash of the bucket
/// that cuts them most evenly, below it against from it; `None` with one bucket, or
/// without operations. One pass.
fn split_point(shares: &[(usize, u64)]) -> Option<u64> {
    let total: u64 = shares.iter().map(|&(_, ops)| ops).sum();
    if total == 0 {
        return None;
    }
    let mut below = 0u64;
    let mut best: Option<(u64, usize)> = None;
    for (k, &(i, ops)) in shares.iter().enumerate() {
        if k > 0 {
            let gap = below.abs_diff(total - below);
            if best.map_or(true, |(least, _)| gap < least) {
                best = Some((gap, i));
            }
        }
        below += ops;
    }
    best.map(|(_, i)| bucket_start(i))
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
    fn a_bucket_shared_with_another_master_counts_whole_for_the_part_here() {
        let mut counter = LoadCounter::new();
        counter.track(TABLE);
        for _ in 0..100 {
            counter.count(TABLE, at_bucket(5));
        }
        // Only the upper three quarters of bucket 5 on are here: every operation counted
        // in it was on that part.
        let middle = bucket_start(5) + (BUCKET_WIDTH / 4) as u64;
        let report = counter.report(&[HashRange::new(TABLE, middle, u64::MAX)], |_| 0);
        assert_eq!(report[0].ops, 100);
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
