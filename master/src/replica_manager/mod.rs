//! The replica manager: where each segment of this master's log is replicated, and
//! keeping it so (DESIGN.md §5).
//!
//! * [`backup_selector`] — `BackupSelector`: chooses the R backups of each new segment
//!   by randomized refinement, and a replacement when a backup is lost. Pure and
//!   synchronous.
//! * [`segment_replicas`] — `SegmentReplicas`: the replicas of one segment and every
//!   protocol decision about them (place, bump epochs, record the epoch, close, free).
//!   Pure and synchronous; property-tested.
//! * [`replica_failures`] — `ReplicaFailures`: what a failed call to a backup loses
//!   (the replica, every replica on the backup, or the master: fenced), which backups
//!   are excluded for a while, and the copies given up on until they are freed. Pure
//!   and synchronous; the simulation drives it too.
//! * [`placement`] — which backups get a segment's empty slots (through the
//!   `BackupSelector`), and the selector's primary counts kept true as replicas come and
//!   go. Pure and synchronous; the simulation places through it too.
//! * [`settling`] — `Settling`: one settle of a segment, one layer above
//!   `SegmentReplicas::step` — confirm alive, place, bump, record, and when to stop
//!   trying. Pure and synchronous; the simulation drives it too.
//! * [`sequencing`] — the order of the replicator's calls: a range's write
//!   (`RangeWrite`), a replica's creation (`Creation`), upkeep between batches
//!   (`Upkeep`). Pure and synchronous; the simulation follows them too.
//! * `transport` — one `ReplicaTransport` per way bytes reach a frame (`shm`, `tcp`,
//!   `rpc`, `rdma`), the pure choice among them, and the resources they share (mapped
//!   frame files with their backups' liveness, RDMA links).
//! * [`replicator`] — `Replicator`: the async driver the appender calls at its
//!   replication point. It performs what `SegmentReplicas`, `Settling` and
//!   `ReplicaFailures` ask through the transports, feeding the selector the server list
//!   it pulls from the coordinators' leader.
//! * [`server_list_watch`] — `ServerListWatch`: the server-list versions the coordinator
//!   pushes (`ServerListChanged`), which make the replicator pull at once instead of at
//!   its next periodic refresh.
//! * [`rdma_link`] — `RdmaLink`: one RDMA connection per backup for the `rdma` transport.

pub mod backup_selector;
pub mod placement;
pub mod rdma_link;
pub mod replica_failures;
pub mod replicator;
pub mod segment_replicas;
pub mod sequencing;
pub mod server_list_watch;
pub mod settling;
mod transport;

pub use replicator::{Fatal, ReplicationConfig, ReplicationStats, Replicator, ServerSource};
pub use server_list_watch::ServerListWatch;
