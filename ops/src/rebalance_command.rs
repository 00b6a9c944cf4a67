//! `rampart rebalance`: where load-based rebalancing stands, and the operator's levers
//! (docs/design.md §7, "Rebalancing"; docs/operating.md, "Rebalancing").
//!
//! `show` (the default) prints whether the leader rebalances (`rampart coordinator
//! --rebalance`) and whether an operator paused it, the pinned ranges, each master's
//! load (operations per second and log bytes, with its tablets) and the newest
//! decisions with the figures behind them and how each ended. `pause` and `resume` are
//! committed, so they hold across leaders; a move under way when paused goes on.
//! `pin TABLE START-END` leaves the tablets meeting that range where they are (a drain
//! still moves them); `unpin` removes every pinned range meeting it. `cap MB` caps the
//! megabytes per second each move begun from then on copies (0 lifts it). `show` also
//! lists the moves open now; `rampart tablet cancel-move ID` ends one. Errors print on
//! stderr and exit 2.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rampart_common::protocol::coordinator::{RebalanceAction, RebalanceReply};
use rampart_common::tablet::HashRange;
use std::process::ExitCode;

/// `rampart rebalance`.
#[derive(Args, Debug)]
pub struct RebalanceArgs {
    #[command(flatten)]
    pub client: crate::kv::ClientArgs,
    #[command(subcommand)]
    pub command: Option<RebalanceCommand>,
}

/// What to ask of the rebalancer.
#[derive(Subcommand, Debug)]
pub enum RebalanceCommand {
    /// Where it stands: on or paused, the pins, each master's load, the last decisions.
    Show,
    /// Stop deciding moves and splits (a move under way goes on).
    Pause,
    /// Decide again.
    Resume,
    /// Leave the tablets meeting a range of key hashes where they are.
    Pin {
        /// Table name.
        table: String,
        /// The hashes, `START-END` (inclusive; decimal or `0x` hexadecimal), or `all`.
        range: String,
    },
    /// Unpin every pinned range meeting a range of key hashes.
    Unpin {
        /// Table name.
        table: String,
        /// The hashes, `START-END`, or `all`.
        range: String,
    },
    /// Cap the megabytes per second each move copies from now on (the rebalancer's, a
    /// drain's and `rampart tablet move`'s alike); 0 lifts the cap.
    Cap {
        /// Megabytes per second.
        mb_per_s: u32,
    },
}

/// Runs `rampart rebalance ...`.
pub fn run(args: RebalanceArgs) -> Result<ExitCode> {
    crate::startup::run_client(&args.client.security, async {
        let client = crate::kv::connect(&args.client).await?;
        let action = match args.command.unwrap_or(RebalanceCommand::Show) {
            RebalanceCommand::Show => RebalanceAction::Show,
            RebalanceCommand::Pause => RebalanceAction::Pause,
            RebalanceCommand::Resume => RebalanceAction::Resume,
            RebalanceCommand::Pin { table, range } => {
                RebalanceAction::Pin(table_range(&client, &table, &range).await?)
            }
            RebalanceCommand::Unpin { table, range } => {
                RebalanceAction::Unpin(table_range(&client, &table, &range).await?)
            }
            RebalanceCommand::Cap { mb_per_s } => RebalanceAction::Cap(mb_per_s),
        };
        let reply = client
            .rebalance(action)
            .await
            .context("asking the rebalancer")?;
        print!("{}", describe(&reply));
        Ok(ExitCode::SUCCESS)
    })?
}

async fn table_range(
    client: &rampart_client::Client,
    table: &str,
    range: &str,
) -> Result<HashRange> {
    let (start, end) = crate::tablet_command::parse_range(range)?;
    let id = client.get_table_id(table).await?;
    Ok(HashRange::new(id, start, end))
}

/// The report `rampart rebalance` prints (and `rampart status` reuses).
pub(crate) fn describe(reply: &RebalanceReply) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let state = match (reply.enabled, reply.paused) {
        (false, _) => "off (rampart coordinator --rebalance off)",
        (true, true) => "paused (rampart rebalance resume)",
        (true, false) => "on",
    };
    let _ = writeln!(out, "rebalancing: {state}");
    let cap = match reply.move_cap_mb_s {
        0 => "none".to_string(),
        mb => format!("{mb} MB/s"),
    };
    let _ = writeln!(out, "move bandwidth cap: {cap}");
    for open in &reply.moves {
        let _ = writeln!(
            out,
            "  open: {} of table {} {:#018x}..={:#018x} from {} to {} (`rampart tablet cancel-move {}`)",
            open.id, open.range.table, open.range.start, open.range.end, open.source, open.target, open.id.0
        );
    }
    for range in &reply.pinned {
        let _ = writeln!(
            out,
            "  pinned: table {} {:#018x}..={:#018x}",
            range.table, range.start, range.end
        );
    }
    let _ = writeln!(out, "load (ops/s, log bytes, tablets):");
    for server in &reply.servers {
        let _ = writeln!(
            out,
            "  {:<10} {:>10} ops/s {:>14} bytes {:>4} tablets",
            server.server.to_string(),
            server.ops_per_s,
            server.bytes,
            server.tablets.len()
        );
    }
    if reply.decisions.is_empty() {
        let _ = writeln!(out, "decisions: none yet");
    } else {
        let _ = writeln!(out, "decisions (oldest first):");
        for decision in &reply.decisions {
            let _ = writeln!(
                out,
                "  {}: {}\n    why: {}\n    outcome: {}",
                rampart_coordinator::status_page::utc_time(decision.at_unix_ms),
                decision.action,
                decision.why,
                decision.outcome
            );
        }
    }
    out
}
