//! `Replicator`: keeps R replicas of every segment of this master's log on backups
//! (DESIGN.md §5), over the transports of `rampart_common::onesided`.
//!
//! The appender owns it and calls [`Replicator::replicate`] with every batch's sealed
//! byte ranges, between sealing the batch and publishing it: it returns only when every
//! one of the R replicas of each touched segment holds the bytes (transport completion),
//! so nothing is acknowledged with fewer than R copies. Between batches the appender
//! calls [`Replicator::tick`], which finishes background closes, watches the backups that
//! hold this master's replicas, and re-creates replicas that were lost.
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
//! # Transports
//! Chosen per replica from the backup's `OpenReplica` reply: with no transport forced,
//! `shm` when the backup runs on this host (its frame file is mapped once per backup),
//! else `tcp` (its soft-NIC), else `rpc`. A forced transport that a backup cannot offer
//! makes the replica go elsewhere. `rdma` is used only when forced: one RC connection
//! per backup (`RdmaLink`, set up by the `RdmaConnect` RPC), writing into the frame's
//! slot of the backup's registered frame file.
//!
//! # Lost replicas
//! A replica is *lost* when a write, open, close or probe to its backup fails at the
//! transport level (the backup is then marked failed and every replica on it is lost),
//! or when its backup refuses it (`UnknownFrame`, `StaleEpoch`, `BackupFull` on close:
//! only that replica). A lost replica of the **open** segment is re-created before the
//! write path goes on: a replacement backup is opened at a new epoch e' > e, given every
//! byte the segment holds so far, then the surviving replicas are moved to e'
//! (`BumpEpoch`), e' is recorded at the coordinator (`SetOpenEpoch`), and only then does
//! the write continue — so the replica left behind at e (on a backup that may only have
//! looked dead, or written to disk when its backup stopped) is recognisably stale: a
//! recovery does not count it (`coordinator::recovery_plan`). Until e' is recorded no
//! byte goes past what every copy held when the loss was found, so the copies at e still
//! hold every acknowledged write and may still be counted; while no coordinator answers,
//! writes wait. Every placement
//! attempt takes a new epoch (`Segment::next_epoch`), so no two copies of a segment ever
//! share one. A lost replica of a **closed** segment is re-created by
//! [`Replicator::tick`], one segment per tick and one attempt each, so writes keep
//! flowing meanwhile. Replicas given up on (lost, or on a backup only thought dead) are
//! freed later by `tick` with `FreeReplica { epoch_max }`, which spares any newer copy. A backup that holds this master's replicas and was not heard from
//! for [`PROBE_INTERVAL`] is probed (`Ping`, answered by the storage server it runs in);
//! one that the server list no longer shows Up is failed at once.
//!
//! A backup answers `Fenced` for a recovered master's frames even after the recovery
//! freed them; an `shm` copy that finds its frame's slot taken asks the backup why (an
//! empty `WriteReplica`), so a zombie master stops rather than re-creating the replica.
//!
//! `shm` writes cannot notice a dead backup (the frame file outlives its process), so the
//! replicator holds a pidfd of each `shm` backup and checks after every copy that the
//! process is alive; a dead one fails the write.
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
//!   refreshing the server list, and warns every [`WAIT_WARN_INTERVAL`]. Clients see
//!   their deadline pass; the batch is acknowledged once the backups exist.
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
//!   without it two segments below the head is stale, whatever the epochs say.
//! * Liveness of `shm` backups by pidfd (above): DESIGN.md assumed a write to a dead
//!   backup fails, which holds for tcp, rpc and rdma but not for shared memory.

use bytes::Bytes;
use futures::future::join_all;
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::onesided::nic::NicClient;
use rampart_common::onesided::shm::ShmMapping;
use rampart_common::onesided::{self, FrameWriteError, TransportKind};
use rampart_common::protocol::backup::{
    BumpEpoch, BumpEpochRequest, CloseReplica, CloseReplicaRequest, FreeReplica,
    FreeReplicaRequest, OpenReplica, OpenReplicaReply, OpenReplicaRequest, WriteReplica,
    WriteReplicaRequest,
};
use rampart_common::protocol::coordinator::{
    GetTabletMap, SetOpenEpoch, SetOpenEpochRequest, TabletMapRequest,
};
use rampart_common::protocol::master::{Ping, PingRequest};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::status::Status;
use rampart_common::tablet::{ServerInfo, ServerStatus};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::backup_selector::{BackupInfo, BackupSelector};
use super::rdma_link::{RdmaFrame, RdmaLink};
use super::server_list_watch::ServerListWatch;
use crate::segmented_log::SegmentRange;

/// Deadline of one replication RPC or soft-NIC write.
pub const REPLICA_IO_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Where the replicator reads the bytes of this master's segments.
pub trait SegmentSource: Send + Sync {
    /// Bytes every segment (hence every frame) holds.
    fn segment_capacity(&self) -> u32;
    /// A copy of bytes `[start, end)` of `segment`, or `None` if it is not live or
    /// shorter.
    fn segment_range(&self, segment: SegmentId, start: u32, end: u32) -> Option<Bytes>;
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
}

/// A backup's same-host frame file, mapped.
struct ShmBackup {
    map: ShmMapping,
    /// Readable once the backup process has exited; `None` when pidfds are unsupported
    /// (then `kill(pid, 0)` is used).
    pidfd: Option<OwnedFd>,
    pid: i32,
}

impl ShmBackup {
    fn open(path: &str, pid: u32) -> std::io::Result<ShmBackup> {
        let map = ShmMapping::open(std::path::Path::new(path))?;
        let pid = i32::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = if fd >= 0 {
            // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
            Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
        } else {
            None
        };
        let backup = ShmBackup { map, pidfd, pid };
        if !backup.alive() {
            return Err(std::io::Error::other("backup process is not running"));
        }
        Ok(backup)
    }

    /// Whether the backup process still runs.
    fn alive(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut poll = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                loop {
                    // SAFETY: one valid pollfd, zero timeout.
                    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
                    if ready >= 0 {
                        // Readable (1) once the process has exited.
                        return ready == 0;
                    }
                    if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                        // Cannot tell: count it dead (a spurious re-replication is
                        // safe; acknowledging into a dead backup's file is not).
                        return false;
                    }
                }
            }
            // SAFETY: signal 0 only checks that the process exists.
            None => (unsafe { libc::kill(self.pid, 0) }) == 0,
        }
    }
}

impl std::fmt::Debug for ShmBackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmBackup").field("pid", &self.pid).finish()
    }
}

/// How bytes reach one replica.
#[derive(Clone, Debug)]
enum Route {
    Shm {
        backup: Arc<ShmBackup>,
        slot_offset: u64,
        slot_capacity: u32,
    },
    Tcp {
        nic: String,
    },
    Rpc,
    Rdma {
        link: Arc<RdmaLink>,
        slot_offset: u64,
        slot_capacity: u32,
    },
}

impl Route {
    fn kind(&self) -> TransportKind {
        match self {
            Route::Shm { .. } => TransportKind::Shm,
            Route::Tcp { .. } => TransportKind::Tcp,
            Route::Rpc => TransportKind::Rpc,
            Route::Rdma { .. } => TransportKind::Rdma,
        }
    }
}

/// One replica of a segment.
#[derive(Clone, Debug)]
struct Replica {
    backup: ServerId,
    addr: String,
    handle: u64,
    route: Route,
    /// The epoch the backup holds this replica at.
    epoch: u64,
    /// `CloseReplica` answered Ok: the replica is on the backup's disk.
    closed: bool,
    /// A close is in flight.
    closing: bool,
}

/// The replicas of one segment.
#[derive(Debug)]
struct Segment {
    /// The epoch every live replica is at (once `restore` finished).
    epoch: u64,
    /// The epoch the next placement attempt uses. Every attempt takes a new one, so a
    /// replica given up on at epoch e is never confused with a later one: an abandoned
    /// copy's free (bounded by e) cannot touch it, and a backup never sees the same
    /// (segment, epoch) opened twice for two different copies.
    /// Invariant: > every epoch used for this segment.
    next_epoch: u64,
    /// The epoch the coordinator knows this segment's replicas at (`SetOpenEpoch`).
    /// Invariants: 1. ≤ `epoch`. 2. While the segment is open and this is below `epoch`,
    /// no byte is written to its replicas past what they held when they were re-created:
    /// until it is recorded, a recovery must still count the copies left behind at the
    /// older epoch, which therefore may lack nothing acknowledged.
    recorded_epoch: u64,
    /// Bytes every live replica holds.
    len: u32,
    /// The footer is among those bytes.
    closed: bool,
    /// R slots; slot 0 holds the primary. `None`: lost (or not yet placed).
    replicas: Vec<Option<Replica>>,
}

impl Segment {
    fn missing(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_none()).count()
    }

    fn backups(&self) -> Vec<ServerId> {
        self.replicas.iter().flatten().map(|r| r.backup).collect()
    }
}

/// How long [`Replicator::restore`] keeps trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Patience {
    /// Until every replica exists (the write path: nothing is acknowledged before).
    UntilDone,
    /// One placement round (upkeep between batches: the next tick tries again).
    OneAttempt,
}

/// What a failed replica operation means.
enum Failure {
    /// The backup is unreachable or dead: every replica on it is lost.
    Backup(String),
    /// Only this replica is unusable (refused, gone, full).
    Replica(String),
    /// Fenced: never acknowledge.
    Fenced,
}

fn classify_rpc(error: &RpcError) -> Failure {
    match error {
        RpcError::Status {
            status: Status::Fenced,
            ..
        } => Failure::Fenced,
        error if error.is_transport() => Failure::Backup(error.to_string()),
        error => Failure::Replica(error.to_string()),
    }
}

fn classify_write(error: FrameWriteError) -> Failure {
    match error {
        FrameWriteError::Fenced | FrameWriteError::Refused(Status::Fenced) => Failure::Fenced,
        FrameWriteError::Transport(detail) => Failure::Backup(detail),
        other => Failure::Replica(other.to_string()),
    }
}

/// The result of a background close.
struct CloseDone {
    segment: SegmentId,
    slot: usize,
    handle: u64,
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
    host: String,
    pool: Arc<RpcPool>,
    nic: Arc<NicClient>,
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
    /// Backups marked failed, and when.
    failed: HashMap<ServerId, Instant>,
    /// Backups that refused a replica (full frames or disk), and until when they are
    /// not chosen.
    refused: HashMap<ServerId, Instant>,
    shm: HashMap<(String, u32), Arc<ShmBackup>>,
    /// One RDMA connection per backup address (`--replication rdma`).
    rdma: HashMap<String, Arc<RdmaLink>>,
    /// Every live segment this replicator has seen.
    segments: BTreeMap<SegmentId, Segment>,
    closes: JoinSet<CloseDone>,
    stats: ReplicationStats,
    /// Set when a background close was refused as fenced: the next call to
    /// `replicate` or `tick` fails with it.
    fenced: Option<Fatal>,
    /// Replicas this master stopped using that may still exist on a live backup; freed
    /// (epoch-bounded) by `tick`. Invariant: at most [`ABANDONED_MAX`] entries.
    abandoned: Vec<Abandoned>,
    /// A replica was placed, lost, closed or re-created since `take_changed_stats`.
    changed: bool,
}

/// A replica given up on, to be freed on its backup.
#[derive(Debug, Clone)]
struct Abandoned {
    backup: ServerId,
    addr: String,
    segment: SegmentId,
    /// The replica's epoch: the free spares newer copies (a replacement placed on the
    /// same backup later).
    epoch: u64,
}

/// Most abandoned replicas remembered for freeing; older ones are forgotten (their
/// frames stay until the backup restarts or recovery frees the master's replicas).
pub const ABANDONED_MAX: usize = 4096;

fn abandon(abandoned: &mut Vec<Abandoned>, segment: SegmentId, replica: &Replica) {
    if abandoned.len() >= ABANDONED_MAX {
        let forgotten = abandoned.remove(0);
        tracing::warn!(backup = %forgotten.backup, segment = %forgotten.segment, "too many abandoned replicas; one is not freed");
    }
    abandoned.push(Abandoned {
        backup: replica.backup,
        addr: replica.addr.clone(),
        segment,
        epoch: replica.epoch,
    });
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("own", &self.own)
            .field("replicas", &self.config.replicas)
            .field("segments", &self.segments.len())
            .finish()
    }
}

impl Replicator {
    /// A replicator for the master on server `own`.
    pub fn new(own: ServerId, config: ReplicationConfig) -> Replicator {
        let coordinators = match &config.servers {
            ServerSource::Coordinators(addrs) => CoordinatorSet::new(addrs),
            ServerSource::Fixed(_) => CoordinatorSet::new::<&str>(&[]),
        };
        Replicator {
            own,
            selector: BackupSelector::new(own, config.seed ^ own.0),
            config,
            host: onesided::host_id(),
            pool: Arc::new(RpcPool::new()),
            nic: Arc::new(NicClient::new()),
            coordinators,
            backups: HashMap::new(),
            list_fetched: None,
            list_version: 0,
            server_list: Arc::new(ServerListWatch::new()),
            failed: HashMap::new(),
            refused: HashMap::new(),
            shm: HashMap::new(),
            rdma: HashMap::new(),
            segments: BTreeMap::new(),
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
        stats.under_replicated = self.under_replicated() as u64;
        stats
    }

    fn under_replicated(&self) -> usize {
        self.segments
            .values()
            .filter(|s| {
                s.missing() > 0
                    || s.replicas
                        .iter()
                        .flatten()
                        .any(|r| s.closed && !r.closed && !r.closing)
            })
            .count()
    }

    /// Returns once every replica holds `ranges` (in order). See the module doc.
    ///
    /// # Errors
    /// [`Fatal`] when the batch must never be acknowledged.
    pub async fn replicate(
        &mut self,
        ranges: &[SegmentRange],
        source: &dyn SegmentSource,
    ) -> Result<(), Fatal> {
        if self.config.replicas == 0 {
            return Ok(());
        }
        self.drain_closes();
        if let Some(fatal) = &self.fenced {
            return Err(fatal.clone());
        }
        for range in ranges {
            self.replicate_range(range, source).await?;
        }
        Ok(())
    }

    async fn replicate_range(
        &mut self,
        range: &SegmentRange,
        source: &dyn SegmentSource,
    ) -> Result<(), Fatal> {
        let id = range.segment;
        if !self.segments.contains_key(&id) {
            self.segments.insert(
                id,
                Segment {
                    epoch: 1,
                    next_epoch: 1,
                    recorded_epoch: 1,
                    len: range.start,
                    closed: false,
                    replicas: vec![None; self.config.replicas],
                },
            );
        }
        // Every replica must hold [0, start) before this range goes on top of it, and a
        // re-created open segment's epoch must be known to the coordinator.
        self.restore(id, range.start, source, Patience::UntilDone)
            .await?;
        self.record_open_epoch(id, Patience::UntilDone).await?;
        let bytes = source
            .segment_range(id, range.start, range.end)
            .ok_or(Fatal::MissingBytes(id))?;
        let failures = self.write_all(id, range.start, &bytes).await;
        if !failures.is_empty() {
            self.apply_failures(id, failures)?;
            // The survivors hold [0, end); lost replicas are re-created holding as much.
            self.restore(id, range.end, source, Patience::UntilDone)
                .await?;
            self.record_open_epoch(id, Patience::UntilDone).await?;
        }
        let segment = self.segment_mut(id)?;
        segment.len = range.end;
        if range.closes {
            segment.closed = true;
            self.start_closes(id);
        }
        Ok(())
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
        let writes = segment.replicas.iter().enumerate().filter_map(|(slot, r)| {
            let replica = r.clone()?;
            let (pool, nic, bytes) = (Arc::clone(&self.pool), Arc::clone(&self.nic), bytes.clone());
            Some(async move {
                let result = write_replica(&pool, &nic, &replica, offset, bytes).await;
                (slot, replica.backup, result)
            })
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
            let Some(replica) = self
                .segments
                .get(&id)
                .and_then(|s| s.replicas.get(slot).cloned().flatten())
            else {
                continue;
            };
            match failure {
                Failure::Fenced => {
                    return Err(Fatal::Fenced {
                        segment: id,
                        backup: replica.backup,
                    })
                }
                Failure::Backup(detail) => self.backup_failed(replica.backup, &detail),
                Failure::Replica(detail) => {
                    tracing::warn!(segment = %id, backup = %replica.backup, %detail, "replica lost");
                    self.lose_replica(id, slot);
                }
            }
        }
        Ok(())
    }

    fn lose_replica(&mut self, id: SegmentId, slot: usize) {
        self.changed = true;
        let Some(segment) = self.segments.get_mut(&id) else {
            return;
        };
        if let Some(Some(replica)) = segment.replicas.get(slot) {
            if slot == 0 {
                self.selector.primary_freed(replica.backup);
            }
            abandon(&mut self.abandoned, id, replica);
        }
        if let Some(r) = segment.replicas.get_mut(slot) {
            *r = None;
        }
    }

    /// Marks `backup` failed: every replica on it is lost.
    fn backup_failed(&mut self, backup: ServerId, detail: &str) {
        self.changed = true;
        // Unmap the frame files of backups that exited (each pins its file's memory),
        // and drop broken RDMA connections.
        self.shm.retain(|_, shm| shm.alive());
        self.rdma.retain(|_, link| !link.is_broken());
        if self.failed.insert(backup, Instant::now()).is_none() {
            self.stats.backups_failed += 1;
            tracing::warn!(%backup, %detail, "backup failed; re-creating its replicas elsewhere");
        }
        for (id, segment) in self.segments.iter_mut() {
            for (slot, r) in segment.replicas.iter_mut().enumerate() {
                if let Some(replica) = r.as_ref().filter(|r| r.backup == backup) {
                    if slot == 0 {
                        self.selector.primary_freed(backup);
                    }
                    // If the backup was only thought dead, its copy must not keep a
                    // frame there forever.
                    abandon(&mut self.abandoned, *id, replica);
                    *r = None;
                }
            }
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

    /// Fills every empty slot of `id` with a new replica holding `[0, len)`; for an
    /// open segment that had live replicas, then moves the survivors to the new epoch.
    /// Waits (refreshing the server list) while not enough backups exist.
    async fn restore(
        &mut self,
        id: SegmentId,
        len: u32,
        source: &dyn SegmentSource,
        patience: Patience,
    ) -> Result<(), Fatal> {
        let mut refused: HashSet<ServerId> = HashSet::new();
        let mut waiting_since: Option<Instant> = None;
        let mut last_warn: Option<Instant> = None;
        let mut backoff = Duration::from_millis(5);
        loop {
            let Some(segment) = self.segments.get(&id) else {
                return Ok(());
            };
            if segment.missing() == 0 {
                return Ok(());
            }
            let fresh = segment.replicas.iter().all(Option::is_none);
            let had_survivors = !fresh;
            if fresh && len > 0 && !segment.closed {
                // Every replica of the open segment is gone, so no survivor's fence
                // can tell this master that it is being recovered (the bump below is
                // what normally would). Before its bytes go to new backups, the
                // coordinator must still list it Up.
                self.confirm_alive().await?;
            }
            self.refresh_servers(false).await;
            let mut exclude = self.excluded();
            exclude.extend(refused.iter().copied());
            let placement = self.place(id, fresh, &exclude);
            let targets = match placement {
                Ok(targets) => targets,
                Err(detail) => {
                    let now = Instant::now();
                    let since = *waiting_since.get_or_insert(now);
                    // The first failure is often a list fetched while servers were
                    // still enlisting: refresh before warning.
                    let warn_due = now - since >= WAIT_BACKOFF_MAX
                        && last_warn.map_or(true, |t| now - t >= WAIT_WARN_INTERVAL);
                    if warn_due {
                        tracing::warn!(segment = %id, waited = ?(now - since), %detail, "writes wait for backups");
                        last_warn = Some(now);
                    }
                    if !refused.is_empty() && now - since > WAIT_WARN_INTERVAL {
                        // Backups that refused may have room again.
                        refused.clear();
                    }
                    if patience == Patience::OneAttempt {
                        return Ok(());
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(WAIT_BACKOFF_MAX);
                    self.refresh_servers(true).await;
                    continue;
                }
            };
            let new_epoch = match self.segments.get_mut(&id) {
                Some(segment) => {
                    segment.next_epoch += 1;
                    segment.next_epoch - 1
                }
                None => return Ok(()),
            };
            let capacity = source.segment_capacity();
            let bytes = if len > 0 {
                Some(
                    source
                        .segment_range(id, 0, len)
                        .ok_or(Fatal::MissingBytes(id))?,
                )
            } else {
                None
            };
            let closed = self.segments.get(&id).is_some_and(|s| s.closed);
            for (slot, backup) in targets {
                match self
                    .create_replica(id, backup, new_epoch, capacity, bytes.as_ref(), closed)
                    .await
                {
                    Ok(replica) => {
                        if had_survivors || len > 0 {
                            self.stats.replicas_recreated += 1;
                            tracing::info!(segment = %id, %backup, epoch = new_epoch, bytes = len, "replica re-created");
                        }
                        if let Some(segment) = self.segments.get_mut(&id) {
                            segment.replicas[slot] = Some(replica);
                        }
                        self.changed = true;
                    }
                    Err(failure) => {
                        if slot == 0 && fresh {
                            // `select` counted a primary there; it holds none.
                            self.selector.primary_freed(backup);
                        }
                        match failure {
                            Failure::Fenced => {
                                return Err(Fatal::Fenced {
                                    segment: id,
                                    backup,
                                })
                            }
                            Failure::Backup(detail) => self.backup_failed(backup, &detail),
                            Failure::Replica(detail) => {
                                tracing::warn!(segment = %id, %backup, %detail, "backup refused a replica; trying another");
                                refused.insert(backup);
                                self.refused
                                    .insert(backup, Instant::now() + REFUSED_BACKUP_EXCLUSION);
                            }
                        }
                    }
                }
            }
            let Some(segment) = self.segments.get(&id) else {
                return Ok(());
            };
            if segment.missing() > 0 {
                if patience == Patience::OneAttempt {
                    return Ok(());
                }
                continue;
            }
            if new_epoch != segment.epoch {
                // Every slot is filled: the new replicas at `new_epoch`, the survivors
                // still at the old one. Move the survivors (open segments only: a closed
                // replica is final and complete, whatever its epoch).
                if !segment.closed {
                    let failures = self.bump_epochs(id, new_epoch).await;
                    if !failures.is_empty() {
                        self.apply_failures(id, failures)?;
                        continue;
                    }
                }
                if let Some(segment) = self.segments.get_mut(&id) {
                    segment.epoch = new_epoch;
                    if len == 0 || segment.closed {
                        // No copy left behind holds anything the new ones lack (an
                        // empty one), or each is complete (closed): nothing to record.
                        segment.recorded_epoch = new_epoch;
                    }
                }
            }
            return Ok(());
        }
    }

    /// Records at the coordinator the epoch of the open segment `id` if its replicas were
    /// re-created since the last record (`SetOpenEpoch`; see `Segment::recorded_epoch`).
    /// With [`Patience::UntilDone`] waits, retrying, while no coordinator answers: the
    /// write path goes no further until it is recorded. [`Fatal::DeclaredDead`] when the
    /// coordinator answers that this master was declared crashed. A fixed server list
    /// (tests, benchmarks) has no coordinator to tell: the epoch counts as recorded.
    async fn record_open_epoch(&mut self, id: SegmentId, patience: Patience) -> Result<(), Fatal> {
        let mut backoff = Duration::from_millis(5);
        let mut last_warn: Option<Instant> = None;
        loop {
            let Some(segment) = self.segments.get_mut(&id) else {
                return Ok(());
            };
            if segment.closed || segment.recorded_epoch >= segment.epoch {
                return Ok(());
            }
            let epoch = segment.epoch;
            if matches!(self.config.servers, ServerSource::Fixed(_)) {
                segment.recorded_epoch = epoch;
                return Ok(());
            }
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
                Ok(()) => {
                    if let Some(segment) = self.segments.get_mut(&id) {
                        segment.recorded_epoch = segment.recorded_epoch.max(epoch);
                    }
                    tracing::info!(segment = %id, epoch, "open segment epoch recorded");
                    return Ok(());
                }
                Err(CoordinatorCallError::Rpc(RpcError::Status {
                    status: Status::ServerCrashed,
                    ..
                })) => return Err(Fatal::DeclaredDead(self.own)),
                Err(error) => {
                    let now = Instant::now();
                    if last_warn.map_or(true, |t| now - t >= WAIT_WARN_INTERVAL) {
                        tracing::warn!(segment = %id, epoch, %error, "open segment epoch not recorded; writes wait for the coordinators");
                        last_warn = Some(now);
                    }
                    if patience == Patience::OneAttempt {
                        return Ok(());
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(WAIT_BACKOFF_MAX);
                }
            }
        }
    }

    /// Returns once the server list shows this master Up; [`Fatal::DeclaredDead`] when
    /// it shows it otherwise. Waits while no coordinator answers. A master absent
    /// from a [`ServerSource::Fixed`] list (tests) counts as Up.
    async fn confirm_alive(&mut self) -> Result<(), Fatal> {
        let mut backoff = Duration::from_millis(5);
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
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(WAIT_BACKOFF_MAX);
                }
            }
        }
    }

    /// Backups for the empty slots of `id`: a fresh segment gets all R from `select`
    /// (primary by refinement); otherwise each empty slot gets a replacement.
    fn place(
        &mut self,
        id: SegmentId,
        fresh: bool,
        exclude: &HashSet<ServerId>,
    ) -> Result<Vec<(usize, ServerId)>, String> {
        let Some(segment) = self.segments.get(&id) else {
            return Ok(Vec::new());
        };
        if fresh {
            let chosen = self
                .selector
                .select(self.config.replicas, exclude)
                .map_err(|e| e.to_string())?;
            return Ok(chosen.into_iter().enumerate().collect());
        }
        let mut others = segment.backups();
        let empty: Vec<usize> = segment
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(slot, _)| slot)
            .collect();
        let mut targets = Vec::new();
        for slot in empty {
            let backup = self
                .selector
                .select_replacement(&others, slot == 0, exclude)
                .map_err(|e| e.to_string())?;
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
        epoch: u64,
        capacity: u32,
        bytes: Option<&Bytes>,
        closed: bool,
    ) -> Result<Replica, Failure> {
        let addr = self
            .backups
            .get(&backup)
            .map(|b| b.addr.clone())
            .ok_or_else(|| Failure::Replica(format!("{backup} left the server list")))?;
        let result = self
            .open_and_fill(id, backup, &addr, epoch, capacity, bytes, closed)
            .await;
        if result.is_err() {
            if self.abandoned.len() >= ABANDONED_MAX {
                self.abandoned.remove(0);
            }
            self.abandoned.push(Abandoned {
                backup,
                addr,
                segment: id,
                epoch,
            });
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn open_and_fill(
        &mut self,
        id: SegmentId,
        backup: ServerId,
        addr: &str,
        epoch: u64,
        capacity: u32,
        bytes: Option<&Bytes>,
        closed: bool,
    ) -> Result<Replica, Failure> {
        let request = OpenReplicaRequest {
            master: self.own,
            segment: id,
            epoch,
            capacity,
        };
        let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
        let reply = self
            .pool
            .call::<OpenReplica>(addr, &request, deadline)
            .await
            .map_err(|e| classify_rpc(&e))?;
        self.heard(backup);
        let link = if self.config.transport == Some(TransportKind::Rdma) {
            Some(self.rdma_link(addr).await?)
        } else {
            None
        };
        let route = self.route(&reply, link).map_err(Failure::Replica)?;
        tracing::debug!(
            segment = %id, %backup, epoch, handle = reply.handle, transport = %route.kind(),
            "replica opened"
        );
        let mut replica = Replica {
            backup,
            addr: addr.to_string(),
            handle: reply.handle,
            route,
            epoch,
            closed: false,
            closing: false,
        };
        if let Some(bytes) = bytes {
            write_replica(&self.pool, &self.nic, &replica, 0, bytes.clone()).await?;
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

    /// The RDMA connection to the backup at `addr`, made on first use (and again after
    /// it broke).
    async fn rdma_link(&mut self, addr: &str) -> Result<Arc<RdmaLink>, Failure> {
        if let Some(link) = self.rdma.get(addr).filter(|l| !l.is_broken()) {
            return Ok(Arc::clone(link));
        }
        let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
        let link = RdmaLink::connect(&self.pool, addr, self.own, deadline)
            .await
            .map_err(|error| {
                if error.contains("Fenced") || error.contains("fenced") {
                    Failure::Fenced
                } else {
                    Failure::Replica(format!("RDMA connection failed: {error}"))
                }
            })?;
        let link = Arc::new(link);
        self.rdma.insert(addr.to_string(), Arc::clone(&link));
        Ok(link)
    }

    /// How bytes will reach the frame the backup opened.
    fn route(
        &mut self,
        reply: &OpenReplicaReply,
        link: Option<Arc<RdmaLink>>,
    ) -> Result<Route, String> {
        if let Some(link) = link {
            let shm = reply
                .shm
                .as_ref()
                .ok_or("the backup reports no frame slot to write by RDMA")?;
            return Ok(Route::Rdma {
                link,
                slot_offset: shm.slot_offset,
                slot_capacity: shm.slot_capacity,
            });
        }
        let local_shm = reply.shm.as_ref().filter(|shm| shm.host == self.host);
        let want = self.config.transport;
        if matches!(want, None | Some(TransportKind::Shm)) {
            if let Some(shm) = local_shm {
                let key = (shm.path.clone(), shm.pid);
                let backup = match self.shm.get(&key) {
                    Some(backup) if backup.alive() => Some(Arc::clone(backup)),
                    _ => match ShmBackup::open(&shm.path, shm.pid) {
                        Ok(backup) => {
                            let backup = Arc::new(backup);
                            self.shm.insert(key, Arc::clone(&backup));
                            Some(backup)
                        }
                        Err(error) if want.is_some() => {
                            return Err(format!("cannot map frame file {}: {error}", shm.path))
                        }
                        Err(error) => {
                            tracing::debug!(path = %shm.path, %error, "frame file not mappable; not using shm");
                            None
                        }
                    },
                };
                if let Some(backup) = backup {
                    return Ok(Route::Shm {
                        backup,
                        slot_offset: shm.slot_offset,
                        slot_capacity: shm.slot_capacity,
                    });
                }
            } else if want.is_some() {
                return Err("the backup offers no shared-memory frames on this host".into());
            }
        }
        if matches!(want, None | Some(TransportKind::Tcp)) {
            if let Some(nic) = &reply.nic {
                return Ok(Route::Tcp { nic: nic.clone() });
            }
            if want.is_some() {
                return Err("the backup offers no soft-NIC".into());
            }
        }
        match want {
            None | Some(TransportKind::Rpc) => Ok(Route::Rpc),
            Some(other) => Err(format!(
                "transport {other} is not available to the replica manager"
            )),
        }
    }

    async fn bump_epochs(&mut self, id: SegmentId, new_epoch: u64) -> Vec<(usize, Failure)> {
        let Some(segment) = self.segments.get(&id) else {
            return Vec::new();
        };
        // Only the survivors: replicas created for this epoch are at it already.
        let calls = segment.replicas.iter().enumerate().filter_map(|(slot, r)| {
            let replica = r.clone().filter(|r| r.epoch != new_epoch)?;
            let pool = Arc::clone(&self.pool);
            Some(async move {
                let request = BumpEpochRequest {
                    handle: replica.handle,
                    epoch: replica.epoch,
                    new_epoch,
                };
                let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
                let result = pool
                    .call::<BumpEpoch>(&replica.addr, &request, deadline)
                    .await;
                (slot, result)
            })
        });
        let results = join_all(calls).await;
        let mut failures = Vec::new();
        for (slot, result) in results {
            match result {
                Ok(()) => {
                    if let Some(Some(replica)) = self
                        .segments
                        .get_mut(&id)
                        .and_then(|s| s.replicas.get_mut(slot))
                    {
                        replica.epoch = new_epoch;
                    }
                }
                Err(error) => failures.push((slot, classify_rpc(&error))),
            }
        }
        failures
    }

    /// Sends `CloseReplica` to every replica of the closed segment `id`, in the
    /// background.
    fn start_closes(&mut self, id: SegmentId) {
        self.changed = true;
        let Some(segment) = self.segments.get_mut(&id) else {
            return;
        };
        let length = segment.len;
        for (slot, r) in segment.replicas.iter_mut().enumerate() {
            let Some(replica) = r else { continue };
            if replica.closed || replica.closing {
                continue;
            }
            replica.closing = true;
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
        let Some(replica) = self
            .segments
            .get_mut(&done.segment)
            .and_then(|s| s.replicas.get_mut(done.slot))
            .and_then(Option::as_mut)
            .filter(|r| r.handle == done.handle)
        else {
            return;
        };
        replica.closing = false;
        match done.result {
            Ok(()) => {
                replica.closed = true;
                let backup = replica.backup;
                self.heard(backup);
            }
            Err(error) => {
                let backup = replica.backup;
                match classify_rpc(&error) {
                    Failure::Backup(detail) => self.backup_failed(backup, &detail),
                    Failure::Replica(detail) => {
                        tracing::warn!(segment = %done.segment, %backup, %detail, "close failed; replica lost");
                        self.refused
                            .insert(backup, Instant::now() + REFUSED_BACKUP_EXCLUSION);
                        self.lose_replica(done.segment, done.slot);
                    }
                    Failure::Fenced => {
                        self.fenced = Some(Fatal::Fenced {
                            segment: done.segment,
                            backup,
                        });
                    }
                }
            }
        }
    }

    /// Background upkeep between batches: finished closes, the server list, probes of
    /// quiet backups, and re-creation of one closed segment's lost replicas.
    ///
    /// # Errors
    /// [`Fatal`] as for [`Replicator::replicate`].
    pub async fn tick(&mut self, source: &dyn SegmentSource) -> Result<(), Fatal> {
        if self.config.replicas == 0 {
            return Ok(());
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
        // One closed segment per tick, so that writes interleave with re-replication.
        let closed_needing = self
            .segments
            .iter()
            .find(|(_, s)| s.closed && s.missing() > 0)
            .map(|(id, s)| (*id, s.len));
        if let Some((id, len)) = closed_needing {
            self.restore(id, len, source, Patience::OneAttempt).await?;
        }
        // The open segment's lost replicas: without a write they would wait for one.
        let open_needing: Vec<(SegmentId, u32)> = self
            .segments
            .iter()
            .filter(|(_, s)| !s.closed && s.missing() > 0)
            .map(|(id, s)| (*id, s.len))
            .collect();
        for (id, len) in open_needing {
            self.restore(id, len, source, Patience::OneAttempt).await?;
        }
        // Epochs of re-created open segments not yet recorded (no coordinator answered):
        // the next write waits for them, upkeep tries meanwhile.
        let unrecorded: Vec<SegmentId> = self
            .segments
            .iter()
            .filter(|(_, s)| !s.closed && s.missing() == 0 && s.recorded_epoch < s.epoch)
            .map(|(id, _)| *id)
            .collect();
        for id in unrecorded {
            self.record_open_epoch(id, Patience::OneAttempt).await?;
        }
        Ok(())
    }

    /// Whether the replicator has upkeep to do soon (lost replicas or closes in flight).
    pub fn busy(&self) -> bool {
        !self.closes.is_empty() || self.segments.values().any(|s| s.missing() > 0)
    }

    /// Frees abandoned replicas on backups that are Up and not failed; forgets those
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
                .partition(|a| !self.failed.contains_key(&a.backup));
        self.abandoned = waiting;
        let own = self.own;
        let frees = ready.into_iter().map(|a| {
            let pool = Arc::clone(&self.pool);
            async move {
                let request = FreeReplicaRequest {
                    master: own,
                    segment: a.segment,
                    epoch_max: a.epoch,
                };
                let deadline = Instant::now() + PROBE_TIMEOUT;
                let result = pool.call::<FreeReplica>(&a.addr, &request, deadline).await;
                (a, result)
            }
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

async fn write_replica(
    pool: &RpcPool,
    nic: &NicClient,
    replica: &Replica,
    offset: u32,
    bytes: Bytes,
) -> Result<(), Failure> {
    match &replica.route {
        Route::Shm {
            backup,
            slot_offset,
            slot_capacity,
        } => {
            let written = backup.map.write(
                *slot_offset,
                *slot_capacity,
                replica.handle,
                u64::from(offset),
                &bytes,
            );
            match written {
                Ok(()) => {}
                // The slot changed hands: the frame was closed, freed or replaced — or
                // freed when this master's recovery ended, which must stop it. Only the
                // backup knows which: ask it (no bytes move).
                Err(FrameWriteError::FrameGone) => return Err(ask_why_gone(pool, replica).await),
                Err(error) => return Err(classify_write(error)),
            }
            if !backup.alive() {
                return Err(Failure::Backup(format!(
                    "backup process {} exited",
                    backup.pid
                )));
            }
            Ok(())
        }
        Route::Tcp { nic: addr } => nic
            .write(
                addr,
                replica.handle,
                replica.epoch,
                u64::from(offset),
                &bytes,
                REPLICA_IO_TIMEOUT,
            )
            .await
            .map_err(classify_write),
        Route::Rdma {
            link,
            slot_offset,
            slot_capacity,
        } => {
            let frame = RdmaFrame {
                handle: replica.handle,
                epoch: replica.epoch,
                slot_offset: *slot_offset,
                slot_capacity: *slot_capacity,
            };
            link.write(pool, &frame, u64::from(offset), bytes)
                .await
                .map_err(classify_write)
        }
        Route::Rpc => {
            let request = WriteReplicaRequest {
                handle: replica.handle,
                epoch: replica.epoch,
                offset,
                bytes,
            };
            let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
            pool.call::<WriteReplica>(&replica.addr, &request, deadline)
                .await
                .map_err(|e| classify_rpc(&e))
        }
    }
}

/// Why the frame of `replica` left its slot, as its backup answers an empty
/// `WriteReplica`: `Fenced` (a recovered master's frame) stops the master; anything else
/// loses the replica.
async fn ask_why_gone(pool: &RpcPool, replica: &Replica) -> Failure {
    let request = WriteReplicaRequest {
        handle: replica.handle,
        epoch: replica.epoch,
        offset: 0,
        bytes: Bytes::new(),
    };
    let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
    match pool
        .call::<WriteReplica>(&replica.addr, &request, deadline)
        .await
    {
        Ok(()) => Failure::Replica(format!(
            "frame {} left its shared-memory slot",
            replica.handle
        )),
        Err(error) => classify_rpc(&error),
    }
}

async fn close_replica(pool: &RpcPool, replica: &Replica, length: u32) -> Result<(), RpcError> {
    let request = CloseReplicaRequest {
        handle: replica.handle,
        epoch: replica.epoch,
        length,
    };
    // A close writes the replica to disk: allow for a slow disk.
    let deadline = Instant::now() + REPLICA_IO_TIMEOUT * 5;
    pool.call::<CloseReplica>(&replica.addr, &request, deadline)
        .await
        .map(|_| ())
}
