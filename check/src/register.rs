//! The sequential specification of one key (docs/design.md §3), as a nondeterministic model
//! for the linearizability search: [`KeyState`] and [`step`].
//!
//! A key holds at most one object, with a version. What the specification promises, and
//! so what the model checks:
//!
//! * a read returns the object the key holds (value and version), or nothing;
//! * a write, remove or increment applies exactly when its reject rules let it (each rule
//!   as `RejectRules::check` evaluates it, with the status it names), and a refusal
//!   reports the version the key held (0 when it held no object);
//! * every new object's version is above every version the key had before — its current
//!   object's, and that of any object removed earlier (versions increase over the life of
//!   the key, across removes, re-creates and recoveries). The exact step is the master's
//!   business (an overwrite takes the next version, a new object the master's safe
//!   version), so the model only asks for "above";
//! * an increment reads the 8-byte little-endian integer the key holds (none counts as
//!   0), and a value of another length is refused as not an integer;
//! * a removal returns the version it removed, or none when there was no object.
//!
//! # Why a version is a range
//!
//! An operation whose outcome the client never learned ([`Ret::Unknown`]: a timeout, a
//! connection lost after sending) may have applied, and if so with a version nobody saw.
//! The model keeps what is known of the key's last version as a [`Span`]; a later read,
//! refusal or removal that names the version pins it down. Reject rules that compare
//! versions split a span into the parts each outcome needs, so the model stays exact.
//!
//! # Nondeterminism
//!
//! [`step`] returns every state the key may be in after the operation: none when the
//! operation's outcome is impossible from this state, two or more when an unknown outcome
//! may or may not have applied. The search carries sets of states (P. Fonseca's and
//! Porcupine's power-set construction), so one path covers every choice.

use rampart_common::reject::RejectRules;
use rampart_common::status::Status;

/// What is known of a version: it lies in `min..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    /// The lowest it may be.
    pub min: u64,
    /// The highest it may be.
    pub max: u64,
}

impl Span {
    /// Exactly `version`.
    pub fn exact(version: u64) -> Span {
        Span {
            min: version,
            max: version,
        }
    }

    /// Anything above the version a span `self` holds: a new version after it.
    fn above(self) -> Span {
        Span {
            min: self.min.saturating_add(1),
            max: u64::MAX,
        }
    }

    /// Whether `version` may be it.
    pub fn contains(self, version: u64) -> bool {
        self.min <= version && version <= self.max
    }

    /// Whether it is known exactly.
    pub fn is_exact(self) -> bool {
        self.min == self.max
    }

    /// The part of it in `min..=max`, if any.
    fn clamp(self, min: u64, max: u64) -> Option<Span> {
        let span = Span {
            min: self.min.max(min),
            max: self.max.min(max),
        };
        (span.min <= span.max).then_some(span)
    }
}

/// A value as the model compares values: 8 bytes are an integer (what an increment
/// reads and writes, little-endian), any other value is named by its index in the
/// history's table of values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// An 8-byte value.
    Int(i64),
    /// Any other value, by index.
    Bytes(u32),
}

/// One state a key may be in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyState {
    /// The object's value, or `None` when the key holds no object.
    pub value: Option<Value>,
    /// The key's last version: its object's, or when it holds none, that of the last
    /// object removed (0 for a key never written). A new object's version is above it.
    pub version: Span,
}

impl KeyState {
    /// A key never written: no object, last version 0.
    pub const INITIAL: KeyState = KeyState {
        value: None,
        version: Span { min: 0, max: 0 },
    };
}

/// An operation as called, in model terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Read the key.
    Read,
    /// Write `value` unless `rules` refuse.
    Write {
        /// The value written.
        value: Value,
        /// When to refuse.
        rules: RejectRules,
    },
    /// Remove the object unless `rules` refuse.
    Remove {
        /// When to refuse.
        rules: RejectRules,
    },
    /// Add `delta` to the integer unless `rules` refuse.
    Increment {
        /// What is added.
        delta: i64,
        /// When to refuse.
        rules: RejectRules,
    },
}

/// What the client learned of the operation, in model terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ret {
    /// A read: the version and value, or `None` for no object.
    Read(Option<(u64, Value)>),
    /// A write applied with this new version.
    Written(u64),
    /// A remove applied; the version removed, `None` if there was no object.
    Removed(Option<u64>),
    /// An increment applied: the new integer and version.
    Incremented {
        /// The integer after it.
        value: i64,
        /// The new version.
        version: u64,
    },
    /// A reject rule refused it; `current` is the key's version then (0: no object).
    Rejected {
        /// `ObjectDoesntExist`, `ObjectExists` or `WrongVersion`.
        status: Status,
        /// The version then.
        current: u64,
    },
    /// An increment found a value that is not 8 bytes; `current` is its version.
    NotAnInteger {
        /// The version then.
        current: u64,
    },
    /// No answer: it may or may not have applied.
    Unknown,
}

/// Whether `ret` can answer `call` at all (a write answered by a removal is a malformed
/// history, not a violation).
pub fn fits(call: &Call, ret: &Ret) -> bool {
    matches!(
        (call, ret),
        (_, Ret::Unknown)
            | (Call::Read, Ret::Read(_))
            | (Call::Write { .. }, Ret::Written(_) | Ret::Rejected { .. })
            | (Call::Remove { .. }, Ret::Removed(_) | Ret::Rejected { .. })
            | (
                Call::Increment { .. },
                Ret::Incremented { .. } | Ret::Rejected { .. } | Ret::NotAnInteger { .. }
            )
    )
}

/// The parts of `state` that `rules` treat alike, each with the status that refuses the
/// operation there (`None`: it applies). One part unless the rules compare versions.
fn split(state: KeyState, rules: &RejectRules) -> impl Iterator<Item = (KeyState, Option<Status>)> {
    let rules = *rules;
    let mut parts = [None, None, None];
    match state.value {
        Some(_) if rules.version_le_given || rules.version_ne_given => {
            let given = rules.given_version.0;
            let spans = [
                given
                    .checked_sub(1)
                    .and_then(|below| state.version.clamp(0, below)),
                state.version.clamp(given, given),
                given
                    .checked_add(1)
                    .and_then(|above| state.version.clamp(above, u64::MAX)),
            ];
            for (part, span) in parts.iter_mut().zip(spans) {
                *part = span.map(|version| KeyState { version, ..state });
            }
        }
        _ => parts[0] = Some(state),
    }
    parts.into_iter().flatten().map(move |part| {
        let current = part
            .value
            .map(|_| rampart_common::ids::Version(part.version.min));
        (part, rules.check(current))
    })
}

/// The integer an increment reads in `state`: `None` for a value that is not 8 bytes.
fn integer(state: &KeyState) -> Option<i64> {
    match state.value {
        None => Some(0),
        Some(Value::Int(n)) => Some(n),
        Some(Value::Bytes(_)) => None,
    }
}

/// Every state the key may be in after `call` answered `ret` from `state`, appended to
/// `next` (nothing when that answer is impossible from `state`).
pub fn step(state: KeyState, call: &Call, ret: &Ret, next: &mut Vec<KeyState>) {
    match (call, ret) {
        (_, Ret::Unknown) => {
            // Not applied (or never to apply: the same to every observer)...
            next.push(state);
            // ...or applied, with a version nobody saw.
            for (part, refused) in split(state, rules_of(call)) {
                if refused.is_none() {
                    next.extend(applied_unseen(part, call));
                }
            }
        }
        (
            Call::Write { rules, .. } | Call::Remove { rules } | Call::Increment { rules, .. },
            Ret::Rejected { status, current },
        ) => {
            for (part, refused) in split(state, rules) {
                match part.value {
                    _ if refused != Some(*status) => {}
                    None if *current == 0 => next.push(part),
                    Some(_) if part.version.contains(*current) => next.push(KeyState {
                        value: part.value,
                        version: Span::exact(*current),
                    }),
                    _ => {}
                }
            }
        }
        (Call::Increment { rules, .. }, Ret::NotAnInteger { current }) => {
            for (part, refused) in split(state, rules) {
                if refused.is_none() && integer(&part).is_none() && part.version.contains(*current)
                {
                    next.push(KeyState {
                        value: part.value,
                        version: Span::exact(*current),
                    });
                }
            }
        }
        _ => next.extend(applied_seen(state, call, ret)),
    }
}

/// The state after `call` applied from `state` and answered `ret` (a read, or a mutation
/// whose outcome the client learned), if that answer is possible from `state`.
fn applied_seen(state: KeyState, call: &Call, ret: &Ret) -> Option<KeyState> {
    let applies = |rules: &RejectRules, fits: &dyn Fn(KeyState) -> bool| {
        split(state, rules).any(|(part, refused)| refused.is_none() && fits(part))
    };
    let holding = |value, version| KeyState {
        value,
        version: Span::exact(version),
    };
    match (call, ret) {
        (Call::Read, Ret::Read(None)) if state.value.is_none() => Some(state),
        (Call::Read, Ret::Read(Some((version, value))))
            if state.value == Some(*value) && state.version.contains(*version) =>
        {
            Some(holding(state.value, *version))
        }
        (Call::Write { value, rules }, Ret::Written(version))
            if applies(rules, &|part| part.version.min < *version) =>
        {
            Some(holding(Some(*value), *version))
        }
        (Call::Remove { rules }, Ret::Removed(None))
            if state.value.is_none() && rules.check(None).is_none() =>
        {
            Some(state)
        }
        (Call::Remove { rules }, Ret::Removed(Some(version)))
            if applies(rules, &|part| {
                part.value.is_some() && part.version.contains(*version)
            }) =>
        {
            Some(holding(None, *version))
        }
        (Call::Increment { delta, rules }, Ret::Incremented { value, version })
            if applies(rules, &|part| {
                integer(&part).and_then(|old| old.checked_add(*delta)) == Some(*value)
                    && part.version.min < *version
            }) =>
        {
            Some(holding(Some(Value::Int(*value)), *version))
        }
        _ => None,
    }
}

/// The state after `call` applied from `part` (where its rules let it) without anyone
/// seeing the new version: `None` when it changes nothing or cannot apply.
fn applied_unseen(part: KeyState, call: &Call) -> Option<KeyState> {
    match call {
        Call::Write { value, .. } => Some(KeyState {
            value: Some(*value),
            version: part.version.above(),
        }),
        Call::Remove { .. } => part.value.map(|_| KeyState {
            value: None,
            version: part.version,
        }),
        Call::Increment { delta, .. } => integer(&part)
            .and_then(|old| old.checked_add(*delta))
            .map(|new| KeyState {
                value: Some(Value::Int(new)),
                version: part.version.above(),
            }),
        Call::Read => None,
    }
}

/// The rules of a call (none for a read).
fn rules_of(call: &Call) -> &RejectRules {
    const NONE: RejectRules = RejectRules {
        given_version: rampart_common::ids::Version(0),
        doesnt_exist: false,
        exists: false,
        version_le_given: false,
        version_ne_given: false,
    };
    match call {
        Call::Read => &NONE,
        Call::Write { rules, .. } | Call::Remove { rules } | Call::Increment { rules, .. } => rules,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::Version;

    fn after(state: KeyState, call: Call, ret: Ret) -> Vec<KeyState> {
        let mut next = Vec::new();
        step(state, &call, &ret, &mut next);
        next
    }

    fn holding(value: Value, version: u64) -> KeyState {
        KeyState {
            value: Some(value),
            version: Span::exact(version),
        }
    }

    const A: Value = Value::Bytes(0);
    const B: Value = Value::Bytes(1);

    fn write(value: Value) -> Call {
        Call::Write {
            value,
            rules: RejectRules::default(),
        }
    }

    #[test]
    fn a_read_sees_exactly_what_the_key_holds() {
        let state = holding(A, 3);
        assert_eq!(after(state, Call::Read, Ret::Read(Some((3, A)))), [state]);
        assert!(after(state, Call::Read, Ret::Read(Some((3, B)))).is_empty());
        assert!(after(state, Call::Read, Ret::Read(Some((2, A)))).is_empty());
        assert!(after(state, Call::Read, Ret::Read(None)).is_empty());
        assert_eq!(
            after(KeyState::INITIAL, Call::Read, Ret::Read(None)),
            [KeyState::INITIAL]
        );
    }

    #[test]
    fn a_new_version_must_be_above_every_earlier_one_even_after_a_remove() {
        let state = holding(A, 5);
        assert_eq!(after(state, write(B), Ret::Written(6)), [holding(B, 6)]);
        assert!(after(state, write(B), Ret::Written(5)).is_empty());
        let removed = after(
            state,
            Call::Remove {
                rules: RejectRules::default(),
            },
            Ret::Removed(Some(5)),
        );
        assert_eq!(
            removed,
            [KeyState {
                value: None,
                version: Span::exact(5)
            }]
        );
        assert!(after(removed[0], write(B), Ret::Written(4)).is_empty());
        assert_eq!(
            after(removed[0], write(B), Ret::Written(9)),
            [holding(B, 9)]
        );
    }

    #[test]
    fn a_refusal_must_be_the_one_the_rules_give_with_the_current_version() {
        let state = holding(A, 5);
        let cas = |v| Call::Write {
            value: B,
            rules: RejectRules::version_is(Version(v)),
        };
        let wrong = |current| Ret::Rejected {
            status: Status::WrongVersion,
            current,
        };
        assert_eq!(after(state, cas(4), wrong(5)), [state]);
        assert!(
            after(state, cas(4), wrong(4)).is_empty(),
            "not the version held"
        );
        assert!(
            after(state, cas(5), wrong(5)).is_empty(),
            "the rules let it apply"
        );
        assert!(
            after(state, cas(4), Ret::Written(6)).is_empty(),
            "the rules refuse"
        );
        let missing = Ret::Rejected {
            status: Status::ObjectDoesntExist,
            current: 0,
        };
        assert_eq!(
            after(KeyState::INITIAL, cas(4), missing),
            [KeyState::INITIAL]
        );
    }

    #[test]
    fn an_unknown_write_may_or_may_not_have_applied_with_a_version_unseen() {
        let state = holding(A, 5);
        let next = after(state, write(B), Ret::Unknown);
        assert_eq!(
            next,
            [
                state,
                KeyState {
                    value: Some(B),
                    version: Span {
                        min: 6,
                        max: u64::MAX
                    }
                }
            ]
        );
        // A later read pins the version down.
        assert_eq!(
            after(next[1], Call::Read, Ret::Read(Some((40, B)))),
            [holding(B, 40)]
        );
    }

    #[test]
    fn rules_comparing_versions_split_an_unknown_version() {
        let state = KeyState {
            value: Some(A),
            version: Span { min: 3, max: 9 },
        };
        let rules = RejectRules {
            given_version: Version(5),
            version_le_given: true,
            ..RejectRules::default()
        };
        let call = Call::Remove { rules };
        // Applied: the version was above 5.
        assert!(after(state, call, Ret::Removed(Some(4))).is_empty());
        assert_eq!(
            after(state, call, Ret::Removed(Some(7))),
            [KeyState {
                value: None,
                version: Span::exact(7)
            }]
        );
        // Unknown: not applied, or applied on the part above 5.
        assert_eq!(
            after(state, call, Ret::Unknown),
            [
                state,
                KeyState {
                    value: None,
                    version: Span { min: 6, max: 9 }
                }
            ]
        );
    }

    #[test]
    fn an_increment_adds_to_the_integer_or_to_zero() {
        let inc = |delta| Call::Increment {
            delta,
            rules: RejectRules::default(),
        };
        assert_eq!(
            after(
                KeyState::INITIAL,
                inc(3),
                Ret::Incremented {
                    value: 3,
                    version: 1
                }
            ),
            [holding(Value::Int(3), 1)]
        );
        let state = holding(Value::Int(3), 1);
        assert!(after(
            state,
            inc(3),
            Ret::Incremented {
                value: 3,
                version: 2
            }
        )
        .is_empty());
        assert!(after(
            holding(A, 1),
            inc(1),
            Ret::Incremented {
                value: 1,
                version: 2
            }
        )
        .is_empty());
        assert_eq!(
            after(holding(A, 1), inc(1), Ret::NotAnInteger { current: 1 }),
            [holding(A, 1)]
        );
    }

    #[test]
    fn answers_that_do_not_fit_the_call_are_told_apart() {
        assert!(fits(&write(A), &Ret::Written(1)));
        assert!(fits(&Call::Read, &Ret::Unknown));
        assert!(!fits(&write(A), &Ret::Removed(None)));
        assert!(!fits(&Call::Read, &Ret::Written(1)));
    }
}
