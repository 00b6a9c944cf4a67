//! `RpcStats`: what the RPC server counts of the requests it serves — per opcode, a
//! latency histogram and a count per reply status — in plain atomics, so the request
//! path pays a clock read and a few relaxed increments. `crate::metrics` reads a
//! [`snapshot`](RpcStats::snapshot) at each scrape and names what it finds (this module
//! knows opcodes and statuses as numbers only, so the RPC layer depends on no metrics
//! or protocol module).

use super::frame::Opcode;
use crate::status::Status;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds: 10 µs to 10 s, about ×3 apart (a
/// last bucket holds what is slower).
pub const LATENCY_BOUNDS_SECONDS: [f64; 13] = [
    0.000_01, 0.000_03, 0.000_1, 0.000_3, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0,
];

/// Opcodes counted one by one (every opcode of every service is below it); the rest
/// share one slot.
pub const OPCODE_SLOTS: usize = 300;

/// Status codes counted one by one; the rest (unrecognized codes) share the last slot.
pub const STATUS_SLOTS: usize = 32;

#[derive(Debug)]
struct Slot {
    /// Requests per latency bucket (not cumulative); the last is past every bound.
    buckets: [AtomicU64; LATENCY_BOUNDS_SECONDS.len() + 1],
    /// Their latencies summed, in nanoseconds.
    sum_ns: AtomicU64,
    /// Requests per reply status code.
    statuses: [AtomicU64; STATUS_SLOTS],
}

impl Slot {
    fn new() -> Slot {
        Slot {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            statuses: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The counts of one process's RPC servers.
#[derive(Debug)]
pub struct RpcStats {
    /// One per opcode below [`OPCODE_SLOTS`], then one for all others.
    slots: Box<[Slot]>,
}

/// One opcode's counts, as read.
#[derive(Clone, Debug, PartialEq)]
pub struct OpcodeCounts {
    /// The opcode; `None` for opcodes past [`OPCODE_SLOTS`] together.
    pub opcode: Option<Opcode>,
    /// Requests per latency bucket of [`LATENCY_BOUNDS_SECONDS`] (not cumulative), and
    /// last those past every bound.
    pub buckets: Vec<u64>,
    /// Their latencies summed.
    pub sum_seconds: f64,
    /// Requests per reply status (`None`: an unrecognized status code), only those seen.
    pub statuses: Vec<(Option<Status>, u64)>,
}

impl OpcodeCounts {
    /// Requests counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

impl RpcStats {
    fn new() -> RpcStats {
        RpcStats {
            slots: (0..=OPCODE_SLOTS).map(|_| Slot::new()).collect(),
        }
    }

    /// Counts one request of `opcode` answered `status` after `elapsed`.
    pub fn observe(&self, opcode: Opcode, status: Status, elapsed: Duration) {
        let slot = &self.slots[usize::from(opcode.0).min(OPCODE_SLOTS)];
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BOUNDS_SECONDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BOUNDS_SECONDS.len());
        slot.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        slot.sum_ns.fetch_add(nanos, Ordering::Relaxed);
        let code = usize::from(status.code()).min(STATUS_SLOTS - 1);
        slot.statuses[code].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts of every opcode that served a request.
    pub fn snapshot(&self) -> Vec<OpcodeCounts> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| {
                let buckets: Vec<u64> = slot
                    .buckets
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect();
                if buckets.iter().all(|&n| n == 0) {
                    return None;
                }
                let statuses = slot
                    .statuses
                    .iter()
                    .enumerate()
                    .map(|(code, n)| (code, n.load(Ordering::Relaxed)))
                    .filter(|&(_, n)| n > 0)
                    .map(|(code, n)| {
                        let known = code < STATUS_SLOTS - 1;
                        let status = u16::try_from(code).ok().map(Status::from_code);
                        (status.filter(|_| known), n)
                    })
                    .collect();
                Some(OpcodeCounts {
                    opcode: (index < OPCODE_SLOTS)
                        .then(|| u16::try_from(index).ok().map(Opcode))
                        .flatten(),
                    buckets,
                    sum_seconds: slot.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
                    statuses,
                })
            })
            .collect()
    }
}

/// This process's RPC counts (every `RpcServer` of the process adds to them).
pub fn rpc_stats() -> &'static RpcStats {
    static STATS: LazyLock<RpcStats> = LazyLock::new(RpcStats::new);
    &STATS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_opcode_status_and_latency() {
        let stats = RpcStats::new();
        stats.observe(Opcode(11), Status::Ok, Duration::from_micros(20));
        stats.observe(Opcode(11), Status::Retry, Duration::from_secs(20));
        stats.observe(
            Opcode(4000),
            Status::Unrecognized(999),
            Duration::from_micros(5),
        );
        let counts = stats.snapshot();
        assert_eq!(counts.len(), 2);
        let ping = &counts[0];
        assert_eq!(ping.opcode, Some(Opcode(11)));
        assert_eq!(ping.count(), 2);
        assert_eq!(ping.buckets[1], 1, "20 µs: in (10 µs, 30 µs]");
        assert_eq!(
            ping.buckets[LATENCY_BOUNDS_SECONDS.len()],
            1,
            "20 s: past every bound"
        );
        assert_eq!(
            ping.statuses,
            vec![(Some(Status::Ok), 1), (Some(Status::Retry), 1)]
        );
        assert!((ping.sum_seconds - 20.00002).abs() < 1e-6);
        let other = &counts[1];
        assert_eq!(other.opcode, None);
        assert_eq!(other.statuses, vec![(None, 1)]);
    }
}
