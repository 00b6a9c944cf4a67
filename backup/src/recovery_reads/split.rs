//! The split of a replica into recovery pieces (the `recovery_reads` module doc, and
//! docs/design.md §6 "The backups' side of recovery"): [`PartitionIndex`], which
//! partition each key hash belongs to, and the pure [`split_replica`], with the two
//! passes the reader uses on its own ([`note_places`], then [`copy_pieces`] or the
//! region's `write_pieces`).

use rampart_common::ids::{key_hash, KeyHash, SegmentId, ServerId, TableId, Version};
use rampart_common::log::{
    entries, object_entry_bytes, scan, tombstone_entry_bytes, Entry, COMPLETION_ENTRY_BYTES,
};
use rampart_common::protocol::backup::{PartitionRanges, ReplicaInfo};
use rampart_common::tablet::HashRange;

/// Partitions of one recovery attempt (one recovery master each). Bounds the per-segment
/// bookkeeping of a split.
pub const RECOVERY_PARTITIONS_MAX: usize = 4096;

/// Key-hash ranges of one recovery attempt, all partitions together (a few per tablet
/// of the crashed master). Bounds the cost of building the index, done on the reactor.
pub const RECOVERY_RANGES_MAX: usize = 65_536;

/// Why a set of partitions cannot be indexed.
#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq)]
pub enum PartitionError {
    /// More partitions than [`RECOVERY_PARTITIONS_MAX`].
    #[error("{count} partitions exceed the limit of {max}")]
    TooManyPartitions {
        /// Partitions given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More ranges than [`RECOVERY_RANGES_MAX`].
    #[error("{count} key-hash ranges exceed the limit of {max}")]
    TooManyRanges {
        /// Ranges given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A range whose start lies past its end.
    #[error("partition {partition}: range {table} [{start:#x}, {end:#x}] is empty")]
    EmptyRange {
        /// The partition's index.
        partition: u32,
        /// The range's table.
        table: TableId,
        /// Its first hash.
        start: u64,
        /// Its last hash.
        end: u64,
    },
    /// Two ranges (of one partition or of two) share a hash.
    #[error("partitions {first} and {second} overlap in {table} at {at:#x}")]
    Overlap {
        /// The table.
        table: TableId,
        /// The partition of the lower range.
        first: u32,
        /// The partition of the higher range.
        second: u32,
        /// The first hash they share.
        at: u64,
    },
}

/// Which partition each (table, key hash) belongs to: every partition's ranges, merged
/// and sorted, so that a lookup is one binary search however many partitions there are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionIndex {
    /// Invariants: 1. sorted by (table, start); 2. `start ≤ end` in each; 3. disjoint:
    /// of two neighbours in one table, the first ends before the second starts.
    ranges: Vec<IndexedRange>,
    /// Partitions indexed (some may have no range). Invariant: every `partition` in
    /// `ranges` is below it.
    partitions: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IndexedRange {
    table: TableId,
    start: u64,
    end: u64,
    partition: u32,
}

impl PartitionIndex {
    /// Indexes `partitions` (partition `i` is `partitions[i]`). Ranges are inclusive;
    /// they need not be sorted, but must not overlap, within a partition or across.
    pub fn new(partitions: &[PartitionRanges]) -> Result<PartitionIndex, PartitionError> {
        if partitions.len() > RECOVERY_PARTITIONS_MAX {
            return Err(PartitionError::TooManyPartitions {
                count: partitions.len(),
                max: RECOVERY_PARTITIONS_MAX,
            });
        }
        let count: usize = partitions.iter().map(Vec::len).sum();
        if count > RECOVERY_RANGES_MAX {
            return Err(PartitionError::TooManyRanges {
                count,
                max: RECOVERY_RANGES_MAX,
            });
        }
        let mut ranges = Vec::with_capacity(count);
        for (partition, list) in (0u32..).zip(partitions) {
            for &HashRange { table, start, end } in list {
                if start > end {
                    return Err(PartitionError::EmptyRange {
                        partition,
                        table,
                        start,
                        end,
                    });
                }
                ranges.push(IndexedRange {
                    table,
                    start,
                    end,
                    partition,
                });
            }
        }
        ranges.sort_unstable_by_key(|range| (range.table, range.start));
        for pair in ranges.windows(2) {
            let (low, high) = (pair[0], pair[1]);
            if low.table == high.table && low.end >= high.start {
                return Err(PartitionError::Overlap {
                    table: low.table,
                    first: low.partition,
                    second: high.partition,
                    at: high.start,
                });
            }
        }
        Ok(PartitionIndex {
            ranges,
            partitions: partitions.len() as u32,
        })
    }

    /// How many partitions were indexed.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The partition holding `hash` of `table`, if any.
    pub fn partition_of(&self, table: TableId, hash: KeyHash) -> Option<u32> {
        let after = self
            .ranges
            .partition_point(|range| (range.table, range.start) <= (table, hash.0));
        let range = self.ranges.get(after.checked_sub(1)?)?;
        (range.table == table && hash.0 <= range.end).then_some(range.partition)
    }
}

/// The entries of one replica that fall in one partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    /// Raw `Object` and `Tombstone` entries, headers included, in log order.
    pub entries: Vec<u8>,
    /// How many entries `entries` holds.
    pub count: u32,
}

/// A replica split by partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitReplica {
    /// The highest `SafeVersion` floor in the replica's valid prefix; 0 if none.
    pub safe_version: Version,
    /// One per partition of the index, by partition.
    pub pieces: Vec<Piece>,
}

/// Why a replica cannot be split.
#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq)]
pub enum SplitError {
    /// A closed replica whose valid prefix does not end with its footer (docs/design.md §4:
    /// treated as corrupt, another replica is used).
    #[error(
        "closed replica {master}/{segment} does not scan to its footer: valid prefix \
         {valid_bytes} of {length} bytes ({stop})"
    )]
    NotClosed {
        /// Whose log.
        master: ServerId,
        /// Which segment.
        segment: SegmentId,
        /// Where the valid prefix ends.
        valid_bytes: u32,
        /// Bytes of the replica.
        length: usize,
        /// Why the scan stopped.
        stop: String,
    },
    /// The segment header names another log or segment than the replica it was read as.
    #[error("replica {master}/{segment} holds the header of {found_master}/{found_segment}")]
    WrongSegment {
        /// Whose log it was read as.
        master: ServerId,
        /// Which segment it was read as.
        segment: SegmentId,
        /// The header's log id.
        found_master: ServerId,
        /// The header's segment id.
        found_segment: SegmentId,
    },
}

/// Splits the replica `bytes` (described by `replica`) into one piece per partition of
/// `index`: the valid prefix is found with [`scan`], its `Object` and `Tombstone`
/// entries are appended, raw, to the piece of the partition holding their (table, key
/// hash), and entries in no partition are skipped. Pure.
///
/// Each piece is allocated once at its exact size: a first pass over the entries
/// notes where each one goes, the second copies. Pieces grown by doubling cost a
/// reallocation and copy per doubling and up to twice their size in fresh pages, and
/// the cache holds them for the whole recovery.
pub fn split_replica(
    bytes: &[u8],
    replica: &ReplicaInfo,
    index: &PartitionIndex,
) -> Result<SplitReplica, SplitError> {
    split_replica_noting_in(bytes, replica, index, &mut Vec::new())
}

/// Where one entry of a replica goes: (partition, start, end).
pub(super) type EntryPlace = (u32, usize, usize);

/// [`split_replica`], noting where entries go in `places` (cleared first): a reader
/// passes the same vector for every replica, so the notes, ~24 bytes per entry, cost
/// no fresh memory after the first.
pub(super) fn split_replica_noting_in(
    bytes: &[u8],
    replica: &ReplicaInfo,
    index: &PartitionIndex,
    places: &mut Vec<EntryPlace>,
) -> Result<SplitReplica, SplitError> {
    let notes = note_places(bytes, replica, index, places)?;
    Ok(SplitReplica {
        safe_version: notes.safe_version,
        pieces: copy_pieces(bytes, &notes, places),
    })
}

/// The second pass of a split into the backup's own memory: one piece per partition,
/// each allocated once at its exact size.
pub(super) fn copy_pieces(bytes: &[u8], notes: &Notes, places: &[EntryPlace]) -> Vec<Piece> {
    let mut pieces: Vec<Piece> = notes
        .bytes
        .iter()
        .zip(&notes.counts)
        .map(|(&size, &count)| Piece {
            entries: Vec::with_capacity(size),
            count,
        })
        .collect();
    for &(partition, start, end) in places {
        // In bounds: `entries` decoded these entries whole from `bytes`.
        pieces[partition as usize]
            .entries
            .extend_from_slice(&bytes[start..end]);
    }
    pieces
}

/// What [`note_places`] found besides the places: the replica's `SafeVersion` floor, and
/// each partition's bytes and entries.
pub(super) struct Notes {
    pub(super) safe_version: Version,
    pub(super) bytes: Vec<usize>,
    pub(super) counts: Vec<u32>,
}

/// The first pass of a split: checks the replica and notes, in `places` (cleared
/// first), where each run of entries goes — neighbouring entries of one partition make
/// one run.
pub(super) fn note_places(
    bytes: &[u8],
    replica: &ReplicaInfo,
    index: &PartitionIndex,
    places: &mut Vec<EntryPlace>,
) -> Result<Notes, SplitError> {
    let found = scan(bytes);
    if replica.closed && !found.closed {
        return Err(SplitError::NotClosed {
            master: replica.master,
            segment: replica.segment,
            valid_bytes: found.valid_bytes,
            length: bytes.len(),
            stop: format!("{:?}", found.stop),
        });
    }
    if let Some(header) = found.header {
        if (header.log_id, header.segment_id) != (replica.master, replica.segment) {
            return Err(SplitError::WrongSegment {
                master: replica.master,
                segment: replica.segment,
                found_master: header.log_id,
                found_segment: header.segment_id,
            });
        }
    }
    let partitions = index.partitions() as usize;
    let mut notes = Notes {
        safe_version: Version(0),
        bytes: vec![0; partitions],
        counts: vec![0; partitions],
    };
    // Each run of entries that goes to a piece, in log order.
    places.clear();
    for (offset, entry) in entries(bytes, found.valid_bytes) {
        // Completion records (`rampart_common::rifl`) go where the object they name
        // goes: they carry its key hash.
        let (table, hash, length) = match entry {
            Entry::Object(object) => (
                object.table,
                key_hash(object.key),
                object_entry_bytes(object.key.len(), object.value.len()),
            ),
            Entry::Tombstone(tombstone) => (
                tombstone.table,
                key_hash(tombstone.key),
                tombstone_entry_bytes(tombstone.key.len()),
            ),
            Entry::Completion(record) => (record.table, record.key_hash, COMPLETION_ENTRY_BYTES),
            Entry::SafeVersion(floor) => {
                notes.safe_version = notes.safe_version.max(floor);
                continue;
            }
            Entry::Header(_) | Entry::Digest(_) | Entry::Checksum(_) | Entry::Footer { .. } => {
                continue
            }
        };
        let Some(partition) = index.partition_of(table, hash) else {
            continue;
        };
        let start = offset as usize;
        notes.bytes[partition as usize] += length;
        notes.counts[partition as usize] += 1;
        match places.last_mut() {
            Some((last, _, end)) if *last == partition && *end == start => *end += length,
            _ => places.push((partition, start, start + length)),
        }
    }
    Ok(notes)
}
