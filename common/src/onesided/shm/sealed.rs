//! [`SealedFrames`]: a graceful stop's seal on its backup's frame file, so that nothing
//! written after the flush is acknowledged, then the file's release and removal (the
//! `shm` module doc, "A file outlives its backup only while a cold start needs it").
//! "The module doc" below is the `shm` overview (`mod.rs`).

use super::header::{slot_offset, FileHeader, OWNER_WORD_OFFSET, SEALED_OWNER};
use super::left_behind::same_file;
use super::mapping::{map_whole_file, page_bytes, Mapping, Populate};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{self, AtomicU64, Ordering};

/// A graceful stop's hold on its backup's own frame file, by path: the file's held slots
/// sealed, so that nothing written to them after [`SealedFrames::seal`] is ever
/// acknowledged (module doc, "A file outlives its backup only while a cold start needs
/// it"). The stopping server writes the open frames to its store, then either
/// [`releases`](SealedFrames::release) the sealed slots and
/// [`removes`](SealedFrames::remove) the file, or keeps it as it is for the restart.
///
/// It maps the file a second time (as a master does) rather than going through the
/// backup's [`FrameFile`]: the server that stops holds the backup, not its file, and
/// touches only the owner words, which every process accesses atomically.
///
/// [`FrameFile`]: super::frame_file::FrameFile
#[derive(Debug)]
pub struct SealedFrames {
    /// As given to [`SealedFrames::seal`].
    path: PathBuf,
    /// The file mapped, to tell it from another at the same path before removing it.
    file: File,
    map: Mapping,
    header: FileHeader,
    page_bytes: u64,
    /// Slots held when sealed (each now [`SEALED_OWNER`] unless released since).
    sealed: Vec<usize>,
}

impl SealedFrames {
    /// Seals every held slot of the frame file at `path`: its owner word becomes
    /// [`SEALED_OWNER`], then a SeqCst fence. From then on no write to those slots is
    /// acknowledged by any writer that checks the owner word (`shm`, `rpc`, `tcp`; not
    /// `rdma`, whose NIC does not), and every write acknowledged before is visible to a
    /// read after this returns. Call it on the file of a backup that serves no more
    /// requests (an open after this would hand out a slot unsealed). Errors are the
    /// operating system's, or `InvalidData` for a file that is not a frame file of this
    /// format.
    pub fn seal(path: &Path) -> io::Result<SealedFrames> {
        let (file, map) = map_whole_file(path, Populate::No)?;
        let page = page_bytes();
        let header = FileHeader::read(&file, page).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame file {}: {why}", path.display()),
            )
        })?;
        let mut frames = SealedFrames {
            path: path.to_path_buf(),
            file,
            map,
            header,
            page_bytes: page,
            sealed: Vec::new(),
        };
        let mut held = Vec::new();
        for slot in 0..frames.header.slots {
            let word = frames.owner_word(slot);
            // The swap, not a store: a slot released meanwhile (a close ending) stays free.
            let mut owner = word.load(Ordering::SeqCst);
            while owner != 0 {
                match word.compare_exchange(
                    owner,
                    SEALED_OWNER.0,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => {
                        held.push(slot);
                        break;
                    }
                    Err(now) => owner = now,
                }
            }
        }
        // Dekker with the writers' final check (module doc, "Write protocol", step 4):
        // the owner words before this fence, the caller's reads of the data after it.
        atomic::fence(Ordering::SeqCst);
        frames.sealed = held;
        Ok(frames)
    }

    /// The owner word of `slot`. `FileHeader::read` checked that the file, hence the
    /// mapping, is as long as its slots.
    fn owner_word(&self, slot: usize) -> &AtomicU64 {
        let at = slot_offset(self.page_bytes, self.header.stride, slot) + OWNER_WORD_OFFSET;
        self.map
            .word(at)
            .expect("every slot lies inside the mapping: the header matched the file's length")
    }

    /// How many slots were held when sealed.
    pub fn count(&self) -> usize {
        self.sealed.len()
    }

    /// Frees the sealed slots (owner word [`SEALED_OWNER`] → 0): call it once every
    /// frame they held is in the store, and nothing else. A slot whose owner changed
    /// since it was sealed is left as it is.
    pub fn release(&self) {
        for &slot in &self.sealed {
            let _ = self.owner_word(slot).compare_exchange(
                SEALED_OWNER.0,
                0,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    /// Whether any slot of the file is held (sealed or not): then a restarted backup
    /// would read it back, and the file must stay.
    pub fn holds_frames(&self) -> bool {
        (0..self.header.slots).any(|slot| self.owner_word(slot).load(Ordering::SeqCst) != 0)
    }

    /// Removes the file if no slot is held and the path still names the file sealed;
    /// whether it did. A master that still maps the file keeps its pages until it
    /// unmaps them; its writes fail their owner check.
    pub fn remove(self) -> io::Result<bool> {
        if self.holds_frames() || !same_file(&self.file, &self.path) {
            return Ok(false);
        }
        std::fs::remove_file(&self.path)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::FrameHandle;
    use crate::onesided::shm::device::ShmMapping;
    use crate::onesided::shm::frame_file::FrameFile;
    use crate::onesided::shm::left_behind::{LeftBehind, LeftSlot};
    use crate::onesided::shm::test_support::{frame_file, label, labelled, CAPACITY, TAG};
    use crate::onesided::FrameWriteError;
    use tempfile::TempDir;

    #[test]
    fn a_sealed_slot_refuses_every_writer_and_the_released_file_is_removed() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 3, CAPACITY);
        file.assign(0, FrameHandle(7), label());
        file.assign(1, FrameHandle(8), labelled(1, 2, 1, CAPACITY));
        file.assign(2, FrameHandle(9), labelled(1, 3, 1, CAPACITY));
        file.release(2);
        let mapping = ShmMapping::open(file.path()).expect("map");
        let (at, capacity) = (file.slot_offset(0), file.slot_capacity());
        mapping
            .write(at, capacity, FrameHandle(7), 0, b"before")
            .expect("an open frame takes writes");

        let sealed = SealedFrames::seal(file.path()).expect("seal");
        assert_eq!(sealed.count(), 2, "the held slots, not the free one");
        assert!(
            matches!(
                mapping.write(at, capacity, FrameHandle(7), 6, b"after"),
                Err(FrameWriteError::FrameGone)
            ),
            "a master's write after the seal"
        );
        assert!(
            matches!(
                file.write(1, FrameHandle(8), 0, b"after"),
                Err(FrameWriteError::FrameGone)
            ),
            "the backup's own writer after the seal"
        );
        assert_eq!(&file.read(0, 6)[..], b"before");
        assert!(sealed.holds_frames());

        sealed.release();
        assert!(!sealed.holds_frames());
        let path = file.path().to_path_buf();
        assert!(sealed.remove().expect("remove"), "nothing held: removed");
        assert!(!path.exists());
        // A new backup's file at the path outlives the old one's drop.
        let next = FrameFile::create(&path, 1, CAPACITY, TAG).expect("create again");
        drop(file);
        assert!(path.exists(), "the old file's drop left the new one alone");
        drop(next);
        assert!(!path.exists());
    }

    #[test]
    fn a_sealed_file_not_released_stays_and_is_read_back_whole() {
        let dir = TempDir::new().expect("tempdir");
        let file = frame_file(&dir, 2, CAPACITY);
        file.assign(1, FrameHandle(11), labelled(3, 4, 2, 1000));
        file.write(1, FrameHandle(11), 0, b"segment four")
            .expect("write");
        let sealed = SealedFrames::seal(file.path()).expect("seal");
        assert!(!sealed.remove().expect("remove"), "a held slot keeps it");
        let path = file.path().to_path_buf();
        drop(file);
        assert!(path.exists(), "sealed frames are frames: the file stays");
        let LeftBehind::Frames(left) = FrameFile::read_back(&path, TAG).expect("read") else {
            panic!("our frames");
        };
        let held = left.held();
        assert_eq!(
            held,
            vec![LeftSlot {
                slot: 1,
                owner: SEALED_OWNER,
                label: labelled(3, 4, 2, 1000),
                fenced: false,
                fenced_length: None,
            }]
        );
        assert_eq!(&left.read(&held[0])[..12], b"segment four");
    }
}
