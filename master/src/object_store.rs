//! `ObjectStore`: the master's objects — its log, index, tablets and version floor —
//! as a plain synchronous struct (STYLE.md habit 8). The async appender and the RPC
//! service drive it; tests drive it directly.
//! It speaks domain types only ([`WriteOp`], [`OpOutcome`], [`Object`],
//! [`EnumeratePage`]); the RPC service (`service.rs`) converts them to and from the
//! wire.
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
//!
//! # Recovery replay
//! [`ObjectStore::stage_replay`] stages one piece of a crashed master's log (see
//! [`replay`](crate::replay) for the rules) into a batch like `stage` does, and
//! [`ObjectStore::publish_recovered`] publishes it *although this master does not own
//! the keys yet*: reads still answer `UnknownTablet` for them, because reads check
//! ownership before the index. `take_tablets` of a fresh range keeps what the index
//! holds there, which is how the replayed objects become visible;
//! [`ObjectStore::forget_unowned`] drops them if the recovery is abandoned.
//!
//! # Exactly-once
//! A write, remove or increment that carries a client's identity (`rampart_common::rifl`)
//! and changes an object gets a completion record appended with it, in the same append
//! ([`Completions`](crate::completions)); a retry of it — in the same batch, later, or on
//! the master that recovered it — is answered from the record and appends nothing.
//! Records live in their object's tablet: the cleaner moves them, recovery replays them,
//! a dropped tablet drops them, and the client's acknowledgements end them.
//!
//! # Profiles and the will
//! Every object, tombstone and completion record appended is counted in the
//! [`Profiler`] under its tablet.
//! Entries replayed into ranges not owned yet are remembered and counted when their
//! tablet is taken, so the will ([`ObjectStore::will`]) covers every entry of the log
//! that a recovery of this master would replay.

use bytes::Bytes;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{key_hash, ClientId, KeyHash, ServerId, TableId, TabletEpoch, Version};
use rampart_common::limits::{ENUMERATE_PAGE_BYTES_MAX, KEY_BYTES_MAX};
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, Tablet};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::ops::RangeInclusive;

use rampart_common::config::SEGMENT_FIXED_OVERHEAD_BYTES;
use rampart_common::ids::SegmentId;
use rampart_common::log::{
    decode_entry, decode_object_trusted, object_entry_bytes, tombstone_entry_bytes,
    CompletionEntry, Entry, LogFull, COMPLETION_ENTRY_BYTES,
};

use crate::cleaner::{self, CleaningPass, StepEnd};
use crate::client_lease_cache::ClientLeaseCache;
use crate::completions::{Completions, Lookup, Record, RECORDS_PER_CLIENT_MAX};

use crate::object_index::{LogRef, ObjectIndex, SlotAt, INDEX_BYTES_PER_OBJECT};
use crate::profiler::{PartitionLimits, Profiler, ProfilerConfig, Will};
use crate::replay::{PieceEntry, RecoveryPiece, ReplayState};
use crate::segmented_log::{
    Appended, NoSpace, SealedRange, SegmentPool, SegmentedLog, Superseded, CLEANER_RESERVE_SEGMENTS,
};
use crate::tablets::{EpochStep, OwnedTablets};

/// Entries the cleaner's walk parses and locates in the index ahead of the one it
/// copies (`walk_ahead`): enough for the processor to overlap their lookups' cache
/// misses, few enough that what a step walks past its budget is small.
const WALK_AHEAD: usize = 64;

/// Versions a master reserves at the coordinator at a time (`ReserveVersions`, one Raft
/// commit): at a million writes a second, an hour and more of writing.
pub const VERSION_RESERVATION: u64 = 1 << 32;

/// A reservation is made once fewer than this many versions are left below the ceiling:
/// half a reservation, so it is in place long before the versions run out.
pub const VERSION_LOW_WATER: u64 = VERSION_RESERVATION / 2;

const _: () = assert!(VERSION_LOW_WATER < VERSION_RESERVATION);

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
    fn table_and_key(&self) -> (TableId, &Bytes) {
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
    fn failed(status: Status, version: Version) -> OpOutcome {
        OpOutcome {
            status,
            version,
            counter: None,
        }
    }

    fn applied(version: Version) -> OpOutcome {
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

/// One page of an enumeration ([`ObjectStore::enumerate`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnumeratePage {
    /// The objects, as `(key, object)`, in key-hash order.
    pub objects: Vec<(Bytes, Object)>,
    /// Where the next page starts, or `None` when the requested range is done.
    pub next_hash: Option<u64>,
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
    /// Final staged state per key; later operations of the batch read it.
    staged: HashMap<StagedKey, Staged, SeededKeyHash>,
    /// Keys staged that the index does not hold yet: it grows by at most this many at
    /// publish (counted against the memory, `ObjectStore::new_key_fits`).
    new_keys: u64,
    /// Completion records appended by this batch, by (client, number): held at publish.
    completions: HashMap<(ClientId, u64), Record>,
    /// The highest acknowledgement each client sent in this batch: applied at publish.
    acks: HashMap<ClientId, u64>,
    /// Records in `completions` per client (the per-client limit is checked per op).
    records_per_client: HashMap<ClientId, usize>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Whether nothing was staged (no effect, no record, no acknowledgement).
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty() && self.completions.is_empty() && self.acks.is_empty()
    }

    fn note_ack(&mut self, client: ClientId, ack: u64) {
        let held = self.acks.entry(client).or_default();
        *held = (*held).max(ack);
    }

    /// Records of `client` staged in this batch.
    fn records_of(&self, client: ClientId) -> usize {
        self.records_per_client.get(&client).copied().unwrap_or(0)
    }

    /// Stages the record of `client`'s operation `seq`.
    fn add_record(&mut self, client: ClientId, seq: u64, record: Record) {
        if self.completions.insert((client, seq), record).is_none() {
            *self.records_per_client.entry(client).or_default() += 1;
        }
    }

    fn get(&self, table: TableId, hash: KeyHash, key: &Bytes) -> Option<Staged> {
        let key = StagedKey {
            table,
            hash,
            key: key.clone(),
        };
        self.staged.get(&key).copied()
    }

    fn insert(&mut self, table: TableId, hash: KeyHash, key: &Bytes, staged: Staged) {
        let key = StagedKey {
            table,
            hash,
            key: key.clone(),
        };
        self.staged.insert(key, staged);
    }
}

/// A key of a [`Batch`], with the `key_hash` its operation computed already. The map
/// hashes that instead of the key's bytes: replay stages every object of a recovery,
/// and SipHash over each key, twice, plus `key_hash` again at publish, cost more than
/// the lookups themselves. `key_hash` is unseeded and a batch's keys often share a
/// tablet (a narrow range of hashes), so [`SeededKeyHash`] mixes it with a random seed.
#[derive(Clone, Debug)]
struct StagedKey {
    table: TableId,
    /// `key_hash(&key)`.
    hash: KeyHash,
    key: Bytes,
}

impl PartialEq for StagedKey {
    fn eq(&self, other: &Self) -> bool {
        self.table == other.table && self.hash == other.hash && self.key == other.key
    }
}

impl Eq for StagedKey {}

impl Hash for StagedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Equal keys have equal hashes, so this agrees with `eq`.
        state.write_u64(self.hash.0 ^ self.table.0.wrapping_mul(MIX));
    }
}

/// An odd constant with well-spread bits (2⁶⁴ / φ).
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// Builds the hashers of [`StagedKey`]s, seeded once per process at random: the hash
/// table's bucket and control bits then depend on every bit of the key hash and on
/// the seed, so neither keys that share a tablet nor keys a client chose to share low
/// hash bits pile up in a few buckets.
#[derive(Clone, Copy, Debug)]
struct SeededKeyHash(u64);

impl Default for SeededKeyHash {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        SeededKeyHash(
            *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(MIX)),
        )
    }
}

impl BuildHasher for SeededKeyHash {
    type Hasher = KeyHashHasher;

    fn build_hasher(&self) -> KeyHashHasher {
        KeyHashHasher(self.0)
    }
}

/// A [`SeededKeyHash`] hasher: each `u64` written (a `StagedKey` writes one) is folded
/// into the state with a 64 × 64 → 128-bit multiply, whose halves are xored.
/// Anything else written (no caller does) is folded in eight bytes at a time.
#[derive(Debug)]
struct KeyHashHasher(u64);

impl Hasher for KeyHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, value: u64) {
        let product = u128::from(self.0 ^ value) * u128::from(MIX);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
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
    /// Version of the next new object (a key with no live object). Invariant: greater
    /// than every version this master has removed, and than every version replayed
    /// into it by a recovery. Overwrites need not raise it: a live key's next version is
    /// its own + 1, and only a remove ends a key's life.
    safe_version: Version,
    /// Versions this master may hand out are below this (its version ceiling at the
    /// coordinator, as far as it knows); a write that would need one at or above it is
    /// answered `Retry` until a reservation raises it (see [`ObjectStore::ceiling_wanted`]).
    /// `u64::MAX` for a master without coordinators (tests, benchmarks).
    /// Invariant: every version handed out is below it.
    version_ceiling: Version,
    /// The highest version this master holds, handed out or replayed, or may hand out
    /// next (`safe_version`).
    version_max: Version,
    /// Byte and record counts of every appended entry, by owned tablet.
    /// Invariants: 1. profiles exactly the tablets in `tablets` (taken and dropped
    /// together). 2. every entry in `log` appended for an owned key was tracked once.
    profiler: Profiler,
    /// The limits the will is cut to; the profiler's split thresholds derive from them.
    partition_limits: PartitionLimits,
    /// Entries replayed into ranges not owned yet: (table, hash, entry bytes), tracked
    /// in the profiler when their tablet is taken, dropped when their recovery is
    /// abandoned. Empty outside a recovery.
    /// The segment each was appended to: a failed recovery's leftovers are cleaned out
    /// of them ([`ObjectStore::forget_unowned`]).
    replayed_untracked: Vec<(TableId, KeyHash, u64, SegmentId)>,
    /// Segments that hold entries a failed or abandoned recovery left behind
    /// ([`ObjectStore::forget_unowned`]); the cleaner takes them first
    /// ([`ObjectStore::plan_cleaning`]). Invariant: a replay stages nothing while any of
    /// them is still in the log, so no range is taken with leftovers in this log.
    tainted: BTreeSet<SegmentId>,
    /// Completion records of clients' operations (`rampart_common::rifl`).
    /// Invariants: 1. every record's entry is in `log` and counted live there. 2. every
    /// record lies in an owned tablet, or in a range a recovery replayed into and not
    /// yet abandoned (as objects do).
    completions: Completions,
    /// What this master knows of its clients' leases (`crate::client_leases`).
    client_leases: ClientLeaseCache,
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
            completions: Completions::new(),
            client_leases: ClientLeaseCache::default(),
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

    /// Reads the published object `key`: `UnknownTablet` when this master does not own
    /// it, `KeyTooLarge`, or `ObjectDoesntExist`.
    pub fn read(&self, table: TableId, key: &[u8]) -> Result<Object, Status> {
        self.read_with(table, key, |status, version, value| match status {
            Status::Ok => Ok(Object {
                version,
                value: Bytes::copy_from_slice(value),
            }),
            status => Err(status),
        })
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
            // of it (module doc, "Versions"). The reservation runs in the background.
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
    /// version it supersedes (module doc, "Removals") and the completion record of
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

    /// The completion record of `rifl`'s operation with this outcome, if it is tracked.
    fn record_entry(
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
    fn stage_record(
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
        let ObjectStore {
            log,
            index,
            tablets,
            completions,
            ..
        } = self;
        let mut dead_records = Vec::new();
        for ((client, seq), record) in batch.completions {
            if owned_only && !tablets.owns(record.table, record.hash) {
                dead_records.push(record);
                continue;
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
        }
        for at in dead {
            self.note_dead(at);
        }
        self.fit_segments_to_index();
    }

    /// Whether one more key (beyond those `batch` adds) fits the memory: the index with
    /// it, and the segments held with the cleaner's reserve (module doc of
    /// [`segmented_log`](crate::segmented_log), "Memory").
    fn new_key_fits(&self, batch: &Batch) -> bool {
        let index = (self.index.len() + batch.new_keys + 1) * INDEX_BYTES_PER_OBJECT;
        let segments = (self.log.segments_held() + CLEANER_RESERVE_SEGMENTS)
            * u64::from(self.config.segment_bytes);
        index + segments <= self.config.memory_bytes
    }

    /// Gives the log the segments the memory holds beside the index.
    fn fit_segments_to_index(&mut self) {
        let index = self.index.len() * INDEX_BYTES_PER_OBJECT;
        let limit =
            self.config.memory_bytes.saturating_sub(index) / u64::from(self.config.segment_bytes);
        self.log.set_segments_limit(limit);
    }

    /// Stages one recovery piece into `batch` (see [`replay`](crate::replay) for the
    /// rules): appends each surviving object with its original version and each needed
    /// tombstone, updates `state`, and raises the safe version above everything the
    /// piece holds (appending a `SafeVersion` entry when it rises). Publish the batch
    /// with [`publish_recovered`](Self::publish_recovered) once it is replicated.
    ///
    /// # Errors
    /// [`NoSpace`] when the log is full; the entries staged until then stay in `batch`
    /// (publish it anyway: its bytes are in the log) and the recovery must fail.
    pub fn stage_replay(
        &mut self,
        batch: &mut Batch,
        state: &mut ReplayState,
        piece: &RecoveryPiece,
    ) -> Result<(), NoSpace> {
        // Leftovers of a failed attempt leave the log before this attempt's entries join
        // it (`forget_unowned`).
        if self.tainted_held() > 0 {
            return Err(NoSpace);
        }
        state.counts_mut().entries_received += piece.entries().len() as u64;
        for entry in piece.entries() {
            match entry {
                PieceEntry::Object {
                    table,
                    hash,
                    version,
                    key,
                    value,
                } => {
                    let (table, hash, version) = (*table, *hash, state.shifted(*version));
                    state.note_version(version);
                    let deleted = state.deleted(table, key).is_some_and(|d| d >= version);
                    let current = self.current(batch, table, hash, key);
                    if deleted || current.is_some_and(|(v, _)| v >= version) {
                        state.counts_mut().objects_dropped += 1;
                        continue;
                    }
                    if current.is_none() {
                        if !self.new_key_fits(batch) {
                            return Err(NoSpace);
                        }
                        batch.new_keys += 1;
                    }
                    // The version this one supersedes in this log (replayed earlier, or
                    // staged in this batch) stays in its segment: a tombstone masks it.
                    let superseded = current.map(|(version, at)| Superseded {
                        version,
                        segment: at.segment,
                    });
                    let Appended {
                        at,
                        tombstone_bytes,
                        ..
                    } = self.log.append_object_completing(
                        table,
                        version,
                        key,
                        value,
                        superseded,
                        None,
                        self.safe_version,
                    )?;
                    let bytes = object_entry_bytes(key.len(), value.len()) as u64 + tombstone_bytes;
                    self.note_replayed(table, hash, bytes, at.segment);
                    self.supersede_staged(batch, table, hash, key);
                    batch.insert(table, hash, key, Staged::Live { version, at });
                    let counts = state.counts_mut();
                    counts.objects_appended += 1;
                    counts.bytes_appended += bytes;
                    if current.is_none() {
                        counts.objects_live += 1;
                    }
                }
                PieceEntry::Tombstone {
                    table,
                    hash,
                    version,
                    key,
                } => {
                    let (table, hash, version) = (*table, *hash, state.shifted(*version));
                    state.note_version(version);
                    if !state.note_deleted(table, key, version) {
                        // An equal or newer tombstone was replayed already.
                        continue;
                    }
                    let current = self.current(batch, table, hash, key);
                    if current.is_some_and(|(v, _)| v > version) {
                        // The key was re-created after this deletion; it survives.
                        continue;
                    }
                    // The tombstone names the segment of the object it kills here; with
                    // none, the head: no older copy of the key can lie in a later one.
                    let object_segment = current.map_or(self.log.head(), |(_, at)| at.segment);
                    let at = self.log.append_tombstone(
                        table,
                        version,
                        object_segment,
                        key,
                        self.safe_version,
                    )?;
                    let bytes = tombstone_entry_bytes(key.len()) as u64;
                    self.note_replayed(table, hash, bytes, at.segment);
                    self.supersede_staged(batch, table, hash, key);
                    batch.insert(table, hash, key, Staged::Removed);
                    let counts = state.counts_mut();
                    counts.tombstones_appended += 1;
                    counts.bytes_appended += bytes;
                    if current.is_some() {
                        counts.objects_live = counts.objects_live.saturating_sub(1);
                    }
                }
                PieceEntry::Completion(record) => {
                    let record = CompletionEntry {
                        version: state.shifted(record.version),
                        ..*record
                    };
                    state.note_version(record.version);
                    batch.note_ack(record.client, record.ack);
                    let known = batch.completions.contains_key(&(record.client, record.seq))
                        || self.completions.lookup(record.client, record.seq) != Lookup::New
                        || batch
                            .acks
                            .get(&record.client)
                            .is_some_and(|&ack| record.seq <= ack);
                    if known {
                        continue;
                    }
                    let at = self.log.append_completion(&record, self.safe_version)?;
                    let bytes = COMPLETION_ENTRY_BYTES as u64;
                    self.note_replayed(record.table, record.key_hash, bytes, at.segment);
                    batch.add_record(record.client, record.seq, Record::of(&record, at));
                    let counts = state.counts_mut();
                    counts.completions_kept += 1;
                    counts.bytes_appended += bytes;
                }
            }
        }
        let floor = self
            .safe_version
            .max(state.shifted(piece.safe_version()))
            .max(state.version_max().next())
            .max(state.version_floor());
        self.version_max = self.version_max.max(state.version_max()).max(floor);
        if floor > self.safe_version {
            self.safe_version = floor;
            self.log.append_safe_version(floor)?;
        }
        Ok(())
    }

    /// Counts a replayed entry (appended to `segment`) in the profiler, or remembers it
    /// until its tablet is taken.
    fn note_replayed(&mut self, table: TableId, hash: KeyHash, bytes: u64, segment: SegmentId) {
        if !self.profiler.track(table, hash, bytes) {
            self.replayed_untracked.push((table, hash, bytes, segment));
        }
    }

    /// Removes the objects of `table` with hashes in `range` from the index; their
    /// entries are dead. Returns where they are (still in the log: no tombstone masks
    /// them).
    fn forget_range(&mut self, table: TableId, range: RangeInclusive<u64>) -> Vec<LogRef> {
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
    fn note_dead(&mut self, at: LogRef) {
        let object = self.log.object(at);
        let bytes = object_entry_bytes(object.key.len(), object.value.len()) as u64;
        self.log.note_dead(at, bytes);
    }

    /// The entry staged for `key` earlier in `batch`, if an object, is superseded by the
    /// one being staged now: it never reaches the index.
    fn supersede_staged(&mut self, batch: &Batch, table: TableId, hash: KeyHash, key: &Bytes) {
        if let Some(Staged::Live { at, .. }) = batch.get(table, hash, key) {
            self.note_dead(at);
        }
    }

    /// Plans a cleaning pass over the log's closed segments (cost-benefit,
    /// [`cleaner::select`]) filling at most `survivors_max` survivors
    /// ([`cleaner::PASS_SURVIVORS_MAX`] in the appender); `None` when no choice would
    /// free a segment.
    ///
    /// Tainted segments ([`forget_unowned`](Self::forget_unowned)) come first, whatever
    /// they score: until they are gone, no recovery can be replayed here.
    pub fn plan_cleaning(&self, survivors_max: u64) -> Option<CleaningPass> {
        let closed = self.log.closed_segments();
        let usage = self.log.usage();
        let tainted: Vec<SegmentId> = closed
            .iter()
            .map(|s| s.segment)
            .filter(|s| self.tainted.contains(s))
            .take(usize::try_from(survivors_max.max(1)).unwrap_or(usize::MAX))
            .collect();
        if !tainted.is_empty() {
            let stamp = closed
                .iter()
                .filter(|s| tainted.contains(&s.segment))
                .map(|s| s.stamp)
                .max()
                .unwrap_or(usage.clock);
            return Some(CleaningPass::new(tainted, stamp));
        }
        let segment_bytes = u64::from(usage.segment_bytes);
        // A survivor holds its header, a checksum per step and its footer besides the
        // entries: counted generously.
        let survivor_capacity = segment_bytes.saturating_sub(SEGMENT_FIXED_OVERHEAD_BYTES as u64);
        let chosen = cleaner::select(
            &closed,
            usage.clock,
            segment_bytes,
            survivor_capacity,
            survivors_max,
        );
        if chosen.is_empty() {
            return None;
        }
        let stamp = closed
            .iter()
            .filter(|s| chosen.contains(&s.segment))
            .map(|s| s.stamp)
            .max()
            .unwrap_or(usage.clock);
        Some(CleaningPass::new(chosen, stamp))
    }

    /// One bounded step of `pass` (module doc of [`cleaner`]): walks at most
    /// `budget_bytes` of the cleaned segments' entries, copying the live ones into the
    /// pass's survivor and dropping the dead ones (uncounting them in the profiles), and
    /// seals what it copied. Replicate the log's unreplicated ranges ([`seal`](Self::seal))
    /// before anything else; commit with [`commit_cleaning`](Self::commit_cleaning) when
    /// the step ends with a survivor closed, the pass done, or no buffer.
    ///
    /// An object is live when the index points at it; it moves with its version, and
    /// the index follows it. A tombstone is live while the segment of the object it
    /// deletes is in the log and not freed by this pass at the latest when the
    /// tombstone's own segment is ([`CleaningPass::walked_before`]); it moves unchanged.
    pub fn clean_step(&mut self, pass: &mut CleaningPass, budget_bytes: usize) -> StepEnd {
        let end = self.walk(pass, budget_bytes);
        if let Some(survivor) = pass.survivor() {
            self.log.seal_survivor(survivor);
        }
        end
    }

    fn walk(&mut self, pass: &mut CleaningPass, budget_bytes: usize) -> StepEnd {
        let mut walked = 0usize;
        // The next entries of the segment being walked, parsed and located ahead.
        let mut ahead: VecDeque<(LogRef, WalkedEntry, Option<SlotAt>)> =
            VecDeque::with_capacity(WALK_AHEAD);
        loop {
            let Some((segment, offset)) = pass.position() else {
                if let Some(survivor) = pass.survivor() {
                    self.log.close_survivor(survivor);
                    pass.survivor_closed();
                }
                return StepEnd::Done;
            };
            if walked >= budget_bytes {
                return StepEnd::Budget;
            }
            let here = LogRef { segment, offset };
            if ahead.front().map(|(at, ..)| *at) != Some(here) {
                self.walk_ahead(here, &mut ahead);
            }
            let Some((_, found, located)) = ahead.pop_front() else {
                // The end of the segment (its bytes end at the footer's checksum).
                pass.segment_walked();
                continue;
            };
            walked += (found.next - offset) as usize;
            let bytes = u64::from(found.next - offset);
            let range = (offset, found.next);
            let (table, hash) = match found.kind {
                Walked::Object { table, hash } => {
                    // Live when the index points here (located ahead); the copy and the
                    // move of the reference need no second lookup.
                    if let Some(slot) = located {
                        let new = match relocate(&mut self.log, pass, segment, range) {
                            Ok(new) => new,
                            Err(end) => return end,
                        };
                        if !self.index.repoint(slot, here, new) {
                            // Cannot happen (nothing reshapes the index during a walk);
                            // stay right anyway.
                            match self.index.ref_mut(table, hash, here) {
                                Some(held) => *held = new,
                                None => self.log.note_dead(new, bytes),
                            }
                        }
                        self.relocated(pass, here, bytes, found.next);
                        continue;
                    }
                    (table, hash)
                }
                Walked::Tombstone {
                    table,
                    hash,
                    object_segment,
                } => {
                    let live =
                        self.log.holds(object_segment) && !pass.walked_before(object_segment);
                    if live {
                        let new = match relocate(&mut self.log, pass, segment, range) {
                            Ok(new) => new,
                            Err(end) => return end,
                        };
                        self.log
                            .tombstone_moved(object_segment, segment, new.segment, bytes);
                        self.relocated(pass, here, bytes, found.next);
                        continue;
                    }
                    (table, hash)
                }
                Walked::Completion {
                    table,
                    hash,
                    client,
                    seq,
                } => {
                    // Live while its client has not acknowledged it and its tablet is
                    // here: the record then points at this very entry.
                    if self.completions.holds(client, seq, here) {
                        let new = match relocate(&mut self.log, pass, segment, range) {
                            Ok(new) => new,
                            Err(end) => return end,
                        };
                        self.completions.repoint(client, seq, here, new);
                        self.relocated(pass, here, bytes, found.next);
                        continue;
                    }
                    (table, hash)
                }
                Walked::Other => {
                    // Headers, digests, safe versions (every head opens with the floor,
                    // `SegmentedLog` module doc), checksums and footers stay behind.
                    pass.advance(found.next);
                    continue;
                }
            };
            self.profiler.untrack(table, hash, bytes);
            pass.note_dropped(bytes);
            pass.advance(found.next);
        }
    }

    /// Parses the next [`WALK_AHEAD`] entries of `from`'s segment, from `from` on, and
    /// locates each object among them in the index, into `ahead` (emptied first).
    /// Their buckets are warmed first ([`ObjectIndex::warm`]) in one short loop, so the
    /// processor overlaps their cache misses, which one lookup at a time between copies
    /// would wait out one after the other (at a million objects, most of a step's
    /// time). Nothing changes the index's shape during a walk (moves only repoint), so
    /// what is located stays valid while the walk uses it.
    fn walk_ahead(
        &self,
        from: LogRef,
        ahead: &mut VecDeque<(LogRef, WalkedEntry, Option<SlotAt>)>,
    ) {
        ahead.clear();
        let Some(bytes) = self.log.segment_bytes(from.segment) else {
            return;
        };
        let mut offset = from.offset;
        let mut objects = Vec::with_capacity(WALK_AHEAD);
        while ahead.len() < WALK_AHEAD {
            let Some(found) = walk_entry(bytes, offset) else {
                break;
            };
            let here = LogRef {
                segment: from.segment,
                offset,
            };
            if let Walked::Object { table, hash } = found.kind {
                objects.push((table, hash));
            }
            offset = found.next;
            ahead.push_back((here, found, None));
        }
        self.index.warm(&objects);
        for (here, found, located) in ahead.iter_mut() {
            if let Walked::Object { table, hash } = found.kind {
                *located = self.index.locate(table, hash, *here);
            }
        }
    }

    /// Books an entry of `bytes` at `here` copied into the survivor; the walk goes on at
    /// `next`.
    fn relocated(&mut self, pass: &mut CleaningPass, here: LogRef, bytes: u64, next: u32) {
        // Counted in the survivor now; the cleaned segment goes at a commit.
        self.log.note_dead(here, bytes);
        pass.note_relocated(bytes);
        pass.advance(next);
    }

    /// Commits what `pass` finished (module doc of [`cleaner`]): closed survivors join
    /// the log, finished segments leave it, with a digest appended to the head. Returns
    /// the segments retired; replicate the log's unreplicated ranges
    /// ([`seal`](Self::seal)), then [`free_cleaned`](Self::free_cleaned).
    ///
    /// # Errors
    /// [`NoSpace`] when the digest fits nowhere; the pass keeps its finished segments.
    pub fn commit_cleaning(&mut self, pass: &mut CleaningPass) -> Result<Vec<SegmentId>, NoSpace> {
        let finished = pass.take_finished();
        match self.log.commit_cleaning(&finished, self.safe_version) {
            Ok(()) => Ok(finished),
            Err(full) => {
                pass.return_finished(finished);
                Err(full)
            }
        }
    }

    /// Frees the segments the last commit retired, once its digest is on every replica;
    /// returns them (their replicas may now be freed on the backups).
    pub fn free_cleaned(&mut self) -> Vec<SegmentId> {
        self.log.free_retired()
    }

    /// Whether this master owns any hash of `ranges`.
    pub fn owns_any(&self, ranges: &[HashRange]) -> bool {
        ranges
            .iter()
            .any(|&HashRange { table, start, end }| self.tablets.owns_any(table, start, end))
    }

    /// Forgets every object in `ranges` that this master does not own: what a failed or
    /// abandoned recovery left in the index. Their pending profile counts are dropped
    /// (should the ranges come here later, only the entries of that recovery are
    /// counted). Returns how many objects were forgotten.
    ///
    /// Their entries stay in this log, and this master may own those ranges later (a
    /// later recovery of them, or of their next owner): a crash then would replay them
    /// beside newer data that may have removed their keys meanwhile, with nothing left
    /// to mask them. A tombstone cannot mask them: the range's next owner may hand this
    /// master the very same versions again, which a tombstone would kill too. So every
    /// segment that holds an entry of the attempt is *tainted*: the cleaner takes those
    /// first ([`plan_cleaning`](Self::plan_cleaning)), dropping the forgotten entries
    /// (dead) and moving everything else, and [`stage_replay`](Self::stage_replay)
    /// refuses while any of them is in the log ([`tainted_held`](Self::tainted_held)).
    pub fn forget_unowned(&mut self, ranges: &[HashRange]) -> u64 {
        let mut removed = 0;
        for &HashRange { table, start, end } in ranges {
            for (from, to) in self.tablets.unowned_parts(table, start, end) {
                let range = from..=to;
                let refs = self.forget_range(table, range.clone());
                removed += refs.len() as u64;
                // Where the live ones are now (the cleaner may have moved them), and
                // where every entry of the attempt was appended (dead ones never move).
                self.tainted.extend(refs.iter().map(|at| at.segment));
                let tainted = &mut self.tainted;
                self.replayed_untracked.retain(|&(t, hash, _, segment)| {
                    let inside = t == table && range.contains(&hash.0);
                    if inside {
                        tainted.insert(segment);
                    }
                    !inside
                });
            }
        }
        let log = &self.log;
        self.tainted.retain(|&segment| log.holds(segment));
        removed
    }

    /// Tainted segments still in the log ([`forget_unowned`](Self::forget_unowned)).
    pub fn tainted_held(&self) -> usize {
        self.tainted.iter().filter(|&&s| self.log.holds(s)).count()
    }

    /// Whether a tainted segment other than the head is in the log: the cleaner has one
    /// to take now.
    pub fn tainted_to_clean(&self) -> bool {
        let head = self.log.head();
        self.tainted.iter().any(|&s| s != head && self.log.holds(s))
    }

    /// Closes the head when it is tainted, so that the cleaner can take it; `NoSpace`
    /// when no buffer is free for a new head (a later rollover closes it).
    pub fn close_tainted_head(&mut self) -> Result<(), NoSpace> {
        let log = &self.log;
        self.tainted.retain(|&segment| log.holds(segment));
        if self.tainted.contains(&self.log.head()) {
            self.log.roll_over_now(self.safe_version)?;
        }
        Ok(())
    }

    /// This master's will: its owned tablets cut into partitions within the partition
    /// limits, from the profiles of everything appended.
    pub fn will(&self) -> Will {
        self.profiler.will(
            self.partition_limits.bytes_max,
            self.partition_limits.records_max,
        )
    }

    /// The profiles behind the will.
    pub fn profiler(&self) -> &Profiler {
        &self.profiler
    }

    /// One page of the objects of `table` whose key hashes lie in `hashes`, of about
    /// `max_bytes` (clamped to 1..=[`ENUMERATE_PAGE_BYTES_MAX`]; whole hash buckets, so
    /// a page may go past it by one bucket). The range's start must be owned here
    /// (`UnknownTablet`) and not past its end (`InvalidArgument`); past the tablet
    /// that owns the start, the page stops and `next_hash` sends the caller on.
    pub fn enumerate(
        &self,
        table: TableId,
        hashes: RangeInclusive<u64>,
        max_bytes: u32,
    ) -> Result<EnumeratePage, Status> {
        let (resume_hash, end_hash) = hashes.into_inner();
        let (_, owned_end) = self
            .tablets
            .range_of(table, resume_hash)
            .ok_or(Status::UnknownTablet)?;
        if end_hash < resume_hash {
            return Err(Status::InvalidArgument);
        }
        // The client may think this master owns more than it does now; serve what it
        // owns and send the client elsewhere for the rest.
        let end = end_hash.min(owned_end);
        let max_bytes = (max_bytes as usize).clamp(1, ENUMERATE_PAGE_BYTES_MAX);
        let mut objects = Vec::new();
        let mut bytes = 0usize;
        let mut next_hash = None;
        // A page ends between two hashes, never inside the objects of one (colliding
        // keys): the cursor is a hash.
        let mut last = None;
        for (hash, at) in self.index.range(table, resume_hash..=end) {
            if bytes >= max_bytes && last != Some(hash) {
                next_hash = Some(hash.0);
                break;
            }
            last = Some(hash);
            let object = self.log.object(at);
            bytes += object.key.len() + object.value.len() + 16;
            objects.push((
                Bytes::copy_from_slice(object.key),
                Object {
                    version: object.version,
                    value: Bytes::copy_from_slice(object.value),
                },
            ));
        }
        if next_hash.is_none() && end < end_hash {
            next_hash = Some(end + 1);
        }
        Ok(EnumeratePage { objects, next_hash })
    }

    /// Starts serving `tablets`.
    ///
    /// A tablet that replaces a wider owned range narrows it: objects in the part no
    /// longer served are forgotten. Their entries stay in the log: nothing narrows a
    /// tablet that may come back here today (a tablet is split only when a table is
    /// created); moving ranges between masters must clean them out first, as
    /// [`forget_unowned`](Self::forget_unowned) does.
    /// Objects already indexed in a range not owned before — replayed by a recovery —
    /// are kept: this is how they become visible. Their entries are counted in the
    /// tablet's profile now.
    pub fn take_tablets(&mut self, tablets: &[Tablet]) {
        for tablet in tablets {
            for (start, end) in self.tablets.take(tablet) {
                self.forget_range(tablet.table, start..=end);
            }
            self.profile_taken(tablet);
        }
    }

    /// Starts profiling `tablet`, counting the entries a recovery replayed into it.
    fn profile_taken(&mut self, tablet: &Tablet) {
        self.profiler.take_tablet(tablet);
        let range = tablet.start_hash..=tablet.end_hash;
        let profiler = &mut self.profiler;
        self.replayed_untracked.retain(|&(table, hash, bytes, _)| {
            let inside = table == tablet.table && range.contains(&hash.0);
            if inside {
                profiler.track(table, hash, bytes);
            }
            !inside
        });
    }

    /// The coordinator's number of the last change of this master's tablets applied here
    /// (see [`OwnedTablets::step`]).
    pub fn tablets_epoch(&self) -> TabletEpoch {
        self.tablets.epoch()
    }

    /// Applies the coordinator's change number `epoch` of this master's tablets — take
    /// `tablets`, as [`take_tablets`](Self::take_tablets) — if it is the next one;
    /// returns where it stood ([`EpochStep::Gap`]: pull the whole set instead).
    pub fn take_tablets_at(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) -> EpochStep {
        let step = self.tablets.step(epoch);
        if step == EpochStep::Next {
            self.take_tablets(tablets);
            self.tablets.set_epoch(epoch);
        }
        step
    }

    /// Applies the change number `epoch` — drop `tablets` and forget their objects, as
    /// [`drop_tablets`](Self::drop_tablets) — if it is the next one; returns where it
    /// stood.
    pub fn drop_tablets_at(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) -> EpochStep {
        let step = self.tablets.step(epoch);
        if step == EpochStep::Next {
            self.drop_tablets(tablets);
            self.tablets.set_epoch(epoch);
        }
        step
    }

    /// Serves exactly `tablets` — this master's whole set in the committed map, as of its
    /// tablet epoch `epoch` — unless what is served reflects that epoch already. Objects
    /// in parts no longer served are forgotten; those a recovery replayed into newly
    /// served ranges become visible. Returns whether anything was applied.
    pub fn replace_tablets(&mut self, epoch: TabletEpoch, tablets: &[Tablet]) -> bool {
        if epoch <= self.tablets.epoch() {
            return false;
        }
        let new: HashSet<HashRange> = tablets.iter().map(Tablet::range).collect();
        let before = self.tablets.ranges();
        let old: HashSet<HashRange> = before.iter().copied().collect();
        for HashRange {
            table,
            start: from,
            end: to,
        } in self.tablets.replace(tablets)
        {
            self.forget_range(table, from..=to);
        }
        // Profiles of tablets gone for good end; one that a new tablet overlaps is
        // replaced by that tablet's, which inherits its counts.
        let own = self.log.log_id();
        let overlapped = |&HashRange { table, start, end }: &HashRange| {
            tablets
                .iter()
                .any(|t| t.table == table && t.start_hash <= end && start <= t.end_hash)
        };
        for &HashRange {
            table,
            start: start_hash,
            end: end_hash,
        } in before.iter().filter(|r| !new.contains(r) && !overlapped(r))
        {
            self.profiler.drop_tablet(&Tablet {
                table,
                start_hash,
                end_hash,
                owner: own,
            });
        }
        for tablet in tablets.iter().filter(|t| !old.contains(&t.range())) {
            self.profile_taken(tablet);
        }
        self.tablets.set_epoch(epoch);
        true
    }

    /// Stops serving `tablets` and forgets their objects (their log space is reclaimed
    /// by the cleaner). They are not masked: a dropped table's id is never used again,
    /// so no later owner of its ranges can meet them.
    pub fn drop_tablets(&mut self, tablets: &[Tablet]) -> u64 {
        let mut removed = 0;
        for tablet in tablets {
            for (start, end) in self.tablets.drop_overlapping(tablet) {
                removed += self.forget_range(tablet.table, start..=end).len() as u64;
            }
            self.profiler.drop_tablet(tablet);
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

    /// Makes this master hand out only versions below a ceiling reserved at the
    /// coordinator, starting from none: call before it serves anything.
    pub fn enforce_version_ceiling(&mut self) {
        self.version_ceiling = Version(0);
    }

    /// The version ceiling this master knows.
    pub fn version_ceiling(&self) -> Version {
        self.version_ceiling
    }

    /// Raises the version ceiling to `ceiling` (reserved at the coordinator, or reported
    /// by it); a lower one changes nothing.
    pub fn raise_version_ceiling(&mut self, ceiling: Version) {
        self.version_ceiling = self.version_ceiling.max(ceiling);
    }

    /// The ceiling to reserve now, if fewer than [`VERSION_LOW_WATER`] versions are left
    /// below the one held: the highest version held plus [`VERSION_RESERVATION`].
    pub fn ceiling_wanted(&self) -> Option<Version> {
        let left = self.version_ceiling.0.saturating_sub(self.version_max.0);
        (left < VERSION_LOW_WATER)
            .then(|| Version(self.version_max.0.saturating_add(VERSION_RESERVATION)))
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

/// Copies the entry at `range` of `segment` into `pass`'s survivor in `log` (opening
/// one when none is open). Errs with where the step ends: the survivor full (closed
/// now: the entry is copied by the next step, into the next survivor) or no buffer for
/// a new one.
fn relocate(
    log: &mut SegmentedLog,
    pass: &mut CleaningPass,
    segment: SegmentId,
    range: (u32, u32),
) -> Result<LogRef, StepEnd> {
    let survivor = match pass.survivor() {
        Some(survivor) => survivor,
        None => {
            let survivor = log
                .open_survivor(pass.stamp())
                .map_err(|NoSpace| StepEnd::NoBuffer)?;
            pass.survivor_opened(survivor);
            survivor
        }
    };
    log.copy_entry(segment, range, survivor).map_err(|LogFull| {
        log.close_survivor(survivor);
        pass.survivor_closed();
        StepEnd::SurvivorClosed
    })
}

/// What the cleaner's walk found at one offset of a segment.
struct WalkedEntry {
    kind: Walked,
    /// Offset of the next entry.
    next: u32,
}

enum Walked {
    Object {
        table: TableId,
        hash: KeyHash,
    },
    Tombstone {
        table: TableId,
        hash: KeyHash,
        object_segment: SegmentId,
    },
    Completion {
        table: TableId,
        hash: KeyHash,
        client: ClientId,
        seq: u64,
    },
    Other,
}

/// The entry at `offset` of `bytes`, a segment of this master's own log: objects are
/// read without checking their CRC again (this master wrote and sealed them; the read
/// path trusts them the same way), tombstones and the rest are decoded. `None` at the
/// end of the bytes.
fn walk_entry(bytes: &[u8], offset: u32) -> Option<WalkedEntry> {
    let at = offset as usize;
    if let Some(object) = decode_object_trusted(bytes, at) {
        let next = at + object_entry_bytes(object.key.len(), object.value.len());
        return Some(WalkedEntry {
            kind: Walked::Object {
                table: object.table,
                hash: key_hash(object.key),
            },
            next: next as u32,
        });
    }
    let (entry, next) = decode_entry(bytes, at).ok()??;
    let kind = match entry {
        Entry::Tombstone(tombstone) => Walked::Tombstone {
            table: tombstone.table,
            hash: key_hash(tombstone.key),
            object_segment: tombstone.segment_id,
        },
        Entry::Completion(record) => Walked::Completion {
            table: record.table,
            hash: record.key_hash,
            client: record.client,
            seq: record.seq,
        },
        // Named one by one: an entry type added later must be decided on here.
        Entry::Object(_)
        | Entry::Header(_)
        | Entry::Digest(_)
        | Entry::SafeVersion(_)
        | Entry::Checksum(_)
        | Entry::Footer { .. } => Walked::Other,
    };
    Some(WalkedEntry {
        kind,
        next: next as u32,
    })
}

/// A read as assertions see it: its status, and version 0 and no value when it found
/// nothing (as the wire reports it).
#[cfg(test)]
pub(crate) trait ReadResult {
    fn status(&self) -> Status;
    fn version(&self) -> Version;
    fn value(&self) -> Bytes;
}

#[cfg(test)]
impl ReadResult for Result<Object, Status> {
    fn status(&self) -> Status {
        self.as_ref().err().copied().unwrap_or(Status::Ok)
    }

    fn version(&self) -> Version {
        self.as_ref().map_or(Version(0), |object| object.version)
    }

    fn value(&self) -> Bytes {
        self.as_ref()
            .map_or_else(|_| Bytes::new(), |object| object.value.clone())
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::segmented_log::CLEANER_RESERVE_SEGMENTS;
    use proptest::prelude::*;
    use rampart_common::ids::SegmentId;
    use rampart_common::log::scanner::{scan, StopReason};
    use std::collections::HashSet;

    const TABLE: TableId = TableId(1);

    /// 8 segments of 128 KiB: small enough to fill and roll over quickly, large enough
    /// for the largest object (a 64 KiB key with a 1 KiB value).
    fn config() -> MasterConfig {
        let config = MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 1024 * 1024,
            value_bytes_max: 1024,
            ..Default::default()
        };
        assert_eq!(config.validate(), Ok(()));
        config
    }

    fn tablet(table: TableId, start_hash: u64, end_hash: u64) -> Tablet {
        Tablet {
            table,
            start_hash,
            end_hash,
            owner: ServerId(1),
        }
    }

    /// A store owning the whole hash space of `TABLE`.
    fn store() -> ObjectStore {
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
        store
    }

    /// Applies `ops` as one batch: stage all, seal, publish.
    fn apply_batch(store: &mut ObjectStore, ops: &[WriteOp]) -> Vec<OpOutcome> {
        let mut batch = Batch::new();
        let outcomes = ops.iter().map(|op| store.stage(&mut batch, op)).collect();
        store.seal();
        store.publish(batch);
        outcomes
    }

    /// Applies one operation as its own batch.
    fn apply(store: &mut ObjectStore, op: &WriteOp) -> OpOutcome {
        apply_batch(store, std::slice::from_ref(op)).remove(0)
    }

    fn write_if(key: &[u8], value: &[u8], rules: RejectRules) -> WriteOp {
        WriteOp::Write {
            table: TABLE,
            key: Bytes::copy_from_slice(key),
            value: Bytes::copy_from_slice(value),
            rules,
            rifl: rampart_common::rifl::Rifl::NONE,
        }
    }

    fn write(key: &[u8], value: &[u8]) -> WriteOp {
        write_if(key, value, RejectRules::default())
    }

    fn remove_if(key: &[u8], rules: RejectRules) -> WriteOp {
        WriteOp::Remove {
            table: TABLE,
            key: Bytes::copy_from_slice(key),
            rules,
            rifl: rampart_common::rifl::Rifl::NONE,
        }
    }

    fn remove(key: &[u8]) -> WriteOp {
        remove_if(key, RejectRules::default())
    }

    fn increment_if(key: &[u8], delta: i64, rules: RejectRules) -> WriteOp {
        WriteOp::Increment {
            table: TABLE,
            key: Bytes::copy_from_slice(key),
            delta,
            rules,
            rifl: rampart_common::rifl::Rifl::NONE,
        }
    }

    fn increment(key: &[u8], delta: i64) -> WriteOp {
        increment_if(key, delta, RejectRules::default())
    }

    /// Writes `value` under `key` unconditionally and returns the new version.
    fn put(store: &mut ObjectStore, key: &[u8], value: &[u8]) -> Version {
        let outcome = apply(store, &write(key, value));
        assert_eq!(outcome.status, Status::Ok, "write of {key:?}");
        outcome.version
    }

    /// Removes `key` unconditionally and returns the version removed.
    fn delete(store: &mut ObjectStore, key: &[u8]) -> Version {
        let outcome = apply(store, &remove(key));
        assert_eq!(outcome.status, Status::Ok, "remove of {key:?}");
        outcome.version
    }

    /// Total bytes written to the log, sealed or not.
    fn log_len(store: &ObjectStore) -> usize {
        let log = store.log();
        log.segment_ids()
            .map(|id| log.segment_bytes(id).unwrap().len())
            .sum()
    }

    fn int(n: i64) -> [u8; 8] {
        n.to_le_bytes()
    }

    /// A key whose hash is at most (`low`) or above (`!low`) `split`.
    fn key_on_side(split: u64, low: bool, tag: &str) -> Vec<u8> {
        (0u32..)
            .map(|i| format!("{tag}-{i}").into_bytes())
            .find(|key| (key_hash(key).0 <= split) == low)
            .unwrap()
    }

    /// Which operation a reject-rule case applies.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Kind {
        Write,
        Remove,
        Increment,
    }

    /// Runs every reject rule against `kind`, in a state that trips it and one that lets
    /// the operation through. A rejected operation must report the current version and
    /// change nothing, not even the log; a passing one must take effect.
    fn check_reject_rules(kind: Kind) {
        const OLD: i64 = 5;
        const DELTA: i64 = 3;
        let op = |rules: RejectRules| match kind {
            Kind::Write => write_if(b"k", b"new", rules),
            Kind::Remove => remove_if(b"k", rules),
            Kind::Increment => increment_if(b"k", DELTA, rules),
        };
        let doesnt_exist = |r: &mut RejectRules| r.doesnt_exist = true;
        let exists = |r: &mut RejectRules| r.exists = true;
        let le_given = |r: &mut RejectRules| r.version_le_given = true;
        let ne_given = |r: &mut RejectRules| r.version_ne_given = true;
        // (case, object present, rule, given version relative to the object's, rejection)
        type Case = (
            &'static str,
            bool,
            fn(&mut RejectRules),
            i64,
            Option<Status>,
        );
        let no_object = Some(Status::ObjectDoesntExist);
        let object_exists = Some(Status::ObjectExists);
        let wrong = Some(Status::WrongVersion);
        let cases: [Case; 12] = [
            ("doesnt_exist, missing", false, doesnt_exist, 0, no_object),
            ("doesnt_exist, present", true, doesnt_exist, 0, None),
            ("exists, present", true, exists, 0, object_exists),
            ("exists, missing", false, exists, 0, None),
            ("le_given, equal", true, le_given, 0, wrong),
            ("le_given, greater", true, le_given, 1, wrong),
            ("le_given, smaller", true, le_given, -1, None),
            ("le_given, missing", false, le_given, 0, None),
            ("ne_given, greater", true, ne_given, 1, wrong),
            ("ne_given, smaller", true, ne_given, -1, wrong),
            ("ne_given, equal", true, ne_given, 0, None),
            ("ne_given, missing", false, ne_given, 0, None),
        ];
        for (case, present, rule, offset, rejected) in cases {
            let context = format!("{kind:?} with {case}");
            let mut store = store();
            // Raise the safe version above 1, so that a new object's version, an
            // overwrite's and "given - 1" are all distinct real versions.
            put(&mut store, b"other", b"x");
            put(&mut store, b"other", b"x");
            delete(&mut store, b"other");
            let safe = store.safe_version();
            assert!(safe > Version(2));
            if present {
                put(&mut store, b"k", &int(OLD));
                put(&mut store, b"k", &int(OLD));
            }
            let before = store.read(TABLE, b"k");
            let current = before.version();
            // For a missing object the given version is arbitrary: no version rule fires.
            let reference = if present { current.0 } else { safe.0 + 1 };
            let mut rules = RejectRules {
                given_version: Version(reference.checked_add_signed(offset).unwrap()),
                ..RejectRules::default()
            };
            rule(&mut rules);
            let log_before = log_len(&store);
            let outcome = apply(&mut store, &op(rules));
            let after = store.read(TABLE, b"k");
            match rejected {
                Some(status) => {
                    assert_eq!(outcome.status, status, "{context}");
                    assert_eq!(outcome.version, current, "{context}");
                    assert_eq!(after, before, "{context}: a rejected op changes nothing");
                    assert_eq!(log_len(&store), log_before, "{context}: nothing appended");
                }
                None => {
                    assert_eq!(outcome.status, Status::Ok, "{context}");
                    let new_version = if present { current.next() } else { safe };
                    match kind {
                        Kind::Write => {
                            assert_eq!(after.status(), Status::Ok, "{context}");
                            assert_eq!(&after.value()[..], b"new", "{context}");
                            assert_eq!(after.version(), new_version, "{context}");
                            assert_eq!(outcome.version, new_version);
                        }
                        Kind::Remove => {
                            assert_eq!(after.status(), Status::ObjectDoesntExist, "{context}");
                            assert_eq!(outcome.version, current, "{context}");
                        }
                        Kind::Increment => {
                            let old = if present { OLD } else { 0 };
                            assert_eq!(after.status(), Status::Ok, "{context}");
                            assert_eq!(&after.value()[..], &int(old + DELTA), "{context}");
                            assert_eq!(after.version(), new_version, "{context}");
                            assert_eq!(
                                (outcome.version, outcome.counter),
                                (new_version, Some(old + DELTA))
                            );
                        }
                    }
                }
            }
        }
    }

    /// Enumerates `[resume, end]` of `TABLE` page by page, checking each page's bounds.
    fn enumerate_all(store: &ObjectStore, end: u64, max_bytes: u32) -> Vec<(Bytes, Object)> {
        let mut all = Vec::new();
        let mut resume = Some(0u64);
        let mut pages = 0;
        while let Some(resume_hash) = resume {
            pages += 1;
            assert!(pages <= 100_000, "enumeration does not terminate");
            let page = store
                .enumerate(TABLE, resume_hash..=end, max_bytes)
                .unwrap();
            assert!(
                !page.objects.is_empty() || page.next_hash.is_none(),
                "no progress"
            );
            let sizes: Vec<usize> = page
                .objects
                .iter()
                .map(|(key, o)| key.len() + o.value.len() + 16)
                .collect();
            // Soft bound: everything but the last object fits under max_bytes.
            let before_last: usize = sizes.iter().rev().skip(1).sum();
            assert!(
                before_last < (max_bytes as usize).max(1),
                "page over its bound"
            );
            let hashes: Vec<u64> = page
                .objects
                .iter()
                .map(|(key, _)| key_hash(key).0)
                .collect();
            assert!(hashes.iter().all(|h| (resume_hash..=end).contains(h)));
            if let Some(next) = page.next_hash {
                assert!(next > resume_hash);
                assert!(hashes.iter().all(|h| *h < next));
            }
            all.extend(page.objects);
            resume = page.next_hash;
        }
        all
    }

    /// A reference model of the store, written from the rules in the module doc. Ops
    /// apply to it one by one, so it holds what the store holds once a batch publishes.
    #[derive(Debug, Default)]
    struct Model {
        /// Key → (version, value).
        objects: HashMap<Vec<u8>, (Version, Vec<u8>)>,
        /// The version a new object gets.
        safe_version: u64,
        /// The highest version ever removed, of any key.
        removed_max: Option<Version>,
    }

    impl Model {
        /// The outcome `op` must have, applying it to the model.
        fn apply(&mut self, op: &WriteOp) -> (Status, Version, Option<i64>) {
            let (key, rules) = match op {
                WriteOp::Write { key, rules, .. }
                | WriteOp::Remove { key, rules, .. }
                | WriteOp::Increment { key, rules, .. } => (key.to_vec(), *rules),
            };
            let current = self.objects.get(&key).cloned();
            let current_version = current.as_ref().map_or(Version(0), |(v, _)| *v);
            if let Some(status) = rules.check(current.as_ref().map(|(v, _)| *v)) {
                return (status, current_version, None);
            }
            let new_version = current
                .as_ref()
                .map_or(Version(self.safe_version), |(v, _)| v.next());
            match op {
                WriteOp::Write { value, .. } => {
                    self.objects.insert(key, (new_version, value.to_vec()));
                    (Status::Ok, new_version, None)
                }
                WriteOp::Remove { .. } => {
                    if current.is_some() {
                        self.objects.remove(&key);
                        self.safe_version = self.safe_version.max(current_version.0 + 1);
                        self.removed_max = self.removed_max.max(Some(current_version));
                    }
                    (Status::Ok, current_version, None)
                }
                WriteOp::Increment { delta, .. } => {
                    let old = match &current {
                        None => 0,
                        Some((_, value)) => match <[u8; 8]>::try_from(&value[..]) {
                            Ok(bytes) => i64::from_le_bytes(bytes),
                            Err(_) => return (Status::NotAnInteger, current_version, None),
                        },
                    };
                    let Some(new) = old.checked_add(*delta) else {
                        return (Status::InvalidArgument, current_version, None);
                    };
                    self.objects
                        .insert(key, (new_version, new.to_le_bytes().to_vec()));
                    (Status::Ok, new_version, Some(new))
                }
            }
        }
    }

    fn arb_op() -> impl Strategy<Value = WriteOp> {
        let key = (0u8..6).prop_map(|k| Bytes::from(vec![b'k', k]));
        let rules = (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0u64..12,
        )
            .prop_map(|(d, e, le, ne, given)| RejectRules {
                given_version: Version(given),
                // Rules are rarer than plain operations, so that objects live long.
                doesnt_exist: d && e,
                exists: e && le,
                version_le_given: le && ne,
                version_ne_given: ne && d,
            });
        let value = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..12),
            any::<i64>().prop_map(|n| n.to_le_bytes().to_vec()),
            Just(i64::MAX.to_le_bytes().to_vec()),
        ];
        let delta = prop_oneof![-5i64..5, Just(i64::MAX), Just(i64::MIN)];
        prop_oneof![
            (key.clone(), value, rules.clone()).prop_map(|(key, value, rules)| WriteOp::Write {
                table: TABLE,
                key,
                value: Bytes::from(value),
                rules,
                rifl: rampart_common::rifl::Rifl::NONE,
            }),
            (key.clone(), rules.clone()).prop_map(|(key, rules)| WriteOp::Remove {
                table: TABLE,
                key,
                rules,
                rifl: rampart_common::rifl::Rifl::NONE,
            }),
            (key, delta, rules).prop_map(|(key, delta, rules)| WriteOp::Increment {
                table: TABLE,
                key,
                delta,
                rules,
                rifl: rampart_common::rifl::Rifl::NONE,
            }),
        ]
    }

    #[test]
    fn write_then_read_returns_the_value_and_version() {
        let mut store = store();
        let version = put(&mut store, b"k", b"hello");
        assert_eq!(version, Version::FIRST);
        let read = store.read(TABLE, b"k");
        assert_eq!(read.status(), Status::Ok);
        assert_eq!(read.version(), version);
        assert_eq!(&read.value()[..], b"hello");
        assert_eq!(store.object_count(), 1);
    }

    #[test]
    fn read_with_hands_over_the_same_object_as_read() {
        let mut store = store();
        let version = put(&mut store, b"k", b"hello");
        let (status, got_version, value) =
            store.read_with(TABLE, b"k", |s, v, bytes| (s, v, bytes.to_vec()));
        assert_eq!(
            (status, got_version, &value[..]),
            (Status::Ok, version, &b"hello"[..])
        );
        let missing = store.read_with(TABLE, b"nope", |s, v, bytes| (s, v, bytes.len()));
        assert_eq!(missing, (Status::ObjectDoesntExist, Version(0), 0));
    }

    #[test]
    fn overwrite_bumps_the_version_by_exactly_one() {
        let mut store = store();
        let mut version = put(&mut store, b"k", b"v0");
        for i in 1..10 {
            let value = format!("v{i}");
            let next = put(&mut store, b"k", value.as_bytes());
            assert_eq!(next, Version(version.0 + 1));
            version = next;
            let read = store.read(TABLE, b"k");
            assert_eq!(
                (read.version(), &read.value()[..]),
                (version, value.as_bytes())
            );
        }
        assert_eq!(store.object_count(), 1);
    }

    #[test]
    fn read_of_a_missing_key_is_object_doesnt_exist() {
        let mut store = store();
        put(&mut store, b"present", b"x");
        let read = store.read(TABLE, b"absent");
        assert_eq!(read.status(), Status::ObjectDoesntExist);
        assert_eq!(read.version(), Version(0));
        assert!(read.value().is_empty());
    }

    #[test]
    fn write_reject_rules_refuse_or_apply_as_specified() {
        check_reject_rules(Kind::Write);
    }

    #[test]
    fn remove_reject_rules_refuse_or_apply_as_specified() {
        check_reject_rules(Kind::Remove);
    }

    #[test]
    fn increment_reject_rules_refuse_or_apply_as_specified() {
        check_reject_rules(Kind::Increment);
    }

    #[test]
    fn remove_then_recreate_gets_a_higher_version() {
        let mut store = store();
        let first = put(&mut store, b"k", b"one");
        let second = put(&mut store, b"k", b"two");
        assert_eq!(delete(&mut store, b"k"), second);
        assert_eq!(store.read(TABLE, b"k").status(), Status::ObjectDoesntExist);
        let recreated = put(&mut store, b"k", b"three");
        assert!(recreated > second, "{recreated} after removing {second}");
        assert!(recreated > first);
        let read = store.read(TABLE, b"k");
        assert_eq!(
            (read.version(), &read.value()[..]),
            (recreated, &b"three"[..])
        );
    }

    #[test]
    fn recreated_key_outranks_every_version_ever_removed() {
        let mut store = store();
        let low = put(&mut store, b"low", b"x");
        let mut high = put(&mut store, b"high", b"x");
        for _ in 0..20 {
            high = put(&mut store, b"high", b"x");
        }
        assert!(high > low);
        // The safe version is master-wide: removing "high" raises the floor for every
        // key, so "low" re-created afterwards must not reuse a version "high" had.
        let mut removed = vec![delete(&mut store, b"high"), delete(&mut store, b"low")];
        let low_again = put(&mut store, b"low", b"y");
        assert!(
            removed.iter().all(|v| low_again > *v),
            "{low_again} vs {removed:?}"
        );
        // And a brand-new key too, and again after a remove in the same batch.
        let fresh = put(&mut store, b"fresh", b"z");
        assert!(removed.iter().all(|v| fresh > *v));
        let outcomes = apply_batch(
            &mut store,
            &[remove(b"fresh"), remove(b"low"), write(b"low", b"w")],
        );
        assert!(outcomes.iter().all(|o| o.status == Status::Ok));
        removed.extend(outcomes[..2].iter().map(|o| o.version));
        let last = outcomes[2].version;
        assert!(removed.iter().all(|v| last > *v), "{last} vs {removed:?}");
        assert!(removed.iter().all(|v| store.safe_version() > *v));
    }

    #[test]
    fn remove_of_a_missing_key_succeeds_and_appends_nothing() {
        let mut store = store();
        put(&mut store, b"other", b"x");
        let log_before = log_len(&store);
        let segments_before = store.log().segment_ids().count();
        let outcome = apply(&mut store, &remove(b"missing"));
        assert_eq!(
            outcome,
            OpOutcome {
                status: Status::Ok,
                version: Version(0),
                counter: None
            }
        );
        assert_eq!(log_len(&store), log_before);
        assert_eq!(store.log().segment_ids().count(), segments_before);
        assert_eq!(store.object_count(), 1);
    }

    #[test]
    fn increment_of_a_missing_key_counts_from_zero() {
        let mut store = store();
        let outcome = apply(&mut store, &increment(b"n", 7));
        assert_eq!(outcome.status, Status::Ok);
        assert_eq!(outcome.counter, Some(7));
        let read = store.read(TABLE, b"n");
        assert_eq!(read.version(), outcome.version);
        assert_eq!(&read.value()[..], &7i64.to_le_bytes());
    }

    #[test]
    fn increments_sum_including_negative_deltas() {
        let mut store = store();
        put(&mut store, b"n", &int(100));
        let mut expected = 100i64;
        let mut version = store.read(TABLE, b"n").version();
        for delta in [1, -250, 42, i64::from(i32::MAX), -7] {
            expected += delta;
            let reply = apply(&mut store, &increment(b"n", delta));
            assert_eq!(reply.status, Status::Ok);
            assert_eq!(reply.counter, Some(expected));
            assert_eq!(reply.version, version.next());
            version = reply.version;
            let read = store.read(TABLE, b"n");
            let stored = i64::from_le_bytes(read.value()[..].try_into().unwrap());
            assert_eq!((stored, read.version()), (expected, version));
        }
    }

    #[test]
    fn increment_of_a_non_integer_is_not_an_integer() {
        let mut store = store();
        for value in [&b""[..], b"seven", b"nine bytes"] {
            let version = put(&mut store, b"n", value);
            let log_before = log_len(&store);
            let reply = apply(&mut store, &increment(b"n", 1));
            assert_eq!(reply.status, Status::NotAnInteger, "value {value:?}");
            assert_eq!(reply.version, version, "reports the current version");
            let read = store.read(TABLE, b"n");
            assert_eq!((&read.value()[..], read.version()), (value, version));
            assert_eq!(log_len(&store), log_before);
        }
    }

    #[test]
    fn increment_overflow_is_invalid_argument_and_changes_nothing() {
        let mut store = store();
        for (start, delta) in [(i64::MAX, 1), (i64::MIN, -1), (1, i64::MAX)] {
            let version = put(&mut store, b"n", &int(start));
            let reply = apply(&mut store, &increment(b"n", delta));
            assert_eq!(reply.status, Status::InvalidArgument, "{start} + {delta}");
            assert_eq!(reply.version, version);
            let read = store.read(TABLE, b"n");
            assert_eq!(
                (&read.value()[..], read.version()),
                (&int(start)[..], version)
            );
        }
    }

    #[test]
    fn a_batch_tells_apart_keys_that_share_a_hash_or_a_key_in_two_tables() {
        let mut batch = Batch::new();
        let at = |offset: u32| Staged::Live {
            version: Version(offset.into()),
            at: LogRef {
                segment: SegmentId(1),
                offset,
            },
        };
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        // A collision of 64-bit key hashes, forced: the keys still decide.
        batch.insert(TableId(1), KeyHash(7), &a, at(1));
        batch.insert(TableId(1), KeyHash(7), &b, at(2));
        batch.insert(TableId(2), KeyHash(7), &a, Staged::Removed);
        assert_eq!(batch.get(TableId(1), KeyHash(7), &a), Some(at(1)));
        assert_eq!(batch.get(TableId(1), KeyHash(7), &b), Some(at(2)));
        assert_eq!(batch.get(TableId(2), KeyHash(7), &a), Some(Staged::Removed));
        assert_eq!(batch.get(TableId(2), KeyHash(7), &b), None);
        batch.insert(TableId(1), KeyHash(7), &a, at(3));
        assert_eq!(
            batch.get(TableId(1), KeyHash(7), &a),
            Some(at(3)),
            "replaced"
        );
        assert_eq!(batch.staged.len(), 3);
    }

    #[test]
    fn staged_effects_are_invisible_until_publish() {
        let mut store = store();
        let old = put(&mut store, b"k", b"old");
        put(&mut store, b"gone", b"still here");

        let mut batch = Batch::new();
        for op in [write(b"k", b"new"), write(b"fresh", b"f"), remove(b"gone")] {
            assert_eq!(store.stage(&mut batch, &op).status, Status::Ok);
        }
        let read = store.read(TABLE, b"k");
        assert_eq!((&read.value()[..], read.version()), (&b"old"[..], old));
        assert_eq!(
            store.read(TABLE, b"fresh").status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(&store.read(TABLE, b"gone").value()[..], b"still here");

        // Sealed (and, in the appender, replicated) is still not visible.
        store.seal();
        assert_eq!(&store.read(TABLE, b"k").value()[..], b"old");
        assert_eq!(
            store.read(TABLE, b"fresh").status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(store.object_count(), 2);

        store.publish(batch);
        let read = store.read(TABLE, b"k");
        assert_eq!(
            (&read.value()[..], read.version()),
            (&b"new"[..], old.next())
        );
        assert_eq!(&store.read(TABLE, b"fresh").value()[..], b"f");
        assert_eq!(
            store.read(TABLE, b"gone").status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(store.object_count(), 2);
    }

    #[test]
    fn ops_in_one_batch_see_each_others_effects() {
        let mut store = store();
        let outcomes = apply_batch(
            &mut store,
            &[
                write(b"n", &int(10)),
                increment(b"n", 5),
                // Create-only must see the staged object.
                write_if(b"n", b"no", RejectRules::create_only()),
                write(b"k", b"first"),
                remove(b"k"),
                // Must see the staged remove: the key is missing again.
                write_if(b"k", b"second", RejectRules::create_only()),
            ],
        );
        let statuses: Vec<Status> = outcomes.iter().map(|o| o.status).collect();
        assert_eq!(
            statuses,
            [
                Status::Ok,
                Status::Ok,
                Status::ObjectExists,
                Status::Ok,
                Status::Ok,
                Status::Ok
            ]
        );
        let written = outcomes[0].version;
        let incremented = outcomes[1];
        assert_eq!(incremented.counter, Some(15));
        assert_eq!(incremented.version, written.next());
        assert_eq!(outcomes[2].version, incremented.version);
        let first = outcomes[3].version;
        assert_eq!(outcomes[4].version, first);
        let second = outcomes[5].version;
        assert!(second > first);

        let n = store.read(TABLE, b"n");
        assert_eq!(
            (&n.value()[..], n.version()),
            (&int(15)[..], incremented.version)
        );
        let k = store.read(TABLE, b"k");
        assert_eq!((&k.value()[..], k.version()), (&b"second"[..], second));
        assert_eq!(store.object_count(), 2);
    }

    #[test]
    fn keys_of_unowned_tables_are_unknown_tablet() {
        let mut store = store();
        let other = TableId(2);
        assert_eq!(store.read(other, b"k").status(), Status::UnknownTablet);
        let ops = [
            WriteOp::Write {
                table: other,
                key: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"v"),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
            WriteOp::Remove {
                table: other,
                key: Bytes::from_static(b"k"),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
            WriteOp::Increment {
                table: other,
                key: Bytes::from_static(b"k"),
                delta: 1,
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
        ];
        let log_before = log_len(&store);
        for op in &ops {
            assert_eq!(
                apply(&mut store, op).status,
                Status::UnknownTablet,
                "{op:?}"
            );
        }
        assert_eq!(log_len(&store), log_before);
        assert_eq!(store.object_count(), 0);
    }

    #[test]
    fn drop_tablets_forgets_objects_and_refuses_ops() {
        let mut store = store();
        let other = TableId(2);
        store.take_tablets(&[tablet(other, 0, u64::MAX)]);
        for i in 0..50 {
            put(&mut store, format!("k{i}").as_bytes(), b"v");
        }
        let kept = WriteOp::Write {
            table: other,
            key: Bytes::from_static(b"kept"),
            value: Bytes::from_static(b"v"),
            rules: RejectRules::default(),
            rifl: rampart_common::rifl::Rifl::NONE,
        };
        assert_eq!(apply(&mut store, &kept).status, Status::Ok);
        assert_eq!(store.object_count(), 51);

        assert_eq!(store.drop_tablets(&[tablet(TABLE, 0, u64::MAX)]), 50);
        assert_eq!(store.object_count(), 1);
        assert_eq!(store.read(TABLE, b"k0").status(), Status::UnknownTablet);
        assert_eq!(
            apply(&mut store, &write(b"k0", b"v")).status,
            Status::UnknownTablet
        );
        assert_eq!(
            apply(&mut store, &remove(b"k0")).status,
            Status::UnknownTablet
        );
        assert_eq!(
            apply(&mut store, &increment(b"k0", 1)).status,
            Status::UnknownTablet
        );
        assert_eq!(store.read(other, b"kept").status(), Status::Ok);

        // Taking the tablet back does not bring the dropped objects back.
        store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
        assert_eq!(store.read(TABLE, b"k0").status(), Status::ObjectDoesntExist);
        assert_eq!(store.object_count(), 1);
    }

    #[test]
    fn retaking_owned_tablets_keeps_their_objects() {
        // The coordinator re-sends TakeTablets when it retries a table creation; the
        // repeat must be harmless.
        let split = u64::MAX / 2;
        let halves = [tablet(TABLE, 0, split), tablet(TABLE, split + 1, u64::MAX)];
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&halves);
        for i in 0..40 {
            put(&mut store, format!("key-{i}").as_bytes(), b"v");
        }
        store.take_tablets(&halves);
        assert_eq!(store.object_count(), 40);
        for i in 0..40 {
            assert_eq!(
                store.read(TABLE, format!("key-{i}").as_bytes()).status(),
                Status::Ok
            );
        }
        // Dropping is idempotent too.
        assert_eq!(store.drop_tablets(&halves), 40);
        assert_eq!(store.drop_tablets(&halves), 0);
        assert_eq!(store.object_count(), 0);
    }

    #[test]
    fn narrowing_a_tablet_forgets_objects_outside_it() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, u64::MAX)]);
        let inside = key_on_side(split, true, "in");
        let outside = key_on_side(split, false, "out");
        put(&mut store, &inside, b"kept");
        put(&mut store, &outside, b"forgotten");
        store.take_tablets(&[tablet(TABLE, 0, split)]);
        assert_eq!(store.object_count(), 1);
        assert_eq!(store.read(TABLE, &outside).status(), Status::UnknownTablet);
        // Were the upper half to come back, its old object must not reappear.
        store.take_tablets(&[tablet(TABLE, split + 1, u64::MAX)]);
        assert_eq!(
            store.read(TABLE, &outside).status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(&store.read(TABLE, &inside).value()[..], b"kept");
    }

    #[test]
    fn dropping_one_tablet_keeps_the_objects_of_its_neighbour() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, split), tablet(TABLE, split + 1, u64::MAX)]);
        let keys: Vec<String> = (0..100).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            put(&mut store, key.as_bytes(), b"v");
        }
        let low = keys
            .iter()
            .filter(|k| key_hash(k.as_bytes()).0 <= split)
            .count();
        assert_eq!(store.drop_tablets(&[tablet(TABLE, 0, split)]), low as u64);
        assert_eq!(store.object_count(), (keys.len() - low) as u64);
        for key in &keys {
            let expected = if key_hash(key.as_bytes()).0 <= split {
                Status::UnknownTablet
            } else {
                Status::Ok
            };
            assert_eq!(
                store.read(TABLE, key.as_bytes()).status(),
                expected,
                "{key}"
            );
        }
    }

    #[test]
    fn a_sub_range_tablet_serves_only_its_range() {
        let split = u64::MAX / 2;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, split)]);
        let inside = key_on_side(split, true, "in");
        let outside = key_on_side(split, false, "out");
        assert_eq!(apply(&mut store, &write(&inside, b"v")).status, Status::Ok);
        assert_eq!(store.read(TABLE, &inside).status(), Status::Ok);
        assert_eq!(
            apply(&mut store, &write(&outside, b"v")).status,
            Status::UnknownTablet
        );
        assert_eq!(store.read(TABLE, &outside).status(), Status::UnknownTablet);
        // The boundary hashes themselves.
        let mut edges = ObjectStore::new(ServerId(1), config());
        let hash = key_hash(&inside).0;
        edges.take_tablets(&[tablet(TABLE, hash, hash)]);
        assert_eq!(apply(&mut edges, &write(&inside, b"v")).status, Status::Ok);
        assert_eq!(
            apply(&mut edges, &write(&outside, b"v")).status,
            Status::UnknownTablet
        );
    }

    #[test]
    fn key_one_byte_over_the_limit_is_key_too_large() {
        let mut store = store();
        let key = vec![b'k'; KEY_BYTES_MAX + 1];
        let log_before = log_len(&store);
        for op in [write(&key, b"v"), remove(&key), increment(&key, 1)] {
            let outcome = apply(&mut store, &op);
            assert_eq!(outcome.status, Status::KeyTooLarge);
        }
        assert_eq!(store.read(TABLE, &key).status(), Status::KeyTooLarge);
        assert_eq!(log_len(&store), log_before);
    }

    #[test]
    fn value_over_the_limit_is_value_too_large() {
        let mut store = store();
        let limit = config().value_bytes_max;
        let log_before = log_len(&store);
        let outcome = apply(&mut store, &write(b"k", &vec![1u8; limit + 1]));
        assert_eq!(outcome.status, Status::ValueTooLarge);
        assert_eq!(store.read(TABLE, b"k").status(), Status::ObjectDoesntExist);
        assert_eq!(log_len(&store), log_before);
    }

    #[test]
    fn key_and_value_exactly_at_their_limits_are_accepted() {
        let mut store = store();
        let value = vec![7u8; config().value_bytes_max];
        // Several, so that at least one lands in a freshly rolled-over segment.
        let keys: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; KEY_BYTES_MAX]).collect();
        for key in &keys {
            let outcome = apply(&mut store, &write(key, &value));
            assert_eq!(outcome.status, Status::Ok);
        }
        assert!(
            store.log().head() > SegmentId(1),
            "the big objects rolled over"
        );
        for key in &keys {
            let read = store.read(TABLE, key);
            assert_eq!(read.status(), Status::Ok);
            assert_eq!(read.value(), value);
        }
    }

    #[test]
    fn full_log_returns_no_space_and_keeps_acknowledged_values() {
        let mut store = store();
        let value = |i: u32| vec![(i % 251) as u8; 1000];
        let mut acknowledged = Vec::new();
        let mut failed = None;
        for i in 0..100_000u32 {
            let key = format!("key-{i}");
            let outcome = apply(&mut store, &write(key.as_bytes(), &value(i)));
            match outcome.status {
                Status::Ok => acknowledged.push((key, i, outcome.version)),
                Status::NoSpace => {
                    failed = Some(key);
                    break;
                }
                other => panic!("write {i}: unexpected {other}"),
            }
        }
        let failed = failed.expect("a bounded log fills up");
        assert!(
            acknowledged.len() > 500,
            "only {} writes fit",
            acknowledged.len()
        );
        // Full: the segments held, the cleaner's reserve (which writes never take) and
        // the index fill the memory, within a segment.
        let (used, max) = store.log_bytes();
        let segment = u64::from(config().segment_bytes);
        let index = store.object_count() * crate::object_index::INDEX_BYTES_PER_OBJECT;
        let reserve = CLEANER_RESERVE_SEGMENTS * segment;
        assert!(
            used + reserve + index <= max,
            "{used} + {reserve} + {index}"
        );
        assert!(
            used + reserve + index + segment > max,
            "{used} + {reserve} + {index}"
        );

        for attempt in 0..10 {
            let key = format!("more-{attempt}");
            assert_eq!(
                apply(&mut store, &write(key.as_bytes(), &value(0))).status,
                Status::NoSpace
            );
        }
        // An overwrite of an acknowledged key is refused too and leaves it intact.
        let (first_key, _, _) = &acknowledged[0];
        assert_eq!(
            apply(&mut store, &write(first_key.as_bytes(), &value(1))).status,
            Status::NoSpace
        );
        assert_eq!(
            store.read(TABLE, failed.as_bytes()).status(),
            Status::ObjectDoesntExist
        );
        for (key, i, version) in &acknowledged {
            let read = store.read(TABLE, key.as_bytes());
            assert_eq!(read.status(), Status::Ok, "{key}");
            assert_eq!(read.version(), *version, "{key}");
            assert_eq!(read.value(), value(*i), "{key}");
        }
        assert_eq!(store.object_count(), acknowledged.len() as u64);
    }

    #[test]
    fn enumerate_returns_objects_in_key_hash_order() {
        let mut store = store();
        for i in 0..200 {
            put(
                &mut store,
                format!("key-{i}").as_bytes(),
                format!("value-{i}").as_bytes(),
            );
        }
        let page = store.enumerate(TABLE, 0..=u64::MAX, u32::MAX).unwrap();
        assert_eq!(page.next_hash, None);
        assert_eq!(page.objects.len(), 200);
        let hashes: Vec<u64> = page
            .objects
            .iter()
            .map(|(key, _)| key_hash(key).0)
            .collect();
        assert!(hashes.windows(2).all(|w| w[0] < w[1]), "hash order");
        for (key, object) in &page.objects {
            let read = store.read(TABLE, key);
            assert_eq!(read.as_ref(), Ok(object));
        }
    }

    #[test]
    fn enumerate_pages_respect_max_bytes_and_cover_every_object_once() {
        let mut store = store();
        let mut expected = HashSet::new();
        for i in 0..300 {
            let key = format!("key-{i}");
            put(&mut store, key.as_bytes(), &vec![b'v'; i % 50]);
            expected.insert(key.into_bytes());
        }
        for max_bytes in [0, 1, 100, 500, 4096, u32::MAX] {
            let all = enumerate_all(&store, u64::MAX, max_bytes);
            let keys: Vec<Vec<u8>> = all.iter().map(|(key, _)| key.to_vec()).collect();
            let unique: HashSet<Vec<u8>> = keys.iter().cloned().collect();
            assert_eq!(
                keys.len(),
                unique.len(),
                "max_bytes {max_bytes}: duplicates"
            );
            assert_eq!(unique, expected, "max_bytes {max_bytes}");
            let hashes: Vec<u64> = all.iter().map(|(key, _)| key_hash(key).0).collect();
            assert!(hashes.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn enumerate_past_the_owned_range_resumes_after_its_end() {
        let split = u64::MAX / 3;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, split)]);
        let mut owned = 0;
        for i in 0..100 {
            let key = format!("key-{i}");
            let status = apply(&mut store, &write(key.as_bytes(), b"v")).status;
            if key_hash(key.as_bytes()).0 <= split {
                assert_eq!(status, Status::Ok);
                owned += 1;
            } else {
                assert_eq!(status, Status::UnknownTablet);
            }
        }
        assert!(owned > 0);
        let page = store.enumerate(TABLE, 0..=u64::MAX, u32::MAX).unwrap();
        assert_eq!(page.objects.len(), owned);
        assert_eq!(page.next_hash, Some(split + 1));
        // A request that stays inside the owned range ends there.
        let inside = store.enumerate(TABLE, 0..=split, u32::MAX).unwrap();
        assert_eq!(inside.next_hash, None);
        assert_eq!(inside.objects.len(), owned);
    }

    #[test]
    fn enumerate_from_outside_the_owned_range_is_unknown_tablet() {
        let split = u64::MAX / 3;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 100, split)]);
        let request =
            |table: TableId, resume_hash: u64| store.enumerate(table, resume_hash..=u64::MAX, 1024);
        for resume in [0, 99, split + 1, u64::MAX] {
            assert_eq!(request(TABLE, resume), Err(Status::UnknownTablet));
        }
        assert_eq!(request(TableId(9), 100), Err(Status::UnknownTablet));
        assert!(request(TABLE, 100).is_ok());
        assert!(request(TABLE, split).is_ok());
        assert_eq!(
            store.enumerate(TABLE, RangeInclusive::new(200, 150), 1024),
            Err(Status::InvalidArgument)
        );
    }

    #[test]
    fn rolled_over_segments_scan_whole_and_chain_by_footers() {
        let mut store = store();
        let mut live = Vec::new();
        for batch in 0..60u32 {
            let ops: Vec<WriteOp> = (0..10u32)
                .map(|i| {
                    let n = batch * 10 + i;
                    let key = format!("key-{}", n % 450);
                    match n % 7 {
                        6 => remove(key.as_bytes()),
                        _ => write(
                            key.as_bytes(),
                            &vec![(n % 256) as u8; 100 + (n as usize * 37) % 900],
                        ),
                    }
                })
                .collect();
            let outcomes = apply_batch(&mut store, &ops);
            assert!(outcomes.iter().all(|o| o.status == Status::Ok));
            live.extend(ops);
        }
        let log = store.log();
        let ids: Vec<SegmentId> = log.segment_ids().collect();
        assert!(ids.len() >= 3, "only {} segments", ids.len());
        assert_eq!(ids.last(), Some(&log.head()));
        for id in &ids {
            let bytes = log.segment_bytes(*id).unwrap();
            let result = scan(bytes);
            assert_eq!(result.valid_bytes as usize, bytes.len(), "{id}: all sealed");
            assert_eq!(result.stop, StopReason::EndOfData, "{id}");
            let header = result.header.unwrap();
            assert_eq!((header.log_id, header.segment_id), (ServerId(1), *id));
            assert_eq!(header.capacity, config().segment_bytes);
            // No cleaner yet: segment n's digest lists 1..=n.
            let digest: Vec<SegmentId> = (1..=id.0).map(SegmentId).collect();
            assert_eq!(result.digest.as_ref(), Some(&digest), "{id}");
            if *id == log.head() {
                assert!(!result.closed);
                assert_eq!(result.successor, None);
                assert_eq!(result.digest, Some(ids.clone()), "head digest lists all");
            } else {
                assert!(result.closed, "{id}");
                assert_eq!(result.successor, Some(SegmentId(id.0 + 1)), "{id}");
            }
        }
        // The latest op per key decides what reads return.
        let mut model = HashMap::new();
        for op in &live {
            match op {
                WriteOp::Write { key, value, .. } => model.insert(key.clone(), Some(value.clone())),
                WriteOp::Remove { key, .. } => model.insert(key.clone(), None),
                WriteOp::Increment { .. } => unreachable!(),
            };
        }
        for (key, value) in &model {
            let read = store.read(TABLE, key);
            match value {
                Some(value) => assert_eq!(&read.value(), value),
                None => assert_eq!(read.status(), Status::ObjectDoesntExist),
            }
        }
    }

    // ---- Recovery replay ----

    /// Where replays go in these tests: a table the recovering store does not own.
    const RECOVERED: TableId = TableId(7);

    fn whole(table: TableId) -> Tablet {
        tablet(table, 0, u64::MAX)
    }

    fn partition() -> Vec<HashRange> {
        vec![HashRange::whole(RECOVERED)]
    }

    fn obj(key: &str, version: u64, value: &str) -> PieceEntry {
        PieceEntry::Object {
            table: RECOVERED,
            hash: key_hash(key.as_bytes()),
            version: Version(version),
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    fn tomb(key: &str, version: u64) -> PieceEntry {
        PieceEntry::Tombstone {
            table: RECOVERED,
            hash: key_hash(key.as_bytes()),
            version: Version(version),
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
    }

    fn piece(entries: Vec<PieceEntry>) -> RecoveryPiece {
        RecoveryPiece::from_entries(SegmentId(1), Version(0), entries)
    }

    /// Replays `pieces` one batch each: stage, seal, publish.
    fn replay(store: &mut ObjectStore, state: &mut ReplayState, pieces: &[RecoveryPiece]) {
        for piece in pieces {
            let mut batch = Batch::new();
            store.stage_replay(&mut batch, state, piece).unwrap();
            store.seal();
            store.publish_recovered(batch);
        }
    }

    /// A recovery master: owns all of `TABLE`, nothing of `RECOVERED`.
    fn recovery_master() -> ObjectStore {
        store()
    }

    /// What reads of `keys` in `RECOVERED` return: (status, version, value).
    fn reads(store: &ObjectStore, keys: &[&str]) -> Vec<(Status, Version, Vec<u8>)> {
        keys.iter()
            .map(|key| {
                let read = store.read(RECOVERED, key.as_bytes());
                (read.status(), read.version(), read.value().to_vec())
            })
            .collect()
    }

    /// Every object and tombstone in the store's log, in log order, as a crash of this
    /// store would hand them to its own recovery.
    fn log_entries(store: &ObjectStore) -> Vec<PieceEntry> {
        let log = store.log();
        let mut entries = Vec::new();
        for id in log.segment_ids() {
            let bytes = log.segment_bytes(id).unwrap();
            let mut offset = 0;
            while let Some((entry, next)) =
                rampart_common::log::decode_entry(bytes, offset).unwrap()
            {
                match entry {
                    rampart_common::log::Entry::Object(o) => entries.push(PieceEntry::Object {
                        table: o.table,
                        hash: key_hash(o.key),
                        version: o.version,
                        key: Bytes::copy_from_slice(o.key),
                        value: Bytes::copy_from_slice(o.value),
                    }),
                    rampart_common::log::Entry::Tombstone(t) => {
                        entries.push(PieceEntry::Tombstone {
                            table: t.table,
                            hash: key_hash(t.key),
                            version: t.version,
                            key: Bytes::copy_from_slice(t.key),
                        })
                    }
                    _ => {}
                }
                offset = next;
            }
        }
        entries
    }

    #[test]
    fn replayed_objects_are_invisible_until_their_tablet_is_taken() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[piece(vec![obj("a", 3, "x"), obj("b", 4, "y")])],
        );
        assert_eq!(store.read(RECOVERED, b"a").status(), Status::UnknownTablet);
        assert_eq!(store.object_count(), 2, "indexed, not served");
        assert_eq!(state.counts().objects_live, 2);
        store.take_tablets(&[whole(RECOVERED)]);
        assert_eq!(
            reads(&store, &["a", "b"]),
            vec![
                (Status::Ok, Version(3), b"x".to_vec()),
                (Status::Ok, Version(4), b"y".to_vec())
            ]
        );
    }

    #[test]
    fn highest_version_wins_in_either_order() {
        for order in [[0, 1], [1, 0]] {
            let pieces = [
                piece(vec![obj("k", 5, "old")]),
                piece(vec![obj("k", 9, "new")]),
            ];
            let mut store = recovery_master();
            let mut state = ReplayState::new();
            replay(
                &mut store,
                &mut state,
                &[pieces[order[0]].clone(), pieces[order[1]].clone()],
            );
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                reads(&store, &["k"]),
                vec![(Status::Ok, Version(9), b"new".to_vec())],
                "{order:?}"
            );
            assert_eq!(state.counts().objects_live, 1);
        }
    }

    #[test]
    fn tombstone_before_or_after_its_object_deletes_it() {
        for tombstone_first in [false, true] {
            let object = piece(vec![obj("k", 5, "v"), obj("other", 2, "o")]);
            let tombstone = piece(vec![tomb("k", 5)]);
            let pieces = if tombstone_first {
                [tombstone, object]
            } else {
                [object, tombstone]
            };
            let mut store = recovery_master();
            let mut state = ReplayState::new();
            replay(&mut store, &mut state, &pieces);
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                store.read(RECOVERED, b"k").status(),
                Status::ObjectDoesntExist,
                "tombstone first: {tombstone_first}"
            );
            assert_eq!(store.read(RECOVERED, b"other").status(), Status::Ok);
            assert_eq!(state.counts().objects_live, 1);
            assert_eq!(state.counts().tombstones_appended, 1, "kept in the log");
        }
    }

    #[test]
    fn a_tombstone_deletes_older_versions_arriving_later() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[
                piece(vec![tomb("k", 5)]),
                piece(vec![obj("k", 3, "older"), obj("k", 5, "same")]),
            ],
        );
        store.take_tablets(&[whole(RECOVERED)]);
        assert_eq!(
            store.read(RECOVERED, b"k").status(),
            Status::ObjectDoesntExist
        );
        assert_eq!(state.counts().objects_dropped, 2);
        assert_eq!(state.counts().objects_appended, 0);
    }

    #[test]
    fn an_object_newer_than_a_tombstone_survives_it() {
        for tombstone_first in [false, true] {
            let object = piece(vec![obj("k", 8, "recreated")]);
            let tombstone = piece(vec![tomb("k", 5), obj("k", 5, "deleted")]);
            let pieces = if tombstone_first {
                [tombstone, object]
            } else {
                [object, tombstone]
            };
            let mut store = recovery_master();
            let mut state = ReplayState::new();
            replay(&mut store, &mut state, &pieces);
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                reads(&store, &["k"]),
                vec![(Status::Ok, Version(8), b"recreated".to_vec())],
                "tombstone first: {tombstone_first}"
            );
        }
    }

    #[test]
    fn a_replay_that_may_lose_data_shifts_every_version_above_the_floor_in_order() {
        // The same pieces replayed with a floor of 1000 give the same survivors, each at
        // its version + 1000; the next versions this master hands out are above them.
        let pieces = [
            piece(vec![obj("k", 5, "old"), obj("gone", 3, "x")]),
            piece(vec![obj("k", 9, "new"), tomb("gone", 3)]),
            RecoveryPiece::from_entries(SegmentId(4), Version(20), vec![obj("j", 2, "j")]),
        ];
        for order in [[0, 1, 2], [2, 1, 0]] {
            let mut store = recovery_master();
            let mut state = ReplayState::with_version_floor(1000);
            let ordered: Vec<RecoveryPiece> = order.iter().map(|&i| pieces[i].clone()).collect();
            replay(&mut store, &mut state, &ordered);
            store.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(
                reads(&store, &["k", "gone", "j"]),
                vec![
                    (Status::Ok, Version(1009), b"new".to_vec()),
                    (Status::ObjectDoesntExist, Version(0), Vec::new()),
                    (Status::Ok, Version(1002), b"j".to_vec()),
                ],
                "{order:?}"
            );
            assert_eq!(store.safe_version(), Version(1020), "the shifted floor");
        }
    }

    #[test]
    fn writes_stay_below_the_version_ceiling_and_ask_for_more_ahead() {
        let mut store = store();
        store.enforce_version_ceiling();
        // Nothing reserved yet: a write is answered Retry and changes nothing.
        let refused = apply(&mut store, &write(b"k", b"v"));
        assert_eq!(refused.status, Status::Retry);
        assert_eq!(store.read(TABLE, b"k").status(), Status::ObjectDoesntExist);
        let wanted = store.ceiling_wanted().expect("a reservation is due");
        assert_eq!(wanted, Version(Version::FIRST.0 + VERSION_RESERVATION));
        store.raise_version_ceiling(Version(3));
        assert_eq!(put(&mut store, b"k", b"v1"), Version(1));
        assert_eq!(put(&mut store, b"k", b"v2"), Version(2));
        // Version 3 is not below the ceiling.
        assert_eq!(apply(&mut store, &write(b"k", b"v3")).status, Status::Retry);
        store.raise_version_ceiling(wanted);
        assert_eq!(store.ceiling_wanted(), None, "far from the ceiling");
        assert_eq!(put(&mut store, b"k", b"v3"), Version(3));
        // A lower ceiling (a stale report) changes nothing.
        store.raise_version_ceiling(Version(2));
        assert_eq!(store.version_ceiling(), wanted);
    }

    #[test]
    fn replay_raises_the_safe_version_above_every_version_and_floor() {
        let mut store = recovery_master();
        put(&mut store, b"local", b"v");
        let mut state = ReplayState::new();
        let floored =
            RecoveryPiece::from_entries(SegmentId(3), Version(40), vec![obj("a", 7, "x")]);
        replay(&mut store, &mut state, &[floored]);
        assert_eq!(store.safe_version(), Version(40));
        replay(&mut store, &mut state, &[piece(vec![tomb("b", 55)])]);
        assert_eq!(store.safe_version(), Version(56));
        // The floor is in the log itself: a crash of this master keeps it.
        let floors: Vec<Version> = store
            .log()
            .segment_ids()
            .flat_map(|id| {
                let bytes = store.log().segment_bytes(id).unwrap().to_vec();
                let mut found = Vec::new();
                let mut offset = 0;
                while let Some((entry, next)) =
                    rampart_common::log::decode_entry(&bytes, offset).unwrap()
                {
                    if let rampart_common::log::Entry::SafeVersion(v) = entry {
                        found.push(v);
                    }
                    offset = next;
                }
                found
            })
            .collect();
        assert_eq!(floors.iter().max(), Some(&Version(56)));
        // A deleted key re-created here outranks every version it had.
        store.take_tablets(&[whole(RECOVERED)]);
        let outcome = apply(
            &mut store,
            &WriteOp::Write {
                table: RECOVERED,
                key: Bytes::from_static(b"b"),
                value: Bytes::from_static(b"new"),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            },
        );
        assert_eq!(outcome.status, Status::Ok);
        assert!(outcome.version > Version(55));
    }

    #[test]
    fn forget_unowned_drops_replayed_objects_but_not_owned_ones() {
        let mut store = recovery_master();
        put(&mut store, b"mine", b"v");
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[piece(vec![obj("a", 3, "x"), obj("b", 3, "y")])],
        );
        assert_eq!(store.object_count(), 3);
        let mut ranges = partition();
        ranges.insert(0, HashRange::whole(TABLE));
        assert_eq!(store.forget_unowned(&ranges), 2);
        assert_eq!(store.object_count(), 1);
        assert_eq!(store.read(TABLE, b"mine").status(), Status::Ok);
        store.take_tablets(&[whole(RECOVERED)]);
        assert_eq!(
            store.read(RECOVERED, b"a").status(),
            Status::ObjectDoesntExist
        );
        assert!(store.owns_any(&partition()));
    }

    /// Runs the cleaner until no tainted segment is left, as the appender's forget job
    /// does (a pass, its steps, commits and frees).
    fn clean_tainted(store: &mut ObjectStore) {
        for _ in 0..1000 {
            store.close_tainted_head().unwrap();
            if store.tainted_held() == 0 {
                return;
            }
            let mut pass = store.plan_cleaning(8).expect("tainted segments to clean");
            while !pass.is_done() {
                let end = store.clean_step(&mut pass, usize::MAX);
                store.seal();
                if end != crate::cleaner::StepEnd::Budget {
                    store.commit_cleaning(&mut pass).unwrap();
                    store.seal();
                    store.free_cleaned();
                }
            }
        }
        panic!("tainted segments never left the log");
    }

    #[test]
    fn objects_forgotten_after_an_abandoned_replay_never_come_back() {
        // An attempt replays k into this master and is abandoned. Meanwhile the
        // partition's real owner removes k, and its cleaner drops the tombstone. Later
        // this master recovers that owner's range (without k, and with `kept` at the
        // very version the attempt replayed) and takes it, then crashes: its own log
        // must not give k back, and must keep `kept`.
        let mut store = recovery_master();
        put(&mut store, b"mine", b"v");
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[piece(vec![obj("k", 5, "old"), obj("kept", 5, "x")])],
        );
        assert_eq!(store.forget_unowned(&partition()), 2);
        assert!(store.tainted_held() > 0);
        clean_tainted(&mut store);
        let mut state = ReplayState::new();
        replay(&mut store, &mut state, &[piece(vec![obj("kept", 5, "x")])]);
        store.take_tablets(&[whole(RECOVERED)]);
        let want = vec![
            (Status::ObjectDoesntExist, Version(0), vec![]),
            (Status::Ok, Version(5), b"x".to_vec()),
        ];
        assert_eq!(reads(&store, &["k", "kept"]), want);
        assert_eq!(
            store.read(TABLE, b"mine").status(),
            Status::Ok,
            "moved, kept"
        );
        let mut own = log_entries(&store);
        own.retain(|e| e.table_and_hash().0 == RECOVERED);
        for reversed in [false, true] {
            if reversed {
                own.reverse();
            }
            let mut again = recovery_master();
            let mut state = ReplayState::new();
            replay(&mut again, &mut state, &[piece(own.clone())]);
            again.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(reads(&again, &["k", "kept"]), want, "reversed: {reversed}");
        }
    }

    #[test]
    fn a_replay_is_refused_while_a_failed_attempts_segments_are_in_the_log() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        replay(&mut store, &mut state, &[piece(vec![obj("k", 5, "old")])]);
        store.forget_unowned(&partition());
        let mut batch = Batch::new();
        let mut state = ReplayState::new();
        let next = piece(vec![obj("other", 6, "y")]);
        assert_eq!(
            store.stage_replay(&mut batch, &mut state, &next),
            Err(NoSpace),
            "a replay beside a failed attempt's leftovers must not go on"
        );
        clean_tainted(&mut store);
        assert_eq!(store.stage_replay(&mut batch, &mut state, &next), Ok(()));
    }

    #[test]
    fn the_will_covers_every_tablet_and_counts_what_was_written() {
        let mut store = ObjectStore::with_partition_limits(
            ServerId(1),
            config(),
            PartitionLimits {
                bytes_max: 4096,
                records_max: 1_000,
            },
        );
        let split = u64::MAX / 2;
        store.take_tablets(&[tablet(TABLE, 0, split), tablet(TABLE, split + 1, u64::MAX)]);
        let mut bytes = 0;
        for i in 0..100 {
            let key = format!("key-{i}");
            put(&mut store, key.as_bytes(), &[1u8; 100]);
            bytes += object_entry_bytes(key.len(), 100) as u64;
        }
        delete(&mut store, b"key-0");
        bytes += tombstone_entry_bytes(b"key-0".len()) as u64;
        let will = store.will();
        assert_eq!(will.coverage(), vec![HashRange::whole(TABLE)]);
        assert!(
            will.partitions.len() >= 2,
            "{} bytes in 4 KiB partitions",
            bytes
        );
        let records: u64 = will.partitions.iter().map(|p| p.records).sum();
        let total: u64 = will.partitions.iter().map(|p| p.bytes).sum();
        assert!(
            records >= 101 && total >= bytes,
            "{records} records, {total} bytes"
        );
        // Dropping a tablet drops it from the will.
        store.drop_tablets(&[tablet(TABLE, split + 1, u64::MAX)]);
        assert_eq!(
            store.will().coverage(),
            vec![HashRange::new(TABLE, 0, split)]
        );
    }

    #[test]
    fn taking_a_recovered_tablet_counts_its_replayed_entries_in_the_will() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        let entries: Vec<PieceEntry> = (0..50)
            .map(|i| obj(&format!("key-{i}"), 10 + i, "value"))
            .chain([tomb("gone", 3)])
            .collect();
        let bytes: u64 = entries.iter().map(|e| e.entry_bytes() as u64).sum();
        replay(&mut store, &mut state, &[piece(entries)]);
        assert_eq!(store.will().coverage(), vec![HashRange::whole(TABLE)]);
        store.take_tablets(&[whole(RECOVERED)]);
        let will = store.will();
        let recovered: Vec<_> = will
            .partitions
            .iter()
            .filter(|p| p.tablets.iter().any(|r| r.table == RECOVERED))
            .collect();
        assert_eq!(recovered.len(), 1);
        assert_eq!((recovered[0].records, recovered[0].bytes), (51, bytes));
    }

    /// One key's history on a crashed master: its log entries in log order.
    fn arb_history() -> impl Strategy<Value = Vec<(bool, u64, u8)>> {
        // (is_write, version step, value): a write creates or overwrites, a delete writes
        // a tombstone of the live version.
        proptest::collection::vec((any::<bool>(), 1u64..3, any::<u8>()), 1..8)
    }

    /// The crashed master's entries for keys k0.. and, per key, what must survive.
    fn crashed_log(
        histories: &[Vec<(bool, u64, u8)>],
    ) -> (Vec<PieceEntry>, Vec<Option<(u64, u8)>>) {
        let mut entries = Vec::new();
        let mut expected = Vec::new();
        for (k, history) in histories.iter().enumerate() {
            let key = format!("k{k}");
            let mut version = 0;
            let mut live: Option<(u64, u8)> = None;
            for &(write, step, value) in history {
                if write || live.is_none() {
                    version += step;
                    entries.push(obj(&key, version, &value.to_string()));
                    live = Some((version, value));
                } else if let Some((v, _)) = live.take() {
                    entries.push(tomb(&key, v));
                }
            }
            expected.push(live);
        }
        (entries, expected)
    }

    fn check_recovered(
        store: &ObjectStore,
        expected: &[Option<(u64, u8)>],
    ) -> Result<(), TestCaseError> {
        for (k, want) in expected.iter().enumerate() {
            let read = store.read(RECOVERED, format!("k{k}").as_bytes());
            match want {
                Some((version, value)) => {
                    prop_assert_eq!(read.status(), Status::Ok, "k{}", k);
                    prop_assert_eq!(read.version(), Version(*version));
                    let value = value.to_string();
                    prop_assert_eq!(&read.value()[..], value.as_bytes());
                }
                None => prop_assert_eq!(read.status(), Status::ObjectDoesntExist, "k{}", k),
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn replay_result_does_not_depend_on_piece_order_and_survives_a_second_crash(
            histories in proptest::collection::vec(arb_history(), 1..6),
            duplicates in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
            order in any::<u64>(),
            abandoned_prefix in 0usize..3,
        ) {
            let (mut entries, expected) = crashed_log(&histories);
            // The cleaner may leave two copies of one object version in a log.
            for d in &duplicates {
                let copy = entries[d.index(entries.len())].clone();
                entries.push(copy);
            }
            // Cut the log into pieces, then shuffle the pieces (and entries across them)
            // with a seeded permutation.
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(order);
            rand::seq::SliceRandom::shuffle(&mut entries[..], &mut rng);
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(entries.len() + 1)).collect();
            bounds.push(0);
            bounds.push(entries.len());
            bounds.sort_unstable();
            let pieces: Vec<RecoveryPiece> = bounds
                .windows(2)
                .map(|w| piece(entries[w[0]..w[1]].to_vec()))
                .collect();

            let mut store = recovery_master();
            // An earlier attempt replayed a prefix, failed, and was forgotten: its
            // entries stay in this master's log as orphans.
            if abandoned_prefix > 0 {
                let mut state = ReplayState::new();
                replay(&mut store, &mut state, &pieces[..abandoned_prefix.min(pieces.len())]);
                store.forget_unowned(&partition());
                clean_tainted(&mut store);
            }
            // The retry gets the pieces in another order (other backups, other timing).
            let mut retry = pieces.clone();
            rand::seq::SliceRandom::shuffle(&mut retry[..], &mut rng);
            let mut state = ReplayState::new();
            replay(&mut store, &mut state, &retry);
            let live = expected.iter().filter(|e| e.is_some()).count() as u64;
            prop_assert_eq!(state.counts().objects_live, live);
            store.take_tablets(&[whole(RECOVERED)]);
            check_recovered(&store, &expected)?;

            // This master crashes in turn: its whole log, orphans included, replayed
            // backwards into another gives the same objects.
            let mut again = recovery_master();
            let mut own = log_entries(&store);
            own.retain(|e| e.table_and_hash().0 == RECOVERED);
            own.reverse();
            let mut state = ReplayState::new();
            replay(&mut again, &mut state, &[piece(own)]);
            again.take_tablets(&[whole(RECOVERED)]);
            check_recovered(&again, &expected)?;
        }
    }

    proptest::proptest! {
        #[test]
        fn store_matches_a_model_under_random_batches(
            batches in proptest::collection::vec(proptest::collection::vec(arb_op(), 1..8), 1..25)
        ) {
            let mut store = store();
            let mut model = Model { safe_version: Version::FIRST.0, ..Model::default() };
            for ops in &batches {
                let outcomes = apply_batch(&mut store, ops);
                for (op, outcome) in ops.iter().zip(&outcomes) {
                    let removed_before = model.removed_max;
                    let (table, key) = op.table_and_key();
                    prop_assert_eq!(table, TABLE);
                    let created = !model.objects.contains_key(&key[..]);
                    let (status, version, value) = model.apply(op);
                    prop_assert_eq!(outcome.status, status, "{:?}", op);
                    let reply = outcome;
                    prop_assert_eq!(reply.version, version, "{:?}", op);
                    if let Some(value) = value {
                        prop_assert_eq!(reply.counter, Some(value));
                    }
                    // The property the floor exists for: a created object outranks
                    // every version ever removed, of any key.
                    if created && status == Status::Ok && !matches!(op, WriteOp::Remove { .. }) {
                        prop_assert!(Some(version) > removed_before);
                    }
                }
                prop_assert_eq!(store.safe_version().0, model.safe_version);
                prop_assert_eq!(store.object_count(), model.objects.len() as u64);
                for k in 0u8..6 {
                    let key = [b'k', k];
                    let read = store.read(TABLE, &key);
                    match model.objects.get(&key[..]) {
                        Some((version, value)) => {
                            prop_assert_eq!(read.status(), Status::Ok);
                            prop_assert_eq!(read.version(), *version);
                            prop_assert_eq!(&read.value()[..], &value[..]);
                        }
                        None => prop_assert_eq!(read.status(), Status::ObjectDoesntExist),
                    }
                }
            }
        }
    }
}
