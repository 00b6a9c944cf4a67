//! What the figures were measured under: the flags, the seed, the machine's cores and
//! clock tick, and its load.

use rampart_common::onesided::TransportKind;

use super::args::ReplicationArgs;

/// What the figures were measured under.
#[derive(Debug)]
pub(super) struct Conditions {
    pub(super) servers: u32,
    pub(super) replicas: u32,
    pub(super) clients: u32,
    pub(super) value_bytes: usize,
    pub(super) records: u64,
    pub(super) zipf: f64,
    pub(super) rounds: u32,
    pub(super) seconds_per_round: Option<f64>,
    pub(super) ops_per_round: Option<u64>,
    pub(super) memory: String,
    pub(super) seed: u64,
    pub(super) clk_tck: u64,
    pub(super) cores: usize,
    pub(super) loadavg_start: String,
}

impl Conditions {
    pub(super) fn now(args: &ReplicationArgs, seed: u64, clk_tck: u64) -> Conditions {
        Conditions {
            servers: args.servers,
            replicas: args.replicas,
            clients: args.clients,
            value_bytes: args.value_bytes,
            records: args.records,
            zipf: args.zipf,
            rounds: args.rounds,
            seconds_per_round: args
                .ops_per_round
                .is_none()
                .then_some(args.seconds_per_round),
            ops_per_round: args.ops_per_round,
            memory: args.memory.clone(),
            seed,
            clk_tck,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadavg_start: loadavg(),
        }
    }

    pub(super) fn line(&self, modes: &[TransportKind]) -> String {
        let window = match (self.ops_per_round, self.seconds_per_round) {
            (Some(ops), _) => format!("{ops} ops"),
            (None, Some(s)) => format!("{s} s"),
            (None, None) => "?".into(),
        };
        let modes: Vec<&str> = modes.iter().map(|m| m.name()).collect();
        format!(
            "replication bench: modes {}; {} servers (each master + backup), R = {}, {} \
             clients on one client thread, {}-byte values, {} records, zipf {}, {} rounds \
             of {window} per workload and mode, {} per server log, {} cores, CLK_TCK {}, \
             loadavg {}, seed {}",
            modes.join(","),
            self.servers,
            self.replicas,
            self.clients,
            self.value_bytes,
            self.records,
            self.zipf,
            self.rounds,
            self.memory,
            self.cores,
            self.clk_tck,
            self.loadavg_start,
            self.seed
        )
    }
}

/// The 1, 5 and 15 minute load averages.
pub(super) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}
