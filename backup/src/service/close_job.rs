//! [`CloseJob`]: a `CloseReplica` on its way to the store, run on a flush thread — the
//! frame copied into the replica image the thread keeps, written and fsynced outside the
//! store lock, then committed under it — holding its claim on the frame until it ends.

use rampart_common::ids::Epoch;
use rampart_common::protocol::backup::CloseReplicaRequest;
use rampart_common::rpc::Reply;
use std::sync::Arc;

use crate::frame_table::{Closing, FrameTable, Release, ReplicaKey};
use crate::frames::Frames;
use crate::lifecycle::{self, CloseFailure, CloseTarget, FrameAccess, FreeTarget, TableAccess};
use crate::segment_store::{PreparedReplica, ReplicaImage, ReplicaMeta, ReplicaWriter, StoreError};
use crate::stored::StoreHandle;

use super::replies::refused;

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
/// the runtime shut down) ends its claim on the frame
/// ([`FrameTable::close_ended`](crate::frame_table::FrameTable::close_ended)): the
/// frame takes writes again if it is still open, and its slot is released if it left
/// the table meanwhile.
pub(super) struct CloseJob {
    frames: Arc<Frames>,
    closing: Closing,
}

impl CloseJob {
    /// Starts closing the frame `request` names: from now until the job drops, the
    /// frame refuses writes and its slot stays pinned.
    pub(super) fn claim(
        frames: &Arc<Frames>,
        request: &CloseReplicaRequest,
    ) -> Result<CloseJob, Reply> {
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

    /// Writes the replica and commits it ([`lifecycle::run_close`]): its bytes and
    /// their fsync outside the store lock ([`ReplicaWriter::prepare`]), then, under it,
    /// the commit ([`StoreHandle::commit_close`]). The slot cannot be released while
    /// this job lives, so the copy reads this frame.
    pub(super) fn run(
        self,
        store: &StoreHandle,
        writer: &ReplicaWriter,
    ) -> Result<ReplicaMeta, CloseFailure> {
        let mut target = LiveReplicas {
            frames: &self.frames,
            store,
            writer,
        };
        lifecycle::run_close(&mut target, &self.closing)
    }
}

impl Drop for CloseJob {
    fn drop(&mut self) {
        lifecycle::end_close(&mut &*self.frames, self.closing.handle);
    }
}

/// The backup's frames, store and replica writer, as [`lifecycle`]'s closes (on a flush
/// thread) and frees (on a blocking thread) see them.
pub(super) struct LiveReplicas<'a> {
    pub frames: &'a Frames,
    pub store: &'a StoreHandle,
    pub writer: &'a ReplicaWriter,
}

impl TableAccess for LiveReplicas<'_> {
    fn with_table<R>(&mut self, act: impl FnOnce(&mut FrameTable) -> R) -> R {
        act(&mut self.frames.table.lock())
    }
}

impl FrameAccess for LiveReplicas<'_> {
    fn release(&mut self, release: Release) {
        self.frames.release(release);
    }
}

impl FreeTarget for LiveReplicas<'_> {
    /// [`StoreHandle::free`]: under the store's lock, mirrored.
    fn free_stored(&mut self, key: ReplicaKey, epoch_max: Epoch) -> Result<bool, StoreError> {
        self.store.free(key, epoch_max)
    }
}

impl CloseTarget for LiveReplicas<'_> {
    type Prepared = PreparedReplica;

    /// Copies the frame into this thread's replica image and writes it
    /// ([`ReplicaWriter::prepare_image`]).
    fn prepare(&mut self, closing: &Closing) -> Result<PreparedReplica, StoreError> {
        let (master, segment) = closing.key;
        let capacity = self.frames.file.slot_capacity() as usize;
        let length = (closing.length as usize).min(capacity);
        CLOSE_IMAGE.with_borrow_mut(|image| {
            let content = image.content_mut(length, capacity);
            self.frames.file.read_to(closing.slot, content);
            self.writer
                .prepare_image(master, segment, closing.epoch, true, image)
        })
    }

    fn commit(
        &mut self,
        closing: &Closing,
        prepared: PreparedReplica,
    ) -> Result<ReplicaMeta, CloseFailure> {
        self.store
            .commit_close(closing.handle, closing.key, prepared)
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::BackupService;
    use super::super::test_support::*;
    use super::*;
    use crate::lifecycle::CloseFailure;
    use crate::segment_store::{Disk, RealDisk};
    use rampart_common::ids::Epoch;
    use rampart_common::protocol::backup::{self as proto, ReplicaInfo};
    use rampart_common::status::Status;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;
    use tempfile::TempDir;

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
}
