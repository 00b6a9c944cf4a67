//! `rampart-backup`: the backup service of a storage server (DESIGN.md §5). It holds
//! replicas of other masters' log segments — first in memory frames written by
//! one-sided writes, then on disk — and serves them back when a master crashes.
//!
//! # Modules
//! * [`disk_speed`] — `DiskSpeed`: the start-up measurement of the disk's read
//!   bandwidth (a probe file written, read back with `O_DIRECT`, removed; about a
//!   second) that the backup reports at enlistment unless `--disk-mbps` overrides it.
//! * [`segment_store`] — `SegmentStore`: the on-disk store of segment replicas. Atomic,
//!   fsynced replica writes; a restart scan that verifies every replica and reports
//!   what it holds byte for byte; quarantine of anything that does not verify.
//! * [`service`] — `BackupService`: the backup RPCs (open, write, close, bump epoch,
//!   free, list, read a replica) over frames held in a shared-memory frame file and the
//!   segment store; the soft-NIC's target (`BackupNic`) and recovery's fence
//!   (`fence_master`); epochs, the bound on open frames, and the ordering of a close
//!   against a free of the same replica.
//!
//! The one-sided transports themselves (the frame file, the soft-NIC) live in
//! `rampart_common::onesided`, shared with the masters that write through them.
//!
//! # A replica's life on a backup
//! 1. A master opens a replica of one of its segments (master, segment, epoch); the
//!    backup reserves a zeroed frame for it: a slot of its frame file.
//! 2. The master writes the segment's bytes into the frame (one-sided: with `shm` the
//!    backup's CPU does nothing per write).
//! 3. When the master closes the segment, the backup flushes the frame with
//!    [`SegmentStore::write_replica`](segment_store::SegmentStore::write_replica) — one
//!    large write and fsync — and releases the slot (zeroed, its memory returned).
//! 4. During recovery of that master, the backup first fences its open frames
//!    ([`BackupService::fence_master`](service::BackupService::fence_master)), then
//!    reads its replicas back with
//!    [`SegmentStore::read_replica`](segment_store::SegmentStore::read_replica), which
//!    re-verifies their checksums; afterwards it frees them.
//! 5. After a restart of the backup itself,
//!    [`SegmentStore::open`](segment_store::SegmentStore::open) scans the disk and
//!    reports every replica it still holds.

pub mod disk_speed;
pub mod segment_store;
pub mod service;
