//! `BufferPool`: large transient buffers kept for reuse, so that their pages are
//! faulted in once per process rather than once per use.
//!
//! A recovery moves every recovered byte through buffers of megabytes that live for
//! milliseconds: the recovery master receives each piece into a frame buffer, and copies
//! each replayed batch out of its log for replication. Handed back to glibc, such a
//! buffer was mostly not reused (most likely the long-lived small allocations made
//! meanwhile, the index's buckets above all, take pieces of the hole it leaves), so the
//! next one was carved from fresh memory that the kernel faults in and zeroes
//! (docs/benchmarks.md, "Fresh pages"). Buffers from a pool keep their memory: taken
//! ([`BufferPool::take`]), filled, frozen into [`Bytes`] ([`BufferPool::freeze`]), and
//! back in the pool when the last `Bytes` of them is dropped, wherever that happens.
//!
//! # Limits
//! A pool holds at most `buffers_max` buffers and `bytes_max` bytes of capacity; a
//! buffer given back beyond either is freed. Capacities are rounded up to a power of two
//! (at least [`POOLED_BYTES_MIN`]), so that buffers of slightly different sizes reuse
//! each other. Requests below [`POOLED_BYTES_MIN`] are not pooled: small buffers are
//! what the allocator serves well.
//!
//! # Concurrency
//! One `parking_lot` mutex around the free buffers, held for a scan of at most
//! `buffers_max` entries; taken once per large buffer, never across I/O.

use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::{Arc, LazyLock};

/// The smallest request a pool serves from its buffers; smaller ones get a plain `Vec`.
pub const POOLED_BYTES_MIN: usize = 64 * 1024;

/// Buffers the process-wide pool ([`shared`]) keeps: a recovery master's fetches in
/// flight and its replication batches, with room to spare.
pub const SHARED_BUFFERS_MAX: usize = 32;

/// Bytes of capacity the process-wide pool ([`shared`]) keeps at most.
pub const SHARED_BYTES_MAX: usize = 64 << 20;

/// The process-wide pool: the RPC layer's frame buffers and a master's replication
/// copies share it.
pub fn shared() -> &'static BufferPool {
    static SHARED: LazyLock<BufferPool> =
        LazyLock::new(|| BufferPool::new(SHARED_BUFFERS_MAX, SHARED_BYTES_MAX));
    &SHARED
}

/// Large buffers kept for reuse. See the module doc.
#[derive(Debug, Clone)]
pub struct BufferPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    buffers_max: usize,
    bytes_max: usize,
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    /// Empty buffers (length 0), any order.
    buffers: Vec<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

/// A buffer of a pool inside [`Bytes`]: back to its pool when dropped.
#[derive(Debug)]
struct Pooled {
    buffer: Vec<u8>,
    pool: Arc<Inner>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

impl BufferPool {
    /// A pool keeping at most `buffers_max` buffers and `bytes_max` bytes of capacity.
    pub fn new(buffers_max: usize, bytes_max: usize) -> BufferPool {
        BufferPool {
            inner: Arc::new(Inner {
                buffers_max,
                bytes_max,
                free: Mutex::new(Free::default()),
            }),
        }
    }

    /// An empty buffer with room for at least `len` bytes: the smallest free one that
    /// fits, else a new one (its capacity rounded up: module doc).
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len < POOLED_BYTES_MIN {
            return Vec::with_capacity(len);
        }
        let mut free = self.inner.free.lock();
        let best = free
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let buffer = free.buffers.swap_remove(i);
            free.bytes -= buffer.capacity();
            return buffer;
        }
        drop(free);
        Vec::with_capacity(len.next_power_of_two())
    }

    /// `buffer` as [`Bytes`]; the buffer comes back to this pool once the last of them
    /// (slices included) is dropped.
    pub fn freeze(&self, buffer: Vec<u8>) -> Bytes {
        if buffer.capacity() < POOLED_BYTES_MIN {
            return Bytes::from(buffer);
        }
        Bytes::from_owner(Pooled {
            buffer,
            pool: Arc::clone(&self.inner),
        })
    }

    /// A copy of `bytes` in a buffer of this pool.
    pub fn copy(&self, bytes: &[u8]) -> Bytes {
        let mut buffer = self.take(bytes.len());
        buffer.extend_from_slice(bytes);
        self.freeze(buffer)
    }

    /// Buffers free in the pool, and their capacity in bytes.
    pub fn free(&self) -> (usize, usize) {
        let free = self.inner.free.lock();
        (free.buffers.len(), free.bytes)
    }
}

impl Inner {
    fn give_back(&self, mut buffer: Vec<u8>) {
        let capacity = buffer.capacity();
        if capacity < POOLED_BYTES_MIN {
            return;
        }
        buffer.clear();
        let mut free = self.free.lock();
        if free.buffers.len() < self.buffers_max && free.bytes + capacity <= self.bytes_max {
            free.bytes += capacity;
            free.buffers.push(buffer);
        }
        // Else it is freed on return, after the lock is released (locals drop in the
        // reverse order of their declaration).
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_buffer_dropped_as_bytes_is_taken_again_with_its_memory() {
        let pool = BufferPool::new(4, 64 * MIB);
        let mut buffer = pool.take(MIB + 5);
        assert!(buffer.capacity() >= 2 * MIB, "rounded up to a power of two");
        buffer.extend_from_slice(&[7; 1000]);
        let address = buffer.as_ptr();
        let bytes = pool.freeze(buffer);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.free(), (0, 0), "a slice still holds it");
        assert_eq!(&slice[..], &[7; 10]);
        drop(slice);
        assert_eq!(pool.free(), (1, 2 * MIB));
        // A smaller request of the same class reuses it, emptied.
        let again = pool.take(MIB + 100);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty());
        assert_eq!(pool.free(), (0, 0));
    }

    #[test]
    fn the_smallest_free_buffer_that_fits_is_taken() {
        let pool = BufferPool::new(4, 64 * MIB);
        let small = pool.copy(&vec![1; POOLED_BYTES_MIN]);
        let large = pool.copy(&vec![2; 4 * MIB]);
        let (small_at, large_at) = (small.as_ptr(), large.as_ptr());
        drop((small, large));
        let (small, large) = (pool.take(POOLED_BYTES_MIN), pool.take(3 * MIB));
        assert_eq!((small.as_ptr(), large.as_ptr()), (small_at, large_at));
        // None fits: a new one.
        let pool = BufferPool::new(4, 64 * MIB);
        drop(pool.copy(&vec![1; POOLED_BYTES_MIN]));
        assert!(pool.take(MIB).capacity() >= MIB);
        assert_eq!(pool.free().0, 1);
    }

    #[test]
    fn the_pool_keeps_no_more_than_its_bounds() {
        let pool = BufferPool::new(2, 64 * MIB);
        let held: Vec<Bytes> = (0..3).map(|_| pool.copy(&vec![0; MIB + 1])).collect();
        drop(held);
        assert_eq!(pool.free(), (2, 4 * MIB), "the third was freed");

        let pool = BufferPool::new(8, 3 * MIB);
        let held: Vec<Bytes> = (0..3).map(|_| pool.copy(&vec![0; MIB + 1])).collect();
        drop(held);
        assert_eq!(
            pool.free(),
            (1, 2 * MIB),
            "a second 2 MiB buffer would pass 3 MiB"
        );
    }

    #[test]
    fn small_buffers_are_not_pooled() {
        let pool = BufferPool::new(4, 64 * MIB);
        let bytes = pool.copy(b"small");
        assert_eq!(&bytes[..], b"small");
        drop(bytes);
        assert_eq!(pool.free(), (0, 0));
        assert_eq!(pool.take(100).capacity(), 100);
    }
}
