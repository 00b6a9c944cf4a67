//! How a member runs and what it reports: [`NodeConfig`] with its defaults, the limits of
//! the inbox and of the peer queues, [`Seed`] (the configuration a re-created group starts
//! from; reading and writing it is `bootstrap`'s), and the errors [`NodeError`] and
//! [`StartError`].

use crate::raft_storage::StorageError;
use crate::state::CoordinatorState;
use rampart_common::protocol::coordinator::NotLeaderHint;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Inputs (proposals, reads, message batches) the ready loop's inbox holds.
pub const INBOX_MAX: usize = 4096;

/// Outgoing Raft messages queued for one peer; past it, new ones are dropped.
pub const PEER_QUEUE_MAX: usize = 4096;

/// Most messages in one `RaftMessages` RPC.
pub const PEER_BATCH_MAX: usize = 256;

/// Deadline of one `RaftMessages` RPC. Shorter than an election timeout would be pointless
/// to aim for on a slow disk; longer would let one dead peer's connection attempt delay
/// the messages queued behind it.
pub const PEER_SEND_TIMEOUT: Duration = Duration::from_millis(500);

/// Largest entry payload raft-rs packs into one append message.
pub(super) const MAX_SIZE_PER_MSG: u64 = 1 << 20;

/// Appends in flight to one follower.
pub(super) const MAX_INFLIGHT_MSGS: usize = 256;

/// Inputs the loop handles before looking at the ready again.
pub(super) const INPUT_BATCH_MAX: usize = 256;

/// Readies the loop handles in one turn before it looks at its inputs again.
pub(super) const READIES_PER_TURN_MAX: usize = 8;

/// How one coordinator's Raft member runs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Its Raft id (≥ 1), a key of `peers`.
    pub id: u64,
    /// Every member's Raft id and RPC address, this one included. Static: the same on
    /// every member.
    pub peers: BTreeMap<u64, String>,
    /// Where its Raft log lives.
    pub data_dir: PathBuf,
    /// Raft tick.
    pub tick: Duration,
    /// Ticks without hearing from a leader before a follower stands for election; raft-rs
    /// randomizes the timeout over `[election_ticks, 2 × election_ticks)`.
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Entries applied since the last snapshot that trigger a new snapshot and the
    /// compaction of the log before it.
    pub snapshot_entries: u64,
    /// For a fresh data directory only: start the group's log from this configuration
    /// (exported from a member of an old group, see [`Seed`]) instead of an empty one.
    pub seed: Option<Seed>,
}

/// Default Raft tick.
pub const TICK_DEFAULT: Duration = Duration::from_millis(10);
/// Default election timeout in ticks: 150–300 ms with the default tick. On loopback a
/// heartbeat round takes well under a millisecond and an `fsync` a few, so this is many
/// round trips of margin against false elections, and keeps failover near 300 ms.
pub const ELECTION_TICKS_DEFAULT: usize = 15;
/// Default heartbeat interval in ticks (30 ms).
pub const HEARTBEAT_TICKS_DEFAULT: usize = 3;
/// Default snapshot interval in applied entries.
pub const SNAPSHOT_ENTRIES_DEFAULT: u64 = 10_000;

impl NodeConfig {
    /// A member with the default timing.
    pub fn new(id: u64, peers: BTreeMap<u64, String>, data_dir: PathBuf) -> NodeConfig {
        NodeConfig {
            id,
            peers,
            data_dir,
            tick: TICK_DEFAULT,
            election_ticks: ELECTION_TICKS_DEFAULT,
            heartbeat_ticks: HEARTBEAT_TICKS_DEFAULT,
            snapshot_entries: SNAPSHOT_ENTRIES_DEFAULT,
            seed: None,
        }
    }
}

/// The configuration of a stopped member, exported to re-create a group whose member lost
/// its data directory (docs/operating.md, "Replacing a coordinator"): every member of the new group
/// starts from the same seed on a fresh directory, so their logs begin identical at
/// `index`. It holds everything the member had applied **and** every entry it held beyond
/// (a follower may hold acknowledged entries before it learns they committed), so export
/// it from the survivor with the highest `(last_term, index)`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seed {
    /// The old log's last index: the new log starts after it.
    pub index: u64,
    /// The term of that entry in the old group (to choose the most up-to-date survivor).
    pub last_term: u64,
    /// The configuration after every entry up to `index`.
    pub state: CoordinatorState,
}

/// Why a proposal or a read did not succeed.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeError {
    /// This member is not the leader; nothing was proposed.
    #[error("not the leader ({})", .0.encode())]
    NotLeader(NotLeaderHint),
    /// A newer leader overwrote the proposal's entry: it was not committed and never will be.
    #[error("proposal dropped by a change of leader; it was not committed")]
    Dropped,
    /// The inbox is full; nothing was proposed.
    #[error("coordinator busy: {INBOX_MAX} requests queued for the Raft loop")]
    Busy,
    /// The proposal's index was covered by a snapshot from a newer leader before its entry
    /// was applied here: it may or may not have committed.
    #[error("proposal overtaken by a snapshot from a newer leader; it may have committed")]
    OutcomeUnknown,
    /// The node stopped (shutdown or a fatal storage error); the outcome is unknown.
    #[error("the Raft node stopped: {0}")]
    Stopped(String),
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The Raft log could not be opened or initialized.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// raft-rs refused the configuration or the stored state.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The configuration contradicts itself or the stored state.
    #[error("{0}")]
    Config(String),
    /// The snapshot in the data directory is unreadable.
    #[error("the snapshot in {dir} cannot be restored: {detail}")]
    Snapshot {
        /// The data directory.
        dir: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The data directory or the loop thread could not be set up.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
