//! `rampart bench replication`: what one-sided replication saves, transport against
//! transport, on a symmetric cluster.
//!
//! For each transport named by `--mode` (`shm`, `tcp`, `rpc`; `rdma` where built) the
//! benchmark starts its own local cluster of `--servers` storage servers, each both a
//! master and a backup (symmetric, as in the Tailwind paper's evaluation), every segment kept on
//! `--replicas` backups over that transport (`rampart server --replication MODE`). Each
//! cluster gets a table of one tablet per master, loaded with `--records` objects. Then
//! the measured *windows* run: YCSB write-only (100% updates) and YCSB-A (50% read, 50%
//! update), Zipfian keys, `--clients` closed-loop clients. The windows alternate between
//! the modes' clusters, round after round (the order rotating), so that on a noisy
//! shared machine every mode sees the same conditions and the ratios between modes are
//! measured side by side. Figures are the medians over `--rounds` rounds.
//!
//! Per mode and workload it reports throughput, update (write) latency p50/p99, and the
//! CPU seconds the *backup side* spends per million replicated writes — the figure
//! one-sided writes exist to shrink.
//!
//! # How backup CPU is measured
//! Every server runs its backup (RPC handlers, the `tcp` soft-NIC, flushes to disk) on a
//! runtime whose threads are named [`BACKUP_THREAD_NAME`] (see `rampart_server::storage_service`). The
//! benchmark sums `utime + stime` (fields 14 and 15 of `/proc/PID/task/TID/stat`, in
//! `sysconf(_SC_CLK_TCK)` ticks) over those threads of the cluster's servers, sampled
//! just before and just after each window, and divides by the replicated writes of the
//! window (acknowledged updates × R). Tick accounting is coarse (10 ms at 100 Hz, and
//! charged to whichever thread runs at the tick), so the exact scheduler run time
//! (`/proc/PID/task/TID/schedstat`, nanoseconds) is reported beside it where the kernel
//! offers it. A [`CpuSampler`] thread also samples every [`CPU_SAMPLE_INTERVAL`], so a
//! thread that exits (tokio retires idle blocking threads) is never lost. A segment's
//! close and flush is a lump of backup CPU that lands in one window or the next, so the
//! figure pooled over all windows (their CPU over their writes) is reported beside the
//! median.
//!
//! Caveat: for `rpc` the `WriteReplica` frame is read and decoded on the connection's
//! thread (a master-runtime thread of the backup's server) before the handler moves to
//! the backup runtime, so rpc's backup CPU is under-counted and the shm/rpc CPU ratio is
//! conservative (it flatters rpc). Segment closes that finish after a window ends are
//! charged to the cluster's next window; the whole-run figure (every sample from the end
//! of the load to the end of the run, over every write including warm-ups) counts them,
//! and also what a backup spends while its cluster waits for the other modes' windows:
//! masters probe quiet backups (`ListReplicas`), and a probe costs the backup a scan of
//! each open frame of that master.
//!
//! # Targets
//! On the 2-core development machine, `shm` against `rpc` in the same run: throughput
//! ≥ [`THROUGHPUT_RATIO_MIN`]×, write p50 ≤ [`WRITE_P50_RATIO_MAX`]×, backup CPU per
//! write ≤ [`BACKUP_CPU_RATIO_MAX`]×. Back of the envelope: an rpc replica write costs
//! the backup a batch's receive, decode, copy and reply — some µs of CPU per write once
//! the batch's writes share it — while an shm one costs it nothing but its share of each
//! segment's open, close and flush (an 8 MiB segment holds ≈ 60 000 100-byte objects, so
//! ≈ 0.1–0.2 s per million); the master waits for R round trips in parallel under rpc,
//! for R memcpys under shm. The benchmark reports PASS or MISS; it never fails on a
//! target (STYLE.md habit 13), only on errors.
//!
//! Measured (2 cores, defaults: 4 servers, R = 3, 16 clients, 100-byte values, 3 rounds
//! of 3 s; two runs): write-only, shm/rpc throughput 2.9× and 3.5×, write p50 0.32× and
//! 0.30×, backup CPU per write 0.030× and 0.024× (shm ≈ 0.13 s, rpc ≈ 5 s, tcp ≈ 9.5 s
//! per million replicated writes). YCSB-A halves the writes per window, so the lumps of
//! segment closes weigh more: CPU ratio 0.072× and 0.036×.
//!
//! # Output
//! A table per workload, the shm/rpc ratios with PASS/MISS, and with `--json FILE`:
//! `{"conditions": {...}, "modes": {"shm": {"throughput_ops_s", "write_p50_us",
//! "write_p99_us", "backup_cpu_s_per_million_writes", ...}, ...}, "ycsb_a": {...},
//! "ratios_shm_over_rpc": {...}, "whole_run": {...}}`; `modes` holds the write-only
//! figures.

use super::median;
use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use rampart_client::{Client, ClientOptions, TableId};
use rampart_common::onesided::TransportKind;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ycsb::{histogram, key, load, KeyChooser, RemoveOnDrop, Workload};
use crate::cluster::{self, LocalCluster, UpArgs};
use rampart_server::BACKUP_THREAD_NAME;

/// Target: shm's throughput over rpc's, at least.
pub const THROUGHPUT_RATIO_MIN: f64 = 1.5;
/// Target: shm's write p50 over rpc's, at most.
pub const WRITE_P50_RATIO_MAX: f64 = 0.6;
/// Target: shm's backup CPU per replicated write over rpc's, at most.
pub const BACKUP_CPU_RATIO_MAX: f64 = 0.05;

/// How often the [`CpuSampler`] reads the backup threads' CPU. Well below tokio's
/// 10 s keep-alive of idle blocking threads, so a backup thread that exits was sampled
/// after its last work.
pub const CPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// Unmeasured load before each window, so a cluster that sat idle while the others
/// were measured has its connections and caches warm again.
pub const WARMUP: Duration = Duration::from_millis(250);

/// After the last window, how long background closes get to finish before the last
/// whole-run sample.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Deadline of one client operation: long enough that a stall shows as latency, not as
/// an error.
pub const OPERATION_DEADLINE: Duration = Duration::from_secs(30);

/// The workloads, in the order each round measures them.
const WORKLOADS: [Workload; 2] = [Workload::WriteOnly, Workload::A];

/// `rampart bench replication`
#[derive(Args, Debug, Clone)]
pub struct ReplicationArgs {
    /// Replication transports to compare, comma-separated (shm, tcp, rpc, rdma); one
    /// cluster each, measured alternately.
    #[arg(long, default_value = "shm,tcp,rpc")]
    pub mode: String,
    /// Storage servers per cluster (each a master and a backup).
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Backup replicas of every segment (R); at most servers − 1.
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Closed-loop clients (tokio tasks on one thread, each with its own connections).
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Objects loaded into each cluster before the windows.
    #[arg(long, default_value_t = 50_000)]
    pub records: u64,
    /// Length of each measured window, seconds (ignored with --ops-per-round).
    #[arg(long, default_value_t = 3.0)]
    pub seconds_per_round: f64,
    /// Operations per measured window (all clients together), instead of a duration.
    #[arg(long)]
    pub ops_per_round: Option<u64>,
    /// Rounds; each measures every workload on every mode once.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// DRAM per server for its log.
    #[arg(long, default_value = "512MiB")]
    pub memory: String,
    /// Zipfian skew (YCSB's default 0.99; 0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Seed of the key and operation choices (printed; reuse to replay the choices).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// When a window's clients stop.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// Each client stops issuing at this instant.
    At(Instant),
    /// Each client issues this many operations.
    Ops(u64),
}

/// Runs the benchmark.
pub fn run(args: ReplicationArgs) -> Result<ExitCode> {
    crate::init_logging("warn");
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
        std::fs::write(path, serde_json::to_string_pretty(&report.json())?)
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

/// Parses `--mode`: distinct transport names, comma-separated.
fn parse_modes(list: &str) -> Result<Vec<TransportKind>> {
    let mut modes = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mode: TransportKind = name.parse()?;
        if modes.contains(&mode) {
            bail!("--mode names {mode} twice");
        }
        modes.push(mode);
    }
    if modes.is_empty() {
        bail!("--mode needs at least one transport");
    }
    Ok(modes)
}

/// `sysconf(_SC_CLK_TCK)`: the unit of `/proc/.../stat` CPU times.
fn clock_ticks_per_second() -> Result<u64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| anyhow!("sysconf(_SC_CLK_TCK) failed"))
}

/// One mode's local cluster and the pids of its servers.
struct ModeCluster {
    mode: TransportKind,
    /// The processes; dropping it stops them.
    cluster: LocalCluster,
    /// The storage servers' pids, whose backup threads are measured.
    pids: Vec<u32>,
    /// The frame files the servers should remove when they stop.
    frame_files: Vec<PathBuf>,
}

impl ModeCluster {
    fn start(args: &ReplicationArgs, mode: TransportKind, root: &Path) -> Result<ModeCluster> {
        let data_dir = root.join(mode.name());
        let up = UpArgs {
            memory: args.memory.clone(),
            replicas: Some(args.replicas),
            replication: Some(mode.name().to_string()),
            // The data path is measured; one coordinator (the default here) leaves the
            // cores to it.
            ..UpArgs::private(data_dir.clone(), args.servers)
        };
        let cluster = cluster::start(&up, false)?;
        let pids = server_pids(&data_dir, args.servers)?;
        let frame_files = (1..=args.servers)
            .map(|i| {
                rampart_common::onesided::shm::default_frame_file(
                    &data_dir.join(format!("server-{i}")),
                )
            })
            .collect();
        Ok(ModeCluster {
            mode,
            cluster,
            pids,
            frame_files,
        })
    }

    /// Stops the servers and reports (and removes) frame files they left behind.
    fn stop(mut self) {
        self.cluster.children.stop_all();
        for file in &self.frame_files {
            if file.exists() {
                eprintln!(
                    "warning: {} cluster: a server left its frame file {} behind; removing it",
                    self.mode,
                    file.display()
                );
                let _ = std::fs::remove_file(file);
            }
        }
    }
}

/// The clusters' processes that exited, named with their status.
fn reap_exited(clusters: &mut [ModeCluster]) -> Vec<String> {
    clusters
        .iter_mut()
        .flat_map(|c| {
            let mode = c.mode;
            c.cluster
                .children
                .reap()
                .into_iter()
                .map(move |(name, status)| format!("{mode} {name} ({status})"))
        })
        .collect()
}

/// The pids of this process's `rampart server` children whose data directory lies under
/// `data_dir`; exactly `expected` of them.
fn server_pids(data_dir: &Path, expected: u32) -> Result<Vec<u32>> {
    let me = std::process::id();
    let prefix = data_dir.display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if stat_field(&stat, 4).and_then(|p| p.parse::<u32>().ok()) != Some(me) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_server = argv.get(1) == Some(&b"server".as_slice());
        let in_dir = argv
            .windows(2)
            .any(|w| w[0] == b"--data-dir" && w[1].starts_with(prefix.as_bytes()));
        if is_server && in_dir {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    if pids.len() != expected as usize {
        bail!(
            "found {} server processes under {prefix}, expected {expected}",
            pids.len()
        );
    }
    Ok(pids)
}

/// Field `n` (1-based, as proc(5) numbers them) of a `/proc/PID/stat` line. The command
/// name (field 2) may hold spaces and parentheses, so fields from 3 on are counted after
/// the last `)`.
fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let close = stat.rfind(')')?;
    match n {
        0 => None,
        1 => stat.split_whitespace().next(),
        2 => Some(&stat[stat.find('(')? + 1..close]),
        _ => stat[close + 1..].split_whitespace().nth(n - 3),
    }
}

/// `utime + stime` (fields 14 and 15) of a `/proc/.../stat` line, in clock ticks.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let utime: u64 = stat_field(stat, 14)?.parse().ok()?;
    let stime: u64 = stat_field(stat, 15)?.parse().ok()?;
    Some(utime + stime)
}

/// Time on CPU (the first field of `/proc/.../schedstat`), in nanoseconds.
fn schedstat_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// CPU used, in both units the kernel offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cpu {
    /// `utime + stime`, clock ticks.
    ticks: u64,
    /// Scheduler run time, nanoseconds (0 where schedstat is missing).
    ns: u64,
}

impl Cpu {
    fn plus(self, other: Cpu) -> Cpu {
        Cpu {
            ticks: self.ticks + other.ticks,
            ns: self.ns + other.ns,
        }
    }

    /// `self − earlier`; saturating, as counters never go back.
    fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            ticks: self.ticks.saturating_sub(earlier.ticks),
            ns: self.ns.saturating_sub(earlier.ns),
        }
    }
}

/// One backup thread's CPU.
#[derive(Clone, Copy, Debug)]
struct ThreadCpu {
    /// At the meter's first sample, or 0 for a thread born later.
    base: Cpu,
    /// At the last sample that found the thread.
    last: Cpu,
}

/// The CPU spent by the backup threads of a set of processes since the meter started.
///
/// # Invariants
/// 1. `threads` holds exactly the backup threads found by the last sample.
/// 2. [`total`](Self::total) never decreases: a thread that vanished keeps the CPU it
///    had at its last sample, in `retired`.
#[derive(Debug)]
struct BackupCpuMeter {
    pids: Vec<u32>,
    /// Live backup threads, by (pid, tid).
    threads: HashMap<(u32, u32), ThreadCpu>,
    /// Threads of other names: their `comm` is read once only.
    others: HashSet<(u32, u32)>,
    /// CPU of backup threads that exited, up to their last sample.
    retired: Cpu,
    /// Whether every read of schedstat succeeded (else `Cpu::ns` is not reported).
    schedstat: bool,
    /// Whether the first sample was taken.
    started: bool,
}

impl BackupCpuMeter {
    fn new(pids: Vec<u32>) -> BackupCpuMeter {
        let mut meter = BackupCpuMeter {
            pids,
            threads: HashMap::new(),
            others: HashSet::new(),
            retired: Cpu::default(),
            schedstat: true,
            started: false,
        };
        meter.sample();
        meter
    }

    /// Reads every backup thread's CPU now.
    fn sample(&mut self) {
        let mut seen = HashSet::new();
        for &pid in &self.pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let Some(tid) = task
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                let id = (pid, tid);
                if self.others.contains(&id) {
                    seen.insert(id);
                    continue;
                }
                let dir = format!("/proc/{pid}/task/{tid}");
                if !self.threads.contains_key(&id) {
                    let Ok(comm) = std::fs::read_to_string(format!("{dir}/comm")) else {
                        continue;
                    };
                    if comm.trim_end() != BACKUP_THREAD_NAME {
                        self.others.insert(id);
                        seen.insert(id);
                        continue;
                    }
                }
                let Some(ticks) = std::fs::read_to_string(format!("{dir}/stat"))
                    .ok()
                    .and_then(|s| stat_cpu_ticks(&s))
                else {
                    continue;
                };
                let ns = std::fs::read_to_string(format!("{dir}/schedstat"))
                    .ok()
                    .and_then(|s| schedstat_ns(&s));
                self.schedstat &= ns.is_some();
                let now = Cpu {
                    ticks,
                    ns: ns.unwrap_or(0),
                };
                let started = self.started;
                self.threads
                    .entry(id)
                    .and_modify(|t| t.last = now)
                    .or_insert(ThreadCpu {
                        base: if started { Cpu::default() } else { now },
                        last: now,
                    });
                seen.insert(id);
            }
        }
        let gone: Vec<(u32, u32)> = self
            .threads
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        for id in gone {
            if let Some(thread) = self.threads.remove(&id) {
                self.retired = self.retired.plus(thread.last.since(thread.base));
            }
        }
        self.others.retain(|id| seen.contains(id));
        self.started = true;
    }

    /// CPU since the meter started, up to the last sample.
    fn total(&self) -> Cpu {
        self.threads
            .values()
            .fold(self.retired, |sum, t| sum.plus(t.last.since(t.base)))
    }
}

/// Samples the meters every [`CPU_SAMPLE_INTERVAL`] on a thread of its own, until
/// dropped.
#[derive(Debug)]
struct CpuSampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CpuSampler {
    fn start(meters: Arc<Mutex<Vec<BackupCpuMeter>>>) -> Result<CpuSampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("cpu-sampler".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(CPU_SAMPLE_INTERVAL);
                    let Ok(mut meters) = meters.lock() else {
                        return;
                    };
                    meters.iter_mut().for_each(BackupCpuMeter::sample);
                }
            })
            .context("cannot start the CPU sampler thread")?;
        Ok(CpuSampler {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for CpuSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Samples meter `index` now and returns its total. The `/proc` reads block the
/// benchmark's thread for well under a millisecond, between windows only.
fn backup_cpu_now(meters: &Mutex<Vec<BackupCpuMeter>>, index: usize) -> Result<Cpu> {
    let mut meters = meters
        .lock()
        .map_err(|_| anyhow!("the CPU sampler panicked"))?;
    let meter = meters
        .get_mut(index)
        .ok_or_else(|| anyhow!("no CPU meter for mode #{index}"))?;
    meter.sample();
    Ok(meter.total())
}

/// Whether every meter could read schedstat.
fn schedstat_available(meters: &Mutex<Vec<BackupCpuMeter>>) -> bool {
    meters
        .lock()
        .map(|m| m.iter().all(|m| m.schedstat))
        .unwrap_or(false)
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
struct Measurement {
    mode: TransportKind,
    workload: Workload,
    round: u32,
    elapsed_s: f64,
    reads: Histogram<u64>,
    updates: Histogram<u64>,
    /// Backup-thread CPU over the window.
    backup: Cpu,
    errors: u64,
    first_error: Option<String>,
}

impl Measurement {
    fn ops(&self) -> u64 {
        self.reads.len() + self.updates.len()
    }

    fn throughput(&self) -> f64 {
        self.ops() as f64 / self.elapsed_s
    }
}

/// What the benchmark task hands back.
struct BenchOutcome {
    measurements: Vec<Measurement>,
    whole_run: Vec<WholeRun>,
}

/// One mode's backup CPU from the end of its load to the end of the run.
#[derive(Debug)]
struct WholeRun {
    mode: TransportKind,
    backup: Cpu,
    /// Acknowledged updates, warm-ups included.
    writes: u64,
    schedstat: bool,
}

async fn bench(
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

fn us(h: &Histogram<u64>, quantile: f64) -> f64 {
    h.value_at_quantile(quantile) as f64 / 1000.0
}

/// Seconds of CPU per million replicated writes (`writes × replicas`), or `None`
/// without writes.
fn cpu_s_per_million(seconds: f64, writes: u64, replicas: u32) -> Option<f64> {
    let replicated = writes * u64::from(replicas);
    (replicated > 0).then(|| seconds / replicated as f64 * 1e6)
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

fn fmt_opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "n/a".to_string(), |v| format!("{v:.decimals$}"))
}

/// What the figures were measured under.
#[derive(Debug)]
struct Conditions {
    servers: u32,
    replicas: u32,
    clients: u32,
    value_bytes: usize,
    records: u64,
    zipf: f64,
    rounds: u32,
    seconds_per_round: Option<f64>,
    ops_per_round: Option<u64>,
    memory: String,
    seed: u64,
    clk_tck: u64,
    cores: usize,
    loadavg_start: String,
}

impl Conditions {
    fn now(args: &ReplicationArgs, seed: u64, clk_tck: u64) -> Conditions {
        Conditions {
            servers: args.servers,
            replicas: args.replicas,
            clients: args.clients,
            value_bytes: args.value_bytes,
            records: args.records,
            zipf: args.zipf,
            rounds: args.rounds,
            seconds_per_round: args
                .ops_per_round
                .is_none()
                .then_some(args.seconds_per_round),
            ops_per_round: args.ops_per_round,
            memory: args.memory.clone(),
            seed,
            clk_tck,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadavg_start: loadavg(),
        }
    }

    fn line(&self, modes: &[TransportKind]) -> String {
        let window = match (self.ops_per_round, self.seconds_per_round) {
            (Some(ops), _) => format!("{ops} ops"),
            (None, Some(s)) => format!("{s} s"),
            (None, None) => "?".into(),
        };
        let modes: Vec<&str> = modes.iter().map(|m| m.name()).collect();
        format!(
            "replication bench: modes {}; {} servers (each master + backup), R = {}, {} \
             clients on one client thread, {}-byte values, {} records, zipf {}, {} rounds \
             of {window} per workload and mode, {} per server log, {} cores, CLK_TCK {}, \
             loadavg {}, seed {}",
            modes.join(","),
            self.servers,
            self.replicas,
            self.clients,
            self.value_bytes,
            self.records,
            self.zipf,
            self.rounds,
            self.memory,
            self.cores,
            self.clk_tck,
            self.loadavg_start,
            self.seed
        )
    }
}

/// The 1, 5 and 15 minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Medians over rounds of one workload on one mode.
#[derive(Debug, Clone, Copy, Default)]
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
struct Report {
    conditions: Conditions,
    modes: Vec<TransportKind>,
    measurements: Vec<Measurement>,
    whole_run: Vec<WholeRun>,
}

impl Report {
    fn errors(&self) -> u64 {
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

    fn print(&self) {
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

    fn json(&self) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let c = &self.conditions;
        let summaries = |workload: Workload| -> Value {
            let mut map = Map::new();
            for mode in &self.modes {
                let s = self.summary(workload, *mode);
                let rounds: Vec<Value> = self
                    .measurements
                    .iter()
                    .filter(|m| m.workload == workload && m.mode == *mode)
                    .map(|m| {
                        json!({
                            "round": m.round + 1,
                            "throughput_ops_s": m.throughput(),
                            "elapsed_s": m.elapsed_s,
                            "writes": m.updates.len(),
                            "reads": m.reads.len(),
                            "write_p50_us": us(&m.updates, 0.5),
                            "write_p99_us": us(&m.updates, 0.99),
                            "backup_cpu_ticks": m.backup.ticks,
                            "backup_cpu_sched_ns": m.backup.ns,
                            "errors": m.errors,
                            "first_error": m.first_error,
                        })
                    })
                    .collect();
                map.insert(
                    mode.name().to_string(),
                    json!({
                        "throughput_ops_s": s.throughput_ops_s,
                        "write_p50_us": s.write_p50_us,
                        "write_p99_us": s.write_p99_us,
                        "read_p50_us": s.read_p50_us,
                        "read_p99_us": s.read_p99_us,
                        "backup_cpu_s_per_million_writes": s.backup_cpu_s_per_million_writes,
                        "backup_cpu_s_per_million_writes_schedstat":
                            s.backup_cpu_s_per_million_writes_schedstat,
                        "backup_cpu_s_per_million_writes_pooled":
                            s.backup_cpu_s_per_million_writes_pooled,
                        "writes": s.writes,
                        "errors": s.errors,
                        "rounds": rounds,
                    }),
                );
            }
            Value::Object(map)
        };
        let ratios = |workload: Workload| -> Value {
            match self.ratios(workload) {
                None => Value::Null,
                Some(r) => json!({
                    "throughput": r.throughput,
                    "throughput_target_min": THROUGHPUT_RATIO_MIN,
                    "throughput_pass": r.throughput_pass(),
                    "write_p50": r.write_p50,
                    "write_p50_target_max": WRITE_P50_RATIO_MAX,
                    "write_p50_pass": r.write_p50_pass(),
                    "backup_cpu": r.backup_cpu,
                    "backup_cpu_schedstat": r.backup_cpu_schedstat,
                    "backup_cpu_pooled": r.backup_cpu_pooled,
                    "backup_cpu_target_max": BACKUP_CPU_RATIO_MAX,
                    "backup_cpu_pass": r.backup_cpu_pass(),
                }),
            }
        };
        let whole: Map<String, Value> = self
            .whole_run
            .iter()
            .map(|w| {
                let (ticks, sched) = self.whole_run_figures(w);
                (
                    w.mode.name().to_string(),
                    json!({
                        "backup_cpu_ticks": w.backup.ticks,
                        "backup_cpu_sched_ns": w.backup.ns,
                        "writes": w.writes,
                        "backup_cpu_s_per_million_writes": ticks,
                        "backup_cpu_s_per_million_writes_schedstat": sched,
                    }),
                )
            })
            .collect();
        json!({
            "conditions": {
                "servers": c.servers,
                "replicas": c.replicas,
                "clients": c.clients,
                "client_threads": 1,
                "value_bytes": c.value_bytes,
                "records": c.records,
                "zipf": c.zipf,
                "rounds": c.rounds,
                "seconds_per_round": c.seconds_per_round,
                "ops_per_round": c.ops_per_round,
                "memory_per_server": c.memory,
                "seed": c.seed,
                "clk_tck": c.clk_tck,
                "cores": c.cores,
                "loadavg_start": c.loadavg_start,
                "loadavg_end": loadavg(),
                "figures": "medians over rounds",
                "note": "rpc's backup CPU is under-counted (its frame is decoded on a \
                         master-runtime thread), so the shm/rpc CPU ratio is conservative",
            },
            "modes": summaries(Workload::WriteOnly),
            "ycsb_a": summaries(Workload::A),
            "ratios_shm_over_rpc": {
                "write_only": ratios(Workload::WriteOnly),
                "ycsb_a": ratios(Workload::A),
            },
            "whole_run": whole,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (rampart (x) y) S 1 4242 4242 0 -1 4194368 321 0 0 0 \
                        17 5 0 0 20 0 3 0 12345 1000 100 18446744073709551615";

    #[test]
    fn stat_field_counts_after_a_command_name_with_parentheses() {
        assert_eq!(stat_field(STAT, 1), Some("4242"));
        assert_eq!(stat_field(STAT, 2), Some("rampart (x) y"));
        assert_eq!(stat_field(STAT, 3), Some("S"));
        assert_eq!(stat_field(STAT, 4), Some("1"));
        assert_eq!(stat_cpu_ticks(STAT), Some(22));
    }

    #[test]
    fn schedstat_ns_reads_the_run_time() {
        assert_eq!(schedstat_ns("320009 43249 2\n"), Some(320_009));
        assert_eq!(schedstat_ns(""), None);
    }

    #[test]
    fn median_of_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn parse_modes_rejects_duplicates_and_unknown_names() {
        assert_eq!(
            parse_modes("shm, rpc").ok(),
            Some(vec![TransportKind::Shm, TransportKind::Rpc])
        );
        assert!(parse_modes("shm,shm").is_err());
        assert!(parse_modes("udp").is_err());
        assert!(parse_modes("").is_err());
    }

    #[test]
    fn backup_cpu_meter_keeps_the_cpu_of_a_backup_thread_that_exited() {
        let mut meter = BackupCpuMeter::new(vec![std::process::id()]);
        assert_eq!(meter.total(), Cpu::default());
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (worked_tx, worked_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(BACKUP_THREAD_NAME.into())
            .spawn(move || {
                let mut x = 0u64;
                for i in 0..5_000_000u64 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
                worked_tx.send(()).expect("the test waits");
                go_rx.recv().expect("the test sends");
                x
            })
            .expect("spawn");
        worked_rx.recv().expect("the thread sends");
        meter.sample();
        assert_eq!(meter.threads.len(), 1, "one backup-named thread: {meter:?}");
        let live = meter.total();
        if meter.schedstat {
            assert!(live.ns > 0, "the thread ran: {live:?}");
        }
        go_tx.send(()).expect("the thread waits");
        thread.join().expect("join");
        meter.sample();
        assert!(meter.threads.is_empty());
        assert_eq!(meter.total(), live, "an exited thread keeps its CPU");
    }

    #[test]
    fn cpu_per_million_divides_by_replicated_writes() {
        assert_eq!(cpu_s_per_million(3.0, 1_000_000, 3), Some(1.0));
        assert_eq!(cpu_s_per_million(1.0, 0, 3), None);
    }
}
