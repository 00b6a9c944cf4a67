//! One-sided writes into backup frames (docs/design.md §5 "One-sided writes").
//!
//! A backup registers *frames*: segment-sized, zeroed buffers, one per open replica,
//! held in slots of a shared-memory *frame file* ([`shm::FrameFile`]). `OpenReplica`
//! and `CloseReplica` are RPCs; between them the master moves bytes into the frame by
//! one of these transports ([`TransportKind`]):
//!
//! * `shm` ([`shm`]) — same host: the master maps the backup's frame file
//!   ([`shm::ShmMapping`]) and copies bytes in. The backup's CPU does nothing per write.
//! * `tcp` ([`nic`]) — across hosts: a small soft-NIC task on the backup places
//!   (frame, offset, bytes) into the frame and acknowledges, without parsing the bytes.
//! * `rpc` — the classic baseline: a `WriteReplica` RPC whose handler copies the bytes.
//!   Kept to measure what one-sided writes gain.
//! * `rdma` — cargo feature `rdma`, verbs through `rdma-sys` (see `rdma`).
//!
//! # Write ordering (Tailwind)
//! Every write copies all but its last [`TAIL_BYTES`] bytes, issues a fence, then copies
//! the tail: a batch ends with its `Checksum` entry, so a reader that sees the checksum
//! also sees the entries before it.
//!
//! # Fencing
//! Each slot starts with a header holding a *fence word* and the *owner* (the handle of
//! the frame the slot currently holds). A backup fences a frame by storing a non-zero
//! fence word, then a SeqCst fence, *before* it scans the frame. A writer copies its
//! bytes, then a SeqCst fence, then reads the fence word and the owner; it reports
//! success only if the frame was neither fenced nor handed to another replica. This is
//! Dekker's pattern: either the scan sees the write, or the writer sees the fence and the
//! write is never acknowledged.

pub mod nic;
pub mod rdma;
pub mod shm;

use std::fmt;
use std::str::FromStr;

/// Bytes copied last, after a fence: the size of a `Checksum` log entry (type, length,
/// CRC32).
pub const TAIL_BYTES: usize = crate::log::entry::CHECKSUM_ENTRY_BYTES;

/// How a master moves replica bytes into backup frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Copy into the backup's shared-memory frame file (same host only).
    Shm,
    /// The backup's soft-NIC over TCP.
    Tcp,
    /// `WriteReplica` RPCs handled by the backup's CPU (the baseline).
    Rpc,
    /// RDMA WRITE over an RC queue pair (cargo feature `rdma`).
    Rdma,
}

impl TransportKind {
    /// Every kind, in the order of [`fmt::Display`] names: shm, tcp, rpc, rdma.
    pub const ALL: [TransportKind; 4] = [
        TransportKind::Shm,
        TransportKind::Tcp,
        TransportKind::Rpc,
        TransportKind::Rdma,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
            TransportKind::Rpc => "rpc",
            TransportKind::Rdma => "rdma",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown transport name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown replication transport {0:?} (expected shm, tcp, rpc or rdma)")]
pub struct UnknownTransport(pub String);

impl FromStr for TransportKind {
    type Err = UnknownTransport;

    fn from_str(s: &str) -> Result<TransportKind, UnknownTransport> {
        TransportKind::ALL
            .into_iter()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| UnknownTransport(s.to_string()))
    }
}

/// Why a one-sided write was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum FrameWriteError {
    /// The frame was fenced (its master is being recovered): never acknowledge.
    #[error("frame fenced by its backup")]
    Fenced,
    /// The slot no longer holds this frame (closed, freed or replaced).
    #[error("the frame was closed, freed or replaced")]
    FrameGone,
    /// The write does not fit in the frame.
    #[error("write of {len} bytes at offset {offset} passes the frame's end ({capacity} bytes)")]
    OutOfBounds {
        /// Where the write started.
        offset: u64,
        /// Its length.
        len: u64,
        /// The frame's data capacity.
        capacity: u64,
    },
    /// The backup refused the write with this status (soft-NIC, RPC).
    #[error("backup refused the write: {0}")]
    Refused(crate::status::Status),
    /// The transport broke (connection lost, timeout); the write may or may not have
    /// landed.
    #[error("transport failed: {0}")]
    Transport(String),
}

/// This host's identity as `shm` needs it: the kernel's boot id
/// (`/proc/sys/kernel/random/boot_id`, different between machines and between boots)
/// and this process's pid namespace (`/proc/self/ns/pid`). A master uses `shm` towards
/// a backup only when the backup reports the same identity: containers on one machine
/// share the boot id, but a master in another pid namespace could not check the
/// backup's liveness by its pid. Falls back to the host name.
pub fn host_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown-host".to_string());
    match std::fs::read_link("/proc/self/ns/pid") {
        Ok(ns) => format!("{boot}/{}", ns.display()),
        Err(_) => boot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_names_round_trip() {
        for kind in TransportKind::ALL {
            assert_eq!(kind.name().parse::<TransportKind>(), Ok(kind));
        }
        assert!("udp".parse::<TransportKind>().is_err());
    }

    #[test]
    fn host_id_is_stable() {
        assert_eq!(host_id(), host_id());
        assert!(!host_id().is_empty());
    }
}
