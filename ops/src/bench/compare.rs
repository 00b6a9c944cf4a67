//! `rampart bench compare --peer redis`: Rampart and Redis on the same machine, in one
//! run, alternating, with the same workloads (issue 18).
//!
//! Three systems, started by the benchmark on loopback and stopped (by PID) afterwards:
//!
//! * `rampart` — a local cluster of `--servers` servers with R = `--replicas` (every
//!   acknowledged write is in R backups), one coordinator;
//! * `redis_wait` — Redis with `--replicas` replicas, every write followed by `WAIT R`
//!   (the closest Redis comes to a write acknowledged on R copies);
//! * `redis_async` — one Redis, no replication.
//!
//! Both Redis set-ups keep nothing on disk (`--save '' --appendonly no`): the comparison is
//! of acknowledged copies in memory, which is what Rampart acknowledges. The YCSB
//! workloads (`--workloads`, default write-only, A, B, C) run with the same records, value
//! size, Zipfian skew and closed-loop clients on each system. The run is cut into
//! `--rounds`; in each round every workload runs a slice on every system, the systems'
//! order rotating, so that a noisy machine's slow moments fall on all of them.
//!
//! Prints a table (throughput, read and write p50/p99 per system, and Rampart's
//! throughput over each Redis's), and with `--json FILE` writes the figures there and one
//! plot per comparison beside it (`FILE` without its extension, `-ycsb.svg`).
//! `--quick` runs a reduced version (10,000 records and operations, 2 rounds, 8 clients)
//! in well under two minutes. Redis must be installed (`redis-server`, Debian's
//! `redis-server` package); the benchmark says so plainly if it is not.
//!
//! **The loss of a server holding `--loss-gib`** (1 KB objects; `--no-loss` skips it):
//! Rampart's client-observed unavailability through the crash recovery of a master
//! holding that much (`rampart bench recovery` as a child, R = `--replicas`, R + 2
//! servers), against a Redis holding as much, persisted as an RDB snapshot (`SAVE`) or as
//! its append-only file (`everysec`, after its rewrites settled and the next fsync),
//! killed with SIGKILL and restarted at once on its files: kill → the last object written
//! is served again; and against Redis Sentinel failover (a primary holding as much, 2
//! replicas, 3 sentinels with the lowest of `--sentinel-down-after-ms` that held
//! `--sentinel-stable-s` under a write load without a sentinel deeming the primary down,
//! the primary killed: until the address the sentinels give takes a write and serves the
//! last object). Plotted beside the JSON as `-loss.svg`.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rampart_client::{Client, ClientOptions, TableId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::plot_path;
use super::resp::{RespConnection, Value};
use super::ycsb::{histogram, key, KeyChooser, RemoveOnDrop, Workload};
use crate::cluster::{self, UpArgs};

/// The systems compared with Rampart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// Redis (`redis-server`).
    Redis,
}

/// `rampart bench compare`
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The system to compare with.
    #[arg(long, value_enum, default_value = "redis")]
    pub peer: Peer,
    /// YCSB workloads to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "write-only,a,b,c"
    )]
    pub workloads: Vec<Workload>,
    /// Objects loaded into each system before the runs.
    #[arg(long, default_value_t = 50_000)]
    pub records: u64,
    /// Operations per workload and system (all clients together, all rounds).
    #[arg(long, default_value_t = 50_000)]
    pub ops: u64,
    /// Closed-loop clients, each with its own connections.
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Zipfian skew (YCSB's default 0.99; 0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Rampart's servers.
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Copies beside the primary: Rampart's R, and Redis's replicas (`WAIT R`).
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Rounds the runs are cut into, alternating the systems.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// A reduced run (about 40 s): 10,000 records and operations, 2 rounds, 8 clients,
    /// 0.05 GiB lost, each Sentinel `down-after` held 2 s.
    #[arg(long)]
    pub quick: bool,
    /// Seed of the key and operation choices (printed; reuse to replay a run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to FILE, and the plots beside it.
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// GiB held by the server that is lost in the loss comparison (1 KB objects).
    #[arg(long, default_value_t = 1.0)]
    pub loss_gib: f64,
    /// Skip the loss comparison.
    #[arg(long)]
    pub no_loss: bool,
    /// Sentinel's `down-after-milliseconds` values to try, largest first: how long the
    /// primary must be unreachable before a sentinel deems it down. Lower fails over
    /// sooner and risks failing over a primary that was only busy (a long command, a
    /// fork for a snapshot, a loaded host). Each is held for `--sentinel-stable-s` under
    /// a write load; the failover is measured with the lowest one under which no
    /// sentinel deemed the live primary down.
    #[arg(long, value_delimiter = ',', default_value = "1000,500,200,100")]
    pub sentinel_down_after_ms: Vec<u64>,
    /// Seconds each `--sentinel-down-after-ms` value is held under load (2 with
    /// `--quick`).
    #[arg(long, default_value_t = 10)]
    pub sentinel_stable_s: u64,
}

/// The systems of one comparison, in their first round's order.
const SYSTEMS: [System; 3] = [System::Rampart, System::RedisWait, System::RedisAsync];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum System {
    Rampart,
    RedisWait,
    RedisAsync,
}

impl System {
    /// The name in the JSON's keys.
    fn key(self) -> &'static str {
        match self {
            System::Rampart => "rampart",
            System::RedisWait => "redis_wait",
            System::RedisAsync => "redis_async",
        }
    }

    fn label(self, replicas: u32) -> String {
        match self {
            System::Rampart => format!("rampart R={replicas}"),
            System::RedisWait => format!("redis WAIT {replicas}"),
            System::RedisAsync => "redis, no replicas".to_string(),
        }
    }
}

/// How long one Redis command may take before the benchmark fails.
const REDIS_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `WAIT` may wait for the replicas, in milliseconds.
const WAIT_TIMEOUT_MS: &str = "5000";

/// Pairs per `MSET` while loading Redis.
const LOAD_BATCH_PAIRS: usize = 256;

/// A `redis-server` child; killed (SIGKILL) and reaped when dropped.
struct RedisProcess {
    port: u16,
    child: Child,
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisProcess {
    /// Starts `redis-server` on a free loopback port, in memory only, with `extra`
    /// arguments; waits until it answers PING.
    fn start(dir: &std::path::Path, extra: &[String]) -> Result<RedisProcess> {
        let mut args: Vec<String> = ["--save", "", "--appendonly", "no"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        args.extend_from_slice(extra);
        RedisProcess::start_at(dir, free_port()?, &args)
    }

    /// Starts `redis-server` on `port` with its files in `dir` and `args` (persistence
    /// included); waits until it answers PING (a server loading its data answers
    /// `LOADING`, which is not yet an answer).
    fn start_at(dir: &std::path::Path, port: u16, args: &[String]) -> Result<RedisProcess> {
        let process = RedisProcess::spawn_at(dir, port, args)?;
        process.wait_ready()?;
        Ok(process)
    }

    /// Starts `redis-server` as [`start_at`](Self::start_at) does, without waiting.
    fn spawn_at(dir: &std::path::Path, port: u16, args: &[String]) -> Result<RedisProcess> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--protected-mode", "no"])
            .arg("--dir")
            .arg(dir)
            .args(["--logfile", &format!("redis-{port}.log")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start redis-server")?;
        Ok(RedisProcess { port, child })
    }

    /// Waits (10 s at most) until it answers PING.
    fn wait_ready(&self) -> Result<()> {
        let (process, port) = (self, self.port);
        let deadline = Instant::now() + Duration::from_secs(10);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        loop {
            let ping = runtime.block_on(async {
                let mut connection = RespConnection::connect(&process.addr()).await?;
                connection.call_ok(&[b"PING"], REDIS_CALL_TIMEOUT).await
            });
            if ping.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("redis-server on port {port} did not answer PING: {ping:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// What one workload measured on one system.
#[derive(Default)]
struct Measured {
    ops: BTreeMap<&'static str, Histogram<u64>>,
    run_s: f64,
}

impl Measured {
    fn total(&self) -> u64 {
        self.ops.values().map(Histogram::len).sum()
    }

    fn throughput(&self) -> f64 {
        if self.run_s > 0.0 {
            self.total() as f64 / self.run_s
        } else {
            0.0
        }
    }

    /// p-quantile of operation `name`, in µs.
    fn us(&self, name: &str, q: f64) -> Option<f64> {
        self.ops
            .get(name)
            .map(|h| h.value_at_quantile(q) as f64 / 1000.0)
    }
}

/// One closed-loop client's connection to one system.
enum Store<'a> {
    Rampart(&'a Client, TableId),
    Redis {
        connection: &'a mut RespConnection,
        /// Replicas every write waits for (`WAIT n`), if any.
        wait: Option<u32>,
    },
}

impl Store<'_> {
    async fn read(&mut self, key: &[u8]) -> Result<()> {
        match self {
            Store::Rampart(client, table) => {
                client.read(*table, key).await?;
            }
            Store::Redis { connection, .. } => {
                connection
                    .call_ok(&[b"GET", key], REDIS_CALL_TIMEOUT)
                    .await?;
            }
        }
        Ok(())
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        match self {
            Store::Rampart(client, table) => {
                client.write(*table, key, value).await?;
            }
            Store::Redis { connection, wait } => {
                connection
                    .call_ok(&[b"SET", key, value], REDIS_CALL_TIMEOUT)
                    .await?;
                if let Some(replicas) = *wait {
                    let wanted = replicas.to_string();
                    let reply = connection
                        .call_ok(
                            &[b"WAIT", wanted.as_bytes(), WAIT_TIMEOUT_MS.as_bytes()],
                            REDIS_CALL_TIMEOUT,
                        )
                        .await?;
                    match reply {
                        Value::Integer(n) if n >= i64::from(replicas) => {}
                        other => bail!("WAIT {replicas} answered {other:?}"),
                    }
                }
            }
        }
        Ok(())
    }
}

/// Runs the benchmark.
pub fn run(mut args: CompareArgs) -> Result<ExitCode> {
    crate::init_logging("warn");
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
        println!(
            "loss of a server holding {} GiB: rampart recovery {:.0} ms (client-observed); \
             redis restarted from its RDB {:.0} ms, from its AOF {:.0} ms, sentinel failover \
             {:.0} ms (down-after {} ms, the lowest stable under load) (kill to data served); \
             rampart's time over RDB's {:.2}x, over AOF's {:.2}x, over sentinel's {:.2}x",
            loss.gib,
            loss.rampart_ms,
            loss.rdb_ms,
            loss.aof_ms,
            loss.sentinel_ms,
            loss.sentinel_down_after_ms,
            loss.rampart_ms / loss.rdb_ms,
            loss.rampart_ms / loss.aof_ms,
            loss.rampart_ms / loss.sentinel_ms
        );
        Some(loss)
    };
    if let Some(path) = &args.json {
        let mut figures = json(&args, seed, &results);
        if let Some(loss) = &loss {
            figures["loss"] = serde_json::json!({
                "gib": loss.gib,
                "object_bytes": LOSS_OBJECT_BYTES,
                "rampart_unavailability_ms": loss.rampart_ms.round(),
                "redis_rdb_reload_ms": loss.rdb_ms.round(),
                "redis_aof_reload_ms": loss.aof_ms.round(),
            "redis_sentinel_failover_ms": loss.sentinel_ms.round(),
                "sentinel_down_after_ms": loss.sentinel_down_after_ms,
                "sentinel_stable_s": args.sentinel_stable_s,
                "sentinel_sweep": loss.sentinel_sweep.iter().map(|(ms, stable)| {
                    serde_json::json!({"down_after_ms": ms, "stable": stable})
                }).collect::<Vec<_>>(),
            });
        }
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

/// Bytes of each object in the loss comparison.
const LOSS_OBJECT_BYTES: usize = 1024;

/// Objects of [`LOSS_OBJECT_BYTES`] that make up `gib`.
fn loss_objects(gib: f64) -> u64 {
    ((gib * (1u64 << 30) as f64) / LOSS_OBJECT_BYTES as f64)
        .round()
        .max(1.0) as u64
}

/// Connections filling a Redis at once.
const LOSS_LOADERS: usize = 4;

/// How long a reload or a recovery may take before the benchmark gives up.
const LOSS_TIMEOUT: Duration = Duration::from_secs(600);

/// What losing a server holding `gib` costs each system: milliseconds from the kill
/// until its data is served again.
#[derive(Debug)]
struct Loss {
    gib: f64,
    rampart_ms: f64,
    rdb_ms: f64,
    aof_ms: f64,
    sentinel_ms: f64,
    /// The `down-after-milliseconds` the failover was measured with.
    sentinel_down_after_ms: u64,
    /// Each value tried, and whether it held under load.
    sentinel_sweep: Vec<(u64, bool)>,
}

/// How a Redis keeps its data on disk.
#[derive(Clone, Copy, Debug)]
enum Persistence {
    /// An RDB snapshot (`SAVE`) taken after the load.
    Rdb,
    /// The append-only file, `appendfsync everysec` (Redis rewrites it as it grows).
    Aof,
}

fn measure_loss(args: &CompareArgs, scratch: &std::path::Path) -> Result<Loss> {
    let rampart_ms = rampart_loss(args, scratch)?;
    let rdb_ms = redis_reload(args.loss_gib, scratch, Persistence::Rdb)?;
    let aof_ms = redis_reload(args.loss_gib, scratch, Persistence::Aof)?;
    let sentinel = sentinel_failover(args, scratch)?;
    Ok(Loss {
        gib: args.loss_gib,
        rampart_ms,
        rdb_ms,
        aof_ms,
        sentinel_ms: sentinel.failover_ms,
        sentinel_down_after_ms: sentinel.down_after_ms,
        sentinel_sweep: sentinel.sweep,
    })
}

/// Sentinels watching the primary of the failover measurement (a quorum of 2).
const SENTINELS: usize = 3;

/// The name the sentinels know the primary by.
const SENTINEL_MASTER: &str = "compare";

/// Writers of the stability probe.
const PROBE_WRITERS: usize = 16;

/// Keys the stability probe overwrites (bounded, so the probe adds at most this many
/// objects to the primary).
const PROBE_KEYS: u64 = 10_000;

/// What the sentinels' logs say when one of them deems the primary down, or fails over.
const DOWN_EVENTS: [&str; 4] = ["+sdown master", "+odown", "+try-failover", "+switch-master"];

/// The Sentinel failover measured, and with which `down-after-milliseconds`.
struct SentinelFailover {
    failover_ms: f64,
    down_after_ms: u64,
    sweep: Vec<(u64, bool)>,
}

/// Redis Sentinel failover: a primary holding `--loss-gib` with 2 replicas and 3
/// sentinels; the most aggressive `down-after-milliseconds` of
/// `--sentinel-down-after-ms` that holds under load (each value, largest first, set on
/// every sentinel and held for `--sentinel-stable-s` while 16 writers overwrite keys on
/// the primary; it holds if no sentinel logged the primary down); then the primary
/// killed with SIGKILL: milliseconds until the address the sentinels give takes a write
/// and serves the last object written. In memory only (the replicas hold the data).
fn sentinel_failover(args: &CompareArgs, scratch: &std::path::Path) -> Result<SentinelFailover> {
    let dir = scratch.join("redis-sentinel");
    std::fs::create_dir_all(&dir)?;
    let primary = RedisProcess::start(&dir, &[])?;
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(RedisProcess::start(
            &dir,
            &[
                "--replicaof".to_string(),
                "127.0.0.1".to_string(),
                primary.port.to_string(),
            ],
        )?);
    }
    let mut sentinels = Vec::new();
    for i in 0..SENTINELS {
        let port = free_port()?;
        let config = dir.join(format!("sentinel-{i}.conf"));
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\nlogfile sentinel-{i}.log\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} {}\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
                 sentinel parallel-syncs {SENTINEL_MASTER} 2\n",
                dir.display(),
                primary.port,
                args.sentinel_down_after_ms[0]
            ),
        )?;
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start redis-server --sentinel")?;
        let sentinel = RedisProcess { port, child };
        sentinel.wait_ready()?;
        sentinels.push(sentinel);
    }
    let objects = loss_objects(args.loss_gib);
    println!("loss: redis sentinel failover, {objects} objects of {LOSS_OBJECT_BYTES} B");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let sentinel_addr = sentinels[0].addr();
    let primary_addr = primary.addr();
    let replica_addrs: Vec<String> = replicas.iter().map(RedisProcess::addr).collect();
    runtime.block_on(async {
        fill_redis(&primary_addr, objects, None).await?;
        let mut connection = RespConnection::connect(&primary_addr).await?;
        let synced = connection
            .call_ok(&[b"WAIT", b"2", b"120000"], Duration::from_secs(130))
            .await?;
        if synced != Value::Integer(2) {
            bail!("the replicas did not take the load: WAIT answered {synced:?}");
        }
        // WAIT counts a replica once its full sync's transfer ended, before it has loaded
        // what it received; a replica still loading cannot be promoted (the sentinels'
        // first attempt would time out). Wait until both serve.
        for addr in &replica_addrs {
            let mut replica = RespConnection::connect(addr).await?;
            let deadline = Instant::now() + LOSS_TIMEOUT;
            loop {
                let info = replica.call(&[b"INFO"], REDIS_CALL_TIMEOUT).await?;
                let ready = matches!(&info, Value::Bulk(Some(bytes)) if {
                    let text = String::from_utf8_lossy(bytes);
                    text.contains("loading:0") && text.contains("master_link_status:up")
                });
                if ready {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("replica {addr} did not load the primary's data in time");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // The sentinels have found the replicas and each other (hello messages every 2 s).
        let mut sentinel = RespConnection::connect(&sentinel_addr).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let known = |reply: Value| match reply {
                Value::Array(Some(items)) => items.len(),
                _ => 0,
            };
            let replicas = known(
                sentinel
                    .call_ok(
                        &[b"SENTINEL", b"replicas", SENTINEL_MASTER.as_bytes()],
                        REDIS_CALL_TIMEOUT,
                    )
                    .await?,
            );
            let peers = known(
                sentinel
                    .call_ok(
                        &[b"SENTINEL", b"sentinels", SENTINEL_MASTER.as_bytes()],
                        REDIS_CALL_TIMEOUT,
                    )
                    .await?,
            );
            if replicas == 2 && peers == SENTINELS - 1 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the sentinels did not find the replicas and each other within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })?;
    let sentinel_addrs: Vec<String> = sentinels.iter().map(RedisProcess::addr).collect();
    let logs: Vec<std::path::PathBuf> = (0..SENTINELS)
        .map(|i| dir.join(format!("sentinel-{i}.log")))
        .collect();
    let mut sweep = Vec::new();
    let mut chosen = None;
    for &down_after in &args.sentinel_down_after_ms {
        let events = runtime.block_on(probe_stability(
            &primary_addr,
            &sentinel_addrs,
            &logs,
            down_after,
            Duration::from_secs(args.sentinel_stable_s),
        ))?;
        let stable = events.is_empty();
        println!(
            "loss: sentinel down-after {down_after} ms under load for {} s: {}",
            args.sentinel_stable_s,
            if stable {
                "held".to_string()
            } else {
                format!("primary deemed down ({})", events.join("; "))
            }
        );
        sweep.push((down_after, stable));
        if events.iter().any(|e| e.contains("+switch-master")) {
            bail!(
                "down-after {down_after} ms failed the live primary over under load; \
                 try larger --sentinel-down-after-ms values"
            );
        }
        if !stable {
            break;
        }
        chosen = Some(down_after);
    }
    let Some(down_after) = chosen else {
        bail!(
            "no --sentinel-down-after-ms value held under load (tried {:?})",
            args.sentinel_down_after_ms
        );
    };
    runtime.block_on(async {
        for addr in &sentinel_addrs {
            set_down_after(addr, down_after).await?;
        }
        // Let a sentinel that deemed the primary down see it up again.
        tokio::time::sleep(Duration::from_millis(down_after.max(1000) * 2)).await;
        anyhow::Ok(())
    })?;
    let last = key(objects - 1);
    let old_port = primary.port.to_string();
    let killed = Instant::now();
    drop(primary);
    let served = runtime.block_on(async {
        loop {
            if killed.elapsed() > LOSS_TIMEOUT {
                bail!("no failover within {LOSS_TIMEOUT:?}");
            }
            if let Some(addr) = failed_over_to(&sentinel_addr, &old_port).await {
                if let Ok(mut connection) = RespConnection::connect(&addr).await {
                    let wrote = connection
                        .call(&[b"SET", b"failover-probe", b"1"], REDIS_CALL_TIMEOUT)
                        .await;
                    let read = connection.call(&[b"GET", &last], REDIS_CALL_TIMEOUT).await;
                    if matches!(wrote, Ok(Value::Simple(_)))
                        && matches!(read, Ok(Value::Bulk(Some(_))))
                    {
                        return Ok(killed.elapsed());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })?;
    drop((replicas, sentinels));
    Ok(SentinelFailover {
        failover_ms: served.as_secs_f64() * 1e3,
        down_after_ms: down_after,
        sweep,
    })
}

/// Sets `down-after-milliseconds` on the sentinel at `addr`.
async fn set_down_after(addr: &str, ms: u64) -> Result<()> {
    let mut sentinel = RespConnection::connect(addr).await?;
    let ms = ms.to_string();
    sentinel
        .call_ok(
            &[
                b"SENTINEL",
                b"SET",
                SENTINEL_MASTER.as_bytes(),
                b"down-after-milliseconds",
                ms.as_bytes(),
            ],
            REDIS_CALL_TIMEOUT,
        )
        .await?;
    Ok(())
}

/// Sets `down_after` on every sentinel, then overwrites keys on the primary from
/// [`PROBE_WRITERS`] connections for `hold`; returns the lines the sentinels logged
/// meanwhile that deem the primary down or fail it over ([`DOWN_EVENTS`]).
async fn probe_stability(
    primary: &str,
    sentinels: &[String],
    logs: &[std::path::PathBuf],
    down_after: u64,
    hold: Duration,
) -> Result<Vec<String>> {
    for addr in sentinels {
        set_down_after(addr, down_after).await?;
    }
    let from: Vec<u64> = logs
        .iter()
        .map(|log| std::fs::metadata(log).map_or(0, |m| m.len()))
        .collect();
    let value = vec![b'p'; LOSS_OBJECT_BYTES];
    let until = Instant::now() + hold;
    let writers = (0..PROBE_WRITERS as u64).map(|w| {
        let value = &value;
        async move {
            let mut connection = RespConnection::connect(primary).await?;
            let mut i = w;
            while Instant::now() < until {
                let key = format!("stability-probe-{}", i % PROBE_KEYS);
                connection
                    .call_ok(&[b"SET", key.as_bytes(), value], REDIS_CALL_TIMEOUT)
                    .await?;
                i += PROBE_WRITERS as u64;
            }
            anyhow::Ok(())
        }
    });
    for result in futures::future::join_all(writers).await {
        result?;
    }
    let mut events = Vec::new();
    for (log, from) in logs.iter().zip(from) {
        let text = std::fs::read(log).unwrap_or_default();
        let new = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
        events.extend(
            new.lines()
                .filter(|line| DOWN_EVENTS.iter().any(|e| line.contains(e)))
                .map(|line| line.trim().to_string()),
        );
    }
    Ok(events)
}

/// The primary's address the sentinel at `sentinel` gives, if it is no longer the one
/// on `old_port`.
async fn failed_over_to(sentinel: &str, old_port: &str) -> Option<String> {
    let mut connection = RespConnection::connect(sentinel).await.ok()?;
    let reply = connection
        .call(
            &[
                b"SENTINEL",
                b"get-master-addr-by-name",
                SENTINEL_MASTER.as_bytes(),
            ],
            REDIS_CALL_TIMEOUT,
        )
        .await
        .ok()?;
    let Value::Array(Some(items)) = reply else {
        return None;
    };
    match items.as_slice() {
        [Value::Bulk(Some(host)), Value::Bulk(Some(port))]
            if port.as_slice() != old_port.as_bytes() =>
        {
            Some(format!(
                "{}:{}",
                String::from_utf8_lossy(host),
                String::from_utf8_lossy(port)
            ))
        }
        _ => None,
    }
}

/// Rampart's client-observed unavailability through the crash recovery of a master
/// holding `--loss-gib`: `rampart bench recovery` (R = `--replicas`, R + 2 servers so the
/// survivors still find R backups), run as a child, its JSON read back.
fn rampart_loss(args: &CompareArgs, scratch: &std::path::Path) -> Result<f64> {
    let json = scratch.join("recovery.json");
    let servers = args.servers.max(args.replicas + 2);
    let data_mb = ((args.loss_gib * 1024.0).round() as u64).max(1);
    println!(
        "loss: rampart bench recovery, {servers} servers, R = {}, {data_mb} MB",
        args.replicas
    );
    let status = Command::new(std::env::current_exe()?)
        .args(["bench", "recovery", "--servers", &servers.to_string()])
        .args(["--replicas", &args.replicas.to_string()])
        .args(["--data-mb", &data_mb.to_string()])
        .args(["--object-bytes", &LOSS_OBJECT_BYTES.to_string()])
        .arg("--json")
        .arg(&json)
        .arg("--svg")
        .arg(scratch.join("recovery.svg"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .context("cannot run rampart bench recovery")?;
    if !status.success() {
        bail!("rampart bench recovery failed ({status})");
    }
    let figures: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    figures["unavailability_ms"]
        .as_f64()
        .context("bench recovery wrote no unavailability_ms")
}

/// A Redis holding `gib` of 1 KB objects, persisted as `persistence` says, killed with
/// SIGKILL and restarted at once on its files (as a supervisor would): milliseconds from
/// the kill until a GET of the last object written is answered.
fn redis_reload(gib: f64, scratch: &std::path::Path, persistence: Persistence) -> Result<f64> {
    let dir = scratch.join(format!("redis-{persistence:?}").to_lowercase());
    std::fs::create_dir_all(&dir)?;
    let config: Vec<String> = match persistence {
        Persistence::Rdb => vec!["--save", "", "--appendonly", "no"],
        Persistence::Aof => vec![
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
        ],
    }
    .into_iter()
    .map(str::to_string)
    .collect();
    let port = free_port()?;
    let redis = RedisProcess::start_at(&dir, port, &config)?;
    let addr = redis.addr();
    let objects = loss_objects(gib);
    println!("loss: redis {persistence:?}, {objects} objects of {LOSS_OBJECT_BYTES} B");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(fill_redis(&addr, objects, Some(persistence)))?;
    let last = key(objects - 1);
    let killed = Instant::now();
    drop(redis);
    let restarted = RedisProcess::spawn_at(&dir, port, &config)?;
    let served = runtime.block_on(async {
        loop {
            if killed.elapsed() > LOSS_TIMEOUT {
                bail!("redis did not serve its data again within {LOSS_TIMEOUT:?}");
            }
            if let Ok(mut connection) = RespConnection::connect(&addr).await {
                if let Ok(Value::Bulk(Some(_))) =
                    connection.call(&[b"GET", &last], REDIS_CALL_TIMEOUT).await
                {
                    return Ok(killed.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })?;
    drop(restarted);
    Ok(served.as_secs_f64() * 1e3)
}

/// Fills the Redis at `addr` with `objects` 1 KB objects, then makes them durable:
/// `SAVE` for an RDB; for the AOF, waits for any rewrite to end and for the next
/// once-a-second fsync.
async fn fill_redis(addr: &str, objects: u64, persistence: Option<Persistence>) -> Result<()> {
    let mut loaders = Vec::with_capacity(LOSS_LOADERS);
    for _ in 0..LOSS_LOADERS {
        loaders.push(RespConnection::connect(addr).await?);
    }
    let value = Bytes::from(vec![b'v'; LOSS_OBJECT_BYTES]);
    load_redis(&mut loaders, objects, &value).await?;
    let mut connection = RespConnection::connect(addr).await?;
    match persistence {
        None => {}
        Some(Persistence::Rdb) => {
            connection.call_ok(&[b"SAVE"], LOSS_TIMEOUT).await?;
        }
        Some(Persistence::Aof) => {
            let deadline = Instant::now() + LOSS_TIMEOUT;
            loop {
                let info = connection
                    .call_ok(&[b"INFO", b"persistence"], REDIS_CALL_TIMEOUT)
                    .await?;
                let text = match info {
                    Value::Bulk(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                    other => bail!("INFO answered {other:?}"),
                };
                if text.contains("aof_rewrite_in_progress:0")
                    && text.contains("aof_rewrite_scheduled:0")
                {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("the AOF rewrite did not end within {LOSS_TIMEOUT:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // `everysec`: what was written is on disk a second later at the latest.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }
    Ok(())
}

fn redis_server_version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|text| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "(unknown version)".to_string())
}

type Results = BTreeMap<(Workload, System), Measured>;

async fn compare(
    args: &CompareArgs,
    coordinator: &str,
    primary: &str,
    standalone: &str,
    seed: u64,
) -> Result<Results> {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..Default::default()
    };
    let coordinators: Vec<&str> = coordinator.split(',').collect();
    let admin = Client::connect_with(&coordinators, options.clone()).await?;
    let table = admin.create_table("compare", args.servers).await?;
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(Client::connect_with(&coordinators, options.clone()).await?);
    }
    let mut waiting = Vec::new();
    let mut asynchronous = Vec::new();
    for _ in 0..args.clients {
        waiting.push(RespConnection::connect(primary).await?);
        asynchronous.push(RespConnection::connect(standalone).await?);
    }
    let value = Bytes::from(vec![b'x'; args.value_bytes]);
    super::ycsb::load(&clients, table, args.records, &value).await?;
    load_redis(&mut waiting, args.records, &value).await?;
    load_redis(&mut asynchronous, args.records, &value).await?;
    // Every replica has the loaded data before the runs.
    let wanted = args.replicas.to_string();
    let synced = waiting[0]
        .call_ok(
            &[b"WAIT", wanted.as_bytes(), b"60000"],
            Duration::from_secs(70),
        )
        .await?;
    if synced != Value::Integer(i64::from(args.replicas)) {
        bail!("Redis replicas did not take the load: WAIT answered {synced:?}");
    }

    let chooser = Arc::new(KeyChooser::new(args.records, args.zipf)?);
    let per_slice = args.ops / u64::from(args.rounds) / u64::from(args.clients);
    let mut results: Results = BTreeMap::new();
    let mut rngs: Vec<SmallRng> = (0..args.clients)
        .map(|c| SmallRng::seed_from_u64(seed ^ u64::from(c).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .collect();
    let progress = crate::progress::Progress::new(
        "comparing",
        per_slice
            * u64::from(args.clients)
            * u64::from(args.rounds)
            * args.workloads.len() as u64
            * SYSTEMS.len() as u64,
        "ops",
    );
    for round in 0..args.rounds {
        for &workload in &args.workloads {
            for i in 0..SYSTEMS.len() {
                let system = SYSTEMS[(i + round as usize) % SYSTEMS.len()];
                let stores: Vec<Store<'_>> = match system {
                    System::Rampart => clients.iter().map(|c| Store::Rampart(c, table)).collect(),
                    System::RedisWait => waiting
                        .iter_mut()
                        .map(|connection| Store::Redis {
                            connection,
                            wait: Some(args.replicas),
                        })
                        .collect(),
                    System::RedisAsync => asynchronous
                        .iter_mut()
                        .map(|connection| Store::Redis {
                            connection,
                            wait: None,
                        })
                        .collect(),
                };
                let started = Instant::now();
                let runs = stores
                    .into_iter()
                    .zip(rngs.iter_mut())
                    .map(|(mut store, rng)| {
                        let chooser = Arc::clone(&chooser);
                        let value = value.clone();
                        let progress = &progress;
                        async move {
                            let mut ops: BTreeMap<&'static str, Histogram<u64>> = BTreeMap::new();
                            for _ in 0..per_slice {
                                let k = key(chooser.next(rng));
                                let start = Instant::now();
                                let name = if rng.gen_bool(workload.read_fraction()) {
                                    store.read(&k).await?;
                                    "read"
                                } else {
                                    store.update(&k, &value).await?;
                                    "update"
                                };
                                let nanos = start.elapsed().as_nanos() as u64;
                                ops.entry(name)
                                    .or_insert_with(histogram)
                                    .record(nanos.max(1))?;
                                progress.inc(1);
                            }
                            Ok::<_, anyhow::Error>(ops)
                        }
                    });
                let outcomes = futures::future::join_all(runs).await;
                let elapsed = started.elapsed().as_secs_f64();
                let measured = results.entry((workload, system)).or_default();
                measured.run_s += elapsed;
                for outcome in outcomes {
                    for (name, h) in outcome.with_context(|| system.label(args.replicas))? {
                        measured.ops.entry(name).or_insert_with(histogram).add(&h)?;
                    }
                }
            }
        }
    }
    progress.finish();
    Ok(results)
}

/// Loads records `0..records` through `connections` (each its share) with `MSET`.
async fn load_redis(connections: &mut [RespConnection], records: u64, value: &Bytes) -> Result<()> {
    let count = connections.len() as u64;
    let loads = connections.iter_mut().enumerate().map(|(c, connection)| {
        let share: Vec<u64> = (0..records).filter(|i| i % count == c as u64).collect();
        async move {
            for chunk in share.chunks(LOAD_BATCH_PAIRS) {
                let keys: Vec<Vec<u8>> = chunk.iter().map(|i| key(*i)).collect();
                let mut request: Vec<&[u8]> = vec![b"MSET"];
                for k in &keys {
                    request.push(k);
                    request.push(value);
                }
                connection.call_ok(&request, REDIS_CALL_TIMEOUT).await?;
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    for outcome in futures::future::join_all(loads).await {
        outcome?;
    }
    Ok(())
}

fn print_table(args: &CompareArgs, seed: u64, results: &Results) {
    println!(
        "{} records, {} ops per workload and system, {} clients, {}-byte values, zipf {}, \
         {} rounds, seed {seed}",
        args.records, args.ops, args.clients, args.value_bytes, args.zipf, args.rounds
    );
    println!(
        "{:<11} {:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>14}",
        "workload",
        "system",
        "ops/s",
        "read_p50",
        "read_p99",
        "write_p50",
        "write_p99",
        "rampart/this"
    );
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    for &workload in &args.workloads {
        let rampart = results
            .get(&(workload, System::Rampart))
            .map_or(0.0, Measured::throughput);
        for system in SYSTEMS {
            let Some(m) = results.get(&(workload, system)) else {
                continue;
            };
            let ratio = if system == System::Rampart || m.throughput() == 0.0 {
                String::new()
            } else {
                format!("{:.2}x", rampart / m.throughput())
            };
            println!(
                "{:<11} {:<20} {:>9.0} {:>9} {:>9} {:>9} {:>9} {:>14}",
                workload.name(),
                system.label(args.replicas),
                m.throughput(),
                us(m.us("read", 0.5)),
                us(m.us("read", 0.99)),
                us(m.us("update", 0.5)),
                us(m.us("update", 0.99)),
                ratio
            );
        }
    }
    println!("latencies in µs; Redis keeps nothing on disk; every Rampart write is in R backups");
}

fn json(args: &CompareArgs, seed: u64, results: &Results) -> serde_json::Value {
    let mut ycsb = serde_json::Map::new();
    for &workload in &args.workloads {
        let mut figures = serde_json::Map::new();
        for system in SYSTEMS {
            let Some(m) = results.get(&(workload, system)) else {
                continue;
            };
            let name = system.key();
            figures.insert(format!("{name}_ops_s"), m.throughput().into());
            for (op, field) in [("update", "write"), ("read", "read")] {
                for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
                    if let Some(v) = m.us(op, q) {
                        figures.insert(format!("{name}_{field}_{label}_us"), v.into());
                    }
                }
            }
        }
        ycsb.insert(workload.name().to_string(), figures.into());
    }
    serde_json::json!({
        "conditions": {
            "records": args.records,
            "ops": args.ops,
            "clients": args.clients,
            "value_bytes": args.value_bytes,
            "zipf": args.zipf,
            "rounds": args.rounds,
            "servers": args.servers,
            "replicas": args.replicas,
            "seed": seed,
            "redis": redis_server_version(),
        },
        "ycsb": ycsb,
    })
}

/// Throughput per workload, a bar per system.
fn write_svg(path: &std::path::Path, args: &CompareArgs, results: &Results) -> Result<()> {
    use plotters::prelude::{
        ChartBuilder, Color, IntoDrawingArea, IntoSegmentedCoord, RGBColor, Rectangle, SVGBackend,
        SegmentValue, BLACK, WHITE,
    };
    const COLOURS: [RGBColor; 3] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0xff, 0x7f, 0x0e),
    ];
    let workloads = &args.workloads;
    let y_max = results
        .values()
        .map(Measured::throughput)
        .fold(0.0_f64, f64::max)
        * 1.35;
    if y_max <= 0.0 {
        bail!("nothing to plot");
    }
    let slots = workloads.len() * (SYSTEMS.len() + 1);
    let draw = || -> Result<()> {
        let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = format!(
            "bench compare: ops/s, {} clients, {} records, {}-byte values, zipf {}",
            args.clients, args.records, args.value_bytes, args.zipf
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 16))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d((0..slots as i32).into_segmented(), 0.0..y_max)?;
        let names: Vec<&str> = workloads.iter().map(|w| w.name()).collect();
        let per = SYSTEMS.len() + 1;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(slots)
            .x_label_formatter(&|v| match v {
                SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => {
                    let i = *i as usize;
                    if i % per == 1 {
                        names.get(i / per).map_or(String::new(), |n| n.to_string())
                    } else {
                        String::new()
                    }
                }
                SegmentValue::Last => String::new(),
            })
            .y_desc("operations/s")
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .draw()?;
        for (w, workload) in workloads.iter().enumerate() {
            for (s, system) in SYSTEMS.iter().enumerate() {
                let Some(m) = results.get(&(*workload, *system)) else {
                    continue;
                };
                let x = (w * per + s) as i32;
                let bar = chart.draw_series(std::iter::once(Rectangle::new(
                    [
                        (SegmentValue::Exact(x), 0.0),
                        (SegmentValue::Exact(x + 1), m.throughput()),
                    ],
                    COLOURS[s].filled(),
                )))?;
                // One legend entry per system.
                if w == 0 {
                    bar.label(system.label(args.replicas))
                        .legend(move |(x, y)| {
                            Rectangle::new([(x, y - 5), (x + 10, y + 5)], COLOURS[s].filled())
                        });
                }
            }
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.9))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().with_context(|| format!("cannot write {}", path.display()))
}

/// The loss comparison: milliseconds until the data is served again, a bar per system.
fn write_loss_svg(path: &std::path::Path, loss: &Loss) -> Result<()> {
    use plotters::prelude::{
        ChartBuilder, Color, IntoDrawingArea, IntoSegmentedCoord, RGBColor, Rectangle, SVGBackend,
        SegmentValue, WHITE,
    };
    let bars = [
        (
            "rampart: crash recovery",
            loss.rampart_ms,
            RGBColor(0x1f, 0x77, 0xb4),
        ),
        (
            "redis: restart from RDB",
            loss.rdb_ms,
            RGBColor(0xd6, 0x27, 0x28),
        ),
        (
            "redis: restart from AOF",
            loss.aof_ms,
            RGBColor(0xff, 0x7f, 0x0e),
        ),
        (
            "redis: sentinel failover",
            loss.sentinel_ms,
            RGBColor(0x2c, 0xa0, 0x2c),
        ),
    ];
    let y_max = bars.iter().map(|b| b.1).fold(0.0_f64, f64::max) * 1.2;
    if y_max <= 0.0 {
        bail!("nothing to plot");
    }
    let draw = || -> Result<()> {
        let root = SVGBackend::new(path, (820, 460)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = format!(
            "bench compare: loss of a server holding {} GiB, kill to data served again",
            loss.gib
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 15))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d((0..bars.len() as i32).into_segmented(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => bars
                    .get(*i as usize)
                    .map_or(String::new(), |b| b.0.to_string()),
                SegmentValue::Last => String::new(),
            })
            .y_desc("milliseconds")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (i, (_, ms, colour)) in bars.iter().enumerate() {
            let i = i as i32;
            chart.draw_series(std::iter::once(Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), *ms),
                ],
                colour.filled(),
            )))?;
        }
        root.present()?;
        Ok(())
    };
    draw().with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_go_beside_the_json() {
        assert_eq!(
            plot_path(std::path::Path::new("out/compare.json"), "ycsb"),
            std::path::Path::new("out/compare-ycsb.svg")
        );
    }
}
