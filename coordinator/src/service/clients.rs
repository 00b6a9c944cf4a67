//! Clients: `OpenClient` (an id for exactly-once writes, and a lease), `RenewClientLease`,
//! and `CheckClientLeases`, which masters ask before they stage a client's write. The
//! leases live in the leader's memory (`crate::client_leases`); ids and expiries are
//! committed through Raft.

use rampart_common::protocol::coordinator::{
    CheckClientLeasesReply, CheckClientLeasesRequest, ClientLeaseState, OpenClientReply,
    OpenClientRequest, RenewClientLeaseReply, RenewClientLeaseRequest, CLIENT_LEASE_CHECKS_MAX,
};
use rampart_common::rpc::Reply;
use rampart_common::status::Status;
use std::time::Duration;

use super::shared::CoordinatorService;
use crate::state::{Command, CommandResult};

impl CoordinatorService {
    /// `OpenClient`: commits a new client and grants it a lease. The request carries
    /// nothing.
    pub(super) async fn open_client(
        &self,
        _request: OpenClientRequest,
    ) -> Result<OpenClientReply, Reply> {
        let received = tokio::time::Instant::now();
        match self.apply(Command::OpenClient).await? {
            CommandResult::ClientOpened { id } => {
                let lease = self.node.leader_term().and_then(|term| {
                    let mut leases = self.client_leases.lock();
                    leases.observe_leadership(Some(term), tokio::time::Instant::now());
                    leases.open(id, received)
                });
                match lease {
                    Some(lease) => Ok(OpenClientReply {
                        client: id,
                        lease_ms: millis(lease),
                    }),
                    None => Err(Reply::error(Status::Retry, "client lease not granted")),
                }
            }
            CommandResult::Rejected { status, detail } => Err(Reply::error(status, detail)),
            other => Err(Reply::error(
                Status::Internal,
                format!("unexpected {other:?}"),
            )),
        }
    }

    /// `RenewClientLease`: a new lease for an open client whose lease still holds.
    pub(super) async fn renew_client_lease(
        &self,
        request: RenewClientLeaseRequest,
    ) -> Result<RenewClientLeaseReply, Reply> {
        // Read before the barrier: a later leader first sees the client after it.
        let received = tokio::time::Instant::now();
        self.read_barrier().await?;
        let open = self
            .node
            .with_state(|state| state.client_open(request.client));
        let lease = open
            .then(|| self.renew_client(request.client, received))
            .flatten();
        match lease {
            Some(lease) => Ok(RenewClientLeaseReply {
                lease_ms: millis(lease),
            }),
            None => Err(Reply::error(
                Status::ClientLeaseExpired,
                format!(
                    "{} did not renew its lease within {:?}",
                    request.client,
                    self.client_leases.lock().lease()
                ),
            )),
        }
    }

    /// `CheckClientLeases`, linearizable: how each client's lease stands.
    pub(super) async fn check_client_leases(
        &self,
        request: CheckClientLeasesRequest,
    ) -> Result<CheckClientLeasesReply, Reply> {
        if request.clients.len() > CLIENT_LEASE_CHECKS_MAX {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!(
                    "{} clients asked about, more than {CLIENT_LEASE_CHECKS_MAX}",
                    request.clients.len()
                ),
            ));
        }
        let received = tokio::time::Instant::now();
        self.read_barrier().await?;
        let open: Vec<bool> = self.node.with_state(|state| {
            request
                .clients
                .iter()
                .map(|&c| state.client_open(c))
                .collect()
        });
        let Some(term) = self.node.leader_term() else {
            return Err(Reply::error(
                Status::Retry,
                "no longer the coordinators' leader",
            ));
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
        Ok(CheckClientLeasesReply { leases: states })
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
}

/// A duration in whole milliseconds, saturating (leases are far shorter).
fn millis(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}
