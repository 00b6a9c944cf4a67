//! `rampart bench rebalance`: a load concentrated on one server's tablets, spread by the
//! rebalancer (issue 42).
//!
//! A private cluster of `--servers` servers, each limited to `--threads` worker threads
//! (1: a hot server is bound by one core even on the 2-core VM), R = `--replicas`, with
//! rebalancing on, acting after `--rebalance-after-ms`. A table of two tablets per server;
//! `--records` objects of `--value-bytes`, all with keys of one server's two tablets.
//! `--clients` closed-loop clients read (`--read-pct`) and write those keys, Zipfian
//! (`--zipf`). The rebalancer is paused for the first `--before-s` seconds (the load as
//! it lands), then resumed for `--run-s` seconds.
//!
//! Prints the aggregate throughput before and over the last `--after-s` seconds, each
//! master's load at the end (max / mean), the time from the resume to the first decision
//! (detect) and to the end of the last (move), the bytes the moves copied, the longest
//! single operation and the operations that failed (must be 0). `--json FILE` writes
//! `throughput_before_ops_s`, `throughput_after_ops_s`, `load_max_over_mean_after`,
//! `detect_ms`, `move_ms`, `bytes_moved`, `max_op_ms`, `failed_ops` with the conditions
//! and every decision; `--svg FILE` plots throughput over time with the decisions marked.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use rampart_client::{Client, ClientOptions, WriteItem};
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::key_hash;
use rampart_common::protocol::coordinator::{
    GetTabletMap, RebalanceAction, RebalanceDecision, TabletMapRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::RpcPool;
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::under_load::{run_mix, runtime, write_json, Load};
use super::ycsb::{key, KeyChooser, RemoveOnDrop};
use crate::cluster::{self, UpArgs};
use crate::plots::LINE_COLOURS;

/// How often the throughput is sampled.
const SAMPLE: Duration = Duration::from_millis(500);

/// `rampart bench rebalance`
#[derive(Args, Debug, Clone)]
pub struct RebalanceBenchArgs {
    /// Storage servers of the private cluster.
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Worker threads of each server's runtime.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Replicas per segment (default: 1).
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Objects loaded, all on one server's tablets.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Closed-loop clients.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// Percent of the operations that read (the rest write).
    #[arg(long, default_value_t = 95)]
    pub read_pct: u32,
    /// Zipfian skew of the keys (0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Seconds of load with the rebalancer paused.
    #[arg(long, default_value_t = 10)]
    pub before_s: u64,
    /// Seconds of load after it resumes.
    #[arg(long, default_value_t = 60)]
    pub run_s: u64,
    /// The last seconds of the run that the throughput after is measured over.
    #[arg(long, default_value_t = 10)]
    pub after_s: u64,
    /// How long a master must stay hot before the rebalancer acts, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub rebalance_after_ms: u64,
    /// Seed of the key and operation choices.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Plot throughput over time, the decisions marked, to this SVG file.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
}

/// What `--json FILE` holds.
#[derive(Debug, Serialize)]
struct Figures {
    servers: u32,
    threads: usize,
    replicas: u32,
    records: u64,
    value_bytes: usize,
    clients: u32,
    read_pct: u32,
    zipf: f64,
    seed: u64,
    throughput_before_ops_s: f64,
    throughput_after_ops_s: f64,
    /// The most loaded master's operations per second over the mean, at the end.
    load_max_over_mean_after: f64,
    /// The hot master's share of the operations before (as the leader saw it).
    load_max_over_mean_before: f64,
    /// From the resume to the first decision (0: none).
    detect_ms: u64,
    /// From the resume to the end of the last decision (0: none).
    move_ms: u64,
    bytes_moved: u64,
    max_op_ms: f64,
    failed_ops: u64,
    /// Throughput over time: (seconds since the load began, operations per second).
    throughput: Vec<(f64, f64)>,
    /// The decisions, with their times in seconds since the load began.
    decisions: Vec<TimedDecision>,
}

#[derive(Debug, Serialize)]
struct TimedDecision {
    at_s: f64,
    done_s: f64,
    action: String,
    why: String,
    outcome: String,
}

/// Runs the benchmark.
pub fn run(args: RebalanceBenchArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if args.servers < 2 || args.clients == 0 || args.records == 0 || args.value_bytes == 0 {
        bail!("--servers at least 2; --clients, --records and --value-bytes at least 1");
    }
    if args.replicas >= args.servers || args.after_s == 0 || args.after_s > args.run_s {
        bail!("--replicas below --servers, and 0 < --after-s <= --run-s");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let data_dir =
        std::env::temp_dir().join(format!("rampart-bench-rebalance-{}", std::process::id()));
    // Declared first, so dropped last: the servers stop before their data goes.
    let _data = RemoveOnDrop(data_dir.clone());
    let up = UpArgs {
        memory: "512MiB".into(),
        replicas: Some(args.replicas),
        rebalance: true,
        rebalance_after_ms: Some(args.rebalance_after_ms),
        server_threads: Some(args.threads),
        ..UpArgs::private(data_dir, args.servers)
    };
    let cluster = cluster::start(&up, false)?;
    let coordinator = cluster.coordinator.clone();
    let task_args = args.clone();
    let figures = runtime()?.block_on(async move {
        tokio::spawn(async move { bench(&task_args, &coordinator, seed).await })
            .await
            .context("benchmark task panicked")?
    })?;
    drop(cluster);
    print_report(&figures);
    write_json(args.json.as_deref(), &figures)?;
    if let Some(path) = &args.svg {
        write_svg(path, &figures)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(f: &Figures) {
    println!(
        "rebalance: {} servers ({} worker thread(s) each), R = {}, {} objects of {} bytes on one server's tablets, {} clients, {} % reads, zipf {}, seed {}",
        f.servers, f.threads, f.replicas, f.records, f.value_bytes, f.clients, f.read_pct, f.zipf, f.seed
    );
    println!(
        "  throughput {:.0} ops/s before, {:.0} ops/s after ({:.2}x)",
        f.throughput_before_ops_s,
        f.throughput_after_ops_s,
        f.throughput_after_ops_s / f.throughput_before_ops_s.max(1.0)
    );
    println!(
        "  load max / mean {:.2} before, {:.2} after",
        f.load_max_over_mean_before, f.load_max_over_mean_after
    );
    println!(
        "  first decision {} ms after the resume, last done after {} ms; {} decisions; {:.1} MB moved",
        f.detect_ms,
        f.move_ms,
        f.decisions.len(),
        f.bytes_moved as f64 / 1e6
    );
    for d in &f.decisions {
        println!("    {:6.1} s  {}: {}", d.at_s, d.action, d.outcome);
    }
    println!(
        "  longest operation {:.1} ms; failed operations {}",
        f.max_op_ms, f.failed_ops
    );
}

async fn bench(args: &RebalanceBenchArgs, coordinator: &str, seed: u64) -> Result<Figures> {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..Default::default()
    };
    let coordinators: Vec<&str> = coordinator.split(',').collect();
    let admin = Client::connect_with(&coordinators, options.clone()).await?;
    admin.rebalance(RebalanceAction::Pause).await?;
    let table = admin.create_table("rebalance", args.servers * 2).await?;
    let hot = hot_tablets(coordinator, table).await?;
    let indexes: Vec<u64> = (0..)
        .filter(|&i| {
            let hash = key_hash(&key(i));
            hot.iter()
                .any(|&(start, end)| start <= hash.0 && hash.0 <= end)
        })
        .take(args.records as usize)
        .collect();
    let indexes = Arc::new(indexes);
    let value = Bytes::from(vec![b'x'; args.value_bytes]);
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(Client::connect_with(&coordinators, options.clone()).await?);
    }
    load(&clients, table, &indexes, &value).await?;
    let chooser = Arc::new(KeyChooser::new(args.records, args.zipf)?);
    let max_op = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mix = Load {
        table,
        chooser: &chooser,
        value: &value,
        read_fraction: f64::from(args.read_pct.min(100)) / 100.0,
        indexes: Some(&indexes),
        done: Some(&done),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let sampler = {
        let (done, stop) = (Arc::clone(&done), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut samples = vec![(0.0, 0u64)];
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(SAMPLE).await;
                samples.push((began.elapsed().as_secs_f64(), done.load(Ordering::Relaxed)));
            }
            samples
        })
    };
    let driver = {
        let (admin, stop) = (admin.clone(), Arc::clone(&stop));
        let (before_s, run_s) = (args.before_s, args.run_s);
        tokio::spawn(async move {
            eprintln!("load with the rebalancer paused: {before_s} s");
            tokio::time::sleep(Duration::from_secs(before_s)).await;
            let before = admin.rebalance(RebalanceAction::Show).await;
            let resumed = Instant::now();
            let resumed_unix_ms = unix_ms();
            admin.rebalance(RebalanceAction::Resume).await?;
            eprintln!("rebalancer resumed: {run_s} s");
            tokio::time::sleep(Duration::from_secs(run_s)).await;
            let after = admin.rebalance(RebalanceAction::Show).await;
            stop.store(true, Ordering::SeqCst);
            Ok::<_, anyhow::Error>((before?, after?, resumed, resumed_unix_ms))
        })
    };
    let phase = run_mix(&clients, &mix, &stop, &max_op, seed).await?;
    let (before, after, resumed, resumed_unix_ms) = driver.await??;
    let samples = sampler.await?;
    let began_unix_ms =
        resumed_unix_ms.saturating_sub(resumed.duration_since(began).as_millis() as u64);
    let rate = |from: f64, to: f64| {
        let at = |t: f64| {
            samples
                .iter()
                .min_by(|a, b| (a.0 - t).abs().total_cmp(&(b.0 - t).abs()))
                .copied()
                .unwrap_or((t, 0))
        };
        let (a, b) = (at(from), at(to));
        (b.1 - a.1) as f64 / (b.0 - a.0).max(0.001)
    };
    let resume_s = resumed.duration_since(began).as_secs_f64();
    let end_s = samples.last().map_or(0.0, |s| s.0);
    // The first second of the run is the clients' warm-up.
    let throughput_before_ops_s = rate(1.0_f64.min(resume_s), resume_s);
    let throughput_after_ops_s = rate(end_s - args.after_s as f64, end_s);
    let decisions: Vec<&RebalanceDecision> = after
        .decisions
        .iter()
        .filter(|d| d.at_unix_ms >= resumed_unix_ms)
        .collect();
    let since_resume = |ms: u64| ms.saturating_sub(resumed_unix_ms);
    let detect_ms = decisions.first().map_or(0, |d| since_resume(d.at_unix_ms));
    let move_ms = decisions
        .iter()
        .map(|d| since_resume(d.done_unix_ms))
        .max()
        .unwrap_or(0);
    let seconds = |ms: u64| ms.saturating_sub(began_unix_ms) as f64 / 1000.0;
    let max_over_mean = |reply: &rampart_common::protocol::coordinator::RebalanceReply| {
        let loads: Vec<f64> = reply.servers.iter().map(|s| s.ops_per_s as f64).collect();
        let mean = loads.iter().sum::<f64>() / loads.len().max(1) as f64;
        loads.iter().copied().fold(0.0, f64::max) / mean.max(1.0)
    };
    let throughput = samples
        .windows(2)
        .map(|w| {
            (
                w[1].0,
                (w[1].1 - w[0].1) as f64 / (w[1].0 - w[0].0).max(0.001),
            )
        })
        .collect();
    Ok(Figures {
        servers: args.servers,
        threads: args.threads,
        replicas: args.replicas,
        records: args.records,
        value_bytes: args.value_bytes,
        clients: args.clients,
        read_pct: args.read_pct,
        zipf: args.zipf,
        seed,
        throughput_before_ops_s,
        throughput_after_ops_s,
        load_max_over_mean_after: max_over_mean(&after),
        load_max_over_mean_before: max_over_mean(&before),
        detect_ms,
        move_ms,
        bytes_moved: decisions.iter().map(|d| d.bytes_moved).sum(),
        max_op_ms: max_op.load(Ordering::SeqCst) as f64 / 1e6,
        failed_ops: phase.failed,
        throughput,
        decisions: decisions
            .iter()
            .map(|d| TimedDecision {
                at_s: seconds(d.at_unix_ms),
                done_s: seconds(d.done_unix_ms),
                action: d.action.clone(),
                why: d.why.clone(),
                outcome: d.outcome.clone(),
            })
            .collect(),
    })
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The hash ranges of the tablets of `table`'s first owner.
async fn hot_tablets(coordinator: &str, table: rampart_client::TableId) -> Result<Vec<(u64, u64)>> {
    let set = CoordinatorSet::new(&coordinator.split(',').collect::<Vec<_>>());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let map = set
        .call::<GetTabletMap>(&RpcPool::new(), &TabletMapRequest {}, deadline)
        .await
        .map_err(|e| anyhow::anyhow!("no tablet map: {e}"))?;
    let tablets = map
        .tables
        .into_iter()
        .find(|t| t.id == table)
        .map(|t| t.tablets)
        .context("the table has no tablets")?;
    let owner = tablets.first().map(|t| t.owner).context("no tablet")?;
    Ok(tablets
        .iter()
        .filter(|t| t.owner == owner)
        .map(|t| (t.start_hash, t.end_hash))
        .collect())
}

/// Writes the objects of `indexes`, split among `clients`.
async fn load(
    clients: &[Client],
    table: rampart_client::TableId,
    indexes: &[u64],
    value: &Bytes,
) -> Result<()> {
    let count = clients.len();
    let loads = clients.iter().enumerate().map(|(c, client)| {
        let share: Vec<u64> = indexes.iter().copied().skip(c).step_by(count).collect();
        async move {
            for chunk in share.chunks(256) {
                let items: Vec<WriteItem> = chunk
                    .iter()
                    .map(|&i| WriteItem {
                        table,
                        key: Bytes::from(key(i)),
                        value: value.clone(),
                        rules: RejectRules::default(),
                    })
                    .collect();
                for result in client.multi_write(&items).await? {
                    result?;
                }
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    for result in futures::future::join_all(loads).await {
        result?;
    }
    Ok(())
}

/// Throughput over time, a vertical line at each decision.
fn write_svg(path: &Path, f: &Figures) -> Result<()> {
    use plotters::prelude::{ChartBuilder, Color, IntoDrawingArea, LineSeries, SVGBackend, WHITE};
    let t_max = f.throughput.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let y_max = f.throughput.iter().map(|p| p.1).fold(1.0f64, f64::max);
    let draw = || -> Result<()> {
        let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "bench rebalance: throughput over time (lines: decisions)",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_max, 0.0..y_max * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the load began")
            .y_desc("operations/s")
            .x_label_formatter(&|t| format!("{t:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        chart.draw_series(LineSeries::new(
            f.throughput.iter().copied(),
            LINE_COLOURS[0].stroke_width(2),
        ))?;
        for d in &f.decisions {
            let colour = if d.action.starts_with("split") {
                LINE_COLOURS[2]
            } else {
                LINE_COLOURS[3]
            };
            chart.draw_series(LineSeries::new(
                [(d.at_s, 0.0), (d.at_s, y_max * 1.1)],
                colour.stroke_width(1),
            ))?;
        }
        root.present()?;
        Ok(())
    };
    draw().with_context(|| format!("cannot write {}", path.display()))
}
