//! The loss of a server against Redis Sentinel failover: a primary holding `--loss-gib`,
//! 2 replicas and 3 sentinels set to the lowest `--sentinel-down-after-ms` that holds
//! under a write load, then the write load of the loss comparison for `--loss-write-ms`
//! and the primary killed: until the address the sentinels give takes a write and serves
//! the last object; then the load's acknowledged writes missing on the new primary.

use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::args::CompareArgs;
use super::loss::{
    count_lost, fill_redis, loss_objects, write_until_kill, LOSS_OBJECT_BYTES, LOSS_TIMEOUT,
};
use super::redis::{free_port, RedisProcess, REDIS_CALL_TIMEOUT};
use crate::bench::lost_writes::LostWrites;
use crate::bench::resp::{RespConnection, Value};
use crate::bench::ycsb::key;

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
pub(super) struct SentinelFailover {
    pub(super) failover_ms: f64,
    pub(super) down_after_ms: u64,
    pub(super) sweep: Vec<(u64, bool)>,
    /// The write load's outcome: the replicas take the primary's writes asynchronously.
    pub(super) lost: LostWrites,
}

/// Redis Sentinel failover: a primary holding `--loss-gib` with 2 replicas and 3
/// sentinels; the most aggressive `down-after-milliseconds` of
/// `--sentinel-down-after-ms` that holds under load (each value, largest first, set on
/// every sentinel and held for `--sentinel-stable-s` while 16 writers overwrite keys on
/// the primary; it holds if no sentinel logged the primary down); then the primary
/// killed with SIGKILL: milliseconds until the address the sentinels give takes a write
/// and serves the last object written. In memory only (the replicas hold the data).
pub(super) fn sentinel_failover(
    args: &CompareArgs,
    scratch: &std::path::Path,
) -> Result<SentinelFailover> {
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
    let (acknowledged, killed) = runtime.block_on(write_until_kill(
        &primary_addr,
        args.loss_write_ms,
        move || drop(primary),
    ))?;
    let (served, promoted) = runtime.block_on(async {
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
                        return Ok((killed.elapsed(), addr));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })?;
    let lost = runtime.block_on(count_lost(&promoted, &acknowledged))?;
    drop((replicas, sentinels));
    Ok(SentinelFailover {
        failover_ms: served.as_secs_f64() * 1e3,
        down_after_ms: down_after,
        sweep,
        lost,
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
