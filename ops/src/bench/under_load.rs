//! What `bench migrate` and `bench drain` share: a private cluster sized for one table,
//! the load measured before and during a change of the cluster, and the clients'
//! latency figures of both phases (`--json` keys `p50_us_before`, `p50_us_during`,
//! `p999_us_before`, `p999_us_during`, `ops_before`, `ops_during`, `max_op_ms`,
//! `failed_ops`).

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use rampart_client::Client;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::migrate::{run_mix, Load, Phase};
use super::ycsb::RemoveOnDrop;
use crate::cluster::{self, LocalCluster, UpArgs};

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
