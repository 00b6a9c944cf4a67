//! `Lease`: whether this master may serve reads and writes now, and `LeaseRenewer`, the
//! task that keeps it (docs/design.md §5 "Fencing").
//!
//! When the coordinator declares a master crashed, it recovers the master's tablets on
//! other servers. A master that is merely cut off (a partition, a long pause) would go on
//! serving stale reads of those tablets meanwhile. The lease closes that window: the
//! master serves client reads and writes only while it holds a lease the coordinator
//! granted, and the coordinator waits out the lease before the recovered tablets go
//! live. A master that learns it was declared crashed (`ServerCrashed`) revokes its lease
//! for good and its process exits ([`Lease::revoked`], awaited by
//! `MasterService::failed`).
//!
//! # Guarantees
//! * A grant of `lease_ms` counts from the instant the renewal request was *sent*
//!   (read from the clock before the call), never from when the reply arrived: the
//!   coordinator counts from when it received the request, later, so the master's
//!   lease always ends first (as long as the two clocks run at about the same rate —
//!   leases tolerate drift of rate, not of offset; there is no offset between two
//!   monotonic clocks to begin with).
//! * Lease time is `CLOCK_BOOTTIME` ([`BootClock`]), which keeps counting while the
//!   machine is suspended. `CLOCK_MONOTONIC` (tokio's `Instant`) stops then: a master on a
//!   VM or laptop that slept through its lease would wake up still believing it valid,
//!   while the coordinator had waited the lease out and recovered its tablets elsewhere.
//!   (The coordinator's own wait may use a clock that stops: a suspended coordinator
//!   only waits longer.)
//! * Grants only extend the lease: a late reply to an older request cannot shorten it.
//! * A revoked lease is never valid again.
//!
//! # Why writes are safe without a check at the replication point
//! `MasterService` checks the lease when a write arrives, not when the appender stages
//! or acknowledges it. A write admitted while the lease held may be replicated after it
//! lapsed; that is safe because recovery *fences* the crashed master's open replicas on
//! every backup before it reads them: a write either reached the replicas before the
//! fence (and recovery replays it) or is refused and never acknowledged. The lease
//! protects what fencing cannot: reads, which touch no backup.
//!
//! # Concurrency
//! [`Lease::valid`] is a clock read and two atomic loads, called on every data request.
//! The renewer is its only writer (plus tests).
//!
//! # Tablets
//! Each grant also reports this master's tablet epoch in the committed map; the renewer
//! hands it to `TabletSync`, which pulls the master's tablets if a change was missed.
//! So the tablets a master serves converge to the map within a renewal interval. It also
//! reports the master's version ceiling, which a recovery may have raised
//! (`VersionReserver`).

use parking_lot::Mutex;
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{RenewLease, RenewLeaseReply, RenewLeaseRequest};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::status::Status;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often the master asks to renew its lease. Several renewals fit in one lease (the
/// coordinator grants ~1 s), so one lost request or a slow leader election does not make
/// the lease lapse.
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_millis(150);

/// Longest one renewal may take (all coordinators tried once). A reply arriving after
/// the lease it grants has run out is worthless, so the call is also cut at the length of
/// the last lease granted when that is shorter.
pub const LEASE_RENEW_CALL_TIMEOUT_MAX: Duration = Duration::from_millis(500);

/// The detail of the `Retry` a master answers to reads and writes without a lease.
pub const LEASE_LAPSED_DETAIL: &str = "lease lapsed: this master cannot reach the coordinators";

const _: () = assert!(LEASE_RENEW_INTERVAL.as_nanos() > 0);
const _: () = assert!(LEASE_RENEW_INTERVAL.as_nanos() < LEASE_RENEW_CALL_TIMEOUT_MAX.as_nanos());

/// A point in lease time: microseconds on a [`Clock`] since its origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaseTime(pub u64);

impl LeaseTime {
    /// Microseconds since the clock's origin.
    pub fn as_us(self) -> u64 {
        self.0
    }
}

/// Where a [`Lease`] reads the time; injected so tests move time by hand.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time (monotonic: never goes back).
    fn now(&self) -> LeaseTime;
}

/// The kernel's `CLOCK_BOOTTIME`: monotonic, and counting the time the machine spent
/// suspended (see the module doc for why leases need that).
#[derive(Debug, Default, Clone, Copy)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> LeaseTime {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a pointer to a timespec we own.
        let result = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
        // Linux has had CLOCK_BOOTTIME since 2.6.39; a failure is a broken system, and
        // a lease must not be computed from garbage.
        assert_eq!(result, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
        let us = u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000
            + u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000;
        LeaseTime(us)
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    /// Microseconds since the origin (starts at one second: 0 is no time at all).
    now_us: AtomicU64,
}

impl ManualClock {
    /// A clock standing at one second past its origin.
    pub fn new() -> ManualClock {
        ManualClock {
            now_us: AtomicU64::new(1_000_000),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now_us.fetch_add(duration_us(by), Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> LeaseTime {
        LeaseTime(self.now_us.load(Ordering::SeqCst))
    }
}

fn duration_us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Whether this master may serve reads and writes; see the module doc.
pub struct Lease {
    clock: Arc<dyn Clock>,
    /// False for a master without coordinators (tests, benchmarks): always valid.
    enforced: bool,
    /// End of the lease on `clock`, in microseconds, rounded down (0: none granted).
    /// Only grows, except that revocation sets it to 0.
    expiry_us: AtomicU64,
    /// Set once, when the coordinator said this server was declared crashed. Once set,
    /// never valid again.
    revoked: AtomicBool,
    /// Why it was revoked (set before `revoked`).
    reason: Mutex<Option<String>>,
    /// The revocation was a drain's end, not a crash (set before `revoked`): the
    /// process exits cleanly.
    drained: AtomicBool,
    /// Woken when the lease is revoked.
    revoked_notify: Notify,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("enforced", &self.enforced)
            .field("remaining", &self.remaining())
            .field("revoked", &self.revoked.load(Ordering::SeqCst))
            .finish()
    }
}

impl Lease {
    /// A lease that is always valid: for a master that runs without coordinators
    /// (tests, benchmarks, `MasterService::new`).
    pub fn always() -> Lease {
        Lease {
            enforced: false,
            ..Lease::with_clock(Arc::new(BootClock))
        }
    }

    /// An enforced lease on `CLOCK_BOOTTIME` ([`BootClock`]), with nothing granted yet.
    pub fn new() -> Lease {
        Lease::with_clock(Arc::new(BootClock))
    }

    /// An enforced lease reading `clock`, with nothing granted yet.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Lease {
        Lease {
            clock,
            enforced: true,
            expiry_us: AtomicU64::new(0),
            revoked: AtomicBool::new(false),
            reason: Mutex::new(None),
            drained: AtomicBool::new(false),
            revoked_notify: Notify::new(),
        }
    }

    /// The lease's clock.
    pub fn now(&self) -> LeaseTime {
        self.clock.now()
    }

    /// Whether leases are enforced at all (false for [`Lease::always`]).
    pub fn is_enforced(&self) -> bool {
        self.enforced
    }

    /// Whether the master may serve reads and writes now.
    pub fn valid(&self) -> bool {
        if self.revoked.load(Ordering::SeqCst) {
            return false;
        }
        if !self.enforced {
            return true;
        }
        // Both sides rounded down: true only if the exact time is before the exact end.
        self.clock.now().as_us() < self.expiry_us.load(Ordering::SeqCst)
    }

    /// How long the lease still runs (`None`: not enforced; zero: lapsed or revoked).
    pub fn remaining(&self) -> Option<Duration> {
        if !self.enforced {
            return None;
        }
        if self.revoked.load(Ordering::SeqCst) {
            return Some(Duration::ZERO);
        }
        let now = self.clock.now().as_us();
        let end = self.expiry_us.load(Ordering::SeqCst);
        Some(Duration::from_micros(end.saturating_sub(now)))
    }

    /// Records a grant of `length` for the request sent at `sent` (read from
    /// [`now`](Self::now) before sending). Extends the lease, never shortens it; does
    /// nothing once revoked.
    pub fn grant(&self, sent: LeaseTime, length: Duration) {
        let end = sent.as_us().saturating_add(duration_us(length));
        self.expiry_us.fetch_max(end, Ordering::SeqCst);
        if self.revoked.load(Ordering::SeqCst) {
            // A grant racing a revocation: the revocation wins.
            self.expiry_us.store(0, Ordering::SeqCst);
        }
    }

    /// Ends the lease for good: this server was declared crashed. The first reason is
    /// kept.
    pub fn revoke(&self, reason: impl Into<String>) {
        {
            let mut held = self.reason.lock();
            if held.is_none() {
                *held = Some(reason.into());
            }
        }
        self.revoked.store(true, Ordering::SeqCst);
        self.expiry_us.store(0, Ordering::SeqCst);
        self.revoked_notify.notify_waiters();
    }

    /// Ends the lease for good: this server was drained and removed. The process then
    /// exits cleanly ([`was_drained`](Self::was_drained)).
    pub fn revoke_drained(&self, reason: impl Into<String>) {
        if self.reason.lock().is_none() {
            self.drained.store(true, Ordering::SeqCst);
        }
        self.revoke(reason);
    }

    /// Whether the lease ended because this server was drained, not declared crashed.
    pub fn was_drained(&self) -> bool {
        self.drained.load(Ordering::SeqCst)
    }

    /// Why the lease was revoked, if it was.
    pub fn revoked_reason(&self) -> Option<String> {
        if !self.revoked.load(Ordering::SeqCst) {
            return None;
        }
        self.reason.lock().clone()
    }

    /// Completes, with the reason, once the lease is revoked (at once if it was).
    pub async fn revoked(&self) -> String {
        loop {
            let notified = self.revoked_notify.notified();
            if let Some(reason) = self.revoked_reason() {
                return reason;
            }
            notified.await;
        }
    }
}

impl Default for Lease {
    fn default() -> Self {
        Lease::always()
    }
}

/// Keeps a [`Lease`] renewed with the coordinators' leader; see the module doc.
///
/// # Failure handling
/// * No coordinator answers (or the call outlives its deadline): the lease is left to
///   run out; the next renewal is due [`LEASE_RENEW_INTERVAL`] after the failed one was
///   sent. One warning when renewals start failing (later failures are debug lines), one
///   when the lease lapses, and one line when a renewal succeeds again, saying for how
///   long and how often they failed.
/// * `ServerCrashed`: the lease is revoked with the coordinator's reason and the task
///   ends; `MasterService::failed` completes and the process exits.
/// * `ServerDrained`: the same, marked a drain's end ([`Lease::was_drained`]): the
///   process exits cleanly.
/// * Any other refusal (a coordinator that does not know the RPC): as a failed renewal.
pub struct LeaseRenewer {
    server: ServerId,
    lease: Arc<Lease>,
    coordinators: Arc<CoordinatorSet>,
    pool: Arc<RpcPool>,
    /// Time between the sends of two renewals.
    interval: Duration,
    /// Told each granted renewal: it reports the master's tablet epoch (`TabletSync`
    /// pulls its tablets when behind) and version ceiling (`VersionReserver`).
    on_grant: Option<GrantHook>,
}

/// What a [`LeaseRenewer`] calls with every granted renewal.
pub type GrantHook = Arc<dyn Fn(&RenewLeaseReply) + Send + Sync>;

impl fmt::Debug for LeaseRenewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseRenewer")
            .field("server", &self.server)
            .field("interval", &self.interval)
            .field("on_grant", &self.on_grant.is_some())
            .finish()
    }
}

impl LeaseRenewer {
    /// A renewer for server `server`'s `lease`, calling through `coordinators`, every
    /// [`LEASE_RENEW_INTERVAL`].
    pub fn new(
        server: ServerId,
        lease: Arc<Lease>,
        coordinators: Arc<CoordinatorSet>,
        pool: Arc<RpcPool>,
    ) -> LeaseRenewer {
        LeaseRenewer {
            server,
            lease,
            coordinators,
            pool,
            interval: LEASE_RENEW_INTERVAL,
            on_grant: None,
        }
    }

    /// The same renewer, calling `hook` with every granted renewal.
    pub fn on_grant(mut self, hook: GrantHook) -> LeaseRenewer {
        self.on_grant = Some(hook);
        self
    }

    /// The same renewer, renewing every `interval`.
    ///
    /// # Panics
    /// If `interval` is zero.
    pub fn with_interval(mut self, interval: Duration) -> LeaseRenewer {
        assert!(!interval.is_zero(), "a renewal interval of zero would spin");
        self.interval = interval;
        self
    }

    /// Renews until `shutdown` completes or the lease is revoked.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let request = RenewLeaseRequest {
            server: self.server,
        };
        // The length of the last grant: a reply later than that grants nothing.
        let mut granted: Option<Duration> = None;
        // Since when renewals fail, and how many did.
        let mut failing: Option<(Instant, u64)> = None;
        let mut was_valid = false;
        let mut next = Instant::now();
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let sent = self.lease.now();
            let started = Instant::now();
            next = started + self.interval;
            let timeout = granted.map_or(LEASE_RENEW_CALL_TIMEOUT_MAX, |length| {
                length.min(LEASE_RENEW_CALL_TIMEOUT_MAX)
            });
            let call =
                self.coordinators
                    .call_round::<RenewLease>(&self.pool, &request, started + timeout);
            let result = tokio::select! {
                _ = &mut shutdown => return,
                result = call => result,
            };
            match result {
                Ok(reply) => {
                    let length = Duration::from_millis(u64::from(reply.lease_ms));
                    self.lease.grant(sent, length);
                    granted = Some(length);
                    if let Some(hook) = &self.on_grant {
                        hook(&reply);
                    }
                    if !was_valid {
                        tracing::info!(server = %self.server, lease = ?length, "lease granted");
                    }
                    if let Some((since, failures)) = failing.take() {
                        tracing::info!(server = %self.server, failures, after = ?since.elapsed(), "lease renewed again");
                    }
                }
                Err(CoordinatorCallError::Rpc(
                    error @ RpcError::Status {
                        status: Status::ServerCrashed,
                        ..
                    },
                )) => {
                    let reason = format!("declared crashed by the coordinator: {error}");
                    tracing::error!(server = %self.server, %reason, "lease revoked");
                    self.lease.revoke(reason);
                    return;
                }
                Err(CoordinatorCallError::Rpc(
                    error @ RpcError::Status {
                        status: Status::ServerDrained,
                        ..
                    },
                )) => {
                    let reason = format!("drained and removed: {error}");
                    tracing::info!(server = %self.server, %reason, "lease ended");
                    self.lease.revoke_drained(reason);
                    return;
                }
                Err(error) => match &mut failing {
                    None => {
                        tracing::warn!(server = %self.server, %error, remaining = ?self.lease.remaining(), "lease renewal failed; said once until a renewal succeeds");
                        failing = Some((Instant::now(), 1));
                    }
                    Some((_, failures)) => {
                        *failures += 1;
                        tracing::debug!(server = %self.server, %error, remaining = ?self.lease.remaining(), "lease renewal failed again");
                    }
                },
            }
            let valid = self.lease.valid();
            if was_valid && !valid {
                tracing::warn!(server = %self.server, "lease lapsed: reads and writes refused until a renewal succeeds");
            }
            was_valid = valid;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use rampart_common::ids::TabletEpoch;
    use rampart_common::protocol::coordinator::RenewLeaseReply;
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Reply, Rpc, RpcServer, Service};
    use std::sync::atomic::AtomicU32;
    use tokio::net::TcpListener;

    const MS: Duration = Duration::from_millis(1);

    fn manual() -> (Arc<ManualClock>, Lease) {
        let clock = Arc::new(ManualClock::new());
        let lease = Lease::with_clock(Arc::clone(&clock) as Arc<dyn Clock>);
        (clock, lease)
    }

    /// Reads the kernel's clock `id`, in microseconds.
    fn raw_clock_us(id: libc::clockid_t) -> u64 {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a timespec we own.
        assert_eq!(unsafe { libc::clock_gettime(id, &mut now) }, 0);
        now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
    }

    /// Run by `lease_time_counts_the_time_a_machine_spent_suspended`, inside a time
    /// namespace whose CLOCK_BOOTTIME runs far ahead of its CLOCK_MONOTONIC.
    #[test]
    #[ignore = "run by lease_time_counts_the_time_a_machine_spent_suspended in a time namespace"]
    fn lease_clock_probe() {
        let read = Lease::new().now().as_us();
        let (boot, monotonic) = (
            raw_clock_us(libc::CLOCK_BOOTTIME),
            raw_clock_us(libc::CLOCK_MONOTONIC),
        );
        assert!(
            boot > monotonic + 500_000_000_000,
            "not in the time namespace: CLOCK_BOOTTIME {boot} µs, CLOCK_MONOTONIC {monotonic} µs"
        );
        assert!(
            read.abs_diff(boot) < 5_000_000,
            "lease time {read} µs is not CLOCK_BOOTTIME ({boot} µs; CLOCK_MONOTONIC {monotonic} µs)"
        );
    }

    #[test]
    fn lease_time_counts_the_time_a_machine_spent_suspended() {
        // A machine that slept looks, to a process started afterwards, like a time
        // namespace whose CLOCK_BOOTTIME runs ahead of its CLOCK_MONOTONIC: 11.6 days
        // here. The lease must read the former (module doc). Needs root (or a user
        // namespace) and Linux 5.6 or later.
        let exe = std::env::current_exe().expect("test binary");
        let output = std::process::Command::new("unshare")
            .args(["--time", "--boottime", "1000000", "--fork", "--"])
            .arg(exe)
            .args(["--exact", "lease::tests::lease_clock_probe", "--ignored"])
            .output()
            .expect("cannot run unshare (util-linux)");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root && stderr.contains("Operation not permitted") {
            eprintln!("SKIPPED: creating a time namespace needs root: {stderr}");
            return;
        }
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{stderr}"
        );
    }

    #[test]
    fn a_new_lease_is_invalid_until_granted() {
        let (_, lease) = manual();
        assert!(!lease.valid());
        assert_eq!(lease.remaining(), Some(Duration::ZERO));
    }

    #[test]
    fn a_lease_is_valid_after_a_grant_and_invalid_once_it_runs_out() {
        let (clock, lease) = manual();
        lease.grant(lease.now(), 500 * MS);
        assert!(lease.valid());
        clock.advance(499 * MS);
        assert!(lease.valid());
        clock.advance(MS);
        assert!(!lease.valid());
    }

    #[test]
    fn a_grant_counts_from_the_send_not_the_reply() {
        let (clock, lease) = manual();
        let sent = lease.now();
        // The reply takes 300 ms to arrive.
        clock.advance(300 * MS);
        lease.grant(sent, 500 * MS);
        assert_eq!(lease.remaining(), Some(200 * MS));
        clock.advance(200 * MS);
        assert!(!lease.valid());
    }

    #[test]
    fn a_late_reply_to_an_older_request_does_not_shorten_the_lease() {
        let (clock, lease) = manual();
        let first = lease.now();
        clock.advance(100 * MS);
        lease.grant(lease.now(), 500 * MS);
        lease.grant(first, 500 * MS);
        clock.advance(450 * MS);
        assert!(lease.valid());
    }

    #[test]
    fn a_revoked_lease_is_never_valid_again() {
        let (_, lease) = manual();
        lease.grant(lease.now(), 500 * MS);
        lease.revoke("declared crashed");
        assert!(!lease.valid());
        lease.grant(lease.now(), 500 * MS);
        assert!(!lease.valid());
        lease.revoke("a second reason");
        assert_eq!(lease.revoked_reason().as_deref(), Some("declared crashed"));
    }

    #[test]
    fn an_unenforced_lease_is_always_valid() {
        let lease = Lease::always();
        assert!(lease.valid());
        assert!(!lease.is_enforced());
        assert_eq!(lease.remaining(), None);
    }

    /// A coordinator that answers `RenewLease` with a grant or, once told to,
    /// `ServerCrashed`.
    #[derive(Debug, Default)]
    struct FakeCoordinator {
        renewals: AtomicU32,
        crashed: AtomicBool,
        lease_ms: AtomicU32,
    }

    impl Service for FakeCoordinator {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                if opcode != RenewLease::OPCODE {
                    return Reply::error(Status::UnknownOpcode, "fake");
                }
                if let Err(reply) = Reply::decode::<RenewLeaseRequest>(payload) {
                    return reply;
                }
                self.renewals.fetch_add(1, Ordering::SeqCst);
                if self.crashed.load(Ordering::SeqCst) {
                    return Reply::error(Status::ServerCrashed, "server 7 was declared crashed");
                }
                Reply::ok(&RenewLeaseReply {
                    lease_ms: self.lease_ms.load(Ordering::SeqCst),
                    tablets_epoch: TabletEpoch(0),
                    version_ceiling: 0,
                })
            })
        }
    }

    async fn start(fake: Arc<FakeCoordinator>) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(RpcServer::run(listener, fake, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    async fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(5 * MS).await;
        }
    }

    fn renewer(addr: &str, lease: &Arc<Lease>) -> LeaseRenewer {
        LeaseRenewer::new(
            ServerId(7),
            Arc::clone(lease),
            Arc::new(CoordinatorSet::new(&[addr])),
            Arc::new(RpcPool::new()),
        )
        .with_interval(20 * MS)
    }

    #[tokio::test]
    async fn the_renewer_keeps_the_lease_and_it_lapses_when_the_coordinator_goes() {
        let fake = Arc::new(FakeCoordinator::default());
        fake.lease_ms.store(150, Ordering::SeqCst);
        let (addr, stop) = start(Arc::clone(&fake)).await;
        let lease = Arc::new(Lease::new());
        let task = tokio::spawn(renewer(&addr, &lease).run(std::future::pending()));
        wait_until("the lease is granted", || lease.valid()).await;
        wait_until("several renewals ran", || {
            fake.renewals.load(Ordering::SeqCst) >= 5
        })
        .await;
        assert!(lease.valid());
        drop(stop);
        wait_until("the lease lapses", || !lease.valid()).await;
        assert_eq!(lease.revoked_reason(), None);
        task.abort();
    }

    #[tokio::test]
    async fn server_crashed_revokes_the_lease_and_ends_the_renewer() {
        let fake = Arc::new(FakeCoordinator::default());
        fake.lease_ms.store(1000, Ordering::SeqCst);
        let (addr, _stop) = start(Arc::clone(&fake)).await;
        let lease = Arc::new(Lease::new());
        let task = tokio::spawn(renewer(&addr, &lease).run(std::future::pending()));
        wait_until("the lease is granted", || lease.valid()).await;
        fake.crashed.store(true, Ordering::SeqCst);
        let reason = tokio::time::timeout(Duration::from_secs(2), lease.revoked())
            .await
            .expect("revoked in time");
        assert!(reason.contains("declared crashed"), "{reason}");
        assert!(!lease.valid());
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("the renewer ends")
            .expect("no panic");
    }

    /// Encodes `message` as a request payload.
    fn encode<M: rampart_common::rpc::WireMessage>(message: &M) -> Bytes {
        let mut out = bytes::BytesMut::new();
        message.encode(&mut out);
        out.freeze()
    }

    #[tokio::test]
    async fn a_master_without_a_lease_answers_retry_to_reads_and_writes_and_serves_them_with_one() {
        use crate::service::{needs_lease, MasterService};
        use rampart_common::config::MasterConfig;
        use rampart_common::ids::TableId;
        use rampart_common::protocol::master::{
            self as proto, EnumerateRequest, IncrementRequest, MultiReadRequest,
            MultiRemoveRequest, MultiWriteRequest, ObjectKey, PingRequest, ReadRequest,
            RemoveRequest, TabletsRequest, WriteRequest,
        };
        use rampart_common::reject::RejectRules;
        use rampart_common::tablet::Tablet;

        let config = MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 1024 * 1024,
            value_bytes_max: 1024,
            ..Default::default()
        };
        let (clock, lease) = manual();
        let lease = Arc::new(lease);
        let master = MasterService::new(ServerId(1), config).with_lease(Arc::clone(&lease));
        let table = TableId(1);
        let key = Bytes::from_static(b"k");
        let write = WriteRequest {
            table,
            key: key.clone(),
            value: Bytes::from_static(b"v"),
            rules: RejectRules::default(),
            rifl: rampart_common::rifl::Rifl::NONE,
        };
        let object = ObjectKey {
            table,
            key: key.clone(),
        };
        let requests: Vec<(Opcode, Bytes)> = vec![
            (
                proto::Read::OPCODE,
                encode(&ReadRequest {
                    table,
                    key: key.clone(),
                }),
            ),
            (
                proto::MultiRead::OPCODE,
                encode(&MultiReadRequest {
                    objects: vec![object.clone()],
                }),
            ),
            (
                proto::Enumerate::OPCODE,
                encode(&EnumerateRequest {
                    table,
                    resume_hash: 0,
                    end_hash: u64::MAX,
                    max_bytes: 1024,
                }),
            ),
            (proto::Write::OPCODE, encode(&write)),
            (
                proto::Remove::OPCODE,
                encode(&RemoveRequest {
                    table,
                    key: key.clone(),
                    rules: RejectRules::default(),
                    rifl: rampart_common::rifl::Rifl::NONE,
                }),
            ),
            (
                proto::Increment::OPCODE,
                encode(&IncrementRequest {
                    table,
                    key: Bytes::from_static(b"n"),
                    delta: 1,
                    rules: RejectRules::default(),
                    rifl: rampart_common::rifl::Rifl::NONE,
                }),
            ),
            (
                proto::MultiWrite::OPCODE,
                encode(&MultiWriteRequest {
                    objects: vec![write.clone()],
                }),
            ),
            (
                proto::MultiRemove::OPCODE,
                encode(&MultiRemoveRequest {
                    objects: vec![RemoveRequest {
                        table,
                        key: key.clone(),
                        rules: RejectRules::default(),
                        rifl: rampart_common::rifl::Rifl::NONE,
                    }],
                }),
            ),
        ];
        // Control requests are served without a lease.
        let take = TabletsRequest {
            owner: ServerId(1),
            epoch: TabletEpoch(1),
            tablets: vec![Tablet {
                table,
                start_hash: 0,
                end_hash: u64::MAX,
                owner: ServerId(1),
            }],
        };
        let reply = master
            .handle(proto::TakeTablets::OPCODE, encode(&take))
            .await;
        assert_eq!(reply.status(), Status::Ok);
        let reply = master
            .handle(proto::Ping::OPCODE, encode(&PingRequest {}))
            .await;
        assert_eq!(reply.status(), Status::Ok);
        // The coordinator's probe of an address learns who listens there, lease or not.
        let reply = master
            .handle(proto::Identify::OPCODE, encode(&PingRequest {}))
            .await;
        assert_eq!(reply.status(), Status::Ok);
        assert_eq!(
            <proto::IdentifyReply as rampart_common::rpc::WireMessage>::decode(
                Bytes::copy_from_slice(reply.payload())
            )
            .ok(),
            Some(proto::IdentifyReply {
                server: ServerId(1)
            })
        );

        for (opcode, payload) in &requests {
            assert!(needs_lease(*opcode));
            let reply = master.handle(*opcode, payload.clone()).await;
            assert_eq!(reply.status(), Status::Retry, "{opcode} without a lease");
            assert_eq!(reply.payload(), LEASE_LAPSED_DETAIL.as_bytes());
            if let Some(reply) = master.handle_now(*opcode, payload) {
                assert_eq!(reply.status(), Status::Retry, "{opcode} served now");
            }
        }
        lease.grant(lease.now(), Duration::from_secs(1));
        for (opcode, payload) in &requests {
            let reply = master.handle(*opcode, payload.clone()).await;
            assert_eq!(reply.status(), Status::Ok, "{opcode} with a lease");
        }
        clock.advance(Duration::from_secs(1));
        for (opcode, payload) in &requests {
            let reply = master.handle(*opcode, payload.clone()).await;
            assert_eq!(
                reply.status(),
                Status::Retry,
                "{opcode} after the lease ran out"
            );
        }
        // A graceful stop refuses every client request before its listener closes, and
        // a grant racing it changes nothing.
        lease.grant(lease.now(), Duration::from_secs(1));
        master.stop_serving("the server is stopping");
        lease.grant(lease.now(), Duration::from_secs(1));
        for (opcode, payload) in &requests {
            let reply = master.handle(*opcode, payload.clone()).await;
            assert_eq!(reply.status(), Status::Retry, "{opcode} once stopping");
            if let Some(reply) = master.handle_now(*opcode, payload) {
                assert_eq!(reply.status(), Status::Retry, "{opcode} served now");
            }
        }
    }

    #[tokio::test]
    async fn a_revoked_lease_makes_the_master_fail() {
        use crate::service::MasterService;
        let lease = Arc::new(Lease::new());
        let config = rampart_common::config::MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 1024 * 1024,
            value_bytes_max: 1024,
            ..Default::default()
        };
        let master = MasterService::new(ServerId(1), config).with_lease(Arc::clone(&lease));
        lease.revoke("declared crashed by the coordinator");
        let reason = tokio::time::timeout(Duration::from_secs(2), master.failed())
            .await
            .expect("failed() completes");
        assert!(reason.contains("declared crashed"), "{reason}");
    }

    #[tokio::test]
    async fn the_renewer_stops_at_shutdown() {
        let fake = Arc::new(FakeCoordinator::default());
        fake.lease_ms.store(1000, Ordering::SeqCst);
        let (addr, _stop) = start(Arc::clone(&fake)).await;
        let lease = Arc::new(Lease::new());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(renewer(&addr, &lease).run(async move {
            let _ = stopped.await;
        }));
        wait_until("the lease is granted", || lease.valid()).await;
        drop(stop);
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("the renewer ends")
            .expect("no panic");
    }
}
