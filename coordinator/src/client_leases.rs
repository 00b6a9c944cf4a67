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
//! * Leadership is tracked by term, not as a yes or no: a member demoted and elected
//!   again starts afresh (another leader may have counted leases from later meanwhile).
//! * A client this leader found run out is *expiring*: no renewal (even one read before
//!   the decision) and no answer revives it in this term, so no master is told its
//!   lease holds while its expiry may commit.
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
use std::collections::{HashMap, HashSet};
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
    /// The term this member leads in and when it was first seen leading in it; `None`
    /// while it does not lead.
    leading: Option<(u64, Instant)>,
    /// Renewals seen since then.
    renewed: HashMap<ClientId, Instant>,
    /// Clients whose leases this leader found run out and whose expiry it proposed:
    /// never renewed or answered valid again in this term, even by a renewal read
    /// before it decided.
    expiring: HashSet<ClientId>,
    /// Whether [`expire`](Self::expire) has looked at the open clients in this term:
    /// after its first look, an open client it has not seen was opened since, and its
    /// lease counts from when it is first seen until [`open`](Self::open) notes it.
    looked: bool,
}

impl ClientLeases {
    /// No leadership yet; leases of length `lease`.
    pub fn new(lease: Duration) -> ClientLeases {
        ClientLeases {
            lease,
            leading: None,
            renewed: HashMap::new(),
            expiring: HashSet::new(),
            looked: false,
        }
    }

    /// The length of a lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Notes the term this member leads in at `now` (`None`: it does not lead). A new
    /// term starts afresh: every open client counts as renewed now (another leader may
    /// have counted from later than this one's renewals). Losing the lead forgets all.
    pub fn observe_leadership(&mut self, term: Option<u64>, now: Instant) {
        let same = match (term, self.leading) {
            (Some(term), Some((led, _))) => term == led,
            (None, None) => true,
            _ => false,
        };
        if !same {
            self.leading = term.map(|term| (term, now));
            self.renewed.clear();
            self.expiring.clear();
            self.looked = false;
        }
    }

    /// Records that open client `client` renewed at `at` (read before the barrier that
    /// confirmed leadership, after which the caller noted its term) and answers at `now`;
    /// how long its lease lasts from `at`. `None` if it has run out by `now` or is
    /// being expired: the client must not be revived, for a master may have been told
    /// its lease lapsed or the expiry may be committing.
    pub fn renew(&mut self, client: ClientId, at: Instant, now: Instant) -> Option<Duration> {
        let (_, since) = self.leading?;
        if self.remaining(client, now).is_zero() {
            return None;
        }
        let last = self.renewed.entry(client).or_insert(since);
        *last = (*last).max(at);
        Some(self.lease)
    }

    /// Client `client` was just opened (its `OpenClient` committed, which confirmed
    /// leadership) from a request read at `at`: its lease starts then, even if
    /// [`expire`](Self::expire) saw it open first and counted from later (nobody was
    /// told of its lease before this). `None` while this member does not lead.
    pub fn open(&mut self, client: ClientId, at: Instant) -> Option<Duration> {
        self.leading?;
        self.renewed.insert(client, at);
        Some(self.lease)
    }

    /// How long open client `client`'s lease lasts from `at` at least; zero once it
    /// ran out or is being expired. While this member does not lead: zero (it answers
    /// nothing then).
    pub fn remaining(&self, client: ClientId, at: Instant) -> Duration {
        let Some((_, since)) = self.leading else {
            return Duration::ZERO;
        };
        if self.expiring.contains(&client) {
            return Duration::ZERO;
        }
        let last = self
            .renewed
            .get(&client)
            .copied()
            .unwrap_or(since)
            .max(since);
        (last + self.lease).saturating_duration_since(at)
    }

    /// Of `open` (the open clients), those whose lease ran out by `now` (at most
    /// [`EXPIRE_CLIENTS_MAX`]), marked as being expired from now on; none while this
    /// member does not lead.
    ///
    /// An open client this member has no time for counts from when the term began if
    /// this is the first look of the term, and from `now` after it: it was opened
    /// since the last look, its `OpenClient` committed and [`open`](Self::open) not
    /// called yet. Counted from the term's start, a client opened late in a long term
    /// would be expired in the moment between its commit and its first lease.
    pub fn expire(&mut self, open: impl Iterator<Item = ClientId>, now: Instant) -> Vec<ClientId> {
        let Some((_, since)) = self.leading else {
            return Vec::new();
        };
        let first_seen = if self.looked { now } else { since };
        self.looked = true;
        let open: Vec<ClientId> = open.collect();
        for &client in &open {
            self.renewed.entry(client).or_insert(first_seen);
        }
        let expired: Vec<ClientId> = open
            .into_iter()
            .filter(|&c| self.remaining(c, now).is_zero())
            .take(EXPIRE_CLIENTS_MAX)
            .collect();
        self.expiring.extend(&expired);
        expired
    }

    /// Forgets what it holds of clients that are no longer open (expired).
    pub fn retain_open(&mut self, open: impl Fn(ClientId) -> bool) {
        self.renewed.retain(|&c, _| open(c));
        self.expiring.retain(|&c| open(c));
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
            let term = self.node.leader_term();
            let expired = {
                let mut leases = self.leases.lock();
                leases.observe_leadership(term, now);
                self.node.with_state(|state| {
                    leases.retain_open(|c| state.client_open(c));
                    leases.expire(state.open_clients(), now)
                })
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
    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_follower_answers_no_lease_and_expires_nothing() {
        let mut leases = ClientLeases::new(LEASE);
        let now = Instant::now();
        assert_eq!(leases.remaining(A, now), Duration::ZERO);
        assert_eq!(leases.renew(A, now, now), None);
        assert!(leases
            .expire([A, B].into_iter(), now + 2 * LEASE)
            .is_empty());
    }

    #[test]
    fn a_new_leader_counts_every_client_as_renewed_when_it_took_over() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(Some(3), t0);
        assert_eq!(leases.remaining(A, t0 + 10 * S), 20 * S);
        assert!(leases
            .expire([A, B].into_iter(), t0 + LEASE - Duration::from_millis(1))
            .is_empty());
        assert_eq!(leases.expire([A, B].into_iter(), t0 + LEASE), vec![A, B]);
    }

    #[test]
    fn a_client_committed_open_before_its_lease_is_noted_is_not_expired() {
        // `OpenClient` commits, the expirer looks, and only then does the service note
        // the new client's lease: it must not count from the term's start.
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(Some(3), t0);
        assert!(leases.expire([A].into_iter(), t0 + S).is_empty());
        let late = t0 + 3 * LEASE;
        assert_eq!(leases.expire([A, B].into_iter(), late), vec![A]);
        assert_eq!(leases.open(B, late - Duration::from_millis(1)), Some(LEASE));
        assert_eq!(leases.remaining(B, late), LEASE - Duration::from_millis(1));
        assert!(leases
            .expire([B].into_iter(), late + LEASE - Duration::from_millis(2))
            .is_empty());
        assert_eq!(leases.expire([B].into_iter(), late + LEASE), vec![B]);
    }

    #[test]
    fn renewals_extend_and_never_shorten_a_lease() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(Some(3), t0);
        let t1 = t0 + 20 * S;
        assert_eq!(leases.renew(A, t1, t1), Some(LEASE));
        // A renewal read before an earlier one (a slow barrier) changes nothing.
        assert_eq!(leases.renew(A, t0 + 5 * S, t1), Some(LEASE));
        assert_eq!(leases.remaining(A, t1), LEASE);
        assert_eq!(leases.expire([A, B].into_iter(), t0 + LEASE), vec![B]);
        assert_eq!(leases.expire([A, B].into_iter(), t1 + LEASE), vec![A, B]);
    }

    #[test]
    fn a_client_opened_late_in_a_term_gets_a_whole_lease() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(Some(3), t0);
        let late = t0 + 3 * LEASE;
        assert_eq!(leases.open(A, late), Some(LEASE));
        assert_eq!(leases.remaining(A, late + S), LEASE - S);
        assert_eq!(leases.renew(A, late + 10 * S, late + 10 * S), Some(LEASE));
        assert!(leases.expire([A].into_iter(), late + 20 * S).is_empty());
    }

    #[test]
    fn a_lease_that_ran_out_is_not_revived_by_a_late_renewal() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(Some(3), t0);
        assert_eq!(leases.renew(A, t0 + LEASE, t0 + LEASE), None);
        // Read just before the end, answered just after it: refused too.
        assert_eq!(leases.renew(A, t0 + LEASE - S, t0 + LEASE + S), None);
        assert_eq!(leases.remaining(A, t0 + LEASE), Duration::ZERO);
    }

    #[test]
    fn a_client_found_run_out_is_never_revived_in_that_term() {
        // The expirer decides at x; a renewal read before x (its barrier slow) comes
        // back after: it must not make the lease valid again while the expiry commits.
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(Some(3), t0);
        let x = t0 + LEASE;
        assert_eq!(leases.expire([A, B].into_iter(), x), vec![A, B]);
        assert_eq!(leases.renew(A, x - S, x - S), None);
        assert_eq!(leases.remaining(A, x - S), Duration::ZERO);
        // Proposed again at the next round while it is still open.
        assert_eq!(leases.expire([A].into_iter(), x + S), vec![A]);
        leases.retain_open(|c| c != A);
        assert!(leases.expire([B].into_iter(), x).contains(&B));
    }

    #[test]
    fn a_new_term_starts_every_lease_afresh_even_on_the_same_member() {
        let mut leases = ClientLeases::new(LEASE);
        let t0 = Instant::now();
        leases.observe_leadership(Some(3), t0);
        assert!(leases.renew(A, t0 + S, t0 + S).is_some());
        leases.expire([B].into_iter(), t0 + LEASE);
        // Demoted and elected again between two looks: another leader may have counted
        // every lease from its own takeover, later than this member's renewals.
        let t3 = t0 + 100 * S;
        leases.observe_leadership(Some(5), t3);
        assert_eq!(leases.remaining(A, t3), LEASE);
        assert_eq!(
            leases.remaining(B, t3),
            LEASE,
            "a new term forgets what expired"
        );
        leases.observe_leadership(None, t3 + S);
        assert_eq!(leases.remaining(A, t3 + S), Duration::ZERO);
        leases.observe_leadership(Some(5), t3 + 2 * S);
        assert_eq!(leases.remaining(A, t3 + 2 * S), LEASE);
    }
}
