//! `Workload`: the writes and removes of each batch, drawn from the world's generator.
//!
//! Three kinds of keys, numbered one after the other ([`SimConfig::key_count`]):
//! * *regular* keys (`0..keys`): written and removed at random, a remove 15% of the time;
//!   a removed key is mostly written again soon, which masks any older version of it
//!   left in the log;
//! * *doomed* keys (`doomed_keys` of them, from `keys`): first written a few at a time in
//!   a batch beside cold data, each overwritten 1–3 times in later batches, then removed
//!   and never written again;
//! * *cold* keys (`cold_keys` of them, after the doomed ones): large values written once,
//!   half before and half after the doomed keys of a first write, and never touched
//!   again.
//!
//! The doomed and cold keys are there for the bug of issue 39, item 1, which the regular
//! keys alone never showed: a removal's tombstone names only the segment of the version
//! it removes. The cold data keeps the segment of a doomed key's first version in the
//! log (mostly live, the cleaner leaves it for long) while the cleaner frees the
//! segments of its later versions and of its tombstone; then nothing but a tombstone of
//! each overwritten version keeps the first one from coming back at the next recovery.
//! Nothing writes the key again to hide it, and every recovery reads every key back
//! ([`crate::cluster`]). With that fix undone, about one seed in 200 fails
//! (`sim/tests/seeds.rs`).
//!
//! In some runs (`SimConfig::births_spread`) doomed keys are born one at a time, each
//! with its cold data, throughout the run rather than as soon as batches draw them: cold
//! data keeps being written into heads that replays are appended to, which keeps an
//! abandoned replay's segments in the log (issue 39, item 2).
//!
//! A step of a doomed key is drawn only while none of its writes is of unknown outcome
//! (the client retries those, and a retry after the removal would write it again).
//!
//! With no doomed keys (`SimConfig::doomed_keys` 0) a batch draws exactly what it drew
//! before they existed.

use std::collections::BTreeSet;

use crate::config::SimConfig;
use crate::world::World;

/// Of a batch's regular ops, the share that are removes.
const REMOVE_P: f64 = 0.15;

/// Steps of doomed keys one batch takes, at most.
const DOOMED_STEPS_PER_BATCH_MAX: u64 = 3;

/// Doomed keys first written in one batch, at most.
const DOOMED_PER_BIRTH_MAX: usize = 4;

/// Cold keys written in the batch of a doomed key's first write, at most: with
/// [`COLD_VALUE_BYTES`], from half a segment to a whole one, so that the segment stays
/// mostly live and the cleaner leaves it for long.
const COLD_PER_BIRTH_MAX: usize = 8;

/// Bytes of one cold value: large beside the regular values (up to `value_bytes_max`,
/// often far smaller).
const COLD_VALUE_BYTES: std::ops::Range<u64> = 8 * 1024..15 * 1024;

/// Where a doomed key stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Doomed {
    /// Not written yet.
    Unborn,
    /// Written; overwritten this many more times before its removal.
    Live { overwrites_left: u64 },
    /// Removed, for good.
    Removed,
}

/// One write (`Some(value)`) or remove (`None`) of a key.
pub type Draw = (u64, Option<Vec<u8>>);

/// The state of the doomed and cold keys across batches.
#[derive(Debug)]
pub struct Workload {
    /// Each doomed key's stage: key `keys + i` is `doomed[i]`.
    doomed: Vec<Doomed>,
    /// Cold keys not written yet.
    cold_unwritten: BTreeSet<u64>,
}

impl Workload {
    /// The workload of a run of `config`.
    pub fn new(config: &SimConfig) -> Workload {
        let cold_first = config.keys + config.doomed_keys;
        Workload {
            doomed: vec![Doomed::Unborn; config.doomed_keys as usize],
            cold_unwritten: (cold_first..config.key_count()).collect(),
        }
    }

    /// Doomed keys removed so far (their removes drawn).
    pub fn removed(&self) -> usize {
        self.doomed
            .iter()
            .filter(|d| **d == Doomed::Removed)
            .count()
    }

    /// A batch (number `batch`) of writes and removes of keys that `owns` says the
    /// target master serves, none of them a doomed key in `busy` (a write of it is of
    /// unknown outcome).
    pub fn draw_batch(
        &mut self,
        world: &mut World,
        owns: impl Fn(u64) -> bool,
        busy: &BTreeSet<u64>,
        batch: usize,
    ) -> Vec<Draw> {
        let owned: Vec<u64> = (0..world.config.keys).filter(|&k| owns(k)).collect();
        let mut ops = Vec::new();
        if !owned.is_empty() {
            let count = world.draw(1..world.config.batch_ops_max as u64 + 1);
            for i in 0..count as usize {
                let key = owned[world.draw(0..owned.len() as u64) as usize];
                if world.chance(REMOVE_P) {
                    ops.push((key, None));
                } else {
                    let len = world.draw(1..world.config.value_bytes_max as u64 + 1);
                    ops.push((key, Some(value(batch, i, key, len))));
                }
            }
        }
        if !self.doomed.is_empty() {
            self.draw_doomed(world, &owns, busy, batch, &mut ops);
        }
        ops
    }

    /// Up to [`DOOMED_STEPS_PER_BATCH_MAX`] steps of distinct doomed keys, appended to
    /// `ops`.
    fn draw_doomed(
        &mut self,
        world: &mut World,
        owns: &impl Fn(u64) -> bool,
        busy: &BTreeSet<u64>,
        batch: usize,
        ops: &mut Vec<Draw>,
    ) {
        let first = world.config.keys;
        let mut candidates: Vec<usize> = (0..self.doomed.len())
            .filter(|&i| self.doomed[i] != Doomed::Removed)
            .filter(|&i| owns(first + i as u64) && !busy.contains(&(first + i as u64)))
            .collect();
        for _ in 0..world.draw(0..DOOMED_STEPS_PER_BATCH_MAX + 1) {
            if candidates.is_empty() {
                return;
            }
            let i = candidates.swap_remove(world.draw(0..candidates.len() as u64) as usize);
            let key = first + i as u64;
            match self.doomed[i] {
                Doomed::Unborn if world.config.births_spread => {
                    // One at a time, at a rate that births them all by about two
                    // thirds of the run.
                    let config = &world.config;
                    let p = 1.5 * config.doomed_keys as f64 / config.batches as f64;
                    if world.chance(p) {
                        self.birth(world, owns, vec![i], batch, ops);
                    }
                }
                Doomed::Unborn => {
                    // A few more unborn ones with it, and the cold data beside them.
                    let mut born = vec![i];
                    born.extend(
                        candidates
                            .iter()
                            .copied()
                            .filter(|&j| self.doomed[j] == Doomed::Unborn)
                            .take(DOOMED_PER_BIRTH_MAX - 1),
                    );
                    candidates.retain(|j| !born.contains(j));
                    self.birth(world, owns, born, batch, ops);
                }
                Doomed::Live { overwrites_left: 0 } => {
                    ops.push((key, None));
                    self.doomed[i] = Doomed::Removed;
                }
                Doomed::Live { overwrites_left } => {
                    let len = world.draw(1..world.config.value_bytes_max as u64 + 1);
                    ops.push((key, Some(value(batch, ops.len(), key, len))));
                    self.doomed[i] = Doomed::Live {
                        overwrites_left: overwrites_left - 1,
                    };
                }
                // Never a candidate.
                Doomed::Removed => {}
            }
        }
    }
}

impl Workload {
    /// The first writes of the doomed keys `born` (indices into `doomed`), with the cold
    /// data beside them, appended to `ops`.
    fn birth(
        &mut self,
        world: &mut World,
        owns: &impl Fn(u64) -> bool,
        born: Vec<usize>,
        batch: usize,
        ops: &mut Vec<Draw>,
    ) {
        let first = world.config.keys;
        // Half of the cold values before them, half after: a rollover inside the batch
        // still leaves them in a mostly cold segment.
        let cold: Vec<u64> = self
            .cold_unwritten
            .iter()
            .copied()
            .filter(|&k| owns(k))
            .take(COLD_PER_BIRTH_MAX)
            .collect();
        let mut births = Vec::new();
        for i in born {
            let key = first + i as u64;
            let len = world.draw(1..world.config.value_bytes_max as u64 + 1);
            births.push((key, len));
            self.doomed[i] = Doomed::Live {
                overwrites_left: world.draw(1..4),
            };
        }
        let (before, after) = cold.split_at(cold.len() / 2);
        for &key in before {
            self.cold_unwritten.remove(&key);
            let len = world.draw(COLD_VALUE_BYTES);
            ops.push((key, Some(value(batch, ops.len(), key, len))));
        }
        for (key, len) in births {
            ops.push((key, Some(value(batch, ops.len(), key, len))));
        }
        for &key in after {
            self.cold_unwritten.remove(&key);
            let len = world.draw(COLD_VALUE_BYTES);
            ops.push((key, Some(value(batch, ops.len(), key, len))));
        }
    }
}

/// A value of `len` bytes (at least its tag) that no other op of the run writes: it
/// names its batch, its place in the batch and its key.
fn value(batch: usize, i: usize, key: u64, len: u64) -> Vec<u8> {
    let mut value = format!("b{batch}o{i}k{key}:").into_bytes();
    value.resize((len as usize).max(value.len()), b'.');
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_doomed_key_is_overwritten_one_to_three_times_then_removed_for_good() {
        let config = SimConfig {
            doomed_keys: 8,
            cold_keys: 16,
            ..SimConfig::for_seed(0)
        };
        let mut world = World::new(config.clone(), 0);
        let mut workload = Workload::new(&config);
        let mut seen: BTreeMap<u64, Vec<bool>> = BTreeMap::new();
        for batch in 0..400 {
            for (key, value) in workload.draw_batch(&mut world, |_| true, &BTreeSet::new(), batch) {
                seen.entry(key).or_default().push(value.is_some());
            }
        }
        let doomed = config.keys..config.keys + config.doomed_keys;
        assert_eq!(workload.removed(), doomed.clone().count());
        for key in doomed {
            let ops = &seen[&key];
            assert_eq!(ops.last(), Some(&false), "key {key}: removed last");
            assert!(ops[..ops.len() - 1].iter().all(|&write| write), "key {key}");
            assert!((3..=5).contains(&ops.len()), "key {key}: {ops:?}");
        }
        for key in config.keys + config.doomed_keys..config.key_count() {
            assert!(
                seen.get(&key).map_or(true, |ops| ops == &[true]),
                "cold {key}"
            );
        }
    }

    #[test]
    fn spread_births_come_one_at_a_time_with_cold_data_throughout_the_run() {
        let config = SimConfig {
            doomed_keys: 8,
            cold_keys: 32,
            births_spread: true,
            batches: 200,
            ..SimConfig::for_seed(0)
        };
        let mut world = World::new(config.clone(), 0);
        let mut workload = Workload::new(&config);
        let doomed = config.keys..config.keys + config.doomed_keys;
        let cold = config.keys + config.doomed_keys..config.key_count();
        let mut birth_batches = Vec::new();
        let mut born = BTreeSet::new();
        for batch in 0..config.batches {
            let ops = workload.draw_batch(&mut world, |_| true, &BTreeSet::new(), batch);
            let births: Vec<u64> = ops
                .iter()
                .map(|(key, _)| *key)
                .filter(|key| doomed.contains(key) && born.insert(*key))
                .collect();
            if births.is_empty() {
                continue;
            }
            assert_eq!(births.len(), 1, "batch {batch}: one birth at a time");
            assert!(
                ops.iter().any(|(key, _)| cold.contains(key)) || workload.cold_unwritten.is_empty(),
                "batch {batch}: a birth comes with cold data"
            );
            birth_batches.push(batch);
        }
        assert_eq!(born.len(), doomed.count(), "every doomed key is born");
        // Spread: not all in the first few batches, as when births come as drawn.
        assert!(
            birth_batches.last().is_some_and(|&b| b >= 20),
            "{birth_batches:?}"
        );
    }
}
