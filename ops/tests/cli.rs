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

#[test]
fn simulate_at_scale_reports_figures_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sim.json");
    let output = rampart(&[
        "simulate",
        "--servers",
        "40",
        "--master-gib",
        "0.5",
        "--report",
        "--placements",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let unavailable = figures["outcome"]["unavailability_ms"].as_f64().unwrap();
    let replayed = figures["outcome"]["replayed_ms"].as_f64().unwrap();
    assert!(unavailable > replayed && replayed > 0.0, "{figures}");
    let servers: Vec<u64> = figures["report"]["scaling"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["servers"].as_u64().unwrap())
        .collect();
    assert_eq!(servers, vec![10, 20, 40]);
    // Fewer servers, longer recoveries.
    let times: Vec<f64> = figures["report"]["scaling"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["outcome"]["replayed_ms"].as_f64().unwrap())
        .collect();
    assert!(times[0] > times[1] && times[1] > times[2], "{times:?}");
    for plot in ["scaling", "placements", "loss"] {
        let svg = std::fs::read_to_string(dir.path().join(format!("sim-{plot}.svg"))).unwrap();
        assert!(svg.contains("<svg"), "{plot}");
    }
}

#[test]
fn simulate_refuses_a_cluster_that_cannot_recover() {
    let output = rampart(&[
        "simulate",
        "--servers",
        "3",
        "--replicas",
        "3",
        "--master-gib",
        "1",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("R = 3 needs 3 servers besides each master"),
        "{stderr}"
    );
}

#[test]
fn simulate_calibrates_from_bench_recovery_runs() {
    // A `bench recovery --json` run as it writes one.
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run.json");
    std::fs::write(
        &run,
        serde_json::json!({
            "servers": 5, "replicas": 3, "object_bytes": 1024, "data_mb": 256,
            "objects_expected": 248000, "objects_verified": 248000, "checksum_ok": true,
            "detection_ms": 4, "setup_ms": 40, "unavailability_ms": 1300.0,
            "key_unavailability_ms": {"p50": 900.0, "p99": 1290.0, "max": 1300.0},
            "recovery_masters": 1, "recovery_rate_mb_s": 222.6, "objects_per_s": 215652.2,
            "floor_rate_mb_s": 400.0, "rate_over_floor": 0.56, "cpu_s_per_gb": 9.0,
            "cpu_s_per_gb_until_keys_back": 6.0, "quiet_after_ms": 2500,
            "partitions": [
                {"partition": 0, "master": 2, "live_ms": 810, "replay_ms": 500,
                 "replay_start_ms": 40, "bytes": 48000000, "objects": 124000, "attempts": 1},
                {"partition": 1, "master": 2, "live_ms": 1150, "replay_ms": 1100,
                 "replay_start_ms": 40, "bytes": 48000000, "objects": 124000, "attempts": 1}
            ]
        })
        .to_string(),
    )
    .unwrap();
    let costs = dir.path().join("costs.json");
    let output = rampart(&[
        "simulate",
        "--calibrate",
        run.to_str().unwrap(),
        "--json",
        costs.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&costs).unwrap()).unwrap();
    let c = &written["costs"];
    assert_eq!(c["commit_ms"].as_f64(), Some(10.0), "{written}");
    assert_eq!(c["detection_ms"].as_f64(), Some(4.0));
    let total = c["replay_ns_per_byte"].as_f64().unwrap()
        + c["split_ns_per_byte"].as_f64().unwrap()
        + 3.0 * c["frame_ns_per_byte"].as_f64().unwrap();
    assert!(
        (total - 6.0).abs() < 1e-9 || c["replay_ns_per_byte"] == c["split_ns_per_byte"],
        "{c}"
    );
    // The run itself, simulated beside it.
    assert!(
        written["check"][0]["simulated_unavailability_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // And the costs drive a simulation.
    let output = rampart(&[
        "simulate",
        "--servers",
        "20",
        "--master-gib",
        "1",
        "--costs",
        costs.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("calibrated from 1 bench recovery run")
    );
}
