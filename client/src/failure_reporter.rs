//! `FailureReporter`: which unreachable masters a client reports to the coordinator, and
//! when (docs/design.md §6 "Detection": clients report servers that stop answering).
//!
//! A client that cannot reach the master owning a key (a transport failure: refused,
//! broken, or no reply in time) reports that master with `ReportFailure`, in the
//! background: the operation goes on retrying at once and never waits for the report.
//! Each server is reported at most once per [`FAILURE_REPORT_INTERVAL`] — a burst of
//! failed operations against one dead master costs the coordinator one report — and at
//! most [`FAILURE_REPORTS_IN_FLIGHT_MAX`] reports are in flight per client; a failure
//! past that is not reported (the next one will be). The coordinator verifies every
//! report with its own ping, so a report about a live master costs a ping, nothing more.
//!
//! This type is the decision alone, given the time (`Client` sends the reports).

use rampart_common::ids::ServerId;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// A client reports one server at most this often.
pub const FAILURE_REPORT_INTERVAL: Duration = Duration::from_millis(500);

/// Deadline of one report (one round over the coordinators).
pub const FAILURE_REPORT_TIMEOUT: Duration = Duration::from_secs(1);

/// Most reports one client has in flight.
pub const FAILURE_REPORTS_IN_FLIGHT_MAX: usize = 4;

/// Most servers whose last report a client remembers; past it, entries older than
/// [`FAILURE_REPORT_INTERVAL`] (which no longer hold a report back) are forgotten.
pub const FAILURE_REPORTS_TRACKED_MAX: usize = 1024;

/// When each server was last reported; see the module doc.
#[derive(Debug, Default)]
pub struct FailureReporter {
    /// Server → when it was last reported. Invariant: at most
    /// [`FAILURE_REPORTS_TRACKED_MAX`] entries, or entries all younger than
    /// [`FAILURE_REPORT_INTERVAL`] (which the in-flight bound keeps few).
    last: HashMap<ServerId, Instant>,
}

impl FailureReporter {
    /// A reporter that has reported nothing.
    pub fn new() -> FailureReporter {
        FailureReporter::default()
    }

    /// Whether `server`, found unreachable at `now`, should be reported now; if so,
    /// records the report.
    pub fn should_report(&mut self, server: ServerId, now: Instant) -> bool {
        if let Some(&at) = self.last.get(&server) {
            if now.saturating_duration_since(at) < FAILURE_REPORT_INTERVAL {
                return false;
            }
        }
        if self.last.len() >= FAILURE_REPORTS_TRACKED_MAX {
            self.last
                .retain(|_, at| now.saturating_duration_since(*at) < FAILURE_REPORT_INTERVAL);
        }
        self.last.insert(server, now);
        true
    }

    /// Servers remembered.
    pub fn tracked(&self) -> usize {
        self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_reported_at_most_once_per_interval() {
        let mut reporter = FailureReporter::new();
        let start = Instant::now();
        assert!(reporter.should_report(ServerId(1), start));
        assert!(!reporter.should_report(ServerId(1), start + Duration::from_millis(499)));
        assert!(reporter.should_report(ServerId(2), start + Duration::from_millis(1)));
        assert!(reporter.should_report(ServerId(1), start + FAILURE_REPORT_INTERVAL));
    }

    #[test]
    fn old_entries_are_forgotten_past_the_bound() {
        let mut reporter = FailureReporter::new();
        let start = Instant::now();
        for id in 0..FAILURE_REPORTS_TRACKED_MAX as u64 {
            assert!(reporter.should_report(ServerId(id), start));
        }
        let later = start + FAILURE_REPORT_INTERVAL;
        assert!(reporter.should_report(ServerId(u64::MAX), later));
        assert_eq!(reporter.tracked(), 1);
    }
}
