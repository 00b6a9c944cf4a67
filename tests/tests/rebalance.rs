//! Rebalancing from outside (issue 42, item 3), on real processes: a server that joins
//! an idle cluster receives tablets, not while an operator has paused the rebalancer,
//! and at once when resumed; a master whose tablets take all the load under a client's
//! reads and writes sheds one to a master that takes none; a move held back by the
//! bandwidth cap is cancelled halfway, and moves again once the cap is lifted. Every key
//! reads back after.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_client::{Client, ClientOptions};
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::{key_hash, ServerId, TableId};
use rampart_common::protocol::coordinator::{
    GetTabletMap, RebalanceAction, RebalanceReply, TabletMapRequest,
};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::Tablet;
use rampart_tests::{runtime, CoordinatorGroup, RampartProcess};
use std::time::{Duration, Instant};

/// The coordinators' flags: rebalancing on, acting after a second.
const REBALANCE: &[&str] = &["--rebalance", "on", "--rebalance-after-ms", "1000"];

async fn client(group: &CoordinatorGroup) -> Client {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    Client::connect_with(&[group.addrs()], options)
        .await
        .unwrap()
}

async fn tablets(group: &CoordinatorGroup, table: TableId) -> Vec<Tablet> {
    let addrs = group.addrs();
    let set = CoordinatorSet::new(&[addrs.as_str()]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let map = set
        .call::<GetTabletMap>(&RpcPool::new(), &TabletMapRequest {}, deadline)
        .await
        .unwrap();
    map.tables
        .into_iter()
        .find(|t| t.id == table)
        .map(|t| t.tablets)
        .unwrap_or_default()
}

fn start_servers(group: &CoordinatorGroup, dir: &std::path::Path, n: u32) -> Vec<RampartProcess> {
    (0..n)
        .map(|_| {
            let data = tempfile::TempDir::new_in(dir).unwrap().keep();
            group
                .start_server(&data, &["--replicas", "1", "--memory", "256MiB"])
                .unwrap()
        })
        .collect()
}

async fn check_keys(client: &Client, table: TableId, keys: &[String]) {
    for key in keys {
        let read = client.read(table, key.as_bytes()).await.unwrap();
        assert_eq!(
            read.map(|o| o.value.to_vec()),
            Some(format!("value of {key}").into_bytes()),
            "{key}"
        );
    }
}

/// Waits up to `timeout` for `done` to hold of the table's tablets.
async fn wait_tablets(
    group: &CoordinatorGroup,
    table: TableId,
    timeout: Duration,
    done: impl Fn(&[Tablet]) -> bool,
) -> Vec<Tablet> {
    let until = Instant::now() + timeout;
    loop {
        let now = tablets(group, table).await;
        if done(&now) || Instant::now() >= until {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn a_server_that_joins_receives_tablets_unless_paused_and_every_key_reads_back() {
    let dir = tempfile::TempDir::new().unwrap();
    let group = CoordinatorGroup::start_with(1, REBALANCE, &[]).unwrap();
    let _servers = start_servers(&group, dir.path(), 2);
    runtime().block_on(async {
        let client = client(&group).await;
        let table = client.create_table("t", 4).await.unwrap();
        let keys: Vec<String> = (0..4000).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            let value = format!("value of {key}");
            client
                .write(table, key.as_bytes(), value.as_bytes())
                .await
                .unwrap();
        }
        client.rebalance(RebalanceAction::Pause).await.unwrap();
        let mut joined = start_servers(&group, dir.path(), 1);
        let new = ServerId(3);
        // Paused: the new server gets nothing while the load stays unbalanced.
        let during = wait_tablets(&group, table, Duration::from_secs(6), |t| {
            t.iter().any(|t| t.owner == new)
        })
        .await;
        assert!(
            during.iter().all(|t| t.owner != new),
            "tablets moved while paused: {during:?}"
        );
        let resumed = client.rebalance(RebalanceAction::Resume).await.unwrap();
        assert!(resumed.enabled && !resumed.paused, "{resumed:?}");
        let after = wait_tablets(&group, table, Duration::from_secs(60), |t| {
            t.iter().any(|t| t.owner == new)
        })
        .await;
        assert!(
            after.iter().any(|t| t.owner == new),
            "the server that joined got no tablet: {after:?}"
        );
        check_keys(&client, table, &keys).await;
        let view: RebalanceReply = client.rebalance(RebalanceAction::Show).await.unwrap();
        let decision = view
            .decisions
            .iter()
            .find(|d| d.action.contains("to server-3") || d.action.contains("to 3"))
            .unwrap_or_else(|| panic!("no decision moved a tablet to server 3: {view:?}"));
        assert!(decision.why.contains("bytes"), "{decision:?}");
        drop(joined.pop());
    });
}

#[test]
fn a_master_with_the_hot_tablets_sheds_one_under_load_and_every_key_reads_back() {
    let dir = tempfile::TempDir::new().unwrap();
    let group = CoordinatorGroup::start_with(1, REBALANCE, &[]).unwrap();
    let _servers = start_servers(&group, dir.path(), 3);
    runtime().block_on(async {
        let client = client(&group).await;
        let table = client.create_table("hot", 6).await.unwrap();
        let map = tablets(&group, table).await;
        let hot_owner = map[0].owner;
        let hot: Vec<Tablet> = map
            .iter()
            .filter(|t| t.owner == hot_owner)
            .copied()
            .collect();
        assert_eq!(hot.len(), 2, "{map:?}");
        // Keys of the hot master's two tablets only.
        let keys: Vec<String> = (0..)
            .map(|i| format!("key-{i}"))
            .filter(|k| {
                hot.iter()
                    .any(|t| t.contains(table, key_hash(k.as_bytes())))
            })
            .take(400)
            .collect();
        for key in &keys {
            let value = format!("value of {key}");
            client
                .write(table, key.as_bytes(), value.as_bytes())
                .await
                .unwrap();
        }
        let until = Instant::now() + Duration::from_secs(90);
        let mut moved = false;
        while !moved && Instant::now() < until {
            // Four readers at once: well above the 1,000 operations per second from which
            // the rebalancer balances operations, not bytes, even on a slow machine.
            let mut readers = tokio::task::JoinSet::new();
            for r in 0..4 {
                let (client, keys) = (client.clone(), keys.clone());
                readers.spawn(async move {
                    for key in keys.iter().skip(r * 25).take(100) {
                        client.read(table, key.as_bytes()).await.unwrap();
                    }
                });
            }
            while let Some(done) = readers.join_next().await {
                done.unwrap();
            }
            let now = tablets(&group, table).await;
            moved = now.iter().filter(|t| t.owner == hot_owner).count() < 2;
        }
        assert!(moved, "the hot master kept both its tablets");
        check_keys(&client, table, &keys).await;
        let view = client.rebalance(RebalanceAction::Show).await.unwrap();
        assert!(
            view.decisions.iter().any(|d| d.why.contains("ops/s")),
            "{view:?}"
        );
    });
}

#[test]
fn a_capped_move_cancelled_halfway_leaves_its_tablets_and_moves_once_uncapped() {
    let dir = tempfile::TempDir::new().unwrap();
    // Rebalancing off: only the operator moves here.
    let group = CoordinatorGroup::start_with(1, &[], &[]).unwrap();
    let _servers = start_servers(&group, dir.path(), 2);
    runtime().block_on(async {
        let client = client(&group).await;
        let table = client.create_table("capped", 1).await.unwrap();
        let keys: Vec<String> = (0..8000).map(|i| format!("key-{i}")).collect();
        let pad = "x".repeat(1000);
        for key in &keys {
            let value = format!("value of {key}");
            client
                .write(table, key.as_bytes(), value.as_bytes())
                .await
                .unwrap();
        }
        // About 8 MB more, so that the copy takes seconds at 1 MB/s.
        for i in 0..8000 {
            let key = format!("pad-{i}");
            client
                .write(table, key.as_bytes(), pad.as_bytes())
                .await
                .unwrap();
        }
        let view = client.rebalance(RebalanceAction::Cap(1)).await.unwrap();
        assert_eq!(view.move_cap_mb_s, 1);
        let before = tablets(&group, table).await;
        let source = before[0].owner;
        let target = if source == ServerId(1) {
            ServerId(2)
        } else {
            ServerId(1)
        };
        let mover = {
            let client = client.clone();
            tokio::spawn(async move { client.move_tablets(table, 0, u64::MAX, target).await })
        };
        let until = Instant::now() + Duration::from_secs(20);
        let open = loop {
            let view = client.rebalance(RebalanceAction::Show).await.unwrap();
            if let Some(open) = view.moves.first() {
                break *open;
            }
            assert!(Instant::now() < until, "the move never showed as open");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!((open.source, open.target), (source, target));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!mover.is_finished(), "the capped move finished in 2 s");
        client.cancel_move(open.id).await.unwrap();
        let moved = tokio::time::timeout(Duration::from_secs(30), mover)
            .await
            .expect("the cancelled move answered")
            .unwrap();
        assert!(moved.is_err(), "the cancelled move committed: {moved:?}");
        assert!(
            client.cancel_move(open.id).await.is_err(),
            "cancelled twice"
        );
        assert_eq!(tablets(&group, table).await, before);
        check_keys(&client, table, &keys).await;
        // Uncapped, the same move goes through.
        client.rebalance(RebalanceAction::Cap(0)).await.unwrap();
        client
            .move_tablets(table, 0, u64::MAX, target)
            .await
            .unwrap();
        let after = tablets(&group, table).await;
        assert!(after.iter().all(|t| t.owner == target), "{after:?}");
        check_keys(&client, table, &keys).await;
    });
}
