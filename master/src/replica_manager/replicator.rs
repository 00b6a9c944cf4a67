//! `Replicator`: keeps R replicas of every segment of this master's log on backups
//! (DESIGN.md §5). It is the async driver of two pure cores: `SegmentReplicas`
//! (`segment_replicas`), which decides for each segment what to place, bump, record,
//! close and free, and `BackupSelector`, which chooses backups; it reaches the frames
//! through the transports of `transport` (one `ReplicaTransport` per kind).
//!
//! The appender owns it and calls [`Replicator::replicate`] with every batch's sealed
//! byte ranges, each carrying its bytes ([`SealedRange`]), between sealing the batch and
//! publishing it: it returns only when every one of the R replicas of each touched
//! segment holds the bytes (transport completion), so nothing is acknowledged with fewer
//! than R copies. The replicator never reads the log: it keeps a copy of the open
//! segments' bytes (in buffers recycled from segment to segment) to fill the replicas
//! it re-creates there. Between
//! batches the appender calls [`Replicator::tick`], which finishes background closes,
//! watches the backups that hold this master's replicas, frees abandoned copies, and
//! re-creates the open segments' lost replicas; it names a closed segment that lost
//! replicas, whose bytes the appender reads from the log and hands to
//! [`Replicator::recreate`].
//!
//! # A segment's replicas
//! A segment seen for the first time (its header range) gets R backups from the
//! [`BackupSelector`] (randomized refinement; the first is the primary), each opened with
//! `OpenReplica`. Every later range is written to all R at its offset; the range that
//! carries the footer is followed by `CloseReplica` to each, sent in the background (the
//! bytes are already in the frames; the close only moves them to disk). Ranges of one
//! batch are written in their order, one after the other, so a new head's header and
//! digest are on every replica before the old head's footer is written (the
//! digest-and-footer protocol of DESIGN.md §4).
//!
//! # Lost replicas
//! A replica is *lost* when a write, open, close or probe to its backup fails at the
//! transport level (the backup is then marked failed and every replica on it is lost),
//! or when its backup refuses it (`UnknownFrame`, `StaleEpoch`, `BackupFull` on close:
//! only that replica). What follows is `SegmentReplicas`'s to decide (its module doc
//! states the guarantees, which a property test checks): a lost replica of the **open**
//! segment is re-created before the write path goes on — a replacement backup is opened
//! at a new epoch e' > e, given every byte the segment holds so far, then the surviving
//! replicas are moved to e' (`BumpEpoch`), e' is recorded at the coordinator
//! (`SetOpenEpoch`), and only then does the write continue — so the replica left behind
//! at e (on a backup that may only have looked dead, or written to disk when its backup
//! stopped) is recognisably stale: a recovery does not count it
//! (`coordinator::recovery_plan`). Until e' is recorded no byte goes past what every
//! copy held when the loss was found, so the copies at e still hold every acknowledged
//! write and may still be counted; while no coordinator answers, writes wait. Every
//! placement attempt takes a new epoch, so no two copies of a segment ever share one. A
//! lost replica of a **closed** segment is re-created by [`Replicator::tick`], one
//! segment per tick and one attempt each, so writes keep flowing meanwhile. Copies given
//! up on (lost, or on a backup only thought dead) are freed later by `tick` with
//! `FreeReplica { epoch_max }`, which spares any newer copy; `epoch_max` is the highest
//! epoch the copy may be at (a bump that got no answer may have landed). A backup that
//! holds this master's replicas and was not heard from for [`PROBE_INTERVAL`] is probed
//! (`Ping`, answered by the storage server it runs in); one that the server list no
//! longer shows Up is failed at once.
//!
//! A backup answers `Fenced` for a recovered master's frames even after the recovery
//! freed them (see `transport` for how each transport learns it).
//!
//! # The server list
//! Backups come from the server list. With [`ServerSource::Coordinators`] it is pulled
//! (`GetTabletMap`) from the coordinators' Raft leader through a `CoordinatorSet`, which
//! asks the leader it last found first and follows `NotLeader` hints — one round per pull,
//! within [`SERVER_LIST_FETCH_TIMEOUT`], since the appender waits for it. The replicator
//! records the `TabletMap::version` of the list it holds and pulls again when that list is
//! older than [`SERVER_LIST_REFRESH`], or at once (the appender's next upkeep, run on
//! the push) when a `ServerListChanged` push recorded in its [`ServerListWatch`]
//! announced a newer version. The periodic pull is the fallback for a lost push.
//!
//! # Failure handling
//! * Not enough backups (fewer eligible failure domains than R): the write path waits,
//!   refreshing the server list. It says so once (a warning naming the cause and the
//!   fix, [`NotEnoughBackups::explain`]) and once more when backups are enough again,
//!   and publishes the state in its [`BackupShortage`] for `rampart status`, the status
//!   page and clients. Clients see their deadline pass; the batch is acknowledged once
//!   the backups exist.
//! * `Fenced` from any replica: this master is being recovered elsewhere. The batch must
//!   never be acknowledged: [`replicate`](Replicator::replicate) returns
//!   [`Fatal::Fenced`] and the master stops. Backups that fenced a master also refuse
//!   its new opens.
//! * An open segment that lost *every* replica has no survivor whose fence could stop
//!   the master, so before its bytes go to new backups the master checks that the
//!   coordinator still lists it Up ([`Fatal::DeclaredDead`] otherwise). Closing the last
//!   gap (a master cut off from everything between that check and its writes) needs the
//!   leases of issue 5.
//!
//! # Departures from DESIGN.md
//! * The epoch of a re-created open replica is recorded on the backups (`BumpEpoch`)
//!   and at the coordinator (`SetOpenEpoch`, as RAMCloud's `updateReplicationEpoch`),
//!   for the open segment only: below it, a copy holding the footer is whole and one
//!   without it two segments below the head is stale, whatever the epochs say. Nor is
//!   it recorded while the segment holds no bytes: a copy left behind empty is never
//!   counted by a recovery.
//! * Liveness of `shm` backups by pidfd (`transport`): DESIGN.md assumed a write to a
//!   dead backup fails, which holds for tcp, rpc and rdma but not for shared memory.

use bytes::Bytes;
use futures::future::join_all;
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::onesided::{self, TransportKind};
use rampart_common::protocol::backup::{
    BumpEpoch, BumpEpochRequest, CloseReplica, CloseReplicaRequest, FreeReplica,
    FreeReplicaRequest, OpenReplica, OpenReplicaRequest,
};
use rampart_common::protocol::coordinator::{
    GetTabletMap, SetOpenEpoch, SetOpenEpochRequest, TabletMapRequest,
};
use rampart_common::protocol::master::{Ping, PingRequest};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::status::Status;
use rampart_common::tablet::{ServerInfo, ServerStatus};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::backup_selector::{BackupInfo, BackupSelector, BackupShortage, NotEnoughBackups};
use super::segment_replicas::{Abandoned, Lost, Replica, SegmentReplicas, Step};
use super::server_list_watch::ServerListWatch;
use super::transport::{classify_rpc, Failure, ReplicaTransport, Transports};
use crate::segmented_log::SealedRange;

pub use super::transport::REPLICA_IO_TIMEOUT;

/// Buffers of closed segments kept for the next open ones (`Replicator::open_bytes`):
/// the head and its predecessor are the only segments ever open at once.
const SPARE_BUFFERS_MAX: usize = 2;

/// A backup holding replicas of this master that was not heard from for this long is
/// probed.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Deadline of a probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The server list is re-read from the coordinator at least this often (sooner when the
/// coordinator announces a newer one: see [`ServerListWatch`]).
pub const SERVER_LIST_REFRESH: Duration = Duration::from_secs(1);

/// How long one pull of the server list may take: one round over the coordinators
/// (`CoordinatorSet::call_round`, each attempt capped at a second), never a wait for an
/// election — the appender runs this between batches, and the next upkeep tries again.
pub const SERVER_LIST_FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// A backup marked failed is not chosen again for this long (unless the server list
/// drops it first). Server ids are never reused, so a restarted backup comes back under
/// a new id at once; this only bounds how long a transient network fault excludes one.
pub const FAILED_BACKUP_EXCLUSION: Duration = Duration::from_secs(10);

/// A backup that refused a replica (full) is not chosen again for this long.
pub const REFUSED_BACKUP_EXCLUSION: Duration = Duration::from_secs(2);

/// While the write path waits for backups, it warns this often.
pub const WAIT_WARN_INTERVAL: Duration = Duration::from_secs(2);

/// How long writes wait for backups before the shortage is said (logged, published):
/// servers of a cluster that starts enlist within it.
pub const SHORTAGE_SAID_AFTER: Duration = Duration::from_secs(1);

/// Longest pause between attempts while waiting for backups.
const WAIT_BACKOFF_MAX: Duration = Duration::from_millis(200);

/// Where the replicator learns the server list.
#[derive(Clone, Debug)]
pub enum ServerSource {
    /// Ask the leader among these coordinators (`GetTabletMap` through a
    /// `CoordinatorSet`, which follows `NotLeader` hints).
    Coordinators(Vec<String>),
    /// A list the caller maintains (tests, benchmarks).
    Fixed(Arc<parking_lot::Mutex<Vec<ServerInfo>>>),
}

/// How this master replicates its log.
#[derive(Clone, Debug)]
pub struct ReplicationConfig {
    /// Replicas per segment (R). 0: the DRAM copy only, acknowledged once sealed.
    pub replicas: usize,
    /// The transport to use for every replica; `None` picks per backup (module doc).
    pub transport: Option<TransportKind>,
    /// Where the server list comes from.
    pub servers: ServerSource,
    /// Seeds the backup selector, so a test can reproduce placements.
    pub seed: u64,
    /// How long a backup marked failed is not chosen again
    /// ([`FAILED_BACKUP_EXCLUSION`] by default).
    pub failed_backup_exclusion: Duration,
}

impl ReplicationConfig {
    /// No replication (R = 0).
    pub fn none() -> ReplicationConfig {
        ReplicationConfig {
            replicas: 0,
            transport: None,
            servers: ServerSource::Fixed(Arc::default()),
            seed: 0,
            failed_backup_exclusion: FAILED_BACKUP_EXCLUSION,
        }
    }
}

/// The replicator cannot go on; the master must stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fatal {
    /// A backup fenced a replica: this master is being recovered elsewhere.
    #[error(
        "segment {segment} was fenced by backup {backup}: this master is being recovered elsewhere"
    )]
    Fenced {
        /// The fenced segment.
        segment: SegmentId,
        /// The backup that fenced it.
        backup: ServerId,
    },
    /// The coordinator lists this master as no longer Up: it was declared crashed.
    #[error("{0} is no longer Up in the coordinator's server list: it was declared crashed")]
    DeclaredDead(ServerId),
    /// The log no longer has bytes it was asked to replicate (a bug).
    #[error("segment {0} bytes are not in the log")]
    MissingBytes(SegmentId),
    /// A range did not start where the segment's replicated bytes end, or its replicas
    /// were not ready for it (a bug).
    #[error("segment {0} was not ready for the range handed to replication")]
    NotWritable(SegmentId),
}

/// How the driver reaches one replica: its backup's address and the transport chosen
/// when it was opened.
#[derive(Clone, Debug)]
struct Link {
    addr: String,
    transport: Arc<dyn ReplicaTransport>,
}

/// The replicas of one segment, reached through [`Link`]s.
type Segment = SegmentReplicas<Link>;

/// How long [`Replicator::settle`] keeps trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Patience {
    /// Until every replica exists (the write path: nothing is acknowledged before).
    UntilDone,
    /// One placement round (upkeep between batches: the next tick tries again).
    OneAttempt,
}

/// The result of a background close.
struct CloseDone {
    segment: SegmentId,
    slot: usize,
    handle: FrameHandle,
    result: Result<(), RpcError>,
}

/// A backup as the replicator knows it.
#[derive(Debug, Clone)]
struct KnownBackup {
    addr: String,
    /// Last successful exchange with it.
    heard: Instant,
}

/// Counts kept for statistics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicationStats {
    /// Segments with fewer than R live replicas right now.
    pub under_replicated: u64,
    /// Replicas re-created after a loss, since start.
    pub replicas_recreated: u64,
    /// Backups marked failed, since start.
    pub backups_failed: u64,
}

/// Keeps R replicas of each segment; see the module doc.
pub struct Replicator {
    own: ServerId,
    config: ReplicationConfig,
    pool: Arc<RpcPool>,
    transports: Transports,
    selector: BackupSelector,
    /// The coordinators of a [`ServerSource::Coordinators`] source, and their leader
    /// once found (empty for a fixed list).
    coordinators: CoordinatorSet,
    /// Up backups from the last server list, by id.
    backups: HashMap<ServerId, KnownBackup>,
    /// When the list was last fetched (or a fetch last failed).
    list_fetched: Option<Instant>,
    /// `TabletMap::version` of the server list held (0: none yet). For a fixed list, the
    /// version pushed when it was last read.
    list_version: u64,
    /// Versions announced by `ServerListChanged` pushes; a newer one than `list_version`
    /// makes the next refresh pull at once.
    server_list: Arc<ServerListWatch>,
    /// Whether writes wait for backups now (published for status reports).
    shortage: Arc<BackupShortage>,
    /// Backups marked failed, and when.
    failed: HashMap<ServerId, Instant>,
    /// Backups that refused a replica (full frames or disk), and until when they are
    /// not chosen.
    refused: HashMap<ServerId, Instant>,
    /// Every live segment this replicator has seen.
    segments: BTreeMap<SegmentId, Segment>,
    /// The bytes of each open segment replicated so far, copied range by range (a
    /// memcpy of each batch's bytes) into a buffer recycled from segment to segment:
    /// what a replica re-created while the segment is open is filled with. Keeping the
    /// ranges' own `Bytes` instead would hold thousands of small allocations per
    /// segment. Invariant: each buffer holds exactly its segment's first `len` bytes.
    /// Given back once the footer is written: a closed segment's lost replicas are
    /// refilled from bytes the appender reads from the log when `tick` names the
    /// segment ([`Replicator::recreate`]).
    open_bytes: BTreeMap<SegmentId, Vec<u8>>,
    /// Buffers of segments that closed, for the next ones (at most
    /// [`SPARE_BUFFERS_MAX`]: only the head and its predecessor are ever open).
    spare_buffers: Vec<Vec<u8>>,
    /// Bytes every segment of this log (hence every frame) holds, from the ranges.
    segment_capacity: u32,
    closes: JoinSet<CloseDone>,
    stats: ReplicationStats,
    /// Set when a background close was refused as fenced: the next call to
    /// `replicate` or `tick` fails with it.
    fenced: Option<Fatal>,
    /// Copies this master stopped using that may still exist on a live backup; freed
    /// (epoch-bounded) by `tick`. Invariant: at most [`ABANDONED_MAX`] entries.
    abandoned: Vec<Abandoned>,
    /// A replica was placed, lost, closed or re-created since `take_changed_stats`.
    changed: bool,
}

/// Most abandoned replicas remembered for freeing; older ones are forgotten (their
/// copies stay on the backup, across its restarts too — a restarted backup stores its
/// frames — until a recovery of this master frees the master's replicas there).
pub const ABANDONED_MAX: usize = 4096;

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("own", &self.own)
            .field("replicas", &self.config.replicas)
            .field("segments", &self.segments.len())
            .finish()
    }
}

/// Progress of a wait in [`Replicator::settle`]: for backups to place replicas on, or
/// for a coordinator to record an epoch.
struct Waiting {
    since: Option<Instant>,
    last_warn: Option<Instant>,
    backoff: Duration,
}

impl Waiting {
    fn new() -> Waiting {
        Waiting {
            since: None,
            last_warn: None,
            backoff: Duration::from_millis(5),
        }
    }

    /// How long this wait has lasted, starting it now if it had not started.
    fn waited(&mut self, now: Instant) -> Duration {
        now - *self.since.get_or_insert(now)
    }

    /// Whether to warn now (at most every [`WAIT_WARN_INTERVAL`]); records it if so.
    fn warn_due(&mut self, now: Instant) -> bool {
        let due = self
            .last_warn
            .map_or(true, |t| now - t >= WAIT_WARN_INTERVAL);
        if due {
            self.last_warn = Some(now);
        }
        due
    }

    /// Sleeps the current backoff, doubling it up to [`WAIT_BACKOFF_MAX`].
    async fn pause(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(WAIT_BACKOFF_MAX);
    }
}

impl Replicator {
    /// A replicator for the master on server `own`.
    pub fn new(own: ServerId, config: ReplicationConfig) -> Replicator {
        let coordinators = match &config.servers {
            ServerSource::Coordinators(addrs) => CoordinatorSet::new(addrs),
            ServerSource::Fixed(_) => CoordinatorSet::new::<&str>(&[]),
        };
        let pool = Arc::new(RpcPool::new());
        Replicator {
            own,
            selector: BackupSelector::new(own, config.seed ^ own.0),
            transports: Transports::new(
                own,
                config.transport,
                onesided::host_id(),
                Arc::clone(&pool),
            ),
            config,
            pool,
            coordinators,
            backups: HashMap::new(),
            list_fetched: None,
            list_version: 0,
            server_list: Arc::new(ServerListWatch::new()),
            shortage: Arc::default(),
            failed: HashMap::new(),
            refused: HashMap::new(),
            segments: BTreeMap::new(),
            open_bytes: BTreeMap::new(),
            spare_buffers: Vec::new(),
            segment_capacity: 0,
            closes: JoinSet::new(),
            stats: ReplicationStats::default(),
            fenced: None,
            abandoned: Vec::new(),
            changed: false,
        }
    }

    /// Replicas per segment.
    pub fn replicas(&self) -> usize {
        self.config.replicas
    }

    /// Where the master service records `ServerListChanged` pushes for this replicator
    /// (and the appender looks for a poke to run upkeep at once).
    pub fn server_list_watch(&self) -> Arc<ServerListWatch> {
        Arc::clone(&self.server_list)
    }

    /// Where the replicator publishes whether writes wait for backups.
    pub fn backup_shortage(&self) -> Arc<BackupShortage> {
        Arc::clone(&self.shortage)
    }

    /// `TabletMap::version` of the server list held (0: none fetched yet).
    pub fn server_list_version(&self) -> u64 {
        self.list_version
    }

    /// Current counts if any replica was placed, lost, closed or re-created since the
    /// last call (cheap otherwise: the write path calls it after every batch).
    pub fn take_changed_stats(&mut self) -> Option<ReplicationStats> {
        std::mem::take(&mut self.changed).then(|| self.stats())
    }

    /// Current counts.
    pub fn stats(&self) -> ReplicationStats {
        let mut stats = self.stats;
        stats.under_replicated = self
            .segments
            .values()
            .filter(|s| s.under_replicated())
            .count() as u64;
        stats
    }

    /// Returns once every replica holds `ranges` (in order). See the module doc.
    ///
    /// # Errors
    /// [`Fatal`] when the batch must never be acknowledged.
    pub async fn replicate(&mut self, ranges: &[SealedRange]) -> Result<(), Fatal> {
        if self.config.replicas == 0 {
            return Ok(());
        }
        self.drain_closes();
        if let Some(fatal) = &self.fenced {
            return Err(fatal.clone());
        }
        for range in ranges {
            self.replicate_range(range).await?;
        }
        Ok(())
    }

    async fn replicate_range(&mut self, sealed: &SealedRange) -> Result<(), Fatal> {
        let range = &sealed.range;
        let id = range.segment;
        let replicas = self.config.replicas;
        self.segment_capacity = sealed.capacity;
        self.segments
            .entry(id)
            .or_insert_with(|| SegmentReplicas::new(id, replicas, range.start));
        // Every replica must hold [0, start) before this range goes on top of it, and a
        // re-created open segment's epoch must be known to the coordinator.
        self.settle(id, None, Patience::UntilDone).await?;
        if !self.segment(id)?.writable(range.start) {
            return Err(Fatal::NotWritable(id));
        }
        let failures = self.write_all(id, range.start, &sealed.bytes).await;
        self.keep_open_bytes(sealed)?;
        let lost_any = !failures.is_empty();
        self.apply_failures(id, failures)?;
        self.segment_mut(id)?.wrote(range.end);
        if lost_any {
            // The survivors hold [0, end); lost replicas are re-created holding as much.
            self.settle(id, None, Patience::UntilDone).await?;
        }
        if range.closes {
            let slots = self.segment_mut(id)?.close();
            self.start_closes(id, slots);
            if let Some(mut buffer) = self.open_bytes.remove(&id) {
                if self.spare_buffers.len() < SPARE_BUFFERS_MAX {
                    buffer.clear();
                    self.spare_buffers.push(buffer);
                }
            }
        }
        Ok(())
    }

    /// Appends a range's bytes to its open segment's copy (see `open_bytes`).
    fn keep_open_bytes(&mut self, sealed: &SealedRange) -> Result<(), Fatal> {
        let id = sealed.range.segment;
        let capacity = sealed.capacity as usize;
        let spare = &mut self.spare_buffers;
        let buffer = self
            .open_bytes
            .entry(id)
            .or_insert_with(|| spare.pop().unwrap_or_else(|| Vec::with_capacity(capacity)));
        if buffer.len() != sealed.range.start as usize {
            // `writable` checked that the range starts where the replicas' bytes end.
            return Err(Fatal::MissingBytes(id));
        }
        buffer.extend_from_slice(&sealed.bytes);
        Ok(())
    }

    /// The first `len` bytes of `id` for a re-created replica: from `log_bytes` (a
    /// closed segment's, read from the log by the appender), else from the open
    /// segment's ranges. `None` when there are none to write.
    fn fill(
        &self,
        id: SegmentId,
        len: u32,
        log_bytes: Option<&Bytes>,
    ) -> Result<Option<Bytes>, Fatal> {
        if len == 0 {
            return Ok(None);
        }
        let len = len as usize;
        if let Some(bytes) = log_bytes {
            return bytes
                .get(..len)
                .map(|_| Some(bytes.slice(..len)))
                .ok_or(Fatal::MissingBytes(id));
        }
        self.open_bytes
            .get(&id)
            .and_then(|buffer| buffer.get(..len))
            .map(|bytes| Some(Bytes::copy_from_slice(bytes)))
            .ok_or(Fatal::MissingBytes(id))
    }

    fn segment(&self, id: SegmentId) -> Result<&Segment, Fatal> {
        self.segments.get(&id).ok_or(Fatal::MissingBytes(id))
    }

    fn segment_mut(&mut self, id: SegmentId) -> Result<&mut Segment, Fatal> {
        self.segments.get_mut(&id).ok_or(Fatal::MissingBytes(id))
    }

    /// Writes `bytes` at `offset` to every live replica of `id`; returns the failures by
    /// slot.
    async fn write_all(
        &mut self,
        id: SegmentId,
        offset: u32,
        bytes: &Bytes,
    ) -> Vec<(usize, Failure)> {
        let Some(segment) = self.segments.get(&id) else {
            return Vec::new();
        };
        let writes = segment.live().map(|(slot, replica)| {
            let (backup, handle, epoch) = (replica.backup, replica.handle, replica.epoch);
            let transport = Arc::clone(&replica.link.transport);
            let bytes = bytes.clone();
            async move {
                let result = transport.write(handle, epoch, offset, bytes).await;
                (slot, backup, result)
            }
        });
        let results = join_all(writes).await;
        let mut failures = Vec::new();
        for (slot, backup, result) in results {
            match result {
                Ok(()) => self.heard(backup),
                Err(failure) => failures.push((slot, failure)),
            }
        }
        failures
    }

    fn heard(&mut self, backup: ServerId) {
        if let Some(known) = self.backups.get_mut(&backup) {
            known.heard = Instant::now();
        }
    }

    /// Marks the failed replicas of `id` lost (and their backups failed when the failure
    /// was the backup's).
    fn apply_failures(
        &mut self,
        id: SegmentId,
        failures: Vec<(usize, Failure)>,
    ) -> Result<(), Fatal> {
        for (slot, failure) in failures {
            let Some(backup) = self
                .segments
                .get(&id)
                .and_then(|s| s.replica(slot))
                .map(|r| r.backup)
            else {
                continue;
            };
            if let Some(detail) = self.failed_beyond_replica(id, backup, failure)? {
                tracing::warn!(segment = %id, %backup, %detail, "replica lost");
                self.lose_replica(id, slot);
            }
        }
        Ok(())
    }

    /// Applies what `failure` of a replica of `id` on `backup` loses beyond that
    /// replica: `Fenced` stops the master ([`Fatal::Fenced`]); a failed backup loses
    /// every replica on it. Returns the detail of a failure of that replica alone, which
    /// each caller handles its own way.
    fn failed_beyond_replica(
        &mut self,
        id: SegmentId,
        backup: ServerId,
        failure: Failure,
    ) -> Result<Option<String>, Fatal> {
        match failure {
            Failure::Fenced => Err(Fatal::Fenced {
                segment: id,
                backup,
            }),
            Failure::Backup(detail) => {
                self.backup_failed(backup, &detail);
                Ok(None)
            }
            Failure::Replica(detail) => Ok(Some(detail)),
        }
    }

    fn lose_replica(&mut self, id: SegmentId, slot: usize) {
        self.changed = true;
        let lost = self.segments.get_mut(&id).and_then(|s| s.lose(slot));
        if let Some(lost) = lost {
            self.forget(lost);
        }
    }

    /// Books a lost replica: the selector's primary count, and its copy to free.
    fn forget(&mut self, lost: Lost) {
        if lost.primary {
            self.selector.primary_freed(lost.abandoned.backup);
        }
        self.abandon(lost.abandoned);
    }

    /// Remembers a copy to free, forgetting the oldest beyond [`ABANDONED_MAX`].
    fn abandon(&mut self, abandoned: Abandoned) {
        if self.abandoned.len() >= ABANDONED_MAX {
            let forgotten = self.abandoned.remove(0);
            tracing::warn!(backup = %forgotten.backup, segment = %forgotten.segment, "too many abandoned replicas; one is not freed");
        }
        self.abandoned.push(abandoned);
    }

    /// Marks `backup` failed: every replica on it is lost (and, if the backup was only
    /// thought dead, its copies freed later).
    fn backup_failed(&mut self, backup: ServerId, detail: &str) {
        self.changed = true;
        self.transports.forget_dead();
        if self.failed.insert(backup, Instant::now()).is_none() {
            self.stats.backups_failed += 1;
            tracing::warn!(%backup, %detail, "backup failed; re-creating its replicas elsewhere");
        }
        let lost: Vec<Lost> = self
            .segments
            .values_mut()
            .flat_map(|segment| segment.lose_backup(backup))
            .collect();
        for lost in lost {
            self.forget(lost);
        }
    }

    fn excluded(&self) -> HashSet<ServerId> {
        let now = Instant::now();
        self.failed
            .iter()
            .filter(|(_, since)| now - **since < self.config.failed_backup_exclusion)
            .map(|(id, _)| *id)
            .chain(
                self.refused
                    .iter()
                    .filter(|(_, until)| **until > now)
                    .map(|(id, _)| *id),
            )
            .collect()
    }

    /// Does what [`SegmentReplicas::step`] asks until every replica of `id` is live and
    /// current: places replicas in empty slots (holding the segment's bytes so far),
    /// bumps the survivors of a loss to the new epoch, records it at the coordinator.
    /// With [`Patience::UntilDone`] waits, refreshing the server list, while not enough
    /// backups exist, and retries while no coordinator answers; with
    /// [`Patience::OneAttempt`] returns after one placement round or one failed round.
    async fn settle(
        &mut self,
        id: SegmentId,
        log_bytes: Option<&Bytes>,
        patience: Patience,
    ) -> Result<(), Fatal> {
        let mut refused: HashSet<ServerId> = HashSet::new();
        let mut for_backups = Waiting::new();
        let mut for_record = Waiting::new();
        let mut placed_once = false;
        loop {
            let Some(segment) = self.segments.get_mut(&id) else {
                return Ok(());
            };
            match segment.step() {
                Step::Ready => return Ok(()),
                Step::Place {
                    slots,
                    fresh,
                    confirm_alive,
                } => {
                    if placed_once && patience == Patience::OneAttempt {
                        return Ok(());
                    }
                    if confirm_alive {
                        self.confirm_alive().await?;
                    }
                    self.refresh_servers(false).await;
                    let mut exclude = self.excluded();
                    exclude.extend(refused.iter().copied());
                    match self.place(id, &slots, fresh, &exclude) {
                        Ok(targets) => {
                            placed_once = true;
                            let refusals = refused.len();
                            self.create_replicas(id, targets, fresh, &mut refused, log_bytes)
                                .await?;
                            // Over once the replicas exist: a placement whose backups then
                            // refused (full) is not the end of it.
                            if refused.len() == refusals && self.shortage.set(None) {
                                tracing::info!(segment = %id, "backups are enough again: writes go on");
                            }
                        }
                        Err(shortage) => {
                            let now = Instant::now();
                            let waited = for_backups.waited(now);
                            // The first failures are often a list fetched while servers
                            // were still enlisting (a cluster starting): said only once
                            // it lasts, and once per change, not per attempt.
                            if waited >= SHORTAGE_SAID_AFTER {
                                let explained = shortage.explain();
                                if self.shortage.set(Some(shortage)) {
                                    tracing::warn!(segment = %id, ?waited, "{explained}");
                                }
                            }
                            if !refused.is_empty() && waited > WAIT_WARN_INTERVAL {
                                // Backups that refused may have room again.
                                refused.clear();
                            }
                            if patience == Patience::OneAttempt {
                                return Ok(());
                            }
                            for_backups.pause().await;
                            self.refresh_servers(true).await;
                        }
                    }
                }
                Step::Bump { epoch, survivors } => {
                    // A survivor whose bump fails is lost: the next step replaces it.
                    let failures = self.bump_epochs(id, epoch, &survivors).await;
                    self.apply_failures(id, failures)?;
                }
                Step::Record { epoch } => {
                    if let Err(error) = self.record_open_epoch(id, epoch).await? {
                        if for_record.warn_due(Instant::now()) {
                            tracing::warn!(segment = %id, %epoch, %error, "open segment epoch not recorded; writes wait for the coordinators");
                        }
                        if patience == Patience::OneAttempt {
                            return Ok(());
                        }
                        for_record.pause().await;
                    }
                }
            }
        }
    }

    /// Opens replicas of `id` on `targets` (slot, backup) at a new epoch, each holding
    /// the segment's bytes so far (and closed, if the segment is). A backup that fails
    /// is marked failed; one that refuses is left out (`refused`) for this settle and
    /// for [`REFUSED_BACKUP_EXCLUSION`].
    async fn create_replicas(
        &mut self,
        id: SegmentId,
        targets: Vec<(usize, ServerId)>,
        fresh: bool,
        refused: &mut HashSet<ServerId>,
        log_bytes: Option<&Bytes>,
    ) -> Result<(), Fatal> {
        let segment = self.segment_mut(id)?;
        let epoch = segment.take_epoch();
        let (len, closed) = (segment.len(), segment.is_closed());
        let capacity = self.segment_capacity;
        let bytes = self.fill(id, len, log_bytes)?;
        for (slot, backup) in targets {
            match self
                .create_replica(id, backup, epoch, capacity, bytes.as_ref(), closed)
                .await
            {
                Ok(replica) => {
                    if !fresh || len > 0 {
                        self.stats.replicas_recreated += 1;
                        tracing::info!(segment = %id, %backup, %epoch, bytes = len, "replica re-created");
                    }
                    self.segment_mut(id)?.placed(slot, replica);
                    self.changed = true;
                }
                Err(failure) => {
                    if slot == 0 && fresh {
                        // `select` counted a primary there; it holds none.
                        self.selector.primary_freed(backup);
                    }
                    if let Some(detail) = self.failed_beyond_replica(id, backup, failure)? {
                        tracing::warn!(segment = %id, %backup, %detail, "backup refused a replica; trying another");
                        refused.insert(backup);
                        self.refused
                            .insert(backup, Instant::now() + REFUSED_BACKUP_EXCLUSION);
                    }
                }
            }
        }
        Ok(())
    }

    /// Records `epoch` of the open segment `id` at the coordinator (`SetOpenEpoch`),
    /// one round over the coordinators: `Ok(Err(why))` when none answered.
    /// [`Fatal::DeclaredDead`] when the coordinator answers that this master was
    /// declared crashed. A fixed server list (tests, benchmarks) has no coordinator to
    /// tell: the epoch counts as recorded.
    async fn record_open_epoch(
        &mut self,
        id: SegmentId,
        epoch: Epoch,
    ) -> Result<Result<(), CoordinatorCallError>, Fatal> {
        if !matches!(self.config.servers, ServerSource::Fixed(_)) {
            let request = SetOpenEpochRequest {
                server: self.own,
                segment: id,
                epoch,
            };
            let deadline = Instant::now() + SERVER_LIST_FETCH_TIMEOUT;
            let result = self
                .coordinators
                .call_round::<SetOpenEpoch>(&self.pool, &request, deadline)
                .await;
            match result {
                Ok(()) => tracing::info!(segment = %id, %epoch, "open segment epoch recorded"),
                Err(CoordinatorCallError::Rpc(RpcError::Status {
                    status: Status::ServerCrashed,
                    ..
                })) => return Err(Fatal::DeclaredDead(self.own)),
                Err(error) => return Ok(Err(error)),
            }
        }
        self.segment_mut(id)?.recorded(epoch);
        Ok(Ok(()))
    }

    /// Returns once the server list shows this master Up; [`Fatal::DeclaredDead`] when
    /// it shows it otherwise. Waits while no coordinator answers. A master absent
    /// from a [`ServerSource::Fixed`] list (tests) counts as Up.
    async fn confirm_alive(&mut self) -> Result<(), Fatal> {
        let mut waiting = Waiting::new();
        loop {
            match self.fetch_servers().await {
                Some((_, servers)) => {
                    let own = servers.iter().find(|s| s.id == self.own);
                    return match own {
                        Some(server) if server.status != ServerStatus::Up => {
                            Err(Fatal::DeclaredDead(self.own))
                        }
                        None if matches!(self.config.servers, ServerSource::Coordinators(_)) => {
                            Err(Fatal::DeclaredDead(self.own))
                        }
                        _ => Ok(()),
                    };
                }
                None => {
                    tracing::warn!("no coordinator answers; the open segment waits for it");
                    waiting.pause().await;
                }
            }
        }
    }

    /// Backups for the empty `slots` of `id`: a fresh segment gets all R from `select`
    /// (primary by refinement); otherwise each empty slot gets a replacement.
    fn place(
        &mut self,
        id: SegmentId,
        slots: &[usize],
        fresh: bool,
        exclude: &HashSet<ServerId>,
    ) -> Result<Vec<(usize, ServerId)>, NotEnoughBackups> {
        if fresh {
            let chosen = self.selector.select(self.config.replicas, exclude)?;
            return Ok(chosen.into_iter().enumerate().collect());
        }
        let mut others: Vec<ServerId> = self
            .segments
            .get(&id)
            .map(|s| s.backups().collect())
            .unwrap_or_default();
        let mut targets = Vec::new();
        for &slot in slots {
            let backup = self
                .selector
                .select_replacement(&others, slot == 0, exclude)?;
            others.push(backup);
            targets.push((slot, backup));
        }
        Ok(targets)
    }

    /// Opens a replica of `id` on `backup` at `epoch`, writes `bytes` (from offset 0) and,
    /// for a closed segment, closes it.
    /// A failure after the open may have reached the backup leaves a frame there: it is
    /// abandoned (freed later, bounded by `epoch`, which no later copy reuses).
    async fn create_replica(
        &mut self,
        id: SegmentId,
        backup: ServerId,
        epoch: Epoch,
        capacity: u32,
        bytes: Option<&Bytes>,
        closed: bool,
    ) -> Result<Replica<Link>, Failure> {
        let addr = self
            .backups
            .get(&backup)
            .map(|b| b.addr.clone())
            .ok_or_else(|| Failure::Replica(format!("{backup} left the server list")))?;
        let result = self
            .open_and_fill(id, backup, addr, epoch, capacity, bytes, closed)
            .await;
        if result.is_err() {
            self.abandon(Abandoned {
                backup,
                segment: id,
                epoch_max: epoch,
            });
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn open_and_fill(
        &mut self,
        id: SegmentId,
        backup: ServerId,
        addr: String,
        epoch: Epoch,
        capacity: u32,
        bytes: Option<&Bytes>,
        closed: bool,
    ) -> Result<Replica<Link>, Failure> {
        let request = OpenReplicaRequest {
            master: self.own,
            segment: id,
            epoch,
            capacity,
        };
        let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
        let reply = self
            .pool
            .call::<OpenReplica>(&addr, &request, deadline)
            .await
            .map_err(|e| classify_rpc(&e))?;
        self.heard(backup);
        let transport = self.transports.open(&addr, &reply).await?;
        tracing::debug!(
            segment = %id, %backup, %epoch, handle = %reply.handle, transport = %transport.kind(),
            "replica opened"
        );
        let mut replica = Replica::new(backup, reply.handle, epoch, Link { addr, transport });
        if let Some(bytes) = bytes {
            replica
                .link
                .transport
                .write(replica.handle, epoch, 0, bytes.clone())
                .await?;
        }
        if closed {
            let length = bytes.map_or(0, |b| b.len() as u32);
            close_replica(&self.pool, &replica, length)
                .await
                .map_err(|e| classify_rpc(&e))?;
            replica.closed = true;
        }
        Ok(replica)
    }

    /// Moves the replicas of `id` in `survivors` to `epoch` (`BumpEpoch`); returns the
    /// failures by slot.
    async fn bump_epochs(
        &mut self,
        id: SegmentId,
        epoch: Epoch,
        survivors: &[usize],
    ) -> Vec<(usize, Failure)> {
        let Some(segment) = self.segments.get_mut(&id) else {
            return Vec::new();
        };
        let mut calls = Vec::new();
        for &slot in survivors {
            segment.bumping(slot, epoch);
            let Some(replica) = segment.replica(slot) else {
                continue;
            };
            let request = BumpEpochRequest {
                handle: replica.handle,
                epoch: replica.epoch,
                new_epoch: epoch,
            };
            let (pool, addr) = (Arc::clone(&self.pool), replica.link.addr.clone());
            calls.push(async move {
                let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
                let result = pool.call::<BumpEpoch>(&addr, &request, deadline).await;
                (slot, result)
            });
        }
        let results = join_all(calls).await;
        let mut failures = Vec::new();
        for (slot, result) in results {
            match result {
                Ok(()) => {
                    if let Some(segment) = self.segments.get_mut(&id) {
                        segment.bumped(slot, epoch);
                    }
                }
                Err(error) => failures.push((slot, classify_rpc(&error))),
            }
        }
        failures
    }

    /// Sends `CloseReplica` to the replicas of the closed segment `id` in `slots`, in
    /// the background.
    fn start_closes(&mut self, id: SegmentId, slots: Vec<usize>) {
        self.changed = true;
        let Some(segment) = self.segments.get(&id) else {
            return;
        };
        let length = segment.len();
        for slot in slots {
            let Some(replica) = segment.replica(slot) else {
                continue;
            };
            let (pool, replica) = (Arc::clone(&self.pool), replica.clone());
            self.closes.spawn(async move {
                let result = close_replica(&pool, &replica, length).await;
                CloseDone {
                    segment: id,
                    slot,
                    handle: replica.handle,
                    result,
                }
            });
        }
    }

    /// Takes the outcomes of finished background closes.
    fn drain_closes(&mut self) {
        while let Some(done) = self.closes.try_join_next() {
            let Ok(done) = done else { continue };
            self.close_finished(done);
        }
    }

    fn close_finished(&mut self, done: CloseDone) {
        self.changed = true;
        let Some(backup) = self
            .segments
            .get_mut(&done.segment)
            .and_then(|s| s.close_answered(done.slot, done.handle, done.result.is_ok()))
        else {
            return;
        };
        let Err(error) = done.result else {
            self.heard(backup);
            return;
        };
        // A fence is reported by the next `replicate` or `tick`.
        match self.failed_beyond_replica(done.segment, backup, classify_rpc(&error)) {
            Err(fatal) => self.fenced = Some(fatal),
            Ok(None) => {}
            Ok(Some(detail)) => {
                tracing::warn!(segment = %done.segment, %backup, %detail, "close failed; replica lost");
                self.refused
                    .insert(backup, Instant::now() + REFUSED_BACKUP_EXCLUSION);
                self.lose_replica(done.segment, done.slot);
            }
        }
    }

    /// Background upkeep between batches: finished closes, the server list, probes of
    /// quiet backups, frees of abandoned copies, and the open segments' lost replicas
    /// and unrecorded epochs. Returns a closed segment that lost replicas, if any: the
    /// caller reads its bytes from the log and hands them to
    /// [`Replicator::recreate`] (one segment per tick, so that writes interleave with
    /// re-replication).
    ///
    /// # Errors
    /// [`Fatal`] as for [`Replicator::replicate`].
    pub async fn tick(&mut self) -> Result<Option<SegmentId>, Fatal> {
        if self.config.replicas == 0 {
            return Ok(None);
        }
        self.drain_closes();
        if let Some(fatal) = &self.fenced {
            return Err(fatal.clone());
        }
        self.refresh_servers(false).await;
        self.probe_quiet_backups().await;
        self.free_abandoned().await;
        let now = Instant::now();
        let exclusion = self.config.failed_backup_exclusion;
        self.failed.retain(|_, since| now - *since < exclusion);
        self.refused.retain(|_, until| *until > now);
        // The open segments' lost replicas and unrecorded epochs: without a write they
        // would wait for one (and the next write waits for them).
        let open_needing: Vec<SegmentId> = self
            .segments
            .iter()
            .filter(|(_, s)| !s.is_closed() && (s.missing() > 0 || s.unrecorded()))
            .map(|(id, _)| *id)
            .collect();
        for id in open_needing {
            self.settle(id, None, Patience::OneAttempt).await?;
        }
        Ok(self
            .segments
            .iter()
            .find(|(_, s)| s.is_closed() && s.missing() > 0)
            .map(|(id, _)| *id))
    }

    /// One placement round for the lost replicas of the closed segment `id` (named by
    /// [`Replicator::tick`]), filled with `bytes`, the segment as the log holds it.
    ///
    /// # Errors
    /// [`Fatal`] as for [`Replicator::replicate`].
    pub async fn recreate(&mut self, id: SegmentId, bytes: Bytes) -> Result<(), Fatal> {
        self.settle(id, Some(&bytes), Patience::OneAttempt).await
    }

    /// The log no longer holds `segments` (the cleaner freed them, after a digest
    /// without them reached every replica of the head): forgets them — no more
    /// re-replication — and frees every copy of them on its backup at the next
    /// [`Replicator::tick`] (`FreeReplica` at any epoch).
    pub fn free_segments(&mut self, segments: &[SegmentId]) {
        for id in segments {
            self.open_bytes.remove(id);
            let Some(segment) = self.segments.remove(id) else {
                continue;
            };
            self.changed = true;
            let held: Vec<(usize, ServerId)> = segment
                .live()
                .map(|(slot, replica)| (slot, replica.backup))
                .collect();
            for (slot, backup) in held {
                if slot == 0 {
                    self.selector.primary_freed(backup);
                }
                self.abandon(Abandoned {
                    backup,
                    segment: *id,
                    epoch_max: Epoch::MAX,
                });
            }
        }
    }

    /// Whether the replicator has upkeep to do soon (lost replicas or closes in flight).
    pub fn busy(&self) -> bool {
        !self.closes.is_empty() || self.segments.values().any(|s| s.missing() > 0)
    }

    /// Frees abandoned copies on backups that are Up and not failed, of segments whole
    /// again (every replica live, on disk or at a recorded epoch); forgets those
    /// whose backup left the server list (its replicas went with it).
    async fn free_abandoned(&mut self) {
        if self.abandoned.is_empty() {
            return;
        }
        let backups = &self.backups;
        self.abandoned.retain(|a| backups.contains_key(&a.backup));
        let (ready, waiting): (Vec<Abandoned>, Vec<Abandoned>) =
            std::mem::take(&mut self.abandoned)
                .into_iter()
                .partition(|a| {
                    // A copy is kept until its segment is whole again: it may be the
                    // last complete one outside this master (`SegmentReplicas::whole`).
                    !self.failed.contains_key(&a.backup)
                        && self.segments.get(&a.segment).map_or(true, Segment::whole)
                });
        self.abandoned = waiting;
        let own = self.own;
        let frees = ready.into_iter().filter_map(|a| {
            let addr = self.backups.get(&a.backup)?.addr.clone();
            let pool = Arc::clone(&self.pool);
            Some(async move {
                let request = FreeReplicaRequest {
                    master: own,
                    segment: a.segment,
                    epoch_max: a.epoch_max,
                };
                let deadline = Instant::now() + PROBE_TIMEOUT;
                let result = pool.call::<FreeReplica>(&addr, &request, deadline).await;
                (a, result)
            })
        });
        for (a, result) in join_all(frees).await {
            match result {
                Ok(_) => {}
                // Unreachable: the backup counts as failed (so upkeep does not wait on
                // it every tick); the free is tried again once its exclusion ends.
                Err(error) if error.is_transport() => {
                    self.backup_failed(a.backup, &error.to_string());
                    self.abandoned.push(a);
                }
                Err(error) => {
                    tracing::debug!(backup = %a.backup, segment = %a.segment, %error, "free of an abandoned replica refused");
                }
            }
        }
    }

    /// Probes backups holding replicas of this master that were quiet for
    /// [`PROBE_INTERVAL`].
    async fn probe_quiet_backups(&mut self) {
        let now = Instant::now();
        let holding: HashSet<ServerId> = self.segments.values().flat_map(|s| s.backups()).collect();
        let quiet: Vec<(ServerId, String)> = holding
            .into_iter()
            .filter_map(|id| {
                let known = self.backups.get(&id)?;
                (now - known.heard >= PROBE_INTERVAL).then(|| (id, known.addr.clone()))
            })
            .collect();
        let probes = quiet.into_iter().map(|(id, addr)| {
            let pool = Arc::clone(&self.pool);
            async move {
                // `Ping` is answered from memory by the storage server's connection
                // task; `ListReplicas` would make the backup scan our open frames.
                let deadline = Instant::now() + PROBE_TIMEOUT;
                let result = pool.call::<Ping>(&addr, &PingRequest {}, deadline).await;
                (id, result)
            }
        });
        for (id, result) in join_all(probes).await {
            match result {
                Ok(_) => self.heard(id),
                Err(error) if error.is_transport() => self.backup_failed(id, &error.to_string()),
                Err(_) => self.heard(id),
            }
        }
    }
    /// The server list from its source with its version; `None` when no coordinator
    /// served it within one round ([`SERVER_LIST_FETCH_TIMEOUT`]).
    async fn fetch_servers(&self) -> Option<(u64, Vec<ServerInfo>)> {
        match &self.config.servers {
            // Read the version first: a push after it is then pulled again, not lost.
            ServerSource::Fixed(list) => Some((self.server_list.pushed(), list.lock().clone())),
            ServerSource::Coordinators(_) => {
                let deadline = Instant::now() + SERVER_LIST_FETCH_TIMEOUT;
                match self
                    .coordinators
                    .call_round::<GetTabletMap>(&self.pool, &TabletMapRequest {}, deadline)
                    .await
                {
                    Ok(map) => Some((map.version, map.servers)),
                    Err(error) => {
                        tracing::debug!(%error, "server list unavailable");
                        None
                    }
                }
            }
        }
    }

    /// Re-reads the server list when it is older than [`SERVER_LIST_REFRESH`], when a
    /// push announced a newer version than the one held, or always with `force`. A
    /// backup that is no longer Up is failed.
    async fn refresh_servers(&mut self, force: bool) {
        let stale = self
            .list_fetched
            .map_or(true, |at| at.elapsed() >= SERVER_LIST_REFRESH);
        let announced = self.server_list.is_newer_than(self.list_version);
        if !force && !stale && !announced {
            return;
        }
        let fetched = self.fetch_servers().await;
        self.list_fetched = Some(Instant::now());
        let Some((version, servers)) = fetched else {
            return;
        };
        if announced {
            tracing::debug!(
                held = self.list_version,
                pushed = self.server_list.pushed(),
                fetched = version,
                "server list pulled after a push"
            );
        }
        self.list_version = version;
        let infos: Vec<BackupInfo> = servers.iter().filter_map(BackupInfo::from_server).collect();
        let now = Instant::now();
        let mut backups = HashMap::new();
        for server in &servers {
            if server.status == ServerStatus::Up && server.services.backup && server.id != self.own
            {
                let heard = self.backups.get(&server.id).map_or(now, |b| b.heard);
                backups.insert(
                    server.id,
                    KnownBackup {
                        addr: server.addr.clone(),
                        heard,
                    },
                );
            }
        }
        let gone: Vec<ServerId> = self
            .segments
            .values()
            .flat_map(|s| s.backups())
            .filter(|id| !backups.contains_key(id))
            .collect();
        self.backups = backups;
        self.selector.update_backups(&infos);
        for id in gone {
            self.backup_failed(id, "no longer Up in the server list");
        }
    }
}

async fn close_replica(
    pool: &RpcPool,
    replica: &Replica<Link>,
    length: u32,
) -> Result<(), RpcError> {
    let request = CloseReplicaRequest {
        handle: replica.handle,
        epoch: replica.epoch,
        length,
    };
    // A close writes the replica to disk: allow for a slow disk.
    let deadline = Instant::now() + REPLICA_IO_TIMEOUT * 5;
    pool.call::<CloseReplica>(&replica.link.addr, &request, deadline)
        .await
        .map(|_| ())
}
