//! `rampart status`: how a cluster stands, from its coordinators — the terminal twin of
//! the coordinators' status page (both show a `rampart_coordinator::cluster_view`).
//!
//! Asks every coordinator given for its Raft status (role, term, leader, commit and
//! applied indexes — each answers for itself, so this works without a leader too, and
//! shows which members are unreachable), then through the leader the configuration and
//! its recent recoveries, then every server that is up for its figures (`ServerStats`).
//! Prints, in order: the problems an operator must fix, each with its fix (too few
//! backups for R, a recovery waiting for missing replicas, silent members); the
//! coordinators; the servers (state, objects, log memory, replicas held, open and
//! unflushed frames, under-replicated segments); replication health; the tables by name
//! with their tablets and owners; the recoveries still running. Exits 0 when a leader
//! serves the configuration and nothing needs fixing, 1 otherwise.

use anyhow::Result;
use clap::Args;
use rampart_common::config::ByteSize;
use rampart_common::rpc::RpcPool;
use rampart_coordinator::cluster_view::{ClusterView, ServerState};
use std::process::ExitCode;

/// `rampart status`
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Coordinator address(es), comma-separated.
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// Seconds to wait for the coordinators' leader.
    #[arg(long, default_value_t = 3.0)]
    pub timeout: f64,
    /// Print the status as JSON (the status page's `/api/status`) instead.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub security: crate::security::ClientSecurityArgs,
}

/// Runs `rampart status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    let security = args.security.clone();
    crate::startup::run_client(&security, status(args))?
}

async fn status(args: StatusArgs) -> Result<ExitCode> {
    let pool = RpcPool::new();
    let addrs = crate::startup::coordinator_list(&args.coordinator);
    let leader_timeout = std::time::Duration::from_secs_f64(args.timeout.max(0.001));
    let view = ClusterView::gather_within(&addrs, &pool, leader_timeout).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", render(&view));
    }
    Ok(if view.config_error.is_none() && view.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The text of `rampart status`.
pub fn render(view: &ClusterView) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut line = |text: String| {
        let _ = writeln!(out, "{text}");
    };
    if view.problems.is_empty() {
        line("problems: none".into());
    } else {
        line("PROBLEMS:".into());
        for problem in &view.problems {
            line(format!("  * {problem}"));
        }
    }
    line("coordinators:".into());
    line(format!(
        "  {:<22} {:>3} {:<13} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8}",
        "address", "id", "role", "term", "leader", "commit", "applied", "snapshot", "version"
    ));
    for c in &view.coordinators {
        match (&c.raft, &c.error) {
            (Some(s), _) => line(format!(
                "  {:<22} {:>3} {:<13} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8}",
                c.addr,
                s.id,
                s.role,
                s.term,
                s.leader_id,
                s.commit,
                s.applied,
                s.snapshot_index,
                s.config_version
            )),
            (None, error) => line(format!(
                "  {:<22} unreachable: {}",
                c.addr,
                error.as_deref().unwrap_or("")
            )),
        }
    }
    if let Some(error) = &view.config_error {
        line(format!("configuration: unavailable: {error}"));
        return out;
    }
    line(format!(
        "configuration version {} from the leader at {}: {} server(s) up, {} recovering, {} crashed, {} removed; {} table(s)",
        view.config_version,
        view.leader.as_deref().unwrap_or("?"),
        view.count(ServerState::Up),
        view.count(ServerState::Recovering) + view.count(ServerState::RecoveryWaiting),
        view.count(ServerState::Crashed),
        view.count(ServerState::Removed),
        view.tables.len()
    ));
    line("servers:".into());
    line(format!(
        "  {:>5} {:<22} {:<17} {:>9} {:>10} {:>10} {:>9} {:>6} {:>10} {:>6}",
        "id",
        "address",
        "state",
        "objects",
        "log held",
        "memory",
        "replicas",
        "frames",
        "unflushed",
        "short"
    ));
    for s in &view.servers {
        let word = if view.drain(s.id).is_some() {
            "draining"
        } else {
            s.state.word()
        };
        let head = format!("  {:>5} {:<22} {:<17}", s.id, s.addr, word);
        match (&s.stats, &s.error) {
            (Some(st), _) => line(format!(
                "{head} {:>9} {:>10} {:>10} {:>9} {:>6} {:>10} {:>6}",
                st.objects,
                ByteSize(st.log_bytes_used).readable(),
                ByteSize(st.log_bytes_max).readable(),
                st.backup_replicas + st.frames_open,
                st.frames_open,
                st.frames_unflushed,
                st.segments_under_replicated
            )),
            (None, Some(error)) => line(format!("{head} no answer: {error}")),
            (None, None) => line(head.trim_end().to_string()),
        }
    }
    let answered: Vec<_> = view
        .servers
        .iter()
        .filter_map(|s| s.stats.as_ref())
        .collect();
    let replicas = answered.iter().map(|s| s.replicas).max().unwrap_or(0);
    let short: u64 = answered.iter().map(|s| s.segments_under_replicated).sum();
    let waiting = answered
        .iter()
        .filter(|s| s.backup_shortage.is_some())
        .count();
    let backups = view
        .servers
        .iter()
        .filter(|s| s.state == ServerState::Up && s.backup)
        .count();
    line(format!(
        "replication: R = {replicas}, {backups} backup(s) up, {short} segment(s) short of R, {}",
        if waiting == 0 {
            "writes flow".to_string()
        } else {
            format!("writes of {waiting} master(s) wait for backups")
        }
    ));
    line("tables:".into());
    if view.tables.is_empty() {
        line("  (none)".into());
    }
    for table in &view.tables {
        line(format!(
            "  {} (id {}, {} tablet(s))",
            table.name,
            table.id,
            table.tablets.len()
        ));
        for t in &table.tablets {
            let load = view
                .tablet_load(table.id, t.start_hash)
                .map(|l| {
                    format!(
                        "  {} ops/s, {}",
                        l.ops,
                        rampart_common::config::ByteSize(l.bytes).readable()
                    )
                })
                .unwrap_or_default();
            line(format!(
                "    {:016x}-{:016x}  server {:<5} {}{load}",
                t.start_hash,
                t.end_hash,
                t.owner,
                t.owner_state.word()
            ));
        }
    }
    for drain in &view.drains {
        line(format!(
            "drain of {}: {} tablets left, {} masters still using its backup; {}",
            drain.server, drain.tablets_left, drain.masters_waiting, drain.detail
        ));
    }
    if let Some(rebalance) = &view.rebalance {
        let state = match (rebalance.enabled, rebalance.paused) {
            (false, _) => "off",
            (true, true) => "paused",
            (true, false) => "on",
        };
        let loads: Vec<String> = rebalance
            .servers
            .iter()
            .map(|s| format!("{} {} ops/s", s.server, s.ops_per_s))
            .collect();
        line(format!(
            "rebalancing: {state}; load: {} (`rampart rebalance`)",
            if loads.is_empty() {
                "none reported".to_string()
            } else {
                loads.join(", ")
            }
        ));
        if let Some(last) = rebalance.decisions.last() {
            line(format!(
                "  last decision: {} ({})",
                last.action, last.outcome
            ));
        }
    }
    let running: Vec<_> = view.recoveries.iter().filter(|r| r.done_ms == 0).collect();
    line(format!(
        "recoveries: {} running, {} finished since this leader took over (`rampart recovery list`)",
        running.len(),
        view.recoveries.len() - running.len()
    ));
    for r in running {
        let live = r.partitions.iter().filter(|p| p.live_ms > 0).count();
        line(format!(
            "  {}: {} of {} partition(s) live{}",
            r.crashed,
            live,
            r.partitions.len(),
            r.waiting
                .as_ref()
                .map(|why| format!("; WAITING: {why}"))
                .unwrap_or_default()
        ));
    }
    out
}
