//! `rampart simulate --servers N ...`: one crash recovery of a cluster of any size,
//! simulated (`rampart_sim::scale`): Rampart's own placement, will, log check, read
//! order and partition assignment, over modelled disks, NICs and cores whose costs are
//! calibrated from `rampart bench recovery`.
//!
//! * `--servers N ...` — one recovery: when its data is back, and what bounds it.
//! * `--report` — with it, the figures of docs/benchmarks.md, *Recovery at scale*: the scaling
//!   curve from 10 servers to N, the spread of recovery times over `--placements`
//!   placements (random against refined), and the probability of losing data in a year;
//!   `--json FILE` writes them, with a plot of each beside it.
//! * `--calibrate RUN.json,...` — the costs, from `rampart bench recovery --json` runs
//!   on this machine (and from timing the backups' split and a frame's flush here);
//!   `--json FILE` writes them for `--costs FILE`.
//! * `--check RUN.json,...` — each local run simulated (servers sharing this machine's
//!   cores) beside what it measured.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rampart_sim::scale::{self, loss, Costs, Host, Outcome, Scenario, GIB};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use crate::bench::recovery_time::RecoveryFigures;
use crate::plots::{plot_path, LINE_COLOURS};

/// Where a master's primary replicas go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Placement {
    /// The selector's refinement (`CANDIDATES_K` random candidates, the one that would
    /// finish reading soonest).
    Refined,
    /// Pure random choice (one candidate).
    Random,
}

impl Placement {
    /// Random candidates per primary replica.
    fn candidates(self) -> usize {
        match self {
            Placement::Refined => rampart_master::replica_manager::backup_selector::CANDIDATES_K,
            Placement::Random => 1,
        }
    }
}

/// The flags of the recovery-at-scale simulation.
#[derive(Args, Debug)]
pub struct ScaleArgs {
    /// Servers in the cluster (each a master and a backup): simulate one recovery at
    /// this scale instead of the seeded correctness runs.
    #[arg(long, conflicts_with_all = ["seeds", "from", "trace", "stop_at_first"])]
    pub servers: Option<usize>,
    /// Masters that crash at once.
    #[arg(long, default_value_t = 1)]
    pub masters_crashed: usize,
    /// GiB of log in each crashed master.
    #[arg(long, default_value_t = 64.0)]
    pub master_gib: f64,
    /// Disk read bandwidth of every backup, MB/s.
    #[arg(long, default_value_t = 100.0)]
    pub disk_mbps: f64,
    /// Disks differ by up to this fraction of `--disk-mbps` either way (uniformly).
    #[arg(long, default_value_t = 0.0)]
    pub disk_spread: f64,
    /// NIC bandwidth each way, Gbit/s.
    #[arg(long, default_value_t = 10.0)]
    pub nic_gbps: f64,
    /// Replicas per segment (R).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Failure domains (racks); 0: one per server.
    #[arg(long, default_value_t = 0)]
    pub racks: usize,
    /// Placement of primary replicas.
    #[arg(long, value_enum, default_value_t = Placement::Refined)]
    pub placement: Placement,
    /// Cores per server.
    #[arg(long, default_value_t = 8.0)]
    pub cores: f64,
    /// Segment size, MiB.
    #[arg(long, default_value_t = 8)]
    pub segment_mib: u64,
    /// Bytes of each object's value (keys of 11 bytes).
    #[arg(long, default_value_t = 1024)]
    pub object_bytes: u64,
    /// Byte limit of a will's partitions, MiB (the masters' `--partition-bytes`).
    #[arg(long, default_value_t = rampart_master::profiler::PARTITION_BYTES_DEFAULT >> 20)]
    pub partition_mib: u64,
    /// Partitions each recovery master replays at once (the masters'
    /// `RECOVERY_PARTITIONS_AT_ONCE`; other values are what-ifs).
    #[arg(long, default_value_t = rampart_master::recovery_master::RECOVERY_PARTITIONS_AT_ONCE)]
    pub partitions_at_once: usize,
    /// The crashed master's lease, ms (the coordinators' `--lease-ms`).
    #[arg(long, default_value_t = rampart_coordinator::recovery_manager::LEASE_DEFAULT.as_millis() as u64)]
    pub lease_ms: u64,
    /// The crashed masters' deaths are proven as they are detected, so their tablets
    /// do not wait out their leases (`rampart coordinator --proof-of-death direct`, or
    /// a supervisor that reports exits, as `cluster up` does).
    #[arg(long)]
    pub death_proven: bool,
    /// Costs from `--calibrate ... --json FILE` (default: the development VM's).
    #[arg(long)]
    pub costs: Option<PathBuf>,
    /// Also the scaling curve, the placements' spread and the probability of data loss.
    #[arg(long)]
    pub report: bool,
    /// Placements (seeds) per placement kind for the spread of `--report`.
    #[arg(long, default_value_t = 100)]
    pub placements: u64,
    /// Failures per server per year, for the probability of data loss.
    #[arg(long, default_value_t = 2.0)]
    pub failures_per_year: f64,
    /// Fit the costs to these `rampart bench recovery --json` runs (comma-separated).
    #[arg(long, value_delimiter = ',', conflicts_with = "servers")]
    pub calibrate: Vec<PathBuf>,
    /// Simulate these local `rampart bench recovery --json` runs beside what they
    /// measured (comma-separated).
    #[arg(long, value_delimiter = ',', conflicts_with = "servers")]
    pub check: Vec<PathBuf>,
    /// Cores of the machine the `--check` runs were measured on (default: this one's).
    #[arg(long)]
    pub host_cores: Option<f64>,
    /// Write the figures (and, with `--report`, plots beside) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl ScaleArgs {
    /// Whether these flags ask for the scale simulation rather than the seeded runs.
    pub fn wanted(&self) -> bool {
        self.servers.is_some() || !self.calibrate.is_empty() || !self.check.is_empty()
    }

    fn scenario(&self, servers: usize, seed: u64) -> Scenario {
        Scenario {
            servers,
            crashed: self.masters_crashed,
            master_bytes: (self.master_gib * GIB as f64) as u64,
            entry_bytes: rampart_common::log::object_entry_bytes(11, self.object_bytes as usize)
                as u64,
            segment_bytes: self.segment_mib << 20,
            replicas: self.replicas,
            disk_read_mbps: self.disk_mbps,
            disk_spread: self.disk_spread,
            nic_gbps: self.nic_gbps,
            racks: self.racks,
            candidates: self.placement.candidates(),
            partition_bytes: self.partition_mib << 20,
            partitions_at_once: self.partitions_at_once,
            lease_ms: self.lease_ms as f64,
            death_proven: self.death_proven,
            host: Host::PerServer { cores: self.cores },
            seed,
            ..Scenario::cluster(servers, self.master_gib)
        }
    }

    fn costs(&self) -> Result<Costs> {
        let Some(path) = &self.costs else {
            return Ok(Costs::development_vm());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the costs {}", path.display()))?;
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let holds_no_costs = || format!("{} holds no costs", path.display());
        let within: WithCosts = serde_json::from_str(&text).with_context(holds_no_costs)?;
        let costs = match within.costs {
            Some(costs) => costs,
            None => serde_json::from_str(&text).with_context(holds_no_costs)?,
        };
        costs.check().map_err(anyhow::Error::msg)?;
        Ok(costs)
    }
}

/// What `--servers N --json FILE` writes: the recovery simulated, with what it was
/// simulated on, and with `--report` the figures of docs/benchmarks.md.
#[derive(Debug, Serialize, Deserialize)]
struct SimulationFigures {
    scenario: Scenario,
    costs: Costs,
    outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    report: Option<ScaleReport>,
}

/// `--report`'s figures: the scaling curve, the placements' spread and the probability
/// of data loss.
#[derive(Debug, Serialize, Deserialize)]
struct ScaleReport {
    /// The recovery of `--servers N` itself.
    headline: Headline,
    scaling: Vec<ScalingPoint>,
    placements: PlacementSpread,
    loss: LossFigures,
}

#[derive(Debug, Serialize, Deserialize)]
struct Headline {
    servers: usize,
    master_gib: f64,
    unavailability_ms: f64,
    replayed_ms: f64,
}

/// The same crashed master on a cluster of `servers`.
#[derive(Debug, Serialize, Deserialize)]
struct ScalingPoint {
    servers: usize,
    outcome: Outcome,
}

/// Recovery times over placements, disks differing by up to `disk_spread`.
#[derive(Debug, Serialize, Deserialize)]
struct PlacementSpread {
    servers: usize,
    disk_spread: f64,
    replayed_ms: PlacementTimes,
}

/// Each placement's ms until the last partition is replayed, one per seed, ascending.
#[derive(Debug, Default, Serialize, Deserialize)]
struct PlacementTimes {
    random: Vec<f64>,
    refined: Vec<f64>,
}

/// The probability of losing data in a year, over the scaling curve's cluster sizes.
#[derive(Debug, Serialize, Deserialize)]
struct LossFigures {
    failures_per_year: f64,
    points: Vec<LossPoint>,
}

#[derive(Debug, Serialize, Deserialize)]
struct LossPoint {
    servers: usize,
    recovery_s: f64,
    per_year: Vec<LossProbability>,
}

#[derive(Debug, Serialize, Deserialize)]
struct LossProbability {
    replicas: usize,
    probability: f64,
}

/// What `--calibrate` and `--check` write with `--json FILE`: the costs (fitted, or
/// those simulated with), and each run simulated beside what it measured.
#[derive(Debug, Serialize, Deserialize)]
struct CalibrationFigures {
    costs: Costs,
    check: Vec<CheckRow>,
}

/// One measured run beside its simulation.
#[derive(Debug, Serialize, Deserialize)]
struct CheckRow {
    /// The run's JSON file.
    run: String,
    servers: usize,
    replicas: usize,
    data_mb: f64,
    /// 0: every server left.
    recovery_masters_max: usize,
    measured_unavailability_ms: f64,
    simulated_unavailability_ms: f64,
    /// Simulated over measured.
    ratio: f64,
}

/// What `--costs FILE` takes the costs from when the file is not the costs alone: any
/// of the JSON above ([`CalibrationFigures`], [`SimulationFigures`]) holds them as
/// `costs`.
#[derive(Deserialize)]
struct WithCosts {
    costs: Option<Costs>,
}

/// Runs the scale simulation the flags ask for.
pub fn run(args: &ScaleArgs, seed: u64) -> Result<ExitCode> {
    if !args.calibrate.is_empty() {
        return calibrate(args);
    }
    if !args.check.is_empty() {
        let costs = args.costs()?;
        let cores = args.host_cores.unwrap_or_else(this_machines_cores);
        let check = check(&args.check, &costs, cores)?;
        if let Some(path) = &args.json {
            write_json(path, &CalibrationFigures { costs, check })?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(servers) = args.servers else {
        bail!("say --servers N, --calibrate RUNS or --check RUNS");
    };
    let costs = args.costs()?;
    let scenario = args.scenario(servers, seed);
    let started = Instant::now();
    let outcome = scale::simulate(&scenario, &costs).map_err(anyhow::Error::msg)?;
    print_outcome(&scenario, &outcome);
    println!(
        "  (simulated {} events in {:.2} s; costs: {})",
        outcome.events,
        started.elapsed().as_secs_f64(),
        costs.source
    );
    let report = if args.report {
        let report = report(args, servers, seed, &costs, &outcome)?;
        if let Some(path) = &args.json {
            write_plots(path, &report)?;
        }
        Some(report)
    } else {
        None
    };
    if let Some(path) = &args.json {
        let figures = SimulationFigures {
            scenario,
            costs,
            outcome,
            report,
        };
        write_json(path, &figures)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_outcome(s: &Scenario, o: &Outcome) {
    println!(
        "{} servers, {} crashed master(s) of {:.1} GiB, R = {}, {} MB/s disks, {} Gbit/s NICs, {} candidate(s) per primary, seed {}:",
        s.servers,
        s.crashed,
        s.master_bytes as f64 / GIB as f64,
        s.replicas,
        s.disk_read_mbps,
        s.nic_gbps,
        s.candidates,
        s.seed
    );
    println!(
        "  unavailability {:.0} ms (median partition live at {:.0} ms): detection {:.0} ms, setup done at {:.0} ms, replayed at {:.0} ms, lease out at {:.0} ms",
        o.unavailability_ms, o.median_partition_live_ms, o.detection_ms, o.setup_ms, o.replayed_ms, o.lease_end_ms
    );
    println!(
        "  {} segments, {} partitions on {} recovery masters (at most {} each), reads per backup {:.1} mean, {} max",
        o.segments,
        o.partitions,
        o.recovery_masters,
        o.partitions_per_master_max,
        o.reads_per_backup_mean,
        o.reads_per_backup_max
    );
    println!(
        "  bounds from setup: disks {:.0} ms, replay {:.0} ms, NICs {:.0} ms; {} copysets",
        o.bound_disk_ms, o.bound_replay_ms, o.bound_nic_ms, o.copysets
    );
}

/// Server counts of the scaling curve: 10, 20, 50, 100, 200, 500, ... up to `max`.
fn curve_points(max: usize) -> Vec<usize> {
    let mut points = Vec::new();
    let mut decade = 10;
    'out: loop {
        for k in [1, 2, 5] {
            let n = k * decade;
            if n >= max {
                break 'out;
            }
            points.push(n);
        }
        decade *= 10;
    }
    points.push(max);
    points
}

/// The least of `values`: of repeated timings, the one least disturbed by the rest of a
/// shared machine.
fn least(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The median of `values` (0 when there are none).
fn median(values: &[f64]) -> f64 {
    crate::stats::median(values.to_vec()).unwrap_or(0.0)
}

fn report(
    args: &ScaleArgs,
    servers: usize,
    seed: u64,
    costs: &Costs,
    headline: &Outcome,
) -> Result<ScaleReport> {
    // The scaling curve: the same master on 10 to N servers.
    println!("\nscaling ({} GiB crashed master):", args.master_gib);
    println!("  servers  unavailability ms  replayed ms  disks ms  replay ms  copysets");
    let mut curve = Vec::new();
    for n in curve_points(servers) {
        let scenario = args.scenario(n, seed);
        let o = scale::simulate(&scenario, costs).map_err(anyhow::Error::msg)?;
        println!(
            "  {n:>7}  {:>17.0}  {:>11.0}  {:>8.0}  {:>9.0}  {:>8}",
            o.unavailability_ms, o.replayed_ms, o.bound_disk_ms, o.bound_replay_ms, o.copysets
        );
        curve.push((n, o));
    }

    // Spread over placements: refined against random, disks differing by 30 %.
    let spread = if args.disk_spread > 0.0 {
        args.disk_spread
    } else {
        0.3
    };
    let mut replayed_ms = PlacementTimes::default();
    println!(
        "\nrecovery time over {} placements ({servers} servers, disks ±{:.0} %):",
        args.placements,
        spread * 100.0
    );
    for placement in [Placement::Random, Placement::Refined] {
        let mut times: Vec<f64> = Vec::new();
        for s in 0..args.placements {
            let mut scenario = args.scenario(servers, seed.wrapping_add(s));
            scenario.disk_spread = spread;
            scenario.candidates = placement.candidates();
            let o = scale::simulate(&scenario, costs).map_err(anyhow::Error::msg)?;
            times.push(o.replayed_ms);
        }
        let mut sorted = times;
        sorted.sort_by(f64::total_cmp);
        let mid = median(&sorted);
        println!(
            "  {placement:?}: replayed at {:.0} ms min, {mid:.0} ms median, {:.0} ms max",
            sorted.first().copied().unwrap_or(0.0),
            sorted.last().copied().unwrap_or(0.0)
        );
        match placement {
            Placement::Random => replayed_ms.random = sorted,
            Placement::Refined => replayed_ms.refined = sorted,
        }
    }

    // Probability of losing data in a year, over the curve's cluster sizes.
    println!(
        "\nprobability of data loss per year ({} failures per server per year):",
        args.failures_per_year
    );
    let mut losses = Vec::new();
    for (n, o) in &curve {
        let recovery_s = o.unavailability_ms / 1e3;
        let per_r: Vec<(usize, f64)> = (1..=3)
            .map(|r| {
                // The copysets of R replicas scale as the placement's; recount for R.
                let scenario = Scenario {
                    replicas: r,
                    ..args.scenario(*n, seed)
                };
                let copysets = scale::plan::Plan::build(&scenario)
                    .map(|p| p.crashes.iter().map(|c| c.copysets).sum::<usize>())
                    .unwrap_or(o.copysets);
                (
                    r,
                    loss::per_year(*n, args.failures_per_year, recovery_s, r, copysets),
                )
            })
            .collect();
        println!(
            "  {n:>5} servers, recovery {recovery_s:.2} s: {}",
            per_r
                .iter()
                .map(|(r, p)| format!("R={r} {p:.2e}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        losses.push(LossPoint {
            servers: *n,
            recovery_s,
            per_year: per_r
                .into_iter()
                .map(|(replicas, probability)| LossProbability {
                    replicas,
                    probability,
                })
                .collect(),
        });
    }
    Ok(ScaleReport {
        headline: Headline {
            servers,
            master_gib: args.master_gib,
            unavailability_ms: headline.unavailability_ms,
            replayed_ms: headline.replayed_ms,
        },
        scaling: curve
            .into_iter()
            .map(|(servers, outcome)| ScalingPoint { servers, outcome })
            .collect(),
        placements: PlacementSpread {
            servers,
            disk_spread: spread,
            replayed_ms,
        },
        loss: LossFigures {
            failures_per_year: args.failures_per_year,
            points: losses,
        },
    })
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// One line per series; `log_x`/`log_y` for logarithmic axes.
struct Chart<'a> {
    title: &'a str,
    x: &'a str,
    y: &'a str,
    log_x: bool,
    log_y: bool,
    series: Vec<(String, Vec<(f64, f64)>)>,
}

fn draw(path: &Path, chart: &Chart) -> Result<()> {
    use plotters::prelude::*;
    let points = || chart.series.iter().flat_map(|(_, s)| s.iter().copied());
    let (x_min, x_max) = points().fold((f64::MAX, f64::MIN), |(lo, hi), (x, _)| {
        (lo.min(x), hi.max(x))
    });
    let (y_min, y_max) = points().fold((f64::MAX, f64::MIN), |(lo, hi), (_, y)| {
        (lo.min(y), hi.max(y))
    });
    if !(x_min.is_finite() && y_min.is_finite() && x_max > x_min) {
        bail!("nothing to plot in {}", path.display());
    }
    let y_lo = if chart.log_y { y_min / 2.0 } else { 0.0 };
    let y_hi = if chart.log_y {
        y_max * 2.0
    } else {
        y_max * 1.1
    };
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let colors = LINE_COLOURS;
    macro_rules! plot {
        ($x:expr, $y:expr) => {{
            let mut c = ChartBuilder::on(&root)
                .caption(chart.title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d($x, $y)?;
            let x_label = |v: &f64| {
                if chart.log_x || v.abs() >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            };
            let y_label = |v: &f64| {
                if chart.log_y && *v < 1.0 {
                    format!("{v:.0e}")
                } else if v.abs() >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            };
            c.configure_mesh()
                .x_desc(chart.x)
                .y_desc(chart.y)
                .x_label_formatter(&x_label)
                .y_label_formatter(&y_label)
                .draw()?;
            for (i, (name, series)) in chart.series.iter().enumerate() {
                let color = colors[i % colors.len()];
                c.draw_series(LineSeries::new(
                    series.iter().copied(),
                    color.stroke_width(2),
                ))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            c.configure_series_labels()
                .position(SeriesLabelPosition::LowerLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }};
    }
    match (chart.log_x, chart.log_y) {
        (true, true) => plot!((x_min..x_max).log_scale(), (y_lo..y_hi).log_scale()),
        (true, false) => plot!((x_min..x_max).log_scale(), y_lo..y_hi),
        (false, true) => plot!(x_min..x_max, (y_lo..y_hi).log_scale()),
        (false, false) => plot!(x_min..x_max, y_lo..y_hi),
    }
    root.present()?;
    println!("wrote {}", path.display());
    Ok(())
}

fn write_plots(json_path: &Path, report: &ScaleReport) -> Result<()> {
    let scaling = &report.scaling;
    draw(
        &plot_path(json_path, "scaling"),
        &Chart {
            title: "Recovery of one crashed master against cluster size (simulated)",
            x: "servers",
            y: "ms from the crash",
            log_x: true,
            log_y: true,
            series: vec![
                (
                    "unavailability".into(),
                    scaling
                        .iter()
                        .map(|p| (p.servers as f64, p.outcome.unavailability_ms))
                        .collect(),
                ),
                (
                    "last partition replayed".into(),
                    scaling
                        .iter()
                        .map(|p| (p.servers as f64, p.outcome.replayed_ms))
                        .collect(),
                ),
            ],
        },
    )?;
    let times = &report.placements.replayed_ms;
    let cdf = [("random", &times.random), ("refined", &times.refined)]
        .into_iter()
        .map(|(kind, times)| {
            let n = times.len().max(1) as f64;
            let line = times
                .iter()
                .enumerate()
                .map(|(i, &t)| (t, (i + 1) as f64 / n))
                .collect();
            (format!("{kind} placement"), line)
        })
        .collect();
    draw(
        &plot_path(json_path, "placements"),
        &Chart {
            title: "Replay time over placements: cumulative fraction (simulated)",
            x: "ms from the crash until the last partition is replayed",
            y: "fraction of placements",
            log_x: false,
            log_y: false,
            series: cdf,
        },
    )?;
    let mut by_r: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in 1..=3 {
        let line: Vec<(f64, f64)> = report
            .loss
            .points
            .iter()
            .filter_map(|p| {
                let prob = p.per_year.iter().find(|e| e.replicas == r)?.probability;
                (prob > 0.0).then_some((p.servers as f64, prob))
            })
            .collect();
        if !line.is_empty() {
            by_r.push((format!("R = {r}"), line));
        }
    }
    draw(
        &plot_path(json_path, "loss"),
        &Chart {
            title: "Probability of losing data in a year (simulated recovery times)",
            x: "servers",
            y: "probability per year",
            log_x: true,
            log_y: true,
            series: by_r,
        },
    )
}

/// A `rampart bench recovery --json` run, as the calibration and the check read it.
struct Measured {
    path: PathBuf,
    servers: usize,
    replicas: usize,
    data_mb: f64,
    object_bytes: u64,
    recovery_masters_max: usize,
    detection_ms: f64,
    setup_ms: f64,
    unavailability_ms: f64,
    last_live_ms: f64,
    cpu_ns_per_byte: f64,
    /// Partitions' live − replay end, for those the lease did not hold.
    commits_ms: Vec<f64>,
    partitions: usize,
    /// The crashed master's death was proven: no lease held its partitions.
    death_proven: bool,
}

fn read_measured(path: &Path) -> Result<Measured> {
    let run = RecoveryFigures::read(path)?;
    let lease_ms = rampart_coordinator::recovery_manager::LEASE_DEFAULT.as_secs_f64() * 1e3;
    let mut commits_ms = Vec::new();
    let mut last_live_ms = 0.0f64;
    // The lease held nothing once the master's death was proven, or once it ran out.
    let held_until = match run.lease_end_ms {
        Some(at) if run.death_proven() => at as f64,
        _ => lease_ms + 100.0,
    };
    for p in &run.partitions {
        let live = p.live_ms as f64;
        let end = (p.replay_start_ms + p.replay_ms) as f64;
        last_live_ms = last_live_ms.max(live);
        // Replayed after the lease or the proof: live − replayed is the commit alone.
        if end > held_until {
            commits_ms.push(live - end);
        }
    }
    let servers = run.servers as usize;
    Ok(Measured {
        path: path.to_path_buf(),
        servers,
        replicas: run.replicas as usize,
        data_mb: run.data_mb as f64,
        object_bytes: run.object_bytes as u64,
        recovery_masters_max: if run.recovery_masters + 1 < servers {
            run.recovery_masters
        } else {
            0
        },
        detection_ms: run.detection_ms as f64,
        setup_ms: run.setup_ms as f64,
        unavailability_ms: run.unavailability_ms,
        last_live_ms,
        cpu_ns_per_byte: run.cpu_s_per_gb_until_keys_back,
        commits_ms,
        partitions: run.partitions.len(),
        death_proven: run.death_proven(),
    })
}

/// The local cluster a measured run used, as a scenario on this machine's cores.
fn local_scenario(m: &Measured, cores: f64) -> Scenario {
    Scenario {
        servers: m.servers,
        crashed: 1,
        master_bytes: (m.data_mb * 1e6) as u64,
        entry_bytes: rampart_common::log::object_entry_bytes(11, m.object_bytes as usize) as u64,
        replicas: m.replicas,
        recovery_masters_max: m.recovery_masters_max,
        death_proven: m.death_proven,
        host: Host::Shared { cores },
        seed: 1,
        ..Scenario::cluster(m.servers, 1.0)
    }
}

fn this_machines_cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// Fits the costs to measured runs.
fn calibrate(args: &ScaleArgs) -> Result<ExitCode> {
    let runs: Vec<Measured> = args
        .calibrate
        .iter()
        .map(|p| read_measured(p))
        .collect::<Result<_>>()?;
    let detection: Vec<f64> = runs.iter().map(|m| m.detection_ms).collect();
    let cpu: Vec<f64> = runs.iter().map(|m| m.cpu_ns_per_byte).collect();
    let commits: Vec<f64> = runs.iter().flat_map(|m| m.commits_ms.clone()).collect();
    let notice: Vec<f64> = runs
        .iter()
        .map(|m| m.unavailability_ms - m.last_live_ms)
        .collect();
    let per_backup_us = Costs::development_vm().setup_per_backup_us;
    let setup: Vec<f64> = runs
        .iter()
        .map(|m| m.setup_ms - m.detection_ms - per_backup_us * m.servers as f64 / 1e3)
        .collect();
    let replicas = runs.iter().map(|m| m.replicas).max().unwrap_or(3) as f64;
    let partitions = runs.iter().map(|m| m.partitions).max().unwrap_or(8).max(1);
    let split = time_split(partitions)?;
    let frame = time_frame_flush()?;
    let cpu_total = median(&cpu);
    let replay = (cpu_total - split - replicas * frame).max(split);
    let costs = Costs {
        detection_ms: median(&detection),
        setup_ms: median(&setup).max(0.0),
        setup_per_backup_us: per_backup_us,
        replay_ns_per_byte: replay,
        split_ns_per_byte: split,
        frame_ns_per_byte: frame,
        commit_ms: median(&commits).max(0.0),
        notice_ms: median(&notice).max(0.0),
        source: format!(
            "calibrated from {} bench recovery run(s): {}",
            runs.len(),
            runs.iter()
                .map(|m| m.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    costs.check().map_err(anyhow::Error::msg)?;
    println!(
        "cluster CPU while recovering {cpu_total:.2} ns per byte (median of {} runs): split {split:.2} (timed here), frame {frame:.2} per replica (timed here) × R = {replicas}, so replay {replay:.2}",
        runs.len()
    );
    println!("{}", serde_json::to_string_pretty(&costs)?);
    let check = check(&args.calibrate, &costs, this_machines_cores())?;
    if let Some(path) = &args.json {
        write_json(path, &CalibrationFigures { costs, check })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Simulates each measured run on `cores` shared cores and prints both.
fn check(paths: &[PathBuf], costs: &Costs, cores: f64) -> Result<Vec<CheckRow>> {
    println!("local runs simulated on {cores} shared cores beside what they measured:");
    println!(
        "  servers  R  MB  recovery masters  measured ms  simulated ms  simulated/measured  run"
    );
    let mut rows = Vec::new();
    for path in paths {
        let m = read_measured(path)?;
        let scenario = local_scenario(&m, cores);
        let o = scale::simulate(&scenario, costs).map_err(anyhow::Error::msg)?;
        let ratio = o.unavailability_ms / m.unavailability_ms.max(1.0);
        println!(
            "  {:>7}  {}  {:>4.0}  {:>16}  {:>11.0}  {:>12.0}  {:>18.2}  {}",
            m.servers,
            m.replicas,
            m.data_mb,
            if m.recovery_masters_max == 0 {
                "all".to_string()
            } else {
                m.recovery_masters_max.to_string()
            },
            m.unavailability_ms,
            o.unavailability_ms,
            ratio,
            m.path.display()
        );
        rows.push(CheckRow {
            run: m.path.display().to_string(),
            servers: m.servers,
            replicas: m.replicas,
            data_mb: m.data_mb,
            recovery_masters_max: m.recovery_masters_max,
            measured_unavailability_ms: m.unavailability_ms,
            simulated_unavailability_ms: o.unavailability_ms,
            ratio,
        });
    }
    Ok(rows)
}

/// ns per byte for the backups' split (the real `split_replica`) of a full segment of
/// 1 KiB objects into `partitions` partitions, on one core: the median of 9 splits.
fn time_split(partitions: usize) -> Result<f64> {
    use rampart_backup::recovery_reads::{split_replica, PartitionIndex};
    use rampart_common::ids::{Epoch, SegmentId, ServerId, TableId, Version};
    use rampart_common::log::SegmentWriter;
    use rampart_common::protocol::backup::ReplicaInfo;
    use rampart_common::tablet::HashRange;

    let capacity = 8u32 << 20;
    let (master, table) = (ServerId(1), TableId(1));
    let mut writer = SegmentWriter::open(master, SegmentId(1), capacity, &[SegmentId(1)])
        .map_err(|_| anyhow::anyhow!("a segment of {capacity} bytes holds no header"))?;
    let value = vec![7u8; 1024];
    for i in 0u64.. {
        let key = format!("k{i:010}");
        if writer
            .append_object(table, Version(i + 1), key.as_bytes(), &value)
            .is_err()
        {
            break;
        }
        if i % 16 == 15 {
            writer.seal_batch();
        }
    }
    let length = writer.close(SegmentId(2));
    let bytes = writer.into_buffer();
    let info = ReplicaInfo {
        master,
        segment: SegmentId(1),
        epoch: Epoch(1),
        length,
        closed: true,
    };
    let width = u64::MAX / partitions as u64;
    let ranges: Vec<Vec<HashRange>> = (0..partitions as u64)
        .map(|p| {
            let end = if p + 1 == partitions as u64 {
                u64::MAX
            } else {
                (p + 1) * width - 1
            };
            vec![HashRange::new(table, p * width, end)]
        })
        .collect();
    let index = PartitionIndex::new(&ranges).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut times = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        let split = split_replica(&bytes, &info, &index).map_err(|e| anyhow::anyhow!("{e}"))?;
        times.push(started.elapsed().as_nanos() as f64 / length as f64);
        std::hint::black_box(split);
    }
    Ok(least(&times))
}

/// ns per byte for a backup taking a replicated segment into a frame (a copy into
/// touched memory) and flushing it to a file in the temporary directory (a buffered
/// write, as the backups' flush does before its `fdatasync`): the least of 9 segments.
fn time_frame_flush() -> Result<f64> {
    use std::io::{Seek, Write};
    let segment = vec![3u8; 8 << 20];
    let mut frame = vec![0u8; 8 << 20];
    let path = std::env::temp_dir().join(format!("rampart-calibrate-{}", std::process::id()));
    let mut file = std::fs::File::create(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let mut times = Vec::new();
    let timed = (0..9).try_for_each(|_| -> std::io::Result<()> {
        file.rewind()?;
        let started = Instant::now();
        frame.copy_from_slice(&segment);
        file.write_all(&frame)?;
        times.push(started.elapsed().as_nanos() as f64 / segment.len() as f64);
        Ok(())
    });
    let _ = std::fs::remove_file(&path);
    timed.with_context(|| format!("cannot write {}", path.display()))?;
    Ok(least(&times))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_runs_from_ten_to_the_cluster() {
        assert_eq!(curve_points(1000), vec![10, 20, 50, 100, 200, 500, 1000]);
        assert_eq!(curve_points(60), vec![10, 20, 50, 60]);
        assert_eq!(curve_points(10), vec![10]);
    }
}
