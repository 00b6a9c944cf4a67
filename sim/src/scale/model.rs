//! What a recovery at scale is simulated for and with: the [`Scenario`] (the cluster,
//! what crashed, its hardware and where the cores are: [`Host`]), the [`Costs`] the model
//! charges for its work, calibrated from `rampart bench recovery`, and the [`Outcome`]
//! (see the parent module for what is real and what is modelled).

use serde::{Deserialize, Serialize};

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// Where the servers' cores are.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Host {
    /// Each server has this many cores of its own (a cluster of machines).
    PerServer {
        /// Cores per server.
        cores: f64,
    },
    /// Every server shares one machine of this many cores (a local cluster); disks are
    /// that machine's page cache and the network its loopback, both as fast as its cores
    /// can copy ([`Costs`] holds what the copies cost).
    Shared {
        /// Cores of the machine.
        cores: f64,
    },
}

/// One recovery to simulate: the cluster, what crashed, and its hardware.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    /// Servers in the cluster before the crash, each a master and a backup.
    pub servers: usize,
    /// Masters that crash at once (the first ones), each recovered by every other.
    pub crashed: usize,
    /// Log bytes of each crashed master (its live objects, as the will counts them).
    pub master_bytes: u64,
    /// Bytes of one log entry (object with its header).
    pub entry_bytes: u64,
    /// Bytes of one segment.
    pub segment_bytes: u64,
    /// Replicas per segment (R).
    pub replicas: usize,
    /// Disk read bandwidth, MB/s (10^6 bytes); ignored with [`Host::Shared`].
    pub disk_read_mbps: f64,
    /// Disks differ: each one's speed is drawn uniformly from
    /// `disk_read_mbps × [1 − spread, 1 + spread]`. 0: all alike.
    pub disk_spread: f64,
    /// NIC bandwidth each way, Gbit/s; ignored with [`Host::Shared`].
    pub nic_gbps: f64,
    /// Failure domains (racks), servers spread over them round-robin; 0: one per
    /// server.
    pub racks: usize,
    /// Random candidates per primary replica: 1 is pure random placement, the
    /// selector's `CANDIDATES_K` (5) refined placement.
    pub candidates: usize,
    /// Byte limit of a will's partitions.
    pub partition_bytes: u64,
    /// Record limit of a will's partitions.
    pub partition_records: u64,
    /// Partitions a recovery master replays at once.
    pub partitions_at_once: usize,
    /// Recovery masters a recovery may use (the coordinators' `--recovery-masters-max`);
    /// 0: every server left.
    pub recovery_masters_max: usize,
    /// The crashed masters' lease, ms, renewed every `lease_renew_ms`.
    pub lease_ms: f64,
    /// Interval of lease renewals, ms.
    pub lease_renew_ms: f64,
    /// The crashed masters' deaths are proven as they are detected (a refused port under
    /// `--proof-of-death direct`, or a supervisor's report: `coordinator::proof_of_death`),
    /// so their tablets go live without waiting out their leases.
    pub death_proven: bool,
    /// Where the cores are.
    pub host: Host,
    /// Fixes every random choice: placement, disk speeds, key hashes, the moment of the
    /// crash within a lease period.
    pub seed: u64,
}

impl Scenario {
    /// The paper's setting (RAMCloud, SOSP 2011, §6), with Rampart's defaults:
    /// `servers` servers with 100 MB/s disks and 10 Gbit/s NICs, one master of
    /// `gib` GiB crashed, R = 3, 8 MiB segments of 1 KiB objects, refined placement.
    pub fn cluster(servers: usize, gib: f64) -> Scenario {
        Scenario {
            servers,
            crashed: 1,
            master_bytes: (gib * GIB as f64) as u64,
            entry_bytes: rampart_common::log::object_entry_bytes(11, 1024) as u64,
            segment_bytes: 8 << 20,
            replicas: 3,
            disk_read_mbps: 100.0,
            disk_spread: 0.0,
            nic_gbps: 10.0,
            racks: 0,
            candidates: rampart_master::replica_manager::backup_selector::CANDIDATES_K,
            partition_bytes: rampart_master::profiler::PARTITION_BYTES_DEFAULT,
            partition_records: rampart_master::profiler::PARTITION_RECORDS_DEFAULT,
            partitions_at_once: rampart_master::recovery_master::RECOVERY_PARTITIONS_AT_ONCE,
            recovery_masters_max: 0,
            lease_ms: duration_ms(rampart_coordinator::recovery_manager::LEASE_DEFAULT),
            lease_renew_ms: duration_ms(rampart_master::lease::LEASE_RENEW_INTERVAL),
            death_proven: false,
            host: Host::PerServer { cores: 8.0 },
            seed: 1,
        }
    }

    /// Why it cannot be simulated, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let survivors = self.servers.saturating_sub(self.crashed);
        if self.crashed == 0 {
            return Err("at least one master must crash".into());
        }
        if survivors < 2 {
            return Err(format!(
                "{} servers with {} crashed leave {survivors}: a recovery needs a recovery \
                 master and at least one backup besides it",
                self.servers, self.crashed
            ));
        }
        if self.replicas == 0 {
            return Err("R = 0 keeps no copy to recover from".into());
        }
        if self.replicas + 1 > self.servers {
            return Err(format!(
                "R = {} needs {} servers besides each master",
                self.replicas, self.replicas
            ));
        }
        if self.segment_bytes < 64 * 1024 || self.segment_bytes > u32::MAX as u64 {
            return Err("segments are 64 KiB to 4 GiB".into());
        }
        if self.entry_bytes == 0 || self.entry_bytes > self.segment_bytes / 2 {
            return Err("an entry is 1 byte to half a segment".into());
        }
        if self.master_bytes < self.segment_bytes {
            return Err("a crashed master holds at least one segment".into());
        }
        let positive = [
            ("disk MB/s", self.disk_read_mbps),
            ("NIC Gbit/s", self.nic_gbps),
            ("lease renewal ms", self.lease_renew_ms),
        ];
        for (what, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("{what} must be positive, not {value}"));
            }
        }
        if !(0.0..1.0).contains(&self.disk_spread) {
            return Err("disk spread is in [0, 1)".into());
        }
        if self.candidates == 0 || self.partitions_at_once == 0 {
            return Err("candidates and partitions at once are at least 1".into());
        }
        if self.partition_bytes == 0 || self.partition_records == 0 {
            return Err("partition limits are positive".into());
        }
        let cores = match self.host {
            Host::PerServer { cores } | Host::Shared { cores } => cores,
        };
        if !(cores > 0.0 && cores.is_finite()) {
            return Err(format!("cores must be positive, not {cores}"));
        }
        Ok(())
    }
}

fn duration_ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What the model's work costs, calibrated on one machine from `rampart bench recovery`
/// (see `rampart simulate --calibrate`). CPU costs are per byte of log on one core.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// The failure's detection: the kill until the crash is declared.
    pub detection_ms: f64,
    /// The recovery's setup (fence and list every backup, plan, start the reads): its
    /// part that does not grow with the cluster.
    pub setup_ms: f64,
    /// The setup's part per backup listed (the coordinator handles one reply each).
    pub setup_per_backup_us: f64,
    /// A recovery master's replay pipeline: taking a piece, checking, staging,
    /// appending and indexing its entries, and sending R copies.
    pub replay_ns_per_byte: f64,
    /// A backup reading a segment it holds in memory and splitting it by partition.
    pub split_ns_per_byte: f64,
    /// A backup taking one byte of a recovery master's replicated data into a frame and
    /// flushing it to its file (per replica).
    pub frame_ns_per_byte: f64,
    /// A partition's replay done (and the lease run out) until it is live: the
    /// commit and the tablets' push.
    pub commit_ms: f64,
    /// The last partition live until a waiting client has read from it: its retry
    /// pause and the tablet map it fetches again.
    pub notice_ms: f64,
    /// Where the figures come from.
    pub source: String,
}

impl Costs {
    /// Calibrated on the 2-core development VM (see docs/benchmarks.md, *Recovery at scale*):
    /// `rampart simulate --calibrate` over three runs of `rampart bench recovery
    /// --servers 5 --replicas 3 --data-mb 256 --recovery-masters 1` (cluster CPU 5.70 ns
    /// per byte recovered; the split and a frame's flush timed in the calibration). The
    /// per-backup part of the setup is assumed, not measured: a local cluster has too
    /// few backups to tell it apart from the fixed part.
    pub fn development_vm() -> Costs {
        Costs {
            detection_ms: 5.0,
            setup_ms: 37.0,
            setup_per_backup_us: 50.0,
            replay_ns_per_byte: 4.60,
            split_ns_per_byte: 0.91,
            frame_ns_per_byte: 0.065,
            commit_ms: 7.5,
            // Clients watch the map while an owner is crashed (`WatchTabletMap`); 160 ms
            // of backoff before. Recalibrated 2026-11-28 (`bench recovery --servers 5
            // --replicas 3 --data-mb 256 --recovery-masters 1`, 3 runs): 4 ms.
            notice_ms: 4.0,
            source: "development VM, 2 cores (built in)".into(),
        }
    }

    /// Why they cannot be used, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        let all = [
            ("detection_ms", self.detection_ms),
            ("setup_ms", self.setup_ms),
            ("setup_per_backup_us", self.setup_per_backup_us),
            ("replay_ns_per_byte", self.replay_ns_per_byte),
            ("split_ns_per_byte", self.split_ns_per_byte),
            ("frame_ns_per_byte", self.frame_ns_per_byte),
            ("commit_ms", self.commit_ms),
            ("notice_ms", self.notice_ms),
        ];
        for (what, value) in all {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(format!("cost {what} must be ≥ 0, not {value}"));
            }
        }
        if self.replay_ns_per_byte <= 0.0 || self.split_ns_per_byte <= 0.0 {
            return Err("replay and split costs must be positive".into());
        }
        Ok(())
    }
}

/// One recovery's outcome. Times in ms from the crash (the kill).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Kill → crash declared.
    pub detection_ms: f64,
    /// Kill → setup done (reads and replays start).
    pub setup_ms: f64,
    /// Kill → the last partition replayed.
    pub replayed_ms: f64,
    /// Kill → the crashed masters' leases (and margin) have run out, or their deaths
    /// were proven (at detection: `Scenario::death_proven`).
    pub lease_end_ms: f64,
    /// Kill → the last partition live: the client-observed unavailability of the
    /// slowest key.
    pub unavailability_ms: f64,
    /// Kill → half the partitions live (the median key's unavailability, about).
    pub median_partition_live_ms: f64,
    /// Segments read (all crashed masters).
    pub segments: usize,
    /// Partitions (all crashed masters).
    pub partitions: usize,
    /// Recovery masters given a partition.
    pub recovery_masters: usize,
    /// Most partitions one recovery master replayed.
    pub partitions_per_master_max: usize,
    /// Segments the busiest backup read, and the mean over backups that read any.
    pub reads_per_backup_max: usize,
    /// See `reads_per_backup_max`.
    pub reads_per_backup_mean: f64,
    /// Lower bounds of the replay, each resource alone at full speed, from setup on:
    /// the slowest backup's reading, the busiest recovery master's replaying, the
    /// busiest NIC.
    pub bound_disk_ms: f64,
    /// See `bound_disk_ms`.
    pub bound_replay_ms: f64,
    /// See `bound_disk_ms`.
    pub bound_nic_ms: f64,
    /// Distinct sets of R backups holding a crashed master's segments (its copysets),
    /// for the probability of losing data.
    pub copysets: usize,
    /// Events simulated.
    pub events: u64,
}
