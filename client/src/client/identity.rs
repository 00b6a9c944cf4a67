//! The client's identity: connecting (a client id from the coordinators), numbering
//! write-type operations under it for exactly-once retries, and keeping its lease —
//! a new id once it expired (module doc of `client`, "Client lease").

use parking_lot::RwLock;
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::ClientId;
use rampart_common::protocol::coordinator::{
    OpenClient, OpenClientRequest, RenewClientLease, RenewClientLeaseRequest,
};
use rampart_common::rpc::{RpcError, RpcPool};
use rampart_common::status::Status;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::state::{Client, ClientOptions, Inner};
use crate::error::ClientError;
use crate::failure_reporter::{FailureReporter, FAILURE_REPORTS_IN_FLIGHT_MAX};
use crate::tablet_map::TabletMapCache;
use crate::tracker::{Ticket, TicketsError, Tracker};

impl Client {
    /// Connects to the cluster through its coordinators (`host:port` each; an entry may
    /// list several, comma-separated, as `RAMPART_COORDINATOR` does) and fetches the
    /// tablet map. Any one reachable coordinator is enough: the client finds the leader.
    pub async fn connect<S: AsRef<str>>(coordinators: &[S]) -> Result<Client, ClientError> {
        Client::connect_with(coordinators, ClientOptions::default()).await
    }

    /// Like [`connect`](Self::connect), with explicit options.
    pub async fn connect_with<S: AsRef<str>>(
        coordinators: &[S],
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        let coordinators = CoordinatorSet::new(coordinators);
        if coordinators.is_empty() {
            return Err(ClientError::NoCoordinator(
                "no coordinator address given".into(),
            ));
        }
        let pool = RpcPool::new();
        let deadline = Instant::now() + options.deadline;
        let opened = match coordinators
            .call::<OpenClient>(&pool, &OpenClientRequest {}, deadline)
            .await
        {
            Ok(reply) => reply,
            Err(CoordinatorCallError::NoLeader { last, .. }) => {
                return Err(ClientError::NoCoordinator(last))
            }
            Err(CoordinatorCallError::Rpc(error)) => return Err(ClientError::from_rpc(error)),
        };
        let client = Client {
            inner: Arc::new(Inner {
                coordinators,
                options,
                pool,
                map: RwLock::new(Arc::new(TabletMapCache::default())),
                refreshing: tokio::sync::Mutex::new(()),
                watching: tokio::sync::Mutex::new(()),
                reporter: parking_lot::Mutex::new(FailureReporter::new()),
                reports_in_flight: Arc::new(tokio::sync::Semaphore::new(
                    FAILURE_REPORTS_IN_FLIGHT_MAX,
                )),
                identity: watch::Sender::new(Tracker::new(opened.client)),
                lease_lost: Arc::new(Notify::new()),
                explained: parking_lot::Mutex::new(HashMap::new()),
            }),
        };
        tokio::spawn(keep_identity(
            Arc::downgrade(&client.inner),
            Duration::from_millis(u64::from(opened.lease_ms)),
            Arc::clone(&client.inner.lease_lost),
        ));
        client.refresh_map(0, deadline).await?;
        Ok(client)
    }

    /// The options this client runs with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// The id the coordinators gave this client (its writes' completion records carry
    /// it). A new one once the lease of the last expired (`client` module doc, "Client
    /// lease").
    pub fn id(&self) -> ClientId {
        self.inner.identity.borrow().client()
    }

    /// A number for one write-type operation, kept by its retries.
    pub(super) async fn ticket(&self, deadline: Instant) -> Result<Ticket, ClientError> {
        self.tickets(1, deadline)
            .await?
            .pop()
            .ok_or_else(|| ClientError::Server("no number given".into()))
    }

    /// Numbers for `n` write-type operations (at most [`TICKETS_MAX`]), kept by their
    /// retries, under the client's current id. Waits until `deadline` while a slow
    /// operation holds the span of numbers full (`crate::tracker`, "Limits": then a
    /// `Timeout` of no attempt) or the id expired and no new one came yet (then
    /// `NoCoordinator`). Nothing was sent when it fails.
    ///
    /// [`TICKETS_MAX`]: crate::tracker::TICKETS_MAX
    pub(super) async fn tickets(
        &self,
        n: usize,
        deadline: Instant,
    ) -> Result<Vec<Ticket>, ClientError> {
        let mut identity = self.inner.identity.subscribe();
        loop {
            let tracker = Arc::clone(&identity.borrow_and_update());
            match tracker.tickets(n, deadline).await {
                Ok(tickets) => return Ok(tickets),
                Err(error @ TicketsError::SpanFull { .. }) => {
                    return Err(ClientError::Timeout {
                        attempts: 0,
                        last: error.to_string(),
                    })
                }
                Err(TicketsError::Expired(client)) => {
                    self.inner.lease_lost.notify_one();
                    match tokio::time::timeout_at(deadline, identity.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => {
                            return Err(ClientError::Server("the client is closing".into()))
                        }
                        Err(_) => {
                            return Err(ClientError::NoCoordinator(format!(
                                "the lease of client {client} expired and no coordinator \
                                 opened a new client id in time"
                            )))
                        }
                    }
                }
            }
        }
    }

    /// Notes how an operation numbered under `tracker`'s id ended: `LeaseExpired` says
    /// that id expired, and the lease task opens a new one for the operations after it.
    /// The operation itself is not sent again (its outcome is unknown).
    pub(super) fn settle<T>(&self, tracker: &Tracker, result: &Result<T, ClientError>) {
        if matches!(result, Err(ClientError::LeaseExpired(_))) {
            tracker.expire();
            self.inner.lease_lost.notify_one();
        }
    }

    /// [`settle`](Self::settle) for a multi-op whose objects `tickets` numbered.
    pub(super) fn settle_all<T>(
        &self,
        tickets: &[Ticket],
        done: Result<Vec<Result<T, ClientError>>, ClientError>,
    ) -> Result<Vec<Result<T, ClientError>>, ClientError> {
        if let (Some(ticket), Ok(results)) = (tickets.first(), &done) {
            if let Some(expired) = results
                .iter()
                .find(|result| matches!(result, Err(ClientError::LeaseExpired(_))))
            {
                self.settle(ticket.tracker(), expired);
            }
        }
        done
    }
}

/// Keeps the client behind `inner` an id with a lease (first `lease` long): renews it
/// every third of its length, and once it expired — the coordinators say so to a
/// renewal, or an operation was refused `ClientLeaseExpired` by a master and woke this
/// task through `lease_lost` — opens a new id and numbers the operations after under it
/// (`client` module doc, "Client lease"). A renewal or an open that fails is tried again
/// within a second. Ends when the client is dropped.
pub(super) async fn keep_identity(
    inner: std::sync::Weak<Inner>,
    lease: Duration,
    lease_lost: Arc<Notify>,
) {
    let mut lease = lease;
    let mut next = renew_interval(lease);
    loop {
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = lease_lost.notified() => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let tracker = Arc::clone(&inner.identity.borrow());
        let client = tracker.client();
        if !tracker.is_expired() {
            let request = RenewClientLeaseRequest { client };
            let deadline = Instant::now() + renew_interval(lease).min(LEASE_RENEW_TIMEOUT);
            match inner
                .coordinators
                .call::<RenewClientLease>(&inner.pool, &request, deadline)
                .await
            {
                Ok(reply) => {
                    lease = Duration::from_millis(u64::from(reply.lease_ms));
                    next = renew_interval(lease);
                    continue;
                }
                Err(CoordinatorCallError::Rpc(RpcError::Status {
                    status: Status::ClientLeaseExpired,
                    detail,
                    ..
                })) => {
                    tracing::warn!(%client, %detail, "client lease expired; opening a new client id");
                    tracker.expire();
                }
                Err(error) => {
                    tracing::debug!(%client, %error, "client lease not renewed; trying again");
                    next = renew_interval(lease).min(LEASE_RETRY_PAUSE);
                    continue;
                }
            }
        }
        let deadline = Instant::now() + LEASE_RENEW_TIMEOUT;
        match inner
            .coordinators
            .call::<OpenClient>(&inner.pool, &OpenClientRequest {}, deadline)
            .await
        {
            Ok(opened) => {
                tracing::warn!(
                    expired = %client,
                    new = %opened.client,
                    "client lease expired; writes go on under a new client id"
                );
                inner.identity.send_replace(Tracker::new(opened.client));
                lease = Duration::from_millis(u64::from(opened.lease_ms));
                next = renew_interval(lease);
            }
            Err(error) => {
                tracing::debug!(expired = %client, %error, "no new client id yet; trying again");
                next = renew_interval(lease).min(LEASE_RETRY_PAUSE);
            }
        }
    }
}

/// How often a lease of length `lease` is renewed: three times per lease, so that two
/// renewals may fail before it runs out.
fn renew_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(10))
}

/// Pause before a renewal or an open that failed is tried again.
const LEASE_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Deadline of one lease renewal.
const LEASE_RENEW_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::test_support::{one_master_map, serve};
    use bytes::Bytes;
    use rampart_common::ids::{TableId, Version};
    use rampart_common::protocol::coordinator::{
        GetTabletMap, OpenClientReply, RenewClientLeaseReply, ReportFailure,
    };
    use rampart_common::protocol::master::{Write, WriteReply, WriteRequest};
    use rampart_common::rifl::Rifl;
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Reply, Rpc, Service};
    use rampart_common::tablet::TabletMap;

    /// Client ids whose lease expired, as the coordinators and masters know them.
    type Expired = Arc<parking_lot::Mutex<std::collections::HashSet<ClientId>>>;

    /// A coordinator that numbers the clients it opens from 1, and renews their leases
    /// (`lease_ms` long) until they are in `expired`.
    #[derive(Debug)]
    struct LeasingCoordinator {
        map: TabletMap,
        lease_ms: u32,
        opened: std::sync::atomic::AtomicU64,
        expired: Expired,
    }

    impl Service for LeasingCoordinator {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            let reply = match opcode {
                GetTabletMap::OPCODE => Reply::ok(&self.map),
                OpenClient::OPCODE => {
                    let opened = self
                        .opened
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Reply::ok(&OpenClientReply {
                        client: ClientId(opened + 1),
                        lease_ms: self.lease_ms,
                    })
                }
                RenewClientLease::OPCODE => {
                    match Reply::decode::<RenewClientLeaseRequest>(payload) {
                        Ok(request) if self.expired.lock().contains(&request.client) => {
                            Reply::error(Status::ClientLeaseExpired, "did not renew")
                        }
                        Ok(_) => Reply::ok(&RenewClientLeaseReply {
                            lease_ms: self.lease_ms,
                        }),
                        Err(reply) => reply,
                    }
                }
                ReportFailure::OPCODE => Reply::ok(&()),
                _ => Reply::error(Status::UnknownOpcode, "leasing coordinator"),
            };
            Box::pin(async move { reply })
        }
    }

    /// A master that refuses the writes of clients in `expired` (`ClientLeaseExpired`),
    /// answers `Retry` to writes of key `slow` (as when the record of an earlier write
    /// is being recovered), applies the others, and logs every write it is sent.
    #[derive(Debug)]
    struct LeaseCheckingMaster {
        expired: Expired,
        sent: parking_lot::Mutex<Vec<(Bytes, Rifl)>>,
    }

    impl LeaseCheckingMaster {
        /// The identities of the writes of `key` it was sent, in order.
        fn sent_of(&self, key: &[u8]) -> Vec<Rifl> {
            let sent = self.sent.lock();
            sent.iter()
                .filter(|(k, _)| &k[..] == key)
                .map(|(_, rifl)| *rifl)
                .collect()
        }
    }

    impl Service for LeaseCheckingMaster {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            let reply = match opcode {
                Write::OPCODE => match Reply::decode::<WriteRequest>(payload) {
                    Ok(request) => {
                        let mut sent = self.sent.lock();
                        sent.push((request.key.clone(), request.rifl));
                        if self.expired.lock().contains(&request.rifl.client) {
                            Reply::error(Status::ClientLeaseExpired, "open a new client")
                        } else if &request.key[..] == b"slow" {
                            Reply::ok(&WriteReply {
                                status: Status::Retry,
                                version: Version(0),
                            })
                        } else {
                            Reply::ok(&WriteReply {
                                status: Status::Ok,
                                version: Version(sent.len() as u64),
                            })
                        }
                    }
                    Err(reply) => reply,
                },
                _ => Reply::error(Status::UnknownOpcode, "lease-checking master"),
            };
            Box::pin(async move { reply })
        }
    }

    /// A lease-checking master and a leasing coordinator (leases `lease_ms` long) over
    /// `expired`, and a client of them whose operations end after 5 s.
    async fn leased_client(lease_ms: u32) -> (Expired, Arc<LeaseCheckingMaster>, Client) {
        let expired = Expired::default();
        let master = Arc::new(LeaseCheckingMaster {
            expired: Arc::clone(&expired),
            sent: parking_lot::Mutex::new(Vec::new()),
        });
        let coordinator = serve(Arc::new(LeasingCoordinator {
            map: one_master_map(TableId(1), serve(Arc::clone(&master)).await),
            lease_ms,
            opened: std::sync::atomic::AtomicU64::new(0),
            expired: Arc::clone(&expired),
        }))
        .await;
        let options = ClientOptions {
            deadline: Duration::from_secs(5),
            ..ClientOptions::default()
        };
        let client = Client::connect_with(&[coordinator], options)
            .await
            .expect("connect");
        (expired, master, client)
    }

    #[tokio::test]
    async fn a_write_refused_for_an_expired_lease_ends_unknown_and_later_ones_use_a_new_id() {
        // Leases far longer than the test: the expiry is learned from the master.
        let (expired, master, client) = leased_client(60_000).await;
        let table = TableId(1);
        assert_eq!(client.id(), ClientId(1));
        client
            .write(table, b"before", b"v")
            .await
            .expect("under the first id");
        // A write in flight, tried again and again, when the lease expires.
        let slow = {
            let client = client.clone();
            tokio::spawn(async move { client.write(table, b"slow", b"v").await })
        };
        while master.sent_of(b"slow").is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        expired.lock().insert(ClientId(1));
        let error = slow
            .await
            .expect("the task ends")
            .expect_err("refused under an expired id");
        assert!(matches!(error, ClientError::LeaseExpired(_)), "{error:?}");
        assert!(error.outcome_unknown(), "{error}");
        // The next write goes on under a new id.
        client
            .write(table, b"after", b"v")
            .await
            .expect("under a new id");
        assert_eq!(client.id(), ClientId(2));
        let after = master.sent_of(b"after");
        assert_eq!(
            after,
            [Rifl {
                client: ClientId(2),
                seq: 1,
                ack: 0
            }]
        );
        // The write in flight was sent under its own identity only: never under the new
        // id, where it would have been a second write.
        let slow = master.sent_of(b"slow");
        assert!(slow.len() >= 2, "{slow:?}");
        assert!(slow.iter().all(|rifl| *rifl == slow[0]), "{slow:?}");
        assert_eq!(slow[0].client, ClientId(1));
    }

    #[tokio::test]
    async fn a_renewal_told_the_lease_expired_opens_a_new_id_for_the_writes_after() {
        // Renewed every 50 ms; the coordinators expire the first id (the client was cut
        // off, say) and say so to its next renewal.
        let (expired, master, client) = leased_client(150).await;
        let table = TableId(1);
        client
            .write(table, b"before", b"v")
            .await
            .expect("under the first id");
        expired.lock().insert(ClientId(1));
        let deadline = Instant::now() + Duration::from_secs(2);
        while client.id() == ClientId(1) {
            assert!(Instant::now() < deadline, "no new id opened");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(client.id(), ClientId(2));
        client
            .write(table, b"after", b"v")
            .await
            .expect("under the new id");
        assert_eq!(master.sent_of(b"before")[0].client, ClientId(1));
        assert_eq!(master.sent_of(b"after")[0].client, ClientId(2));
    }
}
