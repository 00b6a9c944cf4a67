//! Newtype identifiers shared by every crate and by the wire and log formats.
//!
//! Each is a plain `u64` on the wire and on disk (little-endian), wrapped so that a
//! `TableId` can never be passed where a `SegmentId` is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl From<u64> for $name {
            fn from(v: u64) -> Self {
                $name(v)
            }
        }
    };
}

id_type!(
    /// A storage server, assigned by the coordinator at enlistment. Never reused. It is
    /// also the log id of the server's master: segment headers carry it.
    ServerId,
    "server-"
);
id_type!(
    /// A table, assigned by the coordinator at creation. Never reused, so a dropped and
    /// re-created table name gets a fresh id and old objects can never reappear under it.
    TableId,
    "table-"
);
id_type!(
    /// A client of the table API, assigned by the coordinator when it connects
    /// (`OpenClient`). Never reused: masters keep completion records of its writes under
    /// it (`crate::rifl`). 0 is never assigned and means "no client id".
    ClientId,
    "client-"
);
id_type!(
    /// A move of tablets from one master to another (`BeginMove` in the coordinators'
    /// state), assigned when it begins. Never reused: the move's commit or abort names it,
    /// and only one of them takes effect.
    MoveId,
    "move-"
);
/// A segment of one master's log. Two spaces of ids, never mixed:
/// * the log's *head chain* — ids grow by one per new head segment (1, 2, 3, …), each
///   opening with a digest and closed by a footer naming its successor, so recovery
///   finds the head (the highest id) and checks footers by id arithmetic;
/// * the cleaner's *survivor* segments ([`SegmentId::survivor`]), from
///   [`SegmentId::SURVIVOR_FIRST`] up: written whole and closed before a digest names
///   them, never a head. Keeping them out of the head chain's ids keeps every rule of
///   the head chain ("the highest segment is the head", "two below the head only the
///   footer counts") true without knowing what each replica is.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct SegmentId(pub u64);

impl SegmentId {
    /// The first survivor segment id; every id from here up is a survivor's.
    pub const SURVIVOR_FIRST: SegmentId = SegmentId(1 << 63);

    /// The `n`th survivor segment of a log (`n` from 0).
    pub fn survivor(n: u64) -> SegmentId {
        SegmentId(Self::SURVIVOR_FIRST.0 | (n & !Self::SURVIVOR_FIRST.0))
    }

    /// Whether this is a survivor segment (written by the cleaner), not a head.
    pub fn is_survivor(self) -> bool {
        self >= Self::SURVIVOR_FIRST
    }
}

impl fmt::Display for SegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_survivor() {
            write!(f, "survivor-{}", self.0 & !Self::SURVIVOR_FIRST.0)
        } else {
            write!(f, "segment-{}", self.0)
        }
    }
}

impl From<u64> for SegmentId {
    fn from(v: u64) -> Self {
        SegmentId(v)
    }
}

/// The version of an object. Strictly increasing over the life of a key, also across
/// delete and re-create (the master's safe-version floor guarantees it).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Version(pub u64);

impl Version {
    /// The version the first object of a fresh master gets; 0 is never a real version,
    /// so it can mean "no object" in reject rules and replies.
    pub const FIRST: Version = Version(1);

    /// The next version after this one (saturating: 2^64 − 1 versions are not reached,
    /// and a version must not wrap to 0, "no object").
    pub fn next(self) -> Version {
        Version(self.0.saturating_add(1))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Counters that order the states of one thing, or number things handed out in order:
/// plain numbers in logs, a `u64` on the wire and on disk, never mixed up with one
/// another or with ids.
macro_rules! counter_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        pub struct $name(pub u64);

        impl $name {
            /// The one after this (saturating: 2^64 − 1 steps are never reached).
            pub fn next(self) -> $name {
                $name(self.0.saturating_add(1))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

counter_type!(
    /// A master's tablet epoch: how many committed changes of the tablet map touched
    /// the tablets it owns. A master applies the changes in epoch order and pulls its
    /// tablets when it finds one missing.
    TabletEpoch
);
counter_type!(
    /// The epoch of a segment's replicas: every placement attempt of an open segment
    /// takes a new one; a recovery counts an open segment's copies at the recorded epoch
    /// or newer. A backup refuses an operation naming an epoch older than its copy's
    /// (`StaleEpoch`). Not to be confused with a master's [`TabletEpoch`].
    Epoch
);
counter_type!(
    /// A backup's handle of one frame (an open replica's buffer): handed out in
    /// increasing order, never repeated and never 0, which the frame file's owner word
    /// uses to mark a free slot.
    FrameHandle
);

impl Epoch {
    /// Newer than every epoch a replica can have: a bound that frees any copy.
    pub const MAX: Epoch = Epoch(u64::MAX);
}

/// The 64-bit hash of a key that decides which tablet owns it: xxh3-64 of the key bytes
/// (seed 0). Client and server compute it with [`key_hash`]; it is part of the protocol
/// and must never change.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct KeyHash(pub u64);

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

/// The key hash of docs/design.md §3: xxh3-64 of the key bytes.
pub fn key_hash(key: &[u8]) -> KeyHash {
    KeyHash(xxhash_rust::xxh3::xxh3_64(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hash_is_the_documented_function() {
        // Pinned values: changing the hash would move every key to another tablet.
        assert_eq!(key_hash(b"").0, 0x2d06_8005_38d3_94c2);
        assert_eq!(key_hash(b"abc"), key_hash(b"abc"));
        assert_ne!(key_hash(b"abc"), key_hash(b"abd"));
    }

    #[test]
    fn ids_display_with_their_kind() {
        assert_eq!(ServerId(3).to_string(), "server-3");
        assert_eq!(TableId(7).to_string(), "table-7");
        assert_eq!(Version(9).to_string(), "v9");
        assert_eq!(Epoch(4).to_string(), "4");
        assert_eq!(FrameHandle(5).to_string(), "5");
        assert_eq!(SegmentId(12).to_string(), "segment-12");
        assert_eq!(SegmentId::survivor(3).to_string(), "survivor-3");
    }

    #[test]
    fn survivor_ids_lie_above_every_head_id() {
        assert!(!SegmentId(1).is_survivor());
        assert!(!SegmentId((1 << 63) - 1).is_survivor());
        assert!(SegmentId::survivor(0).is_survivor());
        assert!(SegmentId::survivor(0) > SegmentId((1 << 63) - 1));
        assert!(SegmentId::survivor(1) > SegmentId::survivor(0));
        assert_eq!(SegmentId::survivor(0), SegmentId::SURVIVOR_FIRST);
    }

    #[test]
    fn counters_encode_as_the_integers_they_replaced() {
        // Wire messages, Raft logs and snapshots written with raw u64s must still decode.
        let bytes = bincode::serialize(&Epoch(7)).expect("encodes");
        assert_eq!(bytes, bincode::serialize(&7u64).expect("encodes"));
        assert_eq!(bincode::deserialize::<Epoch>(&bytes).ok(), Some(Epoch(7)));
        let bytes = bincode::serialize(&FrameHandle(u64::MAX)).expect("encodes");
        assert_eq!(bytes, bincode::serialize(&u64::MAX).expect("encodes"));
        assert_eq!(Epoch(7).next(), Epoch(8));
    }
}
