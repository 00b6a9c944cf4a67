//! What the comparison prints and writes: the table of the YCSB runs, the line of the
//! loss comparison, and the figures as JSON.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::args::CompareArgs;
use super::loss::{Loss, LOSS_OBJECT_BYTES};
use super::redis::redis_server_version;
use super::ycsb_runs::{Measured, Results, System, SYSTEMS};
use crate::bench::lost_writes::LOSS_WRITERS;
use crate::bench::ycsb::Workload;

/// Prints the YCSB runs: a line of conditions, then a row per workload and system.
pub(super) fn print_table(args: &CompareArgs, seed: u64, results: &Results) {
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

/// What `--json FILE` holds: the conditions, each workload's figures (by workload
/// name) and, unless `--no-loss`, the loss comparison.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CompareFigures {
    conditions: Conditions,
    ycsb: BTreeMap<String, WorkloadFigures>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    loss: Option<LossFigures>,
}

/// The conditions of the YCSB runs.
#[derive(Debug, Serialize, Deserialize)]
struct Conditions {
    records: u64,
    ops: u64,
    clients: u32,
    value_bytes: usize,
    zipf: f64,
    rounds: u32,
    servers: u32,
    replicas: u32,
    seed: u64,
    /// `redis-server --version`.
    redis: String,
}

/// One workload on each system, its keys prefixed `rampart_`, `redis_wait_` and
/// `redis_async_`: throughput, and latencies in µs of the operation types it ran. A
/// system or an operation type that did not run has no keys.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkloadFigures {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rampart_ops_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rampart_write_p50_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rampart_write_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rampart_read_p50_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rampart_read_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_wait_ops_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_wait_write_p50_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_wait_write_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_wait_read_p50_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_wait_read_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_async_ops_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_async_write_p50_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_async_write_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_async_read_p50_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis_async_read_p99_us: Option<f64>,
}

/// One system's figures of one workload, before they take their prefixed keys.
struct SystemFigures {
    ops_s: Option<f64>,
    write_p50_us: Option<f64>,
    write_p99_us: Option<f64>,
    read_p50_us: Option<f64>,
    read_p99_us: Option<f64>,
}

impl SystemFigures {
    fn of(m: Option<&Measured>) -> SystemFigures {
        let us = |op: &str, q: f64| m.and_then(|m| m.us(op, q));
        SystemFigures {
            ops_s: m.map(Measured::throughput),
            write_p50_us: us("update", 0.5),
            write_p99_us: us("update", 0.99),
            read_p50_us: us("read", 0.5),
            read_p99_us: us("read", 0.99),
        }
    }
}

impl WorkloadFigures {
    fn of(workload: Workload, results: &Results) -> WorkloadFigures {
        let system = |s: System| SystemFigures::of(results.get(&(workload, s)));
        let (rampart, wait, asynchronous) = (
            system(System::Rampart),
            system(System::RedisWait),
            system(System::RedisAsync),
        );
        WorkloadFigures {
            rampart_ops_s: rampart.ops_s,
            rampart_write_p50_us: rampart.write_p50_us,
            rampart_write_p99_us: rampart.write_p99_us,
            rampart_read_p50_us: rampart.read_p50_us,
            rampart_read_p99_us: rampart.read_p99_us,
            redis_wait_ops_s: wait.ops_s,
            redis_wait_write_p50_us: wait.write_p50_us,
            redis_wait_write_p99_us: wait.write_p99_us,
            redis_wait_read_p50_us: wait.read_p50_us,
            redis_wait_read_p99_us: wait.read_p99_us,
            redis_async_ops_s: asynchronous.ops_s,
            redis_async_write_p50_us: asynchronous.write_p50_us,
            redis_async_write_p99_us: asynchronous.write_p99_us,
            redis_async_read_p50_us: asynchronous.read_p50_us,
            redis_async_read_p99_us: asynchronous.read_p99_us,
        }
    }
}

/// The loss comparison: ms from the kill until the data is served again, and of the
/// writes the load had acknowledged until the kill, those missing afterwards.
#[derive(Debug, Serialize, Deserialize)]
struct LossFigures {
    gib: f64,
    object_bytes: usize,
    rampart_unavailability_ms: f64,
    redis_rdb_reload_ms: f64,
    redis_aof_reload_ms: f64,
    redis_sentinel_failover_ms: f64,
    /// The write load: its writers, and how long they wrote before each kill.
    write_load_writers: u64,
    write_load_ms: u64,
    rampart_lost_writes: u64,
    redis_rdb_lost_writes: u64,
    redis_aof_lost_writes: u64,
    redis_sentinel_lost_writes: u64,
    rampart_acknowledged_writes: u64,
    redis_rdb_acknowledged_writes: u64,
    redis_aof_acknowledged_writes: u64,
    redis_sentinel_acknowledged_writes: u64,
    sentinel_down_after_ms: u64,
    sentinel_stable_s: u64,
    sentinel_sweep: Vec<SentinelTry>,
}

/// One `down-after-milliseconds` tried, and whether it held under load.
#[derive(Debug, Serialize, Deserialize)]
struct SentinelTry {
    down_after_ms: u64,
    stable: bool,
}

/// The YCSB runs' figures and conditions, and the loss comparison's if it ran.
pub(super) fn figures(
    args: &CompareArgs,
    seed: u64,
    results: &Results,
    loss: Option<&Loss>,
) -> CompareFigures {
    CompareFigures {
        conditions: Conditions {
            records: args.records,
            ops: args.ops,
            clients: args.clients,
            value_bytes: args.value_bytes,
            zipf: args.zipf,
            rounds: args.rounds,
            servers: args.servers,
            replicas: args.replicas,
            seed,
            redis: redis_server_version(),
        },
        ycsb: args
            .workloads
            .iter()
            .map(|&w| (w.name().to_string(), WorkloadFigures::of(w, results)))
            .collect(),
        loss: loss.map(|loss| LossFigures {
            gib: loss.gib,
            object_bytes: LOSS_OBJECT_BYTES,
            rampart_unavailability_ms: loss.rampart_ms.round(),
            redis_rdb_reload_ms: loss.rdb_ms.round(),
            redis_aof_reload_ms: loss.aof_ms.round(),
            redis_sentinel_failover_ms: loss.sentinel_ms.round(),
            write_load_writers: LOSS_WRITERS,
            write_load_ms: args.loss_write_ms,
            rampart_lost_writes: loss.rampart_lost.lost,
            redis_rdb_lost_writes: loss.rdb_lost.lost,
            redis_aof_lost_writes: loss.aof_lost.lost,
            redis_sentinel_lost_writes: loss.sentinel_lost.lost,
            rampart_acknowledged_writes: loss.rampart_lost.acknowledged,
            redis_rdb_acknowledged_writes: loss.rdb_lost.acknowledged,
            redis_aof_acknowledged_writes: loss.aof_lost.acknowledged,
            redis_sentinel_acknowledged_writes: loss.sentinel_lost.acknowledged,
            sentinel_down_after_ms: loss.sentinel_down_after_ms,
            sentinel_stable_s: args.sentinel_stable_s,
            sentinel_sweep: loss
                .sentinel_sweep
                .iter()
                .map(|&(down_after_ms, stable)| SentinelTry {
                    down_after_ms,
                    stable,
                })
                .collect(),
        }),
    }
}

/// Prints the loss comparison: each system's time from the kill to its data served
/// again, and Rampart's over each Redis's; then each system's lost writes.
pub(super) fn print_loss(args: &CompareArgs, loss: &Loss) {
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
    println!(
        "writes lost ({LOSS_WRITERS} writers for {} ms until the kill): rampart {}; redis \
         RDB {}; AOF everysec {}; sentinel {}",
        args.loss_write_ms, loss.rampart_lost, loss.rdb_lost, loss.aof_lost, loss.sentinel_lost
    );
    for (system, lost) in [
        ("rampart", &loss.rampart_lost),
        ("redis RDB", &loss.rdb_lost),
        ("redis AOF", &loss.aof_lost),
        ("redis sentinel", &loss.sentinel_lost),
    ] {
        if lost.foreign > 0 {
            println!("warning: {system}: {lost}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_has_keys_only_for_what_ran() {
        let mut results = Results::new();
        results.insert((Workload::A, System::Rampart), Measured::default());
        results.insert((Workload::A, System::RedisAsync), Measured::default());
        let json = serde_json::to_value(WorkloadFigures::of(Workload::A, &results)).unwrap();
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["rampart_ops_s", "redis_async_ops_s"]);
    }
}
