//! `CoordinatorService`: the coordinator's RPC handlers over its Raft member
//! ([`RaftNode`]).
//!
//! Every change is a [`Command`] proposed through Raft; the handler answers with what
//! applying it produced once it is committed. Reads that must be current (`GetTabletMap`,
//! `GetTableId`) pass a ReadIndex barrier first, so they are linearizable. A coordinator
//! that is not the leader answers `NotLeader` with a hint naming the leader (see
//! `NotLeaderHint`); clients follow it. `RaftStatus` is answered by every coordinator, and
//! `RaftMessages` carries Raft's own traffic between coordinators.
//!
//! Changes that move tablets are followed by pushes to the masters concerned: `TakeTablets`
//! after a table is created, `DropTablets` after it is dropped, each naming the server it
//! is for and that server's tablet epoch after the change (see
//! `protocol::master::TabletsRequest`). Only `Up` owners are told: a crashed owner's
//! tablets are being recovered, and whoever listens at its address now is another server
//! (which refuses, `WrongServer`). A change and its pushes hold the lock of the table's
//! name (one of [`NAME_LOCKS`] stripes), so two concurrent creates/drops of one name
//! cannot reach a master in the wrong order, while changes to other tables proceed in
//! parallel. After an enlistment the leader tells every `Up` server the new configuration
//! version (`ServerListChanged`), and servers holding an older list pull it.
//!
//! # Ownership converges
//! A push is a shortcut, not the mechanism: every lease renewal (`RenewLease`) answers
//! the master's tablet epoch, and a master behind it pulls its whole set
//! (`GetOwnedTablets`, linearizable). So a push that was lost — the leader died between
//! commit and push, the master was unreachable — costs at most a renewal interval.
//!
//! # Failure handling
//! * A proposal not committed within [`PROPOSAL_TIMEOUT`] (a leader cut off from its
//!   majority never commits) is answered `Retry` with the reason; its outcome is unknown,
//!   and every command is safe to retry (creates are idempotent by name, drops by table
//!   id, so a retried drop never hits a table re-created under the same name; a retried
//!   enlistment gets a new id and crashes the orphaned one).
//! * If an `Up` master cannot be reached to take its tablets, `create_table` answers
//!   `Retry` (the table exists; the client library retries, and a repeated create asks
//!   the owners to catch up, `SyncTablets`). A leader that dies between the commit and the
//!   push leaves the same state, repaired the same way — or by the owners' next renewal.
//!   Owners that are not `Up` do not make a create wait: their tablets come back through
//!   recovery.
//! * A failed `DropTablets` push is only logged: the table is already gone from the map,
//!   its id is never reused, so no client can reach the stale tablet through a fresh map,
//!   and the master drops it at its next lease renewal.

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::ids::{ServerId, TabletEpoch};
use rampart_common::protocol::coordinator::{
    self as proto, CreateTableRequest, DropTableRequest, EnlistReply, EnlistRequest,
    RaftMessagesRequest, TableIdReply, TableNameRequest,
};
use rampart_common::protocol::master::{
    DropTablets, PingRequest, ServerStats, SyncTablets, SyncTabletsRequest, TabletsRequest,
    TakeTablets,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, RpcPool, Service};
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::client_leases::{ClientExpirer, ClientLeases};
use crate::failure_verifier::FailureVerifier;
use crate::node::{NodeError, RaftNode};
use crate::recovery::{RecoveryConfig, RecoveryManager};
use crate::state::{Command, CommandResult, CoordinatorState};
use rampart_common::protocol::coordinator::{
    CheckClientLeasesReply, CheckClientLeasesRequest, ClientLeaseState, RenewClientLeaseReply,
    RenewClientLeaseRequest, CLIENT_LEASE_CHECKS_MAX,
};
use rampart_common::protocol::coordinator::{
    OpenClientReply, OpenClientRequest, OwnedTabletsReply, RecoveryStatusReply, RenewLeaseReply,
    RenewLeaseRequest, ReportFailureRequest, ReserveVersionsReply, ReserveVersionsRequest,
    ServerIdRequest, SetOpenEpochRequest, UploadWillRequest,
};
use rampart_common::rifl::CLIENT_LEASE;
use rampart_common::tablet::ServerStatus;

/// How long a create or drop waits for the masters to take or drop their tablets.
pub const TABLET_PUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the leader asks a master that did not take its tablets why.
const EXPLAIN_TIMEOUT: Duration = Duration::from_millis(500);

// How long a handler waits for its proposal to commit, or for a read barrier. Part of
// the protocol (clients size their attempts by it), so it lives with the messages.
use rampart_common::protocol::coordinator::PROPOSAL_TIMEOUT;

/// Lock stripes that serialise changes to one table name with their pushes.
pub const NAME_LOCKS: usize = 64;

/// The coordinator service of one coordinator process.
#[derive(Debug)]
pub struct CoordinatorService {
    /// This coordinator's Raft member, holding the configuration.
    node: RaftNode,
    /// Serialise a table's change with the pushes that follow it, by name hash.
    names: Vec<tokio::sync::Mutex<()>>,
    /// Connections to masters.
    pool: Arc<RpcPool>,
    /// Failure verification (active while this member leads).
    verifier: Arc<FailureVerifier>,
    /// Crash recovery (active while this member leads).
    recovery: Arc<RecoveryManager>,
    /// Stops the recovery manager's loop when the service goes away.
    _recovery_task: AbortOnDrop,
    /// Client leases as this member sees them while it leads.
    client_leases: Arc<Mutex<ClientLeases>>,
    /// Stops the client expirer when the service goes away.
    _expirer_task: AbortOnDrop,
}

/// Aborts a background task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl CoordinatorService {
    /// The service of a running Raft member, with the default recovery settings; must be
    /// called inside a tokio runtime (it starts the recovery manager).
    pub fn new(node: RaftNode) -> CoordinatorService {
        CoordinatorService::with_recovery(node, RecoveryConfig::default())
    }

    /// The service of a running Raft member; must be called inside a tokio runtime (it
    /// starts the recovery manager, stopped when the service is dropped).
    pub fn with_recovery(node: RaftNode, config: RecoveryConfig) -> CoordinatorService {
        let pool = Arc::new(RpcPool::new());
        let verifier = Arc::new(FailureVerifier::new(
            node.clone(),
            Arc::clone(&pool),
            config.verify_timeout,
            config.verify_attempts,
        ));
        let recovery = Arc::new(RecoveryManager::new(
            node.clone(),
            Arc::clone(&pool),
            config,
            Arc::clone(&verifier),
        ));
        let task = tokio::spawn(Arc::clone(&recovery).run());
        let client_leases = Arc::new(Mutex::new(ClientLeases::new(CLIENT_LEASE)));
        let expirer = ClientExpirer::new(node.clone(), Arc::clone(&client_leases));
        let expirer_task = tokio::spawn(expirer.run());
        CoordinatorService {
            client_leases,
            _expirer_task: AbortOnDrop(expirer_task),
            node,
            names: (0..NAME_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            pool,
            verifier,
            recovery,
            _recovery_task: AbortOnDrop(task),
        }
    }

    /// The same service, with client leases of `lease` instead of
    /// [`CLIENT_LEASE`] (tests). Give it before the service serves requests.
    pub fn with_client_lease(mut self, lease: Duration) -> CoordinatorService {
        *self.client_leases.lock() = ClientLeases::new(lease);
        // A new expirer, which sleeps by the new length (the old one is aborted).
        let expirer = ClientExpirer::new(self.node.clone(), Arc::clone(&self.client_leases));
        self._expirer_task = AbortOnDrop(tokio::spawn(expirer.run()));
        self
    }

    /// Renews open client `client`'s lease as of `received` (read before the barrier or
    /// commit that confirmed leadership), in the term this member leads in now; `None`
    /// if it no longer leads or the lease ran out.
    fn renew_client(
        &self,
        client: rampart_common::ids::ClientId,
        received: tokio::time::Instant,
    ) -> Option<Duration> {
        let term = self.node.leader_term()?;
        let now = tokio::time::Instant::now();
        let mut leases = self.client_leases.lock();
        leases.observe_leadership(Some(term), now);
        leases.renew(client, received, now)
    }

    /// The recovery manager (reports of past recoveries).
    pub fn recovery(&self) -> &Arc<RecoveryManager> {
        &self.recovery
    }

    /// This coordinator's Raft member.
    pub fn node(&self) -> &RaftNode {
        &self.node
    }

    /// A copy of this member's state machine (for status pages and tests; not
    /// necessarily current on a follower).
    pub fn state(&self) -> CoordinatorState {
        self.node.with_state(CoordinatorState::clone)
    }

    fn name_lock(&self, name: &str) -> &tokio::sync::Mutex<()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut hasher);
        &self.names[(hasher.finish() % NAME_LOCKS as u64) as usize]
    }

    /// Proposes `command` and waits for its result, or for the reply that says why not.
    async fn apply(&self, command: Command) -> Result<CommandResult, Reply> {
        let what = command_name(&command);
        match tokio::time::timeout(PROPOSAL_TIMEOUT, self.node.propose(command)).await {
            Ok(Ok(result)) => {
                tracing::debug!(what, ?result, "applied");
                Ok(result)
            }
            Ok(Err(e)) => Err(node_error_reply(e)),
            Err(_) => Err(Reply::error(
                Status::Retry,
                format!(
                    "{what} not committed within {PROPOSAL_TIMEOUT:?}: this coordinator \
                     cannot reach a majority of the coordinators; it may still commit, and \
                     retrying is safe"
                ),
            )),
        }
    }

    /// Waits until this member's state reflects every change committed before the call.
    async fn read_barrier(&self) -> Result<(), Reply> {
        match tokio::time::timeout(PROPOSAL_TIMEOUT, self.node.read_barrier()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(node_error_reply(e)),
            Err(_) => Err(Reply::error(
                Status::Retry,
                format!(
                    "read not confirmed within {PROPOSAL_TIMEOUT:?}: this coordinator cannot \
                     reach a majority of the coordinators"
                ),
            )),
        }
    }

    /// Tells every `Up` server, in the background, that the server list changed.
    fn push_server_list_version(&self) {
        crate::push::push_server_list_version(&self.node, &self.pool);
    }

    /// Tells each `Up` server of `epochs` about a change of its tablets: RPC `R` with
    /// the request `request_for(owner, epoch)`, retried until `deadline`
    /// ([`push_until`](crate::push::push_until)). Servers that are not
    /// `Up` are skipped (module doc). Returns the pushes that did not get through.
    async fn tell_owners<R>(
        &self,
        epochs: &[(ServerId, TabletEpoch)],
        request_for: impl Fn(ServerId, TabletEpoch) -> R::Request,
        deadline: Instant,
    ) -> Vec<FailedPush>
    where
        R: Rpc<Reply = ()>,
    {
        let owners: Vec<(ServerId, String, TabletEpoch)> = self.node.with_state(|state| {
            epochs
                .iter()
                .filter_map(|&(owner, epoch)| {
                    let server = state.server(owner)?;
                    (server.status == ServerStatus::Up).then(|| (owner, server.addr.clone(), epoch))
                })
                .collect()
        });
        let pushes = owners.into_iter().map(|(owner, addr, epoch)| {
            let request = request_for(owner, epoch);
            async move {
                crate::push::push_until::<R>(&self.pool, &addr, &request, deadline)
                    .await
                    .err()
                    .map(|error| FailedPush {
                        owner,
                        error: error.to_string(),
                    })
            }
        });
        futures::future::join_all(pushes)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Pushes `tablets`, grouped by owner, with RPC `R` (take or drop) and each owner's
    /// tablet epoch from `epochs`; see [`tell_owners`](Self::tell_owners).
    async fn push<R>(
        &self,
        tablets: &[Tablet],
        epochs: &[(ServerId, TabletEpoch)],
        deadline: Instant,
    ) -> Vec<FailedPush>
    where
        R: Rpc<Request = TabletsRequest, Reply = ()>,
    {
        let mut by_owner: BTreeMap<ServerId, Vec<Tablet>> = BTreeMap::new();
        for tablet in tablets {
            by_owner.entry(tablet.owner).or_default().push(*tablet);
        }
        let request_for = |owner: ServerId, epoch: TabletEpoch| TabletsRequest {
            owner,
            epoch,
            tablets: by_owner.get(&owner).cloned().unwrap_or_default(),
        };
        self.tell_owners::<R>(epochs, request_for, deadline).await
    }

    /// Why masters did not take their tablets: each one's failure, and what its server
    /// says of itself when that explains it (writes waiting for backups:
    /// a master short of backups for R cannot serve new tablets either).
    async fn explain_failed_pushes(&self, failed: &[FailedPush]) -> String {
        let asks = failed.iter().map(|f| {
            let addr = self
                .node
                .with_state(|state| state.server(f.owner).map(|s| s.addr.clone()));
            async move {
                let deadline = Instant::now() + EXPLAIN_TIMEOUT;
                let shortage = match addr {
                    Some(addr) => self
                        .pool
                        .call::<ServerStats>(&addr, &PingRequest {}, deadline)
                        .await
                        .ok()
                        .and_then(|stats| stats.backup_shortage),
                    None => None,
                };
                match shortage {
                    Some(shortage) => format!("{}: {}; {shortage}", f.owner, f.error),
                    None => format!("{}: {}", f.owner, f.error),
                }
            }
        });
        futures::future::join_all(asks).await.join("; ")
    }

    async fn handle_request(&self, opcode: Opcode, payload: Bytes) -> Reply {
        match opcode {
            proto::Enlist::OPCODE => {
                let request: EnlistRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let command = Command::EnlistServer {
                    addr: request.addr.clone(),
                    services: request.services,
                    failure_domain: request.failure_domain,
                    disk_read_mbps: request.disk_read_mbps,
                };
                match self.apply(command).await {
                    Ok(CommandResult::Enlisted { id }) => {
                        tracing::info!(%id, addr = %request.addr, "server enlisted");
                        self.push_server_list_version();
                        Reply::ok(&EnlistReply { id })
                    }
                    Ok(other) => rejected(other),
                    Err(reply) => reply,
                }
            }
            proto::CreateTable::OPCODE => {
                let request: CreateTableRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let _change = self.name_lock(&request.name).lock().await;
                let command = Command::CreateTable {
                    name: request.name.clone(),
                    span: request.span,
                };
                match self.apply(command).await {
                    Ok(CommandResult::TableCreated {
                        id,
                        tablets,
                        created,
                        epochs,
                    }) => {
                        let deadline = Instant::now() + TABLET_PUSH_TIMEOUT;
                        let failed = if created {
                            tracing::info!(%id, name = %request.name, span = request.span, "table created");
                            self.push::<TakeTablets>(&tablets, &epochs, deadline).await
                        } else {
                            // A retry: the owners may have missed the first push, and may
                            // have applied later changes since; they catch up.
                            let sync = |owner, epoch| SyncTabletsRequest { owner, epoch };
                            self.tell_owners::<SyncTablets>(&epochs, sync, deadline)
                                .await
                        };
                        if failed.is_empty() {
                            Reply::ok(&TableIdReply { id })
                        } else {
                            let why = self.explain_failed_pushes(&failed).await;
                            tracing::warn!(%id, %why, "masters did not take their tablets");
                            let detail = format!(
                                "table {id} created, but its masters did not take it: {why}"
                            );
                            Reply::error(Status::Retry, detail)
                        }
                    }
                    Ok(other) => rejected(other),
                    Err(reply) => reply,
                }
            }
            proto::DropTable::OPCODE => {
                let request: DropTableRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                // The name's lock orders this drop with creates of that name and their
                // pushes. A table gone already (or never there) has nothing to drop; the
                // command is then a no-op, whatever a create of its old name did since.
                let name = self
                    .node
                    .with_state(|state| state.table(request.id).map(|t| t.name.clone()))
                    .unwrap_or_default();
                let _change = self.name_lock(&name).lock().await;
                let command = Command::DropTable { id: request.id };
                match self.apply(command).await {
                    Ok(CommandResult::TableDropped {
                        id,
                        tablets,
                        epochs,
                    }) => {
                        if let Some(id) = id {
                            tracing::info!(%id, %name, "table dropped");
                        }
                        let deadline = Instant::now() + TABLET_PUSH_TIMEOUT;
                        let failed = self.push::<DropTablets>(&tablets, &epochs, deadline).await;
                        if !failed.is_empty() {
                            tracing::warn!(?failed, "masters did not drop their tablets; they will at their next lease renewal");
                        }
                        Reply::ok(&())
                    }
                    Ok(other) => rejected(other),
                    Err(reply) => reply,
                }
            }
            proto::GetTableId::OPCODE => {
                let request: TableNameRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                if let Err(reply) = self.read_barrier().await {
                    return reply;
                }
                match self.node.with_state(|state| state.table_id(&request.name)) {
                    Some(id) => Reply::ok(&TableIdReply { id }),
                    None => Reply::error(Status::TableDoesntExist, request.name),
                }
            }
            proto::GetTabletMap::OPCODE => match self.read_barrier().await {
                Ok(()) => Reply::ok(&self.node.with_state(CoordinatorState::tablet_map)),
                Err(reply) => reply,
            },
            proto::RaftStatus::OPCODE => Reply::ok(&self.node.status()),
            proto::ReportFailure::OPCODE => {
                let request: ReportFailureRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                match self
                    .verifier
                    .report_failure(request.server, &request.reporter)
                {
                    Ok(()) => Reply::ok(&()),
                    Err(e) => node_error_reply(e),
                }
            }
            proto::RenewLease::OPCODE => {
                let request: RenewLeaseRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                // Linearizable: a deposed leader must not grant a lease to a server the
                // new leader already declared crashed.
                if let Err(reply) = self.read_barrier().await {
                    return reply;
                }
                let status = self
                    .node
                    .with_state(|state| state.server(request.server).map(|s| s.status));
                match status {
                    Some(ServerStatus::Up) => Reply::ok(&RenewLeaseReply {
                        lease_ms: u32::try_from(self.recovery.config().lease.as_millis())
                            .unwrap_or(u32::MAX),
                        tablets_epoch: self
                            .node
                            .with_state(|state| state.tablet_epoch(request.server)),
                        version_ceiling: self
                            .node
                            .with_state(|state| state.version_ceiling(request.server)),
                    }),
                    Some(_) => Reply::error(
                        Status::ServerCrashed,
                        format!(
                            "{} was declared crashed; its tablets are recovered elsewhere",
                            request.server
                        ),
                    ),
                    None => Reply::error(
                        Status::InvalidArgument,
                        format!("{} never enlisted", request.server),
                    ),
                }
            }
            proto::UploadWill::OPCODE => {
                let request: UploadWillRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let command = Command::SetWill {
                    server: request.server,
                    will: request.will,
                };
                match self.apply(command).await {
                    Ok(CommandResult::WillSet) => Reply::ok(&()),
                    Ok(other) => rejected(other),
                    Err(reply) => reply,
                }
            }
            proto::AllowLoss::OPCODE => {
                let request: ServerIdRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                match self
                    .apply(Command::AllowLoss {
                        server: request.server,
                    })
                    .await
                {
                    Ok(CommandResult::LossAllowed) => {
                        tracing::warn!(server = %request.server, "operator allowed the recovery to lose data");
                        Reply::ok(&())
                    }
                    Ok(other) => rejected(other),
                    Err(reply) => reply,
                }
            }
            proto::GetOwnedTablets::OPCODE => {
                let request: ServerIdRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                if let Err(reply) = self.read_barrier().await {
                    return reply;
                }
                let owned = self.node.with_state(|state| {
                    let server = state.server(request.server)?;
                    Some((
                        server.status,
                        state.tablet_epoch(request.server),
                        state.tablets_of(request.server),
                    ))
                });
                match owned {
                    Some((ServerStatus::Up, epoch, tablets)) => {
                        Reply::ok(&OwnedTabletsReply { epoch, tablets })
                    }
                    Some(_) => Reply::error(
                        Status::ServerCrashed,
                        format!("{} was declared crashed", request.server),
                    ),
                    None => Reply::error(
                        Status::InvalidArgument,
                        format!("{} never enlisted", request.server),
                    ),
                }
            }
            proto::OpenClient::OPCODE => {
                if let Err(reply) = Reply::decode::<OpenClientRequest>(payload) {
                    return reply;
                }
                let received = tokio::time::Instant::now();
                match self.apply(Command::OpenClient).await {
                    Ok(CommandResult::ClientOpened { id }) => {
                        let lease = self.node.leader_term().and_then(|term| {
                            let mut leases = self.client_leases.lock();
                            leases.observe_leadership(Some(term), tokio::time::Instant::now());
                            leases.open(id, received)
                        });
                        match lease {
                            Some(lease) => Reply::ok(&OpenClientReply {
                                client: id,
                                lease_ms: millis(lease),
                            }),
                            None => Reply::error(Status::Retry, "client lease not granted"),
                        }
                    }
                    Ok(CommandResult::Rejected { status, detail }) => Reply::error(status, detail),
                    Ok(other) => Reply::error(Status::Internal, format!("unexpected {other:?}")),
                    Err(reply) => reply,
                }
            }
            proto::RenewClientLease::OPCODE => {
                let request: RenewClientLeaseRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                // Read before the barrier: a later leader first sees the client after it.
                let received = tokio::time::Instant::now();
                if let Err(reply) = self.read_barrier().await {
                    return reply;
                }
                let open = self
                    .node
                    .with_state(|state| state.client_open(request.client));
                let lease = open
                    .then(|| self.renew_client(request.client, received))
                    .flatten();
                match lease {
                    Some(lease) => Reply::ok(&RenewClientLeaseReply {
                        lease_ms: millis(lease),
                    }),
                    None => Reply::error(
                        Status::ClientLeaseExpired,
                        format!(
                            "{} did not renew its lease within {:?}",
                            request.client,
                            self.client_leases.lock().lease()
                        ),
                    ),
                }
            }
            proto::CheckClientLeases::OPCODE => {
                let request: CheckClientLeasesRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                if request.clients.len() > CLIENT_LEASE_CHECKS_MAX {
                    return Reply::error(
                        Status::InvalidArgument,
                        format!(
                            "{} clients asked about, more than {CLIENT_LEASE_CHECKS_MAX}",
                            request.clients.len()
                        ),
                    );
                }
                let received = tokio::time::Instant::now();
                if let Err(reply) = self.read_barrier().await {
                    return reply;
                }
                let open: Vec<bool> = self.node.with_state(|state| {
                    request
                        .clients
                        .iter()
                        .map(|&c| state.client_open(c))
                        .collect()
                });
                let Some(term) = self.node.leader_term() else {
                    return Reply::error(Status::Retry, "no longer the coordinators' leader");
                };
                let mut leases = self.client_leases.lock();
                leases.observe_leadership(Some(term), tokio::time::Instant::now());
                let states = request
                    .clients
                    .iter()
                    .zip(open)
                    .map(|(&client, open)| {
                        let remaining = leases.remaining(client, received);
                        match (open, remaining.is_zero()) {
                            (false, _) => ClientLeaseState::Expired,
                            (true, true) => ClientLeaseState::Lapsed,
                            (true, false) => ClientLeaseState::Valid {
                                ms: millis(remaining),
                            },
                        }
                    })
                    .collect();
                Reply::ok(&CheckClientLeasesReply { leases: states })
            }
            proto::ReserveVersions::OPCODE => {
                let request: ReserveVersionsRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let command = Command::ReserveVersions {
                    server: request.server,
                    ceiling: request.ceiling,
                };
                match self.apply(command).await {
                    Ok(CommandResult::VersionsReserved { ceiling }) => {
                        Reply::ok(&ReserveVersionsReply { ceiling })
                    }
                    Ok(other) => rejected(other),
                    Err(reply) => reply,
                }
            }
            proto::SetOpenEpoch::OPCODE => {
                let request: SetOpenEpochRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let command = Command::SetOpenEpoch {
                    server: request.server,
                    segment: request.segment,
                    epoch: request.epoch,
                };
                match self.apply(command).await {
                    Ok(CommandResult::EpochRecorded) => {
                        tracing::info!(
                            server = %request.server, segment = %request.segment,
                            epoch = %request.epoch, "open segment epoch recorded"
                        );
                        Reply::ok(&())
                    }
                    Ok(other) => rejected(other),
                    Err(reply) => reply,
                }
            }
            proto::RecoveryStatus::OPCODE => {
                if !self.node.is_leader() {
                    return Reply::error(Status::NotLeader, self.node.hint().encode());
                }
                Reply::ok(&RecoveryStatusReply {
                    recoveries: self.recovery.reports(),
                })
            }
            proto::RaftMessages::OPCODE => {
                let request: RaftMessagesRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                if request.group != self.node.group() {
                    let detail = format!(
                        "raft messages from coordinator {} of group {:016x}; this coordinator \
                         belongs to group {:016x} (another cluster, or a member of an old \
                         group left running after the group was re-created)",
                        request.from,
                        request.group,
                        self.node.group()
                    );
                    return Reply::error(Status::InvalidArgument, detail);
                }
                if !self.node.peers().contains_key(&request.from) {
                    let detail = format!(
                        "raft messages from {}, which is not a member of this group",
                        request.from
                    );
                    return Reply::error(Status::InvalidArgument, detail);
                }
                let messages = match crate::node::decode_messages(&request) {
                    Ok(messages) => messages,
                    Err(detail) => return Reply::error(Status::MalformedRequest, detail),
                };
                match self.node.receive(messages) {
                    Ok(()) => Reply::ok(&()),
                    Err(e) => node_error_reply(e),
                }
            }
            other => Reply::error(
                Status::UnknownOpcode,
                format!("coordinator does not serve {other}"),
            ),
        }
    }
}

/// What a command is, for messages.
fn command_name(command: &Command) -> &'static str {
    match command {
        Command::EnlistServer { .. } => "enlistment",
        Command::SetServerStatus { .. } => "server status change",
        Command::CreateTable { .. } => "create-table",
        Command::DropTable { .. } => "drop-table",
        Command::SetWill { .. } => "will upload",
        Command::RecoveredPartition { .. } => "recovered partition",
        Command::AllowLoss { .. } => "allow-loss",
        Command::SetOpenEpoch { .. } => "open segment epoch",
        Command::ReserveVersions { .. } => "version reservation",
        Command::OpenClient | Command::OpenClientWithoutLease => "client opening",
        Command::ExpireClients { .. } => "client expiry",
    }
}

/// The reply for a proposal or read the node did not carry out.
/// A duration in whole milliseconds, saturating (leases are far shorter).
fn millis(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}

fn node_error_reply(error: NodeError) -> Reply {
    match error {
        NodeError::NotLeader(hint) => Reply::error(Status::NotLeader, hint.encode()),
        NodeError::Dropped | NodeError::Busy | NodeError::OutcomeUnknown => {
            Reply::error(Status::Retry, error.to_string())
        }
        NodeError::Stopped(_) => Reply::error(Status::ShuttingDown, error.to_string()),
    }
}

fn rejected(result: CommandResult) -> Reply {
    match result {
        CommandResult::Rejected { status, detail } => Reply::error(status, detail),
        other => Reply::error(Status::Internal, format!("unexpected result {other:?}")),
    }
}

impl Service for CoordinatorService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        Box::pin(self.handle_request(opcode, payload))
    }
}

/// A tablet push that did not get through.
#[derive(Debug)]
struct FailedPush {
    owner: ServerId,
    error: String,
}
