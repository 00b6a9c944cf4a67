//! RPCs served by masters: the data API of docs/design.md §3, and tablet ownership changes
//! that the coordinator sends.
//!
//! Read and write are the hot path: their messages are encoded by hand so that keys
//! and values travel as raw bytes and decode as zero-copy slices of the received frame
//! (`Bytes`). Everything else uses bincode.
//!
//! Per-object outcomes (a rejected write, a missing object, a key whose tablet moved)
//! travel inside the reply as a `status` field, not in the frame
//! header: the header status is for failures of the whole request. That keeps single
//! and multi operations alike, and lets a rejected write report the current version.

use super::rpcs::rpcs;
use crate::bincode_message;
use crate::ids::{ClientId, MoveId, SegmentId, ServerId, TableId, TabletEpoch, Version};
use crate::protocol::backup::PartitionRanges;
use crate::reject::RejectRules;
use crate::rifl::Rifl;
use crate::rpc::message::Cursor;
use crate::rpc::{DecodeError, WireMessage};
use crate::status::Status;
use crate::tablet::{HashRange, Tablet};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Read one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Bytes,
}

/// The outcome of reading one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReply {
    /// `Ok`, `ObjectDoesntExist`, or `UnknownTablet` (in multi-reads).
    pub status: Status,
    /// The object's version (0 when it does not exist).
    pub version: Version,
    /// The value (empty when it does not exist).
    pub value: Bytes,
}

/// Write one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRequest {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Bytes,
    /// The new value.
    pub value: Bytes,
    /// When to refuse.
    pub rules: RejectRules,
    /// Its exactly-once identity ([`Rifl::NONE`]: none).
    pub rifl: Rifl,
}

/// The outcome of a write, remove or increment of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReply {
    /// `Ok`, a reject status, `UnknownTablet`, `NoSpace`, `KeyTooLarge`, ...
    pub status: Status,
    /// Written: the new version. Removed: the version removed (0 if there was none).
    /// Rejected: the current version (0 if the object does not exist).
    pub version: Version,
}

/// Remove one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Bytes,
    /// When to refuse.
    pub rules: RejectRules,
    /// Its exactly-once identity ([`Rifl::NONE`]: none).
    pub rifl: Rifl,
}

/// Add `delta` to an object holding an 8-byte little-endian signed integer; a missing
/// object counts as 0 (unless the rules refuse a missing object).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncrementRequest {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Bytes,
    /// What to add (wrapping on overflow is refused: `InvalidArgument`).
    pub delta: i64,
    /// When to refuse.
    pub rules: RejectRules,
    /// Its exactly-once identity ([`Rifl::NONE`]: none).
    pub rifl: Rifl,
}

/// The outcome of an increment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncrementReply {
    /// As [`WriteReply::status`]; `NotAnInteger` if the value is not 8 bytes.
    pub status: Status,
    /// The new version.
    pub version: Version,
    /// The new value.
    pub value: i64,
}

/// One object of a multi-read or multi-remove.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectKey {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Bytes,
}

/// Read several objects of one master; replies come in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiReadRequest {
    /// What to read.
    pub objects: Vec<ObjectKey>,
}

/// Replies to a multi-read, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiReadReply {
    /// One per requested object.
    pub objects: Vec<ReadReply>,
}

/// Write several objects of one master. Each object is applied or refused on its own
/// (no cross-object atomicity); all of them share one append batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiWriteRequest {
    /// What to write.
    pub objects: Vec<WriteRequest>,
}

/// Remove several objects of one master, each on its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiRemoveRequest {
    /// What to remove.
    pub objects: Vec<RemoveRequest>,
}

/// Replies to a multi-write or multi-remove, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiWriteReply {
    /// One per requested object.
    pub objects: Vec<WriteReply>,
}

/// One page of a table enumeration within one tablet: the objects whose key hash lies
/// in `[resume_hash, tablet.end_hash]`, in key-hash order.
///
/// The cursor is a key-hash position, not a master-side iterator, so an enumeration
/// survives tablets moving between masters: the client looks up whoever owns
/// `resume_hash` now and continues there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnumerateRequest {
    /// The table.
    pub table: TableId,
    /// First key hash still to return.
    pub resume_hash: u64,
    /// Last key hash of the range the client believes this master owns.
    pub end_hash: u64,
    /// Soft bound on the page's payload; a page holds at least one hash's objects.
    pub max_bytes: u32,
}

/// An object returned by enumerate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnumeratedObject {
    /// Its key.
    pub key: Bytes,
    /// Its version.
    pub version: Version,
    /// Its value.
    pub value: Bytes,
}

/// One page of an enumeration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnumerateReply {
    /// Objects in key-hash order; every object of one hash is in the same page.
    pub objects: Vec<EnumeratedObject>,
    /// Where the next page starts, or `None` when `end_hash` was reached.
    pub next_hash: Option<u64>,
}

/// A change of the tablets one master owns, sent by the coordinator: tablets to take
/// (created, or recovered here), or to drop.
///
/// The coordinator numbers the changes of each server's tablets one by one (its *tablet
/// epoch*); a master applies a change only when it is the next one (`epoch` one past
/// its own), skips one it reflects already, and on a gap pulls its whole set
/// (`GetOwnedTablets`) instead. Pushes may so arrive late, twice, or not at all: the
/// master's tablets still converge to the committed map (lease renewals report the
/// epoch, see `RenewLeaseReply`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletsRequest {
    /// The server the change is for. Server ids are never reused (a process restarted
    /// at an address enlists anew), so an id names one incarnation: a server that
    /// receives a change for another id refuses it (`WrongServer`).
    pub owner: ServerId,
    /// The owner's tablet epoch once the change is applied.
    pub epoch: TabletEpoch,
    /// The tablets, each owned by `owner` (for a take) or until now (for a drop).
    pub tablets: Vec<Tablet>,
}

/// The tablets of `owner` changed, up to tablet epoch `epoch`, in ways this message does
/// not carry: an owner behind it pulls its whole set (`GetOwnedTablets`) before it
/// answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncTabletsRequest {
    /// The server meant (`WrongServer` from any other).
    pub owner: ServerId,
    /// The owner's tablet epoch in the committed map.
    pub epoch: TabletEpoch,
}

/// A liveness probe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingRequest {}

/// Which server answers at an address (`Identify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentifyReply {
    /// The id the coordinators gave the server listening there.
    pub server: ServerId,
}

/// Answer to a ping, with a little about the master.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingReply {
    /// Objects live in its hash table.
    pub objects: u64,
    /// Bytes of log memory in use.
    pub log_bytes_used: u64,
    /// Bytes of log memory it may use.
    pub log_bytes_max: u64,
    /// Segments with fewer than R replicas right now (0 in a healthy cluster).
    pub segments_under_replicated: u64,
    /// Bytes of log entries not known dead (what the log would hold once cleaned).
    pub log_bytes_live: u64,
    /// Segments the log cleaner freed since the master started.
    pub segments_cleaned: u64,
}

/// The coordinator's configuration version after a change to the server list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerListVersion {
    /// The configuration version (`TabletMap::version`) that holds the changed list.
    pub version: u64,
}

/// Where one segment of a crashed master can be fetched from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverySource {
    /// The segment.
    pub segment: SegmentId,
    /// Addresses of backups holding a usable replica: the first was asked to read it
    /// (`RecoveryRead`); the others are fallbacks, tried in order if it fails.
    pub backups: Vec<String>,
}

/// Deadline of one `Recover`, the same on both sides: the coordinator gives up on the
/// recovery master after it (and gives the partition to another), and the recovery
/// master cancels a recovery still waiting for its turn or replaying after it, as its
/// answer would come too late to be used (a partition is sized to replay in about half a
/// second; this leaves room for a slow disk, a loaded machine and a turn in a queue).
pub const RECOVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Replay one partition of a crashed master (coordinator → recovery master, docs/design.md §6
/// step 2). Answered once every entry of the partition is replayed into this master's
/// log and replicated; the coordinator then gives it the partition's tablets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverRequest {
    /// The crashed master.
    pub crashed: ServerId,
    /// The recovery attempt.
    pub recovery: u64,
    /// The partition's index in the attempt.
    pub partition: u32,
    /// The partition's key-hash ranges.
    pub ranges: PartitionRanges,
    /// Every segment of the crashed master's log, in expected-availability order (the
    /// order the backups read them).
    pub segments: Vec<RecoverySource>,
    /// 0, unless the operator let this recovery lose data (`allow-loss`): then the
    /// crashed master's version ceiling, and every replayed version `v` (objects,
    /// tombstones, floors) becomes `version_floor + v`. A key whose newest versions were
    /// lost comes back at an older value but a higher version than any it ever had, so
    /// versions keep increasing and a conditional write based on a lost version fails.
    pub version_floor: u64,
}

/// What a recovery master replayed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverReply {
    /// Objects live at the end of replay (now in this master's log).
    pub objects: u64,
    /// Tombstones kept (now in this master's log).
    pub tombstones: u64,
    /// Log bytes the replayed entries take in this master's log.
    pub bytes: u64,
    /// Entries received from backups (objects and tombstones, before deduplication).
    pub entries_received: u64,
    /// Segments fetched from a fallback backup because the first one failed.
    pub fallbacks: u32,
    /// Milliseconds from the request's arrival to its reply.
    pub replay_ms: u32,
}

/// Stop serving the given tablets' objects that a recovery left behind here (a recovery
/// attempt that failed, or whose result the committed map does not give this master):
/// forget every object in the ranges, unless this master owns them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbandonRecoveryRequest {
    /// The crashed master whose recovery left them.
    pub crashed: ServerId,
    /// The attempt that left them. A master that has since received a `Recover` of a
    /// newer attempt of `crashed` ignores this: its objects may be what a commit it has
    /// not heard of yet gave it.
    pub recovery: u64,
    /// The ranges.
    pub ranges: PartitionRanges,
}

/// The recovery of `crashed` is over (it owns no tablet any more): after catching up
/// with its tablets to `tablet_epoch`, the master cancels work on `crashed` still
/// running there, forgets every object it does not own in the ranges its replays of
/// `crashed` covered (less those another crashed master's replay there covers: that
/// one's own `FinishRecovery` forgets them), refuses any later `Recover` of `crashed`
/// and ignores its abandons. This is what frees objects stranded by a lost `Recover`
/// reply and a lost `AbandonRecovery`, or by a leader that died before it could abandon
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishRecoveryRequest {
    /// The server meant (`WrongServer` from any other).
    pub owner: ServerId,
    /// The crashed master whose recovery is over.
    pub crashed: ServerId,
    /// The owner's tablet epoch in the committed map once the recovery was over: every
    /// partition committed to it is in its tablets at that epoch, so it is kept.
    pub tablet_epoch: TabletEpoch,
}

/// Everything `rampart status` and the status page show of one storage server: its
/// master and its backup (answered by the server, not the master alone).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatsReply {
    /// Live objects.
    pub objects: u64,
    /// Log memory held by segments.
    pub log_bytes_used: u64,
    /// Log memory in all.
    pub log_bytes_max: u64,
    /// Bytes of live entries in the log.
    pub log_bytes_live: u64,
    /// Replicas the master keeps of each segment (R).
    pub replicas: u32,
    /// Segments with fewer than R replicas now.
    pub segments_under_replicated: u64,
    /// Why writes wait for backups, and what to do, when they do.
    pub backup_shortage: Option<String>,
    /// Segments the cleaner freed.
    pub segments_cleaned: u64,
    /// Milliseconds the master's lease still runs (`None`: not enforced).
    pub lease_remaining_ms: Option<u64>,
    /// Partitions this master replayed as a recovery master.
    pub recovered_partitions: u64,
    /// Objects and bytes they held.
    pub recovered_objects: u64,
    /// Bytes appended for them.
    pub recovered_bytes: u64,
    /// Replicas the backup stores.
    pub backup_replicas: u64,
    /// Their bytes.
    pub backup_bytes: u64,
    /// Frames open for writes.
    pub frames_open: u64,
    /// Frames whose bytes are not yet in the store.
    pub frames_unflushed: u64,
    /// Frame slots in all.
    pub frame_slots: u64,
}

/// What a move's target asks its source for (`MoveOut`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveStep {
    /// The next piece of the range's live objects, from hash `from` (the first opens the
    /// move on the source, which then notes every change of the range).
    Copy {
        /// The first hash of the piece.
        from: u64,
    },
    /// The current state of what changed since the last tail.
    Tail,
    /// Freeze the range (reads and writes answer `Retry` until the move ends), then a
    /// tail.
    Freeze,
}

/// One step of a move, asked of the source by the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveOutRequest {
    /// The move.
    pub id: MoveId,
    /// Its range (whole tablets of the source).
    pub range: HashRange,
    /// What is asked.
    pub step: MoveStep,
    /// About how many bytes the piece may hold.
    pub bytes_max: u32,
}

/// A piece of a moving range: log entries (objects, tombstones, completion records)
/// that the target replays as it replays a recovery piece.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoveOutReply {
    /// The source's safe version: the target's rises above it.
    pub safe_version: Version,
    /// A copy: where the next piece starts; `None` once the walk is done.
    pub next: Option<u64>,
    /// A tail: how many keys and records still wait on the source.
    pub left: u64,
    /// How many entries `entries` holds.
    pub count: u32,
    /// The entries, one after another, as the log holds them.
    pub entries: Bytes,
}

/// Bytes of a [`MoveOutReply`] besides its entries.
const MOVE_OUT_REPLY_FIXED_BYTES: usize = 8 + 1 + 8 + 8 + 4 + 8;

/// By hand, so the entries decode as a slice of the received frame: `safe_version u64 |
/// has_next u8 | next u64 | left u64 | count u32 | entries_len u64 | entries`.
impl WireMessage for MoveOutReply {
    fn encode(&self, out: &mut BytesMut) {
        out.reserve(MOVE_OUT_REPLY_FIXED_BYTES + self.entries.len());
        out.put_u64_le(self.safe_version.0);
        out.put_u8(u8::from(self.next.is_some()));
        out.put_u64_le(self.next.unwrap_or(0));
        out.put_u64_le(self.left);
        out.put_u32_le(self.count);
        out.put_u64_le(self.entries.len() as u64);
        out.put_slice(&self.entries);
    }

    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut cursor = Cursor::new(payload);
        let safe_version = Version(cursor.u64("safe version")?);
        let has_next = cursor.u8("next tag")?;
        let next = cursor.u64("next")?;
        let next = match has_next {
            0 => None,
            1 => Some(next),
            tag => return Err(DecodeError(format!("next tag {tag}"))),
        };
        let left = cursor.u64("left")?;
        let count = cursor.u32("count")?;
        let len = cursor.u64("entries length")?;
        let len = usize::try_from(len)
            .map_err(|_| DecodeError(format!("entries length {len} too large")))?;
        let entries = cursor.bytes(len, "entries")?;
        cursor.finish()?;
        Ok(MoveOutReply {
            safe_version,
            next,
            left,
            count,
            entries,
        })
    }
}

/// Take a range's objects from its owner ahead of a commit that gives it here
/// (coordinator → target). Answered once the copy, the tails and the last tail after
/// the source froze are replayed here and on this master's backups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveInRequest {
    /// The move.
    pub id: MoveId,
    /// Its range (whole tablets of the source).
    pub range: HashRange,
    /// The source.
    pub source: ServerId,
    /// Where the source listens.
    pub source_addr: String,
    /// The most bytes per second the copy may take (0: no cap); the tails and the
    /// freeze are never held back.
    pub bytes_per_s: u64,
}

/// What a target took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveInReply {
    /// Entries received (objects, tombstones, completion records).
    pub entries: u64,
    /// Bytes of those entries.
    pub bytes: u64,
    /// Tails taken before the freeze.
    pub tails: u32,
    /// Milliseconds from the request to the freeze.
    pub copy_ms: u32,
    /// Milliseconds the range was frozen on the source before this reply.
    pub frozen_ms: u32,
}

/// A move ended without its commit (the abort is committed): the source serves its
/// range again, and the target forgets what it took (coordinator → both; either
/// ignores what it does not hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndMoveRequest {
    /// The move.
    pub id: MoveId,
    /// Its range.
    pub range: HashRange,
}

/// Asks a master to stop using a backup being drained (coordinator → master): it
/// re-creates every replica there elsewhere and places none there again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvacuateBackupRequest {
    /// The backup's server.
    pub backup: ServerId,
}

/// How far a master got in leaving a backup being drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvacuateBackupReply {
    /// The master has looked since it was first asked: the counts below are its own.
    pub reported: bool,
    /// Segments of its log with a replica still on the backup.
    pub on_backup: u32,
    /// Segments of its log not fully replicated (a replica missing, not on disk yet, or
    /// its epoch not recorded).
    pub not_whole: u32,
}

impl EvacuateBackupReply {
    /// The master's log needs nothing of the backup any more.
    pub fn done(&self) -> bool {
        self.reported && self.on_backup == 0 && self.not_whole == 0
    }
}

/// Asks a master which of its segments' copies on a backup it no longer needs there
/// (coordinator → master; the leader's collection, docs/design.md §7, "Collecting
/// replicas nobody needs").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnneededReplicasRequest {
    /// The backup holding them.
    pub backup: ServerId,
    /// The segments of this master's log it holds a copy of (at most
    /// [`UNNEEDED_SEGMENTS_MAX`]).
    pub segments: Vec<SegmentId>,
}

/// Most segments one `UnneededReplicas` names.
pub const UNNEEDED_SEGMENTS_MAX: usize = 65_536;

/// The segments whose copies on the backup the master no longer needs: gone from its
/// log, or fully replicated elsewhere with none of its live replicas on that backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnneededReplicasReply {
    /// Of those asked about.
    pub segments: Vec<SegmentId>,
}

/// Deadline of one `MoveIn`, the same on both sides: the coordinator aborts the move
/// after it. A gigabyte copies in seconds; this leaves room for a loaded machine.
pub const MOVE_IN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

bincode_message!(
    MoveStep,
    MoveOutRequest,
    MoveInRequest,
    MoveInReply,
    EndMoveRequest,
    EvacuateBackupRequest,
    EvacuateBackupReply,
    UnneededReplicasRequest,
    UnneededReplicasReply,
    ServerStatsReply,
    IdentifyReply,
    RecoverySource,
    RecoverRequest,
    RecoverReply,
    AbandonRecoveryRequest,
    FinishRecoveryRequest,
    RemoveRequest,
    IncrementRequest,
    IncrementReply,
    MultiReadRequest,
    MultiReadReply,
    MultiWriteRequest,
    MultiRemoveRequest,
    MultiWriteReply,
    EnumerateRequest,
    EnumerateReply,
    TabletsRequest,
    SyncTabletsRequest,
    PingRequest,
    PingReply,
    ServerListVersion,
);

rpcs! {
    /// Read one object.
    Read = 1: ReadRequest => ReadReply;
    /// Write one object.
    Write = 2: WriteRequest => WriteReply;
    /// Remove one object.
    Remove = 3: RemoveRequest => WriteReply;
    /// Add to an integer object.
    Increment = 4: IncrementRequest => IncrementReply;
    /// Read several objects.
    MultiRead = 5: MultiReadRequest => MultiReadReply;
    /// Write several objects.
    MultiWrite = 6: MultiWriteRequest => MultiWriteReply;
    /// Remove several objects.
    MultiRemove = 7: MultiRemoveRequest => MultiWriteReply;
    /// One page of a table, by key hash.
    Enumerate = 8: EnumerateRequest => EnumerateReply;
    /// Take ownership of tablets (coordinator → master; `WrongServer` when meant for
    /// another server).
    TakeTablets = 9: TabletsRequest => ();
    /// Drop tablets and their objects (coordinator → master; `WrongServer` likewise).
    DropTablets = 10: TabletsRequest => ();
    /// Liveness and a few figures.
    Ping = 11: PingRequest => PingReply;
    /// Pushed by the coordinator leader to every `Up` server after the server list
    /// changes. A server holding an older list pulls (`GetTabletMap`) at once, instead of
    /// at its next periodic refresh. Only the version travels, so a push costs the same
    /// in a cluster of any size.
    ServerListChanged = 12: ServerListVersion => ();
    /// Replay one partition of a crashed master (coordinator → recovery master).
    Recover = 13: RecoverRequest => RecoverReply;
    /// Forget objects a failed recovery left in ranges this master does not own.
    AbandonRecovery = 14: AbandonRecoveryRequest => ();
    /// Catch up with the committed map's tablets of this master (coordinator → master).
    SyncTablets = 15: SyncTabletsRequest => ();
    /// Forget what a finished recovery left here unowned (coordinator → master, once the
    /// crashed master owns nothing; `WrongServer` when meant for another server).
    FinishRecovery = 16: FinishRecoveryRequest => ();
    /// How the server stands: its master's memory, replication, lease and recoveries,
    /// and its backup's replicas and frames (for `rampart status` and the status page).
    ServerStats = 17: PingRequest => ServerStatsReply;
    /// Which server listens here (the coordinator's probe of a crashed server's address:
    /// another id there is proof that the crashed one is gone, see
    /// `coordinator::proof_of_death`). Answered at once, lease or not.
    Identify = 18: PingRequest => IdentifyReply;
    /// One step of a move out of this master (target → source): a piece of the range's
    /// live objects, a tail of its changes, or the freeze and a tail.
    MoveOut = 19: MoveOutRequest => MoveOutReply;
    /// Take a range from its owner ahead of a commit giving it here (coordinator →
    /// target).
    MoveIn = 20: MoveInRequest => MoveInReply;
    /// A move was aborted: serve the range again (source), forget the copy (target).
    EndMove = 21: EndMoveRequest => ();
    /// Stop using a backup being drained; how far that got (coordinator → master).
    EvacuateBackup = 22: EvacuateBackupRequest => EvacuateBackupReply;
    /// Which of its segments' copies on a backup it no longer needs (coordinator →
    /// master); answered at the master's next upkeep.
    UnneededReplicas = 23: UnneededReplicasRequest => UnneededReplicasReply;
}

const RULE_DOESNT_EXIST: u8 = 1;
const RULE_EXISTS: u8 = 2;
const RULE_VERSION_LE_GIVEN: u8 = 4;
const RULE_VERSION_NE_GIVEN: u8 = 8;

fn put_rules(out: &mut BytesMut, rules: &RejectRules) {
    out.put_u64_le(rules.given_version.0);
    let flag = |on: bool, bit: u8| if on { bit } else { 0 };
    let flags = flag(rules.doesnt_exist, RULE_DOESNT_EXIST)
        | flag(rules.exists, RULE_EXISTS)
        | flag(rules.version_le_given, RULE_VERSION_LE_GIVEN)
        | flag(rules.version_ne_given, RULE_VERSION_NE_GIVEN);
    out.put_u8(flags);
}

fn get_rules(cursor: &mut Cursor) -> Result<RejectRules, DecodeError> {
    let given_version = Version(cursor.u64("reject rules")?);
    let flags = cursor.u8("reject rules")?;
    if flags & !0x0F != 0 {
        return Err(DecodeError(format!(
            "unknown reject-rule flags {flags:#04x}"
        )));
    }
    Ok(RejectRules {
        given_version,
        doesnt_exist: flags & RULE_DOESNT_EXIST != 0,
        exists: flags & RULE_EXISTS != 0,
        version_le_given: flags & RULE_VERSION_LE_GIVEN != 0,
        version_ne_given: flags & RULE_VERSION_NE_GIVEN != 0,
    })
}

// Wire layouts of the hot path (little-endian):
//   ReadRequest   table u64 | key_len u32 | key
//   ReadReply     status u16 | version u64 | value (rest of payload)
//   WriteRequest  table u64 | rules (given u64, flags u8) | key_len u32 | key | value (rest)
//   WriteReply    status u16 | version u64

impl WireMessage for ReadRequest {
    fn encode(&self, out: &mut BytesMut) {
        out.reserve(12 + self.key.len());
        out.put_u64_le(self.table.0);
        out.put_u32_le(self.key.len() as u32);
        out.put_slice(&self.key);
    }

    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut cursor = Cursor::new(payload);
        let table = TableId(cursor.u64("table id")?);
        let key_len = cursor.u32("key length")? as usize;
        let key = cursor.bytes(key_len, "key")?;
        cursor.finish()?;
        Ok(ReadRequest { table, key })
    }
}

/// Encodes a [`ReadReply`] from borrowed parts, so a master can copy a value from its
/// log straight into the reply frame.
pub fn encode_read_reply(out: &mut BytesMut, status: Status, version: Version, value: &[u8]) {
    out.reserve(10 + value.len());
    out.put_u16_le(status.code());
    out.put_u64_le(version.0);
    out.put_slice(value);
}

impl WireMessage for ReadReply {
    fn encode(&self, out: &mut BytesMut) {
        encode_read_reply(out, self.status, self.version, &self.value);
    }

    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut cursor = Cursor::new(payload);
        let status = Status::from_code(cursor.u16("status")?);
        let version = Version(cursor.u64("version")?);
        Ok(ReadReply {
            status,
            version,
            value: cursor.rest(),
        })
    }
}

impl WireMessage for WriteRequest {
    fn encode(&self, out: &mut BytesMut) {
        out.reserve(45 + self.key.len() + self.value.len());
        out.put_u64_le(self.table.0);
        put_rules(out, &self.rules);
        out.put_u64_le(self.rifl.client.0);
        out.put_u64_le(self.rifl.seq);
        out.put_u64_le(self.rifl.ack);
        out.put_u32_le(self.key.len() as u32);
        out.put_slice(&self.key);
        out.put_slice(&self.value);
    }

    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut cursor = Cursor::new(payload);
        let table = TableId(cursor.u64("table id")?);
        let rules = get_rules(&mut cursor)?;
        let rifl = Rifl {
            client: ClientId(cursor.u64("client id")?),
            seq: cursor.u64("sequence number")?,
            ack: cursor.u64("acknowledgement")?,
        };
        let key_len = cursor.u32("key length")? as usize;
        let key = cursor.bytes(key_len, "key")?;
        Ok(WriteRequest {
            table,
            key,
            value: cursor.rest(),
            rules,
            rifl,
        })
    }
}

impl WireMessage for WriteReply {
    fn encode(&self, out: &mut BytesMut) {
        out.put_u16_le(self.status.code());
        out.put_u64_le(self.version.0);
    }

    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut cursor = Cursor::new(payload);
        let status = Status::from_code(cursor.u16("status")?);
        let version = Version(cursor.u64("version")?);
        cursor.finish()?;
        Ok(WriteReply { status, version })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<M: WireMessage + PartialEq + std::fmt::Debug>(message: M) {
        let mut out = BytesMut::new();
        message.encode(&mut out);
        assert_eq!(M::decode(out.freeze()), Ok(message));
    }

    #[test]
    fn move_pieces_round_trip_and_a_bad_one_is_refused() {
        for next in [None, Some(0), Some(u64::MAX)] {
            round_trip(MoveOutReply {
                safe_version: Version(9),
                next,
                left: 4,
                count: 2,
                entries: Bytes::from_static(b"entries"),
            });
        }
        let mut out = BytesMut::new();
        MoveOutReply::default().encode(&mut out);
        let mut bad = out.to_vec();
        bad[8] = 2;
        assert!(MoveOutReply::decode(Bytes::from(bad)).is_err(), "next tag");
        let mut long = out.to_vec();
        long.push(0);
        assert!(MoveOutReply::decode(Bytes::from(long)).is_err(), "trailing");
        assert!(
            MoveOutReply::decode(out.freeze().slice(..20)).is_err(),
            "short"
        );
    }

    #[test]
    fn hot_path_messages_round_trip() {
        round_trip(ReadRequest {
            table: TableId(3),
            key: Bytes::from_static(b"key"),
        });
        round_trip(ReadReply {
            status: Status::Ok,
            version: Version(9),
            value: Bytes::from_static(b"value"),
        });
        round_trip(WriteRequest {
            table: TableId(3),
            key: Bytes::from_static(b"k"),
            value: Bytes::new(),
            rules: RejectRules {
                given_version: Version(4),
                exists: true,
                version_ne_given: true,
                ..RejectRules::default()
            },
            rifl: Rifl {
                client: ClientId(11),
                seq: 12,
                ack: 10,
            },
        });
        round_trip(WriteReply {
            status: Status::WrongVersion,
            version: Version(7),
        });
    }

    #[test]
    fn truncated_and_padded_payloads_are_refused() {
        let mut out = BytesMut::new();
        ReadRequest {
            table: TableId(1),
            key: Bytes::from_static(b"abcdef"),
        }
        .encode(&mut out);
        let whole = out.freeze();
        for cut in 0..whole.len() {
            assert!(
                ReadRequest::decode(whole.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        let mut padded = BytesMut::from(&whole[..]);
        padded.put_u8(0);
        assert!(ReadRequest::decode(padded.freeze()).is_err());
    }

    #[test]
    fn unknown_reject_flags_are_refused() {
        let mut out = BytesMut::new();
        out.put_u64_le(1);
        out.put_u64_le(0);
        out.put_u8(0x80);
        out.put_u32_le(0);
        assert!(WriteRequest::decode(out.freeze()).is_err());
    }

    #[test]
    fn bincode_messages_reject_hostile_lengths() {
        // A multi-read that claims 2^60 objects must fail to decode, not allocate.
        let mut out = BytesMut::new();
        out.put_u64_le(1 << 60);
        assert!(MultiReadRequest::decode(out.freeze()).is_err());
    }
}
