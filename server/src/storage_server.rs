//! `StorageServer`: one storage server's life, from its configuration to its stop.
//!
//! [`StorageServer::start`] validates the configuration, then in this order: creates the
//! data directory (the default frame file is named by its canonical path), binds the RPC
//! port without listening on it, measures the disk unless told its speed, opens the
//! backup's store and frame file (frames a killed backup left are stored as open
//! replicas; frame files that no live backup holds and no restart will read — their data
//! directory gone, or no frame held — are removed), allocates and
//! touches the master's log memory, listens on the RPC port and binds the soft-NIC
//! beside it, and only then enlists: from its enlistment on, a server must answer pings,
//! so everything slow comes first. It then builds the master and starts the server's
//! children ([`ServerChildren`]).
//!
//! The port is bound first, so that a port in use fails the start at once rather than
//! after the slow steps, but it listens only once those are done: until then a
//! connection is refused, not accepted and left unanswered for as long as the disk
//! probe and the memory touch take (seconds). That matters when a server is restarted
//! at a crashed one's address: the failure detectors' pings of the old server are
//! refused at once instead of waiting out their timeouts.
//!
//! [`StorageServer::run`] serves until the shutdown future completes or the master
//! cannot go on (fenced, or declared crashed by the coordinator: its lease renewal was
//! refused), then stops: first the master stops serving clients (its lease revoked),
//! then the listener closes — in that order, so that a refused connection proves that
//! nothing serves behind the port (`rampart_coordinator::proof_of_death`); the
//! listener is held until then, as the RPC server's accept loop gives up on nothing but
//! its shutdown. Then, side by side, the children and the
//! backup — its runtime (waiting for the disk reads and writes of its requests), then
//! [`backup_stop::stop`]: the frames sealed, the open ones written to the store, and
//! the frame file removed unless a cold start of the data directory would still read
//! something back from it. So a server stopped gracefully leaves nothing in `/dev/shm`
//! (a killed one leaves its file for the restart, or for a start-up sweep once its data
//! directory is gone).
//!
//! Between `start` and `run` the server is enlisted but not serving: call `run` at once
//! (the failure detectors of other servers report a server that does not answer pings).

use rampart_backup::segment_store::StoreError;
use rampart_backup::service::{BackupConfig, BackupService};
use rampart_common::config::ByteSize;
use rampart_common::ids::ServerId;
use rampart_common::onesided::shm::{
    default_frame_file, remove_stale_frame_files, DEFAULT_FRAME_FILE_PREFIX,
};
use rampart_common::protocol::coordinator::EnlistRequest;
use rampart_common::rpc::RpcServer;
use rampart_common::tablet::Services;
use rampart_master::lease::Lease;
use rampart_master::replica_manager::replicator::FAILED_BACKUP_EXCLUSION;
use rampart_master::replica_manager::{ReplicationConfig, ServerSource};
use rampart_master::segmented_log::SegmentPool;
use rampart_master::MasterService;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpSocket};
use tokio::runtime::{Handle, Runtime};

use crate::backup_stop::{self, BackupStop};
use crate::children::ServerChildren;
use crate::config::{
    advertised_addr, frames_for_budget, host_of, ConfigError, StorageServerConfig, BACKUP_THREADS,
};
use crate::enlistment::{enlist, EnlistError};
use crate::metrics::StorageMetrics;
use crate::storage_service::{StorageService, BACKUP_THREAD_NAME};

/// Why a storage server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration does not validate.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The data directory cannot be created.
    #[error("cannot create {path}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The disk speed was not given and cannot be measured.
    #[error("cannot measure the disk under {path}")]
    DiskProbe {
        /// Where it was measured.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The backup's store or frame file cannot be opened.
    #[error("cannot open the backup store in {path}")]
    BackupStore {
        /// The data directory.
        path: PathBuf,
        /// Why.
        source: StoreError,
    },
    /// The RPC port cannot be bound or listened on (in use, not a local address).
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The backup's runtime, or the soft-NIC's listener, cannot be set up.
    #[error("cannot start {what}")]
    Io {
        /// What was being started.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The coordinators did not enlist the server.
    #[error(transparent)]
    Enlist(#[from] EnlistError),
    /// A blocking start-up step (the disk probe, the store's scan, touching the log's
    /// memory) panicked.
    #[error("start-up step failed: {0}")]
    Panicked(String),
}

/// Why a storage server stopped serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The shutdown future completed.
    Shutdown,
    /// The master cannot go on, for this reason (it was fenced, or the coordinator
    /// declared it crashed): another server is recovering its data. The process should
    /// exit with a failure.
    MasterFailed(String),
    /// The coordinators removed this server after draining it (`rampart drain`), for
    /// this reason: it holds nothing the cluster needs. The process should exit cleanly.
    Drained(String),
}

/// The backup's runtime. Dropping a runtime blocks, which an async context must not do:
/// [`BackupRuntime::stop`] drops it on a blocking thread, and a runtime never stopped
/// (start-up failed after it was built) is shut down in the background.
#[derive(Debug)]
struct BackupRuntime {
    /// `None` once stopped.
    runtime: Option<Runtime>,
    handle: Handle,
}

impl BackupRuntime {
    fn start() -> Result<BackupRuntime, StartError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(BACKUP_THREADS)
            .thread_name(BACKUP_THREAD_NAME)
            .enable_all()
            .build()
            .map_err(|source| StartError::Io {
                what: "the backup runtime",
                source,
            })?;
        Ok(BackupRuntime {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    /// Drops the runtime, waiting for its blocking tasks (close jobs writing replicas).
    async fn stop(mut self) {
        if let Some(runtime) = self.runtime.take() {
            let _ = tokio::task::spawn_blocking(move || drop(runtime)).await;
        }
    }
}

impl Drop for BackupRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A started storage server (see the module doc).
#[derive(Debug)]
pub struct StorageServer {
    id: ServerId,
    addr: SocketAddr,
    /// The address it enlisted with (`StorageServerConfig::advertise`, or `addr`).
    advertised: String,
    listener: TcpListener,
    service: Arc<StorageService>,
    children: ServerChildren,
    backup_runtime: BackupRuntime,
}

/// Connections the RPC port queues before the server accepts them.
pub const LISTEN_BACKLOG: u32 = 1024;

/// Binds `listen` without listening: the port is this server's, and connections to it
/// are refused until it listens.
async fn reserve(listen: &str) -> Result<(TcpSocket, SocketAddr), StartError> {
    let failed = |source| StartError::Listen {
        addr: listen.to_string(),
        source,
    };
    let wanted = tokio::net::lookup_host(listen)
        .await
        .map_err(failed)?
        .next()
        .ok_or_else(|| failed(std::io::Error::other("the name resolves to no address")))?;
    let socket = if wanted.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(failed)?;
    // As `TcpListener::bind` does: a server restarted at its address must not wait for
    // the old connections' TIME_WAIT to end.
    socket.set_reuseaddr(true).map_err(failed)?;
    socket.bind(wanted).map_err(failed)?;
    let addr = socket.local_addr().map_err(failed)?;
    Ok((socket, addr))
}

/// Runs `f` on a blocking thread: start-up steps that touch the disk or fault in memory
/// must not stall the runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StartError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StartError::Panicked(e.to_string()))
}

impl StorageServer {
    /// Starts a server of `config` that will serve RPCs on `listen` (`host:port`; port 0
    /// picks a free one: see [`addr`](Self::addr)). See the module doc.
    pub async fn start(
        config: StorageServerConfig,
        listen: &str,
    ) -> Result<StorageServer, StartError> {
        config.validate()?;
        let data_dir = config.data_dir.clone();
        // The directory first: the default frame file is named by its canonical path,
        // which exists only once the directory does (else a first start and a restart
        // would name different files, and the restart would not find the frames the
        // first one left).
        std::fs::create_dir_all(&data_dir).map_err(|source| StartError::DataDir {
            path: data_dir.clone(),
            source,
        })?;
        let frame_file = config
            .frame_file
            .clone()
            .unwrap_or_else(|| default_frame_file(&data_dir));
        let (socket, addr) = reserve(listen).await?;
        let disk_mbps = match config.disk_mbps {
            Some(mbps) => mbps,
            None => {
                let dir = data_dir.clone();
                let speed = blocking(move || {
                    rampart_backup::disk_speed::measure_read_mbps(
                        &dir,
                        rampart_backup::disk_speed::MEASURE_BUDGET,
                    )
                })
                .await?
                .map_err(|source| StartError::DiskProbe {
                    path: data_dir.clone(),
                    source,
                })?;
                tracing::info!(
                    mbps = speed.read_mbps, method = speed.method, elapsed = ?speed.elapsed,
                    "disk read bandwidth measured"
                );
                speed.read_mbps
            }
        };
        let backup_runtime = BackupRuntime::start()?;
        let backup = open_backup(&config, frame_file).await?;
        // The log's memory, touched before enlisting: from its enlistment on the server
        // must answer pings, and touching takes ≈ 0.4 s per GiB.
        let log_memory = {
            let master = config.master.clone();
            let touching = std::time::Instant::now();
            let pool = blocking(move || SegmentPool::for_config(&master)).await?;
            tracing::info!(
                memory = %ByteSize(config.master.memory_bytes),
                elapsed_ms = touching.elapsed().as_millis() as u64,
                "log memory allocated and touched"
            );
            pool
        };
        let listener = socket
            .listen(LISTEN_BACKLOG)
            .map_err(|source| StartError::Listen {
                addr: listen.to_string(),
                source,
            })?;
        // The soft-NIC of the `tcp` transport listens beside the RPC port, and runs on
        // the backup runtime: its CPU is the backup's.
        let nic_listener = std::net::TcpListener::bind((addr.ip(), config.nic_port))
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .map_err(|source| StartError::Io {
                what: "the soft-NIC listener",
                source,
            })?;
        let nic_addr = nic_listener.local_addr().map_err(|source| StartError::Io {
            what: "the soft-NIC listener",
            source,
        })?;
        // What other servers and clients are told: the advertised host, if any.
        let advertised = advertised_addr(config.advertise.as_deref(), addr);
        backup.set_nic_addr(match &config.advertise {
            Some(_) => format!("{}:{}", host_of(&advertised), nic_addr.port()),
            None => nic_addr.to_string(),
        });
        let request = EnlistRequest {
            addr: advertised.clone(),
            services: Services {
                master: true,
                backup: true,
            },
            failure_domain: config
                .failure_domain
                .clone()
                .unwrap_or_else(|| advertised.clone()),
            disk_read_mbps: disk_mbps,
        };
        let id = enlist(&config.coordinators, &request).await?;
        let replication = ReplicationConfig {
            replicas: config.replicas,
            transport: config.replication,
            servers: ServerSource::Coordinators(config.coordinators.clone()),
            seed: rand::random(),
            failed_backup_exclusion: FAILED_BACKUP_EXCLUSION,
        };
        // Client reads and writes wait for the first lease (milliseconds after this).
        let lease = Arc::new(Lease::new());
        let master = MasterService::with_pool(
            id,
            config.master.clone(),
            replication,
            config.partition_limits,
            log_memory,
        )
        .with_lease(Arc::clone(&lease));
        let nic = {
            let target = backup.nic_target();
            backup_runtime.handle.spawn(async move {
                match TcpListener::from_std(nic_listener) {
                    Ok(listener) => {
                        rampart_common::onesided::nic::serve(
                            listener,
                            target,
                            std::future::pending(),
                        )
                        .await
                    }
                    Err(error) => tracing::error!(%error, "soft-NIC listener lost"),
                }
            })
        };
        let children = ServerChildren::start(id, &advertised, &config, &master, lease, nic);
        let service = Arc::new(StorageService {
            master,
            backup,
            backup_runtime: backup_runtime.handle.clone(),
        });
        tracing::info!(
            %id, %addr, %advertised, memory = %ByteSize(config.master.memory_bytes),
            replicas = config.replicas, "server enlisted"
        );
        Ok(StorageServer {
            id,
            addr,
            advertised,
            listener,
            service,
            children,
            backup_runtime,
        })
    }

    /// The id the coordinators gave this server.
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// Where this server serves RPCs.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address it enlisted with: what other servers and clients reach it at.
    pub fn advertised(&self) -> &str {
        &self.advertised
    }

    /// A registry of this server's metrics (its master, backup and failure detector),
    /// read when scraped: serve it with `rampart_common::metrics::handler`.
    pub fn metrics(&self) -> prometheus::Registry {
        rampart_common::metrics::registry_of(vec![Box::new(StorageMetrics::new(
            Arc::clone(&self.service),
            self.children.detector_counts(),
        ))])
    }

    /// Serves until `shutdown` completes or the master cannot go on, then stops (see the
    /// module doc).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Stopped {
        let StorageServer {
            id,
            addr,
            advertised: _,
            listener,
            service,
            children,
            backup_runtime,
        } = self;
        tracing::info!(%id, %addr, "server serving");
        let failed = Arc::clone(&service);
        let stop = async move {
            let stopped = tokio::select! {
                () = shutdown => Stopped::Shutdown,
                reason = failed.master.failed() => {
                    if failed.master.was_drained() {
                        Stopped::Drained(reason)
                    } else {
                        Stopped::MasterFailed(reason)
                    }
                }
            };
            // Before the listener closes (when this future ends): a port that refuses
            // connections is taken as proof that nothing behind it serves
            // (`rampart_coordinator::proof_of_death`, rule 2).
            failed.master.stop_serving("the server is stopping");
            stopped
        };
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel();
        let backup = Arc::clone(&service.backup);
        RpcServer::run(listener, service, async move {
            let _ = stopped_tx.send(stop.await);
        })
        .await;
        // The soft-NIC is aborted here, the other children drain meanwhile: the backup
        // needs none of them, and a stop that outlasts its parent's patience (`rampart
        // cluster up` kills after 3 s) leaves its frame file behind.
        let children_stopped = children.stop();
        let backup_stopped = async move {
            // No backup request runs after this: the runtime and its tasks are gone.
            backup_runtime.stop().await;
            tokio::task::spawn_blocking(move || backup_stop::stop(&backup)).await
        };
        let (drained, backup_stopped) = tokio::join!(children_stopped, backup_stopped);
        if !drained {
            tracing::warn!(%id, "background tasks did not stop in time; aborted");
        }
        match backup_stopped {
            Ok(BackupStop::Removed { flushed }) => {
                tracing::info!(%id, flushed, "open frames written to the store; frame file removed");
            }
            Ok(BackupStop::Kept { flushed, reason }) => tracing::warn!(
                %id, flushed, %reason,
                "frame file kept for the restart on this data directory"
            ),
            Err(error) => tracing::warn!(%id, %error, "open frames not written to the store"),
        }
        match stopped_rx.await {
            Ok(Stopped::MasterFailed(reason)) => {
                tracing::error!(%id, %reason, "server stopped: its master cannot go on");
                Stopped::MasterFailed(reason)
            }
            Ok(Stopped::Drained(reason)) => {
                tracing::info!(%id, %reason, "server stopped: drained");
                Stopped::Drained(reason)
            }
            // The server stopped for its shutdown (or the RPC server dropped its stop
            // future, which only a shutdown does).
            _ => {
                tracing::info!(%id, "server stopped");
                Stopped::Shutdown
            }
        }
    }
}

/// Opens the backup's store and frame file, with the frame bound its disk allows, and
/// logs what the open found.
async fn open_backup(
    config: &StorageServerConfig,
    frame_file: PathBuf,
) -> Result<Arc<BackupService>, StartError> {
    let frame_bytes = config.frame_bytes();
    // `backup_frames` slots, of which as many as the byte budget allows take open
    // frames; the others keep flushed replicas in memory.
    let frames_max = frames_for_budget(
        config.unflushed_bytes_max,
        frame_bytes,
        config.backup_frames,
    );
    let backup_config = BackupConfig {
        frames_max,
        extra_slots: config.backup_frames.saturating_sub(frames_max),
        frame_bytes_max: frame_bytes,
        frame_file: frame_file.clone(),
    };
    let data_dir = config.data_dir.clone();
    let opening = std::time::Instant::now();
    let opened = {
        let (data_dir, frame_file) = (data_dir.clone(), frame_file.clone());
        blocking(move || {
            // Frame files of backups killed with SIGKILL stay behind for the backup
            // restarted on the same data directory; remove those no restart will read
            // (`remove_stale_frame_files`: data directory gone, no frame held, a
            // creation cut short).
            if let Some(dir) = frame_file.parent() {
                let removed = remove_stale_frame_files(
                    dir,
                    DEFAULT_FRAME_FILE_PREFIX,
                    rampart_backup::service::frame_file_tag_is_live,
                );
                if !removed.is_empty() {
                    tracing::info!(files = removed.len(), dir = %dir.display(), "stale frame files removed");
                }
            }
            BackupService::open(&data_dir, backup_config)
        })
        .await?
    };
    let (backup, report) = opened.map_err(|source| StartError::BackupStore {
        path: data_dir.clone(),
        source,
    })?;
    tracing::info!(
        data_dir = %data_dir.display(),
        frame_file = %frame_file.display(),
        frames_open_max = backup.config().frames_max,
        slots = backup.config().frames_max + backup.config().extra_slots,
        elapsed_ms = opening.elapsed().as_millis() as u64,
        replicas = report.store.replicas.len(),
        quarantined = report.store.quarantined.len(),
        frames_read_back = report.frames_read_back.len(),
        "backup store scanned"
    );
    for file in &report.store.quarantined {
        tracing::warn!(file = %file.original.display(), reason = ?file.reason, "replica quarantined");
    }
    for meta in &report.frames_read_back {
        tracing::info!(
            master = %meta.master, segment = %meta.segment, epoch = %meta.epoch,
            length = meta.length, "frame left by a killed backup stored as an open replica"
        );
    }
    for (label, reason) in &report.frames_skipped {
        tracing::info!(
            master = %label.master, segment = %label.segment, epoch = %label.epoch,
            %reason, "frame left by a killed backup not stored"
        );
    }
    if let Some(why) = &report.frame_file_unread {
        tracing::warn!(frame_file = %frame_file.display(), %why, "frame file left behind not read; replaced");
    }
    Ok(Arc::new(backup))
}
