//! `RaftStorage`: the coordinator's durable Raft log, behind [`raft::Storage`]
//! (docs/design.md §7, issue 4).
//!
//! One Raft group ([`RAFT_GROUP_ID`]) kept in a `raft-engine` directory: the log entries,
//! the hard state (term, vote, commit), the conf state (voters) and the latest state-machine
//! snapshot. The ready loop writes through [`RaftStorage::append`],
//! [`RaftStorage::set_hard_state`] (or both at once with
//! [`RaftStorage::append_and_set_hard_state`]), [`RaftStorage::apply_snapshot`] and
//! [`RaftStorage::compact`]; `raft-rs` reads through the [`raft::Storage`] impl. What it
//! hides: the `raft-engine` keys and commands, the mapping from a snapshot to the log's first
//! index, and the purging of old log files.
//!
//! # Layout in the engine
//!
//! * entries — `raft-engine` log entries of group [`RAFT_GROUP_ID`], encoded as
//!   `eraftpb::Entry` (raft-engine's `MessageExt` for raft-rs types);
//! * `hard_state`, `conf_state` — `eraftpb::HardState` / `eraftpb::ConfState` values;
//! * `snapshot` — the latest `eraftpb::Snapshot`, data and metadata. The log holds exactly
//!   the entries after it: `first_index() == snapshot.index + 1` always (index 0 and term 0
//!   when no snapshot was taken yet, so an empty store starts at index 1 as raft expects).
//!
//! A snapshot and the compaction it allows travel in one `LogBatch`, so a crash leaves
//! either both or neither (a batch is one checksummed record; a torn tail is dropped on
//! recovery, and it was never acknowledged).
//!
//! # Guarantees
//!
//! Every write method returns only after its batch is written and `fdatasync`ed: once
//! `append` returns, raft may send the entries' acknowledgement; once `set_hard_state`
//! returns, the vote is binding across a crash. [`RaftStorage::open`] recovers exactly the
//! acknowledged writes, so after a restart [`raft::Storage::initial_state`] returns the last
//! hard state and conf state written.
//!
//! # Concurrency
//!
//! `RaftStorage` is `Send + Sync`: share it (`Arc`) between the ready loop and readers.
//! Writes are serialized by the `durable` lock and block on `fsync`: call them from a
//! dedicated thread or `spawn_blocking`, never on the reactor (a write costs one
//! `fdatasync`, about 0.1–10 ms depending on the disk).
//!
//! # Failure handling
//!
//! An error from a write leaves the on-disk state unknown (the write may or may not have
//! reached the disk, and after a failed `fsync` the page cache cannot be trusted). The
//! caller must stop the Raft node and restart it from [`RaftStorage::open`], never retry
//! the write. Misuse that raft-rs never produces — a hole in the log, overwriting compacted
//! or committed entries, compacting past the commit index — is a programmer error and
//! panics, like raft-rs's own `MemStorage`.
//!
//! # Several engines in one process
//!
//! raft-engine 0.4 keeps the last entries block it decoded in a *thread-local* cache keyed
//! by the block's place alone (queue, file number, offset, length), not by engine. Two
//! engines in one process number their files alike, so a thread that read engine A's
//! block and then asks engine B for the block at the same place gets A's bytes: B answers
//! A's entries (or fails to decode them), and a purge in B rewrites A's entries into B's
//! log for good. One coordinator per process never meets this; a process that runs a
//! whole group (the tests, an embedded cluster) did. Every engine call that reads entries
//! therefore goes through `with_own_block_cache`: on a thread whose cache may hold
//! another engine's block it runs on a fresh thread, whose cache is empty.
//!
//! # Cost
//!
//! Reads (`entries`, `term`) go to the log files through the OS page cache; raft-rs keeps
//! unpersisted and recent entries in memory, so the coordinator's ready loop reads little.
//! The snapshot lives in the engine's memtable (raft-engine keeps key-values in memory), so
//! snapshots are meant to be small: the coordinator's state is kilobytes to a few megabytes.

use parking_lot::RwLock;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState};
use raft_engine::{Command, Config, Engine, LogBatch, MessageExt, ReadableSize};
use std::cell::Cell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The engine's id of the coordinators' one Raft group. Every key and entry lives under it.
pub const RAFT_GROUP_ID: u64 = 1;

/// Size at which raft-engine starts a new log file. Small, because the coordinator's log is
/// small and compacted often: a smaller file is purged sooner after a compaction.
pub const LOG_FILE_BYTES: u64 = 8 << 20;

/// Size of the live log files past which [`RaftStorage::compact`] and
/// [`RaftStorage::apply_snapshot`] purge files whose entries were all compacted (raft-engine
/// rewrites the few live records of old files first). Bounds the log's disk use to roughly
/// this plus what has not been compacted yet.
pub const LOG_PURGE_BYTES: u64 = 64 << 20;

const _: () = assert!(
    LOG_FILE_BYTES < LOG_PURGE_BYTES,
    "purging needs several files"
);

const HARD_STATE_KEY: &[u8] = b"hard_state";
const CONF_STATE_KEY: &[u8] = b"conf_state";
const SNAPSHOT_KEY: &[u8] = b"snapshot";

/// The next [`RaftStorage::engine_id`]; 0 is never given.
static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The engine whose entries block raft-engine's thread-local block cache may hold on
    /// this thread (0: none read an entry here). See "Several engines in one process".
    static BLOCK_CACHE_OWNER: Cell<u64> = const { Cell::new(0) };
}

/// Runs `read`, a raft-engine call of engine `engine_id` that may read entries from its
/// files (`get_entry`, `fetch_entries_to`, `purge_expired_files`), where raft-engine's
/// thread-local block cache holds nothing of another engine: on this thread when it last
/// read for the same engine or for none, else on a fresh thread (a spawn, tens of
/// microseconds, paid only where engines share threads).
fn with_own_block_cache<T: Send>(engine_id: u64, read: impl FnOnce() -> T + Send) -> T {
    let owner = BLOCK_CACHE_OWNER.get();
    if owner == engine_id || owner == 0 {
        BLOCK_CACHE_OWNER.set(engine_id);
        return read();
    }
    std::thread::scope(|scope| match scope.spawn(read).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Tells raft-engine how to find the index of a raft-rs entry.
struct EntryCodec;

impl MessageExt for EntryCodec {
    type Entry = Entry;

    fn index(entry: &Entry) -> u64 {
        entry.index
    }
}

/// Errors of [`RaftStorage`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// raft-engine failed: I/O, a corrupt file, a full disk.
    #[error("raft-engine: {0}")]
    Engine(#[from] raft_engine::Error),
    /// The directory's contents contradict themselves (see the module's layout invariants).
    #[error("raft storage in {dir} is inconsistent: {detail}")]
    Inconsistent {
        /// The engine directory.
        dir: PathBuf,
        /// What contradicts what.
        detail: String,
    },
    /// The directory's path is not valid UTF-8, which raft-engine requires.
    #[error("raft storage directory {0} is not valid UTF-8")]
    BadPath(PathBuf),
    /// [`RaftStorage::initialize`] on a store that already holds Raft state.
    #[error("raft storage is already initialized")]
    AlreadyInitialized,
    /// [`RaftStorage::apply_snapshot`] with a snapshot no newer than the one held.
    #[error("snapshot at index {snapshot_index} is not newer than the held one at {held_index}")]
    SnapshotOutOfDate {
        /// Index of the snapshot offered.
        snapshot_index: u64,
        /// Index of the snapshot already held.
        held_index: u64,
    },
}

impl From<StorageError> for raft::Error {
    fn from(e: StorageError) -> raft::Error {
        raft::Error::Store(raft::StorageError::Other(Box::new(e)))
    }
}

/// What is durable besides the entries, cached so reads need no decoding.
#[derive(Debug, Default)]
struct Durable {
    hard_state: HardState,
    conf_state: ConfState,
    /// Metadata of the held snapshot; default (index 0, term 0) when none was taken.
    snapshot_meta: SnapshotMetadata,
}

impl Durable {
    fn first_index(&self) -> u64 {
        self.snapshot_meta.index + 1
    }
}

/// Durable storage of one Raft group in a raft-engine directory. See the module docs.
pub struct RaftStorage {
    dir: PathBuf,
    engine: Engine,
    /// Unique in the process, for [`with_own_block_cache`]; a reopened directory gets a
    /// new one.
    engine_id: u64,
    /// Invariants, holding whenever the lock is free:
    /// 1. Equal to the last values synced to `engine` (a writer updates it only after its
    ///    synced write succeeded).
    /// 2. The engine's entries, if any, are contiguous from `snapshot_meta.index + 1`.
    /// 3. `hard_state.commit <= last index`.
    ///
    /// Writers hold the write lock across the engine write, so a reader never combines the
    /// engine's entries from one write with cached state from another.
    durable: RwLock<Durable>,
}

impl fmt::Debug for RaftStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RaftStorage")
            .field("dir", &self.dir)
            .field("durable", &*self.durable.read())
            .finish_non_exhaustive()
    }
}

impl RaftStorage {
    /// Opens the store in `dir`, creating the directory and an empty store if needed, and
    /// recovers what earlier processes wrote. Checks the layout invariants and returns
    /// [`StorageError::Inconsistent`] if they do not hold.
    pub fn open(dir: &Path) -> Result<RaftStorage, StorageError> {
        RaftStorage::open_with_limits(dir, LOG_FILE_BYTES, LOG_PURGE_BYTES)
    }

    /// [`RaftStorage::open`] with other file and purge sizes, so tests reach a purge quickly.
    fn open_with_limits(
        dir: &Path,
        log_file_bytes: u64,
        log_purge_bytes: u64,
    ) -> Result<RaftStorage, StorageError> {
        let dir_str = dir
            .to_str()
            .ok_or_else(|| StorageError::BadPath(dir.to_path_buf()))?;
        let cfg = Config {
            dir: dir_str.to_owned(),
            target_file_size: ReadableSize(log_file_bytes),
            purge_threshold: ReadableSize(log_purge_bytes),
            ..Config::default()
        };
        let engine = Engine::open(cfg)?;
        let hard_state: HardState = engine
            .get_message(RAFT_GROUP_ID, HARD_STATE_KEY)?
            .unwrap_or_default();
        let conf_state: ConfState = engine
            .get_message(RAFT_GROUP_ID, CONF_STATE_KEY)?
            .unwrap_or_default();
        let snapshot_meta = engine
            .get_message::<Snapshot>(RAFT_GROUP_ID, SNAPSHOT_KEY)?
            .map(|mut s| s.take_metadata())
            .unwrap_or_default();
        let durable = Durable {
            hard_state,
            conf_state,
            snapshot_meta,
        };
        let storage = RaftStorage {
            dir: dir.to_path_buf(),
            engine,
            engine_id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            durable: RwLock::new(durable),
        };
        storage.check_recovered()?;
        Ok(storage)
    }

    /// Checks invariants 2 and 3 of `durable` after recovery.
    fn check_recovered(&self) -> Result<(), StorageError> {
        let durable = self.durable.read();
        let first = durable.first_index();
        if let Some(engine_first) = self.engine.first_index(RAFT_GROUP_ID) {
            if engine_first != first {
                return Err(self.inconsistent(format!(
                    "log starts at {engine_first} but the snapshot is at {}",
                    durable.snapshot_meta.index
                )));
            }
        }
        let last = self.last_index_locked(&durable);
        if durable.hard_state.commit > last {
            return Err(self.inconsistent(format!(
                "commit index {} is past the last entry {last}",
                durable.hard_state.commit
            )));
        }
        Ok(())
    }

    fn inconsistent(&self, detail: String) -> StorageError {
        StorageError::Inconsistent {
            dir: self.dir.clone(),
            detail,
        }
    }

    /// The engine directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True once the store holds any Raft state: a conf state, a hard state, an entry or a
    /// snapshot. A coordinator calls [`RaftStorage::initialize`] only when this is false.
    pub fn is_initialized(&self) -> bool {
        self.is_initialized_locked(&self.durable.read())
    }

    fn is_initialized_locked(&self, durable: &Durable) -> bool {
        durable.conf_state != ConfState::default()
            || durable.hard_state != HardState::default()
            || durable.snapshot_meta.index != 0
            || self.engine.last_index(RAFT_GROUP_ID).is_some()
    }

    /// First boot of a statically configured group: records a conf state with `voters`,
    /// durably. Every member must be initialized with the same voters, and the log starts
    /// empty at index 1 on all of them. Fails with [`StorageError::AlreadyInitialized`] if
    /// [`RaftStorage::is_initialized`].
    ///
    /// # Panics
    /// If `voters` is empty.
    pub fn initialize(&self, voters: &[u64]) -> Result<(), StorageError> {
        assert!(!voters.is_empty(), "a Raft group needs at least one voter");
        let mut durable = self.durable.write();
        if self.is_initialized_locked(&durable) {
            return Err(StorageError::AlreadyInitialized);
        }
        let conf_state = ConfState {
            voters: voters.to_vec(),
            ..ConfState::default()
        };
        self.write_conf_state_locked(&mut durable, conf_state)
    }

    /// Appends `entries` durably. Entries at or after the first one's index that the store
    /// already holds are replaced (a conflicting suffix from an older leader is truncated).
    ///
    /// # Panics
    /// If the entries are not contiguous, would leave a hole after the last entry, or would
    /// overwrite a compacted or committed entry: raft-rs never asks for these.
    pub fn append(&self, entries: &[Entry]) -> Result<(), StorageError> {
        self.append_and_set_hard_state(entries, None)
    }

    /// Records `hard_state` durably.
    ///
    /// # Panics
    /// If its commit index is past the last entry.
    pub fn set_hard_state(&self, hard_state: &HardState) -> Result<(), StorageError> {
        self.append_and_set_hard_state(&[], Some(hard_state))
    }

    /// [`RaftStorage::append`] then [`RaftStorage::set_hard_state`] in one atomic batch and
    /// one `fsync`: what a `Ready` with both needs.
    ///
    /// # Panics
    /// As `append` and `set_hard_state`.
    pub fn append_and_set_hard_state(
        &self,
        entries: &[Entry],
        hard_state: Option<&HardState>,
    ) -> Result<(), StorageError> {
        let mut durable = self.durable.write();
        let mut batch = LogBatch::default();
        let mut last = self.last_index_locked(&durable);
        if let Some(head) = entries.first() {
            let first = durable.first_index();
            assert!(
                head.index >= first,
                "append at {} overwrites compacted entries (first index {first})",
                head.index
            );
            assert!(
                head.index <= last + 1,
                "append at {} leaves a hole after the last index {last}",
                head.index
            );
            assert!(
                head.index > durable.hard_state.commit,
                "append at {} overwrites committed entries (commit index {})",
                head.index,
                durable.hard_state.commit
            );
            for pair in entries.windows(2) {
                assert_eq!(
                    pair[1].index,
                    pair[0].index + 1,
                    "appended entries are not contiguous"
                );
            }
            batch.add_entries::<EntryCodec>(RAFT_GROUP_ID, entries)?;
            last = head.index + entries.len() as u64 - 1;
        }
        if let Some(hs) = hard_state {
            assert!(
                hs.commit <= last,
                "commit index {} is past the last entry {last}",
                hs.commit
            );
            batch.put_message(RAFT_GROUP_ID, HARD_STATE_KEY.to_vec(), hs)?;
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.engine.write(&mut batch, true)?;
        if let Some(hs) = hard_state {
            durable.hard_state = hs.clone();
        }
        Ok(())
    }

    /// Records `conf_state` durably: after applying a conf change (not used while membership
    /// is static) and by [`RaftStorage::initialize`].
    pub fn set_conf_state(&self, conf_state: &ConfState) -> Result<(), StorageError> {
        let mut durable = self.durable.write();
        self.write_conf_state_locked(&mut durable, conf_state.clone())
    }

    fn write_conf_state_locked(
        &self,
        durable: &mut Durable,
        conf_state: ConfState,
    ) -> Result<(), StorageError> {
        let mut batch = LogBatch::default();
        batch.put_message(RAFT_GROUP_ID, CONF_STATE_KEY.to_vec(), &conf_state)?;
        self.engine.write(&mut batch, true)?;
        durable.conf_state = conf_state;
        Ok(())
    }

    /// Installs a snapshot received from the leader, durably: it becomes the held snapshot,
    /// every entry is dropped (the next append starts right after it), the conf state becomes
    /// the snapshot's, and the hard state's commit moves to the snapshot's index (its term to
    /// the snapshot's if that is higher). Mirrors raft-rs's `MemStorage::apply_snapshot`.
    pub fn apply_snapshot(&self, snapshot: &Snapshot) -> Result<(), StorageError> {
        let meta = snapshot.get_metadata();
        let mut durable = self.durable.write();
        if meta.index <= durable.snapshot_meta.index {
            return Err(StorageError::SnapshotOutOfDate {
                snapshot_index: meta.index,
                held_index: durable.snapshot_meta.index,
            });
        }
        let mut hard_state = durable.hard_state.clone();
        hard_state.term = hard_state.term.max(meta.term);
        hard_state.commit = meta.index;
        let mut batch = LogBatch::default();
        batch.put_message(RAFT_GROUP_ID, SNAPSHOT_KEY.to_vec(), snapshot)?;
        batch.put_message(RAFT_GROUP_ID, HARD_STATE_KEY.to_vec(), &hard_state)?;
        batch.put_message(
            RAFT_GROUP_ID,
            CONF_STATE_KEY.to_vec(),
            meta.get_conf_state(),
        )?;
        if let Some(engine_last) = self.engine.last_index(RAFT_GROUP_ID) {
            // Compacting to one past the last entry drops them all; past the snapshot's index
            // as well so a later append starts right after the snapshot.
            let index = (engine_last + 1).max(meta.index + 1);
            batch.add_command(RAFT_GROUP_ID, Command::Compact { index });
        }
        self.engine.write(&mut batch, true)?;
        durable.snapshot_meta = meta.clone();
        durable.conf_state = meta.get_conf_state().clone();
        durable.hard_state = hard_state;
        drop(durable);
        self.purge();
        Ok(())
    }

    /// Stores a snapshot of the state machine taken after applying entry `index`, and drops
    /// the entries up to and including `index`, durably: the first index becomes `index + 1`
    /// and `term(index)` stays answerable from the snapshot's metadata. A snapshot no newer
    /// than the held one is ignored. `conf_state` is the conf state as of `index`.
    ///
    /// # Panics
    /// If `index` is past the last entry or past the durable commit index (persist a
    /// `LightReady`'s commit index before applying its entries).
    pub fn compact(
        &self,
        index: u64,
        snapshot_data: Vec<u8>,
        conf_state: ConfState,
    ) -> Result<(), StorageError> {
        let mut durable = self.durable.write();
        if index <= durable.snapshot_meta.index {
            return Ok(());
        }
        let last = self.last_index_locked(&durable);
        assert!(
            index <= last,
            "compact at {index} past the last entry {last}"
        );
        assert!(
            index <= durable.hard_state.commit,
            "compact at {index} past the commit index {}",
            durable.hard_state.commit
        );
        let term = self.entry_term_locked(index)?;
        let mut snapshot = Snapshot::default();
        snapshot.set_data(snapshot_data.into());
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf_state);
        let meta = meta.clone();
        let mut batch = LogBatch::default();
        batch.put_message(RAFT_GROUP_ID, SNAPSHOT_KEY.to_vec(), &snapshot)?;
        batch.add_command(RAFT_GROUP_ID, Command::Compact { index: index + 1 });
        self.engine.write(&mut batch, true)?;
        durable.snapshot_meta = meta;
        drop(durable);
        self.purge();
        Ok(())
    }

    /// Lets raft-engine delete log files that hold only compacted entries. Runs after the
    /// compaction is durable, so a failure here only delays reclaiming disk space: it is
    /// logged, not returned (returning it would tell the caller the write is in doubt).
    fn purge(&self) {
        if let Err(e) = with_own_block_cache(self.engine_id, || self.engine.purge_expired_files()) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "raft log purge failed");
        }
    }

    fn last_index_locked(&self, durable: &Durable) -> u64 {
        self.engine
            .last_index(RAFT_GROUP_ID)
            .unwrap_or(durable.snapshot_meta.index)
    }

    /// Term of an entry the engine holds; the caller checked the index is in range.
    fn entry_term_locked(&self, index: u64) -> Result<u64, StorageError> {
        let entry = with_own_block_cache(self.engine_id, || {
            self.engine.get_entry::<EntryCodec>(RAFT_GROUP_ID, index)
        })?;
        match entry {
            Some(entry) => Ok(entry.term),
            None => Err(self.inconsistent(format!("entry {index} is missing"))),
        }
    }
}

impl raft::Storage for RaftStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let durable = self.durable.read();
        Ok(RaftState::new(
            durable.hard_state.clone(),
            durable.conf_state.clone(),
        ))
    }

    /// Reads entries synchronously, so `context` (which allows an asynchronous fetch) is
    /// ignored. `max_size` counts encoded bytes and always lets one entry through, as raft-rs
    /// expects.
    ///
    /// # Panics
    /// If `high > last_index() + 1`, as the trait specifies.
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let durable = self.durable.read();
        if low < durable.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        let last = self.last_index_locked(&durable);
        assert!(
            high <= last + 1,
            "entries up to {high} requested but the last index is {last}"
        );
        if low >= high {
            return Ok(Vec::new());
        }
        // raft-rs's "no limit" is u64::MAX, which saturates to usize::MAX.
        let max_size = max_size
            .into()
            .map(|bytes| usize::try_from(bytes).unwrap_or(usize::MAX));
        let mut entries = Vec::new();
        with_own_block_cache(self.engine_id, || {
            self.engine.fetch_entries_to::<EntryCodec>(
                RAFT_GROUP_ID,
                low,
                high,
                max_size,
                &mut entries,
            )
        })
        .map_err(StorageError::from)?;
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        let durable = self.durable.read();
        if index == durable.snapshot_meta.index {
            return Ok(durable.snapshot_meta.term);
        }
        if index < durable.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if index > self.last_index_locked(&durable) {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        Ok(self.entry_term_locked(index)?)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.durable.read().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        let durable = self.durable.read();
        Ok(self.last_index_locked(&durable))
    }

    /// Returns the held snapshot. Snapshots are made by [`RaftStorage::compact`], not on
    /// demand: while none is held, or the held one is older than `request_index`, this
    /// answers `SnapshotTemporarilyUnavailable` and raft-rs asks again later.
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let durable = self.durable.read();
        if durable.snapshot_meta.index == 0 || durable.snapshot_meta.index < request_index {
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        match self
            .engine
            .get_message::<Snapshot>(RAFT_GROUP_ID, SNAPSHOT_KEY)
            .map_err(StorageError::from)?
        {
            Some(snapshot) => Ok(snapshot),
            None => Err(self
                .inconsistent("the snapshot is missing".to_owned())
                .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use raft::storage::MemStorage;
    use raft::Storage;
    use std::collections::BTreeMap;

    fn entry(index: u64, term: u64) -> Entry {
        entry_with_data(index, term, vec![index as u8; 8])
    }

    fn entry_with_data(index: u64, term: u64, data: Vec<u8>) -> Entry {
        Entry {
            index,
            term,
            data: data.into(),
            ..Entry::default()
        }
    }

    fn entries(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
        range.map(|index| entry(index, term)).collect()
    }

    fn all_entries(storage: &RaftStorage) -> Vec<Entry> {
        let first = storage.first_index().unwrap();
        let last = storage.last_index().unwrap();
        storage
            .entries(first, last + 1, None, GetEntriesContext::empty(false))
            .unwrap()
    }

    fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote,
            commit,
            ..HardState::default()
        }
    }

    fn voters(ids: &[u64]) -> ConfState {
        ConfState {
            voters: ids.to_vec(),
            ..ConfState::default()
        }
    }

    fn compacted<T: fmt::Debug>(result: raft::Result<T>) -> bool {
        matches!(
            result,
            Err(raft::Error::Store(raft::StorageError::Compacted))
        )
    }

    #[test]
    fn open_empty_store_starts_at_index_one() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        assert!(!storage.is_initialized());
        assert_eq!(storage.first_index().unwrap(), 1);
        assert_eq!(storage.last_index().unwrap(), 0);
        assert_eq!(storage.term(0).unwrap(), 0);
        let state = storage.initial_state().unwrap();
        assert!(!state.initialized());
        assert_eq!(state.hard_state, HardState::default());
    }

    #[test]
    fn append_then_entries_and_terms_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        let mut written = entries(1..=3, 1);
        written.extend(entries(4..=5, 2));
        storage.append(&written).unwrap();
        assert_eq!(storage.first_index().unwrap(), 1);
        assert_eq!(storage.last_index().unwrap(), 5);
        assert_eq!(all_entries(&storage), written);
        let middle = storage
            .entries(2, 4, None, GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(middle, written[1..3]);
        assert_eq!(storage.term(3).unwrap(), 1);
        assert_eq!(storage.term(4).unwrap(), 2);
        assert!(matches!(
            storage.term(6),
            Err(raft::Error::Store(raft::StorageError::Unavailable))
        ));
    }

    #[test]
    fn entries_respects_max_size_but_returns_at_least_one() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        let written = entries(1..=4, 1);
        storage.append(&written).unwrap();
        let one = u64::from(protobuf::Message::compute_size(&written[0]));
        let ctx = || GetEntriesContext::empty(false);
        assert_eq!(storage.entries(1, 5, 0, ctx()).unwrap(), written[..1]);
        assert_eq!(storage.entries(1, 5, 2 * one, ctx()).unwrap(), written[..2]);
        assert_eq!(
            storage.entries(1, 5, 2 * one + 1, ctx()).unwrap(),
            written[..2]
        );
        assert_eq!(
            storage.entries(1, 5, raft::NO_LIMIT, ctx()).unwrap(),
            written
        );
    }

    #[test]
    fn append_truncates_conflicting_suffix() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        storage.append(&entries(1..=5, 1)).unwrap();
        // A new leader of term 2 overwrites entries 3.. with a shorter log.
        storage.append(&entries(3..=4, 2)).unwrap();
        assert_eq!(storage.last_index().unwrap(), 4);
        let mut expected = entries(1..=2, 1);
        expected.extend(entries(3..=4, 2));
        assert_eq!(all_entries(&storage), expected);
        drop(storage);
        let storage = RaftStorage::open(dir.path()).unwrap();
        assert_eq!(all_entries(&storage), expected);
    }

    #[test]
    #[should_panic(expected = "leaves a hole")]
    fn append_with_a_hole_panics() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        storage.append(&entries(1..=2, 1)).unwrap();
        let _ = storage.append(&entries(4..=4, 1));
    }

    #[test]
    fn hard_state_conf_state_and_entries_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        storage.initialize(&[1, 2, 3]).unwrap();
        assert!(storage.is_initialized());
        storage
            .append_and_set_hard_state(&entries(1..=3, 2), Some(&hard_state(2, 3, 2)))
            .unwrap();
        drop(storage);

        let storage = RaftStorage::open(dir.path()).unwrap();
        let state = storage.initial_state().unwrap();
        assert_eq!(state.hard_state, hard_state(2, 3, 2));
        assert_eq!(state.conf_state, voters(&[1, 2, 3]));
        assert_eq!(all_entries(&storage), entries(1..=3, 2));
        assert!(matches!(
            storage.initialize(&[1, 2, 3]),
            Err(StorageError::AlreadyInitialized)
        ));
        storage.set_hard_state(&hard_state(3, 1, 3)).unwrap();
        drop(storage);

        let storage = RaftStorage::open(dir.path()).unwrap();
        assert_eq!(
            storage.initial_state().unwrap().hard_state,
            hard_state(3, 1, 3)
        );
    }

    #[test]
    fn compact_moves_first_index_and_stores_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        storage.initialize(&[1, 2, 3]).unwrap();
        let mut written = entries(1..=4, 1);
        written.extend(entries(5..=8, 2));
        storage
            .append_and_set_hard_state(&written, Some(&hard_state(2, 1, 7)))
            .unwrap();
        assert!(matches!(
            storage.snapshot(0, 2),
            Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable
            ))
        ));

        storage
            .compact(5, b"state after 5".to_vec(), voters(&[1, 2, 3]))
            .unwrap();
        let check = |storage: &RaftStorage| {
            assert_eq!(storage.first_index().unwrap(), 6);
            assert_eq!(storage.last_index().unwrap(), 8);
            assert_eq!(storage.term(5).unwrap(), 2, "term of the snapshot's index");
            assert!(compacted(storage.term(4)));
            assert!(compacted(storage.entries(
                5,
                9,
                None,
                GetEntriesContext::empty(false)
            )));
            assert_eq!(all_entries(storage), written[5..]);
            let snapshot = storage.snapshot(0, 2).unwrap();
            assert_eq!(&snapshot.data[..], b"state after 5");
            assert_eq!(snapshot.get_metadata().index, 5);
            assert_eq!(snapshot.get_metadata().term, 2);
            assert_eq!(
                snapshot.get_metadata().get_conf_state(),
                &voters(&[1, 2, 3])
            );
            assert!(storage.snapshot(6, 2).is_err(), "older than requested");
        };
        check(&storage);
        // An older compaction is ignored.
        storage.compact(3, b"stale".to_vec(), voters(&[1])).unwrap();
        check(&storage);
        drop(storage);
        check(&RaftStorage::open(dir.path()).unwrap());
    }

    #[test]
    fn compact_of_the_whole_log_then_append() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        storage
            .append_and_set_hard_state(&entries(1..=3, 1), Some(&hard_state(1, 1, 3)))
            .unwrap();
        storage.compact(3, vec![7], voters(&[1])).unwrap();
        assert_eq!(storage.first_index().unwrap(), 4);
        assert_eq!(storage.last_index().unwrap(), 3);
        assert_eq!(storage.term(3).unwrap(), 1);
        storage.append(&entries(4..=5, 2)).unwrap();
        drop(storage);
        let storage = RaftStorage::open(dir.path()).unwrap();
        assert_eq!(storage.first_index().unwrap(), 4);
        assert_eq!(all_entries(&storage), entries(4..=5, 2));
    }

    #[test]
    fn apply_snapshot_on_fresh_store() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        let mut snapshot = Snapshot::default();
        snapshot.set_data(b"leader state".to_vec().into());
        snapshot.mut_metadata().index = 10;
        snapshot.mut_metadata().term = 3;
        snapshot.mut_metadata().set_conf_state(voters(&[1, 2, 3]));
        storage.apply_snapshot(&snapshot).unwrap();

        let check = |storage: &RaftStorage| {
            assert_eq!(storage.first_index().unwrap(), 11);
            assert_eq!(storage.last_index().unwrap(), 10);
            assert_eq!(storage.term(10).unwrap(), 3);
            let state = storage.initial_state().unwrap();
            assert_eq!(state.hard_state.commit, 10);
            assert_eq!(state.hard_state.term, 3);
            assert_eq!(state.conf_state, voters(&[1, 2, 3]));
            assert_eq!(storage.snapshot(10, 1).unwrap(), snapshot);
        };
        check(&storage);
        assert!(matches!(
            storage.apply_snapshot(&snapshot),
            Err(StorageError::SnapshotOutOfDate { .. })
        ));
        drop(storage);
        let storage = RaftStorage::open(dir.path()).unwrap();
        check(&storage);
        storage.append(&entries(11..=12, 3)).unwrap();
        assert_eq!(all_entries(&storage), entries(11..=12, 3));
    }

    #[test]
    fn apply_snapshot_drops_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path()).unwrap();
        storage.append(&entries(1..=8, 1)).unwrap();
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = 5;
        snapshot.mut_metadata().term = 2;
        storage.apply_snapshot(&snapshot).unwrap();
        assert_eq!(storage.first_index().unwrap(), 6);
        assert_eq!(storage.last_index().unwrap(), 5);
        drop(storage);
        let storage = RaftStorage::open(dir.path()).unwrap();
        assert_eq!(storage.last_index().unwrap(), 5);
        storage.append(&entries(6..=6, 2)).unwrap();
        assert_eq!(all_entries(&storage), entries(6..=6, 2));
    }

    /// `len` bytes of a xorshift sequence seeded by `seed`.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn log_files(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn compact_purges_old_log_files_and_recovers_after_purge() {
        const FILE_BYTES: u64 = 16 << 10;
        const PURGE_BYTES: u64 = 64 << 10;
        const ENTRY_BYTES: usize = 1 << 10;
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open_with_limits(dir.path(), FILE_BYTES, PURGE_BYTES).unwrap();
        let mut index = 0;
        let mut files_max = 0;
        for round in 0..20u64 {
            // Incompressible data: raft-engine compresses large batches with lz4.
            let written: Vec<Entry> = (index + 1..=index + 20)
                .map(|i| entry_with_data(i, 1, noise(i, ENTRY_BYTES)))
                .collect();
            index += 20;
            storage
                .append_and_set_hard_state(&written, Some(&hard_state(1, 1, index)))
                .unwrap();
            storage
                .compact(index - 5, vec![round as u8], voters(&[1]))
                .unwrap();
            files_max = files_max.max(log_files(dir.path()));
        }
        // 400 KiB were written in 16 KiB files; purging keeps about PURGE_BYTES of them.
        assert!(
            files_max < 12,
            "{files_max} files: old log files are not purged"
        );
        drop(storage);
        let storage = RaftStorage::open_with_limits(dir.path(), FILE_BYTES, PURGE_BYTES).unwrap();
        assert_eq!(storage.first_index().unwrap(), index - 4);
        assert_eq!(storage.last_index().unwrap(), index);
        assert_eq!(all_entries(&storage).len(), 5);
        assert_eq!(&storage.snapshot(0, 1).unwrap().data[..], &[19]);
    }

    /// Entries of [`twin_store`]: batches stay under raft-engine's compression threshold
    /// (8 KiB) so blocks of twin stores have the same sizes.
    const TWIN_BATCHES: u64 = 16;
    const TWIN_BATCH_ENTRIES: u64 = 20;
    const TWIN_ENTRY_BYTES: usize = 300;
    const TWIN_LAST: u64 = TWIN_BATCHES * TWIN_BATCH_ENTRIES;

    /// A store in 16 KiB log files, purged past 64 KiB, holding entries 1..=TWIN_LAST
    /// (about 100 KiB) of `fill` bytes: two of them, with different fills, have the same
    /// blocks at the same places in their files.
    fn twin_store(dir: &Path, fill: u8) -> RaftStorage {
        let storage =
            RaftStorage::open_with_limits(dir, 16 << 10, 64 << 10).expect("a fresh store opens");
        for batch in 0..TWIN_BATCHES {
            let first = batch * TWIN_BATCH_ENTRIES + 1;
            let last = first + TWIN_BATCH_ENTRIES - 1;
            let written: Vec<Entry> = (first..=last)
                .map(|i| entry_with_data(i, 1, vec![fill; TWIN_ENTRY_BYTES]))
                .collect();
            storage
                .append_and_set_hard_state(&written, Some(&hard_state(1, 1, last)))
                .expect("a write to a fresh store succeeds");
        }
        storage
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temporary directory")
    }

    fn data_of(storage: &RaftStorage, index: u64) -> Vec<u8> {
        let read = storage
            .entries(index, index + 1, None, GetEntriesContext::empty(false))
            .expect("a held entry reads");
        read[0].data.to_vec()
    }

    /// raft-engine's block cache is per thread, not per engine: without
    /// `with_own_block_cache` the second store answered the first one's entries.
    #[test]
    fn two_stores_read_on_one_thread_each_answer_their_own_entries() {
        let (a_dir, b_dir) = (tempdir(), tempdir());
        let a = twin_store(a_dir.path(), 0xAA);
        let b = twin_store(b_dir.path(), 0xBB);
        for index in [1, 2, 21, TWIN_LAST, 1] {
            assert_eq!(
                data_of(&a, index),
                [0xAA; TWIN_ENTRY_BYTES],
                "a, entry {index}"
            );
            assert_eq!(
                data_of(&b, index),
                [0xBB; TWIN_ENTRY_BYTES],
                "b, entry {index}"
            );
            assert_eq!(a.term(index).expect("a held entry has a term"), 1);
            assert_eq!(b.term(index).expect("a held entry has a term"), 1);
        }
    }

    /// A purge rewrites the live entries of old files, reading them through the same cache:
    /// without `with_own_block_cache`, the second store's log durably held the first one's
    /// entries after its purge.
    #[test]
    fn a_purge_after_reading_another_store_on_the_same_thread_keeps_its_own_entries() {
        let (a_dir, b_dir) = (tempdir(), tempdir());
        let (a, b) = (
            twin_store(a_dir.path(), 0xAA),
            twin_store(b_dir.path(), 0xBB),
        );
        // Snapshots of 12 KiB fill newer files until the few live entries left sit in old
        // files only, which a purge rewrites. Done in lockstep, so each of b's reads comes
        // right after a's read of the block at the same place.
        for index in TWIN_LAST - 20..TWIN_LAST - 10 {
            for storage in [&a, &b] {
                storage
                    .compact(index, noise(index, 12 << 10), voters(&[1]))
                    .expect("a compaction of committed entries succeeds");
            }
        }
        let rewritten = |dir: &Path| {
            std::fs::read_dir(dir)
                .expect("the store's directory lists")
                .any(|f| {
                    f.expect("a directory entry reads")
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".rewrite")
                })
        };
        assert!(rewritten(b_dir.path()), "b's purges rewrote no entry");
        drop(b);
        let b = RaftStorage::open_with_limits(b_dir.path(), 16 << 10, 64 << 10)
            .expect("the purged store reopens");
        let first = b.first_index().expect("first index");
        assert_eq!(first, TWIN_LAST - 10);
        for index in first..=TWIN_LAST {
            assert_eq!(
                data_of(&b, index),
                [0xBB; TWIN_ENTRY_BYTES],
                "b, entry {index}"
            );
            assert_eq!(
                data_of(&a, index),
                [0xAA; TWIN_ENTRY_BYTES],
                "a, entry {index}"
            );
        }
    }

    /// One step of the property test; positions are fractions of the valid range so every
    /// generated step applies.
    #[derive(Debug, Clone)]
    enum Op {
        Append {
            start_back: u64,
            len: u64,
            new_term: bool,
            data_len: usize,
        },
        Commit {
            ahead: u64,
        },
        Compact {
            at_pct: u64,
        },
        ApplySnapshot {
            ahead: u64,
        },
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..4u64, 1..6u64, any::<bool>(), 0..64usize).prop_map(
                |(start_back, len, new_term, data_len)| Op::Append {
                    start_back,
                    len,
                    new_term,
                    data_len
                }
            ),
            3 => (0..6u64).prop_map(|ahead| Op::Commit { ahead }),
            2 => (0..=100u64).prop_map(|at_pct| Op::Compact { at_pct }),
            1 => (1..4u64).prop_map(|ahead| Op::ApplySnapshot { ahead }),
            1 => Just(Op::Reopen),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// `RaftStorage` answers like raft-rs's `MemStorage` over random appends (with
        /// truncation), commits, compactions, installed snapshots and restarts.
        #[test]
        fn behaves_like_mem_storage(ops in proptest::collection::vec(op(), 1..40),
                                    max_size in 0..400u64) {
            let dir = tempfile::tempdir().unwrap();
            let mut storage = RaftStorage::open(dir.path()).unwrap();
            let model = MemStorage::new();
            // Term of every index ever written and not truncated, to check the term kept
            // for the index before the first one (MemStorage forgets it on compaction).
            let mut terms = BTreeMap::from([(0u64, 0u64)]);
            let mut term = 1;
            for op in ops {
                let first = storage.first_index().unwrap();
                let last = storage.last_index().unwrap();
                let commit = storage.initial_state().unwrap().hard_state.commit;
                match op {
                    Op::Append { start_back, len, new_term, data_len } => {
                        let lowest = first.max(commit + 1);
                        let start = (last + 1).saturating_sub(start_back).max(lowest);
                        if new_term {
                            term += 1;
                        }
                        let written: Vec<Entry> = (start..start + len)
                            .map(|i| entry_with_data(i, term, vec![0xAB; data_len]))
                            .collect();
                        storage.append(&written).unwrap();
                        model.wl().append(&written).unwrap();
                        terms.retain(|&i, _| i < start);
                        terms.extend(written.iter().map(|e| (e.index, e.term)));
                    }
                    Op::Commit { ahead } => {
                        let to = (commit + ahead).min(last);
                        let hs = hard_state(term, 1, to);
                        storage.set_hard_state(&hs).unwrap();
                        model.wl().set_hardstate(hs);
                    }
                    Op::Compact { at_pct } => {
                        // MemStorage keeps its first index right only while it holds an
                        // entry, so leave the last one.
                        let highest = commit.min(last.saturating_sub(1));
                        if highest >= first {
                            let at = first + (highest - first) * at_pct / 100;
                            storage.compact(at, vec![1, 2, 3], voters(&[1])).unwrap();
                            model.wl().compact(at + 1).unwrap();
                        }
                    }
                    Op::ApplySnapshot { ahead } => {
                        term += 1;
                        let mut snapshot = Snapshot::default();
                        snapshot.mut_metadata().index = commit.max(first - 1) + ahead;
                        snapshot.mut_metadata().term = term;
                        snapshot.mut_metadata().set_conf_state(voters(&[1, 2]));
                        storage.apply_snapshot(&snapshot).unwrap();
                        model.wl().apply_snapshot(snapshot.clone()).unwrap();
                        terms.clear();
                        terms.insert(snapshot.get_metadata().index, term);
                    }
                    Op::Reopen => {
                        drop(storage);
                        storage = RaftStorage::open(dir.path()).unwrap();
                    }
                }

                let first = storage.first_index().unwrap();
                let last = storage.last_index().unwrap();
                prop_assert_eq!(first, model.first_index().unwrap());
                prop_assert_eq!(last, model.last_index().unwrap());
                prop_assert_eq!(
                    storage.initial_state().unwrap().hard_state,
                    model.initial_state().unwrap().hard_state
                );
                prop_assert_eq!(storage.term(first - 1).unwrap(), terms[&(first - 1)]);
                for i in first..=last {
                    prop_assert_eq!(storage.term(i).unwrap(), model.term(i).unwrap());
                }
                if first > 1 {
                    prop_assert!(compacted(storage.term(first - 2)));
                    prop_assert!(compacted(storage.entries(
                        first - 1, last + 1, None, GetEntriesContext::empty(false))));
                }
                for low in first..=last {
                    let ours = storage
                        .entries(low, last + 1, max_size, GetEntriesContext::empty(false))
                        .unwrap();
                    let theirs = model
                        .entries(low, last + 1, max_size, GetEntriesContext::empty(false))
                        .unwrap();
                    prop_assert_eq!(ours, theirs);
                }
            }
        }
    }
}
