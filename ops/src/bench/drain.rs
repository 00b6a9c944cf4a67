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
use rampart_client::{Client, ClientOptions};
use rampart_common::protocol::coordinator::DrainState;
use serde::Serialize;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::under_load::{
    measure_for, private_cluster, run_mix, runtime, write_json, Latency, Load, Phase,
};
use super::ycsb::{load, KeyChooser};

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
    #[serde(flatten)]
    latency: Latency,
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
    // Declared first, so dropped last: the servers stop before their data goes. The
    // drained server's tablet lands whole on one other server.
    let (_data, cluster) = private_cluster("drain", args.mb, args.servers, replicas)?;
    let coordinator = cluster.coordinator.clone();
    let runtime = runtime()?;
    let task_args = args.clone();
    let (before, during, drain_ms, bytes_moved, max_op) = runtime.block_on(async move {
        tokio::spawn(async move { bench(&task_args, &coordinator, seed).await })
            .await
            .context("benchmark task panicked")?
    })?;
    drop(cluster);
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
        latency: Latency::of(&before, &during, max_op),
    };
    print_report(&figures);
    write_json(args.json.as_deref(), &figures)?;
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
    f.latency.print();
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
        indexes: None,
        done: None,
    };

    eprintln!("load before the drain: {} s", args.before_s);
    let before = measure_for(&clients, &mix, args.before_s, &max_op, seed).await?;
    let stop = Arc::new(AtomicBool::new(false));
    eprintln!("draining {drained} under the load");
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
