//! `rampart bench coordinator`: how fast the Raft-replicated coordinator takes
//! configuration changes, and how long it is unavailable after losing its leader.
//!
//! It starts a local cluster (a group of `--coordinators` and one storage server, which
//! takes the created tables' tablets), then:
//!
//! * **Throughput**, `--rounds` rounds of `--seconds`: `--clients` concurrent callers, each
//!   alternating `CreateTable` (a new one-tablet table, pushed to the server) and `Enlist`
//!   (a backup-only server at a fixed fake address per caller, so each enlistment also
//!   retires the caller's previous id, as a restarted server does). Every call is a
//!   committed Raft entry on a majority's disks. The figure is the median over rounds.
//! * **Failover**, `--failovers` times: find the leader, SIGKILL it, and time from the kill
//!   until a `CreateTable` sent afterwards commits. The caller retries every coordinator
//!   every 2 ms and follows `NotLeader` hints at once, so the figure is the group's
//!   failover (detection, election, first commit), not a client's back-off. The killed
//!   coordinator is then restarted and the next run waits until it has caught up.
//!
//! Calls go straight over RPC (no client library): the figures are the coordinator's.

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_common::protocol::coordinator::{
    CreateTable, CreateTableRequest, Enlist, EnlistRequest, NotLeaderHint, RaftStatus,
    RaftStatusRequest,
};
use rampart_common::rpc::{Rpc, RpcError, RpcPool};
use rampart_common::status::Status;
use rampart_common::tablet::Services;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::ycsb::RemoveOnDrop;
use crate::cluster::{self, UpArgs};
use crate::stats::median;

/// `rampart bench coordinator`
#[derive(Args, Debug, Clone)]
pub struct CoordinatorBenchArgs {
    /// Coordinators in the Raft group.
    #[arg(long, default_value_t = 3)]
    pub coordinators: u32,
    /// Concurrent callers in the throughput rounds.
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    /// Length of one throughput round, in seconds.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Throughput rounds (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Leader kills to time (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub failovers: u32,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Deadline of one attempt while the group fails over: short, so a call to a dead or
/// deposed coordinator does not hide the moment the new leader answers.
const FAILOVER_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(200);

/// Pause between rounds over every coordinator while no leader answers.
const FAILOVER_POLL: Duration = Duration::from_millis(2);

/// Longest a failover may take before the run is called failed.
const FAILOVER_GIVE_UP: Duration = Duration::from_secs(20);

/// Deadline of one throughput call (retried through leader changes until the round ends).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the benchmark.
pub fn run(args: CoordinatorBenchArgs) -> Result<ExitCode> {
    crate::startup::init_logging("warn");
    if args.coordinators < 3 && args.failovers > 0 {
        bail!("failover needs at least 3 coordinators (or --failovers 0)");
    }
    if args.clients == 0 || args.rounds == 0 || args.seconds <= 0.0 {
        bail!("--clients, --rounds and --seconds must be positive");
    }
    let data_dir =
        std::env::temp_dir().join(format!("rampart-bench-coordinator-{}", std::process::id()));
    // Dropped after the cluster (locals drop in reverse), so processes stop first.
    let _data = RemoveOnDrop(data_dir.clone());
    let up = UpArgs {
        coordinators: args.coordinators,
        replicas: Some(0),
        memory: "256MiB".into(),
        ..UpArgs::private(data_dir, 1)
    };
    let mut local = cluster::start(&up, false)?;
    let addrs: Vec<String> = local.coordinators.iter().map(|(_, a)| a.clone()).collect();
    println!(
        "{} coordinators, 1 server; {} callers, {} rounds × {} s; {} failovers",
        args.coordinators, args.clients, args.rounds, args.seconds, args.failovers
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let pool = Arc::new(RpcPool::new());
    let names = Arc::new(AtomicU64::new(0));

    let term_before = runtime.block_on(max_term(&pool, &local.coordinators));
    let mut rates = Vec::new();
    for round in 1..=args.rounds {
        let rate = runtime.block_on(throughput_round(&args, &addrs, &pool, &names))?;
        println!("round {round}: {rate:.0} changes/s");
        rates.push(rate);
    }
    let changes_per_s = median(rates.clone()).unwrap_or(0.0);
    // Each election bumps the term: a stable group keeps its leader under full load.
    let elections_under_load = runtime
        .block_on(max_term(&pool, &local.coordinators))
        .saturating_sub(term_before);
    println!("elections during the throughput rounds: {elections_under_load}");

    let mut failovers = Vec::new();
    for run in 1..=args.failovers {
        let leader = runtime.block_on(wait_for_leader(&pool, &local.coordinators))?;
        local.kill_coordinator(leader)?;
        let killed_at = Instant::now();
        let survivors: Vec<String> = local
            .coordinators
            .iter()
            .filter(|(id, _)| *id != leader)
            .map(|(_, a)| a.clone())
            .collect();
        let committed_at = runtime.block_on(first_commit(&pool, &survivors, &names))?;
        let ms = committed_at.duration_since(killed_at).as_secs_f64() * 1e3;
        println!("failover {run}: leader {leader} killed, next change committed after {ms:.0} ms");
        failovers.push(ms);
        local.restart_coordinator(leader)?;
        runtime.block_on(wait_caught_up(&pool, &local.coordinators))?;
    }
    let failover_median = median(failovers.clone());

    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| changes/s (median of {} rounds) | {changes_per_s:.0} |",
        args.rounds
    );
    println!("| elections under load | {elections_under_load} |");
    if let Some(m) = failover_median {
        println!("| failover ms (median of {}) | {m:.0} |", failovers.len());
        let all: Vec<String> = failovers.iter().map(|f| format!("{f:.0}")).collect();
        println!("| failover ms, every run | {} |", all.join(", "));
    }
    if let Some(path) = &args.json {
        let figures = CoordinatorFigures {
            coordinators: args.coordinators,
            clients: args.clients,
            seconds_per_round: args.seconds,
            changes_per_s_rounds: rates,
            changes_per_s,
            elections_under_load,
            failover_ms: failovers,
            failover_ms_median: failover_median,
        };
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    local.children.stop_all();
    Ok(ExitCode::SUCCESS)
}

/// What `--json FILE` holds.
#[derive(Debug, Serialize, Deserialize)]
struct CoordinatorFigures {
    coordinators: u32,
    clients: u32,
    seconds_per_round: f64,
    /// Committed changes per second, each throughput round.
    changes_per_s_rounds: Vec<f64>,
    /// Their median.
    changes_per_s: f64,
    /// Raft terms begun during the throughput rounds.
    elections_under_load: u64,
    /// Kill of the leader → next change committed, each failover.
    failover_ms: Vec<f64>,
    /// Their median; none (null) without failovers.
    failover_ms_median: Option<f64>,
}

/// One round: every caller alternates create-table and enlist until the round ends;
/// returns committed changes per second.
async fn throughput_round(
    args: &CoordinatorBenchArgs,
    addrs: &[String],
    pool: &Arc<RpcPool>,
    names: &Arc<AtomicU64>,
) -> Result<f64> {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.seconds);
    let mut callers = Vec::new();
    for caller in 0..args.clients {
        let addrs = addrs.to_vec();
        let pool = Arc::clone(pool);
        let names = Arc::clone(names);
        callers.push(tokio::spawn(async move {
            let mut done = 0u64;
            let mut leader = 0usize;
            // A fixed fake address per caller: each enlistment retires the previous id.
            let enlist = EnlistRequest {
                addr: format!("127.0.0.1:{}", 1 + caller),
                services: Services {
                    master: false,
                    backup: true,
                },
                failure_domain: String::new(),
                disk_read_mbps: 100,
            };
            for i in 0u64.. {
                if Instant::now() >= end {
                    break;
                }
                let deadline = Instant::now() + CALL_TIMEOUT;
                let result = if i % 2 == 0 {
                    let name = format!("bench-{}", names.fetch_add(1, Ordering::Relaxed));
                    let request = CreateTableRequest { name, span: 1 };
                    call_leader::<CreateTable>(&pool, &addrs, &mut leader, &request, deadline)
                        .await
                        .map(drop)
                } else {
                    call_leader::<Enlist>(&pool, &addrs, &mut leader, &enlist, deadline)
                        .await
                        .map(drop)
                };
                result?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut total = 0;
    for caller in callers {
        total += caller.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Calls `R` on the leader, following `NotLeader` hints and trying each coordinator in
/// turn, until `deadline`. `leader` is the index into `addrs` to try first.
async fn call_leader<R: Rpc>(
    pool: &RpcPool,
    addrs: &[String],
    leader: &mut usize,
    request: &R::Request,
    deadline: Instant,
) -> Result<R::Reply> {
    let mut last = String::new();
    while Instant::now() < deadline {
        let addr = &addrs[*leader % addrs.len()];
        let attempt = deadline.min(Instant::now() + FAILOVER_ATTEMPT_TIMEOUT);
        match pool.call::<R>(addr, request, attempt).await {
            Ok(reply) => return Ok(reply),
            Err(e) => {
                last = e.to_string();
                *leader = next_address(&e, addrs, *leader);
                if retriable(&e) {
                    tokio::time::sleep(FAILOVER_POLL).await;
                } else {
                    bail!("{addr}: {e}");
                }
            }
        }
    }
    bail!("no coordinator committed the change in time: {last}")
}

/// Which coordinator to try after error `e` from `addrs[current]`.
fn next_address(e: &RpcError, addrs: &[String], current: usize) -> usize {
    if let RpcError::Status {
        status: Status::NotLeader,
        detail,
        ..
    } = e
    {
        if let Some(addr) = NotLeaderHint::parse(detail).leader_addr() {
            if let Some(i) = addrs.iter().position(|a| a == addr) {
                if i != current {
                    return i;
                }
            }
        }
    }
    current + 1
}

fn retriable(e: &RpcError) -> bool {
    e.is_transport() || matches!(e.status(), Some(Status::NotLeader | Status::Retry))
}

/// Sends create-tables to the survivors until one commits; returns when it did.
async fn first_commit(pool: &RpcPool, addrs: &[String], names: &AtomicU64) -> Result<Instant> {
    let deadline = Instant::now() + FAILOVER_GIVE_UP;
    let mut leader = 0;
    let name = format!("failover-{}", names.fetch_add(1, Ordering::Relaxed));
    let request = CreateTableRequest { name, span: 1 };
    call_leader::<CreateTable>(pool, addrs, &mut leader, &request, deadline).await?;
    Ok(Instant::now())
}

/// The leader every coordinator agrees on.
async fn wait_for_leader(pool: &RpcPool, coordinators: &[(u64, String)]) -> Result<u64> {
    let deadline = Instant::now() + FAILOVER_GIVE_UP;
    while Instant::now() < deadline {
        let statuses = statuses(pool, coordinators).await;
        if let Some(first) = statuses.first() {
            let leader = first.leader_id;
            let agreed = statuses.len() == coordinators.len()
                && leader != 0
                && statuses.iter().all(|s| s.leader_id == leader);
            if agreed {
                return Ok(leader);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the coordinators did not agree on a leader within {FAILOVER_GIVE_UP:?}")
}

/// Waits until every coordinator answers and has applied the leader's commit index.
async fn wait_caught_up(pool: &RpcPool, coordinators: &[(u64, String)]) -> Result<()> {
    let deadline = Instant::now() + FAILOVER_GIVE_UP;
    while Instant::now() < deadline {
        let statuses = statuses(pool, coordinators).await;
        let leader = statuses.iter().find(|s| s.role == "leader");
        if let (Some(leader), true) = (leader, statuses.len() == coordinators.len()) {
            if statuses.iter().all(|s| s.applied >= leader.commit) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the restarted coordinator did not catch up within {FAILOVER_GIVE_UP:?}")
}

/// The highest term any coordinator reports.
async fn max_term(pool: &RpcPool, coordinators: &[(u64, String)]) -> u64 {
    statuses(pool, coordinators)
        .await
        .iter()
        .map(|s| s.term)
        .max()
        .unwrap_or(0)
}

async fn statuses(
    pool: &RpcPool,
    coordinators: &[(u64, String)],
) -> Vec<rampart_common::protocol::coordinator::RaftStatusReply> {
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut out = Vec::new();
    for (_, addr) in coordinators {
        if let Ok(status) = pool
            .call::<RaftStatus>(addr, &RaftStatusRequest {}, deadline)
            .await
        {
            out.push(status);
        }
    }
    out
}
