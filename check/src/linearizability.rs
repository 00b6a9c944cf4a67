//! Whether one key's operations are linearizable: [`check_key`], the Wing–Gong search
//! with Lowe's memoization (as in Porcupine), over sets of [`KeyState`]s.
//!
//! # The search
//!
//! Every operation becomes two events, its call and its return, in time order (a call
//! before a return at the same time: operations that touch are taken as concurrent, the
//! lenient reading of a clock that does not tell them apart). An operation of unknown
//! outcome returns at the end of time. The search walks the events: at a call it tries to
//! linearize that operation next — step the model; if some state survives and this (set
//! of operations linearized, set of states) was never reached before, take it and start
//! again from the first event left. At a return of an operation not linearized yet, the
//! last choice was wrong: undo it and try the next call after it. The history is
//! linearizable when every event is taken, and not when there is nothing left to undo.
//!
//! # Memory
//!
//! Configurations already explored are remembered as 128-bit hashes: the set of
//! linearized operations hashed incrementally (a random 128-bit word per operation,
//! XORed in and out, Zobrist-style), then hashed together with the states. Two
//! configurations that differ share a hash with probability about 2^-128 per pair; a
//! collision could only make the search skip a configuration, so it could at worst
//! report a violation that is not one — at a rate no run will meet. The search is bounded
//! by [`Limits::configurations_max`]; past it the answer is [`Outcome::Inconclusive`].
//!
//! # Cost
//!
//! A linearizable history whose operations overlap little is checked in about one model
//! step per operation; each operation of unknown outcome may double the configurations
//! to explore while it stays pending, which is why drills keep them few per key.

use crate::register::{step, Call, KeyState, Ret};
use std::collections::HashSet;
use xxhash_rust::xxh3::xxh3_128_with_seed;

/// Bounds of one key's search.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Configurations explored before the search gives up. Each costs about 40 bytes of
    /// memory (a 16-byte hash in a set).
    pub configurations_max: u64,
}

/// Default [`Limits::configurations_max`]: about 160 MB at most per key being checked.
pub const CONFIGURATIONS_MAX_DEFAULT: u64 = 4_000_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            configurations_max: CONFIGURATIONS_MAX_DEFAULT,
        }
    }
}

/// Operations of the longest partial linearization kept in a [`Violation`].
pub const VIOLATION_TAIL_MAX: usize = 24;

/// The verdict on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Some order of the operations, consistent with real time, satisfies the model.
    Linearizable,
    /// None does.
    Violation(Violation),
    /// The search gave up after exploring this many configurations.
    Inconclusive {
        /// Configurations explored.
        configurations: u64,
    },
}

/// Where the search got furthest before it ran out of choices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The operation (index into the key's operations) that no order could place before
    /// it returned, at the deepest point the search reached.
    pub op: usize,
    /// The last operations (at most [`VIOLATION_TAIL_MAX`]) linearized at that point, in
    /// order.
    pub linearized_tail: Vec<usize>,
    /// How many operations were linearized at that point.
    pub linearized_count: usize,
    /// The states the key could be in then.
    pub states: Vec<KeyState>,
}

/// One event of the search.
#[derive(Clone, Copy, Debug)]
struct Event {
    op: usize,
    call: bool,
    /// For a call, the index of its return event.
    partner: usize,
}

/// The events as a doubly linked list that operations are lifted out of and put back
/// into (Knuth's dancing links): index `events.len()` is the head.
struct EventList {
    events: Vec<Event>,
    next: Vec<usize>,
    prev: Vec<usize>,
}

impl EventList {
    fn new(ops: &[(Call, Ret, u64, u64)]) -> EventList {
        // (time, returns after calls at the same time, op, is call)
        let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (op, &(_, _, call_us, return_us)) in ops.iter().enumerate() {
            order.push((call_us, false, op));
            order.push((return_us.max(call_us), true, op));
        }
        order.sort_unstable();
        let mut events: Vec<Event> = order
            .iter()
            .map(|&(_, is_return, op)| Event {
                op,
                call: !is_return,
                partner: usize::MAX,
            })
            .collect();
        let mut return_of = vec![usize::MAX; ops.len()];
        for (i, event) in events.iter().enumerate() {
            if !event.call {
                return_of[event.op] = i;
            }
        }
        for event in &mut events {
            if event.call {
                event.partner = return_of[event.op];
            }
        }
        let n = events.len();
        // Node n is the head; the list is circular through it.
        let next = (0..=n).map(|i| if i == n { 0 } else { i + 1 }).collect();
        let prev = (0..=n).map(|i| if i == 0 { n } else { i - 1 }).collect();
        let mut list = EventList { events, next, prev };
        if n == 0 {
            list.next[0] = 0;
            list.prev[0] = 0;
        }
        list
    }

    fn head(&self) -> usize {
        self.events.len()
    }

    fn first(&self) -> usize {
        self.next[self.head()]
    }

    fn unlink(&mut self, i: usize) {
        let (p, n) = (self.prev[i], self.next[i]);
        self.next[p] = n;
        self.prev[n] = p;
    }

    fn relink(&mut self, i: usize) {
        let (p, n) = (self.prev[i], self.next[i]);
        self.next[p] = i;
        self.prev[n] = i;
    }

    /// Takes a call and its return out of the list.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(self.events[call].partner);
    }

    /// Puts back what [`EventList::lift`] took, in the opposite order.
    fn unlift(&mut self, call: usize) {
        self.relink(self.events[call].partner);
        self.relink(call);
    }
}

/// Every state after `op` from any of `states`, sorted and without repeats.
fn step_all(states: &[KeyState], call: &Call, ret: &Ret) -> Vec<KeyState> {
    let mut next = Vec::with_capacity(states.len() + 1);
    for state in states {
        step(*state, call, ret, &mut next);
    }
    next.sort_unstable();
    next.dedup();
    next
}

/// The hash of a configuration: the linearized set's hash and the states.
fn configuration_hash(linearized: u128, states: &[KeyState]) -> u128 {
    let mut bytes = Vec::with_capacity(16 + states.len() * 26);
    bytes.extend_from_slice(&linearized.to_le_bytes());
    for state in states {
        match state.value {
            None => bytes.push(0),
            Some(crate::register::Value::Int(n)) => {
                bytes.push(1);
                bytes.extend_from_slice(&n.to_le_bytes());
            }
            Some(crate::register::Value::Bytes(i)) => {
                bytes.push(2);
                bytes.extend_from_slice(&i.to_le_bytes());
            }
        }
        bytes.extend_from_slice(&state.version.min.to_le_bytes());
        bytes.extend_from_slice(&state.version.max.to_le_bytes());
    }
    xxh3_128_with_seed(&bytes, 0x5241_4d50_4152_5431)
}

/// The random word an operation XORs into the linearized set's hash.
fn op_word(op: usize) -> u128 {
    xxh3_128_with_seed(&(op as u64).to_le_bytes(), 0x4c49_4e45_4152_495a)
}

/// Whether `ops` (call, answer, call time, return time) of one key, starting from a key
/// never written, are linearizable.
pub fn check_key(ops: &[(Call, Ret, u64, u64)], limits: Limits) -> Outcome {
    let mut list = EventList::new(ops);
    let mut states = vec![KeyState::INITIAL];
    let mut linearized: u128 = 0;
    // (call event, states before it)
    let mut stack: Vec<(usize, Vec<KeyState>)> = Vec::new();
    let mut seen: HashSet<u128> = HashSet::new();
    let mut configurations: u64 = 0;
    let mut deepest: Option<Violation> = None;
    let mut at = list.first();
    loop {
        if at == list.head() {
            // Only reached when the list is empty: a call's return always follows it.
            return Outcome::Linearizable;
        }
        let event = list.events[at];
        if event.call {
            let (call, ret, _, _) = &ops[event.op];
            let next = step_all(&states, call, ret);
            if !next.is_empty() {
                let with = linearized ^ op_word(event.op);
                if seen.insert(configuration_hash(with, &next)) {
                    configurations += 1;
                    if configurations > limits.configurations_max {
                        return Outcome::Inconclusive { configurations };
                    }
                    stack.push((at, std::mem::replace(&mut states, next)));
                    linearized = with;
                    list.lift(at);
                    at = list.first();
                    continue;
                }
            }
            at = list.next[at];
        } else {
            if deepest
                .as_ref()
                .map_or(true, |d| stack.len() > d.linearized_count)
            {
                let tail_from = stack.len().saturating_sub(VIOLATION_TAIL_MAX);
                deepest = Some(Violation {
                    op: event.op,
                    linearized_tail: stack[tail_from..]
                        .iter()
                        .map(|(call, _)| list.events[*call].op)
                        .collect(),
                    linearized_count: stack.len(),
                    states: states.clone(),
                });
            }
            let Some((call, before)) = stack.pop() else {
                return Outcome::Violation(deepest.expect("recorded just above"));
            };
            states = before;
            linearized ^= op_word(list.events[call].op);
            list.unlift(call);
            at = list.next[call];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::{Span, Value};
    use rampart_common::ids::Version;
    use rampart_common::reject::RejectRules;
    use rampart_common::status::Status;

    const A: Value = Value::Bytes(0);
    const B: Value = Value::Bytes(1);
    const C: Value = Value::Bytes(2);
    const UNKNOWN: u64 = u64::MAX;

    fn write(value: Value) -> Call {
        Call::Write {
            value,
            rules: RejectRules::default(),
        }
    }

    fn remove() -> Call {
        Call::Remove {
            rules: RejectRules::default(),
        }
    }

    fn read(version: u64, value: Value) -> Ret {
        Ret::Read(Some((version, value)))
    }

    fn check(ops: &[(Call, Ret, u64, u64)]) -> Outcome {
        check_key(ops, Limits::default())
    }

    fn violating_op(ops: &[(Call, Ret, u64, u64)]) -> usize {
        match check(ops) {
            Outcome::Violation(v) => v.op,
            other => panic!("expected a violation, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_history_is_linearizable() {
        assert_eq!(check(&[]), Outcome::Linearizable);
    }

    #[test]
    fn sequential_writes_and_reads_are_linearizable() {
        let ops = [
            (write(A), Ret::Written(1), 0, 1),
            (Call::Read, read(1, A), 2, 3),
            (write(B), Ret::Written(2), 4, 5),
            (Call::Read, read(2, B), 6, 7),
            (remove(), Ret::Removed(Some(2)), 8, 9),
            (Call::Read, Ret::Read(None), 10, 11),
        ];
        assert_eq!(check(&ops), Outcome::Linearizable);
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_see_either_value() {
        for seen in [read(1, A), read(2, B)] {
            let ops = [
                (write(A), Ret::Written(1), 0, 1),
                (write(B), Ret::Written(2), 2, 10),
                (Call::Read, seen, 3, 4),
            ];
            assert_eq!(check(&ops), Outcome::Linearizable, "{seen:?}");
        }
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_write_is_a_violation() {
        let ops = [
            (write(A), Ret::Written(1), 0, 1),
            (write(B), Ret::Written(2), 2, 3),
            (Call::Read, read(1, A), 4, 5),
        ];
        assert_eq!(violating_op(&ops), 2);
    }

    #[test]
    fn reads_going_back_in_time_are_a_violation_even_when_each_could_be_concurrent() {
        // B's write is still pending: a read may see A or B, but once one read saw B, a
        // later read may not see A again.
        let ops = [
            (write(A), Ret::Written(1), 0, 1),
            (write(B), Ret::Written(2), 2, 100),
            (Call::Read, read(2, B), 3, 4),
            (Call::Read, read(1, A), 5, 6),
        ];
        assert!(matches!(check(&ops), Outcome::Violation(_)));
    }

    #[test]
    fn a_lost_write_is_a_violation() {
        // Acknowledged, then a read long after sees nothing.
        let ops = [
            (write(A), Ret::Written(1), 0, 1),
            (Call::Read, Ret::Read(None), 50, 51),
        ];
        assert_eq!(violating_op(&ops), 1);
    }

    #[test]
    fn a_write_resurrected_after_its_remove_is_a_violation() {
        let ops = [
            (write(A), Ret::Written(1), 0, 1),
            (remove(), Ret::Removed(Some(1)), 2, 3),
            (Call::Read, read(1, A), 4, 5),
        ];
        assert_eq!(violating_op(&ops), 2);
    }

    #[test]
    fn a_version_going_backwards_is_a_violation() {
        let ops = [
            (write(A), Ret::Written(7), 0, 1),
            (write(B), Ret::Written(5), 2, 3),
        ];
        assert_eq!(violating_op(&ops), 1);
        // Also across a remove and a re-create.
        let ops = [
            (write(A), Ret::Written(7), 0, 1),
            (remove(), Ret::Removed(Some(7)), 2, 3),
            (write(B), Ret::Written(7), 4, 5),
        ];
        assert_eq!(violating_op(&ops), 2);
    }

    #[test]
    fn a_value_never_written_is_a_violation() {
        let ops = [
            (write(A), Ret::Written(1), 0, 1),
            (Call::Read, read(1, C), 2, 3),
        ];
        assert_eq!(violating_op(&ops), 1);
    }

    #[test]
    fn an_unknown_write_may_have_applied_late_or_never() {
        let applied = [
            (write(A), Ret::Written(1), 0, 1),
            (write(B), Ret::Unknown, 2, UNKNOWN),
            (Call::Read, read(1, A), 3, 4),
            (Call::Read, read(9, B), 50, 51),
        ];
        assert_eq!(check(&applied), Outcome::Linearizable);
        let never = [
            (write(A), Ret::Written(1), 0, 1),
            (write(B), Ret::Unknown, 2, UNKNOWN),
            (Call::Read, read(1, A), 50, 51),
        ];
        assert_eq!(check(&never), Outcome::Linearizable);
        // But not before it was called.
        let early = [
            (Call::Read, read(9, B), 0, 1),
            (write(B), Ret::Unknown, 2, UNKNOWN),
        ];
        assert!(matches!(check(&early), Outcome::Violation(_)));
    }

    #[test]
    fn an_increment_applied_twice_is_a_violation() {
        // What a retried increment without exactly-once would do.
        let inc = Call::Increment {
            delta: 1,
            rules: RejectRules::default(),
        };
        let ops = [
            (
                inc,
                Ret::Incremented {
                    value: 1,
                    version: 1,
                },
                0,
                10,
            ),
            (Call::Read, read(2, Value::Int(2)), 20, 21),
        ];
        assert_eq!(violating_op(&ops), 1);
    }

    #[test]
    fn compare_and_swap_succeeds_once_per_version() {
        let cas = |value| Call::Write {
            value,
            rules: RejectRules::version_is(Version(1)),
        };
        // Two concurrent CASes from version 1: one applies, the other must be refused.
        let good = [
            (write(A), Ret::Written(1), 0, 1),
            (cas(B), Ret::Written(2), 2, 10),
            (
                cas(C),
                Ret::Rejected {
                    status: Status::WrongVersion,
                    current: 2,
                },
                3,
                9,
            ),
        ];
        assert_eq!(check(&good), Outcome::Linearizable);
        let both = [
            (write(A), Ret::Written(1), 0, 1),
            (cas(B), Ret::Written(2), 2, 10),
            (cas(C), Ret::Written(3), 3, 9),
        ];
        assert!(matches!(check(&both), Outcome::Violation(_)));
    }

    #[test]
    fn the_violation_names_the_states_the_key_could_be_in() {
        let ops = [
            (write(A), Ret::Written(1), 0, 1),
            (write(B), Ret::Written(2), 2, 3),
            (Call::Read, read(1, A), 4, 5),
        ];
        let Outcome::Violation(violation) = check(&ops) else {
            panic!("expected a violation");
        };
        assert_eq!(violation.linearized_count, 2);
        assert_eq!(violation.linearized_tail, [0, 1]);
        assert_eq!(
            violation.states,
            [KeyState {
                value: Some(B),
                version: Span::exact(2)
            }]
        );
    }

    #[test]
    fn a_search_past_its_limit_is_inconclusive() {
        // Many concurrent unknown writes and a read no order explains: the search tries
        // every subset of them before it can say so.
        let ops: Vec<_> = (0..20)
            .map(|i| (write(Value::Bytes(i)), Ret::Unknown, i as u64, UNKNOWN))
            .chain([(Call::Read, read(1, Value::Bytes(99)), 100, 101)])
            .collect();
        let outcome = check_key(
            &ops,
            Limits {
                configurations_max: 1_000,
            },
        );
        assert!(
            matches!(outcome, Outcome::Inconclusive { .. }),
            "{outcome:?}"
        );
    }
}
