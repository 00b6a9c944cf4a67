//! The flags of `rampart bench replication`, and the transports `--mode` names.

use anyhow::{bail, Result};
use clap::Args;
use rampart_common::onesided::TransportKind;
use std::path::PathBuf;

/// `rampart bench replication`
#[derive(Args, Debug, Clone)]
pub struct ReplicationArgs {
    /// Replication transports to compare, comma-separated (shm, tcp, rpc, rdma); one
    /// cluster each, measured alternately.
    #[arg(long, default_value = "shm,tcp,rpc")]
    pub mode: String,
    /// Storage servers per cluster (each a master and a backup).
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Backup replicas of every segment (R); at most servers − 1.
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Closed-loop clients (tokio tasks on one thread, each with its own connections).
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Objects loaded into each cluster before the windows.
    #[arg(long, default_value_t = 50_000)]
    pub records: u64,
    /// Length of each measured window, seconds (ignored with --ops-per-round).
    #[arg(long, default_value_t = 3.0)]
    pub seconds_per_round: f64,
    /// Operations per measured window (all clients together), instead of a duration.
    #[arg(long)]
    pub ops_per_round: Option<u64>,
    /// Rounds; each measures every workload on every mode once.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// DRAM per server for its log.
    #[arg(long, default_value = "512MiB")]
    pub memory: String,
    /// Zipfian skew (YCSB's default 0.99; 0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Seed of the key and operation choices (printed; reuse to replay the choices).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Parses `--mode`: distinct transport names, comma-separated.
pub(super) fn parse_modes(list: &str) -> Result<Vec<TransportKind>> {
    let mut modes = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mode: TransportKind = name.parse()?;
        if modes.contains(&mode) {
            bail!("--mode names {mode} twice");
        }
        modes.push(mode);
    }
    if modes.is_empty() {
        bail!("--mode needs at least one transport");
    }
    Ok(modes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_modes_rejects_duplicates_and_unknown_names() {
        assert_eq!(
            parse_modes("shm, rpc").ok(),
            Some(vec![TransportKind::Shm, TransportKind::Rpc])
        );
        assert!(parse_modes("shm,shm").is_err());
        assert!(parse_modes("udp").is_err());
        assert!(parse_modes("").is_err());
    }
}
