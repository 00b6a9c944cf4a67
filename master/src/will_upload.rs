//! `WillUploader`: keeps the coordinator's copy of this master's will current (docs/design.md
//! §5 "Tablet profiles and wills").
//!
//! Every [`WILL_CHECK_INTERVAL`] the uploader computes the will (a closure the caller
//! gives, in the server `move || store.lock().will()`, so this module depends on no part
//! of the store) and uploads it with `UploadWill` when nothing was uploaded yet or when
//! it [changed materially](rampart_common::will::Will::changed_materially) since the last
//! upload, by [`WILL_CHANGE_FRACTION`] of the partition limits. A will that moved less
//! is still good enough for recovery: partitions a little over their limit replay a
//! little slower, nothing is lost (coverage changes are always material).
//!
//! * [`WillTracker`] is the decision, synchronous: what was last uploaded, and whether a
//!   new will must go.
//! * [`WillUploader`] is the async driver.
//!
//! # Failure handling
//! An upload that fails (no coordinator leader within [`WILL_UPLOAD_TIMEOUT`], a refusal)
//! is retried at the next tick with the will of that moment; the last *successful*
//! upload stays the reference. `UploadWill` replaces the coordinator's copy whole, so
//! sending it twice is harmless.
//!
//! Computing the will walks the tablet profiles under the store lock: a few thousand
//! bucket counts, microseconds, once a second.

use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{UploadWill, UploadWillRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::will::Will;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

/// How often the will is recomputed and compared with the one uploaded.
pub const WILL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A partition whose bytes or records moved by more than this fraction of the limit
/// makes the will worth uploading again.
pub const WILL_CHANGE_FRACTION: f64 = 0.1;

/// Deadline of one upload (one round over the coordinators); shorter than the check
/// interval so uploads never overlap.
pub const WILL_UPLOAD_TIMEOUT: Duration = Duration::from_millis(900);

const _: () = assert!(WILL_UPLOAD_TIMEOUT.as_nanos() < WILL_CHECK_INTERVAL.as_nanos());

/// What was last uploaded, and whether a will must go; see the module doc.
#[derive(Debug, Clone)]
pub struct WillTracker {
    /// The will the coordinator holds, as far as this master knows (`None`: none
    /// uploaded yet).
    uploaded: Option<Will>,
    /// [`WILL_CHANGE_FRACTION`] unless configured.
    fraction: f64,
}

impl WillTracker {
    /// A tracker with nothing uploaded, deeming a move of more than `fraction` of the
    /// limits material.
    ///
    /// # Panics
    /// If `fraction` is not a finite non-negative number.
    pub fn new(fraction: f64) -> WillTracker {
        assert!(
            fraction.is_finite() && fraction >= 0.0,
            "a change fraction of {fraction} means nothing"
        );
        WillTracker {
            uploaded: None,
            fraction,
        }
    }

    /// Whether `will` must be uploaded.
    pub fn should_upload(&self, will: &Will) -> bool {
        match &self.uploaded {
            None => true,
            Some(uploaded) => will.changed_materially(uploaded, self.fraction),
        }
    }

    /// `will` was uploaded.
    pub fn uploaded(&mut self, will: Will) {
        self.uploaded = Some(will);
    }

    /// The will last uploaded.
    pub fn last_uploaded(&self) -> Option<&Will> {
        self.uploaded.as_ref()
    }
}

/// Uploads a master's will when it changes; see the module doc.
pub struct WillUploader<F> {
    server: ServerId,
    /// Computes the current will.
    will: F,
    tracker: WillTracker,
    coordinators: Arc<CoordinatorSet>,
    pool: Arc<RpcPool>,
    interval: Duration,
}

impl<F> std::fmt::Debug for WillUploader<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WillUploader")
            .field("server", &self.server)
            .field("tracker", &self.tracker)
            .field("interval", &self.interval)
            .finish()
    }
}

impl<F: Fn() -> Will + Send> WillUploader<F> {
    /// An uploader of server `server`'s will, computed by `will`, to `coordinators`,
    /// checking every [`WILL_CHECK_INTERVAL`] against [`WILL_CHANGE_FRACTION`].
    pub fn new(
        server: ServerId,
        will: F,
        coordinators: Arc<CoordinatorSet>,
        pool: Arc<RpcPool>,
    ) -> WillUploader<F> {
        WillUploader {
            server,
            will,
            tracker: WillTracker::new(WILL_CHANGE_FRACTION),
            coordinators,
            pool,
            interval: WILL_CHECK_INTERVAL,
        }
    }

    /// The same uploader, checking every `interval` (tests).
    ///
    /// # Panics
    /// If `interval` is zero.
    pub fn with_interval(mut self, interval: Duration) -> WillUploader<F> {
        assert!(!interval.is_zero(), "a check interval of zero would spin");
        self.interval = interval;
        self
    }

    /// Checks and uploads until `shutdown` completes. The first check is at once.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            let will = (self.will)();
            if !self.tracker.should_upload(&will) {
                continue;
            }
            let request = UploadWillRequest {
                server: self.server,
                will,
            };
            let deadline = Instant::now() + self.interval.min(WILL_UPLOAD_TIMEOUT);
            let upload = self
                .coordinators
                .call_round::<UploadWill>(&self.pool, &request, deadline);
            let result = tokio::select! {
                _ = &mut shutdown => return,
                result = upload => result,
            };
            match result {
                Ok(()) => {
                    tracing::debug!(
                        server = %self.server,
                        partitions = request.will.partitions.len(),
                        "will uploaded"
                    );
                    self.tracker.uploaded(request.will);
                }
                Err(error) => {
                    tracing::warn!(server = %self.server, %error, "will not uploaded; retrying at the next check")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use parking_lot::Mutex;
    use rampart_common::ids::TableId;
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Reply, Rpc, RpcServer, Service};
    use rampart_common::status::Status;
    use rampart_common::tablet::HashRange;
    use rampart_common::will::Partition;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::net::TcpListener;

    fn will(bytes: u64) -> Will {
        Will {
            bytes_max: 1000,
            records_max: 1000,
            partitions: vec![Partition {
                tablets: vec![HashRange::whole(TableId(1))],
                bytes,
                records: 1,
            }],
        }
    }

    #[test]
    fn the_first_will_is_always_uploaded() {
        let tracker = WillTracker::new(0.1);
        assert!(tracker.should_upload(&will(0)));
    }

    #[test]
    fn only_a_material_change_is_uploaded_again() {
        let mut tracker = WillTracker::new(0.1);
        tracker.uploaded(will(100));
        assert!(!tracker.should_upload(&will(100)));
        assert!(!tracker.should_upload(&will(200)));
        assert!(tracker.should_upload(&will(201)));
    }

    /// Records `UploadWill`s; refuses them while `refuse` is set.
    #[derive(Debug, Default)]
    struct FakeCoordinator {
        uploads: Mutex<Vec<UploadWillRequest>>,
        refuse: AtomicBool,
    }

    impl Service for FakeCoordinator {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                if opcode != UploadWill::OPCODE {
                    return Reply::error(Status::UnknownOpcode, "fake");
                }
                if self.refuse.load(Ordering::SeqCst) {
                    return Reply::error(Status::Internal, "refused");
                }
                match Reply::decode::<UploadWillRequest>(payload) {
                    Ok(request) => {
                        self.uploads.lock().push(request);
                        Reply::ok(&())
                    }
                    Err(reply) => reply,
                }
            })
        }
    }

    async fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn the_uploader_sends_the_first_will_and_then_only_material_changes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let fake = Arc::new(FakeCoordinator::default());
        fake.refuse.store(true, Ordering::SeqCst);
        tokio::spawn(RpcServer::run(
            listener,
            Arc::clone(&fake),
            std::future::pending(),
        ));
        let bytes = Arc::new(Mutex::new(100u64));
        let current = Arc::clone(&bytes);
        let uploader = WillUploader::new(
            ServerId(4),
            move || will(*current.lock()),
            Arc::new(CoordinatorSet::new(&[addr.as_str()])),
            Arc::new(RpcPool::new()),
        )
        .with_interval(Duration::from_millis(10));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(uploader.run(async move {
            let _ = stopped.await;
        }));
        // Refused uploads are retried at the next tick.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(fake.uploads.lock().is_empty());
        fake.refuse.store(false, Ordering::SeqCst);
        wait_until("the first will is uploaded", || {
            !fake.uploads.lock().is_empty()
        })
        .await;
        // A small change (≤ 10% of the limit) is not uploaded...
        *bytes.lock() = 150;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(fake.uploads.lock().len(), 1);
        // ...a large one is, once.
        *bytes.lock() = 400;
        wait_until("the changed will is uploaded", || {
            fake.uploads.lock().len() == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(stop);
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("the uploader stops at shutdown")
            .expect("no panic");
        let uploads = fake.uploads.lock();
        assert_eq!(uploads.len(), 2);
        assert_eq!(uploads[0].server, ServerId(4));
        assert_eq!(uploads[0].will, will(100));
        assert_eq!(uploads[1].will, will(400));
    }
}
