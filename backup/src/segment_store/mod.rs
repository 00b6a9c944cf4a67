//! `SegmentStore`: the backup's on-disk store of segment replicas (docs/design.md §5).
//!
//! A backup keeps the replicas it is given in memory frames (the "non-volatile buffer")
//! while they are written, then flushes each closed frame here in one large write, and
//! may flush an open frame here too. After a restart, [`SegmentStore::open`] scans the
//! store and reports every replica it holds, so the backup can tell the coordinator and
//! recovery masters what it can serve. Callers see whole replicas — write one, read one,
//! list, free — and never files, temp names or checksums.
//!
//! # Guarantees
//! 1. A replica reported after a restart (in the [`ScanReport`], by [`SegmentStore::list`]
//!    or by [`SegmentStore::read_replica`]) is byte-identical to what a
//!    [`SegmentStore::write_replica`] that returned `Ok` was given, with the same epoch,
//!    length and open/closed state. `Ok` is returned only after the bytes and the
//!    directory entry are fsynced, so the caller may acknowledge once it has `Ok`.
//! 2. A crash at any point of a write leaves either the previous replica of that
//!    (master, segment) or, if there was none, no replica: the bytes go to a temp file
//!    that is renamed over the final name only once it is durable. A torn or partial
//!    file is never served.
//! 3. A file that fails verification (at open or at a later read) is moved aside to
//!    `quarantine/` and reported; it is never silently deleted and never served.
//! 4. A replica never goes back: a write with an older epoch is refused
//!    ([`StoreError::StaleEpoch`]), and so is a write of the same epoch that would
//!    shrink the replica or reopen a closed one ([`StoreError::Regressed`]).
//!
//! # Layout on disk
//! ```text
//! DIR/LOCK                      advisory lock (flock): one store per directory
//! DIR/replicas/m{M}-s{S}.replica  one file per replica of segment S of master M
//! DIR/replicas/m{M}-s{S}.replica.tmp  a write in progress; removed at open
//! DIR/quarantine/...            files that failed verification, kept for the operator
//! ```
//! `M` and `S` are decimal without leading zeros, so every replica has exactly one name.
//! A replica file is a fixed header followed by `length` content bytes. All integers are
//! little-endian:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0      | 8    | magic `RMPTREPL` |
//! | 8      | 4    | format version (1) |
//! | 12     | 8    | master `ServerId` |
//! | 20     | 8    | segment `SegmentId` |
//! | 28     | 8    | epoch |
//! | 36     | 4    | content length in bytes (≤ [`REPLICA_BYTES_MAX`]) |
//! | 40     | 1    | closed: 0 open, 1 closed |
//! | 41     | 4    | CRC32 of the content |
//! | 45     | 4    | CRC32 of bytes 0..45 of the header |
//! | 49     | length | content |
//!
//! The file must be exactly `49 + length` bytes, and the ids in the header must match
//! the file name (a renamed file is not silently served as another replica).
//!
//! # Failure handling
//! * Disk full (`ENOSPC`, `EDQUOT`) on any step of a write → [`StoreError::Full`]; the
//!   temp file is removed and the previous replica, if any, is untouched. The backup
//!   service turns this into a refusal so the master picks another backup.
//! * Any other I/O error → [`StoreError::Io`] with the path involved.
//! * A file that fails verification → [`StoreError::Corrupt`] from a read, or an entry
//!   of [`ScanReport::quarantined`] at open; either way it is moved to `quarantine/`.
//!   A file that cannot even be read at open (`EIO`, permissions) is quarantined too:
//!   one bad sector must not keep the backup from serving every other replica.
//! * If the rename of a finished write succeeds but the directory fsync fails, the new
//!   replica is in place (and indexed) but not known durable, so the write still
//!   returns an error and the caller must not acknowledge it.
//!
//! # Concurrency
//! `SegmentStore` is a plain synchronous struct; every method blocks on the disk
//! (`fsync` takes milliseconds). The async backup service owns it behind a
//! `std::sync::Mutex` used from `spawn_blocking`, or on a dedicated flush thread fed by
//! a bounded channel — never on the reactor. Methods that may quarantine a file
//! (`read_replica`) take `&mut self`. One process owns a store directory at a time:
//! `open` takes an exclusive `flock` on `DIR/LOCK` and fails with
//! [`StoreError::InUse`] if another store holds it.
//!
//! # Cost
//! A write is one sequential write of the replica plus two fsyncs (file, directory);
//! for an 8 MiB segment on a disk doing 500 MB/s that is ≈ 17 ms of transfer plus the
//! fsync latency. `open` reads and checksums every byte of every replica (CRC32 runs at
//! ≳ 10 GB/s, so the disk's read speed bounds it): 100 GiB of replicas at 1 GB/s take
//! ≈ 100 s to verify.
//!
//! # Files
//! * `store.rs` — [`SegmentStore`]: the index of what is held, the scan at open, writes
//!   (the bytes prepared by a [`ReplicaWriter`], outside the store, then committed),
//!   reads, frees and quarantine; [`StoreError`].
//! * `format.rs` — the layout on disk and the replica file: names, the header
//!   ([`ReplicaMeta`]), verification ([`Corruption`]), and the reads of a replica's file
//!   without the store ([`ReplicaFile`]).
//! * `disk.rs` — [`Disk`], the file-system steps of the write path, and [`RealDisk`],
//!   which writes past the page cache (`O_DIRECT`).

mod disk;
mod format;
mod store;

pub use disk::{Disk, RealDisk, DIRECT_ALIGN_BYTES};
pub use format::{
    Corruption, ReplicaFile, ReplicaFiles, ReplicaMeta, HEADER_BYTES, REPLICA_BYTES_MAX,
};
pub use store::{
    check_write, PreparedReplica, QuarantinedFile, ReplicaImage, ReplicaWriter, ScanReport,
    SegmentStore, StoreError,
};
