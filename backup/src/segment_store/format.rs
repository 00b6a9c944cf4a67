//! The store's layout on disk and its replica file format (the `segment_store` module
//! doc, "Layout on disk"): the directories and file names, the header that carries a
//! replica's [`ReplicaMeta`], and the verification of a file against its name, header
//! and checksums ([`Corruption`] says what failed). [`ReplicaFiles`] names a stored
//! replica's file so that it can be read and verified without the store
//! ([`ReplicaFile`]).

use rampart_common::config::SEGMENT_BYTES_MAX;
use rampart_common::ids::{Epoch, SegmentId, ServerId};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest replica content the store accepts, in bytes: one whole segment of the largest
/// size a master may be configured with (lengths are u32 on disk).
pub const REPLICA_BYTES_MAX: u32 = 256 * 1024 * 1024;

// Every segment a master may use must fit in one replica.
const _: () = assert!(REPLICA_BYTES_MAX >= SEGMENT_BYTES_MAX);

/// Bytes of the fixed header in front of a replica's content.
pub const HEADER_BYTES: usize = 49;

/// First bytes of every replica file.
const MAGIC: [u8; 8] = *b"RMPTREPL";

/// Version of the replica file format described in the `segment_store` module doc.
const FORMAT_VERSION: u32 = 1;

/// Offset of the header's own CRC: it covers every header byte before it.
const HEADER_CRC_OFFSET: usize = HEADER_BYTES - 4;

/// Chunk size for checksumming replicas at open without holding a whole one in memory:
/// large enough for sequential disk reads, small enough to be negligible beside frames.
const SCAN_CHUNK_BYTES: usize = 1024 * 1024;

pub(super) const REPLICAS_DIR: &str = "replicas";
pub(super) const QUARANTINE_DIR: &str = "quarantine";
pub(super) const LOCK_FILE: &str = "LOCK";
pub(super) const REPLICA_SUFFIX: &str = ".replica";
pub(super) const TEMP_SUFFIX: &str = ".tmp";

/// Facts about one stored replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaMeta {
    /// The master whose log the segment belongs to.
    pub master: ServerId,
    /// The segment of that master's log.
    pub segment: SegmentId,
    /// The replica's epoch (Tailwind): bumped by the master when it re-creates a lost
    /// replica of its open segment, so older copies can be told apart.
    pub epoch: Epoch,
    /// Content bytes.
    pub length: u32,
    /// Whether the segment was closed (its footer written) when this was stored.
    pub closed: bool,
    /// CRC32 of the content.
    pub content_crc32: u32,
}

impl ReplicaMeta {
    /// Whether a `FreeReplica` bounded by `epoch_max` spares this copy: it is newer, a
    /// replacement placed after the free was decided (`StoreHandle::free`; the
    /// simulation's store keeps the rule by calling this).
    pub fn outlives_free(&self, epoch_max: Epoch) -> bool {
        self.epoch > epoch_max
    }
}

/// Why a file in the store is not a valid replica.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// The name is not `m{master}-s{segment}.replica` (nor the temp name of one).
    #[error("file name is not m{{master}}-s{{segment}}{REPLICA_SUFFIX}")]
    BadName,
    /// A directory, symlink or other non-regular file.
    #[error("not a regular file")]
    NotAFile,
    /// The file could not be read at all.
    #[error("unreadable: {error}")]
    Unreadable {
        /// The I/O error, as text.
        error: String,
    },
    /// Shorter than the fixed header.
    #[error("{file_bytes} bytes: shorter than the {HEADER_BYTES}-byte header")]
    HeaderTruncated {
        /// Size of the file.
        file_bytes: u64,
    },
    /// The magic bytes are wrong.
    #[error("bad magic")]
    BadMagic,
    /// A format version this build does not read (moved aside, not deleted, so a newer
    /// build can still use it).
    #[error("unsupported format version {version}")]
    UnsupportedVersion {
        /// Version in the header.
        version: u32,
    },
    /// The header's own CRC does not match.
    #[error("header checksum {stored:#010x} does not match {computed:#010x}")]
    HeaderChecksum {
        /// CRC in the header.
        stored: u32,
        /// CRC of the header bytes.
        computed: u32,
    },
    /// A header field has an impossible value (with an intact header CRC: a bug in
    /// whatever wrote it).
    #[error("impossible header field: {field}")]
    BadField {
        /// Which field.
        field: &'static str,
    },
    /// The header names another replica than the file name does.
    #[error("header is for {master}/{segment}, not the replica the file name says")]
    NameMismatch {
        /// Master in the header.
        master: ServerId,
        /// Segment in the header.
        segment: SegmentId,
    },
    /// The file is not header + length bytes long: truncated or with trailing bytes.
    #[error("{file_bytes} bytes where the header says {expected_bytes}")]
    WrongSize {
        /// Size of the file.
        file_bytes: u64,
        /// Header plus content length.
        expected_bytes: u64,
    },
    /// The content's CRC does not match the header.
    #[error("content checksum {computed:#010x} does not match the stored {stored:#010x}")]
    ContentChecksum {
        /// CRC in the header.
        stored: u32,
        /// CRC of the content bytes.
        computed: u32,
    },
    /// The file verifies, but is not the replica this store wrote there (changed behind
    /// the store's back since it was indexed).
    #[error("file holds epoch {epoch}, {length} bytes; the store wrote another replica")]
    Replaced {
        /// Epoch in the file.
        epoch: Epoch,
        /// Length in the file.
        length: u32,
    },
}

/// (master, segment): the key of a replica.
pub(super) type ReplicaKey = (ServerId, SegmentId);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NameKind {
    Replica,
    Temp,
}

/// Parses `m{master}-s{segment}.replica` (or a temp name: `m{master}-s{segment}.replica.{n}.tmp`,
/// or `m{master}-s{segment}.replica.tmp` as written before temp files were numbered).
/// Only canonical decimal is accepted, so that no two names denote one replica.
pub(super) fn parse_name(name: &OsStr) -> Option<(ReplicaKey, NameKind)> {
    let name = name.to_str()?;
    let (stem, kind) = match name.strip_suffix(TEMP_SUFFIX) {
        Some(stem) => {
            let unnumbered = match stem.rsplit_once('.') {
                Some((rest, number)) if canonical_u64(number).is_some() => rest,
                _ => stem,
            };
            (unnumbered.strip_suffix(REPLICA_SUFFIX)?, NameKind::Temp)
        }
        None => (name.strip_suffix(REPLICA_SUFFIX)?, NameKind::Replica),
    };
    let (master, segment) = stem.strip_prefix('m')?.split_once("-s")?;
    Some((
        (
            ServerId(canonical_u64(master)?),
            SegmentId(canonical_u64(segment)?),
        ),
        kind,
    ))
}

fn canonical_u64(text: &str) -> Option<u64> {
    let value: u64 = text.parse().ok()?;
    (value.to_string() == text).then_some(value)
}

pub(super) fn encode_header(meta: &ReplicaMeta) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[0..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&meta.master.0.to_le_bytes());
    header[20..28].copy_from_slice(&meta.segment.0.to_le_bytes());
    header[28..36].copy_from_slice(&meta.epoch.0.to_le_bytes());
    header[36..40].copy_from_slice(&meta.length.to_le_bytes());
    header[40] = u8::from(meta.closed);
    header[41..45].copy_from_slice(&meta.content_crc32.to_le_bytes());
    let crc = crc32fast::hash(&header[..HEADER_CRC_OFFSET]);
    header[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Decodes and checks a header on its own; the content is checked by the caller.
fn decode_header(header: &[u8; HEADER_BYTES]) -> Result<ReplicaMeta, Corruption> {
    let u32_at = |at: usize| {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(&header[at..at + 4]);
        u32::from_le_bytes(bytes)
    };
    let u64_at = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    if header[0..8] != MAGIC {
        return Err(Corruption::BadMagic);
    }
    let version = u32_at(8);
    if version != FORMAT_VERSION {
        return Err(Corruption::UnsupportedVersion { version });
    }
    let stored = u32_at(HEADER_CRC_OFFSET);
    let computed = crc32fast::hash(&header[..HEADER_CRC_OFFSET]);
    if stored != computed {
        return Err(Corruption::HeaderChecksum { stored, computed });
    }
    let length = u32_at(36);
    if length > REPLICA_BYTES_MAX {
        return Err(Corruption::BadField { field: "length" });
    }
    let closed = match header[40] {
        0 => false,
        1 => true,
        _ => return Err(Corruption::BadField { field: "closed" }),
    };
    Ok(ReplicaMeta {
        master: ServerId(u64_at(12)),
        segment: SegmentId(u64_at(20)),
        epoch: Epoch(u64_at(28)),
        length,
        closed,
        content_crc32: u32_at(41),
    })
}

pub(super) fn replica_path(replicas_dir: &Path, master: ServerId, segment: SegmentId) -> PathBuf {
    replicas_dir.join(format!("m{}-s{}{REPLICA_SUFFIX}", master.0, segment.0))
}

/// The replicas directory of a [`SegmentStore`](super::store::SegmentStore)
/// ([`SegmentStore::files`](super::store::SegmentStore::files)): names the
/// file of a replica whose metadata the caller learnt from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFiles {
    pub(super) replicas_dir: PathBuf,
}

impl ReplicaFiles {
    /// The file that holds the replica `meta` describes, if the store still does.
    pub fn file(&self, meta: ReplicaMeta) -> ReplicaFile {
        ReplicaFile {
            path: replica_path(&self.replicas_dir, meta.master, meta.segment),
            meta,
        }
    }
}

/// A stored replica's file and the metadata it must verify to, named by
/// [`ReplicaFiles::file`] so that it can be read with no lock held: a recovery
/// reading gigabytes must not wait behind closes that hold the store across their disk
/// writes (measured: readers spent 4× longer waiting for the lock than reading).
///
/// Safe because a replica file is never changed in place: a write goes to a temporary
/// file renamed over the path, a free unlinks it. So the read sees the replica `meta`
/// describes, or a file that no longer verifies to `meta` (replaced,
/// gone), or — rarely — a corrupt one; those are `None`, and the caller asks the store
/// itself ([`SegmentStore::read_replica`](super::store::SegmentStore::read_replica), under its lock), which tells them apart and
/// quarantines a corrupt file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFile {
    pub(super) path: PathBuf,
    meta: ReplicaMeta,
}

impl ReplicaFile {
    /// The replica's verified content if its file holds the replica `meta` describes;
    /// `None` otherwise (see the type's doc). Blocks on the disk. Recovery reads use
    /// `read_into`, reusing one buffer.
    #[cfg(test)]
    pub fn read(&self) -> Option<Vec<u8>> {
        let mut content = Vec::new();
        self.read_into(&mut content).then_some(content)
    }

    /// Reads the replica's verified content into `content` (its old bytes replaced, its
    /// allocation reused) if its file holds the replica `meta` describes (see the type's
    /// doc); whether it did. On `false` the content is unspecified. Blocks on the disk.
    pub fn read_into(&self, content: &mut Vec<u8>) -> bool {
        let key = (self.meta.master, self.meta.segment);
        matches!(verify_file(&self.path, key, Some(content)), Ok(meta) if meta == self.meta)
    }

    /// The replica's metadata.
    pub fn meta(&self) -> ReplicaMeta {
        self.meta
    }
}

/// Why `verify_file` failed: the file's content, or the reading of it.
#[derive(Debug)]
pub(super) enum Verify {
    Corrupt(Corruption),
    Io(io::Error),
}

impl From<io::Error> for Verify {
    fn from(error: io::Error) -> Self {
        Verify::Io(error)
    }
}

/// Reads and verifies the replica file at `path`, expected to hold replica `key`:
/// header, size, ids, content CRC. With `content`, the content is left there; without,
/// it is checksummed in chunks and dropped.
pub(super) fn verify_file(
    path: &Path,
    key: ReplicaKey,
    content: Option<&mut Vec<u8>>,
) -> Result<ReplicaMeta, Verify> {
    let mut file = File::open(path)?;
    let file_bytes = file.metadata()?.len();
    if file_bytes < HEADER_BYTES as u64 {
        return Err(Verify::Corrupt(Corruption::HeaderTruncated { file_bytes }));
    }
    let mut header = [0u8; HEADER_BYTES];
    file.read_exact(&mut header)?;
    let meta = decode_header(&header).map_err(Verify::Corrupt)?;
    if (meta.master, meta.segment) != key {
        return Err(Verify::Corrupt(Corruption::NameMismatch {
            master: meta.master,
            segment: meta.segment,
        }));
    }
    let expected_bytes = HEADER_BYTES as u64 + u64::from(meta.length);
    if file_bytes != expected_bytes {
        return Err(Verify::Corrupt(Corruption::WrongSize {
            file_bytes,
            expected_bytes,
        }));
    }
    let length = meta.length as usize;
    let computed = match content {
        Some(content) => {
            // Read into the vector's spare room: zeroing it first (`resize`) would write
            // every byte once more before the read does (a recovery reads every replica
            // it serves through here).
            content.clear();
            content.reserve_exact(length);
            let read = (&mut file).take(length as u64).read_to_end(content)?;
            if read != length {
                return Err(Verify::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file ended {} bytes into its {length}-byte content",
                        read
                    ),
                )));
            }
            crc32fast::hash(content)
        }
        None => {
            let mut hasher = crc32fast::Hasher::new();
            let mut chunk = vec![0u8; SCAN_CHUNK_BYTES.min(length)];
            let mut left = length;
            while left > 0 {
                let n = chunk.len().min(left);
                file.read_exact(&mut chunk[..n])?;
                hasher.update(&chunk[..n]);
                left -= n;
            }
            hasher.finalize()
        }
    };
    if computed != meta.content_crc32 {
        return Err(Verify::Corrupt(Corruption::ContentChecksum {
            stored: meta.content_crc32,
            computed,
        }));
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fs;
    use tempfile::TempDir;

    #[test]
    fn header_layout_is_pinned() {
        let meta = ReplicaMeta {
            master: ServerId(0x0102_0304_0506_0708),
            segment: SegmentId(9),
            epoch: Epoch(10),
            length: 0x0B0C,
            closed: true,
            content_crc32: 0xDEAD_BEEF,
        };
        let header = encode_header(&meta);
        assert_eq!(&header[0..8], b"RMPTREPL");
        assert_eq!(header[8..12], [1, 0, 0, 0]);
        assert_eq!(header[12..20], [8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(header[20..28], [9, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(header[28..36], [10, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(header[36..40], [0x0C, 0x0B, 0, 0]);
        assert_eq!(header[40], 1);
        assert_eq!(header[41..45], [0xEF, 0xBE, 0xAD, 0xDE]);
        assert_eq!(header[45..49], crc32fast::hash(&header[..45]).to_le_bytes());
        assert_eq!(decode_header(&header), Ok(meta));
    }

    #[test]
    fn decode_header_rejects_impossible_fields_under_a_valid_checksum() {
        let meta = ReplicaMeta {
            master: ServerId(1),
            segment: SegmentId(1),
            epoch: Epoch(1),
            length: 1,
            closed: false,
            content_crc32: 0,
        };
        let reseal = |mut header: [u8; HEADER_BYTES]| {
            let crc = crc32fast::hash(&header[..HEADER_CRC_OFFSET]);
            header[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
            header
        };
        let mut header = encode_header(&meta);
        header[40] = 2;
        assert_eq!(
            decode_header(&reseal(header)),
            Err(Corruption::BadField { field: "closed" })
        );
        let mut header = encode_header(&meta);
        header[36..40].copy_from_slice(&(REPLICA_BYTES_MAX + 1).to_le_bytes());
        assert_eq!(
            decode_header(&reseal(header)),
            Err(Corruption::BadField { field: "length" })
        );
        let mut header = encode_header(&meta);
        header[8] = 2;
        assert_eq!(
            decode_header(&header),
            Err(Corruption::UnsupportedVersion { version: 2 })
        );
        let mut header = encode_header(&meta);
        header[0] = b'X';
        assert_eq!(decode_header(&header), Err(Corruption::BadMagic));
    }

    #[test]
    fn parse_name_accepts_only_canonical_replica_names() {
        let key = (ServerId(12), SegmentId(0));
        assert_eq!(
            parse_name(OsStr::new("m12-s0.replica")),
            Some((key, NameKind::Replica))
        );
        assert_eq!(
            parse_name(OsStr::new("m12-s0.replica.tmp")),
            Some((key, NameKind::Temp))
        );
        for bad in [
            "m012-s0.replica",
            "m12-s00.replica",
            "m+12-s0.replica",
            "m12-s0.replica.bak",
            "m12-s0",
            "m12-s.replica",
            "12-s0.replica",
            "m12_s0.replica",
            "m18446744073709551616-s0.replica",
            "m12-s0.tmp",
            "",
        ] {
            assert_eq!(parse_name(OsStr::new(bad)), None, "{bad}");
        }
    }

    /// How a property test damages a valid replica file.
    #[derive(Clone, Debug)]
    enum Damage {
        /// XOR a nonzero mask into one byte.
        Flip { at: prop::sample::Index, mask: u8 },
        /// Cut the file to a shorter length.
        Truncate { at: prop::sample::Index },
        /// Append bytes.
        Append { bytes: Vec<u8> },
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            (any::<prop::sample::Index>(), 1..=u8::MAX)
                .prop_map(|(at, mask)| Damage::Flip { at, mask }),
            any::<prop::sample::Index>().prop_map(|at| Damage::Truncate { at }),
            prop::collection::vec(any::<u8>(), 1..16).prop_map(|bytes| Damage::Append { bytes }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any one damaged byte, truncation or trailing garbage is caught: CRC32 detects
        /// every burst of up to 32 bits, and sizes are checked exactly.
        #[test]
        fn verify_file_catches_any_single_byte_change_truncation_or_extension(
            bytes in prop::collection::vec(any::<u8>(), 0..2048),
            epoch in any::<u64>(),
            closed in any::<bool>(),
            damage in damage(),
        ) {
            let dir = TempDir::new().expect("tempdir");
            let path = dir.path().join("m5-s6.replica");
            let meta = ReplicaMeta {
                master: ServerId(5),
                segment: SegmentId(6),
                epoch: Epoch(epoch),
                length: u32::try_from(bytes.len()).expect("small"),
                closed,
                content_crc32: crc32fast::hash(&bytes),
            };
            let mut image = encode_header(&meta).to_vec();
            image.extend_from_slice(&bytes);
            fs::write(&path, &image).expect("write");
            let key = (ServerId(5), SegmentId(6));
            prop_assert_eq!(verify_file(&path, key, None).expect("intact"), meta);

            match damage {
                Damage::Flip { at, mask } => {
                    let at = at.index(image.len());
                    image[at] ^= mask;
                }
                Damage::Truncate { at } => image.truncate(at.index(image.len())),
                Damage::Append { bytes } => image.extend_from_slice(&bytes),
            }
            fs::write(&path, &image).expect("write");
            prop_assert!(matches!(verify_file(&path, key, None), Err(Verify::Corrupt(_))));
            let mut content = Vec::new();
            prop_assert!(matches!(
                verify_file(&path, key, Some(&mut content)),
                Err(Verify::Corrupt(_))
            ));
        }
    }
}
