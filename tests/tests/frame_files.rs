//! Frame files on real processes: a server that stops gracefully leaves no frame file in
//! `/dev/shm` — its frames are in its store, and its successor reports them byte for
//! byte — while a killed server's file stays for the restart on its data directory until
//! that directory is gone, when the next server starting on the host removes it.
//!
//! Frames are opened and written with the backup RPCs, as a master would (master 77
//! does not exist: no recovery or re-replication touches them), and every server runs
//! with `--replicas 0`, so that no real master places frames of its own.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_common::ids::{Epoch, SegmentId, ServerId, TableId, Version};
use rampart_common::onesided::shm::default_frame_file;
use rampart_common::protocol::backup::{
    OpenReplica, OpenReplicaRequest, ReadReplica, ReplicaId, WriteReplica, WriteReplicaRequest,
};
use rampart_common::rpc::RpcPool;
use rampart_tests::{CoordinatorGroup, LocalCluster};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// The fictitious master whose replicas the tests place.
const MASTER: ServerId = ServerId(77);

/// How long a graceful stop may take: `rampart cluster up` kills its children 3 s after
/// asking them to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// The valid prefix of an open segment as a master writes it: its opening and two
/// sealed batches.
fn open_segment(segment: SegmentId) -> Vec<u8> {
    let mut writer =
        rampart_common::log::SegmentWriter::open(MASTER, segment, 8 << 20, &[segment]).unwrap();
    for batch in 0..2u64 {
        for i in 0..10u64 {
            let key = format!("key-{batch}-{i}");
            writer
                .append_object(
                    TableId(1),
                    Version(batch * 10 + i + 1),
                    key.as_bytes(),
                    &[7; 300],
                )
                .unwrap();
        }
        writer.seal_batch();
    }
    let end = writer.committed_len() as usize;
    writer.bytes()[..end].to_vec()
}

/// Opens replica `segment` of [`MASTER`] on the backup at `addr` and writes `bytes` into
/// its frame, leaving it open.
async fn open_frame(pool: &RpcPool, addr: &str, segment: SegmentId, bytes: &[u8]) {
    let open = OpenReplicaRequest {
        master: MASTER,
        segment,
        epoch: Epoch(1),
        capacity: 8 << 20,
    };
    let reply = pool
        .call::<OpenReplica>(addr, &open, deadline())
        .await
        .unwrap();
    let write = WriteReplicaRequest {
        handle: reply.handle,
        epoch: Epoch(1),
        offset: 0,
        bytes: bytes.to_vec().into(),
    };
    pool.call::<WriteReplica>(addr, &write, deadline())
        .await
        .unwrap();
}

/// The frame file a server on `data_dir` uses. Only meaningful where `/dev/shm` exists
/// (else it lies inside the data directory).
fn frame_file(data_dir: &Path) -> PathBuf {
    default_frame_file(data_dir)
}

/// The data directories `rampart cluster up` gave its servers (`DIR/server-N`).
fn server_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("server-"))
        .map(|entry| entry.path())
        .collect();
    dirs.sort();
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_stopped_by_ctrl_c_leaves_no_frame_file() {
    let mut cluster = LocalCluster::start(3, &["--replicas", "0", "--memory", "64MiB"]).unwrap();
    let pool = RpcPool::new();
    for (i, (_, addr, _)) in cluster.servers.iter().enumerate() {
        let segment = SegmentId(i as u64 + 1);
        open_frame(&pool, addr, segment, &open_segment(segment)).await;
    }
    let dirs = server_dirs(cluster.data_dir());
    assert_eq!(dirs.len(), 3, "{dirs:?}");
    for dir in &dirs {
        assert!(
            frame_file(dir).exists(),
            "{}: a running server's frame file",
            dir.display()
        );
    }

    // Ctrl-C on a terminal: SIGINT to `cluster up` alone (its children have their own
    // process group), which stops every child.
    cluster.signal(libc::SIGINT);
    let status = cluster.wait_exit(STOP_TIMEOUT).unwrap();
    assert!(status.success(), "{status:?}");
    for dir in &dirs {
        assert!(
            !frame_file(dir).exists(),
            "{}: its server stopped gracefully, with its open frame flushed, but left its \
             frame file {}",
            dir.display(),
            frame_file(dir).display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gracefully_stopped_server_leaves_no_frame_file_and_its_successor_reports_its_frames() {
    let group = CoordinatorGroup::start(1).unwrap();
    let data = tempfile::TempDir::new().unwrap();
    let dir = data.path().join("server");
    let flags = ["--replicas", "0", "--memory", "64MiB"];
    let server = group.start_server(&dir, &flags).unwrap();
    let pool = RpcPool::new();
    let bytes = open_segment(SegmentId(4));
    open_frame(&pool, &server.addr, SegmentId(4), &bytes).await;
    assert!(frame_file(&dir).exists());

    let status = server.stop(STOP_TIMEOUT).unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        !frame_file(&dir).exists(),
        "a graceful stop flushed the open frame and removed the file"
    );

    // The cold start of the directory: the open replica, from the store alone.
    let restarted = group.start_server(&dir, &flags).unwrap();
    let id = ReplicaId {
        master: MASTER,
        segment: SegmentId(4),
    };
    let read = pool
        .call::<ReadReplica>(&restarted.addr, &id, deadline())
        .await
        .unwrap();
    assert_eq!((read.info.epoch, read.info.closed), (Epoch(1), false));
    assert!(
        read.bytes == bytes,
        "the open replica differs after the stop"
    );
    restarted.stop(STOP_TIMEOUT).unwrap();
    assert!(!frame_file(&dir).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_servers_frame_file_stays_until_its_data_directory_is_gone() {
    if !Path::new("/dev/shm").is_dir() {
        // Frame files then lie in their data directories, and go with them.
        eprintln!("no /dev/shm on this host: nothing to check");
        return;
    }
    let group = CoordinatorGroup::start(1).unwrap();
    let data = tempfile::TempDir::new().unwrap();
    let flags = ["--replicas", "0", "--memory", "64MiB"];
    let dir = |name: &str| data.path().join(name);
    let pool = RpcPool::new();

    // Killed holding a frame: its file is what the cold start of `a` recovers it from.
    let a = group.start_server(&dir("a"), &flags).unwrap();
    open_frame(&pool, &a.addr, SegmentId(1), &open_segment(SegmentId(1))).await;
    // Killed holding none: nothing in its file is needed.
    let idle = group.start_server(&dir("idle"), &flags).unwrap();
    let (a_file, idle_file) = (frame_file(&dir("a")), frame_file(&dir("idle")));
    a.kill();
    idle.kill();
    assert!(a_file.exists(), "a killed server's frames stay");
    assert!(idle_file.exists(), "nothing ran at its kill");

    // The next start on the host: `a`'s directory is there, its frames are needed.
    let b = group.start_server(&dir("b"), &flags).unwrap();
    assert!(
        a_file.exists(),
        "the frames of a killed server whose data directory exists were removed"
    );
    assert!(
        !idle_file.exists(),
        "the frame file of a killed server that held no frame stayed"
    );

    // `a`'s data directory is deleted: its frames are nobody's.
    std::fs::remove_dir_all(dir("a")).unwrap();
    assert!(a_file.exists());
    let c = group.start_server(&dir("c"), &flags).unwrap();
    assert!(
        !a_file.exists(),
        "the frame file of a deleted data directory outlived the next start"
    );

    for (name, server) in [("b", b), ("c", c)] {
        server.stop(STOP_TIMEOUT).unwrap();
        assert!(!frame_file(&dir(name)).exists(), "{name}");
    }
}
