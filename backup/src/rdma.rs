//! `RdmaTarget`: the backup's side of the `rdma` transport (docs/design.md §5 "One-sided
//! writes", "Fencing"): the queue pairs masters connect with `RdmaConnect`, and the
//! registrations of the frame file that their RDMA WRITEs land in.
//!
//! For callers (the [`BackupService`](crate::service::BackupService)) it is three calls:
//! [`RdmaTarget::new`] at start-up, [`RdmaTarget::connect`] for an `RdmaConnect` request,
//! and [`RdmaTarget::revoke`] from `fence_master`. It hides the verbs objects, the second
//! mapping of the frame file, and the bookkeeping of which master holds which key.
//!
//! # One region per master
//! Each connected master gets its own RC queue pair and its own registration of the
//! *whole* frame file (`RdmaRegion`): a master addresses a frame by the `slot_offset` of
//! its `OpenReplica` reply, exactly as `shm` does, so connecting costs one RPC per
//! (master, backup) and none per frame. Separate registrations of the same memory carry
//! separate rkeys, so fencing one master revokes its key only. A second `RdmaConnect` of
//! the same master replaces its queue pair and region (the old key is revoked).
//!
//! The bytes the NIC writes are the frame file's bytes, read by the backup's scans and
//! closes through [`FrameFile`](rampart_common::onesided::shm::FrameFile). `FrameFile`
//! does not expose its mapping, so this module maps the file a second time
//! ([`DeviceMapping`](rampart_common::onesided::shm::DeviceMapping), opened at start-up
//! while the backup holds the file's lock): two shared mappings of one file share its
//! page-cache pages, so a byte the NIC places through this mapping is the byte the frame
//! file reads. Nothing here ever reads or writes through the second mapping; it exists
//! only to be registered.
//!
//! # Guarantees
//! 1. After [`RdmaTarget::revoke`] returns, no RDMA WRITE of that master lands in the
//!    frame file, and every write the master's NIC saw acknowledged is in memory:
//!    deregistering a region invalidates its key in the NIC (later packets are refused
//!    with a remote access error) and returns only once that took effect, after the
//!    data of earlier writes reached memory. `fence_master` calls it after marking the
//!    master's frames fenced and before scanning them, so a write is either seen by the
//!    scan or fails at the master's NIC — and the master, asking whether the frame is
//!    fenced after the failure, is told `Fenced`.
//! 2. A master once fenced never gets a key again (`RdmaConnect` answers `Fenced`): an
//!    RDMA WRITE does not look at the slot's fence word, so a new key would let a
//!    fenced master's writes be acknowledged. Server ids are never reused, so this
//!    refuses only the master being recovered.
//! 3. Where the build has no `rdma` feature, or the host no RDMA device, `RdmaConnect`
//!    answers `InvalidArgument` with the plain reason of
//!    [`rdma_available`](rampart_common::onesided::rdma::rdma_available).
//!
//! # Concurrency
//! One mutex (`RdmaTarget::inner`) over the device, the links and the fenced masters,
//! never held across `.await`. Registering a region (it pins the whole frame file, ms
//! per GiB) happens outside it; a region is only ever *published* (inserted) and
//! *dropped* (deregistered) under it, so when `revoke` releases the mutex no key of
//! that master is valid. `connect` and `revoke` block (verbs calls): callers run them
//! on blocking threads.
//!
//! # Costs and limits (read before deploying)
//! * Registration pins every page of the frame file: the file becomes resident
//!   (every slot: `frames_max` + `extra_slots`, × slot size) and counts against `RLIMIT_MEMLOCK` (raise it, or give
//!   the backup `CAP_IPC_LOCK`). Further masters' regions pin the same pages again.
//! * Long-term pins of file pages are refused by Linux (6.5 and later) unless the file is
//!   on a memory file system: keep `--frame-file` on tmpfs (`/dev/shm`) with `rdma`.
//! * A pin holds the *physical* pages the file had when the region was registered. The
//!   frame file never gives a slot's memory back to the kernel (it is allocated at
//!   creation and slots are zeroed in place), so the pinned pages stay the file's.

#[cfg(feature = "rdma")]
pub(crate) use verbs::RdmaTarget;

#[cfg(not(feature = "rdma"))]
pub(crate) use no_rdma::RdmaTarget;

#[cfg(not(feature = "rdma"))]
mod no_rdma {
    use rampart_common::ids::ServerId;
    use rampart_common::onesided::rdma::NO_FEATURE_MESSAGE;
    use rampart_common::protocol::backup::{RdmaConnectReply, RdmaConnectRequest};
    use rampart_common::rpc::Reply;
    use rampart_common::status::Status;
    use std::io;
    use std::path::Path;

    /// A build without the `rdma` feature: every connect is refused plainly.
    #[derive(Debug)]
    pub(crate) struct RdmaTarget;

    impl RdmaTarget {
        /// Nothing to prepare without the feature.
        pub(crate) fn new(_frame_file: &Path, _frame_file_bytes: u64) -> io::Result<RdmaTarget> {
            Ok(RdmaTarget)
        }

        /// `InvalidArgument`: this build has no RDMA support.
        pub(crate) fn connect(
            &self,
            _request: &RdmaConnectRequest,
        ) -> Result<RdmaConnectReply, Reply> {
            Err(Reply::error(Status::InvalidArgument, NO_FEATURE_MESSAGE))
        }

        /// No master can hold a key: nothing to revoke.
        pub(crate) fn revoke(&self, _master: ServerId) {}
    }
}

#[cfg(feature = "rdma")]
mod verbs {
    use parking_lot::Mutex;
    use rampart_common::ids::ServerId;
    use rampart_common::onesided::rdma::{RdmaDevice, RdmaQueuePair, RdmaRegion};
    use rampart_common::onesided::shm::DeviceMapping;
    use rampart_common::protocol::backup::{RdmaConnectReply, RdmaConnectRequest};
    use rampart_common::rpc::Reply;
    use rampart_common::status::Status;
    use std::collections::{HashMap, HashSet};
    use std::io;
    use std::path::Path;
    use std::sync::Arc;

    /// The backup's RDMA state; see the module doc.
    #[derive(Debug)]
    pub(crate) struct RdmaTarget {
        /// The second mapping of the frame file, registered once per connected master.
        mapping: Arc<DeviceMapping>,
        inner: Mutex<Inner>,
    }

    /// What `RdmaTarget::inner` guards.
    #[derive(Debug)]
    struct Inner {
        /// Opened by the first `connect` that needs it; a failed open is not remembered
        /// (a device configured later is found by the next connect).
        device: Option<RdmaDevice>,
        /// The connected masters. Invariants: 1. at most one link (hence one valid
        /// rkey) per master; 2. a link leaves this map only to be dropped while the
        /// mutex is still held; 3. no key of a master in `fenced`.
        links: HashMap<ServerId, MasterLink>,
        /// Masters whose frames were fenced: refused for the life of the backup (module
        /// doc, guarantee 2). One entry per recovered master.
        fenced: HashSet<ServerId>,
    }

    /// One master's connection. Field order is drop order: the region (its key revoked)
    /// before the queue pair, both before the mapping they name.
    #[derive(Debug)]
    struct MasterLink {
        /// Held for its `Drop`, which revokes the key.
        _region: RdmaRegion,
        /// The backup's end of the RC connection; it only receives (RDMA WRITEs need
        /// no work from the responder's CPU), but must live for them to be accepted.
        _queue_pair: RdmaQueuePair,
        _mapping: Arc<DeviceMapping>,
    }

    impl RdmaTarget {
        /// Opens the frame file at `frame_file` (which must be `frame_file_bytes` long:
        /// the file the backup just created and holds locked) and maps it a second time.
        /// No RDMA device is needed yet.
        pub(crate) fn new(frame_file: &Path, frame_file_bytes: u64) -> io::Result<RdmaTarget> {
            Ok(RdmaTarget {
                mapping: Arc::new(DeviceMapping::open(frame_file, frame_file_bytes)?),
                inner: Mutex::new(Inner {
                    device: None,
                    links: HashMap::new(),
                    fenced: HashSet::new(),
                }),
            })
        }

        /// Serves `RdmaConnect`: a queue pair connected to the master's, and a fresh
        /// registration of the frame file for it (replacing any earlier one). Blocks
        /// for the verbs calls (the registration pins the whole file).
        pub(crate) fn connect(
            &self,
            request: &RdmaConnectRequest,
        ) -> Result<RdmaConnectReply, Reply> {
            let master = request.master;
            let device = {
                let mut inner = self.inner.lock();
                if inner.fenced.contains(&master) {
                    return Err(fenced_reply(master));
                }
                match &inner.device {
                    Some(device) => device.clone(),
                    None => {
                        // The same text as `rdma_available`: the plain reason.
                        let device = RdmaDevice::open(None)
                            .map_err(|error| Reply::error(Status::InvalidArgument, error))?;
                        tracing::info!(device = device.name(), "RDMA device opened");
                        inner.device = Some(device.clone());
                        device
                    }
                }
            };
            let verbs_failed =
                |error| Reply::error(Status::Internal, format!("RDMA connect failed: {error}"));
            let mut queue_pair = device.create_queue_pair().map_err(verbs_failed)?;
            queue_pair
                .connect(&request.endpoint)
                .map_err(verbs_failed)?;
            // SAFETY: the range is exactly `self.mapping`, a live read-write
            // `MAP_SHARED` mapping that the link below keeps alive (`_mapping`, dropped
            // after `region`). Peer writes into it are expected: nothing in this process
            // holds Rust references into the frame file's bytes — `FrameFile` reads and
            // writes them only through raw-pointer copies and atomics, and this mapping
            // is never read or written at all.
            let region = unsafe {
                device.register_remote_writable(self.mapping.as_ptr(), self.mapping.bytes())
            }
            .map_err(verbs_failed)?;
            let (region_addr, rkey) = region.remote();
            let reply = RdmaConnectReply {
                endpoint: queue_pair.local_endpoint(),
                region_addr,
                region_bytes: region.len() as u64,
                rkey,
            };
            let link = MasterLink {
                _region: region,
                _queue_pair: queue_pair,
                _mapping: Arc::clone(&self.mapping),
            };
            let mut inner = self.inner.lock();
            if inner.fenced.contains(&master) {
                // Fenced while registering: the key was never sent; revoke it now.
                drop(link);
                drop(inner);
                return Err(fenced_reply(master));
            }
            let replaced = inner.links.insert(master, link);
            // Under the mutex (invariant 2): a `revoke` waiting for it must find no key
            // of this master still valid.
            drop(replaced);
            drop(inner);
            tracing::info!(%master, qpn = reply.endpoint.qpn, "RDMA connection accepted");
            Ok(reply)
        }

        /// Revokes `master`'s key (its region is deregistered before this returns) and
        /// refuses its later connects. Call it before scanning the master's frames.
        /// Blocks for the deregistration; idempotent.
        pub(crate) fn revoke(&self, master: ServerId) {
            let mut inner = self.inner.lock();
            inner.fenced.insert(master);
            if let Some(link) = inner.links.remove(&master) {
                // Under the mutex (invariant 2).
                drop(link);
                tracing::info!(%master, "RDMA key revoked");
            }
        }
    }

    fn fenced_reply(master: ServerId) -> Reply {
        Reply::error(
            Status::Fenced,
            format!("master {master} is fenced: recovery of it has begun"),
        )
    }
}
