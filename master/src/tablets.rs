//! `OwnedTablets`: which key-hash ranges this master serves.
//!
//! Every data operation checks ownership first; a key outside every owned tablet gets
//! `UnknownTablet`, which sends the client back to the coordinator for a fresh map.

use rampart_common::ids::{KeyHash, TableId};
use rampart_common::tablet::Tablet;
use std::collections::BTreeMap;

/// The tablets a master owns.
#[derive(Debug, Default)]
pub struct OwnedTablets {
    /// By (table, start hash) → end hash.
    /// Invariant: ranges of one table never overlap (the coordinator assigns disjoint
    /// tablets; taking an overlapping tablet replaces the ones it overlaps).
    ranges: BTreeMap<(TableId, u64), u64>,
}

impl OwnedTablets {
    /// Owns nothing.
    pub fn new() -> OwnedTablets {
        OwnedTablets::default()
    }

    /// Whether a key of `table` with `hash` is served here.
    pub fn owns(&self, table: TableId, hash: KeyHash) -> bool {
        self.ranges
            .range(..=(table, hash.0))
            .next_back()
            .is_some_and(|((t, _), end)| *t == table && hash.0 <= *end)
    }

    /// The owned range of `table` containing `hash`.
    pub fn range_of(&self, table: TableId, hash: u64) -> Option<(u64, u64)> {
        self.ranges
            .range(..=(table, hash))
            .next_back()
            .filter(|((t, _), end)| *t == table && hash <= **end)
            .map(|((_, start), end)| (*start, *end))
    }

    /// Starts serving `tablet`, replacing any owned range it overlaps.
    /// Returns the hash ranges no longer served: the parts of replaced ranges that
    /// `tablet` does not cover.
    pub fn take(&mut self, tablet: &Tablet) -> Vec<(u64, u64)> {
        let replaced = self.drop_overlapping(tablet);
        self.ranges
            .insert((tablet.table, tablet.start_hash), tablet.end_hash);
        let mut lost = Vec::new();
        for (start, end) in replaced {
            if start < tablet.start_hash {
                lost.push((start, tablet.start_hash - 1));
            }
            if end > tablet.end_hash {
                lost.push((tablet.end_hash + 1, end));
            }
        }
        lost
    }

    /// Stops serving every owned range that overlaps `tablet`; returns them.
    pub fn drop_overlapping(&mut self, tablet: &Tablet) -> Vec<(u64, u64)> {
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range((tablet.table, 0)..=(tablet.table, tablet.end_hash))
            .filter(|(_, end)| **end >= tablet.start_hash)
            .map(|((_, start), end)| (*start, *end))
            .collect();
        for (start, _) in &overlapping {
            self.ranges.remove(&(tablet.table, *start));
        }
        overlapping
    }

    /// The parts of `[start, end]` of `table` that no owned tablet covers, in order.
    /// A recovery replays into exactly such parts (see `recovery`).
    pub fn unowned_parts(&self, table: TableId, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut parts = Vec::new();
        // `next` is the first hash not yet classified; `None` once past u64::MAX.
        let mut next = Some(start);
        let first_key = self
            .range_of(table, start)
            .map_or(start, |(owned_start, _)| owned_start);
        for (&(_, owned_start), &owned_end) in self.ranges.range((table, first_key)..=(table, end))
        {
            let Some(from) = next else { break };
            if owned_end < from {
                continue;
            }
            if owned_start > from {
                parts.push((from, owned_start - 1));
            }
            next = owned_end.checked_add(1);
        }
        if let Some(from) = next {
            if from <= end {
                parts.push((from, end));
            }
        }
        parts
    }

    /// Whether any hash of `[start, end]` of `table` is owned.
    pub fn owns_any(&self, table: TableId, start: u64, end: u64) -> bool {
        self.unowned_parts(table, start, end) != [(start, end)]
    }

    /// Number of tablets owned.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether nothing is owned.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::ServerId;

    fn tablet(table: u64, start: u64, end: u64) -> Tablet {
        Tablet {
            table: TableId(table),
            start_hash: start,
            end_hash: end,
            owner: ServerId(1),
        }
    }

    #[test]
    fn owns_checks_table_and_range() {
        let mut owned = OwnedTablets::new();
        owned.take(&tablet(1, 100, 200));
        owned.take(&tablet(2, 0, u64::MAX));
        assert!(owned.owns(TableId(1), KeyHash(100)));
        assert!(owned.owns(TableId(1), KeyHash(200)));
        assert!(!owned.owns(TableId(1), KeyHash(99)));
        assert!(!owned.owns(TableId(1), KeyHash(201)));
        assert!(owned.owns(TableId(2), KeyHash(u64::MAX)));
        assert!(!owned.owns(TableId(3), KeyHash(5)));
        assert_eq!(owned.range_of(TableId(1), 150), Some((100, 200)));
    }

    #[test]
    fn taking_a_narrower_tablet_reports_the_ranges_no_longer_served() {
        let mut owned = OwnedTablets::new();
        assert!(owned.take(&tablet(1, 0, 999)).is_empty());
        assert_eq!(owned.take(&tablet(1, 100, 199)), vec![(0, 99), (200, 999)]);
        assert!(owned.owns(TableId(1), KeyHash(150)));
        assert!(!owned.owns(TableId(1), KeyHash(50)));
        assert!(
            owned.take(&tablet(1, 100, 199)).is_empty(),
            "retaking is harmless"
        );
    }

    #[test]
    fn unowned_parts_are_the_gaps_between_owned_tablets() {
        let mut owned = OwnedTablets::new();
        owned.take(&tablet(1, 100, 199));
        owned.take(&tablet(1, 300, 399));
        owned.take(&tablet(2, 0, u64::MAX));
        assert_eq!(
            owned.unowned_parts(TableId(1), 0, 1000),
            vec![(0, 99), (200, 299), (400, 1000)]
        );
        assert_eq!(owned.unowned_parts(TableId(1), 150, 350), vec![(200, 299)]);
        assert!(owned.unowned_parts(TableId(1), 120, 180).is_empty());
        assert!(owned.unowned_parts(TableId(2), 0, u64::MAX).is_empty());
        assert_eq!(
            owned.unowned_parts(TableId(3), 5, u64::MAX),
            vec![(5, u64::MAX)]
        );
        assert!(owned.owns_any(TableId(1), 0, 100));
        assert!(!owned.owns_any(TableId(1), 0, 99));
        assert!(!owned.owns_any(TableId(1), 200, 299));
    }

    #[test]
    fn dropping_a_tablet_stops_serving_it() {
        let mut owned = OwnedTablets::new();
        owned.take(&tablet(1, 0, 99));
        owned.take(&tablet(1, 100, 199));
        assert_eq!(owned.drop_overlapping(&tablet(1, 0, 99)), vec![(0, 99)]);
        assert!(!owned.owns(TableId(1), KeyHash(50)));
        assert!(owned.owns(TableId(1), KeyHash(150)));
    }
}
