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
use rampart_common::onesided::TransportKind;
use rampart_common::protocol::coordinator::{Enlist, EnlistRequest};
use rampart_common::rpc::{RpcPool, RpcServer};
use rampart_common::tablet::Services;
use rampart_coordinator::CoordinatorService;
use rampart_master::replica_manager::{ReplicationConfig, ServerSource};
use rampart_master::MasterService;

use crate::storage::{StorageService, BACKUP_THREAD_NAME};
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
    /// Backup replicas of every segment of this server's master (R). A write is
    /// acknowledged only once R backups hold it; 0 keeps the DRAM copy only.
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// How replica bytes move to backups: shm, tcp, rpc or rdma. Default: chosen per
    /// backup, shm for a backup on this host, else tcp.
    #[arg(long)]
    pub replication: Option<TransportKind>,
    /// Disk read bandwidth of this server's backup, MB/s, reported at enlistment
    /// instead of measuring it at start-up (masters place replicas by it).
    #[arg(long)]
    pub disk_mbps: Option<u32>,
    /// The backup's shared-memory frame file (its "non-volatile buffer"). Default:
    /// /dev/shm/rampart-frames-HASH, HASH naming the data directory.
    #[arg(long)]
    pub frame_file: Option<std::path::PathBuf>,
}

/// Worker threads of a server's backup runtime: backup requests are open, close and
/// (for the `rpc` and `tcp` transports) copies, so one thread keeps up with the master.
pub const BACKUP_THREADS: usize = 1;

/// Unflushed frames a backup holds at most: what its disk writes in this long.
pub const FRAME_FLUSH_WINDOW: Duration = Duration::from_secs(2);

/// Fewest frames a backup offers, whatever its disk: one per concurrently open segment
/// of a few masters.
pub const FRAMES_MIN: usize = 8;

/// The frame bound for a disk of `disk_mbps` and frames of `frame_bytes`, at most
/// `configured`: a backup refuses `OpenReplica` rather than hold more than its disk can
/// flush in [`FRAME_FLUSH_WINDOW`].
pub fn frames_for_disk(disk_mbps: u32, frame_bytes: u32, configured: usize) -> usize {
    let flushable = u64::from(disk_mbps) * 1_000_000 * FRAME_FLUSH_WINDOW.as_secs()
        / u64::from(frame_bytes.max(1));
    let flushable = usize::try_from(flushable).unwrap_or(usize::MAX);
    flushable.clamp(FRAMES_MIN.min(configured), configured.max(1))
}

/// Names of default frame files start with this.
const FRAME_FILE_PREFIX: &str = "rampart-frames-";

/// The default frame file of a server whose data directory is `data_dir`.
fn default_frame_file(data_dir: &std::path::Path) -> std::path::PathBuf {
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let hash = rampart_common::ids::key_hash(canonical.as_os_str().as_encoded_bytes()).0;
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join(format!("{FRAME_FILE_PREFIX}{hash:016x}"))
    } else {
        data_dir.join("frames")
    }
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
    if args.replication == Some(TransportKind::Rdma) {
        if let Err(reason) = rampart_common::onesided::rdma::rdma_available() {
            bail!("--replication rdma: {reason}");
        }
    }
    let frame_file = args
        .frame_file
        .clone()
        .unwrap_or_else(|| default_frame_file(&args.data_dir));
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let disk_mbps = match args.disk_mbps {
        Some(mbps) => mbps,
        None => {
            let speed = rampart_backup::disk_speed::measure_read_mbps(
                &args.data_dir,
                rampart_backup::disk_speed::MEASURE_BUDGET,
            )
            .with_context(|| {
                format!(
                    "cannot measure the disk under {} (give --disk-mbps to skip)",
                    args.data_dir.display()
                )
            })?;
            tracing::info!(
                mbps = speed.read_mbps, method = speed.method, elapsed = ?speed.elapsed,
                "disk read bandwidth measured"
            );
            speed.read_mbps
        }
    };
    let frame_bytes = config.segment_bytes.max(SEGMENT_BYTES_DEFAULT);
    let backup_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(BACKUP_THREADS)
        .thread_name(BACKUP_THREAD_NAME)
        .enable_all()
        .build()
        .context("cannot start the backup runtime")?;
    runtime(args.threads)?.block_on(async {
        let backup_config = BackupConfig {
            frames_max: frames_for_disk(disk_mbps, frame_bytes, args.backup_frames),
            frame_bytes_max: frame_bytes,
            frame_file: frame_file.clone(),
        };
        // Frame files of backups killed with SIGKILL stay behind; remove those that no
        // live backup holds.
        if let Some(dir) = frame_file.parent() {
            let removed = rampart_common::onesided::shm::remove_stale_frame_files(
                dir,
                FRAME_FILE_PREFIX,
            );
            if !removed.is_empty() {
                tracing::info!(files = removed.len(), dir = %dir.display(), "stale frame files removed");
            }
        }
        let (backup, report) = BackupService::open(&args.data_dir, backup_config)
            .with_context(|| format!("cannot open the backup store in {}", args.data_dir.display()))?;
        let backup = Arc::new(backup);
        tracing::info!(
            data_dir = %args.data_dir.display(),
            frame_file = %frame_file.display(),
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
        let local = listener.local_addr()?;
        let addr = local.to_string();
        // The soft-NIC of the `tcp` transport listens beside the RPC port.
        let nic_listener = TcpListener::bind((local.ip(), 0))
            .await
            .context("cannot bind the soft-NIC listener")?;
        backup.set_nic_addr(nic_listener.local_addr()?.to_string());
        let request = EnlistRequest {
            addr: addr.clone(),
            services: Services {
                master: true,
                backup: true,
            },
            failure_domain: args.failure_domain.clone().unwrap_or_else(|| addr.clone()),
            disk_read_mbps: disk_mbps,
        };
        let id = enlist(&coordinators, &request).await?;
        let replication = ReplicationConfig {
            replicas: usize::try_from(args.replicas).context("--replicas is too large")?,
            transport: args.replication,
            servers: ServerSource::Coordinators(coordinators.clone()),
            seed: rand::random(),
            failed_backup_exclusion: rampart_master::replica_manager::replicator::FAILED_BACKUP_EXCLUSION,
        };
        let master = MasterService::with_replication(id, config, replication);
        let service = Arc::new(StorageService {
            master,
            backup: Arc::clone(&backup),
            backup_runtime: backup_runtime.handle().clone(),
        });
        // The soft-NIC runs on the backup runtime too: its CPU is the backup's.
        let nic_listener = nic_listener.into_std()?;
        let nic = backup_runtime.spawn(async move {
            match TcpListener::from_std(nic_listener) {
                Ok(listener) => {
                    rampart_common::onesided::nic::serve(listener, backup.nic_target(), std::future::pending())
                        .await
                }
                Err(error) => tracing::error!(%error, "soft-NIC listener lost"),
            }
        });
        announce(&format!("server {} listening on {addr}", id.0))?;
        tracing::info!(%id, %addr, memory = %args.memory, replicas = args.replicas, "server serving");
        let failed = Arc::clone(&service);
        let flusher = Arc::clone(&service.backup);
        let stop = async move {
            tokio::select! {
                _ = shutdown_signal() => None,
                reason = failed.master.failed() => Some(reason),
            }
        };
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel();
        RpcServer::run(listener, service, async move {
            let _ = stopped_tx.send(stop.await);
        })
        .await;
        nic.abort();
        // The frame file goes with this process: keep what its open frames hold.
        match tokio::task::spawn_blocking(move || flusher.flush_open_frames()).await {
            Ok(flushed) => tracing::info!(%id, flushed, "open frames written to the store"),
            Err(error) => tracing::warn!(%id, %error, "open frames not written to the store"),
        }
        if let Ok(Some(reason)) = stopped_rx.await {
            tracing::error!(%id, %reason, "server stopped: its master cannot go on");
            eprintln!("server {id} stopped: {reason}");
            return Ok(ExitCode::FAILURE);
        }
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
