//! `PeerConnections`: how many connections each peer address holds open, so that one
//! host cannot take every connection the gateway serves.
//!
//! The gateway serves [`GATEWAY_CONNECTIONS_MAX`](crate::gateway::GATEWAY_CONNECTIONS_MAX)
//! connections at once; further ones wait in the listen backlog. Without a share per
//! address, one host opening that many (idle, or slowly authenticating) locks every
//! other client out. [`PeerConnections::admit`] counts a connection against its peer's
//! IP address (IPv4-mapped IPv6 counted as the IPv4 address) and refuses it past the
//! cap; the [`PeerSlot`] it returns gives the place back when dropped.
//!
//! # Concurrency
//! One `std::sync::Mutex` around the map: held for a lookup and an increment, never
//! across an `.await`. The map holds only addresses with a connection open, so it is
//! bounded by the connections served.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Open connections per peer address.
#[derive(Debug, Default)]
pub struct PeerConnections {
    /// 1. Every count is at least 1 (an address with none is removed).
    /// 2. The sum of the counts is the number of live [`PeerSlot`]s.
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection counted against its peer's address; uncounted when dropped.
#[derive(Debug)]
pub struct PeerSlot {
    peers: Arc<PeerConnections>,
    ip: IpAddr,
}

impl PeerConnections {
    /// Counts a connection from `ip`, unless that address already holds `per_peer_max`:
    /// then `None`, and nothing is counted.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, per_peer_max: usize) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if *count >= per_peer_max {
            if *count == 0 {
                open.remove(&ip);
            }
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: Arc::clone(self),
            ip,
        })
    }

    /// Connections open from `ip`.
    pub fn open_from(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&ip.to_canonical()).copied().unwrap_or(0)
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self
            .peers
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_refuses_past_the_cap_per_address_and_dropping_frees_a_place() {
        let peers = Arc::new(PeerConnections::default());
        let a: IpAddr = "10.0.0.1".parse().expect("address");
        let b: IpAddr = "10.0.0.2".parse().expect("address");
        let first = peers.admit(a, 2).expect("under the cap");
        let _second = peers.admit(a, 2).expect("at the cap");
        assert!(peers.admit(a, 2).is_none());
        // Another address has a share of its own; the mapped form is the same address.
        let _other = peers.admit(b, 2).expect("another address");
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("address");
        assert!(peers.admit(mapped, 2).is_none());
        assert_eq!(peers.open_from(a), 2);
        drop(first);
        assert_eq!(peers.open_from(a), 1);
        assert!(peers.admit(a, 2).is_some());
        // A cap of 0 admits nobody and leaves no entry behind.
        assert!(peers
            .admit("10.0.0.3".parse().expect("address"), 0)
            .is_none());
        assert_eq!(
            peers.open.lock().expect("not poisoned").len(),
            2,
            "addresses with no connection are forgotten"
        );
    }
}
