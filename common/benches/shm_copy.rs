//! Micro-benchmark of the `shm` transport's one-sided write
//! (`rampart_common::onesided::shm::ShmMapping::write`): a master copying a write into
//! a backup's frame, mapped from the backup's frame file. Writes of 1 KiB (a small
//! object's batch), 64 KiB and 1 MiB (a replica catching up) go to successive offsets
//! of one 8 MiB frame, wrapping around, as a master appends to an open replica; the
//! first pass over the frame (the warm-up) populates the mapping, so the figures are
//! the steady state's, not the first touch's.
//!
//! The write protocol is two copies (body, then the tail holding the closing checksum)
//! with SeqCst fences between and after, and atomic checks of the slot's owner and
//! fence words before and after (module doc of `onesided::shm`). The floor beside it in
//! each group, `memcpy`, copies the same bytes to the same offsets of a plain 8 MiB
//! buffer: the difference is what the protocol costs.
//!
//! The frame file lives in a temporary directory in `/dev/shm` where there is one (as
//! the backups' default frame files do), else in the system's temporary directory.
//!
//! Run: `cargo bench -p rampart-common --bench shm_copy`.

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::onesided::shm::{FrameFile, ShmMapping, SlotLabel};

/// The frame's capacity: the default segment size.
const FRAME_BYTES: u32 = 8 * 1024 * 1024;

/// Write sizes, in bytes.
const WRITE_SIZES: [usize; 3] = [1024, 64 * 1024, 1024 * 1024];

const OWNER: FrameHandle = FrameHandle(1);

fn label(write_bytes: usize) -> String {
    if write_bytes >= 1024 * 1024 {
        format!("{}MiB", write_bytes / (1024 * 1024))
    } else {
        format!("{}KiB", write_bytes / 1024)
    }
}

fn shm_copy(c: &mut Criterion) {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap_or_else(|e| panic!("a temporary directory: {e}"));
    let file = FrameFile::create(&dir.path().join("frames"), 1, FRAME_BYTES, "bench")
        .unwrap_or_else(|e| panic!("the frame file: {e}"));
    file.assign(
        0,
        OWNER,
        SlotLabel {
            master: ServerId(1),
            segment: SegmentId(1),
            epoch: Epoch(1),
            capacity: FRAME_BYTES,
        },
    );
    let mapping = ShmMapping::open(file.path()).unwrap_or_else(|e| panic!("the mapping: {e}"));
    let (slot_offset, capacity) = (file.slot_offset(0), file.slot_capacity());

    let mut group = c.benchmark_group("shm_copy");
    for write_bytes in WRITE_SIZES {
        let bytes = vec![0x5a; write_bytes];
        let writes = FRAME_BYTES as usize / write_bytes;
        group.throughput(Throughput::Bytes(write_bytes as u64));
        let name = label(write_bytes);
        let mut next = 0usize;
        group.bench_function(format!("{name}/write"), |b| {
            b.iter(|| {
                let offset = (next % writes * write_bytes) as u64;
                next += 1;
                mapping.write(slot_offset, capacity, OWNER, offset, black_box(&bytes))
            })
        });
        let mut plain = vec![0u8; FRAME_BYTES as usize];
        group.bench_function(format!("{name}/memcpy"), |b| {
            b.iter(|| {
                let offset = next % writes * write_bytes;
                next += 1;
                plain[offset..offset + write_bytes].copy_from_slice(black_box(&bytes));
                black_box(&plain);
            })
        });
    }
    group.finish();
    // The file holds a slot: dropping it keeps the file (module doc); release the slot
    // so that it is removed with the directory.
    file.release(0);
}

criterion_group!(benches, shm_copy);
criterion_main!(benches);
