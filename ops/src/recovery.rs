//! `rampart recovery`: what the coordinators' leader knows of crash recoveries, and the
//! operator's one lever over them.
//!
//! * `rampart recovery status` prints each recent recovery: when the crash was declared,
//!   how long detection and setup took, whether it waits (and why: a missing replica
//!   names its segments), and per partition its recovery master, size and when it went
//!   live.
//! * `rampart recovery allow-loss SERVER` lets the recovery of a server whose log is
//!   incomplete go on with the replicas that exist. What the missing segments held is
//!   lost; use it only when the backups that held them cannot come back.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use rampart_common::coordinator_set::{CoordinatorCallError, CoordinatorSet};
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{
    AllowLoss, RecoveryStatus, RecoveryStatusRequest, ServerIdRequest,
};
use rampart_common::rpc::RpcPool;
use std::process::ExitCode;
use std::time::Duration;
use tokio::time::Instant;

/// `rampart recovery ...`
#[derive(Args, Debug)]
pub struct RecoveryArgs {
    /// Coordinator address(es), comma-separated.
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// Seconds to wait for the coordinators' leader.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    #[command(subcommand)]
    pub command: RecoveryCommand,
}

/// The `rampart recovery` subcommands.
#[derive(Subcommand, Debug)]
pub enum RecoveryCommand {
    /// Recent recoveries and their timings, from the coordinators' leader.
    Status,
    /// Let the recovery of SERVER proceed although replicas of its log are missing
    /// (their data is lost).
    AllowLoss {
        /// The crashed server's id (as `rampart status` lists it).
        server: u64,
    },
}

/// Runs `rampart recovery`.
pub fn run(args: RecoveryArgs) -> Result<ExitCode> {
    crate::run_client(recovery(args))?
}

async fn recovery(args: RecoveryArgs) -> Result<ExitCode> {
    let addrs = crate::coordinator_list(&args.coordinator);
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
        RecoveryCommand::Status => {
            let reply = set
                .call::<RecoveryStatus>(&pool, &RecoveryStatusRequest {}, deadline)
                .await
                .map_err(failed)?;
            if reply.recoveries.is_empty() {
                println!("no recoveries since this leader took over");
            }
            for r in &reply.recoveries {
                let state = match (&r.waiting, r.done_ms) {
                    (Some(why), _) => format!("WAITING: {why}"),
                    (None, 0) => "in progress".to_string(),
                    (None, done) => format!("done in {done} ms"),
                };
                println!(
                    "{}: detection {} ms, setup {} ms, {} segments, {}",
                    r.crashed, r.detection_ms, r.setup_ms, r.segments, state
                );
                for p in &r.partitions {
                    let live = if p.live_ms == 0 {
                        "not live yet".to_string()
                    } else {
                        format!("live at {} ms", p.live_ms)
                    };
                    println!(
                        "  partition {:>3} on {:<10} {:>10} objects {:>12} bytes  turn+replay {:>6} ms  {} (attempts {})",
                        p.partition, p.master.to_string(), p.objects, p.bytes, p.replay_ms, live, p.attempts
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
