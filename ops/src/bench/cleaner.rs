//! `rampart bench cleaner`: what the log cleaner costs the write path as memory fills.
//!
//! One master runs in this process — the real `ObjectStore` and `Appender`, cleaner
//! included, without replication (R = 0) or network, so what is measured is the master:
//! staging, the index, and the cleaner's copying, competing for the same cores. The
//! benchmark fills it with live objects to `--utilization` percent of `--memory-mb` —
//! their log entries and their index entries, since `--memory` holds both —
//! then overwrites them `--passes` times over (in operations: passes × objects), keys
//! drawn uniformly and, in a second run, from YCSB's scrambled Zipfian (`--zipf`). The
//! same is done at `--low-utilization` percent for the baseline. Each mix of
//! `--remove-pct` runs all of that: with N % removes, an operation on a key is, now and
//! then, its removal followed by the creation of a fresh key in its place (so N % of the
//! operations are removes, N % creations of keys never seen, the rest overwrites): the
//! live data stays the same, and every removed key is never written again — the
//! workload whose tombstones the cleaner must keep while older versions of their keys
//! remain. `--clients` tasks
//! submit batches of `--batch` writes each, closed loop, as the RPC layer would.
//!
//! For each run it reports the overwrite throughput (over the second half of the
//! overwrites, once the cleaner is in its steady state, and over all of them), the
//! cleaner's *write cost* — bytes it copied per byte it freed, `relocated / (cleaned
//! segments × segment size − relocated)`, LFS's cost less its one — and where memory
//! ends: live bytes over the memory, and segments in use. A curve of throughput over the
//! run goes to `--svg FILE`, one line per run. Figures are medians over `--rounds`.
//! The fills and the overwrites show their progress on stderr (`progress`).
//!
//! With replication, every byte the cleaner copies is also sent to R backups: the write
//! cost says how much more the network carries for cleaning.
//!
//! # Targets
//! On the 2-core development machine with 100-byte values: throughput at 90 %
//! utilization ≥ 50 % of that at 30 % (uniform keys), and a lower write cost for
//! Zipfian keys than for uniform ones (cost-benefit at work: hot segments empty fast,
//! cold ones are left to age). The benchmark prints PASS or MISS; it never fails on a
//! target, only on errors.
//!
//! `--json FILE` writes `{"mixes": [...], "conditions": {...}, "runs": [...]}`: per
//! mix `"throughput_low_util_ops_s"`, `"throughput_high_util_ops_s"`,
//! `"write_cost_uniform"`, `"write_cost_zipf"`, ..., and each run's figures.

use super::ycsb::KeyChooser;
use crate::plots::LINE_COLOURS;
use crate::progress::Progress;
use crate::stats::median;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use parking_lot::Mutex;
use rampart_common::config::{ByteSize, MasterConfig};
use rampart_common::ids::{ServerId, TableId};
use rampart_common::log::{decode_entry, object_entry_bytes, tombstone_entry_bytes, Entry};
use rampart_common::reject::RejectRules;
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;
use rampart_master::appender::{Appender, AppenderStatus, CleanerStats};
use rampart_master::object_index::INDEX_BYTES_PER_OBJECT;
use rampart_master::replica_manager::{ReplicationConfig, Replicator};
use rampart_master::{ObjectStore, WriteOp};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Throughput at high utilization over throughput at low utilization, at least.
pub const THROUGHPUT_RATIO_MIN: f64 = 0.5;

const TABLE: TableId = TableId(1);
const KEY_BYTES: usize = 16;
/// How often the curve is sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// `rampart bench cleaner`
#[derive(Args, Debug)]
pub struct CleanerBenchArgs {
    /// The master's memory, MiB.
    #[arg(long, default_value_t = 256)]
    pub memory_mb: u64,
    /// Live data, percent of the memory, of the measured runs.
    #[arg(long, default_value_t = 90)]
    pub utilization: u64,
    /// Live data, percent of the memory, of the baseline runs.
    #[arg(long, default_value_t = 30)]
    pub low_utilization: u64,
    /// Bytes of each value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Segment size.
    #[arg(long, default_value = "1MiB")]
    pub segment_bytes: String,
    /// Overwrites, in passes over the live objects.
    #[arg(long, default_value_t = 2.0)]
    pub passes: f64,
    /// Zipfian skew of the skewed runs (YCSB's 0.99).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Concurrent submitters.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Writes per submission.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Mixes to run: the percentage of operations that remove a key (each followed by
    /// the creation of a fresh one).
    #[arg(long, value_delimiter = ',', default_value = "0,20")]
    pub remove_pct: Vec<u64>,
    /// Rounds (figures are medians).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Write the figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the throughput curves (SVG).
    #[arg(long, default_value = "cleaner-throughput.svg")]
    pub svg: PathBuf,
}

/// Keys drawn uniformly or Zipfian.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Keys {
    Uniform,
    Zipf(f64),
}

impl Keys {
    /// `uniform`, or `zipf THETA`.
    fn name(self) -> String {
        match self {
            Keys::Uniform => "uniform".to_string(),
            Keys::Zipf(theta) => format!("zipf {theta}"),
        }
    }
}

/// One run's figures.
#[derive(Clone, Debug)]
struct Run {
    utilization: u64,
    remove_pct: u64,
    keys: Keys,
    objects: u64,
    /// Overwrites per second over the second half, and over all of them.
    steady_ops_s: f64,
    all_ops_s: f64,
    write_cost: f64,
    cleaner: CleanerStats,
    /// Live entries and their index over the memory at the end.
    live_share: f64,
    segments_used: u64,
    segments_max: u64,
    /// Bytes of tombstone entries in the log at the end, over the memory.
    tombstone_share: f64,
    /// Writes answered `Retry` (back-pressure) and submitted again.
    retries: u64,
    /// (seconds since the overwrites began, ops/s over the last interval).
    curve: Vec<(f64, f64)>,
}

/// Runs the benchmark.
pub fn run(args: CleanerBenchArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    let segment_bytes: ByteSize = args.segment_bytes.parse().context("--segment-bytes")?;
    let config = MasterConfig {
        segment_bytes: u32::try_from(segment_bytes.0).context("--segment-bytes")?,
        memory_bytes: args.memory_mb << 20,
        value_bytes_max: args.value_bytes.max(1024),
        ..Default::default()
    };
    config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    if !(1..=99).contains(&args.utilization) || !(1..=99).contains(&args.low_utilization) {
        bail!("--utilization and --low-utilization are percentages in 1..=99");
    }
    if args.clients == 0 || args.batch == 0 || args.rounds == 0 || args.passes <= 0.0 {
        bail!("--clients, --batch, --rounds and --passes must be positive");
    }
    if args.remove_pct.is_empty() || args.remove_pct.iter().any(|&p| p > REMOVE_PCT_MAX) {
        bail!("--remove-pct takes percentages in 0..={REMOVE_PCT_MAX}");
    }
    println!(
        "cleaner: one in-process master, R = 0; {} MiB of {} segments, {} B values, {} B keys; \
         {} passes of overwrites; {} clients × {} writes; {} round(s)",
        args.memory_mb,
        ByteSize(segment_bytes.0),
        args.value_bytes,
        KEY_BYTES,
        args.passes,
        args.clients,
        args.batch,
        args.rounds
    );
    let mut runs = Vec::new();
    for round in 0..args.rounds {
        for &remove_pct in &args.remove_pct {
            for utilization in [args.low_utilization, args.utilization] {
                for keys in [Keys::Uniform, Keys::Zipf(args.zipf)] {
                    let mix = Mix {
                        utilization,
                        keys,
                        remove_pct,
                    };
                    let run = run_one(&args, &config, mix, round as u64)?;
                    print_run(&run);
                    runs.push(run);
                }
            }
        }
    }
    let pick = |remove_pct: u64, utilization: u64, keys: Keys, f: fn(&Run) -> f64| {
        median(
            runs.iter()
                .filter(|r| {
                    r.utilization == utilization && r.keys == keys && r.remove_pct == remove_pct
                })
                .map(f)
                .collect(),
        )
        .unwrap_or(0.0)
    };
    let zipf = Keys::Zipf(args.zipf);
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let mut summaries = Vec::new();
    println!();
    for &remove_pct in &args.remove_pct {
        let low = pick(remove_pct, args.low_utilization, Keys::Uniform, |r| {
            r.steady_ops_s
        });
        let high = pick(remove_pct, args.utilization, Keys::Uniform, |r| {
            r.steady_ops_s
        });
        let cost_uniform = pick(remove_pct, args.utilization, Keys::Uniform, |r| {
            r.write_cost
        });
        let cost_zipf = pick(remove_pct, args.utilization, zipf, |r| r.write_cost);
        let tombstones = pick(remove_pct, args.utilization, Keys::Uniform, |r| {
            r.tombstone_share
        });
        let ratio = if low > 0.0 { high / low } else { 0.0 };
        println!(
            "{remove_pct}% removes, uniform: {high:.0} ops/s at {}% against {low:.0} ops/s at {}%: {:.2}× (target ≥ {THROUGHPUT_RATIO_MIN}×) {}",
            args.utilization,
            args.low_utilization,
            ratio,
            verdict(ratio >= THROUGHPUT_RATIO_MIN)
        );
        println!(
            "{remove_pct}% removes, write cost at {}%: zipf {cost_zipf:.2} against uniform {cost_uniform:.2} (target: lower) {}; \
             tombstones {:.2}% of the memory at the end (uniform)",
            args.utilization,
            verdict(cost_zipf < cost_uniform),
            tombstones * 100.0
        );
        summaries.push(MixFigures {
            remove_pct,
            throughput_low_util_ops_s: low,
            throughput_high_util_ops_s: high,
            write_cost_uniform: cost_uniform,
            write_cost_zipf: cost_zipf,
            tombstone_share_high_util_uniform: tombstones,
        });
    }
    write_svg(&args.svg, &runs)?;
    println!("curves: {}", args.svg.display());
    if let Some(path) = &args.json {
        let figures = CleanerFigures {
            mixes: summaries,
            conditions: Conditions {
                memory_mb: args.memory_mb,
                segment_bytes: segment_bytes.0,
                value_bytes: args.value_bytes,
                key_bytes: KEY_BYTES,
                utilization_pct: args.utilization,
                low_utilization_pct: args.low_utilization,
                passes: args.passes,
                zipf: args.zipf,
                clients: args.clients,
                batch: args.batch,
                rounds: args.rounds,
                replicas: 0,
                in_process: true,
            },
            runs: runs.iter().map(RunFigures::of).collect(),
        };
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What `--json FILE` holds.
#[derive(Debug, Serialize, Deserialize)]
struct CleanerFigures {
    /// Per `--remove-pct`, medians over rounds.
    mixes: Vec<MixFigures>,
    conditions: Conditions,
    runs: Vec<RunFigures>,
}

/// One mix's figures: uniform keys' throughput at both utilizations, the write cost of
/// both key distributions at the high one.
#[derive(Debug, Serialize, Deserialize)]
struct MixFigures {
    remove_pct: u64,
    throughput_low_util_ops_s: f64,
    throughput_high_util_ops_s: f64,
    write_cost_uniform: f64,
    write_cost_zipf: f64,
    /// Tombstones' bytes over the memory at the end.
    tombstone_share_high_util_uniform: f64,
}

/// What the runs were measured under.
#[derive(Debug, Serialize, Deserialize)]
struct Conditions {
    memory_mb: u64,
    segment_bytes: u64,
    value_bytes: usize,
    key_bytes: usize,
    utilization_pct: u64,
    low_utilization_pct: u64,
    passes: f64,
    zipf: f64,
    clients: usize,
    batch: usize,
    rounds: usize,
    replicas: u32,
    in_process: bool,
}

/// One run, as [`Run`] holds it less its curve.
#[derive(Debug, Serialize, Deserialize)]
struct RunFigures {
    utilization_pct: u64,
    remove_pct: u64,
    tombstone_share_end: f64,
    /// `uniform`, or `zipf THETA`.
    keys: String,
    objects: u64,
    steady_ops_s: f64,
    all_ops_s: f64,
    write_cost: f64,
    bytes_relocated: u64,
    segments_cleaned: u64,
    /// The cleaner's passes.
    passes: u64,
    retries: u64,
    live_share_end: f64,
    segments_used_end: u64,
    segments_max: u64,
}

impl RunFigures {
    fn of(r: &Run) -> RunFigures {
        RunFigures {
            utilization_pct: r.utilization,
            remove_pct: r.remove_pct,
            tombstone_share_end: r.tombstone_share,
            keys: r.keys.name(),
            objects: r.objects,
            steady_ops_s: r.steady_ops_s,
            all_ops_s: r.all_ops_s,
            write_cost: r.write_cost,
            bytes_relocated: r.cleaner.totals.bytes_relocated,
            segments_cleaned: r.cleaner.totals.segments_cleaned,
            passes: r.cleaner.passes,
            retries: r.retries,
            live_share_end: r.live_share,
            segments_used_end: r.segments_used,
            segments_max: r.segments_max,
        }
    }
}

fn print_run(run: &Run) {
    let keys = run.keys.name();
    println!(
        "{:>3}% {:<9} {:>2}% removes {:>9} objects: {:>9.0} ops/s steady ({:>9.0} overall), write cost {:>6.2}, \
         {} segments cleaned in {} passes, {} retries; at the end {:.1}% live, {:.2}% tombstones, {}/{} segments",
        run.utilization,
        keys,
        run.remove_pct,
        run.objects,
        run.steady_ops_s,
        run.all_ops_s,
        run.write_cost,
        run.cleaner.totals.segments_cleaned,
        run.cleaner.passes,
        run.retries,
        run.live_share * 100.0,
        run.tombstone_share * 100.0,
        run.segments_used,
        run.segments_max,
    );
}

/// Most `--remove-pct`: each removal comes with a creation, so removes are at most half.
const REMOVE_PCT_MAX: u64 = 50;

/// One run's workload.
#[derive(Clone, Copy, Debug)]
struct Mix {
    utilization: u64,
    keys: Keys,
    remove_pct: u64,
}

/// The key of slot `i` in its generation `generation` (a removal moves the slot to the
/// next generation: a fresh key), [`KEY_BYTES`] long.
fn key(i: u64, generation: u32) -> Bytes {
    Bytes::from(format!("k{i:010}g{:04}", generation % 10_000).into_bytes())
}

fn write(i: u64, generation: u32, value: &Bytes) -> WriteOp {
    WriteOp::Write {
        table: TABLE,
        key: key(i, generation),
        value: value.clone(),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

fn remove(i: u64, generation: u32) -> WriteOp {
    WriteOp::Remove {
        table: TABLE,
        key: key(i, generation),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

/// Submits `ops`, again while any is answered `Retry`; returns the retries.
async fn submit_all(appender: &Appender, mut ops: Vec<WriteOp>) -> Result<u64> {
    let mut retries = 0;
    loop {
        let outcomes = appender.submit(ops.clone()).await?;
        let mut again = Vec::new();
        for (op, outcome) in ops.into_iter().zip(outcomes) {
            match outcome.status {
                Status::Ok => {}
                Status::Retry => again.push(op),
                other => bail!("write refused: {other}"),
            }
        }
        if again.is_empty() {
            return Ok(retries);
        }
        retries += again.len() as u64;
        tokio::time::sleep(Duration::from_micros(200)).await;
        ops = again;
    }
}

fn run_one(args: &CleanerBenchArgs, config: &MasterConfig, mix: Mix, round: u64) -> Result<Run> {
    let Mix {
        utilization,
        keys,
        remove_pct,
    } = mix;
    // The share of slot choices that remove (and re-create): removes are
    // r / (1 + r) of the operations.
    let remove_share = remove_pct as f64 / (100 - remove_pct) as f64;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Live data is what the objects hold in memory: log entry and index entry.
    let entry = object_entry_bytes(KEY_BYTES, args.value_bytes) as u64 + INDEX_BYTES_PER_OBJECT;
    let objects = config.memory_bytes * utilization / 100 / entry;
    let overwrites = (objects as f64 * args.passes) as u64;
    runtime.block_on(async {
        let mut store = ObjectStore::new(ServerId(1), config.clone());
        store.take_tablets(&[Tablet {
            table: TABLE,
            start_hash: 0,
            end_hash: u64::MAX,
            owner: ServerId(1),
        }]);
        let store = Arc::new(Mutex::new(store));
        let status = Arc::new(AppenderStatus::default());
        let replicator = Replicator::new(ServerId(1), ReplicationConfig::none());
        let appender =
            Appender::spawn_replicated(Arc::clone(&store), replicator, Arc::clone(&status));
        let value = Bytes::from(vec![b'v'; args.value_bytes]);
        let run_name = format!("{utilization}% {}, {remove_pct}% removes", keys.name());
        // Each slot's current generation (see `key`).
        let generations: Arc<Vec<AtomicU32>> =
            Arc::new((0..objects).map(|_| AtomicU32::new(0)).collect());
        // The fill: every object once, in key order.
        let filling = Progress::new(&format!("fill {run_name}"), objects, "objects");
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..args.clients {
            let (appender, next, value, batch, filling) = (
                appender.clone(),
                Arc::clone(&next),
                value.clone(),
                args.batch as u64,
                filling.clone(),
            );
            tasks.spawn(async move {
                let mut retries = 0;
                loop {
                    let start = next.fetch_add(batch, Ordering::Relaxed);
                    if start >= objects {
                        return Ok::<u64, anyhow::Error>(retries);
                    }
                    let end = (start + batch).min(objects);
                    let ops = (start..end).map(|i| write(i, 0, &value)).collect();
                    retries += submit_all(&appender, ops).await?;
                    filling.inc(end - start);
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        filling.finish();
        let before = *status.cleaner.lock();
        // The overwrites.
        let done = Arc::new(AtomicU64::new(0));
        let chooser = Arc::new(KeyChooser::new(
            objects,
            match keys {
                Keys::Uniform => 0.0,
                Keys::Zipf(theta) => theta,
            },
        )?);
        // Advanced at each sample of the curve, so the writers pay nothing for it.
        let overwriting = Progress::new(&format!("overwrite {run_name}"), overwrites, "writes");
        let started = Instant::now();
        for client in 0..args.clients {
            let (appender, done, value, chooser, batch, generations) = (
                appender.clone(),
                Arc::clone(&done),
                value.clone(),
                Arc::clone(&chooser),
                args.batch,
                Arc::clone(&generations),
            );
            let mut rng = SmallRng::seed_from_u64(round * 1000 + client as u64 + 1);
            tasks.spawn(async move {
                let mut retries = 0;
                loop {
                    let mut ops = Vec::with_capacity(batch + 1);
                    while ops.len() < batch {
                        let slot = chooser.next(&mut rng);
                        let generation = &generations[slot as usize];
                        if rand::Rng::gen_bool(&mut rng, remove_share.min(1.0)) {
                            let old = generation.fetch_add(1, Ordering::Relaxed);
                            ops.push(remove(slot, old));
                            ops.push(write(slot, old + 1, &value));
                        } else {
                            ops.push(write(slot, generation.load(Ordering::Relaxed), &value));
                        }
                    }
                    if done.fetch_add(ops.len() as u64, Ordering::Relaxed) >= overwrites {
                        return Ok(retries);
                    }
                    retries += submit_all(&appender, ops).await?;
                }
            });
        }
        let mut curve = Vec::new();
        let mut retries = 0u64;
        let (mut last_at, mut last_done) = (Instant::now(), 0u64);
        let mut half: Option<(Instant, u64)> = None;
        while !tasks.is_empty() {
            tokio::select! {
                finished = tasks.join_next() => {
                    if let Some(finished) = finished {
                        retries += finished??;
                    }
                }
                _ = tokio::time::sleep(SAMPLE_INTERVAL) => {
                    let now = Instant::now();
                    let count = done.load(Ordering::Relaxed).min(overwrites);
                    let rate = (count - last_done) as f64 / (now - last_at).as_secs_f64();
                    curve.push(((now - started).as_secs_f64(), rate));
                    (last_at, last_done) = (now, count);
                    overwriting.set_position(count);
                    if half.is_none() && count >= overwrites / 2 {
                        half = Some((now, count));
                    }
                }
            }
        }
        let ended = Instant::now();
        overwriting.finish();
        let all_ops_s = overwrites as f64 / (ended - started).as_secs_f64();
        let steady_ops_s = match half {
            Some((at, count)) if ended > at && overwrites > count => {
                (overwrites - count) as f64 / (ended - at).as_secs_f64()
            }
            _ => all_ops_s,
        };
        let after = *status.cleaner.lock();
        let mut cleaner = after;
        cleaner.passes -= before.passes;
        cleaner.totals.bytes_relocated -= before.totals.bytes_relocated;
        cleaner.totals.bytes_dropped -= before.totals.bytes_dropped;
        cleaner.totals.segments_cleaned -= before.totals.segments_cleaned;
        cleaner.totals.survivors -= before.totals.survivors;
        let write_cost = cleaner.write_cost(u64::from(config.segment_bytes));
        let (usage, tombstone_bytes) = {
            let store = store.lock();
            (store.log().usage(), tombstone_bytes_in(&store))
        };
        Ok(Run {
            utilization,
            remove_pct,
            tombstone_share: tombstone_bytes as f64 / config.memory_bytes as f64,
            keys,
            objects,
            steady_ops_s,
            all_ops_s,
            write_cost,
            cleaner,
            live_share: (usage.live_bytes + objects * INDEX_BYTES_PER_OBJECT) as f64
                / config.memory_bytes as f64,
            segments_used: usage.segments_max - usage.segments_free,
            segments_max: usage.segments_max,
            retries,
            curve,
        })
    })
}

/// Bytes of the tombstones in `store`'s log (every segment held).
fn tombstone_bytes_in(store: &ObjectStore) -> u64 {
    let log = store.log();
    let mut bytes = 0;
    for id in log.segment_ids() {
        let Some(segment) = log.segment_bytes(id) else {
            continue;
        };
        let mut offset = 0;
        while let Ok(Some((entry, next))) = decode_entry(segment, offset) {
            if let Entry::Tombstone(tombstone) = entry {
                bytes += tombstone_entry_bytes(tombstone.key.len()) as u64;
            }
            offset = next;
        }
    }
    bytes
}

/// Throughput over time, one line per run.
fn write_svg(path: &Path, runs: &[Run]) -> Result<()> {
    use plotters::prelude::{
        ChartBuilder, Color, IntoDrawingArea, LineSeries, PathElement, SVGBackend,
        SeriesLabelPosition, BLACK, WHITE,
    };
    let t_max = runs
        .iter()
        .flat_map(|r| r.curve.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let y_max = runs
        .iter()
        .flat_map(|r| r.curve.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let draw = || -> Result<()> {
        let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "bench cleaner: overwrite throughput over time",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_max, 0.0..y_max * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the overwrites began")
            .y_desc("overwrites/s")
            .x_label_formatter(&|t| format!("{t:.1}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (i, run) in runs.iter().enumerate() {
            let colour = LINE_COLOURS[i % LINE_COLOURS.len()];
            chart
                .draw_series(LineSeries::new(
                    run.curve.iter().copied(),
                    colour.stroke_width(2),
                ))?
                .label(format!(
                    "{}% {}, {}% rm",
                    run.utilization,
                    run.keys.name(),
                    run.remove_pct
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().with_context(|| format!("cannot write {}", path.display()))
}
