//! `rampart`: the one binary of a Rampart deployment (docs/design.md §9).
//!
//! * `rampart coordinator` / `rampart server` — the two long-running processes, from
//!   flags or from their entry in a cluster file (`--cluster-file`, `cluster_file`).
//! * `rampart server-exited` — a supervisor's word that a server's process exited (the
//!   systemd unit's `ExecStopPost`; `supervisor`).
//! * `rampart cluster up` — a whole local cluster as child processes.
//! * `rampart gateway` — a Redis-protocol front door to one table (`rampart_gateway`).
//! * `rampart kv ...` — table operations from the shell.
//! * `rampart status` — how the cluster stands (the status page's view, in a terminal).
//! * `rampart recovery list|show|status|allow-loss` — crash recoveries, and letting one proceed
//!   with an incomplete log.
//! * `rampart tablet split` — a table's tablet cut in two on its owner.
//! * `rampart bench ycsb` — the YCSB benchmark; `rampart bench replication` — the
//!   replication transports side by side (throughput, write latency, backup CPU).
//! * `rampart token new|resp-password` — a cluster token, and the gateway's RESP password
//!   derived from it.
//! * `rampart simulate` — deterministic simulated runs of replication and crash
//!   recovery, one per seed (`rampart_sim`); with `--servers N`, one crash recovery of
//!   a cluster of N servers, simulated with Rampart's own placement and recovery plan
//!   (`rampart_sim::scale`).
//! * `rampart drill` — faults injected into a local cluster under load, every client
//!   operation recorded and checked for linearizability (`rampart_check`).

mod bench;
mod child_processes;
mod cluster;
mod drain_command;
mod drill;
mod gateway;
mod kv;
mod plots;
mod process;
mod progress;
mod rebalance_command;
mod recovery_command;
mod security;
mod simulate;
mod simulate_scale;
mod startup;
mod stats;
mod status_command;
mod supervisor;
mod tablet_command;
mod token;

use anyhow::Result;
use clap::{Parser, Subcommand};
use rampart_ops::cluster_file;

/// Rampart: a RAM-resident key-value storage cluster with fast crash recovery.
#[derive(Parser, Debug)]
#[command(name = "rampart", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a coordinator.
    Coordinator(process::CoordinatorArgs),
    /// Run a storage server (a master and a backup).
    Server(process::ServerArgs),
    /// Tell the coordinators that a server's process exited (run by its supervisor
    /// once the process is gone: the systemd unit's ExecStopPost), so that its recovery
    /// need not wait out its lease.
    ServerExited(supervisor::ServerExitedArgs),
    /// Manage a local cluster of child processes.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// A Redis-protocol (RESP2) front door to one table, for redis-cli and Redis clients.
    Gateway(gateway::GatewayArgs),
    /// Table operations: create-table, drop-table, put, get, del, incr, scan.
    Kv(kv::KvArgs),
    /// How the cluster stands: problems and their fixes, coordinators, servers, tables,
    /// recoveries.
    Status(status_command::StatusArgs),
    /// Crash recoveries: list, show, status, and allow-loss for an incomplete log.
    Recovery(recovery_command::RecoveryArgs),
    /// Change a table's tablets: split one in two on its owner, or move tablets to
    /// another master under load.
    Tablet(tablet_command::TabletArgs),
    /// Retire a server without a crash: its tablets move away, the masters stop using
    /// its backup, then it is removed.
    Drain(drain_command::DrainArgs),
    /// Load-based rebalancing: where it stands (each master's load, its decisions),
    /// pause and resume it, pin tablets to their masters.
    Rebalance(rebalance_command::RebalanceArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Deterministic simulated runs of replication and crash recovery, one per seed; with
    /// --servers N, one crash recovery at the scale of N servers.
    Simulate(simulate::SimulateArgs),
    /// Cluster tokens: make one, and print the gateway's RESP password derived from it.
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// A crash-injection drill: faults on a local cluster under load, every operation
    /// recorded and checked for linearizability.
    Drill(drill::DrillArgs),
}

fn main() -> std::process::ExitCode {
    // A cluster file stands for flags: they are put on the command line before parsing.
    let args = match cluster_file::expand(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("error: {error:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    let result: Result<std::process::ExitCode> = match cli.command {
        Command::Coordinator(args) => process::run_coordinator(args),
        Command::Server(args) => process::run_server(args),
        Command::ServerExited(args) => supervisor::run_server_exited(args),
        Command::Cluster { command } => cluster::run(command),
        Command::Gateway(args) => gateway::run(args),
        Command::Kv(args) => kv::run(args),
        Command::Status(args) => status_command::run(args),
        Command::Recovery(args) => recovery_command::run(args),
        Command::Tablet(args) => tablet_command::run(args),
        Command::Drain(args) => drain_command::run(args),
        Command::Rebalance(args) => rebalance_command::run(args),
        Command::Bench { command } => bench::run(command),
        Command::Simulate(args) => simulate::run(args),
        Command::Token { command } => token::run(command),
        Command::Drill(args) => drill::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::from(2)
        }
    }
}
