//! `BackupStop`: what a storage server's graceful stop does with its backup's frames —
//! everything they hold goes to the store, and the frame file goes with the process
//! unless a cold start of the data directory would still need it.
//!
//! The frame file is the backup's non-volatile buffer and 512 MiB of memory in
//! `/dev/shm` by default (`rampart_common::onesided::shm`, "A file outlives its backup
//! only while a cold start needs it"). Left behind by every server that stops, it pins
//! that memory until the server restarts on the same data directory — for a server
//! stopped for good, until the host reboots. [`stop`] therefore removes it when it can
//! prove nothing in it is needed, and only then:
//! 1. It waits (at most [`CLOSES_DRAIN_TIMEOUT`]) for the closes in flight: each ends
//!    with its replica stored and its slot freed.
//! 2. It *seals* the file's held slots ([`SealedFrames::seal`]): from here on no write
//!    to them is acknowledged — not even a master's one-sided copy, which only checks
//!    that this process still runs — so their bytes are final.
//! 3. It writes every open frame's valid prefix to the store as an *open* replica
//!    ([`BackupService::flush_open_frames`]), at its epoch and cut at its fenced length:
//!    what a backup restarted on the file would store from it ([`rampart_backup::service`],
//!    "Frames survive a kill"), so a cold start that finds the store alone reports what
//!    it would have reported with the file.
//! 4. If every open frame was written and no close was still running, it releases the
//!    sealed slots and removes the file. Otherwise the file stays, its slots sealed and
//!    held, and the restart reads them back like any killed backup's.
//!
//! The file also stays where another server's master may write into it by RDMA (a
//! build with the `rdma` feature on a host with an RDMA device): the NIC places and
//! acknowledges those writes without looking at the owner word, so the seal does not
//! stop them, and only the frames outlive an RDMA write acknowledged after the flush.
//!
//! Call [`stop`] on a blocking thread, once the backup takes no more requests (its RPC
//! listener closed, its runtime and soft-NIC stopped): an open after the seal would
//! hand out a slot that is not sealed.

use rampart_backup::service::BackupService;
use rampart_common::onesided::shm::SealedFrames;
use std::time::{Duration, Instant};

use crate::config::FRAME_FLUSH_WINDOW;

/// How long a stopping backup waits for its closes in flight to end before it keeps its
/// frame file instead: with the default byte budget
/// (`crate::config::UNFLUSHED_BYTES_DEFAULT`), what a 128 MB/s disk writes in
/// [`FRAME_FLUSH_WINDOW`]. A larger budget on a slower disk may outlast it: the frame
/// file is then kept for the restart, nothing is lost.
pub const CLOSES_DRAIN_TIMEOUT: Duration = FRAME_FLUSH_WINDOW;

/// How often the wait for closes looks again.
const CLOSES_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// What a graceful stop did with the backup's frame file ([`stop`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackupStop {
    /// Every open frame is in the store; the file was removed.
    Removed {
        /// Open frames written to the store.
        flushed: usize,
    },
    /// The file stays for the backup restarted on the same data directory, which reads
    /// back what its held slots hold.
    Kept {
        /// Open frames written to the store.
        flushed: usize,
        /// Why the file is still needed.
        reason: String,
    },
}

/// Flushes the stopped `backup`'s frames to its store and removes its frame file if
/// nothing in it is needed any more (see the module doc). Blocks on the disk.
pub fn stop(backup: &BackupService) -> BackupStop {
    let deadline = Instant::now() + CLOSES_DRAIN_TIMEOUT;
    while backup.stats().0.frames_closing > 0 && Instant::now() < deadline {
        std::thread::sleep(CLOSES_POLL_INTERVAL);
    }
    let sealed = SealedFrames::seal(backup.frame_file_path());
    // After the seal (or its failure: then the file stays, and the flush still spares
    // the restart work).
    let (frames, _) = backup.stats();
    let flushed = backup.flush_open_frames();
    let kept = |reason: String| BackupStop::Kept { flushed, reason };
    let sealed = match sealed {
        Ok(sealed) => sealed,
        Err(error) => return kept(format!("its frames cannot be sealed: {error}")),
    };
    if frames.frames_closing > 0 {
        return kept(format!(
            "{} close(s) still writing after {CLOSES_DRAIN_TIMEOUT:?}",
            frames.frames_closing
        ));
    }
    if flushed < frames.frames_open {
        return kept(format!(
            "{} of {} open frame(s) could not be written to the store",
            frames.frames_open - flushed,
            frames.frames_open
        ));
    }
    if rampart_common::onesided::rdma::rdma_available().is_ok() {
        return kept("masters may write into it by RDMA, which a seal does not stop".into());
    }
    sealed.release();
    match sealed.remove() {
        Ok(true) => BackupStop::Removed { flushed },
        Ok(false) => kept("a slot is held by a frame the stop did not seal".into()),
        Err(error) => kept(format!("it cannot be removed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use rampart_backup::segment_store::{Disk, RealDisk};
    use rampart_backup::service::BackupConfig;
    use rampart_common::ids::{Epoch, SegmentId, ServerId, TableId, Version};
    use rampart_common::log::SegmentWriter;
    use rampart_common::onesided::shm::ShmMapping;
    use rampart_common::onesided::FrameWriteError;
    use rampart_common::protocol::backup::{
        ListReplicas, ListReplicasRequest, OpenReplica, OpenReplicaReply, OpenReplicaRequest,
        ReadReplica, ReplicaId, ReplicaInfo, WriteReplica, WriteReplicaRequest,
    };
    use rampart_common::rpc::{Rpc, Service, WireMessage};
    use rampart_common::status::Status;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    const CAPACITY: u32 = 1 << 20;

    fn config(dir: &Path) -> BackupConfig {
        BackupConfig {
            frames_max: 4,
            extra_slots: 0,
            frame_bytes_max: CAPACITY,
            frame_file: dir.join("frames"),
        }
    }

    async fn call<R: Rpc>(backup: &BackupService, request: &R::Request) -> R::Reply {
        let mut payload = BytesMut::new();
        request.encode(&mut payload);
        let reply = backup.handle(R::OPCODE, payload.freeze()).await;
        assert_eq!(
            reply.status(),
            Status::Ok,
            "{}",
            String::from_utf8_lossy(reply.payload())
        );
        R::Reply::decode(Bytes::copy_from_slice(reply.payload())).expect("reply decodes")
    }

    /// An open segment of `master` as its log writes it: the opening and two batches.
    fn open_segment(master: ServerId, segment: SegmentId) -> Vec<u8> {
        let mut writer = SegmentWriter::open(master, segment, CAPACITY, &[segment]).expect("open");
        for batch in 0..2u64 {
            for i in 0..5u64 {
                let key = format!("key-{batch}-{i}");
                writer
                    .append_object(
                        TableId(1),
                        Version(batch * 5 + i + 1),
                        key.as_bytes(),
                        &[7; 200],
                    )
                    .expect("fits");
            }
            writer.seal_batch();
        }
        let end = writer.committed_len() as usize;
        writer.bytes()[..end].to_vec()
    }

    /// Opens the replica (master 9, `segment`) at epoch 2 and writes `bytes` into it.
    async fn open_and_write(
        backup: &BackupService,
        segment: u64,
        bytes: &[u8],
    ) -> OpenReplicaReply {
        let open = OpenReplicaRequest {
            master: ServerId(9),
            segment: SegmentId(segment),
            epoch: Epoch(2),
            capacity: CAPACITY,
        };
        let reply = call::<OpenReplica>(backup, &open).await;
        let write = WriteReplicaRequest {
            handle: reply.handle,
            epoch: Epoch(2),
            offset: 0,
            bytes: bytes.to_vec().into(),
        };
        call::<WriteReplica>(backup, &write).await;
        reply
    }

    async fn listed(backup: &BackupService) -> Vec<ReplicaInfo> {
        call::<ListReplicas>(backup, &ListReplicasRequest { master: None })
            .await
            .replicas
    }

    #[tokio::test]
    async fn a_graceful_stop_stores_the_open_frames_and_removes_the_frame_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = open_segment(ServerId(9), SegmentId(1));
        let (backup, _) = BackupService::open(dir.path(), config(dir.path())).expect("open");
        open_and_write(&backup, 1, &bytes).await;
        let frame_file = backup.frame_file_path().to_path_buf();
        let before = listed(&backup).await;

        assert_eq!(stop(&backup), BackupStop::Removed { flushed: 1 });
        assert!(!frame_file.exists(), "nothing in it is needed");
        drop(backup);

        // The restart (the cold start of this directory) reports the replica as the
        // running backup did, byte for byte, with no frame file to read back.
        let (backup, report) = BackupService::open(dir.path(), config(dir.path())).expect("again");
        assert!(report.frames_read_back.is_empty());
        assert_eq!(report.frame_file_unread, None);
        assert_eq!(listed(&backup).await, before);
        let id = ReplicaId {
            master: ServerId(9),
            segment: SegmentId(1),
        };
        let read = call::<ReadReplica>(&backup, &id).await;
        assert_eq!((read.info.epoch, read.info.closed), (Epoch(2), false));
        assert!(read.bytes == bytes, "the replica differs after the stop");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_master_write_acknowledged_while_the_backup_stops_is_in_the_store() {
        // A segment of many small batches, which a master copies into its frame one
        // batch a millisecond while the backup stops.
        let mut segment = SegmentWriter::open(ServerId(9), SegmentId(1), CAPACITY, &[SegmentId(1)])
            .expect("open");
        let mut ends = vec![segment.committed_len()];
        for batch in 0..2000u64 {
            segment
                .append_object(TableId(1), Version(batch + 1), b"key", &[batch as u8; 60])
                .expect("fits");
            ends.push(segment.seal_batch());
        }
        let bytes = segment.bytes()[..*ends.last().expect("end") as usize].to_vec();
        let dir = tempfile::tempdir().expect("tempdir");
        let (backup, _) = BackupService::open(dir.path(), config(dir.path())).expect("open");
        let reply = open_and_write(&backup, 1, &bytes[..ends[0] as usize]).await;
        let shm = reply.shm.expect("an shm frame");
        let mapping = ShmMapping::open(Path::new(&shm.path)).expect("map");
        // The last batch whose write was acknowledged.
        let acked = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (acked, bytes, ends) = (Arc::clone(&acked), bytes.clone(), ends.clone());
            std::thread::spawn(move || {
                for batch in 1..ends.len() {
                    let (from, to) = (ends[batch - 1] as usize, ends[batch] as usize);
                    let at = from as u64;
                    match mapping.write(
                        shm.slot_offset,
                        shm.slot_capacity,
                        reply.handle,
                        at,
                        &bytes[from..to],
                    ) {
                        Ok(()) => acked.store(batch, Ordering::SeqCst),
                        Err(FrameWriteError::FrameGone) => return,
                        Err(error) => panic!("unexpected {error:?}"),
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        while acked.load(Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let stopped = stop(&backup);
        writer.join().expect("writer");
        let acked = acked.load(Ordering::SeqCst);
        assert_eq!(stopped, BackupStop::Removed { flushed: 1 });
        assert!(
            acked < ends.len() - 1,
            "the stop came after the whole segment: retry"
        );
        drop(backup);
        let (backup, _) = BackupService::open(dir.path(), config(dir.path())).expect("again");
        let id = ReplicaId {
            master: ServerId(9),
            segment: SegmentId(1),
        };
        let read = call::<ReadReplica>(&backup, &id).await;
        assert!(
            read.bytes.len() >= ends[acked] as usize,
            "batch {acked} was acknowledged, but the store holds {} bytes, not {}",
            read.bytes.len(),
            ends[acked]
        );
        assert!(read.bytes[..] == bytes[..read.bytes.len()]);
    }

    /// A disk whose replica writes fail once `full` is set.
    #[derive(Debug)]
    struct FillingDisk {
        full: Arc<AtomicBool>,
    }

    impl Disk for FillingDisk {
        fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
            if self.full.load(Ordering::SeqCst) {
                return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "full"));
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
    async fn a_stop_that_cannot_store_a_frame_keeps_the_file_for_the_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = open_segment(ServerId(9), SegmentId(1));
        let full = Arc::new(AtomicBool::new(false));
        let disk = Box::new(FillingDisk {
            full: Arc::clone(&full),
        });
        let (backup, _) =
            BackupService::open_with_disk(dir.path(), config(dir.path()), disk).expect("open");
        open_and_write(&backup, 1, &bytes).await;
        let frame_file = backup.frame_file_path().to_path_buf();
        full.store(true, Ordering::SeqCst);

        let stopped = stop(&backup);
        assert!(
            matches!(&stopped, BackupStop::Kept { flushed: 0, reason } if reason.contains("1 of 1")),
            "{stopped:?}"
        );
        drop(backup);
        assert!(frame_file.exists(), "the frame is only in the file");
        // The restart reads the sealed frame back.
        let (backup, report) = BackupService::open(dir.path(), config(dir.path())).expect("again");
        assert_eq!(report.frames_read_back.len(), 1, "{report:?}");
        let id = ReplicaId {
            master: ServerId(9),
            segment: SegmentId(1),
        };
        let read = call::<ReadReplica>(&backup, &id).await;
        assert!(read.bytes == bytes, "the replica differs after the restart");
    }
}
