//! What a `Client` is: its options, the values it returns and takes ([`Object`],
//! [`WriteItem`]), and the state its clones share.

use bytes::Bytes;
use parking_lot::RwLock;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::{ServerId, TableId, Version};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::RpcPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::failure_reporter::FailureReporter;
use crate::tablet_map::TabletMapCache;
use crate::tracker::Tracker;

/// Tunables of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long one operation may take, retries included.
    pub deadline: Duration,
    /// First pause between retries on masters; doubles up to `backoff_max`, each pause
    /// drawn from the upper half of its step (`rampart_common::backoff`). (Coordinator
    /// calls pause as `rampart_common::coordinator_set` says.)
    pub backoff_min: Duration,
    /// Longest pause between retries on masters.
    pub backoff_max: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: Duration::from_secs(10),
            backoff_min: Duration::from_millis(2),
            backoff_max: Duration::from_millis(200),
        }
    }
}

/// An object read from a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// The value.
    pub value: Bytes,
    /// Its version.
    pub version: Version,
}

/// One object of a [`Client::multi_write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteItem {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Bytes,
    /// The new value.
    pub value: Bytes,
    /// When to refuse.
    pub rules: RejectRules,
}

/// A connection to a Rampart cluster. Cheap to clone; clones share connections and
/// the tablet map.
#[derive(Clone, Debug)]
pub struct Client {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    /// The coordinators given to `connect`, and their leader once found.
    pub(super) coordinators: CoordinatorSet,
    pub(super) options: ClientOptions,
    pub(super) pool: RpcPool,
    /// The cached map; replaced whole on refresh.
    pub(super) map: RwLock<Arc<TabletMapCache>>,
    /// Serialises refreshes so a burst of `UnknownTablet`s fetches the map once.
    pub(super) refreshing: tokio::sync::Mutex<()>,
    /// Serialises watches of the map (`WatchTabletMap`), so that the operations waiting
    /// for a crashed owner's tablets hold one watch at a time.
    pub(super) watching: tokio::sync::Mutex<()>,
    /// Which unreachable masters to report, and when. A `parking_lot` mutex: taken for
    /// a map lookup, never across an `.await`.
    pub(super) reporter: parking_lot::Mutex<FailureReporter>,
    /// Bounds the reports in flight ([`FAILURE_REPORTS_IN_FLIGHT_MAX`]).
    ///
    /// [`FAILURE_REPORTS_IN_FLIGHT_MAX`]: crate::failure_reporter::FAILURE_REPORTS_IN_FLIGHT_MAX
    pub(super) reports_in_flight: Arc<tokio::sync::Semaphore>,
    /// This client's id and the numbers of its writes under it (exactly-once retries).
    /// Replaced by the lease task ([`keep_identity`]) once the id's lease expired; a
    /// watch, so that operations waiting for the new id wake when it comes.
    ///
    /// [`keep_identity`]: super::identity::keep_identity
    pub(super) identity: watch::Sender<Arc<Tracker>>,
    /// Wakes the lease task at once: an operation found the id expired.
    pub(super) lease_lost: Arc<Notify>,
    /// What the cluster last said of an owner whose operations timed out, and when
    /// (reused for [`EXPLANATION_REUSE`], so that a burst of timeouts asks once).
    ///
    /// [`EXPLANATION_REUSE`]: super::retry::EXPLANATION_REUSE
    pub(super) explained: parking_lot::Mutex<HashMap<ServerId, (Instant, Option<String>)>>,
}
