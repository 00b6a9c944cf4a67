//! The replicas a backup holds, as reads and recovery see them: [`read_held`] serves one
//! replica — from its open frame, from the slot its close kept, from its file or from
//! the store — for `ReadReplica` and recovery reads; [`recovery_replicas`] lists a
//! master's replicas for `StartRecovery`, with the log digest and the footer's successor
//! of each one not closed.
//!
//! Both are plain synchronous functions over [`HeldReplicas`]: what a backup's frames
//! and store give them (the table's answers, the frames' bytes, the kept slots, the
//! files, the store's verified reads). Every decision is here — which copy a read
//! serves, which frame shadows its stored copy, what a listing reports and drops — and
//! none in the implementations, which only look up and copy. The real backup implements
//! the trait over its `Frames` and `StoreHandle` (`service/held.rs`: its locks, files
//! and blocking reads stay there), the simulation (`rampart-sim`'s `SimBackup`) over
//! bytes held in memory: both run these functions, so a regression here fails
//! simulated seeds.
//!
//! A frame shadows the stored copy of its replica, unless the frame has no footer and
//! the stored copy is closed (a re-creation cut short:
//! [`FrameTable::shadows_stored`]).
//!
//! [`FrameTable::shadows_stored`]: crate::frame_table::FrameTable::shadows_stored

use rampart_common::ids::ServerId;
use rampart_common::log::scan;
use rampart_common::protocol::backup::{RecoveryReplica, ReplicaInfo};
use std::collections::{BTreeMap, BTreeSet};

use crate::frame_table::{FrameRef, FrameTable, ReplicaKey};
use crate::recovery_reads::HeldReplica;
use crate::segment_store::{ReplicaMeta, StoreError};

/// An open frame's valid prefix, copied out of its slot: no more than its fenced
/// length, `bytes.len()` bytes.
#[derive(Clone, Debug)]
pub struct HeldFrame {
    /// The frame, as the table reported it before the copy.
    pub frame: FrameRef,
    /// Its valid prefix.
    pub bytes: Vec<u8>,
}

impl HeldFrame {
    /// The replica as lists and reads report it.
    pub fn info(&self) -> ReplicaInfo {
        self.frame.info(self.bytes.len() as u32)
    }
}

/// What a backup's frames and store give [`read_held`] and [`recovery_replicas`]. Each
/// method looks up or copies, and decides nothing the functions do not tell it to.
pub trait HeldReplicas {
    /// `look` run on the backup's frame table — under its lock, held for that alone —
    /// for the table's answers: its listing, the visible frame of a replica, whether a
    /// frame shadows the stored copy.
    fn with_table<R>(&self, look: impl FnOnce(&FrameTable) -> R) -> R;

    /// Each frame's valid prefix, cut at its fenced length, copied out of its slot; a
    /// frame that left the table meanwhile is left out (its slot may hold another's
    /// bytes now).
    fn scan_frames(&self, frames: Vec<FrameRef>) -> Vec<HeldFrame>;

    /// The stored replica `key` copied into `bytes` from the free slot that kept it,
    /// checked against the store's checksum, and what the store holds of it; `None` if
    /// no slot does (any more), and then `bytes` holds nothing to use.
    fn read_kept(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta>;

    /// The stored replica `key` copied into `bytes` from its file, verified, without the
    /// store's lock, and its metadata; `None` where that cannot say (not held as far as
    /// the table's mirror knows, or the file changed or went meanwhile): the store's
    /// own read ([`HeldReplicas::read_stored`]) then settles it.
    fn read_file(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta>;

    /// The store's read of replica `key`, verified (a corrupt one is quarantined,
    /// reported as [`StoreError::Corrupt`] and no longer held), with what the store
    /// holds of it; `None` if it holds nothing.
    fn read_stored(&self, key: ReplicaKey) -> Result<Option<(Vec<u8>, ReplicaMeta)>, StoreError>;
}

/// Whether `frame` (scanned) hides the stored copy of its replica from reads. Its bytes
/// are scanned again, for the footer, only when the answer depends on it (the store
/// holds a closed copy): the common case costs one lookup.
pub fn shadows_stored<H: HeldReplicas + ?Sized>(held: &H, frame: &HeldFrame) -> bool {
    let key = frame.frame.key();
    if held.with_table(|table| table.shadows_stored(key, false)) {
        return true;
    }
    let has_footer = scan(&frame.bytes).successor.is_some();
    held.with_table(|table| table.shadows_stored(key, has_footer))
}

/// The replica `key` as reads see it: the visible open frame's valid prefix (its fenced
/// length once fenced) unless it has no footer and the store holds a closed copy
/// ([`shadows_stored`]), else the stored copy — from the free slot that kept it, else
/// from its file, else by the store's own read (verified: a corrupt one is quarantined
/// and reported as [`StoreError::Corrupt`]); `None` if not held. `reuse` is a buffer
/// the bytes may be read into.
pub fn read_held<H: HeldReplicas + ?Sized>(
    held: &H,
    key: ReplicaKey,
    mut reuse: Vec<u8>,
) -> Result<Option<HeldReplica>, StoreError> {
    if let Some(frame) = held.with_table(|table| table.visible(key)) {
        if let Some(scanned) = held.scan_frames(vec![frame]).pop() {
            if shadows_stored(held, &scanned) {
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
    if let Some(meta) = held.read_kept(key, &mut reuse) {
        return Ok(Some(HeldReplica {
            info: ReplicaInfo::from(&meta),
            bytes: reuse,
        }));
    }
    // From the file, as the table's mirror (which may lag the store, never lead it)
    // names it; the store's own read below settles what this one cannot (a replica
    // replaced, freed or corrupt meanwhile).
    if let Some(meta) = held.read_file(key, &mut reuse) {
        return Ok(Some(HeldReplica {
            info: ReplicaInfo::from(&meta),
            bytes: reuse,
        }));
    }
    // `None`: freed between the lookup above and the read.
    Ok(held.read_stored(key)?.map(|(bytes, meta)| HeldReplica {
        info: ReplicaInfo::from(&meta),
        bytes,
    }))
}

/// Every replica of `master` held here, for `StartRecovery`: stored ones and visible
/// frames (a frame shadows its stored copy, as in lists: not a closed one when the frame
/// has no footer), sorted by segment, with the log digest and the footer's successor of
/// each one that is not closed — scanned from the frame's bytes, or read from the store
/// for an open stored replica (one freed or corrupt meanwhile is dropped; one
/// unreadable for another reason is reported without its digest, and logged).
pub fn recovery_replicas<H: HeldReplicas + ?Sized>(
    held: &H,
    master: ServerId,
) -> Vec<RecoveryReplica> {
    let (stored, open) = held.with_table(|table| table.list(Some(master)));
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
    for frame in held.scan_frames(open) {
        let key = frame.frame.key();
        let scanned = scan(&frame.bytes);
        // A frame without footer beside a closed stored copy is a re-creation of the
        // closed segment's replica (the master took this backup for dead, lost the
        // replica, then picked this backup again) that the master's crash cut short.
        // Reporting it would hide the whole segment: the recovery would find only
        // copies without footer, and wait for ever or (allowing loss) replay a prefix.
        let has_footer = scanned.successor.is_some();
        if !held.with_table(|table| table.shadows_stored(key, has_footer)) {
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
        match held.read_stored(key) {
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

#[cfg(test)]
mod tests {
    //! The shared functions over a tiny backup: a real [`FrameTable`] (its listing, its
    //! visible frames, its `shadows_stored`), slots as vectors, and a store, kept slots
    //! and files that answer as each test sets them — every branch of both functions.

    use super::*;
    use crate::frame_table::FrameLimits;
    use crate::segment_store::Corruption;
    use rampart_common::ids::{Epoch, FrameHandle, SegmentId, TableId, Version};
    use rampart_common::log::SegmentWriter;
    use rampart_common::onesided::shm::SlotLabel;
    use std::cell::RefCell;
    use std::path::PathBuf;

    const M: ServerId = ServerId(1);
    const CAPACITY: u32 = 4096;

    /// How the store answers a read of a replica its index holds.
    #[derive(Clone, Debug)]
    enum StoreRead {
        Bytes(Vec<u8>),
        /// Freed between the listing and the read.
        Freed,
        /// Failed verification (quarantined).
        Corrupt,
        /// Any other error.
        Unreadable,
    }

    #[derive(Debug)]
    struct Fake {
        table: FrameTable,
        slots: Vec<Vec<u8>>,
        /// Frames that leave the table while the scan copies them.
        leaving: BTreeSet<ReplicaKey>,
        /// Replicas a free slot still keeps, with their bytes.
        kept: BTreeMap<ReplicaKey, Vec<u8>>,
        /// Replicas whose file reads back without the store's lock.
        files: BTreeMap<ReplicaKey, Vec<u8>>,
        /// The store's own reads.
        store: BTreeMap<ReplicaKey, StoreRead>,
        /// Each lookup a function made past the table: "kept", "file", "store".
        reads: RefCell<Vec<(&'static str, SegmentId)>>,
    }

    impl Fake {
        fn new() -> Fake {
            let limits = FrameLimits {
                frames_max: 8,
                frame_bytes_max: CAPACITY,
            };
            Fake {
                table: FrameTable::new(limits, 8, [], FrameHandle(1)),
                slots: vec![vec![0; CAPACITY as usize]; 8],
                leaving: BTreeSet::new(),
                kept: BTreeMap::new(),
                files: BTreeMap::new(),
                store: BTreeMap::new(),
                reads: RefCell::new(Vec::new()),
            }
        }

        /// Segment `segment` stored at `epoch` with `bytes`, its store read answering
        /// `read`; its metadata.
        fn store(
            &mut self,
            segment: u64,
            epoch: u64,
            bytes: &[u8],
            closed: bool,
            read: StoreRead,
        ) -> ReplicaMeta {
            let meta = ReplicaMeta {
                master: M,
                segment: SegmentId(segment),
                epoch: Epoch(epoch),
                length: bytes.len() as u32,
                closed,
                content_crc32: crc32fast::hash(bytes),
            };
            let key = (M, SegmentId(segment));
            self.table.set_stored(key, Some(meta));
            self.store.insert(key, read);
            meta
        }

        /// A frame of `segment` at `epoch` holding `bytes`.
        fn open(&mut self, segment: u64, epoch: u64, bytes: &[u8]) {
            let opened = self
                .table
                .open(SlotLabel {
                    master: M,
                    segment: SegmentId(segment),
                    epoch: Epoch(epoch),
                    capacity: CAPACITY,
                })
                .expect("opens");
            self.slots[opened.frame.slot][..bytes.len()].copy_from_slice(bytes);
        }

        fn reads(&self) -> Vec<(&'static str, u64)> {
            self.reads
                .borrow()
                .iter()
                .map(|(what, s)| (*what, s.0))
                .collect()
        }

        fn noted(&self, what: &'static str, key: ReplicaKey) {
            self.reads.borrow_mut().push((what, key.1));
        }
    }

    impl HeldReplicas for Fake {
        fn read_stored(
            &self,
            key: ReplicaKey,
        ) -> Result<Option<(Vec<u8>, ReplicaMeta)>, StoreError> {
            self.noted("store", key);
            let path = PathBuf::from(format!("m{}-s{}.replica", key.0, key.1));
            match self.store.get(&key) {
                None | Some(StoreRead::Freed) => Ok(None),
                Some(StoreRead::Bytes(bytes)) => Ok(Some((
                    bytes.clone(),
                    self.table.stored(key).expect("indexed"),
                ))),
                Some(StoreRead::Corrupt) => Err(StoreError::Corrupt {
                    moved_to: path.with_extension("quarantined"),
                    path,
                    reason: Corruption::NotAFile,
                }),
                Some(StoreRead::Unreadable) => Err(StoreError::Io {
                    path,
                    source: std::io::Error::other("the disk is gone"),
                }),
            }
        }

        fn read_file(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta> {
            self.noted("file", key);
            *bytes = self.files.get(&key)?.clone();
            self.table.stored(key)
        }

        fn read_kept(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta> {
            self.noted("kept", key);
            *bytes = self.kept.get(&key)?.clone();
            self.table.stored(key)
        }

        fn scan_frames(&self, frames: Vec<FrameRef>) -> Vec<HeldFrame> {
            frames
                .into_iter()
                .filter(|frame| !self.leaving.contains(&frame.key()))
                .map(|frame| {
                    let held = &self.slots[frame.slot][..frame.capacity as usize];
                    let valid = scan(held).valid_bytes as usize;
                    HeldFrame {
                        frame,
                        bytes: held[..valid].to_vec(),
                    }
                })
                .collect()
        }

        fn with_table<R>(&self, look: impl FnOnce(&FrameTable) -> R) -> R {
            look(&self.table)
        }
    }

    /// Segment `segment` of M: two sealed batches, then a footer naming `successor`
    /// if any.
    fn segment(segment: u64, successor: Option<u64>) -> Vec<u8> {
        let id = SegmentId(segment);
        let mut writer = SegmentWriter::open(M, id, CAPACITY, &[id]).expect("opens");
        for batch in 0..2 {
            writer
                .append_object(TableId(1), Version(batch + 1), b"key", &[batch as u8; 100])
                .expect("fits");
            writer.seal_batch();
        }
        if let Some(successor) = successor {
            writer.close(SegmentId(successor));
        }
        writer.bytes().to_vec()
    }

    fn info(segment: u64, epoch: u64, length: usize, closed: bool) -> ReplicaInfo {
        ReplicaInfo {
            master: M,
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
            length: length as u32,
            closed,
        }
    }

    fn read(fake: &Fake, segment: u64) -> Result<Option<HeldReplica>, StoreError> {
        read_held(fake, (M, SegmentId(segment)), Vec::new())
    }

    fn read_ok(fake: &Fake, segment: u64) -> HeldReplica {
        read(fake, segment).expect("reads").expect("held")
    }

    #[test]
    fn a_read_serves_a_frame_that_shadows_the_stored_copy_and_reads_nothing_else() {
        let mut fake = Fake::new();
        let open = segment(1, None);
        fake.open(1, 1, &open);
        let closed = segment(2, Some(3));
        fake.store(2, 1, &closed, true, StoreRead::Bytes(closed.clone()));
        // Re-created with its footer: the whole segment, at a newer epoch.
        fake.open(2, 2, &closed);
        let held = read_ok(&fake, 1);
        assert_eq!(
            (held.info, held.bytes),
            (info(1, 1, open.len(), false), open)
        );
        let held = read_ok(&fake, 2);
        assert_eq!(
            (held.info, held.bytes),
            (info(2, 2, closed.len(), false), closed)
        );
        assert_eq!(fake.reads(), vec![]);
    }

    #[test]
    fn a_read_passes_over_a_footerless_frame_beside_a_closed_copy() {
        let mut fake = Fake::new();
        let closed = segment(1, Some(2));
        fake.store(1, 1, &closed, true, StoreRead::Bytes(closed.clone()));
        fake.files.insert((M, SegmentId(1)), closed.clone());
        fake.open(1, 2, &segment(1, None));
        let held = read_ok(&fake, 1);
        assert_eq!(
            (held.info, held.bytes),
            (info(1, 1, closed.len(), true), closed)
        );
        assert_eq!(fake.reads(), vec![("kept", 1), ("file", 1)]);
    }

    #[test]
    fn a_read_of_a_frame_gone_during_its_copy_falls_back_to_the_store() {
        let mut fake = Fake::new();
        let bytes = segment(1, None);
        fake.open(1, 1, &bytes);
        fake.leaving.insert((M, SegmentId(1)));
        assert!(read(&fake, 1).expect("reads").is_none());
        assert_eq!(fake.reads(), vec![("kept", 1), ("file", 1), ("store", 1)]);
    }

    #[test]
    fn a_stored_copy_is_read_from_its_kept_slot_else_its_file_else_the_store() {
        let mut fake = Fake::new();
        let key = (M, SegmentId(1));
        let bytes = segment(1, Some(2));
        fake.store(1, 1, &bytes, true, StoreRead::Bytes(bytes.clone()));
        fake.kept.insert(key, bytes.clone());
        fake.files.insert(key, bytes.clone());
        let whole = info(1, 1, bytes.len(), true);
        assert_eq!(read_ok(&fake, 1).info, whole);
        assert_eq!(fake.reads(), vec![("kept", 1)]);
        fake.kept.clear();
        assert_eq!(read_ok(&fake, 1).info, whole);
        assert_eq!(fake.reads()[1..], [("kept", 1), ("file", 1)]);
        fake.files.clear();
        let held = read_ok(&fake, 1);
        assert_eq!((held.info, held.bytes), (whole, bytes));
        assert_eq!(fake.reads()[3..], [("kept", 1), ("file", 1), ("store", 1)]);
        fake.store.insert(key, StoreRead::Freed);
        assert!(read(&fake, 1).expect("reads").is_none());
        fake.store.insert(key, StoreRead::Corrupt);
        assert!(matches!(read(&fake, 1), Err(StoreError::Corrupt { .. })));
        fake.store.insert(key, StoreRead::Unreadable);
        assert!(matches!(read(&fake, 1), Err(StoreError::Io { .. })));
        assert!(read(&fake, 9).expect("reads").is_none(), "never held");
    }

    #[test]
    fn the_recovery_listing_reports_each_copy_as_reads_see_it_with_the_digests_of_open_ones() {
        let mut fake = Fake::new();
        let s = SegmentId;
        // 1: closed on disk, nothing read.
        let closed = segment(1, Some(2));
        fake.store(1, 1, &closed, true, StoreRead::Bytes(closed.clone()));
        // 2: open on disk (a graceful stop's flush), its digest and footer read back.
        let flushed = segment(2, Some(3));
        fake.store(2, 1, &flushed, false, StoreRead::Bytes(flushed.clone()));
        // 3, 4: open on disk, freed or corrupt by the time they are read: dropped.
        fake.store(3, 1, &flushed, false, StoreRead::Freed);
        fake.store(4, 1, &flushed, false, StoreRead::Corrupt);
        // 5: open on disk, unreadable: reported without its digest.
        fake.store(5, 1, &flushed, false, StoreRead::Unreadable);
        // 6: open on disk and in a frame at the same epoch: the frame's, not read.
        let in_frame = segment(6, None);
        fake.open(6, 1, &in_frame);
        fake.store(6, 1, &in_frame[..10], false, StoreRead::Unreadable);
        // 7: closed on disk, re-created in a frame cut short: the closed copy.
        let whole = segment(7, Some(8));
        fake.store(7, 1, &whole, true, StoreRead::Bytes(whole.clone()));
        fake.open(7, 2, &segment(7, None));
        // 8: closed on disk, re-created in a frame that reached its footer: the frame.
        let recreated = segment(8, Some(9));
        fake.store(8, 1, &recreated, true, StoreRead::Bytes(recreated.clone()));
        fake.open(8, 2, &recreated);
        // 9: a frame alone, gone during the scan: not reported.
        fake.open(9, 1, &segment(9, None));
        fake.leaving.insert((M, s(9)));
        // Another master's replica: not listed.
        fake.table.set_stored(
            (ServerId(2), s(1)),
            Some(ReplicaMeta {
                master: ServerId(2),
                ..fake.table.stored((M, s(1))).expect("stored")
            }),
        );

        let listed = recovery_replicas(&fake, M);
        let report = |info, digest: Option<u64>, successor: Option<u64>| RecoveryReplica {
            info,
            digest: digest.map(|d| vec![s(d)]),
            successor: successor.map(s),
        };
        assert_eq!(
            listed,
            vec![
                report(info(1, 1, closed.len(), true), None, None),
                report(info(2, 1, flushed.len(), false), Some(2), Some(3)),
                report(info(5, 1, flushed.len(), false), None, None),
                report(info(6, 1, in_frame.len(), false), Some(6), None),
                report(info(7, 1, whole.len(), true), None, None),
                report(info(8, 2, recreated.len(), false), Some(8), Some(9)),
            ]
        );
        assert_eq!(
            fake.reads(),
            vec![("store", 2), ("store", 3), ("store", 4), ("store", 5)]
        );
    }
}
