//! `History` and the checks a run must pass.
//!
//! Every write and remove a master appended is recorded in the order appended, with
//! whether its client heard back. One master owns a key at a time, and a recovery
//! rebuilds the effect of a *prefix* of what the crashed owner appended; what a read
//! of a key may then return is what clients were promised: the state left by one of
//! the key's operations at or after both its last acknowledged one and the one an
//! earlier read of it returned — never an older one (a lost acknowledged write, or a
//! read going back in time), never a value no one wrote — or, for a key with neither,
//! absent too.
//!
//! Every client operation is also recorded as a `rampart_check::Operation` (the same
//! record `rampart drill` keeps) and the whole run is checked for linearizability at its
//! end ([`History::check_linearizable`]): real-time order between batches and reads,
//! reject rules, and versions that only increase over a key's life, removes and
//! recoveries included — which the read rule above does not look at. The simulation
//! is sequential, so program order is real-time order: each event gets a distinct,
//! increasing time ([`History::stamp`]), because the checker takes operations whose
//! times touch as concurrent. Values are recorded as short tags (their unique prefix and
//! their length) so that explanations stay readable.

use rampart_common::ids::Version;
use std::collections::BTreeMap;

/// One write (`value: Some`) or remove (`None`) of a key, as appended to the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub key: u64,
    /// The object's version (for a remove: the version of the object it removed, as its
    /// tombstone says).
    pub version: Version,
    pub value: Option<Vec<u8>>,
}

/// What a key holds: its version and value, or nothing.
pub type KeyState = Option<(Version, Vec<u8>)>;

/// Every operation appended, in order, and what reads returned.
#[derive(Debug, Default)]
pub struct History {
    ops: Vec<(Op, bool)>,
    /// Each key's operations, as indexes into `ops`.
    by_key: BTreeMap<u64, Vec<usize>>,
    /// Each key's operation whose state the last read of it returned.
    read: BTreeMap<u64, usize>,
    /// Reads checked.
    reads: usize,
    /// Every client operation, for the linearizability check.
    client_ops: Vec<rampart_check::Operation>,
    /// The last time [`History::stamp`] gave.
    last_stamp_us: u64,
}

/// The client id of reads in the recorded history (batches are recorded under their
/// master's server id, from 1).
pub const READER: u32 = 0;

/// Index of an operation in a [`History`].
#[derive(Clone, Copy, Debug)]
pub struct OpIndex(usize);

impl History {
    /// A time at or after `now_us` and after every time given before: program order is
    /// real-time order.
    pub fn stamp(&mut self, now_us: u64) -> u64 {
        self.last_stamp_us = now_us.max(self.last_stamp_us + 1);
        self.last_stamp_us
    }

    /// Records a client operation for the linearizability check; its index, to
    /// [`resolve`](Self::resolve) it later.
    pub fn record(&mut self, op: rampart_check::Operation) -> usize {
        self.client_ops.push(op);
        self.client_ops.len() - 1
    }

    /// Operation `index`, recorded of unknown outcome, was retried and answered
    /// `output` at `return_us`: one operation, from its first call to this return.
    pub fn resolve(&mut self, index: usize, output: rampart_check::Output, return_us: u64) {
        let op = &mut self.client_ops[index];
        op.output = output;
        op.return_us = return_us;
    }

    /// Records a read of `key` that returned `got`, now.
    pub fn record_read(&mut self, key: u64, got: &KeyState, now_us: u64) {
        let call_us = self.stamp(now_us);
        let return_us = self.stamp(now_us);
        self.record(rampart_check::Operation {
            client: READER,
            key: key_bytes(key),
            call_us,
            return_us,
            input: rampart_check::Input::Read,
            output: rampart_check::Output::Read(
                got.as_ref().map(|(version, value)| (version.0, tag(value))),
            ),
        });
    }

    /// Client operations recorded, and of them of unknown outcome.
    pub fn recorded(&self) -> (usize, usize) {
        let unknown = self
            .client_ops
            .iter()
            .filter(|o| matches!(o.output, rampart_check::Output::Unknown(_)))
            .count();
        (self.client_ops.len(), unknown)
    }

    /// Checks every recorded client operation for linearizability; the violations,
    /// explained.
    pub fn check_linearizable(&self) -> Result<(), String> {
        let report = rampart_check::check(&self.client_ops, rampart_check::Limits::default(), 1)
            .map_err(|e| format!("history cannot be checked: {e}"))?;
        if report.passed() {
            return Ok(());
        }
        let mut text = format!(
            "not linearizable: {} violation(s), {} key(s) inconclusive, of {} operations \
             ({} of unknown outcome)",
            report.violations.len(),
            report.inconclusive.len(),
            report.operations,
            report.unknown
        );
        for violation in &report.violations {
            text.push('\n');
            text.push_str(&violation.explain(&self.client_ops));
        }
        Err(text)
    }

    /// Records an appended, not yet acknowledged operation.
    pub fn append(&mut self, op: Op) -> OpIndex {
        self.by_key.entry(op.key).or_default().push(self.ops.len());
        self.ops.push((op, false));
        OpIndex(self.ops.len() - 1)
    }

    /// Its client heard back.
    pub fn acknowledge(&mut self, op: OpIndex) {
        self.ops[op.0].1 = true;
    }

    /// Operations acknowledged.
    pub fn acknowledged(&self) -> usize {
        self.ops.iter().filter(|(_, acked)| *acked).count()
    }

    /// Operations appended.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Reads checked.
    pub fn reads(&self) -> usize {
        self.reads
    }

    /// Checks that a read of `key` may return `got` (see the module doc) and remembers
    /// it: later reads may not return an older state. The violation, described.
    pub fn check_read(&mut self, key: u64, got: &KeyState) -> Result<(), String> {
        self.reads += 1;
        let ops = self.by_key.get(&key).map(Vec::as_slice).unwrap_or_default();
        let acked = ops.iter().rev().find(|&&i| self.ops[i].1).copied();
        let floor = acked.max(self.read.get(&key).copied());
        let Some(floor) = floor else {
            // Nothing acknowledged or read yet: absent, or any operation's state.
            if got.is_none() {
                return Ok(());
            }
            if let Some(&at) = ops.iter().find(|&&i| state_after(&self.ops[i].0) == *got) {
                self.read.insert(key, at);
                return Ok(());
            }
            return Err(format!(
                "key {key}: read {} but no client wrote it",
                describe(got)
            ));
        };
        match ops
            .iter()
            .find(|&&i| i >= floor && state_after(&self.ops[i].0) == *got)
        {
            Some(&at) => {
                self.read.insert(key, at);
                Ok(())
            }
            None => Err(format!(
                "key {key}: read {} but {} was {}",
                describe(got),
                if acked == Some(floor) {
                    "the last acknowledged operation"
                } else {
                    "an earlier read"
                },
                describe(&state_after(&self.ops[floor].0))
            )),
        }
    }
}

/// The bytes of key number `key`: what masters store and the recorded history names.
pub fn key_bytes(key: u64) -> Vec<u8> {
    format!("key-{key}").into_bytes()
}

/// A value as the recorded history holds it: its unique prefix (through the first `:`)
/// and its length, never 8 bytes (the checker takes 8 bytes for an integer).
pub fn tag(value: &[u8]) -> Vec<u8> {
    let prefix = value
        .iter()
        .position(|&b| b == b':')
        .map_or(&value[..0], |end| &value[..=end]);
    let mut tag = prefix.to_vec();
    tag.extend_from_slice(format!("{} bytes", value.len()).as_bytes());
    if tag.len() == 8 {
        tag.push(b'.');
    }
    tag
}

fn state_after(op: &Op) -> KeyState {
    op.value.clone().map(|value| (op.version, value))
}

fn describe(state: &KeyState) -> String {
    match state {
        Some((version, value)) => format!("version {} ({} bytes)", version.0, value.len()),
        None => "absent".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: u64, version: u64, value: Option<&[u8]>) -> Op {
        Op {
            key,
            version: Version(version),
            value: value.map(<[u8]>::to_vec),
        }
    }

    fn state(version: u64, value: &[u8]) -> KeyState {
        Some((Version(version), value.to_vec()))
    }

    #[test]
    fn a_lost_acknowledged_write_is_a_violation_and_a_lost_unacknowledged_one_is_not() {
        let mut history = History::default();
        let first = history.append(op(1, 1, Some(b"a")));
        history.acknowledge(first);
        history.append(op(1, 2, Some(b"b")));
        assert_eq!(history.check_read(1, &state(1, b"a")), Ok(()));
        assert_eq!(history.check_read(1, &state(2, b"b")), Ok(()));
        let mut fresh = History::default();
        let first = fresh.append(op(1, 1, Some(b"a")));
        fresh.acknowledge(first);
        assert!(fresh.check_read(1, &None).is_err());
    }

    #[test]
    fn a_read_never_goes_back_to_an_older_state() {
        let mut history = History::default();
        history.append(op(1, 1, Some(b"a")));
        history.append(op(1, 2, Some(b"b")));
        assert_eq!(history.check_read(1, &None), Ok(()));
        assert_eq!(history.check_read(1, &state(2, b"b")), Ok(()));
        assert!(history.check_read(1, &state(1, b"a")).is_err());
        assert!(history.check_read(1, &None).is_err());
    }

    #[test]
    fn an_acknowledged_remove_must_not_come_back() {
        let mut history = History::default();
        let write = history.append(op(1, 1, Some(b"a")));
        history.acknowledge(write);
        let remove = history.append(op(1, 1, None));
        history.acknowledge(remove);
        assert_eq!(history.check_read(1, &None), Ok(()));
        assert!(history.check_read(1, &state(1, b"a")).is_err());
    }

    #[test]
    fn an_overwritten_version_coming_back_after_an_acknowledged_remove_is_a_violation() {
        // Issue 39, item 1: the first version, left in a segment kept by cold data,
        // came back at recovery once the later version's segment and the tombstone's
        // were cleaned.
        let mut history = History::default();
        for version in 1..=3 {
            let write = history.append(op(1, version, Some(format!("v{version}").as_bytes())));
            history.acknowledge(write);
        }
        let remove = history.append(op(1, 3, None));
        history.acknowledge(remove);
        for version in 1..=3 {
            let old = state(version, format!("v{version}").as_bytes());
            assert!(history.check_read(1, &old).is_err(), "version {version}");
        }
        // Read absent once, it stays absent even if the remove's acknowledgement was
        // lost.
        let mut unacknowledged = History::default();
        let write = unacknowledged.append(op(1, 1, Some(b"v1")));
        unacknowledged.acknowledge(write);
        unacknowledged.append(op(1, 1, None));
        assert_eq!(unacknowledged.check_read(1, &None), Ok(()));
        assert!(unacknowledged.check_read(1, &state(1, b"v1")).is_err());
    }

    #[test]
    fn a_value_no_one_wrote_is_a_violation() {
        let mut history = History::default();
        assert!(history.check_read(7, &state(3, b"x")).is_err());
        history.append(op(7, 3, Some(b"y")));
        assert!(history.check_read(7, &state(3, b"x")).is_err());
    }

    fn recorded_write(history: &mut History, key: u64, value: &[u8], version: u64) {
        let call_us = history.stamp(0);
        let return_us = history.stamp(0);
        history.record(rampart_check::Operation {
            client: 1,
            key: key_bytes(key),
            call_us,
            return_us,
            input: rampart_check::Input::Write {
                value: tag(value),
                rules: rampart_common::reject::RejectRules::default(),
            },
            output: rampart_check::Output::Written(version),
        });
    }

    #[test]
    fn recorded_operations_are_checked_for_linearizability() {
        let mut history = History::default();
        recorded_write(&mut history, 1, b"b1o0k1:...", 1);
        history.record_read(1, &state(1, b"b1o0k1:..."), 0);
        recorded_write(&mut history, 1, b"b2o0k1:....", 2);
        assert_eq!(history.check_linearizable(), Ok(()));
        assert_eq!(history.recorded(), (3, 0));
        // A read of the older state after the newer write: stale, though each stamp is
        // the same simulated microsecond.
        history.record_read(1, &state(1, b"b1o0k1:..."), 0);
        let why = history.check_linearizable().unwrap_err();
        assert!(why.contains("lost-write on key \"key-1\""), "{why}");
    }

    #[test]
    fn a_version_that_does_not_increase_after_a_remove_is_caught_only_by_the_recording() {
        let mut history = History::default();
        recorded_write(&mut history, 1, b"b1o0k1:.", 5);
        let (call_us, return_us) = (history.stamp(0), history.stamp(0));
        history.record(rampart_check::Operation {
            client: 1,
            key: key_bytes(1),
            call_us,
            return_us,
            input: rampart_check::Input::Remove {
                rules: rampart_common::reject::RejectRules::default(),
            },
            output: rampart_check::Output::Removed(Some(5)),
        });
        recorded_write(&mut history, 1, b"b3o0k1:.", 5);
        let why = history.check_linearizable().unwrap_err();
        assert!(why.contains("version-backwards"), "{why}");
    }

    #[test]
    fn tags_keep_the_unique_prefix_and_are_never_integers() {
        assert_eq!(tag(b"b12o3k4:......"), b"b12o3k4:14 bytes".to_vec());
        assert_eq!(tag(b"no colon"), b"8 bytes".to_vec());
        assert_ne!(tag(b"").len(), 8);
        for len in 0..40 {
            assert_ne!(tag(&vec![b'x'; len]).len(), 8);
        }
    }
}
