//! `Will` and `Partition`: how a master's tablets are to be cut among recovery masters
//! should it crash (docs/design.md §5 "Tablet profiles and wills"). The master computes its will
//! from its tablet profiles (`rampart_master::profiler`) and uploads it; the coordinator
//! commits it through Raft and hands each partition to one recovery master (§6 step 1).
//! Shared here because both sides and the wire carry it.

use crate::ids::{KeyHash, TableId};
use crate::tablet::HashRange;
use serde::{Deserialize, Serialize};

/// How this master's tablets are to be split among recovery masters should it crash.
/// Uploaded to the coordinator, which commits it through Raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Will {
    /// The byte limit the partitions were cut to.
    pub bytes_max: u64,
    /// The record limit the partitions were cut to.
    pub records_max: u64,
    /// In (table, hash) order; together they cover every tablet of the master exactly
    /// once.
    pub partitions: Vec<Partition>,
}

/// One partition of a will: what one recovery master replays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Hash ranges, in order, non-empty, disjoint; adjacent ranges of one table are
    /// merged.
    pub tablets: Vec<HashRange>,
    /// Upper bound on the log bytes in these ranges.
    pub bytes: u64,
    /// Upper bound on the log entries in these ranges.
    pub records: u64,
}

impl Will {
    /// The partition holding `hash` of `table`, by index. Linear in the ranges.
    pub fn partition_of(&self, table: TableId, hash: KeyHash) -> Option<usize> {
        self.partitions.iter().position(|partition| {
            partition
                .tablets
                .iter()
                .any(|range| range.contains(table, hash))
        })
    }

    /// Every range covered, sorted, with adjacent ranges of one table merged.
    pub fn coverage(&self) -> Vec<HashRange> {
        let mut ranges: Vec<HashRange> = self
            .partitions
            .iter()
            .flat_map(|partition| partition.tablets.iter().copied())
            .collect();
        ranges.sort_unstable();
        let mut merged = Vec::with_capacity(ranges.len());
        for range in ranges {
            push_range(&mut merged, range);
        }
        merged
    }

    /// Whether `self` differs enough from `other` (the will last uploaded) to upload it:
    /// other limits, other coverage (a tablet taken or dropped: the old will no longer
    /// describes the master), another number of partitions, or a partition whose bytes
    /// or records moved by more than `fraction` of the limit (`bytes_max`,
    /// `records_max`). Measured against the limit rather than the partition's own size,
    /// so that a nearly empty partition growing from 1 KiB to 2 KiB is not material.
    /// Boundaries that move with the counts within the fraction are not material either:
    /// the old will still covers everything and is still about as balanced.
    pub fn changed_materially(&self, other: &Will, fraction: f64) -> bool {
        if self.bytes_max != other.bytes_max
            || self.records_max != other.records_max
            || self.partitions.len() != other.partitions.len()
            || self.coverage() != other.coverage()
        {
            return true;
        }
        let moved = |a: u64, b: u64, limit: u64| a.abs_diff(b) as f64 > fraction * limit as f64;
        self.partitions.iter().zip(&other.partitions).any(|(a, b)| {
            moved(a.bytes, b.bytes, self.bytes_max) || moved(a.records, b.records, self.records_max)
        })
    }
}

/// Appends `range` to `ranges`, extending the last range when it is of the same table
/// and ends just before `range` starts.
pub fn push_range(ranges: &mut Vec<HashRange>, range: HashRange) {
    if let Some(last) = ranges.last_mut() {
        if last.table == range.table && last.end.checked_add(1) == Some(range.start) {
            last.end = range.end;
            return;
        }
    }
    ranges.push(range);
}
