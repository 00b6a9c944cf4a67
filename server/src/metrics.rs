//! `StorageMetrics`: a storage server's Prometheus metrics, read from its master, its
//! backup and its failure detector when scraped (the RPC layer's request counts and
//! latencies are the process's own, `rampart_common::metrics::rpc`).

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge};
use rampart_common::metrics::{counter, gauge, set_counter};
use rampart_master::failure_detector::DetectorCounts;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::storage_service::StorageService;

/// The collector of one storage server (register it in a registry of its own: an
/// in-process cluster holds several).
pub struct StorageMetrics {
    service: Arc<StorageService>,
    detector: Arc<DetectorCounts>,
    gauges: Vec<(Gauge, Reader)>,
    counters: Vec<(Counter, Reader)>,
    /// One scrape at a time: a counter is brought up to its component's total by adding
    /// the difference, which two scrapes at once would both add.
    scraping: parking_lot::Mutex<()>,
}

impl std::fmt::Debug for StorageMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageMetrics").finish_non_exhaustive()
    }
}

/// What one scrape reads.
struct Snapshot {
    master: rampart_master::MasterStats,
    frames: rampart_backup::frame_table::FrameStats,
    slots: usize,
    pings: u64,
    pings_unanswered: u64,
    suspicions: u64,
}

type Reader = fn(&Snapshot) -> f64;

impl StorageMetrics {
    /// The metrics of `service`, with the failure detector's `detector` counts.
    pub fn new(service: Arc<StorageService>, detector: Arc<DetectorCounts>) -> StorageMetrics {
        let gauges: Vec<(&str, &str, Reader)> = vec![
            (
                "rampart_master_objects",
                "Live objects in the master.",
                |s| s.master.objects as f64,
            ),
            (
                "rampart_master_log_bytes",
                "Log memory held by segments.",
                |s| s.master.log_bytes_used as f64,
            ),
            (
                "rampart_master_log_free_bytes",
                "Log memory not held by any segment.",
                |s| {
                    s.master
                        .log_bytes_max
                        .saturating_sub(s.master.log_bytes_used) as f64
                },
            ),
            (
                "rampart_master_log_capacity_bytes",
                "Log memory in all (--memory).",
                |s| s.master.log_bytes_max as f64,
            ),
            (
                "rampart_master_log_live_bytes",
                "Bytes of live entries in the log.",
                |s| s.master.log_bytes_live as f64,
            ),
            (
                "rampart_master_completion_records",
                "Completion records kept for clients' retries.",
                |s| s.master.completion_records as f64,
            ),
            (
                "rampart_master_replicas",
                "Replicas kept of each segment (R).",
                |s| s.master.replicas as f64,
            ),
            (
                "rampart_master_segments_under_replicated",
                "Segments with fewer than R replicas.",
                |s| s.master.segments_under_replicated as f64,
            ),
            (
                "rampart_master_writes_waiting_for_backups",
                "1 while writes wait because fewer backups are eligible than replicas wanted.",
                |s| f64::from(u8::from(s.master.backup_shortage.is_some())),
            ),
            (
                "rampart_master_lease_remaining_seconds",
                "How long the master's coordinator lease still runs (-1: not enforced).",
                |s| {
                    s.master
                        .lease_remaining
                        .map_or(-1.0, |left| left.as_secs_f64())
                },
            ),
            (
                "rampart_backup_replicas",
                "Replicas the backup stores.",
                |s| s.frames.replicas_stored as f64,
            ),
            (
                "rampart_backup_replica_bytes",
                "Bytes of the replicas the backup stores.",
                |s| s.frames.bytes_stored as f64,
            ),
            (
                "rampart_backup_masters",
                "Masters with a replica on this backup.",
                |s| s.frames.masters as f64,
            ),
            (
                "rampart_backup_frames_open",
                "Frames open for writes.",
                |s| s.frames.frames_open as f64,
            ),
            (
                "rampart_backup_frames_unflushed",
                "Frames whose bytes are not yet in the store.",
                |s| s.frames.frames_unflushed as f64,
            ),
            (
                "rampart_backup_frames_closing",
                "Frames being written to the store.",
                |s| s.frames.frames_closing as f64,
            ),
            ("rampart_backup_frame_slots", "Frame slots in all.", |s| {
                s.slots as f64
            }),
            (
                "rampart_backup_frame_slots_free",
                "Frame slots free.",
                |s| s.frames.slots_free as f64,
            ),
        ];
        let counters: Vec<(&str, &str, Reader)> = vec![
            (
                "rampart_master_replicas_recreated_total",
                "Replicas re-created after a backup was lost.",
                |s| s.master.replicas_recreated as f64,
            ),
            (
                "rampart_master_backups_failed_total",
                "Backups the master found failed.",
                |s| s.master.backups_failed as f64,
            ),
            (
                "rampart_cleaner_segments_cleaned_total",
                "Segments the cleaner freed.",
                |s| s.master.segments_cleaned as f64,
            ),
            (
                "rampart_cleaner_relocated_bytes_total",
                "Bytes the cleaner copied into survivor segments.",
                |s| s.master.cleaner_bytes_relocated as f64,
            ),
            ("rampart_cleaner_passes_total", "Cleaner passes.", |s| {
                s.master.cleaner_passes as f64
            }),
            (
                "rampart_recovery_partitions_replayed_total",
                "Partitions this master replayed as a recovery master.",
                |s| s.master.recoveries.partitions as f64,
            ),
            (
                "rampart_recovery_partitions_failed_total",
                "Partitions that failed or were abandoned here.",
                |s| s.master.recoveries.partitions_failed as f64,
            ),
            (
                "rampart_recovery_objects_replayed_total",
                "Live objects replayed here.",
                |s| s.master.recoveries.objects as f64,
            ),
            (
                "rampart_recovery_replayed_bytes_total",
                "Bytes appended here by recoveries.",
                |s| s.master.recoveries.bytes as f64,
            ),
            (
                "rampart_recovery_entries_received_total",
                "Log entries received from backups by recoveries.",
                |s| s.master.recoveries.entries as f64,
            ),
            (
                "rampart_recovery_shared_pieces_total",
                "Pieces copied out of a backup's shared memory on this host by recoveries.",
                |s| s.master.recoveries.shared_pieces as f64,
            ),
            (
                "rampart_recovery_shared_pieces_refetched_total",
                "Pieces left in a backup's shared memory that could not be read there and were asked for again inside a reply.",
                |s| s.master.recoveries.shared_pieces_refetched as f64,
            ),
            (
                "rampart_recovery_replay_seconds_total",
                "Seconds spent replaying partitions here, summed.",
                |s| s.master.recoveries.replay_seconds,
            ),
            (
                "rampart_failure_detector_pings_total",
                "Pings the failure detector sent.",
                |s| s.pings as f64,
            ),
            (
                "rampart_failure_detector_pings_unanswered_total",
                "Pings that got no answer in time.",
                |s| s.pings_unanswered as f64,
            ),
            (
                "rampart_failure_detector_suspicions_total",
                "Servers reported to the coordinators as suspected crashed.",
                |s| s.suspicions as f64,
            ),
        ];
        StorageMetrics {
            service,
            detector,
            gauges: gauges
                .into_iter()
                .map(|(name, help, read)| (gauge(name, help), read))
                .collect(),
            counters: counters
                .into_iter()
                .map(|(name, help, read)| (counter(name, help), read))
                .collect(),
            scraping: parking_lot::Mutex::new(()),
        }
    }

    fn snapshot(&self) -> Snapshot {
        let (frames, slots) = self.service.backup.stats();
        Snapshot {
            master: self.service.master.stats(),
            frames,
            slots,
            pings: self.detector.pings.load(Ordering::Relaxed),
            pings_unanswered: self.detector.pings_unanswered.load(Ordering::Relaxed),
            suspicions: self.detector.suspicions_reported.load(Ordering::Relaxed),
        }
    }
}

impl Collector for StorageMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let gauges = self.gauges.iter().flat_map(|(g, _)| g.desc());
        let counters = self.counters.iter().flat_map(|(c, _)| c.desc());
        gauges.chain(counters).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _one_at_a_time = self.scraping.lock();
        let snapshot = self.snapshot();
        let mut families = Vec::with_capacity(self.gauges.len() + self.counters.len());
        for (gauge, read) in &self.gauges {
            gauge.set(read(&snapshot));
            families.extend(gauge.collect());
        }
        for (counter, read) in &self.counters {
            set_counter(counter, read(&snapshot));
            families.extend(counter.collect());
        }
        families
    }
}
