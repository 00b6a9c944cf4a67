//! Changing a table's tablets on a real `rampart cluster up` (issue 42): a split by
//! `rampart tablet split` while clients write, then a `kill -9` of the split tablet's
//! master, whose recovery must bring back every live key of both halves and none of
//! the keys deleted before the split and never written again; a move by `rampart
//! tablet move` under a writer, back again, then a `kill -9` of the owner; and a move
//! that fails after the freeze, aborted, with the news of the abort lost; and moves held
//! with their range frozen while `kill -9` takes their source, their target, then the
//! coordinators' leader; a server drained by `rampart drain` under a writer, then a
//! crash of another, recovered from the backups left; a drained server's process exits
//! cleanly (status 0: a supervisor does not restart it); and enumerations across a move
//! and a split, each key returned once.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_client::ClientError;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::failpoints::FAILPOINTS_ENV;
use rampart_common::ids::{key_hash, MoveId, ServerId, TableId};
use rampart_common::protocol::coordinator::{
    GetMove, GetTabletMap, MoveIdRequest, MoveState, RaftStatus, RaftStatusRequest,
    TabletMapRequest,
};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::{ServerStatus, Tablet};
use rampart_tests::{process_alive, runtime, LocalCluster, SMALL_SERVERS};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The table's tablets as the coordinators hold them now.
async fn tablets(cluster: &LocalCluster, table: TableId) -> Vec<Tablet> {
    let set = CoordinatorSet::new(&[cluster.coordinator.as_str()]);
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

#[test]
fn a_split_tablet_serves_throughout_and_its_master_recovers_with_deleted_keys_gone() {
    let flags = [&["--replicas", "2"], SMALL_SERVERS].concat();
    let cluster = LocalCluster::start(4, &flags).unwrap();
    runtime().block_on(async {
        let client = cluster.client(Duration::from_secs(30)).await.unwrap();
        let table = client.create_table("split", 2).await.unwrap();
        let before = tablets(&cluster, table).await;
        assert_eq!(before.len(), 2);
        // 300 keys, 100 of them deleted and never written again.
        let keys: Vec<String> = (0..300).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            client
                .write(table, key.as_bytes(), key.as_bytes())
                .await
                .unwrap();
        }
        let (deleted, live) = keys.split_at(100);
        for key in deleted {
            client.remove(table, key.as_bytes()).await.unwrap();
        }

        // Writers on keys of their own go on while the tablet is split.
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let writer = {
            let (client, stop, written) = (client.clone(), stop.clone(), written.clone());
            tokio::spawn(async move {
                let mut round = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    round += 1;
                    for j in 0..20 {
                        let key = format!("busy-{j}");
                        let value = round.to_string();
                        client
                            .write(table, key.as_bytes(), value.as_bytes())
                            .await?;
                        written.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok::<u64, ClientError>(round)
            })
        };

        // The lower tablet split at a quarter of the hash space, from the shell.
        let at = "0x4000000000000000";
        let split = cluster
            .rampart(&["tablet", "split", "split", at], None)
            .unwrap();
        assert!(split.status.success(), "{}", text(&split.stderr));
        let out = text(&split.stdout);
        assert!(out.contains(": split"), "{out}");
        let after = tablets(&cluster, table).await;
        let owner = before[0].owner;
        assert_eq!(
            after,
            vec![
                Tablet {
                    end_hash: (1 << 62) - 1,
                    ..before[0]
                },
                Tablet {
                    start_hash: 1 << 62,
                    ..before[0]
                },
                before[1],
            ]
        );
        assert!(out.contains(&format!("on {owner}")), "{out}");
        // Again: nothing changes.
        let again = cluster
            .rampart(&["tablet", "split", "split", at], None)
            .unwrap();
        assert!(again.status.success(), "{}", text(&again.stderr));
        assert!(
            text(&again.stdout).contains("unchanged"),
            "{}",
            text(&again.stdout)
        );
        assert_eq!(tablets(&cluster, table).await, after);
        // Through the library, at a key's hash in the upper half of the lower tablet.
        let key = live
            .iter()
            .find(|k| {
                let hash = key_hash(k.as_bytes()).0;
                hash > (1 << 62) && hash < before[0].end_hash
            })
            .unwrap();
        let hash = key_hash(key.as_bytes()).0;
        let (halves, split) = client.split_tablet(table, hash).await.unwrap();
        assert!(split);
        assert_eq!(halves[1].start_hash, hash);
        assert_eq!(tablets(&cluster, table).await.len(), 4);
        // Bad input: a clear error, exit 2.
        let bad = cluster
            .rampart(&["tablet", "split", "nosuch", "5"], None)
            .unwrap();
        assert_eq!(bad.status.code(), Some(2));
        assert!(
            text(&bad.stderr).contains("nosuch"),
            "{}",
            text(&bad.stderr)
        );

        stop.store(true, Ordering::SeqCst);
        let rounds = writer
            .await
            .unwrap()
            .expect("every write during the splits succeeded");
        assert!(written.load(Ordering::SeqCst) >= 20, "{rounds} rounds");
        // Each round wrote every key: each holds the last round's value.
        for j in 0..20 {
            let key = format!("busy-{j}");
            let object = client.read(table, key.as_bytes()).await.unwrap().unwrap();
            assert_eq!(object.value, rounds.to_string().as_bytes(), "{key}");
        }

        // Every live key once, no deleted one, across the new tablets.
        check_keys(&client, table, live, deleted).await;

        // The split tablets' master dies; its recovery brings both halves back.
        let pid = kill(&cluster, owner);
        check_keys(&client, table, live, deleted).await;
        assert!(!process_alive(pid));
        let recovered = tablets(&cluster, table).await;
        assert!(recovered.iter().all(|t| t.owner != owner), "{recovered:?}");
    });
}

/// Keys that a move must carry as they are: 200 live, 100 deleted and never written
/// again, 12 MB of filler (so that the copy takes a while), and 3000 keys for the
/// writer to delete; and a writer that goes on throughout (see [`MoveLoad::start`]).
struct MoveLoad {
    client: rampart_client::Client,
    table: TableId,
    live: Vec<String>,
    deleted: Vec<String>,
    stop: Arc<AtomicBool>,
    writer: tokio::task::JoinHandle<Result<u64, ClientError>>,
}

/// Keys the writer deletes, one per round, never written again.
const DOOMED: u64 = 3000;

impl MoveLoad {
    /// Writes the keys, then starts the writer. Each round writes a key never written
    /// before or after, deletes a doomed key, and overwrites five keys of its own; every
    /// operation must succeed (the client retries through a freeze and a hand-over).
    async fn start(client: &rampart_client::Client, table: TableId) -> MoveLoad {
        let keys: Vec<String> = (0..300).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            client
                .write(table, key.as_bytes(), key.as_bytes())
                .await
                .unwrap();
        }
        let (deleted, live) = keys.split_at(100);
        for key in deleted {
            client.remove(table, key.as_bytes()).await.unwrap();
        }
        let filler = vec![7u8; 8 << 10];
        for i in 0..1500 {
            let key = format!("filler-{i}");
            client.write(table, key.as_bytes(), &filler).await.unwrap();
        }
        for i in 0..DOOMED {
            let key = format!("doomed-{i}");
            client.write(table, key.as_bytes(), b"d").await.unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut round = 0u64;
                while !stop.load(Ordering::SeqCst) && round + 1 < DOOMED {
                    round += 1;
                    let once = format!("once-{round}");
                    client.write(table, once.as_bytes(), b"o").await?;
                    let doomed = format!("doomed-{round}");
                    client.remove(table, doomed.as_bytes()).await?;
                    for j in 0..5 {
                        let key = format!("busy-{j}");
                        client
                            .write(table, key.as_bytes(), round.to_string().as_bytes())
                            .await?;
                    }
                }
                Ok::<u64, ClientError>(round)
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        MoveLoad {
            client: client.clone(),
            table,
            live: live.to_vec(),
            deleted: deleted.to_vec(),
            stop,
            writer,
        }
    }

    /// Stops the writer (every operation of it succeeded); returns its rounds.
    async fn stop(&mut self) -> u64 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.stop.store(true, Ordering::SeqCst);
        (&mut self.writer)
            .await
            .unwrap()
            .expect("every write and removal of the writer succeeded")
    }

    /// Reads back everything: what the writer wrote and deleted after `rounds`, the live
    /// keys, no deleted one; an enumeration returns each live key once.
    async fn check(&self, rounds: u64) {
        let (client, table) = (&self.client, self.table);
        for j in 0..5 {
            let key = format!("busy-{j}");
            let object = client.read(table, key.as_bytes()).await.unwrap().unwrap();
            assert_eq!(object.value, rounds.to_string().as_bytes(), "{key}");
        }
        for round in 1..=rounds {
            let once = format!("once-{round}");
            let object = client.read(table, once.as_bytes()).await.unwrap();
            assert!(object.is_some(), "{once} was lost");
        }
        for i in 0..DOOMED {
            let doomed = format!("doomed-{i}");
            let object = client.read(table, doomed.as_bytes()).await.unwrap();
            let removed = (1..=rounds).contains(&i);
            assert_eq!(object.is_none(), removed, "{doomed}");
        }
        check_keys(client, table, &self.live, &self.deleted).await;
    }
}

/// Each live key reads as written (its own name), no deleted one reads, and an
/// enumeration returns each live `key-` key once and no other.
async fn check_keys(
    client: &rampart_client::Client,
    table: TableId,
    live: &[String],
    deleted: &[String],
) {
    for key in live {
        let object = client.read(table, key.as_bytes()).await.unwrap();
        assert_eq!(
            object.map(|o| o.value.to_vec()),
            Some(key.as_bytes().to_vec())
        );
    }
    for key in deleted {
        let object = client.read(table, key.as_bytes()).await.unwrap();
        assert!(object.is_none(), "{key} came back");
    }
    let enumerated: Vec<String> = client
        .enumerate(table)
        .collect_all()
        .await
        .unwrap()
        .into_iter()
        .map(|object| text(&object.key))
        .filter(|key| key.starts_with("key-"))
        .collect();
    let unique: BTreeSet<&String> = enumerated.iter().collect();
    assert_eq!(enumerated.len(), unique.len(), "no key twice");
    assert_eq!(unique, live.iter().collect::<BTreeSet<_>>());
}

/// `kill -9` of server `id` of `cluster`; its pid.
fn kill(cluster: &LocalCluster, id: ServerId) -> u32 {
    let pid = cluster
        .servers
        .iter()
        .find(|(server, _, _)| id.0 == *server)
        .map(|&(_, _, pid)| pid)
        .unwrap();
    // SAFETY: kill(2) of a server `cluster up` started and still holds.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    pid
}

/// A master of `cluster` other than `owner`.
fn another(cluster: &LocalCluster, owner: ServerId) -> ServerId {
    cluster
        .servers
        .iter()
        .map(|&(id, _, _)| ServerId(id))
        .find(|&id| id != owner)
        .unwrap()
}

/// `rampart tablet move TABLE all --to TARGET`.
fn move_all(cluster: &LocalCluster, table: &str, target: ServerId) -> std::process::Output {
    cluster
        .rampart(
            &["tablet", "move", table, "all", "--to", &target.to_string()],
            None,
        )
        .unwrap()
}

#[test]
fn a_tablet_moved_away_and_back_serves_throughout_and_keeps_deleted_keys_deleted_through_a_crash() {
    let flags = [&["--replicas", "2"], SMALL_SERVERS].concat();
    let cluster = LocalCluster::start(4, &flags).unwrap();
    runtime().block_on(async {
        let client = cluster.client(Duration::from_secs(30)).await.unwrap();
        let table = client.create_table("moving", 1).await.unwrap();
        let source = tablets(&cluster, table).await[0].owner;
        let mut load = MoveLoad::start(&client, table).await;

        // From the shell, to another master, under the writer.
        let target = another(&cluster, source);
        let moved = move_all(&cluster, "moving", target);
        assert!(moved.status.success(), "{}", text(&moved.stderr));
        let out = text(&moved.stdout);
        assert!(
            out.contains(&format!("moved from {source} to {target}")),
            "{out}"
        );
        let after = tablets(&cluster, table).await;
        assert!(after.iter().all(|t| t.owner == target), "{after:?}");
        // Bad input: a clear error, exit 2, nothing changed.
        let bad = move_all(&cluster, "moving", ServerId(999));
        assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stdout));
        assert_eq!(tablets(&cluster, table).await, after);

        let rounds = load.stop().await;
        load.check(rounds).await;

        // Back to the source, through the library: the source cleaned what it forgot
        // when the range left, and takes it again.
        let back = client
            .move_tablets(table, 0, u64::MAX, source)
            .await
            .unwrap();
        assert_eq!(back.moves.len(), 1);
        assert_eq!(back.moves[0].source, target);
        // Again: on the source already, nothing to move.
        let again = client
            .move_tablets(table, 0, u64::MAX, source)
            .await
            .unwrap();
        assert!(again.moves.is_empty(), "{again:?}");
        load.check(rounds).await;

        // The source dies: its recovery brings back what it holds now, and nothing of
        // what its log held before the range left and came back.
        let pid = kill(&cluster, source);
        load.check(rounds).await;
        assert!(!process_alive(pid));
        let recovered = tablets(&cluster, table).await;
        assert!(recovered.iter().all(|t| t.owner != source), "{recovered:?}");
    });
}

#[test]
fn a_move_that_fails_after_the_freeze_is_aborted_and_the_source_serves_again() {
    // The first move into any master fails once its source froze the range, and no
    // source unfreezes on EndMove: only its frozen watch, asking the coordinators how
    // the move ended, serves the range again.
    let env = [(
        FAILPOINTS_ENV,
        "master-move-in-fails-after-freeze=1*return,master-ignore-end-move",
    )];
    // One coordinator: with three, a leader deposed under a loaded machine leaves the
    // abort's outcome unknown, the client asks for the move again, and the retry drives
    // the same open move to its commit (correct, but not what this test is about).
    let flags = [&["--replicas", "2", "--coordinators", "1"], SMALL_SERVERS].concat();
    let data = tempfile::TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_env(data, 3, &flags, &env).unwrap();
    runtime().block_on(async {
        let client = cluster.client(Duration::from_secs(30)).await.unwrap();
        let table = client.create_table("aborted", 1).await.unwrap();
        let before = tablets(&cluster, table).await;
        let source = before[0].owner;
        let mut load = MoveLoad::start(&client, table).await;

        let target = another(&cluster, source);
        let failed = move_all(&cluster, "aborted", target);
        assert_eq!(failed.status.code(), Some(2), "{}", text(&failed.stdout));
        assert!(
            text(&failed.stderr).contains("aborted"),
            "{}",
            text(&failed.stderr)
        );
        assert_eq!(tablets(&cluster, table).await, before, "nothing moved");
        // The writer waited out the freeze (its retries within its deadline) and goes
        // on on the source.
        let rounds = load.stop().await;
        load.check(rounds).await;

        // The same move again succeeds, and the target's leftovers of the first are
        // gone: it holds exactly what the source held.
        let moved = move_all(&cluster, "aborted", target);
        assert!(moved.status.success(), "{}", text(&moved.stderr));
        assert!(tablets(&cluster, table)
            .await
            .iter()
            .all(|t| t.owner == target));
        load.check(rounds).await;
    });
}

/// Server ids of `cluster` not in `dead`.
fn alive(cluster: &LocalCluster, dead: &[ServerId]) -> Vec<ServerId> {
    cluster
        .servers
        .iter()
        .map(|&(id, _, _)| ServerId(id))
        .filter(|id| !dead.contains(id))
        .collect()
}

/// `rampart tablet move TABLE all --to TARGET` in the background.
fn move_all_in_background(
    cluster: &LocalCluster,
    table: &str,
    target: ServerId,
) -> tokio::task::JoinHandle<std::process::Output> {
    let coordinator = cluster.coordinator.clone();
    let args: Vec<String> = ["tablet", "move", table, "all", "--to", &target.to_string()]
        .map(String::from)
        .into();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        rampart_tests::rampart(&args, None, &[("RAMPART_COORDINATOR", &coordinator)]).unwrap()
    })
}

/// Waits until the coordinators hold an open move, then a moment more, so that the
/// target reached the failpoint that holds it with the range frozen.
async fn wait_move_open(cluster: &LocalCluster) {
    let set = CoordinatorSet::new(&[cluster.coordinator.as_str()]);
    let pool = RpcPool::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        for id in 1..=16 {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            let request = MoveIdRequest { id: MoveId(id) };
            if let Ok(MoveState::Open) = set.call::<GetMove>(&pool, &request, deadline).await {
                tokio::time::sleep(Duration::from_secs(1)).await;
                return;
            }
        }
        assert!(tokio::time::Instant::now() < until, "no move opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `kill -9` of the coordinator that leads now; its pid.
async fn kill_leader(cluster: &LocalCluster) -> u32 {
    let pool = RpcPool::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let (_, addr, _) = &cluster.coordinators[0];
    let status = pool
        .call::<RaftStatus>(addr, &RaftStatusRequest {}, deadline)
        .await
        .unwrap();
    let &(_, _, pid) = cluster
        .coordinators
        .iter()
        .find(|(id, _, _)| *id == status.leader_id)
        .unwrap();
    // SAFETY: kill(2) of a coordinator `cluster up` started and still holds.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    pid
}

/// Waits until every tablet of `table` is owned by one of `owners`; returns the owner.
async fn wait_owned(cluster: &LocalCluster, table: TableId, owners: &[ServerId]) -> ServerId {
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = tablets(cluster, table).await;
        if let Some(first) = now.first() {
            if owners.contains(&first.owner) && now.iter().all(|t| t.owner == first.owner) {
                return first.owner;
            }
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{now:?} not on {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_move_interrupted_by_kill_9_of_the_source_then_the_target_then_the_leader_loses_nothing() {
    // Every move into any master waits 3 s with its range frozen, right after the
    // freeze: the kills land in the middle of the move.
    let env = [(
        FAILPOINTS_ENV,
        "master-move-in-holds-after-freeze=return(3000)",
    )];
    let flags = [&["--replicas", "2"], SMALL_SERVERS].concat();
    let data = tempfile::TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_env(data, 5, &flags, &env).unwrap();
    runtime().block_on(async {
        let client = cluster.client(Duration::from_secs(30)).await.unwrap();
        let mut dead = Vec::new();

        // The source dies: the move commits (the target took everything before the
        // source was found dead) or aborts and the source's recovery takes the range.
        let table = client.create_table("source-dies", 1).await.unwrap();
        let source = tablets(&cluster, table).await[0].owner;
        let mut load = MoveLoad::start(&client, table).await;
        let target = *alive(&cluster, &[source]).first().unwrap();
        let moving = move_all_in_background(&cluster, "source-dies", target);
        wait_move_open(&cluster).await;
        kill(&cluster, source);
        dead.push(source);
        let out = moving.await.unwrap();
        eprintln!("move with its source killed: {}", text(&out.stderr));
        let owner = wait_owned(&cluster, table, &alive(&cluster, &dead)).await;
        let rounds = load.stop().await;
        load.check(rounds).await;
        let source_dies = (table, load, rounds);

        // The target dies: the move aborts, and the source serves the range again.
        let table = client.create_table("target-dies", 1).await.unwrap();
        let source = tablets(&cluster, table).await[0].owner;
        let mut load = MoveLoad::start(&client, table).await;
        let target = *alive(&cluster, &[&dead[..], &[source, owner]].concat())
            .first()
            .unwrap();
        let moving = move_all_in_background(&cluster, "target-dies", target);
        wait_move_open(&cluster).await;
        kill(&cluster, target);
        dead.push(target);
        let out = moving.await.unwrap();
        assert!(!out.status.success(), "{}", text(&out.stdout));
        assert_eq!(wait_owned(&cluster, table, &[source]).await, source);
        let rounds = load.stop().await;
        load.check(rounds).await;
        let target_dies = (table, load, rounds);

        // The leader dies: the new leader aborts the move nobody drives, or the
        // command's retry moves the range; either way once.
        let table = client.create_table("leader-dies", 1).await.unwrap();
        let source = tablets(&cluster, table).await[0].owner;
        let mut load = MoveLoad::start(&client, table).await;
        let target = *alive(&cluster, &[&dead[..], &[source]].concat())
            .first()
            .unwrap();
        let moving = move_all_in_background(&cluster, "leader-dies", target);
        wait_move_open(&cluster).await;
        let leader = kill_leader(&cluster).await;
        let out = moving.await.unwrap();
        eprintln!("move with the leader killed: {}", text(&out.stderr));
        wait_owned(&cluster, table, &[source, target]).await;
        let rounds = load.stop().await;
        load.check(rounds).await;
        assert!(!process_alive(leader));

        // Each table moves again, to the same master, and reads back whole.
        let last = *alive(&cluster, &dead).last().unwrap();
        for name in ["source-dies", "target-dies", "leader-dies"] {
            let moved = move_all(&cluster, name, last);
            assert!(moved.status.success(), "{name}: {}", text(&moved.stderr));
        }
        for (table, load, rounds) in [source_dies, target_dies, (table, load, rounds)] {
            assert_eq!(wait_owned(&cluster, table, &[last]).await, last);
            load.check(rounds).await;
        }
    });
}

#[test]
fn a_server_drained_under_load_leaves_nothing_behind_and_a_later_crash_loses_nothing() {
    // Five servers, R = 2: after the drain and a crash, three are left, enough for
    // every master's two replicas.
    let flags = [&["--replicas", "2"], SMALL_SERVERS].concat();
    let cluster = LocalCluster::start(5, &flags).unwrap();
    runtime().block_on(async {
        let client = cluster.client(Duration::from_secs(30)).await.unwrap();
        let table = client.create_table("drained", 5).await.unwrap();
        let mut load = MoveLoad::start(&client, table).await;
        let drained = tablets(&cluster, table).await[0].owner;

        // Bad input: an unknown server; exit 2 with the reason.
        let unknown = cluster.rampart(&["drain", "server-99"], None).unwrap();
        assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown.stdout));

        let out = cluster
            .rampart(&["drain", &drained.to_string()], None)
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("removed"),
            "{}",
            text(&out.stdout)
        );
        let after = tablets(&cluster, table).await;
        assert!(after.iter().all(|t| t.owner != drained), "{after:?}");

        // Writes went on throughout, and everything reads back.
        let rounds = load.stop().await;
        load.check(rounds).await;

        // Removed, without a recovery, and its process is gone.
        let set = CoordinatorSet::new(&[cluster.coordinator.as_str()]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let map = set
            .call::<GetTabletMap>(&RpcPool::new(), &TabletMapRequest {}, deadline)
            .await
            .unwrap();
        let status = map
            .servers
            .iter()
            .find(|s| s.id == drained)
            .map(|s| s.status);
        assert_eq!(status, Some(ServerStatus::Removed));
        let pid = cluster
            .servers
            .iter()
            .find(|(id, _, _)| *id == drained.0)
            .map(|&(_, _, pid)| pid)
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while process_alive(pid) {
            assert!(
                std::time::Instant::now() < until,
                "the drained server runs on"
            );
            std::thread::sleep(Duration::from_millis(100));
        }

        // The masters re-created what the drained backup held: a crash of one now is
        // recovered from the backups left, whole.
        let owner = tablets(&cluster, table).await[0].owner;
        kill(&cluster, owner);
        load.check(rounds).await;
        let recovered = tablets(&cluster, table).await;
        assert!(recovered.iter().all(|t| t.owner != owner), "{recovered:?}");

        // Three servers left with R = 2: draining another would make writes wait.
        let other = *alive(&cluster, &[drained, owner]).first().unwrap();
        let refused = cluster
            .rampart(&["drain", &other.to_string()], None)
            .unwrap();
        assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stdout));
        assert!(
            text(&refused.stderr).contains("start another server"),
            "{}",
            text(&refused.stderr)
        );
    });
}

#[test]
fn an_enumeration_across_a_move_and_a_split_returns_each_key_once() {
    let flags = [&["--replicas", "2"], SMALL_SERVERS].concat();
    let cluster = LocalCluster::start(3, &flags).unwrap();
    runtime().block_on(async {
        let client = cluster.client(Duration::from_secs(30)).await.unwrap();
        let table = client.create_table("enumerated", 1).await.unwrap();
        // 12 MB: a dozen pages of 1 MiB.
        let value = vec![5u8; 4 << 10];
        let keys: BTreeSet<String> = (0..3000).map(|i| format!("e-{i}")).collect();
        for key in &keys {
            client.write(table, key.as_bytes(), &value).await.unwrap();
        }
        let owner = tablets(&cluster, table).await[0].owner;
        let others = alive(&cluster, &[owner]);

        // Another enumeration runs throughout, from start to end, over and over.
        let stop = Arc::new(AtomicBool::new(false));
        let background = {
            let (client, stop, keys) = (client.clone(), stop.clone(), keys.clone());
            tokio::spawn(async move {
                let mut rounds = 0;
                while !stop.load(Ordering::SeqCst) {
                    let found: Vec<String> = client
                        .enumerate(table)
                        .collect_all()
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|o| text(&o.key))
                        .collect();
                    let unique: BTreeSet<String> = found.iter().cloned().collect();
                    assert_eq!(found.len(), unique.len(), "a key twice");
                    assert_eq!(unique, keys, "a key missed");
                    rounds += 1;
                }
                rounds
            })
        };

        let mut enumeration = client.enumerate(table);
        let mut found: Vec<String> = Vec::new();
        let page = |found: &mut Vec<String>, objects: Vec<_>| {
            found.extend(
                objects
                    .into_iter()
                    .map(|o: rampart_common::protocol::master::EnumeratedObject| text(&o.key)),
            );
        };
        for _ in 0..3 {
            let objects = enumeration.next_page().await.unwrap().unwrap();
            page(&mut found, objects);
        }
        // The whole table moves between two pages.
        client
            .move_tablets(table, 0, u64::MAX, others[0])
            .await
            .unwrap();
        for _ in 0..3 {
            let objects = enumeration.next_page().await.unwrap().unwrap();
            page(&mut found, objects);
        }
        // The rest is split ahead of the cursor, and its upper half moves on.
        let cursor = enumeration.resume_hash().unwrap();
        let at = cursor + (u64::MAX - cursor) / 2;
        client.split_tablet(table, at).await.unwrap();
        client
            .move_tablets(table, at, u64::MAX, others[1])
            .await
            .unwrap();
        while let Some(objects) = enumeration.next_page().await.unwrap() {
            page(&mut found, objects);
        }
        let unique: BTreeSet<String> = found.iter().cloned().collect();
        assert_eq!(found.len(), unique.len(), "a key twice");
        assert_eq!(unique, keys, "a key missed");

        stop.store(true, Ordering::SeqCst);
        let rounds = background.await.unwrap();
        assert!(rounds >= 1);
    });
}

#[test]
fn a_drained_server_is_told_so_and_exits_cleanly() {
    use rampart_common::protocol::coordinator::DrainState;
    let dir = tempfile::TempDir::new().unwrap();
    let group = rampart_tests::CoordinatorGroup::start(1).unwrap();
    let mut servers: Vec<rampart_tests::RampartProcess> = (0..3)
        .map(|i| {
            let data = dir.path().join(format!("server-{i}"));
            group.start_server(&data, &["--replicas", "1"]).unwrap()
        })
        .collect();
    let drained = ServerId(servers[0].server_id());
    let keys: Vec<String> = (0..100).map(|i| format!("key-{i}")).collect();
    let client = runtime().block_on(async {
        let options = rampart_client::ClientOptions {
            deadline: Duration::from_secs(30),
            ..Default::default()
        };
        let client = rampart_client::Client::connect_with(&[group.addrs()], options)
            .await
            .unwrap();
        let table = client.create_table("drained", 3).await.unwrap();
        for key in &keys {
            client
                .write(table, key.as_bytes(), key.as_bytes())
                .await
                .unwrap();
        }
        let mut reply = client.drain_server(drained).await.unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while reply.state != DrainState::Removed {
            assert_ne!(reply.state, DrainState::NotDraining, "{reply:?}");
            assert!(
                std::time::Instant::now() < until,
                "never removed: {reply:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            reply = client.drain_status(drained).await.unwrap();
        }
        (client, table)
    });
    let status = servers[0].wait_exit(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "a drained server exits 0: {status:?}");
    let (client, table) = client;
    runtime().block_on(async {
        for key in &keys {
            let object = client.read(table, key.as_bytes()).await.unwrap();
            assert_eq!(
                object.map(|o| o.value.to_vec()),
                Some(key.as_bytes().to_vec())
            );
        }
    });
}
