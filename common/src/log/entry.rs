//! Log entries: their byte layout, sizes, encoding helpers and [`decode_entry`].
//!
//! Every entry is `type: u8`, `len: u32` (payload bytes), then `len` bytes of payload,
//! little-endian throughout (see the table in the [module doc](super)). Type 0 is never
//! valid, so zeroed memory reads as "nothing written here".
//!
//! Decoding borrows keys and values from the buffer and allocates only for a digest's
//! list of segment ids. Every length read from the buffer is checked against the buffer
//! before it is used, so a corrupt or hostile segment yields an [`EntryError`], never a
//! panic or a large allocation.

use crate::ids::{ClientId, KeyHash, SegmentId, ServerId, TableId, Version};
use crc32fast::Hasher;

/// Bytes of an entry's `type` and `len` fields.
pub const ENTRY_HEADER_BYTES: usize = 5;

/// Bytes of a whole `Checksum` entry: header and the u32 checksum.
pub const CHECKSUM_ENTRY_BYTES: usize = ENTRY_HEADER_BYTES + 4;

/// Bytes of a whole `SegmentFooter` entry: header and the successor segment id.
pub const FOOTER_ENTRY_BYTES: usize = ENTRY_HEADER_BYTES + 8;

/// Bytes of a whole `SegmentHeader` entry: header, log id, segment id, capacity.
pub const SEGMENT_HEADER_ENTRY_BYTES: usize = ENTRY_HEADER_BYTES + 8 + 8 + 4;

/// Bytes of a whole `SafeVersion` entry: header and the version.
pub const SAFE_VERSION_ENTRY_BYTES: usize = ENTRY_HEADER_BYTES + 8;

/// Object payload bytes besides key and value: table id, version, key length, crc.
const OBJECT_FIXED_PAYLOAD_BYTES: usize = 8 + 8 + 4 + 4;

/// Tombstone payload bytes besides the key: table id, version, segment id, key length,
/// crc.
const TOMBSTONE_FIXED_PAYLOAD_BYTES: usize = 8 + 8 + 8 + 4 + 4;

/// Completion record payload bytes: table id, key hash, client, seq, ack, version,
/// counter, flags, crc.
const COMPLETION_PAYLOAD_BYTES: usize = 8 * 7 + 1 + 4;

/// Bytes of a whole `Completion` entry: header and payload.
pub const COMPLETION_ENTRY_BYTES: usize = ENTRY_HEADER_BYTES + COMPLETION_PAYLOAD_BYTES;

/// The `flags` bit of a completion record that says `counter` holds an increment's result.
const COMPLETION_HAS_COUNTER: u8 = 1;

/// Digest payload bytes besides the segment ids: the count.
const DIGEST_FIXED_PAYLOAD_BYTES: usize = 4;

/// Below this many payload bytes, hashing an object's or tombstone's payload a second
/// time (into the running CRC) is cheaper than folding its already known CRC in with
/// [`Hasher::combine`]. Measured (crc32fast 1.5, x86-64 with PCLMULQDQ): a combine costs
/// ≈ 0.1 µs whatever the length, hashing ≈ 15 GB/s plus ≈ 12 ns per call, so the
/// crossover lies near 1.5 KiB.
const CRC_COMBINE_MIN_BYTES: usize = 2048;

const _: () = assert!(CHECKSUM_ENTRY_BYTES == 9);
const _: () = assert!(FOOTER_ENTRY_BYTES == 13);
const _: () = assert!(SEGMENT_HEADER_ENTRY_BYTES == 25);
const _: () = assert!(COMPLETION_ENTRY_BYTES == 66);

/// The type byte of an entry. 0 is never a type: it marks the end of written data.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryType {
    /// First entry of every segment: [`SegmentHeader`].
    SegmentHeader = 1,
    /// Second entry of every segment: the ids of every live segment of the log.
    LogDigest = 2,
    /// An object: [`ObjectEntry`].
    Object = 3,
    /// A deletion: [`TombstoneEntry`].
    Tombstone = 4,
    /// A version floor that keeps versions increasing across delete and recovery.
    SafeVersion = 5,
    /// Tailwind's end-of-batch marker: the CRC32 of every byte before it.
    Checksum = 6,
    /// Closes the segment and names its successor.
    SegmentFooter = 7,
    /// The outcome of a client's write, remove or increment, for its retries:
    /// [`CompletionEntry`] (`crate::rifl`).
    Completion = 8,
}

impl EntryType {
    /// The type for a type byte, or `None` for 0 and unknown bytes.
    pub fn from_u8(byte: u8) -> Option<EntryType> {
        Some(match byte {
            1 => EntryType::SegmentHeader,
            2 => EntryType::LogDigest,
            3 => EntryType::Object,
            4 => EntryType::Tombstone,
            5 => EntryType::SafeVersion,
            6 => EntryType::Checksum,
            7 => EntryType::SegmentFooter,
            8 => EntryType::Completion,
            _ => return None,
        })
    }
}

/// The first entry of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentHeader {
    /// The log this segment belongs to: the id of the server whose master wrote it.
    pub log_id: ServerId,
    /// This segment's id within its log.
    pub segment_id: SegmentId,
    /// The segment's size in bytes; no entry extends past it.
    pub capacity: u32,
}

/// An object entry; key and value borrow from the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjectEntry<'a> {
    /// The table the object belongs to.
    pub table: TableId,
    /// The object's version.
    pub version: Version,
    /// The key bytes.
    pub key: &'a [u8],
    /// The value bytes.
    pub value: &'a [u8],
}

/// A tombstone: records that `version` of `key` was deleted, so that replay does not
/// resurrect the object from an older segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TombstoneEntry<'a> {
    /// The table the deleted object belonged to.
    pub table: TableId,
    /// The version that was deleted.
    pub version: Version,
    /// The segment that held the deleted object; the cleaner drops the tombstone once
    /// that segment is gone.
    pub segment_id: SegmentId,
    /// The key bytes.
    pub key: &'a [u8],
}

/// A completion record: client `client`'s operation `seq` changed the object of `table`
/// whose key hashes to `key_hash`, with this outcome (`crate::rifl`). Appended with the
/// object or tombstone it produced, in one atomic append; it lives in the tablet of
/// (`table`, `key_hash`) and moves with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompletionEntry {
    /// The object's table.
    pub table: TableId,
    /// The object's key hash.
    pub key_hash: KeyHash,
    /// The client.
    pub client: ClientId,
    /// The operation's number.
    pub seq: u64,
    /// The client's acknowledgement when it sent the operation: its operations up to
    /// here had their outcomes at the client.
    pub ack: u64,
    /// The outcome: the new version (write, increment) or the version removed.
    pub version: Version,
    /// An increment's result, `None` for writes and removes.
    pub counter: Option<i64>,
}

/// A decoded entry. Keys and values borrow from the buffer it was decoded from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Entry<'a> {
    /// `SegmentHeader`.
    Header(SegmentHeader),
    /// `LogDigest`: every live segment of the log when this segment was opened, this
    /// one included.
    Digest(Vec<SegmentId>),
    /// `Object`.
    Object(ObjectEntry<'a>),
    /// `Tombstone`.
    Tombstone(TombstoneEntry<'a>),
    /// `SafeVersion`: the version floor.
    SafeVersion(Version),
    /// `Checksum`: the stored value, not yet compared with anything.
    Checksum(u32),
    /// `SegmentFooter`: the segment is closed and `successor` follows it.
    Footer {
        /// The segment opened after this one.
        successor: SegmentId,
    },
    /// `Completion`: a completion record.
    Completion(CompletionEntry),
}

impl Entry<'_> {
    /// The type byte this entry is stored with.
    pub fn entry_type(&self) -> EntryType {
        match self {
            Entry::Header(_) => EntryType::SegmentHeader,
            Entry::Digest(_) => EntryType::LogDigest,
            Entry::Object(_) => EntryType::Object,
            Entry::Tombstone(_) => EntryType::Tombstone,
            Entry::SafeVersion(_) => EntryType::SafeVersion,
            Entry::Checksum(_) => EntryType::Checksum,
            Entry::Footer { .. } => EntryType::SegmentFooter,
            Entry::Completion(_) => EntryType::Completion,
        }
    }
}

/// Why the bytes at an offset are not a valid entry.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum EntryError {
    /// The type byte is neither 0 nor a known type.
    #[error("unknown entry type {ty} at offset {offset}")]
    UnknownType {
        /// Where the entry starts.
        offset: usize,
        /// The type byte found.
        ty: u8,
    },
    /// The entry's header or payload runs past the end of the buffer.
    #[error("entry at offset {offset} runs past the end of the buffer")]
    Truncated {
        /// Where the entry starts.
        offset: usize,
    },
    /// The payload does not have the shape its type requires.
    #[error("malformed entry at offset {offset}: {what}")]
    Malformed {
        /// Where the entry starts.
        offset: usize,
        /// What is wrong with it.
        what: &'static str,
    },
    /// An object's, tombstone's or completion record's own CRC does not match its
    /// payload.
    #[error("entry at offset {offset} fails its CRC")]
    BadCrc {
        /// Where the entry starts.
        offset: usize,
    },
}

/// Total bytes of an object entry, header included. Saturates instead of overflowing, so
/// absurd sizes simply do not fit.
pub fn object_entry_bytes(key_len: usize, value_len: usize) -> usize {
    (ENTRY_HEADER_BYTES + OBJECT_FIXED_PAYLOAD_BYTES)
        .saturating_add(key_len)
        .saturating_add(value_len)
}

/// Total bytes of a tombstone entry, header included.
pub fn tombstone_entry_bytes(key_len: usize) -> usize {
    (ENTRY_HEADER_BYTES + TOMBSTONE_FIXED_PAYLOAD_BYTES).saturating_add(key_len)
}

/// Total bytes of a digest entry listing `segments` segment ids, header included.
pub fn digest_entry_bytes(segments: usize) -> usize {
    (ENTRY_HEADER_BYTES + DIGEST_FIXED_PAYLOAD_BYTES).saturating_add(segments.saturating_mul(8))
}

/// The value a `Checksum` entry stores for a running CRC: the CRC with 0 mapped to 1, so
/// that a checksum field still zero (not yet written) never matches.
pub fn checksum_value(crc: u32) -> u32 {
    if crc == 0 {
        1
    } else {
        crc
    }
}

/// Decodes the entry at `offset`.
///
/// Returns `Ok(None)` at the end of written data: `offset == buf.len()` or a zero type
/// byte. Otherwise the entry and the offset of the next one. Errs if the type is unknown,
/// the entry runs past `buf` (or `offset` lies beyond it), the payload is malformed, or
/// an object's or tombstone's CRC does not match. A `Checksum` entry is returned as
/// stored; comparing it with the bytes before it is [`scan`](super::scan)'s job.
pub fn decode_entry(buf: &[u8], offset: usize) -> Result<Option<(Entry<'_>, usize)>, EntryError> {
    Ok(decode(buf, offset)?.map(|d| (d.entry, d.next)))
}

/// An entry with what the scanner needs beyond [`decode_entry`]'s answer.
pub(crate) struct Decoded<'a> {
    pub(crate) entry: Entry<'a>,
    /// Offset of the next entry.
    pub(crate) next: usize,
    /// For objects and tombstones: the (verified) CRC of the payload before the stored
    /// CRC, so a running CRC can fold it in instead of hashing the payload again.
    pub(crate) body_crc: Option<u32>,
}

/// [`decode_entry`], keeping the verified payload CRC.
pub(crate) fn decode(buf: &[u8], offset: usize) -> Result<Option<Decoded<'_>>, EntryError> {
    let Some(&ty) = buf.get(offset) else {
        return if offset == buf.len() {
            Ok(None)
        } else {
            Err(EntryError::Truncated { offset })
        };
    };
    if ty == 0 {
        return Ok(None);
    }
    let ty = EntryType::from_u8(ty).ok_or(EntryError::UnknownType { offset, ty })?;
    let truncated = EntryError::Truncated { offset };
    let payload_start = offset
        .checked_add(ENTRY_HEADER_BYTES)
        .ok_or(truncated.clone())?;
    let header = buf
        .get(offset + 1..payload_start)
        .ok_or(truncated.clone())?;
    let len = le_u32(header, 0) as usize;
    let next = payload_start.checked_add(len).ok_or(truncated.clone())?;
    let p = buf.get(payload_start..next).ok_or(truncated)?;
    let malformed = |what| EntryError::Malformed { offset, what };

    let mut body_crc = None;
    let entry = match ty {
        EntryType::SegmentHeader => {
            if len != SEGMENT_HEADER_ENTRY_BYTES - ENTRY_HEADER_BYTES {
                return Err(malformed("segment header payload is not 20 bytes"));
            }
            Entry::Header(SegmentHeader {
                log_id: ServerId(le_u64(p, 0)),
                segment_id: SegmentId(le_u64(p, 8)),
                capacity: le_u32(p, 16),
            })
        }
        EntryType::LogDigest => {
            if len < DIGEST_FIXED_PAYLOAD_BYTES {
                return Err(malformed("digest payload shorter than its count"));
            }
            let count = le_u32(p, 0) as u64;
            // u64 arithmetic: count * 8 cannot overflow, and `len` was already checked
            // against the buffer, so the allocation below is bounded by the buffer.
            if len as u64 != DIGEST_FIXED_PAYLOAD_BYTES as u64 + count * 8 {
                return Err(malformed("digest length does not match its count"));
            }
            Entry::Digest(
                p[DIGEST_FIXED_PAYLOAD_BYTES..]
                    .chunks_exact(8)
                    .map(|id| SegmentId(le_u64(id, 0)))
                    .collect(),
            )
        }
        EntryType::Object => {
            if len < OBJECT_FIXED_PAYLOAD_BYTES {
                return Err(malformed("object payload shorter than its fixed fields"));
            }
            let key_len = le_u32(p, 16) as usize;
            if key_len > len - OBJECT_FIXED_PAYLOAD_BYTES {
                return Err(malformed("object key runs past the entry"));
            }
            body_crc = Some(check_crc(p, offset)?);
            let key_start = 20;
            let value_start = key_start + key_len;
            Entry::Object(ObjectEntry {
                table: TableId(le_u64(p, 0)),
                version: Version(le_u64(p, 8)),
                key: &p[key_start..value_start],
                value: &p[value_start..len - 4],
            })
        }
        EntryType::Tombstone => {
            if len < TOMBSTONE_FIXED_PAYLOAD_BYTES {
                return Err(malformed("tombstone payload shorter than its fixed fields"));
            }
            let key_len = le_u32(p, 24) as usize;
            if key_len != len - TOMBSTONE_FIXED_PAYLOAD_BYTES {
                return Err(malformed("tombstone key length does not match the entry"));
            }
            body_crc = Some(check_crc(p, offset)?);
            Entry::Tombstone(TombstoneEntry {
                table: TableId(le_u64(p, 0)),
                version: Version(le_u64(p, 8)),
                segment_id: SegmentId(le_u64(p, 16)),
                key: &p[28..len - 4],
            })
        }
        EntryType::SafeVersion => {
            if len != 8 {
                return Err(malformed("safe version payload is not 8 bytes"));
            }
            Entry::SafeVersion(Version(le_u64(p, 0)))
        }
        EntryType::Checksum => {
            if len != CHECKSUM_ENTRY_BYTES - ENTRY_HEADER_BYTES {
                return Err(malformed("checksum payload is not 4 bytes"));
            }
            Entry::Checksum(le_u32(p, 0))
        }
        EntryType::SegmentFooter => {
            if len != FOOTER_ENTRY_BYTES - ENTRY_HEADER_BYTES {
                return Err(malformed("footer payload is not 8 bytes"));
            }
            Entry::Footer {
                successor: SegmentId(le_u64(p, 0)),
            }
        }
        EntryType::Completion => {
            if len != COMPLETION_PAYLOAD_BYTES {
                return Err(malformed("completion record payload is not 61 bytes"));
            }
            body_crc = Some(check_crc(p, offset)?);
            let flags = p[56];
            if flags & !COMPLETION_HAS_COUNTER != 0 {
                return Err(malformed("completion record has unknown flags"));
            }
            Entry::Completion(CompletionEntry {
                table: TableId(le_u64(p, 0)),
                key_hash: KeyHash(le_u64(p, 8)),
                client: ClientId(le_u64(p, 16)),
                seq: le_u64(p, 24),
                ack: le_u64(p, 32),
                version: Version(le_u64(p, 40)),
                counter: (flags & COMPLETION_HAS_COUNTER != 0).then(|| le_u64(p, 48) as i64),
            })
        }
    };
    Ok(Some(Decoded {
        entry,
        next,
        body_crc,
    }))
}

/// Decodes the object entry at `offset` with bounds checks but without verifying its
/// CRC, for a log this process wrote itself and reads on every client read: its bytes
/// were checksummed when written and never leave DRAM. Replicas read from backups or
/// disks must go through [`decode_entry`] or the scanner, which verify. `None` if the
/// entry at `offset` is not a well-formed object.
pub fn decode_object_trusted(buf: &[u8], offset: usize) -> Option<ObjectEntry<'_>> {
    let payload_start = offset.checked_add(ENTRY_HEADER_BYTES)?;
    let header = buf.get(offset..payload_start)?;
    if header[0] != EntryType::Object as u8 {
        return None;
    }
    let len = le_u32(header, 1) as usize;
    let p = buf.get(payload_start..payload_start.checked_add(len)?)?;
    if len < OBJECT_FIXED_PAYLOAD_BYTES {
        return None;
    }
    let key_len = le_u32(p, 16) as usize;
    if key_len > len - OBJECT_FIXED_PAYLOAD_BYTES {
        return None;
    }
    let value_start = 20 + key_len;
    Some(ObjectEntry {
        table: TableId(le_u64(p, 0)),
        version: Version(le_u64(p, 8)),
        key: &p[20..value_start],
        value: &p[value_start..len - 4],
    })
}

/// Checks the CRC that ends payload `p` against the bytes before it; returns that CRC.
fn check_crc(p: &[u8], offset: usize) -> Result<u32, EntryError> {
    let body = p.len() - 4;
    let crc = crc32fast::hash(&p[..body]);
    if crc != le_u32(p, body) {
        return Err(EntryError::BadCrc { offset });
    }
    Ok(crc)
}

/// Folds a whole object or tombstone entry (`entry_bytes`: header, payload, stored CRC)
/// into `running`, given `body_crc`, the CRC of its payload before the stored CRC. Small
/// entries are hashed in one call; large ones reuse `body_crc` instead of hashing the
/// payload again.
pub(crate) fn fold_crc_entry(running: &mut Hasher, entry_bytes: &[u8], body_crc: u32) {
    let body = ENTRY_HEADER_BYTES..entry_bytes.len() - 4;
    if body.len() < CRC_COMBINE_MIN_BYTES {
        running.update(entry_bytes);
    } else {
        running.update(&entry_bytes[..body.start]);
        running.combine(&Hasher::new_with_initial_len(body_crc, body.len() as u64));
        running.update(&entry_bytes[body.end..]);
    }
}

/// Appends a completion record's payload (without its CRC) after its header.
pub(crate) fn put_completion(buf: &mut Vec<u8>, record: &CompletionEntry) {
    put_entry_header(buf, EntryType::Completion, COMPLETION_PAYLOAD_BYTES);
    for word in [
        record.table.0,
        record.key_hash.0,
        record.client.0,
        record.seq,
        record.ack,
        record.version.0,
        record.counter.unwrap_or(0) as u64,
    ] {
        buf.extend_from_slice(&word.to_le_bytes());
    }
    buf.push(if record.counter.is_some() {
        COMPLETION_HAS_COUNTER
    } else {
        0
    });
}

/// Appends an entry header. The caller appends exactly `len` payload bytes next.
pub(crate) fn put_entry_header(buf: &mut Vec<u8>, ty: EntryType, len: usize) {
    let len = u32::try_from(len).expect("entry length is bounded by the u32 segment capacity");
    buf.push(ty as u8);
    buf.extend_from_slice(&len.to_le_bytes());
}

/// Reads a little-endian u32 at `at`; the caller has checked the bounds.
fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(bytes)
}

/// Reads a little-endian u64 at `at`; the caller has checked the bounds.
fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_type_round_trips_through_its_byte() {
        for byte in 0..=u8::MAX {
            match EntryType::from_u8(byte) {
                Some(ty) => assert_eq!(ty as u8, byte),
                None => assert!(byte == 0 || byte > 8, "type {byte} lost"),
            }
        }
    }

    #[test]
    fn decode_entry_reports_end_of_data_at_zero_type_and_buffer_end() {
        assert_eq!(decode_entry(&[0, 9, 9, 9, 9], 0), Ok(None));
        assert_eq!(decode_entry(&[5], 1), Ok(None));
        assert_eq!(decode_entry(&[], 0), Ok(None));
    }

    #[test]
    fn decode_entry_rejects_offset_past_the_buffer() {
        assert_eq!(
            decode_entry(&[0], 2),
            Err(EntryError::Truncated { offset: 2 })
        );
    }

    #[test]
    fn decode_entry_rejects_unknown_type() {
        assert_eq!(
            decode_entry(&[9, 0, 0, 0, 0], 0),
            Err(EntryError::UnknownType { offset: 0, ty: 9 })
        );
    }

    #[test]
    fn a_completion_record_of_the_wrong_size_or_flags_or_crc_is_refused() {
        let record = CompletionEntry {
            table: TableId(1),
            key_hash: KeyHash(2),
            client: ClientId(3),
            seq: 4,
            ack: 3,
            version: Version(5),
            counter: Some(-6),
        };
        let mut buf = Vec::new();
        put_completion(&mut buf, &record);
        let crc = crc32fast::hash(&buf[ENTRY_HEADER_BYTES..]);
        buf.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(buf.len(), COMPLETION_ENTRY_BYTES);
        assert_eq!(
            decode_entry(&buf, 0),
            Ok(Some((Entry::Completion(record), COMPLETION_ENTRY_BYTES)))
        );
        let mut flipped = buf.clone();
        flipped[30] ^= 1;
        assert_eq!(
            decode_entry(&flipped, 0),
            Err(EntryError::BadCrc { offset: 0 })
        );
        let mut flags = buf.clone();
        flags[ENTRY_HEADER_BYTES + 56] = 2;
        assert!(matches!(
            decode_entry(&flags, 0),
            Err(EntryError::Malformed { .. }) | Err(EntryError::BadCrc { .. })
        ));
        let mut short = buf[..COMPLETION_ENTRY_BYTES - 1].to_vec();
        short[1] -= 1;
        assert!(matches!(
            decode_entry(&short, 0),
            Err(EntryError::Malformed { .. })
        ));
    }

    #[test]
    fn decode_entry_rejects_truncated_header_and_payload() {
        assert_eq!(
            decode_entry(&[5, 8, 0], 0),
            Err(EntryError::Truncated { offset: 0 })
        );
        let mut safe = vec![5, 8, 0, 0, 0];
        safe.extend_from_slice(&[1; 7]);
        assert_eq!(
            decode_entry(&safe, 0),
            Err(EntryError::Truncated { offset: 0 })
        );
        // A huge length must not overflow or allocate.
        assert_eq!(
            decode_entry(&[2, 0xff, 0xff, 0xff, 0xff, 0], 0),
            Err(EntryError::Truncated { offset: 0 })
        );
    }

    #[test]
    fn decode_entry_rejects_payloads_of_the_wrong_shape() {
        let cases: &[&[u8]] = &[
            &[1, 0, 0, 0, 0],             // header without payload
            &[2, 4, 0, 0, 0, 1, 0, 0, 0], // digest claiming one id, holding none
            &[3, 3, 0, 0, 0, 0, 0, 0],    // object shorter than its fixed fields
            &[5, 4, 0, 0, 0, 1, 0, 0, 0], // safe version of 4 bytes
            &[6, 0, 0, 0, 0],             // checksum without value
            &[7, 4, 0, 0, 0, 1, 0, 0, 0], // footer of 4 bytes
        ];
        for case in cases {
            assert!(
                matches!(
                    decode_entry(case, 0),
                    Err(EntryError::Malformed { offset: 0, .. })
                ),
                "{case:?} accepted"
            );
        }
    }

    #[test]
    fn decode_entry_rejects_object_key_longer_than_the_entry() {
        let mut buf = vec![3];
        buf.extend_from_slice(&24u32.to_le_bytes());
        buf.extend_from_slice(&[0; 16]);
        buf.extend_from_slice(&1u32.to_le_bytes()); // key_len 1, but no room for it
        buf.extend_from_slice(&[0; 4]);
        assert!(matches!(
            decode_entry(&buf, 0),
            Err(EntryError::Malformed { .. })
        ));
    }

    #[test]
    fn trusted_object_decode_matches_the_verifying_decode() {
        let mut writer =
            crate::log::SegmentWriter::open(ServerId(1), SegmentId(1), 4096, &[SegmentId(1)])
                .expect("fits");
        let at = writer
            .append_object(TableId(3), Version(9), b"key", b"value")
            .expect("fits");
        let bytes = writer.bytes();
        let trusted = decode_object_trusted(bytes, at as usize).expect("an object");
        match decode_entry(bytes, at as usize) {
            Ok(Some((Entry::Object(verified), _))) => assert_eq!(trusted, verified),
            other => panic!("not an object: {other:?}"),
        }
        assert_eq!(
            decode_object_trusted(bytes, 0),
            None,
            "offset 0 is the segment header"
        );
        assert_eq!(
            decode_object_trusted(bytes, bytes.len() - 2),
            None,
            "runs past the end"
        );
    }

    #[test]
    fn decode_entry_rejects_object_with_bad_crc() {
        let mut buf = vec![3];
        buf.extend_from_slice(&26u32.to_le_bytes());
        let mut payload = Vec::new();
        payload.extend_from_slice(&7u64.to_le_bytes());
        payload.extend_from_slice(&1u64.to_le_bytes());
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(b"kv");
        let crc = crc32fast::hash(&payload);
        payload.extend_from_slice(&crc.to_le_bytes());
        buf.extend_from_slice(&payload);
        let (entry, next) = decode_entry(&buf, 0).expect("valid").expect("present");
        assert_eq!(next, buf.len());
        assert_eq!(
            entry,
            Entry::Object(ObjectEntry {
                table: TableId(7),
                version: Version(1),
                key: b"k",
                value: b"v"
            })
        );
        buf[ENTRY_HEADER_BYTES + 21] ^= 1;
        assert_eq!(decode_entry(&buf, 0), Err(EntryError::BadCrc { offset: 0 }));
    }

    #[test]
    fn checksum_value_is_never_zero() {
        assert_eq!(checksum_value(0), 1);
        assert_eq!(checksum_value(0xdead_beef), 0xdead_beef);
    }

    #[test]
    fn fold_crc_entry_matches_hashing_for_short_and_long_entries() {
        for body_len in [
            0,
            1,
            100,
            CRC_COMBINE_MIN_BYTES - 1,
            CRC_COMBINE_MIN_BYTES,
            100_000,
        ] {
            let mut entry: Vec<u8> = vec![3, 1, 2, 3, 4];
            entry.extend((0..body_len).map(|i| (i * 31 % 251) as u8));
            let body_crc = crc32fast::hash(&entry[ENTRY_HEADER_BYTES..]);
            entry.extend_from_slice(&body_crc.to_le_bytes());
            let mut running = Hasher::new();
            running.update(b"prefix");
            let mut expected = running.clone();
            fold_crc_entry(&mut running, &entry, body_crc);
            expected.update(&entry);
            assert_eq!(
                running.finalize(),
                expected.finalize(),
                "body of {body_len} bytes"
            );
        }
    }
}
