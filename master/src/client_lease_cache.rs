//! `ClientLeaseCache`: what a master knows of its clients' leases (`rampart_common::rifl`,
//! "Leases"), kept in the `ObjectStore` and checked under its lock when a tracked
//! operation executes. Pure; `crate::client_leases` asks the leader and fills it.

use rampart_common::ids::ClientId;
use rampart_common::rifl::CLIENT_LEASE;
use std::collections::HashMap;
use std::time::Instant;

/// What this master knows of its clients' leases. Pure.
#[derive(Debug, Default)]
pub struct ClientLeaseCache {
    /// Whether leases are checked at all (a master with coordinators); without, every
    /// client counts as holding one (masters driven directly by tests and benchmarks).
    required: bool,
    /// Until when each client's lease holds, as the leader answered.
    valid_until: HashMap<ClientId, Instant>,
    /// Clients whose expiry this master learned, and when: an answer that their lease
    /// holds, to a question asked before and handled after, is ignored. Kept for
    /// [`CLIENT_LEASE`], far longer than any question is in flight (`client_leases::CHECK_TIMEOUT`).
    expired: HashMap<ClientId, Instant>,
}

impl ClientLeaseCache {
    /// From now on, a client's lease holds only as the leader said.
    pub fn require(&mut self) {
        self.required = true;
    }

    /// Whether `client`'s lease is known to hold at `now`.
    pub fn valid(&self, client: ClientId, now: Instant) -> bool {
        !self.required
            || self
                .valid_until
                .get(&client)
                .is_some_and(|&until| now < until)
    }

    /// The leader said `client`'s lease holds until `until` (an earlier end than known
    /// changes nothing; so does any answer about a client known to have expired).
    pub fn note(&mut self, client: ClientId, until: Instant) {
        if self.expired.contains_key(&client) {
            return;
        }
        let known = self.valid_until.entry(client).or_insert(until);
        *known = (*known).max(until);
    }

    /// `client` expired for good (learned at `now`): its lease is gone and no late
    /// answer brings it back.
    pub fn expire(&mut self, client: ClientId, now: Instant) {
        self.valid_until.remove(&client);
        self.expired.insert(client, now);
    }

    /// Forgets the leases that ran out by `now` (they are asked about again anyway) and
    /// expiries older than [`CLIENT_LEASE`].
    pub fn forget_lapsed(&mut self, now: Instant) {
        self.valid_until.retain(|_, until| now < *until);
        self.expired
            .retain(|_, at| now.saturating_duration_since(*at) < CLIENT_LEASE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const A: ClientId = ClientId(1);

    #[test]
    fn without_coordinators_every_client_holds_a_lease() {
        let cache = ClientLeaseCache::default();
        assert!(cache.valid(A, Instant::now()));
    }

    #[test]
    fn a_lease_holds_until_the_end_the_leader_answered_and_only_grows() {
        let mut cache = ClientLeaseCache::default();
        cache.require();
        let now = Instant::now();
        assert!(!cache.valid(A, now), "unknown until asked");
        cache.note(A, now + Duration::from_secs(2));
        cache.note(A, now + Duration::from_secs(1));
        assert!(cache.valid(A, now + Duration::from_millis(1999)));
        assert!(!cache.valid(A, now + Duration::from_secs(2)));
        cache.forget_lapsed(now + Duration::from_secs(1));
        assert!(cache.valid(A, now + Duration::from_secs(1)));
        cache.expire(A, now);
        assert!(!cache.valid(A, now), "forgotten with its expiry");
        // An answer to a question asked before the expiry, handled after it.
        cache.note(A, now + Duration::from_secs(30));
        assert!(
            !cache.valid(A, now),
            "an expired client's lease never comes back"
        );
        cache.forget_lapsed(now + CLIENT_LEASE);
        cache.note(A, now + CLIENT_LEASE + Duration::from_secs(30));
        assert!(
            cache.valid(A, now + CLIENT_LEASE),
            "the expiry is forgotten in time"
        );
    }
}
