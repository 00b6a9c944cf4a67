//! Recovery planning: the pure decisions of a crashed master's recovery (docs/design.md §6
//! step 1), each a function of what the backups and the state reported, tested alone.
//!
//! * [`check_log`] — is the crashed master's log complete, judged from the replicas the
//!   backups listed? Which segments does the recovery replay?
//! * [`choose_sources_by_speed`] — which replica of each segment is read, by which
//!   backup (by its disk's speed), with which fallbacks.
//! * [`partitions_for`] — the crashed master's will cut to the tablets it still owns.
//! * [`assign_partitions`] — which recovery master replays which partition.
//!
//! The async driver that calls them is `coordinator::recovery_manager`.
//!
//! # Which copy of a segment
//! A master's log is append-only and never rewritten: every byte of a segment is written
//! once, at one offset, and every replica of the segment — whatever its epoch, on
//! whichever backup — receives a prefix of that one stream (the valid prefix a scan
//! finds ends at a checksum the master wrote). So copies never contradict each other;
//! they differ only in how much of the stream they hold. A write is acknowledged once
//! every replica the master is *currently* writing holds it. The rules follow:
//!
//! 1. **A copy holding the footer is the whole segment**, whatever its epoch (a closed
//!    replica, or an open one whose scan saw the `SegmentFooter`).
//! 2. **Otherwise the longest valid prefix wins** — not the newest epoch. A replica the
//!    master re-created at a new epoch and died while filling holds a shorter prefix
//!    than the survivors at the old epoch, which hold every acknowledged write.
//! 3. **Copies the master replaced are excluded by epoch.** When a replica of the open
//!    segment is lost, the master fills a replacement at a new epoch e′, moves the
//!    survivors to e′, and records e′ at the coordinator (`SetOpenEpoch`) before it
//!    acknowledges anything more. From then on a copy below e′ without the footer may
//!    lack acknowledged writes (it stopped receiving them), so it does not count, even
//!    if it is the only copy found: the segment is then *missing*, and the recovery waits
//!    (or, with `allow-loss`, reads it as the best there is). Before e′ is recorded
//!    nothing was acknowledged that the old copies lack, so they count.
//! 4. **Two below the head, only the footer counts.** A rollover replicates the opening
//!    of n + 1 (header, digest), then the footer of n, then data of n + 1, each range on
//!    every current replica before the next is sent; n + 2 is opened only after data went
//!    into n + 1. So the footer of n is on every current replica before anything of
//!    n + 2 is written anywhere: when a segment ≥ n + 2 exists, an open copy of n without
//!    its footer was replaced while n was open (or written to disk at a graceful stop of
//!    its backup before the master moved on), and is not the log.
//! 5. **A copy that holds less than the chosen one is no fallback**: a recovery master
//!    falling back to it would silently replay less than the plan decided. A segment
//!    whose every equally good copy fails makes that partition's replay fail, and the
//!    next attempt plans again from what the backups then report.
//! 6. **A survivor segment counts only whole.** The cleaner writes its survivors
//!    (ids from `SegmentId::SURVIVOR_FIRST` up, outside the head chain) completely,
//!    footer included, on every current replica before it appends the digest that names
//!    them; so a copy without the footer was replaced or cut short and never counts.
//!    Survivors are never the head, and their footers name no successor in the log.
//!    A survivor no digest names (the master crashed before the digest was written) is
//!    not part of the log: the cleaned segments it copied are still in the digest.
//!
//! **A zombie's stale copy.** A master declared crashed may still run for a while. It
//! cannot add acknowledged writes to any copy: its current replicas are fenced before
//! they are listed, a replacement it places after that must be moved to a new epoch on
//! the fenced survivors (refused) or, if none survive, recorded at the coordinator
//! (refused: it is no longer `Up`). Bytes it managed to place on a backup that the
//! recovery did not reach are still a prefix of its one stream, so at worst rule 2
//! replays writes it never acknowledged — allowed, as their clients never heard back —
//! and never one that contradicts an acknowledged write. A copy it abandoned earlier is
//! shorter, or excluded by rules 3 and 4.

use rampart_common::ids::{Epoch, SegmentId, ServerId};
use rampart_common::protocol::backup::{PartitionRanges, RecoveryReplica};
use rampart_common::tablet::{HashRange, Tablet};
use rampart_common::will::Will;
use std::collections::{BTreeMap, BTreeSet};

/// The crashed master's partitions: its will's partitions cut to the tablets it still
/// owns (a partition recovered already, or a tablet dropped, falls away), plus one
/// partition per owned range the will does not cover (no will uploaded yet, or tablets
/// taken after the last upload). Each partition's ranges are sorted and disjoint; empty
/// partitions are left out. Returns each partition with its will's byte bound (0 when
/// unknown).
pub fn partitions_for(will: Option<&Will>, owned: &[Tablet]) -> Vec<(PartitionRanges, u64)> {
    let mut owned: Vec<HashRange> = owned.iter().map(Tablet::range).collect();
    owned.sort_unstable();
    let mut partitions = Vec::new();
    // What of `owned` the will covers, to find the rest afterwards.
    let mut covered: Vec<HashRange> = Vec::new();
    for partition in will.map(|w| w.partitions.as_slice()).unwrap_or_default() {
        let mut ranges = Vec::new();
        for willed in &partition.tablets {
            for range in owned.iter().filter(|range| range.overlaps(willed)) {
                let start = range.start.max(willed.start);
                ranges.push(HashRange::new(
                    range.table,
                    start,
                    range.end.min(willed.end),
                ));
            }
        }
        ranges.sort_unstable();
        if !ranges.is_empty() {
            covered.extend(ranges.iter().copied());
            partitions.push((ranges, partition.bytes));
        }
    }
    covered.sort_unstable();
    for HashRange { table, start, end } in owned {
        // The parts of [start, end] no covered range holds.
        let mut at = Some(start);
        for covered in covered.iter().filter(|c| c.table == table) {
            let Some(from) = at else { break };
            if covered.end < from || covered.start > end {
                continue;
            }
            if covered.start > from {
                let gap = HashRange::new(table, from, covered.start - 1);
                partitions.push((vec![gap], 0));
            }
            at = covered.end.checked_add(1).filter(|next| *next <= end);
        }
        if let Some(from) = at {
            partitions.push((vec![HashRange::new(table, from, end)], 0));
        }
    }
    partitions
}

/// Partitions of at least twice this many bytes (by their will's bound) are split to
/// give recovery masters that would have none a share ([`spread_over`]); smaller ones
/// are not worth the split's costs (more pieces for the backups to cut and send).
pub const SPLIT_BYTES_MIN: u64 = 8 << 20;

/// `partitions` (from [`partitions_for`]) spread over `masters` recovery masters: while
/// there are fewer partitions than masters, the largest one of at least
/// 2 × [`SPLIT_BYTES_MIN`] is cut in two halves of its key hashes, each given half its
/// byte bound (keys hash uniformly). A small master's will may hold one partition of
/// 48 MiB, which one recovery master would replay alone while the others idle.
pub fn spread_over(
    mut partitions: Vec<(PartitionRanges, u64)>,
    masters: usize,
) -> Vec<(PartitionRanges, u64)> {
    while partitions.len() < masters {
        let largest = (0..partitions.len())
            .filter(|&i| partitions[i].1 >= 2 * SPLIT_BYTES_MIN)
            .max_by_key(|&i| (partitions[i].1, std::cmp::Reverse(i)));
        let Some(i) = largest else { break };
        let Some((first, second)) = halve(&partitions[i].0) else {
            break;
        };
        let bytes = partitions[i].1;
        partitions[i] = (first, bytes / 2);
        partitions.push((second, bytes - bytes / 2));
    }
    partitions
}

/// `ranges` (sorted, disjoint) cut into two parts of about half their key hashes each;
/// `None` when they hold a single hash.
fn halve(ranges: &[HashRange]) -> Option<(PartitionRanges, PartitionRanges)> {
    let span = |r: &HashRange| u128::from(r.end) - u128::from(r.start) + 1;
    let total: u128 = ranges.iter().map(span).sum();
    if total < 2 {
        return None;
    }
    // Hashes still to put in the first part: at least 1, fewer than all.
    let mut left = total / 2;
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for range in ranges {
        let span = span(range);
        if left == 0 {
            second.push(*range);
        } else if span <= left {
            first.push(*range);
            left -= span;
        } else {
            // 0 < left < span ≤ 2^64: the cut falls inside this range.
            let cut = range.start + (left - 1) as u64;
            first.push(HashRange::new(range.table, range.start, cut));
            second.push(HashRange::new(range.table, cut + 1, range.end));
            left = 0;
        }
    }
    Some((first, second))
}

/// One replica reported by backup number `backup` (an index into the caller's list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundReplica {
    /// Which backup holds it.
    pub backup: usize,
    /// What it reported.
    pub replica: RecoveryReplica,
}

impl FoundReplica {
    fn segment(&self) -> SegmentId {
        self.replica.info.segment
    }

    fn length(&self) -> u32 {
        self.replica.info.length
    }

    /// The successor its footer names, if its valid prefix holds one: every closed
    /// replica (the footer is written before the close, naming `segment + 1`), and an
    /// open copy whose scan saw it.
    fn successor(&self) -> Option<SegmentId> {
        if self.replica.info.closed {
            Some(SegmentId(self.segment().0 + 1))
        } else {
            self.replica.successor
        }
    }

    /// Whether it holds the whole segment: its footer.
    fn complete(&self) -> bool {
        self.successor().is_some()
    }
}

/// Epochs the crashed master recorded at the coordinator for segments whose open replicas
/// it re-created (`SetOpenEpoch`): copies of those segments at an older epoch were
/// replaced while the segment was open, and may lack acknowledged writes.
pub type EpochFloors = BTreeMap<SegmentId, Epoch>;

/// Why a log cannot be recovered whole yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incomplete {
    /// Segments known to belong to the log that no backup holds.
    pub missing: Vec<SegmentId>,
    /// What is wrong, for the log and `RecoveryStatus`.
    pub why: String,
}

/// The replicas found, judged by the rules of the module doc ("Which copy of a
/// segment").
struct LogView<'a> {
    /// Replicas with a valid prefix, by segment.
    by_segment: BTreeMap<SegmentId, Vec<&'a FoundReplica>>,
    floors: &'a EpochFloors,
    /// The highest segment any replica holds.
    head: Option<SegmentId>,
}

/// Why a segment's copies do not count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unusable {
    /// No replica with a valid prefix was found.
    Absent,
    /// Only copies older than the epoch its master recorded.
    Stale { floor: Epoch },
    /// Only open copies without the footer, below the head's predecessor: the footer
    /// reached every replica its master was writing before the head existed.
    NoFooter,
}

impl<'a> LogView<'a> {
    fn new(found: &'a [FoundReplica], floors: &'a EpochFloors) -> LogView<'a> {
        let mut by_segment: BTreeMap<SegmentId, Vec<&FoundReplica>> = BTreeMap::new();
        for f in found.iter().filter(|f| f.length() > 0) {
            by_segment.entry(f.segment()).or_default().push(f);
        }
        // Survivor segments are never the head: their ids lie above the head chain's.
        let head = by_segment
            .keys()
            .rev()
            .find(|segment| !segment.is_survivor())
            .copied();
        LogView {
            by_segment,
            floors,
            head,
        }
    }

    /// The copies of `segment` that hold every write acknowledged in it, best first
    /// (complete ones, then longer ones); or why there are none.
    fn usable(&self, segment: SegmentId) -> Result<Vec<&'a FoundReplica>, Unusable> {
        let Some(copies) = self.by_segment.get(&segment) else {
            return Err(Unusable::Absent);
        };
        if segment.is_survivor() {
            // Written whole and closed before any digest named it (rule 6).
            let mut whole: Vec<&FoundReplica> =
                copies.iter().copied().filter(|f| f.complete()).collect();
            if whole.is_empty() {
                return Err(Unusable::NoFooter);
            }
            rank(&mut whole);
            return Ok(whole);
        }
        let floor = self.floors.get(&segment).copied().unwrap_or_default();
        let two_below_head = self
            .head
            .is_some_and(|head| segment.0.saturating_add(2) <= head.0);
        let mut usable: Vec<&FoundReplica> = copies
            .iter()
            .copied()
            .filter(|f| f.complete() || (f.replica.info.epoch >= floor && !two_below_head))
            .collect();
        if usable.is_empty() {
            let stale = copies.iter().any(|f| f.replica.info.epoch < floor);
            return Err(if two_below_head && !stale {
                Unusable::NoFooter
            } else {
                Unusable::Stale { floor }
            });
        }
        rank(&mut usable);
        Ok(usable)
    }

    /// The copies of `segment` a recovery that accepts loss reads: the usable ones, or
    /// else whatever holds a valid prefix (a stale prefix beats nothing).
    fn best_effort(&self, segment: SegmentId) -> Vec<&'a FoundReplica> {
        self.usable(segment).unwrap_or_else(|_| {
            let mut copies = self.by_segment.get(&segment).cloned().unwrap_or_default();
            rank(&mut copies);
            copies
        })
    }
}

/// Sorts copies of one segment best first: complete, then longer, then by backup.
fn rank(copies: &mut [&FoundReplica]) {
    copies.sort_by_key(|f| (!f.complete(), std::cmp::Reverse(f.length()), f.backup));
}

/// Checks that the replicas found hold the whole log (docs/design.md §4 "Digests", and the
/// module doc): returns the segments to replay, in id order. The head is the highest
/// head-chain segment (not a survivor) any replica holds; it needs a usable copy, every footer found needs its
/// successor, and every segment of the head's digest needs a usable copy. With
/// `allow_loss`, an incomplete log yields what was found (the digest's segments that
/// exist, every segment found when there is no digest, nothing when no replica exists at
/// all: the crashed master's tablets then come back empty). `never_wrote` says the
/// crashed master never reserved a version (its ceiling is 0), so it never acknowledged
/// a write: finding no replica of its log, it too is recovered empty.
pub fn check_log(
    found: &[FoundReplica],
    floors: &EpochFloors,
    allow_loss: bool,
    never_wrote: bool,
) -> Result<Vec<SegmentId>, Incomplete> {
    let view = LogView::new(found, floors);
    let everything = || view.by_segment.keys().copied().collect::<Vec<_>>();
    let Some(head) = view.head else {
        if allow_loss || never_wrote {
            return Ok(Vec::new());
        }
        return Err(Incomplete {
            missing: Vec::new(),
            why: "no backup holds any replica of this master's log".to_string(),
        });
    };
    let mut missing: BTreeMap<SegmentId, String> = BTreeMap::new();
    let mut note = |segment: SegmentId, why: Unusable| {
        let why = match why {
            Unusable::Absent => "no backup holds it".to_string(),
            Unusable::Stale { floor } => format!(
                "only copies older than epoch {floor}, which its master recorded after \
                 replacing them"
            ),
            Unusable::NoFooter => "only open copies without its footer".to_string(),
        };
        missing.entry(segment).or_insert(why);
    };
    let head_copies = view.usable(head);
    if let Err(why) = head_copies {
        note(head, why);
    }
    // Every footer found needs its successor: one past the head is missing for sure
    // (a successor below the head is checked against the digest, or was cleaned).
    for copy in found
        .iter()
        .filter(|f| f.length() > 0 && !f.segment().is_survivor())
    {
        if let Some(successor) = copy.successor().filter(|s| *s > head) {
            note(successor, Unusable::Absent);
        }
    }
    let digest = head_copies
        .as_ref()
        .ok()
        .and_then(|copies| copies.iter().find_map(|f| f.replica.digest.as_ref()));
    let Some(digest) = digest else {
        if allow_loss {
            return Ok(everything());
        }
        if missing.is_empty() {
            return Err(Incomplete {
                missing: Vec::new(),
                why: format!("no replica of the head {head} holds its log digest"),
            });
        }
        return Err(incomplete(missing, head, None));
    };
    for &segment in digest {
        if let Err(why) = view.usable(segment) {
            note(segment, why);
        }
    }
    if missing.is_empty() || allow_loss {
        let mut segments: Vec<SegmentId> = digest
            .iter()
            .filter(|s| view.by_segment.contains_key(s))
            .copied()
            .collect();
        segments.sort_unstable();
        segments.dedup();
        return Ok(segments);
    }
    Err(incomplete(missing, head, Some(digest.len())))
}

/// The [`Incomplete`] naming each missing segment and why.
fn incomplete(
    missing: BTreeMap<SegmentId, String>,
    head: SegmentId,
    digest_len: Option<usize>,
) -> Incomplete {
    let names: Vec<String> = missing
        .iter()
        .map(|(segment, why)| format!("{segment} ({why})"))
        .collect();
    let of = digest_len.map_or(String::new(), |len| {
        format!(" of the {len} segments in the log digest of {head}")
    });
    Incomplete {
        why: format!(
            "{} segment(s){of} cannot be recovered whole: {}",
            missing.len(),
            names.join(", ")
        ),
        missing: missing.into_keys().collect(),
    }
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
/// backups; [`choose_sources_by_speed`] with every disk alike.
pub fn choose_sources(
    segments: &[SegmentId],
    found: &[FoundReplica],
    floors: &EpochFloors,
) -> ReadPlan {
    choose_sources_by_speed(segments, found, floors, &[])
}

/// Chooses one replica of each segment to read, spreading the reads over the backups by
/// their disks' read bandwidth (`disk_read_mbps[b]` for backup `b`, MB/s; 0 or missing:
/// unknown, counted as the median of the known ones, or all alike when none is known).
/// Among a segment's usable copies (module doc) one holding the footer wins, otherwise
/// the longest valid prefix; copies as good as it share the reads and are its
/// fallbacks, and a copy that holds less is never read (it would silently lose what the
/// chosen one holds beyond it). A segment with no usable copy (a recovery the operator
/// let lose data) is read from its best copy.
///
/// Each read goes to the equal copy whose backup would finish its share soonest with
/// it: the smallest (reads so far + 1) / bandwidth (ties: fewer reads, then the lower
/// index). The replicas' placement balanced each master's *primaries* by disk speed
/// (`BackupSelector`), but a recovery reads whichever equal copy balances best, so
/// without the speeds here a disk 30 % slower than the rest would get as many reads as
/// any and hold up the whole recovery (`rampart simulate`: 1,000 servers with disks
/// ±30 %, 64 GiB replayed at 1.40 s by count, 1.14 s by speed). Each backup reads its
/// share in segment order; the sources are listed in the order the reads should
/// complete (by each read's expected end, (its position in its backup's list + 1) /
/// bandwidth), which is the order recovery masters ask.
pub fn choose_sources_by_speed(
    segments: &[SegmentId],
    found: &[FoundReplica],
    floors: &EpochFloors,
    disk_read_mbps: &[u32],
) -> ReadPlan {
    let mut known: Vec<u32> = disk_read_mbps.iter().copied().filter(|&m| m > 0).collect();
    known.sort_unstable();
    let fallback = known.get(known.len() / 2).copied().unwrap_or(1);
    let speed = |backup: usize| {
        f64::from(
            disk_read_mbps
                .get(backup)
                .copied()
                .filter(|&m| m > 0)
                .unwrap_or(fallback),
        )
    };
    let view = LogView::new(found, floors);
    let mut load: BTreeMap<usize, usize> = BTreeMap::new();
    let mut plan = ReadPlan::default();
    let mut chosen_at: Vec<(f64, usize, SegmentId, Vec<usize>)> = Vec::new();
    for &segment in segments {
        let candidates = view.best_effort(segment);
        let Some(best) = candidates.first() else {
            continue;
        };
        // As good as the best: complete like it, or (open) as long.
        let equal: Vec<&FoundReplica> = candidates
            .iter()
            .copied()
            .filter(|f| {
                f.complete() == best.complete() && (best.complete() || f.length() >= best.length())
            })
            .collect();
        let finish =
            |backup: usize| (load.get(&backup).copied().unwrap_or(0) + 1) as f64 / speed(backup);
        let chosen = equal
            .iter()
            .min_by(|a, b| {
                finish(a.backup)
                    .total_cmp(&finish(b.backup))
                    .then_with(|| load.get(&a.backup).cmp(&load.get(&b.backup)))
                    .then_with(|| a.backup.cmp(&b.backup))
            })
            .map_or(best.backup, |f| f.backup);
        let end = finish(chosen);
        *load.entry(chosen).or_insert(0) += 1;
        plan.reads.entry(chosen).or_default().push(segment);
        let mut backups = vec![chosen];
        let mut seen = BTreeSet::from([chosen]);
        for f in &equal {
            if seen.insert(f.backup) {
                backups.push(f.backup);
            }
        }
        chosen_at.push((end, chosen, segment, backups));
    }
    chosen_at.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then_with(|| a.1.cmp(&b.1))
            .then_with(|| a.2.cmp(&b.2))
    });
    plan.sources = chosen_at
        .into_iter()
        .map(|(_, _, segment, backups)| (segment, backups))
        .collect();
    plan
}

/// `masters`, given with their free log memory, most of it first; ties go to the lower
/// id (`id` names a master).
pub fn most_free<M>(mut masters: Vec<(M, u64)>, id: impl Fn(&M) -> ServerId) -> Vec<(M, u64)> {
    masters.sort_by_key(|(m, free)| (std::cmp::Reverse(*free), id(m)));
    masters
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
    use rampart_common::ids::TableId;
    use rampart_common::protocol::backup::ReplicaInfo;
    use rampart_common::will::Partition;

    const T: TableId = TableId(7);

    #[test]
    fn partitions_are_halved_by_hash_until_every_master_has_one() {
        let mib = 1u64 << 20;
        let whole = vec![HashRange::new(T, 0, u64::MAX)];
        let spread = spread_over(vec![(whole, 48 * mib)], 4);
        assert_eq!(spread.len(), 4);
        let total: u64 = spread.iter().map(|p| p.1).sum();
        assert_eq!(total, 48 * mib, "the bounds add up");
        assert!(spread.iter().all(|p| p.1 == 12 * mib), "{spread:?}");
        // Together they cover the hashes once, in order.
        let mut ranges: Vec<HashRange> = spread.iter().flat_map(|p| p.0.clone()).collect();
        ranges.sort_unstable();
        assert_eq!(ranges.first().map(|r| r.start), Some(0));
        assert_eq!(ranges.last().map(|r| r.end), Some(u64::MAX));
        for pair in ranges.windows(2) {
            assert_eq!(pair[0].end + 1, pair[1].start, "{ranges:?}");
        }
    }

    #[test]
    fn small_partitions_and_enough_of_them_are_left_alone() {
        let mib = 1u64 << 20;
        let one = |start, end, bytes| (vec![HashRange::new(T, start, end)], bytes);
        let small = vec![one(0, 99, 15 * mib)];
        assert_eq!(
            spread_over(small.clone(), 4),
            small,
            "under 2 × SPLIT_BYTES_MIN"
        );
        let unknown = vec![one(0, 99, 0)];
        assert_eq!(
            spread_over(unknown.clone(), 4),
            unknown,
            "no bound, no split"
        );
        let enough = vec![one(0, 99, 48 * mib), one(100, 199, 48 * mib)];
        assert_eq!(spread_over(enough.clone(), 2), enough);
        // One hash cannot be cut.
        let single = vec![one(5, 5, 48 * mib)];
        assert_eq!(spread_over(single.clone(), 4), single);
        // Two ranges: the cut falls where half the hashes lie.
        let two = vec![(
            vec![HashRange::new(T, 0, 9), HashRange::new(T, 20, 29)],
            32 * mib,
        )];
        let halves = spread_over(two, 2);
        assert_eq!(halves[0].0, vec![HashRange::new(T, 0, 9)]);
        assert_eq!(halves[1].0, vec![HashRange::new(T, 20, 29)]);
        let odd = vec![(vec![HashRange::new(T, 0, 10)], 32 * mib)];
        let halves = spread_over(odd, 2);
        assert_eq!(halves[0].0, vec![HashRange::new(T, 0, 4)]);
        assert_eq!(halves[1].0, vec![HashRange::new(T, 5, 10)]);
    }

    fn replica(backup: usize, segment: u64, epoch: u64, length: u32, closed: bool) -> FoundReplica {
        FoundReplica {
            backup,
            replica: RecoveryReplica {
                info: ReplicaInfo {
                    master: ServerId(9),
                    segment: SegmentId(segment),
                    epoch: Epoch(epoch),
                    length,
                    closed,
                },
                digest: None,
                successor: None,
            },
        }
    }

    /// `f` with a footer naming `successor` in its valid prefix (an open copy).
    fn with_footer(mut f: FoundReplica, successor: u64) -> FoundReplica {
        f.replica.successor = Some(SegmentId(successor));
        f
    }

    fn no_floors() -> EpochFloors {
        EpochFloors::new()
    }

    fn floors(pairs: &[(u64, u64)]) -> EpochFloors {
        pairs
            .iter()
            .map(|&(s, e)| (SegmentId(s), Epoch(e)))
            .collect()
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
        assert_eq!(
            check_log(&found, &no_floors(), false, false),
            Ok(ids(&[1, 2, 3]))
        );
    }

    /// The id of survivor `n` as a raw number, for the helpers above.
    fn survivor(n: u64) -> u64 {
        SegmentId::survivor(n).0
    }

    #[test]
    fn a_survivor_no_digest_names_is_not_the_head_and_not_replayed() {
        // Crash after the cleaner wrote survivor 0 (whole, closed) and before the digest
        // naming it: the head is still segment 3, whose digest keeps the cleaned 1.
        let found = vec![
            replica(0, 1, 0, 100, true),
            replica(1, 2, 0, 100, true),
            with_digest(replica(2, 3, 0, 50, false), &[1, 2, 3]),
            replica(0, survivor(0), 0, 80, true),
            // A survivor cut short (open, no footer) is no head either.
            replica(1, survivor(1), 0, 20, false),
        ];
        assert_eq!(
            check_log(&found, &no_floors(), false, false),
            Ok(ids(&[1, 2, 3]))
        );
    }

    #[test]
    fn a_later_digest_naming_a_whole_survivor_replaces_the_cleaned_segment() {
        let found = vec![
            replica(1, 2, 0, 100, true),
            with_digest(replica(2, 3, 0, 70, false), &[survivor(0), 2, 3]),
            replica(0, survivor(0), 0, 80, true),
            // The survivor's frame that saw its footer counts too.
            with_footer(replica(1, survivor(0), 0, 80, false), survivor(0) + 1),
        ];
        assert_eq!(
            check_log(&found, &no_floors(), false, false),
            Ok(vec![SegmentId(2), SegmentId(3), SegmentId::survivor(0)])
        );
    }

    #[test]
    fn a_named_survivor_counts_only_with_its_footer() {
        let found = vec![
            replica(1, 2, 0, 100, true),
            with_digest(replica(2, 3, 0, 70, false), &[survivor(0), 2, 3]),
            replica(0, survivor(0), 5, 60, false),
        ];
        let incomplete = check_log(&found, &no_floors(), false, false)
            .expect_err("the survivor's only copy lacks its footer");
        assert_eq!(incomplete.missing, vec![SegmentId::survivor(0)]);
        assert!(incomplete.why.contains("survivor-0"), "{}", incomplete.why);
    }

    #[test]
    fn check_log_waits_for_a_segment_of_the_digest() {
        let found = vec![
            replica(0, 1, 0, 100, true),
            with_digest(replica(2, 3, 0, 50, false), &[1, 2, 3]),
        ];
        let incomplete =
            check_log(&found, &no_floors(), false, false).expect_err("segment 2 is missing");
        assert_eq!(incomplete.missing, ids(&[2]));
        assert!(incomplete.why.contains("segment-2"), "{}", incomplete.why);
        // The operator allows the loss: what exists is replayed.
        assert_eq!(
            check_log(&found, &no_floors(), true, false),
            Ok(ids(&[1, 3]))
        );
    }

    #[test]
    fn check_log_waits_for_the_successor_of_a_closed_head() {
        // Crash right after a rollover: segment 2's replicas were lost, segment 1 is closed.
        let found = vec![replica(0, 1, 0, 100, true), replica(1, 1, 0, 100, true)];
        let incomplete = check_log(&found, &no_floors(), false, false).expect_err("head missing");
        assert_eq!(incomplete.missing, ids(&[2]));
    }

    #[test]
    fn check_log_ignores_a_new_head_with_nothing_written() {
        let found = vec![
            with_digest(replica(0, 1, 0, 100, false), &[1]),
            replica(1, 2, 0, 0, false),
        ];
        assert_eq!(check_log(&found, &no_floors(), false, false), Ok(ids(&[1])));
    }

    #[test]
    fn check_log_without_any_replica_waits() {
        let incomplete = check_log(&[], &no_floors(), false, false).expect_err("nothing found");
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
        let plan = choose_sources(&ids(&[1, 2, 3, 4, 5, 6]), &found, &no_floors());
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
    fn choose_sources_by_speed_gives_a_faster_disk_more_reads() {
        // 12 segments on 3 backups each; backup 0 reads twice as fast as 1 and 2.
        let mut found = Vec::new();
        for segment in 1..=12 {
            for backup in 0..3 {
                found.push(replica(backup, segment, 0, 100, true));
            }
        }
        let segments: Vec<u64> = (1..=12).collect();
        let plan = choose_sources_by_speed(&ids(&segments), &found, &no_floors(), &[200, 100, 100]);
        let reads = |b: usize| plan.reads.get(&b).map_or(0, Vec::len);
        assert_eq!((reads(0), reads(1), reads(2)), (6, 3, 3), "{plan:?}");
        // In order of expected completion: the fast disk's second read ends with the
        // slow ones' first.
        assert_eq!(plan.sources[0].1[0], 0);
        // Unknown speeds count as the median; none known: by count, as `choose_sources`.
        let unknown = choose_sources_by_speed(&ids(&segments), &found, &no_floors(), &[0, 0, 0]);
        assert_eq!(
            unknown,
            choose_sources(&ids(&segments), &found, &no_floors())
        );
        for backup in 0..3 {
            assert_eq!(unknown.reads.get(&backup).map(Vec::len), Some(4));
        }
    }

    #[test]
    fn choose_sources_prefers_a_closed_copy_then_the_longest_prefix_whatever_its_epoch() {
        // Every copy of a segment is a prefix of one append-only stream: the closed one
        // holds all of it, whatever its epoch.
        let found = vec![
            replica(0, 1, 1, 100, true),
            replica(1, 1, 2, 80, false),
            replica(2, 1, 2, 90, false),
        ];
        let plan = choose_sources(&ids(&[1]), &found, &no_floors());
        assert_eq!(plan.sources, vec![(SegmentId(1), vec![0])]);
        // Without it, the longest prefix; a shorter copy is no fallback (it would lose
        // what the chosen one holds beyond it).
        let plan = choose_sources(&ids(&[1]), &found[1..], &no_floors());
        assert_eq!(plan.sources, vec![(SegmentId(1), vec![2])]);
    }

    #[test]
    fn choose_sources_prefers_complete_copies_to_a_newer_one_cut_short() {
        // The master lost a replica of its open segment, re-created it at epoch 2 on
        // backup 2 and died halfway through copying the segment there: backup 2 holds a
        // valid but shorter prefix; the survivors at epoch 1 hold every acknowledged
        // write (the master had not yet recorded epoch 2, so epoch 1 is still allowed).
        let found = vec![
            with_digest(replica(0, 1, 1, 1000, false), &[1]),
            with_digest(replica(1, 1, 1, 1000, false), &[1]),
            with_digest(replica(2, 1, 2, 600, false), &[1]),
        ];
        assert_eq!(check_log(&found, &no_floors(), false, false), Ok(ids(&[1])));
        let plan = choose_sources(&ids(&[1]), &found, &no_floors());
        assert_eq!(plan.sources.len(), 1);
        let (_, backups) = &plan.sources[0];
        assert!(
            !backups.contains(&2),
            "the copy cut short must be neither chosen nor a fallback: {backups:?}"
        );
        assert_eq!(backups.len(), 2);
    }

    #[test]
    fn choose_sources_skips_copies_older_than_the_recorded_epoch() {
        // Epoch 2 was recorded: the copy left at epoch 1 (on a backup thought dead, or
        // written to disk at a graceful stop) may lack writes acknowledged since, even
        // if it happens to be as long.
        let found = vec![
            with_digest(replica(0, 3, 1, 900, false), &[3]),
            with_digest(replica(1, 3, 2, 800, false), &[3]),
        ];
        let floors = floors(&[(3, 2)]);
        assert_eq!(check_log(&found, &floors, false, false), Ok(ids(&[3])));
        let plan = choose_sources(&ids(&[3]), &found, &floors);
        assert_eq!(plan.sources, vec![(SegmentId(3), vec![1])]);
    }

    #[test]
    fn check_log_waits_when_the_head_has_only_copies_older_than_its_recorded_epoch() {
        // Every copy at the recorded epoch is unreachable; the stale one alone would
        // silently lose the writes acknowledged after it was replaced.
        let found = vec![
            replica(0, 1, 1, 100, true),
            replica(1, 2, 1, 100, true),
            with_digest(replica(2, 3, 1, 500, false), &[1, 2, 3]),
        ];
        let floors = floors(&[(3, 2)]);
        let incomplete = check_log(&found, &floors, false, false).expect_err("head stale");
        assert_eq!(incomplete.missing, ids(&[3]));
        assert!(incomplete.why.contains("epoch"), "{}", incomplete.why);
        // The operator accepts the loss: the stale copy is better than nothing.
        assert_eq!(check_log(&found, &floors, true, false), Ok(ids(&[1, 2, 3])));
        let plan = choose_sources(&ids(&[1, 2, 3]), &found, &floors);
        assert_eq!(plan.sources.len(), 3);
    }

    #[test]
    fn check_log_waits_for_the_successor_of_a_footer_in_an_open_copy() {
        // Segment 1's footer reached its frames but no close did, and segment 2 (whose
        // header and digest went out before that footer) is on backups that are down.
        let found = vec![
            with_footer(with_digest(replica(0, 1, 1, 100, false), &[1]), 2),
            with_footer(with_digest(replica(1, 1, 1, 100, false), &[1]), 2),
        ];
        let incomplete = check_log(&found, &no_floors(), false, false).expect_err("head missing");
        assert_eq!(incomplete.missing, ids(&[2]));
        assert_eq!(check_log(&found, &no_floors(), true, false), Ok(ids(&[1])));
    }

    #[test]
    fn check_log_needs_a_copy_with_the_footer_of_every_segment_two_below_the_head() {
        // Segment 3 exists, so segment 1's footer was on every replica before segment
        // 3's header was written anywhere: an open copy of 1 without its footer is one
        // its master replaced (here, written to disk at a graceful stop), not the log.
        let found = vec![
            replica(0, 1, 1, 60, false),
            replica(1, 2, 1, 100, true),
            with_digest(replica(2, 3, 1, 50, false), &[1, 2, 3]),
        ];
        let incomplete = check_log(&found, &no_floors(), false, false).expect_err("segment 1");
        assert_eq!(incomplete.missing, ids(&[1]));
        // With a copy that holds the footer, the log is whole, and that copy is read.
        let mut found = found;
        found.push(with_footer(replica(2, 1, 1, 100, false), 2));
        assert_eq!(
            check_log(&found, &no_floors(), false, false),
            Ok(ids(&[1, 2, 3]))
        );
        let plan = choose_sources(&ids(&[1, 2, 3]), &found, &no_floors());
        assert!(plan.sources.contains(&(SegmentId(1), vec![2])), "{plan:?}");
    }

    #[test]
    fn check_log_accepts_an_open_predecessor_of_a_head_holding_only_its_opening() {
        // The master died between opening segment 2 and writing segment 1's footer:
        // segment 1 is complete without it.
        let found = vec![
            with_digest(replica(0, 1, 1, 100, false), &[1]),
            with_digest(replica(1, 2, 1, 40, false), &[1, 2]),
        ];
        assert_eq!(
            check_log(&found, &no_floors(), false, false),
            Ok(ids(&[1, 2]))
        );
    }

    #[test]
    fn check_log_of_a_master_that_never_reserved_a_version_and_left_no_replica_is_empty() {
        // It crashed before its log's opening reached its backups (it reserves versions
        // only after that): it never acknowledged a write, so nothing can be lost.
        assert_eq!(check_log(&[], &no_floors(), false, true), Ok(Vec::new()));
        // One that did reserve left a log somewhere: wait for it.
        assert!(check_log(&[], &no_floors(), false, false).is_err());
        // Replicas found are judged as always.
        let found = vec![replica(0, 1, 1, 100, true)];
        assert!(check_log(&found, &no_floors(), false, true).is_err());
    }

    #[test]
    fn check_log_with_allow_loss_and_no_replica_at_all_recovers_nothing() {
        // A master that never wrote (or whose open segments all died with it): the
        // operator's consent lets the recovery finish, its tablets coming back empty.
        assert_eq!(check_log(&[], &no_floors(), true, false), Ok(Vec::new()));
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
                    tablets: vec![HashRange::new(T, 0, 499)],
                    bytes: 60,
                    records: 1,
                },
                Partition {
                    // Part of it was recovered already (hashes 1000..).
                    tablets: vec![HashRange::new(T, 500, 1999)],
                    bytes: 70,
                    records: 1,
                },
            ],
        };
        let partitions = partitions_for(Some(&will), &owned);
        assert_eq!(
            partitions,
            vec![
                (vec![HashRange::new(T, 0, 499)], 60),
                (vec![HashRange::new(T, 500, 999)], 70),
                // Not in the will: a partition of its own.
                (vec![HashRange::whole(TableId(8))], 0),
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
                tablets: vec![HashRange::new(T, 100, 200)],
                bytes: 1,
                records: 1,
            }],
        };
        let mut ranges: Vec<HashRange> = partitions_for(Some(&will), &owned)
            .into_iter()
            .flat_map(|(r, _)| r)
            .collect();
        ranges.sort_unstable();
        assert_eq!(
            ranges,
            vec![
                HashRange::new(T, 0, 99),
                HashRange::new(T, 100, 200),
                HashRange::new(T, 201, 1000)
            ]
        );
    }

    #[test]
    fn most_free_ranks_by_memory_left_then_id() {
        let masters = vec![(ServerId(1), 100), (ServerId(3), 300), (ServerId(2), 300)];
        let ranked: Vec<u64> = most_free(masters, |&id| id)
            .into_iter()
            .map(|(id, _)| id.0)
            .collect();
        assert_eq!(ranked, [2, 3, 1]);
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
