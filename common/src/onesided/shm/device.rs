//! The frame file mapped by others than its backup: [`ShmMapping`], a master's mapping
//! and its one-sided write (the `shm` transport), and [`DeviceMapping`], the backup's
//! second mapping for memory it hands to an RDMA device. "The module doc" below is the
//! `shm` overview (`mod.rs`).

use super::header::SLOT_HEADER_BYTES;
use super::mapping::{map_whole_file, populate_advice, Mapping, Populate};
use crate::ids::FrameHandle;
use crate::onesided::FrameWriteError;
use memmap2::Advice;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The unit in which a master's mapping is populated ahead of its writes (module doc).
pub const POPULATE_CHUNK_BYTES: u64 = 2 << 20;

/// A second read-write `MAP_SHARED` mapping of a whole frame file, its pages not
/// populated, for memory that this process hands to a device and never reads or writes
/// itself (the backup's RDMA registrations: `rampart_backup::rdma`). Two shared mappings
/// of one file share its page-cache pages, so what the device places through this one
/// is what [`FrameFile`] reads. Unmapped on drop.
///
/// [`FrameFile`]: super::frame_file::FrameFile
#[derive(Debug)]
pub struct DeviceMapping {
    map: Mapping,
}

impl DeviceMapping {
    /// Maps all of the frame file at `path`, which must be `expected_bytes` long (the
    /// file its [`FrameFile`] created and holds locked).
    ///
    /// [`FrameFile`]: super::frame_file::FrameFile
    pub fn open(path: &Path, expected_bytes: u64) -> io::Result<DeviceMapping> {
        let (_file, map) = map_whole_file(path, Populate::No)?;
        if map.len != expected_bytes {
            return Err(io::Error::other(format!(
                "frame file {} holds {} bytes, not {expected_bytes}",
                path.display(),
                map.len
            )));
        }
        Ok(DeviceMapping { map })
    }

    /// Start of the mapping (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.base()
    }

    /// Its length in bytes: the whole file, > 0.
    pub fn bytes(&self) -> usize {
        // `Mapping` invariant: its length fits in `usize`.
        self.map.len as usize
    }
}

/// A master's mapping of a backup's frame file: the `shm` transport. See the
/// [module doc](super).
#[derive(Debug)]
pub struct ShmMapping {
    path: PathBuf,
    map: Mapping,
    /// Per [`POPULATE_CHUNK_BYTES`] of the mapping: whether it was populated already.
    populated: Box<[AtomicBool]>,
    /// The `madvise` advice that populates it ([`populate_advice`]), if any.
    advice: Option<Advice>,
}

impl ShmMapping {
    /// Opens the frame file at `path` read-write and maps all of it (`MAP_SHARED`).
    pub fn open(path: &Path) -> io::Result<ShmMapping> {
        let (file, map) = map_whole_file(path, Populate::No)?;
        let len = map.len;
        let chunks = usize::try_from(len.div_ceil(POPULATE_CHUNK_BYTES)).unwrap_or(0);
        Ok(ShmMapping {
            path: path.to_path_buf(),
            map,
            populated: (0..chunks).map(|_| AtomicBool::new(false)).collect(),
            advice: populate_advice(&file),
        })
    }

    /// Maps in, once per chunk, the chunks of the mapping that bytes `at..at + len` fall
    /// in (module doc: "populated as it goes"). Best effort: a chunk the kernel cannot
    /// populate is left to fault in page by page.
    fn populate(&self, at: u64, len: u64) {
        let end = at.saturating_add(len).min(self.map.len);
        if at >= end {
            return;
        }
        let first = at / POPULATE_CHUNK_BYTES;
        let last = (end - 1) / POPULATE_CHUNK_BYTES;
        for chunk in first..=last {
            let Some(done) = usize::try_from(chunk)
                .ok()
                .and_then(|chunk| self.populated.get(chunk))
            else {
                return;
            };
            if done.swap(true, Ordering::Relaxed) {
                continue;
            }
            let start = chunk * POPULATE_CHUNK_BYTES;
            let len = POPULATE_CHUNK_BYTES.min(self.map.len - start);
            self.map.populate(start, len, self.advice);
        }
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes mapped (the file's size when opened).
    pub fn len_bytes(&self) -> u64 {
        self.map.len
    }

    /// Writes `bytes` at `offset` into the frame whose slot header is at `slot_offset`
    /// (of `slot_capacity` data bytes), if frame `owner` still holds the slot and it is
    /// not fenced; `Ok` means the write may be acknowledged. The protocol is the module
    /// doc's. `slot_offset`/`slot_capacity` come from the backup's `OpenReplica` reply
    /// and are checked against the mapping.
    pub fn write(
        &self,
        slot_offset: u64,
        slot_capacity: u32,
        owner: FrameHandle,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FrameWriteError> {
        self.populate(
            slot_offset
                .saturating_add(SLOT_HEADER_BYTES)
                .saturating_add(offset),
            bytes.len() as u64,
        );
        self.map
            .write_slot(slot_offset, slot_capacity, owner, offset, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onesided::shm::mapping::page_bytes;
    use crate::onesided::shm::test_support::{frame_file, label, labelled, CAPACITY};
    use tempfile::TempDir;

    #[test]
    fn a_device_mapping_covers_the_whole_frame_file_and_refuses_another_length() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        let path = dir.path().join("frames");
        let bytes = std::fs::metadata(&path).expect("metadata").len();
        let mapping = DeviceMapping::open(&path, bytes).expect("map");
        assert_eq!(mapping.bytes() as u64, bytes);
        assert!(DeviceMapping::open(&path, bytes + 4096).is_err());
        // A byte placed through the second mapping is the frame file's byte.
        let at = file.slot_offset(0) as usize;
        // SAFETY: `at` is inside the mapping (the first slot), and nothing else touches
        // the byte while the test runs.
        unsafe { mapping.as_ptr().add(at).write(0xA5) };
        let mut read = [0u8; 1];
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&path)
            .expect("open")
            .read_exact_at(&mut read, at as u64)
            .expect("read");
        assert_eq!(read, [0xA5]);
    }

    #[test]
    fn a_write_through_a_mapping_is_visible_in_the_frame_file() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 3, CAPACITY);
        file.assign(1, FrameHandle(42), label());
        let mapping = ShmMapping::open(file.path()).expect("map");
        assert_eq!(mapping.len_bytes(), file.slot_offset(3));
        let data: Vec<u8> = (0..100u8).collect();
        mapping
            .write(
                file.slot_offset(1),
                file.slot_capacity(),
                FrameHandle(42),
                10,
                &data,
            )
            .expect("write");
        let read = file.read(1, 200);
        assert_eq!(&read[10..110], &data[..]);
        assert!(read[..10].iter().chain(&read[110..]).all(|&b| b == 0));
        // Neighbouring slots are untouched.
        assert!(file.read(0, CAPACITY).iter().all(|&b| b == 0));
        assert!(file.read(2, CAPACITY).iter().all(|&b| b == 0));
        // The backup's own writers use the same protocol.
        file.write(1, FrameHandle(42), 0, b"head")
            .expect("in-process write");
        assert_eq!(&file.read(1, 4)[..], b"head");
        // Reads clamp to the capacity.
        assert_eq!(file.read(1, u32::MAX).len(), CAPACITY as usize);
    }

    #[test]
    fn writes_out_of_bounds_to_a_wrong_owner_or_a_fenced_slot_are_refused() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(0, FrameHandle(7), label());
        let mapping = ShmMapping::open(file.path()).expect("map");
        let at = file.slot_offset(0);
        let cap = file.slot_capacity();
        mapping
            .write(at, cap, FrameHandle(7), u64::from(CAPACITY) - 4, b"edge")
            .expect("fits exactly");
        for (offset, len) in [(u64::from(CAPACITY) - 3, 4), (u64::MAX, 1)] {
            let error = mapping
                .write(at, cap, FrameHandle(7), offset, &vec![1; len])
                .expect_err("past the end");
            assert!(
                matches!(error, FrameWriteError::OutOfBounds { capacity, .. } if capacity == u64::from(CAPACITY)),
                "{error:?}"
            );
        }
        // A slot outside the mapping, or misaligned, or claiming too much capacity.
        let total = mapping.len_bytes();
        for (slot_offset, capacity) in
            [(total, 0), (u64::MAX - 8, 16), (at + 4, 16), (at, u32::MAX)]
        {
            let error = mapping
                .write(slot_offset, capacity, FrameHandle(7), 0, b"x")
                .expect_err("bad slot");
            assert!(
                matches!(error, FrameWriteError::OutOfBounds { capacity: 0, .. }),
                "{slot_offset} {capacity}: {error:?}"
            );
        }
        assert!(matches!(
            file.write(2, FrameHandle(7), 0, b"x"),
            Err(FrameWriteError::OutOfBounds { capacity: 0, .. })
        ));
        // Wrong owner, free slot: nothing is copied.
        assert!(matches!(
            mapping.write(at, cap, FrameHandle(8), 0, b"thief"),
            Err(FrameWriteError::FrameGone)
        ));
        assert!(matches!(
            mapping.write(file.slot_offset(1), cap, FrameHandle(0), 0, b"free"),
            Err(FrameWriteError::FrameGone)
        ));
        assert!(file.read(0, 5).iter().all(|&b| b == 0));
        // Fenced: refused before copying.
        assert!(!file.is_fenced(0));
        file.fence(0);
        assert!(file.is_fenced(0));
        assert!(matches!(
            mapping.write(at, cap, FrameHandle(7), 0, b"late"),
            Err(FrameWriteError::Fenced)
        ));
        assert!(matches!(
            file.write(0, FrameHandle(7), 0, b"late"),
            Err(FrameWriteError::Fenced)
        ));
        assert!(file.read(0, 4).iter().all(|&b| b == 0));
        assert_eq!(file.owner(0), Some(FrameHandle(7)));
    }

    /// Minor page faults this thread has taken so far.
    #[cfg(target_os = "linux")]
    fn thread_minor_faults() -> i64 {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer; RUSAGE_THREAD needs nothing else.
        let result = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(result, 0, "getrusage");
        usage.ru_minflt
    }

    /// On a disk's file system (the temp directory) and, where there is one, in memory
    /// (`/dev/shm`, where frame files live): the two populate differently.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_masters_first_write_into_a_chunk_maps_all_of_it_in() {
        a_first_write_maps_its_chunk_in(TempDir::new().expect("tempdir"));
        if Path::new("/dev/shm").is_dir() {
            a_first_write_maps_its_chunk_in(TempDir::new_in("/dev/shm").expect("tempdir"));
        }
    }

    #[cfg(target_os = "linux")]
    fn a_first_write_maps_its_chunk_in(dir: TempDir) {
        let capacity = 4 << 20;
        let file = frame_file(&dir, 2, capacity);
        file.assign(1, FrameHandle(9), labelled(1, 1, 1, capacity));
        let mapping = ShmMapping::open(file.path()).expect("map");
        let (slot, page) = (file.slot_offset(1), page_bytes());
        // The slot's data, from its first whole chunk on (so that the writes below stay
        // inside one chunk of the mapping).
        let chunk_start = (slot + SLOT_HEADER_BYTES).next_multiple_of(POPULATE_CHUNK_BYTES);
        let offset = chunk_start - slot - SLOT_HEADER_BYTES;
        mapping
            .write(slot, capacity, FrameHandle(9), offset, &[1; 64])
            .expect("first write");
        // The rest of the chunk: every page of it is mapped in already.
        let rest = vec![2u8; (POPULATE_CHUNK_BYTES - page) as usize];
        let before = thread_minor_faults();
        mapping
            .write(slot, capacity, FrameHandle(9), offset + page, &rest)
            .expect("second write");
        let faults = thread_minor_faults() - before;
        let pages = rest.len() as u64 / page;
        assert!(
            faults < 8,
            "{faults} page faults writing {pages} pages of a chunk already populated in {}",
            dir.path().display()
        );
        assert_eq!(file.read(1, capacity)[(offset + page) as usize], 2);
    }
}
