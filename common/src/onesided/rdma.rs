//! The `rdma` transport: RDMA WRITE over a reliable-connected (RC) queue pair, through
//! the verbs of `rdma-sys` (docs/design.md §5 "One-sided writes").
//!
//! The verbs part is compiled only with the cargo feature `rdma` (it links libibverbs and
//! needs libibverbs-dev, librdmacm-dev and libclang-dev to build). What every build has:
//!
//! * [`rdma_available`] — whether this process can use RDMA, with a plain reason where it
//!   cannot. `rampart server --replication rdma` calls it at start-up so that a missing
//!   feature or a missing device is one clear line, not a failure at the first write.
//! * [`RdmaEndpoint`] — what one side of a connection tells the other (queue pair number,
//!   LID, GID, first packet sequence number); it travels in an RPC, so the protocol need
//!   not depend on the feature.
//!
//! With the feature (their docs appear in `cargo doc --features rdma`):
//!
//! * `RdmaDevice` — an opened device: its verbs context, a protection domain, and the
//!   attributes of the port used (`PORT_NUM`).
//! * `RdmaRegion` — a registered byte region that peers may write into (the backup side:
//!   the frame file's mapping). It hands out the `(addr, rkey)` pair a master writes to.
//! * `RdmaQueuePair` — an RC queue pair with its own completion queue and a registered
//!   staging buffer; `RdmaQueuePair::connect` takes it INIT→RTR→RTS and
//!   `RdmaQueuePair::write` moves bytes into a remote region and waits until the NIC has
//!   acknowledged them.
//!
//! Connection set-up goes over the ordinary RPC path: each side creates a queue pair,
//! sends its `RdmaQueuePair::local_endpoint`, and connects to the peer's.
//!
//! # Write ordering (Tailwind)
//! The caller writes the body of a batch, then its tail (the last
//! [`TAIL_BYTES`](super::TAIL_BYTES), the `Checksum` entry) as a second
//! `RdmaQueuePair::write`. An RC queue pair executes the RDMA WRITEs of one send queue
//! at the responder in the order they were posted, and `RdmaQueuePair::write` does not
//! return until the NIC acknowledged the body, so the tail is placed after the body: a
//! scan that sees the checksum sees the entries before it. (Within one message the IB
//! specification leaves the placement order of bytes open, which is exactly why the tail
//! travels in a message of its own.)
//!
//! # Failure handling
//! * No device, or a device whose port is not active: `RdmaDevice::open` fails with
//!   `RdmaError::NoDevice` / `RdmaError::PortNotActive`, whose text names the fix.
//! * A write whose work completion fails (the peer deregistered the region, the remote
//!   address is out of range, the retry budget ran out) returns
//!   `RdmaError::WorkCompletion`; a write not completed within
//!   `WRITE_COMPLETION_TIMEOUT_MS` returns `RdmaError::Timeout`. Either way the queue
//!   pair is unusable and every later write returns `RdmaError::Broken`: the caller
//!   reconnects with a new queue pair. The bytes of a failed write may or may not have
//!   landed.
//! * Fencing: the NIC, not the backup's CPU, acknowledges an RDMA WRITE. A backup fences
//!   a frame by dropping its `RdmaRegion` (deregistering it revokes the rkey, so later
//!   writes fail at the NIC) before it scans the frame.
//!
//! # Concurrency
//! `RdmaQueuePair::write` busy-polls its completion queue, so it blocks its thread for
//! about one network round trip (a few µs on a real NIC): call it from a dedicated thread
//! or `spawn_blocking`, not on the async reactor. One write is outstanding per queue
//! pair (it takes `&mut self`); a master keeps one queue pair per backup.

use serde::{Deserialize, Serialize};

/// Why [`rdma_available`] fails in a build without the `rdma` feature.
pub const NO_FEATURE_MESSAGE: &str = "this build has no RDMA support: rebuild with \
     `--features rdma` (needs libibverbs-dev, librdmacm-dev, libclang-dev)";

/// One side of an RC connection, as sent to the peer: the peer's queue pair is
/// connected to this queue pair number on this port address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RdmaEndpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Local identifier of the port (InfiniBand); 0 on RoCE, where the GID routes.
    pub lid: u16,
    /// Global identifier of the port, GID table entry [`GID_INDEX`].
    pub gid: [u8; 16],
    /// First packet sequence number this side sends (24 bits).
    pub psn: u32,
}

/// GID table entry used on both sides. Entry 0 exists on every port (the link-local
/// GID); deployments that route RoCE v2 across subnets would choose another entry.
pub const GID_INDEX: u8 = 0;

/// Whether this process can replicate over RDMA: `Ok` where a device opens and its port
/// is active, otherwise a message for the operator (no feature in this build, no device,
/// port down).
pub fn rdma_available() -> Result<(), String> {
    #[cfg(feature = "rdma")]
    {
        RdmaDevice::open(None).map(drop).map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "rdma"))]
    {
        Err(NO_FEATURE_MESSAGE.to_string())
    }
}

#[cfg(feature = "rdma")]
pub use verbs::{
    RdmaDevice, RdmaError, RdmaQueuePair, RdmaRegion, ACK_TIMEOUT_EXPONENT, PORT_NUM, RETRY_COUNT,
    STAGING_BYTES, WRITE_COMPLETION_TIMEOUT_MS,
};

#[cfg(feature = "rdma")]
mod verbs {
    use super::{RdmaEndpoint, GID_INDEX};
    use rdma_sys::*;
    use std::ffi::{c_int, c_void, CStr};
    use std::fmt;
    use std::io;
    use std::mem::MaybeUninit;
    use std::ptr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Port used on the device. Every RDMA NIC, rxe and siw device has port 1; a
    /// multi-port NIC would need this to become configuration.
    pub const PORT_NUM: u8 = 1;

    /// Size of each queue pair's registered staging buffer: the largest single RDMA WRITE.
    /// Longer writes go out in pieces of this size, one after the other. 1 MiB keeps the
    /// pinned memory per backup connection small while a piece still takes far longer
    /// on the wire than the completion round trip.
    pub const STAGING_BYTES: usize = 1 << 20;

    /// Local ACK timeout of the RC queue pair, as the verbs exponent: 4.096 µs × 2^14 ≈
    /// 67 ms before a packet is retransmitted — long enough for a loaded switch, short
    /// enough that a dead peer is noticed within a second.
    pub const ACK_TIMEOUT_EXPONENT: u8 = 14;

    /// Retransmissions before the NIC fails a work request with `RETRY_EXC_ERR` (the
    /// verbs maximum).
    pub const RETRY_COUNT: u8 = 7;

    /// How long [`RdmaQueuePair::write`] busy-polls for a completion. It exceeds the NIC's
    /// own retry budget (checked below), so a dead peer normally shows up as a failed
    /// work completion with its reason; the timeout catches a NIC that reports nothing.
    pub const WRITE_COMPLETION_TIMEOUT_MS: u64 = 2_000;

    /// The NIC gives up after `RETRY_COUNT + 1` ACK timeouts of 4.096 µs × 2^exponent.
    const NIC_RETRY_BUDGET_MS: u64 =
        (4_096u64 << ACK_TIMEOUT_EXPONENT) * (RETRY_COUNT as u64 + 1) / 1_000_000;
    const _: () = assert!(NIC_RETRY_BUDGET_MS < WRITE_COMPLETION_TIMEOUT_MS);
    const _: () = assert!(STAGING_BYTES <= u32::MAX as usize);

    /// Work requests a queue pair's send queue holds. One write is outstanding at a time;
    /// the spare entries cost nothing and keep providers that round up happy.
    const SEND_QUEUE_DEPTH: u32 = 16;

    /// Completion queue entries: room for every send queue entry plus the receive entry.
    const CQ_DEPTH: c_int = 32;

    /// Minimum RNR NAK timer (verbs code 12 = 0.64 ms). RDMA WRITE never waits for a
    /// receive buffer, so this only has to be valid.
    const MIN_RNR_TIMER: u8 = 12;

    /// Hop limit of the GRH on routed (RoCE) connections.
    const GRH_HOP_LIMIT: u8 = 64;

    /// `link_layer` value of an Ethernet (RoCE, rxe, siw) port in `ibv_port_attr`.
    const LINK_LAYER_ETHERNET: u8 = 2;

    /// Why an RDMA operation failed.
    #[derive(Debug, thiserror::Error)]
    pub enum RdmaError {
        /// libibverbs found no RDMA device on this host.
        #[error(
            "no RDMA device found: ibv_get_device_list returned none (is an RDMA NIC, rxe or \
             siw configured?); use --replication shm or tcp"
        )]
        NoDevice,
        /// A device was asked for by name and is not there.
        #[error("RDMA device {name:?} not found (devices present: {available})")]
        DeviceNotFound {
            /// The name asked for.
            name: String,
            /// The names present, comma-separated.
            available: String,
        },
        /// The device's port [`PORT_NUM`] is not ACTIVE (cable, link or subnet manager).
        #[error(
            "RDMA device {device} port {port} is not active (state {state}); check the link \
             (ibv_devinfo) or use --replication shm or tcp"
        )]
        PortNotActive {
            /// Device name.
            device: String,
            /// Port number.
            port: u8,
            /// The port state's name.
            state: &'static str,
        },
        /// A verbs call failed with this OS error.
        #[error("{call} failed on RDMA device {device}: {source}")]
        Verbs {
            /// The verbs function.
            call: &'static str,
            /// Device name.
            device: String,
            /// The errno it reported.
            source: io::Error,
        },
        /// The remote range of a write wraps around the address space.
        #[error("remote range of {len} bytes at {addr:#x} wraps around the address space")]
        BadRemoteRange {
            /// Remote start address.
            addr: u64,
            /// Length of the write.
            len: usize,
        },
        /// The NIC completed the write with an error; the queue pair is now in error.
        #[error("RDMA write failed: {status_text} (work completion status {status}, vendor error {vendor_err:#x})")]
        WorkCompletion {
            /// `ibv_wc_status` code.
            status: u32,
            /// Its text from `ibv_wc_status_str`.
            status_text: String,
            /// The provider's own error code.
            vendor_err: u32,
        },
        /// No completion arrived in time; the queue pair is no longer used.
        #[error("RDMA write not completed within {waited_ms} ms")]
        Timeout {
            /// How long the write waited.
            waited_ms: u64,
        },
        /// An earlier write failed, leaving the queue pair in error; connect a new one.
        #[error("RDMA queue pair is unusable after an earlier failure; reconnect")]
        Broken,
        /// [`RdmaQueuePair::write`] before [`RdmaQueuePair::connect`] succeeded.
        #[error("RDMA queue pair is not connected")]
        NotConnected,
    }

    /// The verbs objects every region and queue pair of a device depends on. Held in an
    /// `Arc` by each of them, so the protection domain and the context outlive every
    /// memory region and queue pair made from them (verbs refuses to free a PD in use).
    struct DeviceInner {
        /// Device name (`mlx5_0`, `rxe0`), for messages.
        name: String,
        /// Opened verbs context; closed last.
        context: *mut ibv_context,
        /// Protection domain of every region and queue pair of this device.
        pd: *mut ibv_pd,
        /// Port attributes read at open: the LID and MTU used by every queue pair.
        lid: u16,
        /// The active MTU of the port, used as the path MTU (peers on one fabric share it).
        active_mtu: ibv_mtu::Type,
        /// Whether the port is Ethernet (RoCE, rxe, siw): then the GRH is required.
        ethernet: bool,
        /// GID table entry [`GID_INDEX`] of the port.
        gid: [u8; 16],
    }

    // SAFETY: libibverbs objects may be used from any thread and its calls are
    // thread-safe (rdma-core documents verbs as thread-safe except for a CQ polled by
    // several threads at once, which no type here allows). The pointers are only
    // freed in `Drop`, which runs once, after every user (`Arc`).
    unsafe impl Send for DeviceInner {}
    // SAFETY: as above; shared use only passes the pointers to thread-safe verbs calls.
    unsafe impl Sync for DeviceInner {}

    impl DeviceInner {
        fn verbs_error(&self, call: &'static str, source: io::Error) -> RdmaError {
            RdmaError::Verbs {
                call,
                device: self.name.clone(),
                source,
            }
        }
    }

    impl Drop for DeviceInner {
        fn drop(&mut self) {
            // SAFETY: `pd` and `context` came from `ibv_alloc_pd` / `ibv_open_device`, are
            // freed only here, and every region and queue pair made from them holds an
            // `Arc` to this value, so none is left when this runs. PD before context.
            unsafe {
                ibv_dealloc_pd(self.pd);
                ibv_close_device(self.context);
            }
        }
    }

    /// An opened RDMA device: verbs context, protection domain and port attributes.
    ///
    /// Cheap to clone; regions and queue pairs keep the device open while they live.
    /// (Completion queues belong to each [`RdmaQueuePair`] rather than to the device, so
    /// that one queue pair's busy-poll never consumes another's completions.)
    #[derive(Clone)]
    pub struct RdmaDevice {
        inner: Arc<DeviceInner>,
    }

    impl fmt::Debug for RdmaDevice {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("RdmaDevice")
                .field("name", &self.inner.name)
                .field("lid", &self.inner.lid)
                .field("ethernet", &self.inner.ethernet)
                .finish()
        }
    }

    /// Name of a port state, for messages.
    fn port_state_name(state: ibv_port_state::Type) -> &'static str {
        match state {
            ibv_port_state::IBV_PORT_NOP => "NOP",
            ibv_port_state::IBV_PORT_DOWN => "DOWN",
            ibv_port_state::IBV_PORT_INIT => "INIT",
            ibv_port_state::IBV_PORT_ARMED => "ARMED",
            ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE",
            ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
            _ => "unknown",
        }
    }

    /// The device list of libibverbs, freed on drop.
    struct DeviceList {
        list: *mut *mut ibv_device,
        len: usize,
    }

    impl DeviceList {
        fn get() -> Result<DeviceList, RdmaError> {
            let mut count: c_int = 0;
            // SAFETY: `count` is a valid out-pointer; the returned list is freed by `Drop`.
            let list = unsafe { ibv_get_device_list(&mut count) };
            if list.is_null() {
                // NULL means no kernel support for RDMA (ENOSYS), or a failure to list;
                // either way there is no device this process can use.
                return Err(RdmaError::NoDevice);
            }
            let list = DeviceList {
                list,
                len: usize::try_from(count).unwrap_or(0),
            };
            if list.len == 0 {
                return Err(RdmaError::NoDevice);
            }
            Ok(list)
        }

        fn device(&self, i: usize) -> *mut ibv_device {
            assert!(i < self.len);
            // SAFETY: the list holds `len` valid entries followed by NULL.
            unsafe { *self.list.add(i) }
        }

        fn name(&self, i: usize) -> String {
            // SAFETY: `ibv_get_device_name` returns a NUL-terminated string owned by the
            // device, valid while the list is; it is copied out at once.
            unsafe {
                let name = ibv_get_device_name(self.device(i));
                if name.is_null() {
                    return String::from("?");
                }
                CStr::from_ptr(name).to_string_lossy().into_owned()
            }
        }
    }

    impl Drop for DeviceList {
        fn drop(&mut self) {
            // SAFETY: `list` came from `ibv_get_device_list` and is freed once. Contexts
            // opened from its devices stay valid after the list is freed (ibv_open_device(3)).
            unsafe { ibv_free_device_list(self.list) }
        }
    }

    impl RdmaDevice {
        /// Opens the device called `name`, or the first device when `None`: its verbs
        /// context, a protection domain, and the attributes of port [`PORT_NUM`], which
        /// must be active.
        pub fn open(name: Option<&str>) -> Result<RdmaDevice, RdmaError> {
            let list = DeviceList::get()?;
            let index = match name {
                None => 0,
                Some(wanted) => {
                    (0..list.len)
                        .find(|&i| list.name(i) == wanted)
                        .ok_or_else(|| RdmaError::DeviceNotFound {
                            name: wanted.to_string(),
                            available: (0..list.len)
                                .map(|i| list.name(i))
                                .collect::<Vec<_>>()
                                .join(", "),
                        })?
                }
            };
            let device_name = list.name(index);
            let verbs_error = |call, source| RdmaError::Verbs {
                call,
                device: device_name.clone(),
                source,
            };

            // SAFETY: the device pointer is a valid entry of the live list.
            let context = unsafe { ibv_open_device(list.device(index)) };
            if context.is_null() {
                return Err(verbs_error("ibv_open_device", io::Error::last_os_error()));
            }
            // SAFETY: `context` is an open context.
            let pd = unsafe { ibv_alloc_pd(context) };
            if pd.is_null() {
                let err = io::Error::last_os_error();
                // SAFETY: the context was opened above and nothing else uses it.
                unsafe { ibv_close_device(context) };
                return Err(verbs_error("ibv_alloc_pd", err));
            }
            // From here on `inner` owns both and frees them on every error path.
            let mut inner = DeviceInner {
                name: device_name.clone(),
                context,
                pd,
                lid: 0,
                active_mtu: ibv_mtu::IBV_MTU_1024,
                ethernet: false,
                gid: [0; 16],
            };

            // SAFETY: all-zero is a valid `ibv_port_attr` (plain integers), filled below.
            let mut port: ibv_port_attr = unsafe { MaybeUninit::zeroed().assume_init() };
            // SAFETY: `context` is open and `port` is a valid out-pointer of the right size.
            let rc = unsafe { ___ibv_query_port(context, PORT_NUM, &mut port) };
            if rc != 0 {
                return Err(verbs_error(
                    "ibv_query_port",
                    io::Error::from_raw_os_error(rc),
                ));
            }
            if port.state != ibv_port_state::IBV_PORT_ACTIVE {
                return Err(RdmaError::PortNotActive {
                    device: device_name,
                    port: PORT_NUM,
                    state: port_state_name(port.state),
                });
            }
            inner.lid = port.lid;
            inner.active_mtu = port.active_mtu;
            inner.ethernet = port.link_layer == LINK_LAYER_ETHERNET;

            // SAFETY: all-zero is a valid `ibv_gid` (a 16-byte union).
            let mut gid: ibv_gid = unsafe { MaybeUninit::zeroed().assume_init() };
            // SAFETY: `context` is open and `gid` is a valid out-pointer.
            let rc = unsafe { ibv_query_gid(context, PORT_NUM, c_int::from(GID_INDEX), &mut gid) };
            if rc != 0 {
                return Err(verbs_error("ibv_query_gid", io::Error::last_os_error()));
            }
            // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
            inner.gid = unsafe { gid.raw };

            Ok(RdmaDevice {
                inner: Arc::new(inner),
            })
        }

        /// The device's name (`mlx5_0`, `rxe0`).
        pub fn name(&self) -> &str {
            &self.inner.name
        }

        /// Registers `len` bytes at `addr` for remote writes by peers (the backup side:
        /// the frame file's mapping). The returned region's [`RdmaRegion::remote`] is the
        /// `(addr, rkey)` a master writes to.
        ///
        /// # Safety
        /// `addr..addr + len` must be mapped, writable memory that stays mapped until the
        /// region is dropped. Peers write into it at any time without the CPU's
        /// knowledge: the caller must not hold Rust references (`&[u8]`, `&mut [u8]`) to
        /// it that assume it does not change, and reads it through raw pointers,
        /// volatile or atomic loads (as the frame scan of `shm` does).
        pub unsafe fn register_remote_writable(
            &self,
            addr: *mut u8,
            len: usize,
        ) -> Result<RdmaRegion, RdmaError> {
            let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
            // SAFETY: the caller guarantees the range stays mapped while the region
            // lives; the PD is alive (held by `self.inner`).
            let mr = unsafe { self.register(addr, len, access) }?;
            Ok(RdmaRegion {
                mr,
                device: Arc::clone(&self.inner),
            })
        }

        /// `ibv_reg_mr` with a clear error.
        ///
        /// # Safety
        /// The range must stay mapped until the returned MR is deregistered.
        unsafe fn register(
            &self,
            addr: *mut u8,
            len: usize,
            access: ibv_access_flags,
        ) -> Result<*mut ibv_mr, RdmaError> {
            // The access flags fit an int: they are a handful of low bits.
            let access = access.0 as c_int;
            // SAFETY: the PD is alive; the caller guarantees the range.
            let mr = unsafe { ibv_reg_mr(self.inner.pd, addr.cast::<c_void>(), len, access) };
            if mr.is_null() {
                return Err(self
                    .inner
                    .verbs_error("ibv_reg_mr", io::Error::last_os_error()));
            }
            Ok(mr)
        }

        /// Creates an RC queue pair with its own completion queue and staging buffer. It
        /// can write once [`RdmaQueuePair::connect`] has connected it to a peer.
        pub fn create_queue_pair(&self) -> Result<RdmaQueuePair, RdmaError> {
            let inner = &self.inner;
            // SAFETY: the context is open; no completion channel, no vector preference.
            let cq = unsafe {
                ibv_create_cq(inner.context, CQ_DEPTH, ptr::null_mut(), ptr::null_mut(), 0)
            };
            if cq.is_null() {
                return Err(inner.verbs_error("ibv_create_cq", io::Error::last_os_error()));
            }
            let mut staging = vec![0u8; STAGING_BYTES].into_boxed_slice();
            // SAFETY: the staging buffer lives in the queue pair, which deregisters the MR
            // in `Drop` before the buffer is freed.
            let staging_mr = match unsafe {
                self.register(
                    staging.as_mut_ptr(),
                    staging.len(),
                    ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
                )
            } {
                Ok(mr) => mr,
                Err(e) => {
                    // SAFETY: the CQ was created above and nothing else uses it.
                    unsafe { ibv_destroy_cq(cq) };
                    return Err(e);
                }
            };
            // The queue pair owns the CQ and the MR from here on and frees them on error.
            let mut qp = RdmaQueuePair {
                qp: ptr::null_mut(),
                cq,
                staging_mr,
                staging,
                psn: rand::random::<u32>() & PSN_MASK,
                next_wr_id: 0,
                connected: false,
                broken: false,
                device: Arc::clone(inner),
            };

            // SAFETY: all-zero is a valid `ibv_qp_init_attr` (pointers NULL, integers 0).
            let mut init: ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            // Only the writes we ask for are signaled (`IBV_SEND_SIGNALED`).
            init.sq_sig_all = 0;
            init.cap.max_send_wr = SEND_QUEUE_DEPTH;
            init.cap.max_send_sge = 1;
            // RDMA WRITE consumes no receive entries, but some providers refuse 0.
            init.cap.max_recv_wr = 1;
            init.cap.max_recv_sge = 1;
            // SAFETY: the PD is alive and `init` is fully initialised with a live CQ.
            qp.qp = unsafe { ibv_create_qp(inner.pd, &mut init) };
            if qp.qp.is_null() {
                return Err(inner.verbs_error("ibv_create_qp", io::Error::last_os_error()));
            }
            Ok(qp)
        }
    }

    /// Packet sequence numbers are 24 bits.
    const PSN_MASK: u32 = 0x00ff_ffff;

    /// Queue pair numbers are 24 bits.
    const QPN_MASK: u32 = 0x00ff_ffff;

    /// A registered byte region peers may RDMA-write into; deregistered on drop, which
    /// revokes its rkey (later writes to it fail at the writer's NIC).
    pub struct RdmaRegion {
        /// The memory region; deregistered in `Drop`, before `device` is released.
        mr: *mut ibv_mr,
        device: Arc<DeviceInner>,
    }

    // SAFETY: the MR handle is used only by `ibv_dereg_mr` in `Drop` and read-only field
    // loads; verbs calls are thread-safe.
    unsafe impl Send for RdmaRegion {}
    // SAFETY: shared use only reads the MR's immutable fields.
    unsafe impl Sync for RdmaRegion {}

    impl RdmaRegion {
        /// The region's start address as peers name it in RDMA WRITEs.
        pub fn addr(&self) -> u64 {
            // SAFETY: `mr` is a live MR until `Drop`; its fields are set at registration.
            unsafe { (*self.mr).addr as u64 }
        }

        /// Its length in bytes.
        pub fn len(&self) -> usize {
            // SAFETY: as in `addr`.
            unsafe { (*self.mr).length }
        }

        /// Whether the region is empty.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }

        /// The key peers present to write into it.
        pub fn rkey(&self) -> u32 {
            // SAFETY: as in `addr`.
            unsafe { (*self.mr).rkey }
        }

        /// `(addr, rkey)`: what the backup sends to the master.
        pub fn remote(&self) -> (u64, u32) {
            (self.addr(), self.rkey())
        }
    }

    impl fmt::Debug for RdmaRegion {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("RdmaRegion")
                .field("device", &self.device.name)
                .field("addr", &format_args!("{:#x}", self.addr()))
                .field("len", &self.len())
                .field("rkey", &format_args!("{:#x}", self.rkey()))
                .finish()
        }
    }

    impl Drop for RdmaRegion {
        fn drop(&mut self) {
            // SAFETY: `mr` came from `ibv_reg_mr` and is deregistered once, while the PD
            // is still alive (`device` is released after this).
            unsafe { ibv_dereg_mr(self.mr) };
        }
    }

    /// A reliable-connected queue pair that RDMA-writes into one peer's regions.
    ///
    /// Owns its completion queue and a registered staging buffer of [`STAGING_BYTES`]:
    /// [`RdmaQueuePair::write`] copies the caller's bytes there, posts a signaled RDMA
    /// WRITE and busy-polls for its completion, so at most one work request is in flight.
    pub struct RdmaQueuePair {
        /// The queue pair; NULL only while `create_queue_pair` fails. Destroyed first.
        qp: *mut ibv_qp,
        /// Send and receive CQ of `qp`; destroyed after it.
        cq: *mut ibv_cq,
        /// MR over `staging`; deregistered after `qp` (no work request can read it then)
        /// and before `staging` is freed.
        staging_mr: *mut ibv_mr,
        /// Source of every write. Invariant: not modified while a work request that
        /// reads it is outstanding (writes wait for completion; a write that did not
        /// complete sets `broken`, and a broken queue pair never touches it again).
        staging: Box<[u8]>,
        /// First packet sequence number of this side, sent in the endpoint.
        psn: u32,
        /// `wr_id` of the next work request; checks that a completion is ours.
        next_wr_id: u64,
        /// Set once `connect` reached RTS.
        connected: bool,
        /// Set when a write failed or timed out; the queue pair is then unusable.
        broken: bool,
        /// Keeps the PD and context alive; released last.
        device: Arc<DeviceInner>,
    }

    // SAFETY: the verbs handles may be used from any thread; `write` takes `&mut self`,
    // so the CQ is never polled by two threads at once.
    unsafe impl Send for RdmaQueuePair {}

    impl fmt::Debug for RdmaQueuePair {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("RdmaQueuePair")
                .field("device", &self.device.name)
                .field("endpoint", &self.local_endpoint())
                .field("connected", &self.connected)
                .field("broken", &self.broken)
                .finish()
        }
    }

    impl RdmaQueuePair {
        /// What the peer needs to connect its queue pair to this one.
        pub fn local_endpoint(&self) -> RdmaEndpoint {
            // SAFETY: `qp` is a live queue pair (created before `self` is returned).
            let qpn = unsafe { (*self.qp).qp_num };
            RdmaEndpoint {
                qpn,
                lid: self.device.lid,
                gid: self.device.gid,
                psn: self.psn,
            }
        }

        /// Connects this queue pair to the peer's `remote` endpoint: RESET→INIT (remote
        /// writes allowed), INIT→RTR (path to the peer), RTR→RTS (ready to send).
        pub fn connect(&mut self, remote: &RdmaEndpoint) -> Result<(), RdmaError> {
            // INIT: port, partition, and permission for the peer to write our regions.
            let mut attr = zeroed_qp_attr();
            attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
            attr.pkey_index = 0;
            attr.port_num = PORT_NUM;
            attr.qp_access_flags = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
            self.modify(
                "ibv_modify_qp(INIT)",
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                    | ibv_qp_attr_mask::IBV_QP_PORT
                    | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
            )?;

            // RTR: where the peer is and what it sends first.
            let mut attr = zeroed_qp_attr();
            attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
            attr.path_mtu = self.device.active_mtu;
            attr.dest_qp_num = remote.qpn & QPN_MASK;
            attr.rq_psn = remote.psn & PSN_MASK;
            attr.max_dest_rd_atomic = 1;
            attr.min_rnr_timer = MIN_RNR_TIMER;
            attr.ah_attr.dlid = remote.lid;
            attr.ah_attr.sl = 0;
            attr.ah_attr.src_path_bits = 0;
            attr.ah_attr.port_num = PORT_NUM;
            // Ethernet ports (RoCE) route by GID and have no LIDs; InfiniBand uses the LID.
            if self.device.ethernet || remote.lid == 0 {
                attr.ah_attr.is_global = 1;
                attr.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
                attr.ah_attr.grh.sgid_index = GID_INDEX;
                attr.ah_attr.grh.hop_limit = GRH_HOP_LIMIT;
                attr.ah_attr.grh.traffic_class = 0;
                attr.ah_attr.grh.flow_label = 0;
            }
            self.modify(
                "ibv_modify_qp(RTR)",
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_AV
                    | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                    | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                    | ibv_qp_attr_mask::IBV_QP_RQ_PSN
                    | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                    | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
            )?;

            // RTS: retransmission policy and our first sequence number.
            let mut attr = zeroed_qp_attr();
            attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
            attr.timeout = ACK_TIMEOUT_EXPONENT;
            attr.retry_cnt = RETRY_COUNT;
            attr.rnr_retry = RETRY_COUNT;
            attr.sq_psn = self.psn;
            attr.max_rd_atomic = 1;
            self.modify(
                "ibv_modify_qp(RTS)",
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                    | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                    | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                    | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                    | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
            )?;
            self.connected = true;
            Ok(())
        }

        fn modify(
            &mut self,
            call: &'static str,
            attr: &mut ibv_qp_attr,
            mask: ibv_qp_attr_mask,
        ) -> Result<(), RdmaError> {
            // The mask is a handful of low bits and fits an int.
            let mask = mask.0 as c_int;
            // SAFETY: `qp` is live and `attr` is initialised for every bit in `mask`.
            let rc = unsafe { ibv_modify_qp(self.qp, attr, mask) };
            if rc != 0 {
                // ibv_modify_qp returns the errno value itself.
                return Err(self
                    .device
                    .verbs_error(call, io::Error::from_raw_os_error(rc)));
            }
            Ok(())
        }

        /// Writes `bytes` into the peer's memory at `remote_addr` (inside a region whose
        /// key is `rkey`) and returns once the peer's NIC acknowledged them: they have
        /// reached the peer and are placed in its memory before any later write of this
        /// queue pair.
        ///
        /// Copies through the staging buffer, in pieces of at most [`STAGING_BYTES`],
        /// each waited for before the next is posted. For Tailwind ordering call it twice,
        /// body then tail (see the module docs). On error the queue pair is unusable
        /// ([`RdmaError::Broken`] from then on) and the bytes may have landed in part.
        pub fn write(
            &mut self,
            bytes: &[u8],
            remote_addr: u64,
            rkey: u32,
        ) -> Result<(), RdmaError> {
            if self.broken {
                return Err(RdmaError::Broken);
            }
            if !self.connected {
                return Err(RdmaError::NotConnected);
            }
            let wraps = u64::try_from(bytes.len())
                .ok()
                .and_then(|len| remote_addr.checked_add(len))
                .is_none();
            if wraps {
                return Err(RdmaError::BadRemoteRange {
                    addr: remote_addr,
                    len: bytes.len(),
                });
            }
            let mut remote = remote_addr;
            for piece in bytes.chunks(STAGING_BYTES) {
                if let Err(e) = self.write_piece(piece, remote, rkey) {
                    self.broken = true;
                    return Err(e);
                }
                // Cannot wrap: checked for the whole range above.
                remote += piece.len() as u64;
            }
            Ok(())
        }

        /// Posts one signaled RDMA WRITE of `piece` (at most [`STAGING_BYTES`]) and waits
        /// for its completion.
        fn write_piece(
            &mut self,
            piece: &[u8],
            remote_addr: u64,
            rkey: u32,
        ) -> Result<(), RdmaError> {
            debug_assert!(piece.len() <= STAGING_BYTES);
            // No work request is outstanding (the previous one completed), so the NIC is
            // not reading the staging buffer.
            self.staging[..piece.len()].copy_from_slice(piece);

            let wr_id = self.next_wr_id;
            self.next_wr_id += 1;
            let mut sge = ibv_sge {
                addr: self.staging.as_ptr() as u64,
                // Fits: at most STAGING_BYTES, asserted to fit u32 at compile time.
                length: piece.len() as u32,
                // SAFETY: `staging_mr` is live until `Drop`.
                lkey: unsafe { (*self.staging_mr).lkey },
            };
            // SAFETY: all-zero is a valid `ibv_send_wr` (NULL pointers, zero integers,
            // plain-data unions); the fields used are set below.
            let mut wr: ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
            wr.wr_id = wr_id;
            wr.next = ptr::null_mut();
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.wr.rdma = rdma_t { remote_addr, rkey };
            let mut bad_wr: *mut ibv_send_wr = ptr::null_mut();
            // SAFETY: `qp` is live and connected; `wr` and `sge` outlive the call (the
            // provider copies them into the send queue); the SGE names registered memory
            // that stays untouched until the completion below.
            let rc = unsafe { ibv_post_send(self.qp, &mut wr, &mut bad_wr) };
            if rc != 0 {
                return Err(self
                    .device
                    .verbs_error("ibv_post_send", io::Error::from_raw_os_error(rc)));
            }
            self.wait_completion(wr_id)
        }

        /// Busy-polls the CQ for the completion of `wr_id`, for at most
        /// [`WRITE_COMPLETION_TIMEOUT_MS`].
        fn wait_completion(&mut self, wr_id: u64) -> Result<(), RdmaError> {
            let timeout = Duration::from_millis(WRITE_COMPLETION_TIMEOUT_MS);
            let start = Instant::now();
            loop {
                // SAFETY: all-zero is a valid `ibv_wc` (integers and a plain-data union).
                let mut wc: ibv_wc = unsafe { MaybeUninit::zeroed().assume_init() };
                // SAFETY: `cq` is live, polled only here under `&mut self`, and `wc` has
                // room for the one entry asked for.
                let n = unsafe { ibv_poll_cq(self.cq, 1, &mut wc) };
                if n < 0 {
                    return Err(self
                        .device
                        .verbs_error("ibv_poll_cq", io::Error::from_raw_os_error(-n)));
                }
                if n == 1 {
                    // Only signaled writes complete, one at a time: anything else is a bug.
                    assert_eq!(
                        wc.wr_id, wr_id,
                        "completion for a work request not in flight"
                    );
                    if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                        return Err(RdmaError::WorkCompletion {
                            status: wc.status,
                            status_text: wc_status_text(wc.status),
                            vendor_err: wc.vendor_err,
                        });
                    }
                    return Ok(());
                }
                let waited = start.elapsed();
                if waited >= timeout {
                    return Err(RdmaError::Timeout {
                        waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                std::hint::spin_loop();
            }
        }
    }

    impl Drop for RdmaQueuePair {
        fn drop(&mut self) {
            // SAFETY: each handle came from its create/register call and is freed once,
            // in dependency order: the QP (which flushes any work request still reading
            // the staging buffer) before the MR and the CQ it uses; `staging` and the
            // device (PD, context) are released after this body.
            unsafe {
                if !self.qp.is_null() {
                    ibv_destroy_qp(self.qp);
                }
                ibv_dereg_mr(self.staging_mr);
                ibv_destroy_cq(self.cq);
            }
        }
    }

    fn zeroed_qp_attr() -> ibv_qp_attr {
        // SAFETY: all-zero is a valid `ibv_qp_attr` (integers and plain-data structs).
        unsafe { MaybeUninit::zeroed().assume_init() }
    }

    fn wc_status_text(status: ibv_wc_status::Type) -> String {
        // SAFETY: `ibv_wc_status_str` returns a static NUL-terminated string for any
        // value ("unknown" for codes it does not know).
        unsafe {
            let text = ibv_wc_status_str(status);
            if text.is_null() {
                return format!("status {status}");
            }
            CStr::from_ptr(text).to_string_lossy().into_owned()
        }
    }
}

#[cfg(all(test, feature = "rdma"))]
mod tests {
    use super::*;
    use std::path::Path;

    /// Whether the kernel shows any RDMA device.
    fn host_has_rdma_device() -> bool {
        std::fs::read_dir(Path::new("/sys/class/infiniband"))
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(false)
    }

    const NO_DEVICE_TEXT: &str = "no RDMA device found: ibv_get_device_list returned none \
         (is an RDMA NIC, rxe or siw configured?); use --replication shm or tcp";

    #[test]
    fn open_without_a_device_says_so_plainly() {
        if host_has_rdma_device() {
            eprintln!("skipped: this host has an RDMA device");
            return;
        }
        let err = RdmaDevice::open(None).expect_err("no device on this host");
        assert!(matches!(err, RdmaError::NoDevice), "{err:?}");
        assert_eq!(err.to_string(), NO_DEVICE_TEXT);
        assert_eq!(rdma_available(), Err(NO_DEVICE_TEXT.to_string()));
        let err = RdmaDevice::open(Some("rxe0")).expect_err("no device on this host");
        assert_eq!(err.to_string(), NO_DEVICE_TEXT);
    }

    /// Skips a test that needs a working RDMA device, saying why, unless
    /// `RAMPART_REQUIRE_RDMA=1` (`scripts/soft-roce.sh`, which has just set one up): then
    /// the missing device fails the test.
    fn skip_without_device(why: &str) {
        assert!(
            std::env::var("RAMPART_REQUIRE_RDMA").as_deref() != Ok("1"),
            "RAMPART_REQUIRE_RDMA=1 but {why}"
        );
        eprintln!("skipped: {why}");
    }

    #[test]
    fn loopback_queue_pairs_write_into_a_registered_buffer() {
        if !host_has_rdma_device() {
            skip_without_device("this host has no RDMA device");
            return;
        }
        let device = match RdmaDevice::open(None) {
            Ok(device) => device,
            // A device whose port is down cannot carry the loopback; say so and stop.
            Err(e @ RdmaError::PortNotActive { .. }) => {
                skip_without_device(&e.to_string());
                return;
            }
            Err(e) => panic!("opening the RDMA device failed: {e}"),
        };
        assert_eq!(rdma_available(), Ok(()));

        // The backup side: a zeroed buffer registered for remote writes.
        let target_len = 2 * STAGING_BYTES + 4096;
        let mut target = vec![0u8; target_len].into_boxed_slice();
        let target_ptr = target.as_mut_ptr();
        // SAFETY: `target` outlives `region` (dropped first, below) and is read only
        // through raw pointers after the writes completed.
        let region = unsafe { device.register_remote_writable(target_ptr, target_len) }
            .expect("register target");
        let (addr, rkey) = region.remote();
        assert_eq!(addr, target_ptr as u64);
        assert_eq!(region.len(), target_len);

        let mut writer = device.create_queue_pair().expect("writer queue pair");
        let mut backup = device.create_queue_pair().expect("backup queue pair");
        let writer_end = writer.local_endpoint();
        let backup_end = backup.local_endpoint();
        // The endpoint travels in an RPC.
        let wire = bincode::serialize(&backup_end).expect("serialize endpoint");
        let backup_end: RdmaEndpoint = bincode::deserialize(&wire).expect("deserialize");
        writer.connect(&backup_end).expect("connect writer");
        backup.connect(&writer_end).expect("connect backup");

        // Body then tail, as the Tailwind write path does, plus a write longer than the
        // staging buffer.
        let body: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8 + 1).collect();
        let tail = [0xAB_u8; 9];
        writer.write(&body, addr + 100, rkey).expect("write body");
        writer
            .write(&tail, addr + 100 + body.len() as u64, rkey)
            .expect("write tail");
        let long: Vec<u8> = (0..(STAGING_BYTES + 3000) as u32)
            .map(|i| (i % 253) as u8)
            .collect();
        let long_at = 4096;
        writer
            .write(&long, addr + long_at as u64 + 4096, rkey)
            .expect("long write");

        let read = |at: usize, len: usize| -> Vec<u8> {
            // SAFETY: the range lies inside `target`, and every write to it completed.
            (0..len)
                .map(|i| unsafe { std::ptr::read_volatile(target_ptr.add(at + i)) })
                .collect()
        };
        assert_eq!(read(0, 100), vec![0u8; 100]);
        assert_eq!(read(100, body.len()), body);
        assert_eq!(read(100 + body.len(), tail.len()), tail);
        assert_eq!(read(long_at + 4096, long.len()), long);

        // Out of the region: a failed work completion, then the queue pair is broken.
        let err = writer
            .write(&tail, addr + target_len as u64, rkey)
            .expect_err("out of range");
        assert!(matches!(err, RdmaError::WorkCompletion { .. }), "{err:?}");
        assert!(matches!(
            writer.write(&tail, addr, rkey),
            Err(RdmaError::Broken)
        ));

        drop(writer);
        drop(backup);
        drop(region);
        drop(target);
    }

    #[test]
    fn endpoint_round_trips_through_bincode() {
        let end = RdmaEndpoint {
            qpn: 0x12_3456,
            lid: 7,
            gid: [9; 16],
            psn: 0xAB_CDEF,
        };
        let wire = bincode::serialize(&end).expect("serialize");
        assert_eq!(
            bincode::deserialize::<RdmaEndpoint>(&wire).expect("deserialize"),
            end
        );
    }
}

#[cfg(all(test, not(feature = "rdma")))]
mod no_feature_tests {
    use super::*;

    #[test]
    fn rdma_available_without_the_feature_names_the_rebuild() {
        assert_eq!(
            rdma_available(),
            Err(
                "this build has no RDMA support: rebuild with `--features rdma` (needs \
                 libibverbs-dev, librdmacm-dev, libclang-dev)"
                    .to_string()
            )
        );
    }
}
