//! Recovery planning: the pure decisions of a crashed master's recovery (DESIGN.md §6
//! step 1), each a function of what the backups and the state reported, tested alone.
//!
//! * [`check_log`] — is the crashed master's log complete, judged from the replicas the
//!   backups listed? Which segments does the recovery replay?
//! * [`choose_sources`] — which replica of each segment is read, by which backup, with
//!   which fallbacks.
//! * [`partitions_for`] — the crashed master's will cut to the tablets it still owns.
//! * [`assign_partitions`] — which recovery master replays which partition.
//!
//! The async driver that calls them is `coordinator::recovery`.

use rampart_common::ids::{SegmentId, ServerId, TableId};
use rampart_common::protocol::backup::{PartitionRanges, RecoveryReplica};
use rampart_common::tablet::Tablet;
use rampart_common::will::Will;
use std::collections::{BTreeMap, BTreeSet};

/// The crashed master's partitions: its will's partitions cut to the tablets it still
/// owns (a partition recovered already, or a tablet dropped, falls away), plus one
/// partition per owned range the will does not cover (no will uploaded yet, or tablets
/// taken after the last upload). Each partition's ranges are sorted and disjoint; empty
/// partitions are left out. Returns each partition with its will's byte bound (0 when
/// unknown).
pub fn partitions_for(will: Option<&Will>, owned: &[Tablet]) -> Vec<(PartitionRanges, u64)> {
    let mut owned: Vec<(TableId, u64, u64)> = owned
        .iter()
        .map(|t| (t.table, t.start_hash, t.end_hash))
        .collect();
    owned.sort_unstable();
    let mut partitions = Vec::new();
    // What of `owned` the will covers, to find the rest afterwards.
    let mut covered: Vec<(TableId, u64, u64)> = Vec::new();
    for partition in will.map(|w| w.partitions.as_slice()).unwrap_or_default() {
        let mut ranges = Vec::new();
        for &(table, start, end) in &partition.tablets {
            for &(t, s, e) in &owned {
                if t == table && s <= end && start <= e {
                    ranges.push((table, s.max(start), e.min(end)));
                }
            }
        }
        ranges.sort_unstable();
        if !ranges.is_empty() {
            covered.extend(ranges.iter().copied());
            partitions.push((ranges, partition.bytes));
        }
    }
    covered.sort_unstable();
    for (table, start, end) in owned {
        // The parts of [start, end] no covered range holds.
        let mut at = Some(start);
        for &(t, s, e) in covered.iter().filter(|c| c.0 == table) {
            let Some(from) = at else { break };
            if e < from || s > end {
                continue;
            }
            if s > from {
                partitions.push((vec![(t, from, s - 1)], 0));
            }
            at = e.checked_add(1).filter(|next| *next <= end);
        }
        if let Some(from) = at {
            partitions.push((vec![(table, from, end)], 0));
        }
    }
    partitions
}

/// One replica reported by backup number `backup` (an index into the caller's list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundReplica {
    /// Which backup holds it.
    pub backup: usize,
    /// What it reported.
    pub replica: RecoveryReplica,
}

/// Why a log cannot be recovered whole yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incomplete {
    /// Segments known to belong to the log that no backup holds.
    pub missing: Vec<SegmentId>,
    /// What is wrong, for the log and `RecoveryStatus`.
    pub why: String,
}

/// Checks that the replicas found hold the whole log (DESIGN.md §4 "Digests"): returns
/// the segments to replay, in id order. Replicas with no valid bytes do not count (a
/// segment opened but never written). With `allow_loss`, an incomplete log yields what
/// was found (the digest's segments that exist, or every segment found when there is no
/// digest).
pub fn check_log(found: &[FoundReplica], allow_loss: bool) -> Result<Vec<SegmentId>, Incomplete> {
    let usable: Vec<&FoundReplica> = found.iter().filter(|f| f.replica.info.length > 0).collect();
    let held: BTreeSet<SegmentId> = usable.iter().map(|f| f.replica.info.segment).collect();
    let everything = || held.iter().copied().collect::<Vec<_>>();
    let Some(&head) = held.last() else {
        return Err(Incomplete {
            missing: Vec::new(),
            why: "no backup holds any replica of this master's log".to_string(),
        });
    };
    let head_replicas: Vec<&&FoundReplica> = usable
        .iter()
        .filter(|f| f.replica.info.segment == head)
        .collect();
    if head_replicas.iter().any(|f| f.replica.info.closed) {
        let successor = SegmentId(head.0 + 1);
        if allow_loss {
            return Ok(everything());
        }
        return Err(Incomplete {
            missing: vec![successor],
            why: format!(
                "{head} is closed but no backup holds its successor {successor}: the log's \
                 head is missing"
            ),
        });
    }
    let digest = head_replicas
        .iter()
        .filter_map(|f| f.replica.digest.as_ref().map(|d| (f.replica.info.epoch, d)))
        .max_by_key(|(epoch, _)| *epoch)
        .map(|(_, digest)| digest);
    let Some(digest) = digest else {
        if allow_loss {
            return Ok(everything());
        }
        return Err(Incomplete {
            missing: Vec::new(),
            why: format!("no replica of the head {head} holds its log digest"),
        });
    };
    let missing: Vec<SegmentId> = digest
        .iter()
        .filter(|s| !held.contains(s))
        .copied()
        .collect();
    if missing.is_empty() || allow_loss {
        let mut segments: Vec<SegmentId> = digest
            .iter()
            .filter(|s| held.contains(s))
            .copied()
            .collect();
        segments.sort_unstable();
        segments.dedup();
        return Ok(segments);
    }
    let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
    Err(Incomplete {
        why: format!(
            "no backup holds {} of the {} segments in the log digest of {head}: {}",
            missing.len(),
            digest.len(),
            names.join(", ")
        ),
        missing,
    })
}

/// Where each segment is read: the replica each backup reads, in order, and for each
/// segment the backups to ask (the chosen one first, then fallbacks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadPlan {
    /// Segments each backup (by index) reads, in order.
    pub reads: BTreeMap<usize, Vec<SegmentId>>,
    /// Per segment, in expected-availability order: the backups holding a usable replica,
    /// the chosen one first.
    pub sources: Vec<(SegmentId, Vec<usize>)>,
}

/// Chooses one replica of each segment to read, spreading the reads evenly over the
/// backups. Only replicas of a segment's newest epoch are used (an older epoch is a copy
/// its master replaced and may lack acknowledged writes); among them a closed replica
/// is preferred, then the longest valid prefix (an open head). Each backup reads its
/// share in segment order; the sources are listed in the order the reads should
/// complete (round by round over the backups), which is the order recovery masters ask.
pub fn choose_sources(segments: &[SegmentId], found: &[FoundReplica]) -> ReadPlan {
    let mut by_segment: BTreeMap<SegmentId, Vec<&FoundReplica>> = BTreeMap::new();
    for f in found.iter().filter(|f| f.replica.info.length > 0) {
        by_segment
            .entry(f.replica.info.segment)
            .or_default()
            .push(f);
    }
    let mut load: BTreeMap<usize, usize> = BTreeMap::new();
    let mut plan = ReadPlan::default();
    let mut chosen_at: Vec<(usize, usize, SegmentId, Vec<usize>)> = Vec::new();
    for &segment in segments {
        let Some(replicas) = by_segment.get(&segment) else {
            continue;
        };
        let newest = replicas.iter().map(|f| f.replica.info.epoch).max();
        let mut candidates: Vec<&FoundReplica> = replicas
            .iter()
            .filter(|f| Some(f.replica.info.epoch) == newest)
            .copied()
            .collect();
        // Best first: closed, then longer.
        candidates.sort_by_key(|f| {
            (
                !f.replica.info.closed,
                std::cmp::Reverse(f.replica.info.length),
                f.backup,
            )
        });
        let Some(best) = candidates.first() else {
            continue;
        };
        let (best_closed, best_length) = (best.replica.info.closed, best.replica.info.length);
        // Equally good replicas: spread them by load.
        let chosen = candidates
            .iter()
            .filter(|f| {
                f.replica.info.closed == best_closed
                    && (best_closed || f.replica.info.length == best_length)
            })
            .min_by_key(|f| (load.get(&f.backup).copied().unwrap_or(0), f.backup))
            .map_or(best.backup, |f| f.backup);
        let position = load.entry(chosen).or_insert(0);
        let round = *position;
        *position += 1;
        plan.reads.entry(chosen).or_default().push(segment);
        let mut backups = vec![chosen];
        let mut seen = BTreeSet::from([chosen]);
        for f in &candidates {
            if seen.insert(f.backup) {
                backups.push(f.backup);
            }
        }
        chosen_at.push((round, chosen, segment, backups));
    }
    chosen_at.sort_by_key(|(round, backup, segment, _)| (*round, *backup, *segment));
    plan.sources = chosen_at
        .into_iter()
        .map(|(_, _, segment, backups)| (segment, backups))
        .collect();
    plan
}

/// Assigns partitions (by their byte bounds) to recovery masters (by their free log
/// memory): each partition goes to the master with the fewest partitions so far, then
/// the most memory left, so partitions spread over distinct masters first. Returns, per
/// partition, an index into `masters`; `None` when `masters` is empty.
pub fn assign_partitions(bytes: &[u64], masters: &[(ServerId, u64)]) -> Option<Vec<usize>> {
    if masters.is_empty() {
        return None;
    }
    let mut order: Vec<usize> = (0..bytes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(bytes[i]));
    let mut count = vec![0usize; masters.len()];
    let mut free: Vec<u64> = masters.iter().map(|m| m.1).collect();
    let mut assigned = vec![0; bytes.len()];
    for i in order {
        let best = (0..masters.len())
            .min_by_key(|&m| (count[m], std::cmp::Reverse(free[m]), masters[m].0))
            .unwrap_or(0);
        assigned[i] = best;
        count[best] += 1;
        free[best] = free[best].saturating_sub(bytes[i]);
    }
    Some(assigned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::protocol::backup::ReplicaInfo;
    use rampart_common::will::Partition;

    const T: TableId = TableId(7);

    fn replica(backup: usize, segment: u64, epoch: u64, length: u32, closed: bool) -> FoundReplica {
        FoundReplica {
            backup,
            replica: RecoveryReplica {
                info: ReplicaInfo {
                    master: ServerId(9),
                    segment: SegmentId(segment),
                    epoch,
                    length,
                    closed,
                },
                digest: None,
            },
        }
    }

    fn with_digest(mut f: FoundReplica, digest: &[u64]) -> FoundReplica {
        f.replica.digest = Some(digest.iter().map(|&s| SegmentId(s)).collect());
        f
    }

    fn ids(segments: &[u64]) -> Vec<SegmentId> {
        segments.iter().map(|&s| SegmentId(s)).collect()
    }

    #[test]
    fn check_log_accepts_a_complete_log() {
        let found = vec![
            replica(0, 1, 0, 100, true),
            replica(1, 1, 0, 100, true),
            replica(1, 2, 0, 100, true),
            with_digest(replica(2, 3, 0, 50, false), &[1, 2, 3]),
            with_digest(replica(0, 3, 0, 40, false), &[1, 2, 3]),
        ];
        assert_eq!(check_log(&found, false), Ok(ids(&[1, 2, 3])));
    }

    #[test]
    fn check_log_waits_for_a_segment_of_the_digest() {
        let found = vec![
            replica(0, 1, 0, 100, true),
            with_digest(replica(2, 3, 0, 50, false), &[1, 2, 3]),
        ];
        let incomplete = check_log(&found, false).expect_err("segment 2 is missing");
        assert_eq!(incomplete.missing, ids(&[2]));
        assert!(incomplete.why.contains("segment-2"), "{}", incomplete.why);
        // The operator allows the loss: what exists is replayed.
        assert_eq!(check_log(&found, true), Ok(ids(&[1, 3])));
    }

    #[test]
    fn check_log_waits_for_the_successor_of_a_closed_head() {
        // Crash right after a rollover: segment 2's replicas were lost, segment 1 is closed.
        let found = vec![replica(0, 1, 0, 100, true), replica(1, 1, 0, 100, true)];
        let incomplete = check_log(&found, false).expect_err("head missing");
        assert_eq!(incomplete.missing, ids(&[2]));
    }

    #[test]
    fn check_log_ignores_a_new_head_with_nothing_written() {
        let found = vec![
            with_digest(replica(0, 1, 0, 100, false), &[1]),
            replica(1, 2, 0, 0, false),
        ];
        assert_eq!(check_log(&found, false), Ok(ids(&[1])));
    }

    #[test]
    fn check_log_without_any_replica_waits() {
        let incomplete = check_log(&[], false).expect_err("nothing found");
        assert!(incomplete.why.contains("no backup"), "{}", incomplete.why);
    }

    #[test]
    fn choose_sources_spreads_reads_and_keeps_fallbacks() {
        let mut found = Vec::new();
        for segment in 1..=6 {
            for backup in 0..3 {
                found.push(replica(backup, segment, 0, 100, true));
            }
        }
        let plan = choose_sources(&ids(&[1, 2, 3, 4, 5, 6]), &found);
        for backup in 0..3 {
            assert_eq!(plan.reads.get(&backup).map(Vec::len), Some(2), "{plan:?}");
        }
        assert_eq!(plan.sources.len(), 6);
        for (_, backups) in &plan.sources {
            assert_eq!(backups.len(), 3, "chosen first, then two fallbacks");
        }
        // First round: one segment from each backup.
        let first_round: BTreeSet<usize> = plan.sources[..3].iter().map(|(_, b)| b[0]).collect();
        assert_eq!(first_round.len(), 3);
    }

    #[test]
    fn choose_sources_prefers_the_newest_epoch_then_closed_then_longest() {
        let found = vec![
            replica(0, 1, 1, 100, true),
            replica(1, 1, 2, 80, false),
            replica(2, 1, 2, 90, false),
        ];
        let plan = choose_sources(&ids(&[1]), &found);
        assert_eq!(plan.sources, vec![(SegmentId(1), vec![2, 1])]);
    }

    #[test]
    fn partitions_follow_the_will_cut_to_owned_tablets() {
        let owned = vec![
            Tablet {
                table: T,
                start_hash: 0,
                end_hash: 999,
                owner: ServerId(9),
            },
            Tablet {
                table: TableId(8),
                start_hash: 0,
                end_hash: u64::MAX,
                owner: ServerId(9),
            },
        ];
        let will = Will {
            bytes_max: 100,
            records_max: 100,
            partitions: vec![
                Partition {
                    tablets: vec![(T, 0, 499)],
                    bytes: 60,
                    records: 1,
                },
                Partition {
                    // Part of it was recovered already (hashes 1000..).
                    tablets: vec![(T, 500, 1999)],
                    bytes: 70,
                    records: 1,
                },
            ],
        };
        let partitions = partitions_for(Some(&will), &owned);
        assert_eq!(
            partitions,
            vec![
                (vec![(T, 0, 499)], 60),
                (vec![(T, 500, 999)], 70),
                // Not in the will: a partition of its own.
                (vec![(TableId(8), 0, u64::MAX)], 0),
            ]
        );
        // Without a will: one partition per tablet.
        assert_eq!(partitions_for(None, &owned).len(), 2);
    }

    #[test]
    fn partitions_cover_gaps_the_will_leaves() {
        let owned = vec![Tablet {
            table: T,
            start_hash: 0,
            end_hash: 1000,
            owner: ServerId(9),
        }];
        let will = Will {
            bytes_max: 100,
            records_max: 100,
            partitions: vec![Partition {
                tablets: vec![(T, 100, 200)],
                bytes: 1,
                records: 1,
            }],
        };
        let mut ranges: Vec<(TableId, u64, u64)> = partitions_for(Some(&will), &owned)
            .into_iter()
            .flat_map(|(r, _)| r)
            .collect();
        ranges.sort_unstable();
        assert_eq!(ranges, vec![(T, 0, 99), (T, 100, 200), (T, 201, 1000)]);
    }

    #[test]
    fn assign_partitions_spreads_over_masters_then_by_memory() {
        let masters = vec![(ServerId(1), 100), (ServerId(2), 300), (ServerId(3), 200)];
        let assigned = assign_partitions(&[10, 10, 10, 10], &masters).expect("masters");
        let mut counts = [0; 3];
        for m in &assigned {
            counts[*m] += 1;
        }
        assert_eq!(counts, [1, 2, 1], "the fourth goes to the most free memory");
        assert_eq!(assign_partitions(&[1], &[]), None);
    }
}
