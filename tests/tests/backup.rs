//! Backups on real processes: replicas written through the backup RPCs survive a
//! SIGKILL of the server and are reported, byte for byte, by its successor — the closed
//! ones from the disk, the open ones from the frame file the killed process left; and a
//! backup away while its master was recovered, back on its data directory, has the
//! replicas nobody needs any more freed by the coordinators' collection; so does one
//! away while its master, still up, freed segments and re-created the rest elsewhere.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_common::ids::{Epoch, SegmentId, ServerId};
use rampart_common::protocol::backup::{
    CloseReplica, CloseReplicaRequest, ListReplicas, ListReplicasRequest, OpenReplica,
    OpenReplicaRequest, ReadReplica, ReplicaId, WriteReplica, WriteReplicaRequest,
};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::status::Status;
use rampart_tests::RampartProcess;
use std::time::Duration;
use tokio::time::Instant;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn replica_bytes(segment: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 31 + segment) as u8).collect()
}

/// The valid prefix of an open segment as a master writes it: its opening and two
/// sealed batches of objects.
fn open_segment(master: ServerId, segment: SegmentId) -> Vec<u8> {
    use rampart_common::ids::{TableId, Version};
    let mut writer =
        rampart_common::log::SegmentWriter::open(master, segment, 8 << 20, &[segment]).unwrap();
    for batch in 0..2u64 {
        for i in 0..10u64 {
            let key = format!("key-{batch}-{i}");
            writer
                .append_object(
                    TableId(1),
                    Version(batch * 10 + i + 1),
                    key.as_bytes(),
                    &[7; 300],
                )
                .unwrap();
        }
        writer.seal_batch();
    }
    let end = writer.committed_len() as usize;
    writer.bytes()[..end].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_backup_reports_its_replicas_byte_for_byte() {
    let data = tempfile::TempDir::new().unwrap();
    let data_dir = data.path().to_str().unwrap().to_string();
    let coordinator_dir = data.path().join("coordinator");
    let coordinator = RampartProcess::start(&[
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        coordinator_dir.to_str().unwrap(),
    ])
    .unwrap();
    let server_args = |coordinator: &str| {
        vec![
            "server".to_string(),
            "--coordinator".to_string(),
            coordinator.to_string(),
            "--listen".to_string(),
            "127.0.0.1:0".to_string(),
            "--memory".to_string(),
            "64MiB".to_string(),
            "--backup-frames".to_string(),
            rampart_tests::TEST_BACKUP_FRAMES.to_string(),
            "--data-dir".to_string(),
            data_dir.clone(),
        ]
    };
    let args = server_args(&coordinator.addr);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = RampartProcess::start(&args).unwrap();
    let pool = RpcPool::new();
    let master = ServerId(77);

    // Three closed replicas of different sizes, one left open with two batches written,
    // one opened and never written.
    let mut written = Vec::new();
    for (segment, len) in [(1u64, 100_000usize), (2, 8 << 20), (3, 0)] {
        let open = OpenReplicaRequest {
            master,
            segment: SegmentId(segment),
            epoch: Epoch(1),
            capacity: 8 << 20,
        };
        let handle = pool
            .call::<OpenReplica>(&server.addr, &open, deadline())
            .await
            .unwrap();
        let bytes = replica_bytes(segment, len);
        for (i, chunk) in bytes.chunks(1 << 20).enumerate() {
            let write = WriteReplicaRequest {
                handle: handle.handle,
                epoch: Epoch(1),
                offset: (i << 20) as u32,
                bytes: chunk.to_vec().into(),
            };
            pool.call::<WriteReplica>(&server.addr, &write, deadline())
                .await
                .unwrap();
        }
        let close = CloseReplicaRequest {
            handle: handle.handle,
            epoch: Epoch(1),
            length: len as u32,
        };
        let info = pool
            .call::<CloseReplica>(&server.addr, &close, deadline())
            .await
            .unwrap();
        assert!(info.closed);
        written.push((SegmentId(segment), bytes));
    }
    let open_bytes = open_segment(master, SegmentId(4));
    let open = OpenReplicaRequest {
        master,
        segment: SegmentId(4),
        epoch: Epoch(3),
        capacity: 8 << 20,
    };
    let handle = pool
        .call::<OpenReplica>(&server.addr, &open, deadline())
        .await
        .unwrap();
    let write = WriteReplicaRequest {
        handle: handle.handle,
        epoch: Epoch(3),
        offset: 0,
        bytes: open_bytes.clone().into(),
    };
    pool.call::<WriteReplica>(&server.addr, &write, deadline())
        .await
        .unwrap();
    let empty = OpenReplicaRequest {
        segment: SegmentId(5),
        ..open
    };
    pool.call::<OpenReplica>(&server.addr, &empty, deadline())
        .await
        .unwrap();

    // SIGKILL: no chance to flush anything more.
    server.kill();
    let args = server_args(&coordinator.addr);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let restarted = RampartProcess::start(&args).unwrap();

    let listed = pool
        .call::<ListReplicas>(
            &restarted.addr,
            &ListReplicasRequest {
                master: Some(master),
            },
            deadline(),
        )
        .await
        .unwrap();
    let segments: Vec<(SegmentId, bool)> = listed
        .replicas
        .iter()
        .map(|r| (r.segment, r.closed))
        .collect();
    assert_eq!(
        segments,
        [
            (SegmentId(1), true),
            (SegmentId(2), true),
            (SegmentId(3), true),
            (SegmentId(4), false)
        ],
        "the closed replicas and the open one that holds bytes"
    );
    let id = ReplicaId {
        master,
        segment: SegmentId(4),
    };
    let read = pool
        .call::<ReadReplica>(&restarted.addr, &id, deadline())
        .await
        .unwrap();
    assert_eq!((read.info.epoch, read.info.closed), (Epoch(3), false));
    assert!(
        read.bytes == open_bytes,
        "the open frame differs after the restart"
    );
    for (segment, bytes) in written {
        let id = ReplicaId { master, segment };
        let read = pool
            .call::<ReadReplica>(&restarted.addr, &id, deadline())
            .await
            .unwrap();
        assert!(read.info.closed);
        assert_eq!(read.info.length as usize, bytes.len());
        assert!(read.bytes == bytes, "{segment} differs after the restart");
    }
    let missing = ReplicaId {
        master,
        segment: SegmentId(5),
    };
    let result = pool
        .call::<ReadReplica>(&restarted.addr, &missing, deadline())
        .await;
    assert!(
        matches!(
            result,
            Err(RpcError::Status {
                status: Status::ObjectDoesntExist,
                ..
            })
        ),
        "a frame that never held a byte is not a replica: {result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_servers_enlist_as_backups_in_distinct_failure_domains() {
    use rampart_common::protocol::coordinator::{GetTabletMap, TabletMapRequest};
    let cluster = rampart_tests::LocalCluster::start(3, &["--memory", "64MiB"]).unwrap();
    let coordinators =
        rampart_common::coordinator_set::CoordinatorSet::new(&[&cluster.coordinator]);
    let map = coordinators
        .call::<GetTabletMap>(&RpcPool::new(), &TabletMapRequest {}, deadline())
        .await
        .unwrap();
    assert_eq!(map.servers.len(), 3);
    assert!(map
        .servers
        .iter()
        .all(|s| s.services.master && s.services.backup));
    let domains: std::collections::BTreeSet<&str> = map
        .servers
        .iter()
        .map(|s| s.failure_domain.as_str())
        .collect();
    assert_eq!(
        domains.len(),
        3,
        "each server is its own failure domain by default"
    );
}

/// The tablet map as the coordinators hold it now.
async fn map(group: &rampart_tests::CoordinatorGroup) -> rampart_common::tablet::TabletMap {
    use rampart_common::coordinator_set::CoordinatorSet;
    use rampart_common::protocol::coordinator::{GetTabletMap, TabletMapRequest};
    let addrs = group.addrs();
    let set = CoordinatorSet::new(&[addrs.as_str()]);
    set.call::<GetTabletMap>(&RpcPool::new(), &TabletMapRequest {}, deadline())
        .await
        .unwrap()
}

/// Waits until server `id` has `status` in the server list.
async fn wait_status(
    group: &rampart_tests::CoordinatorGroup,
    id: ServerId,
    status: rampart_common::tablet::ServerStatus,
) {
    let until = Instant::now() + Duration::from_secs(60);
    while !map(group)
        .await
        .servers
        .iter()
        .any(|s| s.id == id && s.status == status)
    {
        assert!(Instant::now() < until, "{id} never {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The replicas of `master` that the backup at `addr` holds.
async fn replicas_of(addr: &str, master: ServerId) -> usize {
    let request = ListReplicasRequest {
        master: Some(master),
    };
    RpcPool::new()
        .call::<ListReplicas>(addr, &request, deadline())
        .await
        .unwrap()
        .replicas
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_back_after_its_masters_recovery_frees_what_nobody_needs() {
    use rampart_common::tablet::ServerStatus;
    // The leader collects every 4 s: a look right after the backup is back comes
    // before the collection.
    let group =
        rampart_tests::CoordinatorGroup::start_with(1, &["--collect-interval-ms", "4000"], &[])
            .unwrap();
    let root = tempfile::TempDir::new().unwrap();
    let dir = |i: usize| root.path().join(format!("server-{i}"));
    let flags = [&["--replicas", "2"], rampart_tests::SMALL_SERVERS].concat();
    // Five: with two gone, every master still finds its two backups.
    let mut servers_up: Vec<Option<RampartProcess>> = (0..5)
        .map(|i| Some(group.start_server(&dir(i), &flags).unwrap()))
        .collect();
    let client = rampart_client::Client::connect(&[group.addrs()])
        .await
        .unwrap();
    let table = client.create_table("kept", 1).await.unwrap();
    for i in 0..300 {
        let key = format!("key-{i}");
        client
            .write(table, key.as_bytes(), &[9; 1000])
            .await
            .unwrap();
    }
    let owner = map(&group)
        .await
        .tables
        .iter()
        .find(|t| t.id == table)
        .unwrap()
        .tablets[0]
        .owner;
    let index = |id: ServerId| {
        servers_up
            .iter()
            .position(|s| s.as_ref().is_some_and(|p| p.server_id() == id.0))
            .unwrap()
    };
    let owner_at = index(owner);
    // A backup holding replicas of the owner goes away.
    let mut away = None;
    for (i, server) in servers_up.iter().enumerate() {
        let server = server.as_ref().unwrap();
        if i != owner_at && replicas_of(&server.addr, owner).await > 0 {
            away = Some(i);
            break;
        }
    }
    let away = away.unwrap();
    let away_id = ServerId(servers_up[away].as_ref().unwrap().server_id());
    servers_up[away].take().unwrap().kill();
    wait_status(&group, away_id, ServerStatus::Removed).await;
    // The owner re-created what it lost there, then crashes and is recovered while the
    // backup is away: the recovery's frees never reach it.
    let owner_addr = servers_up[owner_at].as_ref().unwrap().addr.clone();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        use rampart_common::protocol::master::{PingRequest, ServerStats};
        let stats = RpcPool::new()
            .call::<ServerStats>(&owner_addr, &PingRequest {}, deadline())
            .await
            .unwrap();
        if stats.segments_under_replicated == 0 {
            break;
        }
        assert!(Instant::now() < until, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    servers_up[owner_at].take().unwrap().kill();
    wait_status(&group, owner, ServerStatus::Removed).await;

    // Back on its data directory (under a new id): it holds the owner's old replicas,
    // and the collection frees them.
    let back = group.start_server(&dir(away), &flags).unwrap();
    assert!(
        replicas_of(&back.addr, owner).await > 0,
        "the store kept them"
    );
    let until = Instant::now() + Duration::from_secs(30);
    while replicas_of(&back.addr, owner).await > 0 {
        assert!(Instant::now() < until, "never collected");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What live masters need is still there: every key reads back.
    for i in 0..300 {
        let key = format!("key-{i}");
        assert!(client.read(table, key.as_bytes()).await.unwrap().is_some());
    }
}

/// The (segment, epoch) of every replica of `master` that the backup at `addr` holds.
async fn replica_ids(addr: &str, master: ServerId) -> Vec<(SegmentId, Epoch)> {
    let request = ListReplicasRequest {
        master: Some(master),
    };
    RpcPool::new()
        .call::<ListReplicas>(addr, &request, deadline())
        .await
        .unwrap()
        .replicas
        .iter()
        .map(|r| (r.segment, r.epoch))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_back_after_its_live_master_freed_and_moved_its_segments_gives_them_back() {
    use rampart_common::protocol::master::{PingRequest, ServerStats};
    use rampart_common::tablet::ServerStatus;
    let group =
        rampart_tests::CoordinatorGroup::start_with(1, &["--collect-interval-ms", "3000"], &[])
            .unwrap();
    let root = tempfile::TempDir::new().unwrap();
    let dir = |i: usize| root.path().join(format!("server-{i}"));
    // An idle master cleans from 10 % of its 64 segments on.
    let flags = [
        &["--replicas", "1", "--cleaner-threshold", "10"],
        rampart_tests::SMALL_SERVERS,
    ]
    .concat();
    let mut servers_up: Vec<Option<RampartProcess>> = (0..3)
        .map(|i| Some(group.start_server(&dir(i), &flags).unwrap()))
        .collect();
    let client = rampart_client::Client::connect(&[group.addrs()])
        .await
        .unwrap();
    let table = client.create_table("kept", 1).await.unwrap();
    let write_round = |round: u8| {
        let client = client.clone();
        async move {
            for i in 0..50 {
                let key = format!("key-{i}");
                client
                    .write(table, key.as_bytes(), &[round; 60_000])
                    .await
                    .unwrap();
            }
        }
    };
    write_round(1).await;
    let owner = map(&group)
        .await
        .tables
        .iter()
        .find(|t| t.id == table)
        .unwrap()
        .tablets[0]
        .owner;
    let index = |id: ServerId| {
        servers_up
            .iter()
            .position(|s| s.as_ref().is_some_and(|p| p.server_id() == id.0))
            .unwrap()
    };
    let owner_at = index(owner);
    let owner_addr = servers_up[owner_at].as_ref().unwrap().addr.clone();
    let stats = || async {
        RpcPool::new()
            .call::<ServerStats>(&owner_addr, &PingRequest {}, deadline())
            .await
            .unwrap()
    };
    // A backup holding replicas of the owner goes away; the owner re-creates them on
    // the other.
    let mut away = None;
    for (i, server) in servers_up.iter().enumerate() {
        let server = server.as_ref().unwrap();
        if i != owner_at && replicas_of(&server.addr, owner).await > 0 {
            away = Some(i);
            break;
        }
    }
    let away = away.unwrap();
    let away_id = ServerId(servers_up[away].as_ref().unwrap().server_id());
    servers_up[away].take().unwrap().kill();
    wait_status(&group, away_id, ServerStatus::Removed).await;
    // Overwritten while it is away: the owner cleans, freeing segments it had there.
    let cleaned_before = stats().await.segments_cleaned;
    for round in 2..6 {
        write_round(round).await;
    }
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let now = stats().await;
        if now.segments_cleaned > cleaned_before && now.segments_under_replicated == 0 {
            break;
        }
        assert!(Instant::now() < until, "never cleaned and whole: {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Back on its data directory (under a new id): it holds the owner's old copies,
    // freed segments and abandoned ones alike, and the collection frees them, the owner
    // being up.
    let back = group.start_server(&dir(away), &flags).unwrap();
    let held = replica_ids(&back.addr, owner).await;
    assert!(!held.is_empty(), "the store kept them");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = replica_ids(&back.addr, owner).await;
        if !now.iter().any(|copy| held.contains(copy)) {
            break;
        }
        assert!(
            Instant::now() < until,
            "never collected: {now:?} of {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing the owner needs was freed: it crashes, and its recovery reads every key
    // back at its last value.
    servers_up[owner_at].take().unwrap().kill();
    wait_status(&group, owner, ServerStatus::Removed).await;
    for i in 0..50 {
        let key = format!("key-{i}");
        let object = client.read(table, key.as_bytes()).await.unwrap().unwrap();
        assert!(object.value.iter().all(|&b| b == 5), "{key}");
    }
}
