//! The handlers of a replica's RPCs once its frame is open: `CloseReplica` (a
//! [`CloseJob`] on a flush thread), `FreeReplica`, `ListReplicas`, `ReadReplica`; and
//! `RdmaConnect`, which sets up the `rdma` transport for a master.

use bytes::Bytes;
use rampart_common::protocol::backup::{
    CloseReplicaRequest, FreeReplicaReply, FreeReplicaRequest, ListReplicasReply,
    ListReplicasRequest, RdmaConnectRequest, ReadReplicaReply, ReplicaId, ReplicaInfo,
};
use rampart_common::rpc::Reply;
use rampart_common::status::Status;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::frame_table::ReplicaKey;
use crate::lifecycle::{self, CloseFailure};

use super::close_job::{CloseJob, LiveReplicas};
use super::held::read_held;
use super::replies::{blocking, not_held, store_error_reply};
use super::state::BackupService;

impl BackupService {
    pub(super) async fn close(&self, payload: Bytes) -> Result<Reply, Reply> {
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
    pub(super) async fn rdma_connect(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: RdmaConnectRequest = Reply::decode(payload)?;
        let rdma = Arc::clone(&self.rdma);
        let reply = blocking(move || rdma.connect(&request)).await??;
        Ok(Reply::ok(&reply))
    }

    pub(super) async fn free(&self, payload: Bytes) -> Result<Reply, Reply> {
        let id: FreeReplicaRequest = Reply::decode(payload)?;
        let key = (id.master, id.segment);
        let epoch_max = id.epoch_max;
        // `lifecycle::free`: the frame goes first, so that a close in flight finds it
        // gone (docs/design.md §5, "Concurrency": close racing free); copies newer than
        // `epoch_max` stay (a replacement placed after the free was decided).
        let (store, frames) = (Arc::clone(&self.store), Arc::clone(&self.frames));
        let writer = self.writer.clone();
        let freed = blocking(move || {
            let mut target = LiveReplicas {
                frames: &frames,
                store: &store,
                writer: &writer,
            };
            lifecycle::free(&mut target, key, epoch_max)
        })
        .await?
        .map_err(store_error_reply)?;
        tracing::debug!(master = %id.master, segment = %id.segment, frame_freed = freed.frame, stored_freed = freed.stored, "replica freed");
        Ok(Reply::ok(&FreeReplicaReply {
            freed: freed.frame || freed.stored,
        }))
    }

    pub(super) async fn list(&self, payload: Bytes) -> Result<Reply, Reply> {
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

    pub(super) async fn read(&self, payload: Bytes) -> Result<Reply, Reply> {
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
}

#[cfg(test)]
mod tests {
    use super::super::config::BackupConfig;
    use super::super::state::BackupService;
    use super::super::test_support::*;
    use rampart_common::ids::{SegmentId, ServerId};
    use rampart_common::protocol::backup::{self as proto, OpenReplicaRequest};
    use rampart_common::status::Status;
    use tempfile::TempDir;

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
}
