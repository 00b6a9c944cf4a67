//! The domain types the store speaks: a [`WriteOp`] in, its [`OpOutcome`] out, and the
//! [`Object`]s and [`EnumeratePage`]s reads return. The RPC service converts them to
//! and from the wire.

use bytes::Bytes;
use rampart_common::ids::{TableId, Version};
use rampart_common::log::COMPLETION_ENTRY_BYTES;
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;

/// A write-type operation on one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Store `value` under `key`.
    Write {
        /// The table.
        table: TableId,
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
        /// When to refuse.
        rules: RejectRules,
        /// Its exactly-once identity ([`Rifl::NONE`]: none).
        rifl: Rifl,
    },
    /// Remove `key`.
    Remove {
        /// The table.
        table: TableId,
        /// The key.
        key: Bytes,
        /// When to refuse.
        rules: RejectRules,
        /// Its exactly-once identity ([`Rifl::NONE`]: none).
        rifl: Rifl,
    },
    /// Add `delta` to the integer under `key` (a missing object counts as 0).
    Increment {
        /// The table.
        table: TableId,
        /// The key.
        key: Bytes,
        /// What to add.
        delta: i64,
        /// When to refuse.
        rules: RejectRules,
        /// Its exactly-once identity ([`Rifl::NONE`]: none).
        rifl: Rifl,
    },
}

impl WriteOp {
    pub(super) fn table_and_key(&self) -> (TableId, &Bytes) {
        match self {
            WriteOp::Write { table, key, .. }
            | WriteOp::Remove { table, key, .. }
            | WriteOp::Increment { table, key, .. } => (*table, key),
        }
    }

    /// Its exactly-once identity.
    pub fn rifl(&self) -> Rifl {
        match self {
            WriteOp::Write { rifl, .. }
            | WriteOp::Remove { rifl, .. }
            | WriteOp::Increment { rifl, .. } => *rifl,
        }
    }

    /// Log bytes this operation may append (for batch sizing).
    pub fn bytes(&self) -> usize {
        let record = if self.rifl().is_tracked() {
            COMPLETION_ENTRY_BYTES
        } else {
            0
        };
        record
            + match self {
                WriteOp::Write { key, value, .. } => key.len() + value.len(),
                WriteOp::Remove { key, .. } | WriteOp::Increment { key, .. } => key.len() + 8,
            }
    }
}

/// The result of one [`WriteOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpOutcome {
    /// `Ok`, or why the operation was refused (then it changed nothing).
    pub status: Status,
    /// Applied: the object's new version; of a remove, the version removed (0 when
    /// there was no object). Refused: the key's current version where the check that
    /// refused it read one (reject rules, an increment of a non-integer), else 0.
    pub version: Version,
    /// An applied increment: the counter's new value.
    pub counter: Option<i64>,
}

impl OpOutcome {
    pub(super) fn failed(status: Status, version: Version) -> OpOutcome {
        OpOutcome {
            status,
            version,
            counter: None,
        }
    }

    pub(super) fn applied(version: Version) -> OpOutcome {
        OpOutcome::failed(Status::Ok, version)
    }
}

/// A published object, as a read finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// Its version.
    pub version: Version,
    /// A copy of its value.
    pub value: Bytes,
}

/// One page of an enumeration
/// ([`ObjectStore::enumerate`](super::store::ObjectStore::enumerate)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnumeratePage {
    /// The objects, as `(key, object)`, in key-hash order.
    pub objects: Vec<(Bytes, Object)>,
    /// Where the next page starts, or `None` when the requested range is done.
    pub next_hash: Option<u64>,
}
