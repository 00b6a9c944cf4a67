//! RPCs served by backups: segment replicas (DESIGN.md §5 "Backups").
//!
//! A master opens a *frame* for each replica (a segment-sized buffer on the backup),
//! fills it, and closes it; the backup then writes the replica to disk. In this version
//! the bytes travel in `WriteReplica` RPCs (the `rpc` transport: the backup's CPU copies
//! them); the one-sided transports of DESIGN.md §5 move the same bytes into the same
//! frames without the backup's CPU, and use these RPCs only to open and close.
//!
//! Every replica carries an *epoch*: a master that re-creates an open replica elsewhere
//! bumps it, and a backup refuses any operation with an epoch older than the replica's
//! (`StaleEpoch`), so a slow message from before the bump cannot overwrite newer data.

use super::rpcs;
use crate::bincode_message;
use crate::ids::{SegmentId, ServerId};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Reserve a frame for replica (master, segment) at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenReplicaRequest {
    /// Whose log.
    pub master: ServerId,
    /// Which segment of it.
    pub segment: SegmentId,
    /// The replica's epoch.
    pub epoch: u64,
    /// Bytes the frame must hold (the segment size).
    pub capacity: u32,
}

/// An open frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameHandle {
    /// Names the frame on this backup until it is closed or freed; never reused.
    pub handle: u64,
}

/// Copy `bytes` into an open frame at `offset` (the `rpc` transport).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReplicaRequest {
    /// The frame.
    pub handle: u64,
    /// The replica's epoch (must match the frame's).
    pub epoch: u64,
    /// Where in the frame.
    pub offset: u32,
    /// What to write.
    pub bytes: Bytes,
}

/// The replica in this frame is complete (its footer is written): write it to disk,
/// then release the frame. Answered once the replica is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseReplicaRequest {
    /// The frame.
    pub handle: u64,
    /// The replica's epoch (must match the frame's).
    pub epoch: u64,
    /// Bytes of the replica (the segment's sealed length).
    pub length: u32,
}

/// Names one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaId {
    /// Whose log.
    pub master: ServerId,
    /// Which segment of it.
    pub segment: SegmentId,
}

/// Asks for the replicas a backup holds, of one master or of all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListReplicasRequest {
    /// `None`: every master's.
    pub master: Option<ServerId>,
}

/// What a backup holds of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    /// Whose log.
    pub master: ServerId,
    /// Which segment of it.
    pub segment: SegmentId,
    /// Its epoch.
    pub epoch: u64,
    /// Bytes held (for an open frame: up to the furthest byte written).
    pub length: u32,
    /// Whether it was closed (and is on disk).
    pub closed: bool,
}

/// The replicas a backup holds, sorted by (master, segment).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListReplicasReply {
    /// One per replica.
    pub replicas: Vec<ReplicaInfo>,
}

/// The bytes of one replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReplicaReply {
    /// Its facts.
    pub info: ReplicaInfo,
    /// Its bytes.
    pub bytes: Bytes,
}

/// Whether a free found something to free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeReplicaReply {
    /// False when the backup held no such replica (freeing is idempotent).
    pub freed: bool,
}

bincode_message!(
    OpenReplicaRequest,
    FrameHandle,
    WriteReplicaRequest,
    CloseReplicaRequest,
    ReplicaId,
    ReplicaInfo,
    ListReplicasRequest,
    ListReplicasReply,
    ReadReplicaReply,
    FreeReplicaReply,
);

rpcs! {
    /// Reserve a frame for a replica (`BackupFull` when none can be taken, `StaleEpoch`
    /// when the backup holds a newer epoch of it).
    OpenReplica = 200: OpenReplicaRequest => FrameHandle;
    /// Copy bytes into an open frame (`UnknownFrame`, `StaleEpoch`, `InvalidArgument`
    /// past the frame's end).
    WriteReplica = 201: WriteReplicaRequest => ();
    /// Complete a replica: write it to disk and release its frame.
    CloseReplica = 202: CloseReplicaRequest => ReplicaInfo;
    /// Forget a replica (open or on disk).
    FreeReplica = 203: ReplicaId => FreeReplicaReply;
    /// The replicas held.
    ListReplicas = 204: ListReplicasRequest => ListReplicasReply;
    /// One replica's bytes (`ObjectDoesntExist` if not held).
    ReadReplica = 205: ReplicaId => ReadReplicaReply;
}
