//! `rampart gateway`: the Redis-protocol front door (`rampart_gateway`) as a process.
//!
//! Connects to the cluster through `--coordinator`, creates its table if missing
//! (`--table`, over `--span` tablets), listens on `--listen` and prints `gateway
//! listening on ADDR` (so a parent that asked for port 0 learns the port), then serves
//! RESP until SIGINT or SIGTERM. `--first-command-timeout-ms`,
//! `--connections-per-peer-max`, `--idle-timeout-ms` and `--reply-bytes-pending-max`
//! bound what one connection may hold (`rampart_gateway::ConnectionLimits`). They are
//! [`ConnectionLimitArgs`], the one place their defaults and checks live: `rampart
//! cluster up` takes the same flags for the gateway it starts, and a cluster file's
//! `[[gateway]]` entry stands for them (`idle_timeout_ms = 5000`).

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_common::announce::{Announce, Speaker};
use rampart_common::config::ByteSize;
use rampart_gateway::gateway::{
    CONNECTIONS_PER_PEER_MAX, FIRST_COMMAND_TIMEOUT, REPLY_BYTES_PENDING_MAX,
};
use rampart_gateway::ConnectionLimits;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// `rampart gateway`
#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// This gateway's name in the cluster file (`--cluster-file`), whose `[[gateway]]`
    /// entry gives its flags (coordinators, listen, table, connection limits, token,
    /// certificate).
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
    /// Bounds on each RESP connection.
    #[command(flatten)]
    pub limits: ConnectionLimitArgs,
}

/// The flags that bound what one RESP connection may hold, shared by `rampart gateway`,
/// `rampart cluster up` (for the gateway it starts, under the same names: none of its
/// other flags is about connections) and the cluster file's `[[gateway]]` entries
/// (which become these flags). The defaults are the library's constants.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "RESP connection limits (the gateway's)")]
pub struct ConnectionLimitArgs {
    /// Milliseconds a RESP connection may take from its accept to its first command
    /// (with a token, to a successful AUTH) before the gateway closes it.
    #[arg(
        long,
        default_value_t = FIRST_COMMAND_TIMEOUT.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub first_command_timeout_ms: u64,
    /// RESP connections one IP address may hold open to the gateway; the one past it is
    /// answered `-ERR max number of clients reached` and closed.
    #[arg(long, default_value_t = CONNECTIONS_PER_PEER_MAX)]
    pub connections_per_peer_max: usize,
    /// Milliseconds an authenticated RESP connection may send nothing before the gateway
    /// closes it (0: never, as Redis's `timeout 0`).
    #[arg(long, default_value_t = 0)]
    pub idle_timeout_ms: u64,
    /// Reply bytes a RESP connection may have waiting to be written before the gateway
    /// stops reading its requests until they are written.
    #[arg(long, default_value_t = ByteSize(REPLY_BYTES_PENDING_MAX as u64))]
    pub reply_bytes_pending_max: ByteSize,
}

impl Default for ConnectionLimitArgs {
    /// The limits with no flag given: the flags' own defaults.
    fn default() -> Self {
        use clap::FromArgMatches;
        let matches = ConnectionLimitArgs::augment_args(clap::Command::new("gateway"))
            .try_get_matches_from(["gateway"])
            .expect("no flags at all are valid flags");
        ConnectionLimitArgs::from_arg_matches(&matches).expect("defaults of the right types")
    }
}

impl ConnectionLimitArgs {
    /// The flags that give these limits to `rampart gateway`: all four, so the child
    /// runs with exactly these.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--first-command-timeout-ms".into(),
            self.first_command_timeout_ms.to_string(),
            "--connections-per-peer-max".into(),
            self.connections_per_peer_max.to_string(),
            "--idle-timeout-ms".into(),
            self.idle_timeout_ms.to_string(),
            "--reply-bytes-pending-max".into(),
            self.reply_bytes_pending_max.to_string(),
        ]
    }

    /// The connection limits the flags give, or what is wrong with them.
    pub fn connection_limits(&self) -> Result<ConnectionLimits> {
        if self.connections_per_peer_max == 0 {
            bail!("--connections-per-peer-max must be at least 1");
        }
        let Ok(reply_bytes_pending_max) = usize::try_from(self.reply_bytes_pending_max.0) else {
            bail!("--reply-bytes-pending-max is larger than this machine's memory");
        };
        if reply_bytes_pending_max == 0 {
            bail!("--reply-bytes-pending-max must be at least 1B");
        }
        Ok(ConnectionLimits {
            first_command_timeout: Duration::from_millis(self.first_command_timeout_ms),
            connections_per_peer_max: self.connections_per_peer_max,
            idle_timeout: (self.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(self.idle_timeout_ms)),
            reply_bytes_pending_max,
        })
    }
}

/// Runs `rampart gateway`.
pub fn run(args: GatewayArgs) -> Result<ExitCode> {
    crate::startup::init_logging("info");
    let connection_limits = args.limits.connection_limits()?;
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
        let coordinators = crate::startup::coordinator_list(&args.coordinator);
        let client = rampart_client::Client::connect(&coordinators)
            .await
            .with_context(|| format!("cannot reach the cluster at {}", args.coordinator))?;
        let gateway = rampart_gateway::Gateway::new(client, &args.table, args.span)
            .await
            .with_context(|| format!("cannot create or find table {}", args.table))?
            .with_password(password)
            .with_tls(tls)
            .with_connection_limits(connection_limits);
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        crate::process::announce(&Announce::Listening {
            speaker: Speaker::Gateway,
            addr: addr.to_string(),
        })?;
        tracing::info!(%addr, table = %args.table, "RESP gateway serving");
        Arc::new(gateway)
            .serve(listener, crate::process::shutdown_signal())
            .await;
        tracing::info!("RESP gateway stopped");
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limit_defaults_are_the_library_s() {
        let defaults = ConnectionLimitArgs::default();
        assert_eq!(
            defaults.connection_limits().expect("valid defaults"),
            ConnectionLimits::default()
        );
    }
}
