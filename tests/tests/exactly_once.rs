//! Exactly-once retries on real processes (issue 15, RIFL): masters that lose every other
//! reply to a write — the connection closes after the request was handled, as when a
//! network fails at the worst moment — and clients that must neither apply an operation
//! twice nor give up on it.
//!
//! Without completion records a retried increment counts twice (the values returned skip
//! and the counter ends too high); without retries the client gives up with an unknown
//! outcome.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_client::{Client, ClientOptions, RejectRules, WriteItem};
use rampart_common::failpoints::{FAILPOINTS_ENV, LOSE_WRITE_REPLIES};
use rampart_tests::{runtime, CoordinatorGroup, RampartProcess, TEST_BACKUP_FRAMES};
use std::collections::BTreeSet;
use std::time::Duration;

/// Two servers (R = 1) whose masters lose every other write reply, and their
/// coordinators.
struct Cluster {
    group: CoordinatorGroup,
    _servers: Vec<RampartProcess>,
    _dir: tempfile::TempDir,
}

fn start() -> Cluster {
    let group = CoordinatorGroup::start(1).unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let addrs = group.addrs();
    let env = [(FAILPOINTS_ENV.to_string(), LOSE_WRITE_REPLIES.to_string())];
    let servers = (0..2)
        .map(|i| {
            let data_dir = dir.path().join(format!("server-{i}"));
            let data_dir = data_dir.to_str().unwrap();
            RampartProcess::start_with_env(
                &[
                    "server",
                    "--coordinator",
                    &addrs,
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    data_dir,
                    "--memory",
                    "64MiB",
                    "--segment-bytes",
                    "1MiB",
                    "--value-bytes-max",
                    "64KiB",
                    "--disk-mbps",
                    "500",
                    "--replicas",
                    "1",
                    "--backup-frames",
                    TEST_BACKUP_FRAMES,
                ],
                &env,
            )
            .unwrap()
        })
        .collect();
    let cluster = Cluster {
        group,
        _servers: servers,
        _dir: dir,
    };
    cluster.check_replies_are_lost();
    cluster
}

impl Cluster {
    /// Two writes straight to a master (no retries): one answer must be lost, or the
    /// binary under test was built without failpoints and these tests prove nothing.
    fn check_replies_are_lost(&self) {
        use rampart_common::protocol::master::{Write, WriteRequest};
        use rampart_common::rpc::RpcPool;
        let pool = RpcPool::new();
        let request = WriteRequest {
            table: rampart_common::ids::TableId(999),
            key: bytes::Bytes::from_static(b"probe"),
            value: bytes::Bytes::new(),
            rules: RejectRules::default(),
            rifl: rampart_common::rifl::Rifl::NONE,
        };
        let lost = runtime().block_on(async {
            let mut lost = 0;
            for _ in 0..2 {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                let answer = pool
                    .call::<Write>(&self._servers[0].addr, &request, deadline)
                    .await;
                if matches!(&answer, Err(e) if e.is_transport()) {
                    lost += 1;
                }
            }
            lost
        });
        assert_eq!(
            lost, 1,
            "the master did not lose every other write reply: is the binary built with \
             failpoints (cargo test --workspace builds it so)?"
        );
    }
}

async fn client(cluster: &Cluster) -> Client {
    let options = ClientOptions {
        deadline: Duration::from_secs(20),
        ..ClientOptions::default()
    };
    Client::connect_with(&[cluster.group.addrs()], options)
        .await
        .unwrap()
}

#[test]
fn increments_whose_replies_are_lost_count_once_each() {
    let cluster = start();
    runtime().block_on(async {
        let client = client(&cluster).await;
        let table = client.create_table("counters", 2).await.unwrap();
        // Four clients of their own (four client ids) and one shared counter.
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let client = self::client(&cluster).await;
            tasks.spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..50 {
                    let (value, _) = client.increment(table, b"shared", 1).await.unwrap();
                    seen.push(value);
                }
                seen
            });
        }
        let mut values = BTreeSet::new();
        while let Some(seen) = tasks.join_next().await {
            for value in seen.unwrap() {
                assert!(values.insert(value), "{value} returned twice");
            }
        }
        // Each increment applied once: every value from 1 to 200 returned exactly once.
        assert_eq!(values, (1..=200).collect::<BTreeSet<i64>>());
        let object = client.read(table, b"shared").await.unwrap().unwrap();
        assert_eq!(object.value.to_vec(), 200i64.to_le_bytes().to_vec());
    });
}

#[test]
fn conditional_writes_removes_and_multi_writes_whose_replies_are_lost_apply_once() {
    let cluster = start();
    runtime().block_on(async {
        let client = client(&cluster).await;
        let table = client.create_table("registers", 2).await.unwrap();
        // Compare-and-swap chain: a retry of a swap that applied must report success
        // (its recorded outcome), not WrongVersion against its own new version.
        let mut version = client.write(table, b"cas", b"0").await.unwrap();
        for i in 1..=40 {
            let value = i.to_string();
            version = client
                .write_with(
                    table,
                    b"cas",
                    value.as_bytes(),
                    RejectRules::version_is(version),
                )
                .await
                .unwrap();
        }
        let object = client.read(table, b"cas").await.unwrap().unwrap();
        assert_eq!((&object.value[..], object.version), (&b"40"[..], version));
        // A create-only write retried after it applied reports its success, and a remove
        // retried after it applied reports the version it removed.
        for i in 0..20 {
            let key = format!("once-{i}");
            let created = client
                .write_with(table, key.as_bytes(), b"v", RejectRules::create_only())
                .await
                .unwrap();
            let removed = client.remove(table, key.as_bytes()).await.unwrap();
            assert_eq!(removed, Some(created));
        }
        // Multi-writes: every object written once, with the version its read shows.
        let items: Vec<WriteItem> = (0..32)
            .map(|i| WriteItem {
                table,
                key: format!("multi-{i}").into(),
                value: format!("value-{i}").into(),
                rules: RejectRules::create_only(),
            })
            .collect();
        let versions = client.multi_write(&items).await.unwrap();
        for (item, version) in items.iter().zip(versions) {
            let version = version.unwrap();
            let object = client.read(table, &item.key).await.unwrap().unwrap();
            assert_eq!(
                (object.value.clone(), object.version),
                (item.value.clone(), version)
            );
        }
    });
}
