//! The flags of `rampart bench compare`.

use clap::{Args, ValueEnum};

use crate::bench::ycsb::Workload;

/// The systems compared with Rampart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// Redis (`redis-server`).
    Redis,
}

/// `rampart bench compare`
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The system to compare with.
    #[arg(long, value_enum, default_value = "redis")]
    pub peer: Peer,
    /// YCSB workloads to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "write-only,a,b,c"
    )]
    pub workloads: Vec<Workload>,
    /// Objects loaded into each system before the runs.
    #[arg(long, default_value_t = 50_000)]
    pub records: u64,
    /// Operations per workload and system (all clients together, all rounds).
    #[arg(long, default_value_t = 50_000)]
    pub ops: u64,
    /// Closed-loop clients, each with its own connections.
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Zipfian skew (YCSB's default 0.99; 0 for uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Rampart's servers.
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Copies beside the primary: Rampart's R, and Redis's replicas (`WAIT R`).
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Rounds the runs are cut into, alternating the systems.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// A reduced run (about 40 s): 10,000 records and operations, 2 rounds, 8 clients,
    /// 0.05 GiB lost, each Sentinel `down-after` held 2 s.
    #[arg(long)]
    pub quick: bool,
    /// Seed of the key and operation choices (printed; reuse to replay a run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the figures as JSON to FILE, and the plots beside it.
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// GiB held by the server that is lost in the loss comparison (1 KB objects).
    #[arg(long, default_value_t = 1.0)]
    pub loss_gib: f64,
    /// Skip the loss comparison.
    #[arg(long)]
    pub no_loss: bool,
    /// Milliseconds of write load before each kill of the loss comparison: 16
    /// closed-loop writers overwrite 10,000 keys of 1 KB on the server that is lost, on
    /// every system alike, until the kill; the acknowledged writes missing once it
    /// serves again are counted.
    #[arg(long, default_value_t = 500)]
    pub loss_write_ms: u64,
    /// Sentinel's `down-after-milliseconds` values to try, largest first: how long the
    /// primary must be unreachable before a sentinel deems it down. Lower fails over
    /// sooner and risks failing over a primary that was only busy (a long command, a
    /// fork for a snapshot, a loaded host). Each is held for `--sentinel-stable-s` under
    /// a write load; the failover is measured with the lowest one under which no
    /// sentinel deemed the live primary down.
    #[arg(long, value_delimiter = ',', default_value = "1000,500,200,100")]
    pub sentinel_down_after_ms: Vec<u64>,
    /// Seconds each `--sentinel-down-after-ms` value is held under load (2 with
    /// `--quick`).
    #[arg(long, default_value_t = 10)]
    pub sentinel_stable_s: u64,
}
