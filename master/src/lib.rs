//! `rampart-master`: the master service of a storage server — objects in a
//! log-structured DRAM log (docs/design.md §4–§5).
//!
//! * [`segmented_log`] — `SegmentedLog`: the log in fixed-size segments, rollover with
//!   digest and footer, the byte ranges awaiting replication.
//! * [`object_index`] — `ObjectIndex`: (table, key) → log reference, ordered by key hash.
//! * [`tablets`] — `OwnedTablets`: the key-hash ranges this master serves.
//! * [`object_store`] — `ObjectStore`: the synchronous core: ownership, reject rules,
//!   versions, staging and publishing batches, enumerate.
//! * [`completions`] — `Completions`: the completion records that answer a retried
//!   write, remove or increment with its first outcome (RIFL, `rampart_common::rifl`).
//! * [`appender`] — `Appender`: the single writer with group commit; it also runs the
//!   cleaner's steps between its batches.
//! * [`cleaner`] — the log cleaner's decisions: cost-benefit choice of segments, when to
//!   clean, and where a pass stands (`CleaningPass`); `ObjectStore::clean_step` and
//!   `commit_cleaning` do the work.
//! * [`profiler`] — `Profiler`: per-tablet trees of byte and record counts over the key
//!   hash, and the will (recovery partitions) computed from them.
//! * [`replica_manager`] — where segments are replicated: `BackupSelector` places the
//!   R replicas of each segment by randomized refinement; `SegmentReplicas` decides
//!   what each segment's replicas need (place, bump, record, close, free); `Replicator`
//!   does it over the transports (`shm`, `tcp`, `rpc`, `rdma`).
//! * [`service`] — `MasterService`: RPC handlers.
//! * [`replay`] — `RecoveryPiece` and `ReplayState`: a backup's piece of a crashed
//!   master's log, decoded and checked, and the replay rules' state (no I/O).
//! * [`recovery_master`] — `RecoveryMaster`: replays a partition of a crashed master's log
//!   (fetch pipeline from backups, replay rules, abandoning a failed attempt).
//! * [`lease`] — `Lease`: whether this master may serve reads and writes (it holds a
//!   lease from the coordinator), and `LeaseRenewer`, the task that renews it.
//! * [`failure_detector`] — `FailureDetector`: pings a random other server every
//!   100 ms and reports one that does not answer to the coordinator.
//! * [`will_upload`] — `WillUploader`: uploads the will to the coordinator when it
//!   changed materially.
//! * [`tablet_load`] — `LoadCounter`: reads and writes served, by table and slice of the
//!   hash space, and each tablet's load from them; [`load_report`] — `LoadReporter`,
//!   which sends it to the coordinators' leader every second (rebalancing).
//! * [`tablet_sync`] — `TabletSync`: keeps the tablets served equal to the committed
//!   map, pulling them when a numbered change was missed (a lost push, a leader that died
//!   between commit and push).
//! * [`version_reserver`] — `VersionReserver`: reserves version ranges at the
//!   coordinator ahead of the versions this master hands out.
//! * [`move_in`] — `MoveIn`: takes a range from its source ahead of the commit of a move
//!   of tablets (copy, tails, freeze, last tail), and forgets it if the move is aborted;
//!   the source's side is the store's (`object_store`'s `moves`).
//! * [`frozen_watch`] — `FrozenWatch`: serves a range frozen for a move again once its
//!   abort is committed and the news of it never came.
//!
//! # The write path
//! 1. `MasterService` decodes a write, remove or increment and submits it to the
//!    `Appender` queue.
//! 2. The appender takes every queued job into one batch, and under the store lock
//!    stages each operation: ownership check (`UnknownTablet`), key and value limits,
//!    a retried operation answered from its completion record (exactly-once),
//!    reject rules against the current (possibly just-staged) version, new version,
//!    append of the object or tombstone — with the operation's completion record — to
//!    the head segment (rolling over when full;
//!    `Retry` while the cleaner can still free room, `NoSpace` when the live data and
//!    its index fill the memory). It seals the batch with one Tailwind checksum.
//! 3. The sealed byte ranges are written to all R replicas of their segments by the
//!    `Replicator` (the replication point in `appender`); the appender waits for every
//!    transport completion.
//! 4. The batch is published to the index — reads see it from now on — and every
//!    request in it is answered.
//!
//! # The recovery path (docs/design.md §6 step 2)
//! 1. The coordinator sends `Recover` with a partition of a crashed master's will (its
//!    ranges, which this master does not own) and, per segment of the crashed log, the
//!    backups holding a replica. `RecoveryMaster` forgets leftovers of an earlier
//!    attempt in those ranges.
//! 2. It asks each segment's first backup for the partition's entries (`RecoveryData`),
//!    a few segments in flight, falling back to the next backup when one fails, and
//!    checks each piece off the reactor. A backup on the same host answers with where
//!    the piece lies in its shared recovery region, and the recovery master copies it
//!    out itself ([`shared_pieces`]).
//! 3. Each piece becomes an appender replay job: under the store lock, highest version
//!    wins and tombstones delete older versions ([`ObjectStore::stage_replay`]); the
//!    survivors are appended to this master's log with their original versions (shifted
//!    above the crashed master's version ceiling when loss was allowed), sealed,
//!    replicated to its own backups and published to the index — but not served, as
//!    reads check ownership first.
//! 4. Once every piece is published, `Recover` answers with the counts; the coordinator
//!    commits the partition to this master and sends `TakeTablets` (or, if that is lost,
//!    this master pulls its tablets at its next lease renewal, `tablet_sync`), which keeps
//!    the replayed objects (and counts them in the profiles behind the will), and reads
//!    see them. If the recovery fails or is abandoned (`AbandonRecovery` of that attempt
//!    or a newer one), the replayed objects are forgotten, and the segments that hold
//!    the attempt's entries are cleaned out of the log before any further replay
//!    ([`ObjectStore::forget_unowned`]): none of them may come back in a later recovery
//!    of this master.
//!
//! # The cleaner
//! Between batches the appender runs the cleaner's bounded steps ([`cleaner`]): live
//! entries of the chosen segments are copied into survivor segments (the index follows
//! them), replicated like a batch, and committed by a new digest appended to the head;
//! once that digest is on every replica the cleaned segments are freed, in memory and on
//! their backups. A removal, and every overwrite of a version in another segment, leave a
//! tombstone that the cleaner keeps while the segment of the version it kills is in the
//! log (`object_store`'s module doc, "Removals"): a removed key never comes back.
//!
//! # The read path
//! `MasterService` locks the store, checks ownership, looks the key up in the index and
//! copies the value from its segment into the reply frame.

pub mod appender;
pub mod cleaner;
pub mod client_lease_cache;
pub mod client_leases;
pub mod completions;
pub mod failure_detector;
pub mod frozen_watch;
pub mod lease;
pub mod load_report;
pub mod move_in;
pub mod object_index;
pub mod object_store;
pub mod profiler;
pub mod recovery_master;
pub mod replay;
pub mod replica_manager;
pub mod segmented_log;
pub mod service;
pub mod shared_pieces;
pub mod tablet_load;
pub mod tablet_sync;
pub mod tablets;
pub mod version_reserver;
pub mod will_upload;

#[cfg(test)]
mod cleaner_tests;
#[cfg(test)]
mod exactly_once_tests;
#[cfg(test)]
mod service_tests;

pub use object_store::{EnumeratePage, Object, ObjectStore, OpOutcome, WriteOp};
pub use service::{MasterService, MasterStats};
