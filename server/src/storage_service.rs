//! `StorageService`: one storage server's RPC service — its master and its backup
//! behind one listener (docs/design.md §1), routed by opcode range (masters 1–99, backups
//! 200–299; see `rampart_common::protocol`).
//!
//! Backup requests run on the backup's own runtime (threads named
//! [`BACKUP_THREAD_NAME`], where the soft-NIC also runs), so that the CPU a backup
//! spends is visible per thread in `/proc` (`rampart bench replication` reads it) and
//! backup work cannot starve the master's workers. Only the decoding of the RPC frame
//! happens on the connection's thread.
//!
//! This is the router alone; [`crate::StorageServer`] builds it and runs everything
//! around it.

use bytes::Bytes;
use rampart_backup::service::BackupService;
use rampart_common::protocol::master::{ServerStats, ServerStatsReply};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, Service};
use rampart_common::status::Status;
use rampart_master::MasterService;
use std::sync::Arc;

/// Name of the threads of a server's backup runtime (≤ 15 bytes: the kernel's limit).
pub const BACKUP_THREAD_NAME: &str = "rampart-backup";

/// The services of one storage server.
#[derive(Debug)]
pub struct StorageService {
    /// Serves objects.
    pub master: MasterService,
    /// Holds other masters' segment replicas.
    pub backup: Arc<BackupService>,
    /// Where backup requests run.
    pub backup_runtime: tokio::runtime::Handle,
}

impl StorageService {
    /// How this server stands (the `ServerStats` reply).
    pub fn stats(&self) -> ServerStatsReply {
        let master = self.master.stats();
        let (frames, slots) = self.backup.stats();
        ServerStatsReply {
            objects: master.objects,
            log_bytes_used: master.log_bytes_used,
            log_bytes_max: master.log_bytes_max,
            log_bytes_live: master.log_bytes_live,
            replicas: u32::try_from(master.replicas).unwrap_or(u32::MAX),
            segments_under_replicated: master.segments_under_replicated,
            backup_shortage: master.backup_shortage.map(|shortage| shortage.explain()),
            segments_cleaned: master.segments_cleaned,
            lease_remaining_ms: master
                .lease_remaining
                .map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
            recovered_partitions: master.recoveries.partitions,
            recovered_objects: master.recoveries.objects,
            recovered_bytes: master.recoveries.bytes,
            backup_replicas: frames.replicas_stored as u64,
            backup_bytes: frames.bytes_stored,
            frames_open: frames.frames_open as u64,
            frames_unflushed: frames.frames_unflushed as u64,
            frame_slots: slots as u64,
        }
    }
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
            let backup = Arc::clone(&self.backup);
            let task = self
                .backup_runtime
                .spawn(async move { backup.handle(opcode, payload).await });
            Box::pin(async move {
                task.await.unwrap_or_else(|e| {
                    Reply::error(Status::Internal, format!("backup task failed: {e}"))
                })
            })
        } else {
            let detail = format!("a storage server does not serve {opcode}");
            Box::pin(async move { Reply::error(Status::UnknownOpcode, detail) })
        }
    }

    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        if opcode == ServerStats::OPCODE {
            return Some(Reply::ok(&self.stats()));
        }
        if is_master(opcode) {
            self.master.handle_now(opcode, payload)
        } else {
            // Backup requests go to the backup runtime (module doc).
            None
        }
    }
}
