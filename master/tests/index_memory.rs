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

#[test]
fn an_indexed_object_costs_no_more_than_it_is_charged() {
    const OBJECTS: u64 = 200_000;
    let mut index = ObjectIndex::new();
    let before = ALLOCATED.load(Ordering::Relaxed);
    for i in 0..OBJECTS {
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
    }
    let per_object = (ALLOCATED.load(Ordering::Relaxed) - before) as f64 / OBJECTS as f64;
    assert_eq!(index.len(), OBJECTS);
    assert!(
        per_object <= INDEX_BYTES_PER_OBJECT as f64,
        "{per_object:.1} bytes per object, charged {INDEX_BYTES_PER_OBJECT}"
    );
    // And not wildly more is charged than spent.
    assert!(
        per_object >= INDEX_BYTES_PER_OBJECT as f64 * 0.6,
        "{per_object:.1} bytes per object, charged {INDEX_BYTES_PER_OBJECT}"
    );
}
