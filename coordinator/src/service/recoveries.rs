//! Crash recovery, as operators see it: `AllowLoss` (let the recovery of a server whose
//! log is incomplete go on) and `RecoveryStatus` (the leader's reports of the
//! recoveries it ran or runs). The recoveries themselves are `crate::recovery_manager`'s.

use rampart_common::protocol::coordinator::{RecoveryStatusReply, ServerIdRequest};
use rampart_common::rpc::Reply;
use rampart_common::status::Status;

use super::shared::{rejected, CoordinatorService};
use crate::state::{Command, CommandResult};

impl CoordinatorService {
    /// `AllowLoss`: commits the operator's consent to lose what missing replicas held.
    pub(super) async fn allow_loss(&self, request: ServerIdRequest) -> Result<(), Reply> {
        match self
            .apply(Command::AllowLoss {
                server: request.server,
            })
            .await?
        {
            CommandResult::LossAllowed => {
                tracing::warn!(server = %request.server, "operator allowed the recovery to lose data");
                Ok(())
            }
            other => Err(rejected(other)),
        }
    }

    /// `RecoveryStatus`, answered by the leader only. Its request carries nothing, and
    /// its payload is not read.
    pub(super) async fn recovery_status(&self) -> Reply {
        if !self.node.is_leader() {
            return Reply::error(Status::NotLeader, self.node.hint().encode());
        }
        Reply::ok(&RecoveryStatusReply {
            recoveries: self.recovery.reports(),
        })
    }
}
