//! The YCSB part of the comparison: the three systems, one closed-loop client's
//! connection to each, and the rounds in which every workload runs a slice on every
//! system, the systems' order rotating.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rampart_client::{Client, ClientOptions, TableId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::args::CompareArgs;
use super::redis::{load_redis, REDIS_CALL_TIMEOUT};
use crate::bench::resp::{RespConnection, Value};
use crate::bench::ycsb::{histogram, key, load, KeyChooser, Workload};
use crate::progress::Progress;

/// The systems of one comparison, in their first round's order.
pub(super) const SYSTEMS: [System; 3] = [System::Rampart, System::RedisWait, System::RedisAsync];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum System {
    Rampart,
    RedisWait,
    RedisAsync,
}

impl System {
    pub(super) fn label(self, replicas: u32) -> String {
        match self {
            System::Rampart => format!("rampart R={replicas}"),
            System::RedisWait => format!("redis WAIT {replicas}"),
            System::RedisAsync => "redis, no replicas".to_string(),
        }
    }
}

/// How long `WAIT` may wait for the replicas, in milliseconds.
const WAIT_TIMEOUT_MS: &str = "5000";

/// What one workload measured on one system.
#[derive(Default)]
pub(super) struct Measured {
    ops: BTreeMap<&'static str, Histogram<u64>>,
    run_s: f64,
}

impl Measured {
    fn total(&self) -> u64 {
        self.ops.values().map(Histogram::len).sum()
    }

    pub(super) fn throughput(&self) -> f64 {
        if self.run_s > 0.0 {
            self.total() as f64 / self.run_s
        } else {
            0.0
        }
    }

    /// p-quantile of operation `name`, in µs.
    pub(super) fn us(&self, name: &str, q: f64) -> Option<f64> {
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

pub(super) type Results = BTreeMap<(Workload, System), Measured>;

pub(super) async fn compare(
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
    load(&clients, table, args.records, &value).await?;
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
    let progress = Progress::new(
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
