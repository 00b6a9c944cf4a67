//! The replica manager: where each segment of this master's log is replicated, and
//! keeping it so (DESIGN.md §5).
//!
//! * [`backup_selector`] — `BackupSelector`: chooses the R backups of each new segment
//!   by randomized refinement, and a replacement when a backup is lost. Pure and
//!   synchronous.
//! * [`replicator`] — `Replicator`: the async driver the appender calls at its
//!   replication point. It opens, writes (over `shm`, `tcp` or `rpc`), closes and
//!   re-creates replicas, feeding the selector the server list it pulls from the
//!   coordinators' leader.
//! * [`server_list_watch`] — `ServerListWatch`: the server-list versions the coordinator
//!   pushes (`ServerListChanged`), which make the replicator pull at once instead of at
//!   its next periodic refresh.
//! * [`rdma_link`] — `RdmaLink`: one RDMA connection per backup for the `rdma` transport.

pub mod backup_selector;
pub mod rdma_link;
pub mod replicator;
pub mod server_list_watch;

pub use replicator::{
    Fatal, ReplicationConfig, ReplicationStats, Replicator, SegmentSource, ServerSource,
};
pub use server_list_watch::ServerListWatch;
