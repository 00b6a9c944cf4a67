//! `Plan`: every decision of a recovery at scale, made by the code the cluster runs (see
//! the parent module's *What is real*): where each crashed master's replicas are, how
//! its will cuts it, which backup reads which segment in which order, and which
//! recovery master replays which partition.

use rampart_backup::recovery_reads::PartitionIndex;
use rampart_common::ids::{Epoch, KeyHash, SegmentId, ServerId, TableId};
use rampart_common::protocol::backup::{PartitionRanges, RecoveryReplica, ReplicaInfo};
use rampart_common::tablet::Tablet;
use rampart_coordinator::recovery_plan::{
    assign_partitions, check_log, choose_sources_by_speed, most_free, partitions_for, EpochFloors,
    FoundReplica,
};
use rampart_master::profiler::{Profiler, ProfilerConfig};
use rampart_master::replica_manager::backup_selector::{BackupInfo, BackupSelector};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashSet};

use super::model::{Host, Scenario};

/// The profiler tracks at most this many entries per crashed master; a larger log is
/// tracked in groups of entries at one hash each (see `will_of`).
pub const TRACKED_ENTRIES_MAX: u64 = 1 << 20;

/// Free log memory every recovery master reports (all alike: the plan then spreads
/// partitions by count, then by server id, as the real coordinator does).
const FREE_BYTES: u64 = 1 << 40;

/// The table every crashed master serves, whole.
const TABLE: TableId = TableId(1);

/// One crashed master's recovery, planned.
#[derive(Clone, Debug)]
pub struct CrashPlan {
    /// The crashed master.
    pub master: ServerId,
    /// Bytes of each segment read, in the order `check_log` listed them.
    pub segment_bytes: Vec<u64>,
    /// Segments (indexes into `segment_bytes`) each server's backup reads, in order;
    /// indexed by server (position in the cluster), empty for servers reading none.
    pub reads: Vec<Vec<usize>>,
    /// Each partition's share of the log's bytes (its true bytes / all bytes).
    pub fractions: Vec<f64>,
    /// Each partition's true bytes.
    pub partition_bytes: Vec<u64>,
    /// The recovery master (position in the cluster) of each partition.
    pub masters: Vec<usize>,
    /// Distinct sets of backups holding one of its segments.
    pub copysets: usize,
}

/// Every crashed master's recovery, and the cluster around them.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Each server's disk read bandwidth, bytes per ns.
    pub disk_bytes_per_ns: Vec<f64>,
    /// The crashed servers (positions).
    pub crashed: Vec<usize>,
    /// One per crashed master.
    pub crashes: Vec<CrashPlan>,
}

/// The server at position `i` (ids start at 1, as the coordinator's do).
fn id_of(i: usize) -> ServerId {
    ServerId(i as u64 + 1)
}

impl Plan {
    /// Plans the recovery of `scenario` (checked by the caller).
    pub fn build(scenario: &Scenario) -> Result<Plan, String> {
        let mut rng = SmallRng::seed_from_u64(scenario.seed);
        let n = scenario.servers;
        let disk_mbps: Vec<f64> = (0..n)
            .map(|_| {
                let spread = scenario.disk_spread;
                let factor = if spread > 0.0 {
                    rng.gen_range(1.0 - spread..=1.0 + spread)
                } else {
                    1.0
                };
                scenario.disk_read_mbps * factor
            })
            .collect();
        let racks = if scenario.racks == 0 {
            n
        } else {
            scenario.racks
        };
        let backups: Vec<BackupInfo> = (0..n)
            .map(|i| BackupInfo {
                id: id_of(i),
                failure_domain: format!("rack-{}", i % racks),
                disk_read_mbps: disk_mbps[i].round().max(1.0) as u32,
            })
            .collect();
        let crashed: Vec<usize> = (0..scenario.crashed).collect();
        let live: Vec<usize> = (scenario.crashed..n).collect();
        // Free memory is alike, so `most_free` orders recovery masters by id.
        // Like the coordinator: the `recovery_masters_max` with the most free memory.
        let mut recovery_masters: Vec<(ServerId, u64)> = most_free(
            live.iter().map(|&i| (id_of(i), FREE_BYTES)).collect(),
            |id| *id,
        );
        if scenario.recovery_masters_max > 0 {
            recovery_masters.truncate(scenario.recovery_masters_max);
        }
        let crashes = crashed
            .iter()
            .map(|&m| {
                plan_crash(
                    scenario,
                    m,
                    &backups,
                    &live,
                    &recovery_masters,
                    rng.gen::<u64>(),
                )
            })
            .collect::<Result<Vec<_>, String>>()?;
        let disk_bytes_per_ns = match scenario.host {
            Host::PerServer { .. } => disk_mbps.iter().map(|mbps| mbps * 1e6 / 1e9).collect(),
            // A local cluster reads from memory; the copy is part of the split's cost.
            Host::Shared { .. } => vec![f64::INFINITY; n],
        };
        Ok(Plan {
            disk_bytes_per_ns,
            crashed,
            crashes,
        })
    }
}

/// Plans the recovery of the master at position `m`.
fn plan_crash(
    scenario: &Scenario,
    m: usize,
    backups: &[BackupInfo],
    live: &[usize],
    recovery_masters: &[(ServerId, u64)],
    seed: u64,
) -> Result<CrashPlan, String> {
    let master = id_of(m);
    let segment_count = scenario.master_bytes.div_ceil(scenario.segment_bytes);
    let last_bytes = scenario.master_bytes - (segment_count - 1) * scenario.segment_bytes;
    let segment_ids: Vec<SegmentId> = (1..=segment_count).map(SegmentId).collect();

    // Placement, as the master made it while every server was up.
    let mut selector = BackupSelector::new(master, seed).with_candidates(scenario.candidates);
    selector.update_backups(backups);
    let mut placed: Vec<Vec<ServerId>> = Vec::with_capacity(segment_ids.len());
    for _ in &segment_ids {
        let chosen = selector
            .select(scenario.replicas, &HashSet::new())
            .map_err(|e| e.explain())?;
        placed.push(chosen);
    }
    let copysets = placed
        .iter()
        .map(|set| {
            let mut set = set.clone();
            set.sort_unstable();
            set
        })
        .collect::<BTreeSet<_>>()
        .len();

    // What the live backups list: every replica not on a crashed server. The head is
    // open, with the digest naming every segment; the others closed.
    let position_of_live: std::collections::HashMap<ServerId, usize> = live
        .iter()
        .enumerate()
        .map(|(at, &i)| (id_of(i), at))
        .collect();
    let mut found = Vec::new();
    for (s, holders) in segment_ids.iter().zip(&placed) {
        let head = s.0 == segment_count;
        let length = if head {
            last_bytes
        } else {
            scenario.segment_bytes
        };
        for holder in holders {
            let Some(&backup) = position_of_live.get(holder) else {
                continue;
            };
            found.push(FoundReplica {
                backup,
                replica: RecoveryReplica {
                    info: ReplicaInfo {
                        master,
                        segment: *s,
                        epoch: Epoch(1),
                        length: length as u32,
                        closed: !head,
                    },
                    digest: head.then(|| segment_ids.clone()),
                    successor: None,
                },
            });
        }
    }
    let floors = EpochFloors::new();
    let segments = check_log(&found, &floors, false, false)
        .map_err(|incomplete| format!("{master}'s log cannot be recovered: {}", incomplete.why))?;
    // The coordinator knows each backup's disk speed from the server list.
    let speeds: Vec<u32> = live.iter().map(|&i| backups[i].disk_read_mbps).collect();
    let read_plan = choose_sources_by_speed(&segments, &found, &floors, &speeds);
    let index_of = |s: SegmentId| (s.0 - 1) as usize;
    let segment_bytes: Vec<u64> = segments
        .iter()
        .map(|s| {
            if s.0 == segment_count {
                last_bytes
            } else {
                scenario.segment_bytes
            }
        })
        .collect();
    let mut reads = vec![Vec::new(); scenario.servers];
    for (backup, list) in &read_plan.reads {
        reads[live[*backup]] = list.iter().map(|&s| index_of(s)).collect();
    }

    // The will, from the real profiler over the master's entries, cut by the
    // coordinator to what the master owns (the whole table).
    let tablet = Tablet {
        table: TABLE,
        start_hash: 0,
        end_hash: u64::MAX,
        owner: master,
    };
    let (partitions, partition_bytes) = will_of(scenario, &tablet, seed)?;
    let total: u64 = partition_bytes.iter().sum();
    let fractions: Vec<f64> = partition_bytes
        .iter()
        .map(|&b| b as f64 / total.max(1) as f64)
        .collect();
    let bounds: Vec<u64> = partitions.iter().map(|(_, bound)| *bound).collect();
    let assigned = assign_partitions(&bounds, recovery_masters)
        .ok_or_else(|| "no recovery master is left".to_string())?;
    let masters = assigned
        .iter()
        .map(|&at| (recovery_masters[at].0 .0 - 1) as usize)
        .collect();
    Ok(CrashPlan {
        master,
        segment_bytes,
        reads,
        fractions,
        partition_bytes,
        masters,
        copysets,
    })
}

/// A recovery's partitions, each with its will's byte bound (`partitions_for`).
type Partitions = Vec<(PartitionRanges, u64)>;

/// The crashed master's partitions (the coordinator's `partitions_for` over the will
/// the real `Profiler` computes) and each one's true bytes. The profiler tracks the
/// master's entries at random key hashes; past [`TRACKED_ENTRIES_MAX`] entries it tracks
/// groups of `g` entries at one hash each and cuts the will at `records_max / g`, so
/// that record limits bind as they would (only the spread of hashes is coarser).
fn will_of(
    scenario: &Scenario,
    tablet: &Tablet,
    seed: u64,
) -> Result<(Partitions, Vec<u64>), String> {
    let entries = (scenario.master_bytes / scenario.entry_bytes).max(1);
    let group = entries.div_ceil(TRACKED_ENTRIES_MAX);
    let tracked = entries.div_ceil(group);
    let bytes_each = scenario.master_bytes / tracked;
    let mut profiler = Profiler::new(ProfilerConfig::for_partitions(
        scenario.partition_bytes,
        scenario.partition_records,
    ));
    profiler.take_tablet(tablet);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x05ee_d0f5_ca1e);
    let hashes: Vec<u64> = (0..tracked).map(|_| rng.gen()).collect();
    for &hash in &hashes {
        profiler.track(TABLE, KeyHash(hash), bytes_each);
    }
    let records_max = (scenario.partition_records / group).max(1);
    let will = profiler.will(scenario.partition_bytes, records_max);
    let partitions = partitions_for(Some(&will), std::slice::from_ref(tablet));
    let ranges: Vec<_> = partitions.iter().map(|(r, _)| r.clone()).collect();
    let index = PartitionIndex::new(&ranges).map_err(|e| {
        format!(
            "the backups refuse the recovery's {} partitions: {e} (raise the partition limits)",
            ranges.len()
        )
    })?;
    let mut bytes = vec![0u64; partitions.len()];
    for &hash in &hashes {
        let Some(p) = index.partition_of(TABLE, KeyHash(hash)) else {
            return Err(format!("hash {hash:#x} is in no partition of the will"));
        };
        bytes[p as usize] += bytes_each;
    }
    Ok((partitions, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(servers: usize, gib: f64) -> Scenario {
        Scenario {
            segment_bytes: 1 << 20,
            ..Scenario::cluster(servers, gib)
        }
    }

    #[test]
    fn every_segment_is_read_once_from_a_live_backup() {
        let scenario = Scenario {
            crashed: 2,
            ..small(20, 0.25)
        };
        let plan = Plan::build(&scenario).unwrap();
        for crash in &plan.crashes {
            let mut read: Vec<usize> = crash.reads.iter().flatten().copied().collect();
            read.sort_unstable();
            assert_eq!(read, (0..crash.segment_bytes.len()).collect::<Vec<_>>());
            for &dead in &plan.crashed {
                assert!(
                    crash.reads[dead].is_empty(),
                    "a crashed backup reads nothing"
                );
                assert!(
                    !crash.masters.contains(&dead),
                    "a crashed server replays nothing"
                );
            }
        }
    }

    #[test]
    fn the_will_covers_the_log_within_its_limits() {
        let scenario = small(30, 0.5);
        let plan = Plan::build(&scenario).unwrap();
        let crash = &plan.crashes[0];
        let total: u64 = crash.partition_bytes.iter().sum();
        let expected = scenario.master_bytes / scenario.entry_bytes * scenario.entry_bytes;
        assert!(
            total.abs_diff(expected) < scenario.entry_bytes * 1024,
            "{total} vs {expected}"
        );
        // 512 MiB in partitions of at most 48 MiB, at least ~92 % full.
        assert!(
            (11..=13).contains(&crash.partition_bytes.len()),
            "{:?}",
            crash.partition_bytes
        );
        assert!(crash
            .partition_bytes
            .iter()
            .all(|&b| b <= scenario.partition_bytes));
        // Distinct recovery masters first.
        let distinct: BTreeSet<_> = crash.masters.iter().collect();
        assert_eq!(distinct.len(), crash.masters.len());
    }

    #[test]
    fn refined_placement_spreads_primaries_better_than_random() {
        // One crashed master of 8 GiB on 100 servers: reads are balanced by
        // `choose_sources_by_speed` over all copies, so compare the primaries' spread directly.
        let spread = |candidates: usize| {
            let scenario = Scenario {
                candidates,
                ..Scenario::cluster(100, 8.0)
            };
            let plan = Plan::build(&scenario).unwrap();
            plan.crashes[0].reads.iter().map(Vec::len).max().unwrap()
        };
        assert!(
            spread(5) <= spread(1),
            "refined {} random {}",
            spread(5),
            spread(1)
        );
    }
}
