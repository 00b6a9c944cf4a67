//! The cleaner against a model: `ObjectStore` with cleaning steps and commits at random
//! points, checked after every step against a `BTreeMap` of what was written, both as
//! the store reads it and as a recovery would rebuild it from the log the head's last
//! sealed digest names (highest version wins, tombstones delete older versions). The
//! recovery view is checked between every step and its commit too: a crash there must
//! find the cleaned segments still named, or the survivors whole.

// A failed unwrap is a failed test, with its location: exactly what a test wants.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{SegmentId, ServerId, TableId, Version};
use rampart_common::log::{entries, scan, Entry};
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use std::collections::BTreeMap;

use crate::cleaner::{CleaningPass, StepEnd, PASS_SURVIVORS_MAX};
use crate::object_store::{Batch, ObjectStore, WriteOp};

const TABLE: TableId = TableId(1);

/// 24 segments of 96 KiB (the least that holds a 64 KiB key).
fn store() -> ObjectStore {
    let config = MasterConfig {
        segment_bytes: 96 * 1024,
        memory_bytes: 24 * 96 * 1024,
        value_bytes_max: 8 * 1024,
        ..Default::default()
    };
    let mut store = ObjectStore::new(ServerId(1), config);
    store.take_tablets(&[Tablet {
        table: TABLE,
        start_hash: 0,
        end_hash: u64::MAX,
        owner: ServerId(1),
    }]);
    store
}

/// Applies one op as its own batch (stage, seal, publish); returns its status.
fn apply(store: &mut ObjectStore, op: WriteOp) -> Status {
    let mut batch = Batch::new();
    let outcome = store.stage(&mut batch, &op);
    store.seal();
    store.publish(batch);
    outcome.status
}

fn put(key: &str, value: &[u8]) -> WriteOp {
    WriteOp::Write {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

fn del(key: &str) -> WriteOp {
    WriteOp::Remove {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

/// What a recovery would rebuild from the sealed bytes of the segments the head's last
/// digest names: key → value, by the replay rules.
fn recovered(store: &ObjectStore) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let log = store.log();
    let head = log.head();
    let head_bytes = log.segment_bytes(head).unwrap();
    let digest = scan(head_bytes).digest.expect("a head carries a digest");
    let mut objects: BTreeMap<Vec<u8>, (Version, Vec<u8>)> = BTreeMap::new();
    let mut deleted: BTreeMap<Vec<u8>, Version> = BTreeMap::new();
    for segment in digest {
        let bytes = log
            .segment_bytes(segment)
            .unwrap_or_else(|| panic!("{segment} of the digest is not in memory"));
        let found = scan(bytes);
        if segment.is_survivor() {
            assert!(found.closed, "{segment} is named before it is whole");
        }
        for (_, entry) in entries(bytes, found.valid_bytes) {
            match entry {
                Entry::Object(o) => {
                    let newer = objects
                        .get(o.key)
                        .map_or(true, |(version, _)| o.version > *version);
                    if newer {
                        objects.insert(o.key.to_vec(), (o.version, o.value.to_vec()));
                    }
                }
                Entry::Tombstone(t) => {
                    let at = deleted.entry(t.key.to_vec()).or_insert(t.version);
                    *at = (*at).max(t.version);
                }
                _ => {}
            }
        }
    }
    objects
        .into_iter()
        .filter(|(key, (version, _))| deleted.get(key).map_or(true, |d| version > d))
        .map(|(key, (_, value))| (key, value))
        .collect()
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// Checks the store's reads and the recovery view against `model`.
fn check(store: &ObjectStore, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    for (key, value) in model {
        let read = store.read(TABLE, key).unwrap();
        assert_eq!(&read.value[..], &value[..], "{when}: read of {key:?}");
    }
    assert_eq!(store.object_count(), model.len() as u64, "{when}");
    assert!(recovered(store) == *model, "{when}: recovery differs");
}

#[test]
fn random_writes_deletes_and_cleaning_keep_exactly_the_live_set() {
    for seed in 1..=12u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut store = store();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut pass: Option<CleaningPass> = None;
        let keys = 10 + rng.below(60);
        let mut freed = 0usize;
        for op in 0..3000u64 {
            let key = format!("k{}", rng.below(keys));
            if rng.below(5) == 0 {
                assert_eq!(apply(&mut store, del(&key)), Status::Ok);
                model.remove(key.as_bytes());
            } else {
                let mut value = format!("{key}@{op};").into_bytes();
                value.resize(value.len() + rng.below(6000) as usize, b'.');
                match apply(&mut store, put(&key, &value)) {
                    Status::Ok => {
                        model.insert(key.into_bytes(), value);
                    }
                    Status::NoSpace => {}
                    other => panic!("seed {seed} op {op}: {other}"),
                }
            }
            if rng.below(4) != 0 {
                continue;
            }
            // A step of a pass, and a commit when it calls for one.
            let survivors_max = 1 + rng.below(PASS_SURVIVORS_MAX);
            let Some(mut current) = pass.take().or_else(|| store.plan_cleaning(survivors_max))
            else {
                continue;
            };
            let end = store.clean_step(&mut current, 512 + rng.below(64 * 1024) as usize);
            store.seal();
            check(&store, &model, &format!("seed {seed} op {op} after a step"));
            if end != StepEnd::Budget && store.commit_cleaning(&mut current).is_ok() {
                store.seal();
                check(
                    &store,
                    &model,
                    &format!("seed {seed} op {op} after a commit"),
                );
                freed += store.free_cleaned().len();
                check(&store, &model, &format!("seed {seed} op {op} after a free"));
            }
            if !current.is_done() {
                pass = Some(current);
            }
        }
        assert!(freed > 0, "seed {seed}: nothing was ever cleaned");
    }
}

/// Writes `count` cold objects of 6 KiB; returns their keys.
fn cold(store: &mut ObjectStore, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let key = format!("cold-{i}");
            assert_eq!(apply(store, put(&key, &[b'c'; 6 * 1024])), Status::Ok);
            key
        })
        .collect()
}

/// Rolls the head over by writing dead data (one key overwritten).
fn roll(store: &mut ObjectStore) {
    let head = store.log().head();
    while store.log().head() == head {
        assert_eq!(apply(store, put("filler", &[b'f'; 6 * 1024])), Status::Ok);
    }
}

fn pass_over(store: &ObjectStore, segments: Vec<SegmentId>) -> CleaningPass {
    CleaningPass::new(segments, store.log().usage().clock)
}

/// Runs `pass` to its end, committing and freeing whenever a step calls for it.
fn run(store: &mut ObjectStore, mut pass: CleaningPass) -> CleaningPass {
    for _ in 0..1000 {
        let end = store.clean_step(&mut pass, usize::MAX);
        store.seal();
        if end != StepEnd::Budget {
            store.commit_cleaning(&mut pass).unwrap();
            store.seal();
            store.free_cleaned();
        }
        if pass.is_done() {
            return pass;
        }
    }
    panic!("the pass never ended");
}

#[test]
fn a_tombstone_outlives_the_segment_of_the_object_it_deletes() {
    let mut store = store();
    let keys = cold(&mut store, 12);
    let cold_segment = store.log().head();
    roll(&mut store);
    // The tombstone lands in a segment of its own, otherwise dead.
    assert_eq!(apply(&mut store, del(&keys[3])), Status::Ok);
    let tombstone_segment = store.log().head();
    roll(&mut store);
    assert_ne!(tombstone_segment, cold_segment);
    let pass = pass_over(&store, vec![tombstone_segment]);
    let pass = run(&mut store, pass);
    assert!(
        pass.counts().bytes_relocated > 0,
        "the tombstone was copied"
    );
    let model = recovered(&store);
    assert!(
        !model.contains_key(keys[3].as_bytes()),
        "deleted, then back"
    );
    assert_eq!(model.len(), 12, "11 cold keys and the filler");
    // Once the object's segment is cleaned too, the tombstone has nothing left to do.
    let pass = pass_over(&store, vec![cold_segment]);
    run(&mut store, pass);
    let survivors: Vec<SegmentId> = store
        .log()
        .segment_ids()
        .filter(|s| s.is_survivor())
        .collect();
    let pass = pass_over(&store, survivors);
    let pass = run(&mut store, pass);
    assert!(pass.counts().bytes_dropped > 0, "the tombstone was dropped");
    assert!(!recovered(&store).contains_key(keys[3].as_bytes()));
}

#[test]
fn a_tombstone_walked_before_its_objects_segment_is_kept() {
    // The pass walks the tombstone's segment first: a commit may free it before the
    // object's segment is walked (a survivor fills), so the tombstone must be copied.
    let mut store = store();
    let keys = cold(&mut store, 12);
    let cold_segment = store.log().head();
    roll(&mut store);
    assert_eq!(apply(&mut store, del(&keys[5])), Status::Ok);
    let tombstone_segment = store.log().head();
    roll(&mut store);
    let mut pass = pass_over(&store, vec![tombstone_segment, cold_segment]);
    let end = store.clean_step(&mut pass, 1);
    assert_eq!(end, StepEnd::Budget);
    // The first step went through the tombstone's segment header; walk it whole.
    while pass.position().map(|(s, _)| s) == Some(tombstone_segment) {
        store.clean_step(&mut pass, 64);
    }
    assert!(
        pass.counts().bytes_relocated > 0,
        "the tombstone was dropped while its object's segment was still to be walked"
    );
    let pass = run(&mut store, pass);
    assert!(pass.is_done());
    assert!(!recovered(&store).contains_key(keys[5].as_bytes()));
}

#[test]
fn a_crash_between_survivors_and_commit_recovers_from_the_cleaned_segments() {
    let mut store = store();
    cold(&mut store, 40);
    roll(&mut store);
    let model = recovered(&store);
    let closed: Vec<SegmentId> = store
        .log()
        .segment_ids()
        .filter(|s| *s != store.log().head())
        .collect();
    let mut pass = pass_over(&store, closed);
    // Survivors written and replicated (sealed), no commit yet: the digest still names
    // the cleaned segments, and they are all still there.
    loop {
        let end = store.clean_step(&mut pass, 16 * 1024);
        store.seal();
        assert_eq!(recovered(&store), model);
        if end != StepEnd::Budget {
            break;
        }
    }
    assert!(store.log().survivor_ids().count() > 0);
    store.commit_cleaning(&mut pass).unwrap();
    store.seal();
    // Committed, not yet freed: the new digest names the survivors, whole.
    assert_eq!(recovered(&store), model);
    store.free_cleaned();
    assert_eq!(recovered(&store), model);
}

#[test]
fn the_index_counts_against_the_memory() {
    // Tiny objects: the index takes much of the memory. New keys are refused once the index,
    // the segments held and the cleaner's reserve fill the memory; pooled buffers the
    // index took are given back; existing keys are still overwritten.
    let mut store = store();
    let memory = 24 * 96 * 1024u64;
    // Batches of 64 writes, so that the batches' checksums take little of the log.
    let mut keys = 0u64;
    'fill: loop {
        let mut batch = Batch::new();
        let statuses: Vec<Status> = (0..64)
            .map(|i| {
                store
                    .stage(&mut batch, &put(&format!("k{}", keys + i), b"v"))
                    .status
            })
            .collect();
        store.seal();
        store.publish(batch);
        for status in statuses {
            match status {
                Status::Ok => keys += 1,
                Status::NoSpace => break 'fill,
                other => panic!("write {keys}: {other}"),
            }
        }
        assert!(keys < 1_000_000, "the memory never filled");
    }
    let log = store.log();
    let segment = 96 * 1024u64;
    let index = store.object_count() * crate::object_index::INDEX_BYTES_PER_OBJECT;
    let held = log.segments_held() * segment;
    let pooled = log.segments_pooled() * segment;
    assert!(
        index > memory / 3,
        "the index ({index} bytes of {memory}) took a large share of the memory"
    );
    assert!(
        held + pooled + index <= memory,
        "segments {held} + pooled {pooled} + index {index} within {memory}"
    );
    // The cleaner's reserve is still there for it.
    assert!(log.segments_free() >= crate::segmented_log::CLEANER_RESERVE_SEGMENTS);
    assert_eq!(apply(&mut store, put("k0", b"w")), Status::Ok);
    assert_eq!(store.read(TABLE, b"k0").unwrap().value, &b"w"[..]);
    // Removing keys gives memory back to new ones.
    for i in 1..=100 {
        assert_eq!(apply(&mut store, del(&format!("k{i}"))), Status::Ok);
    }
    assert_eq!(apply(&mut store, put("fresh", b"v")), Status::Ok);
}

// ---- Deleted stays deleted (issue 39, item 1) ----

/// Cleans `segments` in one pass, or one after another when `one_by_one`.
fn clean(store: &mut ObjectStore, segments: &[SegmentId], one_by_one: bool) {
    if one_by_one {
        for &segment in segments {
            let pass = pass_over(store, vec![segment]);
            run(store, pass);
        }
    } else {
        let pass = pass_over(store, segments.to_vec());
        run(store, pass);
    }
}

#[test]
fn a_deleted_key_stays_deleted_when_the_segment_of_its_removed_version_is_cleaned() {
    // v1 lands beside cold data that keeps its segment in the log; v2 and the removal
    // land in segments of their own, which the cleaner then takes (together, or v2's
    // first). The removal's tombstone names v2's segment; v1 must stay masked after it.
    for one_by_one in [false, true] {
        let mut store = store();
        cold(&mut store, 6);
        assert_eq!(apply(&mut store, put("k", b"v1")), Status::Ok);
        let cold_segment = store.log().head();
        roll(&mut store);
        assert_eq!(apply(&mut store, put("k", b"v2")), Status::Ok);
        let v2_segment = store.log().head();
        roll(&mut store);
        assert_eq!(apply(&mut store, del("k")), Status::Ok);
        let removal_segment = store.log().head();
        roll(&mut store);
        assert!(store.read(TABLE, b"k").is_err());
        clean(&mut store, &[v2_segment, removal_segment], one_by_one);
        assert!(store.log().holds(cold_segment), "the cold segment stays");
        assert!(!store.log().holds(v2_segment) && !store.log().holds(removal_segment));
        assert!(
            !recovered(&store).contains_key(&b"k"[..]),
            "one by one: {one_by_one}: a recovery brings the removed key back"
        );
    }
}

#[test]
fn a_recovery_masters_log_keeps_a_replayed_removal_after_cleaning() {
    // Replay appends v1, then v2 (superseding it), then the removal, each in its own
    // segment of the recovery master's log; cleaning v2's and the removal's segments
    // must not bring v1 back should the recovery master crash in turn.
    use crate::replay::{PieceEntry, RecoveryPiece, ReplayState};
    let recovered_table = TableId(7);
    let entry = |version: u64, value: Option<&str>| {
        let key = Bytes::from_static(b"k");
        let hash = rampart_common::ids::key_hash(b"k");
        match value {
            Some(value) => PieceEntry::Object {
                table: recovered_table,
                hash,
                version: Version(version),
                key,
                value: Bytes::copy_from_slice(value.as_bytes()),
            },
            None => PieceEntry::Tombstone {
                table: recovered_table,
                hash,
                version: Version(version),
                key,
            },
        }
    };
    let mut store = store();
    cold(&mut store, 6);
    let mut state = ReplayState::new();
    let mut segments = Vec::new();
    for entry in [entry(1, Some("v1")), entry(2, Some("v2")), entry(2, None)] {
        let mut batch = Batch::new();
        let piece = RecoveryPiece::from_entries(SegmentId(1), Version(0), vec![entry]);
        store.stage_replay(&mut batch, &mut state, &piece).unwrap();
        store.seal();
        store.publish_recovered(batch);
        segments.push(store.log().head());
        roll(&mut store);
    }
    store.take_tablets(&[Tablet {
        table: recovered_table,
        start_hash: 0,
        end_hash: u64::MAX,
        owner: ServerId(1),
    }]);
    assert!(store.read(recovered_table, b"k").is_err());
    clean(&mut store, &segments[1..], false);
    assert!(
        store.log().holds(segments[0]),
        "v1's segment stays (cold data)"
    );
    assert!(!recovered(&store).contains_key(&b"k"[..]), "v1 came back");
}

#[test]
fn keys_deleted_for_good_never_come_back_whatever_the_cleaner_takes() {
    // The shape that hid the bug: keys written beside cold data, overwritten a few
    // times, then deleted and never written again, while other keys churn so that the
    // cost-benefit cleaner keeps choosing segments (the cold ones stay).
    for seed in 1..=8u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut store = store();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut pass: Option<CleaningPass> = None;
        let mut freed = 0usize;
        let mut doomed: Vec<(String, u32)> = Vec::new();
        let mut next_doomed = 0u32;
        for op in 0..4000u64 {
            let roll_dice = rng.below(10);
            let (key, value) = if roll_dice < 2 {
                // A new doomed key, beside a cold value that pins its segment.
                let cold_key = format!("cold-{op}");
                let cold_value = vec![b'c'; 2 * 1024];
                if apply(&mut store, put(&cold_key, &cold_value)) == Status::Ok {
                    model.insert(cold_key.into_bytes(), cold_value);
                }
                let key = format!("doomed-{next_doomed}");
                next_doomed += 1;
                doomed.push((key.clone(), 1 + rng.below(3) as u32));
                (key, format!("first@{op}").into_bytes())
            } else if roll_dice < 6 && !doomed.is_empty() {
                let at = rng.below(doomed.len() as u64) as usize;
                let (key, writes_left) = doomed[at].clone();
                if writes_left == 0 {
                    doomed.swap_remove(at);
                    assert_eq!(apply(&mut store, del(&key)), Status::Ok);
                    model.remove(key.as_bytes());
                    continue;
                }
                doomed[at].1 -= 1;
                (key, format!("again@{op}").into_bytes())
            } else {
                let key = format!("churn-{}", rng.below(20));
                let mut value = format!("{key}@{op};").into_bytes();
                value.resize(value.len() + rng.below(6000) as usize, b'.');
                (key, value)
            };
            match apply(&mut store, put(&key, &value)) {
                Status::Ok => {
                    model.insert(key.into_bytes(), value);
                }
                Status::NoSpace => {}
                other => panic!("seed {seed} op {op}: {other}"),
            }
            // Cleaning as often as there is anything to clean.
            let Some(mut current) = pass.take().or_else(|| store.plan_cleaning(4)) else {
                continue;
            };
            let end = store.clean_step(&mut current, 4096 + rng.below(64 * 1024) as usize);
            store.seal();
            if end != StepEnd::Budget && store.commit_cleaning(&mut current).is_ok() {
                store.seal();
                freed += store.free_cleaned().len();
            }
            if !current.is_done() {
                pass = Some(current);
            }
            if op % 50 == 0 {
                check(&store, &model, &format!("seed {seed} op {op}"));
            }
        }
        check(&store, &model, &format!("seed {seed} at the end"));
        assert!(
            freed > 20,
            "seed {seed}: the cleaner freed only {freed} segments"
        );
    }
}

fn live_bytes(store: &ObjectStore, segment: SegmentId) -> u64 {
    store
        .log()
        .closed_segments()
        .iter()
        .find(|s| s.segment == segment)
        .map(|s| s.live_bytes)
        .unwrap_or_else(|| panic!("{segment} is not a closed segment"))
}

#[test]
fn an_overwrites_tombstone_stops_counting_as_live_once_the_old_versions_segment_is_freed() {
    let mut store = store();
    cold(&mut store, 6);
    assert_eq!(apply(&mut store, put("k", b"v1")), Status::Ok);
    let old_segment = store.log().head();
    roll(&mut store);
    assert_eq!(apply(&mut store, put("k", b"v2")), Status::Ok);
    let tombstone_segment = store.log().head();
    roll(&mut store);
    let before = live_bytes(&store, tombstone_segment);
    let pass = pass_over(&store, vec![old_segment]);
    run(&mut store, pass);
    assert!(!store.log().holds(old_segment));
    // Two tombstones there kill versions in the old segment: v1's, and that of the
    // filler the rollover to the new segment superseded.
    let tombstone = rampart_common::log::tombstone_entry_bytes(1) as u64;
    let filler_tombstone = rampart_common::log::tombstone_entry_bytes(b"filler".len()) as u64;
    assert_eq!(
        live_bytes(&store, tombstone_segment),
        before - tombstone - filler_tombstone
    );
    // Moved by the cleaner first, it stops counting in the survivor instead.
    let mut store2 = self::store();
    cold(&mut store2, 6);
    assert_eq!(apply(&mut store2, put("k", b"v1")), Status::Ok);
    let old_segment = store2.log().head();
    roll(&mut store2);
    assert_eq!(apply(&mut store2, put("k", b"v2")), Status::Ok);
    let tombstone_segment = store2.log().head();
    roll(&mut store2);
    let pass = pass_over(&store2, vec![tombstone_segment]);
    run(&mut store2, pass);
    let survivor = store2
        .log()
        .segment_ids()
        .find(|s| s.is_survivor())
        .expect("the tombstone and v2 moved to a survivor");
    let before = live_bytes(&store2, survivor);
    let pass = pass_over(&store2, vec![old_segment]);
    run(&mut store2, pass);
    assert_eq!(
        live_bytes(&store2, survivor),
        before - tombstone - filler_tombstone
    );
    assert_eq!(store2.read(TABLE, b"k").unwrap().value, &b"v2"[..]);
}
