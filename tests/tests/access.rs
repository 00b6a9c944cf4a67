//! Access control and TLS from the outside: `cluster up --auth-token-file F --tls-cert C
//! --tls-key K`, then the commands a user runs — without the token (refused, told why),
//! with another cluster's token (refused), with it (served), over TLS (served; a client
//! trusting another certificate is not), the Redis-protocol gateway's `AUTH` (raw RESP,
//! and `redis-cli --tls` where installed) — and a server killed with SIGKILL whose data
//! comes back: masters, backups (the `tcp` soft-NIC) and coordinators prove the token to
//! each other through a whole recovery.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rampart_tests::{rampart, LocalCluster};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A token file with `text`.
fn token_file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{text}\n")).unwrap();
    path.display().to_string()
}

/// A self-signed certificate for 127.0.0.1 and localhost and its key, as PEM files.
fn certificate(dir: &Path, name: &str) -> (String, String) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    (cert.display().to_string(), key.display().to_string())
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Sends `request` over a fresh connection and reads `expected` bytes of reply.
fn resp(addr: &str, request: &[u8], expected: usize) -> String {
    let reply = rampart_tests::raw_exchange(addr, request, expected).unwrap();
    String::from_utf8_lossy(&reply).into_owned()
}

fn redis_cli_installed() -> bool {
    if Command::new("redis-cli").arg("--version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var("RAMPART_REQUIRE_TOOLS").as_deref() != Ok("1"),
        "RAMPART_REQUIRE_TOOLS=1 but redis-cli is not installed"
    );
    eprintln!("skipping the redis-cli part: no redis-cli (apt-get install redis-tools)");
    false
}

#[test]
fn a_cluster_with_a_token_serves_only_those_who_hold_it_over_tcp_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "k6N0o3vY2mM1b8xQ5rT7wZ4sE9uH2jL0k6N0o3vY2mM=";
    let token = token_file(dir.path(), "token", secret);
    let wrong = token_file(
        dir.path(),
        "wrong",
        "another cluster's token, entirely: 32+ bytes",
    );
    let (cert, key) = certificate(dir.path(), "server");
    let (other_cert, _) = certificate(dir.path(), "other");
    let cluster = LocalCluster::start(
        3,
        &[
            "--replicas",
            "1",
            "--memory",
            "64MiB",
            "--replication",
            "tcp",
            "--auth-token-file",
            &token,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    )
    .unwrap();
    let kv = |token: Option<&str>, args: &[&str]| {
        let mut env = vec![("RAMPART_COORDINATOR", cluster.coordinator.as_str())];
        if let Some(token) = token {
            env.push(("RAMPART_AUTH_TOKEN_FILE", token));
        }
        let mut all = vec!["kv", "--timeout", "20"];
        all.extend_from_slice(args);
        rampart(&all, None, &env).unwrap()
    };

    // Without the token: refused at once, and told what to do.
    let started = Instant::now();
    let refused = kv(None, &["create-table", "t"]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--auth-token-file"),
        "{}",
        text(&refused)
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a refusal is not retried until the timeout (20 s)"
    );
    // With another cluster's token: refused (after retrying: the client cannot tell a
    // wrong token from a server being replaced).
    let refused = rampart(
        &["kv", "--timeout", "3", "create-table", "t"],
        None,
        &[
            ("RAMPART_COORDINATOR", &cluster.coordinator),
            ("RAMPART_AUTH_TOKEN_FILE", &wrong),
        ],
    )
    .unwrap();
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("different cluster token"),
        "{}",
        text(&refused)
    );

    // With it: served, in plain TCP and over TLS.
    let created = kv(Some(&token), &["create-table", "t", "--span", "3"]);
    assert!(created.status.success(), "{}", text(&created));
    for i in 0..20 {
        let put = kv(
            Some(&token),
            &["put", "t", &format!("key{i}"), &format!("value{i}")],
        );
        assert!(put.status.success(), "{}", text(&put));
    }
    let got = kv(Some(&token), &["--tls-ca", &cert, "get", "t", "key7"]);
    assert!(got.status.success(), "{}", text(&got));
    assert_eq!(String::from_utf8_lossy(&got.stdout), "value7");
    let distrusting = kv(Some(&token), &["--tls-ca", &other_cert, "get", "t", "key7"]);
    assert!(!distrusting.status.success(), "{}", text(&distrusting));
    assert!(
        String::from_utf8_lossy(&distrusting.stderr).contains("TLS handshake failed"),
        "{}",
        text(&distrusting)
    );
    let status = rampart(
        &["status", "--tls-ca", &cert],
        None,
        &[
            ("RAMPART_COORDINATOR", &cluster.coordinator),
            ("RAMPART_AUTH_TOKEN_FILE", &token),
        ],
    )
    .unwrap();
    assert!(status.status.success(), "{}", text(&status));

    // The gateway: nothing before AUTH; the token itself is not the password; the
    // password derived from it (`rampart token resp-password`) is.
    let password = rampart(
        &["token", "resp-password", "--auth-token-file", &token],
        None,
        &[],
    )
    .unwrap();
    assert!(password.status.success(), "{}", text(&password));
    let password = String::from_utf8_lossy(&password.stdout).trim().to_string();
    assert_eq!(password.len(), 48, "{password}");
    let (gateway, _) = cluster
        .gateway
        .clone()
        .expect("cluster up starts a gateway");
    let expected = "-NOAUTH Authentication required.\r\n";
    assert_eq!(resp(&gateway, b"GET key7\r\n", expected.len()), expected);
    let expected = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    assert_eq!(resp(&gateway, b"AUTH guess\r\n", expected.len()), expected);
    let request = format!("AUTH {secret}\r\n");
    assert_eq!(resp(&gateway, request.as_bytes(), expected.len()), expected);
    let request = format!("AUTH default {password}\r\nSET via-resp 1\r\nINCR via-resp\r\n");
    let expected = "+OK\r\n+OK\r\n:2\r\n";
    assert_eq!(resp(&gateway, request.as_bytes(), expected.len()), expected);
    if redis_cli_installed() {
        let (host, port) = gateway.rsplit_once(':').unwrap();
        let output = Command::new("redis-cli")
            .args(["-h", host, "-p", port, "--tls", "--cacert", &cert])
            .env("REDISCLI_AUTH", &password)
            .args(["GET", "via-resp"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim_end(), "2");
    }

    // Kill a server with SIGKILL: the cluster recovers its data, every process proving
    // the token to the others, and the client reads it all back.
    let (_, _, pid) = cluster.servers[0];
    // SAFETY: kill(2) on a process this test's cluster started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..20 {
        loop {
            let got = kv(Some(&token), &["get", "t", &format!("key{i}")]);
            if got.status.success() {
                assert_eq!(String::from_utf8_lossy(&got.stdout), format!("value{i}"));
                break;
            }
            assert!(Instant::now() < deadline, "key{i} not back: {}", text(&got));
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
