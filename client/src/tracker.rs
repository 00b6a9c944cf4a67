//! `Tracker`: the numbers a client puts on its writes so that retrying them is safe
//! (RIFL, `rampart_common::rifl`).
//!
//! Every write, remove and increment (every object of a multi-op) takes a [`Ticket`]
//! before its first attempt: the client's next operation number, kept by every retry.
//! The acknowledgement sent with each request is the lowest number still outstanding
//! minus one — every operation below it has its outcome here and is never sent again —
//! so masters drop those records. A ticket is returned when its operation finishes,
//! however it finishes (an answer, an error, or the caller dropping the future: then it
//! is never retried either).
//!
//! # Limits
//!
//! At most [`TICKETS_MAX`] tickets are out at once; more operations wait for one.
//! Each master keeps at most `RECORDS_PER_CLIENT_MAX` (8,192) records of a client
//! above its acknowledgement, and every outstanding ticket may leave one, so the bound
//! keeps a client within it.

use parking_lot::Mutex;
use rampart_common::ids::ClientId;
use rampart_common::rifl::Rifl;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Most operations of one client with a number and no outcome yet. Below the masters'
/// `RECORDS_PER_CLIENT_MAX` (8,192).
pub const TICKETS_MAX: usize = 4096;

/// The numbering of one client's operations.
#[derive(Debug)]
pub struct Tracker {
    client: ClientId,
    /// The next number, and the numbers out. One lock: a number is taken and marked out
    /// together, so an acknowledgement never covers a number not sent yet.
    numbers: Mutex<Numbers>,
    /// One permit per ticket out.
    permits: Arc<Semaphore>,
}

#[derive(Debug)]
struct Numbers {
    next: u64,
    out: BTreeSet<u64>,
}

impl Tracker {
    /// Numbering for `client`, from 1.
    pub fn new(client: ClientId) -> Arc<Tracker> {
        Arc::new(Tracker {
            client,
            numbers: Mutex::new(Numbers {
                next: 1,
                out: BTreeSet::new(),
            }),
            permits: Arc::new(Semaphore::new(TICKETS_MAX)),
        })
    }

    /// The client's id.
    pub fn client(&self) -> ClientId {
        self.client
    }

    /// Every operation numbered this or below has finished.
    pub fn ack(&self) -> u64 {
        let numbers = self.numbers.lock();
        numbers
            .out
            .first()
            .map_or(numbers.next - 1, |lowest| lowest - 1)
    }

    /// `n` tickets (at most [`TICKETS_MAX`]), waiting while too many are out.
    pub async fn tickets(self: &Arc<Tracker>, n: usize) -> Vec<Ticket> {
        let n = n.min(TICKETS_MAX);
        // The semaphore is never closed.
        let Ok(permits) = Arc::clone(&self.permits).acquire_many_owned(n as u32).await else {
            return Vec::new();
        };
        let mut permits = permits;
        let mut numbers = self.numbers.lock();
        (0..n)
            .map(|_| {
                let seq = numbers.next;
                numbers.next += 1;
                numbers.out.insert(seq);
                // One permit each (the last ticket takes what is left: one).
                let permit = permits.split(1);
                Ticket {
                    tracker: Arc::clone(self),
                    seq,
                    _permit: permit,
                }
            })
            .collect()
    }
}

/// One operation's number, returned when dropped.
#[derive(Debug)]
pub struct Ticket {
    tracker: Arc<Tracker>,
    seq: u64,
    /// Given back when the ticket is.
    _permit: Option<OwnedSemaphorePermit>,
}

impl Ticket {
    /// The identity to send with the operation (the acknowledgement as of now).
    pub fn rifl(&self) -> Rifl {
        Rifl {
            client: self.tracker.client,
            seq: self.seq,
            ack: self.tracker.ack(),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.tracker.numbers.lock().out.remove(&self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn numbers_grow_and_the_ack_stops_below_the_lowest_outstanding() {
        let tracker = Tracker::new(ClientId(5));
        assert_eq!(tracker.ack(), 0);
        let mut first = tracker.tickets(3).await;
        let numbers: Vec<u64> = first.iter().map(|t| t.rifl().seq).collect();
        assert_eq!(numbers, [1, 2, 3]);
        assert_eq!(first[0].rifl().ack, 0);
        assert_eq!(first[0].rifl().client, ClientId(5));
        // 2 finishes first: 1 is still out, nothing is acknowledged.
        first.remove(1);
        assert_eq!(tracker.ack(), 0);
        // 1 finishes: 1 and 2 acknowledged, 3 still out.
        first.remove(0);
        assert_eq!(tracker.ack(), 2);
        let later = tracker.tickets(1).await;
        assert_eq!(later[0].rifl().seq, 4);
        assert_eq!(later[0].rifl().ack, 2);
        drop(first);
        drop(later);
        assert_eq!(tracker.ack(), 4);
        // Every ack is below every number out.
        let out = tracker.tickets(2).await;
        assert!(out.iter().all(|t| t.rifl().ack < t.rifl().seq));
    }

    #[tokio::test]
    async fn at_most_tickets_max_are_out_and_a_return_lets_the_next_one_go() {
        let tracker = Tracker::new(ClientId(1));
        let all = tracker.tickets(TICKETS_MAX + 10).await;
        assert_eq!(all.len(), TICKETS_MAX, "clamped");
        let waiting = {
            let tracker = Arc::clone(&tracker);
            tokio::spawn(async move { tracker.tickets(1).await.len() })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "no permit is free");
        drop(all);
        assert_eq!(waiting.await.expect("the task ends"), 1);
    }
}
