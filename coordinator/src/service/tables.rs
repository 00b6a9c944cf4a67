//! Tables and tablets: `CreateTable`, `DropTable`, `SplitTablet`, `GetTableId`,
//! `GetTabletMap`, and the pushes that tell the masters concerned what a create, drop or
//! split changed (`TakeTablets`, `DropTablets`, or `SyncTablets` for a split or a
//! retried create), under the table name's lock.

use rampart_common::ids::{ServerId, TableId, TabletEpoch};
use rampart_common::protocol::coordinator::{
    CreateTableRequest, DropTableRequest, MoveIdRequest, MoveState, MoveTabletsReply,
    MoveTabletsRequest, SplitTabletReply, SplitTabletRequest, TableIdReply, TableNameRequest,
    WatchTabletMapRequest, WATCH_TABLET_MAP_WAIT_MAX,
};
use rampart_common::protocol::master::{
    DropTablets, PingRequest, ServerStats, SyncTablets, SyncTabletsRequest, TabletsRequest,
    TakeTablets,
};
use rampart_common::rpc::{Reply, Rpc};
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, ServerStatus, Tablet, TabletMap};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::shared::{rejected, CoordinatorService};
use crate::state::{Command, CommandResult, CoordinatorState, MoveEnd};

/// How long a create, drop or split waits for the masters to take, drop or pull their
/// tablets.
pub const TABLET_PUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the leader asks a master that did not take its tablets why.
const EXPLAIN_TIMEOUT: Duration = Duration::from_millis(500);

impl CoordinatorService {
    /// `CreateTable`: commits the table (idempotent by name) and has its masters take
    /// their tablets, or catch up on a retry.
    pub(super) async fn create_table(
        &self,
        request: CreateTableRequest,
    ) -> Result<TableIdReply, Reply> {
        let _change = self.name_lock(&request.name).lock().await;
        let command = Command::CreateTable {
            name: request.name.clone(),
            span: request.span,
        };
        match self.apply(command).await? {
            CommandResult::TableCreated {
                id,
                tablets,
                created,
                epochs,
            } => {
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
                    Ok(TableIdReply { id })
                } else {
                    let why = self.explain_failed_pushes(&failed).await;
                    tracing::warn!(%id, %why, "masters did not take their tablets");
                    let detail =
                        format!("table {id} created, but its masters did not take it: {why}");
                    Err(Reply::error(Status::Retry, detail))
                }
            }
            other => Err(rejected(other)),
        }
    }

    /// `DropTable`: commits the drop (idempotent by id) and tells the masters, best
    /// effort (module doc).
    pub(super) async fn drop_table(&self, request: DropTableRequest) -> Result<(), Reply> {
        // The name's lock orders this drop with creates of that name and their
        // pushes. A table gone already (or never there) has nothing to drop; the
        // command is then a no-op, whatever a create of its old name did since.
        let name = self
            .node
            .with_state(|state| state.table(request.id).map(|t| t.name.clone()))
            .unwrap_or_default();
        let _change = self.name_lock(&name).lock().await;
        let command = Command::DropTable { id: request.id };
        match self.apply(command).await? {
            CommandResult::TableDropped {
                id,
                tablets,
                epochs,
            } => {
                if let Some(id) = id {
                    tracing::info!(%id, %name, "table dropped");
                }
                let deadline = Instant::now() + TABLET_PUSH_TIMEOUT;
                let failed = self.push::<DropTablets>(&tablets, &epochs, deadline).await;
                if !failed.is_empty() {
                    tracing::warn!(
                        ?failed,
                        "masters did not drop their tablets; they will at their next lease renewal"
                    );
                }
                Ok(())
            }
            other => Err(rejected(other)),
        }
    }

    /// `SplitTablet`: commits the split (idempotent) and has the owner catch up on its
    /// tablets, best effort: until it does, it serves both halves as the one tablet
    /// they were, which answers every request the same.
    pub(super) async fn split_tablet(
        &self,
        request: SplitTabletRequest,
    ) -> Result<SplitTabletReply, Reply> {
        // The name's lock orders the split with a drop of the table and its pushes.
        let name = self.table_name(request.table);
        let _change = self.name_lock(&name).lock().await;
        self.split_at(request.table, request.at).await
    }

    /// `MoveTablets`: splits where the range starts and after it ends, then moves the
    /// tablets between (`crate::mover`).
    pub(super) async fn move_tablets(
        &self,
        request: MoveTabletsRequest,
    ) -> Result<MoveTabletsReply, Reply> {
        let MoveTabletsRequest {
            table,
            start,
            end,
            target,
        } = request;
        if start > end {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!("empty range {start:#x}..={end:#x}"),
            ));
        }
        {
            let name = self.table_name(table);
            let _change = self.name_lock(&name).lock().await;
            self.split_at(table, start).await?;
            if let Some(after) = end.checked_add(1) {
                self.split_at(table, after).await?;
            }
        }
        // One move per run of one owner's tablets, in turn.
        let runs: Vec<HashRange> = self.node.with_state(|state| {
            let tablets = state
                .table(table)
                .map(|t| t.tablets.clone())
                .unwrap_or_default();
            crate::mover::owner_runs(&tablets, start, end)
                .into_iter()
                .filter(|&(_, owner)| owner != target)
                .map(|(range, _)| range)
                .collect()
        });
        let mut moves = Vec::with_capacity(runs.len());
        for range in runs {
            moves.push(self.mover.move_range(range, target).await?);
        }
        Ok(MoveTabletsReply { moves })
    }

    /// `CancelMove`: aborts an open move (`crate::mover`).
    pub(super) async fn cancel_move(&self, request: MoveIdRequest) -> Result<(), Reply> {
        if !self.node.is_leader() {
            return Err(Reply::error(Status::NotLeader, self.node.hint().encode()));
        }
        self.mover.cancel(request.id).await?;
        tracing::info!(id = %request.id, "move cancelled by an operator");
        Ok(())
    }

    /// `GetMove`, linearizable.
    pub(super) async fn get_move(&self, request: MoveIdRequest) -> Result<MoveState, Reply> {
        self.read_barrier().await?;
        Ok(self.node.with_state(|state| {
            if state.open_move(request.id).is_some() {
                MoveState::Open
            } else {
                match state.move_end(request.id) {
                    Some(MoveEnd::Committed) => MoveState::Committed,
                    Some(MoveEnd::Aborted) => MoveState::Aborted,
                    None => MoveState::Unknown,
                }
            }
        }))
    }

    /// The name of table `id` (empty if there is none): the key of its lock.
    fn table_name(&self, id: TableId) -> String {
        self.node
            .with_state(|state| state.table(id).map(|t| t.name.clone()))
            .unwrap_or_default()
    }

    /// Splits table `table`'s tablet holding `at` there (`SplitTablet`) and tells its
    /// owner, best effort; the caller holds the table's name lock.
    async fn split_at(&self, table: TableId, at: u64) -> Result<SplitTabletReply, Reply> {
        match self.apply(Command::SplitTablet { table, at }).await? {
            CommandResult::TabletSplit {
                tablets,
                split,
                epochs,
            } => {
                if split {
                    tracing::info!(%table, at, ?tablets, "tablet split");
                }
                let deadline = Instant::now() + TABLET_PUSH_TIMEOUT;
                let sync = |owner, epoch| SyncTabletsRequest { owner, epoch };
                let failed = self
                    .tell_owners::<SyncTablets>(&epochs, sync, deadline)
                    .await;
                if !failed.is_empty() {
                    tracing::warn!(
                        ?failed,
                        "the owner did not catch up on its split tablet; it will at its next lease renewal"
                    );
                }
                Ok(SplitTabletReply { tablets, split })
            }
            other => Err(rejected(other)),
        }
    }

    /// `GetTableId`, linearizable.
    pub(super) async fn get_table_id(
        &self,
        request: TableNameRequest,
    ) -> Result<TableIdReply, Reply> {
        self.read_barrier().await?;
        match self.node.with_state(|state| state.table_id(&request.name)) {
            Some(id) => Ok(TableIdReply { id }),
            None => Err(Reply::error(Status::TableDoesntExist, request.name)),
        }
    }

    /// `GetTabletMap`, linearizable. Its request carries nothing, and its payload is not
    /// read.
    pub(super) async fn get_tablet_map(&self) -> Reply {
        match self.read_barrier().await {
            Ok(()) => Reply::ok(&self.node.with_state(CoordinatorState::tablet_map)),
            Err(reply) => reply,
        }
    }

    /// `WatchTabletMap`: the map once newer than `seen`, or as it is once the wait (at
    /// most [`WATCH_TABLET_MAP_WAIT_MAX`]) is over; at once when
    /// `WATCH_TABLET_MAP_WAITERS_MAX` watches wait already. One read barrier at the
    /// start (as `GetTabletMap`): what this member applies after it is newer still, so a
    /// wake-up only compares versions, and the map is built once, to answer.
    pub(super) async fn watch_tablet_map(
        &self,
        request: WatchTabletMapRequest,
    ) -> Result<TabletMap, Reply> {
        let wait = Duration::from_millis(u64::from(request.wait_ms)).min(WATCH_TABLET_MAP_WAIT_MAX);
        let deadline = Instant::now() + wait;
        let _waiting = Arc::clone(&self.map_watchers).try_acquire_owned().ok();
        let deadline = if _waiting.is_some() {
            deadline
        } else {
            Instant::now()
        };
        self.read_barrier().await?;
        loop {
            let applied = self.node.state_applied();
            tokio::pin!(applied);
            applied.as_mut().enable();
            let version = self.node.with_state(CoordinatorState::version);
            if version > request.seen || Instant::now() >= deadline {
                return Ok(self.node.with_state(CoordinatorState::tablet_map));
            }
            tokio::select! {
                () = &mut applied => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
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
}

/// A tablet push that did not get through.
#[derive(Debug)]
struct FailedPush {
    owner: ServerId,
    error: String,
}
