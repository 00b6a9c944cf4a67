//! `rampart bench`: benchmarks as binaries, never timed tests (STYLE.md habit 13).
//!
//! * [`ycsb`] — YCSB workloads against a cluster, beside a raw TCP ping-pong floor.
//! * [`cleaner`] — the log cleaner: overwrite throughput and write cost as memory fills,
//!   uniform against Zipfian keys.
//! * [`replication`] — the replication transports (shm, tcp, rpc) side by side on
//!   symmetric clusters: write latency, throughput and the backups' CPU per write.
//! * [`coordinator`] — the Raft-replicated coordinator: configuration changes per second
//!   and leader failover time.
//! * [`recovery_time`] — crash recovery of one master: detection, setup, replay per recovery
//!   master, client-observed unavailability, beside the machine's floor; every object
//!   verified.
//! * [`compare`] — Rampart against Redis on the same machine, alternating (YCSB with
//!   R copies acknowledged against Redis `WAIT R` and without replicas); [`resp`] — the
//!   small RESP client it drives Redis with.
//! * [`lost_writes`] — the write load the loss comparison runs until each kill, and the
//!   count of acknowledged writes missing afterwards.
//! * [`migrate`] — one tablet moved to another master under a YCSB-B load: the move's
//!   rate against a shared-memory copy floor, and the clients' latency before and during.
//! * [`drain`] — a server holding one tablet drained under a write load: how long until
//!   it is removed, the bytes moved, the clients' latency before and during.
//! * [`rebalance`] — a load concentrated on one server's tablets, spread by the
//!   rebalancer: throughput before and after, load max / mean, time to detect and move.
//! * `under_load` — what `migrate`, `drain` and `rebalance` share: a private cluster, the load
//!   before and during a change, the clients' latency figures.
//! * [`echo`] — the floor's echo server (a hidden subcommand, run as a child process
//!   so the floor crosses processes exactly as an RPC does).

pub mod cleaner;
pub mod compare;
pub mod coordinator;
pub mod drain;
pub mod echo;
pub mod lost_writes;
pub mod migrate;
pub mod rebalance;
pub mod recovery_time;
pub mod replication;
pub mod resp;
mod under_load;
pub mod ycsb;

use anyhow::Result;
use clap::Subcommand;
use std::process::ExitCode;

/// `rampart bench ...`
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// YCSB workloads: throughput and latency per operation type.
    Ycsb(ycsb::YcsbArgs),
    /// Replication transports compared: write latency, throughput, backup CPU per write.
    Replication(replication::ReplicationArgs),
    /// Coordinator: configuration changes per second, and failover after killing the leader.
    Coordinator(coordinator::CoordinatorBenchArgs),
    /// Crash recovery: kill a loaded master, time its recovery, verify every object.
    Recovery(recovery_time::RecoveryBenchArgs),
    /// The log cleaner: overwrite throughput and write cost at low and high memory use.
    Cleaner(cleaner::CleanerBenchArgs),
    /// Rampart against Redis on this machine, alternating: YCSB throughput and latency.
    Compare(compare::CompareArgs),
    /// A tablet moved to another master under load: rate against a floor, latency.
    Migrate(migrate::MigrateArgs),
    /// A server drained under a write load: time until removed, bytes moved, latency.
    Drain(drain::DrainBenchArgs),
    /// A load on one server's tablets spread by the rebalancer: throughput, load balance.
    Rebalance(rebalance::RebalanceBenchArgs),
    /// The migrate floor's child (used by `bench migrate`).
    #[command(hide = true)]
    CopySink(migrate::CopySinkArgs),
    /// The floor's echo server (used by `bench ycsb`).
    #[command(hide = true)]
    Echo(echo::EchoArgs),
}

/// Runs `rampart bench ...`.
pub fn run(command: BenchCommand) -> Result<ExitCode> {
    match command {
        BenchCommand::Ycsb(args) => ycsb::run(args),
        BenchCommand::Replication(args) => replication::run(args),
        BenchCommand::Coordinator(args) => coordinator::run(args),
        BenchCommand::Recovery(args) => recovery_time::run(args),
        BenchCommand::Cleaner(args) => cleaner::run(args),
        BenchCommand::Compare(args) => compare::run(args),
        BenchCommand::Migrate(args) => migrate::run(args),
        BenchCommand::Drain(args) => drain::run(args),
        BenchCommand::Rebalance(args) => rebalance::run(args),
        BenchCommand::CopySink(args) => migrate::run_sink(args),
        BenchCommand::Echo(args) => echo::run(args),
    }
}
