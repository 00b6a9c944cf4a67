//! Rebalancing (`ReportLoad`, `Rebalance`): the masters' load reports, kept by the
//! leader's `crate::rebalancer`, and the operator's view, pause and pins.

use rampart_common::protocol::coordinator::{
    RebalanceAction, RebalanceReply, RebalanceRequest, ReportLoadRequest, LOAD_REPORT_TABLETS_MAX,
};
use rampart_common::rpc::Reply;
use rampart_common::status::Status;

use super::shared::{rejected, CoordinatorService};
use crate::state::{Command, CommandResult};

impl CoordinatorService {
    /// `ReportLoad`: kept by the leader's rebalancer (a follower answers `NotLeader`:
    /// loads live in the leader's memory).
    pub(super) async fn report_load(&self, request: ReportLoadRequest) -> Result<(), Reply> {
        if !self.node.is_leader() {
            return Err(Reply::error(Status::NotLeader, self.node.hint().encode()));
        }
        if request.tablets.len() > LOAD_REPORT_TABLETS_MAX {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!(
                    "{} tablets in one load report, more than {LOAD_REPORT_TABLETS_MAX}",
                    request.tablets.len()
                ),
            ));
        }
        self.rebalancer.report(&request);
        Ok(())
    }

    /// `Rebalance`: pauses, resumes, pins or unpins (committed), then answers where
    /// rebalancing stands, as the leader sees it.
    pub(super) async fn rebalance(
        &self,
        request: RebalanceRequest,
    ) -> Result<RebalanceReply, Reply> {
        let command = match request.action {
            RebalanceAction::Show => None,
            RebalanceAction::Pause => Some(Command::SetRebalancePaused { paused: true }),
            RebalanceAction::Resume => Some(Command::SetRebalancePaused { paused: false }),
            RebalanceAction::Pin(range) => Some(Command::PinTablets { range, pin: true }),
            RebalanceAction::Unpin(range) => Some(Command::PinTablets { range, pin: false }),
            RebalanceAction::Cap(mb_per_s) => Some(Command::SetMoveCap { mb_per_s }),
        };
        match command {
            Some(command) => match self.apply(command).await? {
                CommandResult::RebalancingSet { .. } => {
                    tracing::info!(action = ?request.action, "rebalancer set by an operator");
                }
                other => return Err(rejected(other)),
            },
            None => {
                if !self.node.is_leader() {
                    return Err(Reply::error(Status::NotLeader, self.node.hint().encode()));
                }
                self.read_barrier().await?;
            }
        }
        Ok(self.node.with_state(|state| self.rebalancer.view(state)))
    }
}
