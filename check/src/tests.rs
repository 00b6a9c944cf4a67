//! Tests of [`check`](crate::check) on whole histories: hand-made ones that are and are
//! not linearizable, and histories of a correct register made at random.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use super::*;
use proptest::prelude::*;
use rampart_common::ids::Version;
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn op(client: u32, call_us: u64, return_us: u64, input: Input, output: Output) -> Operation {
    Operation {
        client,
        key: b"k".to_vec(),
        call_us,
        return_us,
        input,
        output,
    }
}

fn write(value: &str) -> Input {
    Input::Write {
        value: value.as_bytes().to_vec(),
        rules: RejectRules::default(),
    }
}

fn read(version: u64, value: &str) -> Output {
    Output::Read(Some((version, value.as_bytes().to_vec())))
}

fn remove() -> Input {
    Input::Remove {
        rules: RejectRules::default(),
    }
}

fn verdict(history: &[Operation]) -> Report {
    check(history, Limits::default(), 2).unwrap()
}

fn kind(history: &[Operation]) -> ViolationKind {
    let report = verdict(history);
    assert_eq!(report.violations.len(), 1, "{report:?}");
    report.violations[0].kind
}

#[test]
fn a_stale_read_is_named_so() {
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(1, 2, 3, write("b"), Output::Written(2)),
        op(2, 4, 5, Input::Read, read(1, "a")),
        op(2, 6, 7, Input::Read, read(2, "b")),
    ];
    assert_eq!(kind(&history), ViolationKind::StaleRead);
}

#[test]
fn a_lost_write_is_the_last_read_missing_an_acknowledged_write() {
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(1, 2, 3, write("b"), Output::Written(2)),
        op(2, 4, 5, Input::Read, read(1, "a")),
    ];
    assert_eq!(kind(&history), ViolationKind::LostWrite);
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(2, 4, 5, Input::Read, Output::Read(None)),
    ];
    assert_eq!(kind(&history), ViolationKind::LostWrite);
}

#[test]
fn a_removed_object_read_again_is_resurrected() {
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(1, 2, 3, remove(), Output::Removed(Some(1))),
        op(2, 4, 5, Input::Read, read(1, "a")),
    ];
    assert_eq!(kind(&history), ViolationKind::Resurrected);
}

#[test]
fn a_version_not_above_an_earlier_one_goes_backwards() {
    let history = [
        op(1, 0, 1, write("a"), Output::Written(5)),
        op(1, 2, 3, remove(), Output::Removed(Some(5))),
        op(2, 4, 5, write("b"), Output::Written(3)),
    ];
    assert_eq!(kind(&history), ViolationKind::VersionBackwards);
}

#[test]
fn a_value_nobody_wrote_is_named_so() {
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(2, 4, 5, Input::Read, read(1, "z")),
    ];
    assert_eq!(kind(&history), ViolationKind::NeverWritten);
}

#[test]
fn failed_operations_are_left_out_and_keys_are_checked_apart() {
    let mut other = op(3, 0, 9, write("x"), Output::Written(1));
    other.key = b"other".to_vec();
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(1, 2, 3, write("b"), Output::Failed("no space".into())),
        op(2, 4, 5, Input::Read, read(1, "a")),
        other,
    ];
    let report = verdict(&history);
    assert!(report.passed(), "{report:?}");
    assert_eq!((report.keys, report.operations), (2, 3));
}

#[test]
fn a_malformed_history_is_an_error_not_a_verdict() {
    let history = [op(1, 0, 1, write("a"), Output::Removed(None))];
    assert!(matches!(
        check(&history, Limits::default(), 1),
        Err(HistoryError::Malformed { index: 0, .. })
    ));
    let history = [op(1, 5, 1, write("a"), Output::Written(1))];
    assert!(matches!(
        check(&history, Limits::default(), 1),
        Err(HistoryError::Backwards { index: 0, .. })
    ));
}

#[test]
fn the_explanation_names_the_operations_and_states() {
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(1, 2, 3, write("b"), Output::Written(2)),
        op(2, 4, 5, Input::Read, read(1, "a")),
    ];
    let report = verdict(&history);
    let text = report.violations[0].explain(&history);
    assert!(text.starts_with("lost-write on key \"k\""), "{text}");
    assert!(text.contains("write \"b\" -> v2"), "{text}");
    assert!(text.contains("value #1 at v2"), "{text}");
    assert!(text.contains("read -> v1 \"a\""), "{text}");
}

/// A register that is correct by construction, driven by `clients` clients at random:
/// each operation takes effect at a random instant between its call and its return,
/// in the order of those instants; some outcomes are lost (applied or not) and become
/// unknown when `lose_answers`. Keys `k0` and `k1`.
fn correct_history(seed: u64, clients: u32, ops: usize, lose_answers: bool) -> Vec<Operation> {
    #[derive(Default, Clone)]
    struct Key {
        value: Option<Vec<u8>>,
        /// The last version: the object's, or the last removed one's.
        version: u64,
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut free_at = vec![0u64; clients as usize];
    // (instant it takes effect, applies if unknown, operation)
    let mut planned: Vec<(u64, bool, Operation)> = Vec::new();
    for i in 0..ops {
        let client = rng.gen_range(0..clients);
        let call_us = free_at[client as usize] + rng.gen_range(0..4);
        let return_us = call_us + rng.gen_range(0..12);
        free_at[client as usize] = return_us + 1;
        let effect = rng.gen_range(call_us..=return_us);
        let rules = match rng.gen_range(0..6) {
            0 => RejectRules::version_is(Version(rng.gen_range(0..8))),
            1 => RejectRules::create_only(),
            2 => RejectRules {
                given_version: Version(rng.gen_range(0..8)),
                version_le_given: true,
                ..RejectRules::default()
            },
            _ => RejectRules::default(),
        };
        let input = match rng.gen_range(0..10) {
            0..=3 => Input::Read,
            4..=6 => Input::Write {
                value: if rng.gen_bool(0.2) {
                    rng.gen_range(0i64..3).to_le_bytes().to_vec()
                } else {
                    format!("c{client}-{i}").into_bytes()
                },
                rules,
            },
            7 => Input::Remove { rules },
            _ => Input::Increment {
                delta: rng.gen_range(-2..3),
                rules,
            },
        };
        let mut operation = op(
            client,
            call_us,
            return_us,
            input,
            Output::Unknown(String::new()),
        );
        operation.key = format!("k{}", rng.gen_range(0..2)).into_bytes();
        planned.push((effect, rng.gen_bool(0.5), operation));
    }
    planned.sort_by_key(|(effect, _, _)| *effect);
    let mut keys: std::collections::BTreeMap<Vec<u8>, Key> = Default::default();
    // The next new object's version (a master's safe version: above every earlier one).
    let mut safe = 1u64;
    let mut history = Vec::new();
    for (_, applies_if_unknown, mut operation) in planned {
        let key = keys.entry(operation.key.clone()).or_default();
        let before = key.clone();
        let current = key.value.as_ref().map(|_| Version(key.version));
        let refused = match &operation.input {
            Input::Read => None,
            Input::Write { rules, .. }
            | Input::Remove { rules }
            | Input::Increment { rules, .. } => rules.check(current),
        };
        let current_version = current.map_or(0, |v| v.0);
        let new_version = |key: &Key, safe: &mut u64| {
            let v = if key.value.is_some() {
                key.version + 1
            } else {
                (*safe).max(key.version + 1)
            };
            *safe = (*safe).max(v + 1) + 1;
            v
        };
        let output = match (&operation.input, refused) {
            (Input::Read, _) => Output::Read(key.value.clone().map(|v| (key.version, v))),
            (_, Some(status)) => Output::Rejected {
                status,
                current: current_version,
            },
            (Input::Write { value, .. }, None) => {
                let v = new_version(key, &mut safe);
                key.value = Some(value.clone());
                key.version = v;
                Output::Written(v)
            }
            (Input::Remove { .. }, None) => match key.value.take() {
                None => Output::Removed(None),
                Some(_) => Output::Removed(Some(key.version)),
            },
            (Input::Increment { delta, .. }, None) => {
                let old = match &key.value {
                    None => Some(0),
                    Some(bytes) => <[u8; 8]>::try_from(&bytes[..]).ok().map(i64::from_le_bytes),
                };
                match old {
                    None => Output::NotAnInteger {
                        current: current_version,
                    },
                    Some(old) => {
                        let v = new_version(key, &mut safe);
                        key.value = Some((old + delta).to_le_bytes().to_vec());
                        key.version = v;
                        Output::Incremented {
                            value: old + delta,
                            version: v,
                        }
                    }
                }
            }
        };
        let lost = lose_answers && !matches!(operation.input, Input::Read) && rng_bit(&operation);
        if lost && !applies_if_unknown {
            *key = before;
        }
        operation.output = if lost {
            Output::Unknown("lost".into())
        } else {
            output
        };
        history.push(operation);
    }
    history
}

/// One in eight mutations loses its answer, picked from the operation itself so the
/// choice is the same whatever the order of generation.
fn rng_bit(operation: &Operation) -> bool {
    (operation.call_us * 7 + operation.client as u64 * 13 + operation.return_us) % 8 == 0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the interleaving, a correct register's history passes.
    #[test]
    fn a_correct_registers_history_passes(seed in any::<u64>(), clients in 1u32..6, ops in 0usize..80) {
        let history = correct_history(seed, clients, ops, true);
        let report = verdict(&history);
        prop_assert!(report.passed(), "{:#?}", report.violations.first().map(|v| v.explain(&history)));
    }

    /// A final read that returns an older state than the key's newest acknowledged
    /// mutation is caught as a lost write (or a resurrected one), when no outcome was lost.
    #[test]
    fn a_final_read_of_an_older_state_is_a_lost_write(seed in any::<u64>(), clients in 1u32..6, ops in 1usize..60) {
        let mut history = correct_history(seed, clients, ops, false);
        let key = b"k0".to_vec();
        let newest = history.iter().filter(|o| o.key == key).filter_map(|o| o.version_made()).max();
        // An older state the key held: the value some known write made with a lower version.
        let older = history.iter().filter(|o| o.key == key).find_map(|o| match (&o.input, &o.output) {
            (Input::Write { value, .. }, Output::Written(v)) if Some(*v) < newest => Some((*v, value.clone())),
            _ => None,
        });
        if older.is_none() {
            return Ok(());
        }
        let end = history.iter().map(|o| o.return_us).max().unwrap_or(0);
        history.push(Operation {
            client: 99,
            key,
            call_us: end + 1,
            return_us: end + 2,
            input: Input::Read,
            output: Output::Read(older),
        });
        let report = verdict(&history);
        prop_assert_eq!(report.violations.len(), 1);
        // Resurrected when that older object was removed since, which is also true.
        prop_assert!(
            matches!(report.violations[0].kind, ViolationKind::LostWrite | ViolationKind::Resurrected),
            "{:?}", report.violations[0].kind
        );
    }
}

#[test]
fn an_increment_applied_twice_by_a_retry_is_caught() {
    let inc = Input::Increment {
        delta: 1,
        rules: RejectRules::default(),
    };
    let history = [
        op(
            1,
            0,
            10,
            inc.clone(),
            Output::Incremented {
                value: 1,
                version: 1,
            },
        ),
        op(
            2,
            20,
            21,
            Input::Read,
            Output::Read(Some((2, 2i64.to_le_bytes().to_vec()))),
        ),
    ];
    let report = verdict(&history);
    assert_eq!(report.violations.len(), 1);
    // A refusal with the wrong status is caught too.
    let history = [
        op(1, 0, 1, write("a"), Output::Written(1)),
        op(
            2,
            2,
            3,
            Input::Write {
                value: b"b".to_vec(),
                rules: RejectRules::create_only(),
            },
            Output::Rejected {
                status: Status::WrongVersion,
                current: 1,
            },
        ),
    ];
    assert_eq!(verdict(&history).violations.len(), 1);
}
