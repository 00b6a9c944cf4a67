//! `ReplicaFailures`: what a failed call to a backup loses, and what becomes of the
//! copies given up on (DESIGN.md §5 "Replication"). Pure and synchronous: the
//! replicator, its async driver, and the simulation's master (`rampart-sim`) each
//! tell it what failed and carry out what it returns, so the simulation runs these
//! decisions as the master does.
//!
//! # What a failure loses
//! A call to a replica (an open, a write, a bump, a close) fails in one of three ways
//! ([`Cause`]):
//! * **The backup did not answer** (a transport failure, a timeout, gone from the
//!   server list): every replica on it, of every segment, is lost, and it is not
//!   chosen again for the failed-backup exclusion (it may only have looked dead, so
//!   every copy on it is abandoned, to be freed).
//! * **The backup refused this replica alone** (an unknown frame, a stale epoch, no
//!   room): that replica is lost (a replica being opened was never placed). A backup
//!   that refused an open or a close — it may be full — is not chosen again for the
//!   refused-backup exclusion; one that refused a write or a bump is.
//! * **This master was fenced**: it is being recovered elsewhere and must stop
//!   ([`Fenced`]).
//!
//! # The copies given up on
//! Every replica lost, every open that failed after it may have reached its backup and
//! every replica of a segment the log freed leaves a copy that may still be on a live
//! backup: it is *abandoned* ([`Abandoned`]), at most [`ABANDONED_MAX`] kept (the oldest
//! forgotten beyond), and freed ([`ReplicaFailures::take_frees`]) once its backup is
//! listed and not failed and its segment is whole again (`SegmentReplicas::whole`: until
//! then the copy may be the last complete one outside this master). One whose backup
//! left the server list is forgotten (its replicas went with it); one whose free went
//! unanswered fails its backup and is kept for later.
//!
//! A backup marked failed gets no free until its failure expires ([`expire`]): the
//! driver does not wait on a dead backup at every attempt. The drivers expire failures
//! and free between batches (upkeep) and, since a write that waits for backups holds
//! the replicator, before each pause of that wait too (`Settling`'s `FreeAbandoned`):
//! without those frees a master whose backups were full of frames it gave up on waited
//! for good (in the simulation, which keeps this rule, nearly every seed did).
//!
//! [`expire`]: ReplicaFailures::expire
//!
//! # Time
//! Times are the driver's: any `T` with `T - T = Duration` and `T + Duration = T` — the
//! replicator's `tokio::time::Instant`, the simulation's `Duration` since its start.

use rampart_common::ids::{Epoch, SegmentId, ServerId};
use std::collections::{BTreeMap, HashSet};
use std::ops::{Add, Sub};
use std::time::Duration;

use super::segment_replicas::{Abandoned, Lost, SegmentReplicas};

/// Most abandoned replicas remembered for freeing; older ones are forgotten (their
/// copies stay on the backup, across its restarts too — a restarted backup stores its
/// frames — until a recovery of this master frees the master's replicas there).
pub const ABANDONED_MAX: usize = 4096;

/// Why a call to a replica failed, as far as what it loses goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The backup did not answer: every replica on it is lost.
    Backup,
    /// The backup refused this replica alone.
    Replica,
    /// The backup fenced this master: it must stop.
    Fenced,
}

/// Which call to a replica failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// The open of a new replica, its fill or (for a closed segment) its close: the
    /// replica was never placed (the copy it may have left is abandoned first:
    /// [`open_failed`](ReplicaFailures::open_failed)).
    Open,
    /// A write or a bump to the live replica in `slot`.
    Update { slot: usize },
    /// The close of the live replica in `slot` (answered to the segment first:
    /// `SegmentReplicas::close_answered`).
    Close { slot: usize },
}

/// This master was fenced: it is being recovered elsewhere and must stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced {
    /// The segment whose replica was fenced.
    pub segment: SegmentId,
    /// The backup that fenced it.
    pub backup: ServerId,
}

/// What a failure lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loss {
    /// The backup was marked failed now and was not failed before (the driver counts
    /// and reports it once).
    pub newly_failed: bool,
    /// The replicas marked lost, each abandoned (a primary is given back to the backup
    /// selector by the driver).
    pub lost: Vec<Lost>,
    /// Abandoned copies forgotten to keep at most [`ABANDONED_MAX`], oldest first: never
    /// freed.
    pub forgotten: Vec<Abandoned>,
}

/// Failed and refused backups, and the copies given up on; see the module doc.
#[derive(Debug)]
pub struct ReplicaFailures<T> {
    /// How long a failed backup is not chosen again.
    failed_exclusion: Duration,
    /// How long a backup that refused an open or a close is not chosen again.
    refused_exclusion: Duration,
    /// Backups marked failed, and when (pruned by [`expire`](Self::expire)).
    failed: BTreeMap<ServerId, T>,
    /// Backups that refused a replica, and until when they are not chosen.
    refused: BTreeMap<ServerId, T>,
    /// Copies given up on, to free. Invariant: at most [`ABANDONED_MAX`] entries, but
    /// for those kept after an unanswered free.
    abandoned: Vec<Abandoned>,
}

impl<T> ReplicaFailures<T>
where
    T: Copy + Ord + Sub<Output = Duration> + Add<Duration, Output = T>,
{
    /// No failures yet; a failed backup is excluded for `failed_exclusion`, one that
    /// refused for `refused_exclusion`.
    pub fn new(failed_exclusion: Duration, refused_exclusion: Duration) -> ReplicaFailures<T> {
        ReplicaFailures {
            failed_exclusion,
            refused_exclusion,
            failed: BTreeMap::new(),
            refused: BTreeMap::new(),
            abandoned: Vec::new(),
        }
    }

    /// A call of `call` kind to `backup` for a replica of `id` failed by `cause`:
    /// applies what that loses (module doc). The replica of a [`Call::Update`] or
    /// [`Call::Close`] is lost only if its slot still holds one on `backup`.
    ///
    /// # Errors
    /// [`Fenced`] when this master must stop.
    pub fn call_failed<L>(
        &mut self,
        segments: &mut BTreeMap<SegmentId, SegmentReplicas<L>>,
        (id, backup): (SegmentId, ServerId),
        call: Call,
        cause: Cause,
        now: T,
    ) -> Result<Loss, Fenced> {
        match (cause, call) {
            (Cause::Fenced, _) => Err(Fenced {
                segment: id,
                backup,
            }),
            (Cause::Backup, _) => Ok(self.backup_failed(segments, backup, now)),
            (Cause::Replica, Call::Open) => {
                self.refused.insert(backup, now + self.refused_exclusion);
                Ok(Loss::default())
            }
            (Cause::Replica, Call::Update { slot }) => Ok(self.lose(segments, id, slot, backup)),
            (Cause::Replica, Call::Close { slot }) => {
                self.refused.insert(backup, now + self.refused_exclusion);
                Ok(self.lose(segments, id, slot, backup))
            }
        }
    }

    /// `backup` failed (did not answer, or left the server list): every replica on it,
    /// of every segment, is lost and abandoned, and it is not chosen again for the
    /// failed-backup exclusion, counted from `now`.
    pub fn backup_failed<L>(
        &mut self,
        segments: &mut BTreeMap<SegmentId, SegmentReplicas<L>>,
        backup: ServerId,
        now: T,
    ) -> Loss {
        let newly_failed = self.failed.insert(backup, now).is_none();
        let lost: Vec<Lost> = segments
            .values_mut()
            .flat_map(|segment| segment.lose_backup(backup))
            .collect();
        let forgotten = lost
            .iter()
            .filter_map(|lost| self.abandon(lost.abandoned))
            .collect();
        Loss {
            newly_failed,
            lost,
            forgotten,
        }
    }

    /// The log freed `segment`: every live replica of it is abandoned at any epoch
    /// (no copy of it is wanted any more). Returns them, each with the copy its
    /// abandoning forgot, if any.
    pub fn segment_freed<L>(
        &mut self,
        id: SegmentId,
        segment: &SegmentReplicas<L>,
    ) -> Vec<(Lost, Option<Abandoned>)> {
        let held: Vec<Lost> = segment
            .live()
            .map(|(slot, replica)| Lost {
                abandoned: Abandoned {
                    backup: replica.backup,
                    segment: id,
                    epoch_max: Epoch::MAX,
                },
                primary: slot == 0,
            })
            .collect();
        held.into_iter()
            .map(|lost| (lost, self.abandon(lost.abandoned)))
            .collect()
    }

    /// The open of a new replica of `id` on `backup` at `epoch`, its fill or its close
    /// failed, whatever the cause: the backup may hold a frame for it all the same (an
    /// open whose reply was lost, a fill cut short), which nothing else would ever free,
    /// so it is abandoned, bounded by `epoch` (no later copy reuses it). Returns the
    /// copy forgotten to make room, if any. The cause is then applied by
    /// [`call_failed`](Self::call_failed) with [`Call::Open`].
    pub fn open_failed(
        &mut self,
        id: SegmentId,
        backup: ServerId,
        epoch: Epoch,
    ) -> Option<Abandoned> {
        self.abandon(Abandoned {
            backup,
            segment: id,
            epoch_max: epoch,
        })
    }

    /// Remembers a copy to free; returns the oldest one forgotten to keep at most
    /// [`ABANDONED_MAX`].
    fn abandon(&mut self, abandoned: Abandoned) -> Option<Abandoned> {
        let forgotten = (self.abandoned.len() >= ABANDONED_MAX).then(|| self.abandoned.remove(0));
        self.abandoned.push(abandoned);
        forgotten
    }

    /// The abandoned copies to free now: on backups `listed` (Up in the server list)
    /// and not failed, of segments whole again or gone (`segments`). Those on backups no longer listed are forgotten; the others are
    /// kept.
    pub fn take_frees<L>(
        &mut self,
        listed: impl Fn(ServerId) -> bool,
        segments: &BTreeMap<SegmentId, SegmentReplicas<L>>,
    ) -> Vec<Abandoned> {
        if self.abandoned.is_empty() {
            return Vec::new();
        }
        self.abandoned.retain(|a| listed(a.backup));
        let (ready, waiting): (Vec<Abandoned>, Vec<Abandoned>) =
            std::mem::take(&mut self.abandoned)
                .into_iter()
                .partition(|a| {
                    !self.failed.contains_key(&a.backup)
                        && segments
                            .get(&a.segment)
                            .map_or(true, SegmentReplicas::whole)
                });
        self.abandoned = waiting;
        ready
    }

    /// The free of `abandoned` got no answer: its backup failed (as
    /// [`backup_failed`](Self::backup_failed)), and the copy is kept, to free once the
    /// backup's exclusion ends.
    pub fn free_unanswered<L>(
        &mut self,
        segments: &mut BTreeMap<SegmentId, SegmentReplicas<L>>,
        abandoned: Abandoned,
        now: T,
    ) -> Loss {
        let loss = self.backup_failed(segments, abandoned.backup, now);
        self.abandoned.push(abandoned);
        loss
    }

    /// The backups not to choose now: failed less than the failed-backup exclusion ago,
    /// or refused until later.
    pub fn excluded(&self, now: T) -> HashSet<ServerId> {
        self.failed
            .iter()
            .filter(|(_, since)| self.within_failed_exclusion(**since, now))
            .map(|(id, _)| *id)
            .chain(
                self.refused
                    .iter()
                    .filter(|(_, until)| **until > now)
                    .map(|(id, _)| *id),
            )
            .collect()
    }

    /// Forgets the failures and refusals whose exclusion is over at `now`: their copies
    /// may be freed again.
    pub fn expire(&mut self, now: T) {
        let exclusion = self.failed_exclusion;
        self.failed
            .retain(|_, since| *since > now || now - *since < exclusion);
        self.refused.retain(|_, until| *until > now);
    }

    /// The copies given up on, not freed yet.
    pub fn abandoned(&self) -> &[Abandoned] {
        &self.abandoned
    }

    /// Whether `backup` is marked failed (until [`expire`](Self::expire) forgets it).
    pub fn is_failed(&self, backup: ServerId) -> bool {
        self.failed.contains_key(&backup)
    }

    fn within_failed_exclusion(&self, since: T, now: T) -> bool {
        since > now || now - since < self.failed_exclusion
    }

    /// The replica in `slot` of `id`, if it is still on `backup`, is lost and abandoned.
    fn lose<L>(
        &mut self,
        segments: &mut BTreeMap<SegmentId, SegmentReplicas<L>>,
        id: SegmentId,
        slot: usize,
        backup: ServerId,
    ) -> Loss {
        let Some(segment) = segments.get_mut(&id) else {
            return Loss::default();
        };
        if segment.replica(slot).map(|r| r.backup) != Some(backup) {
            return Loss::default();
        }
        let lost: Vec<Lost> = segment.lose(slot).into_iter().collect();
        let forgotten = lost
            .iter()
            .filter_map(|lost| self.abandon(lost.abandoned))
            .collect();
        Loss {
            newly_failed: false,
            lost,
            forgotten,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica_manager::segment_replicas::{Replica, Step};
    use rampart_common::ids::FrameHandle;

    const EXCLUSION: Duration = Duration::from_millis(50);
    const REFUSAL: Duration = Duration::from_millis(20);
    const A: SegmentId = SegmentId(1);
    const B: SegmentId = SegmentId(2);

    type Segments = BTreeMap<SegmentId, SegmentReplicas<()>>;

    fn failures() -> ReplicaFailures<Duration> {
        ReplicaFailures::new(EXCLUSION, REFUSAL)
    }

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Segment `id` with a live replica on each of `backups` (slot 0 the first), whole.
    fn placed(id: SegmentId, backups: &[u64]) -> SegmentReplicas<()> {
        let mut segment = SegmentReplicas::new(id, backups.len(), 0);
        assert!(matches!(segment.step(), Step::Place { .. }));
        let epoch = segment.take_epoch();
        for (slot, &backup) in backups.iter().enumerate() {
            let replica = Replica::new(ServerId(backup), FrameHandle(slot as u64), epoch, ());
            segment.placed(slot, replica);
        }
        assert_eq!(segment.step(), Step::Ready);
        assert!(segment.whole());
        segment
    }

    /// Segments A on backups 10, 11, 12 and B on 12, 10, 13.
    fn two_segments() -> Segments {
        BTreeMap::from([(A, placed(A, &[10, 11, 12])), (B, placed(B, &[12, 10, 13]))])
    }

    fn backups_of(segments: &Segments, id: SegmentId) -> Vec<ServerId> {
        segments[&id].backups().collect()
    }

    /// A `call` to backup `backup` for `id` failed by `cause` at `ms`; not fenced.
    fn fail(
        f: &mut ReplicaFailures<Duration>,
        segments: &mut Segments,
        (id, backup): (SegmentId, u64),
        call: Call,
        cause: Cause,
        ms: u64,
    ) -> Loss {
        f.call_failed(segments, (id, ServerId(backup)), call, cause, at(ms))
            .expect("not fenced")
    }

    fn excluded(f: &ReplicaFailures<Duration>, now: Duration) -> Vec<ServerId> {
        let mut excluded: Vec<ServerId> = f.excluded(now).into_iter().collect();
        excluded.sort();
        excluded
    }

    #[test]
    fn a_backup_that_did_not_answer_loses_every_replica_on_it_in_every_segment() {
        let (mut f, mut segments) = (failures(), two_segments());
        let loss = fail(
            &mut f,
            &mut segments,
            (A, 10),
            Call::Update { slot: 0 },
            Cause::Backup,
            1,
        );
        assert!(loss.newly_failed);
        let lost: Vec<(SegmentId, ServerId, bool)> = loss
            .lost
            .iter()
            .map(|l| (l.abandoned.segment, l.abandoned.backup, l.primary))
            .collect();
        assert_eq!(
            lost,
            vec![(A, ServerId(10), true), (B, ServerId(10), false)]
        );
        assert_eq!(backups_of(&segments, A), vec![ServerId(11), ServerId(12)]);
        assert_eq!(backups_of(&segments, B), vec![ServerId(12), ServerId(13)]);
        // Each lost copy is abandoned at the epoch its backup may hold it at.
        let abandoned: Vec<Abandoned> = loss.lost.iter().map(|l| l.abandoned).collect();
        assert_eq!(f.abandoned(), abandoned.as_slice());
        assert!(abandoned.iter().all(|a| a.epoch_max == Epoch(1)));
        assert!(f.is_failed(ServerId(10)));
        // Failing again (a free, a probe) is no news, and loses nothing more.
        let again = f.backup_failed(&mut segments, ServerId(10), at(2));
        assert_eq!(again, Loss::default());
    }

    #[test]
    fn a_failed_backup_is_excluded_until_its_exclusion_ends() {
        let (mut f, mut segments) = (failures(), two_segments());
        f.backup_failed(&mut segments, ServerId(13), at(100));
        assert_eq!(excluded(&f, at(100)), vec![ServerId(13)]);
        assert_eq!(excluded(&f, at(149)), vec![ServerId(13)]);
        assert!(excluded(&f, at(150)).is_empty());
        // Its failure is remembered (no free goes there) until expired.
        f.expire(at(149));
        assert!(f.is_failed(ServerId(13)));
        f.expire(at(150));
        assert!(!f.is_failed(ServerId(13)));
    }

    #[test]
    fn a_refused_write_or_bump_loses_that_replica_alone_and_excludes_nothing() {
        let (mut f, mut segments) = (failures(), two_segments());
        let loss = fail(
            &mut f,
            &mut segments,
            (B, 10),
            Call::Update { slot: 1 },
            Cause::Replica,
            1,
        );
        assert!(!loss.newly_failed);
        assert_eq!(loss.lost.len(), 1);
        assert_eq!(loss.lost[0].abandoned.segment, B);
        assert_eq!(
            backups_of(&segments, A).len(),
            3,
            "other segments keep theirs"
        );
        assert_eq!(backups_of(&segments, B), vec![ServerId(12), ServerId(13)]);
        assert!(excluded(&f, at(1)).is_empty());
        assert!(!f.is_failed(ServerId(10)));
    }

    #[test]
    fn a_refused_close_loses_that_replica_and_excludes_its_backup_a_while() {
        let (mut f, mut segments) = (failures(), two_segments());
        let loss = fail(
            &mut f,
            &mut segments,
            (A, 12),
            Call::Close { slot: 2 },
            Cause::Replica,
            10,
        );
        assert_eq!(loss.lost.len(), 1);
        assert_eq!(backups_of(&segments, A), vec![ServerId(10), ServerId(11)]);
        assert_eq!(backups_of(&segments, B).len(), 3);
        assert_eq!(excluded(&f, at(29)), vec![ServerId(12)]);
        assert!(excluded(&f, at(30)).is_empty());
        assert!(
            !f.is_failed(ServerId(12)),
            "refused, not failed: its copies may be freed"
        );
    }

    #[test]
    fn a_refused_open_excludes_its_backup_a_while_and_loses_nothing() {
        let (mut f, mut segments) = (failures(), two_segments());
        assert_eq!(f.open_failed(A, ServerId(14), Epoch(2)), None);
        let loss = fail(
            &mut f,
            &mut segments,
            (A, 14),
            Call::Open,
            Cause::Replica,
            10,
        );
        assert_eq!(loss, Loss::default());
        assert_eq!(excluded(&f, at(10)), vec![ServerId(14)]);
        f.expire(at(30));
        assert!(excluded(&f, at(10)).is_empty(), "expired");
    }

    #[test]
    fn an_open_that_failed_abandons_the_frame_it_may_have_left_at_its_epoch() {
        let mut f = failures();
        f.open_failed(A, ServerId(14), Epoch(7));
        assert_eq!(
            f.abandoned(),
            &[Abandoned {
                backup: ServerId(14),
                segment: A,
                epoch_max: Epoch(7),
            }]
        );
    }

    #[test]
    fn an_open_to_a_backup_that_did_not_answer_fails_the_backup() {
        let (mut f, mut segments) = (failures(), two_segments());
        let loss = fail(&mut f, &mut segments, (B, 11), Call::Open, Cause::Backup, 1);
        assert!(loss.newly_failed);
        assert_eq!(loss.lost.len(), 1, "A's replica on it");
        assert_eq!(backups_of(&segments, A), vec![ServerId(10), ServerId(12)]);
    }

    #[test]
    fn a_fence_stops_the_master_whatever_the_call_and_loses_nothing() {
        for call in [
            Call::Open,
            Call::Update { slot: 0 },
            Call::Close { slot: 0 },
        ] {
            let (mut f, mut segments) = (failures(), two_segments());
            let fenced =
                f.call_failed(&mut segments, (A, ServerId(10)), call, Cause::Fenced, at(1));
            assert_eq!(
                fenced,
                Err(Fenced {
                    segment: A,
                    backup: ServerId(10),
                })
            );
            assert_eq!(backups_of(&segments, A).len(), 3);
            assert!(f.abandoned().is_empty() && excluded(&f, at(1)).is_empty());
        }
    }

    #[test]
    fn a_slot_no_longer_holding_the_failed_replica_loses_nothing() {
        let (mut f, mut segments) = (failures(), two_segments());
        for (slot, backup) in [(0, 11), (5, 10)] {
            let loss = fail(
                &mut f,
                &mut segments,
                (A, backup),
                Call::Update { slot },
                Cause::Replica,
                1,
            );
            assert_eq!(loss, Loss::default());
        }
        let gone = f.call_failed(
            &mut segments,
            (SegmentId(9), ServerId(10)),
            Call::Close { slot: 0 },
            Cause::Replica,
            at(1),
        );
        assert_eq!(gone, Ok(Loss::default()));
        assert_eq!(backups_of(&segments, A).len(), 3);
        assert!(f.abandoned().is_empty());
    }

    #[test]
    fn copies_are_freed_only_on_listed_unfailed_backups_of_whole_or_freed_segments() {
        let (mut f, mut segments) = (failures(), two_segments());
        // A loses its replica on 11 (refused): A is no longer whole.
        fail(
            &mut f,
            &mut segments,
            (A, 11),
            Call::Update { slot: 1 },
            Cause::Replica,
            1,
        );
        f.open_failed(B, ServerId(20), Epoch(2)); // B whole: freed
        f.open_failed(SegmentId(9), ServerId(21), Epoch(1)); // gone: freed
        f.open_failed(B, ServerId(22), Epoch(3)); // not listed: forgotten
        f.open_failed(B, ServerId(23), Epoch(4)); // failed: kept
        f.backup_failed(&mut segments, ServerId(23), at(1));
        let listed = |b: ServerId| b != ServerId(22);
        let frees: Vec<(SegmentId, ServerId)> = f
            .take_frees(listed, &segments)
            .iter()
            .map(|a| (a.segment, a.backup))
            .collect();
        assert_eq!(frees, vec![(B, ServerId(20)), (SegmentId(9), ServerId(21))]);
        let kept: Vec<(SegmentId, ServerId)> = f
            .abandoned()
            .iter()
            .map(|a| (a.segment, a.backup))
            .collect();
        assert_eq!(kept, vec![(A, ServerId(11)), (B, ServerId(23))]);
        // Once A is whole again and 23's failure expired, both go.
        let epoch = segments.get_mut(&A).expect("A").take_epoch();
        let replica = Replica::new(ServerId(14), FrameHandle(9), epoch, ());
        segments.get_mut(&A).expect("A").placed(1, replica);
        while segments.get_mut(&A).expect("A").step() != Step::Ready {
            let segment = segments.get_mut(&A).expect("A");
            match segment.step() {
                Step::Bump { epoch, survivors } => {
                    for slot in survivors {
                        segment.bumped(slot, epoch);
                    }
                }
                Step::Record { epoch } => segment.recorded(epoch),
                step => panic!("{step:?}"),
            }
        }
        f.expire(at(1) + EXCLUSION);
        assert_eq!(f.take_frees(|_| true, &segments).len(), 2);
        assert!(f.abandoned().is_empty());
    }

    #[test]
    fn an_unanswered_free_fails_its_backup_and_keeps_the_copy() {
        let (mut f, mut segments) = (failures(), two_segments());
        f.open_failed(SegmentId(9), ServerId(13), Epoch(1));
        let frees = f.take_frees(|_| true, &segments);
        assert_eq!(frees.len(), 1);
        let loss = f.free_unanswered(&mut segments, frees[0], at(5));
        assert!(loss.newly_failed);
        assert_eq!(loss.lost.len(), 1, "B's replica on 13");
        let kept: Vec<(SegmentId, ServerId)> = f
            .abandoned()
            .iter()
            .map(|a| (a.segment, a.backup))
            .collect();
        assert_eq!(kept, vec![(B, ServerId(13)), (SegmentId(9), ServerId(13))]);
        assert!(f.take_frees(|_| true, &segments).is_empty(), "13 failed");
    }

    #[test]
    fn a_freed_segment_abandons_every_live_replica_at_any_epoch() {
        let (mut f, segments) = (failures(), two_segments());
        let freed = f.segment_freed(B, &segments[&B]);
        let lost: Vec<(ServerId, bool, Option<Abandoned>)> = freed
            .iter()
            .map(|(l, forgotten)| (l.abandoned.backup, l.primary, *forgotten))
            .collect();
        assert_eq!(
            lost,
            vec![
                (ServerId(12), true, None),
                (ServerId(10), false, None),
                (ServerId(13), false, None)
            ]
        );
        assert!(f
            .abandoned()
            .iter()
            .all(|a| a.segment == B && a.epoch_max == Epoch::MAX));
    }

    #[test]
    fn at_most_abandoned_max_copies_are_kept_the_oldest_forgotten() {
        let (mut f, mut segments) = (failures(), two_segments());
        for n in 0..ABANDONED_MAX as u64 {
            assert_eq!(
                f.open_failed(SegmentId(100 + n), ServerId(20), Epoch(1)),
                None
            );
        }
        let oldest = f.abandoned()[0];
        assert_eq!(f.open_failed(A, ServerId(21), Epoch(2)), Some(oldest));
        let loss = f.backup_failed(&mut segments, ServerId(12), at(1));
        assert_eq!(loss.lost.len(), 2);
        assert_eq!(loss.forgotten.len(), 2);
        assert_eq!(f.abandoned().len(), ABANDONED_MAX);
    }
}
