//! `rampart drain SERVER`: an operator retires a server without a crash
//! (docs/design.md §7, "Draining a server"; docs/operating.md, "Shrinking a cluster").
//!
//! The coordinators commit the drain at once; from then on nothing new is placed on the
//! server, and their leader moves its tablets to the other masters under load, has every
//! master re-create the replicas on its backup elsewhere, and only then removes it (its
//! process then exits with status 0). No recovery runs and writes go on throughout. This prints where
//! the drain stands each time that changes, and returns once the server is removed
//! (exit 0); with `--no-wait`, once the drain is committed. Interrupting the wait leaves
//! the drain running: `rampart drain SERVER` again shows it. A drain the server's crash
//! overtook exits 2 (its recovery takes what it held); so do errors.

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_common::protocol::coordinator::{DrainReply, DrainState};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often the wait asks where the drain stands.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// `rampart drain`.
#[derive(Args, Debug)]
pub struct DrainArgs {
    #[command(flatten)]
    pub client: crate::kv::ClientArgs,
    /// The server to drain: its id (`server-3` or `3`).
    pub server: String,
    /// Return once the drain is committed, without waiting for the server's removal.
    #[arg(long)]
    pub no_wait: bool,
    /// Longest to wait for the removal, in seconds (the drain goes on after it).
    #[arg(long = "wait-timeout", default_value_t = 3600)]
    pub wait_timeout: u64,
}

/// Runs `rampart drain ...`.
pub fn run(args: DrainArgs) -> Result<ExitCode> {
    let server = crate::tablet_command::parse_server(&args.server)?;
    crate::startup::run_client(&args.client.security, async {
        let client = crate::kv::connect(&args.client).await?;
        let mut reply = client
            .drain_server(server)
            .await
            .with_context(|| format!("draining {server}"))?;
        println!("{}", describe(&reply));
        if args.no_wait {
            return Ok(ExitCode::SUCCESS);
        }
        let until = Instant::now() + Duration::from_secs(args.wait_timeout);
        loop {
            match reply.state {
                DrainState::Removed => return Ok(ExitCode::SUCCESS),
                DrainState::NotDraining => {
                    bail!("{server} is no longer being drained: {}", reply.detail)
                }
                DrainState::Draining => {}
            }
            if Instant::now() >= until {
                bail!(
                    "{server} not removed within {} s; the drain goes on (`rampart drain {server}` shows it)",
                    args.wait_timeout
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
            let next = client
                .drain_status(server)
                .await
                .with_context(|| format!("asking how the drain of {server} stands"))?;
            if next != reply {
                println!("{}", describe(&next));
            }
            reply = next;
        }
    })?
}

/// One line of progress.
fn describe(reply: &DrainReply) -> String {
    let state = match reply.state {
        DrainState::Draining => "draining",
        DrainState::Removed => "removed",
        DrainState::NotDraining => "not draining",
    };
    format!(
        "{} {state}: {} tablets left, {} masters still using its backup; {}",
        reply.server, reply.tablets_left, reply.masters_waiting, reply.detail
    )
}
