//! The backup's replicas as reads see them, over its frames and store: [`read_held`]
//! serves one replica for `ReadReplica` and recovery, [`recovery_replicas`] lists a
//! master's replicas for `StartRecovery`. What they serve and report is decided by the
//! shared functions of [`crate::held_replicas`] (which the simulation runs too); here is
//! only what those functions are given — [`HeldReplicas`] over [`Frames`] and
//! [`StoreHandle`]: the table's answers, each under a brief hold of its lock, the
//! frames' copies, the kept slots, the replica files read without the store's lock, and
//! the store's own reads.

use rampart_common::ids::ServerId;
use rampart_common::protocol::backup::RecoveryReplica;

use crate::frame_table::{FrameRef, FrameTable, ReplicaKey};
use crate::frames::Frames;
use crate::held_replicas::{self, HeldFrame, HeldReplicas};
use crate::recovery_reads::HeldReplica;
use crate::segment_store::{ReplicaMeta, StoreError};
use crate::stored::StoreHandle;

/// A backup's frames and store, as [`held_replicas`] reads them. Lock order as
/// everywhere: the table's lock is taken alone, briefly, never across a copy, a file
/// read or the store's lock (which [`StoreHandle::read`] takes before the table's).
struct Held<'a> {
    store: &'a StoreHandle,
    frames: &'a Frames,
}

impl HeldReplicas for Held<'_> {
    fn with_table<R>(&self, look: impl FnOnce(&FrameTable) -> R) -> R {
        look(&self.frames.table.lock())
    }

    /// [`Frames::scan`]: copies and scans outside the table's lock, then keeps the
    /// frames still in the table.
    fn scan_frames(&self, frames: Vec<FrameRef>) -> Vec<HeldFrame> {
        self.frames
            .scan(frames)
            .into_iter()
            .map(|scanned| {
                debug_assert_eq!(scanned.bytes.len(), scanned.length as usize);
                HeldFrame {
                    frame: scanned.frame,
                    bytes: scanned.bytes,
                }
            })
            .collect()
    }

    /// [`Frames::read_kept`].
    fn read_kept(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta> {
        self.frames.read_kept(key, bytes)
    }

    /// The file the table's mirror names, read without the store lock (see
    /// [`ReplicaFiles`](crate::segment_store::ReplicaFiles)).
    fn read_file(&self, key: ReplicaKey, bytes: &mut Vec<u8>) -> Option<ReplicaMeta> {
        let stored = self.frames.table.lock().stored(key)?;
        let file = self.frames.files.file(stored);
        file.read_into(bytes).then(|| file.meta())
    }

    /// [`StoreHandle::read`], under the store's lock.
    fn read_stored(&self, key: ReplicaKey) -> Result<Option<(Vec<u8>, ReplicaMeta)>, StoreError> {
        self.store.read(key)
    }
}

/// [`held_replicas::read_held`] on this backup: the replica `key` as reads see it (the
/// visible frame if it shadows the stored copy, else the stored copy from its kept
/// slot, its file or the store); `None` if not held. Blocks: copies and scans frames,
/// reads the stored copy's file (without the store lock), and takes the store lock
/// briefly, or for a whole read when the file changed meanwhile.
pub(super) fn read_held(
    store: &StoreHandle,
    frames: &Frames,
    key: ReplicaKey,
    reuse: Vec<u8>,
) -> Result<Option<HeldReplica>, StoreError> {
    held_replicas::read_held(&Held { store, frames }, key, reuse)
}

/// [`held_replicas::recovery_replicas`] on this backup: every replica of `master` held
/// here, for `StartRecovery`, with the log digest and the footer's successor of each
/// one that is not closed. Blocks: scans frames, reads stored open replicas from disk.
pub(super) fn recovery_replicas(
    store: &StoreHandle,
    frames: &Frames,
    master: ServerId,
) -> Vec<RecoveryReplica> {
    held_replicas::recovery_replicas(&Held { store, frames }, master)
}

#[cfg(test)]
mod tests {
    use super::super::config::BackupConfig;
    use super::super::state::BackupService;
    use super::super::test_support::*;
    use rampart_common::ids::{Epoch, SegmentId};
    use rampart_common::log::scan;
    use rampart_common::protocol::backup::{self as proto, RecoveryReplica};
    use rampart_common::status::Status;
    use tempfile::TempDir;

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
        // after them (docs/design.md §4, every footer needs its successor).
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
}
