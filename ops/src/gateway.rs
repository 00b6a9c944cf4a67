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
    /// This gateway's name in the cluster file (`--cluster-file`), whose `[[gateway]]`
    /// entry gives its flags (coordinators, listen, table, token, certificate).
    #[arg(long, requires = "cluster_file")]
    pub name: Option<String>,
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
    /// The cluster token for the gateway's own connections, and the password RESP
    /// clients must give with `AUTH` (`redis-cli -a` / `--askpass`); `--tls-ca` to dial
    /// the cluster over TLS.
    #[command(flatten)]
    pub security: crate::security::ClientSecurityArgs,
    /// Certificate chain (PEM) to offer TLS to RESP clients with (`redis-cli --tls`),
    /// beside plain RESP on the same port; needs --tls-key.
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
}

/// Runs `rampart gateway`.
pub fn run(args: GatewayArgs) -> Result<ExitCode> {
    crate::init_logging("info");
    let security = args.security.security()?;
    let password = security.token.clone();
    if !rampart_common::auth::install(security) {
        anyhow::bail!("this process's security was set twice");
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(rampart_common::tls::TlsAcceptor::from_files(cert, key)?),
        _ => None,
    };
    crate::process::runtime(args.threads)?.block_on(async {
        let coordinators = crate::coordinator_list(&args.coordinator);
        let client = rampart_client::Client::connect(&coordinators)
            .await
            .with_context(|| format!("cannot reach the cluster at {}", args.coordinator))?;
        let gateway = rampart_gateway::Gateway::new(client, &args.table, args.span)
            .await
            .with_context(|| format!("cannot create or find table {}", args.table))?
            .with_password(password)
            .with_tls(tls);
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
