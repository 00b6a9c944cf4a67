//! `ObjectStore`: the master's objects — its log, index, tablets and version floor —
//! as a plain synchronous struct (STYLE.md habit 8). The async appender and the RPC
//! service drive it; tests drive it directly.
//!
//! # Write protocol: stage, replicate, publish
//! Writes are applied in batches (group commit). [`ObjectStore::stage`] checks one
//! operation against its tablet, its limits and its reject rules, computes the new
//! version and appends the log entry, recording the effect in the [`Batch`]. A later
//! operation of the same batch on the same key sees the staged effect. Staged effects
//! are *not* visible to reads. After the batch is sealed and replicated,
//! [`ObjectStore::publish`] applies the effects to the index, making them visible; only
//! then are the writes acknowledged. So a read never returns a value that a crash
//! could still lose.
//!
//! # Versions
//! An overwrite gets the old version + 1. A new object (no live object with its key)
//! gets the *safe version*: a floor above every version this master ever removed, so a
//! key deleted and re-created never reuses a version. The floor is written into every
//! new segment (`SafeVersion` entry) and tombstones carry the removed version, so
//! recovery can rebuild it.

use bytes::Bytes;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{key_hash, KeyHash, ServerId, TableId, Version};
use rampart_common::limits::{ENUMERATE_PAGE_BYTES_MAX, KEY_BYTES_MAX};
use rampart_common::protocol::master::{
    EnumerateReply, EnumerateRequest, EnumeratedObject, IncrementReply, ReadReply, WriteReply,
};
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use std::collections::HashMap;

use crate::object_index::{LogRef, ObjectIndex};
use crate::segmented_log::{SegmentRange, SegmentedLog};
use crate::tablets::OwnedTablets;

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
    },
    /// Remove `key`.
    Remove {
        /// The table.
        table: TableId,
        /// The key.
        key: Bytes,
        /// When to refuse.
        rules: RejectRules,
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
    },
}

impl WriteOp {
    fn table_and_key(&self) -> (TableId, &Bytes) {
        match self {
            WriteOp::Write { table, key, .. }
            | WriteOp::Remove { table, key, .. }
            | WriteOp::Increment { table, key, .. } => (*table, key),
        }
    }

    /// Log bytes this operation may append (for batch sizing).
    pub fn bytes(&self) -> usize {
        match self {
            WriteOp::Write { key, value, .. } => key.len() + value.len(),
            WriteOp::Remove { key, .. } | WriteOp::Increment { key, .. } => key.len() + 8,
        }
    }
}

/// The result of one [`WriteOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpOutcome {
    /// Of a write or remove.
    Write(WriteReply),
    /// Of an increment.
    Increment(IncrementReply),
}

impl OpOutcome {
    fn failed(status: Status, version: Version) -> OpOutcome {
        OpOutcome::Write(WriteReply { status, version })
    }

    /// The outcome's status.
    pub fn status(&self) -> Status {
        match self {
            OpOutcome::Write(reply) => reply.status,
            OpOutcome::Increment(reply) => reply.status,
        }
    }

    /// As a write/remove reply (an increment's value is dropped).
    pub fn into_write_reply(self) -> WriteReply {
        match self {
            OpOutcome::Write(reply) => reply,
            OpOutcome::Increment(reply) => WriteReply {
                status: reply.status,
                version: reply.version,
            },
        }
    }

    /// As an increment reply (a write's value reads as 0).
    pub fn into_increment_reply(self) -> IncrementReply {
        match self {
            OpOutcome::Increment(reply) => reply,
            OpOutcome::Write(reply) => IncrementReply {
                status: reply.status,
                version: reply.version,
                value: 0,
            },
        }
    }
}

/// What a staged operation did to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staged {
    /// The key now holds the object at `at`.
    Live { version: Version, at: LogRef },
    /// The key was removed.
    Removed,
}

/// The effects of one append batch, staged but not yet published.
#[derive(Debug, Default)]
pub struct Batch {
    /// Final staged state per (table, key); later operations of the batch read it.
    staged: HashMap<(TableId, Bytes), Staged>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Whether nothing was staged.
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }
}

/// A master's objects.
#[derive(Debug)]
pub struct ObjectStore {
    config: MasterConfig,
    log: SegmentedLog,
    /// Published objects only. Invariant: every reference points into `log`.
    index: ObjectIndex,
    tablets: OwnedTablets,
    /// Version of the next new object. Invariant: greater than every version this
    /// master has removed or overwritten.
    safe_version: Version,
}

impl ObjectStore {
    /// An empty store for master `server_id`.
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn new(server_id: ServerId, config: MasterConfig) -> ObjectStore {
        assert_eq!(config.validate(), Ok(()), "master config must be validated");
        let safe_version = Version::FIRST;
        ObjectStore {
            log: SegmentedLog::new(server_id, &config, safe_version),
            config,
            index: ObjectIndex::new(),
            tablets: OwnedTablets::new(),
            safe_version,
        }
    }

    fn check_key(&self, table: TableId, key: &[u8]) -> Result<KeyHash, Status> {
        if key.len() > KEY_BYTES_MAX {
            return Err(Status::KeyTooLarge);
        }
        let hash = key_hash(key);
        if !self.tablets.owns(table, hash) {
            return Err(Status::UnknownTablet);
        }
        Ok(hash)
    }

    /// Reads the published object `key`.
    pub fn read(&self, table: TableId, key: &[u8]) -> ReadReply {
        let hash = match self.check_key(table, key) {
            Ok(hash) => hash,
            Err(status) => {
                return ReadReply {
                    status,
                    version: Version(0),
                    value: Bytes::new(),
                }
            }
        };
        let log = &self.log;
        match self.index.lookup(table, hash, key, |r| log.key(r)) {
            Some(at) => {
                let object = log.object(at);
                ReadReply {
                    status: Status::Ok,
                    version: object.version,
                    value: Bytes::copy_from_slice(object.value),
                }
            }
            None => ReadReply {
                status: Status::ObjectDoesntExist,
                version: Version(0),
                value: Bytes::new(),
            },
        }
    }

    /// Like [`read`](Self::read) but hands the value to `f` without copying it first
    /// (the RPC service encodes it straight into the reply frame).
    pub fn read_with<R>(
        &self,
        table: TableId,
        key: &[u8],
        f: impl FnOnce(Status, Version, &[u8]) -> R,
    ) -> R {
        let hash = match self.check_key(table, key) {
            Ok(hash) => hash,
            Err(status) => return f(status, Version(0), &[]),
        };
        let log = &self.log;
        match self.index.lookup(table, hash, key, |r| log.key(r)) {
            Some(at) => {
                let object = log.object(at);
                f(Status::Ok, object.version, object.value)
            }
            None => f(Status::ObjectDoesntExist, Version(0), &[]),
        }
    }

    /// The current state of `key` for staging: staged effects first, then the index.
    fn current(
        &self,
        batch: &Batch,
        table: TableId,
        hash: KeyHash,
        key: &Bytes,
    ) -> Option<(Version, LogRef)> {
        if let Some(staged) = batch.staged.get(&(table, key.clone())) {
            return match staged {
                Staged::Live { version, at } => Some((*version, *at)),
                Staged::Removed => None,
            };
        }
        let log = &self.log;
        let at = self.index.lookup(table, hash, key, |r| log.key(r))?;
        Some((log.object(at).version, at))
    }

    /// Checks and appends one operation, recording its effect in `batch`.
    pub fn stage(&mut self, batch: &mut Batch, op: &WriteOp) -> OpOutcome {
        let (table, key) = op.table_and_key();
        if let WriteOp::Write { value, .. } = op {
            if value.len() > self.config.value_bytes_max {
                return OpOutcome::failed(Status::ValueTooLarge, Version(0));
            }
        }
        let hash = match self.check_key(table, key) {
            Ok(hash) => hash,
            Err(status) => return OpOutcome::failed(status, Version(0)),
        };
        let current = self.current(batch, table, hash, key);
        let current_version = current.map_or(Version(0), |(v, _)| v);
        let rules = match op {
            WriteOp::Write { rules, .. }
            | WriteOp::Remove { rules, .. }
            | WriteOp::Increment { rules, .. } => rules,
        };
        if let Some(status) = rules.check(current.map(|(v, _)| v)) {
            return OpOutcome::failed(status, current_version);
        }
        let new_version = current.map_or(self.safe_version, |(v, _)| v.next());
        match op {
            WriteOp::Write { value, .. } => {
                match self
                    .log
                    .append_object(table, new_version, key, value, self.safe_version)
                {
                    Ok(at) => {
                        batch.staged.insert(
                            (table, key.clone()),
                            Staged::Live {
                                version: new_version,
                                at,
                            },
                        );
                        OpOutcome::Write(WriteReply {
                            status: Status::Ok,
                            version: new_version,
                        })
                    }
                    Err(_) => OpOutcome::failed(Status::NoSpace, Version(0)),
                }
            }
            WriteOp::Remove { .. } => {
                let Some((version, at)) = current else {
                    // Removing a missing object succeeds and changes nothing.
                    return OpOutcome::Write(WriteReply {
                        status: Status::Ok,
                        version: Version(0),
                    });
                };
                let floor = self.safe_version.max(version.next());
                match self
                    .log
                    .append_tombstone(table, version, at.segment, key, floor)
                {
                    Ok(_) => {
                        self.safe_version = floor;
                        batch.staged.insert((table, key.clone()), Staged::Removed);
                        OpOutcome::Write(WriteReply {
                            status: Status::Ok,
                            version,
                        })
                    }
                    Err(_) => OpOutcome::failed(Status::NoSpace, Version(0)),
                }
            }
            WriteOp::Increment { delta, .. } => {
                let old = match current {
                    None => 0,
                    Some((_, at)) => match <[u8; 8]>::try_from(self.log.object(at).value) {
                        Ok(bytes) => i64::from_le_bytes(bytes),
                        Err(_) => return OpOutcome::failed(Status::NotAnInteger, current_version),
                    },
                };
                let Some(new) = old.checked_add(*delta) else {
                    return OpOutcome::failed(Status::InvalidArgument, current_version);
                };
                let value = new.to_le_bytes();
                match self
                    .log
                    .append_object(table, new_version, key, &value, self.safe_version)
                {
                    Ok(at) => {
                        batch.staged.insert(
                            (table, key.clone()),
                            Staged::Live {
                                version: new_version,
                                at,
                            },
                        );
                        let reply = IncrementReply {
                            status: Status::Ok,
                            version: new_version,
                            value: new,
                        };
                        OpOutcome::Increment(reply)
                    }
                    Err(_) => OpOutcome::failed(Status::NoSpace, Version(0)),
                }
            }
        }
    }

    /// Closes the batch in the log with a Tailwind checksum and returns the byte ranges
    /// to replicate before the batch may be published.
    pub fn seal(&mut self) -> Vec<SegmentRange> {
        self.log.seal_batch();
        self.log.take_unreplicated()
    }

    /// Makes a replicated batch visible to reads.
    pub fn publish(&mut self, batch: Batch) {
        let ObjectStore {
            log,
            index,
            tablets,
            ..
        } = self;
        for ((table, key), staged) in batch.staged {
            let hash = key_hash(&key);
            // A tablet dropped after staging (the appender orders tablet changes
            // between batches, so this is defence in depth) must not regain objects.
            if !tablets.owns(table, hash) {
                continue;
            }
            match staged {
                Staged::Live { at, .. } => {
                    index.upsert(table, hash, &key, at, |r| log.key(r));
                }
                Staged::Removed => {
                    index.remove(table, hash, &key, |r| log.key(r));
                }
            }
        }
    }

    /// One page of an enumeration (see [`EnumerateRequest`]).
    pub fn enumerate(&self, request: &EnumerateRequest) -> Result<EnumerateReply, Status> {
        let (_, owned_end) = self
            .tablets
            .range_of(request.table, request.resume_hash)
            .ok_or(Status::UnknownTablet)?;
        if request.end_hash < request.resume_hash {
            return Err(Status::InvalidArgument);
        }
        // The client may think this master owns more than it does now; serve what it
        // owns and send the client elsewhere for the rest.
        let end = request.end_hash.min(owned_end);
        let max_bytes = (request.max_bytes as usize).clamp(1, ENUMERATE_PAGE_BYTES_MAX);
        let mut objects = Vec::new();
        let mut bytes = 0usize;
        let mut next_hash = None;
        for (hash, bucket) in self.index.range(request.table, request.resume_hash..=end) {
            if bytes >= max_bytes {
                next_hash = Some(hash.0);
                break;
            }
            for at in bucket.refs() {
                let object = self.log.object(*at);
                bytes += object.key.len() + object.value.len() + 16;
                objects.push(EnumeratedObject {
                    key: Bytes::copy_from_slice(object.key),
                    version: object.version,
                    value: Bytes::copy_from_slice(object.value),
                });
            }
        }
        if next_hash.is_none() && end < request.end_hash {
            next_hash = Some(end + 1);
        }
        Ok(EnumerateReply { objects, next_hash })
    }

    /// Starts serving `tablets`.
    pub fn take_tablets(&mut self, tablets: &[Tablet]) {
        for tablet in tablets {
            self.tablets.take(tablet);
        }
    }

    /// Stops serving `tablets` and forgets their objects (their log space is reclaimed
    /// by the cleaner).
    pub fn drop_tablets(&mut self, tablets: &[Tablet]) -> u64 {
        let mut removed = 0;
        for tablet in tablets {
            for (start, end) in self.tablets.drop_overlapping(tablet) {
                removed += self.index.remove_range(tablet.table, start..=end);
            }
        }
        removed
    }

    /// Live objects.
    pub fn object_count(&self) -> u64 {
        self.index.len()
    }

    /// Log memory in use and its limit, in bytes.
    pub fn log_bytes(&self) -> (u64, u64) {
        (self.log.bytes_used(), self.log.bytes_max())
    }

    /// The version a new object would get now.
    pub fn safe_version(&self) -> Version {
        self.safe_version
    }

    /// The log (read-only), for replication and tests.
    pub fn log(&self) -> &SegmentedLog {
        &self.log
    }
}
