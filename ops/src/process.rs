//! The long-running processes: `rampart coordinator` and `rampart server`.
//!
//! Each binds its listener first, then prints one line to stdout naming the bound
//! address (`coordinator listening on ADDR`, `server N listening on ADDR`) — so a
//! parent that asked for port 0 learns the port — and serves until SIGINT or SIGTERM.

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_backup::service::{BackupConfig, BackupService};
use rampart_common::config::{ByteSize, MasterConfig, SEGMENT_BYTES_DEFAULT};
use rampart_common::limits::VALUE_BYTES_MAX_DEFAULT;
use rampart_common::protocol::coordinator::{Enlist, EnlistRequest};
use rampart_common::rpc::{RpcPool, RpcServer};
use rampart_common::tablet::Services;
use rampart_coordinator::CoordinatorService;
use rampart_master::MasterService;

use crate::storage::StorageService;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// How long a starting server keeps trying to enlist with the coordinator.
const ENLIST_TIMEOUT: Duration = Duration::from_secs(30);

/// `rampart coordinator`
#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    /// Address to listen on (port 0 picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7000")]
    pub listen: String,
}

/// `rampart server`
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Directory of the backup's segment replicas (created if missing). A restarted
    /// server given the same directory reports the replicas it holds.
    #[arg(long)]
    pub data_dir: std::path::PathBuf,
    /// Segment replicas the backup holds open in memory at once.
    #[arg(long, default_value_t = 64)]
    pub backup_frames: usize,
    /// Coordinator address(es), comma-separated.
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// Address to listen on (port 0 picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// DRAM for the master's log, e.g. 4GiB.
    #[arg(long, default_value = "1GiB")]
    pub memory: ByteSize,
    /// Bytes per log segment.
    #[arg(long, default_value_t = ByteSize(u64::from(SEGMENT_BYTES_DEFAULT)))]
    pub segment_bytes: ByteSize,
    /// Largest value accepted.
    #[arg(long, default_value_t = ByteSize(VALUE_BYTES_MAX_DEFAULT as u64))]
    pub value_bytes_max: ByteSize,
    /// Failure domain (rack) of this server: no two replicas of a segment are placed in
    /// one domain. Default: the server's own address, so every server is its own domain
    /// (right for one server per machine); give servers that share a rack or a power
    /// supply the same name.
    #[arg(long)]
    pub failure_domain: Option<String>,
    /// Worker threads of the server's runtime (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        builder.worker_threads(threads);
    }
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        // Without a SIGTERM handler, Ctrl-C still works.
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn announce(line: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

/// Runs a coordinator until a signal.
pub fn run_coordinator(args: CoordinatorArgs) -> Result<ExitCode> {
    crate::init_logging("info");
    runtime(0)?.block_on(async {
        let listener = TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        announce(&format!("coordinator listening on {addr}"))?;
        tracing::info!(%addr, "coordinator serving");
        RpcServer::run(
            listener,
            Arc::new(CoordinatorService::new()),
            shutdown_signal(),
        )
        .await;
        tracing::info!("coordinator stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs a storage server until a signal.
pub fn run_server(args: ServerArgs) -> Result<ExitCode> {
    crate::init_logging("info");
    let config = MasterConfig {
        segment_bytes: u32::try_from(args.segment_bytes.0)
            .context("--segment-bytes must be below 4GiB")?,
        memory_bytes: args.memory.0,
        value_bytes_max: usize::try_from(args.value_bytes_max.0)
            .context("--value-bytes-max is too large")?,
    };
    config.validate()?;
    let coordinators: Vec<String> = args
        .coordinator
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if coordinators.is_empty() {
        bail!("--coordinator needs at least one address");
    }
    runtime(args.threads)?.block_on(async {
        let backup_config = BackupConfig {
            frames_max: args.backup_frames,
            frame_bytes_max: config.segment_bytes.max(SEGMENT_BYTES_DEFAULT),
        };
        let (backup, report) = BackupService::open(&args.data_dir, backup_config)
            .with_context(|| format!("cannot open the backup store in {}", args.data_dir.display()))?;
        tracing::info!(
            data_dir = %args.data_dir.display(),
            replicas = report.replicas.len(),
            quarantined = report.quarantined.len(),
            "backup store scanned"
        );
        for file in &report.quarantined {
            tracing::warn!(file = %file.original.display(), reason = ?file.reason, "replica quarantined");
        }
        let listener = TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?.to_string();
        let request = EnlistRequest {
            addr: addr.clone(),
            services: Services {
                master: true,
                backup: true,
            },
            failure_domain: args.failure_domain.clone().unwrap_or_else(|| addr.clone()),
            disk_read_mbps: 0,
        };
        let id = enlist(&coordinators, &request).await?;
        let master = MasterService::new(id, config);
        let service = Arc::new(StorageService { master, backup });
        announce(&format!("server {} listening on {addr}", id.0))?;
        tracing::info!(%id, %addr, memory = %args.memory, "server serving");
        RpcServer::run(listener, service, shutdown_signal()).await;
        tracing::info!(%id, "server stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// Enlists with the first coordinator that answers, retrying until [`ENLIST_TIMEOUT`].
async fn enlist(
    coordinators: &[String],
    request: &EnlistRequest,
) -> Result<rampart_common::ids::ServerId> {
    let pool = RpcPool::new();
    let deadline = Instant::now() + ENLIST_TIMEOUT;
    let mut last = String::new();
    while Instant::now() < deadline {
        for addr in coordinators {
            match pool.call::<Enlist>(addr, request, deadline).await {
                Ok(reply) => return Ok(reply.id),
                Err(e) if e.is_transport() => last = e.to_string(),
                Err(e) => bail!("coordinator {addr} refused enlistment: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no coordinator answered within {ENLIST_TIMEOUT:?}: {last}")
}
