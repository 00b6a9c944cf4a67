//! `rampart cluster up`: a whole local cluster as child processes on loopback.
//!
//! Starts a Raft group of coordinators (3 by default) and N storage servers, prints one
//! line per process (`coordinator ID at ADDR (pid P)`, `server ID at ADDR (pid P)`), each
//! followed by its URLs (`coordinator ID status page URL metrics URL`, `server ID
//! metrics URL`; none with `--no-metrics`), a line for the Redis-protocol gateway
//! (`gateway at ADDR (pid P) speaks RESP ...`; none with `--no-resp`), and then a line
//! starting with `ready`. The gateway's connection limits are `rampart gateway`'s flags
//! under the same names (`--idle-timeout-ms` and the rest of
//! [`ConnectionLimitArgs`](crate::gateway::ConnectionLimitArgs)), passed on to it.
//! Scripts and tests rely on these lines. While the servers start, their progress goes
//! to stderr (`progress`: a bar on a terminal, plain lines otherwise), never between
//! these lines on stdout. It then waits; Ctrl-C or SIGTERM stops every child, and
//! children die with it even if it is killed (see `child_processes`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::child_processes::{Children, Running};
use crate::process::PEERS_ON_STDIN;
use crate::progress::Progress;
use crate::supervisor::ExitReporter;
use rampart_common::announce::{ClusterLine, Pages, Speaker};
use rampart_coordinator::proof_of_death::ProofOfDeath;
use rampart_ops::launch;
use rampart_ops::netns::Network;

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
    /// Storage servers to start (each runs a master and a backup). The default, 5, is
    /// R + 2 for the default R = 3: with one server dead every master still finds R
    /// backups on the others, so writes and the dead server's recovery go on.
    #[arg(long, default_value_t = 5)]
    pub servers: u32,
    /// Backup replicas of every segment (R). Default: 3, or fewer when the cluster is
    /// too small (a master never replicates to its own server, so R ≤ servers − 1).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Replication transport of every server: shm, tcp, rpc or rdma. Default: shm
    /// between servers on one host (all of them, here), else tcp.
    #[arg(long)]
    pub replication: Option<String>,
    /// Coordinators in the Raft group: 3 survives the loss of one, 5 of two; 1 runs a
    /// single coordinator (no fault tolerance).
    #[arg(long, default_value_t = 3)]
    pub coordinators: u32,
    /// Address of the first coordinator; the others listen on the next ports (port 0:
    /// each binds a free port of its own, and learns the others' once all are bound).
    #[arg(long, default_value = "127.0.0.1:7000")]
    pub coordinator_addr: String,
    /// DRAM per server for its log.
    #[arg(long, default_value = "1GiB")]
    pub memory: String,
    /// Server 1's log memory, where it differs from the others' (`memory`): a
    /// benchmark's cluster whose one loaded master holds far more than the rest. Not a
    /// flag of `cluster up`.
    #[arg(skip)]
    pub first_server_memory: Option<String>,
    /// Bytes per log segment.
    #[arg(long, default_value = "8MiB")]
    pub segment_bytes: String,
    /// Directory for the servers' data (server N uses DIR/server-N).
    #[arg(long, default_value = "rampart-data")]
    pub data_dir: std::path::PathBuf,
    /// Largest value a server accepts.
    #[arg(long, default_value = "1MiB")]
    pub value_bytes_max: String,
    /// Percent of each server's log memory in use from which an idle master runs its
    /// cleaner (`rampart server --cleaner-threshold`).
    #[arg(long, default_value_t = rampart_common::config::CLEANER_THRESHOLD_PCT_DEFAULT)]
    pub cleaner_threshold: u8,
    /// Segment replicas each server's backup buffers in memory at once (its frames,
    /// allocated at start-up: 8 MiB each with the default segment size).
    #[arg(long, default_value_t = rampart_server::config::BACKUP_FRAMES_DEFAULT)]
    pub backup_frames: usize,
    /// Replicated data each backup may hold only in memory, not yet on its disk
    /// (`rampart server --unflushed-max`): what a power loss of every server at once
    /// could take, and how far writes and re-replication may run ahead of the disks.
    #[arg(long, default_value = "256MiB")]
    pub unflushed_max: String,
    /// Log level of the children (`RAMPART_LOG` overrides).
    #[arg(long, default_value = "warn")]
    pub log_level: String,
    /// Recovery masters one recovery uses at most (`rampart coordinator
    /// --recovery-masters-max`); 0: all.
    #[arg(long, default_value_t = 0)]
    pub recovery_masters_max: usize,
    /// What proves a crashed server dead, so that its tablets go live without waiting
    /// out its lease (`rampart coordinator --proof-of-death`). Default `direct`: every
    /// process runs on this host's loopback, with nothing between them that could
    /// refuse a connection for a live server; this process, their supervisor, also
    /// reports each server's exit.
    #[arg(long, default_value_t = ProofOfDeath::Direct)]
    pub proof_of_death: ProofOfDeath,
    /// HTTP address of the first coordinator's status page and metrics; the others take
    /// the next ports. Default: the coordinator's host, its port + 100 (7100 for 7000;
    /// free ports when `--coordinator-addr` asks for free ports, port 0). Servers serve their metrics on a
    /// free port of their host. Every URL is printed at start.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Serve no status page and no metrics.
    #[arg(long, conflicts_with = "metrics_addr")]
    pub no_metrics: bool,
    /// Address of the Redis-protocol gateway `cluster up` starts (`rampart gateway`).
    /// Default: 127.0.0.1:6379, or a free port when the coordinators' port is 0.
    #[arg(long)]
    pub resp_addr: Option<String>,
    /// Start no Redis-protocol gateway.
    #[arg(long, conflicts_with = "resp_addr")]
    pub no_resp: bool,
    /// The cluster token and TLS certificate of every process: `--auth-token-file` is
    /// given to every coordinator, server and the gateway (whose RESP clients then
    /// `AUTH` with the token); `--tls-cert`/`--tls-key` let clients of the coordinators,
    /// the servers and the gateway connect over TLS.
    #[command(flatten)]
    pub security: crate::security::ServerSecurityArgs,
    /// The gateway's connection limits: `rampart gateway`'s flags, defaults and checks,
    /// passed on to it.
    #[command(flatten)]
    pub gateway_limits: crate::gateway::ConnectionLimitArgs,
    /// Whether the coordinators move and split tablets by load (`rampart coordinator
    /// --rebalance`): `on` or `off`.
    #[arg(long, default_value = "on", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub rebalance: bool,
    /// The coordinators' `--rebalance-after-ms`, where it differs from their default (a
    /// benchmark's). Not a flag of `cluster up`.
    #[arg(skip)]
    pub rebalance_after_ms: Option<u64>,
    /// Worker threads of each server's runtime (`rampart server --threads`), where a
    /// benchmark bounds them. Not a flag of `cluster up`.
    #[arg(skip)]
    pub server_threads: Option<usize>,
}

impl UpArgs {
    /// A program's private cluster (a benchmark's, a drill's): `servers` servers keeping
    /// their data under `data_dir`, one coordinator, free loopback ports, no status page,
    /// metrics or gateway, no token, no rebalancing (what they measure stays put),
    /// warnings only; the rest as `cluster up`'s defaults.
    /// Callers change what they measure with struct-update syntax.
    pub fn private(data_dir: std::path::PathBuf, servers: u32) -> UpArgs {
        UpArgs {
            servers,
            replicas: None,
            replication: None,
            coordinators: 1,
            coordinator_addr: "127.0.0.1:0".into(),
            memory: "1GiB".into(),
            first_server_memory: None,
            segment_bytes: "8MiB".into(),
            data_dir,
            value_bytes_max: "1MiB".into(),
            cleaner_threshold: rampart_common::config::CLEANER_THRESHOLD_PCT_DEFAULT,
            backup_frames: rampart_server::config::BACKUP_FRAMES_DEFAULT,
            unflushed_max: "256MiB".into(),
            log_level: "warn".into(),
            recovery_masters_max: 0,
            proof_of_death: ProofOfDeath::Direct,
            metrics_addr: None,
            no_metrics: true,
            resp_addr: None,
            no_resp: true,
            security: Default::default(),
            gateway_limits: Default::default(),
            rebalance: false,
            rebalance_after_ms: None,
            server_threads: None,
        }
    }
}

/// How far above a coordinator's port its status page and metrics are by default.
pub const HTTP_PORT_OFFSET: u16 = 100;

/// The HTTP address of coordinator `index` (0-based) listening at `addr`, under `args`.
/// `free_ports`: the coordinators' ports were picked free (`--coordinator-addr
/// HOST:0`); the port 100 above one of those may well be taken, so a free one is picked
/// for the HTTP server too.
fn coordinator_http_addr(
    args: &UpArgs,
    index: usize,
    addr: &str,
    free_ports: bool,
) -> Result<Option<String>> {
    if args.no_metrics {
        return Ok(None);
    }
    let (base, offset) = match &args.metrics_addr {
        Some(first) => (first.as_str(), index),
        None if free_ports => {
            let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
            return Ok(Some(format!("{host}:0")));
        }
        None => (addr, 0),
    };
    let mut parsed: std::net::SocketAddr = base
        .parse()
        .with_context(|| format!("--metrics-addr: `{base}` is not IP:PORT"))?;
    if parsed.port() != 0 {
        let step = if args.metrics_addr.is_some() {
            0
        } else {
            HTTP_PORT_OFFSET
        };
        let port = u16::try_from(usize::from(parsed.port()) + usize::from(step) + offset)
            .map_err(|_| anyhow::anyhow!("no HTTP port above {base}"))?;
        parsed.set_port(port);
    }
    Ok(Some(parsed.to_string()))
}

/// A started local cluster.
#[derive(Debug)]
pub struct LocalCluster {
    /// The coordinators' addresses, comma-separated (what `RAMPART_COORDINATOR` takes).
    pub coordinator: String,
    /// (Raft id, address) of each coordinator.
    pub coordinators: Vec<(u64, String)>,
    /// (server id, address) of each server.
    pub servers: Vec<(u64, String)>,
    /// The processes; dropping this stops them.
    pub children: Children,
    /// The hosts the processes run in, when the cluster has a network of its own
    /// ([`start_in`]); dropped after the processes.
    pub network: Option<Network>,
    /// Each coordinator's command line, to restart it.
    coordinator_args: Vec<(u64, Vec<String>)>,
    /// Each server's command line by slot (`server_args[i]` is `server #i+1`'s), to
    /// restart it on its data directory.
    server_args: Vec<Vec<String>>,
    /// The children's environment.
    env: [(&'static str, String); 1],
    /// Tells the coordinators of each server exit this process sees, once it
    /// [supervises](Self::supervise) its servers.
    reporter: Option<ExitReporter>,
}

impl LocalCluster {
    /// Kills coordinator `id` with SIGKILL, as a crash would.
    pub fn kill_coordinator(&mut self, id: u64) -> Result<()> {
        self.children.kill(&coordinator_name(id))
    }

    /// Starts coordinator `id` again, on its data directory; returns its pid.
    pub fn restart_coordinator(&mut self, id: u64) -> Result<u32> {
        let (_, command) = self
            .coordinator_args
            .iter()
            .find(|(i, _)| *i == id)
            .ok_or_else(|| anyhow::anyhow!("no coordinator {id}"))?;
        let command = command.clone();
        let netns = self.netns_of(&coordinator_host(id))?;
        Ok(self
            .children
            .spawn(&coordinator_name(id), &command, &self.env, netns.as_deref())?
            .pid())
    }

    /// From now on, tells the coordinators of the server exits this process sees (its
    /// word as their supervisor: `crate::supervisor`): those of [`kill_server`] and
    /// those [`report_exits`] reaps (not those [`server_exited`] reaps: servers the
    /// coordinators declared crashed already). Each report blocks for at most
    /// `EXIT_REPORT_TIMEOUT`. Call it from a thread outside any async runtime.
    ///
    /// [`server_exited`]: Self::server_exited
    ///
    /// [`kill_server`]: Self::kill_server
    /// [`report_exits`]: Self::report_exits
    pub fn supervise(&mut self) -> Result<()> {
        self.reporter = Some(ExitReporter::new(&self.coordinator)?);
        Ok(())
    }

    /// Kills the server in `slot` (1-based) with SIGKILL, as a crash would (and tells
    /// the coordinators, when [supervising](Self::supervise)).
    pub fn kill_server(&mut self, slot: usize) -> Result<()> {
        self.children.kill(&server_name(slot))?;
        let id = self.servers.get(slot.wrapping_sub(1)).map(|(id, _)| *id);
        if let Some(id) = id {
            self.report_exit(id);
        }
        Ok(())
    }

    /// Reaps the children that exited; returns a line for each, and tells the
    /// coordinators of the servers among them, when [supervising](Self::supervise).
    pub fn report_exits(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, speaker, status) in self.children.reap() {
            lines.push(format!("{name} exited ({status})"));
            if let Some(server) = speaker.and_then(|s| s.server_id()) {
                self.report_exit(server);
            }
        }
        lines
    }

    /// Tells the coordinators that server `id` exited, when supervising; a failure is
    /// printed (the coordinators still find the server silent).
    fn report_exit(&self, id: u64) {
        if let Some(reporter) = &self.reporter {
            if let Err(error) = reporter.exited(id) {
                eprintln!("{error:#}");
            }
        }
    }

    /// Whether the server in `slot` has exited (reaping it if it just did).
    pub fn server_exited(&mut self, slot: usize) -> bool {
        self.children.has_exited(&server_name(slot))
    }

    /// The process id of the server in `slot`, while it runs.
    pub fn server_pid(&self, slot: usize) -> Option<u32> {
        self.children.pid_of(&server_name(slot))
    }

    /// Starts the server of `slot` again on its data directory (it enlists as a new
    /// server); returns its new id and address, also kept in `servers`.
    pub fn restart_server(&mut self, slot: usize) -> Result<(u64, String)> {
        let command = self
            .server_args
            .get(slot.wrapping_sub(1))
            .ok_or_else(|| anyhow::anyhow!("no server slot {slot}"))?
            .clone();
        let netns = self.netns_of(&server_host(slot))?;
        let running =
            self.children
                .spawn(&server_name(slot), &command, &self.env, netns.as_deref())?;
        let id = announced_id(running);
        let addr = running.addr.clone();
        self.servers[slot - 1] = (id, addr.clone());
        Ok((id, addr))
    }

    /// The namespace file of host `name`, when the cluster has a network.
    fn netns_of(&self, name: &str) -> Result<Option<std::path::PathBuf>> {
        netns_of(self.network.as_ref(), name)
    }
}

fn netns_of(network: Option<&Network>, name: &str) -> Result<Option<std::path::PathBuf>> {
    network.map(|n| Ok(n.host(name)?.netns_path())).transpose()
}

/// The host of coordinator `id` in a cluster's network.
pub fn coordinator_host(id: u64) -> String {
    format!("c{id}")
}

/// The host of the server in `slot` in a cluster's network.
pub fn server_host(slot: usize) -> String {
    format!("s{slot}")
}

/// The hosts [`start_in`] needs in its network for `args`.
pub fn hosts(args: &UpArgs) -> Vec<String> {
    (1..=u64::from(args.coordinators))
        .map(coordinator_host)
        .chain((1..=args.servers as usize).map(server_host))
        .collect()
}

/// The port of every coordinator in a cluster with a network (each has an address of
/// its own).
pub const COORDINATOR_PORT_IN_NETWORK: u16 = 7000;

fn coordinator_name(id: u64) -> String {
    format!("coordinator {id}")
}

fn server_name(slot: usize) -> String {
    format!("server #{slot}")
}

/// The report line of a process started (`coordinator N at ADDR (pid P)`, ...).
fn started_line(
    speaker: Speaker,
    running: &Running,
    data: Option<String>,
    hint: String,
) -> ClusterLine {
    ClusterLine::Started {
        speaker,
        addr: running.addr.clone(),
        pid: running.pid(),
        data,
        hint,
    }
}

/// The server id a server announced (`server ID listening on ADDR`); 0 if none.
fn announced_id(running: &Running) -> u64 {
    running.speaker.and_then(|s| s.server_id()).unwrap_or(0)
}

/// Starts a cluster as described by `args` on this host's addresses, printing a line per
/// process.
pub fn start(args: &UpArgs, print: bool) -> Result<LocalCluster> {
    start_in(args, print, None)
}

/// Starts a cluster as described by `args`, printing a line per process. With a
/// `network` (which must have the [`hosts`] of `args`), every process runs in its own
/// host: coordinator `id` in `cID` at its address and port
/// [`COORDINATOR_PORT_IN_NETWORK`] (`--coordinator-addr` is not used), the server of
/// slot N in `sN` at its address.
pub fn start_in(args: &UpArgs, print: bool, network: Option<Network>) -> Result<LocalCluster> {
    if args.servers == 0 {
        bail!("--servers must be at least 1");
    }
    if args.coordinators == 0 || args.coordinators > COORDINATORS_MAX {
        bail!("--coordinators must be 1 to {COORDINATORS_MAX} (3 or 5 for fault tolerance)");
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
    if !args.no_resp {
        // Checked before any process starts, not when the gateway, last, refuses them.
        args.gateway_limits.connection_limits()?;
    }
    let mut children = Children::new();
    let security_args = args.security.to_args()?;
    let log = std::env::var("RAMPART_LOG").unwrap_or_else(|_| args.log_level.clone());
    let env = [("RAMPART_LOG", log)];
    let free_ports = network.is_none() && args.coordinator_addr.ends_with(":0");
    let (addrs, learn_peers) = coordinator_listen_addrs(args, network.as_ref())?;
    let command_of = |i: usize, listen: &str, peers: &str| {
        coordinator_command(args, i, listen, peers, &security_args, free_ports)
    };
    // A member that has printed its address line: announced, and counted in.
    let mut coordinators = Vec::new();
    let mut take_in = |id: u64, running: &Running| {
        if print {
            let speaker = Speaker::Coordinator(id);
            println!("{}", started_line(speaker, running, None, String::new()));
            if let [page, metrics, ..] = running.urls.as_slice() {
                let pages = ClusterLine::Pages(Pages {
                    speaker,
                    status: Some(page.clone()),
                    metrics: metrics.clone(),
                });
                println!("{pages}");
            }
        }
        coordinators.push((id, running.addr.clone()));
    };
    let mut starting = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i as u64 + 1;
        let peers = if learn_peers {
            PEERS_ON_STDIN.to_string()
        } else {
            launch::peers_list(&addrs)
        };
        let command = command_of(i, addr, &peers)?;
        let netns = netns_of(network.as_ref(), &coordinator_host(id))?;
        let started = Children::start(&coordinator_name(id), &command, &env, netns.as_deref())?;
        if learn_peers {
            starting.push(started);
        } else {
            // One at a time: a fresh member's check of its peers (are they a group
            // already?) is answered at once by those up and refused by those not bound.
            take_in(id, children.wait_ready(started)?);
        }
    }
    if learn_peers {
        launch::start_group(&mut starting)?;
        for (id, started) in (1..).zip(starting) {
            take_in(id, children.wait_ready(started)?);
        }
    }
    // A member restarts on the address it holds now (its peers and servers know it).
    let bound: Vec<String> = coordinators.iter().map(|(_, addr)| addr.clone()).collect();
    let coordinator_args = bound
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            Ok((
                i as u64 + 1,
                command_of(i, addr, &launch::peers_list(&bound))?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let coordinator = coordinators
        .iter()
        .map(|(_, addr)| addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    if print {
        println!("data in {}", args.data_dir.display());
        println!("replicas {replicas}");
        if replicas > 0 && args.servers < replicas + 2 {
            eprintln!(
                "note: {} servers with {replicas} replicas: should one die, the others have \
                 fewer than {replicas} backups besides themselves, so writes and the dead \
                 server's recovery wait until it is back; start {} servers to ride out a crash",
                args.servers,
                replicas + 2
            );
        }
    }
    let mut servers = Vec::new();
    let servers_started = std::time::Instant::now();
    let mut starting = Vec::new();
    let mut server_args_all = Vec::new();
    for i in 1..=args.servers {
        let slot = i as usize;
        let listen = match &network {
            Some(network) => format!("{}:0", network.host(&server_host(slot))?.ip),
            None => "127.0.0.1:0".into(),
        };
        let metrics_addr = listen.clone();
        let server_args: Vec<String> = [
            "server".into(),
            "--coordinator".into(),
            coordinator.clone(),
            "--listen".into(),
            listen,
            "--memory".into(),
            match &args.first_server_memory {
                Some(memory) if i == 1 => memory.clone(),
                _ => args.memory.clone(),
            },
            "--segment-bytes".into(),
            args.segment_bytes.clone(),
            "--value-bytes-max".into(),
            args.value_bytes_max.clone(),
            "--cleaner-threshold".into(),
            args.cleaner_threshold.to_string(),
            "--data-dir".into(),
            args.data_dir
                .join(format!("server-{i}"))
                .display()
                .to_string(),
            "--replicas".into(),
            replicas.to_string(),
            "--backup-frames".into(),
            args.backup_frames.to_string(),
            "--unflushed-max".into(),
            args.unflushed_max.clone(),
        ]
        .into_iter()
        .chain(
            args.replication
                .iter()
                .flat_map(|t| ["--replication".to_string(), t.clone()]),
        )
        .chain(
            (!args.no_metrics)
                .then(|| ["--metrics-addr".to_string(), metrics_addr])
                .into_iter()
                .flatten(),
        )
        .chain(
            args.server_threads
                .iter()
                .flat_map(|n| ["--threads".to_string(), n.to_string()]),
        )
        .chain(security_args.iter().cloned())
        .collect();
        let netns = netns_of(network.as_ref(), &server_host(slot))?;
        starting.push(Children::start(
            &server_name(slot),
            &server_args,
            &env,
            netns.as_deref(),
        )?);
        server_args_all.push(server_args);
    }
    // Side by side: each server spends most of its start touching its memory.
    let progress = if print {
        Progress::new("servers ready", u64::from(args.servers), "servers")
    } else {
        Progress::hidden()
    };
    for (slot, started) in (1..).zip(starting) {
        let running = children.wait_ready(started)?;
        let id = announced_id(running);
        if print {
            // The directory too: ids follow enlistment, not slots, and a server killed by
            // hand is restarted on its directory.
            let data = args.data_dir.join(format!("server-{slot}"));
            progress.suspend(|| {
                let speaker = Speaker::Server(id);
                let data = Some(data.display().to_string());
                println!("{}", started_line(speaker, running, data, String::new()));
                if let Some(metrics) = running.urls.first() {
                    let pages = ClusterLine::Pages(Pages {
                        speaker,
                        status: None,
                        metrics: metrics.clone(),
                    });
                    println!("{pages}");
                }
            });
        }
        progress.inc(1);
        servers.push((id, running.addr.clone()));
    }
    progress.finish();
    if print {
        println!(
            "servers started in {:.1} s: each allocates and touches its {} log and its {} \
             backup frames of 8 MiB or more at start-up (resident from then on), so that \
             writes and recoveries never wait for fresh memory; each backup holds at most \
             {} of replicas only in memory, not yet on its disk (--unflushed-max)",
            servers_started.elapsed().as_secs_f64(),
            args.memory,
            args.backup_frames,
            args.unflushed_max
        );
    }
    if !args.no_resp {
        let command = gateway_command(args, &coordinator, network.is_some(), &security_args);
        let running = children.spawn("gateway", &command, &env, None)?;
        if print {
            let port = running.addr.rsplit(':').next().unwrap_or_default();
            let auth = match &args.security.auth_token_file {
                Some(file) => format!(
                    " --askpass (the password: `rampart token resp-password --auth-token-file {}`)",
                    file.display()
                ),
                None => String::new(),
            };
            let tls = if args.security.tls_cert.is_some() {
                " [--tls --cacert CA]"
            } else {
                ""
            };
            let hint = format!("speaks RESP (Redis): redis-cli -p {port}{auth}{tls}");
            println!("{}", started_line(Speaker::Gateway, running, None, hint));
        }
    }
    Ok(LocalCluster {
        coordinator,
        coordinators,
        servers,
        children,
        network,
        coordinator_args,
        server_args: server_args_all,
        env,
        reporter: None,
    })
}

/// Where each coordinator `args` asks for listens, and whether they learn their peers'
/// addresses once bound: on free ports (`--coordinator-addr HOST:0`), each member of a
/// group binds port 0 itself and is told its peers' addresses on stdin once all are bound
/// (`--peers -`), so nobody picks a port it does not hold and two clusters started at
/// once never share one.
fn coordinator_listen_addrs(
    args: &UpArgs,
    network: Option<&Network>,
) -> Result<(Vec<String>, bool)> {
    let count = args.coordinators;
    match network {
        Some(network) => {
            let addrs = (1..=u64::from(count))
                .map(|id| {
                    let ip = network.host(&coordinator_host(id))?.ip;
                    Ok(format!("{ip}:{COORDINATOR_PORT_IN_NETWORK}"))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((addrs, false))
        }
        None => {
            let addrs = coordinator_addrs(&args.coordinator_addr, count)?;
            let free_ports = args.coordinator_addr.ends_with(":0");
            Ok((addrs, free_ports && count > 1))
        }
    }
}

/// The command line of coordinator `i` (0-based) of `args`, listening on `listen`, with
/// `peers` (a list, or [`PEERS_ON_STDIN`]) when in a group; `free_ports` as for
/// [`coordinator_http_addr`].
fn coordinator_command(
    args: &UpArgs,
    i: usize,
    listen: &str,
    peers: &str,
    security_args: &[String],
    free_ports: bool,
) -> Result<Vec<String>> {
    let id = i as u64 + 1;
    let mut command: Vec<String> = vec![
        "coordinator".into(),
        "--id".into(),
        id.to_string(),
        "--data-dir".into(),
        args.data_dir
            .join(format!("coordinator-{id}"))
            .display()
            .to_string(),
    ];
    if args.coordinators == 1 || peers == PEERS_ON_STDIN {
        command.extend(["--listen".into(), listen.to_string()]);
    }
    if args.coordinators > 1 {
        command.extend(["--peers".into(), peers.to_string()]);
    }
    command.extend(security_args.iter().cloned());
    if args.recovery_masters_max > 0 {
        command.extend([
            "--recovery-masters-max".into(),
            args.recovery_masters_max.to_string(),
        ]);
    }
    command.extend(["--proof-of-death".into(), args.proof_of_death.to_string()]);
    let rebalance = if args.rebalance { "on" } else { "off" };
    command.extend(["--rebalance".into(), rebalance.into()]);
    if let Some(ms) = args.rebalance_after_ms {
        command.extend(["--rebalance-after-ms".into(), ms.to_string()]);
    }
    if let Some(http) = coordinator_http_addr(args, i, listen, free_ports)? {
        command.extend(["--metrics-addr".into(), http]);
    }
    Ok(command)
}

/// The command line of the gateway `args` asks for, reaching the cluster at
/// `coordinator`; `in_network`: the cluster has a network of its own.
fn gateway_command(
    args: &UpArgs,
    coordinator: &str,
    in_network: bool,
    security_args: &[String],
) -> Vec<String> {
    let listen = match &args.resp_addr {
        Some(addr) => addr.clone(),
        None if args.coordinator_addr.ends_with(":0") || in_network => "127.0.0.1:0".into(),
        None => "127.0.0.1:6379".into(),
    };
    let mut command: Vec<String> = vec![
        "gateway".into(),
        "--coordinator".into(),
        coordinator.to_string(),
        "--listen".into(),
        listen,
    ];
    command.extend(args.gateway_limits.to_args());
    // The gateway takes the token (its connections, and its clients' AUTH) and the
    // certificate (its RESP clients' TLS), as the servers do.
    command.extend(security_args.iter().cloned());
    command
}

/// Most coordinators `cluster up` starts.
pub const COORDINATORS_MAX: u32 = 7;

/// The coordinators' addresses: `first`, then the next ports. (With port 0 and more
/// than one coordinator, each binds a port of its own instead: see [`start_in`].)
fn coordinator_addrs(first: &str, count: u32) -> Result<Vec<String>> {
    let addr: std::net::SocketAddr = first
        .parse()
        .with_context(|| format!("--coordinator-addr `{first}` is not IP:PORT"))?;
    if addr.port() == 0 {
        return Ok(vec![first.to_string(); count as usize]);
    }
    (0..count)
        .map(|i| {
            let port = addr
                .port()
                .checked_add(i as u16)
                .context("--coordinator-addr: ports run past 65535")?;
            Ok(std::net::SocketAddr::new(addr.ip(), port).to_string())
        })
        .collect()
}

/// How often `cluster up` looks for children that exited: the delay it adds to the
/// detection of a server's death, which it reports (`crate::supervisor`).
pub const SUPERVISE_INTERVAL: Duration = Duration::from_millis(10);

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
    let token = match &args.security.auth_token_file {
        Some(file) => format!(
            "{}={} ",
            crate::security::TOKEN_FILE_ENV,
            std::path::absolute(file)?.display()
        ),
        None => String::new(),
    };
    let ready = ClusterLine::Ready {
        hint: format!(
            "{} server(s); try `{token}RAMPART_COORDINATOR={} rampart kv create-table demo`; \
             Ctrl-C stops the cluster",
            cluster.servers.len(),
            cluster.coordinator
        ),
    };
    println!("{ready}");
    // The supervisor's word: a server whose process exited is dead, and its recovery
    // need not wait out its lease (`crate::supervisor`).
    args.security.install()?;
    cluster.supervise()?;
    while !stop.load(Ordering::SeqCst) {
        for line in cluster.report_exits() {
            eprintln!("{line}");
        }
        if cluster.children.all_exited() {
            eprintln!("every process of the cluster has exited");
            return Ok(ExitCode::FAILURE);
        }
        // A server's exit is seen, and reported, within this.
        std::thread::sleep(SUPERVISE_INTERVAL);
    }
    println!("stopping the cluster");
    cluster.children.stop_all();
    Ok(ExitCode::SUCCESS)
}

/// Sets `flag` when `signal` arrives.
pub(crate) fn signal_flag(signal: libc::c_int, flag: &Arc<AtomicBool>) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_gateway::ConnectionLimits;

    /// `cluster up`'s flags, parsed as the command line's.
    fn parse(args: &[&str]) -> UpArgs {
        #[derive(clap::Parser)]
        struct Up {
            #[command(flatten)]
            up: UpArgs,
        }
        <Up as clap::Parser>::try_parse_from(std::iter::once("up").chain(args.iter().copied()))
            .expect("valid flags")
            .up
    }

    #[test]
    fn coordinator_http_ports_follow_fixed_ports_and_are_free_with_free_ports() {
        let http = |args: &UpArgs, index, addr, free| {
            coordinator_http_addr(args, index, addr, free).expect("an address")
        };
        let fixed = parse(&[]);
        assert_eq!(
            http(&fixed, 1, "127.0.0.1:7001", false).as_deref(),
            Some("127.0.0.1:7101")
        );
        let free = parse(&["--coordinator-addr", "127.0.0.1:0"]);
        assert_eq!(
            http(&free, 0, "127.0.0.1:40671", true).as_deref(),
            Some("127.0.0.1:0")
        );
        let given = parse(&["--metrics-addr", "127.0.0.1:9100"]);
        assert_eq!(
            http(&given, 2, "127.0.0.1:7002", false).as_deref(),
            Some("127.0.0.1:9102")
        );
        let none = parse(&["--no-metrics"]);
        assert_eq!(http(&none, 0, "127.0.0.1:7000", false), None);
    }

    #[test]
    fn coordinators_on_free_ports_bind_their_own_and_learn_their_peers_on_stdin() {
        let group = parse(&["--coordinator-addr", "127.0.0.1:0", "--coordinators", "3"]);
        let (addrs, learn) = coordinator_listen_addrs(&group, None).expect("addresses");
        assert!(learn, "a group on free ports learns its peers once bound");
        for (i, addr) in addrs.iter().enumerate() {
            let command =
                coordinator_command(&group, i, addr, PEERS_ON_STDIN, &[], true).expect("a command");
            let flag = |name: &str| {
                let at = command.iter().position(|word| word == name);
                at.map(|at| command[at + 1].as_str())
            };
            // No port chosen by cluster up: each member binds port 0 itself.
            assert_eq!(flag("--listen"), Some("127.0.0.1:0"), "{command:?}");
            assert_eq!(flag("--peers"), Some(PEERS_ON_STDIN), "{command:?}");
        }
        let bound = ["127.0.0.1:4001", "127.0.0.1:4002", "127.0.0.1:4003"].map(String::from);
        let restart =
            coordinator_command(&group, 1, &bound[1], &launch::peers_list(&bound), &[], true)
                .expect("a command");
        assert!(
            restart
                .windows(2)
                .any(|w| w[0] == "--peers" && w[1] == launch::peers_list(&bound)),
            "a restarted member is given the addresses its group holds: {restart:?}"
        );
        let alone = parse(&["--coordinator-addr", "127.0.0.1:0", "--coordinators", "1"]);
        let (addrs, learn) = coordinator_listen_addrs(&alone, None).expect("addresses");
        assert!(!learn, "one coordinator binds port 0 and has no peers");
        assert_eq!(addrs, ["127.0.0.1:0"]);
        let fixed = parse(&[]);
        let (addrs, learn) = coordinator_listen_addrs(&fixed, None).expect("addresses");
        assert!(!learn);
        assert_eq!(
            addrs,
            ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
        );
    }

    #[test]
    fn gateway_command_passes_on_the_connection_limits_given_to_cluster_up() {
        /// The gateway's command line, parsed as `rampart gateway` parses it.
        fn gateway(command: &[String]) -> crate::gateway::GatewayArgs {
            #[derive(clap::Parser)]
            struct Gateway {
                #[command(flatten)]
                gateway: crate::gateway::GatewayArgs,
            }
            assert_eq!(command[0], "gateway");
            <Gateway as clap::Parser>::try_parse_from(command)
                .expect("flags rampart gateway takes")
                .gateway
        }
        let up = parse(&[
            "--resp-addr",
            "127.0.0.1:6380",
            "--first-command-timeout-ms",
            "500",
            "--connections-per-peer-max",
            "20",
            "--idle-timeout-ms",
            "5000",
            "--reply-bytes-pending-max",
            "4KiB",
        ]);
        let command = gateway_command(&up, "127.0.0.1:7000", false, &[]);
        assert!(
            command
                .windows(2)
                .any(|w| w == ["--idle-timeout-ms", "5000"]),
            "{command:?}"
        );
        let started = gateway(&command);
        assert_eq!(started.listen, "127.0.0.1:6380");
        assert_eq!(
            started.limits.connection_limits().expect("valid limits"),
            ConnectionLimits {
                first_command_timeout: Duration::from_millis(500),
                connections_per_peer_max: 20,
                idle_timeout: Some(Duration::from_secs(5)),
                reply_bytes_pending_max: 4096,
            }
        );
        // None given: the gateway runs with its own defaults.
        let command = gateway_command(&parse(&[]), "127.0.0.1:7000", false, &[]);
        let started = gateway(&command);
        assert_eq!(started.listen, "127.0.0.1:6379");
        assert_eq!(
            started.limits.connection_limits().expect("valid limits"),
            ConnectionLimits::default()
        );
    }

    #[test]
    fn start_refuses_bad_gateway_limits_before_starting_anything() {
        // Were the limits not checked first, the bad address would be refused next,
        // still before any process.
        let up = parse(&[
            "--connections-per-peer-max",
            "0",
            "--coordinator-addr",
            "not an address",
        ]);
        let error = start(&up, false).expect_err("no connection allowed");
        assert!(
            error
                .to_string()
                .contains("--connections-per-peer-max must be at least 1"),
            "{error}"
        );
    }
}
