//! What the run measured, summarised: medians over rounds per mode and workload, the
//! shm/rpc ratios against their targets, the whole-run backup CPU; printed as tables
//! and written as JSON.

use hdrhistogram::Histogram;
use rampart_common::onesided::TransportKind;
use rampart_server::BACKUP_THREAD_NAME;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::conditions::{loadavg, Conditions};
use super::figures::{cpu_s_per_million, fmt_opt, us};
use super::windows::{Measurement, WholeRun, WORKLOADS};
use crate::bench::ycsb::Workload;
use crate::stats::median;

/// Target: shm's throughput over rpc's, at least.
pub(super) const THROUGHPUT_RATIO_MIN: f64 = 1.5;
/// Target: shm's write p50 over rpc's, at most.
pub(super) const WRITE_P50_RATIO_MAX: f64 = 0.6;
/// Target: shm's backup CPU per replicated write over rpc's, at most.
pub(super) const BACKUP_CPU_RATIO_MAX: f64 = 0.05;

/// Medians over rounds of one workload on one mode.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Summary {
    throughput_ops_s: Option<f64>,
    write_p50_us: Option<f64>,
    write_p99_us: Option<f64>,
    read_p50_us: Option<f64>,
    read_p99_us: Option<f64>,
    /// From `utime + stime`.
    backup_cpu_s_per_million_writes: Option<f64>,
    /// From schedstat.
    backup_cpu_s_per_million_writes_schedstat: Option<f64>,
    /// From `utime + stime`, pooled: all windows' CPU over all their replicated writes.
    /// Steadier than the median where the cost comes in lumps (a segment's close and
    /// flush lands in one window or the next).
    backup_cpu_s_per_million_writes_pooled: Option<f64>,
    writes: u64,
    errors: u64,
}

/// shm against rpc.
#[derive(Debug, Clone, Copy)]
struct Ratios {
    throughput: Option<f64>,
    write_p50: Option<f64>,
    backup_cpu: Option<f64>,
    backup_cpu_schedstat: Option<f64>,
    backup_cpu_pooled: Option<f64>,
}

impl Ratios {
    fn of(shm: &Summary, rpc: &Summary) -> Ratios {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        Ratios {
            throughput: ratio(shm.throughput_ops_s, rpc.throughput_ops_s),
            write_p50: ratio(shm.write_p50_us, rpc.write_p50_us),
            backup_cpu: ratio(
                shm.backup_cpu_s_per_million_writes,
                rpc.backup_cpu_s_per_million_writes,
            ),
            backup_cpu_schedstat: ratio(
                shm.backup_cpu_s_per_million_writes_schedstat,
                rpc.backup_cpu_s_per_million_writes_schedstat,
            ),
            backup_cpu_pooled: ratio(
                shm.backup_cpu_s_per_million_writes_pooled,
                rpc.backup_cpu_s_per_million_writes_pooled,
            ),
        }
    }

    fn throughput_pass(&self) -> Option<bool> {
        self.throughput.map(|r| r >= THROUGHPUT_RATIO_MIN)
    }

    fn write_p50_pass(&self) -> Option<bool> {
        self.write_p50.map(|r| r <= WRITE_P50_RATIO_MAX)
    }

    fn backup_cpu_pass(&self) -> Option<bool> {
        self.backup_cpu.map(|r| r <= BACKUP_CPU_RATIO_MAX)
    }
}

fn verdict(pass: Option<bool>) -> &'static str {
    match pass {
        Some(true) => "PASS",
        Some(false) => "MISS",
        None => "n/a",
    }
}

/// Everything the run measured.
pub(super) struct Report {
    pub(super) conditions: Conditions,
    pub(super) modes: Vec<TransportKind>,
    pub(super) measurements: Vec<Measurement>,
    pub(super) whole_run: Vec<WholeRun>,
}

impl Report {
    pub(super) fn errors(&self) -> u64 {
        self.measurements.iter().map(|m| m.errors).sum()
    }

    fn schedstat(&self) -> bool {
        self.whole_run.iter().all(|w| w.schedstat)
    }

    fn summary(&self, workload: Workload, mode: TransportKind) -> Summary {
        let windows: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(|m| m.workload == workload && m.mode == mode)
            .collect();
        let of = |f: &dyn Fn(&Measurement) -> Option<f64>| {
            median(windows.iter().filter_map(|m| f(m)).collect())
        };
        let nonempty = |h: &Histogram<u64>| !h.is_empty();
        let tck = self.conditions.clk_tck as f64;
        let replicas = self.conditions.replicas;
        let schedstat = self.schedstat();
        Summary {
            throughput_ops_s: of(&|m| Some(m.throughput())),
            write_p50_us: of(&|m| nonempty(&m.updates).then(|| us(&m.updates, 0.5))),
            write_p99_us: of(&|m| nonempty(&m.updates).then(|| us(&m.updates, 0.99))),
            read_p50_us: of(&|m| nonempty(&m.reads).then(|| us(&m.reads, 0.5))),
            read_p99_us: of(&|m| nonempty(&m.reads).then(|| us(&m.reads, 0.99))),
            backup_cpu_s_per_million_writes: of(&|m| {
                cpu_s_per_million(m.backup.ticks as f64 / tck, m.updates.len(), replicas)
            }),
            backup_cpu_s_per_million_writes_schedstat: of(&|m| {
                schedstat
                    .then(|| cpu_s_per_million(m.backup.ns as f64 / 1e9, m.updates.len(), replicas))
                    .flatten()
            }),
            backup_cpu_s_per_million_writes_pooled: cpu_s_per_million(
                windows.iter().map(|m| m.backup.ticks).sum::<u64>() as f64 / tck,
                windows.iter().map(|m| m.updates.len()).sum(),
                replicas,
            ),
            writes: windows.iter().map(|m| m.updates.len()).sum(),
            errors: windows.iter().map(|m| m.errors).sum(),
        }
    }

    fn ratios(&self, workload: Workload) -> Option<Ratios> {
        let has = |mode| self.modes.contains(&mode);
        (has(TransportKind::Shm) && has(TransportKind::Rpc)).then(|| {
            Ratios::of(
                &self.summary(workload, TransportKind::Shm),
                &self.summary(workload, TransportKind::Rpc),
            )
        })
    }

    pub(super) fn print(&self) {
        println!();
        println!("{}", self.conditions.line(&self.modes));
        println!(
            "figures: medians over {} rounds; backup CPU = utime+stime of the servers' \
             `{BACKUP_THREAD_NAME}` threads per million replicated writes (acknowledged \
             writes × R){}; `pooled` is all windows' backup CPU over all their writes",
            self.conditions.rounds,
            if self.schedstat() {
                "; `sched` is the same from schedstat (ns run time)"
            } else {
                ""
            }
        );
        println!(
            "note: for rpc the WriteReplica frame is read and decoded on a master-runtime \
             thread, so rpc's backup CPU is under-counted and the shm/rpc CPU ratio is \
             conservative"
        );
        for workload in WORKLOADS {
            println!();
            println!("workload {}:", workload.name());
            println!(
                "{:<5} {:>10} {:>11} {:>11} {:>10} {:>11} {:>10} {:>11} {:>9} {:>6}",
                "mode",
                "ops/s",
                "write p50µs",
                "write p99µs",
                "read p50µs",
                "bk CPU s/M",
                "sched s/M",
                "pooled s/M",
                "writes",
                "errors"
            );
            for mode in &self.modes {
                let s = self.summary(workload, *mode);
                println!(
                    "{:<5} {:>10} {:>11} {:>11} {:>10} {:>11} {:>10} {:>11} {:>9} {:>6}",
                    mode.name(),
                    fmt_opt(s.throughput_ops_s, 0),
                    fmt_opt(s.write_p50_us, 1),
                    fmt_opt(s.write_p99_us, 1),
                    fmt_opt(s.read_p50_us, 1),
                    fmt_opt(s.backup_cpu_s_per_million_writes, 3),
                    fmt_opt(s.backup_cpu_s_per_million_writes_schedstat, 3),
                    fmt_opt(s.backup_cpu_s_per_million_writes_pooled, 3),
                    s.writes,
                    s.errors
                );
            }
            if let Some(r) = self.ratios(workload) {
                println!(
                    "shm/rpc: throughput {}× (target ≥ {THROUGHPUT_RATIO_MIN}) {}; write p50 \
                     {}× (target ≤ {WRITE_P50_RATIO_MAX}) {}; backup CPU per write {}× \
                     (target ≤ {BACKUP_CPU_RATIO_MAX}) {}{}; pooled {}×",
                    fmt_opt(r.throughput, 2),
                    verdict(r.throughput_pass()),
                    fmt_opt(r.write_p50, 2),
                    verdict(r.write_p50_pass()),
                    fmt_opt(r.backup_cpu, 4),
                    verdict(r.backup_cpu_pass()),
                    r.backup_cpu_schedstat
                        .map(|x| format!(" (sched {x:.4}×)"))
                        .unwrap_or_default(),
                    fmt_opt(r.backup_cpu_pooled, 4),
                );
            }
        }
        println!();
        println!(
            "whole run (end of load to end of run, warm-ups, async closes and idle time \
             included):"
        );
        for w in &self.whole_run {
            let (ticks, sched) = self.whole_run_figures(w);
            println!(
                "{:<5} backup CPU {:.2} s ({} ticks) over {} writes: {} s/M replicated writes{}",
                w.mode.name(),
                w.backup.ticks as f64 / self.conditions.clk_tck as f64,
                w.backup.ticks,
                w.writes,
                fmt_opt(ticks, 3),
                sched
                    .map(|s| format!(" (sched {s:.3})"))
                    .unwrap_or_default()
            );
        }
        println!("loadavg at the end: {}", loadavg());
    }

    fn whole_run_figures(&self, w: &WholeRun) -> (Option<f64>, Option<f64>) {
        let replicas = self.conditions.replicas;
        let ticks = cpu_s_per_million(
            w.backup.ticks as f64 / self.conditions.clk_tck as f64,
            w.writes,
            replicas,
        );
        let sched = w
            .schedstat
            .then(|| cpu_s_per_million(w.backup.ns as f64 / 1e9, w.writes, replicas))
            .flatten();
        (ticks, sched)
    }

    /// The figures as `--json FILE` holds them.
    pub(super) fn figures(&self) -> ReplicationFigures {
        let c = &self.conditions;
        let by_mode = |workload: Workload| -> BTreeMap<String, ModeFigures> {
            self.modes
                .iter()
                .map(|mode| {
                    let rounds = self
                        .measurements
                        .iter()
                        .filter(|m| m.workload == workload && m.mode == *mode)
                        .map(|m| RoundFigures {
                            round: m.round + 1,
                            throughput_ops_s: m.throughput(),
                            elapsed_s: m.elapsed_s,
                            writes: m.updates.len(),
                            reads: m.reads.len(),
                            write_p50_us: us(&m.updates, 0.5),
                            write_p99_us: us(&m.updates, 0.99),
                            backup_cpu_ticks: m.backup.ticks,
                            backup_cpu_sched_ns: m.backup.ns,
                            errors: m.errors,
                            first_error: m.first_error.clone(),
                        })
                        .collect();
                    let figures = ModeFigures {
                        summary: self.summary(workload, *mode),
                        rounds,
                    };
                    (mode.name().to_string(), figures)
                })
                .collect()
        };
        let ratios = |workload: Workload| {
            self.ratios(workload).map(|r| RatioFigures {
                throughput: r.throughput,
                throughput_target_min: THROUGHPUT_RATIO_MIN,
                throughput_pass: r.throughput_pass(),
                write_p50: r.write_p50,
                write_p50_target_max: WRITE_P50_RATIO_MAX,
                write_p50_pass: r.write_p50_pass(),
                backup_cpu: r.backup_cpu,
                backup_cpu_schedstat: r.backup_cpu_schedstat,
                backup_cpu_pooled: r.backup_cpu_pooled,
                backup_cpu_target_max: BACKUP_CPU_RATIO_MAX,
                backup_cpu_pass: r.backup_cpu_pass(),
            })
        };
        let whole_run = self
            .whole_run
            .iter()
            .map(|w| {
                let (ticks, sched) = self.whole_run_figures(w);
                let figures = WholeRunFigures {
                    backup_cpu_ticks: w.backup.ticks,
                    backup_cpu_sched_ns: w.backup.ns,
                    writes: w.writes,
                    backup_cpu_s_per_million_writes: ticks,
                    backup_cpu_s_per_million_writes_schedstat: sched,
                };
                (w.mode.name().to_string(), figures)
            })
            .collect();
        ReplicationFigures {
            conditions: ConditionFigures {
                servers: c.servers,
                replicas: c.replicas,
                clients: c.clients,
                client_threads: 1,
                value_bytes: c.value_bytes,
                records: c.records,
                zipf: c.zipf,
                rounds: c.rounds,
                seconds_per_round: c.seconds_per_round,
                ops_per_round: c.ops_per_round,
                memory_per_server: c.memory.clone(),
                seed: c.seed,
                clk_tck: c.clk_tck,
                cores: c.cores,
                loadavg_start: c.loadavg_start.clone(),
                loadavg_end: loadavg(),
                figures: "medians over rounds".to_string(),
                note: "rpc's backup CPU is under-counted (its frame is decoded on a \
                       master-runtime thread), so the shm/rpc CPU ratio is conservative"
                    .to_string(),
            },
            modes: by_mode(Workload::WriteOnly),
            ycsb_a: by_mode(Workload::A),
            ratios_shm_over_rpc: RatiosByWorkload {
                write_only: ratios(Workload::WriteOnly),
                ycsb_a: ratios(Workload::A),
            },
            whole_run,
        }
    }
}

/// What `--json FILE` holds: the conditions, per workload and mode the medians over
/// rounds and each round, shm against rpc, and the whole run's backup CPU per mode.
/// Modes are keyed by name (`shm`, `tcp`, `rpc`, `rdma`).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ReplicationFigures {
    conditions: ConditionFigures,
    /// The write-only workload.
    modes: BTreeMap<String, ModeFigures>,
    /// YCSB A.
    ycsb_a: BTreeMap<String, ModeFigures>,
    ratios_shm_over_rpc: RatiosByWorkload,
    whole_run: BTreeMap<String, WholeRunFigures>,
}

/// [`Conditions`], with the load at the end.
#[derive(Debug, Serialize, Deserialize)]
struct ConditionFigures {
    servers: u32,
    replicas: u32,
    clients: u32,
    client_threads: u32,
    value_bytes: usize,
    records: u64,
    zipf: f64,
    rounds: u32,
    /// None (null) with `--ops-per-round`.
    seconds_per_round: Option<f64>,
    ops_per_round: Option<u64>,
    memory_per_server: String,
    seed: u64,
    clk_tck: u64,
    cores: usize,
    loadavg_start: String,
    loadavg_end: String,
    /// What the figures are.
    figures: String,
    note: String,
}

/// One workload on one mode: the medians over rounds, and each round.
#[derive(Debug, Serialize, Deserialize)]
struct ModeFigures {
    #[serde(flatten)]
    summary: Summary,
    rounds: Vec<RoundFigures>,
}

/// One round's window of one workload on one mode.
#[derive(Debug, Serialize, Deserialize)]
struct RoundFigures {
    /// From 1.
    round: u32,
    throughput_ops_s: f64,
    elapsed_s: f64,
    writes: u64,
    reads: u64,
    write_p50_us: f64,
    write_p99_us: f64,
    backup_cpu_ticks: u64,
    backup_cpu_sched_ns: u64,
    errors: u64,
    first_error: Option<String>,
}

/// shm against rpc, per workload; none (null) unless both ran.
#[derive(Debug, Serialize, Deserialize)]
struct RatiosByWorkload {
    write_only: Option<RatioFigures>,
    ycsb_a: Option<RatioFigures>,
}

/// [`Ratios`] beside their targets.
#[derive(Debug, Serialize, Deserialize)]
struct RatioFigures {
    throughput: Option<f64>,
    throughput_target_min: f64,
    throughput_pass: Option<bool>,
    write_p50: Option<f64>,
    write_p50_target_max: f64,
    write_p50_pass: Option<bool>,
    backup_cpu: Option<f64>,
    backup_cpu_schedstat: Option<f64>,
    backup_cpu_pooled: Option<f64>,
    backup_cpu_target_max: f64,
    backup_cpu_pass: Option<bool>,
}

/// One mode's backup CPU from the end of its load to the end of the run.
#[derive(Debug, Serialize, Deserialize)]
struct WholeRunFigures {
    backup_cpu_ticks: u64,
    backup_cpu_sched_ns: u64,
    writes: u64,
    backup_cpu_s_per_million_writes: Option<f64>,
    backup_cpu_s_per_million_writes_schedstat: Option<f64>,
}
