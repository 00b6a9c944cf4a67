//! [`Disk`]: the file-system steps of the store's write path, injectable so that tests
//! can fail them as a full disk does; and [`RealDisk`], the real file system, which
//! writes replicas past the page cache (`O_DIRECT`).

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

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
/// [`ReplicaImage`](super::store::ReplicaImage)) is written from where it is, but for its last partial block. Other
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
