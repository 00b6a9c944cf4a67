//! `run`: the benchmark from its flags to its figures: the flags checked, the systems
//! started, the YCSB rounds, the loss comparison, then the table, the JSON and the plots.

use anyhow::{bail, Context, Result};
use std::process::{Command, ExitCode};

use super::args::CompareArgs;
use super::loss::{rampart_loss, redis_reload, Loss, Persistence};
use super::output::{figures, print_loss, print_table};
use super::plots::{write_loss_svg, write_svg};
use super::redis::{redis_server_version, RedisProcess};
use super::sentinel::sentinel_failover;
use super::ycsb_runs::compare;
use crate::bench::ycsb::RemoveOnDrop;
use crate::cluster::{self, UpArgs};
use crate::plots::plot_path;

/// Runs the benchmark.
pub fn run(mut args: CompareArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if args.quick {
        args.records = args.records.min(10_000);
        args.ops = args.ops.min(10_000);
        args.rounds = args.rounds.min(2);
        args.clients = args.clients.min(8);
        args.loss_gib = args.loss_gib.min(0.05);
        args.sentinel_stable_s = args.sentinel_stable_s.min(2);
    }
    args.sentinel_down_after_ms
        .sort_unstable_by(|a, b| b.cmp(a));
    args.sentinel_down_after_ms.dedup();
    if args.sentinel_down_after_ms.is_empty() || args.sentinel_down_after_ms.contains(&0) {
        bail!("--sentinel-down-after-ms takes one or more values above 0");
    }
    if !(args.loss_gib > 0.0 && args.loss_gib <= 64.0) {
        bail!("--loss-gib must be above 0 and at most 64");
    }
    if !(1..=60_000).contains(&args.loss_write_ms) {
        bail!(
            "--loss-write-ms must be 1 to 60000: every system takes the write load until its kill"
        );
    }
    if args.records == 0 || args.clients == 0 || args.rounds == 0 || args.workloads.is_empty() {
        bail!("--records, --clients, --rounds and --workloads must not be zero or empty");
    }
    if args.replicas == 0 || args.replicas >= args.servers {
        bail!(
            "--replicas must be 1 to --servers - 1 (a master never keeps a replica on its own \
             server); {} servers allow at most {}",
            args.servers,
            args.servers.saturating_sub(1)
        );
    }
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        bail!(
            "redis-server is not installed: `bench compare --peer redis` starts its own Redis \
             (Debian: apt-get install redis-server)"
        );
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let scratch = std::env::temp_dir().join(format!("rampart-compare-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    // Declared first, dropped last: the processes stop before their directory goes.
    let _scratch = RemoveOnDrop(scratch.clone());
    let up = UpArgs {
        memory: "512MiB".into(),
        backup_frames: 16,
        replicas: Some(args.replicas),
        ..UpArgs::private(scratch.join("rampart"), args.servers)
    };
    let rampart = cluster::start(&up, false)?;
    let redis_dir = scratch.join("redis");
    std::fs::create_dir_all(&redis_dir)?;
    let primary = RedisProcess::start(&redis_dir, &[])?;
    let mut redis_replicas = Vec::new();
    for _ in 0..args.replicas {
        redis_replicas.push(RedisProcess::start(
            &redis_dir,
            &[
                "--replicaof".to_string(),
                "127.0.0.1".to_string(),
                primary.port.to_string(),
            ],
        )?);
    }
    let standalone = RedisProcess::start(&redis_dir, &[])?;
    println!(
        "bench compare: rampart ({} servers, R = {}, 1 coordinator) against redis {} \
         ({} replicas, WAIT {}) and redis {} (no replicas); nothing on disk in Redis",
        args.servers,
        args.replicas,
        redis_server_version(),
        args.replicas,
        args.replicas,
        standalone.addr()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let task_args = args.clone();
    let coordinator = rampart.coordinator.clone();
    let (primary_addr, standalone_addr) = (primary.addr(), standalone.addr());
    let results = runtime.block_on(async move {
        tokio::spawn(async move {
            compare(
                &task_args,
                &coordinator,
                &primary_addr,
                &standalone_addr,
                seed,
            )
            .await
        })
        .await
        .context("benchmark task panicked")?
    })?;
    drop((primary, redis_replicas, standalone, rampart));
    print_table(&args, seed, &results);
    let loss = if args.no_loss {
        None
    } else {
        let loss = measure_loss(&args, &scratch)?;
        print_loss(&args, &loss);
        Some(loss)
    };
    if let Some(path) = &args.json {
        let figures = figures(&args, seed, &results, loss.as_ref());
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let plot = plot_path(path, "ycsb");
        write_svg(&plot, &args, &results)?;
        println!("figures: {}; plot: {}", path.display(), plot.display());
        if let Some(loss) = &loss {
            let plot = plot_path(path, "loss");
            write_loss_svg(&plot, loss)?;
            println!("plot: {}", plot.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What losing a server holding `--loss-gib` costs each system.
fn measure_loss(args: &CompareArgs, scratch: &std::path::Path) -> Result<Loss> {
    let (rampart_ms, rampart_lost) = rampart_loss(args, scratch)?;
    let write_ms = args.loss_write_ms;
    let (rdb_ms, rdb_lost) = redis_reload(args.loss_gib, write_ms, scratch, Persistence::Rdb)?;
    let (aof_ms, aof_lost) = redis_reload(args.loss_gib, write_ms, scratch, Persistence::Aof)?;
    let sentinel = sentinel_failover(args, scratch)?;
    Ok(Loss {
        gib: args.loss_gib,
        rampart_ms,
        rdb_ms,
        aof_ms,
        sentinel_ms: sentinel.failover_ms,
        rampart_lost,
        rdb_lost,
        aof_lost,
        sentinel_lost: sentinel.lost,
        sentinel_down_after_ms: sentinel.down_after_ms,
        sentinel_sweep: sentinel.sweep,
    })
}
