//! A move between two stores, driven by hand as the target's driver drives it: pieces
//! cut from the source's index, tails of what changed meanwhile, the freeze and the last
//! tail, then the commit (the target takes the range, the source narrows). Checks that
//! the target ends with exactly the source's objects — removed keys stay removed — and
//! that neither side's log can bring back what it should not.

// A failed unwrap is a failed test, with its location: exactly what a test wants.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use rampart_common::ids::{ClientId, MoveId, SegmentId, ServerId, TabletEpoch, Version};
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, Tablet};

use super::test_support::ReadResult;
use super::test_support::{
    apply, clean_tainted, config, delete, log_entries, put, remove, store, write, TABLE,
};
use super::{Batch, MovePiece, ObjectStore, WriteOp};
use crate::replay::{PieceBytes, RecoveryPiece, ReplayState};

const MOVE: MoveId = MoveId(3);
const TARGET: ServerId = ServerId(2);

fn whole_range() -> HashRange {
    HashRange::whole(TABLE)
}

/// A store that owns nothing of `TABLE`.
fn target() -> ObjectStore {
    ObjectStore::new(TARGET, config())
}

/// Replays `piece` into `target` as its move driver does: parsed and checked against the
/// range, staged, sealed, published (not owned yet).
fn replay_piece(target: &mut ObjectStore, state: &mut ReplayState, piece: MovePiece) {
    let bytes = PieceBytes {
        safe_version: piece.safe_version,
        entries: Bytes::from(piece.entries),
        count: piece.count,
    };
    let piece = RecoveryPiece::parse(SegmentId(0), bytes, &[whole_range()]).unwrap();
    let mut batch = Batch::new();
    target.stage_replay(&mut batch, state, &piece).unwrap();
    target.seal();
    target.publish_recovered(batch);
}

/// Copies the source's live objects in pieces of `budget` bytes; `between` runs after
/// the first piece (changes made during the copy).
fn copy(
    source: &mut ObjectStore,
    target: &mut ObjectStore,
    state: &mut ReplayState,
    budget: usize,
    mut between: impl FnMut(&mut ObjectStore),
) {
    let mut from = Some(0);
    let mut pieces = 0;
    while let Some(at) = from {
        let piece = source.move_out_piece(MOVE, at, budget).unwrap();
        from = piece.next;
        replay_piece(target, state, piece);
        pieces += 1;
        if pieces == 1 {
            between(source);
        }
        assert!(pieces < 10_000, "the walk does not end");
    }
}

/// Sends tails until nothing waits.
fn drain(source: &mut ObjectStore, target: &mut ObjectStore, state: &mut ReplayState) {
    loop {
        let piece = source.move_out_tail(MOVE, 4096).unwrap();
        let left = piece.left;
        replay_piece(target, state, piece);
        if left == 0 {
            return;
        }
    }
}

/// The commit: the target takes the range, the source serves nothing of `TABLE`.
fn commit(source: &mut ObjectStore, target: &mut ObjectStore) {
    target.take_tablets(&[tablet(whole_range(), TARGET)]);
    assert!(source.replace_tablets(TabletEpoch(7), &[]));
}

fn tablet(range: HashRange, owner: ServerId) -> Tablet {
    Tablet {
        table: range.table,
        start_hash: range.start,
        end_hash: range.end,
        owner,
    }
}

/// Every key `keys` names, as `store` answers reads of it.
fn contents(store: &ObjectStore, keys: &[String]) -> Vec<(Status, Version, Vec<u8>)> {
    keys.iter()
        .map(|key| {
            let read = store.read(TABLE, key.as_bytes());
            (read.status(), read.version(), read.value().to_vec())
        })
        .collect()
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("key-{i:04}")).collect()
}

#[test]
fn a_moved_range_reads_on_the_target_as_it_did_on_the_source() {
    let mut source = store();
    let names = keys(300);
    for (i, key) in names.iter().enumerate() {
        put(&mut source, key.as_bytes(), format!("v{i}").as_bytes());
    }
    // Overwrites, and removals never written again.
    for key in names.iter().step_by(3) {
        put(&mut source, key.as_bytes(), b"again");
    }
    for key in names.iter().skip(1).step_by(5) {
        delete(&mut source, key.as_bytes());
    }
    let before = contents(&source, &names);
    let mut target = target();
    let mut state = ReplayState::new();
    source
        .open_move_out(MOVE, whole_range(), std::time::Instant::now())
        .unwrap();
    copy(&mut source, &mut target, &mut state, 1000, |_| {});
    drain(&mut source, &mut target, &mut state);
    assert_eq!(
        source.freeze_move_out(MOVE, std::time::Instant::now()),
        Ok(0)
    );
    drain(&mut source, &mut target, &mut state);
    commit(&mut source, &mut target);
    assert_eq!(contents(&target, &names), before);
    assert_eq!(
        source.read(TABLE, names[0].as_bytes()).status(),
        Status::UnknownTablet
    );
    assert!(source.moves_out().is_empty(), "the commit ended the move");
    // Nothing removed on the source ever reached the target's log: its recovery
    // cannot bring one back.
    let removed: Vec<&String> = names.iter().skip(1).step_by(5).collect();
    for entry in log_entries(&target) {
        if let crate::replay::PieceEntry::Object { key, .. } = entry {
            assert!(!removed.iter().any(|r| r.as_bytes() == &key[..]));
        }
    }
}

#[test]
fn changes_made_during_the_copy_reach_the_target_and_removed_keys_stay_removed() {
    let mut source = store();
    let names = keys(400);
    for key in &names {
        put(&mut source, key.as_bytes(), b"old");
    }
    let mut target = target();
    let mut state = ReplayState::new();
    source
        .open_move_out(MOVE, whole_range(), std::time::Instant::now())
        .unwrap();
    // After the first piece: every key changes one way or another, copied already or
    // not; removed keys are never written again.
    copy(&mut source, &mut target, &mut state, 2000, |source| {
        for (i, key) in names.iter().enumerate() {
            match i % 4 {
                0 => {
                    put(source, key.as_bytes(), b"new");
                }
                1 => {
                    delete(source, key.as_bytes());
                }
                2 => {
                    delete(source, key.as_bytes());
                    put(source, key.as_bytes(), b"re-created");
                }
                _ => {}
            }
        }
        put(source, b"born-during-the-copy", b"x");
    });
    drain(&mut source, &mut target, &mut state);
    // More changes between the tails and the freeze.
    delete(&mut source, names[3].as_bytes());
    put(&mut source, names[1].as_bytes(), b"back after removal");
    let mut all = names.clone();
    all.push("born-during-the-copy".into());
    let before = contents(&source, &all);
    assert_eq!(
        source.freeze_move_out(MOVE, std::time::Instant::now()),
        Ok(2)
    );
    drain(&mut source, &mut target, &mut state);
    commit(&mut source, &mut target);
    assert_eq!(contents(&target, &all), before);
    // A later write on the target gets a version above every one the source handed out.
    let highest = before.iter().map(|(_, v, _)| *v).max().unwrap();
    assert!(put(&mut target, names[5].as_bytes(), b"after") > highest);
}

#[test]
fn a_frozen_range_answers_retry_until_the_move_ends_and_the_rest_is_served() {
    let mut source = store();
    put(&mut source, b"k", b"v");
    let low = tablet(HashRange::new(TABLE, 0, 1 << 63), ServerId(1));
    let high = tablet(HashRange::new(TABLE, (1 << 63) + 1, u64::MAX), ServerId(1));
    assert!(source.replace_tablets(TabletEpoch(2), &[low, high]));
    let k_hash = rampart_common::ids::key_hash(b"k").0;
    let (frozen, served) = if k_hash <= 1 << 63 {
        (low, high)
    } else {
        (high, low)
    };
    source
        .open_move_out(MOVE, frozen.range(), std::time::Instant::now())
        .unwrap();
    assert_eq!(
        source.read(TABLE, b"k").status(),
        Status::Ok,
        "open, not frozen"
    );
    source
        .freeze_move_out(MOVE, std::time::Instant::now())
        .unwrap();
    assert_eq!(source.read(TABLE, b"k").status(), Status::Retry);
    assert_eq!(apply(&mut source, &write(b"k", b"w")).status, Status::Retry);
    assert_eq!(apply(&mut source, &remove(b"k")).status, Status::Retry);
    assert_eq!(
        source
            .enumerate(TABLE, frozen.start_hash..=frozen.end_hash, 1000)
            .map(|page| page.objects.len()),
        Err(Status::Retry)
    );
    // An enumeration of the rest stops short of the frozen range.
    let page = source.enumerate(TABLE, 0..=u64::MAX, 1 << 20);
    if served.start_hash == 0 {
        let page = page.unwrap();
        assert_eq!(page.next_hash, Some(frozen.start_hash));
    } else {
        assert_eq!(page.map(|p| p.objects.len()), Err(Status::Retry));
    }
    // Aborted: served again, as it was; and a late step of the target's cannot open or
    // freeze it again.
    source.end_move_out(MOVE);
    assert_eq!(source.read(TABLE, b"k").status(), Status::Ok);
    assert_eq!(apply(&mut source, &write(b"k", b"w")).status, Status::Ok);
    assert_eq!(
        source.open_move_out(MOVE, frozen.range(), std::time::Instant::now()),
        Err(Status::MoveAborted)
    );
    assert_eq!(
        source.freeze_move_out(MOVE, std::time::Instant::now()),
        Err(Status::MoveAborted)
    );
    assert_eq!(source.read(TABLE, b"k").status(), Status::Ok);
}

#[test]
fn only_an_owned_range_opens_and_moves_do_not_overlap() {
    let mut source = store();
    let mut target = target();
    assert_eq!(
        target.open_move_out(MOVE, whole_range(), std::time::Instant::now()),
        Err(Status::UnknownTablet)
    );
    source
        .open_move_out(MOVE, whole_range(), std::time::Instant::now())
        .unwrap();
    assert_eq!(
        source.open_move_out(MOVE, whole_range(), std::time::Instant::now()),
        Ok(()),
        "again"
    );
    assert_eq!(
        source.open_move_out(
            MoveId(4),
            HashRange::new(TABLE, 5, 9),
            std::time::Instant::now()
        ),
        Err(Status::Retry)
    );
    assert_eq!(
        source.open_move_out(MOVE, HashRange::new(TABLE, 5, 9), std::time::Instant::now()),
        Err(Status::InvalidArgument)
    );
    assert_eq!(
        source.move_out_piece(MoveId(9), 0, 100),
        Err(Status::InvalidArgument)
    );
}

#[test]
fn a_move_in_keeps_its_copy_from_a_recoverys_forgetting_until_it_ends() {
    let mut source = store();
    for key in keys(20) {
        put(&mut source, key.as_bytes(), b"v");
    }
    let mut target = target();
    let mut state = ReplayState::new();
    target.begin_move_in(MOVE, whole_range()).unwrap();
    assert_eq!(
        target.begin_move_in(MoveId(4), HashRange::new(TABLE, 1, 2)),
        Err(Status::Retry),
        "overlapping moves in"
    );
    source
        .open_move_out(MOVE, whole_range(), std::time::Instant::now())
        .unwrap();
    copy(&mut source, &mut target, &mut state, 1 << 20, |_| {});
    // A recovery that gave up on an overlapping range forgets what it left: not the
    // move's copy.
    assert_eq!(target.forget_unowned(&[whole_range()]), 0);
    assert_eq!(target.object_count(), 20);
    // The move is aborted: its copy goes, and a late MoveIn of it is refused.
    assert_eq!(target.end_move_in(MOVE), Some(whole_range()));
    assert_eq!(target.forget_unowned(&[whole_range()]), 20);
    assert_eq!(
        target.begin_move_in(MOVE, whole_range()),
        Err(Status::MoveAborted)
    );
}

const CLIENT: ClientId = ClientId(42);

fn tracked_write(key: &str, value: &str, seq: u64) -> WriteOp {
    WriteOp::Write {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        rules: RejectRules::default(),
        rifl: Rifl {
            client: CLIENT,
            seq,
            ack: 0,
        },
    }
}

#[test]
fn a_retry_after_the_move_is_answered_from_its_record_and_not_applied_twice() {
    let mut source = store();
    // One write before the move opens, one during the copy, one after the freeze's
    // tail was cut would be refused: the range is frozen.
    let first = apply(&mut source, &tracked_write("a", "1", 1));
    let mut target = target();
    let mut state = ReplayState::new();
    source
        .open_move_out(MOVE, whole_range(), std::time::Instant::now())
        .unwrap();
    let mut second = None;
    copy(&mut source, &mut target, &mut state, 100, |source| {
        second = Some(apply(source, &tracked_write("b", "2", 2)));
    });
    let second = second.unwrap();
    source
        .freeze_move_out(MOVE, std::time::Instant::now())
        .unwrap();
    drain(&mut source, &mut target, &mut state);
    commit(&mut source, &mut target);
    // Overwritten on the target since; the retries must not apply again.
    put(&mut target, b"a", b"later");
    for (op, outcome) in [
        (tracked_write("a", "1", 1), first),
        (tracked_write("b", "2", 2), second),
    ] {
        let retried = apply(&mut target, &op);
        assert_eq!(retried.status, Status::Ok);
        assert_eq!(retried.version, outcome.version);
    }
    assert_eq!(target.read(TABLE, b"a").value().as_ref(), b"later");
}

#[test]
fn the_source_taints_what_it_forgets_when_the_range_leaves() {
    let mut source = store();
    for key in keys(50) {
        put(&mut source, key.as_bytes(), b"v");
    }
    let mut target = target();
    let mut state = ReplayState::new();
    source
        .open_move_out(MOVE, whole_range(), std::time::Instant::now())
        .unwrap();
    copy(&mut source, &mut target, &mut state, 1 << 20, |_| {});
    source
        .freeze_move_out(MOVE, std::time::Instant::now())
        .unwrap();
    drain(&mut source, &mut target, &mut state);
    commit(&mut source, &mut target);
    // The range could come back here: its old entries must leave the log first, and
    // nothing is replayed (no recovery, no move in) until they have — neither while its
    // objects are still being forgotten, nor while their segments are in the log.
    assert!(source.forgetting());
    let piece = RecoveryPiece::from_entries(SegmentId(1), Version(0), Vec::new());
    let replay = |source: &mut ObjectStore| {
        source
            .stage_replay(&mut Batch::new(), &mut ReplayState::new(), &piece)
            .is_ok()
    };
    assert!(!replay(&mut source));
    while source.forgetting() {
        assert!(source.forget_step(10) > 0);
    }
    assert_eq!(source.object_count(), 0);
    assert!(source.tainted_held() > 0);
    assert!(!replay(&mut source));
    clean_tainted(&mut source);
    assert_eq!(source.tainted_held(), 0);
    assert!(
        log_entries(&source).is_empty(),
        "nothing of the range is left"
    );
}

#[test]
fn a_create_staged_before_a_tail_and_published_after_survives_the_tails_tombstone() {
    let mut source = store();
    // k2 climbs to a high version; k exists, then is removed during the move.
    let mut high = Version(0);
    for _ in 0..50 {
        high = put(&mut source, b"k2", b"x");
    }
    put(&mut source, b"k", b"old");
    let mut target = target();
    let mut state = ReplayState::new();
    source
        .open_move_out(MOVE, whole_range(), std::time::Instant::now())
        .unwrap();
    copy(&mut source, &mut target, &mut state, 1 << 20, |_| {});
    delete(&mut source, b"k");
    // One batch: k created again (it gets the safe version), then k2 removed (which
    // raises the safe version above k's). A tail is cut while the batch replicates.
    let mut batch = Batch::new();
    let created = source.stage(&mut batch, &write(b"k", b"new"));
    let removed = source.stage(&mut batch, &remove(b"k2"));
    assert_eq!((created.status, removed.version), (Status::Ok, high));
    source.seal();
    let tail = source.move_out_tail(MOVE, 4096).unwrap();
    replay_piece(&mut target, &mut state, tail);
    source.publish(batch);
    source
        .freeze_move_out(MOVE, std::time::Instant::now())
        .unwrap();
    drain(&mut source, &mut target, &mut state);
    commit(&mut source, &mut target);
    let read = target.read(TABLE, b"k");
    assert_eq!(
        (read.status(), read.version()),
        (Status::Ok, created.version),
        "the acknowledged create of k was masked by the tail's tombstone"
    );
    assert_eq!(
        target.read(TABLE, b"k2").status(),
        Status::ObjectDoesntExist
    );
}

#[test]
fn a_move_runs_once_on_its_target() {
    // A second run of a move would replay over the first's copy with a fresh replay
    // state, and the tails the source sent the first are not sent again.
    let mut target = target();
    target.begin_move_in(MOVE, whole_range()).unwrap();
    assert_eq!(
        target.begin_move_in(MOVE, whole_range()),
        Err(Status::MoveAborted)
    );
}
