//! The client against fake coordinators (in this process, on loopback): it follows a
//! `NotLeader` hint to the leader, keeps `TableDoesntExist` as its own error, and at its
//! deadline reports `NoCoordinator` with the last reason.

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use rampart_client::{Client, ClientError, ClientOptions, TableId};
use rampart_common::ids::ClientId;
use rampart_common::protocol::coordinator::{
    CreateTable, GetTableId, GetTabletMap, NotLeaderHint, OpenClient, OpenClientReply, TableIdReply,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, RpcServer, Service};
use rampart_common::status::Status;
use rampart_common::tablet::TabletMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A coordinator: the leader (an empty map, no tables; creates answer id 7, client
/// opens id 3) or a follower answering every call with `NotLeader` and `hint`.
#[derive(Debug)]
struct FakeCoordinator {
    hint: Option<NotLeaderHint>,
    calls: AtomicU64,
}

impl Service for FakeCoordinator {
    fn handle(&self, opcode: Opcode, _payload: Bytes) -> HandleFuture<'_> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let reply = match (&self.hint, opcode) {
            (Some(hint), _) => Reply::error(Status::NotLeader, hint.encode()),
            (None, GetTabletMap::OPCODE) => Reply::ok(&TabletMap {
                version: 1,
                servers: Vec::new(),
                tables: Vec::new(),
            }),
            (None, GetTableId::OPCODE) => Reply::error(Status::TableDoesntExist, "missing"),
            (None, CreateTable::OPCODE) => Reply::ok(&TableIdReply { id: TableId(7) }),
            (None, OpenClient::OPCODE) => Reply::ok(&OpenClientReply {
                client: ClientId(3),
                lease_ms: 30_000,
            }),
            (None, other) => Reply::error(Status::UnknownOpcode, format!("{other}")),
        };
        Box::pin(async move { reply })
    }
}

async fn start(hint: Option<NotLeaderHint>) -> (Arc<FakeCoordinator>, String) {
    let service = Arc::new(FakeCoordinator {
        hint,
        calls: AtomicU64::new(0),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(RpcServer::run(
        listener,
        Arc::clone(&service),
        std::future::pending(),
    ));
    (service, addr)
}

fn short_deadline() -> ClientOptions {
    ClientOptions {
        deadline: Duration::from_millis(300),
        ..ClientOptions::default()
    }
}

#[tokio::test]
async fn client_follows_a_hint_to_the_leader_and_stays_with_it() {
    let (leader, leader_addr) = start(None).await;
    let (follower, follower_addr) = start(Some(NotLeaderHint::Leader {
        id: 2,
        addr: leader_addr,
    }))
    .await;
    let client = Client::connect(&[follower_addr]).await.unwrap();
    assert_eq!(client.create_table("t", 1).await.unwrap(), TableId(7));
    match client.get_table_id("missing").await {
        Err(ClientError::TableDoesntExist(detail)) => assert_eq!(detail, "missing"),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(follower.calls.load(Ordering::SeqCst), 1);
    assert!(leader.calls.load(Ordering::SeqCst) >= 3);
}

#[tokio::test]
async fn connect_reports_no_coordinator_with_the_last_reason() {
    let (_follower, follower_addr) = start(Some(NotLeaderHint::Unknown {
        why: "election under way".into(),
    }))
    .await;
    match Client::connect_with(&[follower_addr], short_deadline()).await {
        Err(ClientError::NoCoordinator(last)) => {
            assert!(last.contains("no leader: election under way"), "{last}");
        }
        other => panic!("unexpected {other:?}"),
    }

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = listener.local_addr().unwrap().to_string();
    drop(listener);
    match Client::connect_with(&[dead], short_deadline()).await {
        Err(ClientError::NoCoordinator(last)) => {
            assert!(last.contains("cannot connect"), "{last}");
        }
        other => panic!("unexpected {other:?}"),
    }
}
