//! Replay of a crashed master's log, the pure part: a backup's piece of one segment
//! decoded and checked ([`RecoveryPiece`]), and the state one recovery keeps across its
//! pieces ([`ReplayState`]). `ObjectStore::stage_replay` applies a piece under these rules;
//! `recovery_master` (the driver) fetches the pieces, and the appender orders them with the
//! writes. Nothing here does I/O.
//!
//! # Replay rules
//! Pieces arrive in any order; the result must not depend on it (tested by a property
//! test in `object_store`). [`ReplayState`] keeps, per key, the highest version a
//! tombstone of this recovery deleted. For each entry:
//! * an object older than or equal to a tombstone seen, or to the object of its key
//!   already replayed, is dropped; otherwise it is appended with its original version and
//!   replaces the older one;
//! * a tombstone removes the replayed object of its key if that is not newer, and is
//!   appended to this master's log unless a newer object of its key survives: should
//!   this master crash later, an older copy of the key in its log (left by an earlier,
//!   abandoned attempt) must not come back;
//! * the safe version is raised to every piece's floor and above every version replayed
//!   (and a `SafeVersion` entry appended when it rises), so a key deleted on the crashed
//!   master and re-created here gets a larger version than any it had;
//! * with a version floor (a recovery the operator let lose data), every version is
//!   replayed shifted up by it ([`ReplayState::shifted`]): a shift keeps their order, so
//!   the rules above hold unchanged, and every replayed object ends above every version
//!   the crashed master handed out;
//! * a completion record (`rampart_common::rifl`) is kept unless this master holds it
//!   already or its client acknowledged it (its own `ack`, or a later record's): it is
//!   appended to this master's log alone (its object is replayed by the rules above) and
//!   held, with its version shifted like the objects', so a retry of the operation that
//!   reaches this master is answered with the outcome its client would have seen.

use bytes::Bytes;
use rampart_common::ids::{key_hash, KeyHash, SegmentId, TableId, Version};
use rampart_common::log::{decode_entry, CompletionEntry, Entry, EntryError};
use rampart_common::tablet::HashRange;
use std::collections::HashMap;

/// One decoded, checked entry of a piece. Keys and values share the piece's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PieceEntry {
    /// An object.
    Object {
        /// Its table.
        table: TableId,
        /// `key_hash(key)`.
        hash: KeyHash,
        /// Its version on the crashed master.
        version: Version,
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
    },
    /// A tombstone.
    Tombstone {
        /// Its table.
        table: TableId,
        /// `key_hash(key)`.
        hash: KeyHash,
        /// The version it deleted.
        version: Version,
        /// The key.
        key: Bytes,
    },
    /// A completion record.
    Completion(CompletionEntry),
}

/// One segment's entries of one partition, as a backup sent them, decoded and checked.
///
/// Invariant: every entry's CRC matched, and every entry's (table, hash) lies in the
/// partition's ranges. A piece is only made by [`RecoveryPiece::parse`] (or
/// [`RecoveryPiece::from_entries`] in tests), so replay never meets a bad entry halfway
/// through a piece.
#[derive(Clone, Debug)]
pub struct RecoveryPiece {
    segment: SegmentId,
    safe_version: Version,
    entries: Vec<PieceEntry>,
    /// Bytes of the entries as received (for batch sizing and statistics).
    bytes: usize,
}

/// Why a backup's reply is not a usable piece (the fetch then falls back to another
/// backup).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PieceError {
    /// An entry does not decode or fails its CRC.
    #[error("{0}")]
    Entry(#[from] EntryError),
    /// An entry of a type that does not belong in a piece (header, digest, ...).
    #[error("unexpected {what} entry at offset {offset}")]
    Unexpected {
        /// Where it starts.
        offset: usize,
        /// Its type.
        what: &'static str,
    },
    /// An entry whose key lies outside the partition: the backup split wrongly.
    #[error("entry at offset {offset} lies outside the partition")]
    OutsidePartition {
        /// Where it starts.
        offset: usize,
    },
    /// Bytes after the last entry that are not an entry (a zero type byte).
    #[error("{bytes} stray bytes after the entry ending at offset {offset}")]
    TrailingBytes {
        /// Where the last entry ended.
        offset: usize,
        /// How many bytes follow.
        bytes: usize,
    },
    /// The reply's `count` does not match the entries it holds.
    #[error("reply says {said} entries but holds {found}")]
    CountMismatch {
        /// The reply's count.
        said: u32,
        /// Object and tombstone entries found.
        found: usize,
    },
}

/// Whether `(table, hash)` lies in `ranges` (sorted and disjoint).
fn in_ranges(ranges: &[HashRange], table: TableId, hash: KeyHash) -> bool {
    let after = ranges.partition_point(
        |&HashRange {
             table: t, start, ..
         }| (t, start) <= (table, hash.0),
    );
    after
        .checked_sub(1)
        .is_some_and(|at| ranges[at].table == table && hash.0 <= ranges[at].end)
}

/// What a backup sent for one segment and partition, not checked yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PieceBytes {
    /// The highest `SafeVersion` floor the backup found in the replica (0 if none).
    pub safe_version: Version,
    /// `Object` and `Tombstone` entries in the log's format, one after another.
    pub entries: Bytes,
    /// How many entries the backup says `entries` holds.
    pub count: u32,
}

impl RecoveryPiece {
    /// Decodes and checks a backup's piece of `segment` against the partition `ranges`
    /// (sorted and disjoint). CPU-heavy (a CRC over every byte): run it off the reactor.
    pub fn parse(
        segment: SegmentId,
        reply: PieceBytes,
        ranges: &[HashRange],
    ) -> Result<RecoveryPiece, PieceError> {
        let buf = &reply.entries;
        let mut entries = Vec::with_capacity(reply.count as usize);
        let mut safe_version = reply.safe_version;
        let mut offset = 0;
        while let Some((entry, next)) = decode_entry(buf, offset)? {
            let parsed = match entry {
                Entry::Object(object) => PieceEntry::Object {
                    table: object.table,
                    hash: key_hash(object.key),
                    version: object.version,
                    key: buf.slice_ref(object.key),
                    value: buf.slice_ref(object.value),
                },
                Entry::Tombstone(tombstone) => PieceEntry::Tombstone {
                    table: tombstone.table,
                    hash: key_hash(tombstone.key),
                    version: tombstone.version,
                    key: buf.slice_ref(tombstone.key),
                },
                Entry::Completion(record) => PieceEntry::Completion(record),
                Entry::SafeVersion(floor) => {
                    safe_version = safe_version.max(floor);
                    offset = next;
                    continue;
                }
                Entry::Header(_) => {
                    return Err(PieceError::Unexpected {
                        offset,
                        what: "segment header",
                    })
                }
                Entry::Digest(_) => {
                    return Err(PieceError::Unexpected {
                        offset,
                        what: "digest",
                    })
                }
                Entry::Checksum(_) => {
                    return Err(PieceError::Unexpected {
                        offset,
                        what: "checksum",
                    })
                }
                Entry::Footer { .. } => {
                    return Err(PieceError::Unexpected {
                        offset,
                        what: "footer",
                    })
                }
            };
            let (table, hash) = parsed.table_and_hash();
            if !in_ranges(ranges, table, hash) {
                return Err(PieceError::OutsidePartition { offset });
            }
            entries.push(parsed);
            offset = next;
        }
        // A zero type byte ends `decode_entry`'s walk early.
        if offset != buf.len() {
            return Err(PieceError::TrailingBytes {
                offset,
                bytes: buf.len() - offset,
            });
        }
        if entries.len() != reply.count as usize {
            return Err(PieceError::CountMismatch {
                said: reply.count,
                found: entries.len(),
            });
        }
        Ok(RecoveryPiece {
            segment,
            safe_version,
            entries,
            bytes: buf.len(),
        })
    }

    /// A piece of already checked entries (tests and benchmarks).
    pub fn from_entries(
        segment: SegmentId,
        safe_version: Version,
        entries: Vec<PieceEntry>,
    ) -> RecoveryPiece {
        let bytes = entries.iter().map(PieceEntry::entry_bytes).sum();
        RecoveryPiece {
            segment,
            safe_version,
            entries,
            bytes,
        }
    }

    /// The crashed master's segment this piece came from.
    pub fn segment(&self) -> SegmentId {
        self.segment
    }

    /// The highest `SafeVersion` floor of the segment.
    pub fn safe_version(&self) -> Version {
        self.safe_version
    }

    /// The entries, in log order.
    pub fn entries(&self) -> &[PieceEntry] {
        &self.entries
    }

    /// Bytes of the entries as received.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl PieceEntry {
    /// The entry's table and key hash.
    pub fn table_and_hash(&self) -> (TableId, KeyHash) {
        match self {
            PieceEntry::Object { table, hash, .. } | PieceEntry::Tombstone { table, hash, .. } => {
                (*table, *hash)
            }
            PieceEntry::Completion(record) => (record.table, record.key_hash),
        }
    }

    /// Bytes the entry takes in a log.
    pub fn entry_bytes(&self) -> usize {
        match self {
            PieceEntry::Object { key, value, .. } => {
                rampart_common::log::object_entry_bytes(key.len(), value.len())
            }
            PieceEntry::Tombstone { key, .. } => {
                rampart_common::log::tombstone_entry_bytes(key.len())
            }
            PieceEntry::Completion(_) => rampart_common::log::COMPLETION_ENTRY_BYTES,
        }
    }
}

/// What one recovery replayed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayCounts {
    /// Objects and tombstones received.
    pub entries_received: u64,
    /// Objects appended to this master's log (some later superseded).
    pub objects_appended: u64,
    /// Objects dropped: older than or equal to what was already replayed.
    pub objects_dropped: u64,
    /// Objects of this recovery now in the index.
    pub objects_live: u64,
    /// Tombstones appended to this master's log.
    pub tombstones_appended: u64,
    /// Log bytes appended (objects, tombstones and completion records).
    pub bytes_appended: u64,
    /// Completion records appended to this master's log and held.
    pub completions_kept: u64,
}

/// The state of one recovery's replay, shared by its pieces.
///
/// # Concurrency
/// Held in an `Arc<parking_lot::Mutex<_>>` by the driver and the replay jobs it submits;
/// the appender locks it only while it holds the store lock (lock order: store, then
/// state), and nothing awaits under it.
#[derive(Debug, Default)]
pub struct ReplayState {
    /// Per table and key, the highest version deleted by a tombstone of this recovery.
    /// Invariant: a tombstone's version is recorded before any later entry is replayed,
    /// and an object at or below it is never appended afterwards.
    deleted: HashMap<TableId, HashMap<Box<[u8]>, Version>>,
    /// The highest version seen in any entry (0 before the first), shifted.
    version_max: Version,
    /// Added to every replayed version (`RecoverRequest::version_floor`: 0 unless the
    /// recovery may lose data). A shift keeps the order of versions, so the replay rules
    /// work alike on shifted versions.
    version_floor: u64,
    /// What was replayed.
    counts: ReplayCounts,
}

impl ReplayState {
    /// A fresh state for one recovery.
    pub fn new() -> ReplayState {
        ReplayState::default()
    }

    /// A fresh state for a recovery whose versions are shifted up by `version_floor`
    /// (see `RecoverRequest::version_floor`).
    pub fn with_version_floor(version_floor: u64) -> ReplayState {
        ReplayState {
            version_floor,
            ..ReplayState::default()
        }
    }

    /// The floor every replayed version is shifted by (0 unless loss was allowed).
    pub fn version_floor(&self) -> Version {
        Version(self.version_floor)
    }

    /// `version` of the crashed master's log as this recovery replays it: shifted up by
    /// the version floor (saturating: a floor that near `u64::MAX` is not reached).
    pub fn shifted(&self, version: Version) -> Version {
        if version.0 == 0 {
            return version;
        }
        Version(version.0.saturating_add(self.version_floor))
    }

    /// The highest version a tombstone of this recovery deleted for `key`.
    pub fn deleted(&self, table: TableId, key: &[u8]) -> Option<Version> {
        self.deleted.get(&table)?.get(key).copied()
    }

    /// Records that a tombstone deleted `version` of `key`; false if an equal or newer
    /// deletion was already recorded (the tombstone adds nothing).
    pub fn note_deleted(&mut self, table: TableId, key: &[u8], version: Version) -> bool {
        let keys = self.deleted.entry(table).or_default();
        match keys.get_mut(key) {
            Some(known) if *known >= version => false,
            Some(known) => {
                *known = version;
                true
            }
            None => {
                keys.insert(key.into(), version);
                true
            }
        }
    }

    /// Notes a version seen.
    pub fn note_version(&mut self, version: Version) {
        self.version_max = self.version_max.max(version);
    }

    /// The highest version seen.
    pub fn version_max(&self) -> Version {
        self.version_max
    }

    /// What was replayed so far.
    pub fn counts(&self) -> ReplayCounts {
        self.counts
    }

    /// The counts, for the store to update.
    pub fn counts_mut(&mut self) -> &mut ReplayCounts {
        &mut self.counts
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rampart_common::ids::ServerId;

    const T: TableId = TableId(1);

    #[test]
    fn in_ranges_checks_table_and_bounds() {
        let ranges = [
            HashRange::new(T, 10, 20),
            HashRange::new(T, 30, 40),
            HashRange::whole(TableId(2)),
        ];
        for (table, hash, inside) in [
            (T, 9, false),
            (T, 10, true),
            (T, 20, true),
            (T, 25, false),
            (T, 40, true),
            (T, 41, false),
            (TableId(2), u64::MAX, true),
            (TableId(3), 15, false),
        ] {
            assert_eq!(
                in_ranges(&ranges, table, KeyHash(hash)),
                inside,
                "{table:?} {hash}"
            );
        }
    }

    /// A reply holding an object `k` (version 3) and a tombstone of `gone`.
    /// A 64 KiB segment of master 9 to write entries into.
    fn segment_writer() -> rampart_common::log::SegmentWriter {
        rampart_common::log::SegmentWriter::open(
            ServerId(9),
            SegmentId(1),
            1 << 16,
            &[SegmentId(1)],
        )
        .expect("a 64 KiB segment opens")
    }

    fn reply() -> PieceBytes {
        let mut writer = segment_writer();
        let start = writer.bytes().len();
        writer
            .append_object(T, Version(3), b"k", b"value")
            .expect("fits");
        writer
            .append_tombstone(T, Version(2), SegmentId(1), b"gone")
            .expect("fits");
        writer.append_safe_version(Version(9)).expect("fits");
        PieceBytes {
            safe_version: Version(4),
            entries: Bytes::copy_from_slice(&writer.bytes()[start..]),
            count: 2,
        }
    }

    #[test]
    fn parse_decodes_completion_records_and_keeps_them_to_their_partition() {
        let mut writer = segment_writer();
        let start = writer.bytes().len();
        let record = CompletionEntry {
            table: T,
            key_hash: KeyHash(77),
            client: rampart_common::ids::ClientId(3),
            seq: 4,
            ack: 2,
            version: Version(6),
            counter: Some(10),
        };
        writer.append_completion(&record).expect("fits");
        let bytes = PieceBytes {
            safe_version: Version(1),
            entries: Bytes::copy_from_slice(&writer.bytes()[start..]),
            count: 1,
        };
        let piece = RecoveryPiece::parse(SegmentId(5), bytes.clone(), &[HashRange::whole(T)])
            .expect("parses");
        assert_eq!(piece.entries(), &[PieceEntry::Completion(record)]);
        assert_eq!(piece.entries()[0].table_and_hash(), (T, KeyHash(77)));
        let elsewhere = [HashRange::new(T, 78, u64::MAX)];
        assert!(matches!(
            RecoveryPiece::parse(SegmentId(5), bytes, &elsewhere),
            Err(PieceError::OutsidePartition { .. })
        ));
    }

    #[test]
    fn parse_decodes_objects_tombstones_and_the_floor() {
        let piece = RecoveryPiece::parse(SegmentId(5), reply(), &[HashRange::whole(T)])
            .expect("a well-formed piece parses");
        assert_eq!(piece.segment(), SegmentId(5));
        assert_eq!(
            piece.safe_version(),
            Version(9),
            "the higher of reply and entry"
        );
        assert_eq!(piece.entries().len(), 2);
        assert!(matches!(
            &piece.entries()[0],
            PieceEntry::Object { key, value, version: Version(3), .. }
                if &key[..] == b"k" && &value[..] == b"value"
        ));
        assert!(matches!(
            &piece.entries()[1],
            PieceEntry::Tombstone { key, version: Version(2), .. } if &key[..] == b"gone"
        ));
    }

    #[test]
    fn parse_refuses_bad_crcs_foreign_keys_wrong_counts_and_stray_bytes() {
        let all = [HashRange::whole(T)];
        let mut corrupt = reply();
        let mut bytes = corrupt.entries.to_vec();
        bytes[20] ^= 1;
        corrupt.entries = Bytes::from(bytes);
        assert!(matches!(
            RecoveryPiece::parse(SegmentId(1), corrupt, &all),
            Err(PieceError::Entry(_))
        ));
        let hash = key_hash(b"k").0;
        let elsewhere = [HashRange::new(
            T,
            hash.wrapping_add(1),
            hash.wrapping_add(1),
        )];
        assert!(matches!(
            RecoveryPiece::parse(SegmentId(1), reply(), &elsewhere),
            Err(PieceError::OutsidePartition { offset: 0 })
        ));
        let miscounted = PieceBytes {
            count: 3,
            ..reply()
        };
        assert!(matches!(
            RecoveryPiece::parse(SegmentId(1), miscounted, &all),
            Err(PieceError::CountMismatch { said: 3, found: 2 })
        ));
        let mut padded = reply();
        let mut bytes = padded.entries.to_vec();
        bytes.extend_from_slice(&[0; 7]);
        padded.entries = Bytes::from(bytes);
        assert!(matches!(
            RecoveryPiece::parse(SegmentId(1), padded, &all),
            Err(PieceError::TrailingBytes { bytes: 7, .. })
        ));
    }

    #[test]
    fn later_tombstones_raise_the_deleted_version_only_upwards() {
        let mut state = ReplayState::new();
        assert!(state.note_deleted(T, b"k", Version(5)));
        assert!(!state.note_deleted(T, b"k", Version(5)));
        assert!(!state.note_deleted(T, b"k", Version(3)));
        assert!(state.note_deleted(T, b"k", Version(7)));
        assert_eq!(state.deleted(T, b"k"), Some(Version(7)));
        assert_eq!(state.deleted(T, b"other"), None);
    }
}
