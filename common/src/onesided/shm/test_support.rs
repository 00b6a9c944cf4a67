//! What the `shm` tests share: frame files in a temporary directory, with a tag and slot
//! labels.

use super::frame_file::FrameFile;
use super::header::SlotLabel;
use crate::ids::{Epoch, SegmentId, ServerId};
use tempfile::TempDir;

pub(super) const CAPACITY: u32 = 64 * 1024;

/// The tag of the test files.
pub(super) const TAG: &str = "/data/of/a/backup";

pub(super) fn label() -> SlotLabel {
    labelled(1, 1, 1, CAPACITY)
}

pub(super) fn labelled(master: u64, segment: u64, epoch: u64, capacity: u32) -> SlotLabel {
    SlotLabel {
        master: ServerId(master),
        segment: SegmentId(segment),
        epoch: Epoch(epoch),
        capacity,
    }
}

pub(super) fn frame_file(dir: &TempDir, slots: usize, capacity: u32) -> FrameFile {
    FrameFile::create(&dir.path().join("frames"), slots, capacity, TAG).expect("create")
}
