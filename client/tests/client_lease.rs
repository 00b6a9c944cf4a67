//! A client cut off from the coordinators for longer than its lease, against a real
//! coordinator (leases of 600 ms) and a real master that checks client leases, all in
//! this process on loopback. The client reaches the coordinators through a proxy the test
//! cuts; the master reaches them directly. After the expiry the client's next write,
//! numbered under the expired id, is refused and ends with an unknown outcome (and is
//! never sent again under another id); once the coordinators are reachable again the
//! client opens a new id by itself and its writes succeed.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rampart_client::{Client, ClientError, ClientOptions};
use rampart_common::config::MasterConfig;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::protocol::coordinator::{Enlist, EnlistRequest};
use rampart_common::rpc::{RpcPool, RpcServer};
use rampart_common::tablet::Services;
use rampart_coordinator::node::{NodeConfig, RaftNode};
use rampart_coordinator::CoordinatorService;
use rampart_master::replica_manager::{ReplicationConfig, ServerSource};
use rampart_master::MasterService;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

const CLIENT_LEASE: Duration = Duration::from_millis(600);

/// Forwards connections to `target` while not cut; cutting closes those open and
/// refuses new ones.
struct Proxy {
    addr: String,
    cut: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let cuts = watch::Sender::new(0u64);
        let (accepting, subscribe) = (Arc::clone(&cut), cuts.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if accepting.load(Ordering::SeqCst) {
                    continue; // Dropped: refused.
                }
                let target = target.clone();
                let mut cut = subscribe.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy { addr, cut, cuts }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_past_its_lease_goes_on_under_a_new_id() {
    let dir = tempfile::TempDir::new().unwrap();
    // The coordinator, with short client leases.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let coordinator = listener.local_addr().unwrap().to_string();
    let peers = BTreeMap::from([(1, coordinator.clone())]);
    let node = RaftNode::start(
        NodeConfig::new(1, peers, dir.path().join("coordinator")),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    let service = Arc::new(CoordinatorService::new(node.clone()).with_client_lease(CLIENT_LEASE));
    tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
    // One master (R = 0) that knows the coordinators: it checks client leases.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let request = EnlistRequest {
        addr: listener.local_addr().unwrap().to_string(),
        services: Services {
            master: true,
            backup: false,
        },
        failure_domain: "rack-1".into(),
        disk_read_mbps: 0,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let group = CoordinatorSet::new(&[coordinator.as_str()]);
    let id = group
        .call::<Enlist>(&RpcPool::new(), &request, deadline)
        .await
        .unwrap()
        .id;
    let config = MasterConfig {
        memory_bytes: 64 << 20,
        ..MasterConfig::default()
    };
    let replication = ReplicationConfig {
        servers: ServerSource::Coordinators(vec![coordinator.clone()]),
        ..ReplicationConfig::none()
    };
    let master = Arc::new(MasterService::with_replication(id, config, replication));
    tokio::spawn(Arc::clone(master.tablet_sync()).run(std::future::pending()));
    if let Some(reserver) = master.version_reserver() {
        tokio::spawn(Arc::clone(reserver).run(std::future::pending()));
    }
    let checker = master
        .client_leases()
        .expect("a master with coordinators checks");
    tokio::spawn(Arc::clone(checker).run(std::future::pending()));
    tokio::spawn(RpcServer::run(listener, master, std::future::pending()));

    // The client reaches the coordinator through the proxy only.
    let proxy = Proxy::start(coordinator.clone()).await;
    let options = ClientOptions {
        deadline: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = Client::connect_with(&[proxy.addr.as_str()], options)
        .await
        .unwrap();
    let table = client.create_table("t", 1).await.unwrap();
    client.write(table, b"before", b"v").await.unwrap();
    let first = client.id();

    // Cut off until the coordinator has expired its id.
    proxy.cut();
    let expired_by = Instant::now() + CLIENT_LEASE * 20;
    while node.with_state(|s| s.client_open(first)) {
        assert!(Instant::now() < expired_by, "{first} never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next write is numbered under the expired id (the client does not know yet):
    // refused, its outcome unknown to the caller, and not sent again under another id.
    let error = client
        .write(table, b"refused", b"v")
        .await
        .expect_err("numbered under an expired id");
    assert!(matches!(error, ClientError::LeaseExpired(_)), "{error:?}");
    assert!(error.outcome_unknown(), "{error}");

    // Reachable again: the client opens a new id and writes go on.
    proxy.heal();
    client.write(table, b"after", b"v").await.unwrap();
    assert_ne!(client.id(), first);
    assert!(node.with_state(|s| s.client_open(client.id())));
    assert!(client.read(table, b"after").await.unwrap().is_some());
    assert!(
        client.read(table, b"refused").await.unwrap().is_none(),
        "the refused write was sent again"
    );
}
