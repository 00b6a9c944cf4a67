//! [`Operation`]: one client operation as a drill records it, and the translation of one
//! key's operations into the model's terms ([`KeyOps`]).
//!
//! Times are microseconds on one clock (the recording process's monotonic clock from the
//! start of the run). What an operation returned says how the checker treats it:
//!
//! * an answer (a value read, a new version, a refusal by reject rules) is checked;
//! * [`Output::Failed`]: known not to have taken effect (refused before applying: no
//!   space, invalid, or a read that failed); left out of the check;
//! * [`Output::Unknown`]: the client never learned the outcome (a timeout, a connection
//!   lost after sending). It may have applied at any time after it was called, or never:
//!   the checker treats it as returning at the end of time with any answer.

use crate::register::{fits, Call, Ret, Value};
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One client operation on one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// Which client called it (each client calls one operation at a time).
    pub client: u32,
    /// The key (all keys of one table).
    pub key: Vec<u8>,
    /// When the client called it, µs.
    pub call_us: u64,
    /// When it returned, or the client gave up on it, µs; at or after `call_us`.
    pub return_us: u64,
    /// What was asked.
    pub input: Input,
    /// What came back.
    pub output: Output,
}

/// What an operation asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// Read the key.
    Read,
    /// Write `value` unless `rules` refuse.
    Write {
        /// The value.
        value: Vec<u8>,
        /// When to refuse.
        rules: RejectRules,
    },
    /// Remove the key's object unless `rules` refuse.
    Remove {
        /// When to refuse.
        rules: RejectRules,
    },
    /// Add `delta` to the key's integer unless `rules` refuse.
    Increment {
        /// What is added.
        delta: i64,
        /// When to refuse.
        rules: RejectRules,
    },
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Output {
    /// A read: (version, value), or `None` for no object.
    Read(Option<(u64, Vec<u8>)>),
    /// A write applied with this version.
    Written(u64),
    /// A remove applied: the version removed, `None` when there was no object.
    Removed(Option<u64>),
    /// An increment applied.
    Incremented {
        /// The integer after it.
        value: i64,
        /// Its version.
        version: u64,
    },
    /// Reject rules refused it; the key's version then (0: no object).
    Rejected {
        /// The refusing status.
        status: Status,
        /// The version then.
        current: u64,
    },
    /// An increment found a value that is not an 8-byte integer, of this version.
    NotAnInteger {
        /// The version then.
        current: u64,
    },
    /// Known not to have taken effect; why.
    Failed(String),
    /// The outcome is unknown; why.
    Unknown(String),
}

impl Operation {
    /// Whether the checker takes it into account (everything but [`Output::Failed`]).
    pub fn is_checked(&self) -> bool {
        !matches!(self.output, Output::Failed(_))
    }

    /// Whether the client learned its outcome.
    pub fn is_known(&self) -> bool {
        !matches!(self.output, Output::Failed(_) | Output::Unknown(_))
    }

    /// The version it made the key have, when it was a mutation that applied: the new
    /// object's, or the one removed.
    pub fn version_made(&self) -> Option<u64> {
        match self.output {
            Output::Written(version) | Output::Incremented { version, .. } => Some(version),
            Output::Removed(removed) => removed,
            _ => None,
        }
    }

    /// The version it saw the key at, when it names one: read, refused, not an integer.
    pub fn version_seen(&self) -> Option<u64> {
        match &self.output {
            Output::Read(Some((version, _))) => Some(*version),
            Output::Rejected { current, .. } | Output::NotAnInteger { current } => {
                Some(*current).filter(|&v| v > 0)
            }
            _ => None,
        }
    }

    /// One line for people: `client 3 [1.234567 s .. 1.234890 s] write "k1" = "c3-17" -> v12`.
    pub fn describe(&self) -> String {
        let seconds = |us: u64| us as f64 / 1e6;
        let ended = match self.output {
            Output::Unknown(_) => format!("gave up {:.6} s", seconds(self.return_us)),
            _ => format!("{:.6} s", seconds(self.return_us)),
        };
        let rules = |rules: &RejectRules| {
            if *rules == RejectRules::default() {
                String::new()
            } else {
                format!(" if {}", describe_rules(rules))
            }
        };
        let input = match &self.input {
            Input::Read => "read".to_string(),
            Input::Write { value, rules: r } => format!("write {}{}", shown(value), rules(r)),
            Input::Remove { rules: r } => format!("remove{}", rules(r)),
            Input::Increment { delta, rules: r } => format!("increment by {delta}{}", rules(r)),
        };
        let output = match &self.output {
            Output::Read(None) => "nothing".to_string(),
            Output::Read(Some((version, value))) => format!("v{version} {}", shown(value)),
            Output::Written(version) => format!("v{version}"),
            Output::Removed(None) => "removed nothing".to_string(),
            Output::Removed(Some(version)) => format!("removed v{version}"),
            Output::Incremented { value, version } => format!("{value} at v{version}"),
            Output::Rejected { status, current } => format!("refused ({status}) at v{current}"),
            Output::NotAnInteger { current } => format!("not an integer at v{current}"),
            Output::Failed(why) => format!("failed: {why}"),
            Output::Unknown(why) => format!("unknown: {why}"),
        };
        format!(
            "client {} [{:.6} s .. {ended}] {} {input} -> {output}",
            self.client,
            seconds(self.call_us),
            shown(&self.key)
        )
    }
}

/// Rules as people read them: `exists, version <= 4`.
fn describe_rules(rules: &RejectRules) -> String {
    let given = rules.given_version.0;
    let mut refused = Vec::new();
    if rules.doesnt_exist {
        refused.push("missing".to_string());
    }
    if rules.exists {
        refused.push("exists".to_string());
    }
    if rules.version_le_given {
        refused.push(format!("version <= {given}"));
    }
    if rules.version_ne_given {
        refused.push(format!("version != {given}"));
    }
    format!("not ({})", refused.join(" or "))
}

/// A key or value for people: quoted text, or an integer for 8 bytes that are not text.
fn shown(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if text.chars().all(|c| !c.is_control()) => format!("{text:?}"),
        _ => match <[u8; 8]>::try_from(bytes) {
            Ok(word) => format!("int {}", i64::from_le_bytes(word)),
            Err(_) => format!("{} bytes", bytes.len()),
        },
    }
}

/// A history that cannot be checked as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// An operation's answer does not fit what it asked (a write answered by a read).
    #[error("operation {index} ({describe}) has an answer that does not fit its call")]
    Malformed {
        /// Its index in the history.
        index: usize,
        /// It, described.
        describe: String,
    },
    /// It returned before it was called.
    #[error("operation {index} ({describe}) returns before it is called")]
    Backwards {
        /// Its index in the history.
        index: usize,
        /// It, described.
        describe: String,
    },
}

/// One key's checked operations in the model's terms.
#[derive(Debug, Clone)]
pub struct KeyOps {
    /// Each operation's index in the history, in the order of `ops`.
    pub indexes: Vec<usize>,
    /// (call, answer, call time, return time: `u64::MAX` for an unknown outcome).
    pub ops: Vec<(Call, Ret, u64, u64)>,
}

/// The checked operations of `history` by key, in the model's terms: values other than
/// 8-byte integers are numbered per key in order of appearance.
pub fn by_key(history: &[Operation]) -> Result<BTreeMap<&[u8], KeyOps>, HistoryError> {
    // Each key's operations, and its values numbered.
    type Numbered<'h> = BTreeMap<&'h [u8], u32>;
    let mut keys: BTreeMap<&[u8], (KeyOps, Numbered)> = BTreeMap::new();
    for (index, op) in history.iter().enumerate() {
        if !op.is_checked() {
            continue;
        }
        if op.return_us < op.call_us {
            return Err(HistoryError::Backwards {
                index,
                describe: op.describe(),
            });
        }
        let (key_ops, values) = keys.entry(&op.key).or_insert_with(|| {
            (
                KeyOps {
                    indexes: Vec::new(),
                    ops: Vec::new(),
                },
                BTreeMap::new(),
            )
        });
        let call = match &op.input {
            Input::Read => Call::Read,
            Input::Write {
                value: bytes,
                rules,
            } => Call::Write {
                value: intern(values, bytes),
                rules: *rules,
            },
            Input::Remove { rules } => Call::Remove { rules: *rules },
            Input::Increment { delta, rules } => Call::Increment {
                delta: *delta,
                rules: *rules,
            },
        };
        let ret = match &op.output {
            Output::Read(None) => Ret::Read(None),
            Output::Read(Some((version, bytes))) => {
                Ret::Read(Some((*version, intern(values, bytes))))
            }
            Output::Written(version) => Ret::Written(*version),
            Output::Removed(removed) => Ret::Removed(*removed),
            Output::Incremented { value, version } => Ret::Incremented {
                value: *value,
                version: *version,
            },
            Output::Rejected { status, current } => Ret::Rejected {
                status: *status,
                current: *current,
            },
            Output::NotAnInteger { current } => Ret::NotAnInteger { current: *current },
            Output::Unknown(_) => Ret::Unknown,
            Output::Failed(_) => unreachable!("failed operations are skipped above"),
        };
        if !fits(&call, &ret) {
            return Err(HistoryError::Malformed {
                index,
                describe: op.describe(),
            });
        }
        let return_us = if ret == Ret::Unknown {
            u64::MAX
        } else {
            op.return_us
        };
        key_ops.indexes.push(index);
        key_ops.ops.push((call, ret, op.call_us, return_us));
    }
    Ok(keys.into_iter().map(|(key, (ops, _))| (key, ops)).collect())
}

/// `bytes` as a model value, numbering values of other lengths than 8 in `values`.
fn intern<'h>(values: &mut BTreeMap<&'h [u8], u32>, bytes: &'h [u8]) -> Value {
    match <[u8; 8]>::try_from(bytes) {
        Ok(word) => Value::Int(i64::from_le_bytes(word)),
        Err(_) => {
            let next = values.len() as u32;
            Value::Bytes(*values.entry(bytes).or_insert(next))
        }
    }
}
