//! What the handle and the ready loop share: the inputs sent through the inbox, the state
//! machine and the published status, the `NotLeader` hint, and what an applied proposal
//! returns ([`Applied`]).

use super::config::NodeError;
use crate::state::{Command, CommandResult, CoordinatorState};
use parking_lot::{Mutex, RwLock};
use raft::eraftpb::Message;
use rampart_common::protocol::coordinator::NotLeaderHint;
use std::collections::BTreeMap;
use tokio::sync::oneshot;

/// What the loop does next; sent through the inbox.
pub(super) enum Input {
    Propose {
        command: Command,
        reply: oneshot::Sender<Result<Applied, NodeError>>,
    },
    Read {
        reply: oneshot::Sender<Result<(), NodeError>>,
    },
    Messages(Vec<Message>),
    /// A `RaftMessages` RPC to `peer` failed; `snapshot` if it carried a snapshot.
    Unreachable {
        peer: u64,
        snapshot: bool,
    },
    /// A snapshot reached `peer`.
    SnapshotDelivered {
        peer: u64,
    },
}

/// What the service reads without going through the loop.
#[derive(Debug)]
pub(super) struct Shared {
    /// The state machine, as of `status.applied`.
    pub(super) state: RwLock<CoordinatorState>,
    pub(super) status: Mutex<NodeStatus>,
    /// Set when the loop ended, with why.
    pub(super) stopped: Mutex<Option<String>>,
    /// Notified (every waiter) once committed entries or a snapshot were applied.
    pub(super) applied: tokio::sync::Notify,
}

/// The node's last published role and indexes.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeStatus {
    pub(super) role: &'static str,
    pub(super) term: u64,
    pub(super) leader_id: u64,
    pub(super) commit: u64,
    pub(super) applied: u64,
    pub(super) snapshot_index: u64,
}

pub(super) fn hint(status: &NodeStatus, peers: &BTreeMap<u64, String>) -> NotLeaderHint {
    match peers.get(&status.leader_id) {
        Some(addr) if status.leader_id != 0 => NotLeaderHint::Leader {
            id: status.leader_id,
            addr: addr.clone(),
        },
        _ => NotLeaderHint::Unknown {
            why: format!(
                "coordinator is a {} in term {} and knows of no leader (an election is under \
                 way, or a majority of the {} coordinators is unreachable)",
                status.role,
                status.term,
                peers.len()
            ),
        },
    }
}

/// A committed and applied proposal: what applying it produced, and the index of its
/// entry in the Raft log (unique over the group's life).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Its entry's index.
    pub index: u64,
    /// What applying it produced.
    pub result: CommandResult,
}
