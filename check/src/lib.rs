//! `rampart-check`: histories of client operations on a Rampart cluster, and the checks
//! they must pass (docs/design.md §10, issue 15).
//!
//! * [`history`] — [`Operation`]: one client operation as recorded (call and return
//!   times, what was asked, what came back, or that the outcome is unknown).
//! * [`register`] — the sequential specification of one key, as a nondeterministic model.
//! * [`linearizability`] — [`check_key`](linearizability::check_key): the Wing–Gong–Lowe
//!   search over one key's operations.
//!
//! [`check`] puts them together: it splits a history by key (linearizability is local: a
//! history is linearizable exactly when each object's is, Herlihy and Wing §3.3; multi-key
//! operations count as one operation per key, as Rampart applies them), checks the keys
//! on several threads, and names what each violation looks like ([`ViolationKind`]): a
//! lost acknowledged write, a stale read, a removed object back, a version going
//! backwards, a value nobody wrote.
//!
//! The drill (`rampart drill`) records histories on real clusters; the simulation checks
//! its runs' histories the same way.

pub mod history;
pub mod linearizability;
pub mod register;

pub use history::{HistoryError, Input, Operation, Output};
pub use linearizability::{Limits, Outcome};

use register::KeyState;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a violation looks like, judged from the operation no order could place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// The key's last read (a drill's final read of every key) returned a state older
    /// than a mutation acknowledged before the read was called.
    LostWrite,
    /// A read returned a state older than a mutation acknowledged before it was called,
    /// and later reads did not.
    StaleRead,
    /// A read returned an object whose removal was acknowledged before it was called.
    Resurrected,
    /// A new version not above a version the key had before.
    VersionBackwards,
    /// A read returned a value no operation wrote.
    NeverWritten,
    /// Any other way no order explains the answers.
    NotLinearizable,
}

impl ViolationKind {
    /// A name for tables and JSON: `lost-write`, `stale-read`, ...
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::LostWrite => "lost-write",
            ViolationKind::StaleRead => "stale-read",
            ViolationKind::Resurrected => "resurrected",
            ViolationKind::VersionBackwards => "version-backwards",
            ViolationKind::NeverWritten => "never-written",
            ViolationKind::NotLinearizable => "not-linearizable",
        }
    }
}

/// One key whose operations are not linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyViolation {
    /// The key.
    pub key: Vec<u8>,
    /// What it looks like.
    pub kind: ViolationKind,
    /// The operation no order could place (index into the history).
    pub op: usize,
    /// The last operations of the longest order found, as history indexes, in order.
    pub linearized_tail: Vec<usize>,
    /// How many operations that order holds.
    pub linearized_count: usize,
    /// Operations of the key that overlap `op` in time (history indexes), `op` excluded.
    pub concurrent: Vec<usize>,
    /// The states the key could be in after `linearized_tail`.
    pub states: Vec<KeyState>,
}

impl KeyViolation {
    /// A few lines for people, with the operations of `history` it names.
    pub fn explain(&self, history: &[Operation]) -> String {
        let mut text = format!(
            "{} on key {:?}:\n  after {}\n",
            self.kind.name(),
            String::from_utf8_lossy(&self.key),
            if self.linearized_tail.is_empty() {
                "no operation".to_string()
            } else {
                format!(
                    "{} operations in an order real time allows (the last {} shown):",
                    self.linearized_count,
                    self.linearized_tail.len()
                )
            }
        );
        for &i in &self.linearized_tail {
            text.push_str(&format!("    {}\n", history[i].describe()));
        }
        let states: Vec<String> = self.states.iter().map(describe_state).collect();
        text.push_str(&format!(
            "  the key could hold: {}\n  but no order places\n    {}\n",
            states.join(" | "),
            history[self.op].describe()
        ));
        if !self.concurrent.is_empty() {
            text.push_str("  operations overlapping it:\n");
            for &i in &self.concurrent {
                text.push_str(&format!("    {}\n", history[i].describe()));
            }
        }
        text
    }
}

/// A state for people: `v12 value#3`, `int 5 at v7`, `nothing (last v4)`.
fn describe_state(state: &KeyState) -> String {
    let version = if state.version.is_exact() {
        format!("v{}", state.version.min)
    } else if state.version.max == u64::MAX {
        format!("v{}..", state.version.min)
    } else {
        format!("v{}..=v{}", state.version.min, state.version.max)
    };
    match state.value {
        None => format!("nothing (last {version})"),
        Some(register::Value::Int(n)) => format!("int {n} at {version}"),
        Some(register::Value::Bytes(i)) => format!("value #{i} at {version}"),
    }
}

/// The verdict on a whole history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Keys checked.
    pub keys: usize,
    /// Operations checked (failed ones are left out).
    pub operations: usize,
    /// Of them, operations of unknown outcome.
    pub unknown: usize,
    /// Keys whose operations are not linearizable, in key order.
    pub violations: Vec<KeyViolation>,
    /// Keys whose search gave up, with the configurations it explored.
    pub inconclusive: Vec<(Vec<u8>, u64)>,
}

impl Report {
    /// Whether every key is linearizable.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.inconclusive.is_empty()
    }

    /// Violations of `kind`.
    pub fn count(&self, kind: ViolationKind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }
}

/// Checks `history` key by key on `threads` threads (at least one).
pub fn check(
    history: &[Operation],
    limits: Limits,
    threads: usize,
) -> Result<Report, HistoryError> {
    let keys: Vec<(&[u8], history::KeyOps)> = history::by_key(history)?.into_iter().collect();
    let mut report = Report {
        keys: keys.len(),
        operations: keys.iter().map(|(_, k)| k.ops.len()).sum(),
        unknown: keys
            .iter()
            .flat_map(|(_, k)| &k.ops)
            .filter(|(_, ret, _, _)| *ret == register::Ret::Unknown)
            .count(),
        ..Report::default()
    };
    let next = AtomicUsize::new(0);
    let outcomes: Vec<Vec<(usize, Outcome)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((_, key_ops)) = keys.get(i) else {
                            return done;
                        };
                        done.push((i, linearizability::check_key(&key_ops.ops, limits)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| match w.join() {
                Ok(done) => done,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    let mut outcomes: Vec<(usize, Outcome)> = outcomes.into_iter().flatten().collect();
    outcomes.sort_by_key(|(i, _)| *i);
    for (i, outcome) in outcomes {
        let (key, key_ops) = &keys[i];
        match outcome {
            Outcome::Linearizable => {}
            Outcome::Inconclusive { configurations } => {
                report.inconclusive.push((key.to_vec(), configurations));
            }
            Outcome::Violation(violation) => {
                let op = key_ops.indexes[violation.op];
                let failing = &history[op];
                let concurrent = key_ops
                    .indexes
                    .iter()
                    .copied()
                    .filter(|&j| {
                        let other = &history[j];
                        let other_end = if other.is_known() {
                            other.return_us
                        } else {
                            u64::MAX
                        };
                        j != op
                            && other.call_us <= failing.return_us
                            && failing.call_us <= other_end
                    })
                    .collect();
                report.violations.push(KeyViolation {
                    key: key.to_vec(),
                    kind: classify(history, &key_ops.indexes, op),
                    op,
                    linearized_tail: violation
                        .linearized_tail
                        .iter()
                        .map(|&k| key_ops.indexes[k])
                        .collect(),
                    linearized_count: violation.linearized_count,
                    concurrent,
                    states: violation.states,
                });
            }
        }
    }
    Ok(report)
}

/// What the violation at `op` looks like, from the key's operations (`indexes`).
fn classify(history: &[Operation], indexes: &[usize], op: usize) -> ViolationKind {
    let failing = &history[op];
    let key_ops = || indexes.iter().map(|&i| &history[i]);
    // Mutations acknowledged before the failing operation was called.
    let acknowledged_before = || {
        key_ops()
            .filter(|o| o.is_known() && o.return_us < failing.call_us && o.version_made().is_some())
    };
    let is_last = key_ops().all(|o| o.call_us <= failing.call_us);
    let older_than_acknowledged = |kind_if_last| {
        if is_last {
            kind_if_last
        } else {
            ViolationKind::StaleRead
        }
    };
    match &failing.output {
        Output::Read(Some((version, value))) => {
            let written = key_ops().any(|o| match &o.input {
                Input::Write { value: w, .. } => w == value,
                Input::Increment { .. } => value.len() == 8,
                _ => false,
            });
            if !written {
                return ViolationKind::NeverWritten;
            }
            if acknowledged_before()
                .any(|o| matches!(o.output, Output::Removed(Some(v)) if v == *version))
            {
                return ViolationKind::Resurrected;
            }
            if acknowledged_before().any(|o| o.version_made().is_some_and(|v| v > *version)) {
                return older_than_acknowledged(ViolationKind::LostWrite);
            }
            ViolationKind::NotLinearizable
        }
        Output::Read(None) => {
            let created = acknowledged_before().any(|o| {
                matches!(o.output, Output::Written(_) | Output::Incremented { .. })
                    && !key_ops()
                        .any(|r| matches!(r.input, Input::Remove { .. }) && r.call_us >= o.call_us)
            });
            if created {
                older_than_acknowledged(ViolationKind::LostWrite)
            } else {
                ViolationKind::NotLinearizable
            }
        }
        Output::Written(version) | Output::Incremented { version, .. } => {
            let seen_before = key_ops().filter(|o| o.is_known() && o.return_us < failing.call_us);
            if seen_before
                .filter_map(|o| o.version_made().into_iter().chain(o.version_seen()).max())
                .any(|v| v >= *version)
            {
                ViolationKind::VersionBackwards
            } else {
                ViolationKind::NotLinearizable
            }
        }
        _ => ViolationKind::NotLinearizable,
    }
}

#[cfg(test)]
mod tests;
