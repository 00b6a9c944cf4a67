//! `BackupService`: the backup's RPC handlers and its frames (docs/design.md §5 "Backups",
//! "One-sided writes", "Fencing").
//!
//! A master opens a *frame* for each replica it places here (`OpenReplica`): a slot of
//! the backup's shared-memory frame file. It fills the frame by `WriteReplica` RPCs,
//! through the soft-NIC ([`BackupNic`]), by copying straight into the frame file (`shm`)
//! or by RDMA WRITE into it (`rdma`, after an `RdmaConnect`), and closes it
//! (`CloseReplica`): the close writes the replica to the segment store and releases the
//! frame. `BumpEpoch` moves an open frame to a newer epoch; `FreeReplica`, `ListReplicas`
//! and `ReadReplica` serve the cleaner and recovery; [`BackupService::fence_master`] is
//! recovery's fence, and `StartRecovery`, `RecoveryRead`, `RecoveryData` and
//! `EndRecovery` serve the crash recovery of a master (docs/design.md §6). The frames outlive
//! a killed backup: [`BackupService::open`] stores what a predecessor left in them.
//! Callers see replicas named by (master, segment) and frames named by handles; they
//! never see the store's files, the slots, the locks or the blocking threads.
//!
//! # Guarantees
//! 1. A `CloseReplica` is answered `Ok` only once
//!    [`SegmentStore::write_replica`](crate::segment_store::SegmentStore::write_replica)
//!    returned `Ok`, i.e. the replica is fsynced and survives a restart of the backup.
//! 2. Epochs never go back: an open frame refuses older epochs, and a closed replica is
//!    final (re-opening it at its epoch or an older one is `StaleEpoch`).
//! 3. A replica is never invisible while it moves from frame to disk: the frame stays
//!    in the frame table until the stored replica is in the metadata mirror, and both
//!    changes happen in one critical section.
//! 4. Handles are never reused, and a slot's owner word is the handle of the frame it
//!    holds, so a late write for a closed, freed or replaced frame — by any transport —
//!    gets `UnknownFrame` (or `FrameGone`) rather than touching another replica.
//! 5. No input panics the service: every request is decoded with
//!    [`Reply::decode`](rampart_common::rpc::Reply::decode), every offset and length is
//!    checked in 64-bit arithmetic before it is used.
//! 6. Fencing: after [`BackupService::fence_master`] returns, no write to the fenced
//!    frames is acknowledged by any transport (`Fenced`), and every write acknowledged
//!    before it lies within the lengths it reported (the Dekker pair of
//!    `rampart_common::onesided::shm`). Those lengths are final: lists and reads of a
//!    fenced frame serve exactly that prefix, even if an unacknowledged write in flight
//!    during the fence landed past it. Close, `BumpEpoch` and a replacing open of a
//!    fenced frame are `Fenced` too; list, read and free still serve it. Once freed (by
//!    `EndRecovery`, which also fences a master `StartRecovery` never reached here), a
//!    fenced frame's handle is remembered ([`FENCED_HANDLES_MAX`]) and still answered
//!    `Fenced`: a zombie master must never take it for a lost replica. For `rdma`,
//!    whose writes the NIC acknowledges without looking at the fence word, the fence
//!    revokes the master's RDMA key before the scan, and the master is refused a new
//!    one.
//!
//! # Files
//! * `config.rs` — [`BackupConfig`]: how a backup sizes and places its frames.
//! * `state.rs` — the [`BackupService`] struct (its parts and their locks), shared by
//!   the files below, and what it reports of itself.
//! * `startup.rs` — [`BackupService::open`] ([`OpenReport`]): the frame file's tag and
//!   whether its backup is alive ([`frame_file_tag`], [`IDENTITY_FILE`]), the frames a
//!   killed predecessor left read back into the store; and their flush at a graceful
//!   stop ([`BackupService::flush_open_frames`]).
//! * `dispatch.rs` — requests decoded and sent to their handlers (the `Service` impl);
//!   open, write and bump epoch answered at once, on the connection task.
//! * `replica_rpcs.rs` — `CloseReplica`, `FreeReplica`, `ListReplicas`, `ReadReplica`
//!   and `RdmaConnect`.
//! * `close_job.rs` — `CloseJob`: a close on its way to the store, on a flush thread.
//! * `held.rs` — a replica as reads see it (frame, kept slot, file or store), and the
//!   listing of a master's replicas that `StartRecovery` reports: the shared functions
//!   of [`crate::held_replicas`] (which the simulation runs too) over the service's
//!   frames and store.
//! * `recovery_rpcs.rs` — the fence and the recovery RPCs (`StartRecovery`,
//!   `RecoveryRead`, `RecoveryData`, `EndRecovery`).
//! * `nic.rs` — [`BackupNic`], the soft-NIC's target.
//! * `replies.rs` — refusals and store errors as replies, and the blocking threads the
//!   slow handlers run on.
//! * `test_support.rs` — (tests only) the helpers of the tests beside each file.
//!
//! The crate's private parts do the work: `frame_table.rs` (every decision about
//! frames), `frames.rs` (the table under its lock, and the frame file), `fencing.rs`
//! (the fence's steps), `stored.rs` (the store under its lock, and the table's mirror of
//! it), `held_replicas.rs` (which copy of a replica reads and `StartRecovery` see) and
//! `rdma.rs` (the `rdma` transport).
//!
//! The design, with its guarantees and their arguments: docs/design.md §5 ("Backups").

mod close_job;
mod config;
mod dispatch;
mod held;
mod nic;
mod recovery_rpcs;
mod replica_rpcs;
mod replies;
mod startup;
mod state;
#[cfg(test)]
mod test_support;

pub use crate::frame_table::FENCED_HANDLES_MAX;
pub use config::BackupConfig;
pub use nic::BackupNic;
pub use startup::{frame_file_tag, frame_file_tag_is_live, OpenReport, IDENTITY_FILE};
pub use state::BackupService;
