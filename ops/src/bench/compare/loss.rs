//! The loss of a server holding `--loss-gib`: Rampart's client-observed unavailability
//! through the crash recovery of a master (`rampart bench recovery`, run as a child), and
//! a Redis holding as much, persisted as an RDB snapshot or as its append-only file,
//! killed with SIGKILL and restarted at once on its files. Each server takes the same
//! write load for `--loss-write-ms` until its kill ([`lost_writes`]); what it
//! acknowledged and is missing once the data is served again is counted.
//!
//! [`lost_writes`]: crate::bench::lost_writes

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::args::CompareArgs;
use super::redis::{free_port, load_redis, RedisProcess, REDIS_CALL_TIMEOUT};
use crate::bench::lost_writes::{loss_key, write_until, LostWrites, LOSS_KEYS, LOSS_WRITERS};
use crate::bench::recovery_time::RecoveryFigures;
use crate::bench::resp::{RespConnection, Value};
use crate::bench::ycsb::key;

/// Bytes of each object in the loss comparison.
pub(super) const LOSS_OBJECT_BYTES: usize = 1024;

/// Objects of [`LOSS_OBJECT_BYTES`] that make up `gib`.
pub(super) fn loss_objects(gib: f64) -> u64 {
    ((gib * (1u64 << 30) as f64) / LOSS_OBJECT_BYTES as f64)
        .round()
        .max(1.0) as u64
}

/// Keys of the write load read back per `MGET`.
const LOSS_READ_BATCH: usize = 500;

/// Connections filling a Redis at once.
const LOSS_LOADERS: usize = 4;

/// How long a reload or a recovery may take before the benchmark gives up.
pub(super) const LOSS_TIMEOUT: Duration = Duration::from_secs(600);

/// What losing a server holding `gib` costs each system: milliseconds from the kill
/// until its data is served again.
#[derive(Debug)]
pub(super) struct Loss {
    pub(super) gib: f64,
    pub(super) rampart_ms: f64,
    pub(super) rdb_ms: f64,
    pub(super) aof_ms: f64,
    pub(super) sentinel_ms: f64,
    /// The write load's outcome on each system.
    pub(super) rampart_lost: LostWrites,
    pub(super) rdb_lost: LostWrites,
    pub(super) aof_lost: LostWrites,
    pub(super) sentinel_lost: LostWrites,
    /// The `down-after-milliseconds` the failover was measured with.
    pub(super) sentinel_down_after_ms: u64,
    /// Each value tried, and whether it held under load.
    pub(super) sentinel_sweep: Vec<(u64, bool)>,
}

/// How a Redis keeps its data on disk.
#[derive(Clone, Copy, Debug)]
pub(super) enum Persistence {
    /// An RDB snapshot (`SAVE`) taken after the load.
    Rdb,
    /// The append-only file, `appendfsync everysec` (Redis rewrites it as it grows).
    Aof,
}

/// Rampart's client-observed unavailability through the crash recovery of a master
/// holding `--loss-gib`: `rampart bench recovery` (R = `--replicas`, R + 2 servers so the
/// survivors still find R backups, the write load for `--loss-write-ms` until the kill),
/// run as a child, its JSON read back.
pub(super) fn rampart_loss(
    args: &CompareArgs,
    scratch: &std::path::Path,
) -> Result<(f64, LostWrites)> {
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
        .args(["--write-until-kill-ms", &args.loss_write_ms.to_string()])
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
        // Its JSON is written before it fails on a check (objects, lost writes).
        let lost = RecoveryFigures::read(&json)
            .ok()
            .and_then(|f| f.lost_writes);
        if let Some(lost) = lost.filter(|&lost| lost > 0) {
            bail!("rampart lost {lost} acknowledged writes of the load: a durability bug");
        }
        bail!("rampart bench recovery failed ({status})");
    }
    let figures = RecoveryFigures::read(&json)?;
    let (Some(acknowledged), Some(lost)) = (figures.writes_acknowledged, figures.lost_writes)
    else {
        bail!("rampart bench recovery did not count the write load's lost writes");
    };
    let lost = LostWrites {
        acknowledged,
        lost,
        foreign: 0,
    };
    Ok((figures.unavailability_ms, lost))
}

/// A Redis holding `gib` of 1 KB objects, persisted as `persistence` says, under the
/// write load for `write_ms`, killed with SIGKILL and restarted at once on its files (as
/// a supervisor would): milliseconds from the kill until a GET of the last object
/// written is answered, and the load's writes lost.
pub(super) fn redis_reload(
    gib: f64,
    write_ms: u64,
    scratch: &std::path::Path,
    persistence: Persistence,
) -> Result<(f64, LostWrites)> {
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
    let (acknowledged, killed) =
        runtime.block_on(write_until_kill(&addr, write_ms, move || drop(redis)))?;
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
    let lost = runtime.block_on(count_lost(&addr, &acknowledged))?;
    drop(restarted);
    Ok((served.as_secs_f64() * 1e3, lost))
}

/// The write load on the Redis at `addr`: [`LOSS_WRITERS`] connections writing for
/// `write_ms`; then `kill` as they are told to stop. Returns the writes acknowledged (a
/// write in flight at the kill fails with its connection) and the moment of the kill.
pub(super) async fn write_until_kill(
    addr: &str,
    write_ms: u64,
    kill: impl FnOnce(),
) -> Result<(Vec<u64>, Instant)> {
    let mut connections = Vec::new();
    for _ in 0..LOSS_WRITERS {
        connections.push(RespConnection::connect(addr).await?);
    }
    let stop = AtomicBool::new(false);
    let stop = &stop;
    let writers = connections
        .into_iter()
        .zip(0..)
        .map(|(connection, w)| async move {
            let connection = tokio::sync::Mutex::new(connection);
            let connection = &connection;
            write_until(w, stop, |key, value| async move {
                let request: [&[u8]; 3] = [b"SET", &key, &value];
                let mut connection = connection.lock().await;
                connection
                    .call_ok(&request, REDIS_CALL_TIMEOUT)
                    .await
                    .is_ok()
            })
            .await
        });
    let killer = async {
        tokio::time::sleep(Duration::from_millis(write_ms)).await;
        stop.store(true, Ordering::Release);
        let killed = Instant::now();
        kill();
        killed
    };
    let (acknowledged, killed) = futures::join!(futures::future::join_all(writers), killer);
    Ok((acknowledged.into_iter().flatten().collect(), killed))
}

/// Reads every key of the write load from the Redis at `addr` (`MGET`s of
/// [`LOSS_READ_BATCH`]) and counts the `acknowledged` writes missing.
pub(super) async fn count_lost(addr: &str, acknowledged: &[u64]) -> Result<LostWrites> {
    let mut connection = RespConnection::connect(addr).await?;
    let keys: Vec<Vec<u8>> = (0..LOSS_KEYS).map(loss_key).collect();
    let mut read_back = BTreeMap::new();
    for (c, chunk) in keys.chunks(LOSS_READ_BATCH).enumerate() {
        let mut request: Vec<&[u8]> = vec![b"MGET"];
        request.extend(chunk.iter().map(|k| &k[..]));
        let Value::Array(Some(values)) = connection.call_ok(&request, REDIS_CALL_TIMEOUT).await?
        else {
            bail!("MGET answered something other than an array");
        };
        if values.len() != chunk.len() {
            bail!(
                "MGET of {} keys answered {} values",
                chunk.len(),
                values.len()
            );
        }
        for (i, value) in values.into_iter().enumerate() {
            let value = match value {
                Value::Bulk(value) => value,
                other => bail!("MGET answered {other:?} for a key"),
            };
            read_back.insert((c * LOSS_READ_BATCH + i) as u64, value);
        }
    }
    Ok(LostWrites::count(acknowledged, &read_back))
}

/// Fills the Redis at `addr` with `objects` 1 KB objects, then makes them durable:
/// `SAVE` for an RDB; for the AOF, waits for any rewrite to end and for the next
/// once-a-second fsync.
pub(super) async fn fill_redis(
    addr: &str,
    objects: u64,
    persistence: Option<Persistence>,
) -> Result<()> {
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
