//! `MasterService`: the master's RPC handlers.
//!
//! Reads take the store lock only long enough to look up the object and copy its
//! value into the reply frame. Write-type requests go through the [`Appender`], which
//! replies once the write is durable and visible. Every request is validated before it
//! touches the store: an oversized key or value, an unknown opcode or a malformed
//! payload gets its status and the master keeps serving.
//!
//! Ownership changes (`TakeTablets`, `DropTablets`, `SyncTablets`, and
//! `FinishRecovery`, which catches up with the tablets before it forgets what a
//! recovery left unowned) must name this server
//! (`WrongServer` otherwise: the coordinator meant a server that used to listen at this
//! address) and carry the coordinator's number of the change; a missed change makes the
//! master pull its whole set first ([`TabletSync`]). These and the recovery RPCs
//! (`Recover`, `AbandonRecovery`, `FinishRecovery`), the rare control requests the
//! coordinator sends, reach their typed handlers through a table (`CONTROL`, a
//! [`Router`]); reads and writes, the hot path, keep their hand-written arms.
//!
//! `ServerListChanged` (the coordinator leader announcing a new server-list version) is
//! answered at once: the version goes to the replicator's
//! [`ServerListWatch`], which pulls the list at once if it holds an older one.
//!
//! # Lease
//! Client reads and writes (Read, MultiRead, Enumerate, Write, Remove, Increment,
//! MultiWrite, MultiRemove: [`needs_lease`]) are served only while the master's
//! [`Lease`] is valid; otherwise they are answered `Retry` with
//! [`LEASE_LAPSED_DETAIL`]. Control requests (Ping, ServerListChanged, tablet changes,
//! recovery) are served regardless: the coordinator sends them and knows whom it
//! trusts. The check sits at the two entry points every request passes through, not in
//! the handlers: `handle_immediately` (both `Service::handle_now` and `handle` go
//! through it) checks reads *after* the lookup, so a value is returned only if the
//! lease still held once it was read; `handle_request` checks everything else before it
//! reaches `handle_waiting`. Writes are checked on arrival only: one admitted with a
//! lease and replicated after it lapsed is covered by backup fencing (see
//! `crate::lease`). A master built without coordinators (`MasterService::new`) has
//! [`Lease::always`].

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::config::MasterConfig;
use rampart_common::failpoints;
use rampart_common::ids::{ServerId, TabletEpoch, Version};
use rampart_common::limits::{MULTI_OPS_MAX, MULTI_READ_REPLY_BYTES_MAX};
use rampart_common::protocol::master::{
    self as proto, EnumerateReply, EnumerateRequest, EnumeratedObject, IncrementReply,
    IncrementRequest, MultiReadReply, MultiReadRequest, MultiRemoveRequest, MultiWriteReply,
    PingReply, ReadReply, ReadRequest, RemoveRequest, ServerListVersion, TabletsRequest,
    WriteReply, WriteRequest,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Router, Rpc, Service, WireMessage};
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use std::sync::{Arc, LazyLock};

use crate::appender::{Appender, AppenderStatus, TabletChange};
use crate::client_leases::ClientLeaseChecker;
use crate::lease::{Lease, LEASE_LAPSED_DETAIL};
use crate::move_in::MoveIn;
use crate::object_store::{EnumeratePage, Object, ObjectStore, OpOutcome, WriteOp};
use crate::profiler::PartitionLimits;
use crate::recovery_master::{RecoveryConfig, RecoveryMaster, RecoveryTotals};
use crate::replica_manager::backup_selector::{BackupShortage, NotEnoughBackups};
use crate::replica_manager::{
    ReplicationConfig, ReplicationStats, Replicator, ServerListWatch, ServerSource,
};
use crate::segmented_log::SegmentPool;
use crate::tablet_sync::{SyncError, TabletSync};
use crate::tablets::EpochStep;
use crate::version_reserver::VersionReserver;

/// The master service of one storage server.
#[derive(Debug)]
pub struct MasterService {
    id: ServerId,
    /// The store. A `parking_lot` mutex, not an async one: nothing awaits while holding
    /// it, and every critical section is a lookup or a batch of appends.
    store: Arc<Mutex<ObjectStore>>,
    appender: Appender,
    status: Arc<AppenderStatus>,
    /// Where `ServerListChanged` pushes go; the replicator (on the appender's task)
    /// reads them.
    server_list: Arc<ServerListWatch>,
    /// Whether writes wait for backups now (the replicator publishes it).
    shortage: Arc<BackupShortage>,
    /// Replicas kept of each segment (R).
    replicas: usize,
    /// Whether client reads and writes may be served now ([`Lease::always`] unless
    /// [`with_lease`](Self::with_lease) gave one). Its revocation ends the master
    /// ([`failed`](Self::failed)).
    lease: Arc<Lease>,
    /// Serves `Recover`, `AbandonRecovery` and `FinishRecovery` (replays into `store`
    /// through `appender`).
    recovery: RecoveryMaster,
    /// Serves `MoveIn` and `EndMove` (takes ranges into `store` through `appender`).
    move_in: Arc<MoveIn>,
    /// The last `Ping` answer: its store figures stand while the store is busy.
    last_ping: Mutex<PingReply>,
    /// Pulls this master's tablets from the committed map when it missed a change.
    tablet_sync: Arc<TabletSync>,
    /// Reserves versions at the coordinators; `None` without coordinators (the store's
    /// ceiling is then not enforced).
    version_reserver: Option<Arc<VersionReserver>>,
    /// Checks client leases at the coordinators; `None` without coordinators (every
    /// client then counts as holding one).
    client_leases: Option<Arc<ClientLeaseChecker>>,
}

/// How a master stands: [`MasterService::stats`].
#[derive(Clone, Debug, PartialEq)]
pub struct MasterStats {
    /// Live objects.
    pub objects: u64,
    /// Log memory held by segments.
    pub log_bytes_used: u64,
    /// Log memory in all (`--memory`).
    pub log_bytes_max: u64,
    /// Bytes of live entries in the log.
    pub log_bytes_live: u64,
    /// Completion records kept for clients' retries.
    pub completion_records: u64,
    /// Replicas kept of each segment (R).
    pub replicas: usize,
    /// Segments with fewer than R replicas now.
    pub segments_under_replicated: u64,
    /// Replicas re-created after a backup was lost.
    pub replicas_recreated: u64,
    /// Backups found failed.
    pub backups_failed: u64,
    /// Why writes wait for backups, when they do.
    pub backup_shortage: Option<NotEnoughBackups>,
    /// Segments the cleaner freed.
    pub segments_cleaned: u64,
    /// Bytes the cleaner copied into survivor segments.
    pub cleaner_bytes_relocated: u64,
    /// Cleaner passes.
    pub cleaner_passes: u64,
    /// How long the coordinator lease still runs (`None`: not enforced).
    pub lease_remaining: Option<std::time::Duration>,
    /// What this master replayed as a recovery master.
    pub recoveries: RecoveryTotals,
}

impl MasterService {
    /// A master with an empty log; must run inside a tokio runtime (it spawns the
    /// appender).
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn new(id: ServerId, config: MasterConfig) -> MasterService {
        MasterService::with_replication(id, config, ReplicationConfig::none())
    }

    /// A master with an empty log whose every batch is replicated as `replication`
    /// says before it is acknowledged; must run inside a tokio runtime.
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn with_replication(
        id: ServerId,
        config: MasterConfig,
        replication: ReplicationConfig,
    ) -> MasterService {
        MasterService::with_partitions(id, config, replication, PartitionLimits::default())
    }

    /// Like [`with_replication`](Self::with_replication), with the limits its will cuts
    /// partitions to (`rampart server --partition-mb --partition-records`).
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn with_partitions(
        id: ServerId,
        config: MasterConfig,
        replication: ReplicationConfig,
        limits: PartitionLimits,
    ) -> MasterService {
        let pool = SegmentPool::for_config(&config);
        MasterService::with_pool(id, config, replication, limits, pool)
    }

    /// Like [`with_partitions`](Self::with_partitions), the log in `pool`'s buffers:
    /// a server touches its log memory ([`SegmentPool::for_config`]) before it enlists,
    /// as that takes a while and it must answer pings from its enlistment on.
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn with_pool(
        id: ServerId,
        config: MasterConfig,
        replication: ReplicationConfig,
        limits: PartitionLimits,
        pool: SegmentPool,
    ) -> MasterService {
        let store = Arc::new(Mutex::new(ObjectStore::with_pool(id, config, limits, pool)));
        let status = Arc::new(AppenderStatus::default());
        let replicator = Replicator::new(id, replication.clone());
        let server_list = replicator.server_list_watch();
        let shortage = replicator.backup_shortage();
        let appender =
            Appender::spawn_replicated(Arc::clone(&store), replicator, Arc::clone(&status));
        let recovery = RecoveryMaster::new(
            id,
            Arc::clone(&store),
            appender.clone(),
            RecoveryConfig::default(),
        );
        let move_in = Arc::new(MoveIn::new(Arc::clone(&store), appender.clone()));
        let coordinators = match &replication.servers {
            ServerSource::Coordinators(addrs) => Some(addrs.as_slice()),
            ServerSource::Fixed(_) => None,
        };
        let tablet_sync = Arc::new(TabletSync::new(
            id,
            Arc::clone(&store),
            appender.clone(),
            coordinators,
        ));
        let version_reserver = coordinators.map(|addrs| {
            store.lock().enforce_version_ceiling();
            Arc::new(VersionReserver::new(
                id,
                Arc::clone(&store),
                Arc::clone(&status),
                addrs,
            ))
        });
        let client_leases = coordinators
            .map(|addrs| Arc::new(ClientLeaseChecker::new(id, Arc::clone(&store), addrs)));
        MasterService {
            id,
            recovery,
            move_in,
            last_ping: Mutex::new(PingReply::default()),
            tablet_sync,
            version_reserver,
            client_leases,
            store,
            appender,
            status,
            server_list,
            shortage,
            replicas: replication.replicas,
            lease: Arc::new(Lease::always()),
        }
    }

    /// How this master stands now: memory, replication, cleaner, lease, recoveries (for
    /// metrics and status reports; takes the store lock briefly).
    pub fn stats(&self) -> MasterStats {
        let (objects, (log_bytes_used, log_bytes_max), log_bytes_live, completion_records) = {
            let store = self.store.lock();
            (
                store.object_count(),
                store.log_bytes(),
                store.log().usage().live_bytes,
                store.completion_records() as u64,
            )
        };
        let replication = *self.status.replication.lock();
        let cleaner = *self.status.cleaner.lock();
        MasterStats {
            objects,
            log_bytes_used,
            log_bytes_max,
            log_bytes_live,
            completion_records,
            replicas: self.replicas,
            segments_under_replicated: replication.under_replicated,
            replicas_recreated: replication.replicas_recreated,
            backups_failed: replication.backups_failed,
            backup_shortage: self.shortage.current(),
            segments_cleaned: cleaner.totals.segments_cleaned,
            cleaner_bytes_relocated: cleaner.totals.bytes_relocated,
            cleaner_passes: cleaner.passes,
            lease_remaining: self.lease.remaining(),
            recoveries: self.recovery.totals(),
        }
    }

    /// The same master, serving client reads and writes only while `lease` is valid,
    /// and failing when it is revoked. Give it before the master serves requests.
    pub fn with_lease(mut self, lease: Arc<Lease>) -> MasterService {
        self.lease = lease;
        self
    }

    /// The same master, replaying recoveries with `config` instead of the defaults.
    /// Give it before the master serves requests.
    pub fn with_recovery_config(mut self, config: RecoveryConfig) -> MasterService {
        self.recovery = self.recovery.with_config(config);
        self
    }

    /// The lease this master serves under.
    pub fn lease(&self) -> &Arc<Lease> {
        &self.lease
    }

    /// What reserves this master's versions at the coordinators (its
    /// [`VersionReserver::run`] task must run), if it has coordinators.
    pub fn version_reserver(&self) -> Option<&Arc<VersionReserver>> {
        self.version_reserver.as_ref()
    }

    /// What checks client leases at the coordinators and frees the records of expired
    /// clients (its [`ClientLeaseChecker::run`] task must run), if it has coordinators.
    pub fn client_leases(&self) -> Option<&Arc<ClientLeaseChecker>> {
        self.client_leases.as_ref()
    }

    /// What ends the moves whose abort never arrived here (its `run` task must run): a
    /// frozen source serves its range again, a target forgets its copy. It asks
    /// `coordinators` through `pool`.
    pub fn frozen_watch(
        &self,
        coordinators: Arc<rampart_common::coordinator_set::CoordinatorSet>,
        pool: Arc<rampart_common::rpc::RpcPool>,
    ) -> crate::frozen_watch::FrozenWatch {
        crate::frozen_watch::FrozenWatch::new(
            self.id,
            Arc::clone(&self.store),
            Arc::clone(&self.move_in),
            coordinators,
            pool,
        )
    }

    /// What keeps this master's tablets equal to the committed map: lease renewals
    /// report to it, and its [`TabletSync::run`] task pulls when behind.
    pub fn tablet_sync(&self) -> &Arc<TabletSync> {
        &self.tablet_sync
    }

    /// Where `ServerListChanged` pushes are recorded (the failure detector reads it to
    /// pull a newer server list early).
    pub fn server_list_watch(&self) -> Arc<ServerListWatch> {
        Arc::clone(&self.server_list)
    }

    /// Replication counts (under-replicated segments, re-created replicas).
    pub fn replication_stats(&self) -> ReplicationStats {
        *self.status.replication.lock()
    }

    /// Completes, with the reason, when this master stopped serving for good (it was
    /// fenced, or the coordinator declared it crashed and its lease was revoked:
    /// another server is recovering its data). The process should exit.
    pub async fn failed(&self) -> String {
        let fenced = async {
            loop {
                let notified = self.status.fatal_notify.notified();
                if let Some(reason) = self.status.fatal.lock().clone() {
                    return reason;
                }
                notified.await;
            }
        };
        tokio::select! {
            reason = fenced => reason,
            reason = self.lease.revoked() => reason,
        }
    }

    /// Whether this master stopped because it was drained and removed (`rampart drain`),
    /// not declared crashed: the process exits cleanly.
    pub fn was_drained(&self) -> bool {
        self.lease.was_drained()
    }

    /// Refuses every client read and write from now on, for good (its lease is revoked
    /// with `reason`): a graceful stop calls this before it closes its listener, so that a
    /// master whose port refuses connections serves nothing (`coordinator::proof_of_death`,
    /// rule 2).
    pub fn stop_serving(&self, reason: &str) {
        self.lease.revoke(reason);
    }

    /// This master's server id.
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// What the will uploader ([`crate::will_upload::WillUploader`]) calls for this
    /// master's current will: the profiler's partitions, cut at the configured limits,
    /// computed under the store lock.
    pub fn will_source(&self) -> impl Fn() -> rampart_common::will::Will + Send + Sync + 'static {
        let store = Arc::clone(&self.store);
        move || store.lock().will()
    }

    /// The store, for tests and statistics.
    pub fn store(&self) -> &Arc<Mutex<ObjectStore>> {
        &self.store
    }

    async fn write_ops(&self, ops: Vec<WriteOp>) -> Result<Vec<OpOutcome>, Reply> {
        self.appender
            .submit(ops)
            .await
            .map_err(|e| Reply::error(Status::ShuttingDown, e))
    }

    /// Requests served from memory without waiting — reads, enumerate, ping, identify
    /// and the server-list push — which the RPC layer runs on the connection's task (see
    /// `Service::handle_now`).
    fn handle_immediately(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        let reply = match opcode {
            proto::Read::OPCODE => self.read(payload.clone()),
            proto::MultiRead::OPCODE => self.multi_read(payload.clone()),
            proto::Enumerate::OPCODE => self.enumerate(payload.clone()),
            proto::Ping::OPCODE => {
                // Liveness first: a store held by a long job (a moved range forgotten at
                // once) must not make this master look dead to the failure detectors;
                // the store's figures are then the last ones read.
                let mut last = self.last_ping.lock();
                if let Some(store) = self.store.try_lock() {
                    let (used, max) = store.log_bytes();
                    last.objects = store.object_count();
                    last.log_bytes_used = used;
                    last.log_bytes_max = max;
                    last.log_bytes_live = store.log().usage().live_bytes;
                }
                last.segments_under_replicated = self.status.replication.lock().under_replicated;
                last.segments_cleaned = self.status.cleaner.lock().totals.segments_cleaned;
                Ok(Reply::ok(&*last))
            }
            proto::Identify::OPCODE => Ok(Reply::ok(&proto::IdentifyReply { server: self.id })),
            proto::ServerListChanged::OPCODE => {
                Reply::decode::<ServerListVersion>(payload.clone()).map(|pushed| {
                    if self.server_list.push(pushed.version) {
                        tracing::debug!(master = %self.id, version = pushed.version, "newer server list announced");
                    }
                    Reply::ok(&())
                })
            }
            _ => return None,
        };
        // After the lookup: the value was current while the lease still held.
        if needs_lease(opcode) && !self.lease.valid() {
            return Some(lease_lapsed());
        }
        Some(reply.unwrap_or_else(|error| error))
    }

    fn read(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: ReadRequest = Reply::decode(payload)?;
        let store = self.store.lock();
        // The value is copied once, from the log into the reply frame.
        Ok(
            store.read_with(request.table, &request.key, |status, version, value| {
                Reply::ok_with(|out| proto::encode_read_reply(out, status, version, value))
            }),
        )
    }

    fn multi_read(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: MultiReadRequest = Reply::decode(payload)?;
        check_multi(request.objects.len())?;
        let store = self.store.lock();
        let mut bytes = 0;
        let objects = request
            .objects
            .iter()
            .map(|o| {
                if bytes >= MULTI_READ_REPLY_BYTES_MAX {
                    // Past the reply budget: the client asks again for the rest.
                    let retry = Status::Retry;
                    return ReadReply {
                        status: retry,
                        version: Version(0),
                        value: Bytes::new(),
                    };
                }
                let reply = read_reply(store.read(o.table, &o.key));
                bytes += reply.value.len();
                reply
            })
            .collect();
        Ok(Reply::ok(&MultiReadReply { objects }))
    }

    fn enumerate(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: EnumerateRequest = Reply::decode(payload)?;
        let page = self.store.lock().enumerate(
            request.table,
            request.resume_hash..=request.end_hash,
            request.max_bytes,
        );
        page.map(|page| Reply::ok(&enumerate_reply(page)))
            .map_err(|status| Reply::error(status, "enumerate"))
    }

    async fn handle_request(&self, opcode: Opcode, payload: Bytes) -> Reply {
        if let Some(reply) = self.handle_immediately(opcode, &payload) {
            return reply;
        }
        if needs_lease(opcode) && !self.lease.valid() {
            return lease_lapsed();
        }
        let reply = self
            .handle_waiting(opcode, payload)
            .await
            .unwrap_or_else(|error| error);
        if is_write(opcode)
            && failpoints::active(failpoints::LOSE_WRITE_REPLIES)
            && LOST_WRITE_REPLIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 0
        {
            // Applied (or refused), and the answer never arrives: the client must retry.
            return Reply::disconnect();
        }
        reply
    }

    /// Requests that wait for the appender: writes and tablet changes.
    async fn handle_waiting(&self, opcode: Opcode, payload: Bytes) -> Result<Reply, Reply> {
        match opcode {
            proto::Write::OPCODE => {
                let op = WriteOp::from(Reply::decode::<WriteRequest>(payload)?);
                Ok(Reply::ok(&write_reply(self.write_one(op).await?)))
            }
            proto::Remove::OPCODE => {
                let op = WriteOp::from(Reply::decode::<RemoveRequest>(payload)?);
                Ok(Reply::ok(&write_reply(self.write_one(op).await?)))
            }
            proto::Increment::OPCODE => {
                let op = WriteOp::from(Reply::decode::<IncrementRequest>(payload)?);
                Ok(Reply::ok(&increment_reply(self.write_one(op).await?)))
            }
            proto::MultiWrite::OPCODE => {
                let ops = decode_multi_write(payload)
                    .map_err(|e| Reply::error(Status::MalformedRequest, e))?;
                check_multi(ops.len())?;
                self.write_many(ops).await
            }
            proto::MultiRemove::OPCODE => {
                let request: MultiRemoveRequest = Reply::decode(payload)?;
                check_multi(request.objects.len())?;
                self.write_many(request.objects.into_iter().map(WriteOp::from).collect())
                    .await
            }
            // Tablet changes and recovery: rare, and typed (`CONTROL`), which also
            // answers the opcodes no one serves.
            _ => Ok(CONTROL.handle(self, opcode, payload).await),
        }
    }

    /// `TakeTablets`: serve the tablets the coordinator gives this master.
    async fn take_tablets(&self, request: TabletsRequest) -> Result<(), Reply> {
        self.check_owner(request.owner, &request.tablets)?;
        tracing::info!(master = %self.id, tablets = request.tablets.len(), epoch = %request.epoch, "taking tablets");
        let change = TabletChange::Take {
            epoch: request.epoch,
            tablets: request.tablets,
        };
        self.change_tablets(request.epoch, change).await
    }

    /// `DropTablets`: stop serving tablets, and forget their objects.
    async fn drop_tablets(&self, request: TabletsRequest) -> Result<(), Reply> {
        self.check_owner(request.owner, &request.tablets)?;
        tracing::info!(master = %self.id, tablets = request.tablets.len(), epoch = %request.epoch, "dropping tablets");
        let change = TabletChange::Drop {
            epoch: request.epoch,
            tablets: request.tablets,
        };
        self.change_tablets(request.epoch, change).await
    }

    /// `SyncTablets`: catch up with the committed map's tablets of this master.
    async fn sync_tablets(&self, request: proto::SyncTabletsRequest) -> Result<(), Reply> {
        self.check_owner(request.owner, &[])?;
        self.tablet_sync
            .catch_up(request.epoch)
            .await
            .map_err(sync_failed)?;
        Ok(())
    }

    /// `Recover`: replay one partition of a crashed master.
    async fn recover(&self, request: proto::RecoverRequest) -> Result<proto::RecoverReply, Reply> {
        // A move into these ranges came from the crashed master (a move is of its
        // source's whole tablets), so its crash aborted it. Its copy must not take part
        // in the replay: the crashed log's tombstones of keys it holds may be cleaned
        // away, and the copy would come back with the ranges. Ended and forgotten here
        // (stopped first if it still runs), whether or not its `EndMove` arrived.
        let moving: Vec<_> = self
            .store
            .lock()
            .moves_in()
            .into_iter()
            .filter(|(_, range)| request.ranges.iter().any(|r| r.overlaps(range)))
            .collect();
        for (id, range) in moving {
            self.move_in
                .end_move(proto::EndMoveRequest { id, range })
                .await
                .map_err(|error| Reply::error(error.status(), error))?;
            tracing::info!(master = %self.id, %id, ?range, crashed = %request.crashed, "a move into a range being recovered ended with its source");
        }
        self.recovery
            .recover(request)
            .await
            .map_err(|error| Reply::error(error.status(), error))
    }

    /// `AbandonRecovery`: forget what a failed recovery left in ranges not owned here.
    async fn abandon_recovery(&self, request: proto::AbandonRecoveryRequest) -> Result<(), Reply> {
        let forgotten = self
            .recovery
            .abandon(request.crashed, request.recovery, &request.ranges)
            .await
            .map_err(|error| Reply::error(error.status(), error))?;
        match forgotten {
            Some(forgotten) => {
                tracing::info!(master = %self.id, crashed = %request.crashed, recovery = request.recovery, forgotten, "abandoned recovery")
            }
            None => {
                tracing::info!(master = %self.id, crashed = %request.crashed, recovery = request.recovery, "abandon of an older recovery attempt ignored")
            }
        }
        Ok(())
    }

    /// `FinishRecovery`: catch up with the tablets, then forget what a finished
    /// recovery left here unowned.
    async fn finish_recovery(&self, request: proto::FinishRecoveryRequest) -> Result<(), Reply> {
        self.check_owner(request.owner, &[])?;
        // First serve every tablet the committed map gives this master: what a
        // recovery committed to it is then owned, and not forgotten below.
        self.tablet_sync
            .catch_up(request.tablet_epoch)
            .await
            .map_err(sync_failed)?;
        let forgotten = self
            .recovery
            .finish(request.crashed)
            .await
            .map_err(|error| Reply::error(error.status(), error))?;
        tracing::info!(master = %self.id, crashed = %request.crashed, forgotten, "recovery finished; what it left unowned here is forgotten");
        Ok(())
    }

    /// `MoveOut`: one step of a move of tablets out of this master (`object_store`'s
    /// `moves`): the first piece of the copy opens it.
    async fn move_out(&self, request: proto::MoveOutRequest) -> Result<proto::MoveOutReply, Reply> {
        let proto::MoveOutRequest {
            id,
            range,
            step,
            bytes_max,
        } = request;
        let refused = |status: Status| {
            Reply::error(
                status,
                format!("{id} of {range:?} out of {}: {step:?} refused", self.id),
            )
        };
        let bytes_max = bytes_max as usize;
        let piece = match step {
            proto::MoveStep::Copy { from } => {
                let mut store = self.store.lock();
                if from == range.start {
                    store
                        .open_move_out(id, range, std::time::Instant::now())
                        .map_err(refused)?;
                }
                store.move_out_piece(id, from, bytes_max)
            }
            proto::MoveStep::Tail => self.store.lock().move_out_tail(id, bytes_max),
            proto::MoveStep::Freeze => {
                self.appender
                    .freeze_move_out(id)
                    .await
                    .map_err(|_| Reply::error(Status::ShuttingDown, "the master is stopping"))?
                    .map_err(refused)?;
                tracing::info!(master = %self.id, %id, ?range, "moving range frozen");
                self.store.lock().move_out_tail(id, bytes_max)
            }
        }
        .map_err(refused)?;
        Ok(proto::MoveOutReply {
            safe_version: piece.safe_version,
            next: piece.next,
            left: piece.left,
            count: piece.count,
            entries: Bytes::from(piece.entries),
        })
    }

    /// `MoveIn`: take a range from its source ahead of the commit that gives it here.
    async fn move_in(&self, request: proto::MoveInRequest) -> Result<proto::MoveInReply, Reply> {
        self.move_in
            .move_in(request)
            .await
            .map_err(|error| Reply::error(error.status(), error))
    }

    /// `EndMove`: a move was aborted; serve its range again, or forget its copy.
    async fn end_move(&self, request: proto::EndMoveRequest) -> Result<(), Reply> {
        self.move_in
            .end_move(request)
            .await
            .map(|_| ())
            .map_err(|error| Reply::error(error.status(), error))
    }

    /// `EvacuateBackup`: stop using a backup being drained (the `server_list_watch`
    /// module doc); answers the replicator's last report.
    async fn evacuate_backup(
        &self,
        request: proto::EvacuateBackupRequest,
    ) -> Result<proto::EvacuateBackupReply, Reply> {
        if request.backup == self.id {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!("{} keeps no replicas of its own log", self.id),
            ));
        }
        let report = self.server_list.evacuate(request.backup);
        Ok(proto::EvacuateBackupReply {
            reported: report.is_some(),
            on_backup: report.map_or(0, |r| r.on_backup),
            not_whole: report.map_or(0, |r| r.not_whole),
        })
    }

    /// `UnneededReplicas`: which of this log's segments' copies on a backup it no longer
    /// needs there, answered by the replicator at its next upkeep
    /// (`ServerListWatch::ask_unneeded`); `Retry` while too many questions wait, or
    /// when no upkeep answered in time.
    async fn unneeded_replicas(
        &self,
        request: proto::UnneededReplicasRequest,
    ) -> Result<proto::UnneededReplicasReply, Reply> {
        if request.segments.len() > proto::UNNEEDED_SEGMENTS_MAX {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!(
                    "{} segments in one question, more than {}",
                    request.segments.len(),
                    proto::UNNEEDED_SEGMENTS_MAX
                ),
            ));
        }
        let Some(answer) = self
            .server_list
            .ask_unneeded(request.backup, request.segments)
        else {
            return Err(Reply::error(
                Status::Retry,
                "too many questions about replicas wait; ask again later",
            ));
        };
        match tokio::time::timeout(UNNEEDED_ANSWER_TIMEOUT, answer).await {
            Ok(Ok(segments)) => Ok(proto::UnneededReplicasReply { segments }),
            _ => Err(Reply::error(
                Status::Retry,
                "the replicator did not answer in time; ask again later",
            )),
        }
    }

    /// Refuses an ownership change meant for another server (`WrongServer`: a server
    /// restarted at this address under a new id), or naming tablets of another owner.
    fn check_owner(&self, owner: ServerId, tablets: &[Tablet]) -> Result<(), Reply> {
        if owner != self.id {
            return Err(Reply::error(
                Status::WrongServer,
                format!(
                    "tablets of {owner} sent to {}: a new server listens at that server's \
                     address; {owner}'s tablets are recovered elsewhere",
                    self.id
                ),
            ));
        }
        if let Some(tablet) = tablets.iter().find(|t| t.owner != owner) {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!(
                    "a change of {owner}'s tablets names a tablet of {}",
                    tablet.owner
                ),
            ));
        }
        Ok(())
    }

    /// Applies the coordinator's change number `epoch` of this master's tablets; on a
    /// gap (a change before it was missed) pulls the whole set instead.
    async fn change_tablets(&self, epoch: TabletEpoch, change: TabletChange) -> Result<(), Reply> {
        let step = self
            .appender
            .change_tablets(change)
            .await
            .map_err(|e| Reply::error(Status::ShuttingDown, e))?;
        if step == EpochStep::Gap {
            tracing::info!(master = %self.id, %epoch, applied = %self.tablet_sync.applied(), "a change of this master's tablets was missed; pulling them");
            self.tablet_sync
                .catch_up(epoch)
                .await
                .map_err(sync_failed)?;
        }
        Ok(())
    }

    /// Makes sure the leases of the clients of `ops` (one, from the client library)
    /// are known to hold before they are staged (`crate::client_leases`).
    async fn ensure_client_lease(&self, ops: &[WriteOp]) -> Result<(), Reply> {
        let Some(checker) = &self.client_leases else {
            return Ok(());
        };
        let mut clients: Vec<_> = ops
            .iter()
            .map(WriteOp::rifl)
            .filter(|rifl| rifl.is_tracked())
            .map(|rifl| rifl.client)
            .collect();
        clients.dedup();
        for client in clients {
            checker.ensure(client).await?;
        }
        Ok(())
    }

    async fn write_one(&self, op: WriteOp) -> Result<OpOutcome, Reply> {
        self.ensure_client_lease(std::slice::from_ref(&op)).await?;
        let outcomes = self.write_ops(vec![op]).await?;
        Ok(outcomes
            .into_iter()
            .next()
            .expect("one outcome per submitted op"))
    }

    async fn write_many(&self, ops: Vec<WriteOp>) -> Result<Reply, Reply> {
        self.ensure_client_lease(&ops).await?;
        let outcomes = self.write_ops(ops).await?;
        let reply = MultiWriteReply {
            objects: outcomes.into_iter().map(write_reply).collect(),
        };
        // Room for the whole reply at once (a count, then a status and a version per
        // object), rather than growing the frame by doubling.
        Ok(Reply::ok_with(|frame| {
            frame.reserve(8 + 16 * reply.objects.len());
            reply.encode(frame);
        }))
    }
}

/// The master's control RPCs by opcode (module doc), built on the first one.
static CONTROL: LazyLock<Router<MasterService>> = LazyLock::new(|| {
    Router::<MasterService>::new("master")
        .route::<proto::TakeTablets>(|master, request| Box::pin(master.take_tablets(request)))
        .route::<proto::DropTablets>(|master, request| Box::pin(master.drop_tablets(request)))
        .route::<proto::SyncTablets>(|master, request| Box::pin(master.sync_tablets(request)))
        // Long and rare: never in `handle_immediately`.
        .route::<proto::Recover>(|master, request| Box::pin(master.recover(request)))
        .route::<proto::AbandonRecovery>(|master, request| {
            Box::pin(master.abandon_recovery(request))
        })
        .route::<proto::FinishRecovery>(|master, request| Box::pin(master.finish_recovery(request)))
        .route::<proto::MoveOut>(|master, request| Box::pin(master.move_out(request)))
        .route::<proto::MoveIn>(|master, request| Box::pin(master.move_in(request)))
        .route::<proto::EndMove>(|master, request| Box::pin(master.end_move(request)))
        .route::<proto::EvacuateBackup>(|master, request| Box::pin(master.evacuate_backup(request)))
        .route::<proto::UnneededReplicas>(|master, request| {
            Box::pin(master.unneeded_replicas(request))
        })
});

impl Service for MasterService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        Box::pin(self.handle_request(opcode, payload))
    }

    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        self.handle_immediately(opcode, payload)
    }
}

/// Write replies seen by [`failpoints::LOSE_WRITE_REPLIES`]; every other one is lost.
static LOST_WRITE_REPLIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether `opcode` is a write-type request (write, remove, increment, multi-ops).
fn is_write(opcode: Opcode) -> bool {
    [
        proto::Write::OPCODE,
        proto::Remove::OPCODE,
        proto::Increment::OPCODE,
        proto::MultiWrite::OPCODE,
        proto::MultiRemove::OPCODE,
    ]
    .contains(&opcode)
}

// The wire's view of the store's answers (the store speaks domain types only).

impl From<WriteRequest> for WriteOp {
    fn from(request: WriteRequest) -> WriteOp {
        let WriteRequest {
            table,
            key,
            value,
            rules,
            rifl,
        } = request;
        WriteOp::Write {
            table,
            key,
            value,
            rules,
            rifl,
        }
    }
}

impl From<RemoveRequest> for WriteOp {
    fn from(request: RemoveRequest) -> WriteOp {
        let RemoveRequest {
            table,
            key,
            rules,
            rifl,
        } = request;
        WriteOp::Remove {
            table,
            key,
            rules,
            rifl,
        }
    }
}

impl From<IncrementRequest> for WriteOp {
    fn from(request: IncrementRequest) -> WriteOp {
        let IncrementRequest {
            table,
            key,
            delta,
            rules,
            rifl,
        } = request;
        WriteOp::Increment {
            table,
            key,
            delta,
            rules,
            rifl,
        }
    }
}

/// A write's or remove's reply (an increment's counter is dropped).
fn write_reply(outcome: OpOutcome) -> WriteReply {
    WriteReply {
        status: outcome.status,
        version: outcome.version,
    }
}

/// An increment's reply: a refused one's value reads as 0.
fn increment_reply(outcome: OpOutcome) -> IncrementReply {
    IncrementReply {
        status: outcome.status,
        version: outcome.version,
        value: outcome.counter.unwrap_or(0),
    }
}

/// One object of a multi-read; not found and refused ones carry version 0 and no value.
fn read_reply(read: Result<Object, Status>) -> ReadReply {
    match read {
        Ok(Object { version, value }) => ReadReply {
            status: Status::Ok,
            version,
            value,
        },
        Err(status) => ReadReply {
            status,
            version: Version(0),
            value: Bytes::new(),
        },
    }
}

fn enumerate_reply(page: EnumeratePage) -> EnumerateReply {
    EnumerateReply {
        objects: page
            .objects
            .into_iter()
            .map(|(key, Object { version, value })| EnumeratedObject {
                key,
                version,
                value,
            })
            .collect(),
        next_hash: page.next_hash,
    }
}

/// Whether `opcode` is a client read or write, served only under a valid lease (module
/// doc).
pub fn needs_lease(opcode: Opcode) -> bool {
    matches!(
        opcode,
        proto::Read::OPCODE
            | proto::MultiRead::OPCODE
            | proto::Enumerate::OPCODE
            | proto::Write::OPCODE
            | proto::Remove::OPCODE
            | proto::Increment::OPCODE
            | proto::MultiWrite::OPCODE
            | proto::MultiRemove::OPCODE
    )
}

/// The reply when this master could not catch up with its tablets.
fn sync_failed(error: SyncError) -> Reply {
    let status = match error {
        SyncError::ShuttingDown => Status::ShuttingDown,
        _ => Status::Retry,
    };
    Reply::error(status, error)
}

fn lease_lapsed() -> Reply {
    Reply::error(Status::Retry, LEASE_LAPSED_DETAIL)
}

/// Bytes of the shortest object of a `MultiWrite` payload: table id, key and value
/// lengths, reject rules (a version and four flags) and exactly-once identity (three
/// numbers), with an empty key and value.
/// How long an `UnneededReplicas` waits for the replicator's answer (its upkeep runs
/// every 100 ms, between batches under load).
const UNNEEDED_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

const MULTI_WRITE_OBJECT_BYTES_MIN: usize = 8 + 8 + 8 + (8 + 4) + 3 * 8;

/// A `MultiWrite` payload as write operations whose keys and values are slices of the
/// payload, not copies of it.
///
/// The payload is a bincode-encoded [`proto::MultiWriteRequest`] (the protocol's options:
/// fixed-width little-endian integers, no trailing bytes); decoded through serde, every
/// key and value is copied into an allocation of its own, and the store's first clone
/// of each allocates again (a `Bytes` made from a `Vec` is promoted to a shared one) —
/// at a bulk load's rate, a third of what the master's RPC task spent on a write. This
/// reads the same layout by hand and accepts exactly the payloads that serde does, with
/// the same contents (`service_tests` checks both against each other, on valid and on
/// damaged payloads); only the text of a refusal differs.
///
/// Layout: the object count (u64), then per object: table id (u64); key and value, each
/// a u64 length and its bytes; reject rules — given version (u64) and four flags (one
/// byte each, 0 or 1); exactly-once identity — client id, number, acknowledgement
/// (u64 each).
pub(crate) fn decode_multi_write(
    mut payload: Bytes,
) -> Result<Vec<WriteOp>, rampart_common::rpc::DecodeError> {
    use bytes::Buf;
    use rampart_common::ids::{ClientId, TableId};
    use rampart_common::reject::RejectRules;
    use rampart_common::rifl::Rifl;
    use rampart_common::rpc::DecodeError;
    fn u64_of(payload: &mut Bytes, what: &str) -> Result<u64, DecodeError> {
        payload
            .try_get_u64_le()
            .map_err(|_| DecodeError(format!("payload ends inside {what}")))
    }
    fn flag(payload: &mut Bytes, what: &str) -> Result<bool, DecodeError> {
        match payload.try_get_u8() {
            Ok(0) => Ok(false),
            Ok(1) => Ok(true),
            Ok(other) => Err(DecodeError(format!("{what} is {other}, not a flag"))),
            Err(_) => Err(DecodeError(format!("payload ends inside {what}"))),
        }
    }
    fn bytes_of(payload: &mut Bytes, what: &str) -> Result<Bytes, DecodeError> {
        let len = u64_of(payload, what)?;
        match usize::try_from(len) {
            Ok(len) if len <= payload.len() => Ok(payload.split_to(len)),
            _ => Err(DecodeError(format!(
                "{what} of {len} bytes; {} left",
                payload.len()
            ))),
        }
    }
    let count = u64_of(&mut payload, "the object count")?;
    // Room for what the payload can hold, and never past the limit (checked after,
    // as for any request): a hostile count allocates nothing.
    let room = (payload.len() / MULTI_WRITE_OBJECT_BYTES_MIN).min(MULTI_OPS_MAX + 1);
    let mut ops = Vec::with_capacity(usize::try_from(count).map_or(room, |c| c.min(room)));
    for _ in 0..count {
        let table = TableId(u64_of(&mut payload, "a table id")?);
        let key = bytes_of(&mut payload, "a key")?;
        let value = bytes_of(&mut payload, "a value")?;
        let rules = RejectRules {
            given_version: Version(u64_of(&mut payload, "a given version")?),
            doesnt_exist: flag(&mut payload, "a reject rule")?,
            exists: flag(&mut payload, "a reject rule")?,
            version_le_given: flag(&mut payload, "a reject rule")?,
            version_ne_given: flag(&mut payload, "a reject rule")?,
        };
        let rifl = Rifl {
            client: ClientId(u64_of(&mut payload, "a client id")?),
            seq: u64_of(&mut payload, "a sequence number")?,
            ack: u64_of(&mut payload, "an acknowledgement")?,
        };
        ops.push(WriteOp::Write {
            table,
            key,
            value,
            rules,
            rifl,
        });
    }
    if !payload.is_empty() {
        return Err(DecodeError(format!(
            "{} bytes after the last object",
            payload.len()
        )));
    }
    Ok(ops)
}

fn check_multi(count: usize) -> Result<(), Reply> {
    if count > MULTI_OPS_MAX {
        return Err(Reply::error(
            Status::InvalidArgument,
            format!("{count} objects in one request; the limit is {MULTI_OPS_MAX}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod control_tests {
    use super::*;

    /// The table holds the control RPCs, and none of the hot path's: those keep their
    /// arms, ahead of it.
    #[test]
    fn the_control_table_routes_tablet_changes_and_recovery_only() {
        let routed: Vec<Opcode> = CONTROL.opcodes().collect();
        let control = [
            proto::TakeTablets::OPCODE,
            proto::DropTablets::OPCODE,
            proto::Recover::OPCODE,
            proto::AbandonRecovery::OPCODE,
            proto::SyncTablets::OPCODE,
            proto::FinishRecovery::OPCODE,
            proto::MoveOut::OPCODE,
            proto::MoveIn::OPCODE,
            proto::EndMove::OPCODE,
            proto::EvacuateBackup::OPCODE,
            proto::UnneededReplicas::OPCODE,
        ];
        assert_eq!(routed, control);
        for opcode in routed {
            assert!(!needs_lease(opcode) && !is_write(opcode), "{opcode}");
        }
    }
}
