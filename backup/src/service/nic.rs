//! [`BackupNic`]: the backup's side of the soft-NIC (the `tcp` transport), and where
//! `OpenReplica` replies say it listens. Its tests cover the `shm` transport too: the
//! one-sided writes of masters, which the backup's CPU does not see.

use rampart_common::ids::{Epoch, FrameHandle};
use rampart_common::onesided::nic::NicTarget;
use rampart_common::status::Status;
use std::sync::Arc;

use crate::frames::Frames;

use super::state::BackupService;

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
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use rampart_common::ids::{Epoch, FrameHandle, ServerId};
    use rampart_common::onesided::nic::{self, NicClient};
    use rampart_common::onesided::shm::ShmMapping;
    use rampart_common::onesided::FrameWriteError;
    use rampart_common::protocol::backup as proto;
    use rampart_common::status::Status;
    use std::path::Path;
    use tempfile::TempDir;

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
}
