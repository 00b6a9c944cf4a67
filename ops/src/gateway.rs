//! `rampart gateway`: the Redis-protocol front door (`rampart_gateway`) as a process.
//!
//! Connects to the cluster through `--coordinator`, creates its table if missing
//! (`--table`, over `--span` tablets), listens on `--listen` and prints `gateway
//! listening on ADDR` (so a parent that asked for port 0 learns the port), then serves
//! RESP until SIGINT or SIGTERM.

use anyhow::{Context, Result};
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;

/// `rampart gateway`
#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Coordinator address(es), comma-separated.
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// Address to serve RESP on (Redis's port by default; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:6379")]
    pub listen: String,
    /// The table its keys live in (database 0; created if missing).
    #[arg(long, default_value = "redis")]
    pub table: String,
    /// Tablets of the table when the gateway creates it (spread over the masters).
    #[arg(long, default_value_t = 8)]
    pub span: u32,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Runs `rampart gateway`.
pub fn run(args: GatewayArgs) -> Result<ExitCode> {
    crate::init_logging("info");
    crate::process::runtime(args.threads)?.block_on(async {
        let coordinators = crate::coordinator_list(&args.coordinator);
        let client = rampart_client::Client::connect(&coordinators)
            .await
            .with_context(|| format!("cannot reach the cluster at {}", args.coordinator))?;
        let gateway = rampart_gateway::Gateway::new(client, &args.table, args.span)
            .await
            .with_context(|| format!("cannot create or find table {}", args.table))?;
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        crate::process::announce(&format!("gateway listening on {addr}"))?;
        tracing::info!(%addr, table = %args.table, "RESP gateway serving");
        Arc::new(gateway)
            .serve(listener, crate::process::shutdown_signal())
            .await;
        tracing::info!("RESP gateway stopped");
        Ok(ExitCode::SUCCESS)
    })
}
