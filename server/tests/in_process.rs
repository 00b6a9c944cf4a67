//! A whole cluster in one process: a coordinator and three `StorageServer`s, each on its
//! own loopback listener, driven through the client library. Shows that the server runs
//! as a library (start, serve, stop on its shutdown future) and that one stopped in the
//! middle is recovered by the others.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rampart_client::Client;
use rampart_common::config::MasterConfig;
use rampart_common::ids::TableId;
use rampart_common::onesided::shm::remove_default_frame_files_under;
use rampart_common::rpc::RpcServer;
use rampart_coordinator::cluster_view::ServerState;
use rampart_coordinator::node::{NodeConfig, RaftNode};
use rampart_coordinator::recovery_manager::RecoveryConfig;
use rampart_coordinator::CoordinatorService;
use rampart_server::{StartError, Stopped, StorageServer, StorageServerConfig};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const OBJECTS: usize = 300;

/// A running in-process cluster; its data under `dir`.
struct Cluster {
    coordinator: String,
    coordinator_stop: Option<oneshot::Sender<()>>,
    coordinator_task: Option<JoinHandle<()>>,
    node: RaftNode,
    /// (stop, the server's task) of each storage server.
    servers: Vec<(Option<oneshot::Sender<()>>, JoinHandle<Stopped>)>,
    /// Each server's metrics, rendered as Prometheus text.
    metrics: Vec<Box<dyn Fn() -> String + Send>>,
    /// Each server's address.
    addrs: Vec<String>,
    dir: TempDir,
}

impl Cluster {
    async fn start(servers: usize, replicas: usize) -> Cluster {
        Cluster::start_with(servers, replicas, rampart_common::rifl::CLIENT_LEASE).await
    }

    /// A cluster whose clients' leases last `client_lease`.
    async fn start_with(servers: usize, replicas: usize, client_lease: Duration) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let dir = TempDir::new().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let coordinator = listener.local_addr().unwrap().to_string();
        let node = RaftNode::start(
            NodeConfig::new(
                1,
                BTreeMap::from([(1, coordinator.clone())]),
                dir.path().join("coordinator"),
            ),
            tokio::runtime::Handle::current(),
        )
        .unwrap();
        let recovery = RecoveryConfig {
            lease: Duration::from_millis(750),
            ..RecoveryConfig::default()
        };
        let service = Arc::new(
            CoordinatorService::with_recovery(node.clone(), recovery)
                .with_client_lease(client_lease),
        );
        let (coordinator_stop, stopped) = oneshot::channel::<()>();
        let coordinator_task = tokio::spawn(RpcServer::run(listener, service, async {
            let _ = stopped.await;
        }));
        let mut cluster = Cluster {
            coordinator,
            coordinator_stop: Some(coordinator_stop),
            coordinator_task: Some(coordinator_task),
            node,
            servers: Vec::new(),
            metrics: Vec::new(),
            addrs: Vec::new(),
            dir,
        };
        for index in 0..servers {
            cluster.start_server(index, replicas).await;
        }
        cluster
    }

    async fn start_server(&mut self, index: usize, replicas: usize) {
        self.start_server_at(index, replicas, "127.0.0.1:0", None)
            .await;
    }

    /// Starts server `index` listening on `listen`, enlisting with `advertise`.
    async fn start_server_at(
        &mut self,
        index: usize,
        replicas: usize,
        listen: &str,
        advertise: Option<&str>,
    ) {
        let config = StorageServerConfig {
            advertise: advertise.map(str::to_string),
            backup_frames: 8,
            disk_mbps: Some(500),
            master: MasterConfig {
                segment_bytes: 128 * 1024,
                memory_bytes: 32 * 1024 * 1024,
                value_bytes_max: 16 * 1024,
                ..Default::default()
            },
            replicas,
            ..StorageServerConfig::new(
                vec![self.coordinator.clone()],
                self.dir.path().join(format!("server-{index}")),
            )
        };
        let server = StorageServer::start(config, listen).await.unwrap();
        self.addrs.push(server.advertised().to_string());
        let registry = server.metrics();
        self.metrics.push(Box::new(move || {
            rampart_common::metrics::render(std::slice::from_ref(&registry))
        }));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        self.servers.push((Some(stop), task));
    }

    /// Stops server `index` through its shutdown future; returns how it stopped.
    async fn stop_server(&mut self, index: usize) -> Stopped {
        let (stop, task) = &mut self.servers[index];
        drop(stop.take());
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("a stopping server ends within its stop timeouts")
            .unwrap()
    }

    async fn stop(mut self) {
        for index in 0..self.servers.len() {
            if self.servers[index].0.is_some() {
                assert_eq!(self.stop_server(index).await, Stopped::Shutdown);
            }
        }
        drop(self.coordinator_stop.take());
        if let Some(task) = self.coordinator_task.take() {
            task.await.unwrap();
        }
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || node.stop())
            .await
            .unwrap();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Also after a failed test: frame files in /dev/shm would outlive the directory.
        remove_default_frame_files_under(self.dir.path());
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{i}-{}", "x".repeat(i % 200)).into_bytes()
}

async fn write_all(client: &Client, table: TableId) {
    for i in 0..OBJECTS {
        client.write(table, &key(i), &value(i)).await.unwrap();
    }
}

/// Reads every object back, retrying each until `deadline` (a recovery may be under
/// way); panics naming the first that is missing or wrong.
async fn read_all(client: &Client, table: TableId, deadline: Instant) {
    for i in 0..OBJECTS {
        loop {
            match client.read(table, &key(i)).await {
                Ok(Some(object)) => {
                    assert_eq!(object.value, value(i), "object {i}");
                    break;
                }
                Ok(None) => panic!("object {i} was acknowledged and is gone"),
                Err(error) if Instant::now() < deadline => {
                    tracing::debug!(i, %error, "read retried");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("object {i} not readable by the deadline: {error}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_started_as_a_library_serve_and_stop_on_their_shutdown_future() {
    let cluster = Cluster::start(3, 2).await;
    let client = Client::connect(&[cluster.coordinator.as_str()])
        .await
        .unwrap();
    let table = client.create_table("library", 3).await.unwrap();
    write_all(&client, table).await;
    read_all(&client, table, Instant::now()).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_in_an_in_process_cluster_is_recovered_by_the_others() {
    // Four servers: after one goes, each master left (recovery masters included) still
    // finds R = 2 backups other than its own.
    let mut cluster = Cluster::start(4, 2).await;
    let client = Client::connect(&[cluster.coordinator.as_str()])
        .await
        .unwrap();
    let table = client.create_table("recovered", 4).await.unwrap();
    write_all(&client, table).await;
    assert_eq!(cluster.stop_server(0).await, Stopped::Shutdown);
    read_all(&client, table, Instant::now() + Duration::from_secs(60)).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_renewing_its_lease_expires_and_its_writes_are_refused() {
    let lease = Duration::from_millis(600);
    let cluster = Cluster::start_with(1, 0, lease).await;
    let live = Client::connect(std::slice::from_ref(&cluster.coordinator))
        .await
        .unwrap();
    let table = live.create_table("t", 1).await.unwrap();
    live.increment(table, b"n", 1).await.unwrap();
    // A second client with the same identity as one that went away: no renewals.
    let gone = Client::connect(std::slice::from_ref(&cluster.coordinator))
        .await
        .unwrap();
    gone.increment(table, b"n", 1).await.unwrap();
    let gone_id = gone.id();
    let open = |id| cluster.node.with_state(|s| s.client_open(id));
    assert!(open(live.id()) && open(gone_id));
    drop(gone);
    // Five leases later: the live client renewed throughout, the one dropped expired.
    tokio::time::sleep(lease * 5).await;
    assert!(open(live.id()), "a client that renews keeps its lease");
    assert!(!open(gone_id), "a client that stopped renewing expired");
    // Its id is refused by the master, which learns the expiry from the leader.
    let zombie = rampart_common::rpc::RpcPool::new();
    let master = live.locate(table, b"n").unwrap();
    let request = rampart_common::protocol::master::IncrementRequest {
        table,
        key: bytes::Bytes::from_static(b"n"),
        delta: 1,
        rules: Default::default(),
        rifl: rampart_common::rifl::Rifl {
            client: gone_id,
            seq: 2,
            ack: 1,
        },
    };
    let refused = zombie
        .call::<rampart_common::protocol::master::Increment>(
            &master,
            &request,
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .expect_err("an expired client's write");
    assert_eq!(
        refused.status(),
        Some(rampart_common::status::Status::ClientLeaseExpired),
        "{refused}"
    );
    assert_eq!(live.increment(table, b"n", 1).await.unwrap().0, 3);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_backup_store_cannot_open_fails_to_start_with_the_reason() {
    // The backup runtime exists by the time the store is opened: the failed start must
    // shut it down without blocking (dropping a runtime in async context panics).
    let dir = TempDir::new().unwrap();
    let config = StorageServerConfig {
        frame_file: Some(dir.path().join("no-such-directory").join("frames")),
        disk_mbps: Some(500),
        ..StorageServerConfig::new(vec!["127.0.0.1:1".into()], dir.path().join("server"))
    };
    match StorageServer::start(config, "127.0.0.1:0").await {
        Err(StartError::BackupStore { path, .. }) => assert_eq!(path, dir.path().join("server")),
        other => panic!("expected a backup store error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_server_refuses_connections_until_its_slow_steps_are_done() {
    // Its port is bound at once but listened on only after the disk probe (which this
    // server runs: no --disk-mbps) and the memory touch. Before, connections were
    // accepted and left unanswered for that long: a crashed server's pingers, when a
    // new server was restarted at its address, waited out their timeouts.
    let dir = TempDir::new().unwrap();
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = free.local_addr().unwrap();
    drop(free);
    let config = StorageServerConfig {
        disk_mbps: None,
        ..StorageServerConfig::new(vec!["127.0.0.1:1".into()], dir.path().join("server"))
    };
    let listen = addr.to_string();
    let starting = tokio::spawn(async move { StorageServer::start(config, &listen).await });
    // The probe alone takes ≈ 0.3 s or more; the port is bound within milliseconds.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert_eq!(
        refused.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "a connection was accepted before the server could answer it"
    );
    starting.abort();
    // A port in use fails a start with the reason.
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = StorageServerConfig {
        disk_mbps: Some(500),
        ..StorageServerConfig::new(vec!["127.0.0.1:1".into()], dir.path().join("other"))
    };
    match StorageServer::start(config, &taken.local_addr().unwrap().to_string()).await {
        Err(StartError::Listen { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse)
        }
        other => panic!("expected a listen error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_short_of_backups_for_r_says_so_to_the_client_the_status_and_the_metrics() {
    // R = 2 on three servers; once one is gone, each master left has one other server
    // for its two replicas.
    let mut cluster = Cluster::start(3, 2).await;
    let options = rampart_client::ClientOptions {
        deadline: Duration::from_secs(3),
        ..Default::default()
    };
    let client = Client::connect_with(std::slice::from_ref(&cluster.coordinator), options)
        .await
        .unwrap();
    let table = client.create_table("short", 1).await.unwrap();
    client.write(table, b"k", b"v").await.unwrap();
    let owner = client.locate(table, b"k").unwrap();
    let other = (0..3).find(|&i| cluster.addrs[i] != owner).unwrap();
    assert_eq!(cluster.stop_server(other).await, Stopped::Shutdown);
    let owner_index = (0..3).find(|&i| cluster.addrs[i] == owner).unwrap();
    // Writes go on into the open segment's replicas (shm frames outlive their backup)
    // until the next segment needs two backups other than its master: one is left.
    let mut failed = None;
    for i in 0..64u32 {
        if let Err(error) = client.write(table, &i.to_be_bytes(), &[7u8; 10_000]).await {
            failed = Some(error);
            break;
        }
    }
    let error = failed.expect("a write that cannot reach R replicas");
    let said = error.to_string();
    assert!(
        matches!(error, rampart_client::ClientError::Timeout { .. }),
        "{said}"
    );
    assert!(said.contains("writes wait for backups"), "{said}");
    assert!(said.contains("start more servers"), "{said}");
    assert!(said.contains("--replicas"), "{said}");
    assert!(!said.contains("did not complete the call"), "{said}");
    // Once the stopped server is declared crashed, the one problem left is R.
    let pool = rampart_common::rpc::RpcPool::new();
    let give_up = Instant::now() + Duration::from_secs(30);
    let view = loop {
        let view = rampart_coordinator::cluster_view::ClusterView::gather(
            std::slice::from_ref(&cluster.coordinator),
            &pool,
        )
        .await;
        let stopped = &cluster.addrs[other];
        let declared = view
            .servers
            .iter()
            .any(|s| &s.addr == stopped && s.state != ServerState::Up);
        if declared || Instant::now() > give_up {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view.problems.len(), 1, "{:?}", view.problems);
    assert!(
        view.problems[0].contains("cannot meet R = 2"),
        "{:?}",
        view.problems
    );
    let page = rampart_coordinator::status_page::render_page(&view);
    assert!(page.contains("cannot meet R = 2"));
    let metrics = (cluster.metrics[owner_index])();
    assert!(
        metrics.contains("rampart_master_writes_waiting_for_backups 1"),
        "{metrics}"
    );
    assert!(metrics.contains("rampart_master_replicas 2"), "{metrics}");
    assert!(
        metrics.contains("rampart_backup_frame_slots 8"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rampart_rpc_requests_total{operation=\"Write\""),
        "the process's RPC metrics are served beside the server's: {metrics}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_a_crashed_masters_key_times_out_naming_the_crash_not_the_coordinators() {
    let mut cluster = Cluster::start(2, 1).await;
    let options = rampart_client::ClientOptions {
        deadline: Duration::from_secs(6),
        ..Default::default()
    };
    let client = Client::connect_with(std::slice::from_ref(&cluster.coordinator), options)
        .await
        .unwrap();
    let table = client.create_table("gone", 1).await.unwrap();
    client.write(table, b"k", b"v").await.unwrap();
    // Both servers go: the owner crashes, and the only replicas of its log go with the
    // other, so its recovery cannot finish.
    assert_eq!(cluster.stop_server(0).await, Stopped::Shutdown);
    assert_eq!(cluster.stop_server(1).await, Stopped::Shutdown);
    let error = client
        .read(table, b"k")
        .await
        .expect_err("the key's owner and its replicas are gone");
    let said = error.to_string();
    assert!(
        matches!(error, rampart_client::ClientError::Timeout { .. }),
        "{said}"
    );
    assert!(!said.contains("did not complete the call"), "{said}");
    assert!(
        said.contains("crashed and"),
        "the owner's crash and its recovery are named: {said}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_created_where_masters_cannot_meet_r_is_refused_naming_the_cause() {
    // R = 2 on two servers from the start: no master can open its log on two backups.
    let cluster = Cluster::start(2, 2).await;
    let options = rampart_client::ClientOptions {
        deadline: Duration::from_secs(8),
        ..Default::default()
    };
    let client = Client::connect_with(std::slice::from_ref(&cluster.coordinator), options)
        .await
        .unwrap();
    let error = client
        .create_table("nowhere", 1)
        .await
        .expect_err("its master cannot serve it");
    let said = error.to_string();
    eprintln!("create-table said: {said}");
    assert!(said.contains("did not take it"), "{said}");
    assert!(said.contains("writes wait for backups"), "{said}");
    assert!(said.contains("start more servers"), "{said}");
    assert!(
        !said.contains("timed out after"),
        "the leader's answer, not a client timeout: {said}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_a_wildcard_listener_enlists_with_its_advertised_address() {
    let mut cluster = Cluster::start(2, 1).await;
    cluster
        .start_server_at(2, 1, "0.0.0.0:0", Some("127.0.0.1"))
        .await;
    let advertised = cluster.addrs[2].clone();
    assert!(advertised.starts_with("127.0.0.1:"), "{advertised}");
    assert!(
        !advertised.ends_with(":0"),
        "the listening port is added: {advertised}"
    );
    let enlisted: Vec<String> = cluster
        .node
        .with_state(|state| state.servers().map(|s| s.addr.clone()).collect());
    assert!(enlisted.contains(&advertised), "{enlisted:?}");
    assert!(
        !enlisted.iter().any(|addr| addr.starts_with("0.0.0.0")),
        "a wildcard address is never enlisted: {enlisted:?}"
    );
    let client = Client::connect(std::slice::from_ref(&cluster.coordinator))
        .await
        .unwrap();
    // A table over all three: some keys live on the wildcard-bound server, reached (and
    // replicated to) at its advertised address.
    let table = client.create_table("everywhere", 3).await.unwrap();
    write_all(&client, table).await;
    let on_it = (0..OBJECTS)
        .filter(|&i| client.locate(table, &key(i)).as_deref() == Some(advertised.as_str()));
    assert!(on_it.count() > 0, "the advertised server owns a tablet");
    read_all(&client, table, Instant::now()).await;
    cluster.stop().await;
}
