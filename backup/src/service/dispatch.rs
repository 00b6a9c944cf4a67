//! The dispatch: the backup's table of handlers ([`Router`]), each RPC routed to its
//! handler, and the `Service` impl that sends every request through it. Open, write and
//! bump epoch are answered from memory on the connection task (`handle_now`, their
//! handlers below); the other requests go to the handlers of `replica_rpcs.rs` and
//! `recovery_rpcs.rs`, which decode their payloads themselves and run their slow parts
//! on blocking threads. An opcode routed nowhere is answered `UnknownOpcode` ("backup
//! does not serve opcode N").

use bytes::Bytes;
use rampart_common::protocol::backup::{
    BumpEpoch, BumpEpochRequest, CloseReplica, EndRecovery, FreeReplica, ListReplicas, OpenReplica,
    OpenReplicaReply, OpenReplicaRequest, RdmaConnect, ReadReplica, RecoveryData, RecoveryRead,
    StartRecovery, WriteReplica, WriteReplicaRequest,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, RouteFuture, Router, Service};
use std::future::Future;
use std::sync::LazyLock;

use super::replies::refused;
use super::state::BackupService;

/// Built once, on the first request.
static ROUTER: LazyLock<Router<BackupService>> = LazyLock::new(router);

/// Every RPC the backup serves.
fn router() -> Router<BackupService> {
    Router::<BackupService>::new("backup")
        // Answered from memory, on the connection's task.
        .route_now::<OpenReplica>(BackupService::open_replica)
        .route_now::<WriteReplica>(BackupService::write_replica)
        .route_now::<BumpEpoch>(BackupService::bump_epoch)
        // replica_rpcs.rs
        .route_payload::<CloseReplica>(|service, payload| answer(service.close(payload)))
        .route_payload::<FreeReplica>(|service, payload| answer(service.free(payload)))
        .route_payload::<ListReplicas>(|service, payload| answer(service.list(payload)))
        .route_payload::<ReadReplica>(|service, payload| answer(service.read(payload)))
        .route_payload::<RdmaConnect>(|service, payload| answer(service.rdma_connect(payload)))
        // recovery_rpcs.rs
        .route_payload::<StartRecovery>(|service, payload| answer(service.start_recovery(payload)))
        .route_payload::<RecoveryRead>(|service, payload| answer(service.recovery_read(payload)))
        .route_payload::<RecoveryData>(|service, payload| answer(service.recovery_data(payload)))
        .route_payload::<EndRecovery>(|service, payload| answer(service.end_recovery(payload)))
}

/// A handler's answer, error or not, as the reply.
fn answer<'a>(
    handled: impl Future<Output = Result<Reply, Reply>> + Send + 'a,
) -> RouteFuture<'a, Reply> {
    Box::pin(async move { handled.await.unwrap_or_else(|error| error) })
}

impl BackupService {
    /// `OpenReplica`, answered from memory.
    fn open_replica(&self, request: OpenReplicaRequest) -> Result<OpenReplicaReply, Reply> {
        self.frames
            .open(
                request.master,
                request.segment,
                request.epoch,
                request.capacity,
            )
            .map_err(refused)
    }

    /// `WriteReplica`, answered from memory.
    fn write_replica(&self, request: WriteReplicaRequest) -> Result<(), Reply> {
        self.frames
            .write(
                request.handle,
                request.epoch,
                u64::from(request.offset),
                &request.bytes,
            )
            .map_err(refused)
    }

    /// `BumpEpoch`, answered from memory.
    fn bump_epoch(&self, request: BumpEpochRequest) -> Result<(), Reply> {
        self.frames
            .bump_epoch(request.handle, request.epoch, request.new_epoch)
            .map_err(refused)
    }
}

impl Service for BackupService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        ROUTER.handle(self, opcode, payload)
    }

    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        ROUTER.handle_now(self, opcode, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use bytes::Bytes;
    use rampart_common::ids::{FrameHandle, SegmentId, ServerId};
    use rampart_common::onesided::shm::SLOT_HEADER_BYTES;
    use rampart_common::protocol::backup as proto;
    use rampart_common::rpc::{Opcode, Rpc, Service};
    use rampart_common::status::Status;
    use tempfile::TempDir;

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

    #[test]
    fn every_backup_rpc_is_routed_and_only_open_write_and_bump_answer_now() {
        let router = super::router();
        let routed: Vec<u16> = router.opcodes().map(|opcode| opcode.0).collect();
        let expected: Vec<u16> = (200..300)
            .filter(|&code| rampart_common::protocol::opcode_name(Opcode(code)).is_some())
            .collect();
        assert_eq!(routed, expected);
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        for opcode in router.opcodes() {
            let now = [
                proto::OpenReplica::OPCODE,
                proto::WriteReplica::OPCODE,
                proto::BumpEpoch::OPCODE,
            ]
            .contains(&opcode);
            assert_eq!(
                router.handle_now(&service, opcode, &Bytes::new()).is_some(),
                now,
                "{opcode}"
            );
        }
    }
}
