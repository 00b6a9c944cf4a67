//! `rampart tablet split TABLE HASH` and `rampart tablet move TABLE START-END --to
//! SERVER`: an operator's changes of a table's tablets.
//!
//! A split cuts the tablet holding HASH in two at HASH; both halves stay with its
//! owner and no data moves (docs/design.md, "Splitting a tablet"). HASH is a key hash,
//! decimal or `0x` hexadecimal, or `--key KEY` splits where KEY's hash lies, so that
//! KEY starts the upper half. Prints the tablets that meet there; a split where a
//! tablet starts already prints them unchanged.
//!
//! `rampart tablet cancel-move ID` aborts an open move (`rampart rebalance` lists them):
//! the target forgets its copy and the source serves the range again.
//!
//! A move hands the tablets covering hashes START..=END (split first where one reaches
//! past either end) to master SERVER (an id, `server-3` or `3`), copied under load and
//! frozen only for the last changes (docs/design.md, "Moving a tablet"): one move per
//! run of one owner's tablets, passing over those on SERVER already. Prints each move,
//! its tablets and what it took. A move that fails is aborted and its tablets stay where
//! they were (those moved before it stay moved). Errors print on stderr and exit 2.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rampart_common::ids::{key_hash, ServerId};
use rampart_common::tablet::Tablet;
use std::process::ExitCode;

/// `rampart tablet`. A split of a tablet whose owner is being recovered waits for the
/// recovery, within `--timeout`.
#[derive(Args, Debug)]
pub struct TabletArgs {
    #[command(flatten)]
    pub client: crate::kv::ClientArgs,
    #[command(subcommand)]
    pub command: TabletCommand,
}

/// One change of a table's tablets.
#[derive(Subcommand, Debug)]
pub enum TabletCommand {
    /// Split the tablet holding a key hash in two at that hash, on its owner (no data
    /// moves).
    Split {
        /// Table name.
        table: String,
        /// The first hash of the upper half: decimal, or hexadecimal with `0x`.
        #[arg(required_unless_present = "key", conflicts_with = "key")]
        hash: Option<String>,
        /// Split at this key's hash instead, so that the key starts the upper half.
        #[arg(long)]
        key: Option<String>,
    },
    /// Cancel an open move (`rampart rebalance` lists them): the target forgets its
    /// copy and the source serves the range again.
    CancelMove {
        /// The move: its id (`move-3` or `3`).
        id: String,
    },
    /// Move the tablets covering a range of key hashes to another master, under load.
    Move {
        /// Table name.
        table: String,
        /// The hashes, `START-END` (inclusive; decimal or `0x` hexadecimal), or `all`.
        range: String,
        /// The master that takes them: its server id (`server-3` or `3`).
        #[arg(long)]
        to: String,
    },
}

/// Runs `rampart tablet ...`.
pub fn run(args: TabletArgs) -> Result<ExitCode> {
    crate::startup::run_client(&args.client.security, async {
        let client = crate::kv::connect(&args.client).await?;
        match args.command {
            TabletCommand::Split { table, hash, key } => {
                let at = match (hash, key) {
                    (Some(hash), _) => parse_hash(&hash)?,
                    (None, Some(key)) => key_hash(key.as_bytes()).0,
                    (None, None) => bail!("give a HASH or --key KEY"),
                };
                // Its error names the table.
                let id = client.get_table_id(&table).await?;
                let (tablets, split) = client
                    .split_tablet(id, at)
                    .await
                    .with_context(|| format!("splitting table {table} at {at:#018x}"))?;
                let what = if split {
                    "split"
                } else {
                    "a tablet starts there already; unchanged"
                };
                println!("{table} at {at:#018x}: {what}");
                for tablet in &tablets {
                    println!("{}", describe(tablet));
                }
            }
            TabletCommand::CancelMove { id } => {
                let id = id
                    .strip_prefix("move-")
                    .unwrap_or(&id)
                    .parse::<u64>()
                    .map(rampart_common::ids::MoveId)
                    .with_context(|| format!("{id:?} is not a move id (move-3, or 3)"))?;
                client
                    .cancel_move(id)
                    .await
                    .with_context(|| format!("cancelling {id}"))?;
                println!("{id} cancelled: aborted, its tablets stay where they were");
            }
            TabletCommand::Move { table, range, to } => {
                let (start, end) = parse_range(&range)?;
                let target = parse_server(&to)?;
                let id = client.get_table_id(&table).await?;
                let moved = client
                    .move_tablets(id, start, end, target)
                    .await
                    .with_context(|| {
                        format!(
                            "moving table {table} hashes {start:#018x}..={end:#018x} to {target}"
                        )
                    })?;
                if moved.moves.is_empty() {
                    println!("{table} {start:#018x}..={end:#018x}: on {target} already");
                }
                for each in &moved.moves {
                    let (first, last) = (each.tablets.first(), each.tablets.last());
                    let (from, to) = (
                        first.map_or(start, |t| t.start_hash),
                        last.map_or(end, |t| t.end_hash),
                    );
                    println!(
                        "{table} {from:#018x}..={to:#018x}: moved from {} to {target} ({}): \
                         {} entries, {} bytes, copied in {} ms, frozen {} ms",
                        each.source,
                        each.id,
                        each.entries,
                        each.bytes,
                        each.copy_ms,
                        each.frozen_ms
                    );
                    for tablet in &each.tablets {
                        println!("{}", describe(tablet));
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })?
}

/// `START-END` (each as [`parse_hash`] reads it), or `all`.
pub(crate) fn parse_range(text: &str) -> Result<(u64, u64)> {
    if text == "all" {
        return Ok((0, u64::MAX));
    }
    let Some((start, end)) = text.split_once('-') else {
        bail!("{text:?} is not a range: give START-END (inclusive), or all");
    };
    let (start, end) = (parse_hash(start)?, parse_hash(end)?);
    if start > end {
        bail!("{text:?} is empty: START is past END");
    }
    Ok((start, end))
}

/// A server id as an operator types it: `server-3` or `3`.
pub(crate) fn parse_server(text: &str) -> Result<ServerId> {
    text.strip_prefix("server-")
        .unwrap_or(text)
        .parse::<u64>()
        .map(ServerId)
        .with_context(|| format!("{text:?} is not a server id (server-3, or 3)"))
}

/// A hash as an operator types it: decimal, or hexadecimal after `0x`.
fn parse_hash(text: &str) -> Result<u64> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => text.replace('_', "").parse::<u64>(),
    };
    parsed.with_context(|| format!("{text:?} is not a hash (0..=18446744073709551615, or 0x...)"))
}

/// `  0x0000000000000000..=0x7fffffffffffffff on server 2`
fn describe(tablet: &Tablet) -> String {
    format!(
        "  {:#018x}..={:#018x} on {}",
        tablet.start_hash, tablet.end_hash, tablet.owner
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_parse_in_decimal_and_hexadecimal_and_nothing_else() {
        assert_eq!(parse_hash("1000").ok(), Some(1000));
        assert_eq!(parse_hash("0x8000_0000_0000_0000").ok(), Some(1 << 63));
        assert_eq!(parse_hash("0XFF").ok(), Some(255));
        assert_eq!(parse_hash("18446744073709551615").ok(), Some(u64::MAX));
        for bad in ["", "-1", "18446744073709551616", "0x", "0x1g", "ten"] {
            let error = parse_hash(bad).expect_err(bad);
            assert!(error.to_string().contains("is not a hash"), "{error}");
        }
    }

    #[test]
    fn ranges_and_server_ids_parse_as_operators_type_them() {
        assert_eq!(parse_range("all").ok(), Some((0, u64::MAX)));
        assert_eq!(
            parse_range("0-0x7fffffffffffffff").ok(),
            Some((0, (1 << 63) - 1))
        );
        assert_eq!(parse_range("5-5").ok(), Some((5, 5)));
        for bad in ["", "5", "6-5", "a-b", "1-2-3"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_server("server-3").ok(), Some(ServerId(3)));
        assert_eq!(parse_server("12").ok(), Some(ServerId(12)));
        for bad in ["", "server-", "s3", "-1"] {
            assert!(parse_server(bad).is_err(), "{bad}");
        }
    }
}
