//! [`SegmentStore`]: the store itself (see the `segment_store` module doc) — the index
//! of the replicas it holds, the scan that fills it at open, writes (prepared outside
//! the store by a [`ReplicaWriter`], then committed), reads, frees and quarantine — and
//! its errors ([`StoreError`]).

use rampart_common::ids::{Epoch, SegmentId, ServerId};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::disk::{Disk, RealDisk, DIRECT_ALIGN_BYTES};
use super::format::{
    encode_header, parse_name, replica_path, verify_file, Corruption, NameKind, ReplicaFiles,
    ReplicaKey, ReplicaMeta, Verify, HEADER_BYTES, LOCK_FILE, QUARANTINE_DIR, REPLICAS_DIR,
    REPLICA_BYTES_MAX, REPLICA_SUFFIX, TEMP_SUFFIX,
};

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

/// The backup's on-disk store of segment replicas. See the `segment_store` module doc.
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

    /// Whether a write of these facts may replace what the store holds (Guarantee 4):
    /// [`check_write`] against the stored copy.
    fn check_write(
        &self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        length: u32,
        closed: bool,
    ) -> Result<(), StoreError> {
        check_write(
            self.index.get(&(master, segment)),
            (master, segment),
            (epoch, length, closed),
        )
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
    /// [`ReplicaFile`](super::format::ReplicaFile)).
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
/// touched once, sized for the largest replica the caller will put in it.
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
    /// unspecified (the previous replica's bytes, or zeros). An image too small for
    /// `len` is replaced by one with room for `room_max` bytes of content (at least
    /// `len`): a caller passing the largest replica it handles (a frame's capacity)
    /// faults the memory in once, not again each time a replica is longer than the
    /// longest before it.
    pub fn content_mut(&mut self, len: usize, room_max: usize) -> &mut [u8] {
        let needed = HEADER_BYTES + len + DIRECT_ALIGN_BYTES;
        if self.storage.len() < needed {
            self.storage = vec![0; HEADER_BYTES + len.max(room_max) + DIRECT_ALIGN_BYTES];
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

/// Whether a copy of replica `key` at `epoch`, `length` bytes long and `closed` or not,
/// may replace `stored`, the copy the store holds of it (Guarantee 4): not when `stored`
/// is at a newer epoch ([`StoreError::StaleEpoch`]), nor when it is at the same epoch
/// with more bytes or closed where this one is not ([`StoreError::Regressed`]).
/// Rewriting identical facts is allowed (a retry). The rule of
/// [`SegmentStore::write_replica`] and [`SegmentStore::commit`]; the simulation's store
/// (`rampart-sim`) keeps it by calling this.
///
/// # Errors
/// The refusal, as above.
pub fn check_write(
    stored: Option<&ReplicaMeta>,
    (master, segment): (ServerId, SegmentId),
    (epoch, length, closed): (Epoch, u32, bool),
) -> Result<(), StoreError> {
    let Some(stored) = stored else {
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

#[cfg(test)]
mod tests {
    use super::*;
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
            image.content_mut(length, length).copy_from_slice(&bytes);
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

    /// An image sized for the largest replica keeps its memory when a longer replica
    /// than the first comes: it is faulted in once per flush thread, not once per
    /// growth (8 MiB of fresh pages each time, in a recovery's closes).
    #[test]
    fn an_image_with_room_keeps_its_memory_for_longer_replicas() {
        let mut image = ReplicaImage::new();
        let room = 1 << 20;
        let first = image.content_mut(100, room).as_ptr();
        let longest = image.content_mut(room, room).as_ptr();
        assert_eq!(
            first, longest,
            "a replica within the room reallocated the image"
        );
        assert_eq!(image.content().len(), room);
        // Past the room, it grows to what the replica needs.
        assert_eq!(image.content_mut(room + 1, room).len(), room + 1);
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
}
