//! What the comparison prints and writes: the table of the YCSB runs, the line of the
//! loss comparison, and the figures as JSON.

use super::args::CompareArgs;
use super::loss::{Loss, LOSS_OBJECT_BYTES};
use super::redis::redis_server_version;
use super::ycsb_runs::{Measured, Results, System, SYSTEMS};

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

/// The YCSB runs' figures and conditions, as JSON.
pub(super) fn json(args: &CompareArgs, seed: u64, results: &Results) -> serde_json::Value {
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

/// Prints the loss comparison's line: each system's time from the kill to its data
/// served again, and Rampart's over each Redis's.
pub(super) fn print_loss(loss: &Loss) {
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
}

/// The loss comparison's figures, as the JSON's `loss` object.
pub(super) fn loss_json(args: &CompareArgs, loss: &Loss) -> serde_json::Value {
    serde_json::json!({
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
    })
}
