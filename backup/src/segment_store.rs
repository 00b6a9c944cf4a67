//! `SegmentStore`: the backup's on-disk store of segment replicas (DESIGN.md §5).
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

use rampart_common::config::SEGMENT_BYTES_MAX;
use rampart_common::ids::{Epoch, SegmentId, ServerId};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Largest replica content the store accepts, in bytes: one whole segment of the largest
/// size a master may be configured with (lengths are u32 on disk).
pub const REPLICA_BYTES_MAX: u32 = 256 * 1024 * 1024;

// Every segment a master may use must fit in one replica.
const _: () = assert!(REPLICA_BYTES_MAX >= SEGMENT_BYTES_MAX);

/// Bytes of the fixed header in front of a replica's content.
pub const HEADER_BYTES: usize = 49;

/// First bytes of every replica file.
const MAGIC: [u8; 8] = *b"RMPTREPL";

/// Version of the replica file format described in the module doc.
const FORMAT_VERSION: u32 = 1;

/// Offset of the header's own CRC: it covers every header byte before it.
const HEADER_CRC_OFFSET: usize = HEADER_BYTES - 4;

/// Chunk size for checksumming replicas at open without holding a whole one in memory:
/// large enough for sequential disk reads, small enough to be negligible beside frames.
const SCAN_CHUNK_BYTES: usize = 1024 * 1024;

const REPLICAS_DIR: &str = "replicas";
const QUARANTINE_DIR: &str = "quarantine";
const LOCK_FILE: &str = "LOCK";
const REPLICA_SUFFIX: &str = ".replica";
const TEMP_SUFFIX: &str = ".tmp";

/// Facts about one stored replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaMeta {
    /// The master whose log the segment belongs to.
    pub master: ServerId,
    /// The segment of that master's log.
    pub segment: SegmentId,
    /// The replica's epoch (Tailwind): bumped by the master when it re-creates a lost
    /// replica of its open segment, so older copies can be told apart.
    pub epoch: Epoch,
    /// Content bytes.
    pub length: u32,
    /// Whether the segment was closed (its footer written) when this was stored.
    pub closed: bool,
    /// CRC32 of the content.
    pub content_crc32: u32,
}

/// What [`SegmentStore::open`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Every replica that verified, sorted by (master, segment).
    pub replicas: Vec<ReplicaMeta>,
    /// Files that failed verification (or were not replica files) and were moved aside.
    pub quarantined: Vec<QuarantinedFile>,
    /// Temp files of interrupted writes, removed.
    pub temp_files_removed: Vec<PathBuf>,
}

/// A file moved to `quarantine/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuarantinedFile {
    /// Where it was.
    pub original: PathBuf,
    /// Where it is now.
    pub moved_to: PathBuf,
    /// Why it is not a valid replica.
    pub reason: Corruption,
}

/// Why a file in the store is not a valid replica.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// The name is not `m{master}-s{segment}.replica` (nor the temp name of one).
    #[error("file name is not m{{master}}-s{{segment}}{REPLICA_SUFFIX}")]
    BadName,
    /// A directory, symlink or other non-regular file.
    #[error("not a regular file")]
    NotAFile,
    /// The file could not be read at all.
    #[error("unreadable: {error}")]
    Unreadable {
        /// The I/O error, as text.
        error: String,
    },
    /// Shorter than the fixed header.
    #[error("{file_bytes} bytes: shorter than the {HEADER_BYTES}-byte header")]
    HeaderTruncated {
        /// Size of the file.
        file_bytes: u64,
    },
    /// The magic bytes are wrong.
    #[error("bad magic")]
    BadMagic,
    /// A format version this build does not read (moved aside, not deleted, so a newer
    /// build can still use it).
    #[error("unsupported format version {version}")]
    UnsupportedVersion {
        /// Version in the header.
        version: u32,
    },
    /// The header's own CRC does not match.
    #[error("header checksum {stored:#010x} does not match {computed:#010x}")]
    HeaderChecksum {
        /// CRC in the header.
        stored: u32,
        /// CRC of the header bytes.
        computed: u32,
    },
    /// A header field has an impossible value (with an intact header CRC: a bug in
    /// whatever wrote it).
    #[error("impossible header field: {field}")]
    BadField {
        /// Which field.
        field: &'static str,
    },
    /// The header names another replica than the file name does.
    #[error("header is for {master}/{segment}, not the replica the file name says")]
    NameMismatch {
        /// Master in the header.
        master: ServerId,
        /// Segment in the header.
        segment: SegmentId,
    },
    /// The file is not header + length bytes long: truncated or with trailing bytes.
    #[error("{file_bytes} bytes where the header says {expected_bytes}")]
    WrongSize {
        /// Size of the file.
        file_bytes: u64,
        /// Header plus content length.
        expected_bytes: u64,
    },
    /// The content's CRC does not match the header.
    #[error("content checksum {computed:#010x} does not match the stored {stored:#010x}")]
    ContentChecksum {
        /// CRC in the header.
        stored: u32,
        /// CRC of the content bytes.
        computed: u32,
    },
    /// The file verifies, but is not the replica this store wrote there (changed behind
    /// the store's back since it was indexed).
    #[error("file holds epoch {epoch}, {length} bytes; the store wrote another replica")]
    Replaced {
        /// Epoch in the file.
        epoch: Epoch,
        /// Length in the file.
        length: u32,
    },
}

/// Errors of [`SegmentStore`] operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A write with an older epoch than the stored replica's.
    #[error("{master}/{segment}: epoch {epoch} is older than the stored epoch {stored_epoch}")]
    StaleEpoch {
        /// Master.
        master: ServerId,
        /// Segment.
        segment: SegmentId,
        /// Epoch of the refused write.
        epoch: Epoch,
        /// Epoch of the stored replica.
        stored_epoch: Epoch,
    },
    /// A write of the stored epoch that would shrink the replica or reopen a closed one:
    /// within an epoch a master only appends, so this is an older write arriving late.
    #[error(
        "{master}/{segment} epoch {epoch}: {length} bytes (closed: {closed}) would replace \
         the stored {stored_length} bytes (closed: {stored_closed})"
    )]
    Regressed {
        /// Master.
        master: ServerId,
        /// Segment.
        segment: SegmentId,
        /// Epoch of both.
        epoch: Epoch,
        /// Length of the refused write.
        length: u32,
        /// Whether the refused write was closed.
        closed: bool,
        /// Length of the stored replica.
        stored_length: u32,
        /// Whether the stored replica is closed.
        stored_closed: bool,
    },
    /// The replica's file failed verification; it was moved to `moved_to`.
    #[error("replica {path:?} is corrupt ({reason}); moved to {moved_to:?}")]
    Corrupt {
        /// Where the file was.
        path: PathBuf,
        /// Where it is now.
        moved_to: PathBuf,
        /// What is wrong with it.
        reason: Corruption,
    },
    /// The disk (or the quota) is full; nothing was left behind by the failed write.
    #[error("disk full writing {path:?}")]
    Full {
        /// The file being written.
        path: PathBuf,
    },
    /// Another `SegmentStore` (in this or another process) holds the directory.
    #[error("store directory {path:?} is in use by another process")]
    InUse {
        /// The lock file.
        path: PathBuf,
    },
    /// Any other I/O error.
    #[error("I/O error on {path:?}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// The file-system steps of the write path, injectable so that tests can make them
/// fail the way a full disk does (STYLE habit 10) — a full disk cannot be produced
/// portably without privileges. Reads need no such hook: tests corrupt real files.
/// An implementation reports a full disk as the OS does, with errno `ENOSPC` or `EDQUOT`
/// (`io::Error::from_raw_os_error`).
pub trait Disk: fmt::Debug + Send + Sync {
    /// Creates `path` (truncating any file there), writes `parts` in order and returns
    /// only once they are durable (fsync). May leave a partial file behind on error.
    fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()>;
    /// Renames `from` to `to`, atomically replacing any file at `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of directory `dir` (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real file system. Replicas are written with `O_DIRECT`, past the page cache:
/// buffered writes plus `fsync` run at ≈ 0.29 GB/s on the reference machine and cost
/// the CPU a copy into the page cache and its write-back, `O_DIRECT` at ≈ 1.4 GB/s
/// (issue 12). A single part that starts at a [`DIRECT_ALIGN_BYTES`] boundary (a
/// [`ReplicaImage`]) is written from where it is, but for its last partial block. Other
/// parts, and that last block, are copied into a page-aligned staging buffer (one per
/// thread, kept, so that its pages are faulted in once, not at every write) and padded to
/// [`DIRECT_ALIGN_BYTES`]; the file is cut back to its exact length before the `fsync`.
/// A file system that refuses `O_DIRECT` (tmpfs: `EINVAL`) gets the buffered write.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealDisk;

/// Alignment of an `O_DIRECT` transfer's offset, length and buffer address: the largest
/// logical block size in common use.
pub const DIRECT_ALIGN_BYTES: usize = 4096;

thread_local! {
    /// [`RealDisk`]'s staging buffer on this thread: `DIRECT_ALIGN_BYTES` more than the
    /// largest write so far, so an aligned window of that write's size fits.
    static STAGING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl RealDisk {
    fn write_direct(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let total: usize = parts.iter().map(|part| part.len()).sum();
        let padded = total.div_ceil(DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        // An aligned single part: its whole blocks go straight from it; the rest (under
        // one block) through the staging buffer.
        let (direct, rest): (&[u8], &[u8]) = match parts {
            [only] if only.as_ptr().align_offset(DIRECT_ALIGN_BYTES) == 0 => {
                only.split_at(only.len() / DIRECT_ALIGN_BYTES * DIRECT_ALIGN_BYTES)
            }
            _ => (&[], &[]),
        };
        let rest = [rest];
        let parts: &[&[u8]] = if direct.is_empty() && rest[0].is_empty() {
            parts
        } else {
            &rest
        };
        file.write_all(direct)?;
        let total = total - direct.len();
        let padded = padded - direct.len();
        STAGING.with(|staging| {
            let mut staging = staging.borrow_mut();
            if staging.len() < padded + DIRECT_ALIGN_BYTES {
                staging.resize(padded + DIRECT_ALIGN_BYTES, 0);
            }
            let start = staging.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
            let window = staging
                .get_mut(start..start + padded)
                .ok_or_else(|| io::Error::other("staging buffer cannot be aligned"))?;
            let mut at = 0;
            for part in parts {
                window[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            window[at..].fill(0);
            file.write_all(window)
        })?;
        file.set_len((direct.len() + total) as u64)?;
        file.sync_all()
    }

    fn write_buffered(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        for part in parts {
            file.write_all(part)?;
        }
        file.sync_all()
    }
}

impl Disk for RealDisk {
    fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        match RealDisk::write_direct(path, parts) {
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                RealDisk::write_buffered(path, parts)
            }
            result => result,
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// (master, segment): the key of a replica.
type ReplicaKey = (ServerId, SegmentId);

/// The backup's on-disk store of segment replicas. See the module doc.
#[derive(Debug)]
pub struct SegmentStore {
    /// `DIR/replicas`.
    replicas_dir: PathBuf,
    /// `DIR/quarantine`.
    quarantine_dir: PathBuf,
    /// The write path's file system (shared with the [`ReplicaWriter`]s).
    disk: Arc<dyn Disk>,
    /// Every replica file in `replicas_dir` that verified, by (master, segment).
    /// Invariants: 1. each entry's file exists under its canonical name and its header
    /// holds exactly this meta (unless changed behind the store's back, which reads
    /// detect). 2. no other replica file is served.
    index: BTreeMap<ReplicaKey, ReplicaMeta>,
    /// Sum of `length` over `index`. Invariant: kept equal on every insert and removal.
    bytes_stored: u64,
    /// Holds the exclusive `flock` on `DIR/LOCK` for as long as the store lives; the
    /// kernel drops it when the file closes, also when the process dies.
    _lock: File,
}

impl SegmentStore {
    /// Opens (creating if missing) the store in `dir` on the real file system, and scans
    /// it: verifies every replica, removes temp files of interrupted writes, quarantines
    /// everything else.
    pub fn open(dir: &Path) -> Result<(SegmentStore, ScanReport), StoreError> {
        SegmentStore::open_with_disk(dir, Box::new(RealDisk))
    }

    /// [`SegmentStore::open`] with the write path going through `disk`.
    pub fn open_with_disk(
        dir: &Path,
        disk: Box<dyn Disk>,
    ) -> Result<(SegmentStore, ScanReport), StoreError> {
        let replicas_dir = dir.join(REPLICAS_DIR);
        let quarantine_dir = dir.join(QUARANTINE_DIR);
        for path in [&replicas_dir, &quarantine_dir] {
            fs::create_dir_all(path).map_err(|e| io_error(path, e))?;
        }
        disk.sync_dir(dir).map_err(|e| io_error(dir, e))?;
        let lock = lock_dir(&dir.join(LOCK_FILE))?;

        let mut store = SegmentStore {
            replicas_dir,
            quarantine_dir,
            disk: Arc::from(disk),
            index: BTreeMap::new(),
            bytes_stored: 0,
            _lock: lock,
        };
        let report = store.scan()?;
        tracing::info!(
            dir = %dir.display(),
            replicas = report.replicas.len(),
            bytes = store.bytes_stored,
            quarantined = report.quarantined.len(),
            temp_files_removed = report.temp_files_removed.len(),
            "segment store opened"
        );
        Ok((store, report))
    }

    /// Fills the index from `replicas_dir`; called once, by `open`.
    fn scan(&mut self) -> Result<ScanReport, StoreError> {
        let mut report = ScanReport::default();
        let mut entries = Vec::new();
        let read_dir =
            fs::read_dir(&self.replicas_dir).map_err(|e| io_error(&self.replicas_dir, e))?;
        for entry in read_dir {
            let entry = entry.map_err(|e| io_error(&self.replicas_dir, e))?;
            let file_type = entry.file_type().map_err(|e| io_error(&entry.path(), e))?;
            entries.push((entry.file_name(), file_type.is_file()));
        }
        // Sorted, so the report and the log lines come out the same on every run.
        entries.sort();

        for (name, is_file) in entries {
            let path = self.replicas_dir.join(&name);
            let key = match parse_name(&name) {
                Some((_, NameKind::Temp)) if is_file => {
                    fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
                    tracing::info!(path = %path.display(), "removed temp file of an interrupted write");
                    report.temp_files_removed.push(path);
                    continue;
                }
                Some((key, NameKind::Replica)) if is_file => key,
                Some(_) => {
                    report
                        .quarantined
                        .push(self.quarantine(&path, Corruption::NotAFile)?);
                    continue;
                }
                None => {
                    report
                        .quarantined
                        .push(self.quarantine(&path, Corruption::BadName)?);
                    continue;
                }
            };
            match verify_file(&path, key, None) {
                Ok(meta) => self.insert(meta),
                Err(Verify::Corrupt(reason)) => {
                    report.quarantined.push(self.quarantine(&path, reason)?);
                }
                Err(Verify::Io(error)) => {
                    let reason = Corruption::Unreadable {
                        error: error.to_string(),
                    };
                    report.quarantined.push(self.quarantine(&path, reason)?);
                }
            }
        }
        if !report.quarantined.is_empty() || !report.temp_files_removed.is_empty() {
            for dir in [&self.replicas_dir, &self.quarantine_dir] {
                self.disk.sync_dir(dir).map_err(|e| io_error(dir, e))?;
            }
        }
        report.replicas = self.index.values().copied().collect();
        Ok(report)
    }

    /// Stores `bytes` as the replica of `segment` of `master` at `epoch`, replacing the
    /// stored one if any; returns its metadata once it is durable (Guarantee 1).
    ///
    /// Refused if the stored replica has a newer epoch ([`StoreError::StaleEpoch`]), or
    /// the same epoch and more bytes or a closed state this write lacks
    /// ([`StoreError::Regressed`]). Rewriting identical facts is allowed (a retry).
    ///
    /// # Panics
    /// If `bytes` is longer than [`REPLICA_BYTES_MAX`]: frames are segment-sized, so a
    /// caller passing more has a bug.
    pub fn write_replica(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        closed: bool,
        bytes: &[u8],
    ) -> Result<ReplicaMeta, StoreError> {
        // Refused before anything is written, and checked again by `commit`.
        self.check_write(
            master,
            segment,
            epoch,
            replica_length(master, segment, bytes),
            closed,
        )?;
        let prepared = self
            .writer()
            .prepare(master, segment, epoch, closed, bytes)?;
        self.commit(prepared)
    }

    /// A writer of replica files for this store, usable without it (and so without its
    /// lock): [`ReplicaWriter::prepare`] then [`SegmentStore::commit`] is
    /// [`SegmentStore::write_replica`] with the slow part — the bytes and their fsync —
    /// outside.
    pub fn writer(&self) -> ReplicaWriter {
        ReplicaWriter {
            replicas_dir: self.replicas_dir.clone(),
            disk: Arc::clone(&self.disk),
        }
    }

    /// Makes a prepared replica the stored one: the checks of
    /// [`SegmentStore::write_replica`] against what the store holds *now*, then the
    /// rename over the replica's name and the directory's fsync. Returns its metadata
    /// once it is durable (Guarantee 1). A refused or failed commit removes the prepared
    /// file and leaves the stored replica, if any, as it was — except, as for
    /// `write_replica`, a failed directory fsync, after which the new replica is in place
    /// and indexed but the error returns.
    pub fn commit(&mut self, mut prepared: PreparedReplica) -> Result<ReplicaMeta, StoreError> {
        let meta = prepared.meta;
        self.check_write(
            meta.master,
            meta.segment,
            meta.epoch,
            meta.length,
            meta.closed,
        )?;
        let path = self.replica_path(meta.master, meta.segment);
        if let Err(error) = self.disk.rename(&prepared.temp, &path) {
            return Err(io_error(&path, error));
        }
        prepared.renamed = true;
        // The file at `path` is the new replica from here on, whether or not the
        // directory sync below succeeds: index it so reads and later writes match the
        // disk. An error still returns, so the caller does not acknowledge the write.
        self.insert(meta);
        self.disk
            .sync_dir(&self.replicas_dir)
            .map_err(|e| io_error(&self.replicas_dir, e))?;
        tracing::debug!(
            master = %meta.master, segment = %meta.segment, epoch = %meta.epoch,
            length = meta.length, closed = meta.closed, "replica stored"
        );
        Ok(meta)
    }

    /// Whether a write of these facts may replace what the store holds (Guarantee 4).
    fn check_write(
        &self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        length: u32,
        closed: bool,
    ) -> Result<(), StoreError> {
        let Some(stored) = self.index.get(&(master, segment)) else {
            return Ok(());
        };
        if epoch < stored.epoch {
            return Err(StoreError::StaleEpoch {
                master,
                segment,
                epoch,
                stored_epoch: stored.epoch,
            });
        }
        if epoch == stored.epoch && (length < stored.length || (stored.closed && !closed)) {
            return Err(StoreError::Regressed {
                master,
                segment,
                epoch,
                length,
                closed,
                stored_length: stored.length,
                stored_closed: stored.closed,
            });
        }
        Ok(())
    }

    /// The content of the replica of `segment` of `master`, verified against its
    /// checksums; `None` if the store does not hold it. A replica that fails
    /// verification is quarantined, forgotten and reported as [`StoreError::Corrupt`].
    pub fn read_replica(
        &mut self,
        master: ServerId,
        segment: SegmentId,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(&indexed) = self.index.get(&(master, segment)) else {
            return Ok(None);
        };
        let path = self.replica_path(master, segment);
        let mut content = Vec::new();
        let reason = match verify_file(&path, (master, segment), Some(&mut content)) {
            Ok(meta) if meta == indexed => return Ok(Some(content)),
            Ok(meta) => Corruption::Replaced {
                epoch: meta.epoch,
                length: meta.length,
            },
            Err(Verify::Corrupt(reason)) => reason,
            // Removed behind the store's back: it is lost, so stop reporting it.
            Err(Verify::Io(error)) if error.kind() == io::ErrorKind::NotFound => {
                tracing::error!(path = %path.display(), "replica file vanished");
                self.remove(master, segment);
                return Err(io_error(&path, error));
            }
            // Unreadable now may be readable later (or by the operator): an error, not a
            // verdict on the replica.
            Err(Verify::Io(error)) => return Err(io_error(&path, error)),
        };
        let quarantined = self.quarantine(&path, reason)?;
        self.remove(master, segment);
        self.disk
            .sync_dir(&self.replicas_dir)
            .map_err(|e| io_error(&self.replicas_dir, e))?;
        Err(StoreError::Corrupt {
            path: quarantined.original,
            moved_to: quarantined.moved_to,
            reason: quarantined.reason,
        })
    }

    /// Where this store keeps its replicas, for reads that do not hold the store (see
    /// [`ReplicaFile`]).
    pub fn files(&self) -> ReplicaFiles {
        ReplicaFiles {
            replicas_dir: self.replicas_dir.clone(),
        }
    }

    /// The metadata of one replica, if held.
    pub fn meta(&self, master: ServerId, segment: SegmentId) -> Option<ReplicaMeta> {
        self.index.get(&(master, segment)).copied()
    }

    /// Every replica held, of `master` or of all masters, sorted by (master, segment).
    pub fn list(&self, master: Option<ServerId>) -> Vec<ReplicaMeta> {
        match master {
            Some(master) => self
                .index
                .range((master, SegmentId(0))..=(master, SegmentId(u64::MAX)))
                .map(|(_, meta)| *meta)
                .collect(),
            None => self.index.values().copied().collect(),
        }
    }

    /// Deletes the replica of `segment` of `master`, durably; `false` if not held.
    pub fn free(&mut self, master: ServerId, segment: SegmentId) -> Result<bool, StoreError> {
        if !self.free_one(master, segment)? {
            return Ok(false);
        }
        self.disk
            .sync_dir(&self.replicas_dir)
            .map_err(|e| io_error(&self.replicas_dir, e))?;
        Ok(true)
    }

    /// Deletes every replica of `master`, durably; returns how many there were.
    pub fn free_master(&mut self, master: ServerId) -> Result<usize, StoreError> {
        let segments: Vec<SegmentId> = self
            .list(Some(master))
            .iter()
            .map(|meta| meta.segment)
            .collect();
        for &segment in &segments {
            self.free_one(master, segment)?;
        }
        if !segments.is_empty() {
            self.disk
                .sync_dir(&self.replicas_dir)
                .map_err(|e| io_error(&self.replicas_dir, e))?;
        }
        Ok(segments.len())
    }

    /// Content bytes of every replica held (headers not counted).
    pub fn bytes_stored(&self) -> u64 {
        self.bytes_stored
    }

    /// Removes one replica's file and index entry, without the directory sync.
    fn free_one(&mut self, master: ServerId, segment: SegmentId) -> Result<bool, StoreError> {
        if !self.index.contains_key(&(master, segment)) {
            return Ok(false);
        }
        let path = self.replica_path(master, segment);
        match fs::remove_file(&path) {
            // Already gone (removed behind the store's back): freed all the same.
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(&path, error)),
        }
        self.remove(master, segment);
        tracing::debug!(%master, %segment, "replica freed");
        Ok(true)
    }

    fn insert(&mut self, meta: ReplicaMeta) {
        if let Some(old) = self.index.insert((meta.master, meta.segment), meta) {
            self.bytes_stored -= u64::from(old.length);
        }
        self.bytes_stored += u64::from(meta.length);
    }

    fn remove(&mut self, master: ServerId, segment: SegmentId) {
        if let Some(old) = self.index.remove(&(master, segment)) {
            self.bytes_stored -= u64::from(old.length);
        }
    }

    /// Moves `path` into `quarantine_dir` under its own name, or with `.N` appended when
    /// that name is taken (a file quarantined earlier is never overwritten).
    fn quarantine(&self, path: &Path, reason: Corruption) -> Result<QuarantinedFile, StoreError> {
        let name = path
            .file_name()
            .map(OsStr::to_os_string)
            .unwrap_or_default();
        let mut moved_to = self.quarantine_dir.join(&name);
        let mut n = 0u64;
        // Only this store writes to quarantine_dir (it holds the lock), so the name
        // found free stays free until the rename.
        while fs::symlink_metadata(&moved_to).is_ok() {
            n += 1;
            let mut numbered = OsString::from(&name);
            numbered.push(format!(".{n}"));
            moved_to = self.quarantine_dir.join(numbered);
        }
        fs::rename(path, &moved_to).map_err(|e| io_error(path, e))?;
        tracing::warn!(
            path = %path.display(),
            moved_to = %moved_to.display(),
            %reason,
            "quarantined a file that is not a valid replica"
        );
        Ok(QuarantinedFile {
            original: path.to_path_buf(),
            moved_to,
            reason,
        })
    }

    fn replica_path(&self, master: ServerId, segment: SegmentId) -> PathBuf {
        replica_path(&self.replicas_dir, master, segment)
    }
}

/// Best-effort removal of a failed or abandoned write's temp file. If it fails too, the
/// file is never served (not a replica name) and the next `open` removes it.
fn remove_temp(temp: &Path) {
    match fs::remove_file(temp) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %temp.display(), %error, "could not remove temp file");
        }
    }
}

/// The length of a replica of `bytes`, which must not exceed [`REPLICA_BYTES_MAX`].
///
/// # Panics
/// If it does: frames are segment-sized, so a caller passing more has a bug.
fn replica_length(master: ServerId, segment: SegmentId, bytes: &[u8]) -> u32 {
    let length = u32::try_from(bytes.len())
        .ok()
        .filter(|&length| length <= REPLICA_BYTES_MAX);
    let Some(length) = length else {
        panic!(
            "replica {master}/{segment} of {} bytes exceeds REPLICA_BYTES_MAX",
            bytes.len()
        );
    };
    length
}

/// Numbers temp files, so that two writes of one replica in flight at once (a close of
/// an old epoch's frame and of its replacement, each outside the store lock) never
/// share a temp file.
static TEMP_FILES: AtomicU64 = AtomicU64::new(0);

/// Writes replica files outside the store's lock ([`SegmentStore::writer`]): the bytes
/// and their fsync, the slow part of a write, so that a backup flushing frames does not
/// hold its store — and with it frees, fallback reads and other flushes — across disk
/// transfers. Only [`SegmentStore::commit`] makes a prepared file a replica.
#[derive(Clone, Debug)]
pub struct ReplicaWriter {
    replicas_dir: PathBuf,
    disk: Arc<dyn Disk>,
}

impl ReplicaWriter {
    /// Writes `bytes` as replica `segment` of `master` at `epoch` to a temp file of its
    /// own and makes it durable; nothing is stored until [`SegmentStore::commit`]. Blocks
    /// on the disk. A failed write leaves no temp file (best effort).
    ///
    /// # Panics
    /// If `bytes` is longer than [`REPLICA_BYTES_MAX`] (a caller bug, as for
    /// [`SegmentStore::write_replica`]).
    pub fn prepare(
        &self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        closed: bool,
        bytes: &[u8],
    ) -> Result<PreparedReplica, StoreError> {
        let meta = content_meta(master, segment, epoch, closed, bytes);
        self.write_temp(meta, &[&encode_header(&meta), bytes])
    }

    /// [`ReplicaWriter::prepare`] of the content that `image` holds
    /// ([`ReplicaImage::content_mut`]): the header is written into the image's room for
    /// it, and the whole file is written from the image, without a copy of the content
    /// ([`RealDisk`]).
    ///
    /// # Panics
    /// As [`ReplicaWriter::prepare`].
    pub fn prepare_image(
        &self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        closed: bool,
        image: &mut ReplicaImage,
    ) -> Result<PreparedReplica, StoreError> {
        let meta = content_meta(master, segment, epoch, closed, image.content());
        let file = image.file_mut();
        file[..HEADER_BYTES].copy_from_slice(&encode_header(&meta));
        self.write_temp(meta, &[file])
    }

    /// Writes `parts` (a replica file described by `meta`) durably to a temp file of its
    /// own.
    fn write_temp(
        &self,
        meta: ReplicaMeta,
        parts: &[&[u8]],
    ) -> Result<PreparedReplica, StoreError> {
        let number = TEMP_FILES.fetch_add(1, Ordering::Relaxed);
        let temp = self.replicas_dir.join(format!(
            "m{}-s{}{REPLICA_SUFFIX}.{number}{TEMP_SUFFIX}",
            meta.master.0, meta.segment.0
        ));
        if let Err(error) = self.disk.write_durable(&temp, parts) {
            remove_temp(&temp);
            return Err(io_error(&temp, error));
        }
        Ok(PreparedReplica {
            meta,
            temp,
            renamed: false,
        })
    }
}

/// The metadata of a replica with content `bytes`.
fn content_meta(
    master: ServerId,
    segment: SegmentId,
    epoch: Epoch,
    closed: bool,
    bytes: &[u8],
) -> ReplicaMeta {
    ReplicaMeta {
        master,
        segment,
        epoch,
        length: replica_length(master, segment, bytes),
        closed,
        content_crc32: crc32fast::hash(bytes),
    }
}

/// A replica file built in place, for [`ReplicaWriter::prepare_image`]: room for its
/// header, then its content, starting at a [`DIRECT_ALIGN_BYTES`] boundary so that
/// [`RealDisk`] writes it as it is. Keep one and reuse it: its memory is allocated and
/// touched once, by the first replica of its size.
#[derive(Debug, Default)]
pub struct ReplicaImage {
    /// The memory; the file starts at `start`.
    storage: Vec<u8>,
    start: usize,
    /// Bytes of content after the header room.
    content_len: usize,
}

impl ReplicaImage {
    /// An empty image (no memory until the first [`ReplicaImage::content_mut`]).
    pub const fn new() -> ReplicaImage {
        ReplicaImage {
            storage: Vec::new(),
            start: 0,
            content_len: 0,
        }
    }

    /// The content, `len` bytes, for the caller to fill: what it holds before is
    /// unspecified (the previous replica's bytes, or zeros).
    pub fn content_mut(&mut self, len: usize) -> &mut [u8] {
        let needed = HEADER_BYTES + len + DIRECT_ALIGN_BYTES;
        if self.storage.len() < needed {
            self.storage = vec![0; needed];
            self.start = self.storage.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        }
        self.content_len = len;
        let from = self.start + HEADER_BYTES;
        &mut self.storage[from..from + len]
    }

    /// The content set by the last [`ReplicaImage::content_mut`].
    fn content(&self) -> &[u8] {
        let from = self.start + HEADER_BYTES;
        &self.storage[from..from + self.content_len]
    }

    /// The whole file: header room and content.
    fn file_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + HEADER_BYTES + self.content_len]
    }
}

/// A replica written durably to a temp file by [`ReplicaWriter::prepare`], not yet
/// stored. Dropped without a successful [`SegmentStore::commit`], it removes its file.
#[derive(Debug)]
pub struct PreparedReplica {
    meta: ReplicaMeta,
    temp: PathBuf,
    /// Set once the temp file became the replica's file.
    renamed: bool,
}

impl PreparedReplica {
    /// What the replica will be once committed.
    pub fn meta(&self) -> ReplicaMeta {
        self.meta
    }
}

impl Drop for PreparedReplica {
    fn drop(&mut self) {
        if !self.renamed {
            remove_temp(&self.temp);
        }
    }
}

/// Takes an exclusive, non-blocking `flock` on `path` (created if missing).
fn lock_dir(path: &Path) -> Result<File, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    // SAFETY: `flock` takes a file descriptor and flags and touches no memory; the
    // descriptor is open for as long as `file` lives.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::WouldBlock {
            return Err(StoreError::InUse {
                path: path.to_path_buf(),
            });
        }
        return Err(io_error(path, error));
    }
    Ok(file)
}

/// Maps an I/O error to `Full` when the disk or quota is exhausted, else to `Io`.
fn io_error(path: &Path, source: io::Error) -> StoreError {
    // By errno rather than `ErrorKind::StorageFull`/`QuotaExceeded`, which need a newer
    // Rust than the workspace's rust-version; the errno values are what those kinds map.
    if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
        StoreError::Full {
            path: path.to_path_buf(),
        }
    } else {
        StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameKind {
    Replica,
    Temp,
}

/// Parses `m{master}-s{segment}.replica` (or a temp name: `m{master}-s{segment}.replica.{n}.tmp`,
/// or `m{master}-s{segment}.replica.tmp` as written before temp files were numbered).
/// Only canonical decimal is accepted, so that no two names denote one replica.
fn parse_name(name: &OsStr) -> Option<(ReplicaKey, NameKind)> {
    let name = name.to_str()?;
    let (stem, kind) = match name.strip_suffix(TEMP_SUFFIX) {
        Some(stem) => {
            let unnumbered = match stem.rsplit_once('.') {
                Some((rest, number)) if canonical_u64(number).is_some() => rest,
                _ => stem,
            };
            (unnumbered.strip_suffix(REPLICA_SUFFIX)?, NameKind::Temp)
        }
        None => (name.strip_suffix(REPLICA_SUFFIX)?, NameKind::Replica),
    };
    let (master, segment) = stem.strip_prefix('m')?.split_once("-s")?;
    Some((
        (
            ServerId(canonical_u64(master)?),
            SegmentId(canonical_u64(segment)?),
        ),
        kind,
    ))
}

fn canonical_u64(text: &str) -> Option<u64> {
    let value: u64 = text.parse().ok()?;
    (value.to_string() == text).then_some(value)
}

fn encode_header(meta: &ReplicaMeta) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[0..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&meta.master.0.to_le_bytes());
    header[20..28].copy_from_slice(&meta.segment.0.to_le_bytes());
    header[28..36].copy_from_slice(&meta.epoch.0.to_le_bytes());
    header[36..40].copy_from_slice(&meta.length.to_le_bytes());
    header[40] = u8::from(meta.closed);
    header[41..45].copy_from_slice(&meta.content_crc32.to_le_bytes());
    let crc = crc32fast::hash(&header[..HEADER_CRC_OFFSET]);
    header[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Decodes and checks a header on its own; the content is checked by the caller.
fn decode_header(header: &[u8; HEADER_BYTES]) -> Result<ReplicaMeta, Corruption> {
    let u32_at = |at: usize| {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(&header[at..at + 4]);
        u32::from_le_bytes(bytes)
    };
    let u64_at = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    if header[0..8] != MAGIC {
        return Err(Corruption::BadMagic);
    }
    let version = u32_at(8);
    if version != FORMAT_VERSION {
        return Err(Corruption::UnsupportedVersion { version });
    }
    let stored = u32_at(HEADER_CRC_OFFSET);
    let computed = crc32fast::hash(&header[..HEADER_CRC_OFFSET]);
    if stored != computed {
        return Err(Corruption::HeaderChecksum { stored, computed });
    }
    let length = u32_at(36);
    if length > REPLICA_BYTES_MAX {
        return Err(Corruption::BadField { field: "length" });
    }
    let closed = match header[40] {
        0 => false,
        1 => true,
        _ => return Err(Corruption::BadField { field: "closed" }),
    };
    Ok(ReplicaMeta {
        master: ServerId(u64_at(12)),
        segment: SegmentId(u64_at(20)),
        epoch: Epoch(u64_at(28)),
        length,
        closed,
        content_crc32: u32_at(41),
    })
}

fn replica_path(replicas_dir: &Path, master: ServerId, segment: SegmentId) -> PathBuf {
    replicas_dir.join(format!("m{}-s{}{REPLICA_SUFFIX}", master.0, segment.0))
}

/// The replicas directory of a [`SegmentStore`] ([`SegmentStore::files`]): names the
/// file of a replica whose metadata the caller learnt from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFiles {
    replicas_dir: PathBuf,
}

impl ReplicaFiles {
    /// The file that holds the replica `meta` describes, if the store still does.
    pub fn file(&self, meta: ReplicaMeta) -> ReplicaFile {
        ReplicaFile {
            path: replica_path(&self.replicas_dir, meta.master, meta.segment),
            meta,
        }
    }
}

/// A stored replica's file and the metadata it must verify to, named by
/// [`ReplicaFiles::file`] so that it can be read with no lock held: a recovery
/// reading gigabytes must not wait behind closes that hold the store across their disk
/// writes (measured: readers spent 4× longer waiting for the lock than reading).
///
/// Safe because a replica file is never changed in place: a write goes to a temporary
/// file renamed over the path, a free unlinks it. So the read sees the replica `meta`
/// describes, or a file that no longer verifies to `meta` (replaced,
/// gone), or — rarely — a corrupt one; those are `None`, and the caller asks the store
/// itself ([`SegmentStore::read_replica`], under its lock), which tells them apart and
/// quarantines a corrupt file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFile {
    path: PathBuf,
    meta: ReplicaMeta,
}

impl ReplicaFile {
    /// The replica's verified content if its file holds the replica `meta` describes;
    /// `None` otherwise (see the type's doc). Blocks on the disk. Recovery reads use
    /// `read_into`, reusing one buffer.
    #[cfg(test)]
    pub fn read(&self) -> Option<Vec<u8>> {
        let mut content = Vec::new();
        self.read_into(&mut content).then_some(content)
    }

    /// Reads the replica's verified content into `content` (its old bytes replaced, its
    /// allocation reused) if its file holds the replica `meta` describes (see the type's
    /// doc); whether it did. On `false` the content is unspecified. Blocks on the disk.
    pub fn read_into(&self, content: &mut Vec<u8>) -> bool {
        let key = (self.meta.master, self.meta.segment);
        matches!(verify_file(&self.path, key, Some(content)), Ok(meta) if meta == self.meta)
    }

    /// The replica's metadata.
    pub fn meta(&self) -> ReplicaMeta {
        self.meta
    }
}

/// Why `verify_file` failed: the file's content, or the reading of it.
#[derive(Debug)]
enum Verify {
    Corrupt(Corruption),
    Io(io::Error),
}

impl From<io::Error> for Verify {
    fn from(error: io::Error) -> Self {
        Verify::Io(error)
    }
}

/// Reads and verifies the replica file at `path`, expected to hold replica `key`:
/// header, size, ids, content CRC. With `content`, the content is left there; without,
/// it is checksummed in chunks and dropped.
fn verify_file(
    path: &Path,
    key: ReplicaKey,
    content: Option<&mut Vec<u8>>,
) -> Result<ReplicaMeta, Verify> {
    let mut file = File::open(path)?;
    let file_bytes = file.metadata()?.len();
    if file_bytes < HEADER_BYTES as u64 {
        return Err(Verify::Corrupt(Corruption::HeaderTruncated { file_bytes }));
    }
    let mut header = [0u8; HEADER_BYTES];
    file.read_exact(&mut header)?;
    let meta = decode_header(&header).map_err(Verify::Corrupt)?;
    if (meta.master, meta.segment) != key {
        return Err(Verify::Corrupt(Corruption::NameMismatch {
            master: meta.master,
            segment: meta.segment,
        }));
    }
    let expected_bytes = HEADER_BYTES as u64 + u64::from(meta.length);
    if file_bytes != expected_bytes {
        return Err(Verify::Corrupt(Corruption::WrongSize {
            file_bytes,
            expected_bytes,
        }));
    }
    let length = meta.length as usize;
    let computed = match content {
        Some(content) => {
            content.clear();
            content.resize(length, 0);
            file.read_exact(content)?;
            crc32fast::hash(content)
        }
        None => {
            let mut hasher = crc32fast::Hasher::new();
            let mut chunk = vec![0u8; SCAN_CHUNK_BYTES.min(length)];
            let mut left = length;
            while left > 0 {
                let n = chunk.len().min(left);
                file.read_exact(&mut chunk[..n])?;
                hasher.update(&chunk[..n]);
                left -= n;
            }
            hasher.finalize()
        }
    };
    if computed != meta.content_crc32 {
        return Err(Verify::Corrupt(Corruption::ContentChecksum {
            stored: meta.content_crc32,
            computed,
        }));
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::{Arc, Mutex};
    use tempfile::TempDir;

    const MIB: usize = 1024 * 1024;

    /// Deterministic, non-repeating-looking content so that a misplaced byte shows.
    fn content(seed: u64, length: usize) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..length)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    /// Reopens the store in `dir` after the previous one was dropped. Other tests of this
    /// binary spawn `mount` and `umount`: a child forked in the instant before it execs
    /// shares every open file description, the LOCK's included, so its `flock` outlives
    /// the store for that instant. `InUse` is then retried for a moment.
    fn reopen(dir: &Path) -> (SegmentStore, ScanReport) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match SegmentStore::open(dir) {
                Err(StoreError::InUse { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                result => return result.expect("open"),
            }
        }
    }

    /// Opens a store and checks that its scan found nothing wrong.
    fn open_clean(dir: &Path) -> SegmentStore {
        let (store, report) = reopen(dir);
        assert_eq!(report.quarantined, vec![]);
        assert_eq!(report.temp_files_removed, Vec::<PathBuf>::new());
        store
    }

    fn replica_file(dir: &Path, master: u64, segment: u64) -> PathBuf {
        dir.join(REPLICAS_DIR)
            .join(format!("m{master}-s{segment}.replica"))
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    /// Whether `path` names a temp file of replica `stem` (`m1-s1`, say).
    fn is_temp_of(path: &Path, stem: &str) -> bool {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        name.is_some_and(|name| {
            name.starts_with(&format!("{stem}{REPLICA_SUFFIX}.")) && name.ends_with(TEMP_SUFFIX)
        })
    }

    fn temp_files(dir: &Path) -> Vec<String> {
        names_in(&dir.join(REPLICAS_DIR))
            .into_iter()
            .filter(|name| name.ends_with(TEMP_SUFFIX))
            .collect()
    }

    fn flip_byte(path: &Path, at: usize) {
        let mut bytes = fs::read(path).expect("read");
        bytes[at] ^= 0x40;
        fs::write(path, bytes).expect("write");
    }

    fn truncate(path: &Path, length: u64) {
        let file = OpenOptions::new().write(true).open(path).expect("open");
        file.set_len(length).expect("set_len");
    }

    #[test]
    fn a_replica_file_reads_only_the_replica_its_metadata_describes() {
        let dir = TempDir::new().expect("tempdir");
        let mut store = open_clean(dir.path());
        let files = store.files();
        let (master, segment) = (ServerId(1), SegmentId(1));
        let first = content(1, 4096);
        let old = store
            .write_replica(master, segment, Epoch(1), false, &first)
            .expect("write");
        assert_eq!(files.file(old).read(), Some(first));
        // Replaced by a newer epoch: the old metadata no longer reads.
        let second = content(2, 4096);
        let new = store
            .write_replica(master, segment, Epoch(2), true, &second)
            .expect("write");
        assert_eq!(files.file(old).read(), None);
        assert_eq!(files.file(new).read(), Some(second));
        // Corrupt: not read here; the store's own read quarantines it.
        flip_byte(&files.file(new).path, 100);
        assert_eq!(files.file(new).read(), None);
        assert!(matches!(
            store.read_replica(master, segment),
            Err(StoreError::Corrupt { .. })
        ));
        // Gone.
        assert_eq!(files.file(new).read(), None);
    }

    #[test]
    fn a_replica_file_read_into_a_used_buffer_replaces_its_content() {
        let dir = TempDir::new().expect("tempdir");
        let mut store = open_clean(dir.path());
        let files = store.files();
        let long = content(1, 8192);
        let short = content(2, 100);
        let long_meta = store
            .write_replica(ServerId(1), SegmentId(1), Epoch(1), true, &long)
            .expect("write");
        let short_meta = store
            .write_replica(ServerId(1), SegmentId(2), Epoch(1), true, &short)
            .expect("write");
        let mut buffer = Vec::new();
        assert!(files.file(long_meta).read_into(&mut buffer));
        assert_eq!(buffer, long);
        assert!(files.file(short_meta).read_into(&mut buffer));
        assert_eq!(buffer, short, "the longer replica's bytes are gone");
    }

    #[test]
    fn reopen_reports_every_replica_byte_for_byte() {
        let dir = TempDir::new().expect("tempdir");
        let mut written = BTreeMap::new();
        {
            let mut store = open_clean(dir.path());
            let cases: [(u64, u64, u64, bool, usize); 7] = [
                (1, 1, 1, true, MIB),
                (1, 2, 1, true, 4096),
                (1, 3, 2, false, 100),
                (2, 1, 1, false, 0),
                (2, 7, 5, true, 1),
                (3, 1, 1, false, MIB),
                (u64::MAX, u64::MAX, u64::MAX, true, 333),
            ];
            for (master, segment, epoch, closed, length) in cases {
                let bytes = content(master ^ (segment << 8), length);
                let meta = store
                    .write_replica(
                        ServerId(master),
                        SegmentId(segment),
                        Epoch(epoch),
                        closed,
                        &bytes,
                    )
                    .expect("write");
                assert_eq!(meta.length as usize, length);
                written.insert((ServerId(master), SegmentId(segment)), (meta, bytes));
            }
            assert_eq!(store.list(None).len(), written.len());
        }

        let mut store = open_clean(dir.path());
        let expected: Vec<ReplicaMeta> = written.values().map(|(meta, _)| *meta).collect();
        assert_eq!(store.list(None), expected);
        let total: u64 = expected.iter().map(|meta| u64::from(meta.length)).sum();
        assert_eq!(store.bytes_stored(), total);
        for ((master, segment), (meta, bytes)) in &written {
            assert_eq!(store.meta(*master, *segment), Some(*meta));
            let read = store.read_replica(*master, *segment).expect("read");
            assert_eq!(
                read.as_deref(),
                Some(bytes.as_slice()),
                "{master}/{segment}"
            );
        }
        let of_master_2: Vec<SegmentId> = store
            .list(Some(ServerId(2)))
            .iter()
            .map(|meta| meta.segment)
            .collect();
        assert_eq!(of_master_2, vec![SegmentId(1), SegmentId(7)]);
        assert_eq!(store.list(Some(ServerId(9))), vec![]);
        assert_eq!(
            store.read_replica(ServerId(9), SegmentId(1)).expect("read"),
            None
        );
    }

    #[test]
    fn open_reports_the_replicas_it_found_in_the_scan_report() {
        let dir = TempDir::new().expect("tempdir");
        let meta = {
            let mut store = open_clean(dir.path());
            store
                .write_replica(ServerId(4), SegmentId(2), Epoch(3), true, b"closed segment")
                .expect("write")
        };
        let (store, report) = reopen(dir.path());
        assert_eq!(report.replicas, vec![meta]);
        assert_eq!(store.list(None), report.replicas);
    }

    #[test]
    fn rewrite_with_a_higher_epoch_replaces_the_replica() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(1), SegmentId(1));
        {
            let mut store = open_clean(dir.path());
            store
                .write_replica(m, s, Epoch(1), true, &content(1, 100))
                .expect("write");
            // A new epoch may hold fewer bytes: the re-created replica starts over.
            store
                .write_replica(m, s, Epoch(2), false, &content(2, 50))
                .expect("write");
            assert_eq!(store.meta(m, s).map(|meta| meta.epoch), Some(Epoch(2)));
            assert_eq!(store.bytes_stored(), 50);
        }
        let mut store = open_clean(dir.path());
        let meta = store.meta(m, s).expect("held");
        assert_eq!(
            (meta.epoch, meta.length, meta.closed),
            (Epoch(2), 50, false)
        );
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(content(2, 50))
        );
        assert_eq!(
            names_in(&dir.path().join(REPLICAS_DIR)),
            vec!["m1-s1.replica"]
        );
    }

    #[test]
    fn rewrite_with_a_lower_epoch_is_refused_and_keeps_the_stored_replica() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(1), SegmentId(1));
        let mut store = open_clean(dir.path());
        let stored = store
            .write_replica(m, s, Epoch(5), false, &content(5, 100))
            .expect("write");
        let error = store
            .write_replica(m, s, Epoch(4), true, &content(4, 200))
            .expect_err("stale epoch");
        assert!(
            matches!(
                error,
                StoreError::StaleEpoch {
                    epoch: Epoch(4),
                    stored_epoch: Epoch(5),
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(store.meta(m, s), Some(stored));
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(content(5, 100))
        );
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn rewrite_with_the_same_epoch_and_more_bytes_replaces_an_open_replica() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(1), SegmentId(1));
        let full = content(7, 300);
        {
            let mut store = open_clean(dir.path());
            store
                .write_replica(m, s, Epoch(3), false, &full[..100])
                .expect("first flush");
            store
                .write_replica(m, s, Epoch(3), false, &full[..200])
                .expect("flushed again");
            // Retrying the same flush is harmless.
            store
                .write_replica(m, s, Epoch(3), false, &full[..200])
                .expect("retry");
            store
                .write_replica(m, s, Epoch(3), true, &full)
                .expect("closed");
            assert_eq!(store.bytes_stored(), 300);

            let shorter = store
                .write_replica(m, s, Epoch(3), true, &full[..250])
                .expect_err("shrinks");
            assert!(
                matches!(
                    shorter,
                    StoreError::Regressed {
                        length: 250,
                        stored_length: 300,
                        ..
                    }
                ),
                "{shorter}"
            );
            let reopened = store
                .write_replica(m, s, Epoch(3), false, &full)
                .expect_err("reopens a closed replica");
            assert!(
                matches!(
                    reopened,
                    StoreError::Regressed {
                        closed: false,
                        stored_closed: true,
                        ..
                    }
                ),
                "{reopened}"
            );
        }
        let mut store = open_clean(dir.path());
        let meta = store.meta(m, s).expect("held");
        assert_eq!(
            (meta.epoch, meta.length, meta.closed),
            (Epoch(3), 300, true)
        );
        assert_eq!(store.read_replica(m, s).expect("read"), Some(full));
    }

    #[test]
    fn reopen_quarantines_corrupt_partial_and_foreign_files() {
        let dir = TempDir::new().expect("tempdir");
        let replicas = dir.path().join(REPLICAS_DIR);
        let good = {
            let mut store = open_clean(dir.path());
            for segment in 1..=7 {
                store
                    .write_replica(
                        ServerId(1),
                        SegmentId(segment),
                        Epoch(1),
                        true,
                        &content(segment, 1000),
                    )
                    .expect("write");
            }
            store.meta(ServerId(1), SegmentId(1)).expect("held")
        };
        flip_byte(&replica_file(dir.path(), 1, 2), HEADER_BYTES + 500);
        flip_byte(&replica_file(dir.path(), 1, 3), 30); // the epoch, inside the header
        truncate(&replica_file(dir.path(), 1, 4), HEADER_BYTES as u64 + 999);
        truncate(&replica_file(dir.path(), 1, 5), 10);
        let mut longer = fs::read(replica_file(dir.path(), 1, 6)).expect("read");
        longer.extend_from_slice(b"tail");
        fs::write(replica_file(dir.path(), 1, 6), longer).expect("write");
        // A valid replica under another replica's name.
        fs::copy(
            replica_file(dir.path(), 1, 1),
            replica_file(dir.path(), 1, 7),
        )
        .expect("copy");
        fs::write(replicas.join("notes.txt"), b"operator notes").expect("write");
        fs::write(replicas.join("m01-s1.replica"), b"x").expect("write");
        fs::write(replicas.join("m1-s1.replica.bak"), b"x").expect("write");
        fs::write(replicas.join("junk.tmp"), b"x").expect("write");
        fs::create_dir(replicas.join("m1-s9.replica")).expect("mkdir");

        let (mut store, report) = reopen(dir.path());
        assert_eq!(report.replicas, vec![good]);
        assert_eq!(store.list(None), vec![good]);
        assert_eq!(store.bytes_stored(), 1000);
        let reasons: BTreeMap<String, Corruption> = report
            .quarantined
            .iter()
            .map(|q| {
                let name = q.original.file_name().expect("name").to_string_lossy();
                (name.into_owned(), q.reason.clone())
            })
            .collect();
        let reason = |name: &str| {
            reasons
                .get(name)
                .unwrap_or_else(|| panic!("{name} not reported"))
        };
        assert!(matches!(
            reason("m1-s2.replica"),
            Corruption::ContentChecksum { .. }
        ));
        assert!(matches!(
            reason("m1-s3.replica"),
            Corruption::HeaderChecksum { .. }
        ));
        assert_eq!(
            reason("m1-s4.replica"),
            &Corruption::WrongSize {
                file_bytes: HEADER_BYTES as u64 + 999,
                expected_bytes: HEADER_BYTES as u64 + 1000
            }
        );
        assert_eq!(
            reason("m1-s5.replica"),
            &Corruption::HeaderTruncated { file_bytes: 10 }
        );
        assert!(matches!(
            reason("m1-s6.replica"),
            Corruption::WrongSize { .. }
        ));
        assert_eq!(
            reason("m1-s7.replica"),
            &Corruption::NameMismatch {
                master: ServerId(1),
                segment: SegmentId(1)
            }
        );
        for name in [
            "notes.txt",
            "m01-s1.replica",
            "m1-s1.replica.bak",
            "junk.tmp",
        ] {
            assert_eq!(reason(name), &Corruption::BadName, "{name}");
        }
        assert_eq!(reason("m1-s9.replica"), &Corruption::NotAFile);
        assert_eq!(report.quarantined.len(), 11);

        // Moved aside, never deleted, and never served.
        for q in &report.quarantined {
            assert!(!q.original.exists(), "{:?} still in place", q.original);
            assert!(q.moved_to.starts_with(dir.path().join(QUARANTINE_DIR)));
            assert!(
                fs::symlink_metadata(&q.moved_to).is_ok(),
                "{:?} missing",
                q.moved_to
            );
        }
        assert_eq!(names_in(&replicas), vec!["m1-s1.replica"]);
        assert_eq!(
            store.read_replica(ServerId(1), SegmentId(2)).expect("read"),
            None
        );
        assert_eq!(
            store.read_replica(ServerId(1), SegmentId(1)).expect("read"),
            Some(content(1, 1000))
        );
        drop(store);

        // A second restart finds a clean store and leaves the quarantine alone.
        let store = open_clean(dir.path());
        assert_eq!(store.list(None), vec![good]);
        assert_eq!(names_in(&dir.path().join(QUARANTINE_DIR)).len(), 11);
    }

    #[test]
    fn read_replica_quarantines_a_file_corrupted_after_open() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(2), SegmentId(9));
        let mut store = open_clean(dir.path());
        store
            .write_replica(m, s, Epoch(1), true, &content(9, 4096))
            .expect("write");
        store
            .write_replica(m, SegmentId(10), Epoch(1), true, b"neighbour")
            .expect("write");
        flip_byte(&replica_file(dir.path(), 2, 9), HEADER_BYTES + 4000);

        let error = store.read_replica(m, s).expect_err("corrupt");
        let StoreError::Corrupt {
            path,
            moved_to,
            reason,
        } = error
        else {
            panic!("expected Corrupt, got {error}");
        };
        assert!(
            matches!(reason, Corruption::ContentChecksum { .. }),
            "{reason}"
        );
        assert_eq!(path, replica_file(dir.path(), 2, 9));
        assert!(!path.exists());
        assert!(moved_to.exists());
        assert_eq!(store.meta(m, s), None);
        assert_eq!(store.bytes_stored(), 9);
        assert_eq!(store.read_replica(m, s).expect("read"), None);
        assert_eq!(
            store.read_replica(m, SegmentId(10)).expect("read"),
            Some(b"neighbour".to_vec())
        );
        // The store accepts a fresh replica in its place.
        store
            .write_replica(m, s, Epoch(2), true, b"again")
            .expect("write");
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(b"again".to_vec())
        );
    }

    #[test]
    fn read_replica_refuses_a_valid_file_swapped_in_behind_the_stores_back() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(1), SegmentId(1));
        let mut store = open_clean(dir.path());
        store
            .write_replica(m, s, Epoch(1), true, b"old epoch")
            .expect("write");
        let old_file = fs::read(replica_file(dir.path(), 1, 1)).expect("read");
        store
            .write_replica(m, s, Epoch(2), true, b"new epoch")
            .expect("write");
        fs::write(replica_file(dir.path(), 1, 1), old_file).expect("write");

        let error = store.read_replica(m, s).expect_err("replaced");
        assert!(
            matches!(
                error,
                StoreError::Corrupt {
                    reason: Corruption::Replaced {
                        epoch: Epoch(1),
                        length: 9
                    },
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn read_replica_of_a_vanished_file_is_an_io_error_and_forgets_it() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(1), SegmentId(1));
        let mut store = open_clean(dir.path());
        store
            .write_replica(m, s, Epoch(1), true, b"bytes")
            .expect("write");
        fs::remove_file(replica_file(dir.path(), 1, 1)).expect("remove");
        let error = store.read_replica(m, s).expect_err("gone");
        assert!(
            matches!(&error, StoreError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound),
            "{error}"
        );
        assert_eq!(store.list(None), vec![]);
        assert_eq!(store.bytes_stored(), 0);
    }

    #[test]
    fn quarantine_never_overwrites_an_earlier_quarantined_file() {
        let dir = TempDir::new().expect("tempdir");
        for round in 0..2 {
            {
                let mut store = open_clean(dir.path());
                store
                    .write_replica(ServerId(1), SegmentId(1), Epoch(round), true, b"bytes")
                    .expect("write");
            }
            flip_byte(&replica_file(dir.path(), 1, 1), HEADER_BYTES);
            let (_, report) = reopen(dir.path());
            assert_eq!(report.quarantined.len(), 1);
        }
        assert_eq!(
            names_in(&dir.path().join(QUARANTINE_DIR)),
            vec!["m1-s1.replica", "m1-s1.replica.1"]
        );
    }

    #[test]
    fn open_removes_a_leftover_temp_file_and_the_old_replica_is_intact() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(3), SegmentId(4));
        let old = {
            let mut store = open_clean(dir.path());
            store
                .write_replica(m, s, Epoch(1), false, &content(1, 5000))
                .expect("write")
        };
        // A crash in the middle of writing epoch 2: half its bytes in the temp file.
        let newer = ReplicaMeta {
            master: m,
            segment: s,
            epoch: Epoch(2),
            length: 8000,
            closed: true,
            content_crc32: crc32fast::hash(&content(2, 8000)),
        };
        let mut partial = encode_header(&newer).to_vec();
        partial.extend_from_slice(&content(2, 8000)[..3000]);
        let temp = dir.path().join(REPLICAS_DIR).join("m3-s4.replica.tmp");
        fs::write(&temp, partial).expect("write");
        // And a crash during the very first write of another replica.
        let lone_temp = dir.path().join(REPLICAS_DIR).join("m3-s5.replica.tmp");
        fs::write(&lone_temp, b"torn").expect("write");

        let (mut store, report) = reopen(dir.path());
        assert_eq!(
            report.temp_files_removed,
            vec![temp.clone(), lone_temp.clone()]
        );
        assert_eq!(report.quarantined, vec![]);
        assert!(!temp.exists() && !lone_temp.exists());
        assert_eq!(report.replicas, vec![old]);
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(content(1, 5000))
        );
    }

    #[test]
    fn free_deletes_one_replica_and_reports_an_absent_one() {
        let dir = TempDir::new().expect("tempdir");
        {
            let mut store = open_clean(dir.path());
            store
                .write_replica(ServerId(1), SegmentId(1), Epoch(1), true, &[1; 10])
                .expect("write");
            store
                .write_replica(ServerId(1), SegmentId(2), Epoch(1), true, &[2; 20])
                .expect("write");
            assert_eq!(store.bytes_stored(), 30);
            assert!(store.free(ServerId(1), SegmentId(1)).expect("free"));
            assert!(!store.free(ServerId(1), SegmentId(1)).expect("free again"));
            assert!(!store.free(ServerId(7), SegmentId(1)).expect("never held"));
            assert_eq!(store.bytes_stored(), 20);
            assert_eq!(
                store.read_replica(ServerId(1), SegmentId(1)).expect("read"),
                None
            );
        }
        let store = open_clean(dir.path());
        let held: Vec<SegmentId> = store.list(None).iter().map(|meta| meta.segment).collect();
        assert_eq!(held, vec![SegmentId(2)]);
        assert_eq!(store.bytes_stored(), 20);
    }

    #[test]
    fn free_master_deletes_only_that_masters_replicas() {
        let dir = TempDir::new().expect("tempdir");
        {
            let mut store = open_clean(dir.path());
            for master in 1..=3 {
                for segment in 1..=4 {
                    store
                        .write_replica(
                            ServerId(master),
                            SegmentId(segment),
                            Epoch(1),
                            true,
                            &[0; 100],
                        )
                        .expect("write");
                }
            }
            assert_eq!(store.bytes_stored(), 1200);
            assert_eq!(store.free_master(ServerId(2)).expect("free"), 4);
            assert_eq!(store.free_master(ServerId(2)).expect("free again"), 0);
            assert_eq!(store.bytes_stored(), 800);
        }
        let store = open_clean(dir.path());
        assert_eq!(store.list(Some(ServerId(2))), vec![]);
        assert_eq!(store.list(Some(ServerId(1))).len(), 4);
        assert_eq!(store.list(Some(ServerId(3))).len(), 4);
        assert_eq!(store.bytes_stored(), 800);
    }

    #[test]
    fn a_second_store_on_the_same_directory_is_refused_while_the_first_lives() {
        let dir = TempDir::new().expect("tempdir");
        let first = open_clean(dir.path());
        let error = SegmentStore::open(dir.path()).expect_err("locked");
        assert!(matches!(error, StoreError::InUse { .. }), "{error}");
        drop(first);
        open_clean(dir.path());
    }

    #[test]
    #[should_panic(expected = "exceeds REPLICA_BYTES_MAX")]
    fn write_replica_longer_than_the_limit_is_a_caller_bug() {
        let dir = TempDir::new().expect("tempdir");
        let mut store = open_clean(dir.path());
        let too_long = vec![0u8; REPLICA_BYTES_MAX as usize + 1];
        let _ = store.write_replica(ServerId(1), SegmentId(1), Epoch(1), true, &too_long);
    }

    /// Where [`FaultyDisk`] fails, with which errno.
    #[derive(Clone, Copy, Debug)]
    enum Fault {
        /// Writes this many bytes of the file for real, then fails.
        WriteAfter {
            bytes: usize,
            errno: i32,
        },
        Rename {
            errno: i32,
        },
        SyncDir {
            errno: i32,
        },
    }

    /// The real disk, with one fault the test can switch on and off.
    #[derive(Clone, Debug, Default)]
    struct FaultyDisk {
        fault: Arc<Mutex<Option<Fault>>>,
    }

    impl FaultyDisk {
        fn set(&self, fault: Option<Fault>) {
            *self.fault.lock().expect("lock") = fault;
        }

        fn fault(&self) -> Option<Fault> {
            *self.fault.lock().expect("lock")
        }
    }

    impl Disk for FaultyDisk {
        fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
            let Some(Fault::WriteAfter { bytes, errno }) = self.fault() else {
                return RealDisk.write_durable(path, parts);
            };
            let all = parts.concat();
            RealDisk.write_durable(path, &[&all[..bytes.min(all.len())]])?;
            Err(io::Error::from_raw_os_error(errno))
        }

        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            match self.fault() {
                Some(Fault::Rename { errno }) => Err(io::Error::from_raw_os_error(errno)),
                _ => RealDisk.rename(from, to),
            }
        }

        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            match self.fault() {
                Some(Fault::SyncDir { errno }) => Err(io::Error::from_raw_os_error(errno)),
                _ => RealDisk.sync_dir(dir),
            }
        }
    }

    fn open_faulty(dir: &Path) -> (SegmentStore, FaultyDisk) {
        let disk = FaultyDisk::default();
        let (store, report) =
            SegmentStore::open_with_disk(dir, Box::new(disk.clone())).expect("open");
        assert_eq!(report.quarantined, vec![]);
        (store, disk)
    }

    #[test]
    fn write_on_a_full_disk_returns_full_leaves_no_temp_file_and_the_store_still_works() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(1), SegmentId(1));
        let (mut store, disk) = open_faulty(dir.path());
        let old = store
            .write_replica(m, s, Epoch(1), false, &content(1, 4000))
            .expect("write");

        disk.set(Some(Fault::WriteAfter {
            bytes: 2000,
            errno: libc::ENOSPC,
        }));
        let error = store
            .write_replica(m, s, Epoch(1), true, &content(1, 8000))
            .expect_err("full");
        assert!(
            matches!(&error, StoreError::Full { path } if is_temp_of(path, "m1-s1")),
            "{error}"
        );
        let error = store
            .write_replica(m, SegmentId(2), Epoch(1), true, &content(2, 8000))
            .expect_err("full");
        assert!(matches!(error, StoreError::Full { .. }), "{error}");
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());
        assert_eq!(store.list(None), vec![old]);
        assert_eq!(store.bytes_stored(), 4000);
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(content(1, 4000))
        );

        // Space comes back: the same writes succeed.
        disk.set(None);
        store
            .write_replica(m, s, Epoch(1), true, &content(1, 8000))
            .expect("write");
        store
            .write_replica(m, SegmentId(2), Epoch(1), true, &content(2, 8000))
            .expect("write");
        drop(store);
        let mut store = open_clean(dir.path());
        assert_eq!(store.bytes_stored(), 16000);
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(content(1, 8000))
        );
    }

    #[test]
    fn quota_exceeded_and_full_at_rename_are_reported_as_full() {
        let dir = TempDir::new().expect("tempdir");
        let (mut store, disk) = open_faulty(dir.path());
        for fault in [
            Fault::WriteAfter {
                bytes: 0,
                errno: libc::EDQUOT,
            },
            Fault::Rename {
                errno: libc::ENOSPC,
            },
        ] {
            disk.set(Some(fault));
            let error = store
                .write_replica(ServerId(1), SegmentId(1), Epoch(1), true, b"bytes")
                .expect_err("full");
            assert!(
                matches!(error, StoreError::Full { .. }),
                "{fault:?}: {error}"
            );
            assert_eq!(temp_files(dir.path()), Vec::<String>::new(), "{fault:?}");
            assert_eq!(store.list(None), vec![], "{fault:?}");
        }
    }

    #[test]
    fn a_prepared_replica_is_stored_only_by_commit_and_a_dropped_one_leaves_nothing() {
        let dir = TempDir::new().expect("tempdir");
        let mut store = open_clean(dir.path());
        let (m, s) = (ServerId(1), SegmentId(1));
        let writer = store.writer();
        let prepared = writer
            .prepare(m, s, Epoch(1), true, &content(1, 3000))
            .expect("prepare");
        assert_eq!(store.list(None), vec![], "not stored before its commit");
        assert_eq!(temp_files(dir.path()).len(), 1);
        let meta = store.commit(prepared).expect("commit");
        assert_eq!(store.list(None), vec![meta]);
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());

        let abandoned = writer
            .prepare(m, SegmentId(2), Epoch(1), true, &content(2, 3000))
            .expect("prepare");
        drop(abandoned);
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());
        assert_eq!(store.list(None), vec![meta]);
        drop(store);
        let store = open_clean(dir.path());
        assert_eq!(store.list(None), vec![meta]);
    }

    #[test]
    fn a_replica_built_in_an_image_is_the_file_prepare_writes() {
        let dir = TempDir::new().expect("tempdir");
        let mut store = open_clean(dir.path());
        let writer = store.writer();
        let mut image = ReplicaImage::new();
        let block = DIRECT_ALIGN_BYTES;
        // Around the block boundaries of the file (header included), and a whole segment
        // after smaller ones (the image grows), then a small one again (it is reused).
        let sizes = [
            0,
            1,
            block - HEADER_BYTES - 1,
            block - HEADER_BYTES,
            block - HEADER_BYTES + 1,
            3 * block + 5,
            8 << 20,
            100,
        ];
        for (i, length) in sizes.into_iter().enumerate() {
            let (m, s) = (ServerId(1), SegmentId(i as u64 + 1));
            let bytes = content(i as u64, length);
            let copied = writer
                .prepare(m, s, Epoch(3), true, &bytes)
                .expect("prepare");
            image.content_mut(length).copy_from_slice(&bytes);
            let built = writer
                .prepare_image(m, s, Epoch(3), true, &mut image)
                .expect("prepare_image");
            let file = |p: &PreparedReplica| fs::read(&p.temp).expect("read temp file");
            assert_eq!(file(&built).len(), HEADER_BYTES + length);
            assert!(
                file(&built) == file(&copied),
                "{length} bytes: files differ"
            );
            assert_eq!(built.meta(), copied.meta());
            drop(copied);
            store.commit(built).expect("commit");
            let read = store.read_replica(m, s).expect("read").expect("stored");
            assert!(read == bytes, "{length} bytes: read back differs");
        }
    }

    #[test]
    fn commit_checks_against_what_the_store_holds_when_it_commits() {
        let dir = TempDir::new().expect("tempdir");
        let mut store = open_clean(dir.path());
        let (m, s) = (ServerId(1), SegmentId(1));
        let writer = store.writer();
        // Two writes of one replica prepared side by side: each has a file of its own.
        let older = writer
            .prepare(m, s, Epoch(1), true, &content(1, 3000))
            .expect("prepare");
        let newer = writer
            .prepare(m, s, Epoch(2), false, &content(1, 2000))
            .expect("prepare");
        assert_eq!(temp_files(dir.path()).len(), 2);
        let stored = store.commit(newer).expect("commit");
        let error = store.commit(older).expect_err("stale by now");
        assert!(matches!(error, StoreError::StaleEpoch { .. }), "{error}");
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());
        assert_eq!(store.list(None), vec![stored]);
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(content(1, 2000))
        );
    }

    #[test]
    fn temp_files_of_both_name_forms_are_removed_at_open() {
        let dir = TempDir::new().expect("tempdir");
        drop(open_clean(dir.path()));
        let replicas = dir.path().join(REPLICAS_DIR);
        for name in ["m1-s1.replica.tmp", "m1-s1.replica.17.tmp"] {
            fs::write(replicas.join(name), b"partial").expect("write");
        }
        let (store, report) = SegmentStore::open(dir.path()).expect("open");
        assert_eq!(report.temp_files_removed.len(), 2, "{report:?}");
        assert_eq!(report.quarantined, vec![]);
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());
        assert_eq!(store.list(None), vec![]);
        // A number that is not canonical decimal is no temp name of ours.
        assert_eq!(parse_name(OsStr::new("m1-s1.replica.017.tmp")), None);
    }

    #[test]
    fn other_write_errors_are_io_errors_naming_the_file() {
        let dir = TempDir::new().expect("tempdir");
        let (mut store, disk) = open_faulty(dir.path());
        disk.set(Some(Fault::WriteAfter {
            bytes: 10,
            errno: libc::EIO,
        }));
        let error = store
            .write_replica(ServerId(1), SegmentId(1), Epoch(1), true, b"some bytes")
            .expect_err("io");
        let StoreError::Io { path, source } = &error else {
            panic!("expected Io, got {error}");
        };
        assert!(is_temp_of(path, "m1-s1"), "{path:?}");
        assert_eq!(source.raw_os_error(), Some(libc::EIO));
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn a_failed_directory_sync_is_an_error_but_the_renamed_replica_is_what_reads_see() {
        let dir = TempDir::new().expect("tempdir");
        let (m, s) = (ServerId(1), SegmentId(1));
        let (mut store, disk) = open_faulty(dir.path());
        store
            .write_replica(m, s, Epoch(1), false, b"epoch one")
            .expect("write");
        disk.set(Some(Fault::SyncDir { errno: libc::EIO }));
        let error = store
            .write_replica(m, s, Epoch(2), true, b"epoch two")
            .expect_err("not durable");
        assert!(matches!(error, StoreError::Io { .. }), "{error}");
        disk.set(None);
        assert_eq!(store.meta(m, s).map(|meta| meta.epoch), Some(Epoch(2)));
        assert_eq!(
            store.read_replica(m, s).expect("read"),
            Some(b"epoch two".to_vec())
        );
    }

    /// Unmounts the tmpfs on drop, so a failing assertion does not leave it mounted.
    struct Mount(PathBuf);

    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    #[test]
    fn disk_full_on_a_real_tmpfs_returns_full_and_leaves_no_temp_file() {
        let dir = TempDir::new().expect("tempdir");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                eprintln!(
                    "skipped: cannot mount a 1 MiB tmpfs (needs root): {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                return;
            }
            Err(error) => {
                eprintln!("skipped: cannot run mount: {error}");
                return;
            }
        }
        let _mount = Mount(dir.path().to_path_buf());

        let (m, kib) = (ServerId(1), 1024);
        let mut store = open_clean(dir.path());
        let first = store
            .write_replica(m, SegmentId(1), Epoch(1), true, &content(1, 600 * kib))
            .expect("fits");
        let error = store
            .write_replica(m, SegmentId(2), Epoch(1), true, &content(2, 600 * kib))
            .expect_err("does not fit");
        assert!(matches!(error, StoreError::Full { .. }), "{error}");
        assert_eq!(temp_files(dir.path()), Vec::<String>::new());
        assert_eq!(store.list(None), vec![first]);
        assert_eq!(
            store.read_replica(m, SegmentId(1)).expect("read"),
            Some(content(1, 600 * kib))
        );

        assert!(store.free(m, SegmentId(1)).expect("free"));
        store
            .write_replica(m, SegmentId(2), Epoch(1), true, &content(2, 600 * kib))
            .expect("fits after free");
        drop(store);
        let mut store = open_clean(dir.path());
        assert_eq!(
            store.read_replica(m, SegmentId(2)).expect("read"),
            Some(content(2, 600 * kib))
        );
    }

    #[test]
    fn header_layout_is_pinned() {
        let meta = ReplicaMeta {
            master: ServerId(0x0102_0304_0506_0708),
            segment: SegmentId(9),
            epoch: Epoch(10),
            length: 0x0B0C,
            closed: true,
            content_crc32: 0xDEAD_BEEF,
        };
        let header = encode_header(&meta);
        assert_eq!(&header[0..8], b"RMPTREPL");
        assert_eq!(header[8..12], [1, 0, 0, 0]);
        assert_eq!(header[12..20], [8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(header[20..28], [9, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(header[28..36], [10, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(header[36..40], [0x0C, 0x0B, 0, 0]);
        assert_eq!(header[40], 1);
        assert_eq!(header[41..45], [0xEF, 0xBE, 0xAD, 0xDE]);
        assert_eq!(header[45..49], crc32fast::hash(&header[..45]).to_le_bytes());
        assert_eq!(decode_header(&header), Ok(meta));
    }

    #[test]
    fn decode_header_rejects_impossible_fields_under_a_valid_checksum() {
        let meta = ReplicaMeta {
            master: ServerId(1),
            segment: SegmentId(1),
            epoch: Epoch(1),
            length: 1,
            closed: false,
            content_crc32: 0,
        };
        let reseal = |mut header: [u8; HEADER_BYTES]| {
            let crc = crc32fast::hash(&header[..HEADER_CRC_OFFSET]);
            header[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
            header
        };
        let mut header = encode_header(&meta);
        header[40] = 2;
        assert_eq!(
            decode_header(&reseal(header)),
            Err(Corruption::BadField { field: "closed" })
        );
        let mut header = encode_header(&meta);
        header[36..40].copy_from_slice(&(REPLICA_BYTES_MAX + 1).to_le_bytes());
        assert_eq!(
            decode_header(&reseal(header)),
            Err(Corruption::BadField { field: "length" })
        );
        let mut header = encode_header(&meta);
        header[8] = 2;
        assert_eq!(
            decode_header(&header),
            Err(Corruption::UnsupportedVersion { version: 2 })
        );
        let mut header = encode_header(&meta);
        header[0] = b'X';
        assert_eq!(decode_header(&header), Err(Corruption::BadMagic));
    }

    #[test]
    fn parse_name_accepts_only_canonical_replica_names() {
        let key = (ServerId(12), SegmentId(0));
        assert_eq!(
            parse_name(OsStr::new("m12-s0.replica")),
            Some((key, NameKind::Replica))
        );
        assert_eq!(
            parse_name(OsStr::new("m12-s0.replica.tmp")),
            Some((key, NameKind::Temp))
        );
        for bad in [
            "m012-s0.replica",
            "m12-s00.replica",
            "m+12-s0.replica",
            "m12-s0.replica.bak",
            "m12-s0",
            "m12-s.replica",
            "12-s0.replica",
            "m12_s0.replica",
            "m18446744073709551616-s0.replica",
            "m12-s0.tmp",
            "",
        ] {
            assert_eq!(parse_name(OsStr::new(bad)), None, "{bad}");
        }
    }

    /// How a property test damages a valid replica file.
    #[derive(Clone, Debug)]
    enum Damage {
        /// XOR a nonzero mask into one byte.
        Flip { at: prop::sample::Index, mask: u8 },
        /// Cut the file to a shorter length.
        Truncate { at: prop::sample::Index },
        /// Append bytes.
        Append { bytes: Vec<u8> },
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            (any::<prop::sample::Index>(), 1..=u8::MAX)
                .prop_map(|(at, mask)| Damage::Flip { at, mask }),
            any::<prop::sample::Index>().prop_map(|at| Damage::Truncate { at }),
            prop::collection::vec(any::<u8>(), 1..16).prop_map(|bytes| Damage::Append { bytes }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any one damaged byte, truncation or trailing garbage is caught: CRC32 detects
        /// every burst of up to 32 bits, and sizes are checked exactly.
        #[test]
        fn verify_file_catches_any_single_byte_change_truncation_or_extension(
            bytes in prop::collection::vec(any::<u8>(), 0..2048),
            epoch in any::<u64>(),
            closed in any::<bool>(),
            damage in damage(),
        ) {
            let dir = TempDir::new().expect("tempdir");
            let path = dir.path().join("m5-s6.replica");
            let meta = ReplicaMeta {
                master: ServerId(5),
                segment: SegmentId(6),
                epoch: Epoch(epoch),
                length: u32::try_from(bytes.len()).expect("small"),
                closed,
                content_crc32: crc32fast::hash(&bytes),
            };
            let mut image = encode_header(&meta).to_vec();
            image.extend_from_slice(&bytes);
            fs::write(&path, &image).expect("write");
            let key = (ServerId(5), SegmentId(6));
            prop_assert_eq!(verify_file(&path, key, None).expect("intact"), meta);

            match damage {
                Damage::Flip { at, mask } => {
                    let at = at.index(image.len());
                    image[at] ^= mask;
                }
                Damage::Truncate { at } => image.truncate(at.index(image.len())),
                Damage::Append { bytes } => image.extend_from_slice(&bytes),
            }
            fs::write(&path, &image).expect("write");
            prop_assert!(matches!(verify_file(&path, key, None), Err(Verify::Corrupt(_))));
            let mut content = Vec::new();
            prop_assert!(matches!(
                verify_file(&path, key, Some(&mut content)),
                Err(Verify::Corrupt(_))
            ));
        }
    }
}
