//! `RdmaLink`: a master's RDMA connection to one backup, the `rdma` transport of
//! DESIGN.md §5 "One-sided writes" (verbs in `rampart_common::onesided::rdma`).
//!
//! [`RdmaLink::connect`] creates an RC queue pair on this host's RDMA device, sends its
//! endpoint in an `RdmaConnect` RPC, and connects to the backup's queue pair from the
//! reply, which also names the backup's frame file as a remote-writable region
//! (address, length, rkey). [`RdmaLink::write`] then places bytes into a frame — found
//! by the `slot_offset` of its `OpenReplica` reply, as `shm` does — with RDMA WRITEs
//! that the backup's CPU never sees. One link serves every frame of this master on that
//! backup; the replicator keeps one per backup. It hides the queue pair, the blocking
//! verbs calls and the fence probe.
//!
//! # Write ordering (Tailwind)
//! A write sends all but its last
//! [`TAIL_BYTES`](rampart_common::onesided::TAIL_BYTES) as one RDMA WRITE, waits for the NIC's
//! acknowledgement, then sends the tail as a second one: a scan that sees a batch's
//! `Checksum` entry sees the entries before it (`common::onesided::rdma`, "Write
//! ordering").
//!
//! # Failure handling
//! * Any verbs failure (a failed or missing completion) leaves the queue pair in error:
//!   the link is *broken* and every later write fails at once, without touching the
//!   NIC. Connect a new link.
//! * The NIC cannot say *why* a write failed: a backup fences a frame by revoking this
//!   master's key, which fails the write exactly as a dead backup or a broken fabric
//!   would. So after a failed write, [`RdmaLink::write`] asks the backup with an empty
//!   `WriteReplica` (frame handle and epoch, same offset; no bytes move): `Fenced` →
//!   [`FrameWriteError::Fenced`] (never acknowledge; the backup marks frames fenced
//!   before it revokes the key), `UnknownFrame` → [`FrameWriteError::FrameGone`],
//!   anything else → [`FrameWriteError::Transport`] with both answers. The bytes of a
//!   failed write may or may not have landed.
//! * Without the cargo feature `rdma`, or without an RDMA device on this host,
//!   [`RdmaLink::connect`] fails with the plain reason of
//!   [`rdma_available`](rampart_common::onesided::rdma::rdma_available), and no
//!   `RdmaLink` can exist.
//!
//! # Concurrency
//! `RdmaLink` is `Send + Sync`; writes through one link are serialized (one RDMA WRITE
//! in flight per queue pair) and run on tokio's blocking pool, since the verbs layer
//! busy-polls for completions (a few µs per write on a real NIC; ≈ 100 µs per MiB at
//! 100 Gb/s). The RDMA device is opened once per process and shared by every link.

use bytes::Bytes;
use rampart_common::ids::{Epoch, FrameHandle};
use rampart_common::onesided::shm::SLOT_HEADER_BYTES;
use rampart_common::onesided::FrameWriteError;
use rampart_common::protocol::backup::{WriteReplica, WriteReplicaRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::status::Status;
use std::time::Duration;
use tokio::time::Instant;

pub use link::RdmaLink;

/// Deadline of the fence probe after a failed write. A live backup answers an empty
/// `WriteReplica` in well under a millisecond; one that does not answer within this is
/// reported unreachable (`Transport`), as the replicator's own probes do.
pub const FENCE_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The frame an [`RdmaLink::write`] targets, from its `OpenReplica` reply and the
/// replica's current epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaFrame {
    /// The frame's handle (for the fence probe).
    pub handle: FrameHandle,
    /// The replica's epoch at the backup (for the fence probe).
    pub epoch: Epoch,
    /// Byte offset of the frame's slot header in the backup's frame file
    /// (`ShmFrame::slot_offset`); its data starts [`SLOT_HEADER_BYTES`] later.
    pub slot_offset: u64,
    /// Bytes of data the frame holds (`ShmFrame::slot_capacity`).
    pub slot_capacity: u32,
}

// The replicator shares links between concurrent writes.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<RdmaLink>();
};

/// The remote address of a write of `len` bytes at `offset` into `frame`, inside a
/// region of `region_bytes` bytes at `region_addr` that maps the backup's frame file.
/// A slot that does not lie inside the region has no reachable bytes: reported, as by
/// `shm`, as a capacity of 0.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
fn remote_address(
    region_addr: u64,
    region_bytes: u64,
    frame: &RdmaFrame,
    offset: u64,
    len: u64,
) -> Result<u64, FrameWriteError> {
    let capacity = u64::from(frame.slot_capacity);
    let out_of_bounds = |capacity| FrameWriteError::OutOfBounds {
        offset,
        len,
        capacity,
    };
    let data_start = frame
        .slot_offset
        .checked_add(SLOT_HEADER_BYTES)
        .filter(|start| {
            start
                .checked_add(capacity)
                .is_some_and(|end| end <= region_bytes)
        })
        .ok_or_else(|| out_of_bounds(0))?;
    if offset.checked_add(len).map_or(true, |end| end > capacity) {
        return Err(out_of_bounds(capacity));
    }
    // A region whose end wraps the address space was never registered: refuse the
    // reply's nonsense the same way. Otherwise the sum stays inside the region.
    if region_addr.checked_add(region_bytes).is_none() {
        return Err(out_of_bounds(0));
    }
    Ok(region_addr + data_start + offset)
}

/// After the RDMA write to `frame` at `offset` failed with `failure`: asks the backup at
/// `backup_addr` whether the frame is fenced or gone (module doc, "Failure handling").
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
async fn fence_probe(
    pool: &RpcPool,
    backup_addr: &str,
    frame: &RdmaFrame,
    offset: u64,
    failure: String,
) -> FrameWriteError {
    let Ok(offset) = u32::try_from(offset) else {
        // Unreachable after the bounds check (capacities are u32); say what failed.
        return FrameWriteError::Transport(failure);
    };
    let request = WriteReplicaRequest {
        handle: frame.handle,
        epoch: frame.epoch,
        offset,
        bytes: Bytes::new(),
    };
    let deadline = Instant::now() + FENCE_PROBE_TIMEOUT;
    match pool
        .call::<WriteReplica>(backup_addr, &request, deadline)
        .await
    {
        Err(error) if error.status() == Some(Status::Fenced) => FrameWriteError::Fenced,
        Err(error) if error.status() == Some(Status::UnknownFrame) => FrameWriteError::FrameGone,
        Ok(()) => FrameWriteError::Transport(format!(
            "{failure} (frame {} on {backup_addr} is neither fenced nor gone)",
            frame.handle
        )),
        Err(error) => {
            FrameWriteError::Transport(format!("{failure} (and the fence probe failed: {error})"))
        }
    }
}

#[cfg(feature = "rdma")]
mod link {
    use super::{fence_probe, remote_address, RdmaFrame};
    use bytes::Bytes;
    use parking_lot::Mutex;
    use rampart_common::ids::ServerId;
    use rampart_common::onesided::rdma::{RdmaDevice, RdmaError, RdmaQueuePair};
    use rampart_common::onesided::{FrameWriteError, TAIL_BYTES};
    use rampart_common::protocol::backup::{RdmaConnect, RdmaConnectRequest};
    use rampart_common::rpc::{RpcError, RpcPool};
    use rampart_common::status::Status;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::time::Instant;

    /// This process's RDMA device, opened by the first connect that succeeds in opening
    /// it and kept for the life of the process (its protection domain is shared by
    /// every queue pair). A failed open is not remembered.
    static DEVICE: Mutex<Option<RdmaDevice>> = parking_lot::const_mutex(None);

    fn device() -> Result<RdmaDevice, String> {
        let mut device = DEVICE.lock();
        if let Some(device) = &*device {
            return Ok(device.clone());
        }
        // The text of `rdma_available` where there is no device.
        let opened = RdmaDevice::open(None).map_err(|error| error.to_string())?;
        tracing::info!(device = opened.name(), "RDMA device opened");
        *device = Some(opened.clone());
        Ok(opened)
    }

    /// A master's RDMA connection to one backup. See the module doc.
    #[derive(Debug)]
    pub struct RdmaLink {
        backup_addr: String,
        /// The connected queue pair; locked by the blocking task of one write at a time.
        queue_pair: Arc<Mutex<RdmaQueuePair>>,
        /// The backup's frame file as registered for this master: start, length, key.
        region_addr: u64,
        region_bytes: u64,
        rkey: u32,
        /// Set after the first failed write; never cleared (the queue pair is in error).
        broken: AtomicBool,
    }

    impl RdmaLink {
        /// Connects to the backup at `backup_addr` for `master`: a queue pair on this
        /// host's RDMA device, the `RdmaConnect` RPC (answered by `deadline`), then the
        /// queue pair connected to the backup's. Fails with the plain reason where this
        /// host has no usable device, or where the backup has none.
        pub async fn connect(
            pool: &RpcPool,
            backup_addr: &str,
            master: ServerId,
            deadline: Instant,
        ) -> Result<RdmaLink, String> {
            let joined =
                |error: tokio::task::JoinError| format!("RDMA set-up task failed: {error}");
            let queue_pair = tokio::task::spawn_blocking(|| {
                device()?
                    .create_queue_pair()
                    .map_err(|error| error.to_string())
            })
            .await
            .map_err(joined)??;
            let request = RdmaConnectRequest {
                master,
                endpoint: queue_pair.local_endpoint(),
            };
            let reply = pool
                .call::<RdmaConnect>(backup_addr, &request, deadline)
                .await
                .map_err(|error| match error {
                    RpcError::Status {
                        status: Status::InvalidArgument,
                        detail,
                        ..
                    } => format!("backup {backup_addr} cannot take RDMA writes: {detail}"),
                    error => format!("RdmaConnect to {backup_addr} failed: {error}"),
                })?;
            let queue_pair = tokio::task::spawn_blocking(move || {
                let mut queue_pair = queue_pair;
                queue_pair
                    .connect(&reply.endpoint)
                    .map(|()| queue_pair)
                    .map_err(|error| error.to_string())
            })
            .await
            .map_err(joined)??;
            tracing::debug!(
                backup = backup_addr,
                region_bytes = reply.region_bytes,
                "RDMA link connected"
            );
            Ok(RdmaLink {
                backup_addr: backup_addr.to_string(),
                queue_pair: Arc::new(Mutex::new(queue_pair)),
                region_addr: reply.region_addr,
                region_bytes: reply.region_bytes,
                rkey: reply.rkey,
                broken: AtomicBool::new(false),
            })
        }

        /// Whether a write failed on this link: every later write fails at once, so the
        /// caller should connect a new link before using this backup again.
        pub fn is_broken(&self) -> bool {
            self.broken.load(Ordering::Acquire)
        }

        /// Writes `bytes` at `offset` of `frame`: the body, then the last
        /// [`TAIL_BYTES`] as a second RDMA WRITE, each acknowledged by the backup's NIC
        /// before this goes on. `Ok` means the bytes are in the backup's frame and may
        /// be acknowledged; an empty write moves nothing and is `Ok` at once. Past the
        /// frame's end: [`FrameWriteError::OutOfBounds`]. A failure breaks the link and
        /// is reported as the fence probe classifies it (module doc); `pool` carries
        /// that probe.
        pub async fn write(
            &self,
            pool: &RpcPool,
            frame: &RdmaFrame,
            offset: u64,
            bytes: Bytes,
        ) -> Result<(), FrameWriteError> {
            let remote = remote_address(
                self.region_addr,
                self.region_bytes,
                frame,
                offset,
                bytes.len() as u64,
            )?;
            if bytes.is_empty() {
                return Ok(());
            }
            let failure = if self.is_broken() {
                format!(
                    "RDMA link to {} is broken by an earlier failure",
                    self.backup_addr
                )
            } else {
                let (queue_pair, rkey) = (Arc::clone(&self.queue_pair), self.rkey);
                let written = tokio::task::spawn_blocking(move || {
                    write_body_then_tail(&mut queue_pair.lock(), &bytes, remote, rkey)
                })
                .await;
                let failure = match written {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(error)) => format!("RDMA write to {}: {error}", self.backup_addr),
                    Err(error) => format!("RDMA write task failed: {error}"),
                };
                self.broken.store(true, Ordering::Release);
                failure
            };
            Err(fence_probe(pool, &self.backup_addr, frame, offset, failure).await)
        }
    }

    /// Tailwind's two writes, body then tail, through one queue pair.
    fn write_body_then_tail(
        queue_pair: &mut RdmaQueuePair,
        bytes: &[u8],
        remote: u64,
        rkey: u32,
    ) -> Result<(), RdmaError> {
        let split = bytes.len().saturating_sub(TAIL_BYTES);
        let (body, tail) = bytes.split_at(split);
        if !body.is_empty() {
            queue_pair.write(body, remote, rkey)?;
        }
        // `remote + len` was checked not to wrap (`remote_address`).
        queue_pair.write(tail, remote + split as u64, rkey)
    }
}

#[cfg(not(feature = "rdma"))]
mod link {
    use super::RdmaFrame;
    use bytes::Bytes;
    use rampart_common::ids::ServerId;
    use rampart_common::onesided::rdma::NO_FEATURE_MESSAGE;
    use rampart_common::onesided::FrameWriteError;
    use rampart_common::rpc::RpcPool;
    use std::convert::Infallible;
    use tokio::time::Instant;

    /// A master's RDMA connection to one backup. This build has no `rdma` feature, so
    /// none can exist: [`RdmaLink::connect`] always fails with the plain reason.
    #[derive(Debug)]
    pub struct RdmaLink {
        never: Infallible,
    }

    impl RdmaLink {
        /// Fails: this build has no RDMA support (the text of `rdma_available`).
        pub async fn connect(
            _pool: &RpcPool,
            _backup_addr: &str,
            _master: ServerId,
            _deadline: Instant,
        ) -> Result<RdmaLink, String> {
            Err(NO_FEATURE_MESSAGE.to_string())
        }

        /// Cannot be called: no `RdmaLink` exists in this build.
        pub fn is_broken(&self) -> bool {
            match self.never {}
        }

        /// Cannot be called: no `RdmaLink` exists in this build.
        pub async fn write(
            &self,
            _pool: &RpcPool,
            _frame: &RdmaFrame,
            _offset: u64,
            _bytes: Bytes,
        ) -> Result<(), FrameWriteError> {
            match self.never {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_backup::service::{BackupConfig, BackupService};
    use rampart_common::ids::{SegmentId, ServerId};
    use rampart_common::protocol::backup::{
        FreeReplica, FreeReplicaRequest, OpenReplica, OpenReplicaRequest,
    };
    use rampart_common::rpc::RpcServer;
    use std::sync::Arc;
    use tempfile::TempDir;
    use tokio::net::TcpListener;
    use tokio::sync::oneshot;

    const MASTER: ServerId = ServerId(9);
    const CAPACITY: u32 = 64 * 1024;

    struct Backup {
        service: Arc<BackupService>,
        addr: String,
        stop: Option<oneshot::Sender<()>>,
        _dir: TempDir,
    }

    async fn start_backup() -> Backup {
        let dir = TempDir::new().expect("tempdir");
        let config = BackupConfig {
            frames_max: 2,
            extra_slots: 0,
            frame_bytes_max: CAPACITY,
            frame_file: dir.path().join("frames"),
        };
        let (service, _) = BackupService::open(&dir.path().join("store"), config).expect("open");
        let service = Arc::new(service);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(RpcServer::run(listener, Arc::clone(&service), async move {
            let _ = stopped.await;
        }));
        Backup {
            service,
            addr,
            stop: Some(stop),
            _dir: dir,
        }
    }

    fn host_has_rdma_device() -> bool {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut entries| entries.next().is_some())
    }

    #[tokio::test]
    async fn connect_without_rdma_fails_with_the_plain_reason() {
        if cfg!(feature = "rdma") && host_has_rdma_device() {
            eprintln!("skipped: this host has an RDMA device");
            return;
        }
        let backup = start_backup().await;
        let pool = RpcPool::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        let reason = rampart_common::onesided::rdma::rdma_available()
            .expect_err("no RDMA in this build or on this host");
        let result = RdmaLink::connect(&pool, &backup.addr, MASTER, deadline).await;
        assert_eq!(result.map(|_| ()), Err(reason));
    }

    #[tokio::test]
    async fn fence_probe_tells_a_fenced_frame_from_a_gone_one_and_a_dead_backup() {
        let mut backup = start_backup().await;
        let pool = RpcPool::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        let open = OpenReplicaRequest {
            master: MASTER,
            segment: SegmentId(1),
            epoch: Epoch(1),
            capacity: CAPACITY,
        };
        let reply = pool
            .call::<OpenReplica>(&backup.addr, &open, deadline)
            .await
            .expect("open");
        let shm = reply.shm.expect("frame location");
        let frame = RdmaFrame {
            handle: reply.handle,
            epoch: Epoch(1),
            slot_offset: shm.slot_offset,
            slot_capacity: shm.slot_capacity,
        };
        let probe = |offset| fence_probe(&pool, &backup.addr, &frame, offset, "boom".into());

        let open_frame = probe(100).await;
        assert!(
            matches!(&open_frame, FrameWriteError::Transport(text)
                if text.starts_with("boom") && text.contains("neither fenced nor gone")),
            "{open_frame:?}"
        );
        backup.service.fence_master(MASTER);
        assert!(matches!(probe(100).await, FrameWriteError::Fenced));
        assert!(matches!(
            probe(u64::from(CAPACITY)).await,
            FrameWriteError::Fenced
        ));
        let id = FreeReplicaRequest {
            master: MASTER,
            segment: SegmentId(1),
            epoch_max: Epoch::MAX,
        };
        pool.call::<FreeReplica>(&backup.addr, &id, deadline)
            .await
            .expect("free");
        // Freed, a fenced frame stays fenced: its master is being recovered.
        assert!(matches!(probe(100).await, FrameWriteError::Fenced));
        // A frame of another master, freed without a fence, is merely gone.
        let other = OpenReplicaRequest {
            master: ServerId(MASTER.0 + 1),
            ..open
        };
        let reply = pool
            .call::<OpenReplica>(&backup.addr, &other, deadline)
            .await
            .expect("open");
        let gone = RdmaFrame {
            handle: reply.handle,
            ..frame
        };
        let id = FreeReplicaRequest {
            master: other.master,
            ..id
        };
        pool.call::<FreeReplica>(&backup.addr, &id, deadline)
            .await
            .expect("free");
        let probed = fence_probe(&pool, &backup.addr, &gone, 100, "boom".into()).await;
        assert!(matches!(probed, FrameWriteError::FrameGone), "{probed:?}");

        if let Some(stop) = backup.stop.take() {
            let _ = stop.send(());
        }
        let dead = fence_probe(&RpcPool::new(), &backup.addr, &frame, 0, "boom".into()).await;
        assert!(
            matches!(&dead, FrameWriteError::Transport(text)
                if text.starts_with("boom (and the fence probe failed")),
            "{dead:?}"
        );
    }

    #[test]
    fn remote_address_keeps_writes_inside_the_frame_and_the_region() {
        let frame = RdmaFrame {
            handle: FrameHandle(1),
            epoch: Epoch(1),
            slot_offset: 4096,
            slot_capacity: 1000,
        };
        let base = 0x10_0000;
        let data = base + 4096 + SLOT_HEADER_BYTES;
        let region = 4096 + SLOT_HEADER_BYTES + 1000;
        assert_eq!(remote_address(base, region, &frame, 0, 10).ok(), Some(data));
        assert_eq!(
            remote_address(base, region, &frame, 990, 10).ok(),
            Some(data + 990)
        );
        assert_eq!(
            remote_address(base, region, &frame, 1000, 0).ok(),
            Some(data + 1000)
        );
        let capacity_of = |result: Result<u64, FrameWriteError>| match result {
            Err(FrameWriteError::OutOfBounds { capacity, .. }) => Some(capacity),
            _ => None,
        };
        // Past the frame's end.
        assert_eq!(
            capacity_of(remote_address(base, region, &frame, 991, 10)),
            Some(1000)
        );
        assert_eq!(
            capacity_of(remote_address(base, region, &frame, u64::MAX, 2)),
            Some(1000)
        );
        // A slot that does not lie inside the region.
        assert_eq!(
            capacity_of(remote_address(base, region - 1, &frame, 0, 1)),
            Some(0)
        );
        let far = RdmaFrame {
            slot_offset: u64::MAX - 10,
            ..frame
        };
        assert_eq!(
            capacity_of(remote_address(base, u64::MAX, &far, 0, 1)),
            Some(0)
        );
        // A region whose end would wrap the address space.
        assert_eq!(
            capacity_of(remote_address(u64::MAX - 100, region, &frame, 0, 1)),
            Some(0)
        );
    }
}
