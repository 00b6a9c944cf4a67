//! [`BackupConfig`]: how a backup sizes and places its frames.

use std::path::PathBuf;

/// How a backup sizes and places its frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupConfig {
    /// Frames open at once: the bound on replica bytes held only in memory. Sized so
    /// the disk can flush them (issue 3); `OpenReplica` past it is `BackupFull`. Must be
    /// at least 1.
    pub frames_max: usize,
    /// Slots of the frame file beyond `frames_max`. They hold no more unflushed data
    /// (`frames_max` still bounds the open frames) but keep more flushed replicas
    /// readable from memory, and leave room to open frames while closes still copy
    /// theirs out: in a 1 GiB recovery, a backup with 64 slots instead of 20 serves more
    /// of the crashed master's log from memory (issue 12).
    pub extra_slots: usize,
    /// Largest frame capacity accepted, in bytes; larger opens are `InvalidArgument`.
    /// Values above [`REPLICA_BYTES_MAX`](crate::segment_store::REPLICA_BYTES_MAX) are
    /// treated as it (the store takes no more).
    /// Each slot of the frame file holds this much.
    pub frame_bytes_max: u32,
    /// Where the backup creates its shared-memory frame file (replacing any file a dead
    /// backup left there). Masters on the same host map it, so it should lie on a
    /// memory file system (`/dev/shm`); anywhere else works, with the kernel writing the
    /// frames back to that disk in the background. The path must be valid UTF-8 (it
    /// travels in `OpenReplica` replies).
    pub frame_file: PathBuf,
}
