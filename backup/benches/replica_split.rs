//! Micro-benchmark of the replica split of recovery
//! (`rampart_backup::recovery_reads::split_replica`): a backup reading a crashed master's
//! replicas splits each into one piece per recovery partition. Measured on a closed
//! 8 MiB segment (the default size) of objects with 24-byte keys and values of 100 B
//! and 1 KiB, split over 10 partitions of one table (equal key-hash ranges, so every
//! object goes to some piece); throughput is in segment bytes.
//!
//! The floors, beside it in each group: `scan` — `log::scan` of the same replica, the
//! split's first pass (the valid prefix, a CRC32 of every byte); and `memcpy` — copying
//! the same bytes once, as the split copies every entry it keeps into its piece. The
//! split adds to them a decoding pass (objects' own CRCs again), a key hash and a
//! binary search of the partition index per entry (module doc of `recovery.rs`,
//! "Cost": ≈ 3–5 ms per 8 MiB segment).
//!
//! Run: `cargo bench -p rampart-backup --bench replica_split`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rampart_backup::recovery_reads::{split_replica, PartitionIndex};
use rampart_common::config::SEGMENT_BYTES_DEFAULT;
use rampart_common::ids::{Epoch, SegmentId, ServerId, TableId, Version};
use rampart_common::log::{scan, SegmentWriter};
use rampart_common::protocol::backup::{PartitionRanges, ReplicaInfo};
use rampart_common::tablet::HashRange;

/// Value sizes, in bytes.
const VALUE_SIZES: [usize; 2] = [100, 1024];

/// Recovery partitions (recovery masters).
const PARTITIONS: u64 = 10;

const TABLE: TableId = TableId(1);
const MASTER: ServerId = ServerId(1);
const SEGMENT: SegmentId = SegmentId(7);

/// A closed segment of objects with `value_bytes`-byte values, one batch per object.
fn closed_segment(value_bytes: usize) -> Vec<u8> {
    let value = vec![0x5a; value_bytes];
    let mut writer = SegmentWriter::open(MASTER, SEGMENT, SEGMENT_BYTES_DEFAULT, &[SEGMENT])
        .unwrap_or_else(|_| panic!("an 8 MiB segment opens"));
    let mut key = *b"user00000000000000000000";
    for n in 1u64.. {
        key[4..].copy_from_slice(format!("{n:020}").as_bytes());
        if writer
            .append_object(TABLE, Version(n), &key, &value)
            .is_err()
        {
            break;
        }
        writer.seal_batch();
    }
    writer.close(SegmentId(8));
    writer.into_buffer()
}

/// [`PARTITIONS`] equal key-hash ranges of [`TABLE`], one per partition.
fn partitions() -> PartitionIndex {
    let step = u64::MAX / PARTITIONS + 1;
    let ranges: Vec<PartitionRanges> = (0..PARTITIONS)
        .map(|p| {
            let end = if p + 1 == PARTITIONS {
                u64::MAX
            } else {
                (p + 1) * step - 1
            };
            vec![HashRange {
                table: TABLE,
                start: p * step,
                end,
            }]
        })
        .collect();
    PartitionIndex::new(&ranges).unwrap_or_else(|e| panic!("partitions: {e}"))
}

fn label(value_bytes: usize) -> String {
    if value_bytes >= 1024 {
        format!("{}KiB", value_bytes / 1024)
    } else {
        format!("{value_bytes}B")
    }
}

fn replica_split(c: &mut Criterion) {
    let index = partitions();
    let mut group = c.benchmark_group("replica_split");
    group.sample_size(20);
    for value_bytes in VALUE_SIZES {
        let segment = closed_segment(value_bytes);
        let replica = ReplicaInfo {
            master: MASTER,
            segment: SEGMENT,
            epoch: Epoch(1),
            length: segment.len() as u32,
            closed: true,
        };
        let split = split_replica(&segment, &replica, &index)
            .unwrap_or_else(|e| panic!("the replica splits: {e}"));
        let kept: usize = split.pieces.iter().map(|p| p.entries.len()).sum();
        assert!(
            split.pieces.iter().all(|p| p.count > 0) && kept > segment.len() * 9 / 10,
            "every partition gets objects, and the objects are most of the segment"
        );
        group.throughput(Throughput::Bytes(segment.len() as u64));
        let name = label(value_bytes);
        group.bench_function(format!("{name}/split"), |b| {
            b.iter(|| split_replica(black_box(&segment), &replica, &index))
        });
        group.bench_function(format!("{name}/scan"), |b| {
            b.iter(|| scan(black_box(&segment)))
        });
        let mut copy = vec![0u8; segment.len()];
        group.bench_function(format!("{name}/memcpy"), |b| {
            b.iter(|| {
                copy.copy_from_slice(black_box(&segment));
                black_box(&copy);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, replica_split);
criterion_main!(benches);
