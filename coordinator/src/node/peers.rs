//! The Raft traffic between coordinators: one bounded queue and one sending task per peer,
//! batching messages into `RaftMessages` RPCs and reporting peers unreachable and
//! snapshots delivered or lost; and decoding the messages a peer sent.

use super::config::{NodeConfig, PEER_BATCH_MAX, PEER_QUEUE_MAX, PEER_SEND_TIMEOUT};
use super::shared::Input;
use bytes::Bytes;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use rampart_common::protocol::coordinator::{RaftMessages, RaftMessagesRequest};
use rampart_common::rpc::RpcPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// One queue and one sending task per peer.
pub(super) struct PeerSenders {
    queues: BTreeMap<u64, mpsc::Sender<Message>>,
}

impl PeerSenders {
    pub(super) fn start(
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
    pub(super) fn send(&self, messages: Vec<Message>) -> Vec<u64> {
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
