//! `ClientError`: everything an operation can fail with, as one typed enum.

use rampart_common::ids::Version;
use rampart_common::rpc::RpcError;
use rampart_common::status::Status;

/// Why a client operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The table does not exist (or was dropped).
    #[error("table {0} does not exist")]
    TableDoesntExist(String),
    /// A reject rule refused the operation; `current` is the object's version then
    /// (0 if it did not exist).
    #[error("rejected: {status} (current version {current})")]
    Rejected {
        /// `ObjectDoesntExist`, `ObjectExists` or `WrongVersion`.
        status: Status,
        /// The object's version when it was refused.
        current: Version,
    },
    /// The request itself is invalid (key or value too large, not an integer, ...).
    #[error("invalid request: {status}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Invalid {
        /// What the server said.
        status: Status,
        /// Details, if any.
        detail: String,
    },
    /// The master has no memory left for the write.
    #[error("no space on the master owning this key")]
    NoSpace,
    /// The deadline passed while the operation was being retried. A write, remove or
    /// increment may or may not have applied (once at most: its retries carry its
    /// exactly-once identity); with [`ClientError::LeaseExpired`], the only errors that
    /// leave the outcome unknown ([`ClientError::outcome_unknown`]). With `attempts` 0
    /// it was never sent: it waited for its number (`crate::tracker`, "Limits").
    #[error("timed out after {attempts} attempts: {last}")]
    Timeout {
        /// How often it was tried.
        attempts: u32,
        /// The last failure seen.
        last: String,
    },
    /// No coordinator served the call as the Raft leader before the deadline (all
    /// unreachable, or no leader elected); carries the last reason seen.
    #[error("the coordinators did not complete the call in time: {0}")]
    NoCoordinator(String),
    /// A server answered something the client does not expect.
    #[error("server error: {0}")]
    Server(String),
    /// The client's lease expired while the operation was in flight: it could not renew
    /// it for `rampart_common::rifl::CLIENT_LEASE` (cut off from the coordinators, or
    /// paused), so masters no longer execute writes under its id. Like
    /// [`ClientError::Timeout`], the write may or may not have applied (once at most);
    /// it is not sent again. The client goes on under a new id: later operations need
    /// no new client.
    #[error("client lease expired: {0}; the operation may or may not have applied")]
    LeaseExpired(String),
}

impl ClientError {
    /// Whether a write, remove or increment that failed with this may still have
    /// applied (once at most): [`ClientError::Timeout`] after an attempt, and
    /// [`ClientError::LeaseExpired`].
    pub fn outcome_unknown(&self) -> bool {
        match self {
            ClientError::Timeout { attempts, .. } => *attempts > 0,
            ClientError::LeaseExpired(_) => true,
            _ => false,
        }
    }

    pub(crate) fn from_status(status: Status, current: Version, detail: String) -> ClientError {
        match status {
            s if s.is_rejection() => ClientError::Rejected { status: s, current },
            Status::NoSpace => ClientError::NoSpace,
            Status::ClientLeaseExpired => ClientError::LeaseExpired(detail),
            Status::KeyTooLarge
            | Status::ValueTooLarge
            | Status::NotAnInteger
            | Status::InvalidArgument
            | Status::MalformedRequest
            | Status::MessageTooLarge
            | Status::NotEnoughServers => ClientError::Invalid { status, detail },
            other => ClientError::Server(if detail.is_empty() {
                other.to_string()
            } else {
                format!("{other}: {detail}")
            }),
        }
    }

    pub(crate) fn from_rpc(error: RpcError) -> ClientError {
        match error {
            RpcError::Status { status, detail, .. } => {
                ClientError::from_status(status, Version(0), detail)
            }
            other => ClientError::Server(other.to_string()),
        }
    }
}
