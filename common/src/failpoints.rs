//! Failpoints: named places where a process deliberately misbehaves, so that process
//! tests can show what a lost message or an unknown outcome does (issue 11).
//!
//! A failpoint is active when its name is in the comma-separated environment variable
//! [`FAILPOINTS_ENV`] of the process. The check is compiled in only with the
//! `failpoints` feature, which the integration tests turn on (a dev-dependency of
//! `rampart-tests`, so `cargo test` builds the `rampart` binary with it); in every other
//! build [`active`] is the constant `false` and the misbehaviour is compiled out.

/// The environment variable naming the active failpoints, comma-separated.
pub const FAILPOINTS_ENV: &str = "RAMPART_FAILPOINTS";

/// Coordinator: the push of a recovered partition's tablets to their new owner is lost,
/// as when the leader dies right after the commit.
pub const LOSE_RECOVERED_PUSH: &str = "coordinator-lose-recovered-push";

/// Coordinator: a `RecoveredPartition` that committed is reported to the recovery driver
/// as of unknown outcome, as when a snapshot from a newer leader covers it.
pub const RECOVERED_OUTCOME_UNKNOWN: &str = "coordinator-recovered-outcome-unknown";

/// Coordinator: the first `Recover` reply of each partition is lost, and so is the
/// `AbandonRecovery` that would follow it, as when the network fails twice: the master
/// that replayed the partition is left holding it for nobody, and the partition goes to
/// another master.
pub const LOSE_RECOVER_REPLY_AND_ABANDON: &str = "coordinator-lose-recover-reply-and-abandon";

/// Master: every other reply to a write, remove, increment or multi-op is lost — the
/// connection is closed instead, after the request was handled — so clients retry
/// operations that did apply (exactly-once, `crate::rifl`).
pub const LOSE_WRITE_REPLIES: &str = "master-lose-write-replies";

/// Whether failpoint `name` is active in this process.
#[cfg(feature = "failpoints")]
pub fn active(name: &str) -> bool {
    use std::sync::OnceLock;
    static ACTIVE: OnceLock<Vec<String>> = OnceLock::new();
    let names = ACTIVE.get_or_init(|| {
        let names: Vec<String> = std::env::var(FAILPOINTS_ENV)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if !names.is_empty() {
            tracing::warn!(
                ?names,
                "failpoints active: this process misbehaves on purpose"
            );
        }
        names
    });
    names.iter().any(|n| n == name)
}

/// Whether failpoint `name` is active in this process: never, in a build without the
/// `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn active(_name: &str) -> bool {
    false
}
