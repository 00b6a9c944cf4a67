//! Recovery replay: staging a piece of a crashed master's log into this one, and
//! forgetting what a failed or abandoned recovery left behind.
//!
//! [`ObjectStore::stage_replay`] stages one piece of a crashed master's log (see
//! [`replay`](crate::replay) for the rules) into a batch like `stage` does, and
//! [`ObjectStore::publish_recovered`] publishes it *although this master does not own
//! the keys yet*: reads still answer `UnknownTablet` for them, because reads check
//! ownership before the index. `take_tablets` of a fresh range keeps what the index
//! holds there, which is how the replayed objects become visible;
//! [`ObjectStore::forget_unowned`] drops them if the recovery is abandoned.

use rampart_common::log::{
    object_entry_bytes, tombstone_entry_bytes, CompletionEntry, COMPLETION_ENTRY_BYTES,
};
use rampart_common::tablet::HashRange;

use crate::completions::{Lookup, Record};
use crate::replay::{PieceEntry, RecoveryPiece, ReplayState};
use crate::segmented_log::{Appended, NoSpace, Superseded};

use super::batch::{Batch, Staged};
use super::store::ObjectStore;

impl ObjectStore {
    /// Stages one recovery piece into `batch` (see [`replay`](crate::replay) for the
    /// rules): appends each surviving object with its original version and each needed
    /// tombstone, updates `state`, and raises the safe version above everything the
    /// piece holds (appending a `SafeVersion` entry when it rises). Publish the batch
    /// with [`publish_recovered`](Self::publish_recovered) once it is replicated.
    ///
    /// # Errors
    /// [`NoSpace`] when the log is full; the entries staged until then stay in `batch`
    /// (publish it anyway: its bytes are in the log) and the recovery must fail.
    pub fn stage_replay(
        &mut self,
        batch: &mut Batch,
        state: &mut ReplayState,
        piece: &RecoveryPiece,
    ) -> Result<(), NoSpace> {
        // Leftovers of a failed attempt leave the log before this attempt's entries join
        // it (`forget_unowned`), and a range moved away is forgotten first: its objects,
        // still indexed, could be the very range replayed here.
        if self.tainted_held() > 0 || self.forgetting() {
            return Err(NoSpace);
        }
        state.counts_mut().entries_received += piece.entries().len() as u64;
        for entry in piece.entries() {
            match entry {
                PieceEntry::Object {
                    table,
                    hash,
                    version,
                    key,
                    value,
                } => {
                    let (table, hash, version) = (*table, *hash, state.shifted(*version));
                    state.note_version(version);
                    let deleted = state.deleted(table, key).is_some_and(|d| d >= version);
                    let current = self.current(batch, table, hash, key);
                    if deleted || current.is_some_and(|(v, _)| v >= version) {
                        state.counts_mut().objects_dropped += 1;
                        continue;
                    }
                    if current.is_none() {
                        if !self.new_key_fits(batch) {
                            return Err(NoSpace);
                        }
                        batch.new_keys += 1;
                    }
                    // The version this one supersedes in this log (replayed earlier, or
                    // staged in this batch) stays in its segment: a tombstone masks it.
                    let superseded = current.map(|(version, at)| Superseded {
                        version,
                        segment: at.segment,
                    });
                    let Appended {
                        at,
                        tombstone_bytes,
                        ..
                    } = self.log.append_object_completing(
                        table,
                        version,
                        key,
                        value,
                        superseded,
                        None,
                        self.safe_version,
                    )?;
                    let bytes = object_entry_bytes(key.len(), value.len()) as u64 + tombstone_bytes;
                    self.note_replayed(table, hash, bytes, at.segment);
                    self.supersede_staged(batch, table, hash, key);
                    batch.insert(table, hash, key, Staged::Live { version, at });
                    let counts = state.counts_mut();
                    counts.objects_appended += 1;
                    counts.bytes_appended += bytes;
                    if current.is_none() {
                        counts.objects_live += 1;
                    }
                }
                PieceEntry::Tombstone {
                    table,
                    hash,
                    version,
                    key,
                } => {
                    let (table, hash, version) = (*table, *hash, state.shifted(*version));
                    state.note_version(version);
                    if !state.note_deleted(table, key, version) {
                        // An equal or newer tombstone was replayed already.
                        continue;
                    }
                    let current = self.current(batch, table, hash, key);
                    if current.is_some_and(|(v, _)| v > version) {
                        // The key was re-created after this deletion; it survives.
                        continue;
                    }
                    // The tombstone names the segment of the object it kills here; with
                    // none, the head: no older copy of the key can lie in a later one.
                    let object_segment = current.map_or(self.log.head(), |(_, at)| at.segment);
                    let at = self.log.append_tombstone(
                        table,
                        version,
                        object_segment,
                        key,
                        self.safe_version,
                    )?;
                    let bytes = tombstone_entry_bytes(key.len()) as u64;
                    self.note_replayed(table, hash, bytes, at.segment);
                    self.supersede_staged(batch, table, hash, key);
                    batch.insert(table, hash, key, Staged::Removed);
                    let counts = state.counts_mut();
                    counts.tombstones_appended += 1;
                    counts.bytes_appended += bytes;
                    if current.is_some() {
                        counts.objects_live = counts.objects_live.saturating_sub(1);
                    }
                }
                PieceEntry::Completion(record) => {
                    let record = CompletionEntry {
                        version: state.shifted(record.version),
                        ..*record
                    };
                    state.note_version(record.version);
                    batch.note_ack(record.client, record.ack);
                    let known = batch.completions.contains_key(&(record.client, record.seq))
                        || self.completions.lookup(record.client, record.seq) != Lookup::New
                        || batch
                            .acks
                            .get(&record.client)
                            .is_some_and(|&ack| record.seq <= ack);
                    if known {
                        continue;
                    }
                    let at = self.log.append_completion(&record, self.safe_version)?;
                    let bytes = COMPLETION_ENTRY_BYTES as u64;
                    self.note_replayed(record.table, record.key_hash, bytes, at.segment);
                    batch.add_record(record.client, record.seq, Record::of(&record, at));
                    let counts = state.counts_mut();
                    counts.completions_kept += 1;
                    counts.bytes_appended += bytes;
                }
            }
        }
        let floor = self
            .safe_version
            .max(state.shifted(piece.safe_version()))
            .max(state.version_max().next())
            .max(state.version_floor());
        self.version_max = self.version_max.max(state.version_max()).max(floor);
        if floor > self.safe_version {
            self.safe_version = floor;
            self.log.append_safe_version(floor)?;
        }
        Ok(())
    }

    /// Forgets every object in `ranges` that this master does not own, outside the
    /// moves into it: what a failed or abandoned recovery left in the index (a move
    /// ends first, [`end_move_in`](Self::end_move_in), and then forgets its range). Their pending profile counts are dropped
    /// (should the ranges come here later, only the entries of that recovery are
    /// counted). Returns how many objects were forgotten.
    ///
    /// Their entries stay in this log, and this master may own those ranges later (a
    /// later recovery of them, or of their next owner): a crash then would replay them
    /// beside newer data that may have removed their keys meanwhile, with nothing left
    /// to mask them. A tombstone cannot mask them: the range's next owner may hand this
    /// master the very same versions again, which a tombstone would kill too. So every
    /// segment that holds an entry of the attempt is *tainted*: the cleaner takes those
    /// first ([`plan_cleaning`](Self::plan_cleaning)), dropping the forgotten entries
    /// (dead) and moving everything else, and [`stage_replay`](Self::stage_replay)
    /// refuses while any of them is in the log ([`tainted_held`](Self::tainted_held)).
    pub fn forget_unowned(&mut self, ranges: &[HashRange]) -> u64 {
        let mut removed = 0;
        for &HashRange { table, start, end } in ranges {
            let unowned = self.tablets.unowned_parts(table, start, end);
            let parts: Vec<(u64, u64)> = unowned
                .into_iter()
                .flat_map(|(from, to)| self.outside_moves_in(table, from, to))
                .collect();
            for (from, to) in parts {
                let range = from..=to;
                let refs = self.forget_range(table, range.clone());
                removed += refs.len() as u64;
                // Where the live ones are now (the cleaner may have moved them), and
                // where every entry of the attempt was appended (dead ones never move).
                self.tainted.extend(refs.iter().map(|at| at.segment));
                let tainted = &mut self.tainted;
                self.replayed_untracked.retain(|&(t, hash, _, segment)| {
                    let inside = t == table && range.contains(&hash.0);
                    if inside {
                        tainted.insert(segment);
                    }
                    !inside
                });
            }
        }
        let log = &self.log;
        self.tainted.retain(|&segment| log.holds(segment));
        removed
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;
    use rampart_common::ids::{SegmentId, Version};
    use rampart_common::reject::RejectRules;
    use rampart_common::status::Status;

    use super::super::ops::WriteOp;
    use super::super::test_support::{
        apply, clean_tainted, log_entries, obj, partition, piece, put, reads, recovery_master,
        replay, tomb, whole, ReadResult, RECOVERED, TABLE,
    };

    #[test]
    fn replayed_objects_are_invisible_until_their_tablet_is_taken() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[piece(vec![obj("a", 3, "x"), obj("b", 4, "y")])],
        );
        assert_eq!(store.read(RECOVERED, b"a").status(), Status::UnknownTablet);
        assert_eq!(store.object_count(), 2, "indexed, not served");
        assert_eq!(state.counts().objects_live, 2);
        store.take_tablets(&[whole(RECOVERED)]);
        assert_eq!(
            reads(&store, &["a", "b"]),
            vec![
                (Status::Ok, Version(3), b"x".to_vec()),
                (Status::Ok, Version(4), b"y".to_vec())
            ]
        );
    }

    #[test]
    fn highest_version_wins_in_either_order() {
        for order in [[0, 1], [1, 0]] {
            let pieces = [
                piece(vec![obj("k", 5, "old")]),
                piece(vec![obj("k", 9, "new")]),
            ];
            let mut store = recovery_master();
            let mut state = ReplayState::new();
            replay(
                &mut store,
                &mut state,
                &[pieces[order[0]].clone(), pieces[order[1]].clone()],
            );
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                reads(&store, &["k"]),
                vec![(Status::Ok, Version(9), b"new".to_vec())],
                "{order:?}"
            );
            assert_eq!(state.counts().objects_live, 1);
        }
    }

    #[test]
    fn tombstone_before_or_after_its_object_deletes_it() {
        for tombstone_first in [false, true] {
            let object = piece(vec![obj("k", 5, "v"), obj("other", 2, "o")]);
            let tombstone = piece(vec![tomb("k", 5)]);
            let pieces = if tombstone_first {
                [tombstone, object]
            } else {
                [object, tombstone]
            };
            let mut store = recovery_master();
            let mut state = ReplayState::new();
            replay(&mut store, &mut state, &pieces);
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                store.read(RECOVERED, b"k").status(),
                Status::ObjectDoesntExist,
                "tombstone first: {tombstone_first}"
            );
            assert_eq!(store.read(RECOVERED, b"other").status(), Status::Ok);
            assert_eq!(state.counts().objects_live, 1);
            assert_eq!(state.counts().tombstones_appended, 1, "kept in the log");
        }
    }

    #[test]
    fn a_tombstone_deletes_older_versions_arriving_later() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[
                piece(vec![tomb("k", 5)]),
                piece(vec![obj("k", 3, "older"), obj("k", 5, "same")]),
            ],
        );
        store.take_tablets(&[whole(RECOVERED)]);
        assert_eq!(
            store.read(RECOVERED, b"k").status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(state.counts().objects_dropped, 2);
        assert_eq!(state.counts().objects_appended, 0);
    }

    #[test]
    fn an_object_newer_than_a_tombstone_survives_it() {
        for tombstone_first in [false, true] {
            let object = piece(vec![obj("k", 8, "recreated")]);
            let tombstone = piece(vec![tomb("k", 5), obj("k", 5, "deleted")]);
            let pieces = if tombstone_first {
                [tombstone, object]
            } else {
                [object, tombstone]
            };
            let mut store = recovery_master();
            let mut state = ReplayState::new();
            replay(&mut store, &mut state, &pieces);
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                reads(&store, &["k"]),
                vec![(Status::Ok, Version(8), b"recreated".to_vec())],
                "tombstone first: {tombstone_first}"
            );
        }
    }

    #[test]
    fn a_replay_that_may_lose_data_shifts_every_version_above_the_floor_in_order() {
        // The same pieces replayed with a floor of 1000 give the same survivors, each at
        // its version + 1000; the next versions this master hands out are above them.
        let pieces = [
            piece(vec![obj("k", 5, "old"), obj("gone", 3, "x")]),
            piece(vec![obj("k", 9, "new"), tomb("gone", 3)]),
            RecoveryPiece::from_entries(SegmentId(4), Version(20), vec![obj("j", 2, "j")]),
        ];
        for order in [[0, 1, 2], [2, 1, 0]] {
            let mut store = recovery_master();
            let mut state = ReplayState::with_version_floor(1000);
            let ordered: Vec<RecoveryPiece> = order.iter().map(|&i| pieces[i].clone()).collect();
            replay(&mut store, &mut state, &ordered);
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                reads(&store, &["k", "gone", "j"]),
                vec![
                    (Status::Ok, Version(1009), b"new".to_vec()),
                    (Status::ObjectDoesntExist, Version(0), Vec::new()),
                    (Status::Ok, Version(1002), b"j".to_vec()),
                ],
                "{order:?}"
            );
            assert_eq!(store.safe_version(), Version(1020), "the shifted floor");
        }
    }

    #[test]
    fn replay_raises_the_safe_version_above_every_version_and_floor() {
        let mut store = recovery_master();
        put(&mut store, b"local", b"v");
        let mut state = ReplayState::new();
        let floored =
            RecoveryPiece::from_entries(SegmentId(3), Version(40), vec![obj("a", 7, "x")]);
        replay(&mut store, &mut state, &[floored]);
        assert_eq!(store.safe_version(), Version(40));
        replay(&mut store, &mut state, &[piece(vec![tomb("b", 55)])]);
        assert_eq!(store.safe_version(), Version(56));
        // The floor is in the log itself: a crash of this master keeps it.
        let floors: Vec<Version> = store
            .log()
            .segment_ids()
            .flat_map(|id| {
                let bytes = store.log().segment_bytes(id).unwrap().to_vec();
                let mut found = Vec::new();
                let mut offset = 0;
                while let Some((entry, next)) =
                    rampart_common::log::decode_entry(&bytes, offset).unwrap()
                {
                    if let rampart_common::log::Entry::SafeVersion(v) = entry {
                        found.push(v);
                    }
                    offset = next;
                }
                found
            })
            .collect();
        assert_eq!(floors.iter().max(), Some(&Version(56)));
        // A deleted key re-created here outranks every version it had.
        store.take_tablets(&[whole(RECOVERED)]);
        let outcome = apply(
            &mut store,
            &WriteOp::Write {
                table: RECOVERED,
                key: Bytes::from_static(b"b"),
                value: Bytes::from_static(b"new"),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
        );
        assert_eq!(outcome.status, Status::Ok);
        assert!(outcome.version > Version(55));
    }

    #[test]
    fn forget_unowned_drops_replayed_objects_but_not_owned_ones() {
        let mut store = recovery_master();
        put(&mut store, b"mine", b"v");
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[piece(vec![obj("a", 3, "x"), obj("b", 3, "y")])],
        );
        assert_eq!(store.object_count(), 3);
        let mut ranges = partition();
        ranges.insert(0, HashRange::whole(TABLE));
        assert_eq!(store.forget_unowned(&ranges), 2);
        assert_eq!(store.object_count(), 1);
        assert_eq!(store.read(TABLE, b"mine").status(), Status::Ok);
        store.take_tablets(&[whole(RECOVERED)]);
        assert_eq!(
            store.read(RECOVERED, b"a").status(),
            Status::ObjectDoesntExist
        );
        assert!(store.owns_any(&partition()));
    }

    #[test]
    fn a_replay_is_refused_while_a_failed_attempts_segments_are_in_the_log() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        replay(&mut store, &mut state, &[piece(vec![obj("k", 5, "old")])]);
        store.forget_unowned(&partition());
        let mut batch = Batch::new();
        let mut state = ReplayState::new();
        let next = piece(vec![obj("other", 6, "y")]);
        assert_eq!(
            store.stage_replay(&mut batch, &mut state, &next),
            Err(NoSpace),
            "a replay beside a failed attempt's leftovers must not go on"
        );
        clean_tainted(&mut store);
        assert_eq!(store.stage_replay(&mut batch, &mut state, &next), Ok(()));
    }

    /// One key's history on a crashed master: its log entries in log order.
    fn arb_history() -> impl Strategy<Value = Vec<(bool, u64, u8)>> {
        // (is_write, version step, value): a write creates or overwrites, a delete writes
        // a tombstone of the live version.
        proptest::collection::vec((any::<bool>(), 1u64..3, any::<u8>()), 1..8)
    }

    /// The crashed master's entries for keys k0.. and, per key, what must survive.
    fn crashed_log(
        histories: &[Vec<(bool, u64, u8)>],
    ) -> (Vec<PieceEntry>, Vec<Option<(u64, u8)>>) {
        let mut entries = Vec::new();
        let mut expected = Vec::new();
        for (k, history) in histories.iter().enumerate() {
            let key = format!("k{k}");
            let mut version = 0;
            let mut live: Option<(u64, u8)> = None;
            for &(write, step, value) in history {
                if write || live.is_none() {
                    version += step;
                    entries.push(obj(&key, version, &value.to_string()));
                    live = Some((version, value));
                } else if let Some((v, _)) = live.take() {
                    entries.push(tomb(&key, v));
                }
            }
            expected.push(live);
        }
        (entries, expected)
    }

    fn check_recovered(
        store: &ObjectStore,
        expected: &[Option<(u64, u8)>],
    ) -> Result<(), TestCaseError> {
        for (k, want) in expected.iter().enumerate() {
            let read = store.read(RECOVERED, format!("k{k}").as_bytes());
            match want {
                Some((version, value)) => {
                    prop_assert_eq!(read.status(), Status::Ok, "k{}", k);
                    prop_assert_eq!(read.version(), Version(*version));
                    let value = value.to_string();
                    prop_assert_eq!(&read.value()[..], value.as_bytes());
                }
                None => prop_assert_eq!(read.status(), Status::ObjectDoesntExist, "k{}", k),
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn replay_result_does_not_depend_on_piece_order_and_survives_a_second_crash(
            histories in proptest::collection::vec(arb_history(), 1..6),
            duplicates in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
            order in any::<u64>(),
            abandoned_prefix in 0usize..3,
        ) {
            let (mut entries, expected) = crashed_log(&histories);
            // The cleaner may leave two copies of one object version in a log.
            for d in &duplicates {
                let copy = entries[d.index(entries.len())].clone();
                entries.push(copy);
            }
            // Cut the log into pieces, then shuffle the pieces (and entries across them)
            // with a seeded permutation.
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(order);
            rand::seq::SliceRandom::shuffle(&mut entries[..], &mut rng);
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(entries.len() + 1)).collect();
            bounds.push(0);
            bounds.push(entries.len());
            bounds.sort_unstable();
            let pieces: Vec<RecoveryPiece> = bounds
                .windows(2)
                .map(|w| piece(entries[w[0]..w[1]].to_vec()))
                .collect();

            let mut store = recovery_master();
            // An earlier attempt replayed a prefix, failed, and was forgotten: its
            // entries stay in this master's log as orphans.
            if abandoned_prefix > 0 {
                let mut state = ReplayState::new();
                replay(&mut store, &mut state, &pieces[..abandoned_prefix.min(pieces.len())]);
                store.forget_unowned(&partition());
                clean_tainted(&mut store);
            }
            // The retry gets the pieces in another order (other backups, other timing).
            let mut retry = pieces.clone();
            rand::seq::SliceRandom::shuffle(&mut retry[..], &mut rng);
            let mut state = ReplayState::new();
            replay(&mut store, &mut state, &retry);
            let live = expected.iter().filter(|e| e.is_some()).count() as u64;
            prop_assert_eq!(state.counts().objects_live, live);
            store.take_tablets(&[whole(RECOVERED)]);
            check_recovered(&store, &expected)?;

            // This master crashes in turn: its whole log, orphans included, replayed
            // backwards into another gives the same objects.
            let mut again = recovery_master();
            let mut own = log_entries(&store);
            own.retain(|e| e.table_and_hash().0 == RECOVERED);
            own.reverse();
            let mut state = ReplayState::new();
            replay(&mut again, &mut state, &[piece(own)]);
            again.take_tablets(&[whole(RECOVERED)]);
            check_recovered(&again, &expected)?;
        }
    }
}
