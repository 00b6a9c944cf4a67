//! Starting and stopping a backup. [`BackupService::open`] opens the segment store,
//! stores as open replicas the frames a killed predecessor on the same data directory
//! left in the frame file ([`OpenReport`]), then creates the file afresh. The file is
//! tagged with its backup's data directory and identity ([`frame_file_tag`],
//! [`IDENTITY_FILE`]), so that a backup reads back only its own frames and a file whose
//! backup may still come back is kept ([`frame_file_tag_is_live`]).
//! [`BackupService::flush_open_frames`] stores the open frames at a graceful stop
//! (docs/design.md §5, "Frames survive a kill").

use rampart_common::ids::FrameHandle;
use rampart_common::log::scan;
use rampart_common::onesided::host_id;
use rampart_common::onesided::shm::{FrameFile, LeftBehind, SlotLabel};
use std::path::Path;
use std::sync::Arc;

use crate::flush_threads::{FlushThreads, FLUSH_THREADS};
use crate::frame_table::{FrameLimits, FrameTable};
use crate::frames::Frames;
use crate::rdma::RdmaTarget;
use crate::recovery_reads::{
    RecoveryReads, RECOVERY_PIECES_BYTES_MAX, RECOVERY_REGION_BYTES, RECOVERY_REGION_SLOT_BYTES,
};
use crate::segment_store::{
    Disk, RealDisk, ReplicaMeta, ScanReport, SegmentStore, StoreError, REPLICA_BYTES_MAX,
};
use crate::stored::StoreHandle;
use rampart_common::onesided::shm::{RecoveryRegion, REGION_COOL_DEFAULT};

use super::config::BackupConfig;
use super::state::BackupService;

/// What [`BackupService::open`] found: the store's scan, and what the frame file a killed
/// predecessor left held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// The segment store's scan (the replicas on disk, the files quarantined).
    pub store: ScanReport,
    /// Frames read back from the frame file and stored as open replicas, with what the
    /// store now holds of each.
    pub frames_read_back: Vec<ReplicaMeta>,
    /// Held frames not stored, and why: nothing valid written yet, the store already
    /// holds as much, bytes that are not the labelled replica's.
    pub frames_skipped: Vec<(SlotLabel, String)>,
    /// Why a file found at the frame file's path was not read: not a frame file of this
    /// format, or the file of a backup whose data directory is gone. It is replaced.
    pub frame_file_unread: Option<String>,
}

/// The file in a backup's data directory that holds its identity: a random number drawn
/// when the directory is first used, in hexadecimal.
pub const IDENTITY_FILE: &str = "BACKUP_ID";

/// The tag of the frame file of the backup on `data_dir`: `IDENTITY PATH`, its identity
/// ([`IDENTITY_FILE`], created on first use) and its canonical path. The identity tells
/// this directory from a new one at the same path: a data directory wiped and used again
/// (by a new cluster, whose servers get the same ids again) must not adopt the frames the
/// old one left. Blocks on the disk (creating the identity syncs it).
pub fn frame_file_tag(data_dir: &Path) -> Result<String, StoreError> {
    let path = data_dir.join(IDENTITY_FILE);
    let io_error = |source: std::io::Error| StoreError::Io {
        path: path.clone(),
        source,
    };
    let identity = match std::fs::read_to_string(&path) {
        Ok(text) => u64::from_str_radix(text.trim(), 16).map_err(|_| {
            io_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a backup identity: {:?}", text.trim()),
            ))
        })?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let identity = rand::random::<u64>();
            let temp = data_dir.join(format!("{IDENTITY_FILE}.tmp"));
            let write = || -> std::io::Result<()> {
                let mut file = std::fs::File::create(&temp)?;
                std::io::Write::write_all(&mut file, format!("{identity:016x}\n").as_bytes())?;
                file.sync_all()?;
                std::fs::rename(&temp, &path)?;
                std::fs::File::open(data_dir)?.sync_all()
            };
            write().map_err(io_error)?;
            identity
        }
        Err(error) => return Err(io_error(error)),
    };
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    Ok(format!("{identity:016x} {}", canonical.to_string_lossy()))
}

/// Whether the backup a frame file's `tag` names ([`frame_file_tag`]) may still come back
/// for its frames: its data directory exists and holds the same identity. A file whose
/// tag is not of that form is nobody's.
pub fn frame_file_tag_is_live(tag: &str) -> bool {
    let Some((identity, path)) = tag.split_once(' ') else {
        return false;
    };
    std::fs::read_to_string(Path::new(path).join(IDENTITY_FILE))
        .is_ok_and(|held| held.trim() == identity)
}

/// Stores, as open replicas, the frames that a backup killed on this data directory left
/// in its frame file at `path` (docs/design.md §5, "Frames survive a kill"): each held
/// slot's valid prefix (no more than its recorded fenced length), when its bytes begin
/// with the header of the replica its label names and the store holds less of it.
/// Errors leave the file as it is: a store that cannot take the frames (disk full, I/O error) stops
/// the backup from starting rather than lose them, and so does a file tagged for another
/// backup whose data directory exists. Blocks on the disk.
fn read_back_frames(
    store: &mut SegmentStore,
    path: &Path,
    tag: &str,
    report: &mut OpenReport,
) -> Result<(), StoreError> {
    let io_error = |source: std::io::Error| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let left = match FrameFile::read_back(path, tag).map_err(io_error)? {
        LeftBehind::Nothing => return Ok(()),
        LeftBehind::Unreadable(why) => {
            report.frame_file_unread = Some(why);
            return Ok(());
        }
        LeftBehind::Foreign(owner) if !frame_file_tag_is_live(&owner) => {
            report.frame_file_unread = Some(format!(
                "the frame file of the backup {owner}, whose data directory is gone"
            ));
            return Ok(());
        }
        LeftBehind::Foreign(owner) => {
            return Err(io_error(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "it holds the frames of the backup on {owner}; give each backup its \
                     own frame file"
                ),
            )))
        }
        LeftBehind::Frames(left) => left,
    };
    for slot in left.held() {
        let label = slot.label;
        if label.capacity > REPLICA_BYTES_MAX {
            let reason = format!(
                "a capacity of {} bytes: no replica is that large",
                label.capacity
            );
            report.frames_skipped.push((label, reason));
            continue;
        }
        let bytes = left.read(&slot);
        let scanned = scan(&bytes);
        let valid = slot.fenced_length.map_or(scanned.valid_bytes, |fenced| {
            fenced.min(scanned.valid_bytes)
        });
        let names_it = scanned
            .header
            .is_some_and(|h| h.log_id == label.master && h.segment_id == label.segment);
        let stored = store.meta(label.master, label.segment);
        let holds_as_much = stored.is_some_and(|stored| {
            stored.epoch > label.epoch
                || (stored.epoch == label.epoch && (stored.closed || stored.length >= valid))
        });
        let skipped = if valid == 0 {
            Some("nothing valid was written to it".to_string())
        } else if !names_it {
            Some(format!(
                "its bytes begin with {:?}, not the header of that replica",
                scanned.header
            ))
        } else if holds_as_much {
            Some(format!("the store holds as much of it already: {stored:?}"))
        } else {
            None
        };
        if let Some(reason) = skipped {
            report.frames_skipped.push((label, reason));
            continue;
        }
        let meta = store.write_replica(
            label.master,
            label.segment,
            label.epoch,
            false,
            &bytes[..valid as usize],
        )?;
        report.frames_read_back.push(meta);
    }
    Ok(())
}

impl BackupService {
    /// Opens (scans) the segment store under `data_dir`, creates the frame file at
    /// [`BackupConfig::frame_file`], and returns the service with the scan report (the
    /// replicas this backup still holds after a restart). A frame file that cannot be
    /// created (`frames_max` 0, a path that is not UTF-8, a file another live backup
    /// holds, an I/O error) is [`StoreError::Io`] naming the file.
    ///
    /// The scan blocks on the disk: call this at start-up, before serving. The
    /// service's handlers must run inside a tokio runtime (closes, frees, lists and
    /// reads use `spawn_blocking`).
    pub fn open(
        data_dir: &Path,
        config: BackupConfig,
    ) -> Result<(BackupService, OpenReport), StoreError> {
        BackupService::open_with_disk(data_dir, config, Box::new(RealDisk))
    }

    /// [`BackupService::open`] with the store's write path going through `disk`, so
    /// tests can make the disk fill up (STYLE habit 10).
    pub fn open_with_disk(
        data_dir: &Path,
        config: BackupConfig,
        disk: Box<dyn Disk>,
    ) -> Result<(BackupService, OpenReport), StoreError> {
        let mut config = config;
        if config.frame_bytes_max > REPLICA_BYTES_MAX {
            tracing::warn!(
                frame_bytes_max = config.frame_bytes_max,
                "frame size limit above REPLICA_BYTES_MAX; using {REPLICA_BYTES_MAX}"
            );
            config.frame_bytes_max = REPLICA_BYTES_MAX;
        }
        // The store first: its directory lock keeps a second backup on this data
        // directory from replacing our frame file.
        let (mut store, scan) = SegmentStore::open_with_disk(data_dir, disk)?;
        let frame_error = |source: std::io::Error| StoreError::Io {
            path: config.frame_file.clone(),
            source,
        };
        // The file says whose it is: a restarted backup reads back only its own frames,
        // and a sweep of stale files keeps a file whose data directory still exists.
        let tag = frame_file_tag(data_dir)?;
        let mut report = OpenReport {
            store: scan,
            ..OpenReport::default()
        };
        // Before the file is replaced: what a killed predecessor's frames hold is
        // stored first (docs/design.md §5, "Frames survive a kill").
        read_back_frames(&mut store, &config.frame_file, &tag, &mut report)?;
        let file = FrameFile::create(
            &config.frame_file,
            config.frames_max.saturating_add(config.extra_slots),
            config.frame_bytes_max,
            &tag,
        )
        .map_err(frame_error)?;
        let rdma =
            RdmaTarget::new(file.path(), file.slot_offset(file.slots())).map_err(frame_error)?;
        let path = file
            .path()
            .to_str()
            .ok_or_else(|| {
                frame_error(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the frame file's path is not valid UTF-8",
                ))
            })?
            .to_string();
        let limits = FrameLimits {
            frames_max: config.frames_max,
            frame_bytes_max: config.frame_bytes_max,
        };
        let first_handle = FrameHandle((rand::random::<u64>() >> 2).max(1));
        let table = FrameTable::new(limits, file.slots(), store.list(None), first_handle);
        tracing::info!(
            frame_file = %path, slots = file.slots(), slot_bytes = file.slot_capacity(),
            "frame file created"
        );
        let writer = store.writer();
        // Each close in flight pins an open frame (a retried one may add another).
        let flushers = FlushThreads::start(FLUSH_THREADS, config.frames_max, "rampart-flush")
            .map_err(|source| StoreError::Io {
                path: data_dir.to_path_buf(),
                source,
            })?;
        let files = store.files();
        let recovery = recovery_reads();
        let frames = Arc::new(Frames::new(table, file, host_id(), path, files));
        let service = BackupService {
            writer,
            flushers,
            config,
            store: Arc::new(StoreHandle::new(store, Arc::clone(&frames))),
            frames,
            rdma: Arc::new(rdma),
            recovery,
        };
        Ok((service, report))
    }

    /// At a graceful stop: writes every open frame's valid prefix to the segment store
    /// as an *open* (not closed) replica, so that a backup restarted on the same data
    /// directory still reports it even if the frame file is lost meanwhile (a reboot:
    /// it lives in memory). The file itself stays while frames are open in it, and the
    /// restarted backup reads back whatever a master wrote after this flush. Frames stay
    /// open here (a master still writing sees this backup go away and re-creates the
    /// replica elsewhere). A copy the store already holds at the same or a newer epoch
    /// is kept. Returns how many replicas were written. Blocks on the disk: call it on a
    /// blocking thread, after the service stopped taking requests.
    pub fn flush_open_frames(&self) -> usize {
        let open = self.frames.table.lock().open_frames();
        let mut written = 0;
        for frame in self.frames.scan(open) {
            let key = frame.frame.key();
            match self.store.write_open(key, frame.frame.epoch, &frame.bytes) {
                Ok(_) => written += 1,
                Err(error) => {
                    tracing::warn!(master = %key.0, segment = %key.1, %error, "open frame not flushed");
                }
            }
        }
        written
    }
}

/// The backup's recovery reads, with a recovery region where the system gives one;
/// without, pieces go inside replies.
fn recovery_reads() -> RecoveryReads {
    let slots = RECOVERY_REGION_BYTES / u64::from(RECOVERY_REGION_SLOT_BYTES);
    let slots = u32::try_from(slots).unwrap_or(u32::MAX);
    match RecoveryRegion::create(slots, RECOVERY_REGION_SLOT_BYTES, REGION_COOL_DEFAULT) {
        Ok(region) => RecoveryReads::with_region(RECOVERY_PIECES_BYTES_MAX, region, host_id()),
        Err(error) => {
            tracing::warn!(%error, "no recovery region: recovery pieces go inside replies");
            RecoveryReads::new(RECOVERY_PIECES_BYTES_MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::BackupConfig;
    use super::super::state::BackupService;
    use super::super::test_support::*;
    use crate::segment_store::StoreError;
    use rampart_common::ids::{SegmentId, ServerId};
    use tempfile::TempDir;

    #[tokio::test]
    async fn open_frames_flushed_at_a_graceful_stop_are_reported_after_a_restart() {
        let dir = TempDir::new().expect("tempdir");
        let (bytes, ends) = segment(4, 1, 2);
        {
            let service = open_service(&dir, 4);
            let handle = open(&service, 4, 1, 3).await;
            write_range(&service, handle, 3, &bytes, 0, ends[2]).await;
            // A torn third batch past the valid prefix is not flushed.
            write(&service, handle, 3, ends[2], b"\x02torn")
                .await
                .expect("write");
            assert_eq!(service.flush_open_frames(), 1);
        }
        let service = open_service(&dir, 4);
        assert_eq!(
            list(&service, Some(4)).await,
            vec![info(4, 1, 3, ends[2], false)]
        );
        let replica = read(&service, 4, 1).await.expect("read");
        assert_eq!(&replica.bytes[..], &bytes[..ends[2] as usize]);
    }

    /// Issue 12, item 6: a backup killed (no graceful flush) and restarted on its data
    /// directory reports the open frames it held, at their epochs and lengths; before the
    /// frame file kept its labels and outlived the process, all three were lost.
    #[tokio::test]
    async fn a_killed_backups_open_frames_are_reported_after_a_restart() {
        let dir = TempDir::new().expect("tempdir");
        let (bytes, ends) = segment(4, 1, 2);
        let (fenced_bytes, fenced_ends) = segment(5, 1, 3);
        let (closed_bytes, closed_ends) = segment(4, 2, 1);
        {
            let service = open_service(&dir, 4);
            let handle = open(&service, 4, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[2]).await;
            write(&service, handle, 1, ends[2], b"\x02torn")
                .await
                .expect("write");
            bump(&service, handle, 1, 2).await.expect("bump");
            let fenced_reply = open_reply(&service, 5, 1, 1).await;
            let fenced = fenced_reply.handle;
            write_range(&service, fenced, 1, &fenced_bytes, 0, fenced_ends[2]).await;
            assert_eq!(
                service.fence_master(ServerId(5)),
                vec![info(5, 1, 1, fenced_ends[2], false)]
            );
            // A write in flight during the fence lands past it, unacknowledged (its
            // master's check saw the fence): the read-back must not serve it either.
            let past = &fenced_bytes[fenced_ends[2] as usize..fenced_ends[3] as usize];
            let at = slot_offset(&fenced_reply)
                + rampart_common::onesided::shm::SLOT_HEADER_BYTES
                + u64::from(fenced_ends[2]);
            std::os::unix::fs::FileExt::write_all_at(
                &std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.path().join("frames"))
                    .expect("frame file"),
                past,
                at,
            )
            .expect("write past the fence");
            // Opened, never written: nothing to keep.
            open(&service, 6, 1, 1).await;
            let closed = open(&service, 4, 2, 1).await;
            let end = *closed_ends.last().expect("end");
            write_range(&service, closed, 1, &closed_bytes, 0, end).await;
            close(&service, closed, 1, end).await.expect("close");
            // SIGKILL: no flush; the process's lock and memory go, the file stays.
        }
        let (service, report) = BackupService::open(dir.path(), config(&dir, 4)).expect("reopen");
        let read_back: Vec<(u64, u64, u64, u32, bool)> = report
            .frames_read_back
            .iter()
            .map(|m| (m.master.0, m.segment.0, m.epoch.0, m.length, m.closed))
            .collect();
        assert_eq!(
            read_back,
            vec![(4, 1, 2, ends[2], false), (5, 1, 1, fenced_ends[2], false)]
        );
        let skipped: Vec<(ServerId, SegmentId)> = report
            .frames_skipped
            .iter()
            .map(|(label, _)| (label.master, label.segment))
            .collect();
        assert_eq!(skipped, vec![(ServerId(6), SegmentId(1))]);
        assert_eq!(report.frame_file_unread, None);
        let end = *closed_ends.last().expect("end");
        assert_eq!(
            list(&service, None).await,
            vec![
                info(4, 1, 2, ends[2], false),
                info(4, 2, 1, end, true),
                info(5, 1, 1, fenced_ends[2], false)
            ]
        );
        let replica = read(&service, 4, 1).await.expect("read");
        assert_eq!(&replica.bytes[..], &bytes[..ends[2] as usize]);
        // A second restart finds nothing more to read back: the file was replaced.
        drop(service);
        let (_service, report) = BackupService::open(dir.path(), config(&dir, 4)).expect("again");
        assert_eq!(report.frames_read_back, vec![]);
        assert_eq!(report.store.replicas.len(), 3);
    }

    /// A data directory wiped and used again at the same path (a new cluster, whose
    /// servers get the same ids again) does not adopt the frames the old one left.
    #[tokio::test]
    async fn a_wiped_data_directory_does_not_adopt_the_frames_left_at_its_path() {
        let frames = TempDir::new().expect("tempdir");
        let dir = TempDir::new().expect("tempdir");
        let data = dir.path().join("data");
        let config = || BackupConfig {
            frame_file: frames.path().join("frames"),
            ..config(&dir, 2)
        };
        {
            let (service, _) = BackupService::open(&data, config()).expect("open");
            let (bytes, ends) = segment(3, 1, 1);
            let handle = open(&service, 3, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        }
        std::fs::remove_dir_all(&data).expect("wipe");
        let (service, report) = BackupService::open(&data, config()).expect("a fresh start");
        assert_eq!(report.frames_read_back, vec![]);
        assert!(
            report
                .frame_file_unread
                .as_deref()
                .is_some_and(|why| why.contains("data directory is gone")),
            "{report:?}"
        );
        assert_eq!(list(&service, None).await, vec![]);
    }

    /// A frame file left at this backup's path by a backup of another data directory that
    /// still exists is not silently replaced: its frames are that backup's to read back.
    #[tokio::test]
    async fn a_frame_file_of_another_live_data_directory_is_not_replaced() {
        let other = TempDir::new().expect("tempdir");
        let dir = TempDir::new().expect("tempdir");
        let shared_file = dir.path().join("shared-frames");
        let with_file = |frames_max| BackupConfig {
            frame_file: shared_file.clone(),
            ..config(&dir, frames_max)
        };
        {
            let (service, _) =
                BackupService::open(other.path(), with_file(2)).expect("the other backup");
            let (bytes, ends) = segment(3, 1, 1);
            let handle = open(&service, 3, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        }
        let error = BackupService::open(&dir.path().join("mine"), with_file(2))
            .expect_err("someone else's frames");
        assert!(
            error
                .to_string()
                .contains("give each backup its own frame file"),
            "{error}"
        );
        // Its own backup still reads them back.
        let (_service, report) =
            BackupService::open(other.path(), with_file(2)).expect("the other backup again");
        assert_eq!(report.frames_read_back.len(), 1);
    }

    /// A backup restarted on a full disk cannot store the frames its predecessor left: it
    /// refuses to start, saying why, and leaves the file as it was, so that a start after
    /// space was freed still reads them back.
    #[tokio::test]
    async fn frames_left_behind_are_kept_when_the_disk_is_full_at_restart() {
        let dir = TempDir::new().expect("tempdir");
        let (bytes, ends) = segment(4, 1, 1);
        {
            let service = open_service(&dir, 4);
            let handle = open(&service, 4, 1, 1).await;
            write_range(&service, handle, 1, &bytes, 0, ends[1]).await;
        }
        let disk = FillableDisk::default();
        disk.full.store(true, std::sync::atomic::Ordering::SeqCst);
        let error = BackupService::open_with_disk(dir.path(), config(&dir, 4), Box::new(disk))
            .expect_err("the frames cannot be stored");
        assert!(matches!(error, StoreError::Full { .. }), "{error}");
        let (service, report) =
            BackupService::open(dir.path(), config(&dir, 4)).expect("space again");
        let read_back: Vec<(u64, u32)> = report
            .frames_read_back
            .iter()
            .map(|meta| (meta.segment.0, meta.length))
            .collect();
        assert_eq!(read_back, vec![(1, ends[1])]);
        assert_eq!(
            list(&service, None).await,
            vec![info(4, 1, 1, ends[1], false)]
        );
    }

    #[tokio::test]
    async fn handles_do_not_repeat_across_restarts() {
        let dir = TempDir::new().expect("tempdir");
        let first = {
            let service = open_service(&dir, 4);
            open(&service, 1, 1, 1).await
        };
        let service = open_service(&dir, 4);
        let second = open(&service, 1, 2, 1).await;
        assert_ne!(first, second);
    }
}
