//! `ClientLeases`: the leader's view of client leases (`rampart_common::rifl`), and
//! `ClientExpirer`, the task that commits the expiry of clients that stopped renewing.
//!
//! Which clients are open is committed state (`Command::OpenClient`,
//! `Command::ExpireClients`); *when* each last renewed is the leader's alone, kept in
//! memory and never replicated — renewals are frequent and carry nothing worth a Raft
//! entry. A member that becomes leader counts every open client as renewed at that
//! moment, so leadership changes only ever lengthen leases.
//!
//! # Guarantees
//! * A lease answered to anyone (a renewal to its client, a check to a master) ends no
//!   later than the expiry that any leader may commit. The leader answers only after a
//!   read barrier that confirms it still leads; the time it counts from is read *before*
//!   the barrier, so a later leader — elected after that barrier's quorum answered —
//!   first sees the client after it, and counts from later.
//! * An expiry, once committed, is final: an expired client is never open again (ids
//!   are never reused), so masters may drop its records for good.
//! * The holder of a lease counts it from when it *sent* its request, before the leader
//!   read its clock, so its end comes first (clocks of equal rate; see `master::lease`).
//!
//! # Limits
//! At most `CLIENTS_MAX` open clients (one entry each here); one expiry proposal names at
//! most `EXPIRE_CLIENTS_MAX` clients, the rest wait for the next round.

use parking_lot::Mutex;
use rampart_common::ids::ClientId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::node::RaftNode;
use crate::state::{Command, CommandResult, EXPIRE_CLIENTS_MAX};

/// How often the leader looks for expired clients (a fraction of the lease: an expiry
/// is committed at most this late).
pub fn expiry_interval(lease: Duration) -> Duration {
    (lease / 8).max(Duration::from_millis(10))
}

/// When each open client last renewed, as this member saw it while leading. Pure.
#[derive(Debug)]
pub struct ClientLeases {
    lease: Duration,
    /// When this member began leading; `None` while it does not.
    leading_since: Option<Instant>,
    /// Renewals seen since then.
    renewed: HashMap<ClientId, Instant>,
}

impl ClientLeases {
    /// No leadership yet; leases of length `lease`.
    pub fn new(lease: Duration) -> ClientLeases {
        ClientLeases {
            lease,
            leading_since: None,
            renewed: HashMap::new(),
        }
    }

    /// The length of a lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Notes whether this member leads at `now`: becoming leader counts every open
    /// client as renewed now; losing the lead forgets every renewal.
    pub fn observe_leadership(&mut self, leading: bool, now: Instant) {
        match (leading, self.leading_since) {
            (true, None) => {
                self.leading_since = Some(now);
                self.renewed.clear();
            }
            (false, Some(_)) => {
                self.leading_since = None;
                self.renewed.clear();
            }
            _ => {}
        }
    }

    /// Records that open client `client` renewed at `at` (read before the barrier that
    /// confirmed leadership, after which the caller noted it leads); how long its lease
    /// lasts from then. `None` if it ran out before `at`: the client is as good as
    /// expired (its expiry is being committed) and must not be revived, for a master
    /// may have been told it ran out.
    pub fn renew(&mut self, client: ClientId, at: Instant) -> Option<Duration> {
        let since = self.leading_since?;
        if self.remaining(client, at).is_zero() {
            return None;
        }
        let last = self.renewed.entry(client).or_insert(since);
        *last = (*last).max(at);
        Some(self.lease)
    }

    /// How long open client `client`'s lease lasts from `at` at least; zero once it
    /// ran out. While this member does not lead: zero (it answers nothing then).
    pub fn remaining(&self, client: ClientId, at: Instant) -> Duration {
        let Some(since) = self.leading_since else {
            return Duration::ZERO;
        };
        let last = self
            .renewed
            .get(&client)
            .copied()
            .unwrap_or(since)
            .max(since);
        (last + self.lease).saturating_duration_since(at)
    }

    /// Of `open` (the open clients), those whose lease ran out by `now`, at most
    /// [`EXPIRE_CLIENTS_MAX`]; none while this member does not lead.
    pub fn expired(&self, open: impl Iterator<Item = ClientId>, now: Instant) -> Vec<ClientId> {
        if self.leading_since.is_none() {
            return Vec::new();
        }
        open.filter(|&c| self.remaining(c, now).is_zero())
            .take(EXPIRE_CLIENTS_MAX)
            .collect()
    }

    /// Forgets the renewals of clients that expired.
    pub fn forget(&mut self, clients: &[ClientId]) {
        for client in clients {
            self.renewed.remove(client);
        }
    }
}

/// Commits the expiry of clients whose leases ran out, while this member leads.
#[derive(Debug)]
pub struct ClientExpirer {
    node: RaftNode,
    leases: Arc<Mutex<ClientLeases>>,
}

impl ClientExpirer {
    /// The expirer of `node`'s clients, as `leases` sees them.
    pub fn new(node: RaftNode, leases: Arc<Mutex<ClientLeases>>) -> ClientExpirer {
        ClientExpirer { node, leases }
    }

    /// Runs until dropped (aborted): every [`expiry_interval`], notes leadership and
    /// proposes `ExpireClients` for the clients that ran out.
    pub async fn run(self) {
        loop {
            let interval = expiry_interval(self.leases.lock().lease());
            tokio::time::sleep(interval).await;
            let now = Instant::now();
            let leading = self.node.is_leader();
            let expired = {
                let mut leases = self.leases.lock();
                leases.observe_leadership(leading, now);
                self.node
                    .with_state(|state| leases.expired(state.open_clients(), now))
            };
            if expired.is_empty() {
                continue;
            }
            let command = Command::ExpireClients {
                clients: expired.clone(),
            };
            match tokio::time::timeout(
                interval.max(Duration::from_secs(1)),
                self.node.propose(command),
            )
            .await
            {
                Ok(Ok(CommandResult::ClientsExpired { expired: count })) => {
                    tracing::info!(clients = count, "client leases expired");
                    self.leases.lock().forget(&expired);
                }
                Ok(Ok(other)) => tracing::warn!(?other, "client expiry refused"),
                Ok(Err(error)) => tracing::debug!(%error, "client expiry not proposed"),
                Err(_) => tracing::debug!("client expiry not committed in time"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);
    const A: ClientId = ClientId(1);
    const B: ClientId = ClientId(2);

    #[test]
    fn a_follower_answers_no_lease_and_expires_nothing() {
        let leases = ClientLeases::new(LEASE);
        let now = Instant::now();
        assert_eq!(leases.remaining(A, now), Duration::ZERO);
        assert!(leases
            .expired([A, B].into_iter(), now + 2 * LEASE)
            .is_empty());
    }

    #[test]
    fn a_new_leader_counts_every_client_as_renewed_when_it_took_over() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(true, t0);
        assert_eq!(
            leases.remaining(A, t0 + Duration::from_secs(10)),
            Duration::from_secs(20)
        );
        assert!(leases
            .expired([A].into_iter(), t0 + LEASE - Duration::from_millis(1))
            .is_empty());
        assert_eq!(leases.expired([A, B].into_iter(), t0 + LEASE), vec![A, B]);
    }

    #[test]
    fn renewals_extend_and_never_shorten_a_lease() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(true, t0);
        let t1 = t0 + Duration::from_secs(20);
        assert_eq!(leases.renew(A, t1), Some(LEASE));
        // A renewal read before an earlier one (a slow barrier) changes nothing.
        assert_eq!(leases.renew(A, t0 + Duration::from_secs(5)), Some(LEASE));
        assert_eq!(leases.remaining(A, t1), LEASE);
        assert_eq!(leases.expired([A, B].into_iter(), t0 + LEASE), vec![B]);
        assert_eq!(leases.expired([A, B].into_iter(), t1 + LEASE), vec![A, B]);
        leases.forget(&[A]);
        assert_eq!(
            leases.remaining(A, t1),
            Duration::from_secs(10),
            "back to the takeover"
        );
    }

    #[test]
    fn a_lease_that_ran_out_is_not_revived_by_a_late_renewal() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(true, t0);
        assert_eq!(leases.renew(A, t0 + LEASE), None);
        assert_eq!(leases.remaining(A, t0 + LEASE), Duration::ZERO);
        assert_eq!(leases.expired([A].into_iter(), t0 + LEASE), vec![A]);
    }

    #[test]
    fn losing_and_regaining_the_lead_starts_every_lease_afresh() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(true, t0);
        assert!(leases.renew(A, t0 + Duration::from_secs(1)).is_some());
        leases.observe_leadership(false, t0 + Duration::from_secs(2));
        assert_eq!(
            leases.remaining(A, t0 + Duration::from_secs(2)),
            Duration::ZERO
        );
        let t3 = t0 + Duration::from_secs(100);
        leases.observe_leadership(true, t3);
        assert_eq!(leases.remaining(A, t3), LEASE);
        assert_eq!(leases.remaining(B, t3), LEASE);
    }
}
