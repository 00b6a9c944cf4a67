//! Enlistment: a starting server asks the coordinators' Raft leader for its server id.
//!
//! # Failure handling
//! The call follows `NotLeader` hints and retries until [`ENLIST_TIMEOUT`]. Each attempt
//! may wait [`ENLIST_ATTEMPT_TIMEOUT`], longer than the coordinator's own proposal
//! timeout: a working leader answers (`Retry` at worst) before the attempt is abandoned,
//! so an enlistment is sent again only after a coordinator hung or went away. A repeated
//! enlistment gets a new id and orphans the first, which the failure detectors then find
//! unreachable and the coordinator recovers (it owns nothing yet, so that is cheap).

use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{Enlist, EnlistRequest, PROPOSAL_TIMEOUT};
use rampart_common::rpc::{RpcError, RpcPool};
use std::time::Duration;
use tokio::time::Instant;

/// How long a starting server keeps trying to enlist with the coordinator.
pub const ENLIST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one attempt waits for the leader's answer (see the module doc).
pub const ENLIST_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// The coordinator's proposal timeout bounds how long its answer can take; the attempt
/// must outlast it (see the module doc).
const _: () = assert!(ENLIST_ATTEMPT_TIMEOUT.as_millis() > PROPOSAL_TIMEOUT.as_millis());

/// Why a server could not enlist.
#[derive(Debug, thiserror::Error)]
pub enum EnlistError {
    /// No coordinator leader answered before [`ENLIST_TIMEOUT`].
    #[error("no coordinator leader answered within {timeout:?}: {last}")]
    NoLeader {
        /// How long the server tried.
        timeout: Duration,
        /// The last answers and transport failures, for the operator.
        last: String,
    },
    /// The leader answered with an error that asking again cannot change.
    #[error("the coordinator refused enlistment: {0}")]
    Refused(RpcError),
}

/// Enlists with the coordinators at `coordinators` (see the module doc).
pub async fn enlist(
    coordinators: &[String],
    request: &EnlistRequest,
) -> Result<ServerId, EnlistError> {
    let pool = RpcPool::new();
    let set = CoordinatorSet::new(coordinators).with_attempt_timeout(ENLIST_ATTEMPT_TIMEOUT);
    let deadline = Instant::now() + ENLIST_TIMEOUT;
    match set.call::<Enlist>(&pool, request, deadline).await {
        Ok(reply) => Ok(reply.id),
        Err(CoordinatorCallError::NoLeader { last, .. }) => Err(EnlistError::NoLeader {
            timeout: ENLIST_TIMEOUT,
            last,
        }),
        Err(CoordinatorCallError::Rpc(error)) => Err(EnlistError::Refused(error)),
    }
}
