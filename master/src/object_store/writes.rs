//! Writes: staging a batch of operations, sealing it, publishing it.
//!
//! Writes are applied in batches (group commit). [`ObjectStore::stage`] checks one
//! operation against its tablet, its limits and its reject rules, computes the new
//! version and appends the log entry, recording the effect in the [`Batch`]. A later
//! operation of the same batch on the same key sees the staged effect. Staged effects
//! are *not* visible to reads. After the batch is sealed and replicated,
//! [`ObjectStore::publish`] applies the effects to the index, making them visible; only
//! then are the writes acknowledged. So a read never returns a value that a crash
//! could still lose.

use bytes::Bytes;
use rampart_common::ids::{KeyHash, TableId, Version};
use rampart_common::log::{object_entry_bytes, tombstone_entry_bytes, COMPLETION_ENTRY_BYTES};
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;

use crate::completions::{Lookup, RECORDS_PER_CLIENT_MAX};
use crate::object_index::{LogRef, INDEX_BYTES_PER_OBJECT};
use crate::segmented_log::{Appended, NoSpace, SealedRange, Superseded, CLEANER_RESERVE_SEGMENTS};

use super::batch::{Batch, Staged, StagedKey};
use super::ops::{OpOutcome, WriteOp};
use super::store::ObjectStore;

impl ObjectStore {
    /// The current state of `key` for staging: staged effects first, then the index.
    pub(super) fn current(
        &self,
        batch: &Batch,
        table: TableId,
        hash: KeyHash,
        key: &Bytes,
    ) -> Option<(Version, LogRef)> {
        if let Some(staged) = batch.get(table, hash, key) {
            return match staged {
                Staged::Live { version, at } => Some((version, at)),
                Staged::Removed => None,
            };
        }
        let log = &self.log;
        let at = self.index.lookup(table, hash, key, |r| log.key(r))?;
        Some((log.object(at).version, at))
    }

    /// Checks and appends one operation, recording its effect in `batch`.
    ///
    /// A tracked operation (`rampart_common::rifl`) that completed here before is
    /// answered with its recorded outcome and appends nothing; one numbered at or below
    /// its client's acknowledgement is refused `StaleRequest`. One that changes an
    /// object appends its completion record in the same append as the object or
    /// tombstone. Its client's acknowledgement drops older records at publish.
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
        let rifl = op.rifl();
        if rifl.is_tracked() {
            if rifl.ack >= rifl.seq {
                // The client says it holds this operation's outcome already.
                return OpOutcome::failed(Status::InvalidArgument, Version(0));
            }
            batch.note_ack(rifl.client, rifl.ack);
            let staged = batch.completions.get(&(rifl.client, rifl.seq)).copied();
            match staged.map_or_else(
                || self.completions.lookup(rifl.client, rifl.seq),
                Lookup::Done,
            ) {
                Lookup::Done(record) => {
                    return OpOutcome {
                        status: Status::Ok,
                        version: record.version,
                        counter: record.counter,
                    }
                }
                Lookup::Stale => return OpOutcome::failed(Status::StaleRequest, Version(0)),
                Lookup::New => {}
            }
            // Executed only while its client's lease is known to hold: once its expiry
            // is committed its records go, and a retry must not run again
            // (`crate::client_leases`). The write path asked just before; this
            // catches a lease that ran out in between.
            if !self
                .client_leases
                .valid(rifl.client, std::time::Instant::now())
            {
                return OpOutcome::failed(Status::Retry, Version(0));
            }
            // Cheap first (every record held), exact only near the limit (those the
            // batch's acknowledgement leaves).
            let in_batch = batch.records_of(rifl.client);
            let near =
                self.completions.records_of(rifl.client) + in_batch >= RECORDS_PER_CLIENT_MAX;
            let ack = batch.acks.get(&rifl.client).copied().unwrap_or(rifl.ack);
            if near
                && self.completions.records_above(rifl.client, ack) + in_batch
                    >= RECORDS_PER_CLIENT_MAX
            {
                // Numbered further above its acknowledgement than the client library
                // ever numbers (`rampart_common::rifl::RECORDS_PER_CLIENT_MAX`). Not an
                // invalid request: the records leave as the acknowledgement advances,
                // so the client waits and sends it again, with the same identity.
                return OpOutcome::failed(Status::Retry, Version(0));
            }
        }
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
        let creates = current.is_none() && !matches!(op, WriteOp::Remove { .. });
        if creates && !self.new_key_fits(batch) {
            return OpOutcome::failed(Status::NoSpace, Version(0));
        }
        let new_version = current.map_or(self.safe_version, |(v, _)| v.next());
        if new_version >= self.version_ceiling {
            // Not reserved at the coordinator yet: a crash now could lose the only record
            // of it (`object_store`'s module doc, "Versions"). The reservation runs in the background.
            return OpOutcome::failed(Status::Retry, current_version);
        }
        self.version_max = self.version_max.max(new_version);
        match op {
            WriteOp::Write { value, .. } => {
                let superseded = current.map(|(version, at)| Superseded {
                    version,
                    segment: at.segment,
                });
                match self.append_object(
                    batch,
                    (table, hash, key),
                    value,
                    new_version,
                    superseded,
                    rifl,
                    None,
                ) {
                    Ok(at) => {
                        self.supersede_staged(batch, table, hash, key);
                        batch.new_keys += u64::from(creates);
                        batch.insert(
                            table,
                            hash,
                            key,
                            Staged::Live {
                                version: new_version,
                                at,
                            },
                        );
                        OpOutcome::applied(new_version)
                    }
                    Err(NoSpace) => OpOutcome::failed(Status::NoSpace, Version(0)),
                }
            }
            WriteOp::Remove { .. } => {
                let Some((version, at)) = current else {
                    // Removing a missing object succeeds and changes nothing.
                    return OpOutcome::applied(Version(0));
                };
                let floor = self.safe_version.max(version.next());
                let record = self.record_entry(table, hash, rifl, version, None);
                match self.log.append_tombstone_completing(
                    table,
                    version,
                    at.segment,
                    key,
                    record.as_ref(),
                    floor,
                ) {
                    Ok(Appended { record_at, .. }) => {
                        let bytes = tombstone_entry_bytes(key.len());
                        self.profiler.track(table, hash, bytes as u64);
                        self.stage_record(batch, record.as_ref(), record_at);
                        self.safe_version = floor;
                        self.version_max = self.version_max.max(floor);
                        self.supersede_staged(batch, table, hash, key);
                        batch.insert(table, hash, key, Staged::Removed);
                        OpOutcome::applied(version)
                    }
                    Err(NoSpace) => OpOutcome::failed(Status::NoSpace, Version(0)),
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
                let superseded = current.map(|(version, at)| Superseded {
                    version,
                    segment: at.segment,
                });
                match self.append_object(
                    batch,
                    (table, hash, key),
                    &value,
                    new_version,
                    superseded,
                    rifl,
                    Some(new),
                ) {
                    Ok(at) => {
                        self.supersede_staged(batch, table, hash, key);
                        batch.new_keys += u64::from(creates);
                        batch.insert(
                            table,
                            hash,
                            key,
                            Staged::Live {
                                version: new_version,
                                at,
                            },
                        );
                        OpOutcome {
                            counter: Some(new),
                            ..OpOutcome::applied(new_version)
                        }
                    }
                    Err(NoSpace) => OpOutcome::failed(Status::NoSpace, Version(0)),
                }
            }
        }
    }

    /// Appends the object `key` = `value` at `version`, with the tombstone of the
    /// version it supersedes (`object_store`'s module doc, "Removals") and the completion record of
    /// `rifl` when it is tracked (`counter`: an increment's result), counting them in the
    /// profile and staging the record in `batch`. Returns where the object is.
    #[allow(clippy::too_many_arguments)]
    fn append_object(
        &mut self,
        batch: &mut Batch,
        (table, hash, key): (TableId, KeyHash, &[u8]),
        value: &[u8],
        version: Version,
        superseded: Option<Superseded>,
        rifl: Rifl,
        counter: Option<i64>,
    ) -> Result<LogRef, NoSpace> {
        let record = self.record_entry(table, hash, rifl, version, counter);
        let appended = self.log.append_object_completing(
            table,
            version,
            key,
            value,
            superseded,
            record.as_ref(),
            self.safe_version,
        )?;
        let bytes = object_entry_bytes(key.len(), value.len()) as u64 + appended.tombstone_bytes;
        self.profiler.track(table, hash, bytes);
        self.stage_record(batch, record.as_ref(), appended.record_at);
        Ok(appended.at)
    }

    /// Closes the batch in the log with a Tailwind checksum and returns the byte ranges
    /// to replicate before the batch may be published, with their bytes.
    pub fn seal(&mut self) -> Vec<SealedRange> {
        self.log.seal_batch();
        self.log.take_unreplicated()
    }

    /// Makes a replicated batch visible to reads.
    pub fn publish(&mut self, batch: Batch) {
        self.apply(batch, true);
    }

    /// Makes a replicated replay batch ([`stage_replay`](Self::stage_replay)) part of
    /// the index, although its keys are not owned yet: reads see the objects once
    /// `take_tablets` gives this master their ranges.
    pub fn publish_recovered(&mut self, batch: Batch) {
        self.apply(batch, false);
    }

    fn apply(&mut self, batch: Batch, owned_only: bool) {
        let mut dead_records = Vec::new();
        // What a move out of this master must send on (`moves`): noted after the
        // borrows below end.
        let moving = owned_only && !self.moves_out.is_empty();
        let mut moving_records = Vec::new();
        let mut moving_keys = Vec::new();
        let ObjectStore {
            log,
            index,
            tablets,
            completions,
            ..
        } = self;
        for ((client, seq), record) in batch.completions {
            if owned_only && !tablets.owns(record.table, record.hash) {
                dead_records.push(record);
                continue;
            }
            if moving {
                moving_records.push((record.table, record.hash, client, seq));
            }
            dead_records.extend(completions.insert(client, seq, record));
        }
        for (client, ack) in batch.acks {
            dead_records.extend(completions.acknowledge(client, ack));
        }
        for record in dead_records {
            log.note_dead(record.at, COMPLETION_ENTRY_BYTES as u64);
        }
        let mut dead = Vec::new();
        for (StagedKey { table, hash, key }, staged) in batch.staged {
            // A tablet dropped after staging (the appender orders tablet changes
            // between batches, so this is defence in depth) must not regain objects.
            if owned_only && !tablets.owns(table, hash) {
                if let Staged::Live { at, .. } = staged {
                    dead.push(at);
                }
                continue;
            }
            let replaced = match staged {
                Staged::Live { at, .. } => index.upsert(table, hash, &key, at, |r| log.key(r)),
                Staged::Removed => index.remove(table, hash, &key, |r| log.key(r)),
            };
            dead.extend(replaced);
            if moving {
                moving_keys.push((table, hash, key));
            }
        }
        for at in dead {
            self.note_dead(at);
        }
        self.published_safe = self.safe_version;
        for (table, hash, key) in moving_keys {
            self.note_moving(table, hash, &key);
        }
        for (table, hash, client, seq) in moving_records {
            self.note_moving_record(table, hash, client, seq);
        }
        self.fit_segments_to_index();
    }

    /// Whether one more key (beyond those `batch` adds) fits the memory: the index with
    /// it, and the segments held with the cleaner's reserve (module doc of
    /// [`segmented_log`](crate::segmented_log), "Memory").
    pub(super) fn new_key_fits(&self, batch: &Batch) -> bool {
        let index = (self.index.len() + batch.new_keys + 1) * INDEX_BYTES_PER_OBJECT;
        let segments = (self.log.segments_held() + CLEANER_RESERVE_SEGMENTS)
            * u64::from(self.config.segment_bytes);
        index + segments <= self.config.memory_bytes
    }

    /// The entry staged for `key` earlier in `batch`, if an object, is superseded by the
    /// one being staged now: it never reaches the index.
    pub(super) fn supersede_staged(
        &mut self,
        batch: &Batch,
        table: TableId,
        hash: KeyHash,
        key: &Bytes,
    ) {
        if let Some(Staged::Live { at, .. }) = batch.get(table, hash, key) {
            self.note_dead(at);
        }
    }
}
