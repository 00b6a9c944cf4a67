//! `run`: the benchmark from its flags to its figures: a cluster per transport started,
//! the backups' CPU meters and sampler, the windows run, then the report printed and
//! written, and the clusters stopped.

use anyhow::{bail, Context, Result};
use rampart_common::onesided::TransportKind;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::args::{parse_modes, ReplicationArgs};
use super::backup_cpu::{clock_ticks_per_second, BackupCpuMeter, CpuSampler};
use super::clusters::{reap_exited, ModeCluster};
use super::conditions::Conditions;
use super::report::Report;
use super::windows::bench;
use crate::bench::ycsb::RemoveOnDrop;

/// Runs the benchmark.
pub fn run(args: ReplicationArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    let modes = parse_modes(&args.mode)?;
    if args.records == 0 || args.clients == 0 || args.rounds == 0 {
        bail!("--records, --clients and --rounds must be at least 1");
    }
    if args.replicas == 0 || args.replicas >= args.servers {
        bail!(
            "--replicas must be between 1 and servers − 1 = {} (a master never keeps a \
             replica on its own server)",
            args.servers.saturating_sub(1)
        );
    }
    if args.ops_per_round.is_none()
        && !(args.seconds_per_round.is_finite() && args.seconds_per_round > 0.0)
    {
        bail!("--seconds-per-round must be a positive number");
    }
    if args.ops_per_round == Some(0) {
        bail!("--ops-per-round must be at least 1");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let clk_tck = clock_ticks_per_second()?;
    let conditions = Conditions::now(&args, seed, clk_tck);
    println!("{}", conditions.line(&modes));

    // Declared before the clusters, so dropped after them: servers stop before their
    // data directories go.
    let root =
        std::env::temp_dir().join(format!("rampart-bench-replication-{}", std::process::id()));
    let _data = RemoveOnDrop(root.clone());
    let mut clusters = Vec::new();
    for mode in &modes {
        let started = Instant::now();
        let cluster = ModeCluster::start(&args, *mode, &root)
            .with_context(|| format!("cannot start the {mode} cluster"))?;
        println!(
            "{mode}: {} servers up in {:.1} s (pids {:?})",
            args.servers,
            started.elapsed().as_secs_f64(),
            cluster.pids
        );
        clusters.push(cluster);
    }
    let meters: Vec<BackupCpuMeter> = clusters
        .iter()
        .map(|c| BackupCpuMeter::new(c.pids.clone()))
        .collect();
    let meters = Arc::new(Mutex::new(meters));
    let sampler = CpuSampler::start(Arc::clone(&meters))?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let targets: Vec<(TransportKind, String)> = clusters
        .iter()
        .map(|c| (c.mode, c.cluster.coordinator.clone()))
        .collect();
    let task_args = args.clone();
    let task_meters = Arc::clone(&meters);
    // Spawned, as applications call the client (see `bench ycsb`).
    let outcome = runtime.block_on(async move {
        tokio::spawn(async move { bench(&task_args, &targets, &task_meters, seed, clk_tck).await })
            .await
            .context("benchmark task panicked")?
    });
    let exited = reap_exited(&mut clusters);
    drop(sampler);
    let report = match outcome {
        Ok(report) => report,
        Err(error) if !exited.is_empty() => {
            return Err(error.context(format!("servers exited: {}", exited.join("; "))));
        }
        Err(error) => return Err(error),
    };
    let report = Report {
        conditions,
        measurements: report.measurements,
        whole_run: report.whole_run,
        modes,
    };
    report.print();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report.figures())?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    for cluster in clusters {
        cluster.stop();
    }
    if !exited.is_empty() {
        eprintln!("servers exited during the run: {}", exited.join("; "));
        return Ok(ExitCode::FAILURE);
    }
    if report.errors() > 0 {
        eprintln!(
            "{} operation(s) failed; see the errors above",
            report.errors()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
