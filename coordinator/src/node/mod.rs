//! `RaftNode`: one coordinator's member of the Raft group that replicates
//! [`CoordinatorState`](crate::state::CoordinatorState) (docs/design.md §7, issue 4).
//!
//! A `RawNode` of raft-rs over [`RaftStorage`](crate::raft_storage::RaftStorage), driven by
//! one ready loop on a thread of its own (`rampart-raft`). The service talks to it through
//! a bounded inbox: [`RaftNode::propose`] a [`Command`](crate::state::Command) and get its
//! [`CommandResult`](crate::state::CommandResult) once it is committed and applied;
//! [`RaftNode::read_barrier`] before a read that must be current (ReadIndex);
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
//!
//! # Files
//!
//! * `config` — [`NodeConfig`] and its defaults, the inbox and peer-queue limits,
//!   [`Seed`], [`NodeError`] and [`StartError`].
//! * `bootstrap` — the member file, a fresh directory's initialization, seeds (export,
//!   encoding) and [`group_id`].
//! * `handle` — [`RaftNode`]: starting a member and everything the service calls on it.
//! * `shared` — what the handle and the loop share: the inbox's inputs, the state machine
//!   and the published status, and [`Applied`].
//! * `ready_loop` — the ready loop: the steps above, applying entries, snapshots, and the
//!   proposals and reads waiting for an answer.
//! * `peers` — the queues and sending tasks for the other coordinators, and
//!   [`decode_messages`].

mod bootstrap;
mod config;
mod handle;
mod peers;
mod ready_loop;
mod shared;

pub use self::bootstrap::{group_id, is_fresh};
pub use self::config::{
    NodeConfig, NodeError, Seed, StartError, ELECTION_TICKS_DEFAULT, HEARTBEAT_TICKS_DEFAULT,
    INBOX_MAX, PEER_BATCH_MAX, PEER_QUEUE_MAX, PEER_SEND_TIMEOUT, SNAPSHOT_ENTRIES_DEFAULT,
    TICK_DEFAULT,
};
pub use self::handle::RaftNode;
pub use self::peers::decode_messages;
pub use self::shared::Applied;
