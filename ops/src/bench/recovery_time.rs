//! `rampart bench recovery`: crash recovery of one master, measured end to end.
//!
//! Starts a local cluster (3 coordinators, `--servers` servers, R = `--replicas`), fills
//! one master with `--data-mb` MB of `--object-bytes` objects (one table, one tablet, on
//! server 1, whose log alone is sized for the data: [`LogMemory`]), measures the
//! machine's **floor** on the same data, kills the master with SIGKILL and measures from
//! the kill:
//! * detection (kill → crash declared, from the coordinator's report): this process is
//!   its servers' supervisor, as `cluster up` is, and reports the kill once it reaped
//!   the process, so the crashed master's death is proven then (the cluster's
//!   coordinators take a refused port as proof too: `--proof-of-death direct`),
//! * when its tablets could go live (the recovery's `lease_end`: lease waited, or which
//!   proof of death),
//! * setup, and per partition its recovery master, replay time and the moment it went
//!   live (the coordinator's report, shifted to the kill),
//! * **client-observed unavailability**: kill → a read of a key in every partition has
//!   succeeded (`--probe-keys` keys spread over the hash space are read in a loop from
//!   the kill on; the last first success ends it), and the distribution of the probe
//!   keys' own unavailability (p50, p99, max): with partitions going live one by one, the
//!   median key is back well before the last.
//!
//! * **CPU-seconds per GB recovered**: the user and system time of every cluster process
//!   (coordinators and servers, not this process's probing client) from the kill until
//!   the cluster is quiet again (recovery, re-replication and the backups' flushes done:
//!   under a tenth of a core for half a second), and the part of it spent until every
//!   probe key was back. Run with `--recovery-masters K` and `--data-mb` in proportion to
//!   K, it shows how the work per byte grows with the recovery masters. The same from
//!   the kill until quiet by kind of process and thread name (`Children::thread_cpu`):
//!   the masters' reactors, the backups' threads, the flush threads, the coordinators.
//!
//! Then it verifies every object (count and checksum, by enumerating the table).
//! With `--write-until-kill-ms N`, 16 closed-loop writers overwrite 10,000 keys of the
//! master for the last N ms before the kill (and stop issuing at it); once the recovery
//! is over every key is read back and the acknowledged writes missing are counted
//! ([`lost_writes`](super::lost_writes): the load `bench compare` runs on every system).
//! Loading shows its progress on stderr (`progress`).
//!
//! **The floor** is the least work any recovery of this data does on this machine,
//! with nothing else in the way: one thread of this process, the crashed master's
//! segments (one replica each, read from the disk's page cache) already in memory, and
//! then, timed: each segment verified as recovery verifies it ([`scan`]: the running
//! CRC of every byte and each object's own CRC), and each object copied into a log
//! buffer and inserted into a hash index. The log buffer and the index are allocated at
//! their final size and touched before the clock starts, so no page fault, zeroing or
//! allocation is counted (first touch costs more than all of this work: ≈ 0.7 s per GiB
//! here). Recovery rate is reported as a fraction of it.
//!
//! Prints a table, writes `--json FILE` and a timeline `--svg FILE`: the coordinator's
//! detection and setup, then one bar per partition on its recovery master (fetch, replay
//! and re-replication; then the wait for the lease, the commit and the tablet push), in
//! their own colours. Backups report no timings of their own yet, so they have no bars.

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_client::{Client, ClientOptions, WriteItem};
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::{key_hash, ServerId, TableId};
use rampart_common::log::{
    decode_object_trusted, entries, object_entry_bytes, scan, Entry, EntryType, ENTRY_HEADER_BYTES,
};
use rampart_common::onesided::TransportKind;
use rampart_common::protocol::coordinator::{
    LeaseEnd, RecoveryReport, RecoveryStatus, RecoveryStatusRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::RpcPool;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

use super::lost_writes::{
    loss_key, write_until, LostWrites, LOSS_KEYS, LOSS_KEY_PREFIX, LOSS_WRITERS,
};
use super::ycsb::RemoveOnDrop;
use crate::child_processes::{Children, Usage};
use crate::cluster::{self, UpArgs};
use crate::progress::Progress;

/// Bytes of a page, for the fresh memory that page faults stand for (x86-64, and
/// AArch64 with 4 KiB pages: the servers' faults are of base pages).
const PAGE_BYTES: f64 = 4096.0;

/// Pause between loading and the kill: two will-upload checks
/// (`rampart_master::will_upload::WILL_CHECK_INTERVAL`).
const WILL_SETTLE: Duration = Duration::from_secs(2);

/// `rampart bench recovery`
#[derive(Args, Debug)]
pub struct RecoveryBenchArgs {
    /// Storage servers (each a master and a backup).
    #[arg(long, default_value_t = 6)]
    pub servers: u32,
    /// MB of object data (keys and values) to load into the master that is killed.
    #[arg(long, default_value_t = 256)]
    pub data_mb: u64,
    /// Bytes of each value.
    #[arg(long, default_value_t = 1024)]
    pub object_bytes: usize,
    /// Backup replicas per segment (R).
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Bytes per log segment.
    #[arg(long, default_value = "8MiB")]
    pub segment_bytes: String,
    /// Recovery masters the recovery may use (the coordinators'
    /// `--recovery-masters-max`); 0: every server left. With `--data-mb` in proportion,
    /// the CPU-seconds per GB show how the work grows with the recovery masters.
    #[arg(long, default_value_t = 0)]
    pub recovery_masters: usize,
    /// Keys read in a loop from the kill on, spread over the hash space.
    #[arg(long, default_value_t = 256)]
    pub probe_keys: usize,
    /// Replicated data each backup may hold only in memory (`rampart server
    /// --unflushed-max`): the frames open for the recovery masters' re-replication.
    #[arg(long, default_value = "256MiB")]
    pub unflushed_max: String,
    /// How the masters move replica bytes into backup frames (`rampart server
    /// --replication`: shm, tcp, rpc or rdma); by default each backup's choice, shared
    /// memory on one host. `rdma` needs a build with `--features rdma` and an RDMA
    /// device (`scripts/soft-roce.sh` sets up soft-RoCE and runs this).
    #[arg(long)]
    pub replication: Option<TransportKind>,
    /// Milliseconds of write load before the kill: 16 closed-loop writers overwrite
    /// 10,000 keys of 1 KB on the master until it is killed; once every probe key is
    /// back, each key is read and the acknowledged writes missing counted
    /// (`bench compare`'s honest comparison runs the same load on every system). 0: no
    /// load.
    #[arg(long, default_value_t = 0)]
    pub write_until_kill_ms: u64,
    /// Write the figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the timeline (SVG).
    #[arg(long, default_value = "recovery-timeline.svg")]
    pub svg: PathBuf,
}

/// What `--json FILE` holds: the run's conditions and figures, times in ms from the
/// kill. `rampart simulate --calibrate`/`--check` and `bench compare`'s loss comparison
/// read it back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RecoveryFigures {
    pub(crate) servers: u32,
    pub(crate) replicas: u32,
    pub(crate) object_bytes: usize,
    pub(crate) data_mb: u64,
    pub(crate) objects_expected: u64,
    pub(crate) objects_verified: u64,
    pub(crate) checksum_ok: bool,
    pub(crate) detection_ms: u64,
    pub(crate) setup_ms: u64,
    /// Client-observed: kill → every probe key read again.
    pub(crate) unavailability_ms: f64,
    pub(crate) key_unavailability_ms: KeyUnavailability,
    pub(crate) recovery_masters: usize,
    pub(crate) recovery_rate_mb_s: f64,
    pub(crate) objects_per_s: f64,
    pub(crate) floor_rate_mb_s: f64,
    pub(crate) rate_over_floor: f64,
    /// Kill to quiet.
    pub(crate) cpu_s_per_gb: f64,
    pub(crate) cpu_s_per_gb_until_keys_back: f64,
    /// Minor page faults of all servers, kill to quiet, per GB recovered: each one a
    /// page mapped on first touch, most of them fresh memory the kernel zeroed (absent
    /// in older runs).
    #[serde(default)]
    pub(crate) minor_faults_per_gb: Option<f64>,
    /// The CPU-seconds per GB of `cpu_s_per_gb`, by kind of process and name of thread
    /// ("server: rampart-flush"; `cpu_by_thread_per_gb`), kill to quiet (absent in older
    /// runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_s_per_gb_by_thread: Option<BTreeMap<String, f64>>,
    pub(crate) quiet_after_ms: u64,
    pub(crate) partitions: Vec<PartitionFigures>,
    /// What let the tablets go live (`lease waited`, `refused`, ...: the recovery's
    /// `lease_end`); absent in runs from before it was recorded.
    #[serde(default)]
    pub(crate) lease_end: Option<String>,
    /// When, ms from the kill.
    #[serde(default)]
    pub(crate) lease_end_ms: Option<u64>,
    /// The backups' `--unflushed-max` (absent in older runs).
    #[serde(default)]
    pub(crate) unflushed_max: Option<String>,
    /// The masters' replication transport (`--replication`); absent: each backup's
    /// choice (shared memory on one host), and in older runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replication: Option<String>,
    /// With `--write-until-kill-ms`: the writes acknowledged by the load, and of those
    /// the ones missing after the recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) writes_acknowledged: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lost_writes: Option<u64>,
}

impl RecoveryFigures {
    /// Whether the crashed master's death was proven (its tablets did not wait out its
    /// lease).
    pub(crate) fn death_proven(&self) -> bool {
        self.lease_end
            .as_deref()
            .is_some_and(|end| end != LeaseEnd::Waited.to_string())
    }
}

/// The probe keys' own unavailability, ms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeyUnavailability {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

/// One partition as the coordinator reported it, its times shifted to the kill.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct PartitionFigures {
    pub(crate) partition: u32,
    /// Its recovery master's server id.
    pub(crate) master: u64,
    pub(crate) live_ms: u64,
    pub(crate) replay_ms: u64,
    pub(crate) replay_start_ms: u64,
    pub(crate) bytes: u64,
    pub(crate) objects: u64,
    pub(crate) attempts: u32,
}

impl RecoveryFigures {
    /// Reads a `--json` file back.
    pub(crate) fn read(path: &Path) -> Result<RecoveryFigures> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a `bench recovery --json` run", path.display()))
    }

    fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The CPU-seconds of each kind of thread (`Children::thread_cpu`), per GB recovered,
/// to the hundredth; kinds under a hundredth of a second per GB are summed as "other".
fn cpu_by_thread_per_gb(seconds: &BTreeMap<String, f64>, gb: f64) -> BTreeMap<String, f64> {
    let mut per_gb = BTreeMap::new();
    for (kind, &s) in seconds {
        let key = if s / gb >= 0.01 {
            kind.as_str()
        } else {
            "other"
        };
        *per_gb.entry(key.to_string()).or_insert(0.0) += s / gb;
    }
    per_gb
        .into_iter()
        .map(|(kind, s)| (kind, (s * 100.0).round() / 100.0))
        .collect()
}

/// The table of [`cpu_by_thread_per_gb`], most first.
fn print_cpu_by_thread(per_gb: &BTreeMap<String, f64>) {
    let mut rows: Vec<(&String, &f64)> = per_gb.iter().collect();
    rows.sort_by(|a, b| b.1.total_cmp(a.1).then_with(|| a.0.cmp(b.0)));
    println!();
    println!("| CPU-s per GB, kill to quiet, by process and thread | CPU-s per GB |");
    println!("|---|---|");
    for (kind, s) in rows.into_iter().filter(|(_, &s)| s > 0.0) {
        println!("| {kind} | {s:.2} |");
    }
}

/// Each server's log memory (MiB). Every server's log is allocated and touched at its
/// start, so it is sized to need, or a 2 GiB run does not fit this 24 GiB VM beside the
/// floor's copy of the data: server 1, the master that is loaded and killed
/// ([`table_on_first_server`]), holds the data set plus its log's overhead; the others
/// only their share of its recovery, `assign_partitions` spreading the partitions evenly
/// over the recovery masters, plus one partition for the rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LogMemory {
    victim_mb: u64,
    recovery_master_mb: u64,
}

impl LogMemory {
    /// The overhead of a log over its data: a quarter (entry headers, the index's bytes
    /// counted against `--memory`, segments' unused tails) plus 256 MiB.
    fn with_overhead(data_mb: u64) -> u64 {
        data_mb + data_mb / 4 + 256
    }

    /// For `data_mb` in one master of `servers`, recovered by `recovery_masters` of the
    /// others (0: all of them).
    fn new(data_mb: u64, servers: u32, recovery_masters: usize) -> LogMemory {
        let others = u64::from(servers.saturating_sub(1));
        let recovery_masters = match recovery_masters as u64 {
            0 => others,
            k => k.min(others),
        };
        let partition_mb = rampart_master::profiler::PARTITION_BYTES_DEFAULT.div_ceil(1 << 20);
        let share_mb = data_mb.div_ceil(recovery_masters.max(1)) + partition_mb;
        let victim_mb = LogMemory::with_overhead(data_mb);
        LogMemory {
            victim_mb,
            recovery_master_mb: LogMemory::with_overhead(share_mb).min(victim_mb),
        }
    }
}

/// Creates the benchmark's table (one tablet) on server 1, the one whose log is sized
/// for the data ([`LogMemory`]). The coordinators place each new table on the next
/// master in id order after the last one placed, and ids follow the order in which the
/// servers enlisted: a table placed elsewhere is dropped and created again, which moves
/// the placement on by one, so one of the first `servers` attempts lands on server 1.
async fn table_on_first_server(client: &Client, local: &cluster::LocalCluster) -> Result<TableId> {
    let first = &local.servers.first().context("a cluster with no server")?.1;
    for _ in 0..local.servers.len() {
        let table = client.create_table("bench", 1).await?;
        if client.locate(table, &key(0)).as_ref() == Some(first) {
            return Ok(table);
        }
        client.drop_table_id(table).await?;
    }
    bail!(
        "the coordinators placed none of {} tables on server 1",
        local.servers.len()
    )
}

/// Keys and values of the loaded data: key `k{i}`, value derived from it.
fn key(i: u64) -> Vec<u8> {
    format!("k{i:010}").into_bytes()
}

fn value(i: u64, bytes: usize) -> Vec<u8> {
    let mut v = vec![b'a' + (i % 26) as u8; bytes];
    let tag = i.to_le_bytes();
    let n = tag.len().min(bytes);
    v[..n].copy_from_slice(&tag[..n]);
    v
}

/// Order-independent checksum of a set of objects.
fn checksum(key: &[u8], value: &[u8]) -> u64 {
    let mut bytes = Vec::with_capacity(key.len() + value.len() + 1);
    bytes.extend_from_slice(key);
    bytes.push(0);
    bytes.extend_from_slice(value);
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs the benchmark.
pub fn run(args: RecoveryBenchArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if args.servers < 2 || args.replicas >= args.servers {
        bail!("need at least 2 servers and --replicas below --servers");
    }
    if args.object_bytes == 0 || args.data_mb == 0 {
        bail!("--object-bytes and --data-mb must be positive");
    }
    let data_dir =
        std::env::temp_dir().join(format!("rampart-bench-recovery-{}", std::process::id()));
    let _data = RemoveOnDrop(data_dir.clone());
    let memory = LogMemory::new(args.data_mb, args.servers, args.recovery_masters);
    let replication = args.replication.map(|kind| kind.name().to_string());
    let up = UpArgs {
        coordinators: 3,
        replicas: Some(args.replicas),
        memory: format!("{}MiB", memory.recovery_master_mb),
        first_server_memory: Some(format!("{}MiB", memory.victim_mb)),
        segment_bytes: args.segment_bytes.clone(),
        recovery_masters_max: args.recovery_masters,
        unflushed_max: args.unflushed_max.clone(),
        replication: replication.clone(),
        ..UpArgs::private(data_dir.clone(), args.servers)
    };
    let mut local = cluster::start(&up, false)?;
    // This process is its servers' supervisor, as `cluster up` is: it tells the
    // coordinators of the kill as soon as it has reaped the process.
    local.supervise()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let objects = args.data_mb * 1_000_000 / (args.object_bytes as u64 + 11);
    println!(
        "{} servers, R = {}, {} MB in {} objects of {} bytes, segments {}, at most {} \
         unflushed per backup, replication {}",
        args.servers,
        args.replicas,
        args.data_mb,
        objects,
        args.object_bytes,
        args.segment_bytes,
        args.unflushed_max,
        args.replication
            .map_or("each backup's choice", TransportKind::name)
    );
    let coordinator = local.coordinator.clone();
    let client = runtime.block_on(async {
        let options = ClientOptions {
            deadline: Duration::from_secs(120),
            ..ClientOptions::default()
        };
        Client::connect_with(&[coordinator.as_str()], options).await
    })?;
    let table = runtime.block_on(table_on_first_server(&client, &local))?;
    let load_start = std::time::Instant::now();
    let expected = runtime.block_on(load(&client, table, objects, args.object_bytes))?;
    println!("loaded in {:.1} s", load_start.elapsed().as_secs_f64());
    let victim_addr = client
        .locate(table, &key(0))
        .context("no owner for the table")?;
    let (index, (victim, _)) = local
        .servers
        .iter()
        .enumerate()
        .find(|(_, (_, addr))| *addr == victim_addr)
        .map(|(i, s)| (i, s.clone()))
        .context("owner not among the servers")?;

    // The floor, on the replicas just written (page cache).
    let floor = Floor::measure(&data_dir, ServerId(victim))?;
    let floor_rate = floor.bytes as f64 / 1e6 / floor.seconds.max(1e-9);
    println!(
        "floor: {} objects, {:.0} MB of segments in {:.0} ms: {floor_rate:.0} MB/s",
        floor.objects,
        floor.bytes as f64 / 1e6,
        floor.seconds * 1e3
    );

    // Masters upload their wills once a second: let the last one reflect all the data,
    // as it does in a cluster that ran for more than a second after its last writes.
    std::thread::sleep(WILL_SETTLE);

    // Kill, and probe until every probe key has been read once.
    let probes: Vec<u64> = (0..args.probe_keys as u64)
        .map(|p| p * objects / args.probe_keys.max(1) as u64)
        .collect();
    // A master that died before the kill (the kernel's OOM killer picks the largest
    // process, and the floor above holds the data twice over) is being recovered
    // already: timed from the kill, its recovery would look seconds shorter than it is.
    if local.server_exited(index + 1) {
        bail!(
            "server {victim} exited before the kill (out of memory? see `dmesg`): its \
             recovery cannot be timed; try less --data-mb, or fewer --servers"
        );
    }
    let load = WriteLoad::start(&runtime, &client, table, args.write_until_kill_ms);
    let at_kill = local.children.usage();
    let threads_at_kill = local.children.thread_cpu();
    load.stop();
    let killed = Instant::now();
    let killed_unix = unix_ms();
    local.kill_server(index + 1)?;
    let mut back = runtime.block_on(probe(&client, table, (&probes, args.object_bytes), killed))?;
    let cpu_until_back = local.children.cpu_seconds() - at_kill.cpu_s;
    let (until_quiet, quiet_after) = wait_quiet(&local.children, at_kill, killed);
    let by_thread = local.children.thread_cpu().since(&threads_at_kill);
    let cpu_until_quiet = until_quiet.cpu_s;
    back.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        let rank = ((back.len() as f64 * q).ceil() as usize).clamp(1, back.len().max(1));
        back.get(rank - 1).copied().unwrap_or(0.0) * 1e3
    };
    let unavailable = back.last().copied().unwrap_or(0.0);
    let (key_p50, key_p99) = (quantile(0.5), quantile(0.99));
    println!(
        "client-observed unavailability: {:.0} ms (per probe key: p50 {key_p50:.0} ms, p99 \
         {key_p99:.0} ms)",
        unavailable * 1e3
    );

    let report = runtime.block_on(wait_report(&coordinator, ServerId(victim)))?;
    let shift = report.declared_unix_ms.saturating_sub(killed_unix);
    let detection_ms = shift;
    let (verified, sum) = runtime.block_on(verify(&client, table))?;
    let lost = runtime.block_on(load.count_lost(&client, table))?;
    // An acknowledged write missing is a durability bug: the run fails.
    let ok = verified == expected.0
        && sum == expected.1
        && lost.map_or(true, |l| l.lost == 0 && l.foreign == 0);

    let recovered_mb = args.data_mb as f64;
    let total_s = report
        .partitions
        .iter()
        .map(|p| p.live_ms + shift)
        .max()
        .unwrap_or(0) as f64
        / 1e3;
    let rate = recovered_mb / total_s.max(1e-9);
    let gb = recovered_mb / 1e3;
    let cpu_s_per_gb = cpu_until_quiet / gb;
    let minor_faults_per_gb = until_quiet.minor_faults as f64 / gb;
    let masters: std::collections::BTreeSet<ServerId> =
        report.partitions.iter().map(|p| p.master).collect();
    println!();
    println!("| partition | recovery master | objects | MB | replay ms | live at ms (from kill) |");
    println!("|---|---|---|---|---|---|");
    for p in &report.partitions {
        println!(
            "| {} | {} | {} | {:.1} | {} | {} |",
            p.partition,
            p.master,
            p.objects,
            p.bytes as f64 / 1e6,
            p.replay_ms,
            p.live_ms + shift
        );
    }
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!("| detection ms | {detection_ms} |");
    println!("| setup ms (from kill) | {} |", report.setup_ms + shift);
    println!(
        "| last partition live ms (from kill) | {:.0} |",
        total_s * 1e3
    );
    println!(
        "| client-observed unavailability ms | {:.0} |",
        unavailable * 1e3
    );
    println!("| probe key unavailability p50 / p99 ms | {key_p50:.0} / {key_p99:.0} |");
    match report.lease_end {
        Some(end) => println!(
            "| tablets may go live from ms (from kill) | {} ({end}) |",
            report.lease_end_ms + shift
        ),
        None => println!("| tablets may go live from ms (from kill) | - |"),
    }
    println!("| recovery masters | {} |", masters.len());
    println!("| recovery rate MB/s (data / last live) | {rate:.0} |");
    println!(
        "| objects/s recovered | {:.0} |",
        objects as f64 / total_s.max(1e-9)
    );
    println!("| floor MB/s (one thread, data in memory, no page faults) | {floor_rate:.0} |");
    println!(
        "| recovery rate / floor | {:.2} |",
        rate / floor_rate.max(1e-9)
    );
    println!(
        "| CPU-s per GB recovered, all servers, kill to quiet ({:.1} s) | {cpu_s_per_gb:.2} |",
        quiet_after.as_secs_f64()
    );
    println!(
        "| of which until every probe key was back | {:.2} |",
        cpu_until_back / gb
    );
    println!(
        "| minor page faults per GB recovered, kill to quiet ({:.0} MB of pages per GB) \
         | {minor_faults_per_gb:.0} |",
        minor_faults_per_gb * PAGE_BYTES / 1e6
    );
    println!(
        "| objects verified | {verified} of {} ({}) |",
        expected.0,
        if ok { "checksum matches" } else { "MISMATCH" }
    );
    if let Some(lost) = lost {
        println!(
            "| writes of the load ({} ms until the kill, {LOSS_WRITERS} writers) | {lost} |",
            args.write_until_kill_ms
        );
    }
    let by_thread = cpu_by_thread_per_gb(&by_thread, gb);
    print_cpu_by_thread(&by_thread);
    write_svg(&args.svg, &report, shift, detection_ms)?;
    println!("timeline: {}", args.svg.display());
    if let Some(path) = &args.json {
        let figures = RecoveryFigures {
            servers: args.servers,
            replicas: args.replicas,
            object_bytes: args.object_bytes,
            data_mb: args.data_mb,
            objects_expected: expected.0,
            objects_verified: verified,
            checksum_ok: ok,
            detection_ms,
            setup_ms: report.setup_ms + shift,
            unavailability_ms: (unavailable * 1e3).round(),
            key_unavailability_ms: KeyUnavailability {
                p50: key_p50.round(),
                p99: key_p99.round(),
                max: (unavailable * 1e3).round(),
            },
            recovery_masters: masters.len(),
            recovery_rate_mb_s: rate,
            objects_per_s: objects as f64 / total_s.max(1e-9),
            floor_rate_mb_s: floor_rate,
            rate_over_floor: rate / floor_rate.max(1e-9),
            cpu_s_per_gb,
            cpu_s_per_gb_until_keys_back: cpu_until_back / gb,
            minor_faults_per_gb: Some(minor_faults_per_gb.round()),
            cpu_s_per_gb_by_thread: Some(by_thread),
            quiet_after_ms: quiet_after.as_millis() as u64,
            partitions: report
                .partitions
                .iter()
                .map(|p| PartitionFigures {
                    partition: p.partition,
                    master: p.master.0,
                    live_ms: p.live_ms + shift,
                    replay_ms: p.replay_ms,
                    replay_start_ms: p.replay_start_ms + shift,
                    bytes: p.bytes,
                    objects: p.objects,
                    attempts: p.attempts,
                })
                .collect(),
            lease_end: report.lease_end.map(|end| end.to_string()),
            lease_end_ms: report.lease_end.map(|_| report.lease_end_ms + shift),
            unflushed_max: Some(args.unflushed_max.clone()),
            replication,
            writes_acknowledged: lost.map(|l| l.acknowledged),
            lost_writes: lost.map(|l| l.lost),
        };
        figures.write(path)?;
    }
    local.children.stop_all();
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Writes `objects` objects with multi-writes from 8 tasks, showing its progress;
/// returns (count, checksum).
async fn load(client: &Client, table: TableId, objects: u64, bytes: usize) -> Result<(u64, u64)> {
    const WRITERS: u64 = 8;
    let batch = (256 * 1024 / (bytes as u64 + 16)).clamp(1, 1000);
    let progress = Progress::new("loading", objects, "objects");
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let client = client.clone();
        let progress = progress.clone();
        tasks.spawn(async move {
            let mut i = w * batch;
            while i < objects {
                let items: Vec<WriteItem> = (i..(i + batch).min(objects))
                    .map(|j| WriteItem {
                        table,
                        key: key(j).into(),
                        value: value(j, bytes).into(),
                        rules: RejectRules::default(),
                    })
                    .collect();
                client.multi_write(&items).await?;
                progress.inc(items.len() as u64);
                i += batch * WRITERS;
            }
            Ok::<(), rampart_client::ClientError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    progress.finish();
    let sum = (0..objects).fold(0u64, |s, i| {
        s.wrapping_add(checksum(&key(i), &value(i, bytes)))
    });
    Ok((objects, sum))
}

/// Keys of the write load read back per multi-read.
const LOSS_READ_BATCH: usize = 500;

/// `--write-until-kill-ms`: [`LOSS_WRITERS`] writers overwriting the load's keys on the
/// master from a little before the kill until it ([`lost_writes`](super::lost_writes)).
struct WriteLoad {
    stop: Arc<AtomicBool>,
    writers: Vec<tokio::task::JoinHandle<Vec<u64>>>,
}

impl WriteLoad {
    /// Starts the writers and lets them write for `ms` (nothing for 0).
    fn start(
        runtime: &tokio::runtime::Runtime,
        client: &Client,
        table: TableId,
        ms: u64,
    ) -> WriteLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let writers = if ms == 0 {
            Vec::new()
        } else {
            (0..LOSS_WRITERS)
                .map(|w| {
                    let (client, stop) = (client.clone(), stop.clone());
                    runtime.spawn(async move {
                        write_until(w, &stop, |key, value| {
                            let client = client.clone();
                            async move { client.write(table, &key, &value).await.is_ok() }
                        })
                        .await
                    })
                })
                .collect()
        };
        std::thread::sleep(Duration::from_millis(ms));
        WriteLoad { stop, writers }
    }

    /// Tells the writers to issue nothing more (at the kill).
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Waits for the writes in flight at the kill (they are retried until the recovery
    /// ends), then reads every key of the load back: what was acknowledged and is
    /// missing. `None` without a load.
    async fn count_lost(self, client: &Client, table: TableId) -> Result<Option<LostWrites>> {
        if self.writers.is_empty() {
            return Ok(None);
        }
        let mut acknowledged = Vec::new();
        for writer in self.writers {
            acknowledged.extend(writer.await.context("a writer of the load panicked")?);
        }
        let keys: Vec<Vec<u8>> = (0..LOSS_KEYS).map(loss_key).collect();
        let mut read_back = BTreeMap::new();
        for (c, chunk) in keys.chunks(LOSS_READ_BATCH).enumerate() {
            let batch: Vec<(TableId, &[u8])> = chunk.iter().map(|k| (table, &k[..])).collect();
            for (i, object) in client.multi_read(&batch).await?.into_iter().enumerate() {
                let index = (c * LOSS_READ_BATCH + i) as u64;
                read_back.insert(index, object?.map(|o| o.value.to_vec()));
            }
        }
        Ok(Some(LostWrites::count(&acknowledged, &read_back)))
    }
}

/// Reads every probe key in a loop until each has been read once, with the value it
/// was loaded with (`bytes` long); returns, per key, the seconds from `killed` to its
/// first success.
async fn probe(
    client: &Client,
    table: TableId,
    (probes, bytes): (&[u64], usize),
    killed: Instant,
) -> Result<Vec<f64>> {
    let mut tasks = tokio::task::JoinSet::new();
    for &p in probes {
        let client = client.clone();
        tasks.spawn(async move {
            loop {
                match client.read(table, &key(p)).await {
                    Ok(Some(object)) if object.value[..] == value(p, bytes)[..] => {
                        return Ok(killed.elapsed().as_secs_f64())
                    }
                    Ok(Some(object)) => bail!(
                        "probe key {p} read back another value ({} bytes, version {})",
                        object.value.len(),
                        object.version.0
                    ),
                    Ok(None) => bail!("probe key {p} lost"),
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        });
    }
    let mut back = Vec::with_capacity(probes.len());
    while let Some(done) = tasks.join_next().await {
        back.push(done??);
    }
    Ok(back)
}

/// A window in which the cluster counts as quiet: it used less than
/// [`QUIET_CPU_FRACTION`] of one core over it.
const QUIET_WINDOW: Duration = Duration::from_millis(500);

/// See [`QUIET_WINDOW`]: background work (leases, heartbeats, wills) stays below it.
const QUIET_CPU_FRACTION: f64 = 0.1;

/// The longest [`wait_quiet`] waits after the kill.
const QUIET_WAIT_MAX: Duration = Duration::from_secs(60);

/// Waits until the cluster's processes are quiet (recovery, re-replication and the
/// backups' flushes done: [`QUIET_WINDOW`]) and returns what they used since `at_kill`
/// (up to the start of the quiet window) and when that was, from `killed`.
fn wait_quiet(children: &Children, at_kill: Usage, killed: Instant) -> (Usage, Duration) {
    let mut before = children.usage();
    let mut at = killed.elapsed();
    loop {
        std::thread::sleep(QUIET_WINDOW);
        let now = children.usage();
        if now.cpu_s - before.cpu_s < QUIET_CPU_FRACTION * QUIET_WINDOW.as_secs_f64() {
            return (before.since(at_kill), at);
        }
        if killed.elapsed() > QUIET_WAIT_MAX {
            println!(
                "the cluster was still busy {} s after the kill: CPU counted until then",
                QUIET_WAIT_MAX.as_secs()
            );
            return (now.since(at_kill), killed.elapsed());
        }
        (before, at) = (now, killed.elapsed());
    }
}

/// The coordinator's report of the recovery of `crashed`, once done.
async fn wait_report(coordinator: &str, crashed: ServerId) -> Result<RecoveryReport> {
    let set = CoordinatorSet::new(&[coordinator]);
    let pool = RpcPool::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let call = Instant::now() + Duration::from_secs(5);
        if let Ok(reply) = set
            .call::<RecoveryStatus>(&pool, &RecoveryStatusRequest {}, call)
            .await
        {
            if let Some(report) = reply
                .recoveries
                .into_iter()
                .rev()
                .find(|r| r.crashed == crashed && r.done_ms > 0)
            {
                return Ok(report);
            }
        }
        if Instant::now() > deadline {
            bail!("the recovery of {crashed} did not finish");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Enumerates the table; returns (objects, checksum).
async fn verify(client: &Client, table: TableId) -> Result<(u64, u64)> {
    let mut enumeration = client.enumerate(table);
    let (mut count, mut sum) = (0u64, 0u64);
    while let Some(page) = enumeration.next_page().await? {
        for object in page {
            if object.key.starts_with(LOSS_KEY_PREFIX) {
                continue;
            }
            count += 1;
            sum = sum.wrapping_add(checksum(&object.key, &object.value));
        }
    }
    Ok((count, sum))
}

/// The honest floor (module doc): what one thread does with the crashed master's data
/// when nothing but the work itself costs anything.
struct Floor {
    /// Valid segment bytes verified.
    bytes: u64,
    /// Objects indexed.
    objects: u64,
    /// Seconds of the timed part.
    seconds: f64,
}

/// An entry of [`FloorIndex`] that holds nothing.
const FLOOR_EMPTY: u64 = u64::MAX;

/// The floor's index: open addressing with linear probing over (table, key) hashes, each
/// slot a hash and the log offset of its object. Sized for at most half full and filled
/// with [`FLOOR_EMPTY`] (a non-zero fill, so every page is written) before it is timed.
struct FloorIndex {
    hashes: Vec<u64>,
    offsets: Vec<u64>,
}

impl FloorIndex {
    fn with_capacity(objects: u64) -> FloorIndex {
        let slots = (objects.max(1) * 2).next_power_of_two() as usize;
        FloorIndex {
            hashes: vec![FLOOR_EMPTY; slots],
            offsets: vec![FLOOR_EMPTY; slots],
        }
    }

    /// Inserts `hash` → `offset` unless the slot of `hash` holds an object of a version
    /// at least `version` (read from `log` at its offset), as replay keeps the newest.
    fn insert(&mut self, log: &[u8], hash: u64, offset: u64, version: u64) {
        let hash = hash.min(FLOOR_EMPTY - 1);
        let mask = self.hashes.len() - 1;
        let mut slot = hash as usize & mask;
        loop {
            let held = self.hashes[slot];
            if held == FLOOR_EMPTY {
                self.hashes[slot] = hash;
                self.offsets[slot] = offset;
                return;
            }
            if held == hash {
                let older = decode_object_trusted(log, self.offsets[slot] as usize)
                    .is_some_and(|o| o.version.0 < version);
                if older {
                    self.offsets[slot] = offset;
                }
                return;
            }
            slot = (slot + 1) & mask;
        }
    }
}

impl Floor {
    /// Loads one replica of each segment of `master` found under `data_dir` (untimed),
    /// sizes and touches the log buffer and the index (untimed), then times the
    /// verification, copy and indexing of every object.
    fn measure(data_dir: &Path, master: ServerId) -> Result<Floor> {
        let (all, ranges) = Floor::load(data_dir, master)?;
        let segments: Vec<&[u8]> = ranges.iter().map(|range| &all[range.clone()]).collect();
        // Untimed: how much the log and the index must hold.
        let (mut log_bytes, mut objects) = (0usize, 0u64);
        for segment in &segments {
            let valid = scan(segment).valid_bytes;
            for (_, entry) in entries(segment, valid) {
                if let Entry::Object(object) = entry {
                    log_bytes += object_entry_bytes(object.key.len(), object.value.len());
                    objects += 1;
                }
            }
        }
        // Non-zero fills: every page is faulted in and written now, not in the timed part.
        let mut log = vec![0xA5u8; log_bytes];
        let mut index = FloorIndex::with_capacity(objects);
        let start = std::time::Instant::now();
        let (mut bytes, mut indexed, mut cursor) = (0u64, 0u64, 0usize);
        for segment in &segments {
            let valid = scan(segment).valid_bytes as usize;
            bytes += valid as u64;
            let mut at = 0;
            while at + ENTRY_HEADER_BYTES <= valid {
                let len = u32::from_le_bytes([
                    segment[at + 1],
                    segment[at + 2],
                    segment[at + 3],
                    segment[at + 4],
                ]) as usize;
                let end = at + ENTRY_HEADER_BYTES + len;
                if segment[at] == EntryType::Object as u8 {
                    if let Some(object) = decode_object_trusted(segment, at) {
                        let size = end - at;
                        log[cursor..cursor + size].copy_from_slice(&segment[at..end]);
                        let hash = key_hash(object.key).0 ^ object.table.0.rotate_left(32);
                        index.insert(&log, hash, cursor as u64, object.version.0);
                        cursor += size;
                        indexed += 1;
                    }
                }
                at = end;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        // Keep the work observable so none of it can be optimized away.
        std::hint::black_box((&log, &index.hashes, &index.offsets));
        Ok(Floor {
            bytes,
            objects: indexed,
            seconds,
        })
    }

    /// One replica file per segment of `master` under `data_dir`, read into one buffer,
    /// and each segment's bytes (after the file's header) as a range of it. One buffer,
    /// returned to the system as a whole when dropped: a buffer per 8 MiB file would
    /// stay in the allocator's heap once freed, gigabytes this process would then hold
    /// while the cluster recovers (a 2 GiB run was killed for memory that way). The
    /// master is still running: its cleaner may free a segment (every replica file of
    /// it removed) between the listing and the reading, and a backup may replace a file
    /// (a newer copy renamed over it). A segment is read from the first of its files
    /// that can still be read, and left out if none can: it is no longer in the log.
    fn load(data_dir: &Path, master: ServerId) -> Result<(Vec<u8>, Vec<Range<usize>>)> {
        /// Bytes of a replica file's header (backup::segment_store's layout).
        const REPLICA_HEADER_BYTES: usize = 49;
        let prefix = format!("m{}-s", master.0);
        let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for server in std::fs::read_dir(data_dir)? {
            let replicas = server?.path().join("replicas");
            let Ok(dir) = std::fs::read_dir(&replicas) else {
                continue;
            };
            for file in dir {
                let path = file?.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.starts_with(&prefix) && name.ends_with(".replica") {
                    files.entry(name.to_string()).or_default().push(path);
                }
            }
        }
        // Sized up front: growing it would copy gigabytes.
        let total: u64 = files
            .values()
            .filter_map(|paths| paths.first()?.metadata().ok())
            .map(|meta| meta.len())
            .sum();
        let mut all = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        let mut segments = Vec::with_capacity(files.len());
        for paths in files.values() {
            let start = all.len();
            if !read_first_present(paths, &mut all)? {
                continue;
            }
            if all.len() >= start + REPLICA_HEADER_BYTES {
                segments.push(start + REPLICA_HEADER_BYTES..all.len());
            } else {
                all.truncate(start);
            }
        }
        Ok((all, segments))
    }
}

/// Appends the content of the first of `paths` that still exists to `into`; whether one
/// did.
fn read_first_present(paths: &[PathBuf], into: &mut Vec<u8>) -> Result<bool> {
    for path in paths {
        let start = into.len();
        match std::fs::File::open(path).and_then(|mut file| file.read_to_end(into)) {
            Ok(_) => return Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                into.truncate(start);
            }
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", path.display()))
            }
        }
    }
    Ok(false)
}

/// The timeline: a bar per partition (on its recovery master), phases coloured.
fn write_svg(path: &Path, report: &RecoveryReport, shift: u64, detection: u64) -> Result<()> {
    let svg = rampart_common::recovery_timeline::svg(report, shift, detection, None);
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::LogMemory;

    #[test]
    fn only_the_loaded_master_is_sized_for_the_whole_data_set() {
        // 2 GiB over 6 servers: 5 recovery masters take 410 MiB each, plus one 48 MiB
        // partition of rounding, plus the log's overhead.
        assert_eq!(
            LogMemory::new(2048, 6, 0),
            LogMemory {
                victim_mb: 2048 + 512 + 256,
                recovery_master_mb: 458 + 114 + 256,
            }
        );
        // One recovery master takes everything: it needs the victim's memory, no more.
        assert_eq!(
            LogMemory::new(1024, 5, 1),
            LogMemory {
                victim_mb: 1536,
                recovery_master_mb: 1536,
            }
        );
        // More recovery masters asked for than there are servers left: all of them.
        assert_eq!(LogMemory::new(300, 4, 10), LogMemory::new(300, 4, 0));
        assert_eq!(LogMemory::new(300, 4, 0).recovery_master_mb, 148 + 37 + 256);
    }
}
