//! Where frame files live and when they go: a data directory's default frame file
//! ([`default_frame_file`]), removing a tree's files ([`remove_default_frame_files_under`])
//! and the start-up sweep of files no backup needs ([`remove_stale_frame_files`]).
//! "The module doc" below is the `shm` overview (`mod.rs`).

use super::header::{slot_offset, FileHeader, OWNER_WORD_OFFSET};
use super::left_behind::{lock_exclusive, same_file};
use super::mapping::page_bytes;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Names of default frame files ([`default_frame_file`]) start with this.
pub const DEFAULT_FRAME_FILE_PREFIX: &str = "rampart-frames-";

/// The frame file a server whose data directory is `data_dir` uses unless told
/// otherwise (`rampart server --frame-file`): `/dev/shm/rampart-frames-HASH`, HASH
/// naming the canonical data directory, so that a restarted server finds its frames;
/// `data_dir/frames` where there is no `/dev/shm`.
pub fn default_frame_file(data_dir: &Path) -> PathBuf {
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let hash = crate::ids::key_hash(canonical.as_os_str().as_encoded_bytes()).0;
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join(format!("{DEFAULT_FRAME_FILE_PREFIX}{hash:016x}"))
    } else {
        data_dir.join("frames")
    }
}

/// Removes the default frame file of every data directory in the tree `root` (itself
/// included) whose servers have stopped, before the tree itself is removed: those in
/// `/dev/shm` would otherwise outlive it, holding memory until a server started later
/// finds them stale. Returns whether `root` is a directory; a link is not followed (the
/// tree it names is not the caller's). Best effort.
pub fn remove_default_frame_files_under(root: &Path) -> bool {
    let is_dir = std::fs::symlink_metadata(root).is_ok_and(|meta| meta.is_dir());
    let mut dirs = if is_dir {
        vec![root.to_path_buf()]
    } else {
        Vec::new()
    };
    while let Some(dir) = dirs.pop() {
        let frames = default_frame_file(&dir);
        if !frames.starts_with(&dir) {
            let _ = std::fs::remove_file(&frames);
        }
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                dirs.push(entry.path());
            }
        }
    }
    is_dir
}

/// Removes the frame files in `dir` whose names start with `prefix` that no live backup
/// holds and no backup will read back (module doc, "A file outlives its backup only
/// while a cold start needs it"):
/// * those whose tag `keep` refuses (the owner's data directory is gone);
/// * those that hold no frame (no slot's owner word is set: a restarted backup reads
///   nothing back from them);
/// * those this format cannot read;
/// * the temporary files of [`FrameFile::create`] (`NAME.PID.new`) whose process `PID`
///   is gone (killed while it created the file: nobody will rename it).
///
/// A killed backup's file that holds frames and whose owner is still there is kept for
/// the backup that restarts on it, however long that takes: a free `flock` says only
/// that no backup runs on the file, not that its frames are not needed. A file is
/// removed only while this call holds its `flock`, and only if the path still names the
/// file locked (a backup may have renamed its new file over the path meanwhile), so a
/// file whose backup runs — or is being created — is never touched. Returns the removed
/// paths; errors on single files are skipped (the file stays).
///
/// [`FrameFile::create`]: super::frame_file::FrameFile::create
pub fn remove_stale_frame_files(
    dir: &Path,
    prefix: &str,
    keep: impl Fn(&str) -> bool,
) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let creator = match rest.split('.').collect::<Vec<_>>().as_slice() {
            [_] => None,
            [_, pid, "new"] => match pid.parse::<u32>() {
                Ok(pid) => Some(pid),
                Err(_) => continue,
            },
            _ => continue,
        };
        if creator.is_some_and(process_exists) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if lock_exclusive(&file, &path).is_err() {
            continue;
        }
        let page = page_bytes();
        let orphaned = creator.is_some()
            || match FileHeader::read(&file, page) {
                Ok(header) => !keep(&header.tag) || !holds_frames_at(&file, &header, page),
                Err(_) => true,
            };
        if orphaned && same_file(&file, &path) && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// Whether any slot of the frame file `file` (of `header`) is held, read from its owner
/// words without mapping it. Call it with the file's `flock` held and no backup on it: a
/// master writes data, never owner words. A word that cannot be read counts as held.
fn holds_frames_at(file: &File, header: &FileHeader, page: u64) -> bool {
    (0..header.slots).any(|slot| {
        let at = slot_offset(page, header.stride, slot) + OWNER_WORD_OFFSET;
        let mut word = [0u8; 8];
        file.read_exact_at(&mut word, at).is_err() || u64::from_ne_bytes(word) != 0
    })
}

/// Whether process `pid` exists (in this PID namespace). A process of another user
/// exists too (`EPERM`).
fn process_exists(pid: u32) -> bool {
    // Pid 0 names no process (`kill(0, 0)` would test our own process group).
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    // `kill(pid, 0)`: only checks that the process exists.
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        Err(errno) => errno == rustix::io::Errno::PERM,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::FrameHandle;
    use crate::onesided::shm::frame_file::FrameFile;
    use crate::onesided::shm::sealed::SealedFrames;
    use crate::onesided::shm::test_support::{labelled, TAG};

    #[test]
    fn removing_the_frame_files_under_a_tree_takes_only_its_servers_files() {
        let root = tempfile::TempDir::new().expect("tempdir");
        let servers = [
            root.path().join("server-1"),
            root.path().join("rpc/server-2"),
        ];
        let mut files = Vec::new();
        for data_dir in &servers {
            std::fs::create_dir_all(data_dir).expect("data dir");
            let frames = default_frame_file(data_dir);
            std::fs::write(&frames, b"frames").expect("frame file");
            files.push(frames);
        }
        // A server elsewhere, reached through a link in the tree, keeps its file.
        let elsewhere = tempfile::TempDir::new().expect("tempdir");
        let kept = default_frame_file(elsewhere.path());
        std::fs::write(&kept, b"frames").expect("frame file");
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("link")).expect("link");
        assert!(remove_default_frame_files_under(root.path()));
        for file in files {
            assert!(!file.exists(), "{} left behind", file.display());
        }
        assert!(kept.exists());
        assert!(!remove_default_frame_files_under(&root.path().join("link")));
        assert!(kept.exists(), "a link given as the root is not followed");
        let _ = std::fs::remove_file(kept);
    }

    #[test]
    fn only_frame_files_no_backup_holds_or_will_read_back_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live = FrameFile::create(&dir.path().join("rampart-frames-live"), 1, 4096, TAG)
            .expect("create");
        std::fs::write(
            dir.path().join("rampart-frames-dead"),
            b"not a frame file of this format",
        )
        .expect("write");
        // Files of stopped backups, each holding a frame when its backup went (so the
        // drop keeps it, as a SIGKILL would): one whose data directory is there, one
        // whose is gone, one whose frame a graceful stop sealed and could not flush, and
        // one whose graceful stop released its sealed frame but did not get to remove
        // the file: it holds no frame.
        let kept_tag = dir.path().to_str().expect("utf-8").to_string();
        for (name, tag) in [
            ("kept", kept_tag.as_str()),
            ("orphan", "/no/such/dir"),
            ("sealed", kept_tag.as_str()),
            ("released", kept_tag.as_str()),
        ] {
            let path = dir.path().join(format!("rampart-frames-{name}"));
            let file = FrameFile::create(&path, 2, 4096, tag).expect("create");
            file.assign(0, FrameHandle(1), labelled(1, 1, 1, 4096));
            let sealed = (name != "kept" && name != "orphan")
                .then(|| SealedFrames::seal(&path).expect("seal"));
            drop(file);
            if name == "released" {
                sealed.expect("sealed").release();
            }
        }
        // Temporary files of `create`: one whose process runs (this one), one whose
        // process is gone.
        let creating = format!("rampart-frames-x.{}.new", std::process::id());
        std::fs::write(dir.path().join(&creating), b"being created").expect("write");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead_pid = child.id();
        child.wait().expect("wait");
        let abandoned = format!("rampart-frames-y.{dead_pid}.new");
        std::fs::write(dir.path().join(&abandoned), b"never renamed").expect("write");
        std::fs::write(dir.path().join("other"), b"not ours").expect("write");
        let mut removed =
            remove_stale_frame_files(dir.path(), "rampart-frames-", |tag| Path::new(tag).exists());
        removed.sort();
        assert_eq!(
            removed,
            vec![
                dir.path().join("rampart-frames-dead"),
                dir.path().join("rampart-frames-orphan"),
                dir.path().join("rampart-frames-released"),
                dir.path().join(&abandoned),
            ]
        );
        assert!(dir.path().join("rampart-frames-kept").exists());
        assert!(dir.path().join("rampart-frames-sealed").exists());
        assert!(live.path().exists());
        assert!(dir.path().join(&creating).exists());
        assert!(dir.path().join("other").exists());
    }
}
