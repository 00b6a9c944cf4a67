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
}

/// Index of an operation in a [`History`].
#[derive(Clone, Copy, Debug)]
pub struct OpIndex(usize);

impl History {
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
    fn a_value_no_one_wrote_is_a_violation() {
        let mut history = History::default();
        assert!(history.check_read(7, &state(3, b"x")).is_err());
        history.append(op(7, 3, Some(b"y")));
        assert!(history.check_read(7, &state(3, b"x")).is_err());
    }
}
