//! The coordinator's table of handlers: each RPC routed to its method, typed
//! ([`Router`]), and the `Service` impl that sends every request through the table.
//!
//! `GetTabletMap`, `RaftStatus` and `RecoveryStatus` carry an empty request, which
//! their handlers never decoded: their routes hand over the payload unread, so any
//! payload is still served. An opcode routed nowhere is answered `UnknownOpcode`
//! ("coordinator does not serve opcode N").

use bytes::Bytes;
use rampart_common::protocol::coordinator::{
    AllowLoss, CancelMove, CheckClientLeases, CreateTable, DrainServer, DropTable, Enlist,
    GetDrain, GetMove, GetOwnedTablets, GetTableId, GetTabletMap, ListDrains, MoveTablets,
    OpenClient, ProcessExited, RaftMessages, RaftStatus, Rebalance, RecoveryStatus,
    RenewClientLease, RenewLease, ReportFailure, ReportLoad, ReserveVersions, SetOpenEpoch,
    SplitTablet, UploadWill, WatchTabletMap,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Router, Service};
use std::sync::LazyLock;

use super::shared::CoordinatorService;

/// Built once, on the first request.
static ROUTER: LazyLock<Router<CoordinatorService>> = LazyLock::new(router);

/// Every RPC the coordinator serves, by concern.
fn router() -> Router<CoordinatorService> {
    Router::<CoordinatorService>::new("coordinator")
        // Servers: enlistment, leases, failures, what masters record (servers.rs).
        .route::<Enlist>(|service, request| Box::pin(service.enlist(request)))
        .route::<ReportFailure>(|service, request| Box::pin(service.report_failure(request)))
        .route::<ProcessExited>(|service, request| Box::pin(service.process_exited(request)))
        .route::<RenewLease>(|service, request| Box::pin(service.renew_lease(request)))
        .route::<UploadWill>(|service, request| Box::pin(service.upload_will(request)))
        .route::<GetOwnedTablets>(|service, request| Box::pin(service.get_owned_tablets(request)))
        .route::<ReserveVersions>(|service, request| Box::pin(service.reserve_versions(request)))
        .route::<SetOpenEpoch>(|service, request| Box::pin(service.set_open_epoch(request)))
        // Drains (drains.rs).
        .route::<DrainServer>(|service, request| Box::pin(service.drain_server(request)))
        .route::<GetDrain>(|service, request| Box::pin(service.get_drain(request)))
        .route::<ListDrains>(|service, request| Box::pin(service.list_drains(request)))
        // Rebalancing (rebalancing.rs).
        .route::<ReportLoad>(|service, request| Box::pin(service.report_load(request)))
        .route::<Rebalance>(|service, request| Box::pin(service.rebalance(request)))
        // Tables and tablets (tables.rs).
        .route::<CreateTable>(|service, request| Box::pin(service.create_table(request)))
        .route::<DropTable>(|service, request| Box::pin(service.drop_table(request)))
        .route::<SplitTablet>(|service, request| Box::pin(service.split_tablet(request)))
        .route::<MoveTablets>(|service, request| Box::pin(service.move_tablets(request)))
        .route::<GetMove>(|service, request| Box::pin(service.get_move(request)))
        .route::<CancelMove>(|service, request| Box::pin(service.cancel_move(request)))
        .route::<GetTableId>(|service, request| Box::pin(service.get_table_id(request)))
        .route_payload::<GetTabletMap>(|service, _unread| Box::pin(service.get_tablet_map()))
        .route::<WatchTabletMap>(|service, request| Box::pin(service.watch_tablet_map(request)))
        // Recovery (recoveries.rs).
        .route::<AllowLoss>(|service, request| Box::pin(service.allow_loss(request)))
        .route_payload::<RecoveryStatus>(|service, _unread| Box::pin(service.recovery_status()))
        // Clients (clients.rs).
        .route::<OpenClient>(|service, request| Box::pin(service.open_client(request)))
        .route::<RenewClientLease>(|service, request| Box::pin(service.renew_client_lease(request)))
        .route::<CheckClientLeases>(|service, request| {
            Box::pin(service.check_client_leases(request))
        })
        // The coordinators among themselves (raft.rs).
        .route_payload::<RaftStatus>(|service, _unread| Box::pin(service.raft_status()))
        .route::<RaftMessages>(|service, request| Box::pin(service.raft_messages(request)))
}

impl Service for CoordinatorService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        ROUTER.handle(self, opcode, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::protocol::coordinator as proto;
    use rampart_common::protocol::opcode_name;
    use rampart_common::rpc::Rpc;

    #[test]
    fn every_coordinator_rpc_is_routed() {
        let router = router();
        let routed: Vec<u16> = router.opcodes().map(|opcode| opcode.0).collect();
        let expected: Vec<u16> = (100..200)
            .filter(|&code| opcode_name(Opcode(code)).is_some())
            .collect();
        assert_eq!(routed, expected);
        assert!(router.serves(proto::Enlist::OPCODE));
        assert!(!router.serves(Opcode(199)));
    }
}
