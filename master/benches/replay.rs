//! Micro-benchmark of a recovery master's replay core: `ObjectStore::stage_replay`,
//! `seal` and `publish_recovered`, piece after piece, as the appender runs them for one
//! partition — the version checks against the index and the batch, the log appends (a
//! copy of every byte), the profiler's counts and the index's growth. Not timed: the
//! pieces' transfer and decoding, the replication of the sealed ranges, the locks.
//!
//! The partition: 48 MiB of 1 KiB values (`bench recovery`'s objects: key `k` and ten
//! digits), about 46,000 objects of one table with keys in random hash order, in pieces
//! of 1.6 MB (an 8 MiB segment's share of five partitions), every object new to the
//! recovery master (its range was never owned there), as in a recovery of a master that
//! was loaded and not overwritten. The store's log memory is allocated and touched
//! before the clock starts (as a server does at start-up), so fresh memory is not timed.
//!
//! Run: `cargo bench -p rampart-master --bench replay`. Throughput is in bytes of
//! object entries replayed.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rampart_common::config::MasterConfig;
use rampart_common::ids::{key_hash, SegmentId, ServerId, TableId, Version};
use rampart_common::log::object_entry_bytes;
use rampart_master::object_store::{Batch, ObjectStore};
use rampart_master::replay::{PieceEntry, RecoveryPiece, ReplayState};

/// Bytes of object data in the partition (`PARTITION_BYTES_DEFAULT`).
const PARTITION_BYTES: usize = 48 << 20;

/// Bytes of each value.
const VALUE_BYTES: usize = 1024;

/// Bytes of the entries of one piece: an 8 MiB segment split five ways.
const PIECE_BYTES: usize = (8 << 20) / 5;

const TABLE: TableId = TableId(3);

/// The partition's pieces, keys and values slices of one buffer each (as a piece's
/// entries share the reply they came in), and the bytes of their entries.
fn pieces() -> (Vec<RecoveryPiece>, u64) {
    let entry_bytes = object_entry_bytes(11, VALUE_BYTES);
    let objects = PARTITION_BYTES / entry_bytes;
    let per_piece = PIECE_BYTES / entry_bytes;
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let mut pieces = Vec::new();
    let mut segment = 0;
    let mut i = 0;
    while i < objects {
        let count = per_piece.min(objects - i);
        let keys = Bytes::from(
            (i..i + count)
                .flat_map(|n| format!("k{n:010}").into_bytes())
                .collect::<Vec<u8>>(),
        );
        let entries = (0..count)
            .map(|j| {
                let key = keys.slice(j * 11..(j + 1) * 11);
                PieceEntry::Object {
                    table: TABLE,
                    hash: key_hash(&key),
                    version: Version((i + j) as u64 + 1),
                    key,
                    value: value.clone(),
                }
            })
            .collect();
        segment += 1;
        pieces.push(RecoveryPiece::from_entries(
            SegmentId(segment),
            Version(0),
            entries,
        ));
        i += count;
    }
    (pieces, (objects * entry_bytes) as u64)
}

/// A recovery master's store with room for the partition and then some.
fn store() -> ObjectStore {
    let config = MasterConfig {
        segment_bytes: 8 << 20,
        memory_bytes: (PARTITION_BYTES as u64) * 2 + (64 << 20),
        ..MasterConfig::default()
    };
    ObjectStore::new(ServerId(2), config)
}

fn replay(c: &mut Criterion) {
    let (pieces, bytes) = pieces();
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes));
    group.bench_function("partition_48MiB_1KiB_objects", |b| {
        b.iter_batched(
            store,
            |mut store| {
                let mut state = ReplayState::new();
                for piece in &pieces {
                    let mut batch = Batch::new();
                    if let Err(full) = store.stage_replay(&mut batch, &mut state, piece) {
                        panic!("the store is sized for the partition: {full:?}");
                    }
                    store.seal();
                    store.publish_recovered(batch);
                }
                assert_eq!(state.counts().objects_live, store.object_count());
                store
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
