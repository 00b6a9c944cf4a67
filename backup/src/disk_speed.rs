//! `DiskSpeed`: the backup's start-up measurement of its disk's read bandwidth
//! (docs/design.md §5, "Replica placement" and "Backups").
//!
//! A backup reports its disk read bandwidth when it enlists; the coordinator relays it
//! in the server list, and masters place replicas so that every backup's share of a
//! recovery takes about the same time to read (its count of a master's primaries divided
//! by its bandwidth). [`measure_read_mbps`] produces that figure in about a second: it
//! writes a probe file next to the segment store, reads it back in large reads that
//! bypass the page cache, and removes it. An operator who knows better (or whose disk
//! is shared with other work) overrides the figure with the `--disk-mbps` flag, and the
//! measurement is then not run at all.
//!
//! Callers see one figure and how it was obtained ([`DiskSpeed::method`]); they never
//! see the probe file, the aligned buffer or the cache-bypass fallbacks.
//!
//! # What is measured
//! Sequential reads of [`CHUNK_BYTES`] each, one at a time — the shape of a recovery
//! read of whole segments. The page cache would make the figure that of memory, so:
//! 1. `"O_DIRECT"`: the file is read with `O_DIRECT` into a buffer aligned to
//!    [`DIRECT_IO_ALIGN_BYTES`], straight from the device.
//! 2. `"fadvise"`: where `O_DIRECT` is refused (`EINVAL`, e.g. tmpfs before Linux 6.6,
//!    some FUSE and network filesystems), the file — already fsynced, so its cached
//!    pages are clean — is dropped from the cache with `posix_fadvise(DONTNEED)` and
//!    read with plain reads. On tmpfs nothing can be dropped; the figure is then that
//!    of memory, which is what serving replicas from that directory would cost too.
//! 3. `"buffered"`: where `posix_fadvise` fails too (or off Linux), plain reads; the
//!    figure may be inflated by the cache, and a warning is logged.
//!
//! # Bounds
//! * Write phase: at most [`PROBE_FILE_BYTES`], written in [`CHUNK_BYTES`] writes each
//!   followed by `fdatasync`, so the clock sees the disk and not the page cache. It stops
//!   early once `budget` has passed (a slow disk gets a smaller probe), so it takes at
//!   most `budget` plus one chunk's write and sync.
//! * Read phase: a separate deadline of `budget`, started at the first read; it stops at
//!   the end of the file or once `budget` has passed, so it takes at most `budget` plus
//!   one chunk's read. [`DiskSpeed::elapsed`] is the read phase alone.
//! * With [`MEASURE_BUDGET`] of one second the whole measurement takes ≲ 2 s even on a
//!   slow disk; on a 500 MB/s SSD it takes ≈ 0.3 s (64 MiB written, then read).
//! * Disk space: [`PROBE_FILE_BYTES`] for the duration of the call.
//!
//! # Failure handling
//! * A missing or unwritable directory, a full disk, or a read error is returned as an
//!   `io::Error` of the same kind whose message names the probe file and the step.
//! * The probe file is removed when the call returns, on success and on every error
//!   (a drop guard). A probe left behind by a crash is truncated and reused by the next
//!   measurement; it lives in the store's root, beside `replicas/`, so the segment
//!   store's scan never sees it.
//!
//! # Concurrency
//! Synchronous and blocking for up to ~2 s: call it before the backup starts serving,
//! or from `spawn_blocking`, never on the reactor. Two measurements in the same
//! directory at once would share the probe file; one store directory has one backup
//! (the store's `LOCK`), which measures once.

use std::alloc::{self, Layout};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// How long the read phase may run (and, separately, the write phase): long enough to
/// read tens of megabytes on a spinning disk, short enough not to delay start-up.
pub const MEASURE_BUDGET: Duration = Duration::from_secs(1);

/// The largest probe file written. 64 MiB is eight default 8 MiB segments: read in 4 MiB
/// requests it is 16 requests, enough that per-request latency (~0.1 ms on NVMe) costs
/// < 5 % of the figure even at 3 GB/s (≈ 22 ms of reading), larger than the DRAM write
/// cache of most SSDs, and small enough that a 150 MB/s disk writes and reads it in
/// ≈ 0.45 s each, inside [`MEASURE_BUDGET`]. Slower disks get a smaller probe (the write
/// phase stops at its deadline).
pub const PROBE_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Size of each write and read: large enough that the device, not the syscall, is the
/// bottleneck, and the overshoot past a deadline (one chunk) stays ≲ 80 ms at 50 MB/s.
pub const CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// Alignment of the buffer, the file offsets and the read lengths for `O_DIRECT`: the
/// page size, which is a multiple of every common logical block size (512, 4096).
pub const DIRECT_IO_ALIGN_BYTES: usize = 4096;

/// Name of the probe file inside the measured directory; hidden, and not a name the
/// segment store uses.
pub const PROBE_FILE_NAME: &str = ".disk-probe";

const _: () = assert!(CHUNK_BYTES % DIRECT_IO_ALIGN_BYTES == 0);
const _: () = assert!(PROBE_FILE_BYTES % CHUNK_BYTES as u64 == 0);
const _: () = assert!(PROBE_FILE_BYTES >= CHUNK_BYTES as u64);

/// [`DiskSpeed::method`] when the file was read with `O_DIRECT`.
pub const METHOD_O_DIRECT: &str = "O_DIRECT";
/// [`DiskSpeed::method`] when the cache was dropped with `posix_fadvise(DONTNEED)`.
pub const METHOD_FADVISE: &str = "fadvise";
/// [`DiskSpeed::method`] when nothing could keep the page cache out of the figure.
pub const METHOD_BUFFERED: &str = "buffered";

/// The result of one measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpeed {
    /// Read bandwidth in MB/s (10^6 bytes per second), at least 1.
    pub read_mbps: u32,
    /// Bytes read during the read phase.
    pub bytes_read: u64,
    /// Duration of the read phase (not of the write phase).
    pub elapsed: Duration,
    /// How the page cache was kept out: [`METHOD_O_DIRECT`], [`METHOD_FADVISE`] or
    /// [`METHOD_BUFFERED`].
    pub method: &'static str,
}

/// Measures the read bandwidth of the disk holding `dir` (see the module docs for the
/// method and bounds). `dir` must exist and be writable; a probe file of up to
/// [`PROBE_FILE_BYTES`] is written there and removed before returning.
pub fn measure_read_mbps(dir: &Path, budget: Duration) -> io::Result<DiskSpeed> {
    measure(dir, budget, cfg!(target_os = "linux"))
}

/// [`measure_read_mbps`], with `O_DIRECT` optionally not tried (so tests reach the
/// fallback on any filesystem).
fn measure(dir: &Path, budget: Duration, try_direct: bool) -> io::Result<DiskSpeed> {
    let path = dir.join(PROBE_FILE_NAME);
    let mut buf = AlignedBuf::new(CHUNK_BYTES)?;
    fill_incompressible(buf.as_mut_slice());

    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| context(&path, "create", e))?;
    let _guard = RemoveOnDrop(path.clone());
    write_probe(file, &path, buf.as_slice(), budget)?;

    if try_direct {
        if let Some(speed) = read_direct(&path, &mut buf, budget)? {
            return Ok(speed);
        }
    }
    read_cached(&path, &mut buf, budget)
}

/// Writes chunks of `chunk` until [`PROBE_FILE_BYTES`] or `budget` (at least one chunk),
/// syncing each so the deadline is checked against the disk, not the page cache.
fn write_probe(mut file: File, path: &Path, chunk: &[u8], budget: Duration) -> io::Result<()> {
    let start = Instant::now();
    let mut written = 0u64;
    while written < PROBE_FILE_BYTES {
        file.write_all(chunk)
            .map_err(|e| context(path, "write", e))?;
        file.sync_data().map_err(|e| context(path, "fsync", e))?;
        written += chunk.len() as u64;
        if start.elapsed() >= budget {
            tracing::debug!(
                written,
                "disk probe: write deadline reached, probe truncated"
            );
            break;
        }
    }
    Ok(())
}

/// Reads the probe with `O_DIRECT`. `Ok(None)` when the filesystem refuses it.
#[cfg(target_os = "linux")]
fn read_direct(
    path: &Path,
    buf: &mut AlignedBuf,
    budget: Duration,
) -> io::Result<Option<DiskSpeed>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(context(path, "open (O_DIRECT)", e)),
    };
    match read_timed(file, buf.as_mut_slice(), budget, METHOD_O_DIRECT) {
        Ok(speed) => Ok(Some(speed)),
        // Some filesystems accept the flag at open and refuse the read itself.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(context(path, "read (O_DIRECT)", e)),
    }
}

#[cfg(not(target_os = "linux"))]
fn read_direct(_: &Path, _: &mut AlignedBuf, _: Duration) -> io::Result<Option<DiskSpeed>> {
    Ok(None)
}

/// Reads the probe through the page cache after asking the kernel to drop it.
fn read_cached(path: &Path, buf: &mut AlignedBuf, budget: Duration) -> io::Result<DiskSpeed> {
    let file = File::open(path).map_err(|e| context(path, "open", e))?;
    let method = match drop_cached_pages(&file) {
        Ok(()) => METHOD_FADVISE,
        Err(e) => {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                "disk probe: cannot drop the page cache; the measured bandwidth may be inflated"
            );
            METHOD_BUFFERED
        }
    };
    read_timed(file, buf.as_mut_slice(), budget, method).map_err(|e| context(path, "read", e))
}

/// Drops the file's pages from the page cache; they are clean (the probe was fsynced),
/// so `DONTNEED` discards them rather than starting writeback.
#[cfg(target_os = "linux")]
fn drop_cached_pages(file: &File) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call (borrowed from
    // `file`); posix_fadvise reads no memory of ours.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        // posix_fadvise returns the error number instead of setting errno.
        Err(io::Error::from_raw_os_error(rc))
    }
}

#[cfg(not(target_os = "linux"))]
fn drop_cached_pages(_: &File) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "posix_fadvise(DONTNEED) is only used on Linux",
    ))
}

/// Reads `file` from its start in `buf`-sized reads until the end or until `budget` has
/// passed (at least one read), and computes the bandwidth of the reads.
fn read_timed(
    mut file: File,
    buf: &mut [u8],
    budget: Duration,
    method: &'static str,
) -> io::Result<DiskSpeed> {
    let start = Instant::now();
    let mut bytes_read = 0u64;
    loop {
        let n = match file.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        bytes_read += n as u64;
        if start.elapsed() >= budget {
            break;
        }
    }
    let elapsed = start.elapsed();
    if bytes_read == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "probe file is empty after writing it",
        ));
    }
    Ok(DiskSpeed {
        read_mbps: mbps(bytes_read, elapsed),
        bytes_read,
        elapsed,
        method,
    })
}

/// `bytes / seconds / 1e6`, rounded down, clamped to `1..=u32::MAX`.
fn mbps(bytes: u64, elapsed: Duration) -> u32 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return u32::MAX;
    }
    let rate = bytes as f64 / secs / 1e6;
    // `as` saturates; the clamp makes the floor of 1 explicit.
    (rate as u32).max(1)
}

/// Fills `buf` with xorshift output so compressing or deduplicating filesystems (btrfs,
/// ZFS) store and read every byte, as they would for segment data.
fn fill_incompressible(buf: &mut [u8]) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for word in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

/// Adds the step and the probe path to an I/O error, keeping its kind.
fn context(path: &Path, step: &str, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("disk probe {}: {step}: {e}", path.display()),
    )
}

/// Removes the probe file when the measurement returns, whatever the outcome.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        match fs::remove_file(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                path = %self.0.display(),
                error = %e,
                "disk probe: cannot remove the probe file"
            ),
        }
    }
}

/// A zeroed heap buffer aligned to [`DIRECT_IO_ALIGN_BYTES`], as `O_DIRECT` requires.
struct AlignedBuf {
    /// Start of the allocation; valid for `layout.size()` bytes until drop.
    ptr: NonNull<u8>,
    /// The layout it was allocated with (non-zero size).
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> io::Result<Self> {
        assert!(len > 0, "an aligned buffer must not be empty");
        let layout = Layout::from_size_align(len, DIRECT_IO_ALIGN_BYTES)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size (asserted above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate a {len}-byte disk probe buffer"),
            )
        })?;
        Ok(Self { ptr, layout })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid and initialized (zeroed) for `layout.size()` bytes, and
        // the borrow of `self` keeps it alive and unaliased by `as_mut_slice`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; the exclusive borrow of `self` makes this the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generous slack over the budget: one chunk's read on a slow CI disk, plus
    /// scheduling noise. Not a performance assertion.
    const SLACK: Duration = Duration::from_secs(2);

    fn assert_sane(speed: &DiskSpeed, budget: Duration) {
        assert!(speed.read_mbps >= 1, "{speed:?}");
        assert!(speed.bytes_read > 0, "{speed:?}");
        assert!(speed.bytes_read <= PROBE_FILE_BYTES, "{speed:?}");
        assert!(speed.elapsed <= budget + SLACK, "{speed:?}");
        assert!(
            [METHOD_O_DIRECT, METHOD_FADVISE, METHOD_BUFFERED].contains(&speed.method),
            "{speed:?}"
        );
    }

    #[test]
    fn measure_returns_a_positive_figure_and_removes_the_probe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let speed = measure_read_mbps(dir.path(), MEASURE_BUDGET).expect("measure");
        eprintln!("measured {speed:?} in {}", dir.path().display());
        assert_sane(&speed, MEASURE_BUDGET);
        assert!(!dir.path().join(PROBE_FILE_NAME).exists());
        let left: Vec<_> = fs::read_dir(dir.path()).expect("read_dir").collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn measure_without_o_direct_falls_back_to_fadvise() {
        let dir = tempfile::tempdir().expect("tempdir");
        let speed = measure(dir.path(), MEASURE_BUDGET, false).expect("measure");
        assert_sane(&speed, MEASURE_BUDGET);
        assert_ne!(speed.method, METHOD_O_DIRECT);
        if cfg!(target_os = "linux") {
            assert_eq!(speed.method, METHOD_FADVISE);
        }
        assert!(!dir.path().join(PROBE_FILE_NAME).exists());
    }

    #[test]
    fn measure_with_a_tiny_budget_stops_early_but_still_reports() {
        let dir = tempfile::tempdir().expect("tempdir");
        let speed = measure_read_mbps(dir.path(), Duration::ZERO).expect("measure");
        assert_sane(&speed, Duration::ZERO);
        // One chunk written, at least one read of it.
        assert_eq!(speed.bytes_read, CHUNK_BYTES as u64);
        assert!(!dir.path().join(PROBE_FILE_NAME).exists());
    }

    #[test]
    fn measure_truncates_a_stale_probe_and_removes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stale = dir.path().join(PROBE_FILE_NAME);
        fs::write(&stale, vec![7u8; 3 * CHUNK_BYTES + 5]).expect("write stale probe");
        let speed = measure_read_mbps(dir.path(), Duration::ZERO).expect("measure");
        assert_eq!(speed.bytes_read, CHUNK_BYTES as u64);
        assert!(!stale.exists());
    }

    #[test]
    fn measure_in_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("no-such-dir");
        let err = measure_read_mbps(&missing, MEASURE_BUDGET).expect_err("must fail");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains(PROBE_FILE_NAME), "{err}");
        assert!(!missing.exists());
    }

    #[test]
    fn mbps_is_bytes_per_second_in_millions_and_at_least_one() {
        assert_eq!(mbps(500_000_000, Duration::from_secs(1)), 500);
        assert_eq!(mbps(64 << 20, Duration::from_millis(100)), 671);
        assert_eq!(mbps(1, Duration::from_secs(10)), 1);
        assert_eq!(mbps(1, Duration::ZERO), u32::MAX);
        assert_eq!(mbps(u64::MAX, Duration::from_nanos(1)), u32::MAX);
    }

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        let buf = AlignedBuf::new(CHUNK_BYTES).expect("alloc");
        assert_eq!(buf.as_slice().as_ptr() as usize % DIRECT_IO_ALIGN_BYTES, 0);
        assert_eq!(buf.as_slice().len(), CHUNK_BYTES);
        assert!(buf.as_slice().iter().all(|&b| b == 0));
    }

    #[test]
    fn fill_incompressible_has_no_repeated_words_in_a_chunk() {
        let mut buf = vec![0u8; 64 * 1024];
        fill_incompressible(&mut buf);
        let mut words: Vec<&[u8]> = buf.chunks(8).collect();
        let n = words.len();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), n);
    }
}
