//! Durable writes on real processes: every acknowledged write is in R backup replicas,
//! survives SIGKILL of its master (in the replicas) and of a backup (re-replicated).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_client::{Client, ClientOptions};
use rampart_common::ids::{SegmentId, ServerId, TableId};
use rampart_common::log::{entries, scan, Entry};
use rampart_common::protocol::backup::{
    ListReplicas, ListReplicasRequest, ReadReplica, ReplicaId, ReplicaInfo,
};
use rampart_common::protocol::master::{Ping, PingRequest};
use rampart_common::rpc::RpcPool;
use rampart_tests::{runtime, LocalCluster};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Small servers with 128 KiB segments, so a few seconds of writes fill many segments.
const SMALL_SERVERS: &[&str] = &[
    "--memory",
    "64MiB",
    "--segment-bytes",
    "128KiB",
    "--value-bytes-max",
    "16KiB",
];

async fn connect(cluster: &LocalCluster, deadline: Duration) -> Client {
    let options = ClientOptions {
        deadline,
        ..ClientOptions::default()
    };
    Client::connect_with(&[cluster.coordinator.as_str()], options)
        .await
        .unwrap()
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn value_of(key: &str) -> Vec<u8> {
    format!("{key}:{}", "v".repeat(200)).into_bytes()
}

/// The server (id, addr, pid) that owns `table` (created with span 1).
fn owner(cluster: &LocalCluster, client: &Client, table: TableId) -> (u64, String, u32) {
    let addr = client.locate(table, b"any").unwrap();
    cluster
        .servers
        .iter()
        .find(|(_, a, _)| *a == addr)
        .cloned()
        .unwrap()
}

/// Writes distinct keys from `writers` tasks until `stop`; returns the acknowledged keys.
async fn write_until(
    client: &Client,
    table: TableId,
    writers: usize,
    stop: Arc<AtomicBool>,
) -> Vec<String> {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let (client, stop) = (client.clone(), Arc::clone(&stop));
        tasks.spawn(async move {
            let mut acked = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("w{w}-k{i}");
                match client.write(table, key.as_bytes(), &value_of(&key)).await {
                    Ok(_) => acked.push(key),
                    // After a SIGKILL of the master: not acknowledged.
                    Err(_) => break,
                }
                i += 1;
            }
            acked
        });
    }
    let mut acked = Vec::new();
    while let Some(done) = tasks.join_next().await {
        acked.extend(done.unwrap());
    }
    acked
}

/// What the backup at `addr` lists of `master`'s replicas.
async fn list_replicas(pool: &RpcPool, addr: &str, master: ServerId) -> Vec<ReplicaInfo> {
    let request = ListReplicasRequest {
        master: Some(master),
    };
    pool.call::<ListReplicas>(addr, &request, deadline())
        .await
        .unwrap()
        .replicas
}

/// Every replica of `master` held by the servers at `addrs`, by segment, with bytes.
async fn replicas_of(
    pool: &RpcPool,
    addrs: &[String],
    master: ServerId,
) -> BTreeMap<SegmentId, Vec<(String, ReplicaInfo, Vec<u8>)>> {
    let mut found: BTreeMap<SegmentId, Vec<(String, ReplicaInfo, Vec<u8>)>> = BTreeMap::new();
    for addr in addrs {
        for info in list_replicas(pool, addr, master).await {
            let id = ReplicaId {
                master,
                segment: info.segment,
            };
            let read = pool
                .call::<ReadReplica>(addr, &id, deadline())
                .await
                .unwrap();
            found.entry(info.segment).or_default().push((
                addr.clone(),
                read.info,
                read.bytes.to_vec(),
            ));
        }
    }
    found
}

/// (key, value) of every object in the valid prefix of `bytes`. Every entry there has
/// passed its checksums (the scanner's and the object's own CRC).
fn objects_in(bytes: &[u8]) -> HashSet<(Vec<u8>, Vec<u8>)> {
    entries(bytes, scan(bytes).valid_bytes)
        .filter_map(|(_, entry)| match entry {
            Entry::Object(object) => Some((object.key.to_vec(), object.value.to_vec())),
            _ => None,
        })
        .collect()
}

#[test]
fn killed_master_every_acknowledged_write_is_in_every_replica() {
    let cluster = LocalCluster::start(4, SMALL_SERVERS).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster, Duration::from_secs(2)).await;
        let table = client.create_table("durable", 1).await.unwrap();
        let (master_id, master_addr, master_pid) = owner(&cluster, &client, table);
        let stop = Arc::new(AtomicBool::new(false));
        let writing = tokio::spawn({
            let (client, stop) = (client.clone(), Arc::clone(&stop));
            async move { write_until(&client, table, 4, stop).await }
        });
        // Long enough to fill a few of SMALL_SERVERS' 1 MiB segments, however slow the
        // machine: the master's log in use says when.
        let pool = RpcPool::new();
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let stats = pool
                .call::<Ping>(&master_addr, &PingRequest {}, deadline())
                .await
                .unwrap();
            if stats.log_bytes_used >= 4 << 20 {
                break;
            }
            assert!(
                Instant::now() < until,
                "the log never reached 4 MiB: {stats:?}"
            );
        }
        // SIGKILL while the writers are mid-flight.
        unsafe { libc::kill(master_pid as i32, libc::SIGKILL) };
        stop.store(true, Ordering::SeqCst);
        let acked = writing.await.unwrap();
        assert!(
            acked.len() > 500,
            "only {} writes acknowledged",
            acked.len()
        );

        let others: Vec<String> = cluster
            .servers
            .iter()
            .filter(|(_, addr, _)| *addr != master_addr)
            .map(|(_, addr, _)| addr.clone())
            .collect();
        let replicas = replicas_of(&pool, &others, ServerId(master_id)).await;
        assert!(
            replicas.len() >= 3,
            "{} segments replicated",
            replicas.len()
        );
        let mut in_replicas: HashMap<Vec<u8>, SegmentId> = HashMap::new();
        for (segment, held) in &replicas {
            // A segment whose replicas were still being opened at the kill has fewer
            // than three; then none of them may hold an acknowledged write (checked
            // below: an acknowledged key must be in three replicas).
            let per_replica: Vec<HashSet<(Vec<u8>, Vec<u8>)>> =
                held.iter().map(|(_, _, bytes)| objects_in(bytes)).collect();
            for objects in &per_replica {
                for (key, _) in objects {
                    in_replicas.insert(key.clone(), *segment);
                }
            }
            // Each replica holds at least what every acknowledged batch put there: the
            // acknowledged keys of this segment are checked below against all three.
            for key in &acked {
                let object = (key.as_bytes().to_vec(), value_of(key));
                let holders = per_replica.iter().filter(|o| o.contains(&object)).count();
                assert!(
                    holders == 0 || holders == 3,
                    "{key} is in {holders} of {} replicas of segment {segment}",
                    held.len()
                );
            }
        }
        for key in &acked {
            assert!(
                in_replicas.contains_key(key.as_bytes()),
                "acknowledged write {key} is in no replica"
            );
        }
    });
}

#[test]
fn killed_backup_writes_continue_and_segments_regain_r_replicas() {
    let cluster = LocalCluster::start(5, SMALL_SERVERS).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster, Duration::from_secs(10)).await;
        let table = client.create_table("resilient", 1).await.unwrap();
        let (master_id, master_addr, _) = owner(&cluster, &client, table);
        let master = ServerId(master_id);
        let stop = Arc::new(AtomicBool::new(false));
        let writing = tokio::spawn({
            let (client, stop) = (client.clone(), Arc::clone(&stop));
            async move { write_until(&client, table, 2, stop).await }
        });
        tokio::time::sleep(Duration::from_millis(800)).await;

        // Kill the backup holding the most replicas of the master.
        let pool = RpcPool::new();
        let backups: Vec<(u64, String, u32)> = cluster
            .servers
            .iter()
            .filter(|(_, addr, _)| *addr != master_addr)
            .cloned()
            .collect();
        let mut holding = Vec::new();
        for (_, addr, pid) in &backups {
            let held = list_replicas(&pool, addr, master).await.len();
            holding.push((held, addr.clone(), *pid));
        }
        holding.sort();
        let (held, victim_addr, victim_pid) = holding.last().cloned().unwrap();
        assert!(held > 0);
        unsafe { libc::kill(victim_pid as i32, libc::SIGKILL) };

        // Writes go on after the kill.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stop.store(true, Ordering::SeqCst);
        let acked = writing.await.unwrap();
        assert!(!acked.is_empty());

        // The master reports no under-replicated segment, and the live backups hold
        // three replicas of every segment.
        let survivors: Vec<String> = backups
            .iter()
            .filter(|(_, addr, _)| *addr != victim_addr)
            .map(|(_, addr, _)| addr.clone())
            .collect();
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let ping = pool
                .call::<Ping>(&master_addr, &PingRequest {}, deadline())
                .await
                .unwrap();
            let replicas = replicas_of(&pool, &survivors, master).await;
            let short: Vec<_> = replicas
                .iter()
                .filter(|(_, held)| held.len() != 3)
                .map(|(segment, held)| (*segment, held.len()))
                .collect();
            if ping.segments_under_replicated == 0 && short.is_empty() {
                break;
            }
            assert!(
                Instant::now() < until,
                "still under-replicated: master says {}, backups show {short:?}",
                ping.segments_under_replicated
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // No acknowledged write was lost.
        for key in &acked {
            let read = client.read(table, key.as_bytes()).await.unwrap().unwrap();
            assert_eq!(read.value, value_of(key));
        }
    });
}

#[test]
fn kv_works_with_every_replication_factor() {
    for replicas in 0..=3 {
        let r = replicas.to_string();
        let mut flags = SMALL_SERVERS.to_vec();
        flags.extend(["--replicas", r.as_str()]);
        let cluster = LocalCluster::start(4, &flags).unwrap();
        let kv = |args: &[&str]| {
            let mut all = vec!["kv"];
            all.extend_from_slice(args);
            cluster.rampart(&all, None).unwrap()
        };
        assert!(kv(&["create-table", "t"]).status.success(), "R={replicas}");
        for i in 0..20 {
            let key = format!("k{i}");
            let out = kv(&["put", "t", &key, &format!("v{i}")]);
            assert!(out.status.success(), "R={replicas}: {out:?}");
        }
        let out = kv(&["get", "t", "k7"]);
        assert_eq!(out.stdout, b"v7", "R={replicas}");
        assert!(kv(&["del", "t", "k7"]).status.success());
        assert_eq!(
            kv(&["get", "t", "k7"]).status.code(),
            Some(1),
            "R={replicas}"
        );
    }
}

#[test]
fn cluster_up_refuses_more_replicas_than_other_servers() {
    let out = rampart_tests::rampart(
        &["cluster", "up", "--servers", "2", "--replicas", "2"],
        None,
        &[],
    )
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--replicas 2 needs at least 3 servers"),
        "{stderr}"
    );
}
