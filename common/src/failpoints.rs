//! Failpoints: named places where a process deliberately misbehaves, so that process
//! tests can show what a lost message or an unknown outcome does (issue 11), on TiKV's
//! `fail` crate.
//!
//! A failpoint is active when the comma-separated environment variable
//! [`FAILPOINTS_ENV`] of the process names it: `NAME` (always), or `NAME=ACTIONS` with
//! the `fail` crate's actions (`50%return`, `3*return`, `return->off`, …: see
//! `fail::cfg`) for a failpoint that fires only some of the times it is reached. The
//! check is compiled in only with the `failpoints` feature, which the integration tests
//! turn on (a dev-dependency of `rampart-tests`, so `cargo test` builds the `rampart`
//! binary with it); in every other build [`active`] is the constant `false` and the
//! misbehaviour is compiled out.

/// The environment variable naming the active failpoints, comma-separated.
pub const FAILPOINTS_ENV: &str = "RAMPART_FAILPOINTS";

/// Whether this build has the failpoints compiled in (the `failpoints` feature): without
/// them, [`FAILPOINTS_ENV`] is ignored.
pub const COMPILED_IN: bool = cfg!(feature = "failpoints");

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

/// Master: a move into this master fails right after its source froze the range,
/// before the last tail is replayed: the coordinators abort the move.
pub const MOVE_IN_FAILS_AFTER_FREEZE: &str = "master-move-in-fails-after-freeze";

/// Master: a move into this master waits right after its source froze the range, for
/// the milliseconds its `return(MS)` action gives ([`hold`]), so that a test can kill an
/// end of the move or the coordinators' leader in the middle of it.
pub const MOVE_IN_HOLDS_AFTER_FREEZE: &str = "master-move-in-holds-after-freeze";

/// Master: an `EndMove` does not unfreeze a range moving out of this master, as when it
/// never arrives: only the frozen watch (`master::frozen_watch`) serves it again.
pub const IGNORE_END_MOVE: &str = "master-ignore-end-move";

/// Whether failpoint `name` fires here and now (always for a failpoint named alone in
/// [`FAILPOINTS_ENV`]; as its actions say for `NAME=ACTIONS`).
#[cfg(feature = "failpoints")]
pub fn active(name: &str) -> bool {
    configure_once();
    fail::fail_point!(name, |_| true);
    false
}

/// How long failpoint `name`, where it fires, says to wait: its `return(MS)` action's
/// milliseconds (0 for a bare `return`). The caller waits, asynchronously: the `fail`
/// crate's own `sleep` action would block a runtime thread, and with it the process's
/// answers to pings.
#[cfg(feature = "failpoints")]
pub fn hold(name: &str) -> Option<std::time::Duration> {
    configure_once();
    fail::fail_point!(name, |arg: Option<String>| Some(
        std::time::Duration::from_millis(arg.and_then(|ms| ms.trim().parse().ok()).unwrap_or(0))
    ));
    None
}

/// Configures the `fail` crate from [`FAILPOINTS_ENV`], once per process.
#[cfg(feature = "failpoints")]
fn configure_once() {
    use std::sync::OnceLock;
    static CONFIGURED: OnceLock<()> = OnceLock::new();
    CONFIGURED.get_or_init(|| {
        let text = std::env::var(FAILPOINTS_ENV).unwrap_or_default();
        let mut names = Vec::new();
        for (name, actions) in parse(&text) {
            match fail::cfg(name, actions) {
                Ok(()) => names.push(name.to_string()),
                Err(error) => {
                    tracing::error!(name, actions, %error, "failpoint not configured")
                }
            }
        }
        if !names.is_empty() {
            tracing::warn!(
                ?names,
                "failpoints active: this process misbehaves on purpose"
            );
        }
    });
}

/// The failpoints `text` (the value of [`FAILPOINTS_ENV`]) names, with their actions:
/// `return` (always) for a name given alone.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn parse(text: &str) -> Vec<(&str, &str)> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| match entry.split_once('=') {
            Some((name, actions)) => (name.trim(), actions.trim()),
            None => (entry, "return"),
        })
        .collect()
}

/// Whether failpoint `name` is active in this process: never, in a build without the
/// `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn active(_name: &str) -> bool {
    false
}

/// How long failpoint `name` says to wait: never, in a build without the `failpoints`
/// feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hold(_name: &str) -> Option<std::time::Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_alone_always_fires_and_actions_pass_through() {
        assert_eq!(
            parse(" a , b=50%return ,, c=1*return->off"),
            [("a", "return"), ("b", "50%return"), ("c", "1*return->off")]
        );
        assert!(parse("").is_empty());
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn a_configured_failpoint_fires_as_its_actions_say() {
        fail::cfg("common-test-twice", "2*return->off").expect("valid actions");
        let fired: Vec<bool> = (0..4).map(|_| active("common-test-twice")).collect();
        assert_eq!(fired, [true, true, false, false]);
        assert!(!active("common-test-never-configured"));
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn a_hold_gives_its_milliseconds() {
        fail::cfg("common-test-hold", "1*return(250)->return").expect("valid actions");
        assert_eq!(
            hold("common-test-hold"),
            Some(std::time::Duration::from_millis(250))
        );
        assert_eq!(hold("common-test-hold"), Some(std::time::Duration::ZERO));
        assert_eq!(hold("common-test-never-configured"), None);
    }
}
