//! Exactly-once execution in `ObjectStore` (RIFL, `rampart_common::rifl`): a tracked
//! write, remove or increment applies once and its retries are answered from its
//! completion record — in the same batch, in a later one, on the master that recovered
//! the log, and after the cleaner moved the record; acknowledged records go and their
//! numbers are stale.

use bytes::Bytes;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{key_hash, ClientId, ServerId, TableId, Version};
use rampart_common::log::{decode_entry, Entry};
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;

use crate::cleaner::{StepEnd, PASS_SURVIVORS_MAX};
use crate::completions::RECORDS_PER_CLIENT_MAX;
use crate::object_store::{Batch, ObjectStore, OpOutcome, WriteOp};
use crate::replay::{PieceEntry, RecoveryPiece, ReplayState};

const TABLE: TableId = TableId(1);
const CLIENT: ClientId = ClientId(42);

/// 24 segments of 96 KiB.
fn store(id: u64) -> ObjectStore {
    let config = MasterConfig {
        segment_bytes: 96 * 1024,
        memory_bytes: 24 * 96 * 1024,
        value_bytes_max: 8 * 1024,
        ..Default::default()
    };
    let mut store = ObjectStore::new(ServerId(id), config);
    store.take_tablets(&[whole()]);
    store
}

fn whole() -> Tablet {
    Tablet {
        table: TABLE,
        start_hash: 0,
        end_hash: u64::MAX,
        owner: ServerId(1),
    }
}

fn rifl(seq: u64, ack: u64) -> Rifl {
    Rifl {
        client: CLIENT,
        seq,
        ack,
    }
}

fn put(key: &str, value: &str, rifl: Rifl) -> WriteOp {
    WriteOp::Write {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        rules: RejectRules::default(),
        rifl,
    }
}

fn del(key: &str, rifl: Rifl) -> WriteOp {
    WriteOp::Remove {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
        rules: RejectRules::default(),
        rifl,
    }
}

fn incr(key: &str, delta: i64, rifl: Rifl) -> WriteOp {
    WriteOp::Increment {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
        delta,
        rules: RejectRules::default(),
        rifl,
    }
}

/// Applies `ops` as one batch (stage, seal, publish).
fn batch(store: &mut ObjectStore, ops: &[WriteOp]) -> Vec<OpOutcome> {
    let mut batch = Batch::new();
    let outcomes = ops.iter().map(|op| store.stage(&mut batch, op)).collect();
    store.seal();
    store.publish(batch);
    outcomes
}

fn apply(store: &mut ObjectStore, op: WriteOp) -> OpOutcome {
    batch(store, &[op]).remove(0)
}

fn value_of(store: &ObjectStore, key: &str) -> Option<(Version, Vec<u8>)> {
    store
        .read(TABLE, key.as_bytes())
        .ok()
        .map(|o| (o.version, o.value.to_vec()))
}

/// Recovers `crashed`'s whole log into a fresh master, as a recovery would: every
/// segment a piece, replayed, then the tablet taken.
fn recover(crashed: &ObjectStore) -> ObjectStore {
    let mut recovery = ObjectStore::new(ServerId(9), store(9).config().clone());
    let mut state = ReplayState::new();
    let log = crashed.log();
    let ids: Vec<_> = log.segment_ids().collect();
    for id in ids {
        let bytes = log.segment_bytes(id).expect("a segment of the log");
        let mut entries = Vec::new();
        let mut offset = 0;
        while let Some((entry, next)) =
            decode_entry(bytes, offset).expect("the log's entries decode")
        {
            match entry {
                Entry::Object(o) => entries.push(PieceEntry::Object {
                    table: o.table,
                    hash: key_hash(o.key),
                    version: o.version,
                    key: Bytes::copy_from_slice(o.key),
                    value: Bytes::copy_from_slice(o.value),
                }),
                Entry::Tombstone(t) => entries.push(PieceEntry::Tombstone {
                    table: t.table,
                    hash: key_hash(t.key),
                    version: t.version,
                    key: Bytes::copy_from_slice(t.key),
                }),
                Entry::Completion(c) => entries.push(PieceEntry::Completion(c)),
                _ => {}
            }
            offset = next;
        }
        let piece = RecoveryPiece::from_entries(id, crashed.safe_version(), entries);
        let mut batch = Batch::new();
        recovery
            .stage_replay(&mut batch, &mut state, &piece)
            .expect("the replay fits the recovery master");
        recovery.seal();
        recovery.publish_recovered(batch);
    }
    recovery.take_tablets(&[whole()]);
    recovery
}

#[test]
fn a_retried_write_is_answered_from_its_record_and_applies_once() {
    let mut store = store(1);
    let first = apply(&mut store, put("k", "a", rifl(1, 0)));
    assert_eq!(first.status, Status::Ok);
    apply(&mut store, put("k", "b", rifl(2, 1)));
    let version = value_of(&store, "k").expect("the key is live").0;
    // A late retry of operation 2 (its answer was lost): answered, not applied again.
    let retry = apply(&mut store, put("k", "b", rifl(2, 1)));
    assert_eq!((retry.status, retry.version), (Status::Ok, version));
    assert_eq!(
        value_of(&store, "k").expect("the key is live").0,
        version,
        "not applied again"
    );
    // Operation 1 was acknowledged by operation 2's request: stale now.
    assert_eq!(
        apply(&mut store, put("k", "a", rifl(1, 0))).status,
        Status::StaleRequest
    );
    assert_eq!(value_of(&store, "k").expect("the key is live").1, b"b");
}

#[test]
fn a_client_executes_only_under_a_known_lease_and_an_expired_ones_retry_never_applies() {
    let mut store = store(1);
    store.require_client_leases();
    let now = std::time::Instant::now();
    // No lease known: nothing executes (the write path asks the leader first).
    let unknown = apply(&mut store, incr("n", 5, rifl(1, 0)));
    assert_eq!(unknown.status, Status::Retry);
    assert_eq!(value_of(&store, "n"), None);
    store.note_client_lease(CLIENT, now + std::time::Duration::from_secs(30));
    assert_eq!(apply(&mut store, incr("n", 5, rifl(1, 0))).counter, Some(5));
    assert_eq!(store.completion_records(), 1);
    let live = store.log().usage().live_bytes;
    // Its retry is answered from the record while the client lives.
    assert_eq!(apply(&mut store, incr("n", 5, rifl(1, 0))).counter, Some(5));
    // The client expired for good: its record and lease go, the entry is dead...
    assert_eq!(store.expire_client(CLIENT), 1);
    assert_eq!(store.completion_records(), 0);
    assert!(store.log().usage().live_bytes < live);
    // ... and a late retry, with no record left to answer it, is not executed again.
    let late = apply(&mut store, incr("n", 5, rifl(1, 0)));
    assert_eq!(late.status, Status::Retry);
    assert_eq!(
        value_of(&store, "n").expect("the key is live").1,
        5i64.to_le_bytes()
    );
}

#[test]
fn an_untracked_write_applies_every_time_it_arrives() {
    let mut store = store(1);
    let v1 = apply(&mut store, put("k", "a", Rifl::NONE)).version;
    let v2 = apply(&mut store, put("k", "a", Rifl::NONE)).version;
    assert!(v2 > v1);
}

#[test]
fn a_retry_in_the_same_batch_is_answered_from_the_staged_record() {
    let mut store = store(1);
    let outcomes = batch(
        &mut store,
        &[
            incr("n", 5, rifl(1, 0)),
            incr("n", 5, rifl(1, 0)),
            incr("n", 1, rifl(2, 0)),
        ],
    );
    assert_eq!(outcomes[0], outcomes[1]);
    assert_eq!(outcomes[0].counter, Some(5));
    assert_eq!(outcomes[2].counter, Some(6));
    assert_eq!(
        value_of(&store, "n").expect("the key is live").1,
        6i64.to_le_bytes().to_vec()
    );
}

#[test]
fn an_increment_retried_after_a_recovery_is_counted_once() {
    let mut crashed = store(1);
    assert_eq!(
        apply(&mut crashed, incr("n", 7, rifl(1, 0))).counter,
        Some(7)
    );
    let removed = apply(&mut crashed, del("gone", rifl(2, 0)));
    assert_eq!((removed.status, removed.version), (Status::Ok, Version(0)));
    apply(&mut crashed, put("gone", "x", rifl(3, 0)));
    let removed = apply(&mut crashed, del("gone", rifl(4, 0)));
    let mut recovered = recover(&crashed);
    // The client's retries reach the recovery master: answered as the first time.
    let retry = apply(&mut recovered, incr("n", 7, rifl(1, 0)));
    assert_eq!((retry.status, retry.counter), (Status::Ok, Some(7)));
    assert_eq!(
        value_of(&recovered, "n").expect("the key is live").1,
        7i64.to_le_bytes().to_vec()
    );
    let retry = apply(&mut recovered, del("gone", rifl(4, 0)));
    assert_eq!(retry, removed);
    // A remove that changed nothing has no record: run again, it still changes nothing.
    assert_eq!(
        apply(&mut recovered, del("never", rifl(2, 0))).version,
        Version(0)
    );
    // A new operation applies.
    assert_eq!(
        apply(&mut recovered, incr("n", 1, rifl(5, 4))).counter,
        Some(8)
    );
}

#[test]
fn acknowledged_records_leave_the_recovered_master_too() {
    let mut crashed = store(1);
    apply(&mut crashed, put("a", "1", rifl(1, 0)));
    apply(&mut crashed, put("b", "2", rifl(2, 0)));
    // Operation 3 acknowledges 1 and 2: their records are dropped, and a recovery
    // that meets their entries in the log keeps them dropped.
    apply(&mut crashed, put("c", "3", rifl(3, 2)));
    let mut recovered = recover(&crashed);
    assert_eq!(
        apply(&mut recovered, put("a", "1", rifl(1, 0))).status,
        Status::StaleRequest
    );
    assert_eq!(
        apply(&mut recovered, put("c", "3", rifl(3, 2))).version,
        value_of(&recovered, "c").expect("the key is live").0
    );
}

#[test]
fn the_cleaner_keeps_unacknowledged_records_and_drops_acknowledged_ones() {
    let mut store = store(1);
    let value = "v".repeat(6000);
    // Operation 1 stays unfinished at the client, so operations 2..=120 (overwriting
    // one key) carry ack 0: its lowest unfinished number minus one.
    let first = apply(&mut store, put("kept", "first", rifl(1, 0)));
    for seq in 2..=120 {
        assert_eq!(
            apply(&mut store, put("hot", &value, rifl(seq, 0))).status,
            Status::Ok
        );
    }
    // Now 1 finishes: operations up to 100 acknowledged, 101..=120 still held.
    apply(&mut store, put("other", "x", rifl(121, 100)));
    let held = store.log_bytes().0;
    let mut freed = 0;
    for _ in 0..50 {
        let Some(mut pass) = store.plan_cleaning(PASS_SURVIVORS_MAX) else {
            break;
        };
        loop {
            let end = store.clean_step(&mut pass, 1 << 20);
            store.seal();
            if end != StepEnd::Budget {
                store.commit_cleaning(&mut pass).expect("the pass commits");
                store.seal();
                freed += store.free_cleaned().len();
            }
            if pass.is_done() {
                break;
            }
        }
        if freed > 20 {
            break;
        }
    }
    assert!(freed > 0, "nothing cleaned");
    assert!(store.log_bytes().0 < held);
    // Records above the acknowledgement moved with the cleaning and still answer.
    let retry = apply(&mut store, put("hot", &value, rifl(110, 100)));
    assert_eq!(retry.status, Status::Ok);
    assert_eq!(
        apply(&mut store, put("kept", "first", rifl(1, 0))).status,
        Status::StaleRequest
    );
    assert_ne!(first.version, Version(0));
    // And a recovery of the cleaned log still finds them.
    let mut recovered = recover(&store);
    let again = apply(&mut recovered, put("hot", &value, rifl(110, 100)));
    assert_eq!(again, retry);
}

#[test]
fn records_leave_with_their_tablet() {
    let mut store = store(1);
    apply(&mut store, put("k", "a", rifl(1, 0)));
    store.drop_tablets(&[whole()]);
    store.take_tablets(&[whole()]);
    // The tablet came back empty: nothing of it is remembered, the operation is new.
    assert_eq!(store.object_count(), 0);
    assert_eq!(
        apply(&mut store, put("k", "a", rifl(1, 0))).status,
        Status::Ok
    );
    assert_eq!(
        value_of(&store, "k").expect("the key is live").1,
        b"a",
        "applied again"
    );
}

#[test]
fn an_acknowledgement_covering_its_own_operation_is_refused() {
    let mut store = store(1);
    assert_eq!(
        apply(&mut store, put("k", "a", rifl(3, 3))).status,
        Status::InvalidArgument
    );
}

#[test]
fn a_client_at_the_record_limit_is_told_to_retry_and_its_resend_applies_once_acknowledged() {
    let mut store = store(1);
    // A client whose acknowledgement is held back (one slow operation, numbered 1 here,
    // not sent to this master) fills its records on a healthy master.
    let ops: Vec<WriteOp> = (2..=RECORDS_PER_CLIENT_MAX as u64 + 1)
        .map(|seq| incr("n", 1, rifl(seq, 0)))
        .collect();
    for chunk in ops.chunks(512) {
        assert!(batch(&mut store, chunk)
            .iter()
            .all(|o| o.status == Status::Ok));
    }
    // One more is a valid request the master cannot hold yet: try again, not invalid.
    let waiting = incr("n", 1, rifl(RECORDS_PER_CLIENT_MAX as u64 + 2, 0));
    let refused = apply(&mut store, waiting.clone());
    assert_eq!(refused.status, Status::Retry, "{refused:?}");
    assert_eq!(
        store.completion_records(),
        RECORDS_PER_CLIENT_MAX,
        "nothing applied"
    );
    // The slow operation finishes and the next request acknowledges everything below
    // the waiting one; the waiting one, sent again as it was, applies.
    let next = RECORDS_PER_CLIENT_MAX as u64 + 3;
    let after = apply(
        &mut store,
        incr("n", 1, rifl(next, RECORDS_PER_CLIENT_MAX as u64 + 1)),
    );
    assert_eq!(after.status, Status::Ok);
    let resent = apply(&mut store, waiting);
    assert_eq!(resent.status, Status::Ok);
    assert_eq!(resent.counter, Some(RECORDS_PER_CLIENT_MAX as i64 + 2));
}
