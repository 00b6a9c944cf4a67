//! Client leases on a master (`rampart_common::rifl`, "Leases"): [`ClientLeaseChecker`],
//! the driver around `crate::client_lease_cache` (what this master knows of its clients'
//! leases, kept in the `ObjectStore` and checked under its lock when a tracked operation
//! executes), which
//! asks the coordinators' leader (`CheckClientLeases`) and drops the completion records of
//! clients whose expiry is committed.
//!
//! # Why a master checks before it executes
//! Records of an expired client are dropped. Were its retry executed afterwards, it
//! would apply twice. So a tracked operation that has no record here executes only while
//! this master knows its client's lease holds: the leader's answer, counted from when
//! this master *sent* the question (before the leader read its clock, so it ends first),
//! less [`CLIENT_LEASE_MARGIN`]. The leader commits no expiry before the lease it
//! answered ends (`coordinator::client_leases`), and this master drops records only for
//! an expiry committed — and drops the cached lease with them, so a retry that comes
//! later asks again and is refused. An answer that the lease holds, to a question asked
//! before the expiry was learned and handled after, is ignored (`ClientLeaseCache`
//! remembers expiries for a lease's length).
//!
//! The write path asks before it stages ([`ClientLeaseChecker::ensure`]), so the check
//! under the lock almost always passes; when it does not (the lease ran out in
//! between), the operation is answered `Retry`. One question per client per lease
//! (30 s) and master; the first write of a client on a master waits for it.
//!
//! # Freeing records
//! Every [`SWEEP_INTERVAL`] the checker asks about the clients that have records here
//! and no lease known to hold (those that stopped writing here), in batches of at most
//! `CLIENT_LEASE_CHECKS_MAX`; the expired ones' records and acknowledgements go, and
//! their log entries are dead for the cleaner. Records move with their objects through
//! recovery, so a recovery master drops them the same way.
//!
//! # Failure handling
//! No coordinator answers: the write is answered `Retry` (clients retry); the sweep tries
//! again at its next round. An expired client's write, or one whose lease ran out and
//! whose expiry is pending, is answered `ClientLeaseExpired`.

use parking_lot::Mutex;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::{ClientId, ServerId};
use rampart_common::protocol::coordinator::{
    CheckClientLeases, CheckClientLeasesRequest, ClientLeaseState, CLIENT_LEASE_CHECKS_MAX,
};
use rampart_common::rifl::CLIENT_LEASE;
use rampart_common::rpc::{Reply, RpcPool};
use rampart_common::status::Status;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::object_store::ObjectStore;

/// Taken off every lease the leader answers: the two clocks may run at slightly
/// different rates.
pub const CLIENT_LEASE_MARGIN: Duration = Duration::from_millis(50);

/// How often the checker looks for clients whose records may be freed.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(CLIENT_LEASE.as_secs() / 2);

/// Deadline of one question to the coordinators.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Asks the coordinators about client leases for one master; see the module doc.
#[derive(Debug)]
pub struct ClientLeaseChecker {
    id: ServerId,
    store: Arc<Mutex<ObjectStore>>,
    coordinators: CoordinatorSet,
    pool: RpcPool,
}

impl ClientLeaseChecker {
    /// The checker of master `id`, whose store it keeps (and makes require leases).
    pub fn new(
        id: ServerId,
        store: Arc<Mutex<ObjectStore>>,
        coordinators: &[String],
    ) -> ClientLeaseChecker {
        store.lock().require_client_leases();
        ClientLeaseChecker {
            id,
            store,
            coordinators: CoordinatorSet::new(coordinators),
            pool: RpcPool::new(),
        }
    }

    /// Makes sure `client`'s lease is known to hold before its operation is staged:
    /// asks the leader unless it is known already. `Err` is the reply to answer.
    pub async fn ensure(&self, client: ClientId) -> Result<(), Reply> {
        if self.store.lock().client_lease_valid(client, Instant::now()) {
            return Ok(());
        }
        let states = self.check(vec![client]).await.map_err(|why| {
            Reply::error(Status::Retry, format!("lease of {client} unknown: {why}"))
        })?;
        match states.first() {
            Some(ClientLeaseState::Valid { .. }) => Ok(()),
            Some(ClientLeaseState::Lapsed | ClientLeaseState::Expired) => Err(Reply::error(
                Status::ClientLeaseExpired,
                format!("{client} stopped renewing its lease; open a new client"),
            )),
            None => Err(Reply::error(
                Status::Retry,
                "no answer about the client lease",
            )),
        }
    }

    /// Asks the leader about `clients` (at most `CLIENT_LEASE_CHECKS_MAX`), notes the
    /// leases that hold, and drops the records of the expired clients. Returns the
    /// answers, in order.
    async fn check(&self, clients: Vec<ClientId>) -> Result<Vec<ClientLeaseState>, String> {
        let sent = Instant::now();
        let deadline = tokio::time::Instant::now() + CHECK_TIMEOUT;
        let request = CheckClientLeasesRequest {
            clients: clients.clone(),
        };
        let reply = self
            .coordinators
            .call::<CheckClientLeases>(&self.pool, &request, deadline)
            .await
            .map_err(|e| e.to_string())?;
        if reply.leases.len() != clients.len() {
            return Err(format!(
                "{} answers for {} clients",
                reply.leases.len(),
                clients.len()
            ));
        }
        let mut store = self.store.lock();
        for (&client, state) in clients.iter().zip(&reply.leases) {
            match *state {
                ClientLeaseState::Valid { ms } => {
                    let lease = Duration::from_millis(u64::from(ms));
                    if let Some(lease) = lease.checked_sub(CLIENT_LEASE_MARGIN) {
                        store.note_client_lease(client, sent + lease);
                    }
                }
                ClientLeaseState::Lapsed => {}
                ClientLeaseState::Expired => {
                    let dropped = store.expire_client(client);
                    if dropped > 0 {
                        tracing::debug!(master = %self.id, %client, records = dropped, "client expired: its completion records dropped");
                    }
                }
            }
        }
        Ok(reply.leases)
    }

    /// Runs until `shutdown` completes: every [`SWEEP_INTERVAL`], asks about the
    /// clients with records here and no lease known to hold, and drops those expired.
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
            }
            if let Err(why) = self.sweep().await {
                tracing::debug!(master = %self.id, %why, "client leases not checked; next round");
            }
        }
    }

    /// Asks about the clients with records here and no lease known to hold, and drops
    /// the records of those expired; how many clients expired.
    pub async fn sweep(&self) -> Result<usize, String> {
        let unknown = self.store.lock().clients_to_check(Instant::now());
        let mut expired = 0;
        for batch in unknown.chunks(CLIENT_LEASE_CHECKS_MAX) {
            let states = self.check(batch.to_vec()).await?;
            expired += states
                .iter()
                .filter(|s| **s == ClientLeaseState::Expired)
                .count();
        }
        Ok(expired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object_store::{Batch, WriteOp};
    use bytes::Bytes;
    use rampart_common::config::MasterConfig;
    use rampart_common::ids::TableId;
    use rampart_common::protocol::coordinator::CheckClientLeasesReply;
    use rampart_common::reject::RejectRules;
    use rampart_common::rifl::Rifl;
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Rpc, RpcServer, Service};
    use rampart_common::tablet::Tablet;
    use std::collections::HashMap;

    const A: ClientId = ClientId(1);
    const B: ClientId = ClientId(2);

    /// The lease the fake leader answers by default.
    const SHORT_MS: u64 = 1_000;
    const CLIENT_LEASE_MARGIN_MS: u64 = CLIENT_LEASE_MARGIN.as_millis() as u64;

    /// Answers `CheckClientLeases` as `states` says (a client not in it: valid
    /// [`SHORT_MS`]).
    #[derive(Debug)]
    struct FakeLeader {
        states: Mutex<HashMap<ClientId, ClientLeaseState>>,
    }

    impl Service for FakeLeader {
        fn handle(&self, opcode: Opcode, payload: bytes::Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                if opcode != CheckClientLeases::OPCODE {
                    return Reply::error(Status::UnknownOpcode, "fake leader");
                }
                match Reply::decode::<CheckClientLeasesRequest>(payload) {
                    Ok(request) => {
                        let states = self.states.lock();
                        Reply::ok(&CheckClientLeasesReply {
                            leases: request
                                .clients
                                .iter()
                                .map(|c| {
                                    states.get(c).copied().unwrap_or(ClientLeaseState::Valid {
                                        ms: SHORT_MS as u32,
                                    })
                                })
                                .collect(),
                        })
                    }
                    Err(reply) => reply,
                }
            })
        }
    }

    fn increment(client: ClientId) -> WriteOp {
        WriteOp::Increment {
            table: TableId(1),
            key: Bytes::from_static(b"n"),
            delta: 1,
            rules: RejectRules::default(),
            rifl: Rifl {
                client,
                seq: 1,
                ack: 0,
            },
        }
    }

    #[tokio::test]
    async fn the_checker_learns_leases_refuses_expired_clients_and_frees_their_records() {
        let leader = Arc::new(FakeLeader {
            states: Mutex::new(HashMap::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(RpcServer::run(
            listener,
            Arc::clone(&leader),
            std::future::pending(),
        ));
        let mut store = ObjectStore::new(ServerId(1), MasterConfig::default());
        store.take_tablets(&[Tablet {
            table: TableId(1),
            start_hash: 0,
            end_hash: u64::MAX,
            owner: ServerId(1),
        }]);
        let store = Arc::new(Mutex::new(store));
        let checker = ClientLeaseChecker::new(ServerId(1), Arc::clone(&store), &[addr]);
        for client in [A, B] {
            checker.ensure(client).await.expect("valid leases");
            let mut store = store.lock();
            let mut batch = Batch::new();
            assert_eq!(
                store.stage(&mut batch, &increment(client)).status,
                Status::Ok
            );
            store.seal();
            store.publish(batch);
        }
        assert_eq!(store.lock().completion_records(), 2);
        // The leases are known (for a second): the sweep asks about nobody yet.
        assert_eq!(checker.sweep().await, Ok(0));
        assert_eq!(store.lock().completion_records(), 2);

        // Once the leases known ran out: A lapsed (expiry pending): refused, its record
        // kept. B expired: refused, its record freed.
        leader.states.lock().insert(A, ClientLeaseState::Lapsed);
        leader.states.lock().insert(B, ClientLeaseState::Expired);
        tokio::time::sleep(Duration::from_millis(SHORT_MS - CLIENT_LEASE_MARGIN_MS)).await;
        let refused = checker.ensure(A).await.expect_err("lapsed");
        assert_eq!(refused.status(), Status::ClientLeaseExpired);
        assert_eq!(
            store.lock().completion_records(),
            2,
            "a lapsed lease keeps records"
        );
        assert_eq!(checker.sweep().await, Ok(1));
        assert_eq!(store.lock().completion_records(), 1, "B's record is freed");
        let refused = checker.ensure(B).await.expect_err("expired");
        assert_eq!(refused.status(), Status::ClientLeaseExpired);
    }

    #[tokio::test]
    async fn with_no_coordinator_answering_a_write_is_told_to_retry_not_refused() {
        // A port with nothing listening: the coordinators are unreachable.
        let gone = {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            listener.local_addr().expect("addr").to_string()
        };
        let store = Arc::new(Mutex::new(ObjectStore::new(
            ServerId(1),
            MasterConfig::default(),
        )));
        let checker = ClientLeaseChecker::new(ServerId(1), Arc::clone(&store), &[gone]);
        let reply = checker.ensure(A).await.expect_err("no lease known");
        assert_eq!(
            reply.status(),
            Status::Retry,
            "the client retries; nothing is lost"
        );
        assert!(checker.sweep().await.is_ok(), "nothing to ask about yet");
        assert!(!store.lock().client_lease_valid(A, Instant::now()));
    }
}
