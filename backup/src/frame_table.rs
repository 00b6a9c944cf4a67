//! `FrameTable`: which frames are open, in which slots, at which epochs, and what the
//! store holds beside them — every decision the backup makes about a frame, as a plain
//! synchronous state machine (docs/design.md §5 "Backups", "Fencing").
//!
//! The table owns no bytes and does no I/O. It decides; its driver (the backup's
//! private `frames::Frames`) holds it under one mutex and carries out what it
//! decided on the frame file: stamps a slot the table handed out
//! ([`Opened::assign`]), relabels a slot whose frame moved to a newer epoch, raises a
//! slot's fence word, and releases a slot the table gave back. Refusals are
//! [`Refusal`]s (a status and a reason); the service turns them into replies.
//!
//! Public for `rampart-sim` alone, whose simulated backups drive this same table over
//! frames and a store held in memory, so that the simulation's seeds test the backup's
//! real decisions; nothing else outside this crate uses it.
//!
//! # What it keeps, and its invariants
//! 1. Open frames by handle (`frames`) and the handle of each replica's open frame
//!    (`open`): a bijection, at most `frames_max` entries.
//! 2. Frames removed from the table while a close still copies their slot
//!    (`retiring`); every one has a close in flight, and the last close to end gives
//!    its slot back ([`FrameTable::close_ended`]).
//! 3. Every slot is in exactly one of: the free queue (oldest release first: reused as
//!    late as possible, see `onesided::shm` on stale writers), a frame of `frames` or
//!    `retiring`, or the hands of a driver releasing it (between leaving the table and
//!    [`FrameTable::released`]).
//! 4. A mirror of the store's metadata (`stored`), so that open and list never take the
//!    store's lock; the driver updates it ([`FrameTable::set_stored`]) while holding the
//!    store's lock, right after the store changed.
//! 5. Flushed replicas whose bytes are still in a free slot (`kept`): each such slot is
//!    in the free queue; an open that takes the slot forgets the entry first; a read
//!    uses the entry only while the mirror still says the store holds exactly that.
//! 6. Handles are never reused and never 0 (the frame file's mark of a free slot).
//! 7. Fencing: masters fenced here may open no frame; a fenced frame refuses writes,
//!    closes and bumps, and its first fenced length is final; the handles of fenced
//!    frames that left the table are remembered ([`FENCED_HANDLES_MAX`]) and still
//!    answered `Fenced`, never `UnknownFrame` (a zombie master must not take a fenced
//!    replica for a lost one and re-create it elsewhere).
//!
//! # What lists and reads see
//! Of an open frame and a stored copy of the same replica, the frame is what lists and
//! reads report ([`FrameTable::visible`]: the newer epoch wins, the frame on a tie) —
//! except that a frame whose valid prefix holds no footer never hides a *closed* stored
//! copy ([`FrameTable::shadows_stored`]). Such a frame is a re-creation of a closed
//! segment's replica, on a backup that still held it, that the master's crash cut
//! short: the closed copy is the whole segment (rule 1 of the coordinator's
//! `recovery_plan`), the frame only a prefix of it.
//!
//! # Replacing a frame
//! A master that took this backup for failed re-creates its open replica at a newer
//! epoch, here again, and rewrites it from byte 0. The new frame takes the old one's slot
//! and keeps its bytes ([`Opened::keeps_bytes`]): every copy of a segment is a prefix of
//! the one append-only stream its master writes (the coordinator's `recovery_plan`,
//! "Which copy of a segment"), so the old bytes and the new fill agree wherever both
//! exist, and the valid prefix never shrinks below what the old frame held — which may
//! be every acknowledged write, the new fill only a part of them if the master crashes
//! before it catches up. A fresh, zeroed slot is taken instead when a close still reads
//! the old one (its bytes are being flushed, and stay the old frame's), and the kept
//! slot is zeroed after all when the capacity differs: a segment's capacity is fixed
//! when it opens, so another one means the backup cannot tell the two frames hold the
//! same stream, and zeroing, as for any other slot, is the safe default.
//!
//! # Cost
//! Every operation is a few map lookups, except [`FrameTable::list`] and
//! [`FrameTable::fence_master`] (a range of the master's replicas).

use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::onesided::shm::SlotLabel;
use rampart_common::status::Status;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;

use crate::segment_store::ReplicaMeta;

/// Handles of freed fenced frames remembered: each crashed master leaves a few (its
/// open segments here), so this covers thousands of crashes; a handle forgotten past it
/// is answered `UnknownFrame`, and the master then learns it was declared crashed when
/// it tries to place the replica elsewhere (`OpenReplica` is `Fenced` here, the
/// coordinator refuses its new epoch).
pub const FENCED_HANDLES_MAX: usize = 65_536;

/// (master, segment): the key of a replica.
pub type ReplicaKey = (ServerId, SegmentId);

/// Why the table refused a request: the status the requester hears, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: Status,
    pub detail: String,
}

impl Refusal {
    pub fn new(status: Status, detail: impl Into<String>) -> Refusal {
        Refusal {
            status,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.status, self.detail)
    }
}

/// The sizes the table enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Frames open at once: the bound on unflushed data.
    pub frames_max: usize,
    /// The largest capacity a frame may have (≤ the frame file's slot).
    pub frame_bytes_max: u32,
}

/// One open frame: a replica being written.
#[derive(Debug)]
struct Frame {
    master: ServerId,
    segment: SegmentId,
    epoch: Epoch,
    /// Bytes the frame holds. Invariant: ≤ the frame file's slot capacity.
    capacity: u32,
    /// The frame file slot holding the bytes. Invariant: owned by this frame alone
    /// (the slot's owner word is this frame's handle) until the frame leaves the table
    /// and `retiring`.
    slot: usize,
    /// Closes running. While non-zero the frame refuses writes (the master has declared
    /// it complete, and the bytes are being flushed) and its slot is not released (a
    /// close is copying it).
    closes_in_flight: u32,
    /// Set by [`FrameTable::fence_master`] (or [`FrameTable::end_master`]), never
    /// cleared: the frame's master is being recovered. Mirrors the slot's fence word, so
    /// that the RPC paths refuse without touching the slot.
    fenced: bool,
    /// The valid prefix the first fence reported; from then on the frame's length. A
    /// write in flight during the fence may still land past it, unacknowledged: it is
    /// cut off so that every reader of a fenced frame sees the same replica.
    /// Invariant: `Some` only if `fenced`.
    fenced_length: Option<u32>,
    /// Set (in `retiring`) by the close that stored the frame: what the store then
    /// holds. Whichever close ends last releases the slot keeping its bytes for reads,
    /// also when it is a retried close that found the frame gone.
    stored: Option<ReplicaMeta>,
}

impl Frame {
    fn fenced_refusal(&self, handle: FrameHandle) -> Refusal {
        Refusal::new(
            Status::Fenced,
            format!(
                "frame {handle} of {}/{} is fenced: recovery of its master has begun",
                self.master, self.segment
            ),
        )
    }

    fn being_closed(handle: FrameHandle) -> Refusal {
        Refusal::new(
            Status::UnknownFrame,
            format!("frame {handle} is being closed"),
        )
    }
}

/// A frame captured under the table's lock for work outside it (a copy in or out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRef {
    pub handle: FrameHandle,
    pub slot: usize,
    pub master: ServerId,
    pub segment: SegmentId,
    pub epoch: Epoch,
    pub capacity: u32,
    /// The frame's fenced length: a scan reports no more than it.
    pub fenced_length: Option<u32>,
}

impl FrameRef {
    fn of(handle: FrameHandle, frame: &Frame) -> FrameRef {
        FrameRef {
            handle,
            slot: frame.slot,
            master: frame.master,
            segment: frame.segment,
            epoch: frame.epoch,
            capacity: frame.capacity,
            fenced_length: frame.fenced_length,
        }
    }

    /// The replica this frame holds.
    pub fn key(&self) -> ReplicaKey {
        (self.master, self.segment)
    }
}

/// What [`FrameTable::open`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub frame: FrameRef,
    /// A new frame: the driver must stamp its slot (zeroed unless `keeps_bytes`, owned
    /// by the handle, labelled) before it lets go of the table. `None` for a retried
    /// open, whose frame and slot are as the first open left them.
    pub assign: Option<SlotLabel>,
    /// The new frame took the slot of the frame it replaced — the same replica, at an
    /// older epoch, of the same capacity, with no close reading it — and the slot keeps
    /// its bytes: they are a prefix of the stream the new frame receives (module doc,
    /// "Replacing a frame"). Invariant: only with `assign`.
    pub keeps_bytes: bool,
}

/// A close under way, from [`FrameTable::claim_close`] until
/// [`FrameTable::close_ended`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closing {
    pub handle: FrameHandle,
    pub slot: usize,
    pub key: ReplicaKey,
    pub epoch: Epoch,
    pub length: u32,
}

/// A slot the table gave back: the driver releases it in the frame file (keeping its
/// bytes for reads when `kept` is set), then hands it back with
/// [`FrameTable::returned`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    pub slot: usize,
    /// The stored replica the slot's bytes are, if a close stored them.
    pub kept: Option<ReplicaMeta>,
}

/// What [`FrameTable::end_master`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ended {
    /// The replicas whose frames left the table.
    pub frames: Vec<ReplicaKey>,
    /// Their slots to release now (the others are still read by a close).
    pub releases: Vec<usize>,
}

/// Frames and stored replicas of a backup: [`FrameTable::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Frames open for writes (one per open replica).
    pub frames_open: usize,
    /// Frames whose bytes are only in the frame file, not yet in the store (open, or
    /// closing).
    pub frames_unflushed: usize,
    /// Frames being written to the store.
    pub frames_closing: usize,
    /// Frame file slots free.
    pub slots_free: usize,
    /// Replicas in the store (closed, or open ones flushed at a stop).
    pub replicas_stored: usize,
    /// Their bytes.
    pub bytes_stored: u64,
    /// Masters with a replica here.
    pub masters: usize,
}

/// The frame table. See the module doc.
#[derive(Debug)]
pub struct FrameTable {
    limits: FrameLimits,
    frames: HashMap<FrameHandle, Frame>,
    open: BTreeMap<ReplicaKey, FrameHandle>,
    retiring: HashMap<FrameHandle, Frame>,
    free_slots: VecDeque<usize>,
    stored: BTreeMap<ReplicaKey, ReplicaMeta>,
    kept: HashMap<ReplicaKey, (usize, ReplicaMeta)>,
    kept_slots: HashMap<usize, ReplicaKey>,
    /// Starts at a random point in [1, 2^62) (the driver picks it): a backup restarted
    /// at the same address must not hand out the handles its predecessor did, or a
    /// master's late write, close or bump naming an old handle could reach another
    /// master's new frame.
    next_handle: FrameHandle,
    /// Masters fenced here (their recovery began): they may not open new replicas
    /// either, so a cut-off master cannot move its log to this backup after its open
    /// frames were fenced. Server ids are never reused; one entry per crashed server.
    fenced_masters: HashSet<ServerId>,
    fenced_handles: FencedHandles,
}

impl FrameTable {
    /// A table of `slots` free slots, none open, the store holding `stored`, the first
    /// handle `first_handle` (0 is taken as 1).
    pub fn new(
        limits: FrameLimits,
        slots: usize,
        stored: impl IntoIterator<Item = ReplicaMeta>,
        first_handle: FrameHandle,
    ) -> FrameTable {
        FrameTable {
            limits,
            frames: HashMap::new(),
            open: BTreeMap::new(),
            retiring: HashMap::new(),
            free_slots: (0..slots).collect(),
            stored: stored
                .into_iter()
                .map(|meta| ((meta.master, meta.segment), meta))
                .collect(),
            kept: HashMap::new(),
            kept_slots: HashMap::new(),
            next_handle: first_handle.max(FrameHandle(1)),
            fenced_masters: HashSet::new(),
            fenced_handles: FencedHandles::default(),
        }
    }

    /// Opens a frame for `label` (OpenReplica). A retried open at the frame's epoch
    /// gets the same frame; a newer epoch replaces the open frame (the re-replication
    /// after an epoch bump rewrites it from byte 0), in the old slot keeping its bytes
    /// unless a close still reads it or the capacity changed (module doc, "Replacing a
    /// frame"); an older one, or one a stored replica supersedes, is `StaleEpoch`.
    /// Refusals change nothing.
    pub fn open(&mut self, label: SlotLabel) -> Result<Opened, Refusal> {
        let key = (label.master, label.segment);
        if self.fenced_masters.contains(&label.master) {
            return Err(Refusal::new(
                Status::Fenced,
                format!(
                    "{} was fenced on this backup: recovery of its log has begun",
                    label.master
                ),
            ));
        }
        if label.capacity > self.limits.frame_bytes_max {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!(
                    "frame capacity {} exceeds the limit of {} bytes",
                    label.capacity, self.limits.frame_bytes_max
                ),
            ));
        }
        let replaced = self.open.get(&key).copied();
        if let Some((handle, frame)) = replaced.and_then(|h| Some((h, self.frames.get(&h)?))) {
            if frame.fenced {
                return Err(frame.fenced_refusal(handle));
            }
            if frame.epoch == label.epoch {
                if frame.capacity != label.capacity {
                    return Err(Refusal::new(
                        Status::InvalidArgument,
                        format!(
                            "{}/{} epoch {} is open with capacity {}, not {}",
                            label.master,
                            label.segment,
                            frame.epoch,
                            frame.capacity,
                            label.capacity
                        ),
                    ));
                }
                // A retried open: the same frame, the same reply.
                return Ok(Opened {
                    frame: FrameRef::of(handle, frame),
                    assign: None,
                    keeps_bytes: false,
                });
            }
            if frame.epoch > label.epoch {
                return Err(stale(key, label.epoch, frame.epoch, "an open frame"));
            }
        }
        self.check_not_superseded(key, label.epoch)?;
        if replaced.is_none() && self.open.len() >= self.limits.frames_max {
            return Err(Refusal::new(
                Status::BackupFull,
                format!("all {} frames are open", self.limits.frames_max),
            ));
        }
        // Checked before anything changes, so a refusal leaves all as it was.
        let slot_reusable = replaced
            .and_then(|old| self.frames.get(&old))
            .is_some_and(|old| old.closes_in_flight == 0);
        if !slot_reusable && self.free_slots.is_empty() {
            return Err(Refusal::new(
                Status::BackupFull,
                format!(
                    "no free frame slot: {} frames open, {} still being flushed",
                    self.open.len(),
                    self.retiring.len()
                ),
            ));
        }
        let replaced_capacity = replaced
            .and_then(|old| self.frames.get(&old))
            .map(|old| old.capacity);
        let reused = replaced.and_then(|old| self.remove_frame(old));
        let keeps_bytes = reused.is_some() && replaced_capacity == Some(label.capacity);
        let Some(slot) = reused.or_else(|| self.free_slots.pop_front()) else {
            return Err(Refusal::new(Status::Internal, "free frame slot vanished"));
        };
        self.forget_kept_slot(slot);
        let handle = self.next_handle;
        self.next_handle = handle.next();
        let frame = Frame {
            master: label.master,
            segment: label.segment,
            epoch: label.epoch,
            capacity: label.capacity,
            slot,
            closes_in_flight: 0,
            fenced: false,
            fenced_length: None,
            stored: None,
        };
        let opened = Opened {
            frame: FrameRef::of(handle, &frame),
            assign: Some(label),
            keeps_bytes,
        };
        self.frames.insert(handle, frame);
        self.open.insert(key, handle);
        tracing::debug!(
            master = %label.master, segment = %label.segment, epoch = %label.epoch,
            %handle, slot, replaced = replaced.is_some(), keeps_bytes, "frame opened"
        );
        Ok(opened)
    }

    /// `StaleEpoch` if the store holds `key` at a newer epoch than `epoch`, or closed at
    /// `epoch` (a closed replica is final; an open one may be superseded).
    fn check_not_superseded(&self, key: ReplicaKey, epoch: Epoch) -> Result<(), Refusal> {
        match self.stored.get(&key) {
            Some(stored) if stored.epoch > epoch || (stored.closed && stored.epoch == epoch) => {
                let what = if stored.closed {
                    "a closed replica"
                } else {
                    "a stored replica"
                };
                Err(stale(key, epoch, stored.epoch, what))
            }
            _ => Ok(()),
        }
    }

    /// The open frame `handle`, not fenced, checked against `epoch`. The fence is
    /// checked first: a zombie master must hear `Fenced` whatever epoch it names
    /// (invariant 7), or it would take the replica for a stale one and re-create it
    /// elsewhere.
    fn frame_mut(&mut self, handle: FrameHandle, epoch: Epoch) -> Result<&mut Frame, Refusal> {
        let Some(frame) = self.frames.get_mut(&handle) else {
            return Err(self.fenced_handles.gone(handle));
        };
        if frame.fenced {
            return Err(frame.fenced_refusal(handle));
        }
        if frame.epoch != epoch {
            return Err(Refusal::new(
                Status::StaleEpoch,
                format!(
                    "frame {handle} of {}/{} has epoch {}, not {epoch}",
                    frame.master, frame.segment, frame.epoch
                ),
            ));
        }
        Ok(frame)
    }

    /// Checks a write of `len` bytes at `offset` into frame `handle` at `epoch`, and
    /// returns the slot to copy it into (the copy, outside the table's lock, checks
    /// the slot's owner word: a slot that changed hands meanwhile is not written).
    pub fn writable(
        &mut self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u64,
        len: u64,
    ) -> Result<usize, Refusal> {
        let frame = self.frame_mut(handle, epoch)?;
        if frame.closes_in_flight > 0 {
            return Err(Frame::being_closed(handle));
        }
        if offset
            .checked_add(len)
            .map_or(true, |end| end > u64::from(frame.capacity))
        {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!(
                    "write of {len} bytes at offset {offset} passes the end of frame {handle} \
                     ({} bytes)",
                    frame.capacity
                ),
            ));
        }
        Ok(frame.slot)
    }

    /// What a writer whose copy found the slot no longer its frame's hears: `Fenced`
    /// for a fenced frame freed meanwhile, else `UnknownFrame`.
    pub fn gone_during_write(&self, handle: FrameHandle) -> Refusal {
        if self.fenced_handles.contains(handle) {
            return self.fenced_handles.gone(handle);
        }
        Refusal::new(
            Status::UnknownFrame,
            format!("frame {handle} was closed, freed or replaced during the write"),
        )
    }

    /// Moves frame `handle` from `epoch` to `new_epoch` (BumpEpoch). Returns the slot
    /// whose label the driver must rewrite before it answers (a backup killed after
    /// answering must read the frame back at the new epoch), or `None` for a retried
    /// bump that already took effect.
    pub fn bump_epoch(
        &mut self,
        handle: FrameHandle,
        epoch: Epoch,
        new_epoch: Epoch,
    ) -> Result<Option<usize>, Refusal> {
        let Some(frame) = self.frames.get(&handle) else {
            return Err(self.fenced_handles.gone(handle));
        };
        let key = (frame.master, frame.segment);
        if frame.fenced {
            return Err(frame.fenced_refusal(handle));
        }
        if frame.closes_in_flight > 0 {
            return Err(Frame::being_closed(handle));
        }
        if frame.epoch == new_epoch && epoch < new_epoch {
            return Ok(None);
        }
        if frame.epoch != epoch {
            return Err(Refusal::new(
                Status::StaleEpoch,
                format!(
                    "frame {handle} of {}/{} has epoch {}, not {epoch}",
                    key.0, key.1, frame.epoch
                ),
            ));
        }
        if new_epoch <= epoch {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!("frame {handle}: new epoch {new_epoch} is not newer than {epoch}"),
            ));
        }
        // The same rule as a fresh open at the new epoch (only its wording differs).
        if let Some(stored) = self.stored.get(&key) {
            if stored.epoch > new_epoch || (stored.closed && stored.epoch == new_epoch) {
                return Err(stale(key, new_epoch, stored.epoch, "a stored replica"));
            }
        }
        let Some(frame) = self.frames.get_mut(&handle) else {
            return Err(self.fenced_handles.gone(handle));
        };
        frame.epoch = new_epoch;
        tracing::debug!(
            master = %key.0, segment = %key.1, %handle, epoch = %new_epoch, "frame epoch bumped"
        );
        Ok(Some(frame.slot))
    }

    /// Starts closing frame `handle` at `epoch`, storing its first `length` bytes: from
    /// now until [`FrameTable::close_ended`], the frame refuses writes and bumps, and its
    /// slot stays pinned.
    pub fn claim_close(
        &mut self,
        handle: FrameHandle,
        epoch: Epoch,
        length: u32,
    ) -> Result<Closing, Refusal> {
        let frame = self.frame_mut(handle, epoch)?;
        if length > frame.capacity {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!(
                    "close length {length} exceeds frame {handle} capacity {}",
                    frame.capacity
                ),
            ));
        }
        frame.closes_in_flight += 1;
        Ok(Closing {
            handle,
            slot: frame.slot,
            key: (frame.master, frame.segment),
            epoch: frame.epoch,
            length,
        })
    }

    /// Whether frame `handle` is (still) in the table.
    pub fn is_open(&self, handle: FrameHandle) -> bool {
        self.frames.contains_key(&handle)
    }

    /// The close of `handle` stored it as `meta` (the mirror already says so): the
    /// frame leaves the table, its slot parked until the last close of it ends.
    pub fn closed(&mut self, handle: FrameHandle, meta: ReplicaMeta) {
        let released = self.remove_frame(handle);
        debug_assert!(released.is_none(), "a closing frame's slot is pinned");
        if let Some(frame) = self.retiring.get_mut(&handle) {
            frame.stored = Some(meta);
        }
    }

    /// A close of `handle` ended (stored, failed, or never run). Returns the slot to
    /// release if it was the last close of a frame that left the table.
    pub fn close_ended(&mut self, handle: FrameHandle) -> Option<Release> {
        if let Some(frame) = self.frames.get_mut(&handle) {
            frame.closes_in_flight = frame.closes_in_flight.saturating_sub(1);
            return None;
        }
        let frame = self.retiring.get_mut(&handle)?;
        frame.closes_in_flight = frame.closes_in_flight.saturating_sub(1);
        if frame.closes_in_flight > 0 {
            return None;
        }
        let frame = self.retiring.remove(&handle)?;
        Some(Release {
            slot: frame.slot,
            kept: frame.stored,
        })
    }

    /// Removes the open frame of `key` if its epoch is at most `epoch_max` (FreeReplica:
    /// a copy newer than that is a replacement placed after the free was decided).
    /// Returns whether a frame was removed, and its slot if the driver must release it
    /// now.
    pub fn free(&mut self, key: ReplicaKey, epoch_max: Epoch) -> (bool, Option<usize>) {
        let handle = self.open.get(&key).copied();
        match handle.filter(|h| self.frames.get(h).is_some_and(|f| f.epoch <= epoch_max)) {
            Some(handle) => (true, self.remove_frame(handle)),
            None => (false, None),
        }
    }

    /// Removes frame `handle` from the table. Returns its slot if the caller must
    /// release it now; `None` if there was no such frame or a close still reads the
    /// slot (it is then parked in `retiring`).
    fn remove_frame(&mut self, handle: FrameHandle) -> Option<usize> {
        let frame = self.frames.remove(&handle)?;
        self.open.remove(&(frame.master, frame.segment));
        if frame.fenced {
            self.fenced_handles.remember(handle);
        }
        if frame.closes_in_flight > 0 {
            self.retiring.insert(handle, frame);
            return None;
        }
        Some(frame.slot)
    }

    /// Fences `master` (recovery of it has begun): it may open no frame here from now
    /// on, and each of its open frames refuses writes, closes and bumps. Returns those
    /// frames: the driver raises each slot's fence word before it lets go of the table,
    /// then scans them and records their lengths with [`FrameTable::fenced_length`].
    pub fn fence_master(&mut self, master: ServerId) -> Vec<FrameRef> {
        self.fenced_masters.insert(master);
        let handles: Vec<FrameHandle> = self
            .open
            .range(master_range(master))
            .map(|(_, &h)| h)
            .collect();
        handles
            .into_iter()
            .filter_map(|handle| {
                let frame = self.frames.get_mut(&handle)?;
                frame.fenced = true;
                Some(FrameRef::of(handle, frame))
            })
            .collect()
    }

    /// Records `scanned` as fenced frame `handle`'s length unless a fence already did:
    /// the first is final. Returns the slot and the final length, for the driver to
    /// record in the slot; `None` if the frame left the table.
    pub fn fenced_length(&mut self, handle: FrameHandle, scanned: u32) -> Option<(usize, u32)> {
        let frame = self.frames.get_mut(&handle)?;
        debug_assert!(frame.fenced, "only a fenced frame has a fenced length");
        let length = *frame.fenced_length.get_or_insert(scanned);
        Some((frame.slot, length))
    }

    /// Whether a recovery read of `key` must fence `master` first: it was never fenced
    /// here, or the replica's frame has no final length yet (a fence is under way).
    pub fn needs_fence(&self, master: ServerId, key: ReplicaKey) -> bool {
        !self.fenced_masters.contains(&master)
            || self
                .visible(key)
                .is_some_and(|frame| frame.fenced_length.is_none())
    }

    /// `master` was recovered (EndRecovery): it is fenced for good, and each of its open
    /// frames is fenced and removed (their handles keep answering `Fenced`).
    pub fn end_master(&mut self, master: ServerId) -> Ended {
        self.fenced_masters.insert(master);
        let frames: Vec<(ReplicaKey, FrameHandle)> = self
            .open
            .range(master_range(master))
            .map(|(&key, &h)| (key, h))
            .collect();
        let mut ended = Ended::default();
        for (key, handle) in frames {
            ended.frames.push(key);
            if let Some(frame) = self.frames.get_mut(&handle) {
                frame.fenced = true;
            }
            ended.releases.extend(self.remove_frame(handle));
        }
        ended
    }

    /// The open frame of `key` if it is what reads and lists report for the replica:
    /// the copy with the newer epoch wins, the frame on a tie (it holds at least what
    /// was flushed of the same epoch) — provided [`FrameTable::shadows_stored`] lets it
    /// hide the stored copy, which the caller checks once it scanned the frame.
    pub fn visible(&self, key: ReplicaKey) -> Option<FrameRef> {
        let handle = *self.open.get(&key)?;
        let frame = self.frames.get(&handle)?;
        match self.stored.get(&key) {
            Some(stored) if stored.epoch > frame.epoch => None,
            _ => Some(FrameRef::of(handle, frame)),
        }
    }

    /// Whether the visible open frame of `key`, whose valid prefix holds a footer or
    /// not (`frame_has_footer`), hides the stored copy from lists and reads: always,
    /// unless the store holds a *closed* copy and the frame has no footer. The master
    /// re-creates the replica of a closed segment from byte 0 (after it took this
    /// backup for dead and lost the replica, then picked it again), at a newer epoch, so
    /// the frame is visible; a crash before the re-creation wrote the footer leaves a
    /// frame that is only a prefix of the closed copy, and reporting it would hide the
    /// whole segment from recovery (which then waits for a complete copy, or replays the
    /// prefix and loses acknowledged writes). Without a closed stored copy the answer
    /// does not depend on the footer: callers ask with `false` first, and scan the
    /// frame for its footer only when the answer is no.
    pub fn shadows_stored(&self, key: ReplicaKey, frame_has_footer: bool) -> bool {
        frame_has_footer || !self.stored.get(&key).is_some_and(|stored| stored.closed)
    }

    /// The replicas of `master` (or all): what the store holds, and the visible open
    /// frames (each shadows its stored copy, but see [`FrameTable::shadows_stored`]),
    /// for the driver to scan.
    pub fn list(&self, master: Option<ServerId>) -> (Vec<ReplicaMeta>, Vec<FrameRef>) {
        let range = match master {
            Some(master) => master_range(master),
            None => (ServerId(0), SegmentId(0))..=(ServerId(u64::MAX), SegmentId(u64::MAX)),
        };
        let stored = self.stored.range(range.clone()).map(|(_, m)| *m).collect();
        let frames = self
            .open
            .range(range)
            .filter_map(|(key, _)| self.visible(*key))
            .collect();
        (stored, frames)
    }

    /// Counts of frames and stored replicas (for metrics and status reports).
    pub fn stats(&self) -> FrameStats {
        let closing = self
            .frames
            .values()
            .filter(|frame| frame.closes_in_flight > 0)
            .count();
        FrameStats {
            frames_open: self.open.len(),
            frames_unflushed: self.frames.len() + self.retiring.len(),
            frames_closing: closing + self.retiring.len(),
            slots_free: self.free_slots.len(),
            replicas_stored: self.stored.len(),
            bytes_stored: self
                .stored
                .values()
                .map(|meta| u64::from(meta.length))
                .sum(),
            masters: self
                .stored
                .keys()
                .map(|(master, _)| *master)
                .chain(self.open.keys().map(|(master, _)| *master))
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
        }
    }

    /// Every open frame (a graceful stop flushes them).
    pub fn open_frames(&self) -> Vec<FrameRef> {
        self.open
            .values()
            .filter_map(|&handle| Some(FrameRef::of(handle, self.frames.get(&handle)?)))
            .collect()
    }

    /// Whether `frame` is still in the table, in the same slot: a copy of its slot made
    /// without the lock is then a copy of this frame (handles are never reused, and a
    /// slot changes hands only after its frame left the table).
    pub fn still_holds(&self, frame: &FrameRef) -> bool {
        self.frames
            .get(&frame.handle)
            .is_some_and(|held| held.slot == frame.slot)
    }

    /// Whether the backup holds anything of `key` (an open frame or a stored copy).
    pub fn holds(&self, key: ReplicaKey) -> bool {
        self.open.contains_key(&key) || self.stored.contains_key(&key)
    }

    /// What the store holds of `key`, as the mirror says.
    pub fn stored(&self, key: ReplicaKey) -> Option<ReplicaMeta> {
        self.stored.get(&key).copied()
    }

    /// Mirrors the store's metadata of `key` (`None`: the store holds nothing of it).
    /// Call with the store's lock held, after any store operation on `key` (also a
    /// failed one: a write whose directory sync failed is indexed, a corrupt read is
    /// forgotten).
    pub fn set_stored(&mut self, key: ReplicaKey, meta: Option<ReplicaMeta>) {
        match meta {
            Some(meta) => self.stored.insert(key, meta),
            None => self.stored.remove(&key),
        };
    }

    /// Takes back the slot `release` names, which the driver released in its frame
    /// file: keeping the stored replica its bytes are, if a close stored them
    /// ([`released_keeping`](Self::released_keeping)), else holding nothing
    /// ([`released`](Self::released)).
    pub fn returned(&mut self, release: Release) {
        match release.kept {
            Some(meta) => self.released_keeping(release.slot, meta),
            None => self.released(release.slot),
        }
    }

    /// Takes back a slot the driver released: free, and holding nothing to read.
    pub fn released(&mut self, slot: usize) {
        self.free_slots.push_back(slot);
    }

    /// Takes back a slot the driver released keeping its bytes, those of stored replica
    /// `meta`: reads of it come from the slot while it stays free — if the store still
    /// holds exactly that (a free or a newer write may have come first).
    pub fn released_keeping(&mut self, slot: usize, meta: ReplicaMeta) {
        self.free_slots.push_back(slot);
        let key = (meta.master, meta.segment);
        if self.stored.get(&key) != Some(&meta) {
            return;
        }
        if let Some((old_slot, _)) = self.kept.insert(key, (slot, meta)) {
            self.kept_slots.remove(&old_slot);
        }
        self.kept_slots.insert(slot, key);
    }

    /// The free slot holding the bytes of stored replica `key`, and what the store
    /// holds of it — while the store still holds exactly what the slot kept.
    pub fn kept(&self, key: ReplicaKey) -> Option<(usize, ReplicaMeta)> {
        let &(slot, meta) = self.kept.get(&key)?;
        (self.stored.get(&key) == Some(&meta)).then_some((slot, meta))
    }

    /// Forgets what free slot `slot` held: it is being assigned.
    fn forget_kept_slot(&mut self, slot: usize) {
        if let Some(key) = self.kept_slots.remove(&slot) {
            self.kept.remove(&key);
        }
    }
}

/// Every replica key of `master`.
fn master_range(master: ServerId) -> std::ops::RangeInclusive<ReplicaKey> {
    (master, SegmentId(0))..=(master, SegmentId(u64::MAX))
}

fn stale(key: ReplicaKey, epoch: Epoch, held: Epoch, what: &str) -> Refusal {
    Refusal::new(
        Status::StaleEpoch,
        format!(
            "{}/{}: epoch {epoch} is stale; the backup holds {what} at epoch {held}",
            key.0, key.1
        ),
    )
}

/// Handles of fenced frames that left the table, the newest [`FENCED_HANDLES_MAX`].
#[derive(Debug, Default)]
struct FencedHandles {
    /// Oldest first; the same handles as `set`.
    order: VecDeque<FrameHandle>,
    set: HashSet<FrameHandle>,
}

impl FencedHandles {
    fn remember(&mut self, handle: FrameHandle) {
        if !self.set.insert(handle) {
            return;
        }
        self.order.push_back(handle);
        if self.order.len() > FENCED_HANDLES_MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
    }

    fn contains(&self, handle: FrameHandle) -> bool {
        self.set.contains(&handle)
    }

    /// The answer to a request naming frame `handle`, which is not in the table.
    fn gone(&self, handle: FrameHandle) -> Refusal {
        if self.contains(handle) {
            return Refusal::new(
                Status::Fenced,
                format!("frame {handle} was fenced and freed: its master was recovered"),
            );
        }
        Refusal::new(Status::UnknownFrame, format!("no open frame {handle}"))
    }
}

#[cfg(test)]
impl FrameTable {
    /// Checks invariants 1, 3 and 5 of the module doc, given the slots a driver holds
    /// (released by the table, not yet handed back) and the table's slot count.
    fn check(&self, in_hand: &[usize], slots: usize) {
        assert_eq!(self.frames.len(), self.open.len(), "frames and open differ");
        for (key, handle) in &self.open {
            let frame = &self.frames[handle];
            assert_eq!((frame.master, frame.segment), *key);
        }
        assert!(self.open.len() <= self.limits.frames_max);
        for frame in self.retiring.values() {
            assert!(frame.closes_in_flight > 0, "a retiring frame with no close");
        }
        let mut seen: Vec<usize> = self
            .free_slots
            .iter()
            .chain(self.frames.values().map(|f| &f.slot))
            .chain(self.retiring.values().map(|f| &f.slot))
            .chain(in_hand)
            .copied()
            .collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..slots).collect::<Vec<_>>(),
            "a slot lost or doubled"
        );
        for (key, (slot, _)) in &self.kept {
            assert!(
                self.free_slots.contains(slot),
                "a kept slot that is not free"
            );
            assert_eq!(self.kept_slots.get(slot), Some(key));
        }
        assert_eq!(self.kept.len(), self.kept_slots.len());
    }

    /// Checks that the slot of each close in flight, (handle, slot), is still its
    /// frame's, in the table or in `retiring`: nothing else may be written into it
    /// while the close copies it.
    fn check_pinned(&self, closes: &[(FrameHandle, usize)]) {
        for &(handle, slot) in closes {
            let frame = self
                .frames
                .get(&handle)
                .or_else(|| self.retiring.get(&handle));
            assert_eq!(
                frame.map(|f| f.slot),
                Some(slot),
                "a slot released under a close"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: FrameLimits = FrameLimits {
        frames_max: 2,
        frame_bytes_max: 1024,
    };

    fn label(master: u64, segment: u64, epoch: u64) -> SlotLabel {
        SlotLabel {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
            capacity: 512,
        }
    }

    fn meta(master: u64, segment: u64, epoch: u64, closed: bool) -> ReplicaMeta {
        ReplicaMeta {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
            length: 100,
            closed,
            content_crc32: 7,
        }
    }

    fn key(master: u64, segment: u64) -> ReplicaKey {
        (ServerId(master), SegmentId(segment))
    }

    /// A table of 3 slots (one more than `frames_max`), the store empty.
    fn table() -> FrameTable {
        FrameTable::new(LIMITS, 3, [], FrameHandle(10))
    }

    fn open(table: &mut FrameTable, master: u64, segment: u64, epoch: u64) -> FrameRef {
        let opened = table.open(label(master, segment, epoch)).expect("open");
        assert!(opened.assign.is_some(), "a new frame is assigned");
        opened.frame
    }

    fn status<T: std::fmt::Debug>(result: Result<T, Refusal>) -> Status {
        result.expect_err("refused").status
    }

    /// Stores the frame's close as the store would (the mirror first, as the driver
    /// does under the store's lock), and ends the close.
    fn close(table: &mut FrameTable, frame: &FrameRef) -> Option<Release> {
        let closing = table
            .claim_close(frame.handle, frame.epoch, 100)
            .expect("claim");
        let stored = meta(frame.master.0, frame.segment.0, frame.epoch.0, true);
        table.set_stored(closing.key, Some(stored));
        table.closed(frame.handle, stored);
        table.close_ended(frame.handle)
    }

    /// Hands a released slot back as the driver does.
    fn release(table: &mut FrameTable, release: Release) {
        match release.kept {
            Some(meta) => table.released_keeping(release.slot, meta),
            None => table.released(release.slot),
        }
    }

    #[test]
    fn an_open_takes_the_oldest_free_slot_and_a_retry_gets_the_same_frame_unassigned() {
        let mut table = table();
        let first = open(&mut table, 1, 1, 1);
        assert_eq!((first.handle, first.slot), (FrameHandle(10), 0));
        let retry = table.open(label(1, 1, 1)).expect("retry");
        assert_eq!(retry.frame, first);
        assert_eq!(
            retry.assign, None,
            "a retry must not zero the frame's bytes"
        );
        let other = open(&mut table, 1, 2, 1);
        assert_eq!((other.handle, other.slot), (FrameHandle(11), 1));
        let mut wider = label(1, 1, 1);
        wider.capacity = 1000;
        assert_eq!(status(table.open(wider)), Status::InvalidArgument);
        table.check(&[], 3);
    }

    #[test]
    fn an_open_is_refused_past_its_limits_and_a_refusal_changes_nothing() {
        let mut table = table();
        let mut huge = label(1, 1, 1);
        huge.capacity = LIMITS.frame_bytes_max + 1;
        assert_eq!(status(table.open(huge)), Status::InvalidArgument);
        open(&mut table, 1, 1, 1);
        open(&mut table, 1, 2, 1);
        assert_eq!(status(table.open(label(1, 3, 1))), Status::BackupFull);
        // A replacing open needs no new room.
        let replaced = open(&mut table, 1, 2, 2);
        assert_eq!(replaced.slot, 1, "the replaced frame's slot is reused");
        table.check(&[], 3);
    }

    #[test]
    fn a_replacing_open_of_the_same_replica_keeps_its_slot_and_bytes() {
        // `rampart simulate`, seeds 1853, 2815, 3383, 3941: the master re-created the
        // replica here at a newer epoch and crashed mid-fill; zeroing the slot had lost
        // the acknowledged bytes the old frame held.
        let mut table = table();
        let fresh = table.open(label(1, 1, 1)).expect("open");
        assert!(!fresh.keeps_bytes, "a fresh slot is zeroed");
        let replacing = table.open(label(1, 1, 2)).expect("replace");
        assert_eq!(
            replacing.assign,
            Some(label(1, 1, 2)),
            "a new frame, labelled anew"
        );
        assert_ne!(replacing.frame.handle, fresh.frame.handle);
        assert_eq!(
            replacing.frame.slot, fresh.frame.slot,
            "the old frame's slot"
        );
        assert!(
            replacing.keeps_bytes,
            "its bytes are a prefix of the new frame's"
        );
        let retry = table.open(label(1, 1, 2)).expect("retry");
        assert_eq!((retry.assign, retry.keeps_bytes), (None, false));
        // Another replica never inherits bytes.
        let other = table.open(label(1, 2, 1)).expect("open");
        assert!(!other.keeps_bytes);
        table.check(&[], 3);
    }

    #[test]
    fn a_replacing_open_whose_old_frame_is_being_closed_takes_a_fresh_zeroed_slot() {
        let mut table = table();
        let old = open(&mut table, 1, 1, 1);
        let closing = table
            .claim_close(old.handle, old.epoch, 100)
            .expect("claim");
        let replacing = table.open(label(1, 1, 2)).expect("replace");
        assert_ne!(
            replacing.frame.slot, old.slot,
            "the close still copies the old slot"
        );
        assert!(
            !replacing.keeps_bytes,
            "a slot from the free queue is zeroed"
        );
        table.check(&[], 3);
        let release = table
            .close_ended(closing.handle)
            .expect("the old slot comes back");
        assert_eq!(release.slot, old.slot);
        table.check(&[release.slot], 3);
    }

    #[test]
    fn a_replacing_open_of_another_capacity_reuses_the_slot_but_zeroes_it() {
        let mut table = table();
        let old = open(&mut table, 1, 1, 1);
        let mut narrower = label(1, 1, 2);
        narrower.capacity = 256;
        let replacing = table.open(narrower).expect("replace");
        assert_eq!(replacing.frame.slot, old.slot);
        assert!(!replacing.keeps_bytes, "not known to be the same stream");
        table.check(&[], 3);
    }

    #[test]
    fn epochs_never_go_back_through_an_open() {
        let mut table = table();
        open(&mut table, 1, 1, 5);
        assert_eq!(status(table.open(label(1, 1, 4))), Status::StaleEpoch);
        table.set_stored(key(2, 1), Some(meta(2, 1, 3, true)));
        assert_eq!(
            status(table.open(label(2, 1, 3))),
            Status::StaleEpoch,
            "closed is final"
        );
        assert_eq!(status(table.open(label(2, 1, 2))), Status::StaleEpoch);
        open(&mut table, 2, 1, 4);
        let (freed, slot) = table.free(key(1, 1), Epoch(5));
        assert!(freed);
        table.released(slot.expect("no close reads it"));
        table.set_stored(key(3, 1), Some(meta(3, 1, 3, false)));
        open(&mut table, 3, 1, 3);
        table.check(&[], 3);
    }

    #[test]
    fn writes_are_checked_against_epoch_bounds_and_a_close_in_flight() {
        let mut table = table();
        let frame = open(&mut table, 1, 1, 1);
        assert_eq!(
            table.writable(frame.handle, Epoch(1), 0, 512),
            Ok(frame.slot)
        );
        assert_eq!(
            status(table.writable(frame.handle, Epoch(1), 1, 512)),
            Status::InvalidArgument
        );
        assert_eq!(
            status(table.writable(frame.handle, Epoch(1), u64::MAX, 2)),
            Status::InvalidArgument
        );
        assert_eq!(
            status(table.writable(frame.handle, Epoch(2), 0, 1)),
            Status::StaleEpoch
        );
        assert_eq!(
            status(table.writable(FrameHandle(999), Epoch(1), 0, 1)),
            Status::UnknownFrame
        );
        let closing = table
            .claim_close(frame.handle, Epoch(1), 100)
            .expect("claim");
        assert_eq!(
            status(table.writable(frame.handle, Epoch(1), 0, 1)),
            Status::UnknownFrame
        );
        assert_eq!(
            status(table.bump_epoch(frame.handle, Epoch(1), Epoch(2))),
            Status::UnknownFrame
        );
        assert_eq!(
            status(table.claim_close(frame.handle, Epoch(1), 513)),
            Status::InvalidArgument
        );
        assert_eq!(
            table.close_ended(closing.handle),
            None,
            "the frame is still open"
        );
        assert_eq!(
            table.writable(frame.handle, Epoch(1), 0, 1),
            Ok(frame.slot),
            "writable again"
        );
    }

    #[test]
    fn a_bump_moves_the_frame_once_and_a_retry_of_it_changes_nothing() {
        let mut table = table();
        let frame = open(&mut table, 1, 1, 1);
        assert_eq!(
            table.bump_epoch(frame.handle, Epoch(1), Epoch(3)),
            Ok(Some(frame.slot))
        );
        assert_eq!(
            table.bump_epoch(frame.handle, Epoch(1), Epoch(3)),
            Ok(None),
            "retried"
        );
        assert_eq!(
            status(table.bump_epoch(frame.handle, Epoch(1), Epoch(4))),
            Status::StaleEpoch
        );
        assert_eq!(
            status(table.bump_epoch(frame.handle, Epoch(3), Epoch(3))),
            Status::InvalidArgument
        );
        assert_eq!(
            status(table.writable(frame.handle, Epoch(1), 0, 1)),
            Status::StaleEpoch
        );
        table.set_stored(key(1, 1), Some(meta(1, 1, 5, false)));
        assert_eq!(
            status(table.bump_epoch(frame.handle, Epoch(3), Epoch(4))),
            Status::StaleEpoch
        );
        assert_eq!(
            table.visible(key(1, 1)),
            None,
            "a newer stored copy hides the frame"
        );
    }

    #[test]
    fn a_frame_without_footer_does_not_shadow_a_closed_stored_copy() {
        // The master re-creates its replica of closed segment 1/1 on a backup that still
        // holds it closed, at a newer epoch, and crashes before the footer.
        let mut table = table();
        table.set_stored(key(1, 1), Some(meta(1, 1, 1, true)));
        let frame = open(&mut table, 1, 1, 2);
        assert_eq!(table.visible(key(1, 1)), Some(frame), "the newer epoch");
        assert!(
            !table.shadows_stored(key(1, 1), false),
            "a prefix must not hide the whole segment"
        );
        assert!(
            table.shadows_stored(key(1, 1), true),
            "with its footer the frame is the whole segment too"
        );
        // Beside an open stored copy, or none, the frame shadows with or without footer.
        table.set_stored(key(1, 1), Some(meta(1, 1, 1, false)));
        assert!(table.shadows_stored(key(1, 1), false));
        table.set_stored(key(1, 1), None);
        assert!(table.shadows_stored(key(1, 1), false));
        open(&mut table, 2, 1, 1);
        assert!(table.shadows_stored(key(2, 1), false));
        table.check(&[], 3);
    }

    #[test]
    fn a_stored_close_keeps_its_slot_readable_until_an_open_takes_it() {
        let mut table = table();
        let frame = open(&mut table, 1, 1, 1);
        let released = close(&mut table, &frame).expect("the last close releases");
        assert_eq!(released.kept, Some(meta(1, 1, 1, true)));
        assert!(!table.is_open(frame.handle));
        table.check(&[released.slot], 3);
        release(&mut table, released);
        assert_eq!(
            table.kept(key(1, 1)),
            Some((frame.slot, meta(1, 1, 1, true)))
        );
        // Slots are reused oldest release first: slots 1 and 2 go before slot 0.
        assert_eq!(open(&mut table, 2, 1, 1).slot, 1);
        assert_eq!(open(&mut table, 2, 2, 1).slot, 2);
        assert_eq!(table.kept(key(1, 1)).map(|(slot, _)| slot), Some(0));
        let reused = table.open(label(2, 3, 1));
        assert_eq!(status(reused), Status::BackupFull, "frames_max is 2");
        table.set_stored(key(1, 1), Some(meta(1, 1, 2, false)));
        assert_eq!(
            table.kept(key(1, 1)),
            None,
            "the store no longer holds what the slot has"
        );
        table.check(&[], 3);
    }

    #[test]
    fn a_free_during_a_close_parks_the_slot_until_the_close_ends() {
        let mut table = table();
        let frame = open(&mut table, 1, 1, 1);
        let closing = table
            .claim_close(frame.handle, Epoch(1), 100)
            .expect("claim");
        assert_eq!(
            table.free(key(1, 1), Epoch(0)),
            (false, None),
            "newer than the bound: kept"
        );
        assert_eq!(
            table.free(key(1, 1), Epoch(1)),
            (true, None),
            "the close still reads the slot"
        );
        assert!(
            !table.is_open(frame.handle),
            "the close will find its frame gone"
        );
        table.check(&[], 3);
        let released = table
            .close_ended(closing.handle)
            .expect("released by the close");
        assert_eq!(
            released,
            Release {
                slot: frame.slot,
                kept: None
            }
        );
        table.check(&[released.slot], 3);
    }

    #[test]
    fn of_two_closes_of_one_frame_the_last_to_end_releases_and_keeps_the_stored_bytes() {
        let mut table = table();
        let frame = open(&mut table, 1, 1, 1);
        table
            .claim_close(frame.handle, Epoch(1), 100)
            .expect("first");
        table
            .claim_close(frame.handle, Epoch(1), 100)
            .expect("retry");
        let stored = meta(1, 1, 1, true);
        table.set_stored(key(1, 1), Some(stored));
        table.closed(frame.handle, stored);
        assert_eq!(
            table.close_ended(frame.handle),
            None,
            "the retry still reads it"
        );
        let released = table.close_ended(frame.handle).expect("the last releases");
        assert_eq!(released.kept, Some(stored));
    }

    #[test]
    fn a_fenced_master_opens_nothing_and_its_frames_refuse_all_but_reads() {
        let mut table = table();
        let frame = open(&mut table, 1, 1, 1);
        let other = open(&mut table, 2, 1, 1);
        let fenced = table.fence_master(ServerId(1));
        assert_eq!(fenced.len(), 1);
        assert!(
            table.needs_fence(ServerId(1), key(1, 1)),
            "no final length yet"
        );
        assert_eq!(
            table.fenced_length(frame.handle, 40),
            Some((frame.slot, 40))
        );
        assert_eq!(
            table.fenced_length(frame.handle, 90),
            Some((frame.slot, 40)),
            "final"
        );
        assert!(!table.needs_fence(ServerId(1), key(1, 1)));
        assert!(table.needs_fence(ServerId(2), key(2, 1)));
        assert_eq!(
            table.visible(key(1, 1)).and_then(|f| f.fenced_length),
            Some(40)
        );
        assert_eq!(
            status(table.writable(frame.handle, Epoch(1), 0, 1)),
            Status::Fenced
        );
        assert_eq!(
            status(table.claim_close(frame.handle, Epoch(1), 1)),
            Status::Fenced
        );
        assert_eq!(
            status(table.bump_epoch(frame.handle, Epoch(1), Epoch(2))),
            Status::Fenced
        );
        assert_eq!(status(table.open(label(1, 1, 2))), Status::Fenced);
        assert_eq!(status(table.open(label(1, 9, 1))), Status::Fenced);
        assert_eq!(table.writable(other.handle, Epoch(1), 0, 1), Ok(other.slot));
        // A zombie that names another epoch still hears `Fenced`, not `StaleEpoch`
        // (which would send it to re-create the replica elsewhere).
        assert_eq!(
            status(table.writable(frame.handle, Epoch(2), 0, 1)),
            Status::Fenced
        );
        assert_eq!(
            status(table.claim_close(frame.handle, Epoch(2), 1)),
            Status::Fenced
        );
    }

    #[test]
    fn a_recovered_masters_frames_leave_and_their_handles_keep_answering_fenced() {
        let mut table = table();
        let frame = open(&mut table, 1, 1, 1);
        let unfenced_before = open(&mut table, 2, 1, 1);
        let ended = table.end_master(ServerId(1));
        assert_eq!(
            ended,
            Ended {
                frames: vec![key(1, 1)],
                releases: vec![frame.slot]
            }
        );
        table.check(&ended.releases, 3);
        assert_eq!(
            status(table.writable(frame.handle, Epoch(1), 0, 1)),
            Status::Fenced
        );
        assert_eq!(table.gone_during_write(frame.handle).status, Status::Fenced);
        assert_eq!(status(table.open(label(1, 2, 1))), Status::Fenced);
        // A frame freed without a fence is merely gone.
        assert_eq!(
            table.free(key(2, 1), Epoch(1)),
            (true, Some(unfenced_before.slot))
        );
        assert_eq!(
            status(table.writable(unfenced_before.handle, Epoch(1), 0, 1)),
            Status::UnknownFrame
        );
        assert_eq!(
            table.gone_during_write(unfenced_before.handle).status,
            Status::UnknownFrame
        );
    }

    #[test]
    fn fenced_handles_are_remembered_up_to_their_bound() {
        let mut table = FrameTable::new(LIMITS, 1, [], FrameHandle(1));
        for master in 0..=FENCED_HANDLES_MAX as u64 {
            open(&mut table, master, 0, 1);
            let ended = table.end_master(ServerId(master));
            for slot in ended.releases {
                table.released(slot);
            }
        }
        // Handles 1..=FENCED_HANDLES_MAX+1 were fenced and freed: the oldest is forgotten.
        assert_eq!(
            status(table.writable(FrameHandle(1), Epoch(1), 0, 1)),
            Status::UnknownFrame
        );
        assert_eq!(
            status(table.writable(FrameHandle(2), Epoch(1), 0, 1)),
            Status::Fenced
        );
        let last = FENCED_HANDLES_MAX as u64 + 1;
        assert_eq!(
            status(table.writable(FrameHandle(last), Epoch(1), 0, 1)),
            Status::Fenced
        );
    }

    /// One step of the property test: what a backup's driver might do next.
    #[derive(Clone, Debug)]
    enum Step {
        Open {
            master: u64,
            segment: u64,
            epoch: u64,
        },
        Claim {
            pick: usize,
        },
        Store {
            pick: usize,
        },
        EndClose {
            pick: usize,
        },
        Bump {
            pick: usize,
        },
        Free {
            master: u64,
            segment: u64,
            epoch_max: u64,
        },
        Fence {
            master: u64,
        },
        End {
            master: u64,
        },
        Release,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..3u64, 0..3u64, 1..4u64).prop_map(|(master, segment, epoch)| Step::Open {
                master,
                segment,
                epoch
            }),
            any::<usize>().prop_map(|pick| Step::Claim { pick }),
            any::<usize>().prop_map(|pick| Step::Store { pick }),
            any::<usize>().prop_map(|pick| Step::EndClose { pick }),
            any::<usize>().prop_map(|pick| Step::Bump { pick }),
            (0..3u64, 0..3u64, 0..4u64).prop_map(|(master, segment, epoch_max)| Step::Free {
                master,
                segment,
                epoch_max
            }),
            (0..3u64).prop_map(|master| Step::Fence { master }),
            (0..3u64).prop_map(|master| Step::End { master }),
            Just(Step::Release),
        ]
    }

    proptest! {
        /// Whatever the order of opens, closes, bumps, frees, fences and ends: no slot is
        /// lost or given to two frames, handles never repeat, a kept slot is a free one.
        #[test]
        fn slots_are_never_lost_or_shared_and_handles_never_repeat(
            steps in proptest::collection::vec(step(), 1..80),
        ) {
            const SLOTS: usize = 3;
            let mut table = FrameTable::new(LIMITS, SLOTS, [], FrameHandle(1));
            let mut handles_seen = HashSet::new();
            let mut opened: Vec<FrameRef> = Vec::new();
            let mut closes: Vec<(FrameHandle, Epoch, usize)> = Vec::new(); // (handle, epoch, slot)
            let mut in_hand: Vec<Release> = Vec::new();
            for step in steps {
                match step {
                    Step::Open { master, segment, epoch } => {
                        let replaced = opened
                            .iter()
                            .rev()
                            .find(|f| f.key() == key(master, segment) && table.is_open(f.handle))
                            .copied();
                        if let Ok(opened_now) = table.open(label(master, segment, epoch)) {
                            if opened_now.assign.is_some() {
                                prop_assert!(handles_seen.insert(opened_now.frame.handle));
                            }
                            if opened_now.keeps_bytes {
                                // Only the replaced frame's own slot keeps its bytes.
                                prop_assert!(opened_now.assign.is_some());
                                prop_assert_eq!(
                                    replaced.map(|f| f.slot),
                                    Some(opened_now.frame.slot)
                                );
                            }
                            opened.push(opened_now.frame);
                        }
                    }
                    Step::Claim { pick } if !opened.is_empty() => {
                        let frame = opened[pick % opened.len()];
                        if let Ok(closing) = table.claim_close(frame.handle, frame.epoch, 10) {
                            closes.push((closing.handle, closing.epoch, closing.slot));
                        }
                    }
                    Step::Store { pick } if !closes.is_empty() => {
                        let (handle, epoch, _) = closes[pick % closes.len()];
                        if let Some(frame) = opened.iter().find(|f| f.handle == handle) {
                            if table.is_open(handle) {
                                let stored = meta(frame.master.0, frame.segment.0, epoch.0, true);
                                table.set_stored(frame.key(), Some(stored));
                                table.closed(handle, stored);
                            }
                        }
                    }
                    Step::EndClose { pick } if !closes.is_empty() => {
                        let (handle, _, _) = closes.swap_remove(pick % closes.len());
                        in_hand.extend(table.close_ended(handle));
                    }
                    Step::Bump { pick } if !opened.is_empty() => {
                        let frame = opened[pick % opened.len()];
                        let _ = table.bump_epoch(frame.handle, frame.epoch, frame.epoch.next());
                    }
                    Step::Free { master, segment, epoch_max } => {
                        let (_, slot) = table.free(key(master, segment), Epoch(epoch_max));
                        in_hand.extend(slot.map(|slot| Release { slot, kept: None }));
                    }
                    Step::Fence { master } => {
                        for frame in table.fence_master(ServerId(master)) {
                            table.fenced_length(frame.handle, 5);
                        }
                    }
                    Step::End { master } => {
                        let ended = table.end_master(ServerId(master));
                        in_hand.extend(ended.releases.into_iter().map(|slot| Release { slot, kept: None }));
                    }
                    Step::Release => {
                        if let Some(released) = in_hand.pop() {
                            release(&mut table, released);
                        }
                    }
                    _ => {}
                }
                let held: Vec<usize> = in_hand.iter().map(|r| r.slot).collect();
                table.check(&held, SLOTS);
                let pinned: Vec<(FrameHandle, usize)> = closes.iter().map(|&(h, _, slot)| (h, slot)).collect();
                table.check_pinned(&pinned);
            }
        }
    }
}
