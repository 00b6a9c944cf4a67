//! The `rampart` binary's command line: help, and refusal of bad configuration before
//! anything starts. (Having integration tests here also makes `cargo test --workspace`
//! build the binary that the `rampart-tests` crate drives.)

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::process::Command;

fn rampart(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_lists_every_subcommand() {
    let output = rampart(&["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for command in ["coordinator", "server", "cluster", "kv", "status", "bench"] {
        assert!(help.contains(command), "help lacks {command}:\n{help}");
    }
}

#[test]
fn server_refuses_a_segment_too_small_for_its_largest_object() {
    let stderr = server_refusal("segment", &["--segment-bytes", "64KiB"]);
    assert!(stderr.contains("cannot hold"), "{stderr}");
}

/// Runs `rampart server` with `flags` and a data directory that must stay untouched;
/// asserts it refused to start (exit 2) and returns its stderr.
fn server_refusal(name: &str, flags: &[&str]) -> String {
    let data = std::env::temp_dir().join(format!("rampart-cli-test-{name}-never-created"));
    let data = data.to_str().unwrap();
    let mut args = vec!["server", "--coordinator", "127.0.0.1:1", "--data-dir", data];
    args.extend_from_slice(flags);
    let output = rampart(&args);
    assert!(!std::path::Path::new(data).exists());
    assert_eq!(output.status.code(), Some(2));
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn server_refuses_an_unparseable_memory_size() {
    let output = rampart(&["server", "--memory", "lots", "--data-dir", "/nonexistent"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("byte size"));
}

#[test]
fn server_requires_a_data_dir() {
    let output = rampart(&["server", "--coordinator", "127.0.0.1:1"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--data-dir"));
}

#[test]
fn cluster_up_refuses_zero_servers() {
    let output = rampart(&[
        "cluster",
        "up",
        "--servers",
        "0",
        "--coordinator-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("at least 1"));
}

#[test]
fn server_with_rdma_and_no_rdma_says_why_plainly() {
    // Refused before the data directory is touched: a build without the `rdma` feature,
    // or a machine without an RDMA device (CI builds the feature separately and checks
    // the no-device message in `common::onesided::rdma`).
    let device = std::path::Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut entries| entries.next().is_some());
    if cfg!(feature = "rdma") && device {
        return; // A machine that can run it: nothing to refuse.
    }
    let stderr = server_refusal("rdma", &["--replication", "rdma"]);
    assert!(
        stderr.contains("--replication rdma: this build has no RDMA support")
            || stderr.contains("--replication rdma: no RDMA device found"),
        "{stderr}"
    );
}

#[test]
fn server_refuses_an_unknown_transport() {
    let output = rampart(&[
        "server",
        "--replication",
        "carrier-pigeon",
        "--data-dir",
        "/x",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("expected shm, tcp, rpc or rdma"),
        "{stderr}"
    );
}

#[test]
fn coordinator_refuses_bad_peers_plainly() {
    let data = std::env::temp_dir().join("rampart-cli-test-coordinator-never-created");
    let data = data.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--peers", "1=127.0.0.1:7000,2=127.0.0.1:7001"],
            "--id 3 is not in --peers",
        ),
        (&["--peers", "3=127.0.0.1:0"], "fixed HOST:PORT"),
        (&["--peers", "3=127.0.0.1:1,3=127.0.0.1:2"], "twice"),
        (&["--peers", "3:127.0.0.1:1"], "ID=HOST:PORT"),
        (&["--peers", "0=127.0.0.1:1"], "start at 1"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["coordinator", "--id", "3", "--data-dir", data];
        args.extend_from_slice(flags);
        let output = rampart(&args);
        assert_eq!(output.status.code(), Some(2), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
        assert!(!std::path::Path::new(data).exists());
    }
    let output = rampart(&[
        "coordinator",
        "--data-dir",
        data,
        "--seed",
        "/nonexistent/seed",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
}
