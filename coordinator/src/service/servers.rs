//! Storage servers: `Enlist` (and the server-list push that follows it), the masters'
//! lease renewals (`RenewLease`), failure reports (`ReportFailure`) and supervisors'
//! reports of exited processes (`ProcessExited`), and what a master
//! records at the coordinators: its will (`UploadWill`), the epoch of its open segment
//! (`SetOpenEpoch`), its version ceiling (`ReserveVersions`); and the tablets it owns
//! (`GetOwnedTablets`, linearizable).

use rampart_common::protocol::coordinator::{
    EnlistReply, EnlistRequest, OwnedTabletsReply, ProcessExitedRequest, RenewLeaseReply,
    RenewLeaseRequest, ReportFailureRequest, ReserveVersionsReply, ReserveVersionsRequest,
    ServerIdRequest, SetOpenEpochRequest, UploadWillRequest,
};
use rampart_common::rpc::Reply;
use rampart_common::status::Status;
use rampart_common::tablet::ServerStatus;

use super::shared::{node_error_reply, rejected, CoordinatorService};
use crate::state::{Command, CommandResult};

impl CoordinatorService {
    /// `Enlist`: commits a new server and tells the others the list changed.
    pub(super) async fn enlist(&self, request: EnlistRequest) -> Result<EnlistReply, Reply> {
        let command = Command::EnlistServer {
            addr: request.addr.clone(),
            services: request.services,
            failure_domain: request.failure_domain,
            disk_read_mbps: request.disk_read_mbps,
        };
        match self.apply(command).await? {
            CommandResult::Enlisted { id } => {
                tracing::info!(%id, addr = %request.addr, "server enlisted");
                self.push_server_list_version();
                Ok(EnlistReply { id })
            }
            other => Err(rejected(other)),
        }
    }

    /// Tells every `Up` server, in the background, that the server list changed.
    fn push_server_list_version(&self) {
        crate::push::push_server_list_version(&self.node, &self.pool);
    }

    /// `ReportFailure`: hands the suspect to the failure verifier.
    pub(super) async fn report_failure(&self, request: ReportFailureRequest) -> Result<(), Reply> {
        self.verifier
            .report_failure(request.server, &request.reporter)
            .map_err(node_error_reply)
    }

    /// `ProcessExited`: hands the supervisor's word to the failure verifier.
    pub(super) async fn process_exited(&self, request: ProcessExitedRequest) -> Result<(), Reply> {
        self.verifier
            .process_exited(request.server, &request.supervisor)
            .map_err(node_error_reply)
    }

    /// `RenewLease`, linearizable: the lease, tablet epoch and version ceiling of an `Up`
    /// master.
    pub(super) async fn renew_lease(
        &self,
        request: RenewLeaseRequest,
    ) -> Result<RenewLeaseReply, Reply> {
        // Linearizable: a deposed leader must not grant a lease to a server the
        // new leader already declared crashed.
        self.read_barrier().await?;
        let status = self
            .node
            .with_state(|state| state.server(request.server).map(|s| s.status));
        match status {
            Some(ServerStatus::Up) => Ok(RenewLeaseReply {
                lease_ms: u32::try_from(self.recovery.config().lease.as_millis())
                    .unwrap_or(u32::MAX),
                tablets_epoch: self
                    .node
                    .with_state(|state| state.tablet_epoch(request.server)),
                version_ceiling: self
                    .node
                    .with_state(|state| state.version_ceiling(request.server)),
            }),
            Some(ServerStatus::Removed)
                if self
                    .node
                    .with_state(|state| state.is_drained(request.server)) =>
            {
                Err(Reply::error(
                    Status::ServerDrained,
                    format!(
                        "{} was drained and removed: it holds nothing the cluster needs",
                        request.server
                    ),
                ))
            }
            Some(ServerStatus::Removed) => Err(Reply::error(
                Status::ServerCrashed,
                format!(
                    "{} was removed (recovered after a crash): it holds nothing the cluster \
                     needs",
                    request.server
                ),
            )),
            Some(_) => Err(Reply::error(
                Status::ServerCrashed,
                format!(
                    "{} was declared crashed; its tablets are recovered elsewhere",
                    request.server
                ),
            )),
            None => Err(Reply::error(
                Status::InvalidArgument,
                format!("{} never enlisted", request.server),
            )),
        }
    }

    /// `UploadWill`: commits a master's will.
    pub(super) async fn upload_will(&self, request: UploadWillRequest) -> Result<(), Reply> {
        let command = Command::SetWill {
            server: request.server,
            will: request.will,
        };
        match self.apply(command).await? {
            CommandResult::WillSet => Ok(()),
            other => Err(rejected(other)),
        }
    }

    /// `GetOwnedTablets`, linearizable: an `Up` server's tablets and tablet epoch.
    pub(super) async fn get_owned_tablets(
        &self,
        request: ServerIdRequest,
    ) -> Result<OwnedTabletsReply, Reply> {
        self.read_barrier().await?;
        let owned = self.node.with_state(|state| {
            let server = state.server(request.server)?;
            Some((
                server.status,
                state.tablet_epoch(request.server),
                state.tablets_of(request.server),
            ))
        });
        match owned {
            Some((ServerStatus::Up, epoch, tablets)) => Ok(OwnedTabletsReply { epoch, tablets }),
            Some(_) => Err(Reply::error(
                Status::ServerCrashed,
                format!("{} was declared crashed", request.server),
            )),
            None => Err(Reply::error(
                Status::InvalidArgument,
                format!("{} never enlisted", request.server),
            )),
        }
    }

    /// `ReserveVersions`: commits a master's new version ceiling.
    pub(super) async fn reserve_versions(
        &self,
        request: ReserveVersionsRequest,
    ) -> Result<ReserveVersionsReply, Reply> {
        let command = Command::ReserveVersions {
            server: request.server,
            ceiling: request.ceiling,
        };
        match self.apply(command).await? {
            CommandResult::VersionsReserved { ceiling } => Ok(ReserveVersionsReply { ceiling }),
            other => Err(rejected(other)),
        }
    }

    /// `SetOpenEpoch`: commits the epoch of a master's open segment.
    pub(super) async fn set_open_epoch(&self, request: SetOpenEpochRequest) -> Result<(), Reply> {
        let command = Command::SetOpenEpoch {
            server: request.server,
            segment: request.segment,
            epoch: request.epoch,
        };
        match self.apply(command).await? {
            CommandResult::EpochRecorded => {
                tracing::info!(
                    server = %request.server, segment = %request.segment,
                    epoch = %request.epoch, "open segment epoch recorded"
                );
                Ok(())
            }
            other => Err(rejected(other)),
        }
    }
}
