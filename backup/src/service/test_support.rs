//! Helpers of the tests beside this module's files: a service on a temporary directory,
//! its RPCs called as the RPC server would call them, segments as masters write them
//! (and ones for recovery, split into two partitions), and a disk that fills up.

use bytes::{Bytes, BytesMut};
use rampart_common::ids::{key_hash, Epoch, FrameHandle, SegmentId, ServerId, TableId, Version};
use rampart_common::log::{decode_entry, Entry, SegmentWriter};
use rampart_common::protocol::backup::{
    self as proto, BumpEpochRequest, CloseReplicaRequest, EndRecoveryRequest, FreeReplicaRequest,
    ListReplicasRequest, OpenReplicaReply, OpenReplicaRequest, PartitionRanges, ReadReplicaReply,
    RecoveryDataReply, RecoveryDataRequest, RecoveryReadRequest, RecoveryReplica, ReplicaId,
    ReplicaInfo, StartRecoveryRequest, WriteReplicaRequest,
};
use rampart_common::rpc::{Rpc, Service, WireMessage};
use rampart_common::status::Status;
use rampart_common::tablet::HashRange;
use std::path::Path;
use std::sync::Arc;
use tempfile::TempDir;

use crate::segment_store::{Disk, RealDisk, StoreError};
use rampart_common::onesided::shm::RegionReader;

use super::config::BackupConfig;
use super::state::BackupService;

pub(super) const CAPACITY: u32 = 64 * 1024;

pub(super) fn config(dir: &TempDir, frames_max: usize) -> BackupConfig {
    BackupConfig {
        frames_max,
        extra_slots: 0,
        frame_bytes_max: CAPACITY,
        frame_file: dir.path().join("frames"),
    }
}

/// Opens the service on `dir`. A service just dropped may still be finishing a
/// blocking task (a recovery read, a close) that holds its store's or its frame
/// file's lock for a moment: "in use" is retried for a few seconds.
pub(super) fn open_service(dir: &TempDir, frames_max: usize) -> BackupService {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (service, report) = loop {
        match BackupService::open(dir.path(), config(dir, frames_max)) {
            Ok(opened) => break opened,
            Err(StoreError::InUse { .. }) if std::time::Instant::now() < deadline => {}
            Err(StoreError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline => {}
            Err(error) => panic!("open: {error}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(report.store.quarantined, vec![]);
    service
}

/// Calls `R` on the service directly, as the RPC server would.
pub(super) async fn call<R: Rpc>(
    service: &BackupService,
    request: &R::Request,
) -> Result<R::Reply, (Status, String)> {
    let mut payload = BytesMut::new();
    request.encode(&mut payload);
    let reply = service.handle(R::OPCODE, payload.freeze()).await;
    if reply.status() != Status::Ok {
        let detail = String::from_utf8_lossy(reply.payload()).into_owned();
        return Err((reply.status(), detail));
    }
    Ok(R::Reply::decode(Bytes::copy_from_slice(reply.payload())).expect("reply decodes"))
}

pub(super) fn status<T: std::fmt::Debug>(result: Result<T, (Status, String)>) -> Status {
    match result {
        Ok(reply) => panic!("expected an error, got {reply:?}"),
        Err((status, _)) => status,
    }
}

pub(super) fn open_req(master: u64, segment: u64, epoch: u64) -> OpenReplicaRequest {
    OpenReplicaRequest {
        master: ServerId(master),
        segment: SegmentId(segment),
        epoch: Epoch(epoch),
        capacity: CAPACITY,
    }
}

pub(super) async fn open_reply(
    service: &BackupService,
    master: u64,
    segment: u64,
    epoch: u64,
) -> OpenReplicaReply {
    call::<proto::OpenReplica>(service, &open_req(master, segment, epoch))
        .await
        .expect("open")
}

pub(super) async fn open(
    service: &BackupService,
    master: u64,
    segment: u64,
    epoch: u64,
) -> FrameHandle {
    open_reply(service, master, segment, epoch).await.handle
}

pub(super) async fn bump(
    service: &BackupService,
    handle: FrameHandle,
    epoch: u64,
    new_epoch: u64,
) -> Result<(), (Status, String)> {
    let request = BumpEpochRequest {
        handle,
        epoch: Epoch(epoch),
        new_epoch: Epoch(new_epoch),
    };
    call::<proto::BumpEpoch>(service, &request).await
}

/// A segment of (master, segment) as a master's log writes it: `batches` sealed
/// batches of a few objects. Returns its bytes and the committed length after the
/// opening and after each batch.
pub(super) fn segment(master: u64, segment: u64, batches: usize) -> (Vec<u8>, Vec<u32>) {
    use rampart_common::ids::{TableId, Version};
    use rampart_common::log::SegmentWriter;
    let mut writer = SegmentWriter::open(
        ServerId(master),
        SegmentId(segment),
        CAPACITY,
        &[SegmentId(segment)],
    )
    .expect("segment opens");
    let mut ends = vec![writer.committed_len()];
    for batch in 0..batches {
        for object in 0..3u64 {
            let key = format!("key-{batch}-{object}");
            let value = content(batch as u8, 100 + batch * 10);
            writer
                .append_object(TableId(1), Version(object + 1), key.as_bytes(), &value)
                .expect("fits");
        }
        ends.push(writer.seal_batch());
    }
    (writer.bytes().to_vec(), ends)
}

/// Writes `bytes[from..to]` by `WriteReplica`.
pub(super) async fn write_range(
    service: &BackupService,
    handle: FrameHandle,
    epoch: u64,
    bytes: &[u8],
    from: u32,
    to: u32,
) {
    write(
        service,
        handle,
        epoch,
        from,
        &bytes[from as usize..to as usize],
    )
    .await
    .expect("write");
}

pub(super) async fn write(
    service: &BackupService,
    handle: FrameHandle,
    epoch: u64,
    offset: u32,
    bytes: &[u8],
) -> Result<(), (Status, String)> {
    let request = WriteReplicaRequest {
        handle,
        epoch: Epoch(epoch),
        offset,
        bytes: Bytes::copy_from_slice(bytes),
    };
    call::<proto::WriteReplica>(service, &request).await
}

pub(super) async fn close(
    service: &BackupService,
    handle: FrameHandle,
    epoch: u64,
    length: u32,
) -> Result<ReplicaInfo, (Status, String)> {
    let request = CloseReplicaRequest {
        handle,
        epoch: Epoch(epoch),
        length,
    };
    call::<proto::CloseReplica>(service, &request).await
}

pub(super) async fn list(service: &BackupService, master: Option<u64>) -> Vec<ReplicaInfo> {
    let request = ListReplicasRequest {
        master: master.map(ServerId),
    };
    call::<proto::ListReplicas>(service, &request)
        .await
        .expect("list")
        .replicas
}

pub(super) fn id(master: u64, segment: u64) -> ReplicaId {
    ReplicaId {
        master: ServerId(master),
        segment: SegmentId(segment),
    }
}

pub(super) async fn read(
    service: &BackupService,
    master: u64,
    segment: u64,
) -> Result<ReadReplicaReply, (Status, String)> {
    call::<proto::ReadReplica>(service, &id(master, segment)).await
}

pub(super) async fn free(service: &BackupService, master: u64, segment: u64) -> bool {
    free_up_to(service, master, segment, u64::MAX).await
}

pub(super) async fn free_up_to(
    service: &BackupService,
    master: u64,
    segment: u64,
    epoch_max: u64,
) -> bool {
    let request = FreeReplicaRequest {
        master: ServerId(master),
        segment: SegmentId(segment),
        epoch_max: Epoch(epoch_max),
    };
    call::<proto::FreeReplica>(service, &request)
        .await
        .expect("free")
        .freed
}

pub(super) fn content(seed: u8, length: usize) -> Vec<u8> {
    (0..length)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub(super) fn info(
    master: u64,
    segment: u64,
    epoch: u64,
    length: u32,
    closed: bool,
) -> ReplicaInfo {
    ReplicaInfo {
        master: ServerId(master),
        segment: SegmentId(segment),
        epoch: Epoch(epoch),
        length,
        closed,
    }
}

pub(super) fn slot_offset(reply: &OpenReplicaReply) -> u64 {
    reply.shm.as_ref().expect("shm location").slot_offset
}

/// Flips the last byte of replica 1/1's file.
pub(super) fn corrupt_the_file_of_m1_s1(dir: &TempDir) {
    let path = dir.path().join("replicas").join("m1-s1.replica");
    let mut image = std::fs::read(&path).expect("read file");
    let last = image.len() - 1;
    image[last] ^= 0xFF;
    std::fs::write(&path, image).expect("corrupt");
}

/// A disk that reports `ENOSPC` on every write while `full` is set.
#[derive(Clone, Debug, Default)]
pub(super) struct FillableDisk {
    pub(super) full: Arc<std::sync::atomic::AtomicBool>,
}

impl Disk for FillableDisk {
    fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
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

/// What a log entry says, for comparisons: (tombstone?, table, key, version).
pub(super) type Logged = (bool, TableId, Vec<u8>, Version);

pub(super) const HALF: u64 = 1 << 63;

/// Partition 0: table 1's lower half of hashes; partition 1: table 1's upper half and
/// all of table 2. Table 3 is in none (a tablet the crashed master no longer owned).
pub(super) fn partitions() -> Vec<PartitionRanges> {
    vec![
        vec![HashRange::new(TableId(1), 0, HALF - 1)],
        vec![
            HashRange::new(TableId(1), HALF, u64::MAX),
            HashRange::whole(TableId(2)),
        ],
    ]
}

/// The model of `partitions()`.
pub(super) fn partition_of(table: TableId, key: &[u8]) -> Option<u32> {
    let hash = key_hash(key).0;
    match table.0 {
        1 if hash < HALF => Some(0),
        1 | 2 => Some(1),
        _ => None,
    }
}

/// A segment of `master` with objects in tables 1–3, a tombstone and safe versions,
/// closed (footer to `segment + 1`) or open. Returns its bytes (the committed part),
/// what it logged, and its highest safe version.
pub(super) fn recovery_segment(
    master: u64,
    segment: u64,
    digest: &[u64],
    closed: bool,
) -> (Vec<u8>, Vec<Logged>, Version) {
    let digest: Vec<SegmentId> = digest.iter().copied().map(SegmentId).collect();
    let mut writer =
        SegmentWriter::open(ServerId(master), SegmentId(segment), CAPACITY, &digest).expect("open");
    let mut logged = Vec::new();
    for i in 0..12u64 {
        let table = TableId([1, 1, 1, 2, 3][i as usize % 5]);
        let key = format!("s{segment}-k{i}").into_bytes();
        writer
            .append_object(table, Version(i + 1), &key, &content(i as u8, 50))
            .expect("fits");
        logged.push((false, table, key, Version(i + 1)));
        if i == 5 {
            writer
                .append_safe_version(Version(200 + segment))
                .expect("fits");
            writer.seal_batch();
        }
    }
    let gone = format!("s{segment}-gone").into_bytes();
    writer
        .append_tombstone(TableId(1), Version(3), SegmentId(1), &gone)
        .expect("fits");
    logged.push((true, TableId(1), gone, Version(3)));
    writer
        .append_safe_version(Version(100 + segment))
        .expect("fits");
    writer.seal_batch();
    if closed {
        writer.close(SegmentId(segment + 1));
    }
    let end = writer.committed_len() as usize;
    (
        writer.bytes()[..end].to_vec(),
        logged,
        Version(200 + segment),
    )
}

/// The entries of `logged` in `partition`, in log order.
pub(super) fn expected(logged: &[Logged], partition: u32) -> Vec<Logged> {
    logged
        .iter()
        .filter(|(_, table, key, _)| partition_of(*table, key) == Some(partition))
        .cloned()
        .collect()
}

pub(super) fn decode_piece(reply: &RecoveryDataReply) -> Vec<Logged> {
    let mut offset = 0;
    let mut seen = Vec::new();
    while let Some((entry, next)) = decode_entry(&reply.entries, offset).expect("decodes") {
        match entry {
            Entry::Object(o) => seen.push((false, o.table, o.key.to_vec(), o.version)),
            Entry::Tombstone(t) => seen.push((true, t.table, t.key.to_vec(), t.version)),
            other => panic!("unexpected {other:?} in a piece"),
        }
        offset = next;
    }
    assert_eq!(seen.len(), reply.count as usize);
    seen
}

/// Recovery of master 1 by recovery master 9 reads segment 3 here and returns
/// every entry of `logged` in each of the two `partitions()`, at `epoch`.
pub(super) async fn assert_recovery_reads(
    service: &BackupService,
    logged: &[Logged],
    safe: Version,
    epoch: Epoch,
) {
    recovery_read(service, 1, 9, &[3], partitions())
        .await
        .expect("recovery read");
    for partition in 0..2 {
        let reply = recovery_data(service, 1, 9, 3, partition, vec![])
            .await
            .expect("piece");
        assert_eq!(
            decode_piece(&reply),
            expected(logged, partition),
            "every entry, partition {partition}"
        );
        assert_eq!((reply.safe_version, reply.epoch), (safe, epoch));
    }
}

/// Stores `bytes` as the closed replica (master, segment) at epoch 1.
pub(super) async fn store_closed(service: &BackupService, master: u64, segment: u64, bytes: &[u8]) {
    let handle = open(service, master, segment, 1).await;
    write_range(service, handle, 1, bytes, 0, bytes.len() as u32).await;
    close(service, handle, 1, bytes.len() as u32)
        .await
        .expect("close");
}

/// Writes `bytes` into a new open frame (master, segment) at epoch 1.
pub(super) async fn write_open(
    service: &BackupService,
    master: u64,
    segment: u64,
    bytes: &[u8],
) -> FrameHandle {
    let handle = open(service, master, segment, 1).await;
    write_range(service, handle, 1, bytes, 0, bytes.len() as u32).await;
    handle
}

pub(super) async fn start_recovery(service: &BackupService, master: u64) -> Vec<RecoveryReplica> {
    let request = StartRecoveryRequest {
        master: ServerId(master),
    };
    call::<proto::StartRecovery>(service, &request)
        .await
        .expect("start recovery")
        .replicas
}

pub(super) async fn recovery_read(
    service: &BackupService,
    master: u64,
    recovery: u64,
    segments: &[u64],
    partitions: Vec<PartitionRanges>,
) -> Result<(), (Status, String)> {
    let request = RecoveryReadRequest {
        master: ServerId(master),
        recovery,
        segments: segments.iter().copied().map(SegmentId).collect(),
        partitions,
    };
    call::<proto::RecoveryRead>(service, &request).await
}

pub(super) async fn recovery_data(
    service: &BackupService,
    master: u64,
    recovery: u64,
    segment: u64,
    partition: u32,
    ranges: PartitionRanges,
) -> Result<RecoveryDataReply, (Status, String)> {
    let request = RecoveryDataRequest {
        master: ServerId(master),
        recovery,
        segment: SegmentId(segment),
        partition,
        ranges,
        shared_host: Some(rampart_common::onesided::host_id()),
    };
    let reply = call::<proto::RecoveryData>(service, &request).await?;
    Ok(read_shared(reply))
}

/// `reply` with its entries, copied out of the backup's recovery region where it left
/// them: the service's tests ask as a recovery master on this host does, so they check
/// the pieces read through shared memory.
fn read_shared(reply: RecoveryDataReply) -> RecoveryDataReply {
    let Some(shared) = &reply.shared else {
        return reply;
    };
    let region = RegionReader::open(&shared.region, shared.nonce).expect("region maps");
    let mut entries = Vec::new();
    region
        .copy_runs(&shared.region_runs(), &mut entries)
        .expect("the piece reads");
    RecoveryDataReply {
        entries: entries.into(),
        shared: None,
        ..reply
    }
}

pub(super) async fn end_recovery(service: &BackupService, master: u64) -> u32 {
    let request = EndRecoveryRequest {
        master: ServerId(master),
    };
    call::<proto::EndRecovery>(service, &request)
        .await
        .expect("end recovery")
        .freed
}
