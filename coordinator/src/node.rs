//! `RaftNode`: one coordinator's member of the Raft group that replicates
//! [`CoordinatorState`] (DESIGN.md §7, issue 4).
//!
//! A `RawNode` of raft-rs over [`RaftStorage`], driven by one ready loop on a thread of its
//! own (`rampart-raft`). The service talks to it through a bounded inbox:
//! [`RaftNode::propose`] a [`Command`] and get its [`CommandResult`] once it is committed
//! and applied; [`RaftNode::read_barrier`] before a read that must be current (ReadIndex);
//! [`RaftNode::receive`] the Raft messages other coordinators sent. What it hides: raft-rs,
//! the order of a ready's steps, proposal tracking, snapshots and log compaction, and the
//! peer connections.
//!
//! # The ready loop
//!
//! The thread runs a current-thread tokio runtime, so the loop can wait on a tokio
//! interval (the Raft tick) and on the inbox together, while its `fsync`s block only this
//! thread, never the RPC reactor. Each turn: a tick (every [`NodeConfig::tick`]) or a batch
//! of inputs, then, if raft-rs has a `Ready`, these steps in this order:
//!
//! 1. **Send** the ready's messages. A leader may send its appends before they are durable
//!    locally (Raft §10.2.1); followers' messages wait for step 3.
//! 2. **Apply a snapshot** received from the leader: store it (durably, dropping the log it
//!    covers) and replace the state machine with its contents.
//! 3. **Persist** the new entries and hard state in one synced write, then send the
//!    messages that had to wait for it (votes, append acknowledgements).
//! 4. **Apply** the committed entries to the state machine, answering the proposals they
//!    carry. Their commit index is durable by now (the hard state of step 3, or of an
//!    earlier ready), so a snapshot taken after applying never runs ahead of the durable
//!    commit index.
//! 5. **Advance**; the `LightReady` that follows may carry a newer commit index (persisted
//!    before anything else), more messages to send, and more committed entries to apply.
//!
//! After the ready: answer the reads whose ReadIndex is now applied, and take a snapshot
//! when [`NodeConfig::snapshot_entries`] entries were applied since the last one.
//!
//! # Proposals
//!
//! A proposal's entry carries the command (bincode) as data and a proposal id as context.
//! The leader remembers the index it was appended at. When an entry is applied, a waiting
//! proposal with the entry's id gets the result; a waiting proposal whose index was
//! applied with some other entry was overwritten by a newer leader and gets
//! [`NodeError::Dropped`] (it can never commit); one whose index a snapshot from a newer
//! leader covers gets [`NodeError::OutcomeUnknown`]. A proposal whose leader lost its majority
//! resolves either way once a new leader is elected, or the caller's timeout ends the wait
//! (the outcome is then unknown: every command is safe to retry, see the state module).
//!
//! # Linearizable reads
//!
//! [`RaftNode::read_barrier`] runs raft-rs's ReadIndex (`ReadOnlyOption::Safe`): the leader
//! confirms with a heartbeat round to a majority that it is still leader, and the barrier
//! returns once the state machine has applied the commit index of that moment. A read made
//! after it sees every change committed before the read began. A follower refuses reads
//! (as it refuses proposals) with [`NodeError::NotLeader`], so clients go to the leader.
//! A new leader cannot serve a ReadIndex before an entry of its own term commits (raft-rs
//! drops the request): reads arriving then wait in the node and start once it has.
//!
//! # Failure handling
//!
//! A storage error is fatal (the on-disk state is unknown, see `raft_storage`): the loop
//! stops, every waiter gets [`NodeError::Stopped`], and [`RaftNode::failure`] says why; the
//! process must exit and be restarted. A snapshot whose contents fail to decode or break
//! the state's invariants is fatal too, and so is a panic on the loop's thread (a storage
//! invariant, a raft-rs `fatal!`). Messages that cannot be delivered are dropped (Raft
//! retransmits) and the peer is reported unreachable; a snapshot's delivery or loss is
//! always reported, since the leader pauses a follower until it learns which.
//!
//! # Starting
//!
//! A fresh data directory is initialized in one synced write (the voters, or the seed's
//! snapshot), and only then is the member file written (its id and group id): a
//! directory without a member file never ran a node. A start cut short between the two is
//! finished by the next start with the same settings.
//!
//! # Limits
//!
//! The inbox holds [`INBOX_MAX`] inputs; when it is full, proposals and reads are refused
//! with [`NodeError::Busy`] and incoming Raft messages are dropped. Each peer's outgoing
//! queue holds [`PEER_QUEUE_MAX`] messages, sent in RPCs of at most [`PEER_BATCH_MAX`].
//! Proposals waiting at once are bounded by the inbox and the callers' timeouts.

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, ReadOnlyOption, SnapshotStatus, StateRole, Storage as _};
use rampart_common::protocol::coordinator::{
    NotLeaderHint, RaftMessages, RaftMessagesRequest, RaftStatusReply,
};
use rampart_common::rpc::RpcPool;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::raft_storage::{RaftStorage, StorageError};
use crate::state::{Command, CommandResult, CoordinatorState};

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
const MAX_SIZE_PER_MSG: u64 = 1 << 20;

/// Appends in flight to one follower.
const MAX_INFLIGHT_MSGS: usize = 256;

/// Inputs the loop handles before looking at the ready again.
const INPUT_BATCH_MAX: usize = 256;

/// Readies the loop handles in one turn before it looks at its inputs again.
const READIES_PER_TURN_MAX: usize = 8;

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
/// its data directory (README, "Replacing a coordinator"): every member of the new group
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

/// First bytes of a seed file.
const SEED_MAGIC: &[u8; 8] = b"RPSEED01";

impl Seed {
    /// Reads the configuration held in the data directory of a stopped member.
    pub fn export(data_dir: &std::path::Path) -> Result<Seed, StartError> {
        if is_fresh(data_dir) {
            return Err(StartError::Config(format!(
                "{} holds no coordinator",
                data_dir.display()
            )));
        }
        let storage = RaftStorage::open(data_dir)?;
        let first = storage.first_index()?;
        let last = storage.last_index()?;
        let mut state = if first > 1 {
            let snapshot = storage.snapshot(first - 1, 0)?;
            decode_state(snapshot.get_data()).map_err(|detail| StartError::Snapshot {
                dir: data_dir.to_path_buf(),
                detail,
            })?
        } else {
            CoordinatorState::new()
        };
        let mut next = first;
        while next <= last {
            let entries = storage.entries(
                next,
                last + 1,
                Some(MAX_SIZE_PER_MSG),
                raft::GetEntriesContext::empty(false),
            )?;
            for entry in &entries {
                if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() {
                    let command: Command =
                        bincode::deserialize(&entry.data).map_err(|e| StartError::Snapshot {
                            dir: data_dir.to_path_buf(),
                            detail: format!("entry {} does not decode: {e}", entry.index),
                        })?;
                    state.apply(&command);
                }
                next = entry.index + 1;
            }
        }
        if last == 0 {
            return Err(StartError::Config(format!(
                "{} holds an empty log: nothing to export",
                data_dir.display()
            )));
        }
        let last_term = storage.term(last)?;
        Ok(Seed {
            index: last,
            last_term,
            state,
        })
    }

    /// The seed file's bytes: magic, bincode, CRC-32C of the bincode.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let body = bincode::serialize(self).map_err(|e| format!("cannot encode a seed: {e}"))?;
        let mut bytes = SEED_MAGIC.to_vec();
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        Ok(bytes)
    }

    /// Reads a seed file's bytes, checking the magic, the checksum and the state.
    pub fn decode(bytes: &[u8]) -> Result<Seed, String> {
        let body = bytes
            .strip_prefix(SEED_MAGIC)
            .ok_or("not a coordinator seed file")?;
        let (body, crc) = body.split_last_chunk::<4>().ok_or("truncated seed file")?;
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err("seed file checksum mismatch (corrupt or truncated)".into());
        }
        // The state is the last field: its older encoding is decoded after the rest.
        const HEADER: usize = 16;
        if body.len() < HEADER {
            return Err("truncated seed file".into());
        }
        let (index, last_term): (u64, u64) =
            bincode::deserialize(&body[..HEADER]).map_err(|e| format!("bad seed file: {e}"))?;
        let state =
            CoordinatorState::decode(&body[HEADER..]).map_err(|e| format!("bad seed file: {e}"))?;
        let seed = Seed {
            index,
            last_term,
            state,
        };
        if seed.index == 0 {
            return Err("seed file starts at log index 0".into());
        }
        seed.state
            .check_invariants()
            .map_err(|e| format!("seed breaks an invariant: {e}"))?;
        Ok(seed)
    }

    /// Identifies the seed in the group id.
    fn digest(&self) -> u64 {
        let body = bincode::serialize(self).unwrap_or_default();
        u64::from(crc32fast::hash(&body)) << 32 | self.index & 0xffff_ffff
    }
}

/// The id of a Raft group: a hash of its voters and of the seed it started from. Members
/// refuse Raft messages from another group, so an old member left running after its group
/// was re-created from a seed, or a member of a group with other voters, cannot disturb
/// this one. (Two unseeded groups with the same voter ids share an id: keep clusters'
/// `--peers` apart.)
pub fn group_id(voters: &[u64], seed: Option<&Seed>) -> u64 {
    // FNV-1a: stable across builds and platforms, unlike `DefaultHasher`.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |value: u64| {
        for byte in value.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for voter in voters {
        eat(*voter);
    }
    eat(seed.map_or(0, Seed::digest));
    hash
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

/// What the loop does next; sent through the inbox.
enum Input {
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
struct Shared {
    /// The state machine, as of `status.applied`.
    state: RwLock<CoordinatorState>,
    status: Mutex<NodeStatus>,
    /// Set when the loop ended, with why.
    stopped: Mutex<Option<String>>,
}

/// The node's last published role and indexes.
#[derive(Clone, Debug, Default)]
struct NodeStatus {
    role: &'static str,
    term: u64,
    leader_id: u64,
    commit: u64,
    applied: u64,
    snapshot_index: u64,
}

/// A handle on a running member; cheap to clone.
#[derive(Clone, Debug)]
pub struct RaftNode {
    id: u64,
    group: u64,
    peers: Arc<BTreeMap<u64, String>>,
    inbox: mpsc::Sender<Input>,
    shared: Arc<Shared>,
    /// Ends the loop (a permit is kept if the loop is busy, so a stop is never lost).
    stop: Arc<tokio::sync::Notify>,
    thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl RaftNode {
    /// Opens (or, the first time, initializes) the Raft log in `config.data_dir`, restores
    /// the state machine from its snapshot, and starts the ready loop. Outgoing messages
    /// are sent from tasks on `runtime` (the RPC runtime).
    ///
    /// A fresh data directory is initialized with `config.peers` as the voters; a used one
    /// must have been created for the same voters and the same id.
    pub fn start(
        config: NodeConfig,
        runtime: tokio::runtime::Handle,
    ) -> Result<RaftNode, StartError> {
        if !config.peers.contains_key(&config.id) {
            return Err(StartError::Config(format!(
                "id {} is not among the peers {:?}",
                config.id,
                config.peers.keys().collect::<Vec<_>>()
            )));
        }
        if config.id == 0 {
            return Err(StartError::Config("Raft ids start at 1".into()));
        }
        std::fs::create_dir_all(&config.data_dir)?;
        let storage = RaftStorage::open(&config.data_dir)?;
        let voters: Vec<u64> = config.peers.keys().copied().collect();
        // The member file is written last: a directory without one never ran a node.
        let group = if is_fresh(&config.data_dir) {
            let seed = config.seed.as_ref();
            if storage.is_initialized() {
                check_unfinished_start(&storage, &config)?;
            } else if let Some(seed) = seed {
                // One synced batch: conf state, hard state and the seed snapshot.
                storage.apply_snapshot(&seed_snapshot(seed, &voters)?)?;
            } else {
                storage.initialize(&voters)?;
            }
            let group = group_id(&voters, seed);
            write_member_file(&config, group)?;
            group
        } else if config.seed.is_some() {
            return Err(StartError::Config(format!(
                "{} already holds coordinator state; a seed only starts a fresh directory",
                config.data_dir.display()
            )));
        } else {
            read_member_file(&config)?
        };
        let initial = storage.initial_state()?;
        let mut stored_voters = initial.conf_state.voters.clone();
        stored_voters.sort_unstable();
        if stored_voters != voters {
            return Err(StartError::Config(format!(
                "{} belongs to a group with voters {stored_voters:?}, but the peers given are \
                 {voters:?}; membership is static (see the README on replacing a coordinator)",
                config.data_dir.display()
            )));
        }
        let snapshot_index = storage.first_index()? - 1;
        let state = if snapshot_index > 0 {
            let snapshot = storage.snapshot(snapshot_index, config.id)?;
            decode_state(snapshot.get_data()).map_err(|detail| StartError::Snapshot {
                dir: config.data_dir.clone(),
                detail,
            })?
        } else {
            CoordinatorState::new()
        };
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied: snapshot_index,
            max_size_per_msg: MAX_SIZE_PER_MSG,
            max_inflight_msgs: MAX_INFLIGHT_MSGS,
            check_quorum: true,
            pre_vote: true,
            read_only_option: ReadOnlyOption::Safe,
            ..raft::Config::default()
        };
        raft_config.validate()?;
        let logger = slog::Logger::root(TracingDrain, slog::o!());
        let mut raw = RawNode::new(&raft_config, storage, &logger)?;
        if voters == [config.id] {
            // A group of one needs no election timeout: it is its own majority, and leads
            // as soon as it starts (the vote is persisted by the loop's first ready).
            raw.campaign()?;
        }

        let shared = Arc::new(Shared {
            state: RwLock::new(state),
            status: Mutex::new(NodeStatus {
                role: "follower",
                applied: snapshot_index,
                commit: initial.hard_state.commit,
                term: initial.hard_state.term,
                snapshot_index,
                leader_id: 0,
            }),
            stopped: Mutex::new(None),
        });
        let (inbox, inputs) = mpsc::channel(INBOX_MAX);
        let peers = Arc::new(config.peers.clone());
        let senders = PeerSenders::start(&config, group, &runtime, inbox.clone());
        let mut driver = Driver {
            raw,
            id: config.id,
            peers: Arc::clone(&peers),
            shared: Arc::clone(&shared),
            senders,
            snapshot_entries: config.snapshot_entries.max(1),
            snapshot_index,
            next_proposal: rand::random::<u64>() >> 1,
            proposals: HashMap::new(),
            reads: HashMap::new(),
            waiting_reads: Vec::new(),
            deferred_reads: Vec::new(),
        };
        let tick = config.tick;
        let loop_shared = Arc::clone(&shared);
        let stop = Arc::new(tokio::sync::Notify::new());
        let loop_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("rampart-raft".into())
            .spawn(move || {
                let why = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    // A panic (a storage invariant, a raft-rs `fatal!`) must stop the
                    // node visibly, so the process exits instead of serving errors.
                    Ok(rt) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        rt.block_on(driver.run(inputs, tick, &loop_stop))
                    }))
                    .unwrap_or_else(|panic| {
                        let what = panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("a panic");
                        format!("the Raft loop panicked: {what}")
                    }),
                    Err(e) => format!("cannot build the Raft runtime: {e}"),
                };
                driver.fail_all(&why);
                *loop_shared.stopped.lock() = Some(why);
            })?;
        Ok(RaftNode {
            id: config.id,
            group,
            peers,
            inbox,
            shared,
            stop,
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    /// This member's Raft id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The id of its group (see [`group_id`]).
    pub fn group(&self) -> u64 {
        self.group
    }

    /// Every member's id and address.
    pub fn peers(&self) -> &BTreeMap<u64, String> {
        &self.peers
    }

    /// Proposes `command` and waits until it is committed and applied, returning what
    /// applying it produced. Fails at once with [`NodeError::NotLeader`] on a follower.
    /// The caller bounds the wait (a leader cut off from its majority never commits).
    pub async fn propose(&self, command: Command) -> Result<CommandResult, NodeError> {
        self.propose_indexed(command)
            .await
            .map(|applied| applied.result)
    }

    /// [`propose`](Self::propose), also returning the index of the command's entry.
    pub async fn propose_indexed(&self, command: Command) -> Result<Applied, NodeError> {
        let (reply, result) = oneshot::channel();
        self.send(Input::Propose { command, reply })?;
        result.await.unwrap_or_else(|_| Err(self.stopped_error()))
    }

    /// Returns once the state machine reflects every change committed before the call
    /// (ReadIndex). Fails with [`NodeError::NotLeader`] on a follower.
    pub async fn read_barrier(&self) -> Result<(), NodeError> {
        let (reply, result) = oneshot::channel();
        self.send(Input::Read { reply })?;
        result.await.unwrap_or_else(|_| Err(self.stopped_error()))
    }

    /// Hands Raft messages received from another coordinator to the loop. Dropped when the
    /// inbox is full (Raft retransmits).
    pub fn receive(&self, messages: Vec<Message>) -> Result<(), NodeError> {
        self.send(Input::Messages(messages))
    }

    fn send(&self, input: Input) -> Result<(), NodeError> {
        self.inbox.try_send(input).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => NodeError::Busy,
            mpsc::error::TrySendError::Closed(_) => self.stopped_error(),
        })
    }

    fn stopped_error(&self) -> NodeError {
        let why = self.shared.stopped.lock().clone();
        NodeError::Stopped(why.unwrap_or_else(|| "stopping".into()))
    }

    /// Reads the state machine as it is now on this member (not necessarily current: call
    /// [`RaftNode::read_barrier`] first for a linearizable read).
    pub fn with_state<T>(&self, read: impl FnOnce(&CoordinatorState) -> T) -> T {
        read(&self.shared.state.read())
    }

    /// The term this member leads in, if it believes it is the leader.
    pub fn leader_term(&self) -> Option<u64> {
        let status = self.shared.status.lock();
        (status.role == "leader").then_some(status.term)
    }

    /// Whether this member believes it is the leader.
    pub fn is_leader(&self) -> bool {
        self.shared.status.lock().role == "leader"
    }

    /// Where the leader is, for a `NotLeader` reply.
    pub fn hint(&self) -> NotLeaderHint {
        hint(&self.shared.status.lock(), &self.peers)
    }

    /// This member's role, term and indexes.
    pub fn status(&self) -> RaftStatusReply {
        let status = self.shared.status.lock().clone();
        RaftStatusReply {
            id: self.id,
            group: self.group,
            role: status.role.to_string(),
            term: status.term,
            leader_id: status.leader_id,
            commit: status.commit,
            applied: status.applied,
            snapshot_index: status.snapshot_index,
            config_version: self.shared.state.read().version(),
            peers: self.peers.iter().map(|(i, a)| (*i, a.clone())).collect(),
        }
    }

    /// Why the loop stopped, once it has.
    pub fn failure(&self) -> Option<String> {
        self.shared.stopped.lock().clone()
    }

    /// Stops the loop and waits for its thread. Waiters get [`NodeError::Stopped`].
    pub fn stop(&self) {
        self.stop.notify_one();
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

fn hint(status: &NodeStatus, peers: &BTreeMap<u64, String>) -> NotLeaderHint {
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

/// Name of the file that records which member a data directory belongs to.
const MEMBER_FILE: &str = "member";

/// Whether `data_dir` holds no member yet (missing, or without a member file): starting
/// there initializes a new member.
pub fn is_fresh(data_dir: &std::path::Path) -> bool {
    !data_dir.join(MEMBER_FILE).exists()
}

/// Reads the member file of a used data directory: checks the id (a data directory
/// started under another id would vote twice in one term) and returns the group id.
fn read_member_file(config: &NodeConfig) -> Result<u64, StartError> {
    let path = config.data_dir.join(MEMBER_FILE);
    let found = std::fs::read_to_string(&path)?;
    let mut id = None;
    let mut group = None;
    for line in found.lines() {
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["raft", "id", value] => id = value.parse::<u64>().ok(),
            ["group", value] => group = u64::from_str_radix(value, 16).ok(),
            _ => {}
        }
    }
    match (id, group) {
        (Some(id), Some(group)) if id == config.id => Ok(group),
        (Some(id), Some(_)) => Err(StartError::Config(format!(
            "{} belongs to coordinator {id}, not to id {}",
            config.data_dir.display(),
            config.id
        ))),
        _ => Err(StartError::Config(format!(
            "{} is unreadable: {found:?}",
            path.display()
        ))),
    }
}

/// Records the member id and group id, durably: the last step of a fresh start.
fn write_member_file(config: &NodeConfig, group: u64) -> Result<(), StartError> {
    let text = format!("raft id {}\ngroup {group:016x}\n", config.id);
    let tmp = config.data_dir.join(format!("{MEMBER_FILE}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, config.data_dir.join(MEMBER_FILE))?;
    std::fs::File::open(&config.data_dir)?.sync_all()?;
    Ok(())
}

/// A store initialized by a start that stopped before writing the member file never ran
/// a node (no vote, no entry); it may be used if it is what this start would write.
fn check_unfinished_start(storage: &RaftStorage, config: &NodeConfig) -> Result<(), StartError> {
    let held = storage.first_index()? - 1;
    let last = storage.last_index()?;
    let vote = storage.initial_state()?.hard_state.vote;
    let expected = config.seed.as_ref().map_or(0, |seed| seed.index);
    if held == expected && last == held && vote == 0 {
        return Ok(());
    }
    Err(StartError::Config(format!(
        "{} holds a Raft store from an earlier start that did not finish, made with other \
         settings (snapshot at {held}, expected {expected}); it never ran, so remove the \
         directory and start again",
        config.data_dir.display()
    )))
}

/// The snapshot a seeded member's log starts from: identical on every member.
fn seed_snapshot(seed: &Seed, voters: &[u64]) -> Result<Snapshot, StartError> {
    let data = bincode::serialize(&seed.state)
        .map_err(|e| StartError::Config(format!("cannot encode the seed: {e}")))?;
    let mut snapshot = Snapshot::default();
    snapshot.set_data(data.into());
    let meta = snapshot.mut_metadata();
    meta.index = seed.index;
    meta.term = 1;
    meta.mut_conf_state().voters = voters.to_vec();
    Ok(snapshot)
}

fn decode_state(data: &[u8]) -> Result<CoordinatorState, String> {
    let state = CoordinatorState::decode(data).map_err(|e| format!("undecodable snapshot: {e}"))?;
    state
        .check_invariants()
        .map_err(|e| format!("snapshot breaks an invariant: {e}"))?;
    Ok(state)
}

/// Entry data: the command. Entry context: the proposal id, 8 bytes little-endian.
fn proposal_id(entry: &Entry) -> Option<u64> {
    let bytes: [u8; 8] = entry.get_context().try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// A proposal waiting for its entry to be applied.
struct Proposal {
    index: u64,
    reply: oneshot::Sender<Result<Applied, NodeError>>,
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

/// The ready loop's state; lives on the `rampart-raft` thread.
struct Driver {
    raw: RawNode<RaftStorage>,
    id: u64,
    peers: Arc<BTreeMap<u64, String>>,
    shared: Arc<Shared>,
    senders: PeerSenders,
    snapshot_entries: u64,
    snapshot_index: u64,
    next_proposal: u64,
    /// By proposal id.
    proposals: HashMap<u64, Proposal>,
    /// ReadIndex requests sent, by request id.
    reads: HashMap<u64, oneshot::Sender<Result<(), NodeError>>>,
    /// Reads whose index is known, waiting for it to be applied.
    waiting_reads: Vec<(u64, oneshot::Sender<Result<(), NodeError>>)>,
    /// Reads on a leader that has not committed an entry of its term yet.
    deferred_reads: Vec<oneshot::Sender<Result<(), NodeError>>>,
}

impl Driver {
    /// Runs until `stop`, the inbox closing, or a fatal error; returns why it stopped.
    async fn run(
        &mut self,
        mut inputs: mpsc::Receiver<Input>,
        tick: Duration,
        stop: &tokio::sync::Notify,
    ) -> String {
        let mut ticker = tokio::time::interval_at(Instant::now() + tick, tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.notified() => return "stopped".into(),
                _ = ticker.tick() => {
                    self.raw.tick();
                    // Callers that gave up (their timeout passed) wait no more; an entry
                    // that commits later is applied all the same.
                    self.proposals.retain(|_, p| !p.reply.is_closed());
                    self.reads.retain(|_, reply| !reply.is_closed());
                    self.waiting_reads.retain(|(_, reply)| !reply.is_closed());
                    self.deferred_reads.retain(|reply| !reply.is_closed());
                }
                input = inputs.recv() => {
                    let Some(input) = input else { return "the node was dropped".into() };
                    self.handle(input);
                    for _ in 1..INPUT_BATCH_MAX {
                        match inputs.try_recv() {
                            Ok(input) => self.handle(input),
                            Err(_) => break,
                        }
                    }
                }
            }
            // A ready's light ready can leave more work (a newer commit index); drain it
            // now rather than a tick later, within a bound so inputs are not starved.
            for _ in 0..READIES_PER_TURN_MAX {
                match self.on_ready() {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(why) => {
                        tracing::error!(%why, "the Raft node stops");
                        return why;
                    }
                }
            }
            self.start_deferred_reads();
        }
    }

    /// Handles one input.
    fn handle(&mut self, input: Input) {
        match input {
            Input::Propose { command, reply } => self.propose(command, reply),
            Input::Read { reply } => {
                if self.raw.raft.state != StateRole::Leader {
                    let _ = reply.send(Err(NodeError::NotLeader(self.hint())));
                    return;
                }
                // raft-rs 0.7 silently drops a ReadIndex on a leader that has not yet
                // committed an entry of its own term (raft.rs, `MsgReadIndex`): such a
                // read waits here until the leader's first entry commits.
                self.deferred_reads.push(reply);
                self.start_deferred_reads();
            }
            Input::Messages(messages) => {
                for message in messages {
                    if message.to != self.id {
                        tracing::warn!(
                            to = message.to,
                            from = message.from,
                            "raft message for another member (check --peers on every \
                             coordinator)"
                        );
                        continue;
                    }
                    if let Err(e) = self.raw.step(message) {
                        tracing::debug!(error = %e, "raft message not taken");
                    }
                }
            }
            Input::Unreachable { peer, snapshot } => {
                self.raw.report_unreachable(peer);
                if snapshot {
                    self.raw.report_snapshot(peer, SnapshotStatus::Failure);
                }
            }
            Input::SnapshotDelivered { peer } => {
                self.raw.report_snapshot(peer, SnapshotStatus::Finish);
            }
        }
    }

    /// Starts ReadIndex for the deferred reads once this leader can serve them.
    fn start_deferred_reads(&mut self) {
        if self.deferred_reads.is_empty()
            || self.raw.raft.state != StateRole::Leader
            || !self.raw.raft.commit_to_current_term()
        {
            return;
        }
        for reply in std::mem::take(&mut self.deferred_reads) {
            let id = self.next_id();
            self.reads.insert(id, reply);
            self.raw.read_index(id.to_le_bytes().to_vec());
        }
    }

    /// Queues messages for their peers; a snapshot that cannot even be queued is reported
    /// failed at once, so the leader sends it again instead of pausing the follower.
    fn send(&mut self, messages: Vec<Message>) {
        for peer in self.senders.send(messages) {
            self.raw.report_snapshot(peer, SnapshotStatus::Failure);
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_proposal = self.next_proposal.wrapping_add(1);
        self.next_proposal
    }

    fn hint(&self) -> NotLeaderHint {
        hint(&self.shared.status.lock(), &self.peers)
    }

    fn propose(&mut self, command: Command, reply: oneshot::Sender<Result<Applied, NodeError>>) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = reply.send(Err(NodeError::NotLeader(self.hint())));
            return;
        }
        let data = match bincode::serialize(&command) {
            Ok(data) => data,
            Err(e) => {
                let _ = reply.send(Err(NodeError::Stopped(format!(
                    "cannot encode the command: {e}"
                ))));
                return;
            }
        };
        let id = self.next_id();
        match self.raw.propose(id.to_le_bytes().to_vec(), data) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                self.proposals.insert(id, Proposal { index, reply });
            }
            Err(e) => {
                tracing::debug!(error = %e, "proposal refused");
                let _ = reply.send(Err(NodeError::NotLeader(self.hint())));
            }
        }
    }

    /// Runs the steps of the module docs for one `Ready`, if there is one; says whether
    /// there was.
    fn on_ready(&mut self) -> Result<bool, String> {
        if !self.raw.has_ready() {
            self.publish_status();
            return Ok(false);
        }
        let mut ready = self.raw.ready();
        // 1. Messages that need nothing durable first.
        self.send(ready.take_messages());
        // 2. A snapshot from the leader.
        if !ready.snapshot().is_empty() {
            self.install_snapshot(ready.snapshot())?;
        }
        // 3. Entries and hard state, in one synced write; then what waited for them.
        let hard_state = ready.hs().cloned();
        if !ready.entries().is_empty() || hard_state.is_some() {
            self.raw
                .store()
                .append_and_set_hard_state(ready.entries(), hard_state.as_ref())
                .map_err(|e| format!("cannot persist the Raft log: {e}"))?;
        }
        self.send(ready.take_persisted_messages());
        // 4. Committed entries.
        self.apply(ready.take_committed_entries())?;
        let read_states = ready.take_read_states();
        // 5. Advance, and the light ready.
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            let mut hard_state = self.raw.raft.hard_state();
            hard_state.commit = commit;
            self.raw
                .store()
                .set_hard_state(&hard_state)
                .map_err(|e| format!("cannot persist the commit index: {e}"))?;
        }
        self.send(light.take_messages());
        self.apply(light.take_committed_entries())?;
        self.raw.advance_apply();

        for read in read_states {
            let Ok(bytes) = <[u8; 8]>::try_from(read.request_ctx.as_slice()) else {
                continue;
            };
            if let Some(reply) = self.reads.remove(&u64::from_le_bytes(bytes)) {
                self.waiting_reads.push((read.index, reply));
            }
        }
        self.publish_status();
        self.answer_reads();
        self.maybe_snapshot()?;
        Ok(true)
    }

    /// Applies committed entries in order, answering the proposals they carry.
    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), String> {
        let Some(last) = entries.last().map(|e| e.index) else {
            return Ok(());
        };
        for entry in entries {
            let result = match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => None,
                EntryType::EntryNormal => {
                    let command: Command = bincode::deserialize(&entry.data).map_err(|e| {
                        format!("committed entry {} does not decode: {e}", entry.index)
                    })?;
                    Some(self.shared.state.write().apply(&command))
                }
                // Membership is static: no conf change is ever proposed.
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => None,
            };
            if let Some(id) = proposal_id(&entry) {
                if let Some(proposal) = self.proposals.remove(&id) {
                    let answer = result
                        .map(|result| Applied {
                            index: entry.index,
                            result,
                        })
                        .ok_or(NodeError::Dropped);
                    let _ = proposal.reply.send(answer);
                }
            }
        }
        // Proposals whose index now holds another entry were overwritten.
        let dropped: Vec<u64> = self
            .proposals
            .iter()
            .filter(|(_, p)| p.index <= last)
            .map(|(id, _)| *id)
            .collect();
        for id in dropped {
            if let Some(proposal) = self.proposals.remove(&id) {
                let _ = proposal.reply.send(Err(NodeError::Dropped));
            }
        }
        self.shared.status.lock().applied = last;
        Ok(())
    }

    fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), String> {
        let index = snapshot.get_metadata().index;
        let state = decode_state(snapshot.get_data())
            .map_err(|e| format!("snapshot at {index} from the leader: {e}"))?;
        self.raw
            .store()
            .apply_snapshot(snapshot)
            .map_err(|e| format!("cannot store the snapshot at {index}: {e}"))?;
        *self.shared.state.write() = state;
        self.snapshot_index = index;
        // Proposals at or below the snapshot were decided by a newer leader; whether with
        // their own entry is unknown here.
        let covered: Vec<u64> = self
            .proposals
            .iter()
            .filter(|(_, p)| p.index <= index)
            .map(|(id, _)| *id)
            .collect();
        for id in covered {
            if let Some(proposal) = self.proposals.remove(&id) {
                let _ = proposal.reply.send(Err(NodeError::OutcomeUnknown));
            }
        }
        let mut status = self.shared.status.lock();
        status.applied = index;
        status.snapshot_index = index;
        tracing::info!(index, "installed a snapshot from the leader");
        Ok(())
    }

    /// Snapshots the state machine and compacts the log when enough entries were applied.
    fn maybe_snapshot(&mut self) -> Result<(), String> {
        let applied = self.raw.raft.raft_log.applied;
        if applied < self.snapshot_index.saturating_add(self.snapshot_entries) {
            return Ok(());
        }
        let data = bincode::serialize(&*self.shared.state.read())
            .map_err(|e| format!("cannot encode a snapshot: {e}"))?;
        let conf_state: ConfState = self.raw.raft.prs().conf().to_conf_state();
        let bytes = data.len();
        self.raw
            .store()
            .compact(applied, data, conf_state)
            .map_err(|e| format!("cannot store a snapshot at {applied}: {e}"))?;
        self.snapshot_index = applied;
        self.shared.status.lock().snapshot_index = applied;
        tracing::info!(index = applied, bytes, "snapshot taken; log compacted");
        Ok(())
    }

    fn answer_reads(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting_reads)
            .into_iter()
            .partition(|(index, _)| *index <= applied);
        self.waiting_reads = waiting;
        for (_, reply) in ready {
            let _ = reply.send(Ok(()));
        }
    }

    /// Publishes role, term and indexes; a member that stops leading refuses the reads it
    /// has not answered (a new leader must confirm them).
    fn publish_status(&mut self) {
        let raft = &self.raw.raft;
        let role = match raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        };
        let leader = raft.state == StateRole::Leader;
        {
            let mut status = self.shared.status.lock();
            if status.role != role || status.leader_id != raft.leader_id {
                tracing::info!(
                    id = self.id,
                    role,
                    term = raft.term,
                    leader = raft.leader_id,
                    "raft role"
                );
            }
            status.role = role;
            status.term = raft.term;
            status.leader_id = raft.leader_id;
            status.commit = raft.raft_log.committed;
            status.applied = raft.raft_log.applied;
        }
        let pending = self.reads.len() + self.waiting_reads.len() + self.deferred_reads.len();
        if !leader && pending > 0 {
            let hint = self.hint();
            for reply in self.deferred_reads.drain(..) {
                let _ = reply.send(Err(NodeError::NotLeader(hint.clone())));
            }
            for (_, reply) in self.reads.drain() {
                let _ = reply.send(Err(NodeError::NotLeader(hint.clone())));
            }
            for (_, reply) in self.waiting_reads.drain(..) {
                let _ = reply.send(Err(NodeError::NotLeader(hint.clone())));
            }
        }
    }

    /// Answers every waiter when the loop ends.
    fn fail_all(&mut self, why: &str) {
        let error = NodeError::Stopped(why.to_string());
        for (_, proposal) in self.proposals.drain() {
            let _ = proposal.reply.send(Err(error.clone()));
        }
        for (_, reply) in self.reads.drain() {
            let _ = reply.send(Err(error.clone()));
        }
        for (_, reply) in self.waiting_reads.drain(..) {
            let _ = reply.send(Err(error.clone()));
        }
        for reply in self.deferred_reads.drain(..) {
            let _ = reply.send(Err(error.clone()));
        }
    }
}

/// One queue and one sending task per peer.
struct PeerSenders {
    queues: BTreeMap<u64, mpsc::Sender<Message>>,
}

impl PeerSenders {
    fn start(
        config: &NodeConfig,
        group: u64,
        runtime: &tokio::runtime::Handle,
        inbox: mpsc::Sender<Input>,
    ) -> PeerSenders {
        let pool = Arc::new(RpcPool::new());
        let mut queues = BTreeMap::new();
        for (&peer, addr) in &config.peers {
            if peer == config.id {
                continue;
            }
            let (tx, rx) = mpsc::channel(PEER_QUEUE_MAX);
            runtime.spawn(send_to_peer(
                config.id,
                group,
                peer,
                addr.clone(),
                rx,
                Arc::clone(&pool),
                inbox.clone(),
            ));
            queues.insert(peer, tx);
        }
        PeerSenders { queues }
    }

    /// Queues each message for its peer, dropping it when the queue is full (Raft
    /// retransmits); returns the peers whose snapshot message was dropped.
    fn send(&self, messages: Vec<Message>) -> Vec<u64> {
        let mut lost_snapshots = Vec::new();
        for message in messages {
            let to = message.to;
            let snapshot = message.get_msg_type() == MessageType::MsgSnapshot;
            match self.queues.get(&to) {
                Some(queue) => {
                    if queue.try_send(message).is_err() {
                        tracing::debug!(to, "a peer's Raft queue is full; message dropped");
                        if snapshot {
                            lost_snapshots.push(to);
                        }
                    }
                }
                None => tracing::warn!(to, "raft message to an unknown peer"),
            }
        }
        lost_snapshots
    }
}

/// Sends the messages queued for `peer`, batching whatever queued up during the previous
/// RPC. A failed batch is dropped (Raft retransmits) and the peer reported unreachable.
async fn send_to_peer(
    from: u64,
    group: u64,
    peer: u64,
    addr: String,
    mut queue: mpsc::Receiver<Message>,
    pool: Arc<RpcPool>,
    inbox: mpsc::Sender<Input>,
) {
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < PEER_BATCH_MAX {
            match queue.try_recv() {
                Ok(message) => batch.push(message),
                Err(_) => break,
            }
        }
        let snapshot = batch
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgSnapshot);
        let mut messages = Vec::with_capacity(batch.len());
        let mut snapshot_lost = false;
        for message in &batch {
            match message.write_to_bytes() {
                Ok(bytes) => messages.push(Bytes::from(bytes)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a raft message");
                    snapshot_lost |= message.get_msg_type() == MessageType::MsgSnapshot;
                }
            }
        }
        let request = RaftMessagesRequest {
            from,
            group,
            messages,
        };
        let deadline = Instant::now() + PEER_SEND_TIMEOUT;
        // The leader pauses a follower it sent a snapshot to until told how it went.
        match pool.call::<RaftMessages>(&addr, &request, deadline).await {
            Ok(()) if snapshot && !snapshot_lost => {
                let _ = inbox.send(Input::SnapshotDelivered { peer }).await;
            }
            Ok(()) if snapshot_lost => {
                let _ = inbox.send(Input::Unreachable { peer, snapshot }).await;
            }
            Ok(()) => {}
            Err(e) => {
                tracing::debug!(peer, %addr, error = %e, "raft messages not delivered");
                let input = Input::Unreachable { peer, snapshot };
                if snapshot {
                    // Must arrive, or the follower stays paused.
                    let _ = inbox.send(input).await;
                } else {
                    let _ = inbox.try_send(input);
                }
            }
        }
    }
}

/// Decodes the messages of a `RaftMessages` request.
pub fn decode_messages(request: &RaftMessagesRequest) -> Result<Vec<Message>, String> {
    request
        .messages
        .iter()
        .map(|bytes| {
            Message::parse_from_bytes(bytes).map_err(|e| format!("undecodable raft message: {e}"))
        })
        .collect()
}

/// Forwards raft-rs's slog records to `tracing` (target `raft`).
struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(
        &self,
        record: &slog::Record<'_>,
        values: &slog::OwnedKVList,
    ) -> Result<(), slog::Never> {
        let mut line = record.msg().to_string();
        let mut fields = KvLine(&mut line);
        let _ = slog::KV::serialize(&record.kv(), record, &mut fields);
        let _ = slog::KV::serialize(values, record, &mut fields);
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{line}"),
            slog::Level::Warning => tracing::warn!(target: "raft", "{line}"),
            slog::Level::Info => tracing::info!(target: "raft", "{line}"),
            slog::Level::Debug | slog::Level::Trace => tracing::debug!(target: "raft", "{line}"),
        }
        Ok(())
    }
}

/// Appends ` key=value` for each slog field.
struct KvLine<'a>(&'a mut String);

impl slog::Serializer for KvLine<'_> {
    fn emit_arguments(&mut self, key: slog::Key, value: &std::fmt::Arguments<'_>) -> slog::Result {
        use std::fmt::Write as _;
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_round_trips_and_one_of_the_release_before_open_clients_decodes() {
        let mut opened = CoordinatorState::new();
        opened.apply(&Command::OpenClient);
        let seed = |state| Seed {
            index: 42,
            last_term: 3,
            state,
        };
        let bytes = seed(opened.clone()).encode().expect("encode");
        assert_eq!(Seed::decode(&bytes), Ok(seed(opened)));
        let bytes = seed(CoordinatorState::new()).encode().expect("encode");
        // The older encoding: without the open clients (the counter and the empty set's
        // length, 16 bytes) at the end of the state, which ends the body.
        let body = &bytes[SEED_MAGIC.len()..bytes.len() - 4];
        let old_body = &body[..body.len() - 16];
        let mut old = SEED_MAGIC.to_vec();
        old.extend_from_slice(old_body);
        old.extend_from_slice(&crc32fast::hash(old_body).to_le_bytes());
        let decoded = Seed::decode(&old).expect("an older seed decodes");
        assert_eq!((decoded.index, decoded.last_term), (42, 3));
        assert_eq!(decoded.state, CoordinatorState::new());
    }
}
