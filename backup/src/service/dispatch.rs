//! The dispatch: each request decoded and handed to its handler (the `Service` impl).
//! Open, write and bump epoch are answered from memory on the connection task
//! (`handle_now`); the other requests go to the handlers of `replica_rpcs.rs` and
//! `recovery_rpcs.rs`, which run their slow parts on blocking threads.

use bytes::Bytes;
use rampart_common::protocol::backup::{
    self as proto, BumpEpochRequest, OpenReplicaRequest, WriteReplicaRequest,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, Service};
use rampart_common::status::Status;

use super::replies::refused;
use super::state::BackupService;

impl BackupService {
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
    use super::super::test_support::*;
    use super::*;
    use bytes::Bytes;
    use rampart_common::ids::{FrameHandle, SegmentId, ServerId};
    use rampart_common::onesided::shm::SLOT_HEADER_BYTES;
    use rampart_common::protocol::backup as proto;
    use rampart_common::rpc::{Opcode, Service};
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
}
