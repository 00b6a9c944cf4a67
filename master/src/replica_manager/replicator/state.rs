//! The `Replicator` itself: how it is configured ([`ReplicationConfig`],
//! [`ServerSource`]) and timed, what it knows of backups, segments and the open
//! segments' bytes, its construction, its counters, and how it fails ([`Fatal`]).
//! The other files of `replicator` each add one part of the protocol to it.

use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::{FrameHandle, SegmentId, ServerId};
use rampart_common::onesided::{self, TransportKind};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::tablet::ServerInfo;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::replica_manager::backup_selector::{BackupSelector, BackupShortage};
pub use crate::replica_manager::replica_failures::ABANDONED_MAX;
use crate::replica_manager::replica_failures::{Fenced, ReplicaFailures};
use crate::replica_manager::segment_replicas::SegmentReplicas;
use crate::replica_manager::server_list_watch::ServerListWatch;
use crate::replica_manager::transport::{ReplicaTransport, Transports};

/// Buffers of closed segments kept for the next open ones (`Replicator::open_bytes`):
/// the head and its predecessor are the only segments ever open at once.
pub(super) const SPARE_BUFFERS_MAX: usize = 2;

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

/// Shortest step of the pauses while the write path waits for backups or coordinators.
pub(super) const WAIT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// Longest step of those pauses.
pub(super) const WAIT_BACKOFF_MAX: Duration = Duration::from_millis(200);

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
    /// The transport to use for every replica; `None` picks per backup (the `replicator`
    /// module doc).
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

impl From<Fenced> for Fatal {
    fn from(fenced: Fenced) -> Fatal {
        Fatal::Fenced {
            segment: fenced.segment,
            backup: fenced.backup,
        }
    }
}

/// How the driver reaches one replica: its backup's address and the transport chosen
/// when it was opened.
#[derive(Clone, Debug)]
pub(super) struct Link {
    pub(super) addr: String,
    pub(super) transport: Arc<dyn ReplicaTransport>,
}

/// The replicas of one segment, reached through [`Link`]s.
pub(super) type Segment = SegmentReplicas<Link>;

/// The result of a background close.
pub(super) struct CloseDone {
    pub(super) segment: SegmentId,
    pub(super) slot: usize,
    pub(super) handle: FrameHandle,
    pub(super) result: Result<(), RpcError>,
}

/// A backup as the replicator knows it.
#[derive(Debug, Clone)]
pub(super) struct KnownBackup {
    pub(super) addr: String,
    /// Last successful exchange with it.
    pub(super) heard: Instant,
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

/// Keeps R replicas of each segment; see the `replicator` module doc.
pub struct Replicator {
    pub(super) own: ServerId,
    pub(super) config: ReplicationConfig,
    pub(super) pool: Arc<RpcPool>,
    pub(super) transports: Transports,
    pub(super) selector: BackupSelector,
    /// The coordinators of a [`ServerSource::Coordinators`] source, and their leader
    /// once found (empty for a fixed list).
    pub(super) coordinators: CoordinatorSet,
    /// Up backups from the last server list, by id.
    pub(super) backups: HashMap<ServerId, KnownBackup>,
    /// When the list was last fetched (or a fetch last failed).
    pub(super) list_fetched: Option<Instant>,
    /// `TabletMap::version` of the server list held (0: none yet). For a fixed list, the
    /// version pushed when it was last read.
    pub(super) list_version: u64,
    /// The backups being drained that the list held leaves out (`server_list_watch`):
    /// only these are reported on, so a report that the log needs nothing there comes
    /// after this master stopped choosing them.
    pub(super) evacuated: Vec<ServerId>,
    /// Versions announced by `ServerListChanged` pushes; a newer one than `list_version`
    /// makes the next refresh pull at once.
    pub(super) server_list: Arc<ServerListWatch>,
    /// Whether writes wait for backups now (published for status reports).
    pub(super) shortage: Arc<BackupShortage>,
    /// Backups marked failed (excluded for `failed_backup_exclusion`) or that refused
    /// a replica (full frames or disk: excluded for [`REFUSED_BACKUP_EXCLUSION`]), and
    /// the copies given up on, to free (at most [`ABANDONED_MAX`]): what each failure
    /// loses is this core's to decide.
    pub(super) failures: ReplicaFailures<Instant>,
    /// Every live segment this replicator has seen.
    pub(super) segments: BTreeMap<SegmentId, Segment>,
    /// The bytes of each open segment replicated so far, copied range by range (a
    /// memcpy of each batch's bytes) into a buffer recycled from segment to segment:
    /// what a replica re-created while the segment is open is filled with. Keeping the
    /// ranges' own `Bytes` instead would hold thousands of small allocations per
    /// segment. Invariant: each buffer holds exactly its segment's first `len` bytes.
    /// Given back once the footer is written: a closed segment's lost replicas are
    /// refilled from bytes the appender reads from the log when `tick` names the
    /// segment ([`Replicator::recreate`]).
    pub(super) open_bytes: BTreeMap<SegmentId, Vec<u8>>,
    /// Buffers of segments that closed, for the next ones (at most
    /// [`SPARE_BUFFERS_MAX`]: only the head and its predecessor are ever open).
    pub(super) spare_buffers: Vec<Vec<u8>>,
    /// Bytes every segment of this log (hence every frame) holds, from the ranges.
    pub(super) segment_capacity: u32,
    pub(super) closes: JoinSet<CloseDone>,
    pub(super) stats: ReplicationStats,
    /// Set when a background close was refused as fenced: the next call to
    /// `replicate` or `tick` fails with it.
    pub(super) fenced: Option<Fatal>,
    /// A replica was placed, lost, closed or re-created since `take_changed_stats`.
    pub(super) changed: bool,
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
        let pool = Arc::new(RpcPool::new());
        let failures =
            ReplicaFailures::new(config.failed_backup_exclusion, REFUSED_BACKUP_EXCLUSION);
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
            evacuated: Vec::new(),
            server_list: Arc::new(ServerListWatch::new()),
            shortage: Arc::default(),
            failures,
            segments: BTreeMap::new(),
            open_bytes: BTreeMap::new(),
            spare_buffers: Vec::new(),
            segment_capacity: 0,
            closes: JoinSet::new(),
            stats: ReplicationStats::default(),
            fenced: None,
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
}
