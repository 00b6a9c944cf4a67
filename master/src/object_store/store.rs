//! The [`ObjectStore`] struct: its fields and their invariants, its constructors, and
//! the internals every role shares — the ownership and key check, the accounting of
//! dead entries, forgetting a range, and fitting the log to the memory the index
//! leaves.

use rampart_common::config::MasterConfig;
use rampart_common::ids::{key_hash, KeyHash, MoveId, SegmentId, ServerId, TableId, Version};
use rampart_common::limits::KEY_BYTES_MAX;
use rampart_common::log::{object_entry_bytes, COMPLETION_ENTRY_BYTES};
use rampart_common::status::Status;
use rampart_common::tablet::HashRange;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::RangeInclusive;

use super::move_types::MoveOut;

use crate::client_lease_cache::ClientLeaseCache;
use crate::completions::Completions;
use crate::object_index::{LogRef, ObjectIndex, INDEX_BYTES_PER_OBJECT};
use crate::profiler::{PartitionLimits, Profiler, ProfilerConfig};
use crate::segmented_log::{SegmentPool, SegmentedLog};
use crate::tablet_load::LoadCounter;
use crate::tablets::OwnedTablets;

/// A master's objects.
#[derive(Debug)]
pub struct ObjectStore {
    pub(super) config: MasterConfig,
    pub(super) log: SegmentedLog,
    /// Published objects only. Invariant: every reference points into `log`.
    pub(super) index: ObjectIndex,
    pub(super) tablets: OwnedTablets,
    /// Version of the next new object (a key with no live object). Invariant: greater
    /// than every version this master has removed, and than every version replayed
    /// into it by a recovery. Overwrites need not raise it: a live key's next version is
    /// its own + 1, and only a remove ends a key's life.
    pub(super) safe_version: Version,
    /// Versions this master may hand out are below this (its version ceiling at the
    /// coordinator, as far as it knows); a write that would need one at or above it is
    /// answered `Retry` until a reservation raises it (see [`ObjectStore::ceiling_wanted`]).
    /// `u64::MAX` for a master without coordinators (tests, benchmarks).
    /// Invariant: every version handed out is below it.
    pub(super) version_ceiling: Version,
    /// The highest version this master holds, handed out or replayed, or may hand out
    /// next (`safe_version`).
    pub(super) version_max: Version,
    /// Byte and record counts of every appended entry, by owned tablet.
    /// Invariants: 1. profiles exactly the tablets in `tablets` (taken and dropped
    /// together). 2. every entry in `log` appended for an owned key was tracked once.
    pub(super) profiler: Profiler,
    /// The limits the will is cut to; the profiler's split thresholds derive from them.
    pub(super) partition_limits: PartitionLimits,
    /// Entries replayed into ranges not owned yet: (table, hash, entry bytes), tracked
    /// in the profiler when their tablet is taken, dropped when their recovery is
    /// abandoned. Empty outside a recovery.
    /// The segment each was appended to: a failed recovery's leftovers are cleaned out
    /// of them ([`ObjectStore::forget_unowned`]).
    pub(super) replayed_untracked: Vec<(TableId, KeyHash, u64, SegmentId)>,
    /// Segments that hold entries a failed or abandoned recovery left behind
    /// ([`ObjectStore::forget_unowned`]); the cleaner takes them first
    /// ([`ObjectStore::plan_cleaning`]). Invariant: a replay stages nothing while any of
    /// them is still in the log, so no range is taken with leftovers in this log.
    pub(super) tainted: BTreeSet<SegmentId>,
    /// Ranges moved away whose objects are still indexed: not owned, so never visible,
    /// and forgotten a step at a time between batches ([`ObjectStore::forget_step`]),
    /// each step tainting what it forgot. Invariants: disjoint from the owned tablets
    /// and the moves in (taking a range first forgets what of it is left here), and no
    /// replay stages while any is left.
    pub(super) forgetting: VecDeque<HashRange>,
    /// Completion records of clients' operations (`rampart_common::rifl`).
    /// Invariants: 1. every record's entry is in `log` and counted live there. 2. every
    /// record lies in an owned tablet, or in a range a recovery replayed into and not
    /// yet abandoned (as objects do).
    pub(super) completions: Completions,
    /// What this master knows of its clients' leases (`crate::client_leases`).
    pub(super) client_leases: ClientLeaseCache,
    /// The moves of tablets out of this master (`moves`). Invariant: each range is
    /// owned here whole and overlaps no other.
    pub(super) moves_out: BTreeMap<MoveId, MoveOut>,
    /// The moves of tablets into this master (`moves`): ranges not owned here, whose
    /// replayed objects wait for the commit. Invariant: no two overlap.
    pub(super) moves_in: BTreeMap<MoveId, HashRange>,
    /// The safe version as the last publish left it: above every version removed in a
    /// published batch, and at most every version staged since (a move's tail masks a
    /// removed key just below it, `moves`).
    pub(super) published_safe: Version,
    /// The newest moves out that ended here (at most `moves::ENDED_MOVES_KEPT`).
    pub(super) ended_moves: BTreeSet<MoveId>,
    /// Reads and writes served, by table and slice of the hash space, since the last
    /// load report ([`ObjectStore::load_report`]). Tracks every table of an owned
    /// tablet.
    pub(super) load: LoadCounter,
}

impl ObjectStore {
    /// An empty store for master `server_id`.
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn new(server_id: ServerId, config: MasterConfig) -> ObjectStore {
        ObjectStore::with_partition_limits(server_id, config, PartitionLimits::default())
    }

    /// An empty store whose will is cut to `limits`.
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn with_partition_limits(
        server_id: ServerId,
        config: MasterConfig,
        limits: PartitionLimits,
    ) -> ObjectStore {
        let pool = SegmentPool::for_config(&config);
        ObjectStore::with_pool(server_id, config, limits, pool)
    }

    /// An empty store whose log lives in `pool`'s buffers (see
    /// [`SegmentPool::for_config`]).
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn with_pool(
        server_id: ServerId,
        config: MasterConfig,
        limits: PartitionLimits,
        pool: SegmentPool,
    ) -> ObjectStore {
        assert_eq!(config.validate(), Ok(()), "master config must be validated");
        let safe_version = Version::FIRST;
        ObjectStore {
            log: SegmentedLog::with_pool(server_id, &config, safe_version, pool),
            config,
            index: ObjectIndex::new(),
            tablets: OwnedTablets::new(),
            safe_version,
            version_ceiling: Version(u64::MAX),
            version_max: safe_version,
            profiler: Profiler::new(ProfilerConfig::for_partitions(
                limits.bytes_max,
                limits.records_max,
            )),
            partition_limits: limits,
            replayed_untracked: Vec::new(),
            tainted: BTreeSet::new(),
            forgetting: VecDeque::new(),
            completions: Completions::new(),
            client_leases: ClientLeaseCache::default(),
            moves_out: BTreeMap::new(),
            moves_in: BTreeMap::new(),
            ended_moves: BTreeSet::new(),
            published_safe: safe_version,
            load: LoadCounter::new(),
        }
    }

    pub(super) fn check_key(&self, table: TableId, key: &[u8]) -> Result<KeyHash, Status> {
        if key.len() > KEY_BYTES_MAX {
            return Err(Status::KeyTooLarge);
        }
        let hash = key_hash(key);
        if !self.tablets.owns(table, hash) {
            return Err(Status::UnknownTablet);
        }
        if !self.moves_out.is_empty() && self.frozen(table, hash) {
            // Being handed to another master: the client retries, and follows the
            // map once the move ends (`moves`).
            return Err(Status::Retry);
        }
        self.load.count(table, hash);
        Ok(hash)
    }

    /// Removes the objects of `table` with hashes in `range` from the index; their
    /// entries are dead. Returns where they are (still in the log: no tombstone masks
    /// them).
    pub(super) fn forget_range(
        &mut self,
        table: TableId,
        range: RangeInclusive<u64>,
    ) -> Vec<LogRef> {
        for record in self
            .completions
            .drop_where(|t, hash| t == table && range.contains(&hash.0))
        {
            self.log.note_dead(record.at, COMPLETION_ENTRY_BYTES as u64);
        }
        let refs = self.index.remove_range(table, range);
        for at in &refs {
            self.note_dead(*at);
        }
        self.fit_segments_to_index();
        refs
    }

    /// The object entry at `at` is dead: its segment's live bytes drop.
    pub(super) fn note_dead(&mut self, at: LogRef) {
        let object = self.log.object(at);
        let bytes = object_entry_bytes(object.key.len(), object.value.len()) as u64;
        self.log.note_dead(at, bytes);
    }

    /// Gives the log the segments the memory holds beside the index.
    pub(super) fn fit_segments_to_index(&mut self) {
        let index = self.index.len() * INDEX_BYTES_PER_OBJECT;
        let limit =
            self.config.memory_bytes.saturating_sub(index) / u64::from(self.config.segment_bytes);
        self.log.set_segments_limit(limit);
    }

    /// Live objects.
    pub fn object_count(&self) -> u64 {
        self.index.len()
    }

    /// Log memory in use and its limit, in bytes.
    pub fn log_bytes(&self) -> (u64, u64) {
        (self.log.bytes_used(), self.log.bytes_max())
    }

    /// The master's configuration.
    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    /// The log (read-only), for replication and tests.
    pub fn log(&self) -> &SegmentedLog {
        &self.log
    }
}
