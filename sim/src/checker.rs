//! `History` and the checks a run must pass.
//!
//! Every write and remove the master appended is recorded in log order, with whether
//! its client heard back. The master's log is one append-only stream, so a recovery
//! rebuilds the effect of a *prefix* of it; what that prefix may be is what clients were
//! promised. For every key, the recovered state must be the effect of one of its
//! operations at or after the last acknowledged one — never an older one (a lost
//! acknowledged write, or a read going back in time: a read returns what was
//! acknowledged), never a value no one wrote — or, for a key with no acknowledged
//! operation, of any of its operations or none.

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

/// Every operation appended, in log order.
#[derive(Debug, Default)]
pub struct History {
    ops: Vec<(Op, bool)>,
}

/// Index of an operation in a [`History`].
#[derive(Clone, Copy, Debug)]
pub struct OpIndex(usize);

impl History {
    /// Records an appended, not yet acknowledged operation.
    pub fn append(&mut self, op: Op) -> OpIndex {
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

    /// What a client reading `key` after the last acknowledgement is owed at least: the
    /// state left by its last acknowledged operation (`None` if it has none).
    pub fn acknowledged_state(&self, key: u64) -> Option<KeyState> {
        self.ops
            .iter()
            .rev()
            .find(|(op, acked)| *acked && op.key == key)
            .map(|(op, _)| state_after(op))
    }

    /// Checks the recovered objects (by key) against the history; the first violation,
    /// described.
    pub fn check(&self, recovered: &BTreeMap<u64, (Version, Vec<u8>)>) -> Result<(), String> {
        let mut by_key: BTreeMap<u64, Vec<(usize, &Op, bool)>> = BTreeMap::new();
        for (i, (op, acked)) in self.ops.iter().enumerate() {
            by_key.entry(op.key).or_default().push((i, op, *acked));
        }
        for key in recovered.keys() {
            if !by_key.contains_key(key) {
                return Err(format!("key {key} was recovered but never written"));
            }
        }
        for (key, ops) in &by_key {
            let got: KeyState = recovered.get(key).cloned();
            let last_acked = ops.iter().rposition(|(_, _, acked)| *acked);
            let allowed: Vec<KeyState> = match last_acked {
                Some(at) => ops[at..].iter().map(|(_, op, _)| state_after(op)).collect(),
                None => std::iter::once(None)
                    .chain(ops.iter().map(|(_, op, _)| state_after(op)))
                    .collect(),
            };
            if !allowed.contains(&got) {
                let acked = last_acked.map(|at| ops[at].1);
                return Err(format!(
                    "key {key}: recovered {} but the last acknowledged operation was {}",
                    describe(&got),
                    acked.map_or("none".to_string(), |op| describe(&state_after(op)))
                ));
            }
        }
        Ok(())
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

    #[test]
    fn a_lost_acknowledged_write_is_a_violation_and_a_lost_unacknowledged_one_is_not() {
        let mut history = History::default();
        let first = history.append(op(1, 1, Some(b"a")));
        history.acknowledge(first);
        history.append(op(1, 2, Some(b"b")));
        let mut recovered = BTreeMap::new();
        recovered.insert(1, (Version(1), b"a".to_vec()));
        assert_eq!(history.check(&recovered), Ok(()));
        recovered.insert(1, (Version(2), b"b".to_vec()));
        assert_eq!(history.check(&recovered), Ok(()));
        recovered.remove(&1);
        assert!(history.check(&recovered).is_err());
    }

    #[test]
    fn an_acknowledged_remove_must_not_come_back() {
        let mut history = History::default();
        let write = history.append(op(1, 1, Some(b"a")));
        history.acknowledge(write);
        let remove = history.append(op(1, 1, None));
        history.acknowledge(remove);
        let mut recovered = BTreeMap::new();
        assert_eq!(history.check(&recovered), Ok(()));
        recovered.insert(1, (Version(1), b"a".to_vec()));
        assert!(history.check(&recovered).is_err());
    }

    #[test]
    fn a_value_no_one_wrote_is_a_violation() {
        let history = History::default();
        let mut recovered = BTreeMap::new();
        recovered.insert(7, (Version(3), b"x".to_vec()));
        assert!(history.check(&recovered).is_err());
    }
}
