//! `rampart cluster up`: a whole local cluster as child processes on loopback.
//!
//! Starts one coordinator and N storage servers, prints one line per process
//! (`coordinator at ADDR`, `server ID at ADDR`) and then a line starting with `ready`.
//! Scripts and tests rely on these lines. It then waits; Ctrl-C or SIGTERM stops every
//! child, and children die with it even if it is killed (see `children`).

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::children::Children;

/// Replicas per segment when `--replicas` is not given (clamped to servers − 1).
pub const REPLICAS_DEFAULT: u32 = 3;

/// `rampart cluster ...`
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Start a local cluster and keep it running until Ctrl-C.
    Up(UpArgs),
}

/// `rampart cluster up`
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// Storage servers to start (each runs a master and a backup).
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Backup replicas of every segment (R). Default: 3, or fewer when the cluster is
    /// too small (a master never replicates to its own server, so R ≤ servers − 1).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Replication transport of every server: shm, tcp, rpc or rdma. Default: shm
    /// between servers on one host (all of them, here), else tcp.
    #[arg(long)]
    pub replication: Option<String>,
    /// Coordinator address (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7000")]
    pub coordinator_addr: String,
    /// DRAM per server for its log.
    #[arg(long, default_value = "1GiB")]
    pub memory: String,
    /// Bytes per log segment.
    #[arg(long, default_value = "8MiB")]
    pub segment_bytes: String,
    /// Directory for the servers' data (server N uses DIR/server-N).
    #[arg(long, default_value = "rampart-data")]
    pub data_dir: std::path::PathBuf,
    /// Largest value a server accepts.
    #[arg(long, default_value = "1MiB")]
    pub value_bytes_max: String,
    /// Log level of the children (`RAMPART_LOG` overrides).
    #[arg(long, default_value = "warn")]
    pub log_level: String,
}

/// A started local cluster.
#[derive(Debug)]
pub struct LocalCluster {
    /// The coordinator's address.
    pub coordinator: String,
    /// (server id, address) of each server.
    pub servers: Vec<(u64, String)>,
    /// The processes; dropping this stops them.
    pub children: Children,
}

/// Starts a cluster as described by `args`, printing a line per process.
pub fn start(args: &UpArgs, print: bool) -> Result<LocalCluster> {
    if args.servers == 0 {
        bail!("--servers must be at least 1");
    }
    let replicas = match args.replicas {
        Some(r) if r >= args.servers => bail!(
            "--replicas {r} needs at least {} servers (a master never keeps a replica on its \
             own server); start more with --servers",
            r + 1
        ),
        Some(r) => r,
        None => REPLICAS_DEFAULT.min(args.servers - 1),
    };
    let mut children = Children::new();
    let log = std::env::var("RAMPART_LOG").unwrap_or_else(|_| args.log_level.clone());
    let env = [("RAMPART_LOG", log)];
    let coordinator = children
        .spawn(
            "coordinator",
            &[
                "coordinator".into(),
                "--listen".into(),
                args.coordinator_addr.clone(),
            ],
            &env,
        )?
        .addr
        .clone();
    if print {
        println!("coordinator at {coordinator}");
        println!("data in {}", args.data_dir.display());
        println!("replicas {replicas}");
    }
    let mut servers = Vec::new();
    for i in 1..=args.servers {
        let server_args: Vec<String> = [
            "server".into(),
            "--coordinator".into(),
            coordinator.clone(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--memory".into(),
            args.memory.clone(),
            "--segment-bytes".into(),
            args.segment_bytes.clone(),
            "--value-bytes-max".into(),
            args.value_bytes_max.clone(),
            "--data-dir".into(),
            args.data_dir
                .join(format!("server-{i}"))
                .display()
                .to_string(),
            "--replicas".into(),
            replicas.to_string(),
        ]
        .into_iter()
        .chain(
            args.replication
                .iter()
                .flat_map(|t| ["--replication".to_string(), t.clone()]),
        )
        .collect();
        let running = children.spawn(&format!("server #{i}"), &server_args, &env)?;
        let id: u64 = running
            .announce
            .get(1)
            .and_then(|id| id.parse().ok())
            .unwrap_or(0);
        if print {
            println!("server {id} at {} (pid {})", running.addr, running.pid());
        }
        servers.push((id, running.addr.clone()));
    }
    Ok(LocalCluster {
        coordinator,
        servers,
        children,
    })
}

/// Runs `rampart cluster ...`.
pub fn run(command: ClusterCommand) -> Result<ExitCode> {
    match command {
        ClusterCommand::Up(args) => up(args),
    }
}

fn up(args: UpArgs) -> Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGINT, libc::SIGTERM] {
        signal_flag(signal, &stop)?;
    }
    let mut cluster = start(&args, true)?;
    println!(
        "ready: {} server(s); try `RAMPART_COORDINATOR={} rampart kv create-table demo`; Ctrl-C stops the cluster",
        cluster.servers.len(),
        cluster.coordinator
    );
    while !stop.load(Ordering::SeqCst) {
        for (name, status) in cluster.children.reap() {
            eprintln!("{name} exited ({status})");
        }
        if cluster.children.all_exited() {
            eprintln!("every process of the cluster has exited");
            return Ok(ExitCode::FAILURE);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("stopping the cluster");
    cluster.children.stop_all();
    Ok(ExitCode::SUCCESS)
}

/// Sets `flag` when `signal` arrives.
fn signal_flag(signal: libc::c_int, flag: &Arc<AtomicBool>) -> Result<()> {
    use std::sync::OnceLock;
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    extern "C" fn handler(_: libc::c_int) {
        if let Some(flag) = FLAG.get() {
            flag.store(true, Ordering::SeqCst);
        }
    }
    let _ = FLAG.set(Arc::clone(flag));
    // SAFETY: the handler only performs an atomic store, which is async-signal-safe.
    let previous = unsafe { libc::signal(signal, handler as *const () as libc::sighandler_t) };
    if previous == libc::SIG_ERR {
        bail!("cannot install a handler for signal {signal}");
    }
    Ok(())
}
