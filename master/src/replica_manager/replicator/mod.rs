//! `Replicator`: keeps R replicas of every segment of this master's log on backups
//! (DESIGN.md §5). It is the async driver of pure cores: `SegmentReplicas`
//! (`segment_replicas`), which decides for each segment what to place, bump, record,
//! close and free; `Settling` (`settling`), which turns that into the next effect of a
//! settle and says when to stop trying; `ReplicaFailures` (`replica_failures`), which
//! decides what a failed call loses, which backups are left out a while and when a
//! copy given up on is freed; and `BackupSelector`, which chooses backups. The
//! simulation (`rampart-sim`) drives the same cores. It reaches the frames through the
//! transports of `transport` (one `ReplicaTransport` per kind).
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
//!
//! # Files
//! * `state` — the configuration ([`ReplicationConfig`], [`ServerSource`]), the timing
//!   constants, [`Fatal`], and the [`Replicator`] with its construction and counters.
//! * `write` — the write path: [`Replicator::replicate`] and the open segments' bytes.
//! * `settle` — the loop carrying out what `Settling::next` asks, and its waits.
//! * `place` — `Effect::Place`: choosing backups, opening and filling replicas.
//! * `epochs` — `Effect::Bump` and `Effect::Record`, and the check that this master is
//!   Up (`Effect::ConfirmAlive`).
//! * `close` — closing the replicas of a segment whose footer was written.
//! * `backups` — the server list, the backups heard from, and carrying out what
//!   `ReplicaFailures` decides of the failures of replicas and backups (counts, logs,
//!   the selector's primaries).
//! * `upkeep` — [`Replicator::tick`], [`Replicator::recreate`] and
//!   [`Replicator::free_segments`]: probes, frees and re-replication between batches.
//!
//! [`SealedRange`]: crate::segmented_log::SealedRange
//! [`BackupSelector`]: super::backup_selector::BackupSelector
//! [`ServerListWatch`]: super::ServerListWatch
//! [`NotEnoughBackups::explain`]: super::backup_selector::NotEnoughBackups::explain
//! [`BackupShortage`]: super::backup_selector::BackupShortage

mod backups;
mod close;
mod epochs;
mod place;
mod settle;
mod state;
mod upkeep;
mod write;

pub use super::transport::REPLICA_IO_TIMEOUT;
pub use state::{
    Fatal, ReplicationConfig, ReplicationStats, Replicator, ServerSource, ABANDONED_MAX,
    FAILED_BACKUP_EXCLUSION, PROBE_INTERVAL, PROBE_TIMEOUT, REFUSED_BACKUP_EXCLUSION,
    SERVER_LIST_FETCH_TIMEOUT, SERVER_LIST_REFRESH, SHORTAGE_SAID_AFTER, WAIT_WARN_INTERVAL,
};
