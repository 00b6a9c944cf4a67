//! `SimMaster`: a master over the real cores — its store is a real [`ObjectStore`]
//! (staging with versions below a reserved ceiling, tablets, reads, tombstones, the
//! recovery replay; its log real entries, checksums, digests and footers), each
//! segment's replicas a real [`SegmentReplicas`] — driven the way the appender and
//! `Replicator` drive them, with every call to a backup or the coordinators going
//! through the [`World`].
//!
//! # Replication: the real decisions, a stand-in loop
//! The order of the replicator's calls is the real [`sequencing`]: each range's write a
//! `RangeWrite` (settle, check, write, settle again after a loss, close), each new
//! replica a `Creation` (open, fill, close; abandoned if any step fails), each upkeep
//! between batches an `Upkeep` round (server list, probes, frees, exclusions, the open
//! segments' lost replicas, one closed segment's). Each settle of a segment is a real
//! [`Settling`] (confirm alive, place, bump, record, when to give up) and each failed
//! call goes to a real [`ReplicaFailures`] (what it loses, which backups are left out a
//! while, which copies given up on are freed when). Each placement's backups come from
//! the real [`placement`] through a real `BackupSelector` (each simulated backup its own
//! failure domain), which keeps its primary counts as replicas come and go. Only the
//! loop carrying out their steps through the [`World`] stands in for `Replicator`, and:
//! the server list, read from the world (no cache; no probes, as nothing is quiet: every
//! call reaches its backup or fails it); closes sent inline, not in the background;
//! exclusions on the simulation's time scale (`FAILED_BACKUP_EXCLUSION_US`).
//!
//! The driver is synchronous: one call at a time, each a boundary where the world moves
//! on (a real master writes the R replicas of a range concurrently; here they go one
//! after the other, and a crash can fall between any two of them, which covers the
//! states concurrency leaves behind). A fill of a new replica goes in chunks, so a crash
//! can leave it part written.
//!
//! [`ObjectStore`]: rampart_master::object_store::ObjectStore
//! [`ReplicaFailures`]: rampart_master::replica_manager::replica_failures::ReplicaFailures
//! [`SegmentReplicas`]: rampart_master::replica_manager::segment_replicas::SegmentReplicas
//! [`Settling`]: rampart_master::replica_manager::settling::Settling
//! [`World`]: crate::world::World
//! [`placement`]: rampart_master::replica_manager::placement
//! [`sequencing`]: rampart_master::replica_manager::sequencing

mod replication;
mod sim_master;

pub use sim_master::{ClientWrite, Pending, Recovered, SimMaster, VALUE_BYTES_MAX};
