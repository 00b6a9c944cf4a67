//! `rampart bench`: benchmarks as binaries, never timed tests (STYLE.md habit 13).
//!
//! * [`ycsb`] — YCSB workloads against a cluster, beside a raw TCP ping-pong floor.
//! * [`replication`] — the replication transports (shm, tcp, rpc) side by side on
//!   symmetric clusters: write latency, throughput and the backups' CPU per write.
//! * [`echo`] — the floor's echo server (a hidden subcommand, run as a child process
//!   so the floor crosses processes exactly as an RPC does).

pub mod echo;
pub mod replication;
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
    /// The floor's echo server (used by `bench ycsb`).
    #[command(hide = true)]
    Echo(echo::EchoArgs),
}

/// Runs `rampart bench ...`.
pub fn run(command: BenchCommand) -> Result<ExitCode> {
    match command {
        BenchCommand::Ycsb(args) => ycsb::run(args),
        BenchCommand::Replication(args) => replication::run(args),
        BenchCommand::Echo(args) => echo::run(args),
    }
}
