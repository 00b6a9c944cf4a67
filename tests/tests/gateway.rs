//! The Redis-protocol gateway that `cluster up` starts, driven as Redis users would:
//! raw RESP over a socket (pipelining, errors that keep the connection, a protocol
//! error that closes it), and `redis-cli` (Debian's `redis-tools`; skipped with a
//! message when missing, unless `RAMPART_REQUIRE_TOOLS=1`, which `.ci/run` sets),
//! including a write acknowledged through the gateway read back after its master was
//! killed with SIGKILL and recovered; and a `rampart gateway` of its own started with
//! the flags that bound its connections (first-command deadline, connections per
//! address, idle timeout), checked over raw sockets, beside the gateway of a `cluster up`
//! given the idle timeout.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rampart_tests::{LocalCluster, RampartProcess};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn cluster() -> LocalCluster {
    LocalCluster::start(3, &["--replicas", "1", "--memory", "64MiB"]).unwrap()
}

/// Sends `request` raw over a fresh connection and reads until `expected` bytes of reply
/// came (or the peer closed).
fn exchange(addr: &str, request: &[u8], expected: usize) -> Vec<u8> {
    rampart_tests::raw_exchange(addr, request, expected).unwrap()
}

#[test]
fn pipelined_requests_are_answered_in_order_and_errors_keep_the_connection() {
    let cluster = cluster();
    let (addr, _) = cluster
        .gateway
        .clone()
        .expect("cluster up starts a gateway");
    let request = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n\
                    *2\r\n$3\r\nGET\r\n$1\r\nk\r\n\
                    *1\r\n$8\r\nFLUSHALL\r\n\
                    *2\r\n$4\r\nINCR\r\n$1\r\nk\r\n\
                    *2\r\n$6\r\nEXISTS\r\n$1\r\nk\r\n\
                    PING\r\n";
    let expected =
        "+OK\r\n$1\r\nv\r\n-ERR unknown command 'FLUSHALL', with args beginning with: \r\n\
                    -ERR value is not an integer or out of range\r\n:1\r\n+PONG\r\n";
    let reply = exchange(&addr, request, expected.len());
    assert_eq!(String::from_utf8_lossy(&reply), expected);
    // Consecutive SETs (of distinct keys) and GETs go to the masters together (one
    // multi-write, one multi-read): answered in order, each seeing what came before.
    let request = b"*3\r\n$3\r\nSET\r\n$2\r\np1\r\n$1\r\na\r\n\
                    *3\r\n$3\r\nSET\r\n$2\r\np2\r\n$1\r\nb\r\n\
                    *4\r\n$3\r\nSET\r\n$2\r\np1\r\n$1\r\nc\r\n$2\r\nNX\r\n\
                    *4\r\n$3\r\nSET\r\n$2\r\np3\r\n$1\r\nd\r\n$2\r\nXX\r\n\
                    *2\r\n$3\r\nGET\r\n$2\r\np1\r\n\
                    *2\r\n$3\r\nGET\r\n$2\r\np2\r\n\
                    *2\r\n$3\r\nGET\r\n$2\r\np3\r\n";
    let expected = "+OK\r\n+OK\r\n$-1\r\n$-1\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n";
    let reply = exchange(&addr, request, expected.len());
    assert_eq!(String::from_utf8_lossy(&reply), expected);
    // Bytes that are not RESP: an error, then the connection closes.
    let reply = exchange(&addr, b"*1\r\n:5\r\n", usize::MAX);
    assert!(
        String::from_utf8_lossy(&reply).starts_with("-ERR Protocol error"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

fn redis_cli(addr: &str, args: &[&str]) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let output = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .trim_end()
        .to_string()
}

#[test]
fn redis_cli_reads_back_after_the_master_was_killed_and_recovered() {
    if Command::new("redis-cli").arg("--version").output().is_err() {
        assert!(
            std::env::var("RAMPART_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "RAMPART_REQUIRE_TOOLS=1 but redis-cli is not installed"
        );
        eprintln!("skipping: no redis-cli (apt-get install redis-tools)");
        return;
    }
    let cluster = cluster();
    let (addr, _) = cluster
        .gateway
        .clone()
        .expect("cluster up starts a gateway");
    assert_eq!(redis_cli(&addr, &["PING"]), "PONG");
    assert_eq!(redis_cli(&addr, &["SET", "greeting", "hello"]), "OK");
    assert_eq!(redis_cli(&addr, &["SET", "greeting", "other", "NX"]), "");
    assert_eq!(
        redis_cli(&addr, &["SET", "greeting", "hi", "XX", "GET"]),
        "hello"
    );
    assert_eq!(redis_cli(&addr, &["INCRBY", "visits", "41"]), "41");
    assert_eq!(redis_cli(&addr, &["INCR", "visits"]), "42");
    assert_eq!(redis_cli(&addr, &["MSET", "a", "1", "b", "2"]), "OK");
    assert_eq!(redis_cli(&addr, &["MGET", "a", "b", "none"]), "1\n2"); // nil: an empty line
    assert_eq!(redis_cli(&addr, &["DEL", "a", "none"]), "1");
    let scanned = redis_cli(&addr, &["SCAN", "0", "MATCH", "g*", "COUNT", "1000"]);
    assert!(scanned.ends_with("greeting"), "{scanned}");
    assert!(redis_cli(&addr, &["SET", "k", "v", "EX", "5"]).contains("expiry is not supported"));
    // Kill the master of "greeting" with SIGKILL: the writes acknowledged through the
    // gateway come back through it once recovered.
    let owner = rampart_tests::runtime().block_on(async {
        let client = rampart_client::Client::connect(&[cluster.coordinator.as_str()])
            .await
            .unwrap();
        let table = client.get_table_id("redis").await.unwrap();
        client.locate(table, b"greeting").unwrap()
    });
    let (_, _, pid) = cluster
        .servers
        .iter()
        .find(|(_, server, _)| *server == owner)
        .expect("the owner is one of the cluster's servers");
    // SAFETY: kill(2) on a process this test's cluster started.
    unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let greeting = redis_cli(&addr, &["GET", "greeting"]);
        let visits = redis_cli(&addr, &["GET", "visits"]);
        if greeting == "hi" && visits == "42" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not back after the recovery: greeting {greeting:?}, visits {visits:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(redis_cli(&addr, &["INCR", "visits"]), "43");
}

#[test]
fn a_redis_client_library_works_against_the_gateway() {
    let cluster = cluster();
    let (addr, _) = cluster
        .gateway
        .clone()
        .expect("cluster up starts a gateway");
    let client = redis::Client::open(format!("redis://{addr}/0")).unwrap();
    let mut connection = client.get_connection().unwrap();
    let set: String = redis::cmd("SET")
        .arg("lib")
        .arg("value")
        .query(&mut connection)
        .unwrap();
    assert_eq!(set, "OK");
    let got: Option<String> = redis::cmd("GET").arg("lib").query(&mut connection).unwrap();
    assert_eq!(got.as_deref(), Some("value"));
    let missing: Option<String> = redis::cmd("GET")
        .arg("nothing")
        .query(&mut connection)
        .unwrap();
    assert_eq!(missing, None);
    // A pipeline: answered in order.
    let (count, listed): (i64, Vec<Option<String>>) = redis::pipe()
        .cmd("INCRBY")
        .arg("counter")
        .arg(5)
        .cmd("MGET")
        .arg("lib")
        .arg("nothing")
        .query(&mut connection)
        .unwrap();
    assert_eq!(count, 5);
    assert_eq!(listed, vec![Some("value".to_string()), None]);
    let refused: redis::RedisResult<String> = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .arg("PX")
        .arg(10)
        .query(&mut connection);
    let error = refused.expect_err("expiry is refused");
    assert!(
        error.to_string().contains("expiry is not supported"),
        "{error}"
    );
    // The connection goes on after an error.
    let pong: String = redis::cmd("PING").query(&mut connection).unwrap();
    assert_eq!(pong, "PONG");
}

/// Reads until the peer closes the connection (true) or `wait` passes without it
/// (false); what it sends first is discarded.
fn closes_within(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Sends `request` on `stream` and reads `expected` bytes of reply (or less, if the
/// peer closes).
fn call(stream: &mut TcpStream, request: &[u8], expected: usize) -> String {
    stream.write_all(request).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while reply.len() < expected {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&reply).to_string()
}

#[test]
fn gateway_flags_bound_silent_idle_and_crowded_connections() {
    // `cluster up` passes the limit on to its gateway (checked alongside the gateway
    // started here, within the same wait).
    let cluster = LocalCluster::start(
        3,
        &[
            "--replicas",
            "1",
            "--memory",
            "64MiB",
            "--idle-timeout-ms",
            "1500",
        ],
    )
    .unwrap();
    let gateway = RampartProcess::start(&[
        "gateway",
        "--coordinator",
        &cluster.coordinator,
        "--listen",
        "127.0.0.1:0",
        "--table",
        "bounded",
        "--span",
        "1",
        "--first-command-timeout-ms",
        "500",
        "--connections-per-peer-max",
        "3",
        "--idle-timeout-ms",
        "1500",
        "--reply-bytes-pending-max",
        "4KiB",
    ])
    .unwrap();
    let addr = gateway.addr.as_str();
    eprintln!("gateway with bounded connections at {addr}");
    let (cluster_addr, _) = cluster
        .gateway
        .clone()
        .expect("cluster up starts a gateway");
    let mut cluster_idle = TcpStream::connect(&cluster_addr).unwrap();
    // Silent since its accept: closed after the first-command deadline.
    let mut silent = TcpStream::connect(addr).unwrap();
    assert!(closes_within(&mut silent, Duration::from_secs(20)));
    // Three connections from this address are served; the fourth is told and closed.
    let ping = b"*1\r\n$4\r\nPING\r\n";
    let mut served: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for connection in &mut served {
        assert_eq!(call(connection, ping, 7), "+PONG\r\n");
    }
    let mut crowded = TcpStream::connect(addr).unwrap();
    let refused = call(&mut crowded, b"", 1);
    assert!(
        refused.starts_with("-ERR max number of clients reached"),
        "{refused}"
    );
    assert!(closes_within(&mut crowded, Duration::from_secs(20)));
    // What CONFIG GET tells of the idle timeout (1.5 s: 2 in Redis's whole seconds).
    let timeout = b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$7\r\ntimeout\r\n";
    let expected = "*2\r\n$7\r\ntimeout\r\n$1\r\n2\r\n";
    assert_eq!(call(&mut served[0], timeout, expected.len()), expected);
    assert_eq!(call(&mut cluster_idle, timeout, expected.len()), expected);
    // Authenticated and then idle: closed after the idle timeout.
    for connection in served.iter_mut().chain([&mut cluster_idle]) {
        assert!(closes_within(connection, Duration::from_secs(20)));
    }
}
