//! The types and limits of moves of tablets out of and into this master (`moves` has
//! the store's side of them): a leaf, so that the store's struct and its `moves` role
//! both use them.

use rampart_common::ids::{ClientId, KeyHash, Version};
use rampart_common::tablet::HashRange;
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::time::Instant;

/// Most moves out of one master at once.
pub const MOVES_OUT_MAX: usize = 64;

/// Most keys one move's dirty set holds between two tails.
pub const DIRTY_KEYS_MAX: usize = 1 << 18;

/// Most completion records one move's dirty set holds between two tails (those of the
/// range held at the open count).
pub const DIRTY_RECORDS_MAX: usize = 1 << 20;

/// How many ended moves a master remembers, to refuse a late step of one (an `EndMove`
/// that overtook the target's freeze, or its `MoveIn`, must not be undone by it).
pub const ENDED_MOVES_KEPT: usize = 1024;

/// The largest piece a target may ask for, in bytes (a piece may go past its budget by
/// one entry, or by the objects of one hash).
pub const MOVE_PIECE_BYTES_MAX: usize = 8 << 20;

/// One move out of this master.
#[derive(Debug)]
pub(super) struct MoveOut {
    pub(super) range: HashRange,
    /// Keys of the range changed since the last tail, by hash and key.
    pub(super) dirty: HashSet<(KeyHash, Vec<u8>)>,
    /// The same keys in the order they were noted: a tail drains from the front (a
    /// hash set's first entry is found in time that grows as it empties).
    pub(super) dirty_order: VecDeque<(KeyHash, Vec<u8>)>,
    /// Completion records of the range not sent yet.
    pub(super) dirty_records: BTreeSet<(ClientId, u64)>,
    /// A key or record was not noted: the move cannot complete.
    pub(super) overflowed: bool,
    /// Since when reads and writes of the range answer `Retry`.
    pub(super) frozen: Option<Instant>,
    /// When it opened.
    pub(super) opened: Instant,
}

/// A piece of a moving range in the log's format (objects, tombstones, completion
/// records), what the target replays (`crate::replay::RecoveryPiece::parse`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MovePiece {
    /// The entries, one after another.
    pub entries: Vec<u8>,
    /// How many.
    pub count: u32,
    /// This master's safe version: the target's rises above it.
    pub safe_version: Version,
    /// A copy: where the next piece starts (`None`: the walk is done).
    pub next: Option<u64>,
    /// A tail: how many keys and records still wait.
    pub left: u64,
}
