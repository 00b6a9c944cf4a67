//! The `redis-server` children of the comparison: each started on a loopback port with
//! its own arguments, awaited until it answers PING, and killed (SIGKILL) and reaped when
//! dropped; loading records into them with `MSET`; and the version installed.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::resp::RespConnection;
use crate::bench::ycsb::key;

/// How long one Redis command may take before the benchmark fails.
pub(super) const REDIS_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Pairs per `MSET` while loading Redis.
const LOAD_BATCH_PAIRS: usize = 256;

/// A `redis-server` child; killed (SIGKILL) and reaped when dropped.
pub(super) struct RedisProcess {
    pub(super) port: u16,
    pub(super) child: Child,
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
    pub(super) fn start(dir: &std::path::Path, extra: &[String]) -> Result<RedisProcess> {
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
    pub(super) fn start_at(
        dir: &std::path::Path,
        port: u16,
        args: &[String],
    ) -> Result<RedisProcess> {
        let process = RedisProcess::spawn_at(dir, port, args)?;
        process.wait_ready()?;
        Ok(process)
    }

    /// Starts `redis-server` as [`start_at`](Self::start_at) does, without waiting.
    pub(super) fn spawn_at(
        dir: &std::path::Path,
        port: u16,
        args: &[String],
    ) -> Result<RedisProcess> {
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
    pub(super) fn wait_ready(&self) -> Result<()> {
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

    pub(super) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

pub(super) fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Loads records `0..records` through `connections` (each its share) with `MSET`.
pub(super) async fn load_redis(
    connections: &mut [RespConnection],
    records: u64,
    value: &Bytes,
) -> Result<()> {
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

pub(super) fn redis_server_version() -> String {
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
