//! The replicator's server list against fake coordinators (in this process, on
//! loopback): it is pulled from the leader a follower names, and a `ServerListChanged`
//! push of a newer version makes the master pull at once instead of at its periodic
//! refresh; an older or equal one does not.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::config::MasterConfig;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{GetTabletMap, NotLeaderHint};
use rampart_common::protocol::master::{ServerListChanged, ServerListVersion};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, RpcPool, RpcServer, Service};
use rampart_common::status::Status;
use rampart_common::tablet::TabletMap;
use rampart_master::replica_manager::replicator::SERVER_LIST_REFRESH;
use rampart_master::replica_manager::{ReplicationConfig, Replicator, ServerSource};
use rampart_master::MasterService;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

const MASTER: ServerId = ServerId(100);

/// Bound on any wait in these tests; past it something hangs.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// A coordinator that serves `GetTabletMap` (an empty list at `version`) and records
/// when it was asked, or that only answers `NotLeader` naming `leader`.
#[derive(Debug, Default)]
struct FakeCoordinator {
    /// `Some`: a follower that names this leader.
    leader: Option<String>,
    version: AtomicU64,
    pulls: Mutex<Vec<Instant>>,
}

impl Service for FakeCoordinator {
    fn handle(&self, opcode: Opcode, _payload: Bytes) -> HandleFuture<'_> {
        self.pulls.lock().push(Instant::now());
        let reply = match (&self.leader, opcode) {
            (Some(leader), _) => Reply::error(
                Status::NotLeader,
                NotLeaderHint::Leader {
                    id: 1,
                    addr: leader.clone(),
                }
                .encode(),
            ),
            (None, GetTabletMap::OPCODE) => Reply::ok(&TabletMap {
                version: self.version.load(Ordering::SeqCst),
                servers: Vec::new(),
                tables: Vec::new(),
            }),
            (None, other) => Reply::error(Status::UnknownOpcode, format!("{other}")),
        };
        Box::pin(async move { reply })
    }
}

impl FakeCoordinator {
    fn pulls(&self) -> usize {
        self.pulls.lock().len()
    }
}

async fn serve<S: Service>(service: Arc<S>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
    addr
}

/// A leader at `version` and a follower naming it.
async fn group(version: u64) -> (Arc<FakeCoordinator>, Arc<FakeCoordinator>, String) {
    let leader = Arc::new(FakeCoordinator::default());
    leader.version.store(version, Ordering::SeqCst);
    let leader_addr = serve(Arc::clone(&leader)).await;
    let follower = Arc::new(FakeCoordinator {
        leader: Some(leader_addr),
        ..FakeCoordinator::default()
    });
    let follower_addr = serve(Arc::clone(&follower)).await;
    (leader, follower, follower_addr)
}

fn replication(coordinators: Vec<String>) -> ReplicationConfig {
    ReplicationConfig {
        replicas: 1,
        servers: ServerSource::Coordinators(coordinators),
        ..ReplicationConfig::none()
    }
}

#[tokio::test]
async fn tick_pulls_again_only_when_a_newer_version_was_pushed() {
    let (leader, follower, follower_addr) = group(5).await;
    let mut replicator = Replicator::new(MASTER, replication(vec![follower_addr]));
    let watch = replicator.server_list_watch();

    assert_eq!(replicator.tick().await.unwrap(), None);
    assert_eq!(leader.pulls(), 1);
    assert_eq!(replicator.server_list_version(), 5);
    // Within SERVER_LIST_REFRESH of the pull: nothing to do.
    assert_eq!(replicator.tick().await.unwrap(), None);
    assert_eq!(leader.pulls(), 1);

    // A push of the version held, or an older one, changes nothing.
    assert!(watch.push(5));
    assert!(!watch.push(4));
    assert_eq!(replicator.tick().await.unwrap(), None);
    assert_eq!(leader.pulls(), 1);

    leader.version.store(6, Ordering::SeqCst);
    assert!(watch.push(6));
    assert_eq!(replicator.tick().await.unwrap(), None);
    assert_eq!(leader.pulls(), 2);
    assert_eq!(replicator.server_list_version(), 6);
    assert_eq!(replicator.tick().await.unwrap(), None);
    assert_eq!(leader.pulls(), 2);

    // The follower was asked once; the leader it named is remembered since.
    assert_eq!(follower.pulls(), 1);
}

#[tokio::test]
async fn a_pushed_newer_list_is_pulled_before_the_periodic_refresh() {
    let (leader, _follower, follower_addr) = group(1).await;
    let master = Arc::new(MasterService::with_replication(
        MASTER,
        MasterConfig {
            memory_bytes: 64 << 20,
            ..MasterConfig::default()
        },
        replication(vec![follower_addr]),
    ));
    let master_addr = serve(Arc::clone(&master)).await;

    // The first upkeep pulls the list.
    let wait_for_pull = |after: usize| {
        let leader = Arc::clone(&leader);
        async move {
            tokio::time::timeout(STEP_TIMEOUT, async {
                while leader.pulls() <= after {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await
            .expect("the master pulls its server list");
            *leader.pulls.lock().last().unwrap()
        }
    };
    let pulled = wait_for_pull(0).await;

    // Right after a pull the periodic refresh is SERVER_LIST_REFRESH away; a push of a
    // newer version must bring the next pull well before it.
    leader.version.store(2, Ordering::SeqCst);
    let pool = RpcPool::new();
    let push = ServerListVersion { version: 2 };
    let seen = leader.pulls();
    pool.call::<ServerListChanged>(&master_addr, &push, Instant::now() + STEP_TIMEOUT)
        .await
        .unwrap();
    let pulled_again = wait_for_pull(seen).await;
    let gap = pulled_again - pulled;
    assert!(
        gap < SERVER_LIST_REFRESH / 2,
        "the pushed list was pulled {gap:?} after the previous pull"
    );
}

#[tokio::test]
async fn a_malformed_push_is_refused() {
    let master = Arc::new(MasterService::new(
        MASTER,
        MasterConfig {
            memory_bytes: 64 << 20,
            ..MasterConfig::default()
        },
    ));
    let reply = master
        .handle(ServerListChanged::OPCODE, Bytes::from_static(b"x"))
        .await;
    assert_eq!(reply.status(), Status::MalformedRequest);
    let mut payload = bytes::BytesMut::new();
    rampart_common::rpc::WireMessage::encode(&ServerListVersion { version: 3 }, &mut payload);
    let reply = master
        .handle(ServerListChanged::OPCODE, payload.freeze())
        .await;
    assert_eq!(reply.status(), Status::Ok);
}
