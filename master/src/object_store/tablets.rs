//! The tablets this master serves: taking, dropping and replacing them — by the
//! coordinator's tablet epoch when it numbers the change — and what that does to the
//! objects indexed in their ranges and to their profiles.

use rampart_common::ids::{KeyHash, TableId, TabletEpoch};
use rampart_common::log::COMPLETION_ENTRY_BYTES;
use rampart_common::tablet::{HashRange, Tablet, TabletLoad};
use std::collections::HashSet;
use std::ops::RangeInclusive;

use crate::object_index::LogRef;
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
    /// longer served are forgotten — a step at a time, from the appender — and the
    /// segments holding them tainted (a range moved away may come back;
    /// `forget_narrowed` says why). What is left to forget of a range taken here again
    /// is forgotten first. A split keeps both halves
    /// here and reaches the master as its whole tablet set, through
    /// [`replace_tablets`](Self::replace_tablets), which narrows nothing then.
    /// Objects already indexed in a range not owned before — replayed by a recovery —
    /// are kept: this is how they become visible. Their entries are counted in the
    /// tablet's profile now.
    pub fn take_tablets(&mut self, tablets: &[Tablet]) {
        for tablet in tablets {
            self.forget_now(&tablet.range());
            self.load.track(tablet.table);
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
    ///
    /// The records go now; the objects — a whole tablet's, spread over most of the log
    /// — a step at a time ([`forget_step`](Self::forget_step)), so that no store lock
    /// is held for longer than a step: a gigabyte forgotten at once held this master's
    /// reads and writes, and its answers to pings, for most of a second.
    fn forget_narrowed(&mut self, table: TableId, range: RangeInclusive<u64>) {
        for record in self
            .completions
            .drop_where(|t, hash| t == table && range.contains(&hash.0))
        {
            self.log.note_dead(record.at, COMPLETION_ENTRY_BYTES as u64);
            self.tainted.insert(record.at.segment);
        }
        let log = &self.log;
        self.tainted.retain(|&segment| log.holds(segment));
        let (start, end) = range.into_inner();
        self.forgetting.push_back(HashRange { table, start, end });
    }

    /// Forgets up to about `max` objects of the ranges moved away and not forgotten yet
    /// (a few more when keys share the last hash), tainting the segments that hold
    /// them; returns how many it forgot. [`forgetting`](Self::forgetting) says whether
    /// any are left.
    pub fn forget_step(&mut self, max: usize) -> usize {
        let Some(HashRange { table, start, end }) = self.forgetting.pop_front() else {
            return 0;
        };
        let (refs, rest) = self.index.remove_range_up_to(table, start..=end, max);
        if let Some(start) = rest {
            self.forgetting.push_front(HashRange { table, start, end });
        }
        self.forgotten(&refs);
        refs.len()
    }

    /// Whether objects of a range moved away are still to be forgotten
    /// ([`forget_step`](Self::forget_step)).
    pub fn forgetting(&self) -> bool {
        !self.forgetting.is_empty()
    }

    /// Forgets at once what is left of the ranges moved away that overlap `range`,
    /// which is about to be owned here again.
    fn forget_now(&mut self, range: &HashRange) {
        let mut overlapping = Vec::new();
        self.forgetting.retain(|r| {
            let hit = r.overlaps(range);
            if hit {
                overlapping.push(*r);
            }
            !hit
        });
        for HashRange { table, start, end } in overlapping {
            let refs = self.index.remove_range(table, start..=end);
            self.forgotten(&refs);
        }
    }

    /// The objects at `refs` were forgotten: their entries are dead, and their segments
    /// tainted.
    fn forgotten(&mut self, refs: &[LogRef]) {
        for &at in refs {
            self.note_dead(at);
        }
        self.fit_segments_to_index();
        self.tainted.extend(refs.iter().map(|at| at.segment));
    }

    /// The load of every tablet owned here since the last report: operations served,
    /// log bytes (the profile's count), where a split would halve the operations
    /// (`crate::tablet_load`). Counting starts again from zero.
    pub fn load_report(&mut self) -> Vec<TabletLoad> {
        let tablets = self.tablets.ranges();
        let profiler = &self.profiler;
        self.load.report(&tablets, |range| {
            profiler
                .tablet(range.table, KeyHash(range.start))
                .map_or(0, |profile| profile.totals().bytes)
        })
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
    /// in parts no longer served are forgotten (as by
    /// [`take_tablets`](Self::take_tablets)); those a recovery replayed into newly
    /// served ranges become visible. Returns whether anything was applied.
    pub fn replace_tablets(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) -> bool {
        if epoch <= self.tablets.epoch() {
            return false;
        }
        for tablet in tablets {
            self.forget_now(&tablet.range());
            self.load.track(tablet.table);
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
    use rampart_common::tablet::HashRange;

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
        // Not served from now on, and forgotten later, a step at a time.
        assert_eq!(store.read(TABLE, &outside).status(), Status::UnknownTablet);
        assert!(store.forgetting());
        // Were the upper half to come back before the steps are done, its old object
        // must not reappear: what is left is forgotten first.
        store.take_tablets(&[tablet(TABLE, split + 1, u64::MAX)]);
        assert!(!store.forgetting());
        assert_eq!(store.object_count(), 1);
        assert!(store.tainted_held() > 0);
        assert_eq!(
            store.read(TABLE, &outside).status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(&store.read(TABLE, &inside).value()[..], b"kept");
    }

    #[test]
    fn a_range_moved_away_is_forgotten_in_bounded_steps() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
        for i in 0..200 {
            put(&mut store, format!("key-{i}").as_bytes(), b"v");
        }
        let kept = (0..200)
            .filter(|i| key_hash(format!("key-{i}").as_bytes()).0 <= split)
            .count() as u64;
        assert!(store.replace_tablets(TabletEpoch(1), &[tablet(TABLE, 0, split)]));
        assert_eq!(
            store.object_count(),
            200,
            "nothing forgotten in the change itself"
        );
        let mut steps = 0;
        while store.forgetting() {
            // No collisions among these keys: exactly the step's count, or what is left.
            assert!(store.forget_step(16) <= 16);
            steps += 1;
        }
        assert_eq!(store.object_count(), kept);
        assert!(steps >= (200 - kept) / 16, "{steps} steps");
        assert!(store.tainted_held() > 0);
        for i in 0..200 {
            let key = format!("key-{i}");
            let status = store.read(TABLE, key.as_bytes()).status();
            let low = key_hash(key.as_bytes()).0 <= split;
            assert_eq!(status == Status::Ok, low, "{key}");
        }
    }

    #[test]
    fn a_move_in_waits_for_a_range_moved_away_to_be_forgotten() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
        put(&mut store, &key_on_side(split, false, "out"), b"v");
        store.take_tablets(&[tablet(TABLE, 0, split)]);
        let upper = HashRange {
            table: TABLE,
            start: split + 1,
            end: u64::MAX,
        };
        let id = rampart_common::ids::MoveId(1);
        assert_eq!(store.begin_move_in(id, upper), Err(Status::Retry));
        while store.forgetting() {
            store.forget_step(1);
        }
        assert_eq!(store.begin_move_in(id, upper), Ok(()));
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
