//! `SimBackup`: a backup as the simulated masters and recoveries see it — open frames
//! written in place (one-sided), closed replicas on "disk", fences — following the rules
//! of the real frame table (`rampart-backup`'s `frame_table`) that matter to safety:
//!
//! * an open at the frame's epoch is a retry (the same handle); at a newer epoch it
//!   replaces the open frame, keeping its bytes (both are prefixes of the segment's one
//!   stream); at an older epoch, or one a stored replica supersedes, it is refused
//!   (`StaleEpoch`);
//! * an open frame shadows the stored copy of its replica in lists and reads, except
//!   that a frame without the footer never hides a closed copy;
//! * a fenced master may open nothing; its open frames refuse writes, bumps and closes,
//!   and keep the length their fence scan found;
//! * `FreeReplica { epoch_max }` removes the frame and the stored copy of a replica when
//!   they are at most at `epoch_max` — fenced or not, as the real backup does;
//! * the valid prefix, digest and footer of an open frame come from the real scanner
//!   (`rampart_common::log::scan`), as in the real recovery listing.
//!
//! A *down* backup answers nothing but keeps everything (a partition, a hung process, or
//! a kill with its shared-memory frames outliving it); a *lost* one is gone with its
//! frames and disk. Frame slots, capacity limits and the flush to disk are not modelled:
//! they decide when a backup says `BackupFull`, not what a recovery finds.

use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::log::scan;
use rampart_common::protocol::backup::{RecoveryReplica, ReplicaInfo};
use std::collections::{BTreeMap, BTreeSet};

/// Why a backup refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The master was fenced here: its recovery began.
    Fenced,
    /// No open frame with this handle (freed, replaced, or never opened).
    UnknownFrame,
    /// An open at an epoch older than a copy held here.
    StaleEpoch,
}

/// Whether a backup answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Answers.
    Up,
    /// Answers nothing until this simulated time (µs), then comes back with everything
    /// it held.
    DownUntil(u64),
    /// Gone for good, with its frames and disk.
    Lost,
}

/// One copy of a segment: an open frame or a closed replica on disk.
#[derive(Clone, Debug)]
pub struct Copy {
    /// The frame's handle (for a stored copy: the handle of the frame it was).
    pub handle: FrameHandle,
    pub epoch: Epoch,
    /// The frame: `capacity` bytes, zeroed when opened.
    pub bytes: Vec<u8>,
    /// For a fenced open frame: the valid prefix its fence scan found, final.
    pub fenced_length: Option<u32>,
}

/// A simulated backup.
#[derive(Debug)]
pub struct SimBackup {
    pub id: ServerId,
    pub liveness: Liveness,
    /// Open frames by (master, segment).
    frames: BTreeMap<(ServerId, SegmentId), Copy>,
    /// Closed replicas on disk by (master, segment).
    stored: BTreeMap<(ServerId, SegmentId), Copy>,
    fenced_masters: BTreeSet<ServerId>,
    /// Handles of fenced frames that were freed: still answered `Fenced`.
    fenced_handles: BTreeSet<FrameHandle>,
    /// Never reused, never 0.
    next_handle: FrameHandle,
}

impl SimBackup {
    pub fn new(id: ServerId) -> SimBackup {
        SimBackup {
            id,
            liveness: Liveness::Up,
            frames: BTreeMap::new(),
            stored: BTreeMap::new(),
            fenced_masters: BTreeSet::new(),
            fenced_handles: BTreeSet::new(),
            next_handle: FrameHandle(1),
        }
    }

    /// Whether it answers at `now_us` (a down backup whose time is over comes back).
    pub fn answers(&mut self, now_us: u64) -> bool {
        match self.liveness {
            Liveness::Up => true,
            Liveness::DownUntil(until) if until <= now_us => {
                self.liveness = Liveness::Up;
                true
            }
            Liveness::DownUntil(_) | Liveness::Lost => false,
        }
    }

    /// Gone for good: everything it held is lost.
    pub fn lose(&mut self) {
        self.liveness = Liveness::Lost;
        self.frames.clear();
        self.stored.clear();
    }

    /// `OpenReplica`: a zeroed frame of `capacity` bytes for (master, segment) at
    /// `epoch`; its handle.
    pub fn open(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        capacity: u32,
    ) -> Result<FrameHandle, Refusal> {
        let key = (master, segment);
        if self.fenced_masters.contains(&master) {
            return Err(Refusal::Fenced);
        }
        if let Some(frame) = self.frames.get(&key) {
            if frame.epoch == epoch {
                return Ok(frame.handle);
            }
            if frame.epoch > epoch {
                return Err(Refusal::StaleEpoch);
            }
        }
        if self.stored.get(&key).is_some_and(|s| s.epoch >= epoch) {
            return Err(Refusal::StaleEpoch);
        }
        let handle = self.next_handle;
        self.next_handle = handle.next();
        // A newer epoch's frame keeps what the frame it replaces held: both are
        // prefixes of the segment's one stream, so a fill cut short leaves no less.
        let bytes = match self.frames.remove(&key) {
            Some(old) if old.bytes.len() == capacity as usize => old.bytes,
            _ => vec![0; capacity as usize],
        };
        self.frames.insert(
            key,
            Copy {
                handle,
                epoch,
                bytes,
                fenced_length: None,
            },
        );
        Ok(handle)
    }

    fn frame_mut(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        handle: FrameHandle,
    ) -> Result<&mut Copy, Refusal> {
        if self.fenced_handles.contains(&handle) {
            return Err(Refusal::Fenced);
        }
        let frame = self
            .frames
            .get_mut(&(master, segment))
            .filter(|f| f.handle == handle)
            .ok_or(Refusal::UnknownFrame)?;
        if frame.fenced_length.is_some() {
            return Err(Refusal::Fenced);
        }
        Ok(frame)
    }

    /// A one-sided write of `bytes` at `offset` into frame `handle`. `applied` bytes of
    /// it land (fewer than all when the writer died mid-copy).
    pub fn write(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        handle: FrameHandle,
        offset: u32,
        bytes: &[u8],
        applied: usize,
    ) -> Result<(), Refusal> {
        let frame = self.frame_mut(master, segment, handle)?;
        let start = offset as usize;
        let end = (start + applied.min(bytes.len())).min(frame.bytes.len());
        if start < end {
            frame.bytes[start..end].copy_from_slice(&bytes[..end - start]);
        }
        Ok(())
    }

    /// `BumpEpoch`: the open frame moves to `epoch` (never back).
    pub fn bump(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        handle: FrameHandle,
        epoch: Epoch,
    ) -> Result<(), Refusal> {
        let frame = self.frame_mut(master, segment, handle)?;
        frame.epoch = frame.epoch.max(epoch);
        Ok(())
    }

    /// `CloseReplica`: the frame goes to disk, replacing any stored copy.
    pub fn close(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        handle: FrameHandle,
    ) -> Result<(), Refusal> {
        self.frame_mut(master, segment, handle)?;
        let frame = self
            .frames
            .remove(&(master, segment))
            .expect("frame_mut found it");
        self.stored.insert((master, segment), frame);
        Ok(())
    }

    /// `FreeReplica { epoch_max }`: removes the frame and the stored copy of (master,
    /// segment) that are at most at `epoch_max`.
    pub fn free(&mut self, master: ServerId, segment: SegmentId, epoch_max: Epoch) {
        let key = (master, segment);
        if let Some(frame) = self.frames.get(&key).filter(|f| f.epoch <= epoch_max) {
            if frame.fenced_length.is_some() {
                self.fenced_handles.insert(frame.handle);
            }
            self.frames.remove(&key);
        }
        if self.stored.get(&key).is_some_and(|s| s.epoch <= epoch_max) {
            self.stored.remove(&key);
        }
    }

    /// `StartRecovery`: fences `master` (it may open nothing from now on, its frames
    /// refuse writes, and each keeps the valid prefix found now) and lists every copy of
    /// its log held here, as the real backup reports them.
    pub fn fence_and_list(&mut self, master: ServerId) -> Vec<RecoveryReplica> {
        self.fenced_masters.insert(master);
        let mut listed: BTreeMap<SegmentId, RecoveryReplica> = BTreeMap::new();
        for ((owner, segment), copy) in self.stored.iter().filter(|((m, _), _)| *m == master) {
            let length = scan(&copy.bytes).valid_bytes;
            listed.insert(
                *segment,
                RecoveryReplica {
                    info: ReplicaInfo {
                        master: *owner,
                        segment: *segment,
                        epoch: copy.epoch,
                        length,
                        closed: true,
                    },
                    digest: None,
                    successor: None,
                },
            );
        }
        for ((owner, segment), frame) in self.frames.iter_mut().filter(|((m, _), _)| *m == master) {
            let scanned = scan(&frame.bytes);
            let length = *frame.fenced_length.get_or_insert(scanned.valid_bytes);
            if scanned.successor.is_none() && listed.get(segment).is_some_and(|s| s.info.closed) {
                // A frame without the footer does not hide a closed copy (as the real
                // backup: a re-creation of a closed segment's replica cut short).
                continue;
            }
            // Otherwise a frame shadows the stored copy of its replica.
            listed.insert(
                *segment,
                RecoveryReplica {
                    info: ReplicaInfo {
                        master: *owner,
                        segment: *segment,
                        epoch: frame.epoch,
                        length,
                        closed: false,
                    },
                    digest: scanned.digest,
                    successor: scanned.successor,
                },
            );
        }
        listed.into_values().collect()
    }

    /// `RecoveryRead`: the first `length` bytes of the copy of (master, segment) that
    /// was listed at `epoch` (open or `closed`), if it is still held as it was listed.
    pub fn read(
        &self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        closed: bool,
        length: u32,
    ) -> Option<Vec<u8>> {
        let key = (master, segment);
        let copy = if closed {
            self.stored.get(&key)
        } else {
            self.frames.get(&key)
        }?;
        if copy.epoch != epoch || copy.bytes.len() < length as usize {
            return None;
        }
        Some(copy.bytes[..length as usize].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: ServerId = ServerId(1);
    const S: SegmentId = SegmentId(1);

    #[test]
    fn a_fenced_frame_refuses_writes_and_its_master_opens_nothing() {
        let mut backup = SimBackup::new(ServerId(9));
        let handle = backup.open(M, S, Epoch(1), 64).expect("opens");
        backup.fence_and_list(M);
        assert_eq!(
            backup.write(M, S, handle, 0, &[1; 8], 8),
            Err(Refusal::Fenced)
        );
        assert_eq!(
            backup.open(M, SegmentId(2), Epoch(1), 64),
            Err(Refusal::Fenced)
        );
        backup.free(M, S, Epoch(1));
        assert_eq!(backup.bump(M, S, handle, Epoch(2)), Err(Refusal::Fenced));
    }

    #[test]
    fn an_open_at_an_older_epoch_is_stale_and_a_newer_one_replaces_the_frame() {
        let mut backup = SimBackup::new(ServerId(9));
        let first = backup.open(M, S, Epoch(2), 64).expect("opens");
        assert_eq!(backup.open(M, S, Epoch(2), 64), Ok(first));
        assert_eq!(backup.open(M, S, Epoch(1), 64), Err(Refusal::StaleEpoch));
        let second = backup.open(M, S, Epoch(3), 64).expect("replaces");
        assert_ne!(first, second);
        assert_eq!(
            backup.write(M, S, first, 0, &[1], 1),
            Err(Refusal::UnknownFrame)
        );
    }

    #[test]
    fn a_free_spares_a_copy_newer_than_its_epoch_max() {
        let mut backup = SimBackup::new(ServerId(9));
        backup.open(M, S, Epoch(3), 64).expect("opens");
        backup.free(M, S, Epoch(2));
        assert_eq!(backup.fence_and_list(M).len(), 1);
        backup.free(M, S, Epoch(3));
        assert!(backup.fence_and_list(M).is_empty());
    }
}
