//! The probability of losing data within a year (RAMCloud's Figure 12): how likely it
//! is that, while a crashed master is being recovered, every backup holding a copy of
//! one of its segments fails too.
//!
//! Servers fail independently, as a Poisson process of `failures_per_year` each. A crash
//! of a master opens a window of `recovery_s` seconds (its recovery: until then its
//! segments exist only on their R backups); data is lost if, within the window, all R
//! backups of one of its copysets (the distinct sets of R backups its segments are on,
//! counted from the real placement) fail as well. With p the chance that one server
//! fails within the window, a copyset is lost with chance p^R, the master's data with
//! 1 − (1 − p^R)^copysets, and over a year, with N·failures_per_year crashes,
//! 1 − exp(−N · failures_per_year · that).
//!
//! Left out, as in the paper: a backup's own failure (its segments are re-replicated by
//! their masters, a window of the same order with the master's DRAM copy as one more
//! copy, so rarer still), and correlated failures (a rack losing power loses at most
//! one replica of any segment, by placement).

/// Seconds in a year.
pub const YEAR_S: f64 = 365.25 * 24.0 * 3600.0;

/// The probability of losing data within a year, for a cluster of `servers` servers
/// that each fail `failures_per_year` times a year, each crash's recovery taking
/// `recovery_s`, each master's segments on `copysets` distinct sets of `replicas`
/// backups.
pub fn per_year(
    servers: usize,
    failures_per_year: f64,
    recovery_s: f64,
    replicas: usize,
    copysets: usize,
) -> f64 {
    // p = 1 − e^(−λT), kept exact for tiny λT.
    let p = -(-failures_per_year / YEAR_S * recovery_s).exp_m1();
    let copyset_lost = p.powi(replicas as i32);
    // 1 − (1 − q)^copysets = −expm1(copysets · ln(1 − q)).
    let crash_loses = -(copysets as f64 * (-copyset_lost).ln_1p()).exp_m1();
    -(-(servers as f64) * failures_per_year * crash_loses).exp_m1()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_replicas_and_quicker_recovery_lose_less() {
        let base = per_year(1000, 2.0, 1.0, 3, 8000);
        assert!(base > 0.0 && base < 1e-9, "{base}");
        assert!(per_year(1000, 2.0, 1.0, 2, 8000) > base * 1e5);
        assert!(per_year(1000, 2.0, 10.0, 3, 8000) > base * 100.0);
        assert!(per_year(1000, 2.0, 1.0, 3, 80) < base);
    }

    #[test]
    fn matches_the_closed_form_for_small_probabilities() {
        // N·f·copysets·(f·T/year)^R when everything is small.
        let (n, f, t, r, c) = (100usize, 2.0, 2.0, 2usize, 500usize);
        let approx = n as f64 * f * c as f64 * (f * t / YEAR_S).powi(r as i32);
        let exact = per_year(n, f, t, r, c);
        assert!((exact / approx - 1.0).abs() < 1e-3, "{exact} vs {approx}");
    }

    #[test]
    fn one_replica_loses_data_when_any_backup_fails_in_the_window() {
        // R = 1 with a year-long recovery: a loss is all but certain.
        assert!(per_year(100, 2.0, YEAR_S, 1, 1000) > 0.99);
    }
}
