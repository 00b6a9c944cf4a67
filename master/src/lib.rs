//! `rampart-master`: the master service of a storage server — objects in a
//! log-structured DRAM log (DESIGN.md §4–§5).
//!
//! * [`segmented_log`] — `SegmentedLog`: the log in fixed-size segments, rollover with
//!   digest and footer, the byte ranges awaiting replication.
//! * [`object_index`] — `ObjectIndex`: (table, key) → log reference, ordered by key hash.
//! * [`tablets`] — `OwnedTablets`: the key-hash ranges this master serves.
//! * [`object_store`] — `ObjectStore`: the synchronous core: ownership, reject rules,
//!   versions, staging and publishing batches, enumerate.
//! * [`appender`] — `Appender`: the single writer with group commit.
//! * [`profiler`] — `Profiler`: per-tablet trees of byte and record counts over the key
//!   hash, and the will (recovery partitions) computed from them.
//! * [`replica_manager`] — where segments are replicated: `BackupSelector` places the
//!   R replicas of each segment by randomized refinement; `Replicator` opens, writes
//!   (over `shm`, `tcp` or `rpc`), closes and re-creates them.
//! * [`service`] — `MasterService`: RPC handlers.
//!
//! # The write path
//! 1. `MasterService` decodes a write, remove or increment and submits it to the
//!    `Appender` queue.
//! 2. The appender takes every queued job into one batch, and under the store lock
//!    stages each operation: ownership check (`UnknownTablet`), key and value limits,
//!    reject rules against the current (possibly just-staged) version, new version,
//!    append of the object or tombstone to the head segment (rolling over when full,
//!    `NoSpace` when memory is exhausted). It seals the batch with one Tailwind checksum.
//! 3. The sealed byte ranges are written to all R replicas of their segments by the
//!    `Replicator` (the replication point in `appender`); the appender waits for every
//!    transport completion.
//! 4. The batch is published to the index — reads see it from now on — and every
//!    request in it is answered.
//!
//! # The read path
//! `MasterService` locks the store, checks ownership, looks the key up in the index and
//! copies the value from its segment into the reply frame.

pub mod appender;
pub mod object_index;
pub mod object_store;
pub mod profiler;
pub mod replica_manager;
pub mod segmented_log;
pub mod service;
pub mod tablets;

#[cfg(test)]
mod service_tests;

pub use object_store::{ObjectStore, OpOutcome, WriteOp};
pub use service::MasterService;
