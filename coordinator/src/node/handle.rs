//! [`RaftNode`], the handle the service holds: starting a member (opening or initializing
//! its data directory, then spawning the ready loop on its thread), proposing, reading,
//! receiving messages, and the status it publishes. raft-rs's log records go to
//! `tracing`.

use super::bootstrap::{
    check_unfinished_start, decode_state, group_id, is_fresh, read_member_file, seed_snapshot,
    write_member_file,
};
use super::config::{
    NodeConfig, NodeError, StartError, INBOX_MAX, MAX_INFLIGHT_MSGS, MAX_SIZE_PER_MSG,
};
use super::peers::PeerSenders;
use super::ready_loop::Driver;
use super::shared::{hint, Applied, Input, NodeStatus, Shared};
use crate::raft_storage::RaftStorage;
use crate::state::{Command, CommandResult, CoordinatorState};
use parking_lot::{Mutex, RwLock};
use raft::eraftpb::Message;
use raft::{RawNode, ReadOnlyOption, Storage as _};
use rampart_common::protocol::coordinator::{NotLeaderHint, RaftStatusReply};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

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
                 {voters:?}; membership is static (see docs/operating.md, replacing a coordinator)",
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
            applied: tokio::sync::Notify::new(),
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

    /// Completes once this member applies more of the log (or a snapshot). Create it
    /// (and `enable` it) before reading the state, so that no change is missed in
    /// between.
    pub fn state_applied(&self) -> tokio::sync::futures::Notified<'_> {
        self.shared.applied.notified()
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
