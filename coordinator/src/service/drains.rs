//! Draining a server (`DrainServer`, `GetDrain`, `ListDrains`): the drain is committed here and
//! driven by the leader's `crate::drainer`.

use rampart_common::protocol::coordinator::{
    DrainReply, ListDrainsReply, ListDrainsRequest, ServerIdRequest,
};
use rampart_common::rpc::Reply;
use rampart_common::status::Status;

use super::shared::{rejected, CoordinatorService};
use crate::state::{Command, CommandResult};

impl CoordinatorService {
    /// `DrainServer`: commits the drain (a repeat changes nothing) and answers where it
    /// stands. Refused (`NotEnoughServers`) when the backups left without the server
    /// could not hold every master's replicas (`crate::drainer::backups_short`): its
    /// drain would make writes wait.
    pub(super) async fn drain_server(&self, request: ServerIdRequest) -> Result<DrainReply, Reply> {
        let server = request.server;
        let _checked_alone = self.drain_lock.lock().await;
        let draining = self.node.with_state(|state| state.is_draining(server));
        if !draining {
            let Some(replicas) = self.drainer.replicas().await else {
                return Err(Reply::error(
                    Status::Retry,
                    format!("cannot drain {server} yet: no master said how many replicas it keeps"),
                ));
            };
            let short = self
                .node
                .with_state(|state| crate::drainer::backups_short(state, server, replicas));
            if let Some(short) = short {
                return Err(Reply::error(
                    Status::NotEnoughServers,
                    format!("cannot drain {server}: {short}"),
                ));
            }
        }
        match self.apply(Command::DrainServer { id: server }).await? {
            CommandResult::DrainBegun { begun, .. } => {
                if begun {
                    tracing::info!(%server, "drain begun");
                }
                self.drain_progress(request)
            }
            other => Err(rejected(other)),
        }
    }

    /// `GetDrain`, linearizable.
    pub(super) async fn get_drain(&self, request: ServerIdRequest) -> Result<DrainReply, Reply> {
        self.read_barrier().await?;
        self.drain_progress(request)
    }

    /// `ListDrains`, linearizable.
    pub(super) async fn list_drains(
        &self,
        _request: ListDrainsRequest,
    ) -> Result<ListDrainsReply, Reply> {
        self.read_barrier().await?;
        let drains = self.node.with_state(|state| {
            state
                .draining()
                .filter_map(|server| self.drainer.progress(state, server))
                .collect()
        });
        Ok(ListDrainsReply { drains })
    }

    fn drain_progress(&self, request: ServerIdRequest) -> Result<DrainReply, Reply> {
        self.node
            .with_state(|state| self.drainer.progress(state, request.server))
            .ok_or_else(|| {
                Reply::error(
                    Status::InvalidArgument,
                    format!("unknown server {}", request.server),
                )
            })
    }
}
