//! `StorageServerConfig`: everything one storage server is built from, checked once by
//! [`StorageServerConfig::validate`] before anything starts.
//!
//! Defaults are those of `rampart server` without flags ([`StorageServerConfig::new`]).
//! The frames of the backup that may take open replicas ([`frames_for_budget`]) are
//! derived here from the operator's byte budget, `unflushed_bytes_max`, within the pool
//! of `backup_frames`.

use rampart_common::config::{MasterConfig, SEGMENT_BYTES_DEFAULT};
use rampart_common::onesided::TransportKind;
use rampart_master::profiler::PartitionLimits;
use std::path::PathBuf;
use std::time::Duration;

/// Frames a backup offers by default: 512 MiB of frames of 8 MiB.
pub const BACKUP_FRAMES_DEFAULT: usize = 64;

/// Worker threads of a server's backup runtime: backup requests are open, close and
/// (for the `rpc` and `tcp` transports) copies, so one thread keeps up with the master.
pub const BACKUP_THREADS: usize = 1;

/// How long a backup's disk takes to write what [`UNFLUSHED_BYTES_DEFAULT`] allows at
/// 128 MB/s: about what a stopping backup waits for its closes in flight.
pub const FRAME_FLUSH_WINDOW: Duration = Duration::from_secs(2);

/// Replicated bytes a backup may hold only in memory by default (in frames open for
/// writes or not yet flushed to its disk): 32 frames of 8 MiB. What a power loss of the
/// whole cluster could take, and what the backup's disk must write before a frame is
/// free for a new open; more lets writes and re-replication run ahead of the disk for
/// longer.
pub const UNFLUSHED_BYTES_DEFAULT: u64 = 256 << 20;

/// Backup replicas of every segment by default (R).
pub const REPLICAS_DEFAULT: usize = 3;

/// The frames that may take open replicas under a budget of `unflushed_bytes_max` bytes
/// held only in memory, for frames of `frame_bytes`: at least one, at most the pool's
/// `configured` frames. The same on every start: an operator's setting, not a probe's.
pub fn frames_for_budget(unflushed_bytes_max: u64, frame_bytes: u32, configured: usize) -> usize {
    let frames = unflushed_bytes_max / u64::from(frame_bytes.max(1));
    usize::try_from(frames)
        .unwrap_or(usize::MAX)
        .clamp(1, configured.max(1))
}

/// One storage server: its master, its backup, and how it finds the coordinators.
#[derive(Clone, Debug)]
pub struct StorageServerConfig {
    /// The coordinators' addresses (any member; requests follow the leader).
    pub coordinators: Vec<String>,
    /// Directory of the backup's segment replicas (created if missing). A restarted
    /// server given the same directory reports the replicas it holds.
    pub data_dir: PathBuf,
    /// The backup's shared-memory frame file (its "non-volatile buffer"). `None`:
    /// `/dev/shm/rampart-frames-HASH`, HASH naming the data directory.
    pub frame_file: Option<PathBuf>,
    /// Segment replicas the backup holds in memory, its frame file allocated at start-up
    /// (this many frames of the larger of the segment size and 8 MiB). As many as
    /// `unflushed_bytes_max` allows take open replicas ([`frames_for_budget`]); the rest
    /// keep flushed replicas in memory, for recoveries to read from there.
    pub backup_frames: usize,
    /// Replicated bytes the backup may hold only in memory, not yet on its disk
    /// ([`UNFLUSHED_BYTES_DEFAULT`]).
    pub unflushed_bytes_max: u64,
    /// Disk read bandwidth of the backup in MB/s, reported at enlistment (masters place
    /// replicas by it). `None`: measured at start-up.
    pub disk_mbps: Option<u32>,
    /// The master's log: segment size, memory, largest value.
    pub master: MasterConfig,
    /// Backup replicas of every segment of this server's master (R). A write is
    /// acknowledged only once R backups hold it; 0 keeps the DRAM copy only.
    pub replicas: usize,
    /// How replica bytes move to backups. `None`: chosen per backup, shm for a backup on
    /// this host, else tcp.
    pub replication: Option<TransportKind>,
    /// Failure domain (rack) of this server: no two replicas of a segment are placed in
    /// one domain. `None`: the server's own address, its own domain.
    pub failure_domain: Option<String>,
    /// The address other servers and clients reach this server at, when it is not the
    /// one it listens on (a wildcard listener such as `0.0.0.0:7100`, a NAT): `HOST` (the
    /// listening port is added) or `HOST:PORT` (IPv6 hosts in brackets). It is what the
    /// server enlists with, and its soft-NIC is advertised on the same host. `None`:
    /// the bound address.
    pub advertise: Option<String>,
    /// Port of the backup's soft-NIC (the `tcp` transport's listener), on the listening
    /// address's IP; 0 picks a free one. Fixed ports let firewalls between hosts name
    /// it.
    pub nic_port: u16,
    /// The largest recovery partition of this master's will.
    pub partition_limits: PartitionLimits,
    /// Time between two pings of the failure detector, each of a random other server.
    pub ping_interval: Duration,
    /// How long a pinged server has to answer before it is reported to the coordinator.
    pub ping_timeout: Duration,
    /// Time between two renewals of the master's lease (renew several times per lease,
    /// so that one lost renewal does not stop the master).
    pub lease_renew_interval: Duration,
}

/// Why a [`StorageServerConfig`] cannot run.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// The field at fault, as named in [`StorageServerConfig`].
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl StorageServerConfig {
    /// The defaults of `rampart server`, for a server of `coordinators` keeping its
    /// replicas in `data_dir`.
    pub fn new(coordinators: Vec<String>, data_dir: PathBuf) -> StorageServerConfig {
        StorageServerConfig {
            coordinators,
            data_dir,
            frame_file: None,
            backup_frames: BACKUP_FRAMES_DEFAULT,
            unflushed_bytes_max: UNFLUSHED_BYTES_DEFAULT,
            disk_mbps: None,
            master: MasterConfig::default(),
            replicas: REPLICAS_DEFAULT,
            replication: None,
            failure_domain: None,
            advertise: None,
            nic_port: 0,
            partition_limits: PartitionLimits::default(),
            ping_interval: rampart_master::failure_detector::PING_INTERVAL,
            ping_timeout: rampart_master::failure_detector::PING_TIMEOUT,
            lease_renew_interval: rampart_master::lease::LEASE_RENEW_INTERVAL,
        }
    }

    /// Checks everything that can be checked before starting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| {
            Err(ConfigError {
                field,
                reason: reason.to_string(),
            })
        };
        self.master.validate().map_err(|e| ConfigError {
            field: "master",
            reason: e.0,
        })?;
        if self.coordinators.is_empty() {
            return invalid("coordinators", "at least one address is needed");
        }
        if let Some(advertise) = &self.advertise {
            if let Err(reason) = parse_advertise(advertise) {
                return invalid("advertise", &reason);
            }
        }
        if self.backup_frames == 0 {
            return invalid("backup_frames", "a backup needs at least one frame");
        }
        if self.unflushed_bytes_max < u64::from(self.frame_bytes()) {
            return invalid(
                "unflushed_bytes_max",
                "below one frame: the backup could open no replica",
            );
        }
        if self.disk_mbps == Some(0) {
            return invalid("disk_mbps", "a disk of 0 MB/s flushes nothing");
        }
        if self.partition_limits.bytes_max == 0 || self.partition_limits.records_max == 0 {
            return invalid("partition_limits", "a partition must hold something");
        }
        for (field, value) in [
            ("ping_interval", self.ping_interval),
            ("ping_timeout", self.ping_timeout),
            ("lease_renew_interval", self.lease_renew_interval),
        ] {
            if value.is_zero() {
                return invalid(field, "must be positive");
            }
        }
        if self.replication == Some(TransportKind::Rdma) {
            if let Err(reason) = rampart_common::onesided::rdma::rdma_available() {
                return invalid("replication", &reason);
            }
        }
        Ok(())
    }

    /// The size of the backup's frames: the larger of the segment size and the default
    /// (a backup holds other masters' segments too, of the default size or more).
    pub fn frame_bytes(&self) -> u32 {
        self.master.segment_bytes.max(SEGMENT_BYTES_DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> StorageServerConfig {
        StorageServerConfig::new(vec!["127.0.0.1:7000".into()], PathBuf::from("/tmp/x"))
    }

    #[test]
    fn the_defaults_validate() {
        assert!(config().validate().is_ok());
    }

    #[test]
    fn each_invalid_field_is_named() {
        type Breaks = fn(&mut StorageServerConfig);
        let cases: [(&str, Breaks); 9] = [
            ("master", |c| c.master.segment_bytes = 1),
            ("coordinators", |c| c.coordinators.clear()),
            ("backup_frames", |c| c.backup_frames = 0),
            ("unflushed_bytes_max", |c| c.unflushed_bytes_max = 1024),
            ("disk_mbps", |c| c.disk_mbps = Some(0)),
            ("partition_limits", |c| c.partition_limits.records_max = 0),
            ("ping_interval", |c| c.ping_interval = Duration::ZERO),
            ("ping_timeout", |c| c.ping_timeout = Duration::ZERO),
            ("lease_renew_interval", |c| {
                c.lease_renew_interval = Duration::ZERO
            }),
        ];
        for (field, break_it) in cases {
            let mut config = config();
            break_it(&mut config);
            let error = config.validate().expect_err(field);
            assert_eq!(error.field, field, "{error}");
        }
    }

    #[test]
    fn the_frames_open_follow_the_byte_budget_within_the_pool() {
        let frame = SEGMENT_BYTES_DEFAULT;
        assert_eq!(frames_for_budget(UNFLUSHED_BYTES_DEFAULT, frame, 64), 32);
        assert_eq!(frames_for_budget(100 << 20, frame, 64), 12, "whole frames");
        assert_eq!(
            frames_for_budget(1 << 40, frame, 64),
            64,
            "at most the pool"
        );
        assert_eq!(frames_for_budget(1, frame, 64), 1, "at least one");
    }
}

/// An advertised address: its host, and its port if it names one.
pub fn parse_advertise(text: &str) -> Result<(&str, Option<u16>), String> {
    if text.is_empty() || text.chars().any(char::is_whitespace) {
        return Err(format!("`{text}` is not HOST or HOST:PORT"));
    }
    let (host, port) = match text.rsplit_once(':') {
        // A bracketed IPv6 host alone ends with ']'.
        Some((host, port)) if !text.ends_with(']') => (host, Some(port)),
        _ => (text, None),
    };
    if host.is_empty() || (host.contains(':') && !host.starts_with('[')) {
        return Err(format!(
            "`{text}` is not HOST or HOST:PORT (IPv6 hosts in brackets)"
        ));
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("`{text}`: the port must be 1 to 65535")),
            Ok(port) => Some(port),
        },
    };
    Ok((host, port))
}

/// The address a server listening at `bound` enlists with under `advertise`.
pub fn advertised_addr(advertise: Option<&str>, bound: std::net::SocketAddr) -> String {
    match advertise.map(parse_advertise) {
        Some(Ok((host, Some(port)))) => format!("{host}:{port}"),
        Some(Ok((host, None))) => format!("{host}:{}", bound.port()),
        None | Some(Err(_)) => bound.to_string(),
    }
}

/// The host part of an address `HOST:PORT`.
pub fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

#[cfg(test)]
mod advertise_tests {
    use super::*;

    #[test]
    fn advertised_addresses_take_the_listening_port_unless_they_name_one() {
        let bound: std::net::SocketAddr = "0.0.0.0:7100".parse().expect("an address");
        assert_eq!(advertised_addr(None, bound), "0.0.0.0:7100");
        assert_eq!(advertised_addr(Some("h1.rack1"), bound), "h1.rack1:7100");
        assert_eq!(
            advertised_addr(Some("10.0.0.5:9000"), bound),
            "10.0.0.5:9000"
        );
        assert_eq!(advertised_addr(Some("[fd00::5]"), bound), "[fd00::5]:7100");
        assert_eq!(advertised_addr(Some("[fd00::5]:9"), bound), "[fd00::5]:9");
        assert_eq!(host_of("h1.rack1:7100"), "h1.rack1");
        for bad in ["", "h 1", "h:0", "h:x", "fd00::5", ":7100"] {
            assert!(parse_advertise(bad).is_err(), "{bad}");
        }
    }
}
