//! The replicator against real backup services (in this process, on loopback): every
//! acknowledged batch is on R backups byte for byte, over each transport; lost backups
//! are replaced; a fenced master never acknowledges; writes wait for enough backups, and
//! free the copies their master gave up on while they wait.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_backup::segment_store::{Disk, RealDisk};
use rampart_backup::service::{BackupConfig, BackupService};
use rampart_common::config::MasterConfig;
use rampart_common::ids::{Epoch, SegmentId, ServerId, TableId};
use rampart_common::log::scan;
use rampart_common::onesided::TransportKind;
use rampart_common::protocol::backup::{
    ListReplicas, ListReplicasRequest, OpenReplica, OpenReplicaRequest, ReadReplica, ReplicaId,
    ReplicaInfo,
};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::{RpcPool, RpcServer};
use rampart_common::status::Status;
use rampart_common::tablet::{ServerInfo, ServerStatus, Services, Tablet};
use rampart_master::appender::{Appender, AppenderStatus};
use rampart_master::object_store::{ObjectStore, WriteOp};
use rampart_master::replica_manager::server_list_watch::ServerListWatch;
use rampart_master::replica_manager::{Fatal, ReplicationConfig, Replicator, ServerSource};
use rampart_master::segmented_log::{SealedRange, SegmentRange};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

const MASTER: ServerId = ServerId(100);
const TABLE: TableId = TableId(1);
const SEGMENT_BYTES: u32 = 128 * 1024;

struct TestBackup {
    id: ServerId,
    addr: String,
    service: Arc<BackupService>,
    stop: Option<(oneshot::Sender<()>, oneshot::Sender<()>)>,
    _dir: TempDir,
}

/// A disk with no room: every replica write fails with ENOSPC.
#[derive(Debug)]
struct FullDisk;

impl Disk for FullDisk {
    fn write_durable(&self, _: &std::path::Path, _: &[&[u8]]) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        RealDisk.rename(from, to)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        RealDisk.sync_dir(dir)
    }
}

impl TestBackup {
    async fn start(id: u64, frames_max: usize) -> TestBackup {
        TestBackup::start_on(id, frames_max, Box::new(RealDisk)).await
    }

    async fn start_on(id: u64, frames_max: usize, disk: Box<dyn Disk>) -> TestBackup {
        let dir = TempDir::new().unwrap();
        let config = BackupConfig {
            frames_max,
            extra_slots: 0,
            frame_bytes_max: SEGMENT_BYTES,
            frame_file: dir.path().join("frames"),
        };
        let (service, _) =
            BackupService::open_with_disk(&dir.path().join("store"), config, disk).unwrap();
        let service = Arc::new(service);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let nic_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        service.set_nic_addr(nic_listener.local_addr().unwrap().to_string());
        let (stop_rpc, rpc_stopped) = oneshot::channel::<()>();
        let (stop_nic, nic_stopped) = oneshot::channel::<()>();
        tokio::spawn(RpcServer::run(listener, Arc::clone(&service), async move {
            let _ = rpc_stopped.await;
        }));
        tokio::spawn(rampart_common::onesided::nic::serve(
            nic_listener,
            service.nic_target(),
            async move {
                let _ = nic_stopped.await;
            },
        ));
        TestBackup {
            id: ServerId(id),
            addr,
            service,
            stop: Some((stop_rpc, stop_nic)),
            _dir: dir,
        }
    }

    fn info(&self) -> ServerInfo {
        ServerInfo {
            id: self.id,
            addr: self.addr.clone(),
            services: Services {
                master: false,
                backup: true,
            },
            status: ServerStatus::Up,
            failure_domain: self.addr.clone(),
            disk_read_mbps: 100,
        }
    }

    /// Serves again on the same address (after `kill`), with the same state: a backup
    /// that was only unreachable for a while.
    async fn revive(&mut self) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(self.addr.parse().unwrap()).unwrap();
        let listener = socket.listen(64).unwrap();
        let nic_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.service
            .set_nic_addr(nic_listener.local_addr().unwrap().to_string());
        let (stop_rpc, rpc_stopped) = oneshot::channel::<()>();
        let (stop_nic, nic_stopped) = oneshot::channel::<()>();
        tokio::spawn(RpcServer::run(
            listener,
            Arc::clone(&self.service),
            async move {
                let _ = rpc_stopped.await;
            },
        ));
        tokio::spawn(rampart_common::onesided::nic::serve(
            nic_listener,
            self.service.nic_target(),
            async move {
                let _ = nic_stopped.await;
            },
        ));
        self.stop = Some((stop_rpc, stop_nic));
    }

    /// Stops serving: RPCs and soft-NIC connections break, as if the process died.
    fn kill(&mut self) {
        if let Some((rpc, nic)) = self.stop.take() {
            let _ = rpc.send(());
            let _ = nic.send(());
        }
    }
}

struct Master {
    store: Arc<Mutex<ObjectStore>>,
    appender: Appender,
    status: Arc<AppenderStatus>,
    /// The replicator's news from the coordinators (drains among them).
    watch: Arc<ServerListWatch>,
}

fn start_master(
    replicas: usize,
    transport: Option<TransportKind>,
    servers: Arc<Mutex<Vec<ServerInfo>>>,
) -> Master {
    start_master_excluding_failed_for(
        replicas,
        transport,
        servers,
        rampart_master::replica_manager::replicator::FAILED_BACKUP_EXCLUSION,
    )
}

fn start_master_excluding_failed_for(
    replicas: usize,
    transport: Option<TransportKind>,
    servers: Arc<Mutex<Vec<ServerInfo>>>,
    failed_backup_exclusion: Duration,
) -> Master {
    start_master_from(
        replicas,
        transport,
        ServerSource::Fixed(servers),
        failed_backup_exclusion,
    )
}

/// A master owning all of `TABLE` that learns its server list from `servers`.
fn start_master_from(
    replicas: usize,
    transport: Option<TransportKind>,
    servers: ServerSource,
    failed_backup_exclusion: Duration,
) -> Master {
    let config = MasterConfig {
        segment_bytes: SEGMENT_BYTES,
        memory_bytes: 64 * u64::from(SEGMENT_BYTES),
        value_bytes_max: 4096,
        ..Default::default()
    };
    let mut store = ObjectStore::new(MASTER, config);
    store.take_tablets(&[Tablet {
        table: TABLE,
        start_hash: 0,
        end_hash: u64::MAX,
        owner: MASTER,
    }]);
    let store = Arc::new(Mutex::new(store));
    let replication = ReplicationConfig {
        replicas,
        transport,
        servers,
        seed: 7,
        failed_backup_exclusion,
    };
    let status = Arc::new(AppenderStatus::default());
    let replicator = Replicator::new(MASTER, replication);
    let watch = replicator.server_list_watch();
    let appender = Appender::spawn_replicated(Arc::clone(&store), replicator, Arc::clone(&status));
    Master {
        store,
        appender,
        status,
        watch,
    }
}

fn write(i: usize) -> WriteOp {
    WriteOp::Write {
        table: TABLE,
        key: Bytes::from(format!("key-{i}")),
        value: Bytes::from(vec![(i % 251) as u8; 300]),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

/// Writes `keys` objects in batches of `per_batch`, each acknowledged Ok.
async fn write_many(master: &Master, range: std::ops::Range<usize>, per_batch: usize) {
    let keys: Vec<usize> = range.collect();
    for chunk in keys.chunks(per_batch) {
        let outcomes = master
            .appender
            .submit(chunk.iter().map(|&i| write(i)).collect())
            .await
            .unwrap();
        assert!(outcomes.iter().all(|o| o.status == Status::Ok));
    }
}

/// Every replica of `MASTER` on the live `backups`, by segment.
async fn replicas_by_segment(
    backups: &[&TestBackup],
) -> BTreeMap<SegmentId, Vec<(ServerId, ReplicaInfo)>> {
    let pool = RpcPool::new();
    let mut by_segment: BTreeMap<SegmentId, Vec<(ServerId, ReplicaInfo)>> = BTreeMap::new();
    for backup in backups {
        let deadline = Instant::now() + Duration::from_secs(2);
        let list = pool
            .call::<ListReplicas>(
                &backup.addr,
                &ListReplicasRequest {
                    master: Some(MASTER),
                },
                deadline,
            )
            .await
            .unwrap();
        for info in list.replicas {
            by_segment
                .entry(info.segment)
                .or_default()
                .push((backup.id, info));
        }
    }
    by_segment
}

/// Waits until every segment of the master's log has `replicas` replicas on distinct
/// live backups, each holding exactly the master's bytes (closed segments: closed and
/// whole; the head: at least up to its last sealed batch). Panics after 10 s.
async fn assert_fully_replicated(master: &Master, backups: &[&TestBackup], replicas: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let pool = RpcPool::new();
    loop {
        let found = replicas_by_segment(backups).await;
        let (segments, head): (Vec<(SegmentId, Vec<u8>, bool)>, SegmentId) = {
            let store = master.store.lock();
            let log = store.log();
            let head = log.head();
            (
                log.segment_ids()
                    .map(|id| (id, log.segment_bytes(id).unwrap().to_vec(), id != head))
                    .collect(),
                head,
            )
        };
        let mut problems = Vec::new();
        for (id, bytes, closed) in &segments {
            let held = found.get(id).cloned().unwrap_or_default();
            let mut holders: Vec<ServerId> = held.iter().map(|(b, _)| *b).collect();
            holders.sort();
            holders.dedup();
            if held.len() != replicas || holders.len() != replicas {
                problems.push(format!("segment {id}: replicas on {holders:?}"));
                continue;
            }
            for (backup, info) in &held {
                if *closed && !info.closed {
                    problems.push(format!("segment {id} on {backup}: not closed yet"));
                    continue;
                }
                let addr = &backups.iter().find(|b| b.id == *backup).unwrap().addr;
                let reply = pool
                    .call::<ReadReplica>(
                        addr,
                        &ReplicaId {
                            master: MASTER,
                            segment: *id,
                        },
                        Instant::now() + Duration::from_secs(2),
                    )
                    .await
                    .unwrap();
                let want = if *closed {
                    &bytes[..]
                } else {
                    // The head: what its valid prefix covers (every sealed batch).
                    let valid = scan(bytes).valid_bytes as usize;
                    &bytes[..valid]
                };
                if reply.bytes.len() < want.len() || &reply.bytes[..want.len()] != want {
                    problems.push(format!(
                        "segment {id} on {backup}: {} bytes held, {} expected or differing",
                        reply.bytes.len(),
                        want.len()
                    ));
                }
                let scanned = scan(&reply.bytes);
                if *closed {
                    assert!(
                        scanned.closed && scanned.valid_bytes as usize == reply.bytes.len(),
                        "closed replica of {id} on {backup} scans cleanly to its footer: {:?}",
                        scanned.stop
                    );
                }
            }
        }
        if problems.is_empty() {
            assert!(found
                .keys()
                .all(|id| segments.iter().any(|(s, ..)| s == id)));
            let _ = head;
            return;
        }
        if Instant::now() > deadline {
            panic!("not fully replicated: {problems:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn cluster(n: u64) -> (Vec<TestBackup>, Arc<Mutex<Vec<ServerInfo>>>) {
    let mut backups = Vec::new();
    for id in 1..=n {
        backups.push(TestBackup::start(id, 32).await);
    }
    let list = Arc::new(Mutex::new(backups.iter().map(TestBackup::info).collect()));
    (backups, list)
}

async fn every_batch_is_on_r_backups(transport: TransportKind) {
    let (backups, list) = cluster(5).await;
    let master = start_master(3, Some(transport), list);
    // ≈ 300 KiB of objects: several rollovers of 64 KiB segments.
    write_many(&master, 0..2000, 7).await;
    assert!(master.store.lock().log().segment_ids().count() >= 4);
    let live: Vec<&TestBackup> = backups.iter().collect();
    assert_fully_replicated(&master, &live, 3).await;
    assert_eq!(master.status.replication.lock().replicas_recreated, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_is_on_r_backups_over_shm() {
    every_batch_is_on_r_backups(TransportKind::Shm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_is_on_r_backups_over_tcp() {
    every_batch_is_on_r_backups(TransportKind::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_is_on_r_backups_over_rpc() {
    every_batch_is_on_r_backups(TransportKind::Rpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r_zero_needs_no_backups() {
    let list = Arc::new(Mutex::new(Vec::new()));
    let master = start_master(0, None, list);
    write_many(&master, 0..300, 10).await;
    assert_eq!(master.store.lock().object_count(), 300);
}

/// Kills one backup while writes go on (tcp and rpc: an in-process backup cannot die
/// for `shm`, whose liveness check is by process; the process tests cover that).
async fn lost_backup_is_replaced(transport: TransportKind) {
    let (mut backups, list) = cluster(5).await;
    let master = start_master(3, Some(transport), Arc::clone(&list));
    write_many(&master, 0..400, 5).await;
    // The backup holding the most replicas of ours.
    let found = replicas_by_segment(&backups.iter().collect::<Vec<_>>()).await;
    let victim = (0..backups.len())
        .max_by_key(|&i| {
            found
                .values()
                .filter(|held| held.iter().any(|(b, _)| *b == backups[i].id))
                .count()
        })
        .unwrap();
    backups[victim].kill();
    // Writes continue (they wait only while the head is re-replicated).
    write_many(&master, 400..900, 5).await;
    let live: Vec<&TestBackup> = backups
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, b)| b)
        .collect();
    assert_fully_replicated(&master, &live, 3).await;
    let stats = *master.status.replication.lock();
    assert!(stats.replicas_recreated >= 1, "{stats:?}");
    assert!(stats.backups_failed >= 1, "{stats:?}");
    // Every acknowledged write is still readable from the master.
    let store = master.store.lock();
    for i in 0..900 {
        assert!(store.read(TABLE, format!("key-{i}").as_bytes()).is_ok());
    }
}

/// A backup being drained stays up and answers, but the master re-creates every replica
/// it held on the others, places none there again, and says when it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_being_drained_is_left_though_it_stays_up() {
    let (backups, list) = cluster(4).await;
    let master = start_master(2, Some(TransportKind::Tcp), list);
    write_many(&master, 0..400, 5).await;
    let all: Vec<&TestBackup> = backups.iter().collect();
    let found = replicas_by_segment(&all).await;
    let drained = backups
        .iter()
        .map(|b| b.id)
        .max_by_key(|&id| {
            found
                .values()
                .filter(|held| held.iter().any(|(b, _)| *b == id))
                .count()
        })
        .unwrap();
    assert_eq!(
        master.watch.evacuate(drained),
        None,
        "no report before a look"
    );
    // Writes go on meanwhile.
    write_many(&master, 400..800, 5).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if master.watch.evacuate(drained).is_some_and(|r| r.done()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{:?}",
            master.watch.evacuate(drained)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Done means whole without it: every segment on R of the others.
    let others: Vec<&TestBackup> = backups.iter().filter(|b| b.id != drained).collect();
    assert_fully_replicated(&master, &others, 2).await;
    write_many(&master, 800..900, 5).await;
    assert_fully_replicated(&master, &others, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_backup_is_replaced_over_tcp() {
    lost_backup_is_replaced(TransportKind::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_backup_is_replaced_over_rpc() {
    lost_backup_is_replaced(TransportKind::Rpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_enough_backups() {
    let (backups, list) = cluster(3).await;
    // Only two backups listed: R = 3 cannot be placed yet.
    list.lock().truncate(2);
    let master = start_master(3, None, Arc::clone(&list));
    let appender = master.appender.clone();
    let pending = tokio::spawn(async move { appender.submit(vec![write(1)]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !pending.is_finished(),
        "acknowledged with fewer than R backups"
    );
    list.lock().push(backups[2].info());
    let outcomes = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the write completes once a third backup exists")
        .unwrap()
        .unwrap();
    assert_eq!(outcomes[0].status, Status::Ok);
    assert_fully_replicated(&master, &backups.iter().collect::<Vec<_>>(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_backup_is_skipped() {
    let (mut backups, _) = cluster(3).await;
    // A fourth backup whose only frame another master holds: every open there is
    // BackupFull.
    let full = TestBackup::start(4, 1).await;
    RpcPool::new()
        .call::<OpenReplica>(
            &full.addr,
            &OpenReplicaRequest {
                master: ServerId(999),
                segment: SegmentId(1),
                epoch: Epoch(1),
                capacity: SEGMENT_BYTES,
            },
            Instant::now() + Duration::from_secs(2),
        )
        .await
        .unwrap();
    backups.push(full);
    let list = Arc::new(Mutex::new(backups.iter().map(TestBackup::info).collect()));
    let master = start_master(3, None, list);
    write_many(&master, 0..600, 8).await;
    let found = replicas_by_segment(&backups.iter().collect::<Vec<_>>()).await;
    assert!(found
        .values()
        .all(|held| held.iter().all(|(b, _)| *b != ServerId(4))));
    assert_fully_replicated(&master, &backups[..3].iter().collect::<Vec<_>>(), 3).await;
}

async fn fenced_master_never_acknowledges(transport: TransportKind) {
    fenced_master_never_acknowledges_after(transport, false).await;
}

/// Fences `MASTER` on every backup — and, with `recovered`, ends its recovery there too
/// (its frames freed: a zombie's late write) — then checks that it never acknowledges.
async fn fenced_master_never_acknowledges_after(transport: TransportKind, recovered: bool) {
    let (backups, list) = cluster(4).await;
    let master = start_master(3, Some(transport), list);
    write_many(&master, 0..20, 5).await;
    // Recovery of MASTER begins: every backup fences its open frames.
    for backup in &backups {
        backup.service.fence_master(MASTER);
    }
    if recovered {
        let pool = RpcPool::new();
        for backup in &backups {
            let request = rampart_common::protocol::backup::EndRecoveryRequest { master: MASTER };
            pool.call::<rampart_common::protocol::backup::EndRecovery>(
                &backup.addr,
                &request,
                Instant::now() + Duration::from_secs(2),
            )
            .await
            .unwrap();
        }
    }
    let appender = master.appender.clone();
    let pending = tokio::spawn(async move { appender.submit(vec![write(999)]).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while master.status.fatal.lock().is_none() {
        assert!(
            Instant::now() < deadline,
            "the master did not notice the fence"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished(), "a fenced write was answered");
    assert!(master
        .status
        .fatal
        .lock()
        .as_deref()
        .unwrap()
        .contains("fenced"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_master_never_acknowledges_over_shm() {
    fenced_master_never_acknowledges(TransportKind::Shm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_master_never_acknowledges_over_tcp() {
    fenced_master_never_acknowledges(TransportKind::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_master_never_acknowledges_over_rpc() {
    fenced_master_never_acknowledges(TransportKind::Rpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_master_writing_late_hears_fenced_over_shm() {
    fenced_master_never_acknowledges_after(TransportKind::Shm, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_master_writing_late_hears_fenced_over_tcp() {
    fenced_master_never_acknowledges_after(TransportKind::Tcp, true).await;
}

/// The head's holders, by the backups' own lists.
async fn head_holders(master: &Master, backups: &[TestBackup]) -> Vec<ServerId> {
    let head = master.store.lock().log().head();
    replicas_by_segment(&backups.iter().collect::<Vec<_>>()).await[&head]
        .iter()
        .map(|(b, _)| *b)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_head_that_lost_every_replica_is_re_created() {
    let (mut backups, list) = cluster(3).await;
    let master = start_master(1, Some(TransportKind::Tcp), Arc::clone(&list));
    write_many(&master, 0..50, 5).await;
    let holder = head_holders(&master, &backups).await[0];
    let victim = backups.iter().position(|b| b.id == holder).unwrap();
    backups[victim].kill();
    list.lock().retain(|s| s.id != holder);
    // No write follows: upkeep alone must restore the head.
    let live: Vec<&TestBackup> = backups.iter().filter(|b| b.id != holder).collect();
    assert_fully_replicated(&master, &live, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_fenced_everywhere_cannot_move_its_head_to_fresh_backups() {
    let (backups, list) = cluster(6).await;
    let master = start_master(3, Some(TransportKind::Tcp), Arc::clone(&list));
    write_many(&master, 0..20, 5).await;
    // Recovery fences the master on every backup; then the head's backups vanish from
    // the master's list (a partition), and it tries to re-create its head elsewhere:
    // backups that fenced it refuse to open new replicas for it.
    let holders = head_holders(&master, &backups).await;
    for backup in &backups {
        backup.service.fence_master(MASTER);
    }
    list.lock().retain(|s| !holders.contains(&s.id));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let appender = master.appender.clone();
    let pending = tokio::spawn(async move { appender.submit(vec![write(999)]).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !pending.is_finished(),
        "a fenced master acknowledged a write"
    );
    assert!(master.status.fatal.lock().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_declared_crashed_cannot_move_its_head_to_fresh_backups() {
    let (backups, list) = cluster(6).await;
    let master = start_master(3, Some(TransportKind::Tcp), Arc::clone(&list));
    write_many(&master, 0..20, 5).await;
    // The head's backups vanish, and the coordinator has declared this master crashed
    // (no backup fenced anything yet).
    let holders = head_holders(&master, &backups).await;
    {
        let mut list = list.lock();
        list.retain(|s| !holders.contains(&s.id));
        list.push(ServerInfo {
            id: MASTER,
            addr: "127.0.0.1:1".into(),
            services: Services {
                master: true,
                backup: false,
            },
            status: ServerStatus::Crashed,
            failure_domain: "m".into(),
            disk_read_mbps: 0,
        });
    }
    // Let the master see the new list (it loses every head replica with it).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let appender = master.appender.clone();
    let pending = tokio::spawn(async move { appender.submit(vec![write(999)]).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !pending.is_finished(),
        "a crashed master acknowledged a write"
    );
    let fatal = master.status.fatal.lock().clone().unwrap();
    assert!(fatal.contains("declared crashed"), "{fatal}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_whose_backup_disk_is_full_are_placed_elsewhere() {
    let (mut backups, _) = cluster(4).await;
    // A fifth backup takes frames but cannot write a closed replica to disk.
    backups.push(TestBackup::start_on(5, 32, Box::new(FullDisk)).await);
    let list = Arc::new(Mutex::new(backups.iter().map(TestBackup::info).collect()));
    let master = start_master(3, None, list);
    write_many(&master, 0..2000, 7).await;
    assert!(master.store.lock().log().segment_ids().count() >= 4);
    // Every closed segment ends up closed on three backups, none of them the full one
    // (a closed replica there cannot exist); nothing acknowledged is lost.
    assert_fully_replicated(&master, &backups.iter().collect::<Vec<_>>(), 3).await;
    let found = replicas_by_segment(&backups.iter().collect::<Vec<_>>()).await;
    let head = master.store.lock().log().head();
    assert!(found
        .iter()
        .filter(|(id, _)| **id != head)
        .all(|(_, held)| held.iter().all(|(b, _)| *b != ServerId(5))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_that_was_only_unreachable_is_used_again() {
    // R = 3 over exactly 3 backups: while one is unreachable no replacement exists,
    // and the write path waits; once the backup answers again and its exclusion has
    // run out, writes go on (on it).
    let (mut backups, list) = cluster(3).await;
    let master = start_master_excluding_failed_for(
        3,
        Some(TransportKind::Tcp),
        list,
        Duration::from_millis(300),
    );
    write_many(&master, 0..20, 5).await;
    backups[0].kill();
    let appender = master.appender.clone();
    let pending = tokio::spawn(async move { appender.submit(vec![write(1000)]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!pending.is_finished(), "acknowledged with a replica short");
    backups[0].revive().await;
    let outcomes = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("writes go on once the backup is back")
        .unwrap()
        .unwrap();
    assert_eq!(outcomes[0].status, Status::Ok);
    assert_fully_replicated(&master, &backups.iter().collect::<Vec<_>>(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_that_never_answers_times_out_and_is_replaced() {
    // A listed backup whose listener accepts connections and never replies (a hung
    // process): opens and writes to it time out, and the replicas go elsewhere.
    let (backups, list) = cluster(3).await;
    let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_addr = hung.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = hung.accept().await {
            held.push(stream);
        }
    });
    list.lock().push(ServerInfo {
        id: ServerId(9),
        addr: hung_addr.clone(),
        services: Services {
            master: false,
            backup: true,
        },
        status: ServerStatus::Up,
        failure_domain: hung_addr,
        disk_read_mbps: 100,
    });
    let master = start_master(3, None, list);
    write_many(&master, 0..600, 8).await;
    assert_fully_replicated(&master, &backups.iter().collect::<Vec<_>>(), 3).await;
    let stats = *master.status.replication.lock();
    assert!(stats.backups_failed >= 1, "{stats:?}");
}

/// A coordinator that serves the server list of a test (`GetTabletMap`) and records
/// `SetOpenEpoch` calls; told to, it leaves them unanswered (no majority) or refuses them
/// (`ServerCrashed`).
#[derive(Debug, Default)]
struct EpochCoordinator {
    servers: Mutex<Vec<ServerInfo>>,
    /// (segment, epoch) of every `SetOpenEpoch` it accepted, in order.
    recorded: Mutex<Vec<(SegmentId, Epoch)>>,
    /// Answer `SetOpenEpoch` with `Retry`, as a leader cut off from its majority would.
    stalled: std::sync::atomic::AtomicBool,
    /// Answer `SetOpenEpoch` with `ServerCrashed`.
    crashed: std::sync::atomic::AtomicBool,
    asked: std::sync::atomic::AtomicU64,
}

impl rampart_common::rpc::Service for EpochCoordinator {
    fn handle(
        &self,
        opcode: rampart_common::rpc::Opcode,
        payload: Bytes,
    ) -> rampart_common::rpc::server::HandleFuture<'_> {
        use rampart_common::protocol::coordinator::{
            GetTabletMap, SetOpenEpoch, SetOpenEpochRequest,
        };
        use rampart_common::rpc::{Reply, Rpc};
        use std::sync::atomic::Ordering;
        let reply = match opcode {
            GetTabletMap::OPCODE => Reply::ok(&rampart_common::tablet::TabletMap {
                version: 1,
                servers: self.servers.lock().clone(),
                tables: Vec::new(),
            }),
            SetOpenEpoch::OPCODE => match Reply::decode::<SetOpenEpochRequest>(payload) {
                Err(reply) => reply,
                Ok(request) => {
                    self.asked.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(request.server, MASTER);
                    if self.crashed.load(Ordering::SeqCst) {
                        Reply::error(Status::ServerCrashed, "declared crashed")
                    } else if self.stalled.load(Ordering::SeqCst) {
                        Reply::error(Status::Retry, "no majority")
                    } else {
                        self.recorded.lock().push((request.segment, request.epoch));
                        Reply::ok(&())
                    }
                }
            },
            other => Reply::error(Status::UnknownOpcode, format!("{other}")),
        };
        Box::pin(async move { reply })
    }
}

/// A master like `start_master`'s, whose server list comes from `coordinator`.
async fn start_master_with_coordinator(
    replicas: usize,
    coordinator: Arc<EpochCoordinator>,
) -> Master {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(RpcServer::run(
        listener,
        coordinator,
        std::future::pending(),
    ));
    let servers = ServerSource::Coordinators(vec![addr]);
    start_master_from(
        replicas,
        Some(TransportKind::Tcp),
        servers,
        Duration::from_secs(60),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_created_open_replica_is_recorded_at_the_coordinator_before_the_next_write_is_acknowledged(
) {
    use std::sync::atomic::Ordering;
    let (mut backups, _) = cluster(5).await;
    let coordinator = Arc::new(EpochCoordinator::default());
    *coordinator.servers.lock() = backups.iter().map(TestBackup::info).collect();
    let master = start_master_with_coordinator(3, Arc::clone(&coordinator)).await;
    write_many(&master, 0..40, 5).await;
    assert!(
        coordinator.recorded.lock().is_empty(),
        "nothing was re-created yet"
    );

    // A backup of the head dies, and the coordinators cannot commit anything.
    coordinator.stalled.store(true, Ordering::SeqCst);
    let head = master.store.lock().log().head();
    let holder = head_holders(&master, &backups).await[0];
    let victim = backups.iter().position(|b| b.id == holder).unwrap();
    backups[victim].kill();
    let appender = master.appender.clone();
    let pending = tokio::spawn(async move { appender.submit(vec![write(1000)]).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while coordinator.asked.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the new epoch was never sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !pending.is_finished(),
        "a write was acknowledged before the head's new epoch was recorded: a recovery \
         would still count the copy left behind, which lacks it"
    );

    // The coordinators are back: the epoch the replicas hold now is recorded first.
    coordinator.stalled.store(false, Ordering::SeqCst);
    let outcomes = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the write completes once the epoch is recorded")
        .unwrap()
        .unwrap();
    assert_eq!(outcomes[0].status, Status::Ok);
    let recorded = coordinator.recorded.lock().clone();
    let live: Vec<&TestBackup> = backups.iter().filter(|b| b.id != holder).collect();
    let held = &replicas_by_segment(&live).await[&head];
    assert_eq!(held.len(), 3);
    let epoch = held[0].1.epoch;
    assert!(
        epoch > Epoch(1) && held.iter().all(|(_, info)| info.epoch == epoch),
        "{held:?}"
    );
    assert_eq!(recorded, vec![(head, epoch)]);

    // Declared crashed meanwhile: the next re-creation stops the master for good.
    coordinator.crashed.store(true, Ordering::SeqCst);
    let second = held[0].0;
    let victim = backups.iter().position(|b| b.id == second).unwrap();
    backups[victim].kill();
    let appender = master.appender.clone();
    let pending = tokio::spawn(async move { appender.submit(vec![write(1001)]).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while master.status.fatal.lock().is_none() {
        assert!(Instant::now() < deadline, "the master went on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !pending.is_finished(),
        "a crashed master acknowledged a write"
    );
    let fatal = master.status.fatal.lock().clone().unwrap();
    assert!(fatal.contains("declared crashed"), "{fatal}");
}

/// A `Replicator` on a thread of its own, under a runtime of its own, fed ranges to
/// replicate: a call that never returns (a write stalled for good) is seen by the
/// caller's time limit instead of hanging the test's runtime, whose workers serve the
/// backups.
struct ReplicatorThread {
    calls: std::sync::mpsc::Sender<ReplicateCall>,
}

/// Ranges to replicate, and where the outcome goes.
type ReplicateCall = (Vec<SealedRange>, std::sync::mpsc::Sender<Result<(), Fatal>>);

impl ReplicatorThread {
    fn start(config: ReplicationConfig) -> ReplicatorThread {
        let (calls, received) = std::sync::mpsc::channel::<ReplicateCall>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut replicator = Replicator::new(MASTER, config);
            for (ranges, reply) in received {
                let _ = reply.send(runtime.block_on(replicator.replicate(&ranges)));
            }
        });
        ReplicatorThread { calls }
    }

    /// `Replicator::replicate` of `ranges`; `None` if it has not returned `within`.
    async fn replicate(
        &self,
        ranges: Vec<SealedRange>,
        within: Duration,
    ) -> Option<Result<(), Fatal>> {
        let (reply, replied) = std::sync::mpsc::channel();
        self.calls.send((ranges, reply)).unwrap();
        tokio::task::spawn_blocking(move || replied.recv_timeout(within).ok())
            .await
            .unwrap()
    }
}

/// Bytes `[start, end)` of `segment`, sealed, not closing it.
fn sealed(segment: u64, start: u32, end: u32) -> SealedRange {
    SealedRange {
        range: SegmentRange {
            segment: SegmentId(segment),
            start,
            end,
            closes: false,
        },
        bytes: Bytes::from(vec![segment as u8; (end - start) as usize]),
        capacity: SEGMENT_BYTES,
    }
}

/// A write that waits for backups frees the copies its master gave up on, before each
/// pause (`Settling`'s `FreeAbandoned`): here the only frame slot left in the cluster
/// holds such a copy, and no upkeep runs while a write waits (the write holds the
/// replicator), so without those frees the write would wait for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waiting_for_backups_frees_the_copies_its_master_gave_up_on() {
    // Two backups of one frame each; R = 1, over RPC (a killed backup's frames would
    // still take `shm` writes).
    let mut backups = [TestBackup::start(1, 1).await, TestBackup::start(2, 1).await];
    let list = Arc::new(Mutex::new(
        backups.iter().map(TestBackup::info).collect::<Vec<_>>(),
    ));
    let failed_exclusion = Duration::from_millis(100);
    let replicator = ReplicatorThread::start(ReplicationConfig {
        replicas: 1,
        transport: Some(TransportKind::Rpc),
        servers: ServerSource::Fixed(list),
        seed: 7,
        failed_backup_exclusion: failed_exclusion,
    });
    let within = Duration::from_secs(10);
    let replicate = |ranges| replicator.replicate(ranges, within);
    assert_eq!(replicate(vec![sealed(1, 0, 100)]).await, Some(Ok(())));
    let holders = |found: &BTreeMap<SegmentId, Vec<(ServerId, ReplicaInfo)>>, segment| {
        let held: Vec<ServerId> = found[&SegmentId(segment)].iter().map(|(b, _)| *b).collect();
        held
    };
    let found = replicas_by_segment(&backups.iter().collect::<Vec<_>>()).await;
    let first = holders(&found, 1)[0];
    let (x, y) = if first == backups[0].id {
        (0, 1)
    } else {
        (1, 0)
    };
    // x stops answering: segment 1's next range re-creates it on y, and its copy on x —
    // x's only frame — is given up on.
    backups[x].kill();
    assert_eq!(replicate(vec![sealed(1, 100, 200)]).await, Some(Ok(())));
    backups[x].revive().await;
    tokio::time::sleep(failed_exclusion * 2).await;
    let found = replicas_by_segment(&backups.iter().collect::<Vec<_>>()).await;
    assert_eq!(
        holders(&found, 1).len(),
        2,
        "x still holds the copy given up on"
    );
    // Segment 2 finds both backups full: x with that copy, y with segment 1.
    let started = Instant::now();
    assert_eq!(
        replicate(vec![sealed(2, 0, 100)]).await,
        Some(Ok(())),
        "the write never found a frame: the copy given up on was not freed"
    );
    let found = replicas_by_segment(&backups.iter().collect::<Vec<_>>()).await;
    assert_eq!(holders(&found, 1), vec![backups[y].id]);
    assert_eq!(holders(&found, 2), vec![backups[x].id]);
    // It waited out the refusals (both backups refused its open while full), no more.
    assert!(started.elapsed() < within);
}
