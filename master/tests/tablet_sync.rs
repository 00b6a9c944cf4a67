//! A master's tablets converge to the committed map (issue 11, item 4), against a fake
//! coordinator on loopback: a push that comes after a missed one makes the master pull
//! its whole set, and so does a lease renewal reporting a newer tablet epoch.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{ServerId, TableId, TabletEpoch};
use rampart_common::protocol::coordinator::{GetOwnedTablets, OwnedTabletsReply, ServerIdRequest};
use rampart_common::protocol::master::{
    Read, ReadRequest, TabletsRequest, TakeTablets, Write, WriteRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, RpcPool, RpcServer, Service};
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use rampart_master::replica_manager::{ReplicationConfig, ServerSource};
use rampart_master::MasterService;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

const MASTER: ServerId = ServerId(3);

/// A coordinator whose committed map gives `MASTER` `tablets` at tablet epoch `epoch`.
#[derive(Debug, Default)]
struct MapCoordinator {
    owned: Mutex<(TabletEpoch, Vec<Tablet>)>,
    pulls: AtomicU64,
}

impl Service for MapCoordinator {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        let reply = match opcode {
            GetOwnedTablets::OPCODE => match Reply::decode::<ServerIdRequest>(payload) {
                Err(reply) => reply,
                Ok(request) => {
                    assert_eq!(request.server, MASTER);
                    self.pulls.fetch_add(1, Ordering::SeqCst);
                    let (epoch, tablets) = self.owned.lock().clone();
                    Reply::ok(&OwnedTabletsReply { epoch, tablets })
                }
            },
            other => Reply::error(Status::UnknownOpcode, format!("{other}")),
        };
        Box::pin(async move { reply })
    }
}

fn tablet(table: u64) -> Tablet {
    Tablet {
        table: TableId(table),
        start_hash: 0,
        end_hash: u64::MAX,
        owner: MASTER,
    }
}

async fn serve<S: Service>(service: Arc<S>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
    addr
}

/// A master without replication whose coordinator is `coordinator`.
async fn master(coordinator: &Arc<MapCoordinator>) -> Arc<MasterService> {
    let addr = serve(Arc::clone(coordinator)).await;
    let replication = ReplicationConfig {
        servers: ServerSource::Coordinators(vec![addr]),
        ..ReplicationConfig::none()
    };
    Arc::new(MasterService::with_replication(
        MASTER,
        MasterConfig {
            memory_bytes: 64 << 20,
            ..MasterConfig::default()
        },
        replication,
    ))
}

async fn status_of_read(master: &MasterService, table: u64) -> Status {
    let request = ReadRequest {
        table: TableId(table),
        key: Bytes::from_static(b"k"),
    };
    let mut payload = bytes::BytesMut::new();
    rampart_common::rpc::WireMessage::encode(&request, &mut payload);
    let reply = master.handle(Read::OPCODE, payload.freeze()).await;
    assert_eq!(reply.status(), Status::Ok);
    Reply::decode::<rampart_common::protocol::master::ReadReply>(Bytes::copy_from_slice(
        reply.payload(),
    ))
    .unwrap()
    .status
}

#[tokio::test]
async fn a_push_after_a_missed_one_pulls_the_whole_set_first() {
    let coordinator = Arc::new(MapCoordinator::default());
    let master = master(&coordinator).await;
    let master_addr = serve(Arc::clone(&master)).await;
    // Change 1 (take table 1) was lost; change 2 (take table 2) arrives.
    *coordinator.owned.lock() = (TabletEpoch(2), vec![tablet(1), tablet(2)]);
    let push = TabletsRequest {
        owner: MASTER,
        epoch: TabletEpoch(2),
        tablets: vec![tablet(2)],
    };
    RpcPool::new()
        .call::<TakeTablets>(&master_addr, &push, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(coordinator.pulls.load(Ordering::SeqCst), 1);
    assert_eq!(master.tablet_sync().applied(), TabletEpoch(2));
    assert_eq!(status_of_read(&master, 1).await, Status::ObjectDoesntExist);
    assert_eq!(status_of_read(&master, 2).await, Status::ObjectDoesntExist);
}

#[tokio::test]
async fn a_newer_epoch_reported_by_a_lease_renewal_is_pulled() {
    let coordinator = Arc::new(MapCoordinator::default());
    let master = master(&coordinator).await;
    let sync = Arc::clone(master.tablet_sync());
    tokio::spawn(Arc::clone(&sync).run(std::future::pending()));
    // Table 1 is this master's (change 1), with an object.
    *coordinator.owned.lock() = (TabletEpoch(1), vec![tablet(1)]);
    sync.report(TabletEpoch(1));
    let deadline = Instant::now() + Duration::from_secs(5);
    while sync.applied() < TabletEpoch(1) {
        assert!(Instant::now() < deadline, "epoch 1 never pulled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let write = WriteRequest {
        table: TableId(1),
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    };
    // (This fake reserves no versions: raise the ceiling by hand.)
    master
        .store()
        .lock()
        .raise_version_ceiling(rampart_common::ids::Version(1 << 20));
    let mut payload = bytes::BytesMut::new();
    rampart_common::rpc::WireMessage::encode(&write, &mut payload);
    let reply = master.handle(Write::OPCODE, payload.freeze()).await;
    let written: rampart_common::protocol::master::WriteReply =
        Reply::decode(Bytes::copy_from_slice(reply.payload())).unwrap();
    assert_eq!(written.status, Status::Ok);
    assert_eq!(master.store().lock().object_count(), 1);
    // Table 1 was dropped (change 2) and its push lost; the next renewal says epoch 2.
    *coordinator.owned.lock() = (TabletEpoch(2), vec![]);
    sync.report(TabletEpoch(2));
    sync.report(TabletEpoch(1));
    while sync.applied() < TabletEpoch(2) {
        assert!(Instant::now() < deadline, "epoch 2 never pulled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(status_of_read(&master, 1).await, Status::UnknownTablet);
    assert_eq!(
        master.store().lock().object_count(),
        0,
        "its objects are forgotten"
    );
    assert_eq!(coordinator.pulls.load(Ordering::SeqCst), 2);
}
