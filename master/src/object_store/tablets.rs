//! The tablets this master serves: taking, dropping and replacing them — by the
//! coordinator's tablet epoch when it numbers the change — and what that does to the
//! objects indexed in their ranges and to their profiles.

use rampart_common::ids::{SegmentId, TableId, TabletEpoch};
use rampart_common::tablet::{HashRange, Tablet};
use std::collections::HashSet;
use std::ops::RangeInclusive;

use crate::tablets::EpochStep;

use super::store::ObjectStore;

impl ObjectStore {
    /// Whether this master owns any hash of `ranges`.
    pub fn owns_any(&self, ranges: &[HashRange]) -> bool {
        ranges
            .iter()
            .any(|&HashRange { table, start, end }| self.tablets.owns_any(table, start, end))
    }

    /// Starts serving `tablets`.
    ///
    /// A tablet that replaces a wider owned range narrows it: objects in the part no
    /// longer served are forgotten, and the segments holding them tainted (a range
    /// moved away may come back; `forget_narrowed` says why). A split keeps both halves
    /// here and reaches the master as its whole tablet set, through
    /// [`replace_tablets`](Self::replace_tablets), which narrows nothing then.
    /// Objects already indexed in a range not owned before — replayed by a recovery —
    /// are kept: this is how they become visible. Their entries are counted in the
    /// tablet's profile now.
    pub fn take_tablets(&mut self, tablets: &[Tablet]) {
        for tablet in tablets {
            for (start, end) in self.tablets.take(tablet) {
                self.forget_narrowed(tablet.table, start..=end);
            }
            self.profile_taken(std::slice::from_ref(tablet));
        }
        self.drop_moves_not_owned();
    }

    /// Forgets the objects and records of `table`'s hashes `range`, which this master
    /// stops serving while the range lives on elsewhere (a move committed), and taints
    /// every segment that holds one of them. Their entries stay in the log, and the
    /// range may come back here: a crash then would replay them beside the new owner's
    /// newer data, with nothing to mask them, as with a failed recovery's leftovers
    /// ([`forget_unowned`](Self::forget_unowned)). Dead versions of the range need
    /// nothing: each is masked by an entry that stays in the log as long as it does.
    fn forget_narrowed(&mut self, table: TableId, range: RangeInclusive<u64>) {
        let records: Vec<SegmentId> = self
            .completions
            .keys_where(|t, hash| t == table && range.contains(&hash.0))
            .filter_map(|(client, seq)| self.completions.record(client, seq))
            .map(|record| record.at.segment)
            .collect();
        let refs = self.forget_range(table, range);
        self.tainted.extend(records);
        self.tainted.extend(refs.iter().map(|at| at.segment));
        let log = &self.log;
        self.tainted.retain(|&segment| log.holds(segment));
    }

    /// The coordinator's number of the last change of this master's tablets applied here
    /// (see [`OwnedTablets::step`]).
    ///
    /// [`OwnedTablets::step`]: crate::tablets::OwnedTablets::step
    pub fn tablets_epoch(&self) -> TabletEpoch {
        self.tablets.epoch()
    }

    /// Applies the coordinator's change number `epoch` of this master's tablets — take
    /// `tablets`, as [`take_tablets`](Self::take_tablets) — if it is the next one;
    /// returns where it stood ([`EpochStep::Gap`]: pull the whole set instead).
    pub fn take_tablets_at(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) -> EpochStep {
        let step = self.tablets.step(epoch);
        if step == EpochStep::Next {
            self.take_tablets(tablets);
            self.tablets.set_epoch(epoch);
        }
        step
    }

    /// Applies the change number `epoch` — drop `tablets` and forget their objects, as
    /// [`drop_tablets`](Self::drop_tablets) — if it is the next one; returns where it
    /// stood.
    pub fn drop_tablets_at(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) -> EpochStep {
        let step = self.tablets.step(epoch);
        if step == EpochStep::Next {
            self.drop_tablets(tablets);
            self.tablets.set_epoch(epoch);
        }
        step
    }

    /// Serves exactly `tablets` — this master's whole set in the committed map, as of its
    /// tablet epoch `epoch` — unless what is served reflects that epoch already. Objects
    /// in parts no longer served are forgotten; those a recovery replayed into newly
    /// served ranges become visible. Returns whether anything was applied.
    pub fn replace_tablets(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) -> bool {
        if epoch <= self.tablets.epoch() {
            return false;
        }
        let new: HashSet<HashRange> = tablets.iter().map(Tablet::range).collect();
        let before = self.tablets.ranges();
        let old: HashSet<HashRange> = before.iter().copied().collect();
        for HashRange {
            table,
            start: from,
            end: to,
        } in self.tablets.replace(tablets)
        {
            self.forget_narrowed(table, from..=to);
        }
        self.drop_moves_not_owned();
        // Profiles of tablets gone for good end; one that a new tablet overlaps is
        // replaced by that tablet's, which inherits its counts.
        let own = self.log.log_id();
        let overlapped = |&HashRange { table, start, end }: &HashRange| {
            tablets
                .iter()
                .any(|t| t.table == table && t.start_hash <= end && start <= t.end_hash)
        };
        for &HashRange {
            table,
            start: start_hash,
            end: end_hash,
        } in before.iter().filter(|r| !new.contains(r) && !overlapped(r))
        {
            self.profiler.drop_tablet(&Tablet {
                table,
                start_hash,
                end_hash,
                owner: own,
            });
        }
        // Together: the halves of a tablet split since both inherit the whole's counts.
        let taken: Vec<Tablet> = tablets
            .iter()
            .filter(|t| !old.contains(&t.range()))
            .copied()
            .collect();
        self.profile_taken(&taken);
        self.tablets.set_epoch(epoch);
        true
    }

    /// Stops serving `tablets` and forgets their objects (their log space is reclaimed
    /// by the cleaner). They are not masked: a dropped table's id is never used again,
    /// so no later owner of its ranges can meet them.
    pub fn drop_tablets(&mut self, tablets: &[Tablet]) -> u64 {
        let mut removed = 0;
        for tablet in tablets {
            for (start, end) in self.tablets.drop_overlapping(tablet) {
                removed += self.forget_range(tablet.table, start..=end).len() as u64;
            }
            self.profiler.drop_tablet(tablet);
        }
        self.drop_moves_not_owned();
        removed
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;
    use rampart_common::ids::{key_hash, ServerId, TableId, TabletEpoch};
    use rampart_common::reject::RejectRules;
    use rampart_common::status::Status;

    use super::super::ops::WriteOp;
    use super::super::store::ObjectStore;
    use super::super::test_support::{
        apply, config, increment, log_len, put, remove, store, tablet, write, ReadResult, TABLE,
    };

    /// A key whose hash is at most (`low`) or above (`!low`) `split`.
    fn key_on_side(split: u64, low: bool, tag: &str) -> Vec<u8> {
        (0u32..)
            .map(|i| format!("{tag}-{i}").into_bytes())
            .find(|key| (key_hash(key).0 <= split) == low)
            .unwrap()
    }

    #[test]
    fn keys_of_unowned_tables_are_unknown_tablet() {
        let mut store = store();
        let other = TableId(2);
        assert_eq!(store.read(other, b"k").status(), Status::UnknownTablet);
        let ops = [
            WriteOp::Write {
                table: other,
                key: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"v"),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
            WriteOp::Remove {
                table: other,
                key: Bytes::from_static(b"k"),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
            WriteOp::Increment {
                table: other,
                key: Bytes::from_static(b"k"),
                delta: 1,
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
        ];
        let log_before = log_len(&store);
        for op in &ops {
            assert_eq!(
                apply(&mut store, op).status,
                Status::UnknownTablet,
                "{op:?}"
            );
        }
        assert_eq!(log_len(&store), log_before);
        assert_eq!(store.object_count(), 0);
    }

    #[test]
    fn drop_tablets_forgets_objects_and_refuses_ops() {
        let mut store = store();
        let other = TableId(2);
        store.take_tablets(&[tablet(other, 0, u64::MAX)]);
        for i in 0..50 {
            put(&mut store, format!("k{i}").as_bytes(), b"v");
        }
        let kept = WriteOp::Write {
            table: other,
            key: Bytes::from_static(b"kept"),
            value: Bytes::from_static(b"v"),
            rules: RejectRules::default(),
            rifl: rampart_common::rifl::Rifl::NONE,
        };
        assert_eq!(apply(&mut store, &kept).status, Status::Ok);
        assert_eq!(store.object_count(), 51);

        assert_eq!(store.drop_tablets(&[tablet(TABLE, 0, u64::MAX)]), 50);
        assert_eq!(store.object_count(), 1);
        assert_eq!(store.read(TABLE, b"k0").status(), Status::UnknownTablet);
        assert_eq!(
            apply(&mut store, &write(b"k0", b"v")).status,
            Status::UnknownTablet
        );
        assert_eq!(
            apply(&mut store, &remove(b"k0")).status,
            Status::UnknownTablet
        );
        assert_eq!(
            apply(&mut store, &increment(b"k0", 1)).status,
            Status::UnknownTablet
        );
        assert_eq!(store.read(other, b"kept").status(), Status::Ok);

        // Taking the tablet back does not bring the dropped objects back.
        store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
        assert_eq!(store.read(TABLE, b"k0").status(), Status::ObjectDoesntExist);
        assert_eq!(store.object_count(), 1);
    }

    #[test]
    fn retaking_owned_tablets_keeps_their_objects() {
        // The coordinator re-sends TakeTablets when it retries a table creation; the
        // repeat must be harmless.
        let split = u64::MAX / 2;
        let halves = [tablet(TABLE, 0, split), tablet(TABLE, split + 1, u64::MAX)];
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&halves);
        for i in 0..40 {
            put(&mut store, format!("key-{i}").as_bytes(), b"v");
        }
        store.take_tablets(&halves);
        assert_eq!(store.object_count(), 40);
        for i in 0..40 {
            assert_eq!(
                store.read(TABLE, format!("key-{i}").as_bytes()).status(),
                Status::Ok
            );
        }
        // Dropping is idempotent too.
        assert_eq!(store.drop_tablets(&halves), 40);
        assert_eq!(store.drop_tablets(&halves), 0);
        assert_eq!(store.object_count(), 0);
    }

    #[test]
    fn narrowing_a_tablet_forgets_objects_outside_it() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
        let inside = key_on_side(split, true, "in");
        let outside = key_on_side(split, false, "out");
        put(&mut store, &inside, b"kept");
        put(&mut store, &outside, b"forgotten");
        store.take_tablets(&[tablet(TABLE, 0, split)]);
        assert_eq!(store.object_count(), 1);
        assert_eq!(store.read(TABLE, &outside).status(), Status::UnknownTablet);
        // Were the upper half to come back, its old object must not reappear.
        store.take_tablets(&[tablet(TABLE, split + 1, u64::MAX)]);
        assert_eq!(
            store.read(TABLE, &outside).status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(&store.read(TABLE, &inside).value()[..], b"kept");
    }

    /// A split reaches its owner as its whole tablet set: both halves stay served with
    /// every object, and each half's profile counts at least what it holds (the will's
    /// upper bounds), the upper half's too.
    #[test]
    fn replacing_a_tablet_by_its_two_halves_keeps_every_object_and_both_profiles() {
        let split = u64::MAX / 2;
        let mut store = store();
        let low = key_on_side(split, true, "low");
        let high = key_on_side(split, false, "high");
        put(&mut store, &low, b"l");
        put(&mut store, &high, b"h");
        let halves = [tablet(TABLE, 0, split), tablet(TABLE, split + 1, u64::MAX)];
        assert!(store.replace_tablets(TabletEpoch(1), &halves));
        assert_eq!(store.object_count(), 2);
        assert_eq!(&store.read(TABLE, &low).value()[..], b"l");
        assert_eq!(&store.read(TABLE, &high).value()[..], b"h");
        for (key, half) in [(&low, halves[0]), (&high, halves[1])] {
            let profile = store
                .profiler()
                .tablet(TABLE, key_hash(key))
                .expect("profiled");
            assert_eq!(
                (profile.start_hash(), profile.end_hash()),
                (half.start_hash, half.end_hash)
            );
            assert!(profile.totals().records >= 1, "{half:?} counts its object");
        }
    }

    #[test]
    fn dropping_one_tablet_keeps_the_objects_of_its_neighbour() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, split), tablet(TABLE, split + 1, u64::MAX)]);
        let keys: Vec<String> = (0..100).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            put(&mut store, key.as_bytes(), b"v");
        }
        let low = keys
            .iter()
            .filter(|k| key_hash(k.as_bytes()).0 <= split)
            .count();
        assert_eq!(store.drop_tablets(&[tablet(TABLE, 0, split)]), low as u64);
        assert_eq!(store.object_count(), (keys.len() - low) as u64);
        for key in &keys {
            let expected = if key_hash(key.as_bytes()).0 <= split {
                Status::UnknownTablet
            } else {
                Status::Ok
            };
            assert_eq!(
                store.read(TABLE, key.as_bytes()).status(),
                expected,
                "{key}"
            );
        }
    }

    #[test]
    fn a_sub_range_tablet_serves_only_its_range() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, split)]);
        let inside = key_on_side(split, true, "in");
        let outside = key_on_side(split, false, "out");
        assert_eq!(apply(&mut store, &write(&inside, b"v")).status, Status::Ok);
        assert_eq!(store.read(TABLE, &inside).status(), Status::Ok);
        assert_eq!(
            apply(&mut store, &write(&outside, b"v")).status,
            Status::UnknownTablet
        );
        assert_eq!(store.read(TABLE, &outside).status(), Status::UnknownTablet);
        // The boundary hashes themselves.
        let mut edges = ObjectStore::new(ServerId(1), config());
        let hash = key_hash(&inside).0;
        edges.take_tablets(&[tablet(TABLE, hash, hash)]);
        assert_eq!(apply(&mut edges, &write(&inside, b"v")).status, Status::Ok);
        assert_eq!(
            apply(&mut edges, &write(&outside, b"v")).status,
            Status::UnknownTablet
        );
    }
}
