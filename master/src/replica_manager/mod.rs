//! The replica manager: where each segment of this master's log is replicated
//! (DESIGN.md §5).
//!
//! * [`backup_selector`] — `BackupSelector`: chooses the R backups of each new segment
//!   by randomized refinement, and a replacement when a backup is lost. Pure and
//!   synchronous: the async replication driver feeds it the server list and asks it
//!   for placements.

pub mod backup_selector;
