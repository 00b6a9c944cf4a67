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
    fn dropping_a_tablet_stops_serving_it() {
        let mut owned = OwnedTablets::new();
        owned.take(&tablet(1, 0, 99));
        owned.take(&tablet(1, 100, 199));
        assert_eq!(owned.drop_overlapping(&tablet(1, 0, 99)), vec![(0, 99)]);
        assert!(!owned.owns(TableId(1), KeyHash(50)));
        assert!(owned.owns(TableId(1), KeyHash(150)));
    }
}
