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
//! A master keeps at most [`RECORDS_PER_CLIENT_MAX`] records of a client above the
//! client's acknowledgement (and answers `Retry` beyond). What piles up there is bounded
//! by the *span* of the numbers out — from the lowest outstanding to the highest given —
//! not by how many are out: one slow operation (its owner being recovered for ten
//! seconds) holds the acknowledgement back while thousands of later operations finish
//! and leave their records on healthy masters. So a number is given only while it is at
//! most [`TICKET_SPAN_MAX`] above the acknowledgement it goes out with; an operation that
//! would go further waits until the slow one finishes (it ends by its own deadline at
//! the latest) or its own deadline passes ([`TicketsError::SpanFull`]).
//!
//! Why that suffices: the records a master holds lie above the highest acknowledgement
//! it was sent and at or below the highest number it holds, and that number came with an
//! acknowledgement at most [`TICKET_SPAN_MAX`] below it, which the master noted. (A
//! retry resends the acknowledgement of its first attempt: older, never wrong.)
//!
//! Waiting operations take their numbers in arrival order, so a multi-op waiting for
//! room for many is not overtaken for ever by single writes. The count out is bounded by
//! the span, and one call takes at most [`TICKETS_MAX`].
//!
//! # Identity
//!
//! A tracker numbers the operations of one client id. When that id's lease expired
//! ([`Tracker::expire`]) it gives no more numbers ([`TicketsError::Expired`], also to
//! those waiting) and the client numbers under a new id with a new tracker. Tickets
//! given before keep their id and number: an operation is never sent under another id,
//! which would make it a second, independent operation.

use parking_lot::Mutex;
use rampart_common::ids::ClientId;
use rampart_common::rifl::{Rifl, RECORDS_PER_CLIENT_MAX};
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Most tickets one call of [`Tracker::tickets`] takes (multi-ops take theirs in chunks
/// of this many). Half the span, so that a chunk fits beside the numbers a slow
/// operation holds back.
pub const TICKETS_MAX: usize = 4096;

/// Most a number may lie above the acknowledgement sent with it: the masters' limit on a
/// client's records above its acknowledgement (module doc, "Limits").
pub const TICKET_SPAN_MAX: u64 = RECORDS_PER_CLIENT_MAX as u64;

// A call for the most tickets must fit in an empty span, or it would wait for ever; the
// span must stay within what masters keep records of, which is its reason.
const _: () = assert!(TICKETS_MAX as u64 <= TICKET_SPAN_MAX);
const _: () = assert!(TICKET_SPAN_MAX <= RECORDS_PER_CLIENT_MAX as u64);

/// Why [`Tracker::tickets`] gave no tickets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TicketsError {
    /// The tracker's client id expired: number under a new one.
    #[error("the lease of client {0} expired")]
    Expired(ClientId),
    /// The deadline passed while operation `lowest` held the span full.
    #[error(
        "waited for operation {lowest} of client {client} to finish: {} operations were \
         numbered after it, the most a master keeps records of",
        next - lowest - 1
    )]
    SpanFull {
        /// The client id.
        client: ClientId,
        /// The lowest number outstanding (the slow operation).
        lowest: u64,
        /// The next number.
        next: u64,
    },
}

/// The numbering of one client's operations under one id.
#[derive(Debug)]
pub struct Tracker {
    client: ClientId,
    /// The next number, the numbers out and whether the id expired. One lock: a number
    /// is taken and marked out together, so an acknowledgement never covers a number
    /// not sent yet. Never held across an `.await`.
    numbers: Mutex<Numbers>,
    /// Woken when the lowest number out is returned (the span shrinks) or the id
    /// expires.
    freed: Notify,
    /// Held by the call waiting for room; the others queue for it in arrival order
    /// (tokio's mutex is fair), so no call is overtaken while it waits.
    turn: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Numbers {
    next: u64,
    /// Invariant: every member is below `next`.
    out: BTreeSet<u64>,
    expired: bool,
}

impl Numbers {
    /// The lowest number out, or the next one when none is out.
    fn lowest(&self) -> u64 {
        self.out.first().copied().unwrap_or(self.next)
    }
}

impl Tracker {
    /// Numbering for `client`, from 1.
    pub fn new(client: ClientId) -> Arc<Tracker> {
        Arc::new(Tracker {
            client,
            numbers: Mutex::new(Numbers {
                next: 1,
                out: BTreeSet::new(),
                expired: false,
            }),
            freed: Notify::new(),
            turn: tokio::sync::Mutex::new(()),
        })
    }

    /// The client's id.
    pub fn client(&self) -> ClientId {
        self.client
    }

    /// Every operation numbered this or below has finished.
    pub fn ack(&self) -> u64 {
        self.numbers.lock().lowest() - 1
    }

    /// From the lowest number out to the next number (0 when none is out): how far
    /// above the acknowledgement the next number would lie, less one.
    pub fn span(&self) -> u64 {
        let numbers = self.numbers.lock();
        numbers.next - numbers.lowest()
    }

    /// The client's lease expired: no more numbers, and calls waiting for some end.
    pub fn expire(&self) {
        self.numbers.lock().expired = true;
        self.freed.notify_waiters();
    }

    /// Whether [`expire`](Self::expire) was called.
    pub fn is_expired(&self) -> bool {
        self.numbers.lock().expired
    }

    /// `n` tickets (at most [`TICKETS_MAX`]), waiting until `deadline` while the last
    /// would lie more than [`TICKET_SPAN_MAX`] above the acknowledgement (module doc).
    pub async fn tickets(
        self: &Arc<Tracker>,
        n: usize,
        deadline: Instant,
    ) -> Result<Vec<Ticket>, TicketsError> {
        let n = n.min(TICKETS_MAX) as u64;
        let wait = async {
            let _turn = self.turn.lock().await;
            loop {
                // Registered before looking, so a return in between is not missed.
                let freed = self.freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if let Some(taken) = self.try_take(n) {
                    return taken;
                }
                freed.await;
            }
        };
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(taken) => taken,
            Err(_) => {
                let numbers = self.numbers.lock();
                Err(if numbers.expired {
                    TicketsError::Expired(self.client)
                } else {
                    TicketsError::SpanFull {
                        client: self.client,
                        lowest: numbers.lowest(),
                        next: numbers.next,
                    }
                })
            }
        }
    }

    /// `n` tickets if they fit in the span now.
    fn try_take(self: &Arc<Tracker>, n: u64) -> Option<Result<Vec<Ticket>, TicketsError>> {
        let mut numbers = self.numbers.lock();
        if numbers.expired {
            return Some(Err(TicketsError::Expired(self.client)));
        }
        // The last number is `next + n - 1`; its acknowledgement is at least
        // `lowest - 1`.
        if numbers.next + n - numbers.lowest() > TICKET_SPAN_MAX {
            return None;
        }
        let (first, next) = (numbers.next, numbers.next + n);
        numbers.next = next;
        numbers.out.extend(first..next);
        Some(Ok((first..next)
            .map(|seq| Ticket {
                tracker: Arc::clone(self),
                seq,
            })
            .collect()))
    }
}

/// One operation's number, returned when dropped.
#[derive(Debug)]
pub struct Ticket {
    tracker: Arc<Tracker>,
    seq: u64,
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

    /// The tracker (the client id) it was numbered by.
    pub fn tracker(&self) -> &Arc<Tracker> {
        &self.tracker
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let lowest = {
            let mut numbers = self.tracker.numbers.lock();
            let lowest = numbers.out.first() == Some(&self.seq);
            numbers.out.remove(&self.seq);
            lowest
        };
        if lowest {
            self.tracker.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    async fn one(tracker: &Arc<Tracker>) -> Ticket {
        let mut tickets = tracker.tickets(1, later()).await.expect("room for one");
        tickets.pop().expect("one asked for")
    }

    #[tokio::test]
    async fn numbers_grow_and_the_ack_stops_below_the_lowest_outstanding() {
        let tracker = Tracker::new(ClientId(5));
        assert_eq!(tracker.ack(), 0);
        let mut first = tracker.tickets(3, later()).await.expect("room");
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
        let later_one = one(&tracker).await;
        assert_eq!(later_one.rifl().seq, 4);
        assert_eq!(later_one.rifl().ack, 2);
        drop(first);
        drop(later_one);
        assert_eq!(tracker.ack(), 4);
        // Every ack is below every number out.
        let out = tracker.tickets(2, later()).await.expect("room");
        assert!(out.iter().all(|t| t.rifl().ack < t.rifl().seq));
    }

    #[tokio::test]
    async fn the_span_stays_within_the_masters_limit_while_one_ticket_is_stuck() {
        let tracker = Tracker::new(ClientId(1));
        // One slow operation, and a stream of fast ones that finish at once.
        let stuck = one(&tracker).await;
        let mut given = 1;
        loop {
            let deadline = Instant::now() + Duration::from_millis(50);
            let Ok(mut tickets) = tracker.tickets(1, deadline).await else {
                break;
            };
            let rifl = tickets.pop().expect("one asked for").rifl();
            assert_eq!(rifl.ack, 0, "held back by the slow one");
            assert!(
                rifl.seq - rifl.ack <= RECORDS_PER_CLIENT_MAX as u64,
                "{rifl:?} would leave more records than a master keeps"
            );
            given += 1;
            assert!(given <= 2 * TICKET_SPAN_MAX, "never waited");
        }
        assert_eq!(given, TICKET_SPAN_MAX, "every number within the span given");
        assert_eq!(tracker.span(), TICKET_SPAN_MAX);
        // The next operation waits for the slow one, and goes once it finishes.
        let waiting = {
            let tracker = Arc::clone(&tracker);
            tokio::spawn(async move { tracker.tickets(1, later()).await.map(|t| t[0].rifl()) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "no room while the slow one is out");
        drop(stuck);
        let rifl = waiting.await.expect("the task ends").expect("room now");
        assert_eq!((rifl.seq, rifl.ack), (TICKET_SPAN_MAX + 1, TICKET_SPAN_MAX));
    }

    #[tokio::test]
    async fn a_wait_for_room_ends_at_its_deadline_naming_the_slow_operation() {
        let tracker = Tracker::new(ClientId(2));
        let _stuck = one(&tracker).await;
        let _rest = tracker.tickets(TICKETS_MAX, later()).await.expect("room");
        let _more = tracker
            .tickets(TICKETS_MAX - 1, later())
            .await
            .expect("room");
        let started = Instant::now();
        let refused = tracker
            .tickets(1, started + Duration::from_millis(30))
            .await
            .expect_err("the span is full");
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(
            refused,
            TicketsError::SpanFull {
                client: ClientId(2),
                lowest: 1,
                next: TICKET_SPAN_MAX + 1
            }
        );
        assert!(refused.to_string().contains("operation 1 "), "{refused}");
    }

    #[tokio::test]
    async fn calls_waiting_for_room_take_their_numbers_in_arrival_order() {
        let tracker = Tracker::new(ClientId(3));
        let stuck = one(&tracker).await;
        let filler = tracker.tickets(TICKETS_MAX, later()).await.expect("room");
        let _filler2 = tracker
            .tickets(TICKETS_MAX - 1, later())
            .await
            .expect("room");
        // A large call arrives first, then a small one.
        let large = {
            let tracker = Arc::clone(&tracker);
            tokio::spawn(
                async move { tracker.tickets(100, later()).await.map(|t| t[0].rifl().seq) },
            )
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let small = {
            let tracker = Arc::clone(&tracker);
            tokio::spawn(async move { tracker.tickets(1, later()).await.map(|t| t[0].rifl().seq) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Room for one only (the slow one finished; the filler holds the rest): the small
        // call would fit, but waits behind the large one.
        drop(stuck);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !small.is_finished(),
            "the small call overtook the large one"
        );
        drop(filler);
        let large = large.await.expect("ends").expect("room");
        let small = small.await.expect("ends").expect("room");
        assert!(large < small, "{large} {small}");
    }

    #[tokio::test]
    async fn an_expired_tracker_gives_no_more_numbers_and_ends_the_waits() {
        let tracker = Tracker::new(ClientId(4));
        let stuck = one(&tracker).await;
        let _rest = tracker.tickets(TICKETS_MAX, later()).await.expect("room");
        let _more = tracker
            .tickets(TICKETS_MAX - 1, later())
            .await
            .expect("room");
        let waiting = {
            let tracker = Arc::clone(&tracker);
            tokio::spawn(async move { tracker.tickets(1, later()).await.map(|t| t.len()) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        tracker.expire();
        assert_eq!(
            waiting.await.expect("ends"),
            Err(TicketsError::Expired(ClientId(4)))
        );
        assert_eq!(
            tracker.tickets(1, later()).await.map(|t| t.len()),
            Err(TicketsError::Expired(ClientId(4)))
        );
        // Tickets given before keep their identity.
        assert_eq!(stuck.rifl().client, ClientId(4));
    }

    #[tokio::test]
    async fn a_call_takes_at_most_tickets_max() {
        let tracker = Tracker::new(ClientId(1));
        let all = tracker
            .tickets(TICKETS_MAX + 10, later())
            .await
            .expect("room");
        assert_eq!(all.len(), TICKETS_MAX, "clamped");
    }
}
