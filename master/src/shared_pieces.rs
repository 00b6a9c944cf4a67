//! `SharedPieces`: a recovery master's reads of pieces that backups on its host left in
//! their recovery regions (`onesided::shm::RecoveryRegion`; docs/design.md §6,
//! "One-sided recovery reads"), instead of sending them inside `RecoveryData` replies.
//!
//! [`SharedPieces::read`] maps the region a reply names (once per backup, kept open
//! for the next pieces) and copies the piece out into a pooled buffer. The copy is
//! checked against the slot's refill (the region's seqlock): a piece the backup reused
//! its slot for meanwhile is refused, never read as someone else's entries, and the
//! caller asks for it again inside a reply.
//!
//! A backup whose region cannot be mapped here (another user's process, a kernel that
//! refuses `/proc/PID/fd`) is remembered ([`SharedPieces::unmappable`]): it is asked
//! for pieces inside replies from then on, rather than once more per piece, each such
//! retry costing the backup a whole replica read.
//!
//! # Limits
//! At most [`REGIONS_MAPPED_MAX`] regions stay mapped (one per backup of the host);
//! past it every mapping is dropped and regions are mapped again as pieces need them.
//! Mapping a new region first drops the mappings of regions whose backup process is
//! gone. A region whose nonce changed (its backup restarted, its pid and descriptor
//! reused) is mapped again. A piece is at most [`RPC_PAYLOAD_BYTES_MAX`], as inside a
//! reply, and its runs must lie inside the region, each in a slot of its own.
//! [`REGIONS_MAPPED_MAX`] backups are remembered as unmappable at most.

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::limits::RPC_PAYLOAD_BYTES_MAX;
use rampart_common::onesided::shm::RegionReader;
use rampart_common::protocol::backup::SharedPiece;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Regions kept mapped: a host runs a few backups, so this is never reached in a
/// normal cluster; it bounds the mappings a misbehaving peer could make us hold.
pub const REGIONS_MAPPED_MAX: usize = 64;

/// This host's identity and the regions mapped so far. Cloning shares them.
#[derive(Debug, Clone)]
pub struct SharedPieces {
    host: String,
    regions: Arc<Mutex<HashMap<String, Arc<RegionReader>>>>,
    /// Backups (by address) whose region could not be mapped here.
    unmappable: Arc<Mutex<HashSet<String>>>,
}

/// Why a shared piece was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedReadError {
    /// The region cannot be mapped here: ask this backup inside replies from now on.
    Unmappable(String),
    /// The piece's slots were reused, or its runs are not the region's: ask again.
    Unreadable(String),
}

impl std::fmt::Display for SharedReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SharedReadError::Unmappable(reason) | SharedReadError::Unreadable(reason) => {
                f.write_str(reason)
            }
        }
    }
}

impl SharedPieces {
    /// Reads for a master on the host named `host` (`onesided::host_id`).
    pub fn new(host: String) -> SharedPieces {
        SharedPieces {
            host,
            regions: Arc::default(),
            unmappable: Arc::default(),
        }
    }

    /// Whether `backup`'s region could not be mapped here before: ask it for the bytes.
    pub fn unmappable(&self, backup: &str) -> bool {
        self.unmappable.lock().contains(backup)
    }

    /// Remembers that `backup`'s region cannot be mapped here; true the first time.
    pub fn give_up_on(&self, backup: &str) -> bool {
        let mut unmappable = self.unmappable.lock();
        if unmappable.len() >= REGIONS_MAPPED_MAX {
            unmappable.clear();
        }
        unmappable.insert(backup.to_string())
    }

    /// The host identity to name in `RecoveryData` requests.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The piece's bytes, copied out of its region. Blocks (an `open` and `mmap` the
    /// first time a region is met, a copy of megabytes): call it off the reactor.
    pub fn read(&self, piece: &SharedPiece) -> Result<Bytes, SharedReadError> {
        let reader = self
            .region(&piece.region, piece.nonce)
            .map_err(SharedReadError::Unmappable)?;
        let unreadable = |error: String| {
            SharedReadError::Unreadable(format!("shared piece in {}: {error}", piece.region))
        };
        let runs = piece.region_runs();
        let len = reader
            .runs_len(&runs)
            .map_err(|error| unreadable(error.to_string()))?;
        if len > RPC_PAYLOAD_BYTES_MAX {
            return Err(unreadable(format!(
                "{len} bytes, more than a reply may carry ({RPC_PAYLOAD_BYTES_MAX})"
            )));
        }
        let pool = rampart_common::buffer_pool::shared();
        let mut buffer = pool.take(len);
        reader
            .copy_runs(&runs, &mut buffer)
            .map_err(|error| unreadable(error.to_string()))?;
        Ok(pool.freeze(buffer))
    }

    fn region(&self, path: &str, nonce: u64) -> Result<Arc<RegionReader>, String> {
        if let Some(reader) = self.regions.lock().get(path) {
            if reader.nonce() == nonce {
                return Ok(Arc::clone(reader));
            }
        }
        // Mapped outside the lock: another piece's read may map it too, harmlessly.
        let reader = Arc::new(
            RegionReader::open(path, nonce)
                .map_err(|error| format!("cannot map recovery region {path}: {error}"))?,
        );
        let mut regions = self.regions.lock();
        // A dead backup's descriptor path is gone: its mapping would hold its memory.
        regions.retain(|path, _| std::path::Path::new(path).exists());
        if regions.len() >= REGIONS_MAPPED_MAX {
            regions.clear();
        }
        regions.insert(path.to_string(), Arc::clone(&reader));
        Ok(reader)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::onesided::shm::{RecoveryRegion, RegionRun};
    use rampart_common::protocol::backup::SharedRun;
    use std::time::Duration;

    fn shared(region: &RecoveryRegion, runs: &[RegionRun]) -> SharedPiece {
        SharedPiece {
            region: region.path().to_string(),
            nonce: region.nonce(),
            runs: runs.iter().copied().map(SharedRun::from).collect(),
        }
    }

    #[test]
    fn a_piece_is_read_until_its_slot_is_reused() {
        let region = RecoveryRegion::create(2, 4096, Duration::ZERO).expect("region");
        let mut slot = region.take().expect("slot");
        slot.write(0, b"first ");
        let first = slot.seal();
        let mut slot = region.take().expect("slot");
        slot.write(0, b"piece");
        let second = slot.seal();
        let piece = shared(&region, &[first.run(0, 6), second.run(0, 5)]);
        let reads = SharedPieces::new("here".to_string());
        assert_eq!(reads.read(&piece).expect("reads"), &b"first piece"[..]);
        drop(second);
        let mut slot = region.take().expect("the second slot again");
        slot.write(0, b"other piece");
        let _sealed = slot.seal();
        let error = reads.read(&piece).expect_err("the slot was reused");
        assert!(
            matches!(&error, SharedReadError::Unreadable(e) if e.contains("generation")),
            "{error}"
        );
    }

    /// A reply's runs are checked against the region before anything is allocated for
    /// them: 4,096 runs of 4 GiB would otherwise ask for 16 TiB.
    #[test]
    fn runs_outside_the_region_are_refused_before_any_allocation() {
        let region = RecoveryRegion::create(1, 4096, Duration::ZERO).expect("region");
        let mut slot = region.take().expect("slot");
        slot.write(0, b"x");
        let sealed = slot.seal();
        let huge = RegionRun {
            len: u32::MAX,
            ..sealed.run(0, 1)
        };
        let piece = shared(&region, &vec![huge; 4096]);
        let error = SharedPieces::new("here".to_string())
            .read(&piece)
            .expect_err("outside the region");
        assert!(
            matches!(&error, SharedReadError::Unreadable(e) if e.contains("outside the region")),
            "{error}"
        );
    }

    #[test]
    fn a_region_with_another_nonce_is_refused() {
        let region = RecoveryRegion::create(1, 4096, Duration::ZERO).expect("region");
        let mut slot = region.take().expect("slot");
        slot.write(0, b"x");
        let sealed = slot.seal();
        let reads = SharedPieces::new("here".to_string());
        let mut piece = shared(&region, &[sealed.run(0, 1)]);
        assert_eq!(reads.read(&piece).expect("reads"), &b"x"[..]);
        piece.nonce ^= 1;
        let error = reads.read(&piece).expect_err("another region");
        assert!(
            matches!(&error, SharedReadError::Unmappable(e) if e.contains("nonce")),
            "{error}"
        );
    }
}
