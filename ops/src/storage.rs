//! `StorageService`: one storage server's RPC service — its master and its backup
//! behind one listener (DESIGN.md §1), routed by opcode range (masters 1–99, backups
//! 200–299; see `rampart_common::protocol`).

use bytes::Bytes;
use rampart_backup::service::BackupService;
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Service};
use rampart_common::status::Status;
use rampart_master::MasterService;

/// The services of one storage server.
#[derive(Debug)]
pub struct StorageService {
    /// Serves objects.
    pub master: MasterService,
    /// Holds other masters' segment replicas.
    pub backup: BackupService,
}

fn is_master(opcode: Opcode) -> bool {
    (1..100).contains(&opcode.0)
}

fn is_backup(opcode: Opcode) -> bool {
    (200..300).contains(&opcode.0)
}

impl Service for StorageService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        if is_master(opcode) {
            self.master.handle(opcode, payload)
        } else if is_backup(opcode) {
            self.backup.handle(opcode, payload)
        } else {
            let detail = format!("a storage server does not serve {opcode}");
            Box::pin(async move { Reply::error(Status::UnknownOpcode, detail) })
        }
    }

    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        if is_master(opcode) {
            self.master.handle_now(opcode, payload)
        } else if is_backup(opcode) {
            self.backup.handle_now(opcode, payload)
        } else {
            None
        }
    }
}
