//! Micro-benchmarks of the log format (`rampart_common::log`, docs/design.md §4) on whole
//! 8 MiB segments (the default segment size) of objects with 24-byte keys and values of
//! 100 B, 1 KiB and 10 KiB; throughput is in segment bytes.
//!
//! * `log_encode/<value>/append`: a `SegmentWriter` filled with objects, each write its
//!   own batch (`append_object` then `seal_batch`: the worst case, one write per batch),
//!   in a recycled buffer as the master's log does.
//! * `log_scan/<value>/scan`: `log::scan`, the valid-prefix scanner, over the closed
//!   segment; `log_scan/<value>/entries`: the walk of `log::entries` recovery makes
//!   after it.
//! * The floors, beside them in each group: `crc32` — CRC32 (`crc32fast`) of the same
//!   bytes, hashing every byte once. The writer and the scanner hash an object's payload
//!   for its own CRC and its bytes again for the segment's running CRC, except payloads
//!   of 2 KiB and more, which a CRC combine folds in instead. For encoding also
//!   `memcpy` — copying the same bytes into a buffer, as appending does.
//!
//! Run: `cargo bench -p rampart-common --bench log`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rampart_common::config::SEGMENT_BYTES_DEFAULT;
use rampart_common::ids::{SegmentId, ServerId, TableId, Version};
use rampart_common::log::{entries, scan, SegmentWriter};

/// Value sizes, in bytes.
const VALUE_SIZES: [usize; 3] = [100, 1024, 10 * 1024];

const TABLE: TableId = TableId(1);

/// Fills `buf` (recycled) as one segment of objects with `value`-byte values, one batch
/// per object; returns the writer, not closed.
fn fill(buf: Vec<u8>, value: &[u8]) -> SegmentWriter {
    let mut writer = SegmentWriter::open_in(
        buf,
        ServerId(1),
        SegmentId(7),
        SEGMENT_BYTES_DEFAULT,
        &[SegmentId(7)],
    )
    .unwrap_or_else(|_| panic!("an 8 MiB segment opens"));
    let mut key = *b"user00000000000000000000";
    for n in 1u64.. {
        key[4..].copy_from_slice(format!("{n:020}").as_bytes());
        if writer
            .append_object(TABLE, Version(n), &key, value)
            .is_err()
        {
            break;
        }
        writer.seal_batch();
    }
    writer
}

/// A closed segment of objects with `value_bytes`-byte values.
fn closed_segment(value_bytes: usize) -> Vec<u8> {
    let value = vec![0x5a; value_bytes];
    let mut writer = fill(Vec::with_capacity(SEGMENT_BYTES_DEFAULT as usize), &value);
    writer.close(SegmentId(8));
    writer.into_buffer()
}

fn label(value_bytes: usize) -> String {
    if value_bytes >= 1024 {
        format!("{}KiB", value_bytes / 1024)
    } else {
        format!("{value_bytes}B")
    }
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("log_encode");
    group.sample_size(20);
    for value_bytes in VALUE_SIZES {
        let value = vec![0x5a; value_bytes];
        let segment = closed_segment(value_bytes);
        group.throughput(Throughput::Bytes(segment.len() as u64));
        let name = label(value_bytes);
        let mut buf = Some(Vec::with_capacity(SEGMENT_BYTES_DEFAULT as usize));
        group.bench_function(format!("{name}/append"), |b| {
            b.iter(|| {
                let writer = fill(buf.take().unwrap_or_default(), &value);
                let len = writer.committed_len();
                buf = Some(writer.into_buffer());
                len
            })
        });
        group.bench_function(format!("{name}/crc32"), |b| {
            b.iter(|| crc32fast::hash(black_box(&segment)))
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

fn scanning(c: &mut Criterion) {
    let mut group = c.benchmark_group("log_scan");
    group.sample_size(20);
    for value_bytes in VALUE_SIZES {
        let segment = closed_segment(value_bytes);
        let found = scan(&segment);
        assert!(found.closed, "the segment scans to its footer");
        assert_eq!(found.valid_bytes as usize, segment.len());
        group.throughput(Throughput::Bytes(segment.len() as u64));
        let name = label(value_bytes);
        group.bench_function(format!("{name}/scan"), |b| {
            b.iter(|| scan(black_box(&segment)))
        });
        group.bench_function(format!("{name}/entries"), |b| {
            b.iter(|| entries(black_box(&segment), found.valid_bytes).count())
        });
        group.bench_function(format!("{name}/crc32"), |b| {
            b.iter(|| crc32fast::hash(black_box(&segment)))
        });
    }
    group.finish();
}

criterion_group!(benches, encode, scanning);
criterion_main!(benches);
