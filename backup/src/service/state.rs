//! [`BackupService`]: the service's parts — its configuration, the segment store, the
//! frames, the RDMA target, the recovery reads, the flush threads — shared by the files
//! of this module, each adding the methods of its role; and what the service reports of
//! itself.

use std::path::Path;
use std::sync::Arc;

use crate::flush_threads::FlushThreads;
use crate::frames::Frames;
use crate::rdma::RdmaTarget;
use crate::recovery_reads::RecoveryReads;
use crate::segment_store::ReplicaWriter;
use crate::stored::StoreHandle;

use super::config::BackupConfig;

/// The backup service of one storage server. See the module doc of `service`.
#[derive(Debug)]
pub struct BackupService {
    pub(super) config: BackupConfig,
    /// The on-disk store, keeping the frame table's mirror in step. Lock order: taken
    /// before the table, and only on blocking threads (it is held across fsyncs).
    pub(super) store: Arc<StoreHandle>,
    /// The frame table and the frame file. The table's lock is never held across I/O
    /// or `.await`, and never while waiting for the store's.
    pub(super) frames: Arc<Frames>,
    /// RDMA connections of masters and their keys (`RdmaConnect`, revoked by
    /// `fence_master`). Its lock is never taken while the table's or the store's is held.
    pub(super) rdma: Arc<RdmaTarget>,
    /// Recovery reads and their pieces. Its lock is never held while it calls into the
    /// service (through `RecoverySource`), so it nests with none of the above.
    pub(super) recovery: RecoveryReads,
    /// Writes replica files without the store lock (closes).
    pub(super) writer: ReplicaWriter,
    /// The threads closes run on.
    pub(super) flushers: FlushThreads,
}

impl BackupService {
    /// The configuration in force (after clamping `frame_bytes_max`).
    pub fn config(&self) -> &BackupConfig {
        &self.config
    }

    /// The frame file's absolute path (what `OpenReplica` replies name).
    pub fn frame_file_path(&self) -> &Path {
        self.frames.file.path()
    }

    /// Counts of this backup's frames and stored replicas, and its slot total.
    pub fn stats(&self) -> (crate::frame_table::FrameStats, usize) {
        let stats = self.frames.table.lock().stats();
        (stats, self.config.frames_max + self.config.extra_slots)
    }
}
