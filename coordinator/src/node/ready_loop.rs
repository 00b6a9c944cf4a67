//! The ready loop (`Driver`), on the `rampart-raft` thread: ticks and inputs, the steps of
//! each `Ready` in order, applying committed entries, snapshots and log compaction, and
//! the waiting proposals and reads it answers.

use super::bootstrap::decode_state;
use super::config::{NodeError, INPUT_BATCH_MAX, READIES_PER_TURN_MAX};
use super::peers::PeerSenders;
use super::shared::{hint, Applied, Input, Shared};
use crate::raft_storage::RaftStorage;
use crate::state::Command;
use raft::eraftpb::{ConfState, Entry, EntryType, Message, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use rampart_common::protocol::coordinator::NotLeaderHint;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Entry data: the command. Entry context: the proposal id, 8 bytes little-endian.
fn proposal_id(entry: &Entry) -> Option<u64> {
    let bytes: [u8; 8] = entry.get_context().try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// A proposal waiting for its entry to be applied.
pub(super) struct Proposal {
    index: u64,
    reply: oneshot::Sender<Result<Applied, NodeError>>,
}

/// The ready loop's state; lives on the `rampart-raft` thread.
pub(super) struct Driver {
    pub(super) raw: RawNode<RaftStorage>,
    pub(super) id: u64,
    pub(super) peers: Arc<BTreeMap<u64, String>>,
    pub(super) shared: Arc<Shared>,
    pub(super) senders: PeerSenders,
    pub(super) snapshot_entries: u64,
    pub(super) snapshot_index: u64,
    pub(super) next_proposal: u64,
    /// By proposal id.
    pub(super) proposals: HashMap<u64, Proposal>,
    /// ReadIndex requests sent, by request id.
    pub(super) reads: HashMap<u64, oneshot::Sender<Result<(), NodeError>>>,
    /// Reads whose index is known, waiting for it to be applied.
    pub(super) waiting_reads: Vec<(u64, oneshot::Sender<Result<(), NodeError>>)>,
    /// Reads on a leader that has not committed an entry of its term yet.
    pub(super) deferred_reads: Vec<oneshot::Sender<Result<(), NodeError>>>,
}

impl Driver {
    /// Runs until `stop`, the inbox closing, or a fatal error; returns why it stopped.
    pub(super) async fn run(
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

    /// Runs the steps of the `node` module docs for one `Ready`, if there is one; says whether
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
        self.shared.applied.notify_waiters();
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
        self.shared.applied.notify_waiters();
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
    pub(super) fn fail_all(&mut self, why: &str) {
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
