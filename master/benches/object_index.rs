//! Micro-benchmark of the object index (`rampart_master::object_index::ObjectIndex`), the
//! master's (table, key) → log reference map, at a realistic size: one table of 1M
//! objects with 24-byte YCSB-style keys (`user` and 20 digits). The keys live in a 24 MB
//! arena standing in for the log, which the index's `key_of` closure reads as the
//! master reads its segments. Each operation's key and hash are read from a list in
//! random key order, sequentially, as a request brings them in (hashed once, outside
//! the index): the misses measured are the index's and the log's, not the harness's.
//!
//! * `insert_1M`: 1M upserts of new keys into an empty index, in log order (what a
//!   recovery master's replay does); the index's buckets split as it grows.
//! * `lookup_hit`, `lookup_miss`: point lookups of present and absent keys. A hit reads
//!   the key back from the arena (one more miss: the log entry).
//! * `locate`: the cleaner's liveness check (`ObjectIndex::locate`): the same bucket
//!   search (`Directory::find`) with no key compare.
//! * `upsert_existing`: an overwrite: the key is found and its reference replaced.
//! * The floors to compare the lookups with, both a load from a random place of a 48 MB
//!   array, the index's size (`INDEX_BYTES_PER_OBJECT` × 1M), so one cache and TLB
//!   miss: `floor_dependent_read`, each load's address the last one's value (a miss's
//!   full latency), and `floor_random_read`, independent loads (the processor overlaps
//!   their misses, as it may overlap those of successive lookups). The module doc
//!   reckons a lookup at two or three misses (directory entry, bucket header, slots),
//!   plus the key's in the log for a hit.
//!
//! Run: `cargo bench -p rampart-master --bench object_index`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rampart_common::ids::{key_hash, KeyHash, SegmentId, TableId};
use rampart_master::object_index::{LogRef, ObjectIndex, INDEX_BYTES_PER_OBJECT};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Objects in the index.
const OBJECTS: usize = 1_000_000;

/// Absent keys looked up.
const ABSENT: usize = 1 << 16;

const TABLE: TableId = TableId(1);

type Key = [u8; 24];

/// Key number `n`.
fn key(n: usize) -> Key {
    let mut key = [0u8; 24];
    key.copy_from_slice(format!("user{n:020}").as_bytes());
    key
}

/// Where object `i` lives: its place in the arena doubles as its log offset.
fn at(i: usize) -> LogRef {
    LogRef {
        segment: SegmentId(0),
        offset: i as u32,
    }
}

/// One operation's request: the key, its hash, and where the object is.
struct Probe {
    key: Key,
    hash: KeyHash,
    at: LogRef,
}

/// Probes of keys `numbers`, in a fixed random order.
fn probes(numbers: std::ops::Range<usize>, seed: u64) -> Vec<Probe> {
    let first = numbers.start;
    let mut probes: Vec<Probe> = numbers
        .map(|n| {
            let key = key(n);
            Probe {
                key,
                hash: key_hash(&key),
                at: at(n - first),
            }
        })
        .collect();
    probes.shuffle(&mut SmallRng::seed_from_u64(seed));
    probes
}

/// The index of every key of `log`, inserted in log order.
fn build(log: &[Key], hashes: &[KeyHash]) -> ObjectIndex {
    let key_of = |r: LogRef| &log[r.offset as usize][..];
    let mut index = ObjectIndex::new();
    for (i, (key, &hash)) in log.iter().zip(hashes).enumerate() {
        index.upsert(TABLE, hash, key, at(i), key_of);
    }
    index
}

fn object_index(c: &mut Criterion) {
    let log: Vec<Key> = (0..OBJECTS).map(key).collect();
    let hashes: Vec<KeyHash> = log.iter().map(|key| key_hash(key)).collect();
    let key_of = |r: LogRef| &log[r.offset as usize][..];

    let mut build_group = c.benchmark_group("object_index_build");
    build_group.sample_size(10);
    build_group.throughput(Throughput::Elements(OBJECTS as u64));
    build_group.bench_function("insert_1M", |b| {
        b.iter_with_large_drop(|| build(&log, &hashes))
    });
    build_group.finish();

    let mut index = build(&log, &hashes);
    assert_eq!(index.len(), OBJECTS as u64);
    let present = probes(0..OBJECTS, 1);
    let absent = probes(OBJECTS..OBJECTS + ABSENT, 2);
    let mut group = c.benchmark_group("object_index_1M");
    group.throughput(Throughput::Elements(1));
    let mut next = 0usize;
    group.bench_function("lookup_hit", |b| {
        b.iter(|| {
            let p = &present[next % OBJECTS];
            next += 1;
            index.lookup(TABLE, p.hash, &p.key, key_of)
        })
    });
    group.bench_function("lookup_miss", |b| {
        b.iter(|| {
            let p = &absent[next % ABSENT];
            next += 1;
            index.lookup(TABLE, p.hash, &p.key, key_of)
        })
    });
    group.bench_function("locate", |b| {
        b.iter(|| {
            let p = &present[next % OBJECTS];
            next += 1;
            index.locate(TABLE, p.hash, p.at)
        })
    });
    group.bench_function("upsert_existing", |b| {
        b.iter(|| {
            let p = &present[next % OBJECTS];
            next += 1;
            // The same reference again: the index stays as built, the work is the same.
            index.upsert(TABLE, p.hash, &p.key, p.at, key_of)
        })
    });
    // The floors: a 48 MB array, the index's size.
    let words = (INDEX_BYTES_PER_OBJECT as usize * OBJECTS) / 8;
    let mut memory: Vec<u64> = vec![0; words];
    // One word per object, 48 bytes apart, in the probes' random order.
    let places: Vec<usize> = present
        .iter()
        .map(|p| p.at.offset as usize * 6 % words)
        .collect();
    // The places linked into one random cycle (which also touches every page: untouched
    // ones would all read the one zero page): for `floor_dependent_read`, each load's
    // address is the last load's value, so no two misses overlap.
    for (k, &place) in places.iter().enumerate() {
        memory[place] = places[(k + 1) % OBJECTS] as u64;
    }
    group.bench_function("floor_random_read", |b| {
        b.iter(|| {
            let place = places[next % OBJECTS];
            next += 1;
            black_box(memory[place])
        })
    });
    let mut place = places[0];
    group.bench_function("floor_dependent_read", |b| {
        b.iter(|| {
            place = memory[place] as usize;
            place
        })
    });
    group.finish();
}

criterion_group!(benches, object_index);
criterion_main!(benches);
