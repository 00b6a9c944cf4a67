//! The drill's clients: each a long-lived [`Client`] calling one operation at a time on a
//! bounded key space, recording every operation it calls ([`Operation`]).
//!
//! Keys are registers `r0..` (reads, writes, compare-and-swaps, create-only writes,
//! removes with and without a version rule, multi-reads and multi-writes) and counters
//! `c0..` (increments, some conditional, reads and removes), so that increments always
//! meet integers. Every value written is unique in the run (`w{client}-{sequence}`,
//! never 8 bytes long), so a value read names its write. [`OpChooser`] draws the
//! operations from a seed; [`run_client`] calls them and records what came back.
//!
//! Besides them each client walks keys that are *deleted for good* (issue 39: the
//! shape that hid resurrection from the drill): a cold key `k{client}-{n}` written once
//! with [`COLD_VALUE_BYTES`] (it keeps its segment in the log), beside it `d{client}-{n}`
//! written, overwritten once or twice, then removed and never written again; removed
//! ones are read now and then, and every one of them once more at the end
//! ([`doomed_keys`]), so a key that comes back after cleaning or a crash is a
//! violation.

use bytes::Bytes;
use rampart_check::{Input, Operation, Output};
use rampart_client::{Client, ClientError, RejectRules, TableId, Version, WriteItem};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// Objects in one multi-read or multi-write of the drill.
pub const MULTI_OBJECTS_MAX: usize = 4;

/// Bytes of each cold value written beside a doomed key: large enough to keep its
/// segment in the log (mostly live) while the doomed key's later versions die.
pub const COLD_VALUE_BYTES: usize = 4096;

/// Removed doomed keys a client remembers to read again (the oldest are forgotten).
const DEAD_KEYS_MAX: usize = 64;

/// One operation a client calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrillOp {
    /// Read a key.
    Read(Vec<u8>),
    /// Write a key unless the rules refuse.
    Write {
        key: Vec<u8>,
        value: Vec<u8>,
        rules: RejectRules,
    },
    /// Remove a key unless the rules refuse.
    Remove { key: Vec<u8>, rules: RejectRules },
    /// Add to a counter unless the rules refuse.
    Increment {
        key: Vec<u8>,
        delta: i64,
        rules: RejectRules,
    },
    /// Read several keys at once.
    MultiRead(Vec<Vec<u8>>),
    /// Write several keys at once (key, value), each on its own.
    MultiWrite(Vec<(Vec<u8>, Vec<u8>)>),
}

/// Draws a client's operations.
#[derive(Debug)]
pub struct OpChooser {
    client: u32,
    registers: u32,
    counters: u32,
    sequence: u64,
    /// The version this client last saw of each key, for its compare-and-swaps.
    seen: HashMap<Vec<u8>, Version>,
    /// The doomed key being walked: its number and the writes it has left (its cold
    /// key is written when it is 0 writes in, its removal when none are left).
    doomed: Option<(u64, u32)>,
    /// Doomed keys started so far.
    doomed_started: u64,
    /// Removed doomed keys, most recent last (at most [`DEAD_KEYS_MAX`]).
    dead: Vec<Vec<u8>>,
    rng: SmallRng,
}

impl OpChooser {
    /// Client `client`'s chooser over `keys` keys (a quarter of them counters, at least
    /// one of each when `keys` ≥ 2), seeded from the drill's seed.
    pub fn new(seed: u64, client: u32, keys: u32) -> OpChooser {
        let counters = if keys >= 2 { (keys / 4).max(1) } else { 0 };
        OpChooser {
            client,
            registers: keys - counters,
            counters,
            sequence: 0,
            seen: HashMap::new(),
            doomed: None,
            doomed_started: 0,
            dead: Vec::new(),
            rng: SmallRng::seed_from_u64(seed ^ (u64::from(client) << 32) ^ 0x0064_7269_6c6c),
        }
    }

    /// Every key of a drill over `keys` keys.
    pub fn all_keys(keys: u32) -> Vec<Vec<u8>> {
        let chooser = OpChooser::new(0, 0, keys);
        (0..chooser.registers)
            .map(register)
            .chain((0..chooser.counters).map(counter))
            .collect()
    }

    /// Remembers the version this client saw of `key`.
    pub fn saw(&mut self, key: &[u8], version: Version) {
        self.seen.insert(key.to_vec(), version);
    }

    fn value(&mut self) -> Vec<u8> {
        self.sequence += 1;
        // At least 13 bytes: never taken for an 8-byte integer.
        format!("w{:03}-{:08}", self.client, self.sequence).into_bytes()
    }

    fn register(&mut self) -> Vec<u8> {
        register(self.rng.gen_range(0..self.registers.max(1)))
    }

    /// The next step of the doomed-key walk (module doc): a cold write and the first
    /// write, overwrites, then the removal.
    fn doomed_op(&mut self) -> DrillOp {
        let (n, left) = match self.doomed {
            Some(walk) => walk,
            None => {
                let n = self.doomed_started;
                self.doomed_started += 1;
                // The cold neighbour first, then 2–3 writes of the doomed key.
                self.doomed = Some((n, self.rng.gen_range(2..=3)));
                let mut value = self.value();
                value.resize(COLD_VALUE_BYTES, b'.');
                return DrillOp::Write {
                    key: cold_key(self.client, n),
                    value,
                    rules: RejectRules::default(),
                };
            }
        };
        let key = doomed_key(self.client, n);
        if left == 0 {
            self.doomed = None;
            if self.dead.len() == DEAD_KEYS_MAX {
                self.dead.remove(0);
            }
            self.dead.push(key.clone());
            return DrillOp::Remove {
                key,
                rules: RejectRules::default(),
            };
        }
        self.doomed = Some((n, left - 1));
        DrillOp::Write {
            key,
            value: self.value(),
            rules: RejectRules::default(),
        }
    }

    /// The next operation.
    pub fn next_op(&mut self) -> DrillOp {
        let roll = self.rng.gen_range(0..100);
        match roll {
            20..=22 => return self.doomed_op(),
            23 if !self.dead.is_empty() => {
                let at = self.rng.gen_range(0..self.dead.len());
                return DrillOp::Read(self.dead[at].clone());
            }
            _ => {}
        }
        if self.counters > 0 && roll < 20 {
            let key = counter(self.rng.gen_range(0..self.counters));
            return match roll {
                0..=11 => DrillOp::Increment {
                    key,
                    delta: self.rng.gen_range(1..=5),
                    rules: RejectRules::default(),
                },
                12..=14 => {
                    let rules = self.compare_and_swap(&key);
                    DrillOp::Increment {
                        key,
                        delta: 1,
                        rules,
                    }
                }
                15..=18 => DrillOp::Read(key),
                _ => DrillOp::Remove {
                    key,
                    rules: RejectRules::default(),
                },
            };
        }
        let key = self.register();
        match roll {
            20..=54 => DrillOp::Read(key),
            55..=74 => DrillOp::Write {
                key,
                value: self.value(),
                rules: RejectRules::default(),
            },
            75..=81 => {
                let rules = self.compare_and_swap(&key);
                DrillOp::Write {
                    key,
                    value: self.value(),
                    rules,
                }
            }
            82..=84 => DrillOp::Write {
                key,
                value: self.value(),
                rules: RejectRules::create_only(),
            },
            85..=89 => {
                let rules = if self.rng.gen_bool(0.5) {
                    RejectRules::default()
                } else {
                    self.compare_and_swap(&key)
                };
                DrillOp::Remove { key, rules }
            }
            90..=94 => {
                let n = self.rng.gen_range(2..=MULTI_OBJECTS_MAX);
                DrillOp::MultiRead((0..n).map(|_| self.register()).collect())
            }
            _ => {
                let n = self.rng.gen_range(2..=MULTI_OBJECTS_MAX);
                let mut items: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = self.register();
                    // One write per key in a multi-write: the master applies them in an
                    // order of its own, which one history entry per key could not tell.
                    if items.iter().all(|(k, _)| *k != key) {
                        let value = self.value();
                        items.push((key, value));
                    }
                }
                DrillOp::MultiWrite(items)
            }
        }
    }

    /// Apply only at the version this client saw last (or, now and then, one off it, so
    /// that refusals happen too); only if missing when it saw none.
    fn compare_and_swap(&mut self, key: &[u8]) -> RejectRules {
        match self.seen.get(key) {
            Some(&version) => {
                let off = if self.rng.gen_bool(0.2) { 1 } else { 0 };
                RejectRules::version_is(Version(version.0 + off))
            }
            None => RejectRules::create_only(),
        }
    }
}

fn register(i: u32) -> Vec<u8> {
    format!("r{i}").into_bytes()
}

fn doomed_key(client: u32, n: u64) -> Vec<u8> {
    format!("d{client}-{n}").into_bytes()
}

fn cold_key(client: u32, n: u64) -> Vec<u8> {
    format!("k{client}-{n}").into_bytes()
}

/// The doomed and cold keys (module doc) that `history` touched: read once more at the
/// end beside every register and counter.
pub fn doomed_keys(history: &[Operation]) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = history
        .iter()
        .filter(|o| matches!(o.key.first(), Some(b'd' | b'k')))
        .map(|o| o.key.clone())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

fn counter(i: u32) -> Vec<u8> {
    format!("c{i}").into_bytes()
}

/// What a failed mutation tells: refused by its rules, known not applied, or unknown.
pub fn mutation_failure(error: &ClientError) -> Output {
    match error {
        ClientError::Rejected { status, current } => Output::Rejected {
            status: *status,
            current: current.0,
        },
        // Refused before anything was appended.
        ClientError::NoSpace | ClientError::Invalid { .. } | ClientError::TableDoesntExist(_) => {
            Output::Failed(error.to_string())
        }
        // May have applied in some attempt (once at most): the deadline passed, or
        // anything unexpected.
        _ => Output::Unknown(error.to_string()),
    }
}

/// Counts shared with the drill's progress line.
#[derive(Debug, Default)]
pub struct Counts {
    /// Operations called (a multi-op counts once per key).
    pub operations: AtomicU64,
    /// Of them, of unknown outcome.
    pub unknown: AtomicU64,
    /// Of them, failed (known not applied).
    pub failed: AtomicU64,
}

/// Runs one client until `stop`, recording every operation with times from `start`.
pub async fn run_client(
    client: Client,
    table: TableId,
    mut chooser: OpChooser,
    start: Instant,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) -> Vec<Operation> {
    let mut history = Vec::new();
    let id = chooser.client;
    let now_us = || start.elapsed().as_micros() as u64;
    while !stop.load(Ordering::Relaxed) {
        let op = chooser.next_op();
        let call_us = now_us();
        let mut record = |key: Vec<u8>, input: Input, output: Output| {
            counts.operations.fetch_add(1, Ordering::Relaxed);
            match output {
                Output::Unknown(_) => counts.unknown.fetch_add(1, Ordering::Relaxed),
                Output::Failed(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
            history.push(Operation {
                client: id,
                key,
                call_us,
                return_us: now_us(),
                input,
                output,
            });
        };
        match op {
            DrillOp::Read(key) => {
                let output = match client.read(table, &key).await {
                    Ok(found) => {
                        if let Some(object) = &found {
                            chooser.saw(&key, object.version);
                        }
                        Output::Read(found.map(|o| (o.version.0, o.value.to_vec())))
                    }
                    Err(e) => Output::Failed(e.to_string()),
                };
                record(key, Input::Read, output);
            }
            DrillOp::Write { key, value, rules } => {
                let output = match client.write_with(table, &key, &value, rules).await {
                    Ok(version) => {
                        chooser.saw(&key, version);
                        Output::Written(version.0)
                    }
                    Err(e) => mutation_failure(&e),
                };
                record(key, Input::Write { value, rules }, output);
            }
            DrillOp::Remove { key, rules } => {
                let output = match client.remove_with(table, &key, rules).await {
                    Ok(removed) => Output::Removed(removed.map(|v| v.0)),
                    Err(e) => mutation_failure(&e),
                };
                record(key, Input::Remove { rules }, output);
            }
            DrillOp::Increment { key, delta, rules } => {
                let output = match client.increment_with(table, &key, delta, rules).await {
                    Ok((value, version)) => {
                        chooser.saw(&key, version);
                        Output::Incremented {
                            value,
                            version: version.0,
                        }
                    }
                    Err(e) => mutation_failure(&e),
                };
                record(key, Input::Increment { delta, rules }, output);
            }
            DrillOp::MultiRead(keys) => {
                let wanted: Vec<(TableId, &[u8])> = keys.iter().map(|k| (table, &k[..])).collect();
                let outputs: Vec<Output> = match client.multi_read(&wanted).await {
                    Ok(results) => results
                        .into_iter()
                        .map(|result| match result {
                            Ok(found) => {
                                Output::Read(found.map(|o| (o.version.0, o.value.to_vec())))
                            }
                            Err(e) => Output::Failed(e.to_string()),
                        })
                        .collect(),
                    Err(e) => keys.iter().map(|_| Output::Failed(e.to_string())).collect(),
                };
                for (key, output) in keys.into_iter().zip(outputs) {
                    if let Output::Read(Some((version, _))) = &output {
                        chooser.saw(&key, Version(*version));
                    }
                    record(key, Input::Read, output);
                }
            }
            DrillOp::MultiWrite(items) => {
                let writes: Vec<WriteItem> = items
                    .iter()
                    .map(|(key, value)| WriteItem {
                        table,
                        key: Bytes::copy_from_slice(key),
                        value: Bytes::copy_from_slice(value),
                        rules: RejectRules::default(),
                    })
                    .collect();
                let outputs: Vec<Output> = match client.multi_write(&writes).await {
                    Ok(results) => results
                        .into_iter()
                        .map(|result| match result {
                            Ok(version) => Output::Written(version.0),
                            Err(e) => mutation_failure(&e),
                        })
                        .collect(),
                    Err(e) => items.iter().map(|_| mutation_failure(&e)).collect(),
                };
                for ((key, value), output) in items.into_iter().zip(outputs) {
                    if let Output::Written(version) = output {
                        chooser.saw(&key, Version(version));
                    }
                    record(
                        key,
                        Input::Write {
                            value,
                            rules: RejectRules::default(),
                        },
                        output,
                    );
                }
            }
        }
    }
    history
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chooser_replays_from_its_seed_and_values_are_unique_and_never_integers() {
        let mut a = OpChooser::new(9, 3, 16);
        let mut b = OpChooser::new(9, 3, 16);
        let mut values = std::collections::HashSet::new();
        for _ in 0..2_000 {
            let op = a.next_op();
            assert_eq!(op, b.next_op());
            let written: Vec<&Vec<u8>> = match &op {
                DrillOp::Write { value, .. } => vec![value],
                DrillOp::MultiWrite(items) => items.iter().map(|(_, v)| v).collect(),
                _ => vec![],
            };
            for value in written {
                assert_ne!(value.len(), 8);
                assert!(values.insert(value.clone()), "{value:?} written twice");
            }
        }
    }

    #[test]
    fn increments_go_to_counters_and_writes_to_registers() {
        let mut chooser = OpChooser::new(1, 0, 8);
        let keys = OpChooser::all_keys(8);
        assert_eq!(keys.len(), 8);
        for _ in 0..2_000 {
            match chooser.next_op() {
                DrillOp::Increment { key, .. } => assert_eq!(key[0], b'c'),
                DrillOp::Write { key, .. } => assert!(matches!(key[0], b'r' | b'd' | b'k')),
                DrillOp::Read(key) | DrillOp::Remove { key, .. } if key[0] == b'd' => {}
                DrillOp::MultiWrite(items) => {
                    assert!(items.iter().all(|(k, _)| k[0] == b'r'));
                    let distinct: std::collections::HashSet<_> =
                        items.iter().map(|(k, _)| k).collect();
                    assert_eq!(distinct.len(), items.len());
                }
                DrillOp::Read(key) | DrillOp::Remove { key, .. } => assert!(keys.contains(&key)),
                DrillOp::MultiRead(read) => assert!(read.iter().all(|k| keys.contains(k))),
            }
        }
    }

    #[test]
    fn doomed_keys_are_written_beside_cold_data_then_removed_for_good() {
        let mut chooser = OpChooser::new(5, 2, 8);
        // Per doomed key: writes, then whether it was removed; per cold key: writes.
        let mut doomed: HashMap<Vec<u8>, (u32, bool)> = HashMap::new();
        let mut cold: HashMap<Vec<u8>, u32> = HashMap::new();
        for _ in 0..20_000 {
            match chooser.next_op() {
                DrillOp::Write { key, value, .. } if key[0] == b'k' => {
                    assert_eq!(value.len(), COLD_VALUE_BYTES);
                    *cold.entry(key).or_default() += 1;
                }
                DrillOp::Write { key, .. } if key[0] == b'd' => {
                    let state = doomed.entry(key.clone()).or_default();
                    assert!(!state.1, "{key:?} written after its removal");
                    state.0 += 1;
                }
                DrillOp::Remove { key, .. } if key[0] == b'd' => {
                    let state = doomed.get_mut(&key).expect("removed after its writes");
                    assert!((2..=3).contains(&state.0) && !state.1);
                    state.1 = true;
                }
                _ => {}
            }
        }
        let removed = doomed.values().filter(|(_, removed)| *removed).count();
        assert!(removed > 50, "only {removed} doomed keys removed");
        assert!(cold.values().all(|&writes| writes == 1));
        assert!(cold.len() >= removed);
    }

    #[test]
    fn failed_mutations_are_told_apart() {
        assert!(matches!(
            mutation_failure(&ClientError::NoSpace),
            Output::Failed(_)
        ));
        assert!(matches!(
            mutation_failure(&ClientError::Timeout {
                attempts: 3,
                last: "x".into()
            }),
            Output::Unknown(_)
        ));
        assert_eq!(
            mutation_failure(&ClientError::Rejected {
                status: rampart_common::status::Status::WrongVersion,
                current: Version(4)
            }),
            Output::Rejected {
                status: rampart_common::status::Status::WrongVersion,
                current: 4
            }
        );
    }
}
