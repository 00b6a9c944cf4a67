//! `rampart status`: how a cluster stands, from its coordinators.
//!
//! Asks every coordinator given for its Raft status (role, term, leader, commit and
//! applied indexes, snapshot, configuration version) — each answers for itself, so this
//! works without a leader too, and shows which members are unreachable — then, through
//! the leader, the server list and the number of tables; then asks each master that is
//! up how its memory stands (`Ping`: objects, log memory held and live, segments the
//! cleaner freed, segments short of replicas). Exits 0 when a leader serves the
//! configuration, 1 when none does (the coordinators' answers say why).

use anyhow::Result;
use clap::Args;
use rampart_common::config::ByteSize;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::protocol::coordinator::{
    GetTabletMap, RaftStatus, RaftStatusRequest, TabletMapRequest,
};
use rampart_common::protocol::master::{Ping, PingRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::ServerStatus;
use std::process::ExitCode;
use std::time::Duration;
use tokio::time::Instant;

/// How long one coordinator may take to describe itself.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// `rampart status`
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Coordinator address(es), comma-separated.
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// Seconds to wait for the leader's configuration.
    #[arg(long, default_value_t = 3.0)]
    pub timeout: f64,
}

/// Runs `rampart status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    crate::run_client(status(args))?
}

async fn status(args: StatusArgs) -> Result<ExitCode> {
    let pool = RpcPool::new();
    let addrs = crate::coordinator_list(&args.coordinator);
    println!("coordinators:");
    println!(
        "  {:<22} {:>3} {:<13} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8}",
        "address", "id", "role", "term", "leader", "commit", "applied", "snapshot", "version"
    );
    for addr in &addrs {
        let deadline = Instant::now() + STATUS_TIMEOUT;
        match pool
            .call::<RaftStatus>(addr, &RaftStatusRequest {}, deadline)
            .await
        {
            Ok(s) => println!(
                "  {addr:<22} {:>3} {:<13} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8}",
                s.id,
                s.role,
                s.term,
                s.leader_id,
                s.commit,
                s.applied,
                s.snapshot_index,
                s.config_version
            ),
            Err(e) => println!("  {addr:<22} unreachable: {e}"),
        }
    }
    let set = CoordinatorSet::new(&addrs);
    let deadline = Instant::now() + Duration::from_secs_f64(args.timeout.max(0.001));
    let map = match set
        .call::<GetTabletMap>(&pool, &TabletMapRequest {}, deadline)
        .await
    {
        Ok(map) => map,
        Err(e) => {
            println!("configuration: unavailable: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    println!(
        "configuration version {} from the leader at {}: {} table(s)",
        map.version,
        set.leader().unwrap_or_default(),
        map.tables.len()
    );
    println!("servers:");
    println!(
        "  {:>5} {:<22} {:<8} {:<14} {:<22} {:>9}",
        "id", "address", "status", "services", "domain", "disk MB/s"
    );
    for server in &map.servers {
        let services = match (server.services.master, server.services.backup) {
            (true, true) => "master+backup",
            (true, false) => "master",
            (false, true) => "backup",
            (false, false) => "-",
        };
        println!(
            "  {:>5} {:<22} {:<8} {:<14} {:<22} {:>9}",
            server.id.0,
            server.addr,
            format!("{:?}", server.status),
            services,
            server.failure_domain,
            server.disk_read_mbps
        );
    }
    let masters: Vec<_> = map
        .servers
        .iter()
        .filter(|s| s.services.master && s.status == ServerStatus::Up)
        .collect();
    if !masters.is_empty() {
        println!("masters:");
        println!(
            "  {:>5} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8}",
            "id", "objects", "log held", "log live", "memory", "cleaned", "short"
        );
    }
    for server in masters {
        let deadline = Instant::now() + STATUS_TIMEOUT;
        match pool
            .call::<Ping>(&server.addr, &PingRequest {}, deadline)
            .await
        {
            Ok(ping) => println!(
                "  {:>5} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8}",
                server.id.0,
                ping.objects,
                ByteSize(ping.log_bytes_used).readable(),
                ByteSize(ping.log_bytes_live).readable(),
                ByteSize(ping.log_bytes_max).readable(),
                ping.segments_cleaned,
                ping.segments_under_replicated
            ),
            Err(e) => println!("  {:>5} unreachable: {e}", server.id.0),
        }
    }
    Ok(ExitCode::SUCCESS)
}
