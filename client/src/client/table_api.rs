//! The table API: creating, dropping and naming tables, splitting and moving tablets,
//! and single-object reads, writes, removes and increments.

use bytes::Bytes;
use rampart_common::ids::{MoveId, ServerId, TableId, Version};
use rampart_common::protocol::coordinator::{
    CancelMove, CreateTable, CreateTableRequest, DrainReply, DrainServer, DropTable,
    DropTableRequest, GetDrain, GetTableId, MoveIdRequest, MoveTablets, MoveTabletsReply,
    MoveTabletsRequest, Rebalance, RebalanceAction, RebalanceReply, RebalanceRequest,
    ServerIdRequest, SplitTablet, SplitTabletRequest, TableNameRequest,
};
use rampart_common::protocol::master::{
    Increment, IncrementRequest, Read, ReadRequest, Remove, RemoveRequest, Write, WriteReply,
    WriteRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;

use super::coordinators::MOVE_TIMEOUT;
use super::retry::Attempt;
use super::state::{Client, Object};
use crate::error::ClientError;

impl Client {
    /// Creates table `name` split over `span` tablets (spread over the masters), or
    /// returns the id of the existing table of that name.
    pub async fn create_table(&self, name: &str, span: u32) -> Result<TableId, ClientError> {
        let request = CreateTableRequest {
            name: name.to_string(),
            span,
        };
        let deadline = self.retry().deadline;
        let id = self
            .coordinator_call_patient::<CreateTable>(&request, deadline)
            .await?
            .id;
        self.refresh_map(self.map().version, deadline).await?;
        Ok(id)
    }

    /// Drops table `name` and all its objects. Dropping a missing table succeeds.
    ///
    /// The name is looked up once (at the coordinators, not in the cached map) and the
    /// table dropped by its id, so that a drop retried after an unknown outcome never
    /// drops a table another client created under the same name meanwhile.
    pub async fn drop_table(&self, name: &str) -> Result<(), ClientError> {
        let deadline = self.retry().deadline;
        let request = TableNameRequest {
            name: name.to_string(),
        };
        let id = match self
            .coordinator_call::<GetTableId>(&request, deadline)
            .await
        {
            Ok(reply) => reply.id,
            Err(ClientError::TableDoesntExist(_)) => return Ok(()),
            Err(error) => return Err(error),
        };
        self.drop_table_id(id).await
    }

    /// Drops the table with id `id` and all its objects; succeeds if it no longer exists.
    pub async fn drop_table_id(&self, id: TableId) -> Result<(), ClientError> {
        let deadline = self.retry().deadline;
        self.coordinator_call_patient::<DropTable>(&DropTableRequest { id }, deadline)
            .await?;
        self.refresh_map(self.map().version, deadline).await
    }

    /// Splits the tablet of table `table` that holds hash `at` in two, `[start, at - 1]`
    /// and `[at, end]`, both kept by its owner (no data moves; an operator's step before
    /// moving one half elsewhere). Returns the tablets that now meet at `at`, and whether
    /// the split was made now: false when a tablet started at `at` already, which is
    /// also what a retry of this call after a lost reply sees of its own split.
    /// While the owner is being recovered, the coordinators answer `Retry`, and this
    /// retries until the client's deadline. The cached map is refreshed after, best
    /// effort: the split is made whether or not that refresh succeeds.
    pub async fn split_tablet(
        &self,
        table: TableId,
        at: u64,
    ) -> Result<(Vec<Tablet>, bool), ClientError> {
        let deadline = self.retry().deadline;
        let request = SplitTabletRequest { table, at };
        let reply = self
            .coordinator_call_patient::<SplitTablet>(&request, deadline)
            .await?;
        if let Err(error) = self.refresh_map(self.map().version, deadline).await {
            tracing::debug!(%error, "tablet map not refreshed after a split");
        }
        Ok((reply.tablets, reply.split))
    }

    /// Moves the tablets of table `table` covering hashes `start..=end` to master
    /// `target` (splitting first where a tablet reaches past either end), under load:
    /// the target copies them live and the range is frozen only for the last changes
    /// (module doc of `coordinator::mover`). One move per run of one owner's tablets, in
    /// turn, passing over those on `target` already. Returns once every move is
    /// committed; the cached map is refreshed after, best effort. A move that fails is
    /// aborted, and its tablets stay where they were ([`ClientError::Server`] says why;
    /// those moved before it stay moved). Waits up to [`MOVE_TIMEOUT`] in all.
    pub async fn move_tablets(
        &self,
        table: TableId,
        start: u64,
        end: u64,
        target: ServerId,
    ) -> Result<MoveTabletsReply, ClientError> {
        let request = MoveTabletsRequest {
            table,
            start,
            end,
            target,
        };
        let deadline = tokio::time::Instant::now() + MOVE_TIMEOUT;
        let reply = self
            .coordinator_call_within::<MoveTablets>(&request, deadline, MOVE_TIMEOUT)
            .await?;
        if let Err(error) = self
            .refresh_map(self.map().version, self.retry().deadline)
            .await
        {
            tracing::debug!(%error, "tablet map not refreshed after a move");
        }
        Ok(reply)
    }

    /// Begins draining server `server` (its tablets move to other masters, the masters
    /// re-create the replicas on its backup elsewhere, then it is removed; the leader
    /// drives it, `coordinator::drainer`). Returns where the drain stands; a repeat
    /// changes nothing. Refused for a server that is not `Up`, or whose tablets no
    /// other master could take.
    pub async fn drain_server(&self, server: ServerId) -> Result<DrainReply, ClientError> {
        let deadline = self.retry().deadline;
        self.coordinator_call_patient::<DrainServer>(&ServerIdRequest { server }, deadline)
            .await
    }

    /// Where the drain of server `server` stands.
    pub async fn drain_status(&self, server: ServerId) -> Result<DrainReply, ClientError> {
        let deadline = self.retry().deadline;
        self.coordinator_call_patient::<GetDrain>(&ServerIdRequest { server }, deadline)
            .await
    }

    /// Cancels open move `id` (`rampart rebalance` lists them): the target forgets its
    /// copy, the source serves the range again, and the move's caller is answered
    /// `MoveAborted`. Refused for a move that is not open.
    pub async fn cancel_move(&self, id: MoveId) -> Result<(), ClientError> {
        let deadline = self.retry().deadline;
        self.coordinator_call_patient::<CancelMove>(&MoveIdRequest { id }, deadline)
            .await
    }

    /// Asks the rebalancer to show where it stands, or to pause, resume, pin or unpin
    /// first (`coordinator::rebalancer`); answers the leader's view.
    pub async fn rebalance(&self, action: RebalanceAction) -> Result<RebalanceReply, ClientError> {
        let deadline = self.retry().deadline;
        self.coordinator_call_patient::<Rebalance>(&RebalanceRequest { action }, deadline)
            .await
    }

    /// The id of table `name`.
    pub async fn get_table_id(&self, name: &str) -> Result<TableId, ClientError> {
        if let Some(id) = self.map().table_id(name) {
            return Ok(id);
        }
        let request = TableNameRequest {
            name: name.to_string(),
        };
        self.coordinator_call::<GetTableId>(&request, self.retry().deadline)
            .await
            .map(|reply| reply.id)
    }

    /// Reads `key`; `None` if it does not exist.
    pub async fn read(&self, table: TableId, key: &[u8]) -> Result<Option<Object>, ClientError> {
        let request = ReadRequest {
            table,
            key: Bytes::copy_from_slice(key),
        };
        let deadline = self.deadline();
        self.on_owner_call::<Read, _>(table, key, deadline, &request, |addr, reply| {
            match reply.status {
                Status::ObjectDoesntExist => Attempt::Done(Ok(None)),
                status => outcome(addr, status, reply.version, || {
                    Some(Object {
                        value: reply.value.clone(),
                        version: reply.version,
                    })
                }),
            }
        })
        .await
    }

    /// Writes `value` under `key`; returns the new version.
    pub async fn write(
        &self,
        table: TableId,
        key: &[u8],
        value: &[u8],
    ) -> Result<Version, ClientError> {
        self.write_with(table, key, value, RejectRules::default())
            .await
    }

    /// Writes `value` under `key` unless `rules` refuse; returns the new version.
    pub async fn write_with(
        &self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        rules: RejectRules,
    ) -> Result<Version, ClientError> {
        let deadline = self.deadline();
        let ticket = self.ticket(deadline).await?;
        let request = WriteRequest {
            table,
            key: Bytes::copy_from_slice(key),
            value: Bytes::copy_from_slice(value),
            rules,
            rifl: ticket.rifl(),
        };
        let result = self
            .on_owner_call::<Write, _>(table, key, deadline, &request, write_attempt)
            .await;
        self.settle(ticket.tracker(), &result);
        result
    }

    /// Removes `key`; returns the version removed, `None` if there was no object.
    pub async fn remove(&self, table: TableId, key: &[u8]) -> Result<Option<Version>, ClientError> {
        self.remove_with(table, key, RejectRules::default()).await
    }

    /// Removes `key` unless `rules` refuse; returns the version removed.
    pub async fn remove_with(
        &self,
        table: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<Option<Version>, ClientError> {
        let deadline = self.deadline();
        let ticket = self.ticket(deadline).await?;
        let request = RemoveRequest {
            table,
            key: Bytes::copy_from_slice(key),
            rules,
            rifl: ticket.rifl(),
        };
        let result = self
            .on_owner_call::<Remove, _>(table, key, deadline, &request, write_attempt)
            .await;
        self.settle(ticket.tracker(), &result);
        drop(ticket);
        let version = result?;
        Ok((version != Version(0)).then_some(version))
    }

    /// Adds `delta` to the 8-byte little-endian integer under `key` (a missing object
    /// counts as 0); returns the new value and version.
    pub async fn increment(
        &self,
        table: TableId,
        key: &[u8],
        delta: i64,
    ) -> Result<(i64, Version), ClientError> {
        self.increment_with(table, key, delta, RejectRules::default())
            .await
    }

    /// Like [`increment`](Self::increment) unless `rules` refuse.
    pub async fn increment_with(
        &self,
        table: TableId,
        key: &[u8],
        delta: i64,
        rules: RejectRules,
    ) -> Result<(i64, Version), ClientError> {
        let deadline = self.deadline();
        let ticket = self.ticket(deadline).await?;
        let request = IncrementRequest {
            table,
            key: Bytes::copy_from_slice(key),
            delta,
            rules,
            rifl: ticket.rifl(),
        };
        let result = self
            .on_owner_call::<Increment, _>(table, key, deadline, &request, |addr, reply| {
                outcome(addr, reply.status, reply.version, || {
                    (reply.value, reply.version)
                })
            })
            .await;
        self.settle(ticket.tracker(), &result);
        result
    }
}

/// The retry loop's next step for a single-object reply: `ok` builds the success value.
fn outcome<T>(addr: &str, status: Status, version: Version, ok: impl FnOnce() -> T) -> Attempt<T> {
    match status {
        Status::Ok => Attempt::Done(Ok(ok())),
        Status::UnknownTablet => Attempt::Reroute(format!("{addr}: unknown tablet")),
        Status::Retry => Attempt::Later(format!("{addr}: busy")),
        other => Attempt::Done(Err(ClientError::from_status(other, version, String::new()))),
    }
}

fn write_attempt(addr: &str, reply: WriteReply) -> Attempt<Version> {
    outcome(addr, reply.status, reply.version, || reply.version)
}
