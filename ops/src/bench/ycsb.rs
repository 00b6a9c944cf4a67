//! `rampart bench ycsb`: the YCSB core workloads against a cluster.
//!
//! Loads `--records` objects, then runs `--ops` operations from `--clients` closed-loop
//! clients (each with its own connections), keys drawn from a scrambled Zipfian
//! distribution (YCSB's default; `--zipf 0` for uniform). Prints throughput and
//! p50/p99/p999 per operation type, and beside it the floor: a raw tokio TCP ping-pong
//! with the read RPC's message sizes. The run is split into rounds that alternate with
//! slices of the floor measurement, so that on a noisy shared machine both see the same
//! conditions and their ratio is fair.
//!
//! Loading and the run show their progress on stderr (`progress`). `--json FILE` writes
//! the figures; `--svg FILE` plots latency against percentile per operation type from
//! the same histograms, beside the floor (both axes logarithmic, latency in µs).
//!
//! | workload   | mix                                   |
//! |------------|---------------------------------------|
//! | a          | 50% read, 50% update                  |
//! | b          | 95% read, 5% update                   |
//! | c          | 100% read                             |
//! | f          | 50% read, 50% read-modify-write       |
//! | write-only | 100% update                           |

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rampart_client::{Client, ClientOptions, RejectRules, WriteItem};
use rampart_common::rpc::FRAME_HEADER_BYTES;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::child_processes::Children;
use crate::cluster::{self, UpArgs};
use crate::progress::Progress;

/// The YCSB workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Workload {
    /// 50% read, 50% update.
    A,
    /// 95% read, 5% update.
    B,
    /// 100% read.
    C,
    /// 50% read, 50% read-modify-write.
    F,
    /// 100% update.
    WriteOnly,
}

impl Workload {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::A => "a",
            Workload::B => "b",
            Workload::C => "c",
            Workload::F => "f",
            Workload::WriteOnly => "write-only",
        }
    }

    /// Fraction of reads; the rest are updates (or read-modify-writes for F).
    pub(crate) fn read_fraction(self) -> f64 {
        match self {
            Workload::A | Workload::F => 0.5,
            Workload::B => 0.95,
            Workload::C => 1.0,
            Workload::WriteOnly => 0.0,
        }
    }
}

/// `rampart bench ycsb`
#[derive(Args, Debug, Clone)]
pub struct YcsbArgs {
    /// Workload.
    #[arg(long, value_enum, default_value = "a")]
    pub workload: Workload,
    /// Objects loaded before the run.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Operations in the run (all clients together).
    #[arg(long, default_value_t = 200_000)]
    pub ops: u64,
    /// Closed-loop clients, each with its own connections.
    #[arg(long, default_value_t = 1)]
    pub clients: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Zipfian skew (YCSB's default 0.99; 0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Coordinator of a running cluster (ignored with --local).
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// Start a local cluster for the run (and stop it after).
    #[arg(long)]
    pub local: bool,
    /// Servers of the --local cluster.
    #[arg(long, default_value_t = 1)]
    pub servers: u32,
    /// Replicas per segment in the --local cluster (default: 3, at most servers − 1).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Replication transport of the --local cluster (shm, tcp, rpc).
    #[arg(long)]
    pub replication: Option<String>,
    /// Tablets of the benchmark table.
    #[arg(long, default_value_t = 1)]
    pub span: u32,
    /// Threads of the benchmark client's runtime (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Round trips measured for the floor.
    #[arg(long, default_value_t = 20_000)]
    pub floor_samples: u32,
    /// Seed of the key and operation choices (printed; reuse to replay a run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Plot latency against percentile per operation type, beside the floor, as SVG to
    /// this file.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
}

/// Rounds the run is split into, alternating with slices of the floor measurement.
const BENCH_ROUNDS: u32 = 10;

/// Objects per multi-write while loading.
const LOAD_BATCH_OBJECTS: usize = 256;

/// Latencies of one operation type, in nanoseconds.
type Latencies = BTreeMap<&'static str, Histogram<u64>>;

/// A latency histogram in nanoseconds, 1 ns to 60 s, three significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static histogram bounds are valid")
}

/// The key of record `i` (YCSB's `user` + a zero-padded number).
pub(crate) fn key(i: u64) -> Vec<u8> {
    format!("user{i:012}").into_bytes()
}

/// YCSB's scrambled Zipfian: a Zipf rank, hashed so hot keys spread over the key space.
pub(crate) struct KeyChooser {
    records: u64,
    zipf: Option<Zipf<f64>>,
}

impl KeyChooser {
    pub(crate) fn new(records: u64, theta: f64) -> Result<KeyChooser> {
        let zipf = if theta > 0.0 {
            Some(Zipf::new(records, theta).context("invalid --zipf")?)
        } else {
            None
        };
        Ok(KeyChooser { records, zipf })
    }

    pub(crate) fn next(&self, rng: &mut SmallRng) -> u64 {
        match &self.zipf {
            Some(zipf) => {
                let rank = zipf.sample(rng) as u64;
                fnv64(rank) % self.records
            }
            None => rng.gen_range(0..self.records),
        }
    }
}

fn fnv64(mut value: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for _ in 0..8 {
        hash ^= value & 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        value >>= 8;
    }
    hash
}

/// Removes a tree of data directories, and their servers' frame files, when dropped
/// ([`remove_scratch_data`](crate::process::remove_scratch_data)).
pub(crate) struct RemoveOnDrop(pub(crate) std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        crate::process::remove_scratch_data(&self.0);
    }
}

/// Runs the benchmark.
pub fn run(args: YcsbArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if args.records == 0 || args.clients == 0 {
        bail!("--records and --clients must be at least 1");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut children = Children::new();
    // Declared before the cluster, so dropped after it (locals drop in reverse): the
    // servers stop before their data directory goes.
    let mut _data: Option<RemoveOnDrop> = None;
    let mut _cluster = None;
    let coordinator = if args.local {
        let data_dir = std::env::temp_dir().join(format!("rampart-bench-{}", std::process::id()));
        _data = Some(RemoveOnDrop(data_dir.clone()));
        let up = UpArgs {
            memory: "2GiB".into(),
            replicas: args.replicas,
            replication: args.replication.clone(),
            // The data path is measured; one coordinator (the default here) leaves the
            // cores to it.
            ..UpArgs::private(data_dir, args.servers)
        };
        let started = cluster::start(&up, false)?;
        let addr = started.coordinator.clone();
        _cluster = Some(started);
        addr
    } else {
        args.coordinator.clone()
    };
    let echo = children
        .spawn("echo server", &["bench".into(), "echo".into()], &[], None)?
        .addr
        .clone();

    let runtime = if args.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.client_threads)
            .enable_all()
            .build()?
    };
    // The benchmark runs in a spawned task, as applications call the client: a reply
    // then wakes the caller task to task, not through the runtime's unpark path that
    // wakes a `block_on` future (which costs an extra epoll_wait per call). The floor
    // runs in the same task, so the comparison stays like for like.
    let task_args = args.clone();
    let report = runtime.block_on(async move {
        tokio::spawn(async move { bench(&task_args, &coordinator, &echo, seed).await })
            .await
            .context("benchmark task panicked")?
    })?;
    print_report(&args, seed, &report);
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&report.figures(&args, seed))?,
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        write_svg(path, &args, &report)?;
        println!("latency plot: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

struct Report {
    /// Reads through a bare `Connection`, no client library.
    raw_rpc: Histogram<u64>,
    load_s: f64,
    run_s: f64,
    ops: Latencies,
    floor: Histogram<u64>,
    floor_request_bytes: u32,
    floor_reply_bytes: u32,
}

impl Report {
    fn total_ops(&self) -> u64 {
        self.ops.values().map(Histogram::len).sum()
    }

    fn throughput(&self) -> f64 {
        self.total_ops() as f64 / self.run_s
    }

    fn figures(&self, args: &YcsbArgs, seed: u64) -> YcsbFigures {
        let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        YcsbFigures {
            workload: args.workload.name().to_string(),
            clients: args.clients,
            records: args.records,
            value_bytes: args.value_bytes,
            zipf: args.zipf,
            seed,
            throughput_ops_s: self.throughput(),
            run_s: self.run_s,
            load_s: self.load_s,
            ops: self
                .ops
                .iter()
                .map(|(name, h)| {
                    let figures = OpFigures {
                        count: h.len(),
                        p50_us: us(h, 0.5),
                        p99_us: us(h, 0.99),
                        p999_us: us(h, 0.999),
                        mean_us: h.mean() / 1000.0,
                    };
                    (name.to_string(), figures)
                })
                .collect(),
            raw_rpc_read_p50_us: us(&self.raw_rpc, 0.5),
            raw_rpc_read_p99_us: us(&self.raw_rpc, 0.99),
            floor_rtt_p50_us: us(&self.floor, 0.5),
            floor_rtt_p99_us: us(&self.floor, 0.99),
            floor_request_bytes: self.floor_request_bytes,
            floor_reply_bytes: self.floor_reply_bytes,
            read_p50_over_floor: self
                .ops
                .get("read")
                .map(|h| us(h, 0.5) / us(&self.floor, 0.5)),
        }
    }
}

/// What `--json FILE` holds: the conditions, the throughput, and latencies in µs per
/// operation type (by name) and of the floor.
#[derive(Debug, Serialize, Deserialize)]
struct YcsbFigures {
    workload: String,
    clients: u32,
    records: u64,
    value_bytes: usize,
    zipf: f64,
    seed: u64,
    throughput_ops_s: f64,
    run_s: f64,
    load_s: f64,
    ops: BTreeMap<String, OpFigures>,
    /// Reads through a bare `Connection`, no client library.
    raw_rpc_read_p50_us: f64,
    raw_rpc_read_p99_us: f64,
    floor_rtt_p50_us: f64,
    floor_rtt_p99_us: f64,
    floor_request_bytes: u32,
    floor_reply_bytes: u32,
    /// None (null) when the workload has no reads.
    read_p50_over_floor: Option<f64>,
}

/// One operation type's count and latencies, µs.
#[derive(Debug, Serialize, Deserialize)]
struct OpFigures {
    count: u64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    mean_us: f64,
}

async fn bench(args: &YcsbArgs, coordinator: &str, echo: &str, seed: u64) -> Result<Report> {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..Default::default()
    };
    let coordinators: Vec<&str> = coordinator.split(',').collect();
    let admin = Client::connect_with(&coordinators, options.clone()).await?;
    let table = admin.create_table("ycsb", args.span).await?;
    let value = Bytes::from(vec![b'x'; args.value_bytes]);

    // Load: each client writes its share in multi-write batches.
    let load_start = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(Client::connect_with(&coordinators, options.clone()).await?);
    }
    load(&clients, table, args.records, &value).await?;
    let load_s = load_start.elapsed().as_secs_f64();

    // Run, in rounds alternating with slices of the floor, so that both see the same
    // noise on a shared machine and their ratio is measured side by side.
    let chooser = std::sync::Arc::new(KeyChooser::new(args.records, args.zipf)?);
    let per_client = args.ops / u64::from(args.clients);
    let key_len = key(0).len() as u32;
    // The floor carries the read RPC's bytes on the wire, request and reply.
    let request_wire = FRAME_HEADER_BYTES as u32 + 12 + key_len;
    let reply_wire = FRAME_HEADER_BYTES as u32 + 10 + args.value_bytes as u32;
    let mut floor = histogram();
    let mut raw_rpc = histogram();
    let mut raw_rng = SmallRng::seed_from_u64(seed.rotate_left(17));
    let mut ops: Latencies = BTreeMap::new();
    let mut run_s = 0.0;
    let mut rngs: Vec<SmallRng> = (0..args.clients)
        .map(|c| SmallRng::seed_from_u64(seed ^ u64::from(c).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .collect();
    let running = Progress::new("running", per_client * u64::from(args.clients), "ops");
    let running = &running;
    for round in 0..BENCH_ROUNDS {
        let warmup = if round == 0 { 1000 } else { 0 };
        // The echo protocol's 8-byte size prefix counts toward the request's bytes.
        let slice = super::echo::ping_pong(
            echo,
            request_wire - 8,
            reply_wire,
            warmup,
            args.floor_samples / BENCH_ROUNDS,
        )
        .await?;
        floor.add(&slice)?;
        // The same reads through the bare RPC connection, without the client library,
        // to split the distance to the floor between the RPC layer and the library.
        raw_rpc.add(
            &raw_reads(
                &admin,
                table,
                &chooser,
                &mut raw_rng,
                args.floor_samples / BENCH_ROUNDS,
            )
            .await?,
        )?;

        let count = per_client / u64::from(BENCH_ROUNDS)
            + u64::from(round < (per_client % u64::from(BENCH_ROUNDS)) as u32);
        let start = Instant::now();
        let runs = clients.iter().zip(rngs.iter_mut()).map(|(client, rng)| {
            let chooser = std::sync::Arc::clone(&chooser);
            let value = value.clone();
            let workload = args.workload;
            async move {
                let mut latencies: Latencies = BTreeMap::new();
                for _ in 0..count {
                    let k = key(chooser.next(rng));
                    let start = Instant::now();
                    let name = if rng.gen_bool(workload.read_fraction()) {
                        client.read(table, &k).await?;
                        "read"
                    } else if workload == Workload::F {
                        client.read(table, &k).await?;
                        client.write(table, &k, &value).await?;
                        "read-modify-write"
                    } else {
                        client.write(table, &k, &value).await?;
                        "update"
                    };
                    let nanos = start.elapsed().as_nanos() as u64;
                    latencies
                        .entry(name)
                        .or_insert_with(histogram)
                        .record(nanos.max(1))?;
                    running.inc(1);
                }
                Ok::<Latencies, anyhow::Error>(latencies)
            }
        });
        for result in futures::future::join_all(runs).await {
            for (name, h) in result? {
                ops.entry(name).or_insert_with(histogram).add(&h)?;
            }
        }
        run_s += start.elapsed().as_secs_f64();
    }
    running.finish();
    Ok(Report {
        raw_rpc,
        load_s,
        run_s,
        ops,
        floor,
        floor_request_bytes: request_wire,
        floor_reply_bytes: reply_wire,
    })
}

/// Loads records `0..records` into `table`: client `c` of `clients` writes the records
/// `i` with `i % clients.len() == c`, in multi-write batches. Shows its progress.
pub(crate) async fn load(
    clients: &[Client],
    table: rampart_client::TableId,
    records: u64,
    value: &Bytes,
) -> Result<()> {
    let progress = Progress::new("loading", records, "records");
    let progress = &progress;
    let count = clients.len() as u64;
    let loads = clients.iter().enumerate().map(|(c, client)| {
        let value = value.clone();
        let share: Vec<u64> = (0..records).filter(|i| i % count == c as u64).collect();
        async move {
            for chunk in share.chunks(LOAD_BATCH_OBJECTS) {
                let items: Vec<WriteItem> = chunk
                    .iter()
                    .map(|i| WriteItem {
                        table,
                        key: Bytes::from(key(*i)),
                        value: value.clone(),
                        rules: RejectRules::default(),
                    })
                    .collect();
                for result in client.multi_write(&items).await? {
                    result?;
                }
                progress.inc(chunk.len() as u64);
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    for result in futures::future::join_all(loads).await {
        result?;
    }
    progress.finish();
    Ok(())
}

/// `samples` sequential reads of chosen keys over one bare RPC connection to each key's
/// owner; latencies in nanoseconds.
async fn raw_reads(
    client: &Client,
    table: rampart_client::TableId,
    chooser: &KeyChooser,
    rng: &mut SmallRng,
    samples: u32,
) -> Result<Histogram<u64>> {
    use rampart_common::protocol::master::{Read, ReadRequest};
    use rampart_common::rpc::Connection;
    let mut connections: BTreeMap<String, Connection> = BTreeMap::new();
    let mut latencies = histogram();
    for _ in 0..samples {
        let k = key(chooser.next(rng));
        let addr = client
            .locate(table, &k)
            .context("no owner for a benchmark key")?;
        if !connections.contains_key(&addr) {
            connections.insert(addr.clone(), Connection::connect(&addr).await?);
        }
        let connection = &connections[&addr];
        let request = ReadRequest {
            table,
            key: Bytes::from(k),
        };
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        connection.call::<Read>(&request, deadline).await?;
        latencies.record((start.elapsed().as_nanos() as u64).max(1))?;
    }
    Ok(latencies)
}

fn print_report(args: &YcsbArgs, seed: u64, report: &Report) {
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "ycsb workload {}: {} records, {} ops, {} client(s), {}-byte values, zipf {}, seed {seed}",
        args.workload.name(),
        args.records,
        report.total_ops(),
        args.clients,
        args.value_bytes,
        args.zipf
    );
    println!("load: {:.2} s; run: {:.2} s", report.load_s, report.run_s);
    println!("throughput: {:.0} ops/s", report.throughput());
    println!(
        "{:<18} {:>9} {:>9} {:>9} {:>9}",
        "op", "count", "p50_us", "p99_us", "p999_us"
    );
    for (name, h) in &report.ops {
        println!(
            "{:<18} {:>9} {:>9.1} {:>9.1} {:>9.1}",
            name,
            h.len(),
            us(h, 0.5),
            us(h, 0.99),
            us(h, 0.999)
        );
    }
    println!(
        "{:<18} {:>9} {:>9.1} {:>9.1} {:>9.1}   (one Connection, no client library)",
        "read (bare rpc)",
        report.raw_rpc.len(),
        us(&report.raw_rpc, 0.5),
        us(&report.raw_rpc, 0.99),
        us(&report.raw_rpc, 0.999),
    );
    println!(
        "{:<18} {:>9} {:>9.1} {:>9.1} {:>9.1}   (raw tokio TCP ping-pong, {} B -> {} B)",
        "floor",
        report.floor.len(),
        us(&report.floor, 0.5),
        us(&report.floor, 0.99),
        us(&report.floor, 0.999),
        report.floor_request_bytes,
        report.floor_reply_bytes
    );
    if let Some(read) = report.ops.get("read") {
        println!(
            "read p50 / floor p50 = {:.2}",
            us(read, 0.5) / us(&report.floor, 0.5)
        );
    }
}

/// Largest x of the latency plot: the 99.999th percentile (1 / (1 − q) = 10⁵); past it
/// even the default run (about 10⁵ operations of each type) has no sample left to draw.
const PLOT_X_MAX: f64 = 1e5;

/// Points per halving of the distance to 100 % in the latency plot.
const PLOT_TICKS_PER_HALF_DISTANCE: u32 = 5;

/// A histogram's percentile distribution as (1 / (1 − q), latency µs) points, as
/// HdrHistogram plots it: equal distances on a log axis for 90 %, 99 %, 99.9 %, ... The
/// last quantile (q = 1, the maximum) has no finite x and is left out.
fn percentile_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    h.iter_quantiles(PLOT_TICKS_PER_HALF_DISTANCE)
        .filter(|v| v.quantile_iterated_to() < 1.0)
        .map(|v| {
            let x = 1.0 / (1.0 - v.quantile_iterated_to());
            (x, v.value_iterated_to() as f64 / 1000.0)
        })
        .filter(|(x, _)| *x < PLOT_X_MAX)
        .collect()
}

/// The percentile an x of the latency plot stands for: 1 → `0%`, 10 → `90%`, 1000 →
/// `99.9%`.
fn percentile_label(x: f64) -> String {
    let percent = 100.0 * (1.0 - 1.0 / x.max(1.0));
    let text = format!("{percent:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

/// Writes the latency plot (module doc) to `path`.
fn write_svg(path: &std::path::Path, args: &YcsbArgs, report: &Report) -> Result<()> {
    use plotters::prelude::{
        ChartBuilder, Color, DashedLineSeries, IntoDrawingArea, IntoLogRange, LineSeries,
        PathElement, RGBColor, SVGBackend, SeriesLabelPosition, BLACK, WHITE,
    };
    /// Colours of the operation types, in the order of the report.
    const COLOURS: [RGBColor; 4] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x94, 0x67, 0xbd),
    ];
    const GREY: RGBColor = RGBColor(0x70, 0x70, 0x70);
    /// One line of the plot.
    struct Line {
        name: String,
        points: Vec<(f64, f64)>,
        colour: RGBColor,
        dashed: bool,
    }
    let mut series: Vec<Line> = report
        .ops
        .iter()
        .zip(COLOURS.iter().cycle())
        .map(|((name, h), colour)| Line {
            name: name.to_string(),
            points: percentile_points(h),
            colour: *colour,
            dashed: false,
        })
        .collect();
    series.push(Line {
        name: format!(
            "floor (TCP ping-pong, {} B -> {} B)",
            report.floor_request_bytes, report.floor_reply_bytes
        ),
        points: percentile_points(&report.floor),
        colour: GREY,
        dashed: true,
    });
    let points = || series.iter().flat_map(|line| line.points.iter());
    let x_end = points().map(|p| p.0).fold(100.0_f64, f64::max);
    let x_max = 10f64.powf(x_end.log10().ceil()).min(PLOT_X_MAX);
    let y_min = points().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_max = points().map(|p| p.1).fold(0.0_f64, f64::max);
    if !y_min.is_finite() || y_max <= 0.0 {
        bail!("no latencies to plot");
    }
    let (y_min, y_max) = (
        10f64.powf(y_min.max(0.001).log10().floor()),
        10f64.powf(y_max.log10().ceil()),
    );
    let draw = || -> Result<()> {
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = format!(
            "bench ycsb, workload {}: {} records, {} ops, {} client(s), {}-byte values, zipf {}, {:.0} ops/s",
            args.workload.name(),
            args.records,
            report.total_ops(),
            args.clients,
            args.value_bytes,
            args.zipf,
            report.throughput()
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 16))
            .margin(16)
            // Room for the last percentile label, centred on the right edge.
            .margin_right(40)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d((1.0..x_max).log_scale(), (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency (µs)")
            .x_label_formatter(&|x| percentile_label(*x))
            .y_label_formatter(&|y| format!("{y}"))
            .draw()?;
        for line in &series {
            let colour = line.colour;
            let style = colour.stroke_width(2);
            let points = line.points.iter().copied();
            let drawn = if line.dashed {
                chart.draw_series(DashedLineSeries::new(points, 6, 4, style))?
            } else {
                chart.draw_series(LineSeries::new(points, style))?
            };
            drawn
                .label(line.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_label_names_the_nines() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(2.0), "50%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(1e4), "99.99%");
    }

    #[test]
    fn percentile_points_rise_with_the_percentile_and_stay_finite() {
        let mut h = histogram();
        for nanos in 1..=10_000u64 {
            h.record(nanos * 1000)
                .expect("within the histogram's bounds");
        }
        let points = percentile_points(&h);
        assert!(points.len() > 10, "{points:?}");
        assert!(points
            .iter()
            .all(|(x, y)| x.is_finite() && *x >= 1.0 && *y > 0.0));
        assert!(points
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        // The median of 1..=10 000 µs, within the histogram's three significant digits.
        let median = points
            .iter()
            .find(|(x, _)| *x >= 2.0)
            .expect("a point at or past 50 %");
        assert!((median.1 - 5000.0).abs() < 100.0, "{median:?}");
    }
}
