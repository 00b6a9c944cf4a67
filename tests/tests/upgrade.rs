//! What the binary before a change wrote, the binary after it must take up: a data
//! directory and a cluster file written before issue 40's restructuring
//! (`tests/fixtures/before-issue-40/`, made as its README says) restart and recover
//! under this build.

use rampart_tests::LocalCluster;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/before-issue-40")
}

/// Copies the directory tree at `from` into `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a folder");
    for entry in std::fs::read_dir(from).expect("the fixture") {
        let entry = entry.expect("an entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("a copy");
        }
    }
}

#[test]
fn a_data_directory_written_before_issue_40_restarts_and_recovers() {
    let data = tempfile::TempDir::new().expect("a temporary directory");
    copy_tree(&fixture().join("data"), data.path());
    // The shape the fixture was written with (its README).
    let cluster = LocalCluster::start_on(
        data,
        3,
        &[
            "--replicas",
            "2",
            "--memory",
            "16MiB",
            "--segment-bytes",
            "1MiB",
            "--value-bytes-max",
            "64KiB",
            "--backup-frames",
            "4",
            "--no-resp",
            "--no-metrics",
        ],
    )
    .expect("the cluster starts on the old data directory");
    // The three servers of the old run are recovered from the replicas on disk; the
    // scan waits for them (its deadline covers the recoveries).
    let scan = cluster
        .rampart(&["kv", "--timeout", "60", "scan", "t"], None)
        .expect("rampart kv scan");
    assert!(
        scan.status.success(),
        "scan failed: {}",
        String::from_utf8_lossy(&scan.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8_lossy(&scan.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    let mut expected: Vec<String> = (11..=40)
        .map(|i| match i {
            20 => "key-20\trewritten".to_string(),
            i => format!("key-{i}\tvalue-{i}"),
        })
        .collect();
    expected.sort();
    assert_eq!(
        lines, expected,
        "keys 1-10 were deleted and must stay so; 11-40 are served with their last values"
    );
    let deleted = cluster
        .rampart(&["kv", "get", "t", "key-5"], None)
        .expect("rampart kv get");
    assert_eq!(
        deleted.status.code(),
        Some(1),
        "a deleted key stays deleted"
    );
}

#[test]
fn a_cluster_file_written_before_issue_40_still_loads() {
    let old = fixture().join("cluster.toml");
    let file = rampart_ops::cluster_file::ClusterFile::load(&old).expect("the old file loads");
    assert!(file.problems().is_empty(), "{:?}", file.problems());
    let coordinator = file.coordinator_flags(1).expect("coordinator 1's flags");
    assert!(
        coordinator.iter().any(|flag| flag == "--peers"),
        "{coordinator:?}"
    );
    // Every entry of the current example expands as it did: the same flags from the old
    // file and from ops/deploy/cluster.toml, where the files are the same.
    let current = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/deploy/cluster.toml");
    if std::fs::read(&current).ok() == std::fs::read(&old).ok() {
        let now = rampart_ops::cluster_file::ClusterFile::load(&current).expect("loads");
        assert_eq!(now.coordinator_flags(1).expect("flags"), coordinator);
    }
}
