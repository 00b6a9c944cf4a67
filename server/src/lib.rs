//! `rampart-server`: one storage server, a master and a backup behind one listener
//! (docs/design.md §1), as a library.
//!
//! `rampart server` is a thin wrapper over it (flags in, exit code out); an in-process
//! cluster starts several in one process, each on its own listener (see
//! `tests/in_process.rs`). Anything that attaches to a server (metrics, another
//! listener) attaches here.
//!
//! # Modules
//! * [`config`]: [`StorageServerConfig`], validated once, and the backup's frame bound.
//! * [`storage_server`]: [`StorageServer`], start-up order, serving and the stop order.
//! * [`backup_stop`]: what a graceful stop does with the backup's frames: sealed,
//!   written to the store, and the frame file removed unless a cold start needs it.
//! * [`children`]: the background tasks (lease renewer, tablet sync, version reserver,
//!   failure detector, will uploader, soft-NIC), started and stopped together.
//! * [`metrics`]: [`metrics::StorageMetrics`], the server's Prometheus metrics, read
//!   from its master, backup and failure detector when scraped.
//! * [`enlistment`]: how a starting server gets its id from the coordinators.
//! * [`storage_service`]: the RPC router, masters' opcodes to the master, backups' to
//!   the backup's own runtime.
//!
//! # Main path
//! `StorageServer::start(config, listen)` → port bound, backup store opened, log memory
//! touched, port listened on, enlisted, children started → `run(shutdown)`: every RPC goes through
//! [`StorageService`] to `rampart_master::MasterService` (reads, writes through the
//! master's appender and replicator to R backups) or `rampart_backup::BackupService` →
//! at shutdown, listener closed, then children stopped beside the backup: its runtime
//! drained, its frames sealed and written to its store, its frame file removed.

pub mod backup_stop;
pub mod children;
pub mod config;
pub mod enlistment;
pub mod metrics;
pub mod storage_server;
pub mod storage_service;

pub use config::{ConfigError, StorageServerConfig};
pub use storage_server::{StartError, Stopped, StorageServer};
pub use storage_service::{StorageService, BACKUP_THREAD_NAME};
