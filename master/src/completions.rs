//! `Completions`: the completion records a master holds, so that a retried write,
//! remove or increment is answered with its first outcome instead of applying twice
//! (RIFL, `rampart_common::rifl`). Plain data, driven by the `ObjectStore` under its
//! lock.
//!
//! # What it holds
//!
//! Per client: the highest acknowledgement it sent (`acked`: it holds the outcome of
//! every operation numbered that or below, and never sends them again) and a record per
//! operation above it that changed an object here — its outcome, the tablet it lives in
//! (table, key hash) and where its `Completion` entry is in the log. A record leaves
//! when its client acknowledges it ([`Completions::acknowledge`]), or with its tablet
//! ([`Completions::drop_where`]). The log entry of a record that left is dead; the
//! cleaner copies the others ([`Completions::holds`], [`Completions::repoint`]).
//!
//! # Limits
//!
//! A client may have at most [`RECORDS_PER_CLIENT_MAX`] records here: more means it
//! sends operations far past its acknowledgements, which the client library never does
//! (it numbers no operation that far above the acknowledgement it sends). A client that
//! leaves for good keeps its last records and acknowledgement until its lease expires
//! ([`Completions::forget_client`], driven by `crate::client_leases`): at most that
//! many records, and one acknowledgement, per client seen within a lease and a sweep
//! (about 45 s).

use rampart_common::ids::{ClientId, KeyHash, TableId, Version};
use rampart_common::log::CompletionEntry;
use std::collections::{BTreeMap, HashMap};

use crate::object_index::LogRef;

/// Most completion records one client may have on one master; shared with the client
/// library, which never numbers an operation further above its acknowledgement, so only
/// a client that breaks the protocol meets it (and is answered `Retry`).
pub use rampart_common::rifl::RECORDS_PER_CLIENT_MAX;

/// One completed operation, as a retry of it is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The new version (write, increment) or the version removed.
    pub version: Version,
    /// An increment's result.
    pub counter: Option<i64>,
    /// Where its `Completion` entry is in this master's log.
    pub at: LogRef,
    /// The table of the object it changed.
    pub table: TableId,
    /// The key hash of that object: the record lives in its tablet.
    pub hash: KeyHash,
}

impl Record {
    /// The record of `entry`, whose log entry is at `at`.
    pub fn of(entry: &CompletionEntry, at: LogRef) -> Record {
        Record {
            version: entry.version,
            counter: entry.counter,
            at,
            table: entry.table,
            hash: entry.key_hash,
        }
    }
}

/// What is known of an operation ([`Completions::lookup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Not completed here: execute it.
    New,
    /// Completed: answer with this.
    Done(Record),
    /// Numbered at or below its client's acknowledgement: never executed again.
    Stale,
}

#[derive(Debug, Default)]
struct ClientRecords {
    /// Every operation numbered this or below has its outcome at the client.
    acked: u64,
    /// Records of operations above `acked`, by number.
    done: BTreeMap<u64, Record>,
}

/// The completion records of one master. See the module doc.
#[derive(Debug, Default)]
pub struct Completions {
    clients: HashMap<ClientId, ClientRecords>,
    /// Records held, over every client.
    len: usize,
}

impl Completions {
    /// No records.
    pub fn new() -> Completions {
        Completions::default()
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records held for `client`.
    pub fn records_of(&self, client: ClientId) -> usize {
        self.clients.get(&client).map_or(0, |c| c.done.len())
    }

    /// Records held for `client` above its operation `ack` (those an acknowledgement of
    /// `ack` leaves).
    pub fn records_above(&self, client: ClientId, ack: u64) -> usize {
        self.clients
            .get(&client)
            .map_or(0, |c| c.done.range(ack.saturating_add(1)..).count())
    }

    /// What is known of `client`'s operation `seq`.
    pub fn lookup(&self, client: ClientId, seq: u64) -> Lookup {
        let Some(records) = self.clients.get(&client) else {
            return Lookup::New;
        };
        if seq <= records.acked {
            return Lookup::Stale;
        }
        records
            .done
            .get(&seq)
            .map_or(Lookup::New, |record| Lookup::Done(*record))
    }

    /// Holds `record` of `client`'s operation `seq`. Returns a record that is dead now:
    /// the one it replaces (a recovery replaying two copies), or `record` itself when the
    /// client acknowledged `seq` already.
    pub fn insert(&mut self, client: ClientId, seq: u64, record: Record) -> Option<Record> {
        let records = self.clients.entry(client).or_default();
        if seq <= records.acked {
            return Some(record);
        }
        let replaced = records.done.insert(seq, record);
        if replaced.is_none() {
            self.len += 1;
        }
        replaced
    }

    /// `client` holds the outcome of every operation numbered `ack` or below: their
    /// records go; returns them (their log entries are dead).
    pub fn acknowledge(&mut self, client: ClientId, ack: u64) -> Vec<Record> {
        let records = self.clients.entry(client).or_default();
        if ack <= records.acked {
            return Vec::new();
        }
        records.acked = ack;
        let kept = records.done.split_off(&(ack.saturating_add(1)));
        let dropped: Vec<Record> = std::mem::replace(&mut records.done, kept)
            .into_values()
            .collect();
        self.len -= dropped.len();
        dropped
    }

    /// Whether `client`'s record `seq` is held and its entry is at `at` (the cleaner's
    /// liveness test).
    pub fn holds(&self, client: ClientId, seq: u64, at: LogRef) -> bool {
        self.clients
            .get(&client)
            .and_then(|c| c.done.get(&seq))
            .is_some_and(|record| record.at == at)
    }

    /// The cleaner moved `client`'s record `seq` from `from` to `to`; false (and nothing
    /// changed) if that record is not at `from`.
    pub fn repoint(&mut self, client: ClientId, seq: u64, from: LogRef, to: LogRef) -> bool {
        match self
            .clients
            .get_mut(&client)
            .and_then(|c| c.done.get_mut(&seq))
        {
            Some(record) if record.at == from => {
                record.at = to;
                true
            }
            _ => false,
        }
    }

    /// Forgets `client` (its lease expired for good): its records and acknowledgement
    /// go; returns the records (their log entries are dead).
    pub fn forget_client(&mut self, client: ClientId) -> Vec<Record> {
        let Some(records) = self.clients.remove(&client) else {
            return Vec::new();
        };
        self.len -= records.done.len();
        records.done.into_values().collect()
    }

    /// The clients with records or an acknowledgement here.
    pub fn clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.clients.keys().copied()
    }

    /// The operations (client, number) whose records are on an object `wanted` names.
    pub fn keys_where<'a>(
        &'a self,
        wanted: impl Fn(TableId, KeyHash) -> bool + 'a,
    ) -> impl Iterator<Item = (ClientId, u64)> + 'a {
        self.clients.iter().flat_map(move |(&client, records)| {
            records
                .done
                .iter()
                .filter(|(_, record)| wanted(record.table, record.hash))
                .map(move |(&seq, _)| (client, seq))
                .collect::<Vec<_>>()
        })
    }

    /// The record of `client`'s operation `seq`, if held.
    pub fn record(&self, client: ClientId, seq: u64) -> Option<&Record> {
        self.clients.get(&client).and_then(|c| c.done.get(&seq))
    }

    /// Drops every record whose object `gone` says left this master (a tablet dropped,
    /// or replayed for a recovery that was abandoned); returns them.
    pub fn drop_where(&mut self, gone: impl Fn(TableId, KeyHash) -> bool) -> Vec<Record> {
        let mut dropped = Vec::new();
        for records in self.clients.values_mut() {
            records.done.retain(|_, record| {
                let keep = !gone(record.table, record.hash);
                if !keep {
                    dropped.push(*record);
                }
                keep
            });
        }
        self.len -= dropped.len();
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::SegmentId;

    fn record(version: u64, offset: u32, hash: u64) -> Record {
        Record {
            version: Version(version),
            counter: None,
            at: LogRef {
                segment: SegmentId(1),
                offset,
            },
            table: TableId(1),
            hash: KeyHash(hash),
        }
    }

    const A: ClientId = ClientId(7);
    const B: ClientId = ClientId(8);

    #[test]
    fn an_operation_is_new_until_recorded_then_done_then_stale_once_acknowledged() {
        let mut completions = Completions::new();
        assert_eq!(completions.lookup(A, 1), Lookup::New);
        assert_eq!(completions.insert(A, 1, record(5, 100, 1)), None);
        assert_eq!(completions.lookup(A, 1), Lookup::Done(record(5, 100, 1)));
        assert_eq!(completions.lookup(B, 1), Lookup::New, "clients are apart");
        assert_eq!(completions.lookup(A, 2), Lookup::New);
        assert_eq!(completions.acknowledge(A, 1), vec![record(5, 100, 1)]);
        assert_eq!(completions.lookup(A, 1), Lookup::Stale);
        assert_eq!(completions.len(), 0);
    }

    #[test]
    fn acknowledgements_only_grow_and_drop_exactly_what_they_cover() {
        let mut completions = Completions::new();
        for seq in 1..=5 {
            completions.insert(A, seq, record(seq, seq as u32, 1));
        }
        completions.insert(B, 3, record(30, 300, 1));
        let dropped = completions.acknowledge(A, 3);
        assert_eq!(dropped.len(), 3);
        assert!(completions.acknowledge(A, 2).is_empty(), "an older ack");
        assert_eq!(completions.records_of(A), 2);
        assert_eq!(completions.records_above(A, 0), 2);
        assert_eq!(completions.records_above(A, 4), 1);
        assert_eq!(completions.len(), 3);
        // A record arriving for an acknowledged number (a replay) is dead at once.
        assert_eq!(
            completions.insert(A, 2, record(2, 2, 1)),
            Some(record(2, 2, 1))
        );
        assert_eq!(completions.len(), 3);
    }

    #[test]
    fn a_second_copy_replaces_the_first_which_is_dead() {
        let mut completions = Completions::new();
        completions.insert(A, 1, record(5, 100, 1));
        assert_eq!(
            completions.insert(A, 1, record(5, 200, 1)),
            Some(record(5, 100, 1))
        );
        assert_eq!(completions.len(), 1);
        assert!(completions.holds(A, 1, record(5, 200, 1).at));
        assert!(!completions.holds(A, 1, record(5, 100, 1).at));
    }

    #[test]
    fn the_cleaner_moves_a_record_only_from_where_it_is() {
        let mut completions = Completions::new();
        completions.insert(A, 1, record(5, 100, 1));
        let (from, to) = (record(0, 100, 1).at, record(0, 900, 1).at);
        assert!(!completions.repoint(A, 1, to, from), "not there");
        assert!(completions.repoint(A, 1, from, to));
        assert!(completions.holds(A, 1, to));
        assert!(!completions.repoint(A, 2, from, to), "no such record");
    }

    #[test]
    fn records_leave_with_their_tablet() {
        let mut completions = Completions::new();
        completions.insert(A, 1, record(5, 100, 10));
        completions.insert(A, 2, record(6, 101, 20));
        completions.insert(B, 1, record(7, 102, 30));
        let dropped = completions.drop_where(|_, hash| hash.0 >= 20);
        assert_eq!(dropped.len(), 2);
        assert_eq!(completions.len(), 1);
        assert_eq!(completions.lookup(A, 1), Lookup::Done(record(5, 100, 10)));
        assert_eq!(completions.lookup(B, 1), Lookup::New);
    }
}
