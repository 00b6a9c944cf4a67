//! `CoordinatorService`: the coordinator's RPC handlers over [`CoordinatorState`].
//!
//! Every change is a [`Command`] applied to the state machine (a later issue replicates
//! the same commands through Raft). Changes that move tablets are followed by pushes to
//! the masters concerned: `TakeTablets` after a table is created, `DropTablets` after
//! it is dropped. Changes and their pushes are serialised by one async mutex, so two
//! concurrent creates/drops of one name cannot reach a master in the wrong order.
//!
//! # Failure handling
//! If a master cannot be reached to take its tablets, `create_table` answers `Retry`
//! (the table exists; the client library retries, and a repeated create re-pushes the
//! tablets, because create is idempotent by name). A failed `DropTablets` push is only
//! logged: the table is already gone from the map, its id is never reused, so no client
//! can reach the stale tablet through a fresh map.

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{
    self as proto, CreateTableRequest, EnlistReply, EnlistRequest, TableIdReply, TableNameRequest,
};
use rampart_common::protocol::master::{DropTablets, TabletsRequest, TakeTablets};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, RpcPool, Service};
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::state::{Command, CommandResult, CoordinatorState};

/// How long a create or drop waits for the masters to take or drop their tablets.
pub const TABLET_PUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// Pause between attempts to push tablets to an unreachable master.
pub const TABLET_PUSH_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// How long the coordinator keeps retrying, in the background, a `DropTablets` that a
/// master missed. (With failure detection, a master gone this long is declared dead.)
pub const DROP_PUSH_RETRY_WINDOW: Duration = Duration::from_secs(600);

/// The coordinator service of one coordinator process.
#[derive(Debug, Default)]
pub struct CoordinatorService {
    /// The configuration. A blocking mutex: nothing awaits while holding it.
    state: Mutex<CoordinatorState>,
    /// Serialises configuration changes together with the pushes that follow them.
    changes: tokio::sync::Mutex<()>,
    /// Connections to masters.
    pool: Arc<RpcPool>,
}

impl CoordinatorService {
    /// A coordinator with an empty configuration.
    pub fn new() -> CoordinatorService {
        CoordinatorService::default()
    }

    /// A copy of the current state (for status pages and tests).
    pub fn state(&self) -> CoordinatorState {
        self.state.lock().clone()
    }

    fn apply(&self, command: &Command) -> CommandResult {
        let result = self.state.lock().apply(command);
        tracing::debug!(?command, ?result, "applied");
        result
    }

    /// Sends `tablets`, grouped by owner, with RPC `R` (take or drop), retrying
    /// transport failures until `deadline` (a master may be between enlisting and
    /// serving); returns the pushes that did not get through.
    async fn push<R>(&self, tablets: &[Tablet], deadline: Instant) -> Vec<FailedPush>
    where
        R: Rpc<Request = TabletsRequest, Reply = ()>,
    {
        let mut by_owner: BTreeMap<ServerId, Vec<Tablet>> = BTreeMap::new();
        for tablet in tablets {
            by_owner.entry(tablet.owner).or_default().push(*tablet);
        }
        let addrs: BTreeMap<ServerId, String> = {
            let state = self.state.lock();
            by_owner
                .keys()
                .filter_map(|id| state.server(*id).map(|s| (*id, s.addr.clone())))
                .collect()
        };
        let pushes = by_owner.into_iter().map(|(owner, tablets)| {
            let addr = addrs.get(&owner).cloned();
            async move {
                let Some(addr) = addr else {
                    let error = "not in the server list".to_string();
                    return Some(FailedPush {
                        owner,
                        addr: None,
                        tablets,
                        error,
                    });
                };
                let request = TabletsRequest { tablets };
                match push_until::<R>(&self.pool, &addr, &request, deadline).await {
                    Ok(()) => None,
                    Err(error) => {
                        let tablets = request.tablets;
                        Some(FailedPush {
                            owner,
                            addr: Some(addr),
                            tablets,
                            error,
                        })
                    }
                }
            }
        });
        futures::future::join_all(pushes)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Keeps pushing `DropTablets` to masters that missed it, in the background, for up
    /// to [`DROP_PUSH_RETRY_WINDOW`]: until a master drops the tablets it keeps serving
    /// them to clients with a stale map, and keeps their memory.
    fn retry_drops_in_background(&self, failed: Vec<FailedPush>) {
        let pool = Arc::clone(&self.pool);
        tokio::spawn(async move {
            let give_up = Instant::now() + DROP_PUSH_RETRY_WINDOW;
            for push in failed {
                let Some(addr) = push.addr else { continue };
                let request = TabletsRequest {
                    tablets: push.tablets,
                };
                match push_until::<DropTablets>(&pool, &addr, &request, give_up).await {
                    Ok(()) => tracing::info!(owner = %push.owner, "late drop of tablets delivered"),
                    Err(error) => tracing::error!(
                        owner = %push.owner, %error,
                        "master never dropped the tablets of a dropped table"
                    ),
                }
            }
        });
    }

    async fn handle_request(&self, opcode: Opcode, payload: Bytes) -> Reply {
        match opcode {
            proto::Enlist::OPCODE => {
                let request: EnlistRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let _change = self.changes.lock().await;
                let command = Command::EnlistServer {
                    addr: request.addr.clone(),
                    services: request.services,
                    failure_domain: request.failure_domain,
                    disk_read_mbps: request.disk_read_mbps,
                };
                match self.apply(&command) {
                    CommandResult::Enlisted { id } => {
                        tracing::info!(%id, addr = %request.addr, "server enlisted");
                        Reply::ok(&EnlistReply { id })
                    }
                    other => rejected(other),
                }
            }
            proto::CreateTable::OPCODE => {
                let request: CreateTableRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let _change = self.changes.lock().await;
                let command = Command::CreateTable {
                    name: request.name.clone(),
                    span: request.span,
                };
                match self.apply(&command) {
                    CommandResult::TableCreated {
                        id,
                        tablets,
                        created,
                    } => {
                        if created {
                            tracing::info!(%id, name = %request.name, span = request.span, "table created");
                        }
                        let deadline = Instant::now() + TABLET_PUSH_TIMEOUT;
                        let failed = self.push::<TakeTablets>(&tablets, deadline).await;
                        if failed.is_empty() {
                            Reply::ok(&TableIdReply { id })
                        } else {
                            let why: Vec<String> = failed
                                .iter()
                                .map(|f| format!("{}: {}", f.owner, f.error))
                                .collect();
                            let why = why.join("; ");
                            tracing::warn!(%id, %why, "masters did not take their tablets");
                            let detail = format!(
                                "table {id} created, but its masters did not take it: {why}"
                            );
                            Reply::error(Status::Retry, detail)
                        }
                    }
                    other => rejected(other),
                }
            }
            proto::DropTable::OPCODE => {
                let request: TableNameRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let _change = self.changes.lock().await;
                match self.apply(&Command::DropTable {
                    name: request.name.clone(),
                }) {
                    CommandResult::TableDropped { id, tablets } => {
                        if let Some(id) = id {
                            tracing::info!(%id, name = %request.name, "table dropped");
                        }
                        let deadline = Instant::now() + TABLET_PUSH_TIMEOUT;
                        let failed = self.push::<DropTablets>(&tablets, deadline).await;
                        if !failed.is_empty() {
                            tracing::warn!(?failed, "masters did not drop their tablets; retrying");
                            self.retry_drops_in_background(failed);
                        }
                        Reply::ok(&())
                    }
                    other => rejected(other),
                }
            }
            proto::GetTableId::OPCODE => {
                let request: TableNameRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                match self.state.lock().table_id(&request.name) {
                    Some(id) => Reply::ok(&TableIdReply { id }),
                    None => Reply::error(Status::TableDoesntExist, request.name),
                }
            }
            proto::GetTabletMap::OPCODE => Reply::ok(&self.state.lock().tablet_map()),
            other => Reply::error(
                Status::UnknownOpcode,
                format!("coordinator does not serve {other}"),
            ),
        }
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
    addr: Option<String>,
    tablets: Vec<Tablet>,
    error: String,
}

/// Calls `R` on `addr` until it succeeds, answers an error, or `deadline` passes,
/// pausing [`TABLET_PUSH_RETRY_PAUSE`] after each transport failure.
async fn push_until<R>(
    pool: &RpcPool,
    addr: &str,
    request: &TabletsRequest,
    deadline: Instant,
) -> Result<(), String>
where
    R: Rpc<Request = TabletsRequest, Reply = ()>,
{
    loop {
        match pool.call::<R>(addr, request, deadline).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transport() && Instant::now() < deadline => {
                tokio::time::sleep(TABLET_PUSH_RETRY_PAUSE).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
