//! The example deployment (`ops/deploy/cluster.toml`: 3 racks, a coordinator and three
//! servers on each, R = 3, the `tcp` transport, a cluster token) run on three "hosts" —
//! network namespaces with addresses of their own — using only the cluster file and the
//! systemd units' command lines (their `ExecStart`, with `%i` filled in): processes
//! bind wildcard addresses and advertise their host's. Data is written from outside the
//! hosts, a server is killed with SIGKILL and its unit's `ExecStopPost` run as systemd
//! would (its report is the proof of death: the recovery does not wait out the lease),
//! every object comes back, and then every
//! segment of every live master — the recovery masters' replayed data included — has its
//! R replicas in R different racks.
//!
//! Needs root, `ip` and `iptables` (network namespaces); skipped with a message
//! otherwise, unless `RAMPART_REQUIRE_TOOLS=1` (`.ci/run`), which makes it fail instead.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rampart_client::{Client, WriteItem};
use rampart_common::auth::{ClusterToken, Security};
use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::backup::{ListReplicas, ListReplicasRequest};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::RpcPool;
use rampart_ops::netns::Network;
use rampart_tests::{rampart, RampartProcess};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const HOSTS: [&str; 3] = ["h1", "h2", "h3"];
/// The example's host addresses, replaced by the namespaces'.
const EXAMPLE_ADDRS: [&str; 3] = ["10.0.1.10", "10.0.2.10", "10.0.3.10"];
const OBJECTS: usize = 20_000;
const VALUE_BYTES: usize = 1000;
const REPLICAS: usize = 3;

fn key(i: usize) -> Vec<u8> {
    format!("key{i}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    let mut value = format!("value{i}-").into_bytes();
    value.resize(VALUE_BYTES, b'x');
    value
}

/// The example cluster file with this test's addresses, directories and sizes.
fn cluster_file(network: &Network, dir: &std::path::Path) -> String {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/deploy/cluster.toml"),
    )
    .unwrap();
    let mut text = example
        .replace(
            "/etc/rampart/token",
            &dir.join("token").display().to_string(),
        )
        .replace("/var/lib/rampart", &dir.display().to_string())
        .replace("memory = \"16GiB\"", "memory = \"64MiB\"")
        .replace("segment_bytes = \"8MiB\"", "segment_bytes = \"1MiB\"")
        .replace("value_bytes_max = \"1MiB\"", "value_bytes_max = \"64KiB\"")
        .replace("backup_frames = 64", "backup_frames = 8");
    for (host, example_addr) in HOSTS.iter().zip(EXAMPLE_ADDRS) {
        let ip = network.host(host).unwrap().ip.to_string();
        text = text.replace(example_addr, &ip);
    }
    for changed in ["64MiB", "\"1MiB\"", "64KiB", "backup_frames = 8"] {
        assert!(
            text.contains(changed),
            "the example no longer says what the test changes"
        );
    }
    text
}

/// The command line of systemd unit `unit` (in `ops/deploy/`) for `instance` (its `%i`),
/// with the cluster file at `file`: its `ExecStart`, less the binary.
fn unit_command(unit: &str, instance: &str, file: &str) -> Vec<String> {
    unit_line(unit, "ExecStart", instance, file)
}

/// Line `key` of systemd unit `unit` as systemd runs it (`%i` = `instance`, `%n` the
/// unit's full name, a leading `-` dropped), with the cluster file at `file`, less the
/// binary.
fn unit_line(unit: &str, key: &str, instance: &str, file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../ops/deploy")
            .join(unit),
    )
    .unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the unit has an {key}"));
    let line = line.strip_prefix('-').unwrap_or(line);
    let words: Vec<String> = line
        .replace("%i", instance)
        .replace("%n", &unit.replace("@.", &format!("@{instance}.")))
        .replace("/etc/rampart/cluster.toml", file)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(words[0], "/usr/local/bin/rampart");
    words[1..].to_vec()
}

#[test]
fn the_example_three_rack_deployment_recovers_a_server_with_replicas_across_racks() {
    if let Err(why) = Network::check_available() {
        assert!(
            std::env::var("RAMPART_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "RAMPART_REQUIRE_TOOLS=1 but {why}"
        );
        eprintln!("skipping the multi-host deployment test: {why}");
        return;
    }
    let network = Network::create(&HOSTS).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secret = "deployment-test-token-of-more-than-32-bytes";
    std::fs::write(dir.path().join("token"), secret).unwrap();
    let file = dir.path().join("cluster.toml");
    std::fs::write(&file, cluster_file(&network, dir.path())).unwrap();
    let file_arg = file.display().to_string();
    let parsed = rampart_ops::cluster_file::ClusterFile::load(&file).unwrap();
    let netns_of = |address: &str| {
        let ip = address.rsplit_once(':').unwrap().0;
        HOSTS
            .iter()
            .map(|h| network.host(h).unwrap())
            .find(|h| h.ip.to_string() == ip)
            .unwrap()
            .netns
            .clone()
    };

    // With the units' command lines: each process from its entry, in its host.
    let start = |netns: String, unit: &str, instance: &str| {
        let command = unit_command(unit, instance, &file_arg);
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        RampartProcess::start_in_netns(&netns, &command).unwrap()
    };
    let mut processes = Vec::new();
    for coordinator in &parsed.coordinators {
        processes.push(start(
            netns_of(&coordinator.address),
            "rampart-coordinator@.service",
            &coordinator.id.to_string(),
        ));
    }
    let mut servers = Vec::new();
    for server in &parsed.servers {
        let process = start(
            netns_of(&server.address),
            "rampart-server@.service",
            &server.name,
        );
        assert_eq!(
            process.addr, server.address,
            "it announces its advertised address"
        );
        let id = ServerId(process.server_id());
        servers.push((id, server.address.clone(), server.rack.clone(), process));
    }
    let gateway = start(
        netns_of(&parsed.coordinators[0].address),
        "rampart-gateway@.service",
        "h1",
    );

    // A client outside the hosts, holding the token.
    assert!(rampart_common::auth::install(Security::with_token(
        ClusterToken::new(secret.as_bytes()).unwrap()
    )));
    let coordinators: Vec<String> = parsed
        .coordinators
        .iter()
        .map(|c| c.address.clone())
        .collect();
    let runtime = rampart_tests::runtime();
    let client = runtime.block_on(Client::connect(&coordinators)).unwrap();
    let table = runtime.block_on(client.create_table("t", 9)).unwrap();
    for batch in (0..OBJECTS).collect::<Vec<_>>().chunks(200) {
        let items: Vec<WriteItem> = batch
            .iter()
            .map(|&i| WriteItem {
                table,
                key: key(i).into(),
                value: value(i).into(),
                rules: RejectRules::default(),
            })
            .collect();
        for outcome in runtime.block_on(client.multi_write(&items)).unwrap() {
            outcome.unwrap();
        }
    }
    // The gateway in h1, reached from outside with AUTH.
    let (_, port) = gateway.addr.rsplit_once(':').unwrap();
    let h1 = network.host("h1").unwrap().ip;
    let mut resp = std::net::TcpStream::connect((h1, port.parse::<u16>().unwrap())).unwrap();
    resp.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let password = ClusterToken::new(secret.as_bytes())
        .unwrap()
        .resp_password();
    resp.write_all(
        format!("AUTH {password}\r\nSET from-resp hello\r\nGET from-resp\r\n").as_bytes(),
    )
    .unwrap();
    let expected = "+OK\r\n+OK\r\n$5\r\nhello\r\n";
    let mut reply = vec![0u8; expected.len()];
    resp.read_exact(&mut reply).unwrap();
    assert_eq!(String::from_utf8_lossy(&reply), expected);

    // Kill the master of key0 with SIGKILL; everything comes back.
    let owner = client.locate(table, &key(0)).unwrap();
    let victim = servers
        .iter()
        .position(|(_, address, _, _)| *address == owner)
        .unwrap();
    let (dead, _, dead_rack, process) = servers.remove(victim);
    let dead_name = parsed
        .servers
        .iter()
        .find(|s| s.address == owner)
        .unwrap()
        .name
        .clone();
    process.kill();
    eprintln!("killed {dead} ({dead_rack})");
    // What systemd does once the process is gone: the unit's ExecStopPost. Its word is
    // the coordinators' proof of death (`proof_of_death = "supervisor"`): without it
    // they would wait out the lease (a refused port is no proof in this deployment).
    let stop_post = unit_line(
        "rampart-server@.service",
        "ExecStopPost",
        &dead_name,
        &file_arg,
    );
    let stop_post: Vec<&str> = stop_post.iter().map(String::as_str).collect();
    let reported = rampart(&stop_post, None, &[("EXIT_CODE", "killed")]).unwrap();
    assert!(reported.status.success(), "{reported:?}");
    assert!(
        String::from_utf8_lossy(&reported.stdout).contains(&format!("server {} exited", dead.0)),
        "{reported:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let keys: Vec<Vec<u8>> = (0..OBJECTS).map(key).collect();
    for (chunk, batch) in keys.chunks(500).enumerate() {
        let lookups: Vec<_> = batch.iter().map(|k| (table, &k[..])).collect();
        loop {
            let read = runtime.block_on(client.multi_read(&lookups));
            if let Ok(outcomes) = read {
                for (j, outcome) in outcomes.into_iter().enumerate() {
                    let object = outcome.unwrap().expect("every acknowledged object is back");
                    assert_eq!(&object.value[..], &value(chunk * 500 + j)[..]);
                }
                break;
            }
            assert!(Instant::now() < deadline, "not recovered: {read:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let listed = rampart(
        &["recovery", "list", "--cluster-file", &file_arg],
        None,
        &[],
    )
    .unwrap();
    let listed_text = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.status.success()
            && listed_text.contains(&dead.to_string())
            && listed_text.contains("done"),
        "{listed:?}"
    );
    let shown = rampart(
        &[
            "recovery",
            "show",
            &dead.0.to_string(),
            "--cluster-file",
            &file_arg,
        ],
        None,
        &[],
    )
    .unwrap();
    let shown_text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown_text.contains("its death proven: supervisor saw it exit"),
        "the unit's report proved the death: {shown_text}"
    );

    // Every live master's segments: R replicas, in R racks (re-replication of what the
    // dead backup held may take a moment).
    let rack_of: BTreeMap<String, String> = parsed
        .servers
        .iter()
        .map(|s| (s.address.clone(), s.rack.clone()))
        .collect();
    let live: BTreeSet<ServerId> = servers.iter().map(|(id, ..)| *id).collect();
    let pool = RpcPool::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut placement: BTreeMap<(ServerId, SegmentId), Vec<String>> = BTreeMap::new();
        for (_, address, _, _) in &servers {
            let request = ListReplicasRequest { master: None };
            let reply = runtime
                .block_on(pool.call::<ListReplicas>(
                    address,
                    &request,
                    tokio::time::Instant::now() + Duration::from_secs(5),
                ))
                .unwrap();
            for replica in reply.replicas {
                placement
                    .entry((replica.master, replica.segment))
                    .or_default()
                    .push(rack_of[address].clone());
            }
        }
        for ((master, segment), racks) in &placement {
            let distinct: BTreeSet<&String> = racks.iter().collect();
            assert_eq!(
                distinct.len(),
                racks.len(),
                "two replicas of {master} segment {segment:?} in one rack: {racks:?}"
            );
        }
        let short: Vec<_> = placement
            .iter()
            .filter(|((master, _), racks)| live.contains(master) && racks.len() != REPLICAS)
            .collect();
        let masters_with_segments: BTreeSet<ServerId> = placement
            .keys()
            .map(|(master, _)| *master)
            .filter(|m| live.contains(m))
            .collect();
        if short.is_empty() && masters_with_segments.len() == live.len() {
            eprintln!(
                "{} segments of {} live masters, each with {REPLICAS} replicas in {REPLICAS} racks",
                placement.keys().filter(|(m, _)| live.contains(m)).count(),
                live.len()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "segments short of {REPLICAS} replicas: {short:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(gateway);
    drop(servers);
    drop(processes);
}
