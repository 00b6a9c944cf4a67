//! `rampart drill`: a crash-injection drill with a linearizability checker (docs/design.md
//! §10, issue 15).
//!
//! Starts a local cluster as processes (coordinators and storage servers, data under
//! `--out`), creates a table, and drives it from `--clients` long-lived clients
//! ([`workload`]) while an [`faults::Injector`] carries out a seeded
//! [`plan::FaultPlan`]: masters and backups killed, two at once, the coordinator leader
//! killed, a recovery master killed during a recovery, a master paused until declared
//! dead and then resumed, a master or the coordinator leader cut off by a network
//! partition ([`plan::Cut`]). With partitions, every process runs on a host of its own
//! (a network namespace with its own address, `rampart_ops::netns`; replication over
//! `tcp`, which a cut stops) and the clients on the drill's, which reaches them all;
//! without them (or without root), on loopback. Every operation is recorded (call and return
//! times, what was asked, what came back or that the outcome is unknown). When the
//! time is up the drill lets the cluster settle, reads every key once more (the final
//! reads that a lost write cannot hide from), and checks:
//!
//! * the history of every key is linearizable (`rampart_check`), violations named
//!   (lost write, stale read, resurrected, version backwards, never written);
//! * every key is served again (its final read succeeds);
//! * every server killed or paused was recovered (`Removed` in the server list);
//! * the cluster healed after every fault, and a master paused or cut off exited once
//!   resumed or reconnected;
//! * a master paused, or cut off by `REJECT` rules (whose resets look like a dead port),
//!   was not taken for dead: its recovery waited out its lease. The drill reports every
//!   server it kills to the coordinators as their supervisor, and with a network they
//!   take only that word as proof of death (`--proof-of-death supervisor`); on loopback,
//!   a refused port too (`direct`). Each kill's line says which let its tablets go live.
//!
//! It prints a line per fault and a progress line every few seconds, then a verdict
//! table; `--json FILE` writes the figures. The exit status is 1 on any violation, with
//! `failure-SEED.txt` (each violation explained: the order found, the states the key
//! could hold, the operation no order places) and `failure-SEED.jsonl` (the violating
//! keys' operations, which `--recheck` checks again) under `--out`.
//!
//! Ctrl-C (or SIGTERM) ends the drill early; what ran is checked all the same.
//!
//! The seed fixes the fault plan and every client's choice of operations; the timing of
//! real processes does not replay, so a history that failed is kept to be checked again.

pub mod faults;
pub mod plan;
pub mod workload;

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_check::{Limits, Operation, Report};
use rampart_client::{Client, ClientOptions};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::UpArgs;
use plan::{FaultKind, FaultPlan};
use rampart_coordinator::proof_of_death::ProofOfDeath;
use rampart_ops::netns::Network;
use workload::{Counts, OpChooser};

/// The faults a drill injects when `--faults` is not given: every kind it can inject.
pub const FAULTS_DEFAULT: &str = "all";

/// Seconds between two progress lines.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// How long the final read of one key may take (the cluster has settled by then).
const FINAL_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The name of the file that marks a data directory as the drill's own, so that a new
/// drill may empty it.
const MARKER: &str = ".rampart-drill";

/// `rampart drill`
#[derive(Args, Debug)]
pub struct DrillArgs {
    /// Storage servers (each a master and a backup).
    #[arg(long, default_value_t = 5)]
    pub servers: u32,
    /// Coordinators in the Raft group.
    #[arg(long, default_value_t = 3)]
    pub coordinators: u32,
    /// Backup replicas of every segment (R).
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// Concurrent clients, each calling one operation at a time.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// Keys of the table (a quarter of them counters for increments).
    #[arg(long, default_value_t = 32)]
    pub keys: u32,
    /// How long the workload and the faults run: `60s`, `10m`, `1h`, `500ms`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Faults to inject, comma-separated: kill-master, kill-backup, kill-two,
    /// kill-coordinator-leader, kill-during-recovery, partition, pause, move, drain; `all` for every
    /// one of them, `none` for no fault. `partition` runs every process in a network
    /// namespace of its own (root, iproute2 and iptables); where that cannot be done it
    /// is skipped with a message and the other faults run on loopback.
    #[arg(long, default_value = FAULTS_DEFAULT)]
    pub faults: String,
    /// Seed of the fault plan and of the clients' operations (default: from the clock,
    /// printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Shortest pause between two faults, in seconds.
    #[arg(long, default_value_t = 3.0)]
    pub gap_min_s: f64,
    /// Longest pause between two faults, in seconds.
    #[arg(long, default_value_t = 8.0)]
    pub gap_max_s: f64,
    /// Deadline of one client operation, retries included, in seconds.
    #[arg(long, default_value_t = 20.0)]
    pub op_timeout_s: f64,
    /// Write the verdict as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Directory for the cluster's data and the drill's files.
    #[arg(long, default_value = "rampart-drill")]
    pub out: PathBuf,
    /// Also write the whole history to OUT/history-SEED.jsonl.
    #[arg(long)]
    pub history: bool,
    /// Check a recorded history (JSON lines) instead of running a drill.
    #[arg(long, value_name = "FILE")]
    pub recheck: Option<PathBuf>,
    /// DRAM per server for its log.
    #[arg(long, default_value = "64MiB")]
    pub memory: String,
    /// Bytes per log segment.
    #[arg(long, default_value = "1MiB")]
    pub segment_bytes: String,
    /// Log level of the cluster's processes (`RAMPART_LOG` overrides).
    #[arg(long, default_value = "error")]
    pub log_level: String,
}

/// `60s`, `10m`, `1h`, `500ms`, or a number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 60s, 10m or 500ms"))?;
    let seconds = match unit.trim() {
        "" | "s" => number,
        "ms" => number / 1e3,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        other => return Err(format!("unknown unit `{other}` in `{text}`: ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("`{text}`: {e}"))
}

/// Runs `rampart drill`.
pub fn run(args: DrillArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if let Some(file) = &args.recheck {
        return recheck(file);
    }
    let mut kinds = if args.faults.trim() == "none" {
        Vec::new()
    } else {
        FaultKind::parse_list(&args.faults).map_err(anyhow::Error::msg)?
    };
    // Partitions need a network of hosts (namespaces); without root or the tools the
    // drill goes on without them and says so.
    let mut unavailable = None;
    if kinds.contains(&FaultKind::Partition) {
        if let Err(why) = Network::check_available() {
            kinds.retain(|kind| *kind != FaultKind::Partition);
            println!("partition: skipped, {why:#}; the other faults run on loopback");
            unavailable = Some((FaultKind::Partition, format!("{why:#}")));
        }
    }
    if args.clients == 0 || args.keys == 0 {
        bail!("--clients and --keys must be at least 1");
    }
    if args.replicas + 1 > args.servers {
        bail!(
            "--replicas {} needs at least {} servers",
            args.replicas,
            args.replicas + 1
        );
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    println!(
        "drill seed {seed}: {} s, {} servers (R = {}), {} coordinators, {} clients on {} keys, \
         faults: {}",
        args.duration.as_secs_f64(),
        args.servers,
        args.replicas,
        args.coordinators,
        args.clients,
        args.keys,
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let data_dir = args.out.join("data");
    prepare_data_dir(&data_dir)?;

    let with_network = kinds.contains(&FaultKind::Partition);
    let up = UpArgs {
        replicas: Some(args.replicas),
        // Hosts of their own replicate over the network they can be cut from (`shm`
        // would carry a cut-off master's writes to its backups all the same).
        replication: with_network.then(|| "tcp".to_string()),
        coordinators: args.coordinators,
        memory: args.memory.clone(),
        segment_bytes: args.segment_bytes.clone(),
        value_bytes_max: "64KiB".into(),
        backup_frames: 16,
        log_level: args.log_level.clone(),
        // With a network, a partition may cut a live master off by REJECT rules, whose
        // resets look like a dead port: only the drill's word as the servers'
        // supervisor (it reports every kill) proves a death there.
        proof_of_death: if with_network {
            ProofOfDeath::Supervisor
        } else {
            ProofOfDeath::Direct
        },
        ..UpArgs::private(data_dir.clone(), args.servers)
    };
    let started = std::time::Instant::now();
    let network = if with_network {
        let hosts = crate::cluster::hosts(&up);
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let network = Network::create(&hosts)?;
        println!(
            "network: a host (network namespace) per process, the clients at {}",
            network.root_ip
        );
        Some(network)
    } else {
        None
    };
    let mut cluster = crate::cluster::start_in(&up, false, network)?;
    // The drill tells the coordinators of every server it kills, as a supervisor does.
    cluster.supervise()?;
    println!(
        "cluster up in {:.1} s: coordinators {}",
        started.elapsed().as_secs_f64(),
        cluster.coordinator
    );
    let coordinators = crate::startup::coordinator_list(&cluster.coordinator);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let options = ClientOptions {
        deadline: Duration::from_secs_f64(args.op_timeout_s.max(0.1)),
        ..ClientOptions::default()
    };
    let span = args.servers.saturating_sub(1).max(1);
    let table = runtime.block_on(async {
        let client = Client::connect_with(&coordinators, options.clone()).await?;
        client.create_table("drill", span).await
    })?;

    let start = tokio::time::Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // Ctrl-C or SIGTERM ends the drill early: what ran is still checked, and the
    // cluster and its network are taken down.
    for signal in [libc::SIGINT, libc::SIGTERM] {
        crate::cluster::signal_flag(signal, &stop)?;
    }
    let counts = Arc::new(Counts::default());
    let mut clients = Vec::new();
    for id in 0..args.clients {
        let client = runtime.block_on(Client::connect_with(&coordinators, options.clone()))?;
        clients.push(runtime.spawn(workload::run_client(
            client,
            table,
            OpChooser::new(seed, id, args.keys),
            start,
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
    }

    let until = std::time::Instant::now() + args.duration;
    let plan = FaultPlan::new(
        seed,
        &kinds,
        Duration::from_secs_f64(args.gap_min_s.max(0.0)),
        Duration::from_secs_f64(args.gap_max_s.max(args.gap_min_s).max(0.0)),
    );
    let mut injector = faults::Injector::new(
        cluster,
        runtime.handle().clone(),
        table,
        args.replicas as usize,
        plan,
        start.into_std(),
    );
    // The injector runs on this thread: the children it restarts get SIGTERM when the
    // thread that started them exits (PR_SET_PDEATHSIG follows the thread, not the
    // process), and this one lives until the drill ends. Progress goes on another.
    let progress = {
        let (stop, counts) = (Arc::clone(&stop), Arc::clone(&counts));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let next = std::time::Instant::now() + PROGRESS_INTERVAL;
                while std::time::Instant::now() < next.min(until) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                println!(
                    "{:>7.1} s  {} operations ({} unknown, {} failed)",
                    start.elapsed().as_secs_f64(),
                    counts.operations.load(Ordering::Relaxed),
                    counts.unknown.load(Ordering::Relaxed),
                    counts.failed.load(Ordering::Relaxed)
                );
                if std::time::Instant::now() >= until {
                    return;
                }
            }
        })
    };
    injector.run(until, &stop);
    if stop.load(Ordering::Relaxed) {
        println!("stopped early by a signal: checking what ran");
    }
    stop.store(true, Ordering::Relaxed);
    let _ = progress.join();
    println!("time is up: waiting for the clients' last operations");
    let mut history: Vec<Operation> = Vec::new();
    for client in clients {
        history.extend(runtime.block_on(client)?);
    }
    let mut anomalies = injector.anomalies.clone();
    println!("waiting for every crashed server to be recovered");
    if let Err(why) = injector.settle() {
        anomalies.push(format!("after the drill: {why}"));
    }
    let crashed = injector.crashed.len();
    let recoveries = injector.recovered();

    // The final reads: every key once more, with the cluster settled.
    println!("reading every key once more");
    let final_options = ClientOptions {
        deadline: FINAL_READ_TIMEOUT,
        ..ClientOptions::default()
    };
    // A client that cannot connect leaves every key unserved (a violation, with the
    // reason), not the drill without a verdict.
    let final_client = runtime.block_on(Client::connect_with(&coordinators, final_options));
    // All keys at once: a cluster that does not serve them costs one deadline, not one
    // per key.
    let mut final_keys = OpChooser::all_keys(args.keys);
    final_keys.extend(workload::doomed_keys(&history));
    let reads = final_keys.into_iter().map(|key| {
        let client = final_client.as_ref();
        async move {
            let call_us = start.elapsed().as_micros() as u64;
            let result = match client {
                Ok(client) => client.read(table, &key).await,
                Err(e) => Err(e.clone()),
            };
            (key, call_us, start.elapsed().as_micros() as u64, result)
        }
    });
    let mut unserved = Vec::new();
    for (key, call_us, return_us, result) in runtime.block_on(futures::future::join_all(reads)) {
        let output = match result {
            Ok(found) => {
                rampart_check::Output::Read(found.map(|o| (o.version.0, o.value.to_vec())))
            }
            Err(e) => {
                unserved.push(format!(
                    "key {:?} not served: {e}",
                    String::from_utf8_lossy(&key)
                ));
                rampart_check::Output::Failed(e.to_string())
            }
        };
        history.push(Operation {
            client: args.clients,
            key,
            call_us,
            return_us,
            input: rampart_check::Input::Read,
            output,
        });
    }
    let log = injector.log.clone();
    let mut cluster = injector.into_cluster();
    cluster.children.stop_all();
    drop(cluster);
    drop(runtime);

    println!(
        "checking {} operations on {} keys...",
        history.len(),
        args.keys
    );
    let checking = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let report = rampart_check::check(&history, Limits::default(), threads)?;
    let check_seconds = checking.elapsed().as_secs_f64();

    let verdict = Verdict {
        seed,
        report: &report,
        faults: &log,
        crashed,
        recoveries,
        unavailable: unavailable.as_ref(),
        anomalies: &anomalies,
        unserved: &unserved,
        check_seconds,
    };
    verdict.print(&kinds);
    if let Some(file) = &args.json {
        std::fs::write(
            file,
            serde_json::to_string_pretty(&verdict.figures(&kinds))?,
        )
        .with_context(|| format!("cannot write {}", file.display()))?;
    }
    if args.history {
        let file = args.out.join(format!("history-{seed}.jsonl"));
        write_history(&file, history.iter())?;
        println!("history: {}", file.display());
    }
    if verdict.violations() == 0 {
        println!("PASS: no violation");
        return Ok(ExitCode::SUCCESS);
    }
    let explained = args.out.join(format!("failure-{seed}.txt"));
    let mut text = format!("rampart drill seed {seed}\n\n");
    for line in anomalies.iter().chain(&unserved) {
        text.push_str(&format!("{line}\n"));
    }
    for violation in &report.violations {
        text.push_str(&format!("\n{}", violation.explain(&history)));
    }
    std::fs::write(&explained, text)?;
    let keys: Vec<&[u8]> = report.violations.iter().map(|v| &v.key[..]).collect();
    let failing = args.out.join(format!("failure-{seed}.jsonl"));
    write_history(
        &failing,
        history.iter().filter(|o| keys.contains(&&o.key[..])),
    )?;
    println!(
        "FAIL: {} violation(s); explained in {}, the keys' operations in {} (check them \
         again with --recheck)",
        verdict.violations(),
        explained.display(),
        failing.display()
    );
    Ok(ExitCode::FAILURE)
}

/// Empties a directory the drill made before (or creates it); refuses one it did not.
fn prepare_data_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        if !dir.join(MARKER).exists() && std::fs::read_dir(dir)?.next().is_some() {
            bail!(
                "{} exists and is not a drill's data directory: choose another --out",
                dir.display()
            );
        }
        rampart_common::onesided::shm::remove_default_frame_files_under(dir);
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join(MARKER),
        b"made by rampart drill; emptied by the next one\n",
    )?;
    Ok(())
}

fn write_history<'a>(file: &Path, ops: impl Iterator<Item = &'a Operation>) -> Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(file).with_context(|| format!("cannot create {}", file.display()))?,
    );
    for op in ops {
        serde_json::to_writer(&mut out, op)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// `--recheck FILE`: checks a recorded history again.
fn recheck(file: &Path) -> Result<ExitCode> {
    let reader = std::io::BufReader::new(
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?,
    );
    let mut history = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        history.push(
            serde_json::from_str::<Operation>(&line)
                .with_context(|| format!("{}:{}: not an operation", file.display(), n + 1))?,
        );
    }
    let checking = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let report = rampart_check::check(&history, Limits::default(), threads)?;
    println!(
        "{} operations on {} keys checked in {:.2} s",
        report.operations,
        report.keys,
        checking.elapsed().as_secs_f64()
    );
    for violation in &report.violations {
        println!("\n{}", violation.explain(&history));
    }
    for (key, configurations) in &report.inconclusive {
        println!(
            "key {:?}: inconclusive after {configurations} configurations",
            String::from_utf8_lossy(key)
        );
    }
    Ok(if report.passed() {
        println!("linearizable");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Everything the drill found.
struct Verdict<'a> {
    seed: u64,
    report: &'a Report,
    faults: &'a [faults::FaultRecord],
    crashed: usize,
    recoveries: usize,
    /// A kind asked for that this machine cannot inject, and why.
    unavailable: Option<&'a (FaultKind, String)>,
    anomalies: &'a [String],
    unserved: &'a [String],
    check_seconds: f64,
}

impl Verdict<'_> {
    fn violations(&self) -> usize {
        self.report.violations.len()
            + self.report.inconclusive.len()
            + self.anomalies.len()
            + self.unserved.len()
            + self.crashed.saturating_sub(self.recoveries)
    }

    fn injected(&self, kind: FaultKind) -> usize {
        self.faults
            .iter()
            .filter(|f| f.kind == kind && f.injected)
            .count()
    }

    fn print(&self, kinds: &[FaultKind]) {
        println!();
        println!("| drill seed {} | |", self.seed);
        println!("|---|---|");
        for kind in kinds {
            let skipped = self
                .faults
                .iter()
                .filter(|f| f.kind == *kind && !f.injected)
                .count();
            println!(
                "| {kind} | {} injected{} |",
                self.injected(*kind),
                if skipped > 0 {
                    format!(", {skipped} skipped")
                } else {
                    String::new()
                }
            );
        }
        if let Some((kind, why)) = self.unavailable {
            println!("| {kind} | not injected: {why} |");
        }
        println!(
            "| servers crashed / recovered | {} / {} |",
            self.crashed, self.recoveries
        );
        println!(
            "| operations checked | {} on {} keys ({} of unknown outcome) |",
            self.report.operations, self.report.keys, self.report.unknown
        );
        use rampart_check::ViolationKind as K;
        for kind in [
            K::LostWrite,
            K::StaleRead,
            K::Resurrected,
            K::VersionBackwards,
            K::NeverWritten,
            K::NotLinearizable,
        ] {
            println!("| {} | {} |", kind.name(), self.report.count(kind));
        }
        println!("| inconclusive keys | {} |", self.report.inconclusive.len());
        println!("| keys not served at the end | {} |", self.unserved.len());
        println!("| cluster anomalies | {} |", self.anomalies.len());
        println!("| violations | {} |", self.violations());
        println!("| check seconds | {:.2} |", self.check_seconds);
        for anomaly in self.anomalies.iter().chain(self.unserved) {
            println!("  {anomaly}");
        }
    }

    fn figures(&self, kinds: &[FaultKind]) -> VerdictFigures {
        let mut violation_kinds = BTreeMap::new();
        for v in &self.report.violations {
            *violation_kinds
                .entry(v.kind.name().to_string())
                .or_insert(0) += 1;
        }
        VerdictFigures {
            seed: self.seed,
            operations: self.report.operations,
            unknown_outcomes: self.report.unknown,
            faults: kinds
                .iter()
                .map(|k| (k.name().to_string(), self.injected(*k)))
                .collect(),
            servers_crashed: self.crashed,
            recoveries: self.recoveries,
            not_injected: self
                .unavailable
                .map(|(kind, why)| BTreeMap::from([(kind.name().to_string(), why.clone())])),
            violations: self.violations(),
            violation_kinds,
            lost_acknowledged_writes: self.report.count(rampart_check::ViolationKind::LostWrite),
            inconclusive_keys: self.report.inconclusive.len(),
            unserved_keys: self.unserved.len(),
            anomalies: self.anomalies.to_vec(),
            check_seconds: self.check_seconds,
            fault_log: self
                .faults
                .iter()
                .map(|f| FaultFigures {
                    at_s: f.at_s,
                    kind: f.kind.name().to_string(),
                    injected: f.injected,
                    what: f.what.clone(),
                    healed_after_s: f.healed_after_s,
                })
                .collect(),
        }
    }
}

/// What `--json FILE` holds: the verdict, fault kinds by name.
#[derive(Debug, Serialize, Deserialize)]
struct VerdictFigures {
    seed: u64,
    operations: usize,
    unknown_outcomes: usize,
    /// Faults injected, per kind asked for.
    faults: BTreeMap<String, usize>,
    servers_crashed: usize,
    recoveries: usize,
    /// A kind asked for that this machine cannot inject, and why; none (null) if none.
    not_injected: Option<BTreeMap<String, String>>,
    violations: usize,
    /// Keys not linearizable, per kind of violation.
    violation_kinds: BTreeMap<String, u64>,
    lost_acknowledged_writes: usize,
    inconclusive_keys: usize,
    unserved_keys: usize,
    anomalies: Vec<String>,
    check_seconds: f64,
    fault_log: Vec<FaultFigures>,
}

/// One fault of the plan, carried out or skipped.
#[derive(Debug, Serialize, Deserialize)]
struct FaultFigures {
    at_s: f64,
    kind: String,
    injected: bool,
    /// What was done, or why it was skipped.
    what: String,
    healed_after_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_usual_units() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 weeks").is_err());
    }
}
