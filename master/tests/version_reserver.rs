//! A master's version reservations against a fake coordinator on loopback: nothing is
//! handed out before a reservation, one is made as soon as the log's opening is out, a
//! coordinator that cannot be reached holds writes back (answered `Retry`, nothing
//! applied), and one that says the master crashed ends the reserver.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::config::MasterConfig;
use rampart_common::ids::{ServerId, TableId, TabletEpoch, Version};
use rampart_common::protocol::coordinator::{
    ReserveVersions, ReserveVersionsReply, ReserveVersionsRequest,
};
use rampart_common::protocol::master::{
    TabletsRequest, TakeTablets, Write, WriteReply, WriteRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, RpcServer, Service, WireMessage};
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use rampart_master::object_store::VERSION_RESERVATION;
use rampart_master::replica_manager::{ReplicationConfig, ServerSource};
use rampart_master::version_reserver::ReserveError;
use rampart_master::MasterService;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

const MASTER: ServerId = ServerId(4);
const TABLE: TableId = TableId(1);

/// A coordinator that grants every reservation (recording it) or, told to, answers
/// that the master was declared crashed.
#[derive(Debug, Default)]
struct Ceilings {
    granted: Mutex<Vec<u64>>,
    crashed: AtomicBool,
}

impl Service for Ceilings {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        let reply = match opcode {
            ReserveVersions::OPCODE => match Reply::decode::<ReserveVersionsRequest>(payload) {
                Err(reply) => reply,
                Ok(_) if self.crashed.load(Ordering::SeqCst) => {
                    Reply::error(Status::ServerCrashed, "declared crashed")
                }
                Ok(request) => {
                    assert_eq!(request.server, MASTER);
                    self.granted.lock().push(request.ceiling);
                    Reply::ok(&ReserveVersionsReply {
                        ceiling: request.ceiling,
                    })
                }
            },
            other => Reply::error(Status::UnknownOpcode, format!("{other}")),
        };
        Box::pin(async move { reply })
    }
}

/// A master without replication whose coordinators are at `addr`, owning `TABLE`.
/// A log of 64 MiB: every master touches its whole log when it is created.
fn small_log() -> MasterConfig {
    MasterConfig {
        memory_bytes: 64 << 20,
        ..MasterConfig::default()
    }
}

async fn master(addr: String) -> MasterService {
    let replication = ReplicationConfig {
        servers: ServerSource::Coordinators(vec![addr]),
        ..ReplicationConfig::none()
    };
    let master = MasterService::with_replication(MASTER, small_log(), replication);
    let take = TabletsRequest {
        owner: MASTER,
        epoch: TabletEpoch(1),
        tablets: vec![Tablet {
            table: TABLE,
            start_hash: 0,
            end_hash: u64::MAX,
            owner: MASTER,
        }],
    };
    let reply = master.handle(TakeTablets::OPCODE, encode(&take)).await;
    assert_eq!(reply.status(), Status::Ok);
    master
}

fn encode<M: WireMessage>(message: &M) -> Bytes {
    let mut out = bytes::BytesMut::new();
    message.encode(&mut out);
    out.freeze()
}

async fn write(master: &MasterService, key: &'static [u8]) -> WriteReply {
    let request = WriteRequest {
        table: TABLE,
        key: Bytes::from_static(key),
        value: Bytes::from_static(b"v"),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    };
    let reply = master.handle(Write::OPCODE, encode(&request)).await;
    assert_eq!(reply.status(), Status::Ok);
    Reply::decode(Bytes::copy_from_slice(reply.payload())).unwrap()
}

async fn serve(coordinator: Arc<Ceilings>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(RpcServer::run(
        listener,
        coordinator,
        std::future::pending(),
    ));
    addr
}

#[tokio::test]
async fn writes_wait_for_the_first_reservation_which_comes_once_the_log_is_out() {
    let coordinator = Arc::new(Ceilings::default());
    let master = master(serve(Arc::clone(&coordinator)).await).await;
    let reserver = Arc::clone(master.version_reserver().expect("has coordinators"));
    // Nothing reserved: the write is refused with Retry and not applied.
    assert_eq!(write(&master, b"k").await.status, Status::Retry);
    assert_eq!(master.store().lock().object_count(), 0);
    // The log's opening is out at once here (no replicas): a reservation is due.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !reserver.reserve_if_due().await.unwrap() {
        assert!(Instant::now() < deadline, "no reservation was ever due");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        *coordinator.granted.lock(),
        vec![Version::FIRST.0 + VERSION_RESERVATION]
    );
    let written = write(&master, b"k").await;
    assert_eq!((written.status, written.version), (Status::Ok, Version(1)));
    assert!(!reserver.reserve_if_due().await.unwrap(), "not due again");
}

#[tokio::test]
async fn without_a_coordinator_nothing_is_reserved_and_writes_stay_refused() {
    // A coordinator address nobody listens at.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let master = master(addr).await;
    let reserver = master.version_reserver().expect("has coordinators");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let error = reserver.reserve_if_due().await.expect_err("unreachable");
    assert!(matches!(error, ReserveError::Unavailable(_)), "{error:?}");
    assert_eq!(write(&master, b"k").await.status, Status::Retry);
    assert_eq!(master.store().lock().object_count(), 0);
}

#[tokio::test]
async fn a_master_declared_crashed_reserves_nothing_and_its_reserver_ends() {
    let coordinator = Arc::new(Ceilings::default());
    coordinator.crashed.store(true, Ordering::SeqCst);
    let master = master(serve(Arc::clone(&coordinator)).await).await;
    let reserver = Arc::clone(master.version_reserver().expect("has coordinators"));
    tokio::time::timeout(Duration::from_secs(5), reserver.run(std::future::pending()))
        .await
        .expect("the reserver ends once the coordinator says the master crashed");
    assert!(coordinator.granted.lock().is_empty());
    assert_eq!(write(&master, b"k").await.status, Status::Retry);
}

#[tokio::test]
async fn nothing_is_reserved_before_the_logs_opening_is_on_its_backups() {
    // R = 1 and no backup to be found (this coordinator serves no server list): the
    // opening of segment 1 never goes out, so the master must not reserve — a master
    // the coordinators hold a ceiling for must have a log a recovery can find.
    let coordinator = Arc::new(Ceilings::default());
    let replication = ReplicationConfig {
        replicas: 1,
        servers: ServerSource::Coordinators(vec![serve(Arc::clone(&coordinator)).await]),
        ..ReplicationConfig::none()
    };
    let master = MasterService::with_replication(MASTER, small_log(), replication);
    let reserver = master.version_reserver().expect("has coordinators");
    for _ in 0..5 {
        assert!(!reserver.reserve_if_due().await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(coordinator.granted.lock().is_empty());
}
