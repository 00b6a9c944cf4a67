//! `rampart bench migrate`: one tablet moved to another master under a YCSB-B load
//! (issue 42).
//!
//! A private cluster (`--servers`, R = `--replicas`) holds a table of one tablet,
//! loaded with `--mb` of `--value-bytes` objects. `--clients` closed-loop clients run
//! YCSB-B (95 % reads, 5 % updates, scrambled Zipfian keys) for `--before-s` seconds;
//! then, with the same load running, the tablet is moved to another master
//! (`Client::move_tablets`), and the load stops when the move is committed. Prints the
//! migration rate against the floor measured in the same run — the same bytes copied
//! between two processes of this machine through shared memory
//! ([`copy_floor`]) — the clients' p50 and p99.9 before and during the move, the
//! longest single operation, and the operations that failed (must be 0).
//!
//! `--json FILE` writes `migrate_mb_s`, `floor_mb_s`, `p50_us_before`, `p50_us_during`,
//! `p999_us_before`, `p999_us_during`, `max_op_ms` and `failed_ops`, with the
//! conditions.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use rampart_client::{Client, ClientOptions};
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{GetTabletMap, TabletMapRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::ServerStatus;
use serde::Serialize;
use std::io::{Read, Write};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::under_load::{
    measure_for, private_cluster, run_mix, runtime, write_json, Latency, Load, Phase,
};
use super::ycsb::{load, KeyChooser};

/// `rampart bench migrate`
#[derive(Args, Debug, Clone)]
pub struct MigrateArgs {
    /// Megabytes of objects in the moved tablet.
    #[arg(long, default_value_t = 1024)]
    pub mb: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Closed-loop YCSB-B clients.
    #[arg(long, default_value_t = 4)]
    pub clients: u32,
    /// Seconds of load measured before the move.
    #[arg(long, default_value_t = 5)]
    pub before_s: u64,
    /// Zipfian skew of the keys (0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Storage servers of the private cluster.
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Replicas per segment (default: 2, at most servers − 1).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Seed of the key and operation choices.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// What `--json FILE` holds.
#[derive(Debug, Serialize)]
struct MigrateFigures {
    mb: u64,
    value_bytes: usize,
    clients: u32,
    servers: u32,
    replicas: u32,
    zipf: f64,
    seed: u64,
    /// Bytes the move copied (entries), over the move's wall time, MB/s.
    migrate_mb_s: f64,
    /// The same bytes copied between two processes through shared memory, MB/s.
    floor_mb_s: f64,
    moved_bytes: u64,
    move_ms: u64,
    copy_ms: u32,
    frozen_ms: u32,
    #[serde(flatten)]
    latency: Latency,
}

/// Runs the benchmark.
pub fn run(args: MigrateArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if args.mb == 0 || args.clients == 0 || args.servers < 2 || args.value_bytes == 0 {
        bail!("--mb, --clients and --value-bytes must be at least 1, --servers at least 2");
    }
    let replicas = args.replicas.unwrap_or(2).min(args.servers - 1);
    let seed = args.seed.unwrap_or_else(rand::random);
    // Declared first, so dropped last: the servers stop before their data goes. The
    // source and the target each hold the table whole.
    let (_data, cluster) = private_cluster("migrate", args.mb, args.servers, replicas)?;
    let coordinator = cluster.coordinator.clone();
    let runtime = runtime()?;
    let task_args = args.clone();
    let (before, during, moved, move_ms, max_op) = runtime.block_on(async move {
        tokio::spawn(async move { bench(&task_args, &coordinator, seed).await })
            .await
            .context("benchmark task panicked")?
    })?;
    drop(cluster);
    let floor_mb_s = copy_floor(moved.bytes)?;
    let migrate_mb_s = moved.bytes as f64 / 1e6 / (move_ms as f64 / 1000.0);
    let figures = MigrateFigures {
        mb: args.mb,
        value_bytes: args.value_bytes,
        clients: args.clients,
        servers: args.servers,
        replicas,
        zipf: args.zipf,
        seed,
        migrate_mb_s,
        floor_mb_s,
        moved_bytes: moved.bytes,
        move_ms,
        copy_ms: moved.copy_ms,
        frozen_ms: moved.frozen_ms,
        latency: Latency::of(&before, &during, max_op),
    };
    print_report(&figures);
    write_json(args.json.as_deref(), &figures)?;
    Ok(ExitCode::SUCCESS)
}

fn print_report(f: &MigrateFigures) {
    println!(
        "migrate: {} MB of {}-byte objects, R = {}, {} servers, {} YCSB-B clients (zipf {}), seed {}",
        f.mb, f.value_bytes, f.replicas, f.servers, f.clients, f.zipf, f.seed
    );
    println!(
        "  moved {:.1} MB in {} ms: {:.1} MB/s; floor (the same bytes between two processes through shared memory) {:.1} MB/s; rate / floor {:.3}",
        f.moved_bytes as f64 / 1e6,
        f.move_ms,
        f.migrate_mb_s,
        f.floor_mb_s,
        f.migrate_mb_s / f.floor_mb_s
    );
    println!(
        "  copy {} ms, frozen {} ms (reads and writes of the range answered Retry)",
        f.copy_ms, f.frozen_ms
    );
    f.latency.print();
}

type Outcome = (
    Phase,
    Phase,
    rampart_common::protocol::coordinator::MovedTablets,
    u64,
    u64,
);

async fn bench(args: &MigrateArgs, coordinator: &str, seed: u64) -> Result<Outcome> {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..Default::default()
    };
    let coordinators: Vec<&str> = coordinator.split(',').collect();
    let admin = Client::connect_with(&coordinators, options.clone()).await?;
    let table = admin.create_table("migrate", 1).await?;
    let records = (args.mb << 20) / args.value_bytes as u64;
    let value = Bytes::from(vec![b'x'; args.value_bytes]);
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(Client::connect_with(&coordinators, options.clone()).await?);
    }
    load(&clients, table, records, &value).await?;
    let (source, target) = ends(coordinator, table).await?;
    let chooser = Arc::new(KeyChooser::new(records, args.zipf)?);
    let max_op = Arc::new(AtomicU64::new(0));

    eprintln!("load before the move: {} s", args.before_s);
    let mix = Load {
        table,
        chooser: &chooser,
        value: &value,
        read_fraction: 0.95,
        indexes: None,
        done: None,
    };
    let before = measure_for(&clients, &mix, args.before_s, &max_op, seed).await?;
    let stop = Arc::new(AtomicBool::new(false));
    eprintln!("moving {table} from {source} to {target} under the load");
    let started = Instant::now();
    let mover = {
        let (admin, stop) = (admin.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let moved = admin.move_tablets(table, 0, u64::MAX, target).await;
            let move_ms = started.elapsed().as_millis() as u64;
            stop.store(true, Ordering::SeqCst);
            moved.map(|moved| (moved, move_ms))
        })
    };
    let during = run_mix(&clients, &mix, &stop, &max_op, seed ^ 1).await?;
    let (mut moved, move_ms) = mover.await?.context("the move failed")?;
    let moved = moved
        .moves
        .pop()
        .context("nothing moved: the tablet was on the target already")?;
    Ok((
        before,
        during,
        moved,
        move_ms,
        max_op.load(Ordering::SeqCst),
    ))
}

/// The table's one owner, and another `Up` master.
pub(super) async fn ends(
    coordinator: &str,
    table: rampart_client::TableId,
) -> Result<(ServerId, ServerId)> {
    let set = CoordinatorSet::new(&coordinator.split(',').collect::<Vec<_>>());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let map = set
        .call::<GetTabletMap>(&RpcPool::new(), &TabletMapRequest {}, deadline)
        .await
        .map_err(|e| anyhow::anyhow!("no tablet map: {e}"))?;
    let source = map
        .tables
        .iter()
        .find(|t| t.id == table)
        .and_then(|t| t.tablets.first())
        .map(|t| t.owner)
        .context("the table has no tablet")?;
    let target = map
        .servers
        .iter()
        .find(|s| s.id != source && s.status == ServerStatus::Up && s.services.master)
        .map(|s| s.id)
        .context("no other master")?;
    Ok((source, target))
}

/// Bytes per slot of the floor's shared region (as a move's piece).
const FLOOR_CHUNK: usize = 1 << 20;

/// The floor's shared region: a file of two slots in `/dev/shm` (the temporary
/// directory where there is none), created new under this process's id, removed on
/// drop.
struct FloorRegion {
    path: std::path::PathBuf,
    file: std::fs::File,
}

impl FloorRegion {
    fn create() -> Result<FloorRegion> {
        let dir = std::path::Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("rampart-copy-floor-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let region = FloorRegion { path, file };
        region.file.set_len(2 * FLOOR_CHUNK as u64)?;
        Ok(region)
    }
}

impl Drop for FloorRegion {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The floor: `bytes` copied from this process into a shared-memory region and out of
/// it by a child process into its own (touched) memory, a 1 MiB slot at a time, two
/// slots in flight, each handed over by a byte on a pipe. MB/s.
pub fn copy_floor(bytes: u64) -> Result<f64> {
    let region = FloorRegion::create()?;
    // SAFETY: the file is this process's own, created and sized here; only the child
    // (which copies out of a slot between handovers) maps it besides.
    let mut shared = unsafe { memmap2::MmapMut::map_mut(&region.file) }?;
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .args(["bench", "copy-sink"])
        .arg(&region.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the floor's child")?;
    let mut to_child = child.stdin.take().context("no pipe to the child")?;
    let mut from_child = child.stdout.take().context("no pipe from the child")?;
    let source = vec![0x5au8; FLOOR_CHUNK];
    let chunks = bytes.div_ceil(FLOOR_CHUNK as u64).max(1);
    let mut ack = [0u8; 1];
    // The child maps and touches its memory before it says it is ready.
    from_child.read_exact(&mut ack)?;
    let started = Instant::now();
    for i in 0..chunks {
        if i >= 2 {
            from_child.read_exact(&mut ack)?;
        }
        let slot = (i % 2) as usize;
        shared[slot * FLOOR_CHUNK..(slot + 1) * FLOOR_CHUNK].copy_from_slice(&source);
        to_child.write_all(&[slot as u8])?;
    }
    for _ in 0..chunks.min(2) {
        from_child.read_exact(&mut ack)?;
    }
    let elapsed = started.elapsed();
    drop(to_child);
    child.wait()?;
    Ok((chunks * FLOOR_CHUNK as u64) as f64 / 1e6 / elapsed.as_secs_f64())
}

/// `rampart bench copy-sink REGION`: the floor's child. Maps REGION, touches a buffer of
/// its own, says it is ready, then for every slot number read on stdin copies that slot
/// into its buffer and answers a byte, until stdin closes.
#[derive(Args, Debug)]
pub struct CopySinkArgs {
    /// The shared region (two slots of 1 MiB).
    pub region: std::path::PathBuf,
}

/// Runs the floor's child.
pub fn run_sink(args: CopySinkArgs) -> Result<ExitCode> {
    let file = std::fs::File::open(&args.region)?;
    // SAFETY: the parent owns the region and writes a slot only before handing it over.
    let shared = unsafe { memmap2::Mmap::map(&file) }?;
    if shared.len() < 2 * FLOOR_CHUNK {
        bail!("the region is {} bytes, not two slots", shared.len());
    }
    let mut own = vec![1u8; FLOOR_CHUNK];
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&[1])?;
    stdout.flush()?;
    let mut slot = [0u8; 1];
    while stdin.read_exact(&mut slot).is_ok() {
        let at = usize::from(slot[0] & 1) * FLOOR_CHUNK;
        own.copy_from_slice(&shared[at..at + FLOOR_CHUNK]);
        stdout.write_all(&[own[FLOOR_CHUNK - 1]])?;
        stdout.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}
