//! Tests of the write path (`writes`): staging, reject rules, limits, a full log, the
//! segments a batch fills, and the store against a reference model.

// A failed unwrap is a failed test, with its location: exactly what a test wants.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proptest::prelude::*;
use rampart_common::ids::{SegmentId, ServerId, Version};
use rampart_common::limits::KEY_BYTES_MAX;
use rampart_common::log::scanner::{scan, StopReason};
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use std::collections::HashMap;

use crate::segmented_log::CLEANER_RESERVE_SEGMENTS;

use super::batch::Batch;
use super::ops::{OpOutcome, WriteOp};
use super::test_support::{
    apply, apply_batch, config, delete, increment, increment_if, int, log_len, put, remove,
    remove_if, store, write, write_if, ReadResult, TABLE,
};

/// Which operation a reject-rule case applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write,
    Remove,
    Increment,
}

/// Runs every reject rule against `kind`, in a state that trips it and one that lets
/// the operation through. A rejected operation must report the current version and
/// change nothing, not even the log; a passing one must take effect.
fn check_reject_rules(kind: Kind) {
    const OLD: i64 = 5;
    const DELTA: i64 = 3;
    let op = |rules: RejectRules| match kind {
        Kind::Write => write_if(b"k", b"new", rules),
        Kind::Remove => remove_if(b"k", rules),
        Kind::Increment => increment_if(b"k", DELTA, rules),
    };
    let doesnt_exist = |r: &mut RejectRules| r.doesnt_exist = true;
    let exists = |r: &mut RejectRules| r.exists = true;
    let le_given = |r: &mut RejectRules| r.version_le_given = true;
    let ne_given = |r: &mut RejectRules| r.version_ne_given = true;
    // (case, object present, rule, given version relative to the object's, rejection)
    type Case = (
        &'static str,
        bool,
        fn(&mut RejectRules),
        i64,
        Option<Status>,
    );
    let no_object = Some(Status::ObjectDoesntExist);
    let object_exists = Some(Status::ObjectExists);
    let wrong = Some(Status::WrongVersion);
    let cases: [Case; 12] = [
        ("doesnt_exist, missing", false, doesnt_exist, 0, no_object),
        ("doesnt_exist, present", true, doesnt_exist, 0, None),
        ("exists, present", true, exists, 0, object_exists),
        ("exists, missing", false, exists, 0, None),
        ("le_given, equal", true, le_given, 0, wrong),
        ("le_given, greater", true, le_given, 1, wrong),
        ("le_given, smaller", true, le_given, -1, None),
        ("le_given, missing", false, le_given, 0, None),
        ("ne_given, greater", true, ne_given, 1, wrong),
        ("ne_given, smaller", true, ne_given, -1, wrong),
        ("ne_given, equal", true, ne_given, 0, None),
        ("ne_given, missing", false, ne_given, 0, None),
    ];
    for (case, present, rule, offset, rejected) in cases {
        let context = format!("{kind:?} with {case}");
        let mut store = store();
        // Raise the safe version above 1, so that a new object's version, an
        // overwrite's and "given - 1" are all distinct real versions.
        put(&mut store, b"other", b"x");
        put(&mut store, b"other", b"x");
        delete(&mut store, b"other");
        let safe = store.safe_version();
        assert!(safe > Version(2));
        if present {
            put(&mut store, b"k", &int(OLD));
            put(&mut store, b"k", &int(OLD));
        }
        let before = store.read(TABLE, b"k");
        let current = before.version();
        // For a missing object the given version is arbitrary: no version rule fires.
        let reference = if present { current.0 } else { safe.0 + 1 };
        let mut rules = RejectRules {
            given_version: Version(reference.checked_add_signed(offset).unwrap()),
            ..RejectRules::default()
        };
        rule(&mut rules);
        let log_before = log_len(&store);
        let outcome = apply(&mut store, &op(rules));
        let after = store.read(TABLE, b"k");
        match rejected {
            Some(status) => {
                assert_eq!(outcome.status, status, "{context}");
                assert_eq!(outcome.version, current, "{context}");
                assert_eq!(after, before, "{context}: a rejected op changes nothing");
                assert_eq!(log_len(&store), log_before, "{context}: nothing appended");
            }
            None => {
                assert_eq!(outcome.status, Status::Ok, "{context}");
                let new_version = if present { current.next() } else { safe };
                match kind {
                    Kind::Write => {
                        assert_eq!(after.status(), Status::Ok, "{context}");
                        assert_eq!(&after.value()[..], b"new", "{context}");
                        assert_eq!(after.version(), new_version, "{context}");
                        assert_eq!(outcome.version, new_version);
                    }
                    Kind::Remove => {
                        assert_eq!(after.status(), Status::ObjectDoesntExist, "{context}");
                        assert_eq!(outcome.version, current, "{context}");
                    }
                    Kind::Increment => {
                        let old = if present { OLD } else { 0 };
                        assert_eq!(after.status(), Status::Ok, "{context}");
                        assert_eq!(&after.value()[..], &int(old + DELTA), "{context}");
                        assert_eq!(after.version(), new_version, "{context}");
                        assert_eq!(
                            (outcome.version, outcome.counter),
                            (new_version, Some(old + DELTA))
                        );
                    }
                }
            }
        }
    }
}

/// A reference model of the store, written from the rules in `object_store`'s module doc. Ops
/// apply to it one by one, so it holds what the store holds once a batch publishes.
#[derive(Debug, Default)]
struct Model {
    /// Key → (version, value).
    objects: HashMap<Vec<u8>, (Version, Vec<u8>)>,
    /// The version a new object gets.
    safe_version: u64,
    /// The highest version ever removed, of any key.
    removed_max: Option<Version>,
}

impl Model {
    /// The outcome `op` must have, applying it to the model.
    fn apply(&mut self, op: &WriteOp) -> (Status, Version, Option<i64>) {
        let (key, rules) = match op {
            WriteOp::Write { key, rules, .. }
            | WriteOp::Remove { key, rules, .. }
            | WriteOp::Increment { key, rules, .. } => (key.to_vec(), *rules),
        };
        let current = self.objects.get(&key).cloned();
        let current_version = current.as_ref().map_or(Version(0), |(v, _)| *v);
        if let Some(status) = rules.check(current.as_ref().map(|(v, _)| *v)) {
            return (status, current_version, None);
        }
        let new_version = current
            .as_ref()
            .map_or(Version(self.safe_version), |(v, _)| v.next());
        match op {
            WriteOp::Write { value, .. } => {
                self.objects.insert(key, (new_version, value.to_vec()));
                (Status::Ok, new_version, None)
            }
            WriteOp::Remove { .. } => {
                if current.is_some() {
                    self.objects.remove(&key);
                    self.safe_version = self.safe_version.max(current_version.0 + 1);
                    self.removed_max = self.removed_max.max(Some(current_version));
                }
                (Status::Ok, current_version, None)
            }
            WriteOp::Increment { delta, .. } => {
                let old = match &current {
                    None => 0,
                    Some((_, value)) => match <[u8; 8]>::try_from(&value[..]) {
                        Ok(bytes) => i64::from_le_bytes(bytes),
                        Err(_) => return (Status::NotAnInteger, current_version, None),
                    },
                };
                let Some(new) = old.checked_add(*delta) else {
                    return (Status::InvalidArgument, current_version, None);
                };
                self.objects
                    .insert(key, (new_version, new.to_le_bytes().to_vec()));
                (Status::Ok, new_version, Some(new))
            }
        }
    }
}

fn arb_op() -> impl Strategy<Value = WriteOp> {
    let key = (0u8..6).prop_map(|k| Bytes::from(vec![b'k', k]));
    let rules = (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u64..12,
    )
        .prop_map(|(d, e, le, ne, given)| RejectRules {
            given_version: Version(given),
            // Rules are rarer than plain operations, so that objects live long.
            doesnt_exist: d && e,
            exists: e && le,
            version_le_given: le && ne,
            version_ne_given: ne && d,
        });
    let value = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..12),
        any::<i64>().prop_map(|n| n.to_le_bytes().to_vec()),
        Just(i64::MAX.to_le_bytes().to_vec()),
    ];
    let delta = prop_oneof![-5i64..5, Just(i64::MAX), Just(i64::MIN)];
    prop_oneof![
        (key.clone(), value, rules.clone()).prop_map(|(key, value, rules)| WriteOp::Write {
            table: TABLE,
            key,
            value: Bytes::from(value),
            rules,
            rifl: rampart_common::rifl::Rifl::NONE,
        }),
        (key.clone(), rules.clone()).prop_map(|(key, rules)| WriteOp::Remove {
            table: TABLE,
            key,
            rules,
            rifl: rampart_common::rifl::Rifl::NONE,
        }),
        (key, delta, rules).prop_map(|(key, delta, rules)| WriteOp::Increment {
            table: TABLE,
            key,
            delta,
            rules,
            rifl: rampart_common::rifl::Rifl::NONE,
        }),
    ]
}

#[test]
fn write_then_read_returns_the_value_and_version() {
    let mut store = store();
    let version = put(&mut store, b"k", b"hello");
    assert_eq!(version, Version::FIRST);
    let read = store.read(TABLE, b"k");
    assert_eq!(read.status(), Status::Ok);
    assert_eq!(read.version(), version);
    assert_eq!(&read.value()[..], b"hello");
    assert_eq!(store.object_count(), 1);
}

#[test]
fn overwrite_bumps_the_version_by_exactly_one() {
    let mut store = store();
    let mut version = put(&mut store, b"k", b"v0");
    for i in 1..10 {
        let value = format!("v{i}");
        let next = put(&mut store, b"k", value.as_bytes());
        assert_eq!(next, Version(version.0 + 1));
        version = next;
        let read = store.read(TABLE, b"k");
        assert_eq!(
            (read.version(), &read.value()[..]),
            (version, value.as_bytes())
        );
    }
    assert_eq!(store.object_count(), 1);
}

#[test]
fn write_reject_rules_refuse_or_apply_as_specified() {
    check_reject_rules(Kind::Write);
}

#[test]
fn remove_reject_rules_refuse_or_apply_as_specified() {
    check_reject_rules(Kind::Remove);
}

#[test]
fn increment_reject_rules_refuse_or_apply_as_specified() {
    check_reject_rules(Kind::Increment);
}

#[test]
fn remove_of_a_missing_key_succeeds_and_appends_nothing() {
    let mut store = store();
    put(&mut store, b"other", b"x");
    let log_before = log_len(&store);
    let segments_before = store.log().segment_ids().count();
    let outcome = apply(&mut store, &remove(b"missing"));
    assert_eq!(
        outcome,
        OpOutcome {
            status: Status::Ok,
            version: Version(0),
            counter: None
        }
    );
    assert_eq!(log_len(&store), log_before);
    assert_eq!(store.log().segment_ids().count(), segments_before);
    assert_eq!(store.object_count(), 1);
}

#[test]
fn increment_of_a_missing_key_counts_from_zero() {
    let mut store = store();
    let outcome = apply(&mut store, &increment(b"n", 7));
    assert_eq!(outcome.status, Status::Ok);
    assert_eq!(outcome.counter, Some(7));
    let read = store.read(TABLE, b"n");
    assert_eq!(read.version(), outcome.version);
    assert_eq!(&read.value()[..], &7i64.to_le_bytes());
}

#[test]
fn increments_sum_including_negative_deltas() {
    let mut store = store();
    put(&mut store, b"n", &int(100));
    let mut expected = 100i64;
    let mut version = store.read(TABLE, b"n").version();
    for delta in [1, -250, 42, i64::from(i32::MAX), -7] {
        expected += delta;
        let reply = apply(&mut store, &increment(b"n", delta));
        assert_eq!(reply.status, Status::Ok);
        assert_eq!(reply.counter, Some(expected));
        assert_eq!(reply.version, version.next());
        version = reply.version;
        let read = store.read(TABLE, b"n");
        let stored = i64::from_le_bytes(read.value()[..].try_into().unwrap());
        assert_eq!((stored, read.version()), (expected, version));
    }
}

#[test]
fn increment_of_a_non_integer_is_not_an_integer() {
    let mut store = store();
    for value in [&b""[..], b"seven", b"nine bytes"] {
        let version = put(&mut store, b"n", value);
        let log_before = log_len(&store);
        let reply = apply(&mut store, &increment(b"n", 1));
        assert_eq!(reply.status, Status::NotAnInteger, "value {value:?}");
        assert_eq!(reply.version, version, "reports the current version");
        let read = store.read(TABLE, b"n");
        assert_eq!((&read.value()[..], read.version()), (value, version));
        assert_eq!(log_len(&store), log_before);
    }
}

#[test]
fn increment_overflow_is_invalid_argument_and_changes_nothing() {
    let mut store = store();
    for (start, delta) in [(i64::MAX, 1), (i64::MIN, -1), (1, i64::MAX)] {
        let version = put(&mut store, b"n", &int(start));
        let reply = apply(&mut store, &increment(b"n", delta));
        assert_eq!(reply.status, Status::InvalidArgument, "{start} + {delta}");
        assert_eq!(reply.version, version);
        let read = store.read(TABLE, b"n");
        assert_eq!(
            (&read.value()[..], read.version()),
            (&int(start)[..], version)
        );
    }
}

#[test]
fn staged_effects_are_invisible_until_publish() {
    let mut store = store();
    let old = put(&mut store, b"k", b"old");
    put(&mut store, b"gone", b"still here");

    let mut batch = Batch::new();
    for op in [write(b"k", b"new"), write(b"fresh", b"f"), remove(b"gone")] {
        assert_eq!(store.stage(&mut batch, &op).status, Status::Ok);
    }
    let read = store.read(TABLE, b"k");
    assert_eq!((&read.value()[..], read.version()), (&b"old"[..], old));
    assert_eq!(
        store.read(TABLE, b"fresh").status(),
        Status::ObjectDoesntExist
    );
    assert_eq!(&store.read(TABLE, b"gone").value()[..], b"still here");

    // Sealed (and, in the appender, replicated) is still not visible.
    store.seal();
    assert_eq!(&store.read(TABLE, b"k").value()[..], b"old");
    assert_eq!(
        store.read(TABLE, b"fresh").status(),
        Status::ObjectDoesntExist
    );
    assert_eq!(store.object_count(), 2);

    store.publish(batch);
    let read = store.read(TABLE, b"k");
    assert_eq!(
        (&read.value()[..], read.version()),
        (&b"new"[..], old.next())
    );
    assert_eq!(&store.read(TABLE, b"fresh").value()[..], b"f");
    assert_eq!(
        store.read(TABLE, b"gone").status(),
        Status::ObjectDoesntExist
    );
    assert_eq!(store.object_count(), 2);
}

#[test]
fn ops_in_one_batch_see_each_others_effects() {
    let mut store = store();
    let outcomes = apply_batch(
        &mut store,
        &[
            write(b"n", &int(10)),
            increment(b"n", 5),
            // Create-only must see the staged object.
            write_if(b"n", b"no", RejectRules::create_only()),
            write(b"k", b"first"),
            remove(b"k"),
            // Must see the staged remove: the key is missing again.
            write_if(b"k", b"second", RejectRules::create_only()),
        ],
    );
    let statuses: Vec<Status> = outcomes.iter().map(|o| o.status).collect();
    assert_eq!(
        statuses,
        [
            Status::Ok,
            Status::Ok,
            Status::ObjectExists,
            Status::Ok,
            Status::Ok,
            Status::Ok
        ]
    );
    let written = outcomes[0].version;
    let incremented = outcomes[1];
    assert_eq!(incremented.counter, Some(15));
    assert_eq!(incremented.version, written.next());
    assert_eq!(outcomes[2].version, incremented.version);
    let first = outcomes[3].version;
    assert_eq!(outcomes[4].version, first);
    let second = outcomes[5].version;
    assert!(second > first);

    let n = store.read(TABLE, b"n");
    assert_eq!(
        (&n.value()[..], n.version()),
        (&int(15)[..], incremented.version)
    );
    let k = store.read(TABLE, b"k");
    assert_eq!((&k.value()[..], k.version()), (&b"second"[..], second));
    assert_eq!(store.object_count(), 2);
}

#[test]
fn key_one_byte_over_the_limit_is_key_too_large() {
    let mut store = store();
    let key = vec![b'k'; KEY_BYTES_MAX + 1];
    let log_before = log_len(&store);
    for op in [write(&key, b"v"), remove(&key), increment(&key, 1)] {
        let outcome = apply(&mut store, &op);
        assert_eq!(outcome.status, Status::KeyTooLarge);
    }
    assert_eq!(store.read(TABLE, &key).status(), Status::KeyTooLarge);
    assert_eq!(log_len(&store), log_before);
}

#[test]
fn value_over_the_limit_is_value_too_large() {
    let mut store = store();
    let limit = config().value_bytes_max;
    let log_before = log_len(&store);
    let outcome = apply(&mut store, &write(b"k", &vec![1u8; limit + 1]));
    assert_eq!(outcome.status, Status::ValueTooLarge);
    assert_eq!(store.read(TABLE, b"k").status(), Status::ObjectDoesntExist);
    assert_eq!(log_len(&store), log_before);
}

#[test]
fn key_and_value_exactly_at_their_limits_are_accepted() {
    let mut store = store();
    let value = vec![7u8; config().value_bytes_max];
    // Several, so that at least one lands in a freshly rolled-over segment.
    let keys: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; KEY_BYTES_MAX]).collect();
    for key in &keys {
        let outcome = apply(&mut store, &write(key, &value));
        assert_eq!(outcome.status, Status::Ok);
    }
    assert!(
        store.log().head() > SegmentId(1),
        "the big objects rolled over"
    );
    for key in &keys {
        let read = store.read(TABLE, key);
        assert_eq!(read.status(), Status::Ok);
        assert_eq!(read.value(), value);
    }
}

#[test]
fn full_log_returns_no_space_and_keeps_acknowledged_values() {
    let mut store = store();
    let value = |i: u32| vec![(i % 251) as u8; 1000];
    let mut acknowledged = Vec::new();
    let mut failed = None;
    for i in 0..100_000u32 {
        let key = format!("key-{i}");
        let outcome = apply(&mut store, &write(key.as_bytes(), &value(i)));
        match outcome.status {
            Status::Ok => acknowledged.push((key, i, outcome.version)),
            Status::NoSpace => {
                failed = Some(key);
                break;
            }
            other => panic!("write {i}: unexpected {other}"),
        }
    }
    let failed = failed.expect("a bounded log fills up");
    assert!(
        acknowledged.len() > 500,
        "only {} writes fit",
        acknowledged.len()
    );
    // Full: the segments held, the cleaner's reserve (which writes never take) and
    // the index fill the memory, within a segment.
    let (used, max) = store.log_bytes();
    let segment = u64::from(config().segment_bytes);
    let index = store.object_count() * crate::object_index::INDEX_BYTES_PER_OBJECT;
    let reserve = CLEANER_RESERVE_SEGMENTS * segment;
    assert!(
        used + reserve + index <= max,
        "{used} + {reserve} + {index}"
    );
    assert!(
        used + reserve + index + segment > max,
        "{used} + {reserve} + {index}"
    );

    for attempt in 0..10 {
        let key = format!("more-{attempt}");
        assert_eq!(
            apply(&mut store, &write(key.as_bytes(), &value(0))).status,
            Status::NoSpace
        );
    }
    // An overwrite of an acknowledged key is refused too and leaves it intact.
    let (first_key, _, _) = &acknowledged[0];
    assert_eq!(
        apply(&mut store, &write(first_key.as_bytes(), &value(1))).status,
        Status::NoSpace
    );
    assert_eq!(
        store.read(TABLE, failed.as_bytes()).status(),
        Status::ObjectDoesntExist
    );
    for (key, i, version) in &acknowledged {
        let read = store.read(TABLE, key.as_bytes());
        assert_eq!(read.status(), Status::Ok, "{key}");
        assert_eq!(read.version(), *version, "{key}");
        assert_eq!(read.value(), value(*i), "{key}");
    }
    assert_eq!(store.object_count(), acknowledged.len() as u64);
}

#[test]
fn rolled_over_segments_scan_whole_and_chain_by_footers() {
    let mut store = store();
    let mut live = Vec::new();
    for batch in 0..60u32 {
        let ops: Vec<WriteOp> = (0..10u32)
            .map(|i| {
                let n = batch * 10 + i;
                let key = format!("key-{}", n % 450);
                match n % 7 {
                    6 => remove(key.as_bytes()),
                    _ => write(
                        key.as_bytes(),
                        &vec![(n % 256) as u8; 100 + (n as usize * 37) % 900],
                    ),
                }
            })
            .collect();
        let outcomes = apply_batch(&mut store, &ops);
        assert!(outcomes.iter().all(|o| o.status == Status::Ok));
        live.extend(ops);
    }
    let log = store.log();
    let ids: Vec<SegmentId> = log.segment_ids().collect();
    assert!(ids.len() >= 3, "only {} segments", ids.len());
    assert_eq!(ids.last(), Some(&log.head()));
    for id in &ids {
        let bytes = log.segment_bytes(*id).unwrap();
        let result = scan(bytes);
        assert_eq!(result.valid_bytes as usize, bytes.len(), "{id}: all sealed");
        assert_eq!(result.stop, StopReason::EndOfData, "{id}");
        let header = result.header.unwrap();
        assert_eq!((header.log_id, header.segment_id), (ServerId(1), *id));
        assert_eq!(header.capacity, config().segment_bytes);
        // No cleaner yet: segment n's digest lists 1..=n.
        let digest: Vec<SegmentId> = (1..=id.0).map(SegmentId).collect();
        assert_eq!(result.digest.as_ref(), Some(&digest), "{id}");
        if *id == log.head() {
            assert!(!result.closed);
            assert_eq!(result.successor, None);
            assert_eq!(result.digest, Some(ids.clone()), "head digest lists all");
        } else {
            assert!(result.closed, "{id}");
            assert_eq!(result.successor, Some(SegmentId(id.0 + 1)), "{id}");
        }
    }
    // The latest op per key decides what reads return.
    let mut model = HashMap::new();
    for op in &live {
        match op {
            WriteOp::Write { key, value, .. } => model.insert(key.clone(), Some(value.clone())),
            WriteOp::Remove { key, .. } => model.insert(key.clone(), None),
            WriteOp::Increment { .. } => unreachable!(),
        };
    }
    for (key, value) in &model {
        let read = store.read(TABLE, key);
        match value {
            Some(value) => assert_eq!(&read.value(), value),
            None => assert_eq!(read.status(), Status::ObjectDoesntExist),
        }
    }
}

proptest::proptest! {
    #[test]
    fn store_matches_a_model_under_random_batches(
        batches in proptest::collection::vec(proptest::collection::vec(arb_op(), 1..8), 1..25)
    ) {
        let mut store = store();
        let mut model = Model { safe_version: Version::FIRST.0, ..Model::default() };
        for ops in &batches {
            let outcomes = apply_batch(&mut store, ops);
            for (op, outcome) in ops.iter().zip(&outcomes) {
                let removed_before = model.removed_max;
                let (table, key) = op.table_and_key();
                prop_assert_eq!(table, TABLE);
                let created = !model.objects.contains_key(&key[..]);
                let (status, version, value) = model.apply(op);
                prop_assert_eq!(outcome.status, status, "{:?}", op);
                let reply = outcome;
                prop_assert_eq!(reply.version, version, "{:?}", op);
                if let Some(value) = value {
                    prop_assert_eq!(reply.counter, Some(value));
                }
                // The property the floor exists for: a created object outranks
                // every version ever removed, of any key.
                if created && status == Status::Ok && !matches!(op, WriteOp::Remove { .. }) {
                    prop_assert!(Some(version) > removed_before);
                }
            }
            prop_assert_eq!(store.safe_version().0, model.safe_version);
            prop_assert_eq!(store.object_count(), model.objects.len() as u64);
            for k in 0u8..6 {
                let key = [b'k', k];
                let read = store.read(TABLE, &key);
                match model.objects.get(&key[..]) {
                    Some((version, value)) => {
                        prop_assert_eq!(read.status(), Status::Ok);
                        prop_assert_eq!(read.version(), *version);
                        prop_assert_eq!(&read.value()[..], &value[..]);
                    }
                    None => prop_assert_eq!(read.status(), Status::ObjectDoesntExist),
                }
            }
        }
    }
}
