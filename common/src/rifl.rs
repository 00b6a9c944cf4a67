//! `Rifl`: what a client puts on every write, remove and increment so that the operation
//! takes effect once however often it is retried — RAMCloud's RIFL (Lee et al.,
//! "Implementing Linearizability at Large Scale and Low Latency", SOSP 2015).
//!
//! # The contract
//!
//! * **Identity.** A client gets a [`ClientId`] from the coordinators when it connects
//!   (`OpenClient`, a Raft-committed counter: never reused, not even by a group
//!   re-created from a seed export). It numbers its write-type
//!   operations `seq` = 1, 2, 3, … — one number per operation (per object of a
//!   multi-op), kept by every retry of that operation.
//! * **Acknowledgement.** Every request also carries `ack`: the client holds the outcome
//!   of every operation numbered `ack` or below and will never send one of them again.
//!   It is the client's lowest unfinished number minus one.
//! * **The master** executes an operation once. When it changes an object (a write, an
//!   increment, a remove that found an object) the master appends a *completion record*
//!   (`log::CompletionEntry`: client, seq, ack, the outcome, and the object's table and
//!   key hash) in the same atomic append as the object or tombstone, so the two are
//!   durable together, replicated together, and move together through recovery (backups
//!   split records by key hash like objects) and cleaning. A request whose record
//!   exists is answered from it, without executing; one numbered at or below the
//!   client's `ack` is answered `StaleRequest`; records at or below `ack` are dropped.
//! * **Only changes are recorded.** An operation that changed nothing (refused by its
//!   reject rules, a remove of a missing object, refused for space) may be executed
//!   again by a retry: its first attempt had no effect, so the retry is the one that
//!   counts, and it still falls within the operation's call and return — linearizable.
//!
//! * **Leases.** A client's id comes with a lease, which the client renews
//!   (`RenewClientLease`) every [`CLIENT_LEASE`] / 3. A client that stops renewing for
//!   longer than [`CLIENT_LEASE`] (it exited, crashed, or was cut off) expires: the
//!   coordinators' leader commits its expiry through Raft, and masters then drop its
//!   records and acknowledgement — that is how the records of clients that are gone
//!   are freed. A master executes a tracked operation only while it knows its client's
//!   lease holds (asked of the leader with `CheckClientLeases`, remembered for as long as
//!   the answer says), so no retry is executed again after its record was dropped: an
//!   expired client is answered `ClientLeaseExpired` and must open a new id.
//!
//! * **Limit.** A master keeps at most [`RECORDS_PER_CLIENT_MAX`] records of a client
//!   above its acknowledgement. A client keeps every number it sends within that many of
//!   the `ack` it sends with it, so one slow operation holding the acknowledgement back
//!   makes the client wait before it numbers more, rather than every master refuse it.
//!
//! A `Rifl` whose client is 0 ([`Rifl::NONE`]) asks for nothing: the operation runs
//! every time it arrives (masters driven directly by benchmarks and tests).

use crate::ids::ClientId;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a client's lease lasts after its last renewal (see the module doc). Long
/// enough that a client cut off by a short partition or paused by a long garbage
/// collection keeps its identity; short enough that the records of clients that are
/// gone leave within a minute.
pub const CLIENT_LEASE: Duration = Duration::from_secs(30);

/// Most completion records one master keeps for one client above the client's
/// acknowledgement. A client's records there are of operations numbered above its `ack`
/// and at most its highest number, so a client that never numbers an operation more than
/// this far above the `ack` it sends with it stays within the limit on every master
/// (`rampart_client::tracker` waits for that). A master at the limit answers `Retry`:
/// the records leave as the client's acknowledgement advances.
pub const RECORDS_PER_CLIENT_MAX: usize = 8192;

/// The exactly-once identity of one write-type operation, and the client's
/// acknowledgement. See the module doc.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rifl {
    /// The client; 0 for none.
    pub client: ClientId,
    /// The operation's number for this client, from 1.
    pub seq: u64,
    /// Every operation of this client numbered `ack` or below has its outcome at the
    /// client and is never sent again.
    pub ack: u64,
}

impl Rifl {
    /// No exactly-once tracking.
    pub const NONE: Rifl = Rifl {
        client: ClientId(0),
        seq: 0,
        ack: 0,
    };

    /// Whether the operation is tracked (a client id and a number).
    pub fn is_tracked(&self) -> bool {
        self.client.0 != 0 && self.seq != 0
    }
}
