//! `BackupService`: the backup's RPC handlers and its frames (DESIGN.md §5 "Backups",
//! "One-sided writes", "Fencing").
//!
//! A master opens a *frame* for each replica it places here (`OpenReplica`), fills it —
//! by `WriteReplica` RPCs (the `rpc` transport), through the soft-NIC ([`BackupNic`], the
//! `tcp` transport), by copying straight into the shared frame file (`shm`) or by RDMA
//! WRITE into it (`rdma`, after an `RdmaConnect`; see `rdma.rs`) — and
//! closes it (`CloseReplica`); the close writes the replica to the [`SegmentStore`] and
//! releases the frame. `BumpEpoch` moves an open frame to a newer epoch, and
//! `FreeReplica`, `ListReplicas` and `ReadReplica` serve the cleaner and recovery;
//! [`BackupService::fence_master`] is recovery's fence. Callers see replicas named by
//! (master, segment) and frames named by handles; they never see the store's files,
//! the slots, the locks or the blocking threads.
//!
//! Crash recovery of a master (DESIGN.md §6) uses four more RPCs:
//! * `StartRecovery` fences the master's open frames and reports every replica of it
//!   held here, sorted by segment — open frames with their fenced lengths, stored
//!   replicas open or closed, a frame shadowing the stored copy as in lists (unless the
//!   frame has no footer and the stored copy is closed: see "Frames") — with the
//!   log digest, and the successor named by a footer, of each replica that is not closed
//!   (the coordinator's completeness check, DESIGN.md §4: every footer found needs its
//!   successor, whether or not its copy was closed).
//! * `RecoveryRead` answers at once and has [`RecoveryReads`] read the named replicas
//!   in order on a blocking thread, splitting each by partition.
//! * `RecoveryData` hands out one (segment, partition) piece, waits for it, or reads
//!   the replica on demand (a fallback); see [`RecoveryReads::fetch`].
//! * `EndRecovery` forgets the master's recovery and frees every replica of it here,
//!   frames first, as `FreeReplica` does (so a close in flight cannot resurrect one).
//!
//! Every recovery read fences the master first if `StartRecovery` did not reach this
//! backup: bytes a still-running master could change are never served to recovery.
//!
//! # Guarantees
//! 1. A `CloseReplica` is answered `Ok` only once [`SegmentStore::write_replica`]
//!    returned `Ok`, i.e. the replica is fsynced and survives a restart of the backup.
//! 2. Epochs never go back: an open frame refuses older epochs, and a closed replica is
//!    final (re-opening it at its epoch or an older one is `StaleEpoch`).
//! 3. A replica is never invisible while it moves from frame to disk: the frame stays
//!    in the frame table until the stored replica is in the metadata mirror, and both
//!    changes happen in one critical section.
//! 4. Handles are never reused, and a slot's owner word is the handle of the frame it
//!    holds, so a late write for a closed, freed or replaced frame — by any transport —
//!    gets `UnknownFrame` (or `FrameGone`) rather than touching another replica.
//! 5. No input panics the service: every request is decoded with [`Reply::decode`],
//!    every offset and length is checked in 64-bit arithmetic before it is used.
//! 6. Fencing: after [`BackupService::fence_master`] returns, no write to the fenced
//!    frames is acknowledged by any transport (`Fenced`), and every write acknowledged
//!    before it lies within the lengths it reported (the Dekker pair of
//!    `rampart_common::onesided::shm`). Those lengths are final: lists and reads of a
//!    fenced frame serve exactly that prefix, even if an unacknowledged write in flight
//!    during the fence landed past it. Close, `BumpEpoch` and a replacing open of a
//!    fenced frame are `Fenced` too; list, read and free still serve it. Once freed (by
//!    `EndRecovery`, which also fences a master `StartRecovery` never reached here), a
//!    fenced frame's handle is remembered ([`FENCED_HANDLES_MAX`]) and still answered
//!    `Fenced`: a zombie master must never take it for a lost replica. For `rdma`,
//!    whose writes the NIC acknowledges without looking at the fence word, the fence
//!    revokes the master's RDMA key before the scan, and the master is refused a new
//!    one.
//!
//! # Parts
//! This module is the dispatch: it decodes requests, calls the parts below, and turns
//! their answers into replies.
//! * `frame_table.rs` — `FrameTable`, every decision about frames (open, write, bump,
//!   close, free, fence, end) as a plain synchronous state machine, tested alone; its
//!   refusals are a status and a reason.
//! * `frames.rs` — `Frames`: the table under its lock and the [`FrameFile`], carrying out
//!   the table's decisions on the file and copying bytes in and out of slots.
//! * `fencing.rs` — the fence (guarantee 6) and its order of steps.
//! * `stored.rs` — `StoreHandle`: the [`SegmentStore`] under its lock, keeping the
//!   table's mirror of the store's metadata in step with every store call.
//! * `rdma.rs` — `RdmaTarget`, the backup's side of the `rdma` transport.
//!
//! # Frames
//! A frame is (master, segment, epoch, capacity) and
//! the *slot* of the backup's [`FrameFile`] that holds its bytes. The file is created at
//! start-up at [`BackupConfig::frame_file`] with [`BackupConfig::frames_max`] +
//! [`BackupConfig::extra_slots`] slots of [`BackupConfig::frame_bytes_max`] bytes;
//! `OpenReplica` takes a free slot (oldest released first), zeroes it and stamps it with
//! the handle, and its reply tells the master where the slot lies in the file and where
//! the soft-NIC listens. At most `frames_max` frames are open at once — the bound on
//! unflushed data; past it (or when every slot is still being flushed) `OpenReplica` is
//! `BackupFull` and the master picks another backup. The slots beyond `frames_max` are
//! what lets flushed replicas stay in memory (below) while as many frames are open.
//!
//! **Flushed replicas stay readable from memory.** A close that stored its replica
//! releases the slot *keeping its bytes* ([`FrameFile::release`]; the
//! next open zeroes it instead). While the slot stays free — slots are reused oldest
//! release first, so the most recently flushed replicas stay longest — reads of that
//! replica (`ReadReplica`, recovery) copy it from the slot, checked against the store's
//! checksum, instead of reading the disk: the store writes with `O_DIRECT`, so its
//! files are not in the page cache, and a recovery that started on this machine's disk
//! waited for it (reads at ≈ 0.3 GB/s) before any partition could go live.
//!
//! One-sided writes do not tell the backup how far they wrote, so the length of an open
//! frame (in lists, reads and the fence) is its *valid prefix*: the frame is copied out
//! of its slot and scanned with [`scan`] (DESIGN.md §4), which stops at the last
//! `Checksum` entry that matches. A close stores the first `length` bytes the master
//! names.
//!
//! **A frame shadows the stored copy of its replica** in lists, reads and
//! `StartRecovery` (when its epoch is at least the stored one) — **except a frame
//! without footer beside a closed stored copy.** A master that took this backup for dead
//! re-creates its lost replica of a closed segment from byte 0, at a newer epoch, and
//! may pick this backup again, which still holds the closed copy; if the master crashes
//! before the re-creation reaches the footer, the frame is only a prefix of that copy,
//! and reporting it would leave the recovery with no complete copy of the segment
//! (`FrameTable::shadows_stored`; found by `rampart simulate`, seed 35).
//!
//! # Concurrency
//! Two locks, both `parking_lot` mutexes (nothing awaits while holding either):
//! * `store` — the [`SegmentStore`] (in `StoreHandle`). Held across disk I/O (a commit's rename and
//!   directory fsync, a free, the writes of a graceful stop), so it is only ever taken
//!   on a blocking thread, never on the reactor. A close writes its replica's bytes and
//!   fsyncs them *outside* it, on one of the [`FLUSH_THREADS`] flush threads
//!   ([`ReplicaWriter::prepare`]), and takes it only to commit; so frees and other
//!   closes wait for a rename, not for a transfer. Reads of a stored
//!   replica (`ReadReplica`, recovery) do not take it: they read the file the metadata
//!   mirror names ([`ReplicaFiles`](crate::segment_store::ReplicaFiles); files are never changed in place) and fall back to
//!   the store only when that file no longer verifies, so a recovery's reads never wait
//!   behind closes writing to the disk.
//! * `table` — the frame table, the free slots and a mirror of the store's metadata
//!   (in `Frames`).
//!   Held only for lookups and bookkeeping (and to zero the slot an open takes, a
//!   `memset` of touched memory: ≈ 0.4 ms for 8 MiB), so the reactor and the connection tasks
//!   (`handle_now`) take it freely. Writes (`WriteReplica`, the soft-NIC) look their
//!   frame up under it and copy *outside* it: the slot's owner word, checked by the copy
//!   itself, stops a write to a slot that changed hands meanwhile. Copying frames out
//!   for a scan, and zeroing a released slot, also happen outside it.
//!
//! Lock order: `store` before `table`. A blocking task holding `store` may take `table`
//! briefly to publish its result; nothing that holds `table` ever waits for `store`.
//! Hence no cycle exists. The RDMA state (`rdma.rs`) has a mutex of its own, taken by
//! `RdmaConnect` and `fence_master` with neither held.
//!
//! **A slot is released only when nothing reads it.** A frame removed from the table
//! (closed, freed, replaced) while a close is still copying its slot to disk is parked in
//! `retiring`; its slot is released when the last such close ends (keeping its bytes
//! for reads if any of them stored the replica, whichever ends last). Lists, reads and the
//! fence copy a slot without pinning it, and check afterwards, under `table`, that its
//! frame is still in the table (it cannot come back: handles are never reused); a copy
//! that lost that race is discarded.
//!
//! **Close racing free (or a replacing open) of the same replica.** `FreeReplica` first
//! removes the frame from the table (under `table`), then frees the stored replica
//! (under `store`). A close checks, *under `store`*, that its frame is still in the
//! table before it writes. So either the close's write runs first, entirely before the
//! free's store step, which then deletes it; or the close finds its frame gone, writes
//! nothing and answers `UnknownFrame`. Either way **the replica ends up freed**, and a
//! close answered `Ok` was linearised before the free. A replica the master freed is
//! never resurrected by a close that was still in flight.
//!
//! # Failure handling
//! * Store full on close → `BackupFull`; the frame stays open so the master can retry
//!   the close or free the frame and place the replica elsewhere. Any other store error
//!   also leaves the frame open (the master decides); `StaleEpoch`/`Regressed` map to
//!   `StaleEpoch`, I/O errors to `Internal` with the detail.
//! * A replica that fails verification on read is quarantined by the store and
//!   reported as `Internal` with the reason; it is no longer listed.
//! * A retried close whose first attempt succeeded finds the frame gone and gets
//!   `UnknownFrame`; the master can confirm with `ListReplicas`.
//! * A frame refuses writes while a close of it runs (`UnknownFrame`: the master
//!   declared it complete). That covers the `rpc` and `tcp` transports; a master writing
//!   by `shm` must not write after sending close, and does not.
//! * The frame file lives as long as the service (and the [`BackupNic`] and closes that
//!   share it), then is removed if no frame is open in it; otherwise it stays, as it
//!   does when the backup is killed (next section).
//!
//! # Frames survive a kill
//! The frames are the backup's non-volatile buffer (DESIGN.md §5): a write acknowledged
//! by every replica may be in no store yet (below a segment per master, nothing is). So
//! each slot's header labels the frame it holds (master, segment, epoch, capacity, and
//! the fenced length once fenced), written before the slot is handed out or before the
//! answer that changed it, and the file outlives a killed process. [`BackupService::open`]
//! first reads back the file a predecessor on the same data directory left (its *tag* is
//! the data directory): each held slot's valid prefix — scanned as a list scans a frame,
//! cut at its recorded fenced length — whose bytes begin with the labelled replica's
//! header is written to the store as an *open* replica unless the store already holds
//! as much, the same step as [`BackupService::flush_open_frames`] at a graceful stop.
//! Only then is the file replaced. So every replica the predecessor could have reported
//! is reported again, at the same epoch, with at least the length it reported (and no
//! more than a fenced length). A master still writing into the old file learns the
//! backup process is gone (the `shm` route checks) and re-creates the replica elsewhere,
//! as after any backup crash. A power loss of the host loses the file (`/dev/shm` is
//! memory): only what the store holds survives that.
//!
//! # Cost
//! Open, write and `BumpEpoch` run on the connection task (`handle_now`). A write copies
//! its payload once, outside `table` (≈ 100 µs per MiB at memory speed). Listing or
//! reading an open frame copies and scans it on a blocking thread (≈ 1–5 ms per 8 MiB
//! frame). A close costs one replica write plus two fsyncs in the store (≈ 17 ms for
//! 8 MiB at 500 MB/s), on a flush thread ([`FlushThreads`]): the frame is copied into
//! a buffer the thread keeps (touched memory), written, and its slot released with its
//! bytes, zeroed in place by the next open (the frame file is a pool allocated at
//! start-up: no page is faulted in or given back while the backup runs).
//! `StartRecovery` scans each open frame of the master twice (fence, then digest) and
//! reads each stored open replica from disk (one per master normally); recovery reads
//! cost what [`crate::recovery`] says, all on blocking threads.

use bytes::Bytes;
use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::log::scan;
use rampart_common::onesided::host_id;
use rampart_common::onesided::nic::NicTarget;
use rampart_common::onesided::shm::{FrameFile, LeftBehind, SlotLabel};
use rampart_common::protocol::backup::{
    self as proto, BumpEpochRequest, CloseReplicaRequest, EndRecoveryReply, EndRecoveryRequest,
    FreeReplicaReply, FreeReplicaRequest, ListReplicasReply, ListReplicasRequest,
    OpenReplicaRequest, RdmaConnectRequest, ReadReplicaReply, RecoveryDataRequest,
    RecoveryReadRequest, RecoveryReplica, ReplicaId, ReplicaInfo, StartRecoveryReply,
    StartRecoveryRequest, WriteReplicaRequest,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, Service};
use rampart_common::status::Status;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::fencing;
use crate::flush_threads::{FlushThreads, FLUSH_THREADS};
pub use crate::frame_table::FENCED_HANDLES_MAX;
use crate::frame_table::{Closing, FrameLimits, FrameTable, Refusal, ReplicaKey};
use crate::frames::Frames;
use crate::rdma::RdmaTarget;
use crate::recovery::{HeldReplica, RecoveryReads, ReplicaSource, RECOVERY_PIECES_BYTES_MAX};
use crate::segment_store::{
    Disk, RealDisk, ReplicaImage, ReplicaMeta, ReplicaWriter, ScanReport, SegmentStore, StoreError,
    REPLICA_BYTES_MAX,
};
use crate::stored::{CloseFailure, StoreHandle};

/// How a backup sizes and places its frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupConfig {
    /// Frames open at once: the bound on replica bytes held only in memory. Sized so
    /// the disk can flush them (issue 3); `OpenReplica` past it is `BackupFull`. Must be
    /// at least 1.
    pub frames_max: usize,
    /// Slots of the frame file beyond `frames_max`. They hold no more unflushed data
    /// (`frames_max` still bounds the open frames) but keep more flushed replicas
    /// readable from memory, and leave room to open frames while closes still copy
    /// theirs out: in a 1 GiB recovery, a backup with 64 slots instead of 20 serves more
    /// of the crashed master's log from memory (issue 12).
    pub extra_slots: usize,
    /// Largest frame capacity accepted, in bytes; larger opens are `InvalidArgument`.
    /// Values above [`REPLICA_BYTES_MAX`] are treated as it (the store takes no more).
    /// Each slot of the frame file holds this much.
    pub frame_bytes_max: u32,
    /// Where the backup creates its shared-memory frame file (replacing any file a dead
    /// backup left there). Masters on the same host map it, so it should lie on a
    /// memory file system (`/dev/shm`); anywhere else works, with the kernel writing the
    /// frames back to that disk in the background. The path must be valid UTF-8 (it
    /// travels in `OpenReplica` replies).
    pub frame_file: PathBuf,
}

/// What [`BackupService::open`] found: the store's scan, and what the frame file a killed
/// predecessor left held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// The segment store's scan (the replicas on disk, the files quarantined).
    pub store: ScanReport,
    /// Frames read back from the frame file and stored as open replicas, with what the
    /// store now holds of each.
    pub frames_read_back: Vec<ReplicaMeta>,
    /// Held frames not stored, and why: nothing valid written yet, the store already
    /// holds as much, bytes that are not the labelled replica's.
    pub frames_skipped: Vec<(SlotLabel, String)>,
    /// Why a file found at the frame file's path was not read: not a frame file of this
    /// format, or the file of a backup whose data directory is gone. It is replaced.
    pub frame_file_unread: Option<String>,
}

/// The file in a backup's data directory that holds its identity: a random number drawn
/// when the directory is first used, in hexadecimal.
pub const IDENTITY_FILE: &str = "BACKUP_ID";

/// The tag of the frame file of the backup on `data_dir`: `IDENTITY PATH`, its identity
/// ([`IDENTITY_FILE`], created on first use) and its canonical path. The identity tells
/// this directory from a new one at the same path: a data directory wiped and used again
/// (by a new cluster, whose servers get the same ids again) must not adopt the frames the
/// old one left. Blocks on the disk (creating the identity syncs it).
pub fn frame_file_tag(data_dir: &Path) -> Result<String, StoreError> {
    let path = data_dir.join(IDENTITY_FILE);
    let io_error = |source: std::io::Error| StoreError::Io {
        path: path.clone(),
        source,
    };
    let identity = match std::fs::read_to_string(&path) {
        Ok(text) => u64::from_str_radix(text.trim(), 16).map_err(|_| {
            io_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a backup identity: {:?}", text.trim()),
            ))
        })?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let identity = rand::random::<u64>();
            let temp = data_dir.join(format!("{IDENTITY_FILE}.tmp"));
            let write = || -> std::io::Result<()> {
                let mut file = std::fs::File::create(&temp)?;
                std::io::Write::write_all(&mut file, format!("{identity:016x}\n").as_bytes())?;
                file.sync_all()?;
                std::fs::rename(&temp, &path)?;
                std::fs::File::open(data_dir)?.sync_all()
            };
            write().map_err(io_error)?;
            identity
        }
        Err(error) => return Err(io_error(error)),
    };
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    Ok(format!("{identity:016x} {}", canonical.to_string_lossy()))
}

/// Whether the backup a frame file's `tag` names ([`frame_file_tag`]) may still come back
/// for its frames: its data directory exists and holds the same identity. A file whose
/// tag is not of that form is nobody's.
pub fn frame_file_tag_is_live(tag: &str) -> bool {
    let Some((identity, path)) = tag.split_once(' ') else {
        return false;
    };
    std::fs::read_to_string(Path::new(path).join(IDENTITY_FILE))
        .is_ok_and(|held| held.trim() == identity)
}

/// Stores, as open replicas, the frames that a backup killed on this data directory left
/// in its frame file at `path` (module doc, "Frames survive a kill"): each held slot's
/// valid prefix (no more than its recorded fenced length), when its bytes begin with the
/// header of the replica its label names and the store holds less of it. Errors leave
/// the file as it is: a store that cannot take the frames (disk full, I/O error) stops
/// the backup from starting rather than lose them, and so does a file tagged for another
/// backup whose data directory exists. Blocks on the disk.
fn read_back_frames(
    store: &mut SegmentStore,
    path: &Path,
    tag: &str,
    report: &mut OpenReport,
) -> Result<(), StoreError> {
    let io_error = |source: std::io::Error| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let left = match FrameFile::read_back(path, tag).map_err(io_error)? {
        LeftBehind::Nothing => return Ok(()),
        LeftBehind::Unreadable(why) => {
            report.frame_file_unread = Some(why);
            return Ok(());
        }
        LeftBehind::Foreign(owner) if !frame_file_tag_is_live(&owner) => {
            report.frame_file_unread = Some(format!(
                "the frame file of the backup {owner}, whose data directory is gone"
            ));
            return Ok(());
        }
        LeftBehind::Foreign(owner) => {
            return Err(io_error(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "it holds the frames of the backup on {owner}; give each backup its \
                     own frame file"
                ),
            )))
        }
        LeftBehind::Frames(left) => left,
    };
    for slot in left.held() {
        let label = slot.label;
        if label.capacity > REPLICA_BYTES_MAX {
            let reason = format!(
                "a capacity of {} bytes: no replica is that large",
                label.capacity
            );
            report.frames_skipped.push((label, reason));
            continue;
        }
        let bytes = left.read(&slot);
        let scanned = scan(&bytes);
        let valid = slot.fenced_length.map_or(scanned.valid_bytes, |fenced| {
            fenced.min(scanned.valid_bytes)
        });
        let names_it = scanned
            .header
            .is_some_and(|h| h.log_id == label.master && h.segment_id == label.segment);
        let stored = store.meta(label.master, label.segment);
        let holds_as_much = stored.is_some_and(|stored| {
            stored.epoch > label.epoch
                || (stored.epoch == label.epoch && (stored.closed || stored.length >= valid))
        });
        let skipped = if valid == 0 {
            Some("nothing valid was written to it".to_string())
        } else if !names_it {
            Some(format!(
                "its bytes begin with {:?}, not the header of that replica",
                scanned.header
            ))
        } else if holds_as_much {
            Some(format!("the store holds as much of it already: {stored:?}"))
        } else {
            None
        };
        if let Some(reason) = skipped {
            report.frames_skipped.push((label, reason));
            continue;
        }
        let meta = store.write_replica(
            label.master,
            label.segment,
            label.epoch,
            false,
            &bytes[..valid as usize],
        )?;
        report.frames_read_back.push(meta);
    }
    Ok(())
}

/// The replica `key` as reads see it: the visible open frame's valid prefix (its fenced
/// length once fenced) unless it has no footer and the store holds a closed copy
/// ([`FrameTable::shadows_stored`]), else the stored copy, verified (a corrupt one is
/// quarantined and reported as [`StoreError::Corrupt`]); `None` if not held. Blocks:
/// copies and scans frames, reads the stored copy's file (without the store lock: see
/// [`ReplicaFiles`](crate::segment_store::ReplicaFiles)), and takes the store lock briefly, or for a whole read when the
/// file changed meanwhile.
fn read_held(
    store: &StoreHandle,
    frames: &Frames,
    key: ReplicaKey,
    mut reuse: Vec<u8>,
) -> Result<Option<HeldReplica>, StoreError> {
    let frame = frames.table.lock().visible(key);
    if let Some(frame) = frame {
        if let Some(scanned) = frames.scan(vec![frame]).pop() {
            if frames.shadows_stored(&scanned) {
                return Ok(Some(HeldReplica {
                    info: scanned.info(),
                    bytes: scanned.bytes,
                }));
            }
            // A re-creation of a closed segment's replica on this backup, which still
            // holds it closed, cut short by the master's crash: the closed copy below
            // is the whole segment, the frame only a prefix of it.
        }
        // Closed, freed or replaced meanwhile: the store has the answer.
    }
    // From memory if the slot it was flushed from is still free.
    if let Some(meta) = frames.read_kept(key, &mut reuse) {
        return Ok(Some(HeldReplica {
            info: ReplicaInfo::from(&meta),
            bytes: reuse,
        }));
    }
    // Read the file without the store lock: its metadata from the mirror (which may
    // lag the store, never lead it), and the store's own read below settles what this
    // one cannot (a replica replaced, freed or corrupt meanwhile).
    let stored = frames.table.lock().stored(key);
    if let Some(file) = stored.map(|meta| frames.files.file(meta)) {
        if file.read_into(&mut reuse) {
            return Ok(Some(HeldReplica {
                info: ReplicaInfo::from(&file.meta()),
                bytes: reuse,
            }));
        }
    }
    // `None`: freed between the lookup above and the read.
    Ok(store.read(key)?.map(|(bytes, meta)| HeldReplica {
        info: ReplicaInfo::from(&meta),
        bytes,
    }))
}

/// Every replica of `master` held here, for `StartRecovery`: stored ones and visible
/// frames (a frame shadows its stored copy, as in lists: not a closed one when the frame
/// has no footer), sorted by segment, with the log digest and the footer's successor of
/// each one that is not closed. Blocks: scans frames, reads stored open replicas from
/// disk.
fn recovery_replicas(
    store: &StoreHandle,
    frames: &Frames,
    master: ServerId,
) -> Vec<RecoveryReplica> {
    let (stored, open) = frames.table.lock().list(Some(master));
    let mut replicas: BTreeMap<ReplicaKey, RecoveryReplica> = stored
        .iter()
        .map(|meta| {
            let replica = RecoveryReplica {
                info: ReplicaInfo::from(meta),
                digest: None,
                successor: None,
            };
            ((meta.master, meta.segment), replica)
        })
        .collect();
    let mut from_frames = BTreeSet::new();
    for frame in frames.scan(open) {
        let key = frame.frame.key();
        let scanned = scan(&frame.bytes);
        // A frame without footer beside a closed stored copy is a re-creation of the
        // closed segment's replica (the master took this backup for dead, lost the
        // replica, then picked this backup again) that the master's crash cut short.
        // Reporting it would hide the whole segment: the recovery would find only
        // copies without footer, and wait for ever or (allowing loss) replay a prefix.
        if !frames
            .table
            .lock()
            .shadows_stored(key, scanned.successor.is_some())
        {
            continue;
        }
        from_frames.insert(key);
        replicas.insert(
            key,
            RecoveryReplica {
                info: frame.info(),
                digest: scanned.digest,
                successor: scanned.successor,
            },
        );
    }
    // Open replicas on disk (flushed at a graceful stop): their digest and footer are in
    // their bytes.
    let open_stored: Vec<ReplicaKey> = replicas
        .iter()
        .filter(|(key, replica)| !replica.info.closed && !from_frames.contains(*key))
        .map(|(key, _)| *key)
        .collect();
    for key in open_stored {
        match store.read(key) {
            Ok(Some((bytes, _))) => {
                if let Some(replica) = replicas.get_mut(&key) {
                    let scanned = scan(&bytes);
                    replica.digest = scanned.digest;
                    replica.successor = scanned.successor;
                }
            }
            // Freed meanwhile, or corrupt (now quarantined): no longer held.
            Ok(None) | Err(StoreError::Corrupt { .. }) => {
                replicas.remove(&key);
            }
            // Perhaps readable later: reported, without its digest.
            Err(error) => {
                tracing::warn!(master = %key.0, segment = %key.1, %error, "open replica unreadable at recovery start");
            }
        }
    }
    replicas.into_values().collect()
}

/// The service's replicas as recovery reads them ([`ReplicaSource`]). Fences the
/// master first where that has not been done ([`fencing::fence_before_reading`]): a
/// frame is served to recovery only with its final, fenced length.
#[derive(Debug)]
struct RecoverySource {
    store: Arc<StoreHandle>,
    frames: Arc<Frames>,
    rdma: Arc<RdmaTarget>,
}

impl ReplicaSource for RecoverySource {
    fn read(
        &self,
        master: ServerId,
        segment: SegmentId,
        reuse: Vec<u8>,
    ) -> Result<Option<HeldReplica>, StoreError> {
        let key = (master, segment);
        fencing::fence_before_reading(&self.frames, &self.rdma, key);
        read_held(&self.store, &self.frames, key, reuse)
    }
}

/// A replica's facts on the wire (also what `rampart-sim`'s backups report).
impl From<&ReplicaMeta> for ReplicaInfo {
    fn from(meta: &ReplicaMeta) -> ReplicaInfo {
        ReplicaInfo {
            master: meta.master,
            segment: meta.segment,
            epoch: meta.epoch,
            length: meta.length,
            closed: meta.closed,
        }
    }
}

/// The reply for a refusal of the frame table.
fn refused(refusal: Refusal) -> Reply {
    Reply::error(refusal.status, refusal.detail)
}

/// The reply for a store error.
fn store_error_reply(error: StoreError) -> Reply {
    let status = match &error {
        StoreError::Full { .. } => Status::BackupFull,
        StoreError::StaleEpoch { .. } | StoreError::Regressed { .. } => Status::StaleEpoch,
        StoreError::Corrupt { .. } | StoreError::InUse { .. } | StoreError::Io { .. } => {
            Status::Internal
        }
    };
    Reply::error(status, error)
}

/// Runs `f` on a blocking thread (it takes the store lock, or copies and scans frames).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Reply> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Reply::error(Status::Internal, format!("backup store task failed: {e}")))
}

thread_local! {
    /// The replica file a close builds, the frame copied into it, reused by every close
    /// on this (flush) thread: a fresh buffer per close would fault in and zero 8 MiB of
    /// new pages each time, slower than the copy itself. The copy is the one copy of the
    /// bytes a close makes (the disk writes from it, `O_DIRECT`), and the snapshot the
    /// store checksums and writes (a master must not write after its close, but the
    /// stored bytes then still agree with their checksum if one does).
    static CLOSE_IMAGE: std::cell::RefCell<ReplicaImage> = const { std::cell::RefCell::new(ReplicaImage::new()) };
}

/// A close on its way to the store. Dropping it (done, failed, or never run because
/// the runtime shut down) ends its claim on the frame ([`FrameTable::close_ended`]): the
/// frame takes writes again if it is still open, and its slot is released if it left
/// the table meanwhile.
struct CloseJob {
    frames: Arc<Frames>,
    closing: Closing,
}

impl CloseJob {
    /// Starts closing the frame `request` names: from now until the job drops, the
    /// frame refuses writes and its slot stays pinned.
    fn claim(frames: &Arc<Frames>, request: &CloseReplicaRequest) -> Result<CloseJob, Reply> {
        let closing = frames
            .table
            .lock()
            .claim_close(request.handle, request.epoch, request.length)
            .map_err(refused)?;
        Ok(CloseJob {
            frames: Arc::clone(frames),
            closing,
        })
    }

    /// Writes the replica: its bytes and their fsync outside the store lock
    /// ([`ReplicaWriter::prepare`]), then, under it, the commit
    /// ([`StoreHandle::commit_close`]). The slot cannot be released while this job
    /// lives, so the copy reads this frame.
    fn run(self, store: &StoreHandle, writer: &ReplicaWriter) -> Result<ReplicaMeta, CloseFailure> {
        let Closing {
            handle,
            slot,
            key: (master, segment),
            epoch,
            length,
        } = self.closing;
        // Not needed for safety (the check under the store lock is), but a frame freed
        // while its close was queued is not written at all.
        if !self.frames.table.lock().is_open(handle) {
            return Err(CloseFailure::FrameGone);
        }
        let length = length.min(self.frames.file.slot_capacity()) as usize;
        let prepared = CLOSE_IMAGE
            .with_borrow_mut(|image| {
                let content = image.content_mut(length);
                self.frames.file.read_to(slot, content);
                writer.prepare_image(master, segment, epoch, true, image)
            })
            .map_err(CloseFailure::Store)?;
        store.commit_close(handle, (master, segment), prepared)
    }
}

impl Drop for CloseJob {
    fn drop(&mut self) {
        let release = self.frames.table.lock().close_ended(self.closing.handle);
        if let Some(release) = release {
            debug_assert_eq!(release.slot, self.closing.slot);
            self.frames.release(release);
        }
    }
}

/// The backup service of one storage server. See the module doc.
#[derive(Debug)]
pub struct BackupService {
    config: BackupConfig,
    /// The on-disk store, keeping the frame table's mirror in step. Lock order: taken
    /// before the table, and only on blocking threads (it is held across fsyncs).
    store: Arc<StoreHandle>,
    /// The frame table and the frame file. The table's lock is never held across I/O
    /// or `.await`, and never while waiting for the store's.
    frames: Arc<Frames>,
    /// RDMA connections of masters and their keys (`RdmaConnect`, revoked by
    /// `fence_master`). Its lock is never taken while the table's or the store's is held.
    rdma: Arc<RdmaTarget>,
    /// Recovery reads and their pieces. Its lock is never held while it calls into the
    /// service (through [`RecoverySource`]), so it nests with none of the above.
    recovery: RecoveryReads,
    /// Writes replica files without the store lock (closes).
    writer: ReplicaWriter,
    /// The threads closes run on.
    flushers: FlushThreads,
}

/// The backup's side of the soft-NIC (`rampart_common::onesided::nic::serve`): places
/// bytes into open frames with the checks of `WriteReplica`. Shares the frames with its
/// [`BackupService`] (from [`BackupService::nic_target`]).
#[derive(Debug, Clone)]
pub struct BackupNic {
    frames: Arc<Frames>,
}

impl NicTarget for BackupNic {
    fn place(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), Status> {
        self.frames
            .write(handle, epoch, offset, bytes)
            .map_err(|refusal| refusal.status)
    }
}

impl BackupService {
    /// Opens (scans) the segment store under `data_dir`, creates the frame file at
    /// [`BackupConfig::frame_file`], and returns the service with the scan report (the
    /// replicas this backup still holds after a restart). A frame file that cannot be
    /// created (`frames_max` 0, a path that is not UTF-8, a file another live backup
    /// holds, an I/O error) is [`StoreError::Io`] naming the file.
    ///
    /// The scan blocks on the disk: call this at start-up, before serving. The
    /// service's handlers must run inside a tokio runtime (closes, frees, lists and
    /// reads use `spawn_blocking`).
    pub fn open(
        data_dir: &Path,
        config: BackupConfig,
    ) -> Result<(BackupService, OpenReport), StoreError> {
        BackupService::open_with_disk(data_dir, config, Box::new(RealDisk))
    }

    /// [`BackupService::open`] with the store's write path going through `disk`, so
    /// tests can make the disk fill up (STYLE habit 10).
    pub fn open_with_disk(
        data_dir: &Path,
        config: BackupConfig,
        disk: Box<dyn Disk>,
    ) -> Result<(BackupService, OpenReport), StoreError> {
        let mut config = config;
        if config.frame_bytes_max > REPLICA_BYTES_MAX {
            tracing::warn!(
                frame_bytes_max = config.frame_bytes_max,
                "frame size limit above REPLICA_BYTES_MAX; using {REPLICA_BYTES_MAX}"
            );
            config.frame_bytes_max = REPLICA_BYTES_MAX;
        }
        // The store first: its directory lock keeps a second backup on this data
        // directory from replacing our frame file.
        let (mut store, scan) = SegmentStore::open_with_disk(data_dir, disk)?;
        let frame_error = |source: std::io::Error| StoreError::Io {
            path: config.frame_file.clone(),
            source,
        };
        // The file says whose it is: a restarted backup reads back only its own frames,
        // and a sweep of stale files keeps a file whose data directory still exists.
        let tag = frame_file_tag(data_dir)?;
        let mut report = OpenReport {
            store: scan,
            ..OpenReport::default()
        };
        // Before the file is replaced: what a killed predecessor's frames hold is
        // stored first (module doc, "Frames survive a kill").
        read_back_frames(&mut store, &config.frame_file, &tag, &mut report)?;
        let file = FrameFile::create(
            &config.frame_file,
            config.frames_max.saturating_add(config.extra_slots),
            config.frame_bytes_max,
            &tag,
        )
        .map_err(frame_error)?;
        let rdma =
            RdmaTarget::new(file.path(), file.slot_offset(file.slots())).map_err(frame_error)?;
        let path = file
            .path()
            .to_str()
            .ok_or_else(|| {
                frame_error(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the frame file's path is not valid UTF-8",
                ))
            })?
            .to_string();
        let limits = FrameLimits {
            frames_max: config.frames_max,
            frame_bytes_max: config.frame_bytes_max,
        };
        let first_handle = FrameHandle((rand::random::<u64>() >> 2).max(1));
        let table = FrameTable::new(limits, file.slots(), store.list(None), first_handle);
        tracing::info!(
            frame_file = %path, slots = file.slots(), slot_bytes = file.slot_capacity(),
            "frame file created"
        );
        let writer = store.writer();
        // Each close in flight pins an open frame (a retried one may add another).
        let flushers = FlushThreads::start(FLUSH_THREADS, config.frames_max, "rampart-flush")
            .map_err(|source| StoreError::Io {
                path: data_dir.to_path_buf(),
                source,
            })?;
        let files = store.files();
        let frames = Arc::new(Frames::new(table, file, host_id(), path, files));
        let service = BackupService {
            writer,
            flushers,
            config,
            store: Arc::new(StoreHandle::new(store, Arc::clone(&frames))),
            frames,
            rdma: Arc::new(rdma),
            recovery: RecoveryReads::new(RECOVERY_PIECES_BYTES_MAX),
        };
        Ok((service, report))
    }

    /// The configuration in force (after clamping `frame_bytes_max`).
    pub fn config(&self) -> &BackupConfig {
        &self.config
    }

    /// The frame file's absolute path (what `OpenReplica` replies name).
    pub fn frame_file_path(&self) -> &Path {
        self.frames.file.path()
    }

    /// Records where this backup's soft-NIC listens; later `OpenReplica` replies name it.
    /// The process running the backup binds the listener and serves
    /// [`BackupService::nic_target`] on it.
    pub fn set_nic_addr(&self, addr: String) {
        self.frames.set_nic_addr(addr);
    }

    /// The soft-NIC's target: this backup's frames.
    pub fn nic_target(&self) -> Arc<BackupNic> {
        Arc::new(BackupNic {
            frames: Arc::clone(&self.frames),
        })
    }

    /// Counts of this backup's frames and stored replicas, and its slot total.
    pub fn stats(&self) -> (crate::frame_table::FrameStats, usize) {
        let stats = self.frames.table.lock().stats();
        (stats, self.config.frames_max + self.config.extra_slots)
    }

    /// At a graceful stop: writes every open frame's valid prefix to the segment store
    /// as an *open* (not closed) replica, so that a backup restarted on the same data
    /// directory still reports it even if the frame file is lost meanwhile (a reboot:
    /// it lives in memory). The file itself stays while frames are open in it, and the
    /// restarted backup reads back whatever a master wrote after this flush. Frames stay
    /// open here (a master still writing sees this backup go away and re-creates the
    /// replica elsewhere). A copy the store already holds at the same or a newer epoch
    /// is kept. Returns how many replicas were written. Blocks on the disk: call it on a
    /// blocking thread, after the service stopped taking requests.
    pub fn flush_open_frames(&self) -> usize {
        let open = self.frames.table.lock().open_frames();
        let mut written = 0;
        for frame in self.frames.scan(open) {
            let key = frame.frame.key();
            match self.store.write_open(key, frame.frame.epoch, &frame.bytes) {
                Ok(_) => written += 1,
                Err(error) => {
                    tracing::warn!(master = %key.0, segment = %key.1, %error, "open frame not flushed");
                }
            }
        }
        written
    }

    /// Fences every open frame of `master` (recovery of it has begun) and reports each
    /// one with the length of its valid prefix. After this returns, no write to those
    /// frames is acknowledged by any transport, and every write acknowledged before it
    /// lies within the reported lengths (module doc, guarantee 6; `fencing.rs`). The
    /// first fence's lengths are final: later fences, lists and reads report the same.
    /// Idempotent.
    ///
    /// Blocks while it copies and scans the frames (≈ 1–5 ms per 8 MiB frame): call it
    /// on a blocking thread.
    pub fn fence_master(&self, master: ServerId) -> Vec<ReplicaInfo> {
        fencing::fence(&self.frames, &self.rdma, master)
    }

    /// Requests answered from memory without waiting: open, write, bump epoch.
    fn handle_immediately(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        let reply = match opcode {
            proto::OpenReplica::OPCODE => Reply::decode::<OpenReplicaRequest>(payload.clone())
                .and_then(|request| {
                    let reply = self
                        .frames
                        .open(
                            request.master,
                            request.segment,
                            request.epoch,
                            request.capacity,
                        )
                        .map_err(refused)?;
                    Ok(Reply::ok(&reply))
                }),
            proto::WriteReplica::OPCODE => Reply::decode::<WriteReplicaRequest>(payload.clone())
                .and_then(|request| {
                    self.frames
                        .write(
                            request.handle,
                            request.epoch,
                            u64::from(request.offset),
                            &request.bytes,
                        )
                        .map_err(refused)?;
                    Ok(Reply::ok(&()))
                }),
            proto::BumpEpoch::OPCODE => Reply::decode::<BumpEpochRequest>(payload.clone())
                .and_then(|request| {
                    self.frames
                        .bump_epoch(request.handle, request.epoch, request.new_epoch)
                        .map_err(refused)?;
                    Ok(Reply::ok(&()))
                }),
            _ => return None,
        };
        Some(reply.unwrap_or_else(|error| error))
    }

    async fn handle_request(&self, opcode: Opcode, payload: Bytes) -> Reply {
        if let Some(reply) = self.handle_immediately(opcode, &payload) {
            return reply;
        }
        let reply = match opcode {
            proto::CloseReplica::OPCODE => self.close(payload).await,
            proto::FreeReplica::OPCODE => self.free(payload).await,
            proto::ListReplicas::OPCODE => self.list(payload).await,
            proto::ReadReplica::OPCODE => self.read(payload).await,
            proto::RdmaConnect::OPCODE => self.rdma_connect(payload).await,
            proto::StartRecovery::OPCODE => self.start_recovery(payload).await,
            proto::RecoveryRead::OPCODE => self.recovery_read(payload).await,
            proto::RecoveryData::OPCODE => self.recovery_data(payload).await,
            proto::EndRecovery::OPCODE => self.end_recovery(payload).await,
            other => Err(Reply::error(
                Status::UnknownOpcode,
                format!("backup does not serve {other}"),
            )),
        };
        reply.unwrap_or_else(|error| error)
    }

    async fn close(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: CloseReplicaRequest = Reply::decode(payload)?;
        let job = CloseJob::claim(&self.frames, &request)?;
        let (store, writer) = (Arc::clone(&self.store), self.writer.clone());
        let flushed = self
            .flushers
            .run(move || job.run(&store, &writer))
            .await
            .map_err(|error| Reply::error(Status::Internal, format!("close failed: {error}")))?;
        match flushed {
            Ok(meta) => {
                tracing::debug!(
                    master = %meta.master, segment = %meta.segment, epoch = %meta.epoch,
                    length = meta.length, "replica closed"
                );
                Ok(Reply::ok(&ReplicaInfo::from(&meta)))
            }
            Err(CloseFailure::FrameGone) => Err(Reply::error(
                Status::UnknownFrame,
                format!(
                    "frame {} was freed or replaced while closing",
                    request.handle
                ),
            )),
            Err(CloseFailure::Store(error)) => {
                tracing::warn!(handle = %request.handle, %error, "close failed; frame kept open");
                Err(store_error_reply(error))
            }
        }
    }

    /// `RdmaConnect`, on a blocking thread (it opens the device the first time and
    /// registers the frame file).
    async fn rdma_connect(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: RdmaConnectRequest = Reply::decode(payload)?;
        let rdma = Arc::clone(&self.rdma);
        let reply = blocking(move || rdma.connect(&request)).await??;
        Ok(Reply::ok(&reply))
    }

    async fn free(&self, payload: Bytes) -> Result<Reply, Reply> {
        let id: FreeReplicaRequest = Reply::decode(payload)?;
        let key = (id.master, id.segment);
        let epoch_max = id.epoch_max;
        // The frame goes first, so that a close in flight finds it gone (module doc).
        // Copies newer than `epoch_max` stay (a replacement placed after the free was
        // decided).
        let (frame_freed, release) = self.frames.table.lock().free(key, epoch_max);
        let (store, frames) = (Arc::clone(&self.store), Arc::clone(&self.frames));
        let result = blocking(move || {
            if let Some(slot) = release {
                frames.release_slot(slot);
            }
            store.free(key, epoch_max)
        })
        .await?;
        let stored_freed = result.map_err(store_error_reply)?;
        tracing::debug!(master = %id.master, segment = %id.segment, frame_freed, stored_freed, "replica freed");
        Ok(Reply::ok(&FreeReplicaReply {
            freed: frame_freed || stored_freed,
        }))
    }

    async fn list(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: ListReplicasRequest = Reply::decode(payload)?;
        let (stored, open) = self.frames.table.lock().list(request.master);
        let mut replicas: BTreeMap<ReplicaKey, ReplicaInfo> = stored
            .iter()
            .map(|meta| ((meta.master, meta.segment), ReplicaInfo::from(meta)))
            .collect();
        let frames = Arc::clone(&self.frames);
        let scanned = blocking(move || {
            let scanned = frames.scan(open);
            scanned
                .into_iter()
                .filter(|frame| frames.shadows_stored(frame))
                .collect::<Vec<_>>()
        })
        .await?;
        // A frame shadows the stored copy of its replica (`FrameTable::visible`), unless
        // it has no footer and the stored copy is closed (`FrameTable::shadows_stored`:
        // a re-creation of a closed replica cut short); a frame that left the table
        // during the scan is not listed (its stored copy, if any, is).
        for frame in scanned {
            replicas.insert(frame.frame.key(), frame.info());
        }
        Ok(Reply::ok(&ListReplicasReply {
            replicas: replicas.into_values().collect(),
        }))
    }

    async fn read(&self, payload: Bytes) -> Result<Reply, Reply> {
        let id: ReplicaId = Reply::decode(payload)?;
        let key = (id.master, id.segment);
        if !self.frames.table.lock().holds(key) {
            return Err(not_held(key));
        }
        let (store, frames) = (Arc::clone(&self.store), Arc::clone(&self.frames));
        match blocking(move || read_held(&store, &frames, key, Vec::new())).await? {
            Ok(Some(held)) => Ok(Reply::ok(&ReadReplicaReply {
                info: held.info,
                bytes: Bytes::from(held.bytes),
            })),
            Ok(None) => Err(not_held(key)),
            Err(error) => {
                tracing::error!(master = %id.master, segment = %id.segment, %error, "replica read failed");
                Err(store_error_reply(error))
            }
        }
    }

    /// What recovery reads replicas through.
    fn recovery_source(&self) -> Arc<dyn ReplicaSource> {
        Arc::new(RecoverySource {
            store: Arc::clone(&self.store),
            frames: Arc::clone(&self.frames),
            rdma: Arc::clone(&self.rdma),
        })
    }

    /// `StartRecovery`: fence, then report every replica of the master with digests.
    async fn start_recovery(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: StartRecoveryRequest = Reply::decode(payload)?;
        let master = request.master;
        let (store, frames, rdma) = (
            Arc::clone(&self.store),
            Arc::clone(&self.frames),
            Arc::clone(&self.rdma),
        );
        let replicas = blocking(move || {
            fencing::fence(&frames, &rdma, master);
            recovery_replicas(&store, &frames, master)
        })
        .await?;
        tracing::info!(%master, replicas = replicas.len(), "recovery started: replicas reported");
        Ok(Reply::ok(&StartRecoveryReply { replicas }))
    }

    /// `RecoveryRead`: schedule the reads, answer at once.
    async fn recovery_read(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: RecoveryReadRequest = Reply::decode(payload)?;
        self.recovery
            .start(request, self.recovery_source())
            .map_err(|error| Reply::error(error.status(), error))?;
        Ok(Reply::ok(&()))
    }

    /// `RecoveryData`: one piece, from the cache, after a wait, or read on demand.
    async fn recovery_data(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: RecoveryDataRequest = Reply::decode(payload)?;
        let reply = self
            .recovery
            .fetch(&request, self.recovery_source())
            .await
            .map_err(|error| Reply::error(error.status(), error))?;
        Ok(Reply::ok(&reply))
    }

    /// `EndRecovery`: forget the master's recovery, then free every replica of it held
    /// here with the ordering of `free` (frames leave the table before the store step,
    /// so a close in flight either lands first and is deleted, or finds its frame gone).
    async fn end_recovery(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: EndRecoveryRequest = Reply::decode(payload)?;
        let master = request.master;
        self.recovery.end(master);
        // Recovered: the master is fenced here for good (also if `StartRecovery` never
        // reached this backup), and its freed frames keep answering `Fenced`.
        let ended = self.frames.table.lock().end_master(master);
        let (store, frames) = (Arc::clone(&self.store), Arc::clone(&self.frames));
        let releases = ended.releases;
        let (result, stored) = blocking(move || {
            for slot in releases {
                frames.release_slot(slot);
            }
            store.free_master(master)
        })
        .await?;
        result.map_err(store_error_reply)?;
        let freed: BTreeSet<ReplicaKey> = ended.frames.into_iter().chain(stored).collect();
        tracing::info!(%master, freed = freed.len(), "recovery ended: replicas freed");
        Ok(Reply::ok(&EndRecoveryReply {
            freed: u32::try_from(freed.len()).unwrap_or(u32::MAX),
        }))
    }
}

fn not_held(key: ReplicaKey) -> Reply {
    Reply::error(
        Status::ObjectDoesntExist,
        format!("no replica of {}/{} on this backup", key.0, key.1),
    )
}

impl Service for BackupService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        Box::pin(self.handle_request(opcode, payload))
    }

    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        self.handle_immediately(opcode, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use rampart_common::onesided::nic::{self, NicClient};
    use rampart_common::onesided::shm::{ShmMapping, SLOT_HEADER_BYTES};
    use rampart_common::onesided::FrameWriteError;
    use rampart_common::protocol::backup::OpenReplicaReply;
    use rampart_common::rpc::WireMessage;
    use std::time::Duration;
    use tempfile::TempDir;

    const CAPACITY: u32 = 64 * 1024;

    fn config(dir: &TempDir, frames_max: usize) -> BackupConfig {
        BackupConfig {
            frames_max,
            extra_slots: 0,
            frame_bytes_max: CAPACITY,
            frame_file: dir.path().join("frames"),
        }
    }

    /// Opens the service on `dir`. A service just dropped may still be finishing a
    /// blocking task (a recovery read, a close) that holds its store's or its frame
    /// file's lock for a moment: "in use" is retried for a few seconds.
    fn open_service(dir: &TempDir, frames_max: usize) -> BackupService {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let (service, report) = loop {
            match BackupService::open(dir.path(), config(dir, frames_max)) {
                Ok(opened) => break opened,
                Err(StoreError::InUse { .. }) if std::time::Instant::now() < deadline => {}
                Err(StoreError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::WouldBlock
                        && std::time::Instant::now() < deadline => {}
                Err(error) => panic!("open: {error}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(report.store.quarantined, vec![]);
        service
    }

    /// Calls `R` on the service directly, as the RPC server would.
    async fn call<R: Rpc>(
        service: &BackupService,
        request: &R::Request,
    ) -> Result<R::Reply, (Status, String)> {
        let mut payload = BytesMut::new();
        request.encode(&mut payload);
        let reply = service.handle(R::OPCODE, payload.freeze()).await;
        if reply.status() != Status::Ok {
            let detail = String::from_utf8_lossy(reply.payload()).into_owned();
            return Err((reply.status(), detail));
        }
        Ok(R::Reply::decode(Bytes::copy_from_slice(reply.payload())).expect("reply decodes"))
    }

    fn status<T: std::fmt::Debug>(result: Result<T, (Status, String)>) -> Status {
        match result {
            Ok(reply) => panic!("expected an error, got {reply:?}"),
            Err((status, _)) => status,
        }
    }

    fn open_req(master: u64, segment: u64, epoch: u64) -> OpenReplicaRequest {
        OpenReplicaRequest {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
            capacity: CAPACITY,
        }
    }

    async fn open_reply(
        service: &BackupService,
        master: u64,
        segment: u64,
        epoch: u64,
    ) -> OpenReplicaReply {
        call::<proto::OpenReplica>(service, &open_req(master, segment, epoch))
            .await
            .expect("open")
    }

    async fn open(service: &BackupService, master: u64, segment: u64, epoch: u64) -> FrameHandle {
        open_reply(service, master, segment, epoch).await.handle
    }

    async fn bump(
        service: &BackupService,
        handle: FrameHandle,
        epoch: u64,
        new_epoch: u64,
    ) -> Result<(), (Status, String)> {
        let request = BumpEpochRequest {
            handle,
            epoch: Epoch(epoch),
            new_epoch: Epoch(new_epoch),
        };
        call::<proto::BumpEpoch>(service, &request).await
    }

    /// A segment of (master, segment) as a master's log writes it: `batches` sealed
    /// batches of a few objects. Returns its bytes and the committed length after the
    /// opening and after each batch.
    fn segment(master: u64, segment: u64, batches: usize) -> (Vec<u8>, Vec<u32>) {
        use rampart_common::ids::{TableId, Version};
        use rampart_common::log::SegmentWriter;
        let mut writer = SegmentWriter::open(
            ServerId(master),
            SegmentId(segment),
            CAPACITY,
            &[SegmentId(segment)],
        )
        .expect("segment opens");
        let mut ends = vec![writer.committed_len()];
        for batch in 0..batches {
            for object in 0..3u64 {
                let key = format!("key-{batch}-{object}");
                let value = content(batch as u8, 100 + batch * 10);
                writer
                    .append_object(TableId(1), Version(object + 1), key.as_bytes(), &value)
                    .expect("fits");
            }
            ends.push(writer.seal_batch());
        }
        (writer.bytes().to_vec(), ends)
    }

    /// Writes `bytes[from..to]` by `WriteReplica`.
    async fn write_range(
        service: &BackupService,
        handle: FrameHandle,
        epoch: u64,
        bytes: &[u8],
        from: u32,
        to: u32,
    ) {
        write(
            service,
            handle,
            epoch,
            from,
            &bytes[from as usize..to as usize],
        )
        .await
        .expect("write");
    }

    async fn write(
        service: &BackupService,
        handle: FrameHandle,
        epoch: u64,
        offset: u32,
        bytes: &[u8],
    ) -> Result<(), (Status, String)> {
        let request = WriteReplicaRequest {
            handle,
            epoch: Epoch(epoch),
            offset,
            bytes: Bytes::copy_from_slice(bytes),
        };
        call::<proto::WriteReplica>(service, &request).await
    }

    async fn close(
        service: &BackupService,
        handle: FrameHandle,
        epoch: u64,
        length: u32,
    ) -> Result<ReplicaInfo, (Status, String)> {
        let request = CloseReplicaRequest {
            handle,
            epoch: Epoch(epoch),
            length,
        };
        call::<proto::CloseReplica>(service, &request).await
    }

    async fn list(service: &BackupService, master: Option<u64>) -> Vec<ReplicaInfo> {
        let request = ListReplicasRequest {
            master: master.map(ServerId),
        };
        call::<proto::ListReplicas>(service, &request)
            .await
            .expect("list")
            .replicas
    }

    fn id(master: u64, segment: u64) -> ReplicaId {
        ReplicaId {
            master: ServerId(master),
            segment: SegmentId(segment),
        }
    }

    async fn read(
        service: &BackupService,
        master: u64,
        segment: u64,
    ) -> Result<ReadReplicaReply, (Status, String)> {
        call::<proto::ReadReplica>(service, &id(master, segment)).await
    }

    async fn free(service: &BackupService, master: u64, segment: u64) -> bool {
        free_up_to(service, master, segment, u64::MAX).await
    }

    async fn free_up_to(
        service: &BackupService,
        master: u64,
        segment: u64,
        epoch_max: u64,
    ) -> bool {
        let request = FreeReplicaRequest {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch_max: Epoch(epoch_max),
        };
        call::<proto::FreeReplica>(service, &request)
            .await
            .expect("free")
            .freed
    }

    fn content(seed: u8, length: usize) -> Vec<u8> {
        (0..length)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn info(master: u64, segment: u64, epoch: u64, length: u32, closed: bool) -> ReplicaInfo {
        ReplicaInfo {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
            length,
            closed,
        }
    }

    #[tokio::test]
    async fn close_stores_the_bytes_written_out_of_order_and_a_restart_reports_them() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let data = content(7, 10_000);
        let handle = open(&service, 1, 5, 1).await;
        for (start, end) in [(6000, 10_000), (0, 3000), (3000, 6000)] {
            write(&service, handle, 1, start as u32, &data[start..end])
                .await
                .expect("write");
        }
        let closed = close(&service, handle, 1, 10_000).await.expect("close");
        assert_eq!(closed, info(1, 5, 1, 10_000, true));
        assert_eq!(list(&service, None).await, vec![closed]);
        let replica = read(&service, 1, 5).await.expect("read");
        assert_eq!(replica.info, closed);
        assert_eq!(&replica.bytes[..], &data[..]);
        // The frame is released: its handle is gone.
        assert_eq!(
            status(write(&service, handle, 1, 0, b"late").await),
            Status::UnknownFrame
        );

        drop(service);
        let (service, report) = BackupService::open(dir.path(), config(&dir, 4)).expect("reopen");
        assert_eq!(report.store.replicas.len(), 1);
        assert_eq!(report.frames_read_back, vec![]);
        assert_eq!(list(&service, None).await, vec![closed]);
        assert_eq!(list(&service, Some(1)).await, vec![closed]);
        assert_eq!(list(&service, Some(2)).await, vec![]);
        let replica = read(&service, 1, 5).await.expect("read after restart");
        assert_eq!(replica.info, closed);
        assert_eq!(&replica.bytes[..], &data[..]);
    }

    #[tokio::test]
    async fn open_is_idempotent_per_epoch_replaced_by_newer_and_refuses_older_or_closed() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let first_reply = open_reply(&service, 1, 1, 2).await;
        let first = first_reply.handle;
        assert_eq!(open_reply(&service, 1, 1, 2).await, first_reply);
        write(&service, first, 2, 0, b"old epoch")
            .await
            .expect("write");

        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 1, 1)).await),
            Status::StaleEpoch
        );
        let second = open(&service, 1, 1, 3).await;
        assert_ne!(second, first);
        assert_eq!(
            status(write(&service, first, 2, 0, b"x").await),
            Status::UnknownFrame
        );
        // The new frame starts zeroed: nothing of the old epoch survives.
        assert_eq!(list(&service, None).await, vec![info(1, 1, 3, 0, false)]);
        write(&service, second, 3, 0, b"new").await.expect("write");
        close(&service, second, 3, 3).await.expect("close");

        for epoch in [2, 3] {
            assert_eq!(
                status(call::<proto::OpenReplica>(&service, &open_req(1, 1, epoch)).await),
                Status::StaleEpoch,
                "epoch {epoch}"
            );
        }
        // A newer epoch than the closed replica may still be opened.
        open(&service, 1, 1, 4).await;
        // A different capacity on a retried open is a caller error.
        let mut request = open_req(1, 1, 4);
        request.capacity = 100;
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &request).await),
            Status::InvalidArgument
        );
        request.capacity = CAPACITY + 1;
        request.segment = SegmentId(9);
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &request).await),
            Status::InvalidArgument
        );
    }

    #[tokio::test]
    async fn write_and_close_check_bounds_handles_and_epochs() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let handle = open(&service, 1, 1, 1).await;
        write(&service, handle, 1, CAPACITY - 4, b"edge")
            .await
            .expect("fits");
        let past_end = write(&service, handle, 1, CAPACITY - 3, b"edge").await;
        let (code, detail) = past_end.expect_err("past the end");
        assert_eq!(code, Status::InvalidArgument);
        assert!(detail.contains("passes the end"), "{detail}");
        assert_eq!(
            status(write(&service, handle, 1, u32::MAX, b"x").await),
            Status::InvalidArgument
        );
        assert_eq!(
            status(write(&service, FrameHandle(999), 1, 0, b"x").await),
            Status::UnknownFrame
        );
        assert_eq!(
            status(write(&service, handle, 2, 0, b"x").await),
            Status::StaleEpoch
        );
        assert_eq!(
            status(close(&service, handle, 2, 4).await),
            Status::StaleEpoch
        );
        assert_eq!(
            status(close(&service, handle, 1, CAPACITY + 1).await),
            Status::InvalidArgument
        );
        assert_eq!(
            status(close(&service, FrameHandle(999), 1, 0).await),
            Status::UnknownFrame
        );

        assert!(free(&service, 1, 1).await);
        assert_eq!(
            status(write(&service, handle, 1, 0, b"x").await),
            Status::UnknownFrame
        );
        assert_eq!(
            status(close(&service, handle, 1, 0).await),
            Status::UnknownFrame
        );
    }

    #[tokio::test]
    async fn open_past_frames_max_is_backup_full_until_a_frame_closes() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let first = open(&service, 1, 1, 1).await;
        open(&service, 1, 2, 1).await;
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 3, 1)).await),
            Status::BackupFull
        );
        // A retry or an epoch bump of an open replica needs no new frame.
        open(&service, 1, 2, 1).await;
        open(&service, 1, 2, 2).await;
        let first_slot = slot_offset(&open_reply(&service, 1, 1, 1).await);
        close(&service, first, 1, 0).await.expect("close");
        // The closed frame's slot is the one free again.
        let reply = open_reply(&service, 1, 3, 1).await;
        assert_eq!(slot_offset(&reply), first_slot);
    }

    fn slot_offset(reply: &OpenReplicaReply) -> u64 {
        reply.shm.as_ref().expect("shm location").slot_offset
    }

    #[tokio::test]
    async fn free_drops_open_frames_and_stored_replicas_and_is_idempotent() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let open_frame = open(&service, 1, 1, 1).await;
        let (bytes, ends) = segment(1, 1, 1);
        write_range(&service, open_frame, 1, &bytes, 0, ends[1]).await;
        let closed = open(&service, 1, 2, 1).await;
        write(&service, closed, 1, 0, b"closed")
            .await
            .expect("write");
        close(&service, closed, 1, 6).await.expect("close");
        assert_eq!(
            list(&service, Some(1)).await,
            vec![info(1, 1, 1, ends[1], false), info(1, 2, 1, 6, true)]
        );

        assert!(free(&service, 1, 1).await);
        assert!(free(&service, 1, 2).await);
        assert!(!free(&service, 1, 1).await);
        assert!(!free(&service, 1, 2).await);
        assert_eq!(list(&service, None).await, vec![]);
        assert_eq!(
            status(read(&service, 1, 2).await),
            Status::ObjectDoesntExist
        );
        // Freed replicas stay freed across a restart.
        drop(service);
        let service = open_service(&dir, 4);
        assert_eq!(list(&service, None).await, vec![]);
    }

    #[tokio::test]
    async fn free_keeps_copies_newer_than_its_epoch_bound() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        // A replica abandoned at epoch 1, then replaced here at epoch 2 (open frame)…
        open(&service, 1, 1, 1).await;
        open(&service, 1, 1, 2).await;
        // …and a closed replica at epoch 3.
        let closed = open(&service, 1, 2, 3).await;
        write(&service, closed, 3, 0, b"closed")
            .await
            .expect("write");
        close(&service, closed, 3, 6).await.expect("close");
        // A late free of the epoch-1 copies touches neither.
        assert!(!free_up_to(&service, 1, 1, 1).await);
        assert!(!free_up_to(&service, 1, 2, 2).await);
        assert_eq!(list(&service, Some(1)).await.len(), 2);
        assert!(free_up_to(&service, 1, 1, 2).await);
        assert!(free_up_to(&service, 1, 2, 3).await);
        assert_eq!(list(&service, Some(1)).await, vec![]);
    }

    #[tokio::test]
    async fn listing_a_large_open_frame_reports_its_whole_valid_prefix() {
        use rampart_common::ids::{TableId, Version};
        use rampart_common::log::SegmentWriter;
        const LARGE: u32 = 4 * 1024 * 1024;
        let dir = TempDir::new().expect("tempdir");
        let config = BackupConfig {
            frames_max: 2,
            extra_slots: 0,
            frame_bytes_max: LARGE,
            frame_file: dir.path().join("frames"),
        };
        let (service, _) = BackupService::open(dir.path(), config).expect("open");
        let request = OpenReplicaRequest {
            capacity: LARGE,
            ..open_req(1, 1, 1)
        };
        let handle = call::<proto::OpenReplica>(&service, &request)
            .await
            .expect("open")
            .handle;
        // ≈ 1.2 MiB of sealed batches: past the first read and the first growth.
        let mut writer =
            SegmentWriter::open(ServerId(1), SegmentId(1), LARGE, &[SegmentId(1)]).expect("open");
        for batch in 0..300u64 {
            for object in 0..4u64 {
                let key = format!("key-{batch}-{object}");
                writer
                    .append_object(TableId(1), Version(1), key.as_bytes(), &[batch as u8; 1000])
                    .expect("fits");
            }
            writer.seal_batch();
        }
        let bytes = writer.bytes().to_vec();
        let end = writer.committed_len();
        assert!(end > 1024 * 1024);
        write_range(&service, handle, 1, &bytes, 0, end).await;
        assert_eq!(
            list(&service, Some(1)).await,
            vec![info(1, 1, 1, end, false)]
        );
        let replica = read(&service, 1, 1).await.expect("read");
        assert_eq!(&replica.bytes[..], &bytes[..end as usize]);
    }

    #[tokio::test]
    async fn open_frames_flushed_at_a_graceful_stop_are_reported_after_a_restart() {
        let dir = TempDir::new().expect("tempdir");
        let (bytes, ends) = segment(4, 1, 2);
        {
            let service = open_service(&dir, 4);
            let handle = open(&service, 4, 1, 3).await;
            write_range(&service, handle, 3, &bytes, 0, ends[2]).await;
            // A torn third batch past the valid prefix is not flushed.
            write(&service, handle, 3, ends[2], b"\x02torn")
                .await
                .expect("write");
            assert_eq!(service.flush_open_frames(), 1);
        }
        let service = open_service(&dir, 4);
        assert_eq!(
            list(&service, Some(4)).await,
            vec![info(4, 1, 3, ends[2], false)]
        );
        let replica = read(&service, 4, 1).await.expect("read");
        assert_eq!(&replica.bytes[..], &bytes[..ends[2] as usize]);
    }

    /// Issue 12, item 6: a backup killed (no graceful flush) and restarted on its data
    /// directory reports the open frames it held, at their epochs and lengths; before the
    /// frame file kept its labels and outlived the process, all three were lost.
    #[tokio::test]
    async fn a_killed_backups_open_frames_are_reported_after_a_restart() {
        let dir = TempDir::new().expect("tempdir");
        let (bytes, ends) = segment(4, 1, 2);
        let (fenced_bytes, fenced_ends) = segment(5, 1, 3);
        let (closed_bytes, closed_ends) = segment(4, 2, 1);
        {
            let service = open_service(&dir, 4);
            let handle = open(&service, 4, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[2]).await;
            write(&service, handle, 1, ends[2], b"\x02torn")
                .await
                .expect("write");
            bump(&service, handle, 1, 2).await.expect("bump");
            let fenced_reply = open_reply(&service, 5, 1, 1).await;
            let fenced = fenced_reply.handle;
            write_range(&service, fenced, 1, &fenced_bytes, 0, fenced_ends[2]).await;
            assert_eq!(
                service.fence_master(ServerId(5)),
                vec![info(5, 1, 1, fenced_ends[2], false)]
            );
            // A write in flight during the fence lands past it, unacknowledged (its
            // master's check saw the fence): the read-back must not serve it either.
            let past = &fenced_bytes[fenced_ends[2] as usize..fenced_ends[3] as usize];
            let at = slot_offset(&fenced_reply)
                + rampart_common::onesided::shm::SLOT_HEADER_BYTES
                + u64::from(fenced_ends[2]);
            std::os::unix::fs::FileExt::write_all_at(
                &std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.path().join("frames"))
                    .expect("frame file"),
                past,
                at,
            )
            .expect("write past the fence");
            // Opened, never written: nothing to keep.
            open(&service, 6, 1, 1).await;
            let closed = open(&service, 4, 2, 1).await;
            let end = *closed_ends.last().expect("end");
            write_range(&service, closed, 1, &closed_bytes, 0, end).await;
            close(&service, closed, 1, end).await.expect("close");
            // SIGKILL: no flush; the process's lock and memory go, the file stays.
        }
        let (service, report) = BackupService::open(dir.path(), config(&dir, 4)).expect("reopen");
        let read_back: Vec<(u64, u64, u64, u32, bool)> = report
            .frames_read_back
            .iter()
            .map(|m| (m.master.0, m.segment.0, m.epoch.0, m.length, m.closed))
            .collect();
        assert_eq!(
            read_back,
            vec![(4, 1, 2, ends[2], false), (5, 1, 1, fenced_ends[2], false)]
        );
        let skipped: Vec<(ServerId, SegmentId)> = report
            .frames_skipped
            .iter()
            .map(|(label, _)| (label.master, label.segment))
            .collect();
        assert_eq!(skipped, vec![(ServerId(6), SegmentId(1))]);
        assert_eq!(report.frame_file_unread, None);
        let end = *closed_ends.last().expect("end");
        assert_eq!(
            list(&service, None).await,
            vec![
                info(4, 1, 2, ends[2], false),
                info(4, 2, 1, end, true),
                info(5, 1, 1, fenced_ends[2], false)
            ]
        );
        let replica = read(&service, 4, 1).await.expect("read");
        assert_eq!(&replica.bytes[..], &bytes[..ends[2] as usize]);
        // A second restart finds nothing more to read back: the file was replaced.
        drop(service);
        let (_service, report) = BackupService::open(dir.path(), config(&dir, 4)).expect("again");
        assert_eq!(report.frames_read_back, vec![]);
        assert_eq!(report.store.replicas.len(), 3);
    }

    /// A data directory wiped and used again at the same path (a new cluster, whose
    /// servers get the same ids again) does not adopt the frames the old one left.
    #[tokio::test]
    async fn a_wiped_data_directory_does_not_adopt_the_frames_left_at_its_path() {
        let frames = TempDir::new().expect("tempdir");
        let dir = TempDir::new().expect("tempdir");
        let data = dir.path().join("data");
        let config = || BackupConfig {
            frame_file: frames.path().join("frames"),
            ..config(&dir, 2)
        };
        {
            let (service, _) = BackupService::open(&data, config()).expect("open");
            let (bytes, ends) = segment(3, 1, 1);
            let handle = open(&service, 3, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        }
        std::fs::remove_dir_all(&data).expect("wipe");
        let (service, report) = BackupService::open(&data, config()).expect("a fresh start");
        assert_eq!(report.frames_read_back, vec![]);
        assert!(
            report
                .frame_file_unread
                .as_deref()
                .is_some_and(|why| why.contains("data directory is gone")),
            "{report:?}"
        );
        assert_eq!(list(&service, None).await, vec![]);
    }

    /// A frame file left at this backup's path by a backup of another data directory that
    /// still exists is not silently replaced: its frames are that backup's to read back.
    #[tokio::test]
    async fn a_frame_file_of_another_live_data_directory_is_not_replaced() {
        let other = TempDir::new().expect("tempdir");
        let dir = TempDir::new().expect("tempdir");
        let shared_file = dir.path().join("shared-frames");
        let with_file = |frames_max| BackupConfig {
            frame_file: shared_file.clone(),
            ..config(&dir, frames_max)
        };
        {
            let (service, _) =
                BackupService::open(other.path(), with_file(2)).expect("the other backup");
            let (bytes, ends) = segment(3, 1, 1);
            let handle = open(&service, 3, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        }
        let error = BackupService::open(&dir.path().join("mine"), with_file(2))
            .expect_err("someone else's frames");
        assert!(
            error
                .to_string()
                .contains("give each backup its own frame file"),
            "{error}"
        );
        // Its own backup still reads them back.
        let (_service, report) =
            BackupService::open(other.path(), with_file(2)).expect("the other backup again");
        assert_eq!(report.frames_read_back.len(), 1);
    }

    #[tokio::test]
    async fn a_fenced_master_cannot_open_new_replicas() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        // Fenced with no open frame here: a backup recovery only asked.
        assert_eq!(service.fence_master(ServerId(7)), vec![]);
        let refused = call::<proto::OpenReplica>(&service, &open_req(7, 1, 1)).await;
        assert_eq!(status(refused), Status::Fenced);
        // Other masters are unaffected.
        open(&service, 8, 1, 1).await;
    }

    #[tokio::test]
    async fn a_zombie_masters_frames_freed_by_end_recovery_keep_answering_fenced() {
        // Master 7's recovery fenced its frame here and, once done, freed it. The master,
        // still running somewhere (a zombie), writes late: it must hear Fenced — by every
        // path — never UnknownFrame, which it would take for an ordinary lost replica.
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (head, _, _) = recovery_segment(7, 1, &[1], false);
        let fenced = write_open(&service, 7, 1, &head).await;
        start_recovery(&service, 7).await;
        // A frame of master 8 that this backup never fenced: its recovery ended without
        // `StartRecovery` reaching here.
        let unfenced = write_open(&service, 8, 1, &head).await;
        assert_eq!(end_recovery(&service, 7).await, 1);
        assert_eq!(end_recovery(&service, 8).await, 1);
        for handle in [fenced, unfenced] {
            let late = write(&service, handle, 1, head.len() as u32, b"late").await;
            assert_eq!(status(late), Status::Fenced, "write to {handle}");
            assert_eq!(
                status(close(&service, handle, 1, head.len() as u32).await),
                Status::Fenced
            );
            assert_eq!(status(bump(&service, handle, 1, 2).await), Status::Fenced);
            let placed = service.nic_target().place(handle, Epoch(1), 0, b"late");
            assert_eq!(placed, Err(Status::Fenced), "soft-NIC write to {handle}");
        }
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(8, 2, 1)).await),
            Status::Fenced
        );
        // A handle that never was a fenced frame is still merely unknown.
        let other = write_open(&service, 9, 1, &head).await;
        free(&service, 9, 1).await;
        assert_eq!(
            status(write(&service, other, 1, 0, b"x").await),
            Status::UnknownFrame
        );
    }

    #[tokio::test]
    async fn handles_do_not_repeat_across_restarts() {
        let dir = TempDir::new().expect("tempdir");
        let first = {
            let service = open_service(&dir, 4);
            open(&service, 1, 1, 1).await
        };
        let service = open_service(&dir, 4);
        let second = open(&service, 1, 2, 1).await;
        assert_ne!(first, second);
    }

    #[tokio::test]
    async fn read_of_an_open_frame_returns_its_valid_prefix() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let handle = open(&service, 3, 1, 1).await;
        let replica = read(&service, 3, 1).await.expect("read empty");
        assert_eq!(replica.info, info(3, 1, 1, 0, false));
        assert!(replica.bytes.is_empty());
        let (bytes, ends) = segment(3, 1, 2);
        // The second batch first: nothing past the opening is valid until the first
        // batch lands too.
        write_range(&service, handle, 1, &bytes, ends[1], ends[2]).await;
        write_range(&service, handle, 1, &bytes, 0, ends[0]).await;
        let replica = read(&service, 3, 1).await.expect("read");
        assert_eq!(replica.info, info(3, 1, 1, ends[0], false));
        assert_eq!(&replica.bytes[..], &bytes[..ends[0] as usize]);
        write_range(&service, handle, 1, &bytes, ends[0], ends[1]).await;
        let replica = read(&service, 3, 1).await.expect("read");
        assert_eq!(replica.info, info(3, 1, 1, ends[2], false));
        assert_eq!(&replica.bytes[..], &bytes[..ends[2] as usize]);
        // A batch whose checksum has not landed is not part of the prefix.
        let (longer, longer_ends) = segment(3, 1, 3);
        write_range(&service, handle, 1, &longer, ends[2], longer_ends[3] - 4).await;
        assert_eq!(
            list(&service, None).await,
            vec![info(3, 1, 1, ends[2], false)]
        );
        assert_eq!(
            status(read(&service, 3, 2).await),
            Status::ObjectDoesntExist
        );
        assert_eq!(
            status(read(&service, 4, 1).await),
            Status::ObjectDoesntExist
        );
    }

    /// Writes 100 bytes to replica 1 of master 1, closes it (stored, its slot keeping the
    /// bytes) and corrupts its file: a read that reaches the disk fails.
    async fn flush_then_corrupt_its_file(service: &BackupService, dir: &TempDir) {
        let handle = open(service, 1, 1, 1).await;
        write(service, handle, 1, 0, &content(1, 100))
            .await
            .expect("write");
        close(service, handle, 1, 100).await.expect("close");
        corrupt_the_file_of_m1_s1(dir);
    }

    /// Flips the last byte of replica 1/1's file.
    fn corrupt_the_file_of_m1_s1(dir: &TempDir) {
        let path = dir.path().join("replicas").join("m1-s1.replica");
        let mut image = std::fs::read(&path).expect("read file");
        let last = image.len() - 1;
        image[last] ^= 0xFF;
        std::fs::write(&path, image).expect("corrupt");
    }

    /// A closed frame's slot keeps its bytes while it stays free: reads of the replica
    /// come from memory (here: the disk's copy is corrupt, and the read is still right)
    /// until an open takes the slot; then they come from the disk, which is checked.
    #[tokio::test]
    async fn a_replica_is_read_from_its_free_slot_until_an_open_takes_it_then_from_disk() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        flush_then_corrupt_its_file(&service, &dir).await;
        let from_memory = read(&service, 1, 1).await.expect("read from the slot");
        assert_eq!(&from_memory.bytes[..], &content(1, 100)[..]);
        assert_eq!(from_memory.info, info(1, 1, 1, 100, true));
        // Two opens take both free slots: the replica's bytes are gone from memory.
        open(&service, 1, 2, 1).await;
        open(&service, 1, 3, 1).await;
        let (code, detail) = read(&service, 1, 1).await.expect_err("corrupt");
        assert_eq!(code, Status::Internal);
        assert!(detail.contains("checksum"), "{detail}");
        assert_eq!(
            list(&service, None).await,
            vec![info(1, 2, 1, 0, false), info(1, 3, 1, 0, false)]
        );
    }

    /// A close and its retry both in flight: the first stores the replica, the retry
    /// finds the frame gone and ends last, releasing the slot. The replica is still read
    /// from that slot (its file is corrupt, so a read from disk would fail).
    #[tokio::test]
    async fn a_retried_close_that_ends_last_keeps_the_stored_replica_in_its_slot() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let handle = open(&service, 1, 1, 1).await;
        write(&service, handle, 1, 0, &content(1, 100))
            .await
            .expect("write");
        let request = proto::CloseReplicaRequest {
            handle,
            epoch: Epoch(1),
            length: 100,
        };
        let first = CloseJob::claim(&service.frames, &request).expect("claim");
        let retry = CloseJob::claim(&service.frames, &request).expect("claim again");
        let meta = first
            .run(&service.store, &service.writer)
            .unwrap_or_else(|_| panic!("the first close stores the replica"));
        assert!(matches!(
            retry.run(&service.store, &service.writer),
            Err(CloseFailure::FrameGone)
        ));
        corrupt_the_file_of_m1_s1(&dir);
        let from_memory = read(&service, 1, 1).await.expect("read from the slot");
        assert_eq!(&from_memory.bytes[..], &content(1, 100)[..]);
        assert_eq!(from_memory.info, ReplicaInfo::from(&meta));
    }

    /// Extra slots keep flushed replicas in memory without letting more frames open:
    /// with as many frames open as allowed, the replica flushed before them is still read
    /// from its slot (its file is corrupt, so a read from disk would fail).
    #[tokio::test]
    async fn extra_slots_keep_a_flushed_replica_in_memory_but_open_no_more_frames() {
        let dir = TempDir::new().expect("tempdir");
        let config = BackupConfig {
            extra_slots: 2,
            ..config(&dir, 2)
        };
        let (service, _) = BackupService::open(dir.path(), config).expect("open");
        flush_then_corrupt_its_file(&service, &dir).await;
        open(&service, 1, 2, 1).await;
        open(&service, 1, 3, 1).await;
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 4, 1)).await),
            Status::BackupFull,
            "free slots, but frames_max frames are open"
        );
        let from_memory = read(&service, 1, 1).await.expect("read from the slot");
        assert_eq!(&from_memory.bytes[..], &content(1, 100)[..]);
    }

    /// A backup restarted on a full disk cannot store the frames its predecessor left: it
    /// refuses to start, saying why, and leaves the file as it was, so that a start after
    /// space was freed still reads them back.
    #[tokio::test]
    async fn frames_left_behind_are_kept_when_the_disk_is_full_at_restart() {
        let dir = TempDir::new().expect("tempdir");
        let (bytes, ends) = segment(4, 1, 1);
        {
            let service = open_service(&dir, 4);
            let handle = open(&service, 4, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        }
        let disk = FillableDisk::default();
        disk.full.store(true, std::sync::atomic::Ordering::SeqCst);
        let error = BackupService::open_with_disk(dir.path(), config(&dir, 4), Box::new(disk))
            .expect_err("the frames cannot be stored");
        assert!(matches!(error, StoreError::Full { .. }), "{error}");
        let (service, report) =
            BackupService::open(dir.path(), config(&dir, 4)).expect("space again");
        let read_back: Vec<(u64, u32)> = report
            .frames_read_back
            .iter()
            .map(|meta| (meta.segment.0, meta.length))
            .collect();
        assert_eq!(read_back, vec![(1, ends[1])]);
        assert_eq!(
            list(&service, None).await,
            vec![info(4, 1, 1, ends[1], false)]
        );
    }

    /// A disk that reports `ENOSPC` on every write while `full` is set.
    #[derive(Clone, Debug, Default)]
    struct FillableDisk {
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Disk for FillableDisk {
        fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
            if self.full.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            RealDisk.write_durable(path, parts)
        }

        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            RealDisk.rename(from, to)
        }

        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            RealDisk.sync_dir(dir)
        }
    }

    #[tokio::test]
    async fn close_on_a_full_disk_is_backup_full_and_the_frame_stays_open_for_a_retry() {
        let dir = TempDir::new().expect("tempdir");
        let disk = FillableDisk::default();
        let (service, _) =
            BackupService::open_with_disk(dir.path(), config(&dir, 4), Box::new(disk.clone()))
                .expect("open");
        let handle = open(&service, 1, 1, 1).await;
        let (bytes, ends) = segment(1, 1, 2);
        write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        disk.full.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            status(close(&service, handle, 1, ends[1]).await),
            Status::BackupFull
        );
        // Still open, still readable and writable.
        assert_eq!(
            list(&service, None).await,
            vec![info(1, 1, 1, ends[1], false)]
        );
        write_range(&service, handle, 1, &bytes, ends[1], ends[2]).await;
        disk.full.store(false, std::sync::atomic::Ordering::SeqCst);
        let closed = close(&service, handle, 1, ends[2]).await.expect("retry");
        assert_eq!(closed, info(1, 1, 1, ends[2], true));
        assert_eq!(
            &read(&service, 1, 1).await.expect("read").bytes[..],
            &bytes[..ends[2] as usize]
        );
    }

    /// A disk whose writes wait while `closed` is set, telling `entered` when one does.
    #[derive(Clone, Debug, Default)]
    struct GatedDisk {
        closed: Arc<std::sync::atomic::AtomicBool>,
        entered: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Disk for GatedDisk {
        fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
            use std::sync::atomic::Ordering::SeqCst;
            while self.closed.load(SeqCst) {
                self.entered.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
            RealDisk.write_durable(path, parts)
        }

        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            RealDisk.rename(from, to)
        }

        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            RealDisk.sync_dir(dir)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_and_frees_do_not_wait_for_a_close_stuck_on_the_disk() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = TempDir::new().expect("tempdir");
        let disk = GatedDisk::default();
        let (service, _) =
            BackupService::open_with_disk(dir.path(), config(&dir, 4), Box::new(disk.clone()))
                .expect("open");
        let service = Arc::new(service);
        let (bytes, ends) = segment(1, 1, 2);
        let stored = open(&service, 1, 1, 1).await;
        write_range(&service, stored, 1, &bytes, 0, ends[2]).await;
        close(&service, stored, 1, ends[2]).await.expect("close");
        // A second close stalls in its disk write (until the end of the test, even a
        // failed one: the guard below opens the gate).
        struct Open(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.store(false, SeqCst);
            }
        }
        disk.closed.store(true, SeqCst);
        let _reopen = Open(Arc::clone(&disk.closed));
        let (other, other_ends) = segment(1, 2, 1);
        let stalled = open(&service, 1, 2, 1).await;
        write_range(&service, stalled, 1, &other, 0, other_ends[1]).await;
        let other_length = other_ends[1];
        let closing = {
            let service = Arc::clone(&service);
            tokio::spawn(async move { close(&service, stalled, 1, other_length).await })
        };
        for _ in 0..1000 {
            if disk.entered.load(SeqCst) || closing.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(disk.entered.load(SeqCst), "the close reached the disk");
        // Recovery reads the stored replica meanwhile.
        let read = tokio::time::timeout(Duration::from_secs(5), read(&service, 1, 1))
            .await
            .expect("the read waited for the stalled close")
            .expect("read");
        assert_eq!(&read.bytes[..], &bytes[..ends[2] as usize]);
        // And frees it: the close writes outside the store lock.
        let freed = tokio::time::timeout(Duration::from_secs(5), free(&service, 1, 1))
            .await
            .expect("the free waited for the stalled close");
        assert!(freed);
        assert!(!closing.is_finished(), "the close was still stalled");
        disk.closed.store(false, SeqCst);
        let closed = closing.await.expect("join").expect("the close completes");
        assert_eq!(closed, info(1, 2, 1, other_length, true));
        assert_eq!(list(&service, None).await, vec![closed]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_free_racing_a_close_always_leaves_the_replica_freed() {
        let dir = TempDir::new().expect("tempdir");
        let service = Arc::new(open_service(&dir, 64));
        let mut closes_ok = 0;
        for segment in 0..64 {
            let handle = open(&service, 1, segment, 1).await;
            write(&service, handle, 1, 0, b"bytes")
                .await
                .expect("write");
            let closer = {
                let service = Arc::clone(&service);
                tokio::spawn(async move { close(&service, handle, 1, 5).await })
            };
            // Vary how far the close gets before the free starts.
            for _ in 0..segment % 4 {
                tokio::task::yield_now().await;
            }
            let freed = free(&service, 1, segment).await;
            assert!(freed, "the frame or the replica was held");
            match closer.await.expect("join") {
                Ok(_) => closes_ok += 1,
                Err((code, _)) => assert_eq!(code, Status::UnknownFrame),
            }
            assert_eq!(list(&service, None).await, vec![], "segment {segment}");
        }
        // Report how the race went; which interleavings occur is up to the scheduler.
        eprintln!("{closes_ok} of 64 closes completed before their free");
        // Every slot came back, whichever way each race went.
        for segment in 100..164 {
            open(&service, 1, segment, 1).await;
        }
        drop(service);
        let service = open_service(&dir, 64);
        assert_eq!(list(&service, None).await, vec![]);
    }

    #[tokio::test]
    async fn garbage_payloads_are_malformed_and_unknown_opcodes_are_refused() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let opcodes = [
            proto::OpenReplica::OPCODE,
            proto::WriteReplica::OPCODE,
            proto::CloseReplica::OPCODE,
            proto::FreeReplica::OPCODE,
            proto::ListReplicas::OPCODE,
            proto::ReadReplica::OPCODE,
            proto::BumpEpoch::OPCODE,
            proto::StartRecovery::OPCODE,
            proto::RecoveryRead::OPCODE,
            proto::RecoveryData::OPCODE,
            proto::EndRecovery::OPCODE,
        ];
        let garbage: [&[u8]; 4] = [b"", &[0xFF; 3], &[0xFF; 64], &[0x01; 200]];
        for opcode in opcodes {
            for payload in garbage {
                let reply = service
                    .handle(opcode, Bytes::copy_from_slice(payload))
                    .await;
                assert_eq!(
                    reply.status(),
                    Status::MalformedRequest,
                    "{opcode} {payload:?}"
                );
            }
        }
        let reply = service.handle(Opcode(299), Bytes::new()).await;
        assert_eq!(reply.status(), Status::UnknownOpcode);
        assert!(service.handle_now(Opcode(299), &Bytes::new()).is_none());
        assert!(service
            .handle_now(proto::CloseReplica::OPCODE, &Bytes::new())
            .is_none());
    }

    #[tokio::test]
    async fn open_reply_locates_the_frame_for_shm_and_the_nic_and_a_retry_gets_the_same() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let first = open_reply(&service, 1, 1, 1).await;
        let shm = first.shm.clone().expect("shm location");
        assert_eq!(shm.host, rampart_common::onesided::host_id());
        assert_eq!(Path::new(&shm.path), service.frame_file_path());
        assert!(Path::new(&shm.path).is_absolute());
        assert_eq!(shm.pid, std::process::id());
        assert_eq!(shm.slot_capacity, CAPACITY);
        assert_eq!(first.nic, None);
        service.set_nic_addr("127.0.0.1:9999".to_string());
        let retry = open_reply(&service, 1, 1, 1).await;
        assert_eq!((retry.handle, &retry.shm), (first.handle, &first.shm));
        assert_eq!(retry.nic.as_deref(), Some("127.0.0.1:9999"));
        assert_eq!(open_reply(&service, 1, 1, 1).await, retry);
        // Another frame, another slot; a smaller frame reports its own capacity.
        let mut request = open_req(1, 2, 1);
        request.capacity = 1000;
        let second = call::<proto::OpenReplica>(&service, &request)
            .await
            .expect("open");
        let second_shm = second.shm.expect("shm location");
        assert_ne!(second_shm.slot_offset, shm.slot_offset);
        assert_eq!(second_shm.slot_capacity, 1000);
    }

    #[tokio::test]
    async fn shm_writes_land_in_the_frame_and_lists_report_their_valid_prefix() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let reply = open_reply(&service, 1, 7, 1).await;
        let shm = reply.shm.expect("shm location");
        let mapping = ShmMapping::open(Path::new(&shm.path)).expect("map");
        let shm_write = |offset: u32, bytes: &[u8]| {
            mapping.write(
                shm.slot_offset,
                shm.slot_capacity,
                reply.handle,
                u64::from(offset),
                bytes,
            )
        };
        let (bytes, ends) = segment(1, 7, 3);
        for pair in ends.windows(2).take(2) {
            shm_write(pair[0], &bytes[pair[0] as usize..pair[1] as usize]).expect("write");
        }
        shm_write(0, &bytes[..ends[0] as usize]).expect("write the opening last");
        assert_eq!(
            list(&service, None).await,
            vec![info(1, 7, 1, ends[2], false)]
        );
        // Past the frame's end: refused by the mapping, nothing written.
        assert!(matches!(
            shm_write(CAPACITY - 2, b"abc"),
            Err(FrameWriteError::OutOfBounds { .. })
        ));
        let closed = close(&service, reply.handle, 1, ends[2])
            .await
            .expect("close");
        assert_eq!(closed, info(1, 7, 1, ends[2], true));
        assert_eq!(
            &read(&service, 1, 7).await.expect("read").bytes[..],
            &bytes[..ends[2] as usize]
        );
        // The slot was released: a late write finds it gone.
        assert!(matches!(
            shm_write(ends[2], &bytes[ends[2] as usize..ends[3] as usize]),
            Err(FrameWriteError::FrameGone)
        ));
    }

    #[tokio::test]
    async fn a_freed_slot_is_reused_zeroed() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 1);
        let first = open_reply(&service, 1, 1, 1).await;
        write(&service, first.handle, 1, 0, &[0xEE; CAPACITY as usize])
            .await
            .expect("fill");
        assert!(free(&service, 1, 1).await);
        let second = open_reply(&service, 2, 1, 1).await;
        assert_eq!(slot_offset(&second), slot_offset(&first));
        let file = std::fs::read(service.frame_file_path()).expect("read the frame file");
        let data_start = slot_offset(&second) as usize + SLOT_HEADER_BYTES as usize;
        assert!(file[data_start..data_start + CAPACITY as usize]
            .iter()
            .all(|&b| b == 0));
        // The old handle cannot reach the new frame.
        assert_eq!(
            status(write(&service, first.handle, 1, 0, b"x").await),
            Status::UnknownFrame
        );
    }

    #[tokio::test]
    async fn nic_writes_land_with_the_checks_of_write_replica() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        service.set_nic_addr(addr.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(nic::serve(listener, service.nic_target(), async move {
            let _ = stopped.await;
        }));
        let reply = open_reply(&service, 1, 1, 1).await;
        assert_eq!(reply.nic.as_deref(), Some(addr.as_str()));
        let client = NicClient::new();
        let timeout = std::time::Duration::from_secs(5);
        let (bytes, ends) = segment(1, 1, 1);
        client
            .write(
                &addr,
                reply.handle,
                Epoch(1),
                0,
                &bytes[..ends[1] as usize],
                timeout,
            )
            .await
            .expect("write");
        assert_eq!(
            list(&service, None).await,
            vec![info(1, 1, 1, ends[1], false)]
        );
        let refusals = [
            (reply.handle, 2, 0, Status::StaleEpoch),
            (FrameHandle(999), 1, 0, Status::UnknownFrame),
            (
                reply.handle,
                1,
                u64::from(CAPACITY) - 1,
                Status::InvalidArgument,
            ),
            (reply.handle, 1, u64::MAX, Status::InvalidArgument),
        ];
        for (handle, epoch, offset, expected) in refusals {
            match client
                .write(&addr, handle, Epoch(epoch), offset, b"xy", timeout)
                .await
            {
                Err(FrameWriteError::Refused(status)) => assert_eq!(status, expected),
                other => panic!("{handle}/{epoch}/{offset}: {other:?}"),
            }
        }
        service.fence_master(ServerId(1));
        assert!(matches!(
            client
                .write(&addr, reply.handle, Epoch(1), 0, b"late", timeout)
                .await,
            Err(FrameWriteError::Refused(Status::Fenced))
        ));
        drop(stop);
        server.await.expect("server stops");
    }

    #[tokio::test]
    async fn bump_epoch_moves_an_open_frame_keeping_its_bytes() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let handle = open(&service, 1, 1, 1).await;
        let (bytes, ends) = segment(1, 1, 2);
        write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        bump(&service, handle, 1, 2).await.expect("bump");
        assert_eq!(
            list(&service, None).await,
            vec![info(1, 1, 2, ends[1], false)]
        );
        assert_eq!(
            status(write(&service, handle, 1, ends[1], b"x").await),
            Status::StaleEpoch
        );
        write_range(&service, handle, 2, &bytes, ends[1], ends[2]).await;
        // A retried bump is answered as the first was.
        bump(&service, handle, 1, 2).await.expect("retry");
        assert_eq!(
            status(bump(&service, handle, 2, 2).await),
            Status::InvalidArgument
        );
        assert_eq!(
            status(bump(&service, handle, 2, 1).await),
            Status::InvalidArgument
        );
        assert_eq!(
            status(bump(&service, handle, 3, 4).await),
            Status::StaleEpoch
        );
        assert_eq!(
            status(bump(&service, FrameHandle(999), 1, 2).await),
            Status::UnknownFrame
        );
        // An open at the old epoch is stale; at the new one it is a retry.
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 1, 1)).await),
            Status::StaleEpoch
        );
        assert_eq!(open(&service, 1, 1, 2).await, handle);
        let closed = close(&service, handle, 2, ends[2]).await.expect("close");
        assert_eq!(closed, info(1, 1, 2, ends[2], true));
        assert_eq!(
            status(bump(&service, handle, 2, 3).await),
            Status::UnknownFrame
        );
    }

    #[tokio::test]
    async fn fence_master_reports_acknowledged_writes_and_refuses_every_later_one() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let fenced = open_reply(&service, 1, 1, 1).await;
        let other_segment = open(&service, 1, 2, 1).await;
        let other_master = open(&service, 2, 1, 1).await;
        let (bytes, ends) = segment(1, 1, 2);
        let shm = fenced.shm.clone().expect("shm location");
        let mapping = ShmMapping::open(Path::new(&shm.path)).expect("map");
        mapping
            .write(
                shm.slot_offset,
                shm.slot_capacity,
                fenced.handle,
                0,
                &bytes[..ends[1] as usize],
            )
            .expect("shm write before the fence");
        let infos = service.fence_master(ServerId(1));
        assert_eq!(
            infos,
            vec![info(1, 1, 1, ends[1], false), info(1, 2, 1, 0, false)]
        );
        // Every transport is refused now.
        let late = &bytes[ends[1] as usize..ends[2] as usize];
        assert!(matches!(
            mapping.write(
                shm.slot_offset,
                shm.slot_capacity,
                fenced.handle,
                u64::from(ends[1]),
                late
            ),
            Err(FrameWriteError::Fenced)
        ));
        assert_eq!(
            status(write(&service, fenced.handle, 1, ends[1], late).await),
            Status::Fenced
        );
        assert_eq!(
            service
                .nic_target()
                .place(fenced.handle, Epoch(1), u64::from(ends[1]), late),
            Err(Status::Fenced)
        );
        assert_eq!(
            status(close(&service, fenced.handle, 1, ends[1]).await),
            Status::Fenced
        );
        assert_eq!(
            status(bump(&service, fenced.handle, 1, 2).await),
            Status::Fenced
        );
        for epoch in [1, 2] {
            assert_eq!(
                status(call::<proto::OpenReplica>(&service, &open_req(1, 1, epoch)).await),
                Status::Fenced
            );
        }
        assert_eq!(
            status(write(&service, other_segment, 1, 0, b"x").await),
            Status::Fenced
        );
        // The replica is still listed and readable with what was acknowledged.
        let replica = read(&service, 1, 1).await.expect("read");
        assert_eq!(&replica.bytes[..], &bytes[..ends[1] as usize]);
        // Fencing is idempotent; other masters are unaffected.
        assert_eq!(service.fence_master(ServerId(1)), infos);
        write(&service, other_master, 1, 0, b"fine")
            .await
            .expect("other master");
        // Recovery frees the fenced frames; their slots serve new frames.
        assert!(free(&service, 1, 1).await);
        assert!(free(&service, 1, 2).await);
        open(&service, 3, 1, 1).await;
        open(&service, 3, 2, 1).await;
    }

    /// Guarantee 6 under a race: a writer copies batches through the shared mapping
    /// while the backup fences; every batch acknowledged to the writer lies within the
    /// reported length, and nothing is acknowledged once the fence has returned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fence_master_racing_an_shm_writer_never_loses_an_acknowledged_write() {
        const ROUNDS: u64 = 50;
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let (bytes, ends) = segment(1, 1, 40);
        let mut fenced_mid_stream = 0;
        for round in 0..ROUNDS {
            // Each round a new master: the fence of an earlier round is not in the way.
            let master = round + 1;
            let reply = open_reply(&service, master, 1, 1).await;
            let shm = reply.shm.clone().expect("shm location");
            let mapping = ShmMapping::open(Path::new(&shm.path)).expect("map");
            let shm_write = |from: u32, to: u32| {
                let batch = &bytes[from as usize..to as usize];
                let (at, capacity) = (shm.slot_offset, shm.slot_capacity);
                mapping.write(at, capacity, reply.handle, u64::from(from), batch)
            };
            shm_write(0, ends[0]).expect("the opening");
            let (acked_end, reported) = std::thread::scope(|scope| {
                let writer = scope.spawn(|| {
                    let mut acked_end = ends[0];
                    for pair in ends.windows(2) {
                        match shm_write(pair[0], pair[1]) {
                            Ok(()) => acked_end = pair[1],
                            Err(FrameWriteError::Fenced) => break,
                            Err(error) => panic!("unexpected {error:?}"),
                        }
                    }
                    acked_end
                });
                // Let the writer get going for a while that varies by round.
                for _ in 0..(round * 997) % 20_000 {
                    std::hint::spin_loop();
                }
                let infos = service.fence_master(ServerId(master));
                (writer.join().expect("writer"), infos[0].length)
            });
            assert!(
                reported >= acked_end,
                "round {round}: batches acknowledged up to {acked_end}, fence reported {reported}"
            );
            assert!(ends.contains(&reported), "round {round}: {reported}");
            assert!(matches!(
                shm_write(0, ends[0]),
                Err(FrameWriteError::Fenced)
            ));
            let held = read(&service, master, 1).await.expect("read");
            assert_eq!(held.info.length, reported);
            assert_eq!(&held.bytes[..], &bytes[..reported as usize]);
            if acked_end < *ends.last().expect("batches") {
                fenced_mid_stream += 1;
            }
            assert!(free(&service, master, 1).await);
        }
        eprintln!("{fenced_mid_stream} of {ROUNDS} fences landed mid-stream");
    }

    /// Whether the kernel shows an RDMA device (then the no-device tests do not apply).
    fn host_has_rdma_device() -> bool {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut entries| entries.next().is_some())
    }

    fn rdma_connect_req(master: u64) -> proto::RdmaConnectRequest {
        proto::RdmaConnectRequest {
            master: ServerId(master),
            endpoint: rampart_common::onesided::rdma::RdmaEndpoint {
                qpn: 7,
                lid: 1,
                gid: [0; 16],
                psn: 1,
            },
        }
    }

    #[tokio::test]
    async fn rdma_connect_without_rdma_answers_invalid_argument_plainly() {
        if cfg!(feature = "rdma") && host_has_rdma_device() {
            eprintln!("skipped: this host can serve RDMA");
            return;
        }
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let reason = rampart_common::onesided::rdma::rdma_available()
            .expect_err("no RDMA in this build or on this host");
        assert_eq!(
            call::<proto::RdmaConnect>(&service, &rdma_connect_req(1)).await,
            Err((Status::InvalidArgument, reason))
        );
        // The rest of the service is unaffected, fencing included.
        let handle = open(&service, 1, 1, 1).await;
        service.fence_master(ServerId(1));
        assert_eq!(
            status(write(&service, handle, 1, 0, b"x").await),
            Status::Fenced
        );
    }

    /// The question an RDMA writer asks after a failed write: an empty `WriteReplica`
    /// moves no bytes and answers whether the frame is fenced or gone.
    #[tokio::test]
    async fn an_empty_write_tells_whether_a_frame_is_fenced_or_gone() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let handle = open(&service, 1, 1, 1).await;
        write(&service, handle, 1, 100, b"")
            .await
            .expect("open frame");
        write(&service, handle, 1, CAPACITY, b"")
            .await
            .expect("at the frame's end");
        service.fence_master(ServerId(1));
        for offset in [0, 100, CAPACITY] {
            assert_eq!(
                status(write(&service, handle, 1, offset, b"").await),
                Status::Fenced
            );
        }
        // Freed, a fenced frame still answers Fenced: its master was recovered.
        assert!(free(&service, 1, 1).await);
        assert_eq!(
            status(write(&service, handle, 1, 100, b"").await),
            Status::Fenced
        );
        let other = open(&service, 2, 1, 1).await;
        assert!(free(&service, 2, 1).await);
        assert_eq!(
            status(write(&service, other, 1, 100, b"").await),
            Status::UnknownFrame
        );
    }

    #[cfg(feature = "rdma")]
    #[tokio::test]
    async fn rdma_connect_from_a_fenced_master_is_refused() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        service.fence_master(ServerId(1));
        assert_eq!(
            status(call::<proto::RdmaConnect>(&service, &rdma_connect_req(1)).await),
            Status::Fenced
        );
        if !host_has_rdma_device() {
            // Other masters get the device's answer: here, none.
            assert_eq!(
                status(call::<proto::RdmaConnect>(&service, &rdma_connect_req(2)).await),
                Status::InvalidArgument
            );
        }
    }

    // ---- Crash recovery: StartRecovery, RecoveryRead, RecoveryData, EndRecovery ----

    use rampart_common::ids::{key_hash, TableId, Version};
    use rampart_common::log::{decode_entry, Entry, SegmentWriter};
    use rampart_common::protocol::backup::{PartitionRanges, RecoveryDataReply};
    use rampart_common::tablet::HashRange;

    /// What a log entry says, for comparisons: (tombstone?, table, key, version).
    type Logged = (bool, TableId, Vec<u8>, Version);

    const HALF: u64 = 1 << 63;

    /// Partition 0: table 1's lower half of hashes; partition 1: table 1's upper half and
    /// all of table 2. Table 3 is in none (a tablet the crashed master no longer owned).
    fn partitions() -> Vec<PartitionRanges> {
        vec![
            vec![HashRange::new(TableId(1), 0, HALF - 1)],
            vec![
                HashRange::new(TableId(1), HALF, u64::MAX),
                HashRange::whole(TableId(2)),
            ],
        ]
    }

    /// The model of `partitions()`.
    fn partition_of(table: TableId, key: &[u8]) -> Option<u32> {
        let hash = key_hash(key).0;
        match table.0 {
            1 if hash < HALF => Some(0),
            1 | 2 => Some(1),
            _ => None,
        }
    }

    /// A segment of `master` with objects in tables 1–3, a tombstone and safe versions,
    /// closed (footer to `segment + 1`) or open. Returns its bytes (the committed part),
    /// what it logged, and its highest safe version.
    fn recovery_segment(
        master: u64,
        segment: u64,
        digest: &[u64],
        closed: bool,
    ) -> (Vec<u8>, Vec<Logged>, Version) {
        let digest: Vec<SegmentId> = digest.iter().copied().map(SegmentId).collect();
        let mut writer =
            SegmentWriter::open(ServerId(master), SegmentId(segment), CAPACITY, &digest)
                .expect("open");
        let mut logged = Vec::new();
        for i in 0..12u64 {
            let table = TableId([1, 1, 1, 2, 3][i as usize % 5]);
            let key = format!("s{segment}-k{i}").into_bytes();
            writer
                .append_object(table, Version(i + 1), &key, &content(i as u8, 50))
                .expect("fits");
            logged.push((false, table, key, Version(i + 1)));
            if i == 5 {
                writer
                    .append_safe_version(Version(200 + segment))
                    .expect("fits");
                writer.seal_batch();
            }
        }
        let gone = format!("s{segment}-gone").into_bytes();
        writer
            .append_tombstone(TableId(1), Version(3), SegmentId(1), &gone)
            .expect("fits");
        logged.push((true, TableId(1), gone, Version(3)));
        writer
            .append_safe_version(Version(100 + segment))
            .expect("fits");
        writer.seal_batch();
        if closed {
            writer.close(SegmentId(segment + 1));
        }
        let end = writer.committed_len() as usize;
        (
            writer.bytes()[..end].to_vec(),
            logged,
            Version(200 + segment),
        )
    }

    /// The entries of `logged` in `partition`, in log order.
    fn expected(logged: &[Logged], partition: u32) -> Vec<Logged> {
        logged
            .iter()
            .filter(|(_, table, key, _)| partition_of(*table, key) == Some(partition))
            .cloned()
            .collect()
    }

    fn decode_piece(reply: &RecoveryDataReply) -> Vec<Logged> {
        let mut offset = 0;
        let mut seen = Vec::new();
        while let Some((entry, next)) = decode_entry(&reply.entries, offset).expect("decodes") {
            match entry {
                Entry::Object(o) => seen.push((false, o.table, o.key.to_vec(), o.version)),
                Entry::Tombstone(t) => seen.push((true, t.table, t.key.to_vec(), t.version)),
                other => panic!("unexpected {other:?} in a piece"),
            }
            offset = next;
        }
        assert_eq!(seen.len(), reply.count as usize);
        seen
    }

    /// Recovery of master 1 by recovery master 9 reads segment 3 here and returns
    /// every entry of `logged` in each of the two `partitions()`, at `epoch`.
    async fn assert_recovery_reads(
        service: &BackupService,
        logged: &[Logged],
        safe: Version,
        epoch: Epoch,
    ) {
        recovery_read(service, 1, 9, &[3], partitions())
            .await
            .expect("recovery read");
        for partition in 0..2 {
            let reply = recovery_data(service, 1, 9, 3, partition, vec![])
                .await
                .expect("piece");
            assert_eq!(
                decode_piece(&reply),
                expected(logged, partition),
                "every entry, partition {partition}"
            );
            assert_eq!((reply.safe_version, reply.epoch), (safe, epoch));
        }
    }

    /// Stores `bytes` as the closed replica (master, segment) at epoch 1.
    async fn store_closed(service: &BackupService, master: u64, segment: u64, bytes: &[u8]) {
        let handle = open(service, master, segment, 1).await;
        write_range(service, handle, 1, bytes, 0, bytes.len() as u32).await;
        close(service, handle, 1, bytes.len() as u32)
            .await
            .expect("close");
    }

    /// Writes `bytes` into a new open frame (master, segment) at epoch 1.
    async fn write_open(
        service: &BackupService,
        master: u64,
        segment: u64,
        bytes: &[u8],
    ) -> FrameHandle {
        let handle = open(service, master, segment, 1).await;
        write_range(service, handle, 1, bytes, 0, bytes.len() as u32).await;
        handle
    }

    async fn start_recovery(service: &BackupService, master: u64) -> Vec<RecoveryReplica> {
        let request = StartRecoveryRequest {
            master: ServerId(master),
        };
        call::<proto::StartRecovery>(service, &request)
            .await
            .expect("start recovery")
            .replicas
    }

    async fn recovery_read(
        service: &BackupService,
        master: u64,
        recovery: u64,
        segments: &[u64],
        partitions: Vec<PartitionRanges>,
    ) -> Result<(), (Status, String)> {
        let request = RecoveryReadRequest {
            master: ServerId(master),
            recovery,
            segments: segments.iter().copied().map(SegmentId).collect(),
            partitions,
        };
        call::<proto::RecoveryRead>(service, &request).await
    }

    async fn recovery_data(
        service: &BackupService,
        master: u64,
        recovery: u64,
        segment: u64,
        partition: u32,
        ranges: PartitionRanges,
    ) -> Result<RecoveryDataReply, (Status, String)> {
        let request = RecoveryDataRequest {
            master: ServerId(master),
            recovery,
            segment: SegmentId(segment),
            partition,
            ranges,
        };
        call::<proto::RecoveryData>(service, &request).await
    }

    async fn end_recovery(service: &BackupService, master: u64) -> u32 {
        let request = EndRecoveryRequest {
            master: ServerId(master),
        };
        call::<proto::EndRecovery>(service, &request)
            .await
            .expect("end recovery")
            .freed
    }

    #[tokio::test]
    async fn start_recovery_fences_and_reports_closed_and_open_replicas_with_digests() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (closed, _, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &closed).await;
        let (head, _, _) = recovery_segment(1, 2, &[1, 2], false);
        let handle = write_open(&service, 1, 2, &head).await;
        let other_master = write_open(&service, 2, 1, b"").await;

        let replicas = start_recovery(&service, 1).await;
        assert_eq!(
            replicas,
            vec![
                RecoveryReplica {
                    info: info(1, 1, 1, closed.len() as u32, true),
                    digest: None,
                    successor: None,
                },
                RecoveryReplica {
                    info: info(1, 2, 1, head.len() as u32, false),
                    digest: Some(vec![SegmentId(1), SegmentId(2)]),
                    successor: None,
                },
            ]
        );
        // Fenced: a later write to the open frame is refused, and so is a new replica.
        assert_eq!(
            status(write(&service, handle, 1, head.len() as u32, b"late").await),
            Status::Fenced
        );
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 3, 1)).await),
            Status::Fenced
        );
        write(&service, other_master, 1, 0, b"fine")
            .await
            .expect("another master is not fenced");
        // Idempotent.
        assert_eq!(start_recovery(&service, 1).await, replicas);
    }

    #[tokio::test]
    async fn start_recovery_reports_the_digest_of_an_open_replica_on_disk() {
        let dir = TempDir::new().expect("tempdir");
        let (head, _, _) = recovery_segment(5, 3, &[2, 3], false);
        {
            let service = open_service(&dir, 4);
            write_open(&service, 5, 3, &head).await;
            assert_eq!(service.flush_open_frames(), 1);
        }
        let service = open_service(&dir, 4);
        assert_eq!(
            start_recovery(&service, 5).await,
            vec![RecoveryReplica {
                info: info(5, 3, 1, head.len() as u32, false),
                digest: Some(vec![SegmentId(2), SegmentId(3)]),
                successor: None,
            }]
        );
    }

    #[tokio::test]
    async fn start_recovery_reports_the_footer_of_a_replica_that_was_never_closed() {
        // Segment 4's footer reached this frame, but its close did not (the master died
        // between the two); segment 6's footer is in an open replica written to disk at
        // a graceful stop. Both must say that their master closed them: the log goes on
        // after them (DESIGN.md §4, every footer needs its successor).
        let dir = TempDir::new().expect("tempdir");
        let (flushed, _, _) = recovery_segment(7, 6, &[4, 5, 6], true);
        {
            let service = open_service(&dir, 4);
            write_open(&service, 7, 6, &flushed).await;
            assert_eq!(service.flush_open_frames(), 1);
        }
        let service = open_service(&dir, 4);
        let (in_frame, _, _) = recovery_segment(7, 4, &[4], true);
        write_open(&service, 7, 4, &in_frame).await;
        assert_eq!(
            start_recovery(&service, 7).await,
            vec![
                RecoveryReplica {
                    info: info(7, 4, 1, in_frame.len() as u32, false),
                    digest: Some(vec![SegmentId(4)]),
                    successor: Some(SegmentId(5)),
                },
                RecoveryReplica {
                    info: info(7, 6, 1, flushed.len() as u32, false),
                    digest: Some(vec![SegmentId(4), SegmentId(5), SegmentId(6)]),
                    successor: Some(SegmentId(7)),
                },
            ]
        );
    }

    #[tokio::test]
    async fn a_re_created_replica_cut_short_does_not_hide_the_closed_copy_from_recovery() {
        // `rampart simulate`, seed 35: this backup holds closed segment 3 of master 1.
        // The master took the backup for dead, lost the replica, and re-created it here
        // at epoch 2, from byte 0; it crashed after the first batch. Recovery must see
        // the closed copy (the whole segment), not the frame (a footer-less prefix).
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (closed, logged, safe) = recovery_segment(1, 3, &[3], true);
        store_closed(&service, 1, 3, &closed).await;
        let (unclosed, _, _) = recovery_segment(1, 3, &[3], false);
        // The end of the first sealed batch: the last checksum before the second one's.
        let prefix = scan(&unclosed[..unclosed.len() - 1]).valid_bytes;
        assert!(prefix > 0 && (prefix as usize) < unclosed.len());
        assert_eq!(closed[..prefix as usize], unclosed[..prefix as usize]);
        let handle = open(&service, 1, 3, 2).await;
        write_range(&service, handle, 2, &closed, 0, prefix).await;
        let whole = info(1, 3, 1, closed.len() as u32, true);

        assert_eq!(list(&service, Some(1)).await, vec![whole]);
        let read_back = read(&service, 1, 3).await.expect("read");
        assert_eq!(read_back.info, whole);
        assert!(read_back.bytes[..] == closed[..], "the closed copy's bytes");
        assert_eq!(
            start_recovery(&service, 1).await,
            vec![RecoveryReplica {
                info: whole,
                digest: None,
                successor: None,
            }]
        );
        assert_recovery_reads(&service, &logged, safe, Epoch(1)).await;

        // A re-created frame that reached the footer is the whole segment too, and still
        // shadows the stored copy, as any frame at a newer epoch does.
        let (recreated, _, _) = recovery_segment(2, 3, &[3], true);
        store_closed(&service, 2, 3, &recreated).await;
        let handle = open(&service, 2, 3, 2).await;
        write_range(&service, handle, 2, &recreated, 0, recreated.len() as u32).await;
        assert_eq!(
            list(&service, Some(2)).await,
            vec![info(2, 3, 2, recreated.len() as u32, false)]
        );
    }

    #[tokio::test]
    async fn a_replacing_open_cut_short_keeps_the_acknowledged_bytes_of_the_replaced_frame() {
        // `rampart simulate`, seeds 1853, 2815, 3383, 3941: master 1's open segment 3 is
        // here at epoch 1, holding every acknowledged write. A dropped message made the
        // master take this backup for failed: it re-created the replica here at epoch 2,
        // from byte 0, and crashed after the first batch. The replacing open must keep
        // the old frame's bytes (the same stream), or the acknowledged writes are gone.
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (bytes, logged, safe) = recovery_segment(1, 3, &[3], false);
        let whole = scan(&bytes).valid_bytes;
        assert_eq!(whole as usize, bytes.len(), "every batch sealed");
        // The end of the first sealed batch: the last checksum before the second one's.
        let first = scan(&bytes[..bytes.len() - 1]).valid_bytes;
        assert!(first > 0 && first < whole);
        write_open(&service, 1, 3, &bytes).await;
        let handle = open(&service, 1, 3, 2).await;
        write_range(&service, handle, 2, &bytes, 0, first).await;
        let kept = info(1, 3, 2, whole, false);

        assert_eq!(list(&service, Some(1)).await, vec![kept]);
        let replicas = start_recovery(&service, 1).await;
        assert_eq!(
            replicas.iter().map(|r| r.info).collect::<Vec<_>>(),
            vec![kept],
            "the replacement at epoch 2, with every byte of the replaced frame"
        );
        let read_back = read(&service, 1, 3).await.expect("read");
        assert_eq!(read_back.info, kept);
        assert!(read_back.bytes[..] == bytes[..], "all {whole} bytes");
        assert_recovery_reads(&service, &logged, safe, Epoch(2)).await;
    }

    #[tokio::test]
    async fn recovery_read_then_recovery_data_returns_each_partitions_entries_once() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (first, first_logged, first_safe) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &first).await;
        let (head, head_logged, head_safe) = recovery_segment(1, 2, &[1, 2], false);
        write_open(&service, 1, 2, &head).await;
        start_recovery(&service, 1).await;

        recovery_read(&service, 1, 7, &[2, 1], partitions())
            .await
            .expect("recovery read");
        // Asked in the backup's read order, as recovery masters do.
        for (segment, logged, safe, epoch) in [
            (2, &head_logged, head_safe, 1),
            (1, &first_logged, first_safe, 1),
        ] {
            for partition in 0..2 {
                let reply = recovery_data(&service, 1, 7, segment, partition, vec![])
                    .await
                    .expect("piece");
                let want = expected(logged, partition);
                assert!(!want.is_empty(), "the test covers every partition");
                assert_eq!(decode_piece(&reply), want, "{segment}/{partition}");
                assert_eq!((reply.safe_version, reply.epoch), (safe, Epoch(epoch)));
            }
        }
        assert_eq!(service.recovery.pieces_bytes(), 0, "every piece handed out");
        // Handed out once: a repeat re-reads the replica and cuts out the given ranges.
        let again = recovery_data(&service, 1, 7, 1, 1, partitions()[1].clone())
            .await
            .expect("re-read");
        assert_eq!(decode_piece(&again), expected(&first_logged, 1));
        assert_eq!(
            status(recovery_data(&service, 1, 7, 1, 2, vec![]).await),
            Status::InvalidArgument,
            "no partition 2"
        );
    }

    #[tokio::test]
    async fn recovery_data_for_an_unscheduled_segment_reads_it_and_cuts_out_the_ranges() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (bytes, logged, safe) = recovery_segment(3, 4, &[4], true);
        store_closed(&service, 3, 4, &bytes).await;
        // No StartRecovery, no RecoveryRead here: a fallback for a failed backup.
        for partition in 0..2u32 {
            let ranges = partitions()[partition as usize].clone();
            let reply = recovery_data(&service, 3, 1, 4, partition, ranges)
                .await
                .expect("on demand");
            assert_eq!(decode_piece(&reply), expected(&logged, partition));
            assert_eq!(reply.safe_version, safe);
        }
        assert_eq!(service.recovery.pieces_bytes(), 0, "nothing cached");
        // The read fenced the master.
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(3, 9, 1)).await),
            Status::Fenced
        );
        assert_eq!(
            status(recovery_data(&service, 3, 1, 5, 0, partitions()[0].clone()).await),
            Status::ObjectDoesntExist
        );
        let overlapping = vec![
            HashRange::new(TableId(1), 0, 10),
            HashRange::new(TableId(1), 5, 20),
        ];
        assert_eq!(
            status(recovery_data(&service, 3, 1, 4, 0, overlapping).await),
            Status::InvalidArgument
        );
    }

    #[tokio::test]
    async fn recovery_data_of_a_corrupt_stored_replica_is_internal() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 1);
        let (bytes, _, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &bytes).await;
        // Another frame takes the only slot: the replica is read from the disk.
        open(&service, 2, 1, 1).await;
        let path = dir.path().join("replicas").join("m1-s1.replica");
        let mut image = std::fs::read(&path).expect("read file");
        let middle = image.len() / 2;
        image[middle] ^= 0xFF;
        std::fs::write(&path, image).expect("corrupt");

        recovery_read(&service, 1, 1, &[1], partitions())
            .await
            .expect("recovery read");
        let (code, detail) = recovery_data(&service, 1, 1, 1, 0, vec![])
            .await
            .expect_err("corrupt");
        assert_eq!(code, Status::Internal);
        assert!(detail.contains("checksum"), "{detail}");
        // Every partition of it gets the same answer.
        assert_eq!(
            status(recovery_data(&service, 1, 1, 1, 1, vec![]).await),
            Status::Internal
        );
        // It was quarantined: no longer held.
        assert_eq!(list(&service, Some(1)).await, vec![]);
    }

    #[tokio::test]
    async fn end_recovery_frees_every_replica_and_is_idempotent() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let (first, _, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &first).await;
        let (head, _, _) = recovery_segment(1, 2, &[1, 2], false);
        write_open(&service, 1, 2, &head).await;
        let (other, _, _) = recovery_segment(2, 1, &[1], true);
        store_closed(&service, 2, 1, &other).await;
        start_recovery(&service, 1).await;
        recovery_read(&service, 1, 1, &[1, 2], partitions())
            .await
            .expect("recovery read");
        recovery_data(&service, 1, 1, 1, 0, vec![])
            .await
            .expect("a piece, so the reader has run");

        assert_eq!(end_recovery(&service, 1).await, 2);
        assert_eq!(list(&service, Some(1)).await, vec![]);
        assert_eq!(service.recovery.pieces_bytes(), 0);
        assert_eq!(service.recovery.current(ServerId(1)), None);
        assert_eq!(end_recovery(&service, 1).await, 0);
        // Another master's replica stays; the freed frame's slot serves a new frame.
        assert_eq!(list(&service, Some(2)).await.len(), 1);
        open(&service, 3, 1, 1).await;
        open(&service, 3, 2, 1).await;
        // Nothing of master 1 is left to read.
        assert_eq!(
            status(recovery_data(&service, 1, 1, 1, 0, partitions()[0].clone()).await),
            Status::ObjectDoesntExist
        );
        // After a restart too.
        drop(service);
        let service = open_service(&dir, 2);
        assert_eq!(list(&service, Some(1)).await, vec![]);
    }

    #[tokio::test]
    async fn a_newer_recovery_replaces_an_older_one_and_drops_its_pieces() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (first, first_logged, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &first).await;
        let (second, second_logged, _) = recovery_segment(1, 2, &[1, 2], true);
        store_closed(&service, 1, 2, &second).await;
        start_recovery(&service, 1).await;

        // Attempt 1: everything in one partition. Let it read both segments.
        let everything = vec![vec![
            HashRange::whole(TableId(1)),
            HashRange::whole(TableId(2)),
        ]];
        recovery_read(&service, 1, 1, &[1, 2], everything.clone())
            .await
            .expect("attempt 1");
        recovery_data(&service, 1, 1, 1, 0, vec![])
            .await
            .expect("attempt 1 read segment 1");
        // Attempt 2 splits in two; attempt 1's unfetched pieces are dropped.
        recovery_read(&service, 1, 2, &[1, 2], partitions())
            .await
            .expect("attempt 2");
        assert_eq!(service.recovery.current(ServerId(1)), Some(2));
        for (segment, logged) in [(1, &first_logged), (2, &second_logged)] {
            for partition in 0..2 {
                let reply = recovery_data(&service, 1, 2, segment, partition, vec![])
                    .await
                    .expect("attempt 2 piece");
                assert_eq!(decode_piece(&reply), expected(logged, partition));
            }
        }
        assert_eq!(
            service.recovery.pieces_bytes(),
            0,
            "attempt 1's pieces are gone"
        );
        // Attempt 1 is stale; its late requests are served on demand with their ranges.
        assert_eq!(
            status(recovery_read(&service, 1, 1, &[1, 2], everything.clone()).await),
            Status::InvalidArgument
        );
        let late = recovery_data(&service, 1, 1, 2, 0, everything[0].clone())
            .await
            .expect("on demand");
        let all: Vec<Logged> = second_logged
            .iter()
            .filter(|(_, table, _, _)| table.0 <= 2)
            .cloned()
            .collect();
        assert_eq!(decode_piece(&late), all);
        assert_eq!(service.recovery.pieces_bytes(), 0);
    }
}
