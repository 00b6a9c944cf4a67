//! `rampart simulate`: deterministic simulated runs of clusters through replication,
//! crashes and recoveries (`rampart_sim`). Each seed is one run; a failing seed prints itself, and
//! `rampart simulate --seed N --trace` replays it exactly, event by event.
//!
//! With `--servers N` (or `--calibrate`, `--check`) it simulates one crash recovery at
//! scale instead: see [`crate::simulate_scale`].

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use std::time::Instant;

/// `rampart simulate`
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Run this one seed (with `--trace`, print every event of it). With `--servers`:
    /// the seed of the placement, the disks' speeds and the keys (default 1).
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    pub seed: Option<u64>,
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Print the trace of every failing run (and of the one run of `--seed`).
    #[arg(long)]
    pub trace: bool,
    /// Stop at the first failing seed.
    #[arg(long)]
    pub stop_at_first: bool,
    /// Run the world where a crashed master's death may be proven (`rampart coordinator
    /// --proof-of-death`, drawn per seed, with zombies whose ports refuse).
    #[arg(long, conflicts_with = "splitting")]
    pub proving_death: bool,
    /// Run the world where the coordinators split tablets under the workload (`rampart
    /// tablet split`, at a rate drawn per seed).
    #[arg(long)]
    pub splitting: bool,
    /// One recovery at scale instead (`--servers N`, `--calibrate`, `--check`).
    #[command(flatten)]
    pub scale: crate::simulate_scale::ScaleArgs,
}

/// Runs `rampart simulate`: exit 0 when every seed passed, 1 when one failed.
pub fn run(args: SimulateArgs) -> Result<ExitCode> {
    if args.scale.wanted() {
        return crate::simulate_scale::run(&args.scale, args.seed.unwrap_or(1));
    }
    let seeds = match args.seed {
        Some(seed) => seed..seed + 1,
        None => args.from..args.from.saturating_add(args.seeds),
    };
    let started = Instant::now();
    let (mut passed, mut failed, mut acknowledged, mut zombies, mut late) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut recoveries, mut partitions, mut reads, mut cleaned) = (0u64, 0u64, 0u64, 0u64);
    let (mut linearizable, mut unknown) = (0u64, 0u64);
    let (mut retried, mut from_record) = (0u64, 0u64);
    for seed in seeds {
        let run = if args.proving_death {
            rampart_sim::run_proving_death(seed)
        } else if args.splitting {
            rampart_sim::run_splitting(seed)
        } else {
            rampart_sim::run(seed)
        };
        match run {
            Ok(report) => {
                passed += 1;
                acknowledged += report.acknowledged as u64;
                zombies += report
                    .crashes
                    .iter()
                    .filter(|c| **c == rampart_sim::world::Crash::Declared)
                    .count() as u64;
                recoveries += report.crashes.len() as u64;
                partitions += report.partitions as u64;
                reads += report.reads as u64;
                late += report.late_delivered as u64;
                cleaned += report.segments_cleaned as u64;
                linearizable += report.linearizable_ops as u64;
                unknown += report.unknown_ops as u64;
                retried += report.retries_answered as u64;
                from_record += report.retries_from_record as u64;
                if args.seed.is_some() {
                    if args.trace {
                        for line in &report.trace {
                            println!("  {line}");
                        }
                    }
                    println!(
                        "seed {}: {} masters, {} of {} operations acknowledged, {} reads checked, crashes {:?} recovered in {} partitions, {} objects served at the end, {} late requests, {} segments cleaned, {} events, {:.3} s simulated",
                        report.seed,
                        report.masters,
                        report.acknowledged,
                        report.appended,
                        report.reads,
                        report.crashes,
                        report.partitions,
                        report.objects,
                        report.late_delivered,
                        report.segments_cleaned,
                        report.events,
                        report.time_us as f64 / 1e6
                    );
                }
            }
            Err(failure) => {
                failed += 1;
                println!("{failure}");
                if args.trace {
                    for line in &failure.trace {
                        println!("  {line}");
                    }
                }
                if args.stop_at_first {
                    break;
                }
            }
        }
    }
    println!(
        "{passed} passed, {failed} failed ({acknowledged} writes acknowledged, {reads} reads checked, {recoveries} crashes recovered ({zombies} of zombie masters) in {partitions} partitions, {late} late requests delivered, {cleaned} segments cleaned; {linearizable} operations checked for linearizability, {unknown} of unknown outcome; {retried} retried writes answered, {from_record} of them from their completion records) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
