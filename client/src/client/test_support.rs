//! What the tests of `client` share: a one-master tablet map, and serving a fake
//! server on a port of its own.

use rampart_common::ids::{ServerId, TableId};
use rampart_common::rpc::{RpcServer, Service};
use rampart_common::tablet::{ServerInfo, ServerStatus, Services, TableInfo, Tablet, TabletMap};
use std::sync::Arc;
use tokio::net::TcpListener;

/// A map of one table with one tablet, owned by server 9 at `addr`.
pub(super) fn one_master_map(table: TableId, addr: String) -> TabletMap {
    TabletMap {
        version: 2,
        servers: vec![ServerInfo {
            id: ServerId(9),
            addr,
            services: Services {
                master: true,
                backup: true,
            },
            status: ServerStatus::Up,
            failure_domain: "rack".into(),
            disk_read_mbps: 100,
        }],
        tables: vec![TableInfo {
            id: table,
            name: "t".into(),
            tablets: vec![Tablet {
                table,
                start_hash: 0,
                end_hash: u64::MAX,
                owner: ServerId(9),
            }],
        }],
    }
}

/// Serves `service` on a port of its own; its address.
pub(super) async fn serve(service: Arc<impl Service>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
    addr
}
