//! The long-running processes: `rampart coordinator` and `rampart server`.
//!
//! Each binds its listener, then prints one line to stdout naming the bound address
//! (`coordinator N listening on ADDR`, `server N listening on ADDR`: the lines of
//! `rampart_common::announce`, which every launcher reads) — so a parent that
//! asked for port 0 learns the port — and serves until SIGINT or SIGTERM. A server
//! listens only once its slow start-up steps are done (`StorageServer::start`), and
//! records the id it enlisted under in its data directory first (`server.id`, read by
//! `rampart server-exited`: `supervisor`). With
//! `--metrics-addr`, a line before it names the metrics URL (`... metrics at
//! http://ADDR/metrics`); a coordinator serves its status page there too.
//!
//! A coordinator started with `--peers -` (a parent starting a group on ports the OS
//! picks) binds `--listen` first, prints `coordinator N waiting for its peers, bound to
//! ADDR`, and reads the group's `--peers` list, which must name ADDR for it, as one line
//! on stdin: every member holds its port before any peer learns it, so two groups
//! started at once can never be handed the same port.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rampart_common::announce::{Announce, Pages, Speaker};
use rampart_common::config::{
    ByteSize, MasterConfig, CLEANER_THRESHOLD_PCT_DEFAULT, SEGMENT_BYTES_DEFAULT,
};
use rampart_common::failpoints;
use rampart_common::limits::VALUE_BYTES_MAX_DEFAULT;
use rampart_common::onesided::shm::remove_default_frame_files_under;
use rampart_common::onesided::TransportKind;
use rampart_common::protocol::coordinator::{RaftStatus, RaftStatusRequest};
use rampart_common::rpc::{RpcPool, RpcServer};
use rampart_coordinator::node::{group_id, NodeConfig, RaftNode, Seed};
use rampart_coordinator::CoordinatorService;
use rampart_server::config::BACKUP_FRAMES_DEFAULT;
use rampart_server::{StartError, Stopped, StorageServer, StorageServerConfig};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// `rampart coordinator`
#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    /// This coordinator's Raft id, a key of `--peers`.
    #[arg(long, default_value_t = 1)]
    pub id: u64,
    /// A cluster file (TOML) whose `[[coordinator]]` entry with `--id` gives this
    /// coordinator's flags (peers, listen, data dir, metrics, token, certificate).
    #[arg(long, value_name = "FILE")]
    pub cluster_file: Option<std::path::PathBuf>,
    /// Every coordinator of the Raft group, this one included: `1=HOST:PORT,2=...`.
    /// Static membership: give every member the same list. Without it the coordinator
    /// runs alone, as a group of one at `--listen`. `-`: bind `--listen` (port 0 picks a
    /// free port), print `coordinator N waiting for its peers, bound to ADDR`, then read
    /// the list, naming ADDR for this member, as one line on stdin.
    #[arg(long)]
    pub peers: Option<String>,
    /// Address to listen on. Default: this coordinator's address in `--peers`, or
    /// 127.0.0.1:7000 alone (port 0 picks a free port, printed at start; alone only).
    #[arg(long)]
    pub listen: Option<String>,
    /// Address to serve HTTP on: the status page at `/`, its JSON at `/api/status`, and
    /// Prometheus metrics at `/metrics` (port 0 picks a free port; the URL is printed at
    /// start). None by default.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Directory of this coordinator's Raft log and snapshots (created if missing). It
    /// belongs to this id for good: never wipe it to restart a member (see docs/operating.md).
    #[arg(long)]
    pub data_dir: std::path::PathBuf,
    #[command(flatten)]
    pub security: crate::security::ServerSecurityArgs,
    /// Raft tick, in milliseconds.
    #[arg(long, default_value_t = rampart_coordinator::node::TICK_DEFAULT.as_millis() as u64)]
    pub raft_tick_ms: u64,
    /// Ticks without a leader before a follower stands for election (randomized up to
    /// twice this). Lower fails over faster; too low elects needlessly under load.
    #[arg(long, default_value_t = rampart_coordinator::node::ELECTION_TICKS_DEFAULT)]
    pub election_ticks: usize,
    /// Ticks between the leader's heartbeats (less than `--election-ticks`).
    #[arg(long, default_value_t = rampart_coordinator::node::HEARTBEAT_TICKS_DEFAULT)]
    pub heartbeat_ticks: usize,
    /// Applied changes between snapshots of the configuration (each compacts the log).
    #[arg(long, default_value_t = rampart_coordinator::node::SNAPSHOT_ENTRIES_DEFAULT)]
    pub snapshot_entries: u64,
    /// Write the configuration held in `--data-dir` (a stopped member's) to FILE, and
    /// exit: the seed to re-create a group (see docs/operating.md, "Replacing a coordinator").
    #[arg(long, value_name = "FILE")]
    pub export: Option<std::path::PathBuf>,
    /// Start a fresh `--data-dir` from a configuration written by `--export`. Every member
    /// of the re-created group must be started from the same file.
    #[arg(long, value_name = "FILE")]
    pub seed: Option<std::path::PathBuf>,
    /// Confirm that this member has never run before, although the other members already
    /// hold a configuration (a member added to the group after the others started).
    /// Never use it for a member that lost its data directory.
    #[arg(long)]
    pub first_start: bool,
    /// Lease granted to masters, in milliseconds: a master cut off from the coordinators
    /// stops serving this long after its last granted renewal, and recovered tablets go
    /// live no sooner after a crash. Longer rides out longer coordinator outages;
    /// shorter puts recovered data back sooner when replay is quick.
    #[arg(long, default_value_t = rampart_coordinator::recovery_manager::LEASE_DEFAULT.as_millis() as u64)]
    pub lease_ms: u64,
    /// Deadline of each of the leader's own pings of a server reported silent, in
    /// milliseconds. Shorter declares a hung server dead sooner; too short declares a
    /// merely slow one dead (it then exits and its data is recovered).
    #[arg(long, default_value_t = rampart_coordinator::recovery_manager::VERIFY_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub verify_timeout_ms: u64,
    /// Pings of a reported server that must all fail before it is declared crashed.
    #[arg(long, default_value_t = rampart_coordinator::recovery_manager::VERIFY_ATTEMPTS_DEFAULT)]
    pub verify_attempts: u32,
    /// Recovery masters one recovery gives partitions to at most, those with the most
    /// free log memory (the others only take over a partition whose master failed); 0:
    /// every master that is up. Fewer leaves the others' CPU to their clients during a
    /// recovery, at the cost of a longer one.
    #[arg(long, default_value_t = 0)]
    pub recovery_masters_max: usize,
    /// How often the leader frees, on the backups, the replicas of masters that are gone
    /// (recovered or drained) that a backup away at the time kept, in milliseconds.
    #[arg(long, default_value_t = rampart_coordinator::collector::COLLECT_INTERVAL_DEFAULT.as_millis() as u64)]
    pub collect_interval_ms: u64,
    /// What proves a crashed master dead, so that its tablets go live elsewhere without
    /// waiting out its lease: `supervisor` (its supervisor, such as `rampart cluster up`,
    /// saw its process exit), `direct` (that, or its address refuses connections or
    /// another server answers there: only where no firewall REJECT rule, NAT or proxy
    /// stands between coordinators and servers) or `off` (always wait out the lease).
    /// A hung or cut-off master is always waited out.
    #[arg(long, default_value_t = rampart_coordinator::proof_of_death::ProofOfDeath::Supervisor)]
    pub proof_of_death: rampart_coordinator::proof_of_death::ProofOfDeath,
    /// Whether the leader moves and splits tablets by load (`on` or `off`): a master
    /// whose load stays above the mean moves its hottest tablets to the least loaded,
    /// and a server that joins gets its share. `rampart rebalance` shows, pauses and
    /// pins.
    #[arg(long, default_value = "on", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub rebalance: bool,
    /// How far above the mean (in percent) a master's load must stay to count as hot.
    #[arg(long, default_value_t = rampart_coordinator::rebalance::RebalanceConfig::default().threshold_pct)]
    pub rebalance_threshold_pct: u32,
    /// How long a master must stay hot before the rebalancer acts, in milliseconds.
    #[arg(long, default_value_t = rampart_coordinator::rebalance::RebalanceConfig::default().sustain.as_millis() as u64)]
    pub rebalance_after_ms: u64,
}

/// The `--peers` value that has a coordinator read the list from stdin once it is bound.
pub const PEERS_ON_STDIN: &str = "-";

/// The peers of coordinator `id`, bound to `bound`, from the `--peers` line its parent
/// sent on stdin: refused unless it names `bound` for `id` (a parent that mixed up its
/// members' addresses would otherwise split the group).
fn learned_peers(
    id: u64,
    bound: std::net::SocketAddr,
    line: &str,
) -> Result<BTreeMap<u64, String>> {
    let line = line.trim();
    if line.is_empty() {
        bail!("--peers -: stdin closed before the peers' list arrived");
    }
    let peers = parse_peers(line)?;
    match peers.get(&id) {
        Some(addr) if addr.parse::<std::net::SocketAddr>().ok() == Some(bound) => Ok(peers),
        Some(addr) => bail!(
            "--peers -: the list names {addr} for coordinator {id}, which is bound to {bound}"
        ),
        None => bail!("--peers -: coordinator {id} is not in the list `{line}`"),
    }
}

/// Parses `--peers`: `ID=ADDR` pairs, comma-separated.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((id, addr)) = pair.split_once('=') else {
            bail!("--peers: `{pair}` is not ID=HOST:PORT");
        };
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("--peers: `{id}` is not a Raft id"))?;
        if id == 0 {
            bail!("--peers: Raft ids start at 1");
        }
        let addr = addr.trim();
        if addr.is_empty() || addr.ends_with(":0") {
            bail!("--peers: member {id} needs a fixed HOST:PORT, not `{addr}`");
        }
        if peers.insert(id, addr.to_string()).is_some() {
            bail!("--peers names id {id} twice");
        }
    }
    if peers.is_empty() {
        bail!("--peers is empty");
    }
    Ok(peers)
}

/// `rampart server`
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// A cluster file (TOML) whose `[[server]]` entry named `--name` gives this server's
    /// flags (coordinators, listen, advertise, rack, data dir, memory, R, transport,
    /// token, certificate).
    #[arg(long, value_name = "FILE", requires = "name")]
    pub cluster_file: Option<std::path::PathBuf>,
    /// This server's name in the cluster file.
    #[arg(long, requires = "cluster_file")]
    pub name: Option<String>,
    /// Directory of the backup's segment replicas (created if missing). A restarted
    /// server given the same directory reports the replicas it holds.
    #[arg(long)]
    pub data_dir: std::path::PathBuf,
    /// Segment replicas the backup holds in memory: its frame file, a pool allocated at
    /// start-up (this many frames of the larger of --segment-bytes and 8 MiB). As many
    /// as --unflushed-max allows take open replicas; the rest keep flushed replicas in
    /// memory, so that a recovery reads more of them from there.
    #[arg(long, default_value_t = BACKUP_FRAMES_DEFAULT)]
    pub backup_frames: usize,
    /// Replicated data the backup may hold only in memory, not yet on its disk (frames
    /// open for writes, or closed and not yet flushed): what a power loss of the whole
    /// cluster could take, and how far writes and re-replication may run ahead of the
    /// disk. At least one frame; at most --backup-frames of them count.
    #[arg(long, default_value = "256MiB")]
    pub unflushed_max: ByteSize,
    /// Coordinator address(es), comma-separated.
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// Address to listen on (port 0 picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address to serve Prometheus metrics on, at `http://ADDR/metrics` (port 0 picks a
    /// free port; the URL is printed at start). None by default.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// The address other servers and clients reach this one at, when it is not
    /// `--listen` (e.g. `--listen 0.0.0.0:7100 --advertise h1.rack1`): HOST (the
    /// listening port is added) or HOST:PORT. It is what the server enlists with and
    /// announces.
    #[arg(long)]
    pub advertise: Option<String>,
    #[command(flatten)]
    pub security: crate::security::ServerSecurityArgs,
    /// Port of the backup's soft-NIC (the `tcp` replication transport), on --listen's
    /// IP and advertised on --advertise's host (0: a free port, printed nowhere; give one
    /// where a firewall must name it).
    #[arg(long, default_value_t = 0)]
    pub nic_port: u16,
    /// DRAM for the master's log, e.g. 4GiB.
    #[arg(long, default_value = "1GiB")]
    pub memory: ByteSize,
    /// Bytes per log segment.
    #[arg(long, default_value_t = ByteSize(u64::from(SEGMENT_BYTES_DEFAULT)))]
    pub segment_bytes: ByteSize,
    /// Largest value accepted.
    #[arg(long, default_value_t = ByteSize(VALUE_BYTES_MAX_DEFAULT as u64))]
    pub value_bytes_max: ByteSize,
    /// Percent of the log's memory in use from which an idle master runs its cleaner
    /// (1..=99). Under load the cleaner runs once few segments are free, whatever this
    /// says: the later a segment is cleaned, the less of it is still live.
    #[arg(long, default_value_t = CLEANER_THRESHOLD_PCT_DEFAULT)]
    pub cleaner_threshold: u8,
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
    #[arg(long, default_value_t = rampart_server::config::REPLICAS_DEFAULT as u32)]
    pub replicas: u32,
    /// How replica bytes move to backups: shm, tcp, rpc or rdma. Default: chosen per
    /// backup, shm for a backup on this host, else tcp.
    #[arg(long)]
    pub replication: Option<TransportKind>,
    /// Disk read bandwidth of this server's backup, MB/s, reported at enlistment
    /// instead of measuring it at start-up (masters place replicas by it).
    #[arg(long)]
    pub disk_mbps: Option<u32>,
    /// Largest recovery partition of this master's will, in MiB: should it crash, each
    /// recovery master replays at most this much of its data.
    #[arg(long, default_value_t = rampart_master::profiler::PARTITION_BYTES_DEFAULT / (1024 * 1024))]
    pub partition_mb: u64,
    /// Most objects and tombstones in one recovery partition of this master's will.
    #[arg(long, default_value_t = rampart_master::profiler::PARTITION_RECORDS_DEFAULT)]
    pub partition_records: u64,
    /// The backup's shared-memory frame file (its "non-volatile buffer"). Default:
    /// /dev/shm/rampart-frames-HASH, HASH naming the data directory.
    #[arg(long)]
    pub frame_file: Option<std::path::PathBuf>,
    /// Milliseconds between two pings of the failure detector, each of a random other
    /// server. Shorter detects a crash sooner, at more pings per second in the cluster.
    #[arg(long, default_value_t = rampart_master::failure_detector::PING_INTERVAL.as_millis() as u64)]
    pub ping_interval_ms: u64,
    /// Milliseconds a pinged server has to answer before it is reported to the
    /// coordinator (which checks for itself before declaring it crashed).
    #[arg(long, default_value_t = rampart_master::failure_detector::PING_TIMEOUT.as_millis() as u64)]
    pub ping_timeout_ms: u64,
    /// Milliseconds between two renewals of the master's lease. The lease's length is
    /// the coordinator's (`rampart coordinator --lease-ms`); renew several times per
    /// lease so that a lost renewal does not stop the master.
    #[arg(long, default_value_t = rampart_master::lease::LEASE_RENEW_INTERVAL.as_millis() as u64)]
    pub lease_renew_ms: u64,
}

/// Removes `root`, a scratch tree of data directories whose servers have stopped (a
/// bench's cluster), and the default frame files of every data directory in it (see
/// [`remove_default_frame_files_under`]). Best effort.
pub(crate) fn remove_scratch_data(root: &std::path::Path) {
    let is_dir = remove_default_frame_files_under(root);
    let _ = if is_dir {
        std::fs::remove_dir_all(root)
    } else {
        std::fs::remove_file(root)
    };
}

pub(crate) fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
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

pub(crate) fn announce(line: &Announce) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

/// Says on stdout, when [`failpoints::FAILPOINTS_ENV`] names failpoints, whether this
/// build honours them, before any other line: a process test that asks for failpoints
/// must not run a build without them (a plain `cargo build` of the same target
/// directory) and take the silence of its failpoints for a pass.
fn announce_failpoints() -> Result<()> {
    let named = std::env::var(failpoints::FAILPOINTS_ENV).unwrap_or_default();
    if named.trim().is_empty() {
        return Ok(());
    }
    if !failpoints::COMPILED_IN {
        tracing::warn!(%named, "failpoints compiled out of this build: RAMPART_FAILPOINTS ignored");
    }
    announce(&Announce::Failpoints {
        compiled_in: failpoints::COMPILED_IN,
        named,
    })
}

/// Runs a coordinator until a signal, or until its Raft node fails.
pub fn run_coordinator(args: CoordinatorArgs) -> Result<ExitCode> {
    crate::startup::init_logging("info");
    announce_failpoints()?;
    args.security.install()?;
    if let Some(file) = &args.export {
        return export_seed(&args.data_dir, file);
    }
    let seed = match &args.seed {
        Some(file) => {
            let bytes =
                std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
            let seed =
                Seed::decode(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            Some(seed)
        }
        None => None,
    };
    let peers_on_stdin = args.peers.as_deref() == Some(PEERS_ON_STDIN);
    if peers_on_stdin && args.listen.is_none() {
        bail!("--peers - needs --listen (port 0 picks a free port)");
    }
    let peers = match args.peers.as_deref() {
        Some(PEERS_ON_STDIN) | None => None,
        Some(text) => Some(parse_peers(text)?),
    };
    if let Some(peers) = &peers {
        if !peers.contains_key(&args.id) {
            bail!(
                "--id {} is not in --peers (ids {:?})",
                args.id,
                peers.keys().collect::<Vec<_>>()
            );
        }
    }
    let listen = match (&args.listen, &peers) {
        (Some(listen), _) => listen.clone(),
        (None, Some(peers)) => peers.get(&args.id).cloned().unwrap_or_default(),
        (None, None) => "127.0.0.1:7000".to_string(),
    };
    let runtime = runtime(0)?;
    runtime.block_on(async {
        let listener = TcpListener::bind(&listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let peers = match peers {
            Some(peers) => peers,
            None if peers_on_stdin => {
                announce(&Announce::WaitingForPeers {
                    coordinator: args.id,
                    addr: addr.to_string(),
                })?;
                let line = tokio::task::spawn_blocking(|| {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line).map(|_| line)
                })
                .await?
                .context("cannot read --peers from stdin")?;
                learned_peers(args.id, addr, &line)?
            }
            None => BTreeMap::from([(args.id, addr.to_string())]),
        };
        if rampart_coordinator::node::is_fresh(&args.data_dir)
            && peers.len() > 1
            && !args.first_start
        {
            let voters: Vec<u64> = peers.keys().copied().collect();
            let group = group_id(&voters, seed.as_ref());
            let version = seed.as_ref().map_or(0, |s| s.state.version());
            refuse_to_rejoin(args.id, &peers, group, version).await?;
        }
        let config = NodeConfig {
            id: args.id,
            peers,
            data_dir: args.data_dir.clone(),
            tick: Duration::from_millis(args.raft_tick_ms.max(1)),
            election_ticks: args.election_ticks,
            heartbeat_ticks: args.heartbeat_ticks,
            snapshot_entries: args.snapshot_entries,
            seed,
        };
        let members: Vec<String> = config.peers.values().cloned().collect();
        let node = RaftNode::start(config, tokio::runtime::Handle::current())
            .with_context(|| format!("cannot start coordinator {}", args.id))?;
        tracing::info!(id = args.id, %addr, data_dir = %args.data_dir.display(), "coordinator serving");
        let recovery = rampart_coordinator::recovery_manager::RecoveryConfig {
            lease: Duration::from_millis(args.lease_ms.max(1)),
            verify_timeout: Duration::from_millis(args.verify_timeout_ms.max(1)),
            verify_attempts: args.verify_attempts.max(1),
            masters_max: (args.recovery_masters_max > 0).then_some(args.recovery_masters_max),
            proof_of_death: args.proof_of_death,
            collect_interval: Duration::from_millis(args.collect_interval_ms.max(1)),
            rebalance: args.rebalance.then(|| rampart_coordinator::rebalance::RebalanceConfig {
                threshold_pct: args.rebalance_threshold_pct,
                sustain: Duration::from_millis(args.rebalance_after_ms),
                ..Default::default()
            }),
        };
        let service = Arc::new(CoordinatorService::with_recovery(node.clone(), recovery));
        if let Some(http) = &args.metrics_addr {
            let metrics = rampart_common::metrics::registry_of(vec![Box::new(
                rampart_coordinator::metrics::CoordinatorMetrics::new(Arc::clone(&service)),
            )]);
            let handler = rampart_coordinator::status_page::handler(members, vec![metrics]);
            let bound = rampart_common::http::spawn(http, handler)
                .await
                .with_context(|| format!("cannot serve HTTP on {http}"))?;
            announce(&Announce::Urls(Pages {
                speaker: Speaker::Coordinator(args.id),
                status: Some(format!("http://{bound}/")),
                metrics: format!("http://{bound}/metrics"),
            }))?;
        }
        announce(&Announce::Listening {
            speaker: Speaker::Coordinator(args.id),
            addr: addr.to_string(),
        })?;
        let failed = {
            let node = node.clone();
            async move {
                loop {
                    if node.failure().is_some() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        RpcServer::run(listener, service, async {
            tokio::select! {
                _ = shutdown_signal() => {}
                _ = failed => {}
            }
        })
        .await;
        let failure = node.failure();
        tokio::task::block_in_place(|| node.stop());
        match failure {
            Some(why) => {
                tracing::error!(%why, "coordinator stopped: its Raft node failed");
                Ok(ExitCode::FAILURE)
            }
            None => {
                tracing::info!("coordinator stopped");
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

/// How long a fresh member asks its peers whether the group already holds a configuration.
const REJOIN_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Refuses to start a member with an empty data directory in a group that already holds a
/// configuration beyond the one it starts from (`version`: 0, or the seed's): that member
/// lost its log, and a Raft member that forgets its votes and log could elect a second
/// leader in one term or lose committed changes. Also refuses when a peer belongs to
/// another group (`group` is this member's). Peers that do not answer are not evidence
/// either way: a brand-new group starts its members one by one.
async fn refuse_to_rejoin(
    id: u64,
    peers: &BTreeMap<u64, String>,
    group: u64,
    version: u64,
) -> Result<()> {
    let pool = RpcPool::new();
    let deadline = Instant::now() + REJOIN_CHECK_TIMEOUT;
    let asks = peers
        .iter()
        .filter(|(peer, _)| **peer != id)
        .map(|(peer, addr)| {
            let pool = &pool;
            async move {
                let status = pool
                    .call::<RaftStatus>(addr, &RaftStatusRequest {}, deadline)
                    .await;
                (*peer, status)
            }
        });
    for (peer, status) in futures::future::join_all(asks).await {
        let Ok(status) = status else { continue };
        if status.group != group {
            bail!(
                "coordinator {peer} belongs to group {:016x}, but this one would start group \
                 {group:016x}: stop every member of an old group before re-creating it, and \
                 start every member of a re-created group with the same --seed",
                status.group
            );
        }
        if status.config_version > version {
            bail!(
                "coordinator {id} has an empty data directory, but coordinator {peer} already \
                 holds configuration version {}: a member's Raft log cannot be recreated. \
                 Restore this member's data directory, or re-create the group (docs/operating.md, \
                 \"Replacing a coordinator\"); if this member has truly never run, pass \
                 --first-start",
                status.config_version
            );
        }
    }
    Ok(())
}

/// `rampart coordinator --export FILE`: writes the configuration of a stopped member.
fn export_seed(data_dir: &std::path::Path, file: &std::path::Path) -> Result<ExitCode> {
    let seed = Seed::export(data_dir)
        .with_context(|| format!("cannot export from {}", data_dir.display()))?;
    let bytes = seed.encode().map_err(anyhow::Error::msg)?;
    std::fs::write(file, bytes).with_context(|| format!("cannot write {}", file.display()))?;
    println!(
        "exported configuration version {} (log index {}, last term {}) from {} to {}",
        seed.state.version(),
        seed.index,
        seed.last_term,
        data_dir.display(),
        file.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs a storage server until a signal, or until its master cannot go on (fenced, or
/// declared crashed by the coordinator: its lease renewal was refused).
pub fn run_server(args: ServerArgs) -> Result<ExitCode> {
    tune_malloc();
    crate::startup::init_logging("info");
    announce_failpoints()?;
    args.security.install()?;
    let config = server_config(&args)?;
    let data_dir = config.data_dir.clone();
    runtime(args.threads)?.block_on(async {
        let server =
            StorageServer::start(config, &args.listen)
                .await
                .map_err(|error| match error {
                    StartError::Config(error) => {
                        anyhow!("{}: {}", flags_of(error.field), error.reason)
                    }
                    StartError::DiskProbe { .. } => {
                        anyhow!("{:#} (give --disk-mbps to skip)", anyhow!(error))
                    }
                    error => anyhow!(error),
                })?;
        if let Some(addr) = &args.metrics_addr {
            let handler = rampart_common::metrics::handler(vec![server.metrics()]);
            let bound = rampart_common::http::spawn(addr, handler)
                .await
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            announce(&Announce::Urls(Pages {
                speaker: Speaker::Server(server.id().0),
                status: None,
                metrics: format!("http://{bound}/metrics"),
            }))?;
        }
        // For a supervisor that reports this process's exit (`rampart server-exited`).
        // Without the record, its report names an older incarnation and the coordinators
        // wait out this one's lease: worth a warning, not a server.
        if let Err(error) = crate::supervisor::record_incarnation(&data_dir, server.id().0) {
            tracing::warn!(error = %format!("{error:#}"), "a supervisor cannot report this server's exit");
        }
        announce(&Announce::Listening {
            speaker: Speaker::Server(server.id().0),
            addr: server.advertised().to_string(),
        })?;
        let id = server.id();
        match server.run(shutdown_signal()).await {
            Stopped::Shutdown => Ok(ExitCode::SUCCESS),
            Stopped::Drained(reason) => {
                eprintln!("server {id} stopped: {reason}");
                Ok(ExitCode::SUCCESS)
            }
            Stopped::MasterFailed(reason) => {
                eprintln!("server {id} stopped: {reason}");
                Ok(ExitCode::FAILURE)
            }
        }
    })
}

/// Allocations up to this size come from glibc's heaps, not from `mmap` of their own.
pub const MALLOC_MMAP_THRESHOLD_BYTES: i32 = 64 << 20;

/// Free memory at the top of glibc's main heap kept for reuse rather than given back.
pub const MALLOC_TRIM_THRESHOLD_BYTES: i32 = 256 << 20;

/// Tunes glibc's allocator for a storage server's transient buffers, set before any
/// thread starts. A recovery moves its data through buffers of megabytes (a backup's
/// pieces, the RPC buffers of their replies, a close's image); by default glibc gives
/// such a block back to the kernel when it is freed (its own `mmap` above the dynamic
/// threshold, or the trimmed top of a heap), so the next one is faulted in and zeroed
/// by the kernel again: 5 % of the CPU of a 256 MB recovery went to `clear_page`. With
/// blocks up to [`MALLOC_MMAP_THRESHOLD_BYTES`] from the heaps and up to
/// [`MALLOC_TRIM_THRESHOLD_BYTES`] of free top kept, freed buffers are reused. What
/// stays allocated is bounded by the peak of those buffers, which the servers' own
/// limits bound (pieces cached, fetches and RPCs in flight). Not glibc: nothing to do.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` changes allocator parameters only; it is called before any
    // thread of this process starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES);
    }
}

/// The server's configuration from its flags (validated when the server starts:
/// [`flags_of`] names the flags of a field it refuses).
fn server_config(args: &ServerArgs) -> Result<StorageServerConfig> {
    let master = MasterConfig {
        segment_bytes: u32::try_from(args.segment_bytes.0)
            .context("--segment-bytes must be below 4GiB")?,
        memory_bytes: args.memory.0,
        value_bytes_max: usize::try_from(args.value_bytes_max.0)
            .context("--value-bytes-max is too large")?,
        cleaner_threshold_pct: args.cleaner_threshold,
    };
    let config = StorageServerConfig {
        frame_file: args.frame_file.clone(),
        backup_frames: args.backup_frames,
        unflushed_bytes_max: args.unflushed_max.0,
        disk_mbps: args.disk_mbps,
        master,
        replicas: usize::try_from(args.replicas).context("--replicas is too large")?,
        replication: args.replication,
        failure_domain: args.failure_domain.clone(),
        advertise: args.advertise.clone(),
        nic_port: args.nic_port,
        partition_limits: rampart_master::profiler::PartitionLimits {
            bytes_max: args.partition_mb.saturating_mul(1024 * 1024),
            records_max: args.partition_records,
        },
        ping_interval: Duration::from_millis(args.ping_interval_ms),
        ping_timeout: Duration::from_millis(args.ping_timeout_ms),
        lease_renew_interval: Duration::from_millis(args.lease_renew_ms),
        ..StorageServerConfig::new(
            crate::startup::coordinator_list(&args.coordinator),
            args.data_dir.clone(),
        )
    };
    Ok(config)
}

/// The flags that set the configuration field `field` (`ConfigError::field`), for
/// errors that name what the user typed.
fn flags_of(field: &str) -> &str {
    match field {
        "master" => "--segment-bytes, --memory, --value-bytes-max or --cleaner-threshold",
        "coordinators" => "--coordinator",
        "backup_frames" => "--backup-frames",
        "unflushed_bytes_max" => "--unflushed-max",
        "disk_mbps" => "--disk-mbps",
        "partition_limits" => "--partition-mb or --partition-records",
        "ping_interval" => "--ping-interval-ms",
        "ping_timeout" => "--ping-timeout-ms",
        "lease_renew_interval" => "--lease-renew-ms",
        "replication" => "--replication rdma",
        "advertise" => "--advertise",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_learned_on_stdin_must_name_the_address_this_member_holds() {
        let bound: std::net::SocketAddr = "127.0.0.1:40001".parse().expect("an address");
        let peers = learned_peers(2, bound, "1=127.0.0.1:40000,2=127.0.0.1:40001\n")
            .expect("the list names the bound address");
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[&2], "127.0.0.1:40001");
        let other = learned_peers(2, bound, "1=127.0.0.1:40000,2=127.0.0.1:40002")
            .expect_err("another port for this member");
        assert!(
            other.to_string().contains("bound to 127.0.0.1:40001"),
            "{other}"
        );
        let absent = learned_peers(3, bound, "1=127.0.0.1:40000,2=127.0.0.1:40001")
            .expect_err("this member is not in the list");
        assert!(absent.to_string().contains("not in the list"), "{absent}");
        let closed = learned_peers(2, bound, "").expect_err("stdin closed");
        assert!(closed.to_string().contains("stdin closed"), "{closed}");
        let unpicked = learned_peers(2, bound, "1=127.0.0.1:0,2=127.0.0.1:40001")
            .expect_err("a peer without a port");
        assert!(
            unpicked.to_string().contains("fixed HOST:PORT"),
            "{unpicked}"
        );
    }
}
