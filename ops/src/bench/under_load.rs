//! What `bench migrate` and `bench drain` share: a private cluster sized for one table,
//! the clients' load (a read/write mix, [`run_mix`]) measured before and during a
//! change of the cluster, and the clients' latency figures of both phases (`--json` keys `p50_us_before`, `p50_us_during`,
//! `p999_us_before`, `p999_us_during`, `ops_before`, `ops_during`, `max_op_ms`,
//! `failed_ops`).

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use rampart_client::Client;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::ycsb::{histogram, key, KeyChooser, RemoveOnDrop};
use crate::cluster::{self, LocalCluster, UpArgs};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// A private cluster of `servers` (R = `replicas`) in a temporary directory named after
/// `bench`, each server with room for a table of `mb` whole and its cleaning; the
/// directory goes when the returned guard does (after the cluster: declare it first).
pub(super) fn private_cluster(
    bench: &str,
    mb: u64,
    servers: u32,
    replicas: u32,
) -> Result<(RemoveOnDrop, LocalCluster)> {
    let data_dir =
        std::env::temp_dir().join(format!("rampart-bench-{bench}-{}", std::process::id()));
    let data = RemoveOnDrop(data_dir.clone());
    let up = UpArgs {
        memory: format!("{}MiB", (mb * 5 / 2).max(512)),
        replicas: Some(replicas),
        unflushed_max: format!("{}MiB", (mb * 2).max(256)),
        ..UpArgs::private(data_dir, servers)
    };
    Ok((data, cluster::start(&up, false)?))
}

/// The benchmark's runtime: two worker threads, as the machine has two cores.
pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// `load` from every client for `seconds`: the phase before the change.
pub(super) async fn measure_for(
    clients: &[Client],
    load: &Load<'_>,
    seconds: u64,
    max_op: &Arc<AtomicU64>,
    seed: u64,
) -> Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let timer = Arc::clone(&stop);
    let sleeper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        timer.store(true, Ordering::SeqCst);
    });
    let phase = run_mix(clients, load, &stop, max_op, seed).await?;
    sleeper.await.context("the phase's timer")?;
    Ok(phase)
}

/// The clients' figures before and during the change.
#[derive(Debug, Serialize)]
pub(super) struct Latency {
    pub(super) p50_us_before: f64,
    pub(super) p50_us_during: f64,
    pub(super) p999_us_before: f64,
    pub(super) p999_us_during: f64,
    pub(super) ops_before: u64,
    pub(super) ops_during: u64,
    pub(super) max_op_ms: f64,
    pub(super) failed_ops: u64,
}

impl Latency {
    /// The figures of `before` and `during`, the longest operation `max_op_ns`.
    pub(super) fn of(before: &Phase, during: &Phase, max_op_ns: u64) -> Latency {
        let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Latency {
            p50_us_before: us(&before.latencies, 0.5),
            p50_us_during: us(&during.latencies, 0.5),
            p999_us_before: us(&before.latencies, 0.999),
            p999_us_during: us(&during.latencies, 0.999),
            ops_before: before.latencies.len(),
            ops_during: during.latencies.len(),
            max_op_ms: max_op_ns as f64 / 1e6,
            failed_ops: before.failed + during.failed,
        }
    }

    /// Its two lines of the report.
    pub(super) fn print(&self) {
        println!(
            "  p50 {:.0} µs before, {:.0} µs during ({:.2}x); p99.9 {:.0} µs before, {:.0} µs during ({:.2}x); {} ops before, {} during",
            self.p50_us_before,
            self.p50_us_during,
            self.p50_us_during / self.p50_us_before,
            self.p999_us_before,
            self.p999_us_during,
            self.p999_us_during / self.p999_us_before,
            self.ops_before,
            self.ops_during
        );
        println!(
            "  longest operation {:.1} ms; failed operations {}",
            self.max_op_ms, self.failed_ops
        );
    }
}

/// Writes `figures` as JSON to `path`, if one was given.
pub(super) fn write_json(path: Option<&std::path::Path>, figures: &impl Serialize) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// The load's figures over one phase.
pub(super) struct Phase {
    pub(super) latencies: Histogram<u64>,
    pub(super) failed: u64,
}

/// What a load's clients do: keys of `table` drawn by `chooser`, a read with
/// probability `read_fraction`, else a write of `value`.
pub(super) struct Load<'a> {
    pub(super) table: rampart_client::TableId,
    pub(super) chooser: &'a Arc<KeyChooser>,
    pub(super) value: &'a Bytes,
    pub(super) read_fraction: f64,
    /// The key numbers the chooser's ranks stand for (`None`: the ranks themselves).
    pub(super) indexes: Option<&'a Arc<Vec<u64>>>,
    /// Counts every operation done, for throughput over time.
    pub(super) done: Option<&'a Arc<AtomicU64>>,
}

/// `load` from every client until `stop`: latencies in one histogram, the longest
/// operation in `max_op` (ns), failures counted.
pub(super) async fn run_mix(
    clients: &[Client],
    load: &Load<'_>,
    stop: &Arc<AtomicBool>,
    max_op: &Arc<AtomicU64>,
    seed: u64,
) -> Result<Phase> {
    let (table, chooser, value, read_fraction) =
        (load.table, load.chooser, load.value, load.read_fraction);
    let runs = clients.iter().enumerate().map(|(c, client)| {
        let (chooser, value, stop, max_op) = (
            Arc::clone(chooser),
            value.clone(),
            Arc::clone(stop),
            Arc::clone(max_op),
        );
        let (indexes, done) = (load.indexes.cloned(), load.done.cloned());
        let mut rng =
            SmallRng::seed_from_u64(seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        async move {
            let mut latencies = histogram();
            let mut failed = 0;
            while !stop.load(Ordering::SeqCst) {
                let rank = chooser.next(&mut rng);
                let k = key(indexes.as_ref().map_or(rank, |all| all[rank as usize]));
                let start = Instant::now();
                let ok = if rng.gen_bool(read_fraction) {
                    client.read(table, &k).await.is_ok()
                } else {
                    client.write(table, &k, &value).await.is_ok()
                };
                let nanos = start.elapsed().as_nanos() as u64;
                max_op.fetch_max(nanos, Ordering::SeqCst);
                latencies.record(nanos.max(1))?;
                if !ok {
                    failed += 1;
                }
                if let Some(done) = &done {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<Phase, anyhow::Error>(Phase { latencies, failed })
        }
    });
    let mut all = Phase {
        latencies: histogram(),
        failed: 0,
    };
    for phase in futures::future::join_all(runs).await {
        let phase = phase?;
        all.latencies.add(&phase.latencies)?;
        all.failed += phase.failed;
    }
    Ok(all)
}
