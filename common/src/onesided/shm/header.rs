//! The frame file's format (the `shm` module doc, "Layout"): the slot header's words,
//! the file header ([`FileHeader`]) that names the file's owner, and where each slot lies.
//! Pure layout, no mapping: every other file of `shm` reads and writes through these.
//! "The module doc" below is the `shm` overview (`mod.rs`).

use crate::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes of a slot's header: the fence word at +0, the owner at +8, the rest reserved.
/// The frame's data follows. A cache line, so the header words never share one with data.
pub const SLOT_HEADER_BYTES: u64 = 64;

/// Where the fence word lies in a slot header.
pub(super) const FENCE_WORD_OFFSET: u64 = 0;

/// Where the owner word lies in a slot header.
pub(super) const OWNER_WORD_OFFSET: u64 = 8;

/// Where the label words lie in a slot header ([`SlotLabel`], module doc "Layout").
pub(super) const MASTER_WORD_OFFSET: u64 = 16;
pub(super) const SEGMENT_WORD_OFFSET: u64 = 24;
pub(super) const EPOCH_WORD_OFFSET: u64 = 32;
pub(super) const CAPACITY_WORD_OFFSET: u64 = 40;
/// The fenced length plus one; 0 while none was recorded.
pub(super) const FENCED_LENGTH_WORD_OFFSET: u64 = 48;

/// The owner word of a *sealed* slot ([`SealedFrames`]): held, so a backup restarted on
/// the file reads it back, but by no frame, so every write to it fails its owner check.
/// No frame has this handle: backups draw their first handle below 2^62 and count up by
/// one (and [`FrameFile::assign`] refuses it).
///
/// [`SealedFrames`]: super::sealed::SealedFrames
/// [`FrameFile::assign`]: super::frame_file::FrameFile::assign
pub const SEALED_OWNER: FrameHandle = FrameHandle(u64::MAX);

/// First bytes of every frame file.
const FILE_MAGIC: [u8; 8] = *b"RMPFRAME";

/// Version of the frame file format of the module doc. Files of another version are
/// unreadable to this one (version 1 had no file header and no slot labels).
const FILE_FORMAT_VERSION: u32 = 2;

/// Bytes of the file header before the tag.
pub(super) const FILE_HEADER_FIXED_BYTES: u64 = 64;

/// Alignment the header words need (`AtomicU64`), hence of every slot offset.
pub(super) const WORD_ALIGN_BYTES: u64 = 8;

/// Largest frame file, in bytes: the file is sparse and costs only address space until
/// written, but a misconfigured `slots × capacity` should fail at start-up with a clear
/// error rather than reserve absurd amounts of it (1 TiB holds 131072 frames of 8 MiB).
pub const FRAME_FILE_BYTES_MAX: u64 = 1 << 40;

const _: () = assert!(OWNER_WORD_OFFSET + 8 <= SLOT_HEADER_BYTES);
const _: () = assert!(FENCED_LENGTH_WORD_OFFSET + 8 <= SLOT_HEADER_BYTES);
const _: () = assert!(FENCE_WORD_OFFSET % WORD_ALIGN_BYTES == 0);
const _: () = assert!(OWNER_WORD_OFFSET % WORD_ALIGN_BYTES == 0);
const _: () = assert!(SLOT_HEADER_BYTES % WORD_ALIGN_BYTES == 0);

/// What a slot's header says of the frame it holds (module doc "Layout"): enough for a
/// backup restarted after a kill to tell which replica the bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLabel {
    /// The master whose log the frame copies.
    pub master: ServerId,
    /// The segment of that log.
    pub segment: SegmentId,
    /// The frame's epoch (Tailwind).
    pub epoch: Epoch,
    /// The frame's capacity in bytes (≤ the slot's).
    pub capacity: u32,
}

/// Byte offset of slot `slot`'s header in a file of `stride`-byte slots after a
/// `page`-byte file header (saturating past the end).
pub(super) fn slot_offset(page: u64, stride: u64, slot: usize) -> u64 {
    (slot as u64).saturating_mul(stride).saturating_add(page)
}

/// A frame file's header (module doc "Layout").
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FileHeader {
    pub(super) slots: usize,
    pub(super) slot_capacity: u32,
    pub(super) stride: u64,
    pub(super) tag: String,
}

impl FileHeader {
    /// The header's bytes: at most a page (the tag's length is checked by the caller).
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(FILE_HEADER_FIXED_BYTES as usize + self.tag.len());
        bytes.extend_from_slice(&FILE_MAGIC);
        bytes.extend_from_slice(&FILE_FORMAT_VERSION.to_ne_bytes());
        bytes.extend_from_slice(&(self.tag.len() as u32).to_ne_bytes());
        bytes.extend_from_slice(&(self.slots as u64).to_ne_bytes());
        bytes.extend_from_slice(&u64::from(self.slot_capacity).to_ne_bytes());
        bytes.extend_from_slice(&self.stride.to_ne_bytes());
        bytes.resize(FILE_HEADER_FIXED_BYTES as usize, 0);
        bytes.extend_from_slice(self.tag.as_bytes());
        bytes
    }

    /// Reads and checks the header of `file` (whose first `page` bytes hold it); the
    /// error says why it is not a frame file of this format.
    pub(super) fn read(file: &File, page: u64) -> Result<FileHeader, String> {
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if len < page {
            return Err(format!("{len} bytes: shorter than its header"));
        }
        let mut bytes = vec![0u8; page as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| format!("cannot read its header: {e}"))?;
        let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        if bytes[..8] != FILE_MAGIC {
            return Err("no frame file magic".to_string());
        }
        let version = u32_at(8);
        if version != FILE_FORMAT_VERSION {
            return Err(format!(
                "format version {version}, not {FILE_FORMAT_VERSION}"
            ));
        }
        let tag_len = u64::from(u32_at(12));
        if tag_len > page - FILE_HEADER_FIXED_BYTES {
            return Err(format!("a tag of {tag_len} bytes"));
        }
        let start = FILE_HEADER_FIXED_BYTES as usize;
        let tag = std::str::from_utf8(&bytes[start..start + tag_len as usize])
            .map_err(|_| "a tag that is not UTF-8".to_string())?
            .to_string();
        let header = FileHeader {
            slots: usize::try_from(u64_at(16)).unwrap_or(usize::MAX),
            slot_capacity: u32::try_from(u64_at(24)).unwrap_or(u32::MAX),
            stride: u64_at(32),
            tag,
        };
        let sane = header.stride % page == 0
            && header.stride >= SLOT_HEADER_BYTES + u64::from(header.slot_capacity)
            && header.slots > 0;
        if !sane || header.file_bytes(page) != len {
            return Err(format!(
                "{} slots of {} bytes at a stride of {} do not make its {len} bytes",
                header.slots, header.slot_capacity, header.stride
            ));
        }
        Ok(header)
    }

    /// The file's size: the header's page, then the slots (saturating).
    pub(super) fn file_bytes(&self, page: u64) -> u64 {
        slot_offset(page, self.stride, self.slots)
    }
}
