//! The Raft-replicated coordinator as real processes on loopback: SIGKILL of the leader
//! under configuration changes, the whole group killed and restarted, and a minority
//! that refuses changes.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_client::{Client, ClientOptions};
use rampart_common::ids::TableId;
use rampart_common::protocol::coordinator::{
    GetTabletMap, RaftStatus, RaftStatusRequest, TabletMapRequest,
};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::{ServerStatus, TabletMap};
use rampart_tests::{runtime, CoordinatorGroup, RampartProcess};
use std::time::Duration;
use tokio::time::Instant;

const SERVER_FLAGS: &[&str] = &[
    "--memory",
    "64MiB",
    "--segment-bytes",
    "128KiB",
    "--value-bytes-max",
    "16KiB",
    "--replicas",
    "1",
    "--disk-mbps",
    "500",
];

const ELECTION: Duration = Duration::from_secs(10);

async fn connect(group: &CoordinatorGroup, deadline: Duration) -> Client {
    let addrs = group.addrs();
    let addrs: Vec<&str> = addrs.split(',').collect();
    let options = ClientOptions {
        deadline,
        ..ClientOptions::default()
    };
    Client::connect_with(&addrs, options).await.unwrap()
}

/// The tablet map from whichever coordinator leads (linearizable).
async fn tablet_map(group: &CoordinatorGroup) -> TabletMap {
    let pool = RpcPool::new();
    let deadline = Instant::now() + ELECTION;
    loop {
        for (_, addr) in &group.peers {
            let call = (Instant::now() + Duration::from_millis(500)).min(deadline);
            if let Ok(map) = pool
                .call::<GetTabletMap>(addr, &TabletMapRequest {}, call)
                .await
            {
                return map;
            }
        }
        assert!(Instant::now() < deadline, "no coordinator served the map");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `after` holds the servers and tables `before` held. Its version may have moved on: the
/// running servers keep committing commands that leave the map as it was (a will upload
/// once their tablets changed, a version reservation once their log is open), some of
/// them after `before` was read.
fn assert_same_configuration(after: &TabletMap, before: &TabletMap) {
    assert_eq!(
        after.servers, before.servers,
        "the servers came back different"
    );
    assert_eq!(
        after.tables, before.tables,
        "the tables came back different"
    );
    assert!(
        after.version >= before.version,
        "the configuration went back from version {} to {}",
        before.version,
        after.version
    );
}

/// Three coordinators and two storage servers enlisted with them (the servers' data in
/// the directory returned; declare the servers last so they stop first).
fn cluster() -> (CoordinatorGroup, tempfile::TempDir, Vec<RampartProcess>) {
    let group = CoordinatorGroup::start(3).unwrap();
    let data = tempfile::TempDir::new().unwrap();
    let servers = (0..2)
        .map(|i| {
            group
                .start_server(&data.path().join(format!("s{i}")), SERVER_FLAGS)
                .unwrap()
        })
        .collect();
    (group, data, servers)
}

fn server_id(server: &RampartProcess) -> u64 {
    server.server_id()
}

fn up(map: &TabletMap, id: u64) -> bool {
    map.servers
        .iter()
        .any(|s| s.id.0 == id && s.status == ServerStatus::Up)
}

#[test]
fn killing_the_leader_while_tables_are_created_and_servers_enlist_loses_nothing() {
    let (mut group, data, servers) = cluster();
    let rt = runtime();
    let client = rt.block_on(connect(&group, Duration::from_secs(15)));
    let creates = rt.spawn({
        let client = client.clone();
        async move {
            let mut results = Vec::new();
            for i in 0..30 {
                let name = format!("t{i}");
                let result = client.create_table(&name, 2).await;
                results.push((name, result));
            }
            results
        }
    });
    // Let a few creates commit, then kill the leader in the middle of the rest.
    std::thread::sleep(Duration::from_millis(300));
    let leader = rt.block_on(group.leader(ELECTION)).unwrap();
    group.kill(leader);
    let killed_at = std::time::Instant::now();
    // A server enlists while the group elects a new leader.
    let late = group
        .start_server(&data.path().join("late"), SERVER_FLAGS)
        .unwrap();
    let results = rt.block_on(creates).unwrap();
    eprintln!(
        "leader {leader} killed; creates done {:?} later",
        killed_at.elapsed()
    );

    let map = rt.block_on(tablet_map(&group));
    let mut ids: Vec<TableId> = Vec::new();
    for (name, result) in &results {
        match result {
            Ok(id) => {
                let table = map.tables.iter().find(|t| &t.name == name);
                assert_eq!(
                    table.map(|t| t.id),
                    Some(*id),
                    "{name} was acknowledged as {id} but the map says otherwise"
                );
                ids.push(*id);
            }
            // A call that failed must say why, clearly.
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    assert!(
        results.iter().filter(|(_, r)| r.is_ok()).count() >= 25,
        "most creates ride through the failover: {results:?}"
    );
    let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "one table created twice");
    for server in servers.iter().chain(std::iter::once(&late)) {
        assert!(
            up(&map, server_id(server)),
            "server {} lost",
            server_id(server)
        );
    }

    // The killed coordinator comes back and catches up.
    group.restart(leader).unwrap();
    let pool = RpcPool::new();
    let addr = group.peers[leader as usize - 1].1.clone();
    let deadline = Instant::now() + ELECTION;
    rt.block_on(async {
        loop {
            let call = Instant::now() + Duration::from_millis(500);
            if let Ok(status) = pool
                .call::<RaftStatus>(&addr, &RaftStatusRequest {}, call)
                .await
            {
                // At least: masters keep uploading their wills meanwhile.
                if status.config_version >= map.version {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the restarted coordinator did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[test]
fn killing_every_coordinator_and_restarting_them_brings_the_cluster_back() {
    let (mut group, _data, servers) = cluster();
    let rt = runtime();
    let table = rt.block_on(async {
        let client = connect(&group, Duration::from_secs(10)).await;
        let table = client.create_table("kept", 4).await.unwrap();
        for i in 0..100u32 {
            client
                .write(table, format!("k{i}").as_bytes(), &i.to_le_bytes())
                .await
                .unwrap();
        }
        table
    });
    let before = rt.block_on(tablet_map(&group));
    for id in 1..=3 {
        group.kill(id);
    }
    for id in 1..=3 {
        group.restart(id).unwrap();
    }
    rt.block_on(async {
        let after = tablet_map(&group).await;
        assert_same_configuration(&after, &before);
        for server in &servers {
            assert!(up(&after, server_id(server)));
        }
        // A fresh client finds the table and its data, and writes, with no manual step.
        let client = connect(&group, Duration::from_secs(10)).await;
        assert_eq!(client.get_table_id("kept").await.unwrap(), table);
        for i in 0..100u32 {
            let object = client
                .read(table, format!("k{i}").as_bytes())
                .await
                .unwrap();
            assert_eq!(object.unwrap().value.as_ref(), i.to_le_bytes());
        }
        client.write(table, b"after", b"restart").await.unwrap();
        let other = client.create_table("new", 2).await.unwrap();
        assert_ne!(other, table);
    });
    // `rampart status` shows one leader, two followers and both servers Up.
    let out =
        rampart_tests::rampart(&["status", "--coordinator", &group.addrs()], None, &[]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let roles: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|role| ["leader", "follower", "candidate"].contains(role))
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "leader").count(),
        1,
        "{text}"
    );
    assert_eq!(
        roles.iter().filter(|r| **r == "follower").count(),
        2,
        "{text}"
    );
    for server in &servers {
        let line = text
            .lines()
            .find(|l| l.contains(&server.addr))
            .unwrap_or_else(|| panic!("server {} missing: {text}", server.addr));
        assert!(line.contains(" up "), "{line}");
    }
    // And how each master's memory stands: the 101 objects written, between them.
    let objects: u64 = servers
        .iter()
        .filter_map(|server| {
            let line = text.lines().find(|l| l.contains(&server.addr))?;
            line.split_whitespace().nth(3)?.parse::<u64>().ok()
        })
        .sum();
    assert_eq!(objects, 101, "{text}");
    // The tables by name, with their tablets' owners.
    assert!(text.contains("  kept (id "), "{text}");
    assert!(text.contains("problems: none"), "{text}");
}

#[test]
fn a_lone_coordinator_refuses_changes_with_a_clear_error() {
    let (mut group, _data, _servers) = cluster();
    let rt = runtime();
    let client = rt.block_on(connect(&group, Duration::from_secs(3)));
    let table = rt.block_on(client.create_table("before", 1)).unwrap();
    rt.block_on(client.write(table, b"k", b"v")).unwrap();
    let leader = rt.block_on(group.leader(ELECTION)).unwrap();
    // Kill two, keeping the leader: it must notice it lost its majority and stop leading.
    for id in 1..=3 {
        if id != leader {
            group.kill(id);
        }
    }
    rt.block_on(async {
        let error = client.create_table("diverged", 1).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("no leader") || message.contains("majority"),
            "unclear error: {message}"
        );
        // Masters stop serving once their lease lapses (a master cut off from the
        // coordinators' majority might have been replaced): reads wait, and fail at their
        // deadline saying why (the lease, or the coordinators the client then asks).
        let error = client.read(table, b"k").await.unwrap_err().to_string();
        assert!(
            ["lease", "no leader", "majority"]
                .iter()
                .any(|w| error.contains(w)),
            "unclear error: {error}"
        );
    });
    // With a majority again, changes commit. (The refused create may still commit, if
    // the lone leader had appended it before stepping down: the error said so.)
    let back = if leader == 1 { 2 } else { 1 };
    group.restart(back).unwrap();
    rt.block_on(async {
        let client = connect(&group, Duration::from_secs(10)).await;
        let after = client.create_table("after", 1).await.unwrap();
        // Leases are granted again: data flows.
        let object = client.read(table, b"k").await.unwrap().unwrap();
        assert_eq!(object.value.as_ref(), b"v");
        let map = tablet_map(&group).await;
        assert!(map.tables.iter().any(|t| t.id == after));
        assert!(map.tables.iter().any(|t| t.id == table));
    });
}

#[test]
fn a_wiped_member_is_refused_and_the_group_is_re_created_from_a_seed() {
    let (mut group, data, _servers) = cluster();
    let rt = runtime();
    let table = rt.block_on(async {
        let client = connect(&group, Duration::from_secs(10)).await;
        let table = client.create_table("kept", 2).await.unwrap();
        client.write(table, b"k", b"v").await.unwrap();
        table
    });
    let before = rt.block_on(tablet_map(&group));

    // Member 3 loses its data directory: starting it empty is refused, clearly.
    group.kill(3);
    std::fs::remove_dir_all(&group.dirs[&3]).unwrap();
    let args = group.member_args(3).unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = rampart_tests::rampart(&args, None, &[]).unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("cannot be recreated"), "{stderr}");

    // Re-create the group: stop all, export the survivors, seed every member afresh.
    for id in 1..=2 {
        group.kill(id);
    }
    let mut best: Option<(u64, u64, std::path::PathBuf)> = None;
    for id in 1..=2 {
        let file = data.path().join(format!("seed-{id}.bin"));
        let dir = group.dirs[&id].to_str().unwrap().to_string();
        let out = rampart_tests::rampart(
            &[
                "coordinator",
                "--data-dir",
                &dir,
                "--export",
                file.to_str().unwrap(),
            ],
            None,
            &[],
        )
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // "exported configuration version V (log index I, last term T) from ..."
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        let words: Vec<&str> = line.split_whitespace().collect();
        let index: u64 = words[6].trim_end_matches(',').parse().unwrap();
        let term: u64 = words[9].trim_end_matches(')').parse().unwrap();
        if best
            .as_ref()
            .map_or(true, |(t, i, _)| (term, index) > (*t, *i))
        {
            best = Some((term, index, file));
        }
    }
    let (_, _, seed) = best.unwrap();
    for id in 1..=3 {
        let fresh = data.path().join(format!("new-coordinator-{id}"));
        group.dirs.insert(id, fresh);
        group
            .restart_with(id, &["--seed", seed.to_str().unwrap()])
            .unwrap();
    }
    rt.block_on(async {
        assert_same_configuration(&tablet_map(&group).await, &before);
        let client = connect(&group, Duration::from_secs(10)).await;
        assert_eq!(client.get_table_id("kept").await.unwrap(), table);
        let object = client.read(table, b"k").await.unwrap().unwrap();
        assert_eq!(object.value.as_ref(), b"v");
        client.create_table("after", 1).await.unwrap();
    });
}
