//! The order of the replicator's calls, as cores both drivers follow (the async
//! `Replicator` and the simulation's master): what writing one sealed range involves
//! ([`RangeWrite`]), what creating one replica involves ([`Creation`]), and what upkeep
//! between batches does, in which order ([`Upkeep`]). Each decides; its driver carries
//! out the steps it names (with `Settling` for each [`RangeStep::Settle`]) and reports
//! back. Pure and synchronous.

use rampart_common::ids::{Epoch, SegmentId, ServerId};
use std::collections::{BTreeMap, VecDeque};
use std::ops::{Add, Sub};
use std::time::Duration;

use super::backup_selector::BackupSelector;
use super::placement;
use super::replica_failures::ReplicaFailures;
use super::segment_replicas::{Abandoned, Replica, SegmentReplicas};
use crate::segmented_log::SegmentRange;

/// A step of writing one range ([`RangeWrite::next`]).
#[derive(Debug, PartialEq, Eq)]
pub enum RangeStep {
    /// Settle the segment until every replica is live and current (`Settling` with
    /// `Patience::UntilDone`): before the range, every replica must hold what precedes
    /// it (and a re-created open segment's epoch must be recorded); after a loss, the
    /// replacements must hold as much as the survivors.
    Settle,
    /// Write the range's bytes to every live replica, at the range's start; then
    /// [`RangeWrite::written`], the failures booked already.
    Write {
        /// Where the bytes go in the segment.
        offset: u32,
    },
    /// The range closed the segment: close these replicas (now or in the background,
    /// answering `SegmentReplicas::close_answered`).
    Close {
        /// Their slots.
        slots: Vec<usize>,
    },
    /// The range is on every replica.
    Done,
}

/// The segment's replicas do not hold what precedes the range after settling: the
/// range cannot go on top of them.
#[derive(Debug, PartialEq, Eq)]
pub struct NotWritable(pub SegmentId);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    SettleBefore,
    Check,
    Writing,
    Written { lost_any: bool },
    Closing,
    Done,
}

/// Writing one sealed range of a segment to each of its replicas: settle, check the
/// replicas end where the range starts, write, settle again if a write failed, and
/// close the replicas if the range closes the segment.
#[derive(Debug)]
pub struct RangeWrite {
    segment: SegmentId,
    start: u32,
    end: u32,
    closes: bool,
    phase: Phase,
}

impl RangeWrite {
    /// Begins writing `range`, tracking its segment in `segments` (with `replicas`
    /// replicas, starting where the range starts) if it was not.
    pub fn begin<L>(
        segments: &mut BTreeMap<SegmentId, SegmentReplicas<L>>,
        range: &SegmentRange,
        replicas: usize,
    ) -> RangeWrite {
        let id = range.segment;
        segments
            .entry(id)
            .or_insert_with(|| SegmentReplicas::new(id, replicas, range.start));
        RangeWrite {
            segment: id,
            start: range.start,
            end: range.end,
            closes: range.closes,
            phase: Phase::SettleBefore,
        }
    }

    /// The segment the range belongs to.
    pub fn segment(&self) -> SegmentId {
        self.segment
    }

    /// The next step for `segment` (the range's).
    ///
    /// # Errors
    /// [`NotWritable`] when, settled, the replicas do not end where the range starts:
    /// the batch must never be acknowledged.
    pub fn next<L>(&mut self, segment: &mut SegmentReplicas<L>) -> Result<RangeStep, NotWritable> {
        match self.phase {
            Phase::SettleBefore => {
                self.phase = Phase::Check;
                Ok(RangeStep::Settle)
            }
            Phase::Check => {
                if !segment.writable(self.start) {
                    return Err(NotWritable(self.segment));
                }
                self.phase = Phase::Writing;
                Ok(RangeStep::Write { offset: self.start })
            }
            // `written` was not called: the writes are still to do.
            Phase::Writing => Ok(RangeStep::Write { offset: self.start }),
            Phase::Written { lost_any } => {
                segment.wrote(self.end);
                self.phase = Phase::Closing;
                if lost_any {
                    // The survivors hold [0, end); lost replicas are re-created holding
                    // as much.
                    return Ok(RangeStep::Settle);
                }
                self.next(segment)
            }
            Phase::Closing => {
                self.phase = Phase::Done;
                if self.closes {
                    return Ok(RangeStep::Close {
                        slots: segment.close(),
                    });
                }
                Ok(RangeStep::Done)
            }
            Phase::Done => Ok(RangeStep::Done),
        }
    }

    /// The writes of [`RangeStep::Write`] ended, each failure booked (its replica lost);
    /// `lost_any`: whether any failed.
    pub fn written(&mut self, lost_any: bool) {
        if self.phase == Phase::Writing {
            self.phase = Phase::Written { lost_any };
        }
    }
}

/// A step of creating one replica after its open ([`Creation::after_open`]), on the
/// replica's backup.
#[derive(Debug, PartialEq, Eq)]
pub enum CreateStep {
    /// Write the segment's first `len` bytes into the new frame, from offset 0.
    Fill {
        /// How many.
        len: u32,
    },
    /// Close it, `length` bytes long: the segment is closed.
    Close {
        /// The replica's length.
        length: u32,
    },
}

/// Creating replicas of a segment in its empty slots, all at one new epoch: for each,
/// open a frame, fill it with the segment's bytes so far, and close it if the segment
/// is. A creation
/// that fails after its open may have reached the backup leaves a frame there: it is
/// abandoned ([`Creation::failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Creation {
    /// The segment.
    pub segment: SegmentId,
    /// The new replicas' epoch (`SegmentReplicas::take_epoch`).
    pub epoch: Epoch,
    /// The bytes each new replica gets: the segment's so far.
    pub len: u32,
    /// Whether the segment is closed (each new replica is closed once filled).
    pub closed: bool,
}

impl Creation {
    /// Begins creating replicas of `segment`, at a new epoch.
    pub fn begin<L>(segment: &mut SegmentReplicas<L>) -> Creation {
        Creation {
            segment: segment.id(),
            epoch: segment.take_epoch(),
            len: segment.len(),
            closed: segment.is_closed(),
        }
    }

    /// The calls that create one replica after its open (a frame at [`epoch`]), in
    /// order; the first that fails ends the creation.
    ///
    /// [`epoch`]: Creation::epoch
    pub fn after_open(&self) -> impl Iterator<Item = CreateStep> {
        let fill = (self.len > 0).then_some(CreateStep::Fill { len: self.len });
        let close = self
            .closed
            .then_some(CreateStep::Close { length: self.len });
        fill.into_iter().chain(close)
    }

    /// The replica in `slot` exists: `segment` places it.
    pub fn created<L>(&self, segment: &mut SegmentReplicas<L>, slot: usize, replica: Replica<L>) {
        segment.placed(slot, replica);
    }

    /// The creation of the replica in `slot` on `backup` failed at some step: its copy
    /// there (if any) is abandoned, bounded by this creation's epoch, and the
    /// `selector` (if it has chosen anything yet) gets back the primary's count it took.
    /// Returns the copy forgotten to make room, if any. The failure's cause is then
    /// applied by `ReplicaFailures::call_failed` with `Call::Open`.
    pub fn failed<T>(
        &self,
        failures: &mut ReplicaFailures<T>,
        selector: Option<&mut BackupSelector>,
        (slot, backup): (usize, ServerId),
    ) -> Option<Abandoned>
    where
        T: Copy + Ord + Sub<Output = Duration> + Add<Duration, Output = T>,
    {
        let forgotten = failures.open_failed(self.segment, backup, self.epoch);
        if let Some(selector) = selector {
            placement::open_failed(selector, slot, backup);
        }
        forgotten
    }
}

/// A step of upkeep between batches ([`Upkeep::next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpkeepStep {
    /// Fail the backups the server list no longer shows Up (fetching it if due).
    RefreshServers,
    /// Probe the backups holding replicas that were quiet for a while; one that does
    /// not answer fails.
    ProbeQuiet,
    /// Free the abandoned copies `ReplicaFailures::take_frees` gives.
    FreeAbandoned,
    /// End the exclusions that are over (`ReplicaFailures::expire`).
    Expire,
    /// One placement round (`Patience::OneAttempt`) for this open segment, which lost
    /// replicas or has an unrecorded epoch: without a write it would wait for one, and
    /// the next write would wait for it.
    SettleOpen(SegmentId),
    /// Re-create the lost replicas of this closed segment, from the log: one segment
    /// per upkeep, so that writes interleave with re-replication. The last step.
    Recreate(SegmentId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpkeepPhase {
    Refresh,
    Probe,
    Free,
    Expire,
    ListOpen,
    SettleOpen,
    Recreate,
    Done,
}

/// One round of upkeep between batches: the server list, probes, frees, exclusions,
/// the open segments' lost replicas, then one closed segment's. Each step is decided
/// when asked for, on the segments as the steps before left them.
#[derive(Debug)]
pub struct Upkeep {
    phase: UpkeepPhase,
    open: VecDeque<SegmentId>,
}

impl Default for Upkeep {
    fn default() -> Self {
        Upkeep::new()
    }
}

impl Upkeep {
    /// A round from its first step.
    pub fn new() -> Upkeep {
        Upkeep {
            phase: UpkeepPhase::Refresh,
            open: VecDeque::new(),
        }
    }

    /// The next step, or `None` when the round is over.
    pub fn next<L>(
        &mut self,
        segments: &BTreeMap<SegmentId, SegmentReplicas<L>>,
    ) -> Option<UpkeepStep> {
        loop {
            let (step, next) = match self.phase {
                UpkeepPhase::Refresh => (Some(UpkeepStep::RefreshServers), UpkeepPhase::Probe),
                UpkeepPhase::Probe => (Some(UpkeepStep::ProbeQuiet), UpkeepPhase::Free),
                UpkeepPhase::Free => (Some(UpkeepStep::FreeAbandoned), UpkeepPhase::Expire),
                UpkeepPhase::Expire => (Some(UpkeepStep::Expire), UpkeepPhase::ListOpen),
                UpkeepPhase::ListOpen => {
                    self.open = segments
                        .iter()
                        .filter(|(_, s)| !s.is_closed() && (s.missing() > 0 || s.unrecorded()))
                        .map(|(id, _)| *id)
                        .collect();
                    (None, UpkeepPhase::SettleOpen)
                }
                UpkeepPhase::SettleOpen => match self.open.pop_front() {
                    // Gone meanwhile (freed): nothing to settle.
                    Some(id) if !segments.contains_key(&id) => (None, UpkeepPhase::SettleOpen),
                    Some(id) => (Some(UpkeepStep::SettleOpen(id)), UpkeepPhase::SettleOpen),
                    None => (None, UpkeepPhase::Recreate),
                },
                UpkeepPhase::Recreate => {
                    let under = segments
                        .iter()
                        .find(|(_, s)| s.is_closed() && s.missing() > 0)
                        .map(|(id, _)| UpkeepStep::Recreate(*id));
                    (under, UpkeepPhase::Done)
                }
                UpkeepPhase::Done => return None,
            };
            self.phase = next;
            if step.is_some() {
                return step;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::FrameHandle;
    use std::time::Instant;

    type Segments = BTreeMap<SegmentId, SegmentReplicas<()>>;

    const S: SegmentId = SegmentId(1);

    fn range(start: u32, end: u32, closes: bool) -> SegmentRange {
        SegmentRange {
            segment: S,
            start,
            end,
            closes,
        }
    }

    /// A segment of S with every one of its `replicas` replicas live at epoch 1,
    /// holding `len` bytes.
    fn live(segments: &mut Segments, replicas: usize, len: u32) {
        let mut write = RangeWrite::begin(segments, &range(0, len, false), replicas);
        let segment = segments.get_mut(&S).expect("tracked");
        let creation = Creation::begin(segment);
        for slot in 0..replicas {
            let replica = Replica::new(
                ServerId(slot as u64 + 10),
                FrameHandle(slot as u64),
                creation.epoch,
                (),
            );
            creation.created(segment, slot, replica);
        }
        segment.recorded(creation.epoch);
        assert_eq!(write.next(segment), Ok(RangeStep::Settle));
        assert_eq!(write.next(segment), Ok(RangeStep::Write { offset: 0 }));
        write.written(false);
        assert_eq!(write.next(segment), Ok(RangeStep::Done));
    }

    #[test]
    fn a_range_is_settled_checked_written_and_closes_its_segment() {
        let mut segments = Segments::new();
        live(&mut segments, 2, 100);
        let mut write = RangeWrite::begin(&mut segments, &range(100, 150, true), 2);
        let segment = segments.get_mut(&S).expect("tracked");
        assert_eq!(write.next(segment), Ok(RangeStep::Settle));
        assert_eq!(write.next(segment), Ok(RangeStep::Write { offset: 100 }));
        assert_eq!(
            write.next(segment),
            Ok(RangeStep::Write { offset: 100 }),
            "not written yet"
        );
        write.written(false);
        assert_eq!(
            write.next(segment),
            Ok(RangeStep::Close { slots: vec![0, 1] })
        );
        assert_eq!(segment.len(), 150);
        assert!(segment.is_closed());
        assert_eq!(write.next(segment), Ok(RangeStep::Done));
    }

    #[test]
    fn a_failed_write_settles_again_before_the_close() {
        let mut segments = Segments::new();
        live(&mut segments, 2, 100);
        let mut write = RangeWrite::begin(&mut segments, &range(100, 150, true), 2);
        let segment = segments.get_mut(&S).expect("tracked");
        write.next(segment).expect("settle");
        write.next(segment).expect("write");
        write.written(true);
        assert_eq!(write.next(segment), Ok(RangeStep::Settle));
        assert_eq!(segment.len(), 150, "the survivors hold the range");
        assert!(matches!(write.next(segment), Ok(RangeStep::Close { .. })));
    }

    #[test]
    fn a_range_that_does_not_start_where_the_replicas_end_is_not_written() {
        let mut segments = Segments::new();
        live(&mut segments, 1, 100);
        let mut write = RangeWrite::begin(&mut segments, &range(120, 150, false), 1);
        let segment = segments.get_mut(&S).expect("tracked");
        assert_eq!(write.next(segment), Ok(RangeStep::Settle));
        assert_eq!(write.next(segment), Err(NotWritable(S)));
    }

    #[test]
    fn a_creation_fills_what_the_segment_holds_and_closes_a_closed_one() {
        let empty = Creation::begin(&mut SegmentReplicas::<()>::new(SegmentId(9), 1, 0));
        assert_eq!(
            empty.after_open().count(),
            0,
            "an empty open segment: the open alone"
        );
        let mut segments = Segments::new();
        live(&mut segments, 1, 100);
        let mut write = RangeWrite::begin(&mut segments, &range(100, 100, true), 1);
        let segment = segments.get_mut(&S).expect("tracked");
        write.next(segment).expect("settle");
        write.next(segment).expect("write");
        write.written(false);
        write.next(segment).expect("close");
        let closed = Creation::begin(segment);
        assert_eq!(closed.epoch, Epoch(2), "every creation takes a new epoch");
        assert_eq!(
            closed.after_open().collect::<Vec<_>>(),
            vec![
                CreateStep::Fill { len: 100 },
                CreateStep::Close { length: 100 }
            ]
        );
    }

    #[test]
    fn a_failed_creation_abandons_its_copy_at_its_epoch() {
        let mut segment = SegmentReplicas::<()>::new(S, 1, 0);
        let creation = Creation::begin(&mut segment);
        let mut failures =
            ReplicaFailures::<Instant>::new(Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(creation.failed(&mut failures, None, (0, ServerId(7))), None);
        assert_eq!(
            failures.abandoned(),
            &[Abandoned {
                backup: ServerId(7),
                segment: S,
                epoch_max: creation.epoch,
            }]
        );
    }

    #[test]
    fn upkeep_settles_the_open_segments_that_need_it_then_recreates_one_closed_one() {
        let mut segments = Segments::new();
        live(&mut segments, 1, 100);
        // A closed segment that lost its replica, and an open one that lost its own.
        let closed = SegmentId(2);
        let mut closing = SegmentReplicas::new(closed, 1, 0);
        closing.close();
        segments.insert(closed, closing);
        segments.insert(SegmentId(3), SegmentReplicas::new(SegmentId(3), 1, 0));
        let mut upkeep = Upkeep::new();
        let steps: Vec<UpkeepStep> = std::iter::from_fn(|| upkeep.next(&segments)).collect();
        assert_eq!(
            steps,
            vec![
                UpkeepStep::RefreshServers,
                UpkeepStep::ProbeQuiet,
                UpkeepStep::FreeAbandoned,
                UpkeepStep::Expire,
                UpkeepStep::SettleOpen(SegmentId(3)),
                UpkeepStep::Recreate(closed),
            ]
        );
    }

    #[test]
    fn an_open_segment_freed_during_upkeep_is_not_settled() {
        let mut segments = Segments::new();
        for id in [SegmentId(1), SegmentId(2)] {
            segments.insert(id, SegmentReplicas::new(id, 1, 0));
        }
        let mut upkeep = Upkeep::new();
        for _ in 0..4 {
            upkeep.next(&segments);
        }
        assert_eq!(
            upkeep.next(&segments),
            Some(UpkeepStep::SettleOpen(SegmentId(1)))
        );
        // Settling the first, the log freed the second.
        segments.remove(&SegmentId(2));
        assert_eq!(upkeep.next(&segments), None);
    }
}
