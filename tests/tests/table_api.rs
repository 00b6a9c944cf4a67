//! The table API end to end: a real `rampart cluster up` process tree on loopback,
//! driven through the `rampart kv` CLI and through the client library.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_client::{Client, ClientError, RejectRules, Version, WriteItem};
use rampart_common::limits::{KEY_BYTES_MAX, VALUE_BYTES_MAX_DEFAULT};
use rampart_common::status::Status;
use rampart_tests::{process_alive, runtime, LocalCluster, SMALL_SERVERS};
use std::collections::BTreeSet;
use std::time::Duration;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn kv_cli_session_reads_writes_and_reports_missing_keys() {
    let cluster = LocalCluster::start(2, SMALL_SERVERS).unwrap();
    let kv = |args: &[&str], stdin: Option<&[u8]>| {
        let mut all = vec!["kv"];
        all.extend_from_slice(args);
        cluster.rampart(&all, stdin).unwrap()
    };

    let created = kv(&["create-table", "demo", "--span", "4"], None);
    assert!(created.status.success(), "{}", text(&created.stderr));
    assert_eq!(
        kv(&["create-table", "demo"], None).stdout,
        created.stdout,
        "create is idempotent"
    );

    let put = kv(&["put", "demo", "alice", "engineer"], None);
    assert!(put.status.success(), "{}", text(&put.stderr));
    let first_version: u64 = text(&put.stdout).trim().parse().unwrap();

    let get = kv(&["get", "demo", "alice"], None);
    assert!(get.status.success());
    assert_eq!(
        get.stdout, b"engineer",
        "into a pipe, get prints the value alone (no newline)"
    );
    assert_eq!(
        kv(&["get", "demo", "alice", "--raw"], None).stdout,
        b"engineer",
        "--raw: the bytes as stored"
    );

    let binary: Vec<u8> = (0..=255u8).collect();
    assert!(kv(&["put", "demo", "blob"], Some(&binary)).status.success());
    assert_eq!(
        kv(&["get", "demo", "blob"], None).stdout,
        binary,
        "values from stdin, raw bytes"
    );

    let overwrite = kv(&["put", "demo", "alice", "manager"], None);
    let second_version: u64 = text(&overwrite.stdout).trim().parse().unwrap();
    assert_eq!(second_version, first_version + 1);
    let with_version = kv(&["get", "demo", "alice", "--with-version"], None);
    assert_eq!(
        text(&with_version.stdout),
        format!("{second_version}\tmanager")
    );

    let missing = kv(&["get", "demo", "bob"], None);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(text(&missing.stderr).trim(), "not found");
    assert!(missing.stdout.is_empty());

    assert_eq!(
        text(&kv(&["incr", "demo", "hits", "5"], None).stdout).trim(),
        "5"
    );
    assert_eq!(
        text(&kv(&["incr", "demo", "hits", "-7"], None).stdout).trim(),
        "-2"
    );
    let not_integer = kv(&["incr", "demo", "alice"], None);
    assert_eq!(not_integer.status.code(), Some(2));
    assert!(text(&not_integer.stderr).contains("not an 8-byte integer"));

    let scan = kv(&["scan", "demo"], None);
    let keys: BTreeSet<String> = text(&scan.stdout)
        .lines()
        .map(|line| line.split('\t').next().unwrap().to_string())
        .collect();
    assert_eq!(keys, ["alice", "blob", "hits"].map(String::from).into());
    let blob_line = text(&scan.stdout)
        .lines()
        .find(|l| l.starts_with("blob\t"))
        .unwrap()
        .to_string();
    // One line per object: line breakers and non-ASCII are escaped, the rest is kept.
    for escaped in [
        r"\x00",
        r"\t",
        r"\n",
        r"\\",
        r"\xff",
        "\"",
        "0123456789",
        "ABCDEFGH",
        "abcdefgh",
    ] {
        assert!(
            blob_line.contains(escaped),
            "{escaped} missing in {blob_line}"
        );
    }

    assert!(kv(&["del", "demo", "alice"], None).status.success());
    assert_eq!(kv(&["get", "demo", "alice"], None).status.code(), Some(1));
    assert!(
        kv(&["del", "demo", "alice"], None).status.success(),
        "deleting twice is fine"
    );

    assert!(kv(&["drop-table", "demo"], None).status.success());
    let gone = kv(&["get", "demo", "blob"], None);
    assert_eq!(gone.status.code(), Some(2));
    assert!(
        text(&gone.stderr).contains("does not exist"),
        "{}",
        text(&gone.stderr)
    );

    let unreachable = rampart_tests::rampart(
        &["kv", "--timeout", "0.5", "get", "demo", "x"],
        None,
        &[("RAMPART_COORDINATOR", "127.0.0.1:1")],
    )
    .unwrap();
    assert_eq!(unreachable.status.code(), Some(2));
    assert!(text(&unreachable.stderr).contains("cannot reach the cluster"));
}

async fn connect(cluster: &LocalCluster) -> Client {
    cluster.client(Duration::from_secs(10)).await.unwrap()
}

#[test]
fn client_library_serves_every_operation_across_several_masters() {
    let cluster = LocalCluster::start(3, SMALL_SERVERS).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster).await;
        let table = client.create_table("people", 6).await.unwrap();
        assert_eq!(client.get_table_id("people").await.unwrap(), table);

        // Writes spread over six tablets on three masters; enumerate sees each once.
        let mut expected = BTreeSet::new();
        for i in 0..600u32 {
            let key = format!("key-{i}");
            client
                .write(table, key.as_bytes(), &i.to_le_bytes())
                .await
                .unwrap();
            expected.insert(key);
        }
        let mut seen = BTreeSet::new();
        let mut pages = client.enumerate(table);
        while let Some(page) = pages.next_page().await.unwrap() {
            for object in page {
                let key = String::from_utf8(object.key.to_vec()).unwrap();
                let i: u32 = key.trim_start_matches("key-").parse().unwrap();
                assert_eq!(&object.value[..], &i.to_le_bytes());
                assert!(seen.insert(key), "enumerate returned an object twice");
            }
        }
        assert_eq!(seen, expected);

        // Every master served some of them.
        let owners: BTreeSet<_> = (0..600u32)
            .map(|i| {
                rampart_common::ids::key_hash(format!("key-{i}").as_bytes()).0 / (u64::MAX / 6 + 1)
            })
            .collect();
        assert_eq!(owners.len(), 6, "keys cover every tablet");

        // Multi-ops, in input order, across masters.
        let items: Vec<WriteItem> = (0..50u32)
            .map(|i| WriteItem {
                table,
                key: format!("multi-{i}").into_bytes().into(),
                value: format!("value-{i}").into_bytes().into(),
                rules: RejectRules::default(),
            })
            .collect();
        let written = client.multi_write(&items).await.unwrap();
        assert!(written.iter().all(Result::is_ok));
        let keys: Vec<Vec<u8>> = (0..52u32)
            .map(|i| format!("multi-{i}").into_bytes())
            .collect();
        let key_refs: Vec<(rampart_client::TableId, &[u8])> =
            keys.iter().map(|k| (table, k.as_slice())).collect();
        let read = client.multi_read(&key_refs).await.unwrap();
        for (i, object) in read.iter().enumerate() {
            match object.as_ref().unwrap() {
                Some(object) => assert_eq!(object.value, format!("value-{i}").into_bytes()),
                None => assert!(i >= 50, "multi-{i} should exist"),
            }
        }
        // One bad object fails alone; the others are read.
        let long_key = vec![b'k'; KEY_BYTES_MAX + 1];
        let mixed = client
            .multi_read(&[(table, b"multi-1"), (table, &long_key)])
            .await
            .unwrap();
        assert!(matches!(mixed[0], Ok(Some(_))));
        assert!(matches!(
            mixed[1],
            Err(ClientError::Invalid {
                status: Status::KeyTooLarge,
                ..
            })
        ));
        let removed = client.multi_remove(&key_refs[..10]).await.unwrap();
        assert!(removed.iter().all(|r| matches!(r, Ok(Some(_)))));
        assert!(client.read(table, b"multi-3").await.unwrap().is_none());

        // Reject rules and versions.
        let v1 = client.write(table, b"cas", b"one").await.unwrap();
        let stale = client
            .write_with(
                table,
                b"cas",
                b"two",
                RejectRules::version_is(Version(v1.0 + 5)),
            )
            .await;
        assert!(matches!(
            stale,
            Err(ClientError::Rejected { status: Status::WrongVersion, current }) if current == v1
        ));
        let v2 = client
            .write_with(table, b"cas", b"two", RejectRules::version_is(v1))
            .await
            .unwrap();
        assert_eq!(v2, v1.next());
        let exists = client
            .write_with(table, b"cas", b"x", RejectRules::create_only())
            .await;
        assert!(matches!(
            exists,
            Err(ClientError::Rejected {
                status: Status::ObjectExists,
                ..
            })
        ));
        assert_eq!(client.remove(table, b"cas").await.unwrap(), Some(v2));
        let recreated = client.write(table, b"cas", b"three").await.unwrap();
        assert!(
            recreated > v2,
            "a re-created key gets a higher version ({recreated} > {v2})"
        );
        let missing = RejectRules {
            doesnt_exist: true,
            ..RejectRules::default()
        };
        let absent = client.remove_with(table, b"never", missing).await;
        assert!(matches!(
            absent,
            Err(ClientError::Rejected {
                status: Status::ObjectDoesntExist,
                ..
            })
        ));

        assert_eq!(client.increment(table, b"counter", 10).await.unwrap().0, 10);
        assert_eq!(client.increment(table, b"counter", -3).await.unwrap().0, 7);

        // Dropping and re-creating a table gives a fresh, empty table.
        client.drop_table("people").await.unwrap();
        assert!(matches!(
            client.read(table, b"key-1").await,
            Err(ClientError::TableDoesntExist(_))
        ));
        let again = client.create_table("people", 2).await.unwrap();
        assert_ne!(again, table, "table ids are never reused");
        assert!(client.read(again, b"key-1").await.unwrap().is_none());
        assert!(client
            .enumerate(again)
            .collect_all()
            .await
            .unwrap()
            .is_empty());
    });
}

#[test]
fn bad_input_gets_a_clear_error_and_the_cluster_keeps_serving() {
    let cluster =
        LocalCluster::start(1, &["--memory", "64MiB", "--segment-bytes", "4MiB"]).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster).await;
        let table = client.create_table("t", 1).await.unwrap();
        client.write(table, b"kept", b"value").await.unwrap();

        let long_key = vec![b'k'; KEY_BYTES_MAX + 1];
        let result = client.write(table, &long_key, b"v").await;
        assert!(matches!(
            result,
            Err(ClientError::Invalid {
                status: Status::KeyTooLarge,
                ..
            })
        ));
        let result = client.read(table, &long_key).await;
        assert!(matches!(
            result,
            Err(ClientError::Invalid {
                status: Status::KeyTooLarge,
                ..
            })
        ));

        let big_value = vec![0u8; VALUE_BYTES_MAX_DEFAULT + 1];
        let result = client.write(table, b"big", &big_value).await;
        assert!(matches!(
            result,
            Err(ClientError::Invalid {
                status: Status::ValueTooLarge,
                ..
            })
        ));
        let at_limit = vec![7u8; VALUE_BYTES_MAX_DEFAULT];
        client.write(table, b"big", &at_limit).await.unwrap();
        assert_eq!(
            client
                .read(table, b"big")
                .await
                .unwrap()
                .unwrap()
                .value
                .len(),
            at_limit.len()
        );

        assert!(matches!(
            client.get_table_id("no-such-table").await,
            Err(ClientError::TableDoesntExist(_))
        ));
        let unknown = rampart_client::TableId(9999);
        assert!(matches!(
            client.read(unknown, b"k").await,
            Err(ClientError::TableDoesntExist(_))
        ));
        assert!(matches!(
            client.create_table("", 1).await,
            Err(ClientError::Invalid {
                status: Status::InvalidArgument,
                ..
            })
        ));
        assert!(matches!(
            client.create_table("zero-span", 0).await,
            Err(ClientError::Invalid {
                status: Status::InvalidArgument,
                ..
            })
        ));

        // Nothing acknowledged was lost, and the master still serves.
        assert_eq!(
            &client.read(table, b"kept").await.unwrap().unwrap().value[..],
            b"value"
        );
        client.write(table, b"after", b"ok").await.unwrap();
    });
}

#[test]
fn a_full_master_refuses_writes_with_no_space_and_keeps_its_data() {
    // Eight 256 KiB segments, less the cleaner's and the index's: 16 KiB values fill
    // the log after about 90 writes (none dead, so the cleaner cannot help).
    let flags = [
        "--memory",
        "2MiB",
        "--segment-bytes",
        "256KiB",
        "--value-bytes-max",
        "16KiB",
    ];
    let cluster = LocalCluster::start(1, &flags).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster).await;
        let table = client.create_table("full", 1).await.unwrap();
        let mut acknowledged = Vec::new();
        let value = |i: u32| vec![(i % 251) as u8; 16 * 1024];
        for i in 0.. {
            match client
                .write(table, format!("k{i}").as_bytes(), &value(i))
                .await
            {
                Ok(_) => acknowledged.push(i),
                Err(ClientError::NoSpace) => break,
                Err(other) => panic!("unexpected error {other}"),
            }
            assert!(i < 1000, "the log never filled up");
        }
        assert!(
            acknowledged.len() > 30,
            "only {} writes fit",
            acknowledged.len()
        );
        // Full stays full, reads keep working, nothing acknowledged is lost.
        let more = client.write(table, b"more", &value(0)).await;
        assert!(matches!(more, Err(ClientError::NoSpace)), "{more:?}");
        for i in acknowledged {
            let object = client
                .read(table, format!("k{i}").as_bytes())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(object.value, value(i));
        }
    });
}

#[test]
fn cluster_up_stops_every_child_on_sigterm_and_when_killed() {
    let mut cluster = LocalCluster::start(2, &["--memory", "64MiB"]).unwrap();
    let pids: Vec<u32> = cluster.servers.iter().map(|(_, _, pid)| *pid).collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|pid| process_alive(*pid)));
    cluster.signal(libc::SIGTERM);
    assert!(cluster
        .wait_exit(Duration::from_secs(10))
        .unwrap()
        .success());
    wait_until_dead(&pids);

    // SIGKILL leaves no chance to clean up: the children die by PR_SET_PDEATHSIG.
    let mut cluster = LocalCluster::start(2, &["--memory", "64MiB"]).unwrap();
    let pids: Vec<u32> = cluster.servers.iter().map(|(_, _, pid)| *pid).collect();
    cluster.signal(libc::SIGKILL);
    cluster.wait_exit(Duration::from_secs(10)).unwrap();
    wait_until_dead(&pids);
}

fn wait_until_dead(pids: &[u32]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|pid| process_alive(*pid)) {
        assert!(
            std::time::Instant::now() < deadline,
            "children {pids:?} outlived cluster up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn operations_racing_a_table_drop_succeed_or_report_the_table_gone() {
    let cluster = LocalCluster::start(2, &["--memory", "64MiB"]).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster).await;
        let table = client.create_table("doomed", 4).await.unwrap();
        let keep = client.create_table("kept", 2).await.unwrap();
        client.write(keep, b"k", b"v").await.unwrap();

        let writers: Vec<_> = (0..4)
            .map(|w| {
                let client = client.clone();
                tokio::spawn(async move {
                    let (mut ok, mut gone) = (0u32, 0u32);
                    for i in 0..2_000u32 {
                        let key = format!("w{w}-{i}");
                        let result = if i % 2 == 0 {
                            client.write(table, key.as_bytes(), b"x").await.map(|_| ())
                        } else {
                            client.read(table, key.as_bytes()).await.map(|_| ())
                        };
                        match result {
                            Ok(()) => ok += 1,
                            Err(ClientError::TableDoesntExist(_)) => {
                                gone += 1;
                                break;
                            }
                            Err(other) => panic!("unexpected error while dropping: {other}"),
                        }
                    }
                    (ok, gone)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        client.drop_table("doomed").await.unwrap();
        let mut stopped = 0;
        for writer in writers {
            let (ok, gone) = writer.await.unwrap();
            assert!(ok > 0, "each writer got some operations in before the drop");
            stopped += gone;
        }
        assert!(stopped > 0, "the drop happened while writers were running");
        assert!(matches!(
            client.write(table, b"late", b"x").await,
            Err(ClientError::TableDoesntExist(_))
        ));
        // The other table was not disturbed.
        assert_eq!(
            &client.read(keep, b"k").await.unwrap().unwrap().value[..],
            b"v"
        );
    });
}

#[test]
fn a_multi_read_larger_than_one_reply_is_split_and_completed() {
    // Five 16 MiB values (80 MiB) cannot travel in one reply (64 MiB payload limit):
    // the master fills its 32 MiB multi-read budget and answers the rest `Retry`, and
    // the client asks again until it has them all. The multi-write is split by bytes.
    let flags = [
        "--memory",
        "512MiB",
        "--segment-bytes",
        "32MiB",
        "--value-bytes-max",
        "16MiB",
    ];
    let cluster = LocalCluster::start(1, &flags).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster).await;
        let table = client.create_table("big", 1).await.unwrap();
        let value = |i: u8| vec![i; 16 * 1024 * 1024];
        let items: Vec<WriteItem> = (1..=5u8)
            .map(|i| WriteItem {
                table,
                key: vec![b'k', i].into(),
                value: value(i).into(),
                rules: RejectRules::default(),
            })
            .collect();
        let written = client.multi_write(&items).await.unwrap();
        assert!(written.iter().all(Result::is_ok), "{written:?}");
        let keys: Vec<Vec<u8>> = (1..=5u8).map(|i| vec![b'k', i]).collect();
        let refs: Vec<(rampart_client::TableId, &[u8])> =
            keys.iter().map(|k| (table, k.as_slice())).collect();
        let read = client.multi_read(&refs).await.unwrap();
        for (i, object) in (1..=5u8).zip(read) {
            let object = object.unwrap().unwrap();
            assert!(object.value == value(i), "object {i} came back wrong");
        }
    });
}

/// Issue 14: a master overwrites one key forever. Before the cleaner, a 16 MiB master
/// answered `NoSpace` after 16 MiB of overwrites of one 80 KB value; now the cleaner
/// frees the dead copies and five times the memory goes through without a failure.
#[test]
fn one_key_overwritten_with_five_times_the_memory_never_fails() {
    let flags = [
        "--memory",
        "16MiB",
        "--segment-bytes",
        "1MiB",
        "--value-bytes-max",
        "128KiB",
        "--replicas",
        "1",
    ];
    let cluster = LocalCluster::start(2, &flags).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster).await;
        let table = client.create_table("hot", 1).await.unwrap();
        let writes = 5 * 16 * 1024 / 80;
        for i in 0..writes {
            let value = vec![(i % 251) as u8; 80 * 1000];
            client
                .write(table, b"the-key", &value)
                .await
                .unwrap_or_else(|e| panic!("write {i} of {writes}: {e}"));
        }
        let object = client.read(table, b"the-key").await.unwrap().unwrap();
        assert_eq!(object.value, vec![((writes - 1) % 251) as u8; 80 * 1000]);
    });
}

/// Issue 14: a long run of overwrites of many keys under a small `--memory` (live data
/// a third of it) never fails for want of memory, and every key reads its last value.
#[test]
fn a_long_overwrite_run_under_small_memory_never_runs_out() {
    let flags = [
        "--memory",
        "8MiB",
        "--segment-bytes",
        "256KiB",
        "--value-bytes-max",
        "16KiB",
        "--replicas",
        "1",
    ];
    let cluster = LocalCluster::start(2, &flags).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster).await;
        let table = client.create_table("churn", 2).await.unwrap();
        let keys = 700u64;
        let value = |key: u64, round: u64| {
            let mut v = format!("{key}:{round};").into_bytes();
            v.resize(4000, b'v');
            v
        };
        // 700 keys of 4 KB: 2.8 MB live over two masters of 8 MiB; ten rounds write
        // 28 MB, several times what the masters hold.
        let rounds = 10u64;
        for round in 0..rounds {
            let mut writes = tokio::task::JoinSet::new();
            for worker in 0..4u64 {
                let client = client.clone();
                writes.spawn(async move {
                    for key in (worker..keys).step_by(4) {
                        client
                            .write(table, format!("k{key}").as_bytes(), &value(key, round))
                            .await
                            .unwrap_or_else(|e| panic!("round {round} key {key}: {e}"));
                    }
                });
            }
            while let Some(done) = writes.join_next().await {
                done.unwrap();
            }
        }
        for key in 0..keys {
            let object = client
                .read(table, format!("k{key}").as_bytes())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(object.value, value(key, rounds - 1), "k{key}");
        }
    });
    // The backups' disks hold what the logs still need, not everything ever written
    // (about 55 segments a master, survivors besides): each master holds at most 32
    // segments of 256 KiB, and each backup the replicas of the other master (R = 1).
    // Frees go out with the masters' upkeep: wait for them a little.
    let replicas_on = |server: u32| {
        let dir = cluster.data_dir().join(format!("server-{server}/replicas"));
        std::fs::read_dir(&dir).map_or(0, |entries| entries.count())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held: Vec<usize> = (1..=2).map(replicas_on).collect();
        if held.iter().all(|&n| n <= 32 + 2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "backups hold {held:?} replica files, more than the masters' logs"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
