//! `ObjectStore`: the master's objects — its log, index, tablets and version floor —
//! as a plain synchronous struct (STYLE.md habit 8). The async appender and the RPC
//! service drive it; tests drive it directly.
//! It speaks domain types only ([`WriteOp`], [`OpOutcome`], [`Object`],
//! [`EnumeratePage`]); the RPC service (`service.rs`) converts them to and from the
//! wire.
//!
//! One file per role, each adding its own `impl ObjectStore` block:
//! * `store` — the `ObjectStore` struct, its fields and their invariants, its
//!   constructors, and the internals every role shares.
//! * `ops` — the domain types: [`WriteOp`], [`OpOutcome`], [`Object`], [`EnumeratePage`].
//! * `batch` — [`Batch`]: the effects of one append batch, staged but not published.
//! * `writes` — staging a write batch, sealing it, publishing it (stage, replicate,
//!   publish); its tests are in `writes_tests`.
//! * `reads` — reads and enumeration of published objects.
//! * `replay` — staging a crashed master's log into this one (recovery replay), and
//!   forgetting what a failed recovery left.
//! * `cleaning` — the cleaner's passes over the log, the segments a failed recovery
//!   tainted first.
//! * `tablets` — taking, dropping and replacing tablets, by tablet epoch.
//! * `moves` — the source's side of a move of tablets: pieces cut from the index, the
//!   tails of what changed meanwhile, the range frozen for the last; and the target's
//!   registration of a move in. `move_types` — their types and limits (a leaf).
//! * `versions` — the safe version and the version ceiling reserved at the coordinator.
//! * `exactly_once` — completion records and clients' leases (exactly-once).
//! * `will` — the profiles of everything appended, and the will cut from them.
//! * `test_support` (tests only) — the stores, operations and recovery pieces the
//!   tests share.
//!
//! # Versions
//! An overwrite gets the old version + 1. A new object (no live object with its key)
//! gets the *safe version*: a floor above every version this master ever removed, so a
//! key deleted and re-created never reuses a version. The floor is written into every
//! new segment (`SafeVersion` entry) and tombstones carry the removed version, so
//! recovery can rebuild it.
//!
//! Every version handed out is also below the master's *version ceiling*, reserved
//! ahead at the coordinator (`ReserveVersions`, [`VERSION_RESERVATION`] at a time): so the
//! coordinator knows a version above every one this master ever handed out even if part
//! of its log is lost, and a recovery the operator let lose data (`allow-loss`) shifts
//! what survives above it — versions never repeat. A write that would need a version at
//! or above the ceiling is answered `Retry` until the next reservation lands.
//!
//! # Removals: deleted stays deleted
//! Recovery replays whatever versions a log holds, and the highest version of a key
//! wins unless a tombstone of an equal or higher version kills it. Dead versions stay
//! in their segments until the cleaner takes those, so the rule that keeps a removed
//! key removed is: *every dead version in the log is masked, for as long as its segment
//! is in the log, by an entry of its key with a version at least its own.*
//! * A removal appends a tombstone naming the segment of the version it removes; the
//!   cleaner keeps the tombstone while that segment is in the log.
//! * An append that supersedes a version in another segment — an overwrite, an
//!   increment, a replay superseding what it replayed before — appends a tombstone for
//!   that version in the same group, after the new object (RAMCloud does the same): a
//!   crash that keeps the tombstone keeps the object. A version superseded in the same
//!   segment needs none: the newer object lives in that segment as long as it does, and
//!   masks it (and when that one dies in turn, its own tombstone, of a higher version,
//!   masks both).
//!
//! By induction every dead version is masked until its segment leaves the log, however
//! often the key was overwritten and in whatever order segments are cleaned. The cost
//! is a tombstone (37 bytes and the key) per overwrite that lands in another segment
//! than the version it replaces, alive until that version's segment is cleaned.
//!
//! A recovery that fails leaves entries for ranges this master does not own; a
//! tombstone cannot mask those (the range's next owner may replay the very same
//! versions here later), so their segments are cleaned out of the log before any
//! further replay ([`ObjectStore::forget_unowned`]).

mod batch;
mod cleaning;
mod exactly_once;
mod move_types;
mod moves;
#[cfg(test)]
mod moves_tests;
mod ops;
mod reads;
mod replay;
mod store;
mod tablets;
#[cfg(test)]
mod test_support;
mod versions;
mod will;
mod writes;
#[cfg(test)]
mod writes_tests;

pub use batch::Batch;
pub use move_types::{
    MovePiece, DIRTY_KEYS_MAX, DIRTY_RECORDS_MAX, ENDED_MOVES_KEPT, MOVES_OUT_MAX,
    MOVE_PIECE_BYTES_MAX,
};
pub use ops::{EnumeratePage, Object, OpOutcome, WriteOp};
pub use store::ObjectStore;
#[cfg(test)]
pub(crate) use test_support::ReadResult;
pub use versions::{VERSION_LOW_WATER, VERSION_RESERVATION};
