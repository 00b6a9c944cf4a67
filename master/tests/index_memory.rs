//! `INDEX_BYTES_PER_OBJECT`, the memory one indexed object is charged, bounds what the
//! index really allocates: measured with a counting allocator (this test binary's own).

use rampart_common::ids::{key_hash, SegmentId, TableId};
use rampart_master::object_index::{LogRef, ObjectIndex, INDEX_BYTES_PER_OBJECT};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the counter only
// observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// The index's bytes per object, measured as it grows, at each size of `sizes`
/// (ascending).
fn bytes_per_object(sizes: &[u64]) -> Vec<(u64, f64)> {
    let mut index = ObjectIndex::new();
    let before = ALLOCATED.load(Ordering::Relaxed);
    let mut measured = Vec::new();
    let mut i = 0u64;
    for &size in sizes {
        while i < size {
            let key = format!("key-{i:012}");
            let at = LogRef {
                segment: SegmentId(1 + i / 10_000),
                offset: (i % 10_000) as u32,
            };
            // Distinct hashes: no key is compared.
            index.upsert(
                TableId(1),
                key_hash(key.as_bytes()),
                key.as_bytes(),
                at,
                |_| b"",
            );
            i += 1;
        }
        assert_eq!(index.len(), size);
        let spent = ALLOCATED.load(Ordering::Relaxed) - before;
        measured.push((size, spent as f64 / size as f64));
    }
    measured
}

#[test]
fn an_indexed_object_costs_no_more_than_it_is_charged() {
    // Sizes a factor 1.19 apart from 2,000 to 400,000: buckets split in waves, so the
    // cost per object swings with the size; this samples its highs and lows.
    let sizes: Vec<u64> = (0..31)
        .map(|k| (2_000.0 * 1.19f64.powi(k)) as u64)
        .collect();
    let measured = bytes_per_object(&sizes);
    for &(size, per_object) in &measured {
        println!("{size:>8} objects: {per_object:.1} bytes each");
        assert!(
            per_object <= INDEX_BYTES_PER_OBJECT as f64,
            "{per_object:.1} bytes per object at {size}, charged {INDEX_BYTES_PER_OBJECT}"
        );
    }
    // And not wildly more is charged than spent, on average.
    let mean = measured.iter().map(|(_, b)| b).sum::<f64>() / measured.len() as f64;
    assert!(
        mean >= INDEX_BYTES_PER_OBJECT as f64 * 0.6,
        "{mean:.1} bytes per object on average, charged {INDEX_BYTES_PER_OBJECT}"
    );
}
