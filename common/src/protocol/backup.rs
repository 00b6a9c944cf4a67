//! RPCs served by backups: segment replicas (docs/design.md §5 "Backups").
//!
//! A master opens a *frame* for each replica (a segment-sized buffer on the backup),
//! fills it, and closes it; the backup then writes the replica to disk. The bytes travel
//! by one of the transports of `common::onesided`: `WriteReplica` RPCs (the `rpc`
//! baseline: the backup's CPU copies them), or one-sided writes into the same frames
//! (`shm`, `tcp`, `rdma`), which use these RPCs only to open, close and fence. The
//! `rdma` transport first connects a queue pair per (master, backup) with `RdmaConnect`.
//!
//! Every replica carries an *epoch*: a master that re-creates an open replica elsewhere
//! bumps it, and a backup refuses any operation with an epoch older than the replica's
//! (`StaleEpoch`), so a slow message from before the bump cannot overwrite newer data.

use super::rpcs::rpcs;
use crate::bincode_message;
use crate::ids::{Epoch, FrameHandle, SegmentId, ServerId, Version};
use crate::onesided::rdma::RdmaEndpoint;
use crate::rpc::message::Cursor;
use crate::rpc::{DecodeError, WireMessage};
use crate::tablet::HashRange;
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Reserve a frame for replica (master, segment) at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenReplicaRequest {
    /// Whose log.
    pub master: ServerId,
    /// Which segment of it.
    pub segment: SegmentId,
    /// The replica's epoch.
    pub epoch: Epoch,
    /// Bytes the frame must hold (the segment size).
    pub capacity: u32,
}

/// An open frame, and where one-sided writes can reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenReplicaReply {
    /// Names the frame on this backup until it is closed or freed; never reused.
    pub handle: FrameHandle,
    /// Where the frame lives in the backup's shared-memory frame file (the `shm`
    /// transport); `None` when the backup has no frame file.
    pub shm: Option<ShmFrame>,
    /// The backup's soft-NIC address (the `tcp` transport), `host:port`.
    pub nic: Option<String>,
}

/// A frame's place in a backup's shared-memory frame file (`common::onesided::shm`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmFrame {
    /// Identity of the backup's host (`onesided::host_id`): a master maps the file only
    /// when this equals its own, i.e. both run on one machine.
    pub host: String,
    /// Absolute path of the frame file on that host.
    pub path: String,
    /// Byte offset of the frame's slot (its header) in the file.
    pub slot_offset: u64,
    /// Bytes of data a writer may place after the slot's header: the frame's capacity
    /// (the slot itself may hold more).
    pub slot_capacity: u32,
    /// The backup's process id on that host. The frame file outlives a killed backup,
    /// so a master writing by `shm` checks after each copy that this process still runs
    /// (a write into a dead backup's file must fail, not succeed silently).
    pub pid: u32,
}

/// Move an open frame to a newer epoch in place, keeping its bytes: after a master
/// re-created a lost replica of its open segment elsewhere, the replicas that survived
/// are told the new epoch, so that a replica left behind at the old epoch (on a backup
/// thought dead) is known to be stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BumpEpochRequest {
    /// The frame.
    pub handle: FrameHandle,
    /// Its current epoch.
    pub epoch: Epoch,
    /// The new epoch (> `epoch`).
    pub new_epoch: Epoch,
}

/// Copy `bytes` into an open frame at `offset` (the `rpc` transport).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReplicaRequest {
    /// The frame.
    pub handle: FrameHandle,
    /// The replica's epoch (must match the frame's).
    pub epoch: Epoch,
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
    pub handle: FrameHandle,
    /// The replica's epoch (must match the frame's).
    pub epoch: Epoch,
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

/// Forget a replica (open or on disk), if its epoch is at most `epoch_max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeReplicaRequest {
    /// Whose log.
    pub master: ServerId,
    /// Which segment of it.
    pub segment: SegmentId,
    /// Copies at a newer epoch are kept: a master that abandoned a replica at epoch e and
    /// later placed a replacement at e + 1 on the same backup frees only the old one,
    /// however late the free arrives. [`Epoch::MAX`] frees any epoch.
    pub epoch_max: Epoch,
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
    pub epoch: Epoch,
    /// Bytes held. For an open frame: its valid prefix (docs/design.md §4), up to the last
    /// matching `Checksum` entry, since one-sided writes do not tell the backup how far
    /// they wrote; for a fenced frame, the prefix its fence reported.
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

/// Connect an RDMA queue pair of `master` to this backup (the `rdma` transport,
/// `common::onesided::rdma`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaConnectRequest {
    /// The master asking; the region in the reply is its own, revoked when it is fenced.
    pub master: ServerId,
    /// The master's queue pair, which the backup's new queue pair connects to.
    pub endpoint: RdmaEndpoint,
}

/// The backup's side of an RDMA connection: its queue pair, and the region the master
/// may RDMA-WRITE into — the backup's whole frame file, so that the frame at
/// [`ShmFrame::slot_offset`] of an `OpenReplica` reply has its header at
/// `region_addr + slot_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaConnectReply {
    /// The backup's queue pair, already connected to the master's.
    pub endpoint: RdmaEndpoint,
    /// Address of the frame file's first byte, as RDMA WRITEs name it.
    pub region_addr: u64,
    /// Bytes of the region (the frame file's length): writes past it are refused.
    pub region_bytes: u64,
    /// The key the master presents; valid until the backup fences this master or the
    /// master connects again.
    pub rkey: u32,
}

/// Key-hash ranges, sorted and disjoint: one recovery partition (a partition of the
/// crashed master's will, cut to the tablets it still owned).
pub type PartitionRanges = Vec<HashRange>;

/// Recovery of `master` begins (docs/design.md §6 step 1): fence its open frames and report
/// every replica of it this backup holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRecoveryRequest {
    /// The crashed master.
    pub master: ServerId,
}

/// One replica reported at the start of a recovery, with the facts the coordinator
/// needs to check that the log is complete (docs/design.md §4 "Digests").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryReplica {
    /// Its facts (for an open frame, the length is the fenced valid prefix).
    pub info: ReplicaInfo,
    /// The log digest in its valid prefix: every live segment of the log when this
    /// segment was opened. Reported for replicas that are not closed (the candidates
    /// for the log's head); `None` for closed ones, or when the prefix holds no digest.
    pub digest: Option<Vec<SegmentId>>,
    /// For a replica that is not closed, the successor named by a `SegmentFooter` in its
    /// valid prefix: its master closed the segment, although this copy was never closed
    /// (a frame whose close had not arrived, or one written to disk at a graceful stop).
    /// `None` when the prefix holds no footer. A closed replica holds a footer by
    /// definition (naming `segment + 1`) and reports `None` here.
    pub successor: Option<SegmentId>,
}

/// Every replica of the crashed master held here, sorted by segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRecoveryReply {
    /// One per replica.
    pub replicas: Vec<RecoveryReplica>,
}

/// Read these replicas of `master` from disk, in this order, splitting each into
/// per-partition pieces as it is read, and keep the pieces until recovery masters fetch
/// them (docs/design.md §6: backups read "in an order they choose and report"; here the
/// coordinator chooses one replica per segment, balancing the reads over backups, and
/// each backup reads its share in segment order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryReadRequest {
    /// The crashed master.
    pub master: ServerId,
    /// Names this attempt at recovering `master`; a newer attempt replaces an older one's
    /// reads and pieces.
    pub recovery: u64,
    /// Segments to read, in order.
    pub segments: Vec<SegmentId>,
    /// The partitions, by index: a piece for partition `i` holds the entries whose
    /// (table, key hash) lies in `partitions[i]`.
    pub partitions: Vec<PartitionRanges>,
}

/// Ask for the entries of one replica that fall in one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryDataRequest {
    /// The crashed master.
    pub master: ServerId,
    /// The recovery attempt (see [`RecoveryReadRequest::recovery`]).
    pub recovery: u64,
    /// Which segment.
    pub segment: SegmentId,
    /// The partition's index in the attempt.
    pub partition: u32,
    /// The partition's ranges: a backup that was not asked to read this segment (the
    /// recovery master falls back to it because the chosen one failed) reads it now and
    /// cuts out this partition's entries.
    pub ranges: PartitionRanges,
    /// The asker's host identity (`onesided::host_id`) when it can read a piece from
    /// the backup's shared memory: a backup on the same host may then answer with where
    /// the piece lies ([`RecoveryDataReply::shared`]) instead of its bytes.
    pub shared_host: Option<String>,
}

/// Where a piece lies in the backup's shared memory (`onesided::shm::RecoveryRegion`):
/// the runs, one after another, make the piece.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedPiece {
    /// The region's path on the backup's host (`/proc/PID/fd/FD`).
    pub region: String,
    /// The region's nonce: a file at `region` without it is another.
    pub nonce: u64,
    /// At most [`SHARED_PIECE_RUNS_MAX`].
    pub runs: Vec<SharedRun>,
}

/// The first `len` bytes of `slot`'s data in a recovery region, valid while the slot's
/// generation is `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedRun {
    pub slot: u32,
    pub generation: u64,
    pub len: u32,
}

impl SharedPiece {
    /// The runs as the region reads them (`RegionReader::copy_runs`).
    pub fn region_runs(&self) -> Vec<crate::onesided::shm::RegionRun> {
        self.runs
            .iter()
            .map(|run| crate::onesided::shm::RegionRun {
                slot: run.slot,
                generation: run.generation,
                offset: 0,
                len: run.len,
            })
            .collect()
    }
}

impl From<crate::onesided::shm::RegionRun> for SharedRun {
    /// A run from the start of its slot (`offset` 0), as pieces fill slots.
    fn from(run: crate::onesided::shm::RegionRun) -> SharedRun {
        debug_assert_eq!(run.offset, 0, "a piece's run starts its slot");
        SharedRun {
            slot: run.slot,
            generation: run.generation,
            len: run.len,
        }
    }
}

/// Longest [`SharedPiece::region`] a reply may carry.
pub const SHARED_PIECE_PATH_BYTES_MAX: usize = 4096;

/// Most runs a [`SharedPiece`] may have: a whole region of 1 GiB in 256 KiB slots.
pub const SHARED_PIECE_RUNS_MAX: usize = 4096;

/// The entries of one replica that fall in one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryDataReply {
    /// The replica's epoch.
    pub epoch: Epoch,
    /// The highest `SafeVersion` floor in the replica (0 if none): the recovery master
    /// raises its own floor to it, so a key deleted on the crashed master is never
    /// re-created with a version it already used.
    pub safe_version: Version,
    /// `Object` and `Tombstone` entries in the log's own format (docs/design.md §4), one after
    /// another, as they lay in the replica (each carries its own CRC).
    pub entries: Bytes,
    /// How many entries the piece holds.
    pub count: u32,
    /// Where the piece lies in the backup's shared memory, for an asker on its host;
    /// `entries` is then empty. The asker that cannot read it there asks again without
    /// [`RecoveryDataRequest::shared_host`].
    pub shared: Option<SharedPiece>,
}

/// Bytes of a [`RecoveryDataReply`] besides its entries and shared piece.
const RECOVERY_DATA_REPLY_FIXED_BYTES: usize = 8 + 8 + 8 + 4 + 1;

/// By hand, for the bulk of a recovery's bytes: the layout is the one bincode gives the
/// serde derive (`epoch u64 | safe_version u64 | entries_len u64 | entries | count u32 |
/// shared`, little-endian; `shared` is a tag byte, 0 for none, or 1 then `path_len u64 |
/// path | nonce u64 | runs u64 | (slot u32 | generation u64 | len u32)...`), but the
/// frame is sized once before the entries are copied in, and
/// decoding hands out the entries as a slice of the received frame instead of copying
/// them.
impl WireMessage for RecoveryDataReply {
    fn encode(&self, out: &mut BytesMut) {
        out.reserve(RECOVERY_DATA_REPLY_FIXED_BYTES + self.entries.len());
        out.put_u64_le(self.epoch.0);
        out.put_u64_le(self.safe_version.0);
        out.put_u64_le(self.entries.len() as u64);
        out.put_slice(&self.entries);
        out.put_u32_le(self.count);
        match &self.shared {
            None => out.put_u8(0),
            Some(shared) => {
                out.put_u8(1);
                out.put_u64_le(shared.region.len() as u64);
                out.put_slice(shared.region.as_bytes());
                out.put_u64_le(shared.nonce);
                out.put_u64_le(shared.runs.len() as u64);
                for run in &shared.runs {
                    out.put_u32_le(run.slot);
                    out.put_u64_le(run.generation);
                    out.put_u32_le(run.len);
                }
            }
        }
    }

    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut cursor = Cursor::new(payload);
        let epoch = Epoch(cursor.u64("epoch")?);
        let safe_version = Version(cursor.u64("safe version")?);
        let entries_len = cursor.u64("entries length")?;
        let entries_len = usize::try_from(entries_len)
            .map_err(|_| DecodeError(format!("entries length {entries_len} too large")))?;
        let entries = cursor.bytes(entries_len, "entries")?;
        let count = cursor.u32("count")?;
        let shared = match cursor.u8("shared tag")? {
            0 => None,
            1 => {
                let path_len = cursor.u64("region path length")?;
                if path_len > SHARED_PIECE_PATH_BYTES_MAX as u64 {
                    return Err(DecodeError(format!(
                        "region path of {path_len} bytes (at most {SHARED_PIECE_PATH_BYTES_MAX})"
                    )));
                }
                let path = cursor.bytes(path_len as usize, "region path")?;
                let region = String::from_utf8(path.to_vec())
                    .map_err(|_| DecodeError("region path is not UTF-8".to_string()))?;
                let nonce = cursor.u64("nonce")?;
                let count = cursor.u64("runs")?;
                if count > SHARED_PIECE_RUNS_MAX as u64 {
                    return Err(DecodeError(format!(
                        "{count} runs in a shared piece (at most {SHARED_PIECE_RUNS_MAX})"
                    )));
                }
                let mut runs = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    runs.push(SharedRun {
                        slot: cursor.u32("slot")?,
                        generation: cursor.u64("generation")?,
                        len: cursor.u32("length")?,
                    });
                }
                Some(SharedPiece {
                    region,
                    nonce,
                    runs,
                })
            }
            tag => return Err(DecodeError(format!("shared piece tag {tag}"))),
        };
        cursor.finish()?;
        Ok(RecoveryDataReply {
            epoch,
            safe_version,
            entries,
            count,
            shared,
        })
    }
}

/// Recovery of `master` is over: free every replica of it held here and forget its
/// recovery reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndRecoveryRequest {
    /// The recovered master.
    pub master: ServerId,
}

/// What ending a recovery freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndRecoveryReply {
    /// Replicas freed.
    pub freed: u32,
}

bincode_message!(
    StartRecoveryRequest,
    RecoveryReplica,
    StartRecoveryReply,
    RecoveryReadRequest,
    RecoveryDataRequest,
    EndRecoveryRequest,
    EndRecoveryReply,
    OpenReplicaRequest,
    OpenReplicaReply,
    ShmFrame,
    BumpEpochRequest,
    WriteReplicaRequest,
    CloseReplicaRequest,
    ReplicaId,
    FreeReplicaRequest,
    ReplicaInfo,
    ListReplicasRequest,
    ListReplicasReply,
    ReadReplicaReply,
    FreeReplicaReply,
    RdmaConnectRequest,
    RdmaConnectReply,
);

rpcs! {
    /// Reserve a frame for a replica (`BackupFull` when none can be taken, `StaleEpoch`
    /// when the backup holds a newer epoch of it, `Fenced` when its open frame is).
    OpenReplica = 200: OpenReplicaRequest => OpenReplicaReply;
    /// Copy bytes into an open frame (`UnknownFrame`, `StaleEpoch`, `InvalidArgument`
    /// past the frame's end, `Fenced`).
    WriteReplica = 201: WriteReplicaRequest => ();
    /// Complete a replica: write it to disk and release its frame (`Fenced` once its
    /// master's recovery began: the frame stays for recovery).
    CloseReplica = 202: CloseReplicaRequest => ReplicaInfo;
    /// Forget a replica (open or on disk).
    FreeReplica = 203: FreeReplicaRequest => FreeReplicaReply;
    /// The replicas held.
    ListReplicas = 204: ListReplicasRequest => ListReplicasReply;
    /// One replica's bytes (`ObjectDoesntExist` if not held).
    ReadReplica = 205: ReplicaId => ReadReplicaReply;
    /// Move an open frame to a newer epoch, keeping its bytes (`UnknownFrame`,
    /// `StaleEpoch`, `InvalidArgument` when `new_epoch` is not newer, `Fenced`).
    BumpEpoch = 206: BumpEpochRequest => ();
    /// Connect the master's RDMA queue pair and register the frame file for its writes;
    /// a new connect of the same master replaces its earlier one (`InvalidArgument` with
    /// the plain reason where the backup has no RDMA, `Fenced` once recovery of the
    /// master began).
    RdmaConnect = 207: RdmaConnectRequest => RdmaConnectReply;
    /// Fence a crashed master's open frames and list its replicas with their digests.
    StartRecovery = 208: StartRecoveryRequest => StartRecoveryReply;
    /// Start reading a crashed master's replicas in order, splitting them by partition.
    RecoveryRead = 209: RecoveryReadRequest => ();
    /// One partition's entries of one replica (waits while that replica is being read;
    /// `ObjectDoesntExist` if not held, `Internal` if it does not verify).
    RecoveryData = 210: RecoveryDataRequest => RecoveryDataReply;
    /// Free every replica of a recovered master.
    EndRecovery = 211: EndRecoveryRequest => EndRecoveryReply;
}
