//! The trace of a run: one line per event, stamped with the simulated time, so that a
//! failing seed shows what happened in order (`rampart simulate --seed N --trace`).

/// The trace line of `event` at simulated time `now_us`.
pub fn line(now_us: u64, event: &str) -> String {
    format!("{now_us:>10} µs  {event}")
}
