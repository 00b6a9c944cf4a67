//! # rampart-sim: deterministic simulation of replication and crash recovery
//!
//! One seed fixes a whole run: a master takes a random workload of writes and removes,
//! replicates its log to simulated backups while the world drops and loses messages
//! (or holds requests back and delivers them late, after the master gave up on them),
//! takes backups down for a while or for good, leaves the coordinators without a leader,
//! and kills the master — or declares it crashed while it keeps running (a zombie) —
//! at any call; then the crashed master is recovered and the recovered objects are
//! checked against what every client was told ([`checker`]). A failing seed prints
//! itself and replays exactly: `rampart simulate --seed N --trace`.
//!
//! # What is real and what is simulated
//! The protocol decisions are Rampart's own code, not models of it:
//! * the master's log is a real `SegmentedLog` (entries, Tailwind checksums, digests,
//!   footers, rollovers);
//! * each segment's replicas are a real `SegmentReplicas` (placement, epochs, bumps,
//!   the epoch recorded at the coordinator, closes, frees);
//! * the coordinators' state is the real `CoordinatorState` (enlistment, crash
//!   declarations, `SetOpenEpoch` with its two-segment bound and its refusal once the
//!   master is crashed);
//! * each backup's decisions about its frames are the real `FrameTable` of
//!   `rampart-backup` (opens and the replacing open that keeps a slot's bytes, epoch
//!   checks, writes, bumps, closes, frees with their epoch bound, fences and fenced
//!   lengths, which frame shadows a stored copy, the slot a flushed replica stays
//!   readable from);
//! * backups' listings use the real log scanner, and the recovery's choice of copies is
//!   the real `recovery_plan` (`check_log`, `choose_sources`).
//!
//! Around them, thin synchronous drivers stand in for the async ones ([`master`] for
//! `Replicator`, [`recovery`] for the coordinator's recovery driver, [`backup`] for the
//! backup's frames, store and request handlers: frame slots and the disk are bytes in
//! memory, the store's write and free rules restated). The network, the clock and the
//! faults are the [`world`].
//!
//! # Why an executor of our own, not `madsim` or `turmoil`
//! The cores are synchronous state machines (STYLE.md habit 8), so a seeded loop over
//! them needs no async runtime at all: no crate to adopt, runs of a few milliseconds
//! (thousands of seeds a minute on two cores), and exact replay. `madsim` would replace
//! tokio in every crate behind a `cfg`, yet could not make the real drivers
//! deterministic as they stand: `raft-engine` writes from its own threads, frames are
//! shared memory mapped by two processes with pidfd liveness, and the drivers read
//! `std::time`. `turmoil` simulates TCP between hosts, but a third of the replication
//! is one-sided writes into shared memory and the interesting faults are between a
//! write and its fence. Running the real async drivers under simulation needs the RPC
//! layer over an injected network and time from an injected clock first (STYLE.md
//! habit 10); that is the next layer, not this one.
//!
//! # Not simulated yet
//! One master per run, one table; no cleaner (none exists); backups that restart
//! under a new id; the recovery masters' own replication; several recoveries at once;
//! client reads racing the crash (a read returns what was acknowledged, so the check of
//! acknowledged writes covers it here).

pub mod backup;
pub mod checker;
pub mod master;
pub mod recovery;
pub mod trace;
pub mod world;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::fmt;

use checker::History;
use master::SimMaster;
use world::{Crash, Stop, World};

/// Steps after which a recovery that neither ends nor fails is reported stuck.
const RECOVERY_STEPS_MAX: usize = 200_000;

/// What one run does; drawn from its seed (a "swarm": each seed also picks its own
/// rates of each fault, so that some runs hammer one kind of fault).
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Backups (each on its own failure domain).
    pub backups: usize,
    /// Replicas of each segment (R).
    pub replicas: usize,
    /// Bytes of one segment: small, so runs roll over often.
    pub segment_bytes: u32,
    /// Batches the workload appends.
    pub batches: usize,
    /// Most operations in one batch.
    pub batch_ops_max: usize,
    /// Distinct keys.
    pub keys: u64,
    /// Largest value, bytes.
    pub value_bytes_max: usize,
    /// Bytes of one write of a new replica's fill: a crash can fall between two.
    pub fill_chunk_bytes: u32,
    /// Per call: the request or its reply is lost.
    pub drop_p: f64,
    /// Per call: a backup goes down for a while (keeping what it holds).
    pub backup_down_p: f64,
    /// Per call: a backup is lost for good (at most R − 1 of them in a run).
    pub backup_lost_p: f64,
    /// Per call: the coordinators have no leader for a while.
    pub coordinator_silent_p: f64,
    /// Per call: the master crashes.
    pub master_crash_p: f64,
    /// Of those crashes, the share that are declarations of a master still running.
    pub zombie_p: f64,
    /// Of the requests dropped, the share the network only held back: they reach their
    /// backup later, after the master gave up on them (stale opens, writes, bumps,
    /// closes and frees arriving out of order).
    pub late_p: f64,
}

impl SimConfig {
    /// The configuration of run `seed`.
    pub fn for_seed(seed: u64) -> SimConfig {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5157_4d43_4f4e_4647);
        let backups = rng.gen_range(3..=7);
        let replicas = rng.gen_range(2..=3).min(backups - 1);
        let pick = |rng: &mut SmallRng, choices: &[f64]| choices[rng.gen_range(0..choices.len())];
        SimConfig {
            backups,
            replicas,
            segment_bytes: [4096, 8192][rng.gen_range(0..2)],
            batches: rng.gen_range(20..=200),
            batch_ops_max: rng.gen_range(1..=8),
            keys: rng.gen_range(4..=64),
            value_bytes_max: rng.gen_range(8..=600),
            fill_chunk_bytes: rng.gen_range(64..=2048),
            drop_p: pick(&mut rng, &[0.0, 0.01, 0.05]),
            backup_down_p: pick(&mut rng, &[0.0, 0.005, 0.03]),
            backup_lost_p: pick(&mut rng, &[0.0, 0.002, 0.01]),
            coordinator_silent_p: pick(&mut rng, &[0.0, 0.002, 0.01]),
            master_crash_p: pick(&mut rng, &[0.0005, 0.003, 0.02]),
            zombie_p: pick(&mut rng, &[0.0, 0.5, 1.0]),
            // Drawn last, from draws of its own: seeds drawn without late requests run
            // as they did before late requests were simulated.
            late_p: pick(&mut rng, &[0.0, 0.0, 0.5, 1.0]),
        }
    }
}

/// A run that passed its checks.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    /// Operations appended, and acknowledged to their clients.
    pub appended: usize,
    pub acknowledged: usize,
    /// How the master ended: killed, or declared crashed while running.
    pub crash: Crash,
    /// Why the master stopped before the workload ended, if it did.
    pub stopped: Option<String>,
    /// Objects recovered.
    pub recovered: usize,
    /// Simulated time at the end, µs.
    pub time_us: u64,
    /// Events in the trace, and the CRC32 of all of them: equal for two runs of one
    /// seed.
    pub events: usize,
    pub trace_crc32: u32,
    /// Requests that reached a backup after their sender gave up on them.
    pub late_delivered: usize,
    /// Every event of the run.
    pub trace: Vec<String>,
}

/// A run that failed a check: the seed replays it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub why: String,
    /// Every event of the run.
    pub trace: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation seed {} failed: {}\n  replay it: cargo run -p rampart-ops -- simulate --seed {} --trace",
            self.seed, self.why, self.seed
        )
    }
}

/// Runs seed `seed` and checks it.
pub fn run(seed: u64) -> Result<Report, Failure> {
    let config = SimConfig::for_seed(seed);
    let mut world = World::new(config.clone(), seed);
    world.note(format!("{config:?}"));
    let mut master = SimMaster::new(world.master, config.segment_bytes, config.replicas);
    let mut history = History::default();
    let stopped = drive(&mut world, &mut master, &mut history, &config);
    if let Some(stop) = &stopped {
        world.note(format!("master stopped: {stop:?}"));
    }
    let fail = |world: World, why: String| Failure {
        seed,
        why,
        trace: world.trace,
    };
    if let Some(Stop::Fatal(why)) = &stopped {
        if world.crash.is_none() {
            // Only a master declared crashed may stop itself.
            return Err(fail(world, format!("a live master stopped itself: {why}")));
        }
    }
    if world.crash.is_none() {
        world.declare_crashed("killed after the workload");
        world.crash = Some(Crash::Killed);
    }
    let crash = world.crash.unwrap_or(Crash::Killed);
    let Some(mut recovery) = world.recovery.take() else {
        return Err(fail(world, "a crashed master has no recovery".to_string()));
    };
    let mut steps = 0;
    while !recovery.ended() {
        steps += 1;
        if steps > RECOVERY_STEPS_MAX {
            return Err(fail(world, "the recovery never ended".to_string()));
        }
        world.pass_time();
        recovery.advance(&mut world.reach());
    }
    if let Some(why) = recovery.failure() {
        let why = format!("recovery failed: {why}");
        return Err(fail(world, why));
    }
    let recovered = match recovery.replay() {
        Ok(objects) => objects,
        Err(why) => return Err(fail(world, why)),
    };
    if let Err(why) = history.check(&recovered) {
        return Err(fail(world, why));
    }
    Ok(Report {
        seed,
        appended: history.len(),
        acknowledged: history.acknowledged(),
        crash,
        stopped: stopped.map(|s| format!("{s:?}")),
        recovered: recovered.len(),
        time_us: world.now_us,
        events: world.trace.len(),
        trace_crc32: world
            .trace
            .iter()
            .fold(crc32fast::Hasher::new(), |mut crc, line| {
                crc.update(line.as_bytes());
                crc
            })
            .finalize(),
        late_delivered: world.late_delivered,
        trace: world.trace,
    })
}

/// Runs the workload until it ends or the master stops; why it stopped, if it did.
fn drive(
    world: &mut World,
    master: &mut SimMaster,
    history: &mut History,
    config: &SimConfig,
) -> Option<Stop> {
    if let Err(stop) = master.start(world) {
        return Some(stop);
    }
    for batch in 0..config.batches {
        let count = world.draw(1..config.batch_ops_max as u64 + 1);
        let ops: Vec<(u64, Option<Vec<u8>>)> = (0..count)
            .map(|i| {
                let key = world.draw(0..config.keys);
                if world.chance(0.15) {
                    (key, None)
                } else {
                    let len = world.draw(1..config.value_bytes_max as u64 + 1) as usize;
                    let mut value = format!("b{batch}o{i}k{key}:").into_bytes();
                    value.resize(len.max(value.len()), b'.');
                    (key, Some(value))
                }
            })
            .collect();
        if let Err(stop) = master.write_batch(world, &ops, history) {
            return Some(stop);
        }
        if let Err(stop) = master.tick(world) {
            return Some(stop);
        }
    }
    None
}
