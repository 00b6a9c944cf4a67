//! The log cleaner's decisions (docs/design.md §5 "Cleaner"): which segments to clean
//! ([`select`], LFS cost-benefit), when ([`CleanerPolicy::urgency`]), and where a pass
//! stands ([`CleaningPass`]). Pure and synchronous: no clock, no I/O, no locks.
//!
//! # How a pass runs
//! The appender drives passes between its batches (`appender`): it asks the policy
//! whether cleaning is due, plans a pass from the log's closed segments, then runs
//! bounded *steps* ([`ObjectStore::clean_step`](crate::ObjectStore::clean_step)): each
//! walks at most [`STEP_BYTES`] of the cleaned segments under the store lock, copies the
//! live entries into a survivor segment — an object is live when the index points at
//! it; a tombstone while the segment holding the object it deletes is still in the log
//! and will not be freed before the tombstone's own segment — and its bytes are
//! replicated like a write
//! batch. When a survivor is full (or the pass is done) the survivor is closed and the
//! pass *commits*: a digest without the finished segments and with the closed survivors
//! goes to the head's replicas; then the finished segments are freed, in memory and on
//! their backups. Each commit frees at least one segment, since a survivor holds any one
//! segment's live bytes (its header is smaller than a head's header and digest).
//!
//! # Why the appender runs the steps
//! The cleaner's copies are ordered with the writes around them by running between the
//! appender's batches, never inside one. A relocation racing a batch between its staging
//! and its publishing would break the tombstone rule: a remove staged against a copy in
//! segment A, the cleaner moving that object to survivor S, then A freed and the
//! tombstone (which names A) dropped while S still holds the deleted object — which a
//! recovery would bring back. The survivors' bytes also need the appender's replicator.
//! Reads go on during steps except for the lock hold of one step.
//!
//! Segments that hold a failed recovery's leftovers (*tainted*,
//! `ObjectStore::forget_unowned`) are chosen before any other, whatever they score.
//!
//! # Cost-benefit
//! LFS's choice: a segment of utilization `u` (live bytes over capacity) whose youngest
//! data is `age` old scores `(1 − u) · age / (1 + u)` — what cleaning it frees, times how
//! long that space is likely to stay free (old data changes less), over the cost of
//! reading it and writing its live part. Age is measured on the log clock (bytes
//! appended) so the choice is deterministic. With skewed writes, hot segments empty
//! fast and cold ones stay full: cost-benefit lets cold segments age instead of
//! cleaning them at high `u`, which is what makes skewed workloads cheaper to clean
//! than uniform ones.

use rampart_common::config::MasterConfig;
use rampart_common::ids::SegmentId;

use crate::segmented_log::{LogUsage, SegmentUsage, CLEANER_RESERVE_SEGMENTS};

/// Most bytes of cleaned segments one step walks (its lock hold: about a millisecond
/// of copying and index lookups for 100-byte objects).
pub const STEP_BYTES: usize = 1024 * 1024;

/// Most survivor segments one pass fills before a new choice is made. A pass needs one
/// free buffer at a time whatever its size (it commits each survivor as it fills), so
/// the bound only keeps the choice fresh; it must let a pass over nearly full segments
/// free one (at 95 % live, 20 segments into 19 survivors).
pub const PASS_SURVIVORS_MAX: u64 = 64;

/// Segments a pass aims to free: it stops choosing once its segments would free this
/// many. Small, so that each pass takes only the best segments of the moment: at 90 %
/// utilization a pass freeing 8 had to reach down to segments nearly as full as the
/// average (write cost 4.73 uniform, 2.87 Zipfian, against 4.45 and 2.51 with 2, in
/// `rampart bench cleaner`); a commit (one digest) per two segments freed is cheap.
pub const PASS_FREES_TARGET: u64 = 2;

/// When the cleaner runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CleanerPolicy {
    /// An idle master cleans once this share of the segment buffers holds segments.
    pub threshold: f64,
}

impl CleanerPolicy {
    /// The policy of a master configured with `config`
    /// ([`MasterConfig::cleaner_threshold_pct`], `--cleaner-threshold`).
    pub fn of(config: &MasterConfig) -> CleanerPolicy {
        CleanerPolicy {
            threshold: f64::from(config.cleaner_threshold_pct) / 100.0,
        }
    }
}

impl Default for CleanerPolicy {
    fn default() -> CleanerPolicy {
        CleanerPolicy::of(&MasterConfig::default())
    }
}

/// How pressing cleaning is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Urgency {
    /// Nothing to do.
    Idle,
    /// Clean a step between batches.
    Background,
    /// Writes are about to stop (at most one free buffer beyond the reserve): clean
    /// before the next batch, as long as cleaning frees anything.
    Urgent,
}

/// Free segments below which cleaning runs under load: a sixty-fourth of the memory,
/// and at least two beyond the cleaner's reserve.
pub fn low_water(segments_max: u64) -> u64 {
    (segments_max / 64).max(CLEANER_RESERVE_SEGMENTS + 2)
}

impl CleanerPolicy {
    /// How pressing cleaning is for a log at `usage`, when the master is `idle` (no
    /// write waiting) or not.
    ///
    /// Under load the cleaner runs late — once free segments fall to the
    /// [`low_water`] mark — because the longer a segment waits, the more of it is dead
    /// and the less cleaning it costs: cleaning as soon as memory passes the threshold
    /// keeps segments nearly full of live data, and at 90 % live data that costs about
    /// three times the copying (measured with `rampart bench cleaner`: write cost 13
    /// against 4). Idle time is free, so an idle master cleans from the threshold on
    /// (`threshold` of the segments in use), making room ahead of the next burst.
    pub fn urgency(&self, usage: &LogUsage, idle: bool) -> Urgency {
        if usage.segments_free <= CLEANER_RESERVE_SEGMENTS + 1 {
            return Urgency::Urgent;
        }
        if usage.segments_free <= low_water(usage.segments_max) {
            return Urgency::Background;
        }
        let used = usage.segments_max - usage.segments_free;
        if idle && used as f64 >= self.threshold * usage.segments_max as f64 {
            Urgency::Background
        } else {
            Urgency::Idle
        }
    }
}

/// The LFS cost-benefit score of a segment with `live_bytes` of `capacity` whose
/// youngest data is `age` old: `(1 − u) · age / (1 + u)`. Higher is better to clean.
pub fn cost_benefit(live_bytes: u64, capacity: u64, age: u64) -> f64 {
    let u = (live_bytes as f64 / capacity.max(1) as f64).min(1.0);
    (1.0 - u) * age as f64 / (1.0 + u)
}

/// Chooses the segments of a pass from `closed` (the log's closed segments), best
/// cost-benefit first, at the log clock `clock`: until they would free
/// [`PASS_FREES_TARGET`] segments or fill `survivors_max` survivors of
/// `survivor_capacity` bytes, and only if cleaning them frees at least one segment
/// (fewer survivors than cleaned segments). Empty when nothing is worth cleaning (every
/// segment is full of live data).
pub fn select(
    closed: &[SegmentUsage],
    clock: u64,
    segment_bytes: u64,
    survivor_capacity: u64,
    survivors_max: u64,
) -> Vec<SegmentId> {
    let mut ranked: Vec<(f64, &SegmentUsage)> = closed
        .iter()
        .map(|s| {
            // One byte of age at least, so that equally fresh segments still rank by u.
            let age = clock.saturating_sub(s.stamp).max(1);
            (cost_benefit(s.live_bytes, segment_bytes, age), s)
        })
        .filter(|(score, _)| *score > 0.0)
        .collect();
    // Best first; ties (and NaN, which cannot occur) by segment id for determinism.
    ranked.sort_by(|a, b| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.1.segment.cmp(&b.1.segment))
    });
    let capacity = survivor_capacity.max(1);
    let budget = survivors_max.max(1) * capacity;
    let mut chosen = Vec::new();
    let mut live = 0u64;
    for (_, segment) in ranked {
        if live + segment.live_bytes > budget {
            break;
        }
        live += segment.live_bytes;
        chosen.push(segment.segment);
        if chosen.len() as u64 >= live.div_ceil(capacity) + PASS_FREES_TARGET {
            break;
        }
    }
    let survivors = live.div_ceil(capacity);
    if (chosen.len() as u64) <= survivors {
        return Vec::new();
    }
    chosen
}

/// Where one cleaning pass stands: the segments it cleans, the position of the next
/// entry to look at, the survivor being filled, and which cleaned segments may be freed
/// at the next commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleaningPass {
    /// The segments to clean, in the order they are walked.
    segments: Vec<SegmentId>,
    /// Index into `segments` of the one being walked.
    next: usize,
    /// Offset of the next entry in it.
    offset: u32,
    /// The survivor being filled, if one is open.
    survivor: Option<SegmentId>,
    /// Walked segments whose last live entries may sit in the open survivor: freed only
    /// once it is closed.
    walked: Vec<SegmentId>,
    /// Walked segments whose every live entry is in a closed survivor: freed at the
    /// next commit.
    finished: Vec<SegmentId>,
    /// The youngest stamp among the cleaned segments (the survivors' stamp).
    stamp: u64,
    /// What the pass did so far.
    counts: PassCounts,
}

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Bytes of entries copied into survivors.
    pub bytes_relocated: u64,
    /// Bytes of entries dropped (dead).
    pub bytes_dropped: u64,
    /// Segments handed over for freeing.
    pub segments_cleaned: u64,
    /// Survivor segments closed.
    pub survivors: u64,
}

/// Where a step stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEnd {
    /// Its byte budget is spent; more of the pass remains.
    Budget,
    /// The survivor filled and was closed: commit before going on.
    SurvivorClosed,
    /// Every segment was walked and the last survivor closed: commit, and the pass ends.
    Done,
    /// A survivor was needed and no buffer is free: commit what is finished (if
    /// anything) and try again later.
    NoBuffer,
}

impl CleaningPass {
    /// A pass over `segments` (from [`select`]), whose youngest data has `stamp`.
    pub fn new(segments: Vec<SegmentId>, stamp: u64) -> CleaningPass {
        CleaningPass {
            segments,
            next: 0,
            offset: 0,
            survivor: None,
            walked: Vec::new(),
            finished: Vec::new(),
            stamp,
            counts: PassCounts::default(),
        }
    }

    /// The segment being walked and the offset of its next entry; `None` once every
    /// segment was walked.
    pub fn position(&self) -> Option<(SegmentId, u32)> {
        self.segments.get(self.next).map(|s| (*s, self.offset))
    }

    /// The next entry to look at starts at `offset` of the current segment.
    pub fn advance(&mut self, offset: u32) {
        self.offset = offset;
    }

    /// The current segment was walked to its end.
    pub fn segment_walked(&mut self) {
        if let Some(segment) = self.segments.get(self.next) {
            if self.survivor.is_some() {
                self.walked.push(*segment);
            } else {
                // Nothing of it went to a survivor that is still open.
                self.finished.push(*segment);
            }
        }
        self.next += 1;
        self.offset = 0;
    }

    /// Whether this pass walked `segment` before the one it walks now: that segment is
    /// freed at the same commit as the current one or earlier (commits free segments
    /// in the order they were walked), so a tombstone here for an object there dies
    /// with it. A segment of the pass not walked yet may outlive the current one (a
    /// commit comes whenever a survivor fills): a tombstone for an object there must
    /// be kept.
    pub fn walked_before(&self, segment: SegmentId) -> bool {
        self.segments[..self.next.min(self.segments.len())].contains(&segment)
    }

    /// The survivor being filled.
    pub fn survivor(&self) -> Option<SegmentId> {
        self.survivor
    }

    /// A survivor was opened.
    pub fn survivor_opened(&mut self, survivor: SegmentId) {
        debug_assert!(self.survivor.is_none(), "one survivor at a time");
        self.survivor = Some(survivor);
    }

    /// The open survivor was closed: what was walked into it may be freed.
    pub fn survivor_closed(&mut self) {
        if self.survivor.take().is_some() {
            self.counts.survivors += 1;
        }
        self.finished.append(&mut self.walked);
    }

    /// Takes the segments the next commit frees.
    pub fn take_finished(&mut self) -> Vec<SegmentId> {
        let finished = std::mem::take(&mut self.finished);
        self.counts.segments_cleaned += finished.len() as u64;
        finished
    }

    /// Gives back segments a commit could not free (it found no room for its digest).
    pub fn return_finished(&mut self, mut segments: Vec<SegmentId>) {
        self.counts.segments_cleaned -= segments.len() as u64;
        segments.append(&mut self.finished);
        self.finished = segments;
    }

    /// Whether every segment was walked, and nothing is left to commit.
    pub fn is_done(&self) -> bool {
        self.next >= self.segments.len()
            && self.survivor.is_none()
            && self.walked.is_empty()
            && self.finished.is_empty()
    }

    /// The stamp survivors of this pass carry.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// What the pass did so far.
    pub fn counts(&self) -> PassCounts {
        self.counts
    }

    /// Counts an entry copied into a survivor.
    pub fn note_relocated(&mut self, bytes: u64) {
        self.counts.bytes_relocated += bytes;
    }

    /// Counts an entry dropped.
    pub fn note_dropped(&mut self, bytes: u64) {
        self.counts.bytes_dropped += bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGMENT: u64 = 1000;

    fn usage(segment: u64, live_bytes: u64, stamp: u64) -> SegmentUsage {
        SegmentUsage {
            segment: SegmentId(segment),
            live_bytes,
            stamp,
        }
    }

    fn log_usage(segments_max: u64, segments_free: u64) -> LogUsage {
        LogUsage {
            segments_max,
            segments_free,
            live_bytes: 0,
            segment_bytes: SEGMENT as u32,
            clock: 0,
        }
    }

    #[test]
    fn cost_benefit_prefers_emptier_and_older_segments() {
        // Emptier is better at equal age; older is better at equal utilization.
        assert!(cost_benefit(100, SEGMENT, 50) > cost_benefit(500, SEGMENT, 50));
        assert!(cost_benefit(500, SEGMENT, 100) > cost_benefit(500, SEGMENT, 50));
        // The formula itself: u = 0.5, age 30 → 0.5 · 30 / 1.5 = 10.
        assert!((cost_benefit(500, SEGMENT, 30) - 10.0).abs() < 1e-9);
        // A full segment frees nothing; an empty one scores its age.
        assert_eq!(cost_benefit(SEGMENT, SEGMENT, 1_000), 0.0);
        assert!((cost_benefit(0, SEGMENT, 7) - 7.0).abs() < 1e-9);
        // An old, fuller segment can beat a young, emptier one: the point of the formula.
        assert!(cost_benefit(800, SEGMENT, 10_000) > cost_benefit(300, SEGMENT, 100));
    }

    #[test]
    fn select_takes_the_best_scores_first() {
        let closed = [
            usage(1, 900, 0),   // old but nearly full: 0.1·1000/1.9 ≈ 52
            usage(2, 200, 900), // young, emptyish: 0.8·100/1.2 ≈ 67
            usage(3, 500, 0),   // old, half full: 0.5·1000/1.5 ≈ 333
            usage(4, 950, 999), // young and full: ≈ 0.05
        ];
        let chosen = select(&closed, 1000, SEGMENT, SEGMENT, PASS_SURVIVORS_MAX);
        assert_eq!(chosen[..3], [SegmentId(3), SegmentId(2), SegmentId(1)]);
    }

    #[test]
    fn select_fills_at_most_the_pass_survivors() {
        let closed: Vec<SegmentUsage> = (1..=20).map(|s| usage(s, 700, 0)).collect();
        let chosen = select(&closed, 100, SEGMENT, SEGMENT, 4);
        // 4 survivors of 1000 bytes hold 5 segments 70 % full (freeing one, short of
        // the target).
        assert_eq!(chosen.len(), 5);
    }

    #[test]
    fn select_stops_once_the_pass_frees_its_target() {
        // Nearly empty segments: the pass stops at the target, not at the survivors.
        let closed: Vec<SegmentUsage> = (1..=100).map(|s| usage(s, 10, 0)).collect();
        let chosen = select(&closed, 100, SEGMENT, SEGMENT, PASS_SURVIVORS_MAX);
        assert_eq!(chosen.len() as u64, PASS_FREES_TARGET + 1);
        // Nearly full ones: as many as it takes to free one.
        let closed: Vec<SegmentUsage> = (1..=40).map(|s| usage(s, 940, 0)).collect();
        let chosen = select(&closed, 100, SEGMENT, SEGMENT, PASS_SURVIVORS_MAX);
        assert!(chosen.len() >= 17, "{}", chosen.len());
    }

    #[test]
    fn select_cleans_nothing_that_frees_nothing() {
        // Full segments: copying them all would take as many survivors.
        let full: Vec<SegmentUsage> = (1..=5).map(|s| usage(s, SEGMENT, 0)).collect();
        assert!(select(&full, 100, SEGMENT, SEGMENT, PASS_SURVIVORS_MAX).is_empty());
        // One segment alone never frees anything: its survivor takes its place.
        assert!(select(
            &[usage(1, 10, 0)],
            100,
            SEGMENT,
            SEGMENT,
            PASS_SURVIVORS_MAX
        )
        .is_empty());
        // Two at 60 % need two survivors of 1000: nothing gained either.
        assert!(select(
            &[usage(1, 600, 0), usage(2, 600, 0)],
            100,
            SEGMENT,
            SEGMENT,
            PASS_SURVIVORS_MAX
        )
        .is_empty());
        // Two at 40 % fit one survivor: one segment freed.
        assert_eq!(
            select(
                &[usage(1, 400, 0), usage(2, 400, 0)],
                100,
                SEGMENT,
                SEGMENT,
                PASS_SURVIVORS_MAX
            )
            .len(),
            2
        );
        assert!(select(&[], 100, SEGMENT, SEGMENT, PASS_SURVIVORS_MAX).is_empty());
    }

    #[test]
    fn urgency_follows_the_threshold_the_low_water_and_the_reserve() {
        let policy = CleanerPolicy::default();
        let urgency = |max, free, idle| policy.urgency(&log_usage(max, free), idle);
        // An idle master cleans from the threshold on.
        assert_eq!(urgency(1000, 500, true), Urgency::Idle);
        assert_eq!(urgency(1000, 101, true), Urgency::Idle);
        assert_eq!(urgency(1000, 100, true), Urgency::Background);
        // Under load, only from the low-water mark on.
        assert_eq!(low_water(1000), 15);
        assert_eq!(urgency(1000, 100, false), Urgency::Idle);
        assert_eq!(urgency(1000, 16, false), Urgency::Idle);
        assert_eq!(urgency(1000, 15, false), Urgency::Background);
        // Writes about to stop: urgent, idle or not.
        let last = CLEANER_RESERVE_SEGMENTS + 1;
        assert_eq!(urgency(1000, last + 1, false), Urgency::Background);
        assert_eq!(urgency(1000, last, false), Urgency::Urgent);
        assert_eq!(urgency(1000, 0, true), Urgency::Urgent);
        // A small memory keeps two segments beyond the reserve.
        assert_eq!(low_water(8), CLEANER_RESERVE_SEGMENTS + 2);
    }

    #[test]
    fn a_walked_segment_is_freed_only_once_its_survivor_is_closed() {
        let (a, b, c) = (SegmentId(1), SegmentId(2), SegmentId(3));
        let mut pass = CleaningPass::new(vec![a, b, c], 7);
        assert_eq!(pass.position(), Some((a, 0)));
        // Nothing of `a` was live: no survivor, finished at once.
        pass.segment_walked();
        assert_eq!(pass.position(), Some((b, 0)));
        assert!(pass.walked_before(a) && !pass.walked_before(b) && !pass.walked_before(c));
        pass.survivor_opened(SegmentId::survivor(0));
        pass.advance(40);
        assert_eq!(pass.position(), Some((b, 40)));
        pass.segment_walked();
        // `b`'s live entries are in the open survivor: not yet.
        assert_eq!(pass.take_finished(), vec![a]);
        pass.survivor_closed();
        assert_eq!(pass.take_finished(), vec![b]);
        assert!(!pass.is_done());
        pass.survivor_opened(SegmentId::survivor(1));
        pass.segment_walked();
        assert_eq!(pass.position(), None);
        assert!(!pass.is_done(), "the survivor holding c's entries is open");
        pass.survivor_closed();
        let last = pass.take_finished();
        assert_eq!(last, vec![c]);
        pass.return_finished(last);
        assert!(!pass.is_done());
        assert_eq!(pass.take_finished(), vec![c]);
        assert!(pass.is_done());
        assert_eq!(pass.counts().segments_cleaned, 3);
        assert_eq!(pass.counts().survivors, 2);
        assert!(pass.walked_before(b) && !pass.walked_before(SegmentId(4)));
    }
}
