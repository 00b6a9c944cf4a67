//! `rampart recovery`: what the coordinators' leader knows of crash recoveries, and the
//! operator's one lever over them.
//!
//! * `rampart recovery list` prints a line per recent recovery (the leader keeps the
//!   last 32 since it took over): the crashed server (its id is the recovery's id:
//!   server ids are never reused), when it was declared, its state, and the time of
//!   each phase.
//! * `rampart recovery show ID` prints one recovery phase by phase: detection, setup,
//!   and per partition its recovery master, when its replay started and how long it
//!   took, how much it replayed, when it went live, and the attempts it took.
//! * `rampart recovery status` prints every recent recovery in full (as `show`).
//! * `rampart recovery allow-loss SERVER` lets the recovery of a server whose log is
//!   incomplete go on with the replicas that exist. What the missing segments held is
//!   lost; use it only when the backups that held them cannot come back.
//!
//! `--coordinator` and `--timeout` go before or after the subcommand.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{
    AllowLoss, RecoveryReport, RecoveryStatus, RecoveryStatusRequest, ServerIdRequest,
};
use rampart_common::rpc::RpcPool;
use rampart_coordinator::status_page::utc_time;
use std::process::ExitCode;
use std::time::Duration;
use tokio::time::Instant;

/// `rampart recovery ...`
#[derive(Args, Debug)]
pub struct RecoveryArgs {
    /// Coordinator address(es), comma-separated.
    #[arg(
        long,
        env = "RAMPART_COORDINATOR",
        default_value = "127.0.0.1:7000",
        global = true
    )]
    pub coordinator: String,
    /// Seconds to wait for the coordinators' leader.
    #[arg(long, default_value_t = 5.0, global = true)]
    pub timeout: f64,
    #[command(flatten)]
    pub security: crate::security::ClientSecurityArgs,
    #[command(subcommand)]
    pub command: RecoveryCommand,
}

/// The `rampart recovery` subcommands.
#[derive(Subcommand, Debug)]
pub enum RecoveryCommand {
    /// Every recent recovery in full, from the coordinators' leader.
    Status,
    /// A line per recent recovery: state and the time of each phase.
    List,
    /// One recovery phase by phase (ID: the crashed server's id).
    Show {
        /// The recovery's id: the crashed server's id (as `recovery list` prints it).
        id: u64,
    },
    /// Let the recovery of SERVER proceed although replicas of its log are missing
    /// (their data is lost).
    AllowLoss {
        /// The crashed server's id (as `rampart status` lists it).
        server: u64,
    },
}

/// Runs `rampart recovery`.
pub fn run(args: RecoveryArgs) -> Result<ExitCode> {
    let security = args.security.clone();
    crate::startup::run_client(&security, recovery(args))?
}

async fn recovery(args: RecoveryArgs) -> Result<ExitCode> {
    let addrs = crate::startup::coordinator_list(&args.coordinator);
    let set = CoordinatorSet::new(&addrs);
    let pool = RpcPool::new();
    let deadline = Instant::now() + Duration::from_secs_f64(args.timeout.max(0.0));
    let failed = |error: CoordinatorCallError| match error {
        CoordinatorCallError::NoLeader { last, .. } => {
            anyhow::anyhow!("no coordinator leader: {last}")
        }
        CoordinatorCallError::Rpc(error) => anyhow::anyhow!("{error}"),
    };
    match args.command {
        RecoveryCommand::AllowLoss { server } => {
            if server == 0 {
                bail!("server ids start at 1");
            }
            let request = ServerIdRequest {
                server: ServerId(server),
            };
            set.call::<AllowLoss>(&pool, &request, deadline)
                .await
                .map_err(failed)?;
            println!("recovery of server {server} may now proceed without its missing replicas");
            Ok(ExitCode::SUCCESS)
        }
        RecoveryCommand::Status | RecoveryCommand::List | RecoveryCommand::Show { .. } => {
            let reply = set
                .call::<RecoveryStatus>(&pool, &RecoveryStatusRequest {}, deadline)
                .await
                .map_err(failed)?;
            let reports = &reply.recoveries;
            match args.command {
                RecoveryCommand::List => {
                    if reports.is_empty() {
                        println!("no recoveries since this leader took over");
                    } else {
                        println!(
                            "{:>4}  {:<12} {:<13} {:>9} {:>8} {:>9} {:>9} {:>10}  state",
                            "id",
                            "crashed",
                            "declared",
                            "detection",
                            "setup",
                            "replay",
                            "total",
                            "partitions"
                        );
                    }
                    for r in reports {
                        println!("{}", list_line(r));
                    }
                    Ok(ExitCode::SUCCESS)
                }
                RecoveryCommand::Show { id } => {
                    let Some(report) = reports.iter().rev().find(|r| r.crashed.0 == id) else {
                        let known: Vec<u64> = reports.iter().map(|r| r.crashed.0).collect();
                        bail!(
                            "no recovery {id} at the leader (it keeps the last {} since it \
                             took over; it knows {known:?})",
                            rampart_coordinator::recovery_manager::REPORTS_MAX
                        );
                    };
                    print!("{}", show(report));
                    Ok(ExitCode::SUCCESS)
                }
                _ => {
                    if reports.is_empty() {
                        println!("no recoveries since this leader took over");
                    }
                    for r in reports {
                        print!("{}", show(r));
                    }
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
    }
}

/// The slowest partition's replay, in milliseconds.
fn replay_ms(report: &RecoveryReport) -> u64 {
    report
        .partitions
        .iter()
        .map(|p| p.replay_ms)
        .max()
        .unwrap_or(0)
}

fn state(report: &RecoveryReport) -> String {
    match (&report.waiting, report.done_ms) {
        (Some(why), _) => format!("WAITING: {why}"),
        (None, 0) => "in progress".to_string(),
        (None, _) => "done".to_string(),
    }
}

/// One line of `recovery list`.
fn list_line(r: &RecoveryReport) -> String {
    let total = if r.done_ms == 0 {
        "-".to_string()
    } else {
        format!("{} ms", r.done_ms)
    };
    format!(
        "{:>4}  {:<12} {:<13} {:>6} ms {:>5} ms {:>6} ms {:>9} {:>10}  {}",
        r.crashed.0,
        r.crashed.to_string(),
        utc_time(r.declared_unix_ms),
        r.detection_ms,
        r.setup_ms,
        replay_ms(r),
        total,
        r.partitions.len(),
        state(r)
    )
}

/// `recovery show`: one recovery phase by phase.
fn show(r: &RecoveryReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let objects: u64 = r.partitions.iter().map(|p| p.objects).sum();
    let bytes: u64 = r.partitions.iter().map(|p| p.bytes).sum();
    let _ = writeln!(
        out,
        "recovery {} of {}: declared crashed at {}, {}",
        r.crashed.0,
        r.crashed,
        utc_time(r.declared_unix_ms),
        state(r)
    );
    let _ = writeln!(
        out,
        "  detection  {:>7} ms  (last answer to the crash being declared)",
        r.detection_ms
    );
    let _ = writeln!(
        out,
        "  setup      {:>7} ms  (fence, list {} segments, plan {} partitions)",
        r.setup_ms,
        r.segments,
        r.partitions.len()
    );
    let _ = writeln!(
        out,
        "  replay     {:>7} ms  (slowest partition; {objects} objects, {} in all)",
        replay_ms(r),
        rampart_common::config::ByteSize(bytes).readable()
    );
    if let Some(end) = r.lease_end {
        let why = match end {
            rampart_common::protocol::coordinator::LeaseEnd::Waited => {
                "its lease ran out: nothing proved it dead".to_string()
            }
            proven => format!("its death proven: {proven}"),
        };
        let _ = writeln!(out, "  lease end  {:>7} ms  ({why})", r.lease_end_ms);
    }
    if r.done_ms > 0 {
        let _ = writeln!(
            out,
            "  total      {:>7} ms  (declared to done: tablets live, masters told, replicas freed)",
            r.done_ms
        );
    }
    let _ = writeln!(
        out,
        "  {:>9} {:<11} {:>10} {:>12} {:>12} {:>10} {:>10} {:>8}",
        "partition", "master", "objects", "bytes", "replay from", "replay", "live at", "attempts"
    );
    for p in &r.partitions {
        let live = if p.live_ms == 0 {
            "-".to_string()
        } else {
            format!("{} ms", p.live_ms)
        };
        let _ = writeln!(
            out,
            "  {:>9} {:<11} {:>10} {:>12} {:>9} ms {:>7} ms {:>10} {:>8}",
            p.partition,
            p.master.to_string(),
            p.objects,
            p.bytes,
            p.replay_start_ms,
            p.replay_ms,
            live,
            p.attempts
        );
    }
    out
}
