//! `OwnedTablets`: which key-hash ranges this master serves.
//!
//! Every data operation checks ownership first; a key outside every owned tablet gets
//! `UnknownTablet`, which sends the client back to the coordinator for a fresh map.
//!
//! # Converging to the committed map
//! The coordinator numbers the changes of each master's tablets one by one (its *tablet
//! epoch*, `protocol::master::TabletsRequest`). `OwnedTablets` remembers the number of
//! the last change it reflects, and [`OwnedTablets::step`] tells a pushed change apart:
//! the next one is applied, an older one is already reflected, and a later one means a
//! change was missed — then the whole set is pulled and [`OwnedTablets::replace`]d. The
//! decision is this pure function; `tablet_sync` drives the pulls.

use rampart_common::ids::{KeyHash, TableId, TabletEpoch};
use rampart_common::tablet::{HashRange, Tablet};
use std::collections::BTreeMap;

/// The tablets a master owns.
#[derive(Debug, Default)]
pub struct OwnedTablets {
    /// By (table, start hash) → end hash.
    /// Invariant: ranges of one table never overlap (the coordinator assigns disjoint
    /// tablets; taking an overlapping tablet replaces the ones it overlaps).
    ranges: BTreeMap<(TableId, u64), u64>,
    /// The coordinator's number of the last change of this master's tablets that
    /// `ranges` reflect (0: none yet). Only grows.
    epoch: TabletEpoch,
}

/// Where a numbered change of a master's tablets stands against what it reflects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochStep {
    /// The next change: apply it.
    Next,
    /// Reflected already (pushed twice, or covered by a later pull): nothing to do.
    Held,
    /// A change before it was missed: pull the whole set instead of applying it.
    Gap,
}

impl OwnedTablets {
    /// Owns nothing.
    pub fn new() -> OwnedTablets {
        OwnedTablets::default()
    }

    /// The number of the last change of this master's tablets reflected here.
    pub fn epoch(&self) -> TabletEpoch {
        self.epoch
    }

    /// Where the change numbered `epoch` stands (module doc).
    pub fn step(&self, epoch: TabletEpoch) -> EpochStep {
        if epoch <= self.epoch {
            EpochStep::Held
        } else if epoch == self.epoch.next() {
            EpochStep::Next
        } else {
            EpochStep::Gap
        }
    }

    /// Records that the changes up to `epoch` are reflected.
    ///
    /// # Panics
    /// If `epoch` is older than what is reflected: epochs only grow.
    pub fn set_epoch(&mut self, epoch: TabletEpoch) {
        assert!(
            epoch >= self.epoch,
            "tablet epoch {epoch} after {}",
            self.epoch
        );
        self.epoch = epoch;
    }

    /// Every owned tablet's range, in order.
    pub fn ranges(&self) -> Vec<HashRange> {
        self.ranges
            .iter()
            .map(|(&(table, start), &end)| HashRange::new(table, start, end))
            .collect()
    }

    /// Makes the owned tablets exactly `tablets` (disjoint, as the coordinator assigns
    /// them). Returns the parts owned before that no tablet of `tablets` covers: their
    /// objects are no longer served.
    pub fn replace(&mut self, tablets: &[Tablet]) -> Vec<HashRange> {
        let before = std::mem::take(&mut self.ranges);
        for tablet in tablets {
            self.ranges
                .insert((tablet.table, tablet.start_hash), tablet.end_hash);
        }
        let mut lost = Vec::new();
        for ((table, start), end) in before {
            for (from, to) in self.unowned_parts(table, start, end) {
                lost.push(HashRange::new(table, from, to));
            }
        }
        lost
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
    /// A recovery replays into exactly such parts (see `recovery_master`).
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
    fn a_numbered_change_is_applied_next_skipped_when_held_and_a_gap_when_one_was_missed() {
        let mut owned = OwnedTablets::new();
        assert_eq!(owned.step(TabletEpoch(1)), EpochStep::Next);
        assert_eq!(owned.step(TabletEpoch(2)), EpochStep::Gap);
        owned.set_epoch(TabletEpoch(1));
        assert_eq!(owned.step(TabletEpoch(1)), EpochStep::Held);
        assert_eq!(owned.step(TabletEpoch(0)), EpochStep::Held);
        assert_eq!(owned.step(TabletEpoch(2)), EpochStep::Next);
        owned.set_epoch(TabletEpoch(5));
        assert_eq!(
            owned.step(TabletEpoch(3)),
            EpochStep::Held,
            "a late push after a pull"
        );
        assert_eq!(owned.step(TabletEpoch(6)), EpochStep::Next);
        assert_eq!(owned.step(TabletEpoch(8)), EpochStep::Gap);
    }

    #[test]
    fn replacing_the_set_reports_only_what_no_new_tablet_covers() {
        let mut owned = OwnedTablets::new();
        owned.take(&tablet(1, 0, 999));
        owned.take(&tablet(2, 0, 99));
        owned.take(&tablet(3, 0, u64::MAX));
        // Table 2 was dropped, table 1 narrowed to two pieces, table 4 is new.
        let lost = owned.replace(&[
            tablet(1, 0, 499),
            tablet(1, 600, 999),
            tablet(3, 0, u64::MAX),
            tablet(4, 0, 9),
        ]);
        assert_eq!(
            lost,
            vec![
                HashRange::new(TableId(1), 500, 599),
                HashRange::new(TableId(2), 0, 99)
            ],
            "objects of the kept parts stay"
        );
        assert_eq!(
            owned.ranges(),
            vec![
                HashRange::new(TableId(1), 0, 499),
                HashRange::new(TableId(1), 600, 999),
                HashRange::whole(TableId(3)),
                HashRange::new(TableId(4), 0, 9)
            ]
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
