//! Exactly-once: the completion records appended with tracked operations, and what
//! this master knows of its clients' leases. (Tests: `exactly_once_tests` and
//! `client_leases`.)
//!
//! A write, remove or increment that carries a client's identity (`rampart_common::rifl`)
//! and changes an object gets a completion record appended with it, in the same append
//! ([`Completions`](crate::completions)); a retry of it — in the same batch, later, or on
//! the master that recovered it — is answered from the record and appends nothing.
//! Records live in their object's tablet: the cleaner moves them, recovery replays them,
//! a dropped tablet drops them, and the client's acknowledgements end them.

use rampart_common::ids::{ClientId, KeyHash, TableId, Version};
use rampart_common::log::{CompletionEntry, COMPLETION_ENTRY_BYTES};
use rampart_common::rifl::Rifl;

use crate::completions::{Lookup, Record};
use crate::object_index::LogRef;

use super::batch::Batch;
use super::store::ObjectStore;

impl ObjectStore {
    /// The completion record of `rifl`'s operation with this outcome, if it is tracked.
    pub(super) fn record_entry(
        &self,
        table: TableId,
        hash: KeyHash,
        rifl: Rifl,
        version: Version,
        counter: Option<i64>,
    ) -> Option<CompletionEntry> {
        rifl.is_tracked().then_some(CompletionEntry {
            table,
            key_hash: hash,
            client: rifl.client,
            seq: rifl.seq,
            ack: rifl.ack,
            version,
            counter,
        })
    }

    /// Stages `record`, appended at `at`, in `batch`, and counts it in the profile.
    pub(super) fn stage_record(
        &mut self,
        batch: &mut Batch,
        record: Option<&CompletionEntry>,
        at: Option<LogRef>,
    ) {
        let (Some(record), Some(at)) = (record, at) else {
            return;
        };
        self.profiler
            .track(record.table, record.key_hash, COMPLETION_ENTRY_BYTES as u64);
        batch.add_record(record.client, record.seq, Record::of(record, at));
    }

    /// The version that tracked operation `rifl` produced (or removed), if it completed
    /// here and its record is held: a retry of it is answered with that.
    pub fn completed(&self, rifl: Rifl) -> Option<Version> {
        match self.completions.lookup(rifl.client, rifl.seq) {
            Lookup::Done(record) => Some(record.version),
            Lookup::New | Lookup::Stale => None,
        }
    }

    /// Completion records held (over every client).
    pub fn completion_records(&self) -> usize {
        self.completions.len()
    }

    /// Makes this master execute a client's tracked operations only while it knows the
    /// client's lease holds (`crate::client_leases`): call before it serves anything.
    pub fn require_client_leases(&mut self) {
        self.client_leases.require();
    }

    /// Whether `client`'s lease is known to hold at `now`.
    pub fn client_lease_valid(&self, client: ClientId, now: std::time::Instant) -> bool {
        self.client_leases.valid(client, now)
    }

    /// The leader said `client`'s lease holds until `until`.
    pub fn note_client_lease(&mut self, client: ClientId, until: std::time::Instant) {
        self.client_leases.note(client, until);
    }

    /// `client` expired for good: its completion records and acknowledgement go (their
    /// log entries are dead), and so does its lease. Returns how many records went.
    pub fn expire_client(&mut self, client: ClientId) -> usize {
        self.client_leases.expire(client, std::time::Instant::now());
        let dropped = self.completions.forget_client(client);
        for record in &dropped {
            self.log.note_dead(record.at, COMPLETION_ENTRY_BYTES as u64);
        }
        dropped.len()
    }

    /// The clients with completion records or an acknowledgement here whose lease is
    /// not known to hold at `now` (leases that ran out are forgotten meanwhile).
    pub fn clients_to_check(&mut self, now: std::time::Instant) -> Vec<ClientId> {
        self.client_leases.forget_lapsed(now);
        let leases = &self.client_leases;
        self.completions
            .clients()
            .filter(|&client| !leases.valid(client, now))
            .collect()
    }
}
