//! `rampart bench drain`: a server holding one tablet drained under a write load
//! (issue 42).
//!
//! A private cluster (`--servers`, R = `--replicas`) holds a table of one tablet,
//! loaded with `--mb` of `--value-bytes` objects on one server. `--clients` closed-loop
//! clients write half the time and read the other half (YCSB-A, scrambled Zipfian
//! keys) for `--before-s` seconds; then, with the same load running, that server is
//! drained (`Client::drain_server`: its tablet moves away, every master leaves its
//! backup, it is removed), and the load stops once it is removed. Prints how long the
//! drain took, the bytes its moves copied, the clients' p50 and p99.9 before and during,
//! the longest single operation, and the operations that failed (must be 0).
//!
//! `--json FILE` writes `drain_ms`, `bytes_moved`, `max_op_ms` and `failed_ops`, with
//! the latencies and the conditions. Compare `drain_ms` with `move_ms` of
//! `rampart bench migrate` at the same `--mb`.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use rampart_client::{Client, ClientOptions};
use rampart_common::protocol::coordinator::DrainState;
use serde::Serialize;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::migrate::{run_mix, Load, Phase};
use super::ycsb::{load, KeyChooser, RemoveOnDrop};
use crate::cluster::{self, UpArgs};

/// How often the bench asks how the drain stands.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// `rampart bench drain`
#[derive(Args, Debug, Clone)]
pub struct DrainBenchArgs {
    /// Megabytes of objects on the drained server.
    #[arg(long, default_value_t = 1024)]
    pub mb: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Closed-loop YCSB-A clients.
    #[arg(long, default_value_t = 4)]
    pub clients: u32,
    /// Seconds of load measured before the drain.
    #[arg(long, default_value_t = 5)]
    pub before_s: u64,
    /// Zipfian skew of the keys (0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Storage servers of the private cluster (the drain leaves one fewer).
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Replicas per segment (default: 2, at most servers − 2).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Seed of the key and operation choices.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// What `--json FILE` holds.
#[derive(Debug, Serialize)]
struct DrainFigures {
    mb: u64,
    value_bytes: usize,
    clients: u32,
    servers: u32,
    replicas: u32,
    zipf: f64,
    seed: u64,
    /// From the drain's start until the server was removed.
    drain_ms: u64,
    /// Bytes the drain's moves copied.
    bytes_moved: u64,
    p50_us_before: f64,
    p50_us_during: f64,
    p999_us_before: f64,
    p999_us_during: f64,
    ops_before: u64,
    ops_during: u64,
    max_op_ms: f64,
    failed_ops: u64,
}

/// Runs the benchmark.
pub fn run(args: DrainBenchArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if args.mb == 0 || args.clients == 0 || args.servers < 3 || args.value_bytes == 0 {
        bail!("--mb, --clients and --value-bytes must be at least 1, --servers at least 3");
    }
    // A drain leaves servers − 1: each master then needs R others.
    let replicas = args.replicas.unwrap_or(2).min(args.servers - 2);
    let seed = args.seed.unwrap_or_else(rand::random);
    let data_dir = std::env::temp_dir().join(format!("rampart-bench-drain-{}", std::process::id()));
    // Declared before the cluster, so dropped after it: the servers stop first.
    let _data = RemoveOnDrop(data_dir.clone());
    // The drained server's tablet lands whole on one other server, with room to clean.
    let memory_mb = (args.mb * 5 / 2).max(512);
    let up = UpArgs {
        memory: format!("{memory_mb}MiB"),
        replicas: Some(replicas),
        unflushed_max: format!("{}MiB", (args.mb * 2).max(256)),
        ..UpArgs::private(data_dir, args.servers)
    };
    let cluster = cluster::start(&up, false)?;
    let coordinator = cluster.coordinator.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let task_args = args.clone();
    let (before, during, drain_ms, bytes_moved, max_op) = runtime.block_on(async move {
        tokio::spawn(async move { bench(&task_args, &coordinator, seed).await })
            .await
            .context("benchmark task panicked")?
    })?;
    drop(cluster);
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let figures = DrainFigures {
        mb: args.mb,
        value_bytes: args.value_bytes,
        clients: args.clients,
        servers: args.servers,
        replicas,
        zipf: args.zipf,
        seed,
        drain_ms,
        bytes_moved,
        p50_us_before: us(&before.latencies, 0.5),
        p50_us_during: us(&during.latencies, 0.5),
        p999_us_before: us(&before.latencies, 0.999),
        p999_us_during: us(&during.latencies, 0.999),
        ops_before: before.latencies.len(),
        ops_during: during.latencies.len(),
        max_op_ms: max_op as f64 / 1e6,
        failed_ops: before.failed + during.failed,
    };
    print_report(&figures);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(f: &DrainFigures) {
    println!(
        "drain: {} MB of {}-byte objects on the drained server, R = {}, {} servers, {} YCSB-A clients (zipf {}), seed {}",
        f.mb, f.value_bytes, f.replicas, f.servers, f.clients, f.zipf, f.seed
    );
    println!(
        "  drained in {} ms (its tablet moved, the masters off its backup, removed); {:.1} MB moved",
        f.drain_ms,
        f.bytes_moved as f64 / 1e6
    );
    println!(
        "  p50 {:.0} µs before, {:.0} µs during ({:.2}x); p99.9 {:.0} µs before, {:.0} µs during ({:.2}x); {} ops before, {} during",
        f.p50_us_before,
        f.p50_us_during,
        f.p50_us_during / f.p50_us_before,
        f.p999_us_before,
        f.p999_us_during,
        f.p999_us_during / f.p999_us_before,
        f.ops_before,
        f.ops_during
    );
    println!(
        "  longest operation {:.1} ms; failed operations {}",
        f.max_op_ms, f.failed_ops
    );
}

type Outcome = (Phase, Phase, u64, u64, u64);

async fn bench(args: &DrainBenchArgs, coordinator: &str, seed: u64) -> Result<Outcome> {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..Default::default()
    };
    let coordinators: Vec<&str> = coordinator.split(',').collect();
    let admin = Client::connect_with(&coordinators, options.clone()).await?;
    let table = admin.create_table("drain", 1).await?;
    let records = (args.mb << 20) / args.value_bytes as u64;
    let value = Bytes::from(vec![b'x'; args.value_bytes]);
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(Client::connect_with(&coordinators, options.clone()).await?);
    }
    load(&clients, table, records, &value).await?;
    let (drained, _) = super::migrate::ends(coordinator, table).await?;
    let chooser = Arc::new(KeyChooser::new(records, args.zipf)?);
    let max_op = Arc::new(AtomicU64::new(0));
    let mix = Load {
        table,
        chooser: &chooser,
        value: &value,
        read_fraction: 0.5,
    };

    eprintln!("load before the drain: {} s", args.before_s);
    let stop = Arc::new(AtomicBool::new(false));
    let before = {
        let timer = Arc::clone(&stop);
        let before_s = args.before_s;
        let sleeper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(before_s)).await;
            timer.store(true, Ordering::SeqCst);
        });
        let phase = run_mix(&clients, &mix, &stop, &max_op, seed).await?;
        sleeper.await?;
        phase
    };
    eprintln!("draining {drained} under the load");
    stop.store(false, Ordering::SeqCst);
    let started = Instant::now();
    let drainer = {
        let (admin, stop) = (admin.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let result = drain(&admin, drained).await;
            stop.store(true, Ordering::SeqCst);
            result.map(|bytes| (bytes, started.elapsed().as_millis() as u64))
        })
    };
    let during = run_mix(&clients, &mix, &stop, &max_op, seed ^ 1).await?;
    let (bytes_moved, drain_ms) = drainer.await?.context("the drain failed")?;
    Ok((
        before,
        during,
        drain_ms,
        bytes_moved,
        max_op.load(Ordering::SeqCst),
    ))
}

/// Drains `server` and waits until it is removed; the bytes its moves copied.
async fn drain(admin: &Client, server: rampart_common::ids::ServerId) -> Result<u64> {
    let mut reply = admin.drain_server(server).await?;
    let mut bytes = reply.bytes_moved;
    loop {
        match reply.state {
            DrainState::Removed => return Ok(bytes),
            DrainState::NotDraining => bail!("{server} stopped being drained: {}", reply.detail),
            DrainState::Draining => {}
        }
        tokio::time::sleep(POLL_INTERVAL).await;
        reply = admin.drain_status(server).await?;
        // Once removed the leader no longer reports the drain's bytes.
        bytes = bytes.max(reply.bytes_moved);
    }
}
