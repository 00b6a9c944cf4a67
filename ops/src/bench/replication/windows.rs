//! The measured windows: every cluster loaded, then round after round each workload run
//! on each mode's cluster in turn (the order rotating), a warm-up before each window,
//! the backups' CPU sampled either side of it, and a line printed as each window ends.

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rampart_client::{Client, ClientOptions, TableId};
use rampart_common::onesided::TransportKind;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::args::ReplicationArgs;
use super::backup_cpu::{backup_cpu_now, schedstat_available, BackupCpuMeter, Cpu};
use super::figures::{cpu_s_per_million, fmt_opt, us};
use crate::bench::ycsb::{histogram, key, load, KeyChooser, Workload};

/// Unmeasured load before each window, so a cluster that sat idle while the others
/// were measured has its connections and caches warm again.
pub(super) const WARMUP: Duration = Duration::from_millis(250);

/// After the last window, how long background closes get to finish before the last
/// whole-run sample.
pub(super) const SETTLE: Duration = Duration::from_secs(1);

/// Deadline of one client operation: long enough that a stall shows as latency, not as
/// an error.
pub(super) const OPERATION_DEADLINE: Duration = Duration::from_secs(30);

/// The workloads, in the order each round measures them.
pub(super) const WORKLOADS: [Workload; 2] = [Workload::WriteOnly, Workload::A];

/// When a window's clients stop.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// Each client stops issuing at this instant.
    At(Instant),
    /// Each client issues this many operations.
    Ops(u64),
}

/// One mode's cluster as the clients see it.
struct Target {
    mode: TransportKind,
    table: TableId,
    clients: Vec<Client>,
    /// Per client: the key and operation choices, seeded alike for every mode so each
    /// mode sees the same sequence.
    rngs: Vec<SmallRng>,
}

/// One measured window.
#[derive(Debug)]
pub(super) struct Measurement {
    pub(super) mode: TransportKind,
    pub(super) workload: Workload,
    pub(super) round: u32,
    pub(super) elapsed_s: f64,
    pub(super) reads: Histogram<u64>,
    pub(super) updates: Histogram<u64>,
    /// Backup-thread CPU over the window.
    pub(super) backup: Cpu,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
}

impl Measurement {
    fn ops(&self) -> u64 {
        self.reads.len() + self.updates.len()
    }

    pub(super) fn throughput(&self) -> f64 {
        self.ops() as f64 / self.elapsed_s
    }
}

/// What the benchmark task hands back.
pub(super) struct BenchOutcome {
    pub(super) measurements: Vec<Measurement>,
    pub(super) whole_run: Vec<WholeRun>,
}

/// One mode's backup CPU from the end of its load to the end of the run.
#[derive(Debug)]
pub(super) struct WholeRun {
    pub(super) mode: TransportKind,
    pub(super) backup: Cpu,
    /// Acknowledged updates, warm-ups included.
    pub(super) writes: u64,
    pub(super) schedstat: bool,
}

pub(super) async fn bench(
    args: &ReplicationArgs,
    modes: &[(TransportKind, String)],
    meters: &Mutex<Vec<BackupCpuMeter>>,
    seed: u64,
    clk_tck: u64,
) -> Result<BenchOutcome> {
    let options = ClientOptions {
        deadline: OPERATION_DEADLINE,
        ..Default::default()
    };
    let value = Bytes::from(vec![b'x'; args.value_bytes]);
    let mut targets = Vec::new();
    for (mode, coordinator) in modes {
        let coordinators: Vec<&str> = coordinator.split(',').collect();
        let admin = Client::connect_with(&coordinators, options.clone()).await?;
        let table = admin.create_table("replication", args.servers).await?;
        let mut clients = Vec::new();
        for _ in 0..args.clients {
            clients.push(Client::connect_with(&coordinators, options.clone()).await?);
        }
        let started = Instant::now();
        load(&clients, table, args.records, &value)
            .await
            .with_context(|| format!("loading the {mode} cluster"))?;
        println!(
            "{mode}: loaded {} records in {:.1} s",
            args.records,
            started.elapsed().as_secs_f64()
        );
        let rngs = (0..args.clients)
            .map(|c| {
                SmallRng::seed_from_u64(seed ^ u64::from(c).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            })
            .collect();
        targets.push(Target {
            mode: *mode,
            table,
            clients,
            rngs,
        });
    }
    let mut whole_start = Vec::new();
    for index in 0..targets.len() {
        whole_start.push(backup_cpu_now(meters, index)?);
    }
    let mut whole_writes = vec![0u64; targets.len()];

    let chooser = KeyChooser::new(args.records, args.zipf)?;
    let mut measurements = Vec::new();
    for round in 0..args.rounds {
        for workload in WORKLOADS {
            for k in 0..targets.len() {
                // The order rotates each round, so no mode always goes first.
                let index = (k + round as usize) % targets.len();
                let target = &mut targets[index];
                let warmup = window(
                    target,
                    workload,
                    Stop::At(Instant::now() + WARMUP),
                    &chooser,
                    &value,
                )
                .await;
                whole_writes[index] += warmup.updates.len();
                let before = backup_cpu_now(meters, index)?;
                let stop = match args.ops_per_round {
                    Some(ops) => Stop::Ops(ops.div_ceil(u64::from(args.clients))),
                    None => {
                        Stop::At(Instant::now() + Duration::from_secs_f64(args.seconds_per_round))
                    }
                };
                let mut measured = window(target, workload, stop, &chooser, &value).await;
                let after = backup_cpu_now(meters, index)?;
                measured.backup = after.since(before);
                measured.round = round;
                whole_writes[index] += measured.updates.len();
                print_progress(&measured, args.replicas, clk_tck);
                if let Some(error) = &measured.first_error {
                    eprintln!(
                        "  {} errors in this window; the first: {error}",
                        measured.errors
                    );
                }
                measurements.push(measured);
            }
        }
    }
    tokio::time::sleep(SETTLE).await;
    let schedstat = schedstat_available(meters);
    let mut whole_run = Vec::new();
    for (index, target) in targets.iter().enumerate() {
        whole_run.push(WholeRun {
            mode: target.mode,
            backup: backup_cpu_now(meters, index)?.since(whole_start[index]),
            writes: whole_writes[index],
            schedstat,
        });
    }
    Ok(BenchOutcome {
        measurements,
        whole_run,
    })
}

/// Runs `workload` on `target` from all its clients until `stop`. A client that meets
/// an error stops for the rest of the window (a dead server would otherwise make it
/// spin); the errors are counted and the first kept.
async fn window(
    target: &mut Target,
    workload: Workload,
    stop: Stop,
    chooser: &KeyChooser,
    value: &Bytes,
) -> Measurement {
    let table = target.table;
    let start = Instant::now();
    let runs = target
        .clients
        .iter()
        .zip(target.rngs.iter_mut())
        .map(|(client, rng)| async move {
            let mut reads = histogram();
            let mut updates = histogram();
            let mut issued = 0u64;
            loop {
                let more = match stop {
                    Stop::At(at) => Instant::now() < at,
                    Stop::Ops(ops) => issued < ops,
                };
                if !more {
                    break;
                }
                issued += 1;
                let k = key(chooser.next(rng));
                let read = rng.gen_bool(workload.read_fraction());
                let started = Instant::now();
                let result = if read {
                    client.read(table, &k).await.map(|_| ())
                } else {
                    client.write(table, &k, value).await.map(|_| ())
                };
                if let Err(error) = result {
                    return (reads, updates, Some(error.to_string()));
                }
                let nanos = (started.elapsed().as_nanos() as u64).max(1);
                // Saturates at the histogram's highest value rather than failing.
                if read {
                    reads.saturating_record(nanos);
                } else {
                    updates.saturating_record(nanos);
                }
            }
            (reads, updates, None)
        });
    let results = futures::future::join_all(runs).await;
    let elapsed_s = start.elapsed().as_secs_f64();
    let mut measurement = Measurement {
        mode: target.mode,
        workload,
        round: 0,
        elapsed_s,
        reads: histogram(),
        updates: histogram(),
        backup: Cpu::default(),
        errors: 0,
        first_error: None,
    };
    for (reads, updates, error) in results {
        // Same bounds on both sides: adding cannot fail.
        let _ = measurement.reads.add(&reads);
        let _ = measurement.updates.add(&updates);
        if let Some(error) = error {
            measurement.errors += 1;
            measurement.first_error.get_or_insert(error);
        }
    }
    measurement
}

fn print_progress(m: &Measurement, replicas: u32, clk_tck: u64) {
    let cpu = cpu_s_per_million(
        m.backup.ticks as f64 / clk_tck as f64,
        m.updates.len(),
        replicas,
    );
    println!(
        "round {} {:<10} {:<4} {:>8.0} ops/s  write p50 {:>7.1} µs  p99 {:>8.1} µs  \
         backup {:>3} ticks {:>8.3} ms  {} s/M repl. writes",
        m.round + 1,
        m.workload.name(),
        m.mode.name(),
        m.throughput(),
        us(&m.updates, 0.5),
        us(&m.updates, 0.99),
        m.backup.ticks,
        m.backup.ns as f64 / 1e6,
        fmt_opt(cpu, 3),
    );
}
