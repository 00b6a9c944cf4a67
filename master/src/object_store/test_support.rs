//! What the store's tests share (tests only): a small config, stores owning a table,
//! operations and how to apply them, recovery pieces and how to replay them, and
//! [`ReadResult`] to look at a read.

// A failed unwrap is a failed test, with its location: exactly what a test wants.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{key_hash, SegmentId, ServerId, TableId, Version};
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, Tablet};

use crate::replay::{PieceEntry, RecoveryPiece, ReplayState};

use super::batch::Batch;
use super::ops::{Object, OpOutcome, WriteOp};
use super::store::ObjectStore;

/// A read as assertions see it: its status, and version 0 and no value when it found
/// nothing (as the wire reports it).
pub(crate) trait ReadResult {
    fn status(&self) -> Status;
    fn version(&self) -> Version;
    fn value(&self) -> Bytes;
}

impl ReadResult for Result<Object, Status> {
    fn status(&self) -> Status {
        self.as_ref().err().copied().unwrap_or(Status::Ok)
    }

    fn version(&self) -> Version {
        self.as_ref().map_or(Version(0), |object| object.version)
    }

    fn value(&self) -> Bytes {
        self.as_ref()
            .map_or_else(|_| Bytes::new(), |object| object.value.clone())
    }
}

pub(super) const TABLE: TableId = TableId(1);

/// 8 segments of 128 KiB: small enough to fill and roll over quickly, large enough
/// for the largest object (a 64 KiB key with a 1 KiB value).
pub(super) fn config() -> MasterConfig {
    let config = MasterConfig {
        segment_bytes: 128 * 1024,
        memory_bytes: 1024 * 1024,
        value_bytes_max: 1024,
        ..Default::default()
    };
    assert_eq!(config.validate(), Ok(()));
    config
}

pub(super) fn tablet(table: TableId, start_hash: u64, end_hash: u64) -> Tablet {
    Tablet {
        table,
        start_hash,
        end_hash,
        owner: ServerId(1),
    }
}

/// A store owning the whole hash space of `TABLE`.
pub(super) fn store() -> ObjectStore {
    let mut store = ObjectStore::new(ServerId(1), config());
    store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
    store
}

/// Applies `ops` as one batch: stage all, seal, publish.
pub(super) fn apply_batch(store: &mut ObjectStore, ops: &[WriteOp]) -> Vec<OpOutcome> {
    let mut batch = Batch::new();
    let outcomes = ops.iter().map(|op| store.stage(&mut batch, op)).collect();
    store.seal();
    store.publish(batch);
    outcomes
}

/// Applies one operation as its own batch.
pub(super) fn apply(store: &mut ObjectStore, op: &WriteOp) -> OpOutcome {
    apply_batch(store, std::slice::from_ref(op)).remove(0)
}

pub(super) fn write_if(key: &[u8], value: &[u8], rules: RejectRules) -> WriteOp {
    WriteOp::Write {
        table: TABLE,
        key: Bytes::copy_from_slice(key),
        value: Bytes::copy_from_slice(value),
        rules,
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

pub(super) fn write(key: &[u8], value: &[u8]) -> WriteOp {
    write_if(key, value, RejectRules::default())
}

pub(super) fn remove_if(key: &[u8], rules: RejectRules) -> WriteOp {
    WriteOp::Remove {
        table: TABLE,
        key: Bytes::copy_from_slice(key),
        rules,
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

pub(super) fn remove(key: &[u8]) -> WriteOp {
    remove_if(key, RejectRules::default())
}

pub(super) fn increment_if(key: &[u8], delta: i64, rules: RejectRules) -> WriteOp {
    WriteOp::Increment {
        table: TABLE,
        key: Bytes::copy_from_slice(key),
        delta,
        rules,
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

pub(super) fn increment(key: &[u8], delta: i64) -> WriteOp {
    increment_if(key, delta, RejectRules::default())
}

/// Writes `value` under `key` unconditionally and returns the new version.
pub(super) fn put(store: &mut ObjectStore, key: &[u8], value: &[u8]) -> Version {
    let outcome = apply(store, &write(key, value));
    assert_eq!(outcome.status, Status::Ok, "write of {key:?}");
    outcome.version
}

/// Removes `key` unconditionally and returns the version removed.
pub(super) fn delete(store: &mut ObjectStore, key: &[u8]) -> Version {
    let outcome = apply(store, &remove(key));
    assert_eq!(outcome.status, Status::Ok, "remove of {key:?}");
    outcome.version
}

/// Total bytes written to the log, sealed or not.
pub(super) fn log_len(store: &ObjectStore) -> usize {
    let log = store.log();
    log.segment_ids()
        .map(|id| log.segment_bytes(id).unwrap().len())
        .sum()
}

pub(super) fn int(n: i64) -> [u8; 8] {
    n.to_le_bytes()
}

/// Where replays go in these tests: a table the recovering store does not own.
pub(super) const RECOVERED: TableId = TableId(7);

pub(super) fn whole(table: TableId) -> Tablet {
    tablet(table, 0, u64::MAX)
}

pub(super) fn partition() -> Vec<HashRange> {
    vec![HashRange::whole(RECOVERED)]
}

pub(super) fn obj(key: &str, version: u64, value: &str) -> PieceEntry {
    PieceEntry::Object {
        table: RECOVERED,
        hash: key_hash(key.as_bytes()),
        version: Version(version),
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
    }
}

pub(super) fn tomb(key: &str, version: u64) -> PieceEntry {
    PieceEntry::Tombstone {
        table: RECOVERED,
        hash: key_hash(key.as_bytes()),
        version: Version(version),
        key: Bytes::copy_from_slice(key.as_bytes()),
    }
}

pub(super) fn piece(entries: Vec<PieceEntry>) -> RecoveryPiece {
    RecoveryPiece::from_entries(SegmentId(1), Version(0), entries)
}

/// Replays `pieces` one batch each: stage, seal, publish.
pub(super) fn replay(store: &mut ObjectStore, state: &mut ReplayState, pieces: &[RecoveryPiece]) {
    for piece in pieces {
        let mut batch = Batch::new();
        store.stage_replay(&mut batch, state, piece).unwrap();
        store.seal();
        store.publish_recovered(batch);
    }
}

/// A recovery master: owns all of `TABLE`, nothing of `RECOVERED`.
pub(super) fn recovery_master() -> ObjectStore {
    store()
}

/// What reads of `keys` in `RECOVERED` return: (status, version, value).
pub(super) fn reads(store: &ObjectStore, keys: &[&str]) -> Vec<(Status, Version, Vec<u8>)> {
    keys.iter()
        .map(|key| {
            let read = store.read(RECOVERED, key.as_bytes());
            (read.status(), read.version(), read.value().to_vec())
        })
        .collect()
}

/// Every object and tombstone in the store's log, in log order, as a crash of this
/// store would hand them to its own recovery.
pub(super) fn log_entries(store: &ObjectStore) -> Vec<PieceEntry> {
    let log = store.log();
    let mut entries = Vec::new();
    for id in log.segment_ids() {
        let bytes = log.segment_bytes(id).unwrap();
        let mut offset = 0;
        while let Some((entry, next)) = rampart_common::log::decode_entry(bytes, offset).unwrap() {
            match entry {
                rampart_common::log::Entry::Object(o) => entries.push(PieceEntry::Object {
                    table: o.table,
                    hash: key_hash(o.key),
                    version: o.version,
                    key: Bytes::copy_from_slice(o.key),
                    value: Bytes::copy_from_slice(o.value),
                }),
                rampart_common::log::Entry::Tombstone(t) => entries.push(PieceEntry::Tombstone {
                    table: t.table,
                    hash: key_hash(t.key),
                    version: t.version,
                    key: Bytes::copy_from_slice(t.key),
                }),
                _ => {}
            }
            offset = next;
        }
    }
    entries
}

/// Forgets what is left of the ranges moved away, then runs the cleaner until no
/// tainted segment is left, as the appender's forget job does (a pass, its steps,
/// commits and frees).
pub(super) fn clean_tainted(store: &mut ObjectStore) {
    while store.forgetting() {
        store.forget_step(7);
    }
    for _ in 0..1000 {
        store.close_tainted_head().unwrap();
        if store.tainted_held() == 0 {
            return;
        }
        let mut pass = store.plan_cleaning(8).expect("tainted segments to clean");
        while !pass.is_done() {
            let end = store.clean_step(&mut pass, usize::MAX);
            store.seal();
            if end != crate::cleaner::StepEnd::Budget {
                store.commit_cleaning(&mut pass).unwrap();
                store.seal();
                store.free_cleaned();
            }
        }
    }
    panic!("tainted segments never left the log");
}
