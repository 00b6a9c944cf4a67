//! `rampart-backup`: the backup service of a storage server (docs/design.md §5). It holds
//! replicas of other masters' log segments — first in memory frames written by
//! one-sided writes, then on disk — and serves them back when a master crashes.
//!
//! # Modules
//! * [`disk_speed`] — `DiskSpeed`: the start-up measurement of the disk's read
//!   bandwidth (a probe file written, read back with `O_DIRECT`, removed; about a
//!   second) that the backup reports at enlistment unless `--disk-mbps` overrides it.
//! * [`flush_threads`] — `FlushThreads`: the few long-lived threads that write closed
//!   frames to the store, each keeping its copy and staging buffers touched.
//! * [`recovery_reads`] — `RecoveryReads`: recovery's reads of a crashed master's replicas
//!   (`RecoveryRead`), each split once into per-partition pieces
//!   ([`recovery_reads::split_replica`], a pure function) and kept, within a memory bound, until
//!   recovery masters fetch them (`RecoveryData`); replicas nobody scheduled here are
//!   read and cut on demand.
//! * [`segment_store`] — `SegmentStore`: the on-disk store of segment replicas. Atomic,
//!   fsynced replica writes; a restart scan that verifies every replica and reports
//!   what it holds byte for byte; quarantine of anything that does not verify.
//! * [`frame_table`] — `FrameTable`: every decision about frames (open, write, bump,
//!   close, free, fence) as a synchronous state machine, unit- and property-tested.
//!   Public for `rampart-sim` alone, which drives it over simulated frames; here
//!   `frames` carries its decisions out on the frame file and `stored` keeps the
//!   table's mirror of the store in step with every store call (private modules,
//!   behind [`service`]).
//! * [`fencing`] — the steps of a fence, in the order its guarantee rests on
//!   ([`fencing::fence`]), and [`lifecycle`] — those of a close and a free: plain
//!   functions over what a backup gives them (its table under the lock, its slots, its
//!   store). Public for `rampart-sim` too, which runs them over its simulated frames and
//!   store; the service over its own.
//! * [`held_replicas`] — the replicas held here as reads see them: which copy a read
//!   serves ([`held_replicas::read_held`]: a frame, the slot a close kept, the file, the
//!   store) and what `StartRecovery` reports ([`held_replicas::recovery_replicas`]), as
//!   plain functions over what a backup's frames and store give them
//!   ([`held_replicas::HeldReplicas`]). Public for `rampart-sim` too, which runs them
//!   over its simulated frames and store; the service runs them over its own.
//! * [`service`] — `BackupService`: the backup RPCs (open, write, close, bump epoch,
//!   free, list, read a replica; start, read for, fetch for and end a recovery) over
//!   frames held in a shared-memory frame file and the segment store; the soft-NIC's
//!   target (`BackupNic`) and recovery's fence (`fence_master`); epochs, the bound on
//!   open frames, and the ordering of a close against a free of the same replica.
//!
//! The one-sided transports themselves (the frame file, the soft-NIC) live in
//! `rampart_common::onesided`, shared with the masters that write through them.
//!
//! # A replica's life on a backup
//! 1. A master opens a replica of one of its segments (master, segment, epoch); the
//!    backup reserves a zeroed frame for it: a slot of its frame file.
//! 2. The master writes the segment's bytes into the frame (one-sided: with `shm` the
//!    backup's CPU does nothing per write).
//! 3. When the master closes the segment, the backup flushes the frame on a flush
//!    thread — one large write and fsync outside the store's lock
//!    ([`ReplicaWriter::prepare`](segment_store::ReplicaWriter::prepare)), then the
//!    rename under it ([`SegmentStore::commit`](segment_store::SegmentStore::commit)) —
//!    and releases the slot (zeroed in place, for the next frame).
//! 4. During recovery of that master, the backup first fences its open frames
//!    ([`BackupService::fence_master`](service::BackupService::fence_master), on
//!    `StartRecovery`, which reports every replica of the master held here with the log
//!    digests of the open ones), then reads its replicas back in the order
//!    `RecoveryRead` gives — stored ones with
//!    [`SegmentStore::read_replica`](segment_store::SegmentStore::read_replica), which
//!    re-verifies their checksums, fenced frames up to their fenced length — and splits
//!    each into per-partition pieces ([`RecoveryReads`](recovery_reads::RecoveryReads)) that
//!    recovery masters fetch with `RecoveryData`. `EndRecovery` frees them all.
//! 5. After a restart of the backup itself,
//!    [`SegmentStore::open`](segment_store::SegmentStore::open) scans the disk and
//!    reports every replica it still holds.

pub mod disk_speed;
pub mod fencing;
pub mod flush_threads;
pub mod frame_table;
mod frames;
pub mod held_replicas;
pub mod lifecycle;
mod rdma;
pub mod recovery_reads;
pub mod segment_store;
pub mod service;
mod stored;
