//! How the replicator's bytes reach a replica's frame: one [`ReplicaTransport`] per
//! transport of DESIGN.md §5 "One-sided writes" (`shm`, `tcp`, `rpc`, `rdma`), the
//! choice among them for a newly opened frame ([`candidates`], pure), and the
//! per-backup resources they share ([`Transports`]: mapped frame files, RDMA links).
//!
//! # Choosing
//! From the backup's `OpenReplica` reply: with no transport forced, `shm` when the
//! backup runs on this host (its frame file is mapped once per backup), else `tcp` (its
//! soft-NIC), else `rpc`. A forced transport that the backup cannot offer is an error
//! (the replica goes elsewhere). `rdma` is used only when forced: one RC connection per
//! backup ([`RdmaLink`]), writing into the frame's slot of the backup's frame file.
//!
//! # Failure
//! Every write returns a [`Failure`] that says how much it loses: the backup
//! (unreachable or dead: every replica on it), the replica only (refused, gone), or
//! everything (`Fenced`: this master is being recovered elsewhere and must stop).
//!
//! `shm` writes cannot notice a dead backup (the frame file outlives its process), so
//! [`ShmBackup`] holds a pidfd of the backup process and the `shm` transport checks
//! after every copy that it is alive; a dead one fails the write. An `shm` copy that
//! finds its frame's slot taken asks the backup why (an empty `WriteReplica`), so a
//! zombie master learns it was fenced rather than re-creating the replica.

use bytes::Bytes;
use futures::future::BoxFuture;
use rampart_common::ids::{Epoch, FrameHandle, ServerId};
use rampart_common::onesided::nic::NicClient;
use rampart_common::onesided::shm::ShmMapping;
use rampart_common::onesided::{FrameWriteError, TransportKind};
use rampart_common::protocol::backup::{OpenReplicaReply, WriteReplica, WriteReplicaRequest};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::status::Status;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::rdma_link::{RdmaFrame, RdmaLink};

/// What a failed replica operation means.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The backup is unreachable or dead: every replica on it is lost.
    Backup(String),
    /// Only this replica is unusable (refused, gone, full).
    Replica(String),
    /// Fenced: never acknowledge.
    Fenced,
}

/// What an RPC error to a backup loses.
pub(crate) fn classify_rpc(error: &RpcError) -> Failure {
    match error {
        RpcError::Status {
            status: Status::Fenced,
            ..
        } => Failure::Fenced,
        error if error.is_transport() => Failure::Backup(error.to_string()),
        error => Failure::Replica(error.to_string()),
    }
}

/// What a failed one-sided write loses.
pub(crate) fn classify_write(error: FrameWriteError) -> Failure {
    match error {
        FrameWriteError::Fenced | FrameWriteError::Refused(Status::Fenced) => Failure::Fenced,
        FrameWriteError::Transport(detail) => Failure::Backup(detail),
        other => Failure::Replica(other.to_string()),
    }
}

/// Writes bytes into one replica's frame on its backup.
pub(crate) trait ReplicaTransport: Send + Sync + std::fmt::Debug {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Places `bytes` at `offset` of frame `handle`, held at `epoch` by the backup;
    /// returns once the transport reports them in the frame (DESIGN.md §5: that is the
    /// replication point, not the disk).
    fn write(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u32,
        bytes: Bytes,
    ) -> BoxFuture<'_, Result<(), Failure>>;
}

/// A backup's same-host frame file, mapped, and the liveness of its process.
pub(crate) struct ShmBackup {
    map: ShmMapping,
    /// Readable once the backup process has exited; `None` when pidfds are unsupported
    /// (then `kill(pid, 0)` is used).
    pidfd: Option<OwnedFd>,
    pid: i32,
}

impl ShmBackup {
    /// Maps the frame file at `path` of the backup process `pid`; an error when either
    /// is gone.
    pub(crate) fn open(path: &str, pid: u32) -> std::io::Result<ShmBackup> {
        let map = ShmMapping::open(std::path::Path::new(path))?;
        let pid = i32::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = match i32::try_from(fd) {
            // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
            Ok(fd) if fd >= 0 => Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            _ => None,
        };
        let backup = ShmBackup { map, pidfd, pid };
        if !backup.alive() {
            return Err(std::io::Error::other("backup process is not running"));
        }
        Ok(backup)
    }

    /// Whether the backup process still runs.
    pub(crate) fn alive(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut poll = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                loop {
                    // SAFETY: one valid pollfd, zero timeout.
                    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
                    if ready >= 0 {
                        // Readable (1) once the process has exited.
                        return ready == 0;
                    }
                    if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                        // Cannot tell: count it dead (a spurious re-replication is
                        // safe; acknowledging into a dead backup's file is not).
                        return false;
                    }
                }
            }
            // SAFETY: signal 0 only checks that the process exists.
            None => (unsafe { libc::kill(self.pid, 0) }) == 0,
        }
    }
}

impl std::fmt::Debug for ShmBackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmBackup").field("pid", &self.pid).finish()
    }
}

/// `shm`: a copy into the backup's mapped frame file, then a liveness check.
#[derive(Debug)]
struct ShmTransport {
    backup: Arc<ShmBackup>,
    slot_offset: u64,
    slot_capacity: u32,
    /// To ask the backup why a frame left its slot.
    pool: Arc<RpcPool>,
    addr: String,
}

impl ReplicaTransport for ShmTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn write(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u32,
        bytes: Bytes,
    ) -> BoxFuture<'_, Result<(), Failure>> {
        Box::pin(async move {
            let written = self.backup.map.write(
                self.slot_offset,
                self.slot_capacity,
                handle,
                u64::from(offset),
                &bytes,
            );
            match written {
                Ok(()) => {}
                // The slot changed hands: the frame was closed, freed or replaced — or
                // freed when this master's recovery ended, which must stop it. Only the
                // backup knows which: ask it (no bytes move).
                Err(FrameWriteError::FrameGone) => {
                    return Err(ask_why_gone(&self.pool, &self.addr, handle, epoch).await)
                }
                Err(error) => return Err(classify_write(error)),
            }
            if !self.backup.alive() {
                return Err(Failure::Backup(format!(
                    "backup process {} exited",
                    self.backup.pid
                )));
            }
            Ok(())
        })
    }
}

/// Why frame `handle` left its slot, as its backup at `addr` answers an empty
/// `WriteReplica`: `Fenced` (a recovered master's frame) stops the master; anything else
/// loses the replica.
async fn ask_why_gone(pool: &RpcPool, addr: &str, handle: FrameHandle, epoch: Epoch) -> Failure {
    let request = WriteReplicaRequest {
        handle,
        epoch,
        offset: 0,
        bytes: Bytes::new(),
    };
    let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
    match pool.call::<WriteReplica>(addr, &request, deadline).await {
        Ok(()) => Failure::Replica(format!("frame {handle} left its shared-memory slot")),
        Err(error) => classify_rpc(&error),
    }
}

/// `tcp`: a write through the backup's soft-NIC.
#[derive(Debug)]
struct NicTransport {
    nic: Arc<NicClient>,
    /// The soft-NIC's address.
    addr: String,
}

impl ReplicaTransport for NicTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn write(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u32,
        bytes: Bytes,
    ) -> BoxFuture<'_, Result<(), Failure>> {
        Box::pin(async move {
            self.nic
                .write(
                    &self.addr,
                    handle,
                    epoch,
                    u64::from(offset),
                    &bytes,
                    REPLICA_IO_TIMEOUT,
                )
                .await
                .map_err(classify_write)
        })
    }
}

/// `rpc`: a `WriteReplica` RPC, which the backup's CPU serves.
#[derive(Debug)]
struct RpcTransport {
    pool: Arc<RpcPool>,
    addr: String,
}

impl ReplicaTransport for RpcTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Rpc
    }

    fn write(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u32,
        bytes: Bytes,
    ) -> BoxFuture<'_, Result<(), Failure>> {
        Box::pin(async move {
            let request = WriteReplicaRequest {
                handle,
                epoch,
                offset,
                bytes,
            };
            let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
            self.pool
                .call::<WriteReplica>(&self.addr, &request, deadline)
                .await
                .map_err(|e| classify_rpc(&e))
        })
    }
}

/// `rdma`: RDMA WRITEs into the frame's slot of the backup's registered frame file.
#[derive(Debug)]
struct RdmaTransport {
    link: Arc<RdmaLink>,
    pool: Arc<RpcPool>,
    slot_offset: u64,
    slot_capacity: u32,
}

impl ReplicaTransport for RdmaTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn write(
        &self,
        handle: FrameHandle,
        epoch: Epoch,
        offset: u32,
        bytes: Bytes,
    ) -> BoxFuture<'_, Result<(), Failure>> {
        Box::pin(async move {
            let frame = RdmaFrame {
                handle,
                epoch,
                slot_offset: self.slot_offset,
                slot_capacity: self.slot_capacity,
            };
            self.link
                .write(&self.pool, &frame, u64::from(offset), bytes)
                .await
                .map_err(classify_write)
        })
    }
}

/// Deadline of one replication RPC or soft-NIC write.
pub const REPLICA_IO_TIMEOUT: Duration = Duration::from_secs(2);

/// A way to reach a newly opened frame, from its `OpenReplica` reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// Map `path` (the frame file of backup process `pid` on this host).
    Shm {
        path: String,
        pid: u32,
        slot_offset: u64,
        slot_capacity: u32,
    },
    /// The soft-NIC at this address.
    Tcp(String),
    /// `WriteReplica` RPCs.
    Rpc,
    /// The frame's slot, over this backup's RDMA link.
    Rdma {
        slot_offset: u64,
        slot_capacity: u32,
    },
}

/// The transports that may reach the frame of `reply`, best first, for a replicator on
/// host `host` that wants `want` (`None`: any). A candidate that cannot be set up (a
/// frame file that will not map) gives way to the next; an empty list is never
/// returned: `Err` says why no transport fits.
pub(crate) fn candidates(
    reply: &OpenReplicaReply,
    want: Option<TransportKind>,
    host: &str,
) -> Result<Vec<Candidate>, String> {
    if want == Some(TransportKind::Rdma) {
        let shm = reply
            .shm
            .as_ref()
            .ok_or("the backup reports no frame slot to write by RDMA")?;
        return Ok(vec![Candidate::Rdma {
            slot_offset: shm.slot_offset,
            slot_capacity: shm.slot_capacity,
        }]);
    }
    let mut found = Vec::new();
    if matches!(want, None | Some(TransportKind::Shm)) {
        match reply.shm.as_ref().filter(|shm| shm.host == host) {
            Some(shm) => found.push(Candidate::Shm {
                path: shm.path.clone(),
                pid: shm.pid,
                slot_offset: shm.slot_offset,
                slot_capacity: shm.slot_capacity,
            }),
            None if want.is_some() => {
                return Err("the backup offers no shared-memory frames on this host".into())
            }
            None => {}
        }
    }
    if matches!(want, None | Some(TransportKind::Tcp)) {
        match &reply.nic {
            Some(nic) => found.push(Candidate::Tcp(nic.clone())),
            None if want.is_some() => return Err("the backup offers no soft-NIC".into()),
            None => {}
        }
    }
    if matches!(want, None | Some(TransportKind::Rpc)) {
        found.push(Candidate::Rpc);
    }
    Ok(found)
}

/// The transports of one replicator and what they share across replicas: mapped frame
/// files (one per backup process) and RDMA links (one per backup).
pub(crate) struct Transports {
    own: ServerId,
    /// The transport every replica must use; `None` picks per backup.
    want: Option<TransportKind>,
    /// This host's identity (`onesided::host_id`).
    host: String,
    pool: Arc<RpcPool>,
    nic: Arc<NicClient>,
    shm: HashMap<(String, u32), Arc<ShmBackup>>,
    rdma: HashMap<String, Arc<RdmaLink>>,
}

impl std::fmt::Debug for Transports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transports")
            .field("want", &self.want)
            .field("shm", &self.shm.len())
            .field("rdma", &self.rdma.len())
            .finish()
    }
}

impl Transports {
    /// The transports of the master `own` on host `host`, sending RPCs through `pool`.
    pub(crate) fn new(
        own: ServerId,
        want: Option<TransportKind>,
        host: String,
        pool: Arc<RpcPool>,
    ) -> Transports {
        Transports {
            own,
            want,
            host,
            pool,
            nic: Arc::new(NicClient::new()),
            shm: HashMap::new(),
            rdma: HashMap::new(),
        }
    }

    /// How to write into the frame the backup at `addr` opened (`reply`).
    pub(crate) async fn open(
        &mut self,
        addr: &str,
        reply: &OpenReplicaReply,
    ) -> Result<Arc<dyn ReplicaTransport>, Failure> {
        let candidates = candidates(reply, self.want, &self.host).map_err(Failure::Replica)?;
        for candidate in candidates {
            match candidate {
                Candidate::Shm {
                    path,
                    pid,
                    slot_offset,
                    slot_capacity,
                } => {
                    let backup = match self.shm_backup(&path, pid) {
                        Ok(backup) => backup,
                        Err(error) if self.want.is_some() => {
                            return Err(Failure::Replica(format!(
                                "cannot map frame file {path}: {error}"
                            )))
                        }
                        Err(error) => {
                            tracing::debug!(%path, %error, "frame file not mappable; not using shm");
                            continue;
                        }
                    };
                    return Ok(Arc::new(ShmTransport {
                        backup,
                        slot_offset,
                        slot_capacity,
                        pool: Arc::clone(&self.pool),
                        addr: addr.to_string(),
                    }));
                }
                Candidate::Tcp(nic) => {
                    return Ok(Arc::new(NicTransport {
                        nic: Arc::clone(&self.nic),
                        addr: nic,
                    }))
                }
                Candidate::Rpc => {
                    return Ok(Arc::new(RpcTransport {
                        pool: Arc::clone(&self.pool),
                        addr: addr.to_string(),
                    }))
                }
                Candidate::Rdma {
                    slot_offset,
                    slot_capacity,
                } => {
                    return Ok(Arc::new(RdmaTransport {
                        link: self.rdma_link(addr).await?,
                        pool: Arc::clone(&self.pool),
                        slot_offset,
                        slot_capacity,
                    }))
                }
            }
        }
        Err(Failure::Replica(
            "no transport reaches the backup's frame".into(),
        ))
    }

    /// The mapped frame file of backup process `pid`, mapped on first use (and again
    /// once the process it was mapped for has exited).
    fn shm_backup(&mut self, path: &str, pid: u32) -> std::io::Result<Arc<ShmBackup>> {
        let key = (path.to_string(), pid);
        if let Some(backup) = self.shm.get(&key).filter(|b| b.alive()) {
            return Ok(Arc::clone(backup));
        }
        let backup = Arc::new(ShmBackup::open(path, pid)?);
        self.shm.insert(key, Arc::clone(&backup));
        Ok(backup)
    }

    /// The RDMA connection to the backup at `addr`, made on first use (and again after
    /// it broke).
    async fn rdma_link(&mut self, addr: &str) -> Result<Arc<RdmaLink>, Failure> {
        if let Some(link) = self.rdma.get(addr).filter(|l| !l.is_broken()) {
            return Ok(Arc::clone(link));
        }
        let deadline = Instant::now() + REPLICA_IO_TIMEOUT;
        let link = RdmaLink::connect(&self.pool, addr, self.own, deadline)
            .await
            .map_err(|error| {
                if error.contains("Fenced") || error.contains("fenced") {
                    Failure::Fenced
                } else {
                    Failure::Replica(format!("RDMA connection failed: {error}"))
                }
            })?;
        let link = Arc::new(link);
        self.rdma.insert(addr.to_string(), Arc::clone(&link));
        Ok(link)
    }

    /// Unmaps the frame files of backups that exited (each pins its file's memory) and
    /// drops broken RDMA links.
    pub(crate) fn forget_dead(&mut self) {
        self.shm.retain(|_, shm| shm.alive());
        self.rdma.retain(|_, link| !link.is_broken());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::protocol::backup::ShmFrame;

    fn reply(host: Option<&str>, nic: bool) -> OpenReplicaReply {
        OpenReplicaReply {
            handle: FrameHandle(9),
            shm: host.map(|host| ShmFrame {
                host: host.into(),
                path: "/dev/shm/frames".into(),
                slot_offset: 4096,
                slot_capacity: 1024,
                pid: 77,
            }),
            nic: nic.then(|| "10.0.0.2:7000".to_string()),
        }
    }

    fn shm() -> Candidate {
        Candidate::Shm {
            path: "/dev/shm/frames".into(),
            pid: 77,
            slot_offset: 4096,
            slot_capacity: 1024,
        }
    }

    #[test]
    fn unforced_prefers_shared_memory_on_this_host_then_the_soft_nic_then_rpc() {
        let nic = Candidate::Tcp("10.0.0.2:7000".into());
        assert_eq!(
            candidates(&reply(Some("here"), true), None, "here"),
            Ok(vec![shm(), nic.clone(), Candidate::Rpc])
        );
        assert_eq!(
            candidates(&reply(Some("there"), true), None, "here"),
            Ok(vec![nic, Candidate::Rpc])
        );
        assert_eq!(
            candidates(&reply(None, false), None, "here"),
            Ok(vec![Candidate::Rpc])
        );
    }

    #[test]
    fn a_forced_transport_is_the_only_candidate_or_an_error() {
        let here = reply(Some("here"), true);
        assert_eq!(
            candidates(&here, Some(TransportKind::Shm), "here"),
            Ok(vec![shm()])
        );
        assert!(candidates(&here, Some(TransportKind::Shm), "elsewhere").is_err());
        assert_eq!(
            candidates(&here, Some(TransportKind::Tcp), "here"),
            Ok(vec![Candidate::Tcp("10.0.0.2:7000".into())])
        );
        assert!(candidates(&reply(None, false), Some(TransportKind::Tcp), "here").is_err());
        assert_eq!(
            candidates(&here, Some(TransportKind::Rpc), "here"),
            Ok(vec![Candidate::Rpc])
        );
        // RDMA writes into the frame's slot wherever the backup runs.
        assert_eq!(
            candidates(&here, Some(TransportKind::Rdma), "elsewhere"),
            Ok(vec![Candidate::Rdma {
                slot_offset: 4096,
                slot_capacity: 1024
            }])
        );
        assert!(candidates(&reply(None, true), Some(TransportKind::Rdma), "here").is_err());
    }
}
