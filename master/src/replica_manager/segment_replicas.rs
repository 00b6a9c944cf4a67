//! `SegmentReplicas`: the R replicas of one segment of this master's log and every
//! protocol decision about them (DESIGN.md §5 "Replication", §4 "Segment epochs"): pure
//! and synchronous. The replicator, its async driver, asks [`SegmentReplicas::step`]
//! what to do next, performs it (opens, writes, bumps, records, closes: I/O to backups
//! and the coordinator), and reports the outcome back. What the machine hands back to
//! the driver are actions: slots to place, replicas to bump, an epoch to record, slots
//! to close, and [`Abandoned`] copies to free.
//!
//! # Guarantees (each checked by the property test below)
//! * **Nothing acknowledged is missing from a copy a recovery would count.** A recovery
//!   counts an open segment's copies at the epoch the coordinator recorded, or newer.
//!   A write may start only when [`SegmentReplicas::writable`]: every slot holds a live
//!   replica, all at the segment's epoch, and that epoch is recorded. So a copy left
//!   behind by a loss (perhaps still on a backup that only looked dead) is either at an
//!   older epoch than the recorded one, or held every acknowledged byte.
//! * **Epochs are never reused.** Every placement attempt takes a new epoch
//!   ([`SegmentReplicas::take_epoch`]), and survivors are bumped to the newest attempt's
//!   epoch, so no two copies of a segment on backups ever hold one epoch at different
//!   contents.
//! * **A free never touches a live copy.** A lost replica is handed back as
//!   [`Abandoned`] with the highest epoch its backup may hold it at (a failed bump may
//!   have landed); the free spares newer copies, and a replacement always gets a newer
//!   epoch.
//! * **A copy is freed only once the segment is whole again** ([`SegmentReplicas::whole`]):
//!   a lost replica may be the last complete copy outside the master's memory, so the
//!   driver keeps it until its replacement holds everything (found by the simulation,
//!   `rampart-sim`).
//! * **A closed segment needs no epochs.** Its replicas hold the footer, so each is
//!   complete whatever its epoch: re-created ones are not bumped or recorded.

use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use std::collections::BTreeMap;

/// The epoch of a segment's first placement.
const FIRST_EPOCH: Epoch = Epoch(1);

/// One replica of a segment on a backup; `L` is how the driver reaches it.
#[derive(Clone, Debug)]
pub struct Replica<L> {
    /// The backup holding it.
    pub backup: ServerId,
    /// Its frame's handle on that backup.
    pub handle: FrameHandle,
    /// The epoch the backup holds it at.
    pub epoch: Epoch,
    /// `CloseReplica` answered Ok: the replica is on the backup's disk.
    pub closed: bool,
    /// A close is in flight.
    pub closing: bool,
    /// The driver's way to it (address, transport).
    pub link: L,
    /// The highest epoch the backup may hold it at: above `epoch` while a bump to it
    /// failed without an answer (it may have landed).
    epoch_max: Epoch,
}

impl<L> Replica<L> {
    /// A replica just opened on `backup` as frame `handle` at `epoch`.
    pub fn new(backup: ServerId, handle: FrameHandle, epoch: Epoch, link: L) -> Replica<L> {
        Replica {
            backup,
            handle,
            epoch,
            closed: false,
            closing: false,
            link,
            epoch_max: epoch,
        }
    }
}

/// A copy given up on, to be freed on its backup with `FreeReplica { epoch_max }`,
/// which spares any newer copy there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned {
    pub backup: ServerId,
    pub segment: SegmentId,
    /// The highest epoch the backup may hold the copy at.
    pub epoch_max: Epoch,
}

/// A replica marked lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lost {
    /// What to free on its backup.
    pub abandoned: Abandoned,
    /// It was the segment's primary (slot 0), counted as such by the backup selector.
    pub primary: bool,
}

/// What the driver does next for a segment ([`SegmentReplicas::step`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Place new replicas in these (empty) slots, at an epoch from
    /// [`SegmentReplicas::take_epoch`], each holding the segment's first
    /// [`len`](SegmentReplicas::len) bytes (and closed, if the segment is).
    Place {
        slots: Vec<usize>,
        /// Every slot is empty: choose all R backups afresh (the primary by refinement).
        fresh: bool,
        /// Every replica of an open segment that holds bytes is lost, so no survivor's
        /// fence can tell this master that it is being recovered: before its bytes go
        /// to new backups, the coordinator must confirm that it still lists it Up.
        confirm_alive: bool,
    },
    /// Move the replicas in these slots (survivors of a loss, at older epochs) to
    /// `epoch` (`BumpEpoch`).
    Bump { epoch: Epoch, survivors: Vec<usize> },
    /// Record `epoch` at the coordinator (`SetOpenEpoch`).
    Record { epoch: Epoch },
    /// Every replica is live and current: the segment may be written.
    Ready,
}

/// The replicas of one segment; see the module doc.
#[derive(Debug)]
pub struct SegmentReplicas<L> {
    id: SegmentId,
    /// The epoch every live replica is at once `step` returns `Ready`.
    epoch: Epoch,
    /// The epoch the next placement attempt takes. Invariant: > every epoch used for
    /// this segment.
    next_epoch: Epoch,
    /// The epoch the coordinator knows this segment's replicas at. Invariants: 1. ≤
    /// `epoch`. 2. While the segment is open and this is below `epoch`, no byte is
    /// written past what the replicas held when they were re-created: a recovery must
    /// still count the copies left behind at the older epoch, which therefore may lack
    /// nothing acknowledged.
    recorded_epoch: Epoch,
    /// Bytes every live replica holds.
    len: u32,
    /// The footer is among those bytes.
    closed: bool,
    /// R slots; slot 0 holds the primary. `None`: lost (or not yet placed).
    replicas: Vec<Option<Replica<L>>>,
}

impl<L> SegmentReplicas<L> {
    /// Segment `id`, seen first holding `len` bytes, to be kept on `replicas` backups.
    pub fn new(id: SegmentId, replicas: usize, len: u32) -> SegmentReplicas<L> {
        SegmentReplicas {
            id,
            epoch: FIRST_EPOCH,
            next_epoch: FIRST_EPOCH,
            recorded_epoch: FIRST_EPOCH,
            len,
            closed: false,
            replicas: (0..replicas).map(|_| None).collect(),
        }
    }

    /// The segment.
    pub fn id(&self) -> SegmentId {
        self.id
    }

    /// Bytes every live replica holds.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// No live replica need hold any byte yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment's footer was written.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Slots without a live replica.
    pub fn missing(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_none()).count()
    }

    /// The open segment's replicas were re-created and the coordinator does not know
    /// their epoch yet.
    pub fn unrecorded(&self) -> bool {
        !self.closed && self.recorded_epoch < self.epoch
    }

    /// Fewer than R replicas are live, or a closed segment's replica is not on disk and
    /// no close is under way.
    pub fn under_replicated(&self) -> bool {
        self.missing() > 0 || (self.closed && self.live().any(|(_, r)| !r.closed && !r.closing))
    }

    /// Every slot holds a live replica again — on disk, for a closed segment; all at
    /// the segment's recorded epoch, for the open one — so the copies abandoned on the way may be
    /// freed. Until then an abandoned copy may be the only complete one outside this
    /// master's memory (its backup may only have looked dead, and the replacements may
    /// still be filling), and a crash of this master would need it.
    pub fn whole(&self) -> bool {
        if self.closed {
            self.missing() == 0 && self.live().all(|(_, r)| r.closed)
        } else {
            self.writable(self.len)
        }
    }

    /// The backups holding live replicas.
    pub fn backups(&self) -> impl Iterator<Item = ServerId> + '_ {
        self.live().map(|(_, r)| r.backup)
    }

    /// The live replicas, by slot.
    pub fn live(&self) -> impl Iterator<Item = (usize, &Replica<L>)> {
        self.replicas
            .iter()
            .enumerate()
            .filter_map(|(slot, r)| Some((slot, r.as_ref()?)))
    }

    /// The live replica in `slot`.
    pub fn replica(&self, slot: usize) -> Option<&Replica<L>> {
        self.replicas.get(slot)?.as_ref()
    }

    /// What the driver does next to make every replica live and current. Adopts the
    /// newest placement's epoch as the segment's once every slot is filled and every
    /// survivor bumped to it.
    pub fn step(&mut self) -> Step {
        let slots: Vec<usize> = (0..self.replicas.len())
            .filter(|&slot| self.replicas[slot].is_none())
            .collect();
        if !slots.is_empty() {
            let fresh = slots.len() == self.replicas.len();
            return Step::Place {
                confirm_alive: fresh && self.len > 0 && !self.closed,
                fresh,
                slots,
            };
        }
        // Every slot is filled: the newest replicas at the newest attempt's epoch, any
        // survivors of a loss at older ones.
        let newest = self
            .live()
            .map(|(_, r)| r.epoch)
            .max()
            .unwrap_or(self.epoch);
        if newest != self.epoch {
            if !self.closed {
                let survivors: Vec<usize> = self
                    .live()
                    .filter(|(_, r)| r.epoch != newest)
                    .map(|(slot, _)| slot)
                    .collect();
                if !survivors.is_empty() {
                    return Step::Bump {
                        epoch: newest,
                        survivors,
                    };
                }
            }
            self.epoch = newest;
            if self.len == 0 || self.closed {
                // Nothing to record: each copy left behind is empty, and a recovery
                // never counts a copy without a valid prefix (`recovery_plan`), nor is
                // a lost copy ever written again; or each copy is complete (closed).
                // Recording anyway would stall writes on the coordinator for nothing.
                self.recorded_epoch = newest;
            }
        }
        if self.unrecorded() {
            return Step::Record { epoch: self.epoch };
        }
        Step::Ready
    }

    /// The epoch of a new placement attempt: a new one each time (module doc).
    pub fn take_epoch(&mut self) -> Epoch {
        let epoch = self.next_epoch;
        self.next_epoch = epoch.next();
        epoch
    }

    /// A replica was opened (and filled, and closed if the segment is) for `slot`.
    pub fn placed(&mut self, slot: usize, replica: Replica<L>) {
        debug_assert!(
            replica.epoch < self.next_epoch,
            "placed at an epoch not taken"
        );
        if let Some(r) = self.replicas.get_mut(slot) {
            *r = Some(replica);
        }
    }

    /// The replica in `slot` is lost; `None` if none was live there.
    pub fn lose(&mut self, slot: usize) -> Option<Lost> {
        let replica = self.replicas.get_mut(slot)?.take()?;
        Some(Lost {
            abandoned: Abandoned {
                backup: replica.backup,
                segment: self.id,
                epoch_max: replica.epoch_max,
            },
            primary: slot == 0,
        })
    }

    /// Every replica on `backup` is lost.
    pub fn lose_backup(&mut self, backup: ServerId) -> Vec<Lost> {
        let slots: Vec<usize> = self
            .live()
            .filter(|(_, r)| r.backup == backup)
            .map(|(slot, _)| slot)
            .collect();
        slots
            .into_iter()
            .filter_map(|slot| self.lose(slot))
            .collect()
    }

    /// The bump of `slot` to `epoch` is being sent: until it answers, the backup may
    /// hold the replica at either epoch.
    pub fn bumping(&mut self, slot: usize, epoch: Epoch) {
        if let Some(Some(replica)) = self.replicas.get_mut(slot) {
            replica.epoch_max = replica.epoch_max.max(epoch);
        }
    }

    /// The bump of `slot` to `epoch` succeeded.
    pub fn bumped(&mut self, slot: usize, epoch: Epoch) {
        if let Some(Some(replica)) = self.replicas.get_mut(slot) {
            replica.epoch = epoch;
            replica.epoch_max = replica.epoch_max.max(epoch);
        }
    }

    /// The coordinator recorded `epoch` for this segment.
    pub fn recorded(&mut self, epoch: Epoch) {
        self.recorded_epoch = self.recorded_epoch.max(epoch);
    }

    /// Whether bytes from `start` may be written to the replicas now: every slot live
    /// and at the recorded epoch, the segment open, and `start` where its bytes end.
    pub fn writable(&self, start: u32) -> bool {
        !self.closed
            && start == self.len
            && self.missing() == 0
            && self.recorded_epoch == self.epoch
            && self.live().all(|(_, r)| r.epoch == self.epoch)
    }

    /// Every live replica holds the first `end` bytes (those whose write failed were
    /// marked lost first).
    pub fn wrote(&mut self, end: u32) {
        self.len = self.len.max(end);
    }

    /// The footer was written: the segment is closed. Returns the slots to send
    /// `CloseReplica` to (marked closing).
    pub fn close(&mut self) -> Vec<usize> {
        self.closed = true;
        let mut slots = Vec::new();
        for (slot, r) in self.replicas.iter_mut().enumerate() {
            let Some(replica) = r else { continue };
            if replica.closed || replica.closing {
                continue;
            }
            replica.closing = true;
            slots.push(slot);
        }
        slots
    }

    /// The close of frame `handle` in `slot` answered: on disk (`closed`) or not. Returns
    /// the replica's backup, or `None` when the slot holds another replica since.
    pub fn close_answered(
        &mut self,
        slot: usize,
        handle: FrameHandle,
        closed: bool,
    ) -> Option<ServerId> {
        let replica = self
            .replicas
            .get_mut(slot)?
            .as_mut()
            .filter(|r| r.handle == handle)?;
        replica.closing = false;
        replica.closed = closed;
        Some(replica.backup)
    }
}

/// Of `asked`, the segments whose copies on `backup` a log with the replicas `segments`
/// no longer needs there (docs/design.md §7, "Collecting replicas nobody needs"):
/// * one no longer tracked, below the newest tracked: freed from the log, after the
///   digest that left it out was on every replica, so no recovery reads it again;
/// * one tracked and [`whole`](SegmentReplicas::whole) with none of its live replicas on
///   `backup`: an abandoned copy (its backup left the list, or came back under a new id),
///   and every copy a recovery would need is elsewhere. Until whole, an abandoned copy
///   may be the only complete one outside this master's memory, so it is kept.
///
/// A segment above the newest tracked is kept: it is not this log's to judge.
pub fn unneeded_on<L>(
    segments: &BTreeMap<SegmentId, SegmentReplicas<L>>,
    backup: ServerId,
    asked: &[SegmentId],
) -> Vec<SegmentId> {
    let Some(&newest) = segments.keys().next_back() else {
        return Vec::new();
    };
    asked
        .iter()
        .copied()
        .filter(|id| match segments.get(id) {
            Some(segment) => segment.whole() && !segment.backups().any(|b| b == backup),
            None => *id < newest,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEGMENT: SegmentId = SegmentId(5);

    /// Drives `segment` to `Ready` with every action succeeding; returns the backups
    /// placed and the epochs they got.
    fn settle(segment: &mut SegmentReplicas<()>, next_backup: &mut u64) -> Vec<(ServerId, Epoch)> {
        let mut placed = Vec::new();
        loop {
            match segment.step() {
                Step::Place { slots, .. } => {
                    let epoch = segment.take_epoch();
                    for slot in slots {
                        let backup = ServerId(*next_backup);
                        *next_backup += 1;
                        segment.placed(
                            slot,
                            Replica::new(backup, FrameHandle(*next_backup), epoch, ()),
                        );
                        placed.push((backup, epoch));
                    }
                }
                Step::Bump { epoch, survivors } => {
                    for slot in survivors {
                        segment.bumping(slot, epoch);
                        segment.bumped(slot, epoch);
                    }
                }
                Step::Record { epoch } => segment.recorded(epoch),
                Step::Ready => return placed,
            }
        }
    }

    #[test]
    fn a_new_segment_is_placed_fresh_at_the_first_epoch_and_needs_no_record() {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 3, 0);
        assert!(!segment.writable(0));
        assert_eq!(
            segment.step(),
            Step::Place {
                slots: vec![0, 1, 2],
                fresh: true,
                confirm_alive: false
            }
        );
        let placed = settle(&mut segment, &mut 10);
        assert!(placed.iter().all(|&(_, epoch)| epoch == Epoch(1)));
        assert!(segment.writable(0));
        assert!(
            !segment.writable(1),
            "a write must start where the bytes end"
        );
    }

    #[test]
    fn copies_are_unneeded_once_freed_or_abandoned_with_the_segment_whole_elsewhere() {
        let mut segments = BTreeMap::new();
        let mut whole = SegmentReplicas::<()>::new(SegmentId(3), 2, 0);
        settle(&mut whole, &mut 1);
        assert!(whole.whole());
        segments.insert(SegmentId(3), whole);
        let placing = SegmentReplicas::<()>::new(SegmentId(5), 2, 0);
        assert!(!placing.whole());
        segments.insert(SegmentId(5), placing);
        let asked = [SegmentId(1), SegmentId(3), SegmentId(5), SegmentId(7)];
        // Backup 9 holds none of the live replicas: 1 was freed, 3 is whole elsewhere,
        // 5 is not whole yet, 7 is not this log's to judge.
        assert_eq!(
            unneeded_on(&segments, ServerId(9), &asked),
            vec![SegmentId(1), SegmentId(3)]
        );
        // Backup 1 holds a live replica of 3.
        assert_eq!(
            unneeded_on(&segments, ServerId(1), &asked),
            vec![SegmentId(1)]
        );
        assert!(unneeded_on(
            &BTreeMap::<SegmentId, SegmentReplicas<()>>::new(),
            ServerId(9),
            &asked
        )
        .is_empty());
    }

    #[test]
    fn a_lost_replica_of_the_open_segment_is_replaced_at_a_new_epoch_then_survivors_bumped_then_recorded(
    ) {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 3, 0);
        settle(&mut segment, &mut 10);
        segment.wrote(100);
        let lost = segment.lose(1).expect("slot 1 is live");
        assert_eq!(lost.abandoned.epoch_max, Epoch(1));
        assert!(!segment.writable(100));
        assert_eq!(
            segment.step(),
            Step::Place {
                slots: vec![1],
                fresh: false,
                confirm_alive: false
            }
        );
        let epoch = segment.take_epoch();
        assert_eq!(epoch, Epoch(2));
        segment.placed(1, Replica::new(ServerId(20), FrameHandle(7), epoch, ()));
        assert_eq!(
            segment.step(),
            Step::Bump {
                epoch: Epoch(2),
                survivors: vec![0, 2]
            }
        );
        segment.bumped(0, Epoch(2));
        segment.bumped(2, Epoch(2));
        // Nothing goes past the 100 bytes every copy held until the coordinator knows.
        assert_eq!(segment.step(), Step::Record { epoch: Epoch(2) });
        assert!(!segment.writable(100));
        segment.recorded(Epoch(2));
        assert_eq!(segment.step(), Step::Ready);
        assert!(segment.writable(100));
    }

    #[test]
    fn a_new_segment_whose_first_placement_partly_failed_moves_on_without_recording() {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 2, 0);
        let Step::Place { .. } = segment.step() else {
            panic!("a new segment is placed")
        };
        let first = segment.take_epoch();
        segment.placed(0, Replica::new(ServerId(10), FrameHandle(1), first, ()));
        // Slot 1's open reached its backup and then failed: an empty copy at `first`.
        let second = segment.take_epoch();
        segment.placed(1, Replica::new(ServerId(11), FrameHandle(2), second, ()));
        assert_eq!(
            segment.step(),
            Step::Bump {
                epoch: second,
                survivors: vec![0]
            }
        );
        segment.bumped(0, second);
        // The copy left behind is empty: a recovery never counts it.
        assert_eq!(segment.step(), Step::Ready);
        assert!(segment.writable(0));
    }

    #[test]
    fn a_segment_is_whole_only_once_every_replacement_is_live_recorded_and_on_disk() {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 2, 0);
        settle(&mut segment, &mut 10);
        assert!(segment.whole());
        segment.wrote(100);
        segment.lose(1).expect("slot 1 is live");
        assert!(!segment.whole(), "a replica is missing");
        let Step::Place { .. } = segment.step() else {
            panic!("the lost replica is replaced")
        };
        let epoch = segment.take_epoch();
        segment.placed(1, Replica::new(ServerId(20), FrameHandle(7), epoch, ()));
        assert!(!segment.whole(), "the survivor is not bumped yet");
        segment.bumped(0, epoch);
        segment.step();
        assert!(!segment.whole(), "the new epoch is not recorded yet");
        segment.recorded(epoch);
        assert!(segment.whole());
        // Closed: whole only once every replica is on disk.
        let closing = segment.close();
        assert!(!segment.whole());
        for slot in closing {
            let handle = segment.replica(slot).expect("live").handle;
            segment.close_answered(slot, handle, true);
        }
        assert!(segment.whole());
    }

    #[test]
    fn losing_every_replica_of_an_open_segment_with_bytes_asks_to_confirm_this_master_is_up() {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 2, 0);
        settle(&mut segment, &mut 10);
        segment.wrote(64);
        assert_eq!(segment.lose_backup(ServerId(10)).len(), 1);
        assert_eq!(segment.lose_backup(ServerId(11)).len(), 1);
        assert_eq!(
            segment.step(),
            Step::Place {
                slots: vec![0, 1],
                fresh: true,
                confirm_alive: true
            }
        );
    }

    #[test]
    fn a_closed_segment_s_replacement_is_neither_bumped_nor_recorded() {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 2, 0);
        settle(&mut segment, &mut 10);
        segment.wrote(64);
        assert_eq!(segment.close(), vec![0, 1]);
        assert_eq!(
            segment.close_answered(0, FrameHandle(11), true),
            Some(ServerId(10))
        );
        assert!(!segment.under_replicated(), "slot 1's close is under way");
        assert_eq!(
            segment.close_answered(1, FrameHandle(12), false),
            Some(ServerId(11))
        );
        assert!(segment.under_replicated(), "slot 1 is not on disk");
        segment.lose(1);
        let placed = settle(&mut segment, &mut 20);
        assert_eq!(placed, vec![(ServerId(20), Epoch(2))]);
        assert!(!segment.unrecorded());
        assert!(
            !segment.writable(64),
            "a closed segment takes no more bytes"
        );
    }

    #[test]
    fn a_failed_bump_abandons_the_survivor_at_the_epoch_it_may_have_reached() {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 2, 0);
        settle(&mut segment, &mut 10);
        segment.wrote(64);
        segment.lose(1);
        let Step::Place { .. } = segment.step() else {
            panic!("slot 1 is empty")
        };
        let epoch = segment.take_epoch();
        segment.placed(1, Replica::new(ServerId(20), FrameHandle(7), epoch, ()));
        segment.bumping(0, epoch);
        let lost = segment.lose(0).expect("slot 0 is live");
        assert_eq!(lost.abandoned.epoch_max, epoch);
        assert!(lost.primary);
    }

    #[test]
    fn a_close_answer_for_a_replaced_replica_is_ignored() {
        let mut segment = SegmentReplicas::<()>::new(SEGMENT, 1, 0);
        settle(&mut segment, &mut 10);
        segment.close();
        segment.lose(0);
        settle(&mut segment, &mut 20);
        assert_eq!(segment.close_answered(0, FrameHandle(11), true), None);
    }

    /// One event of the property test's world.
    #[derive(Clone, Debug)]
    enum Event {
        /// A batch writes this many bytes; the replicas whose bit is set fail.
        Write { bytes: u32, fails: u8 },
        /// Every replica on the backup of this slot is lost (it looked dead).
        BackupDies { slot: usize },
        /// The footer goes on.
        Close,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => (1u32..500, any::<u8>()).prop_map(|(bytes, fails)| Event::Write { bytes, fails }),
            1 => (0usize..3).prop_map(|slot| Event::BackupDies { slot }),
            1 => Just(Event::Close),
        ]
    }

    /// A copy of the segment on a backup, as the world sees it (the machine may not
    /// know of it any more).
    #[derive(Clone, Debug)]
    struct Copy {
        backup: ServerId,
        epoch: Epoch,
        len: u32,
        /// Freed by an epoch-bounded free.
        freed: bool,
    }

    /// The world: every copy ever opened, what the coordinator recorded, what was
    /// acknowledged, and outcomes drawn from `luck`.
    struct World {
        copies: Vec<Copy>,
        recorded: Epoch,
        acknowledged: u32,
        luck: std::vec::IntoIter<bool>,
        /// Backups are picked round-robin from [`BACKUPS`], skipping those holding a live
        /// replica (as the selector does), so a backup that lost a copy may get a new one.
        next_backup: u64,
        epochs_taken: Vec<Epoch>,
        /// Copies given up on and not freed yet: their backups may be slow to answer,
        /// so a recovery may still find them.
        to_free: Vec<Abandoned>,
    }

    /// Backups in the property test's world.
    const BACKUPS: u64 = 5;

    impl World {
        /// Whether the next action succeeds (most do; runs out into success).
        fn lucky(&mut self) -> bool {
            self.luck.next().unwrap_or(true)
        }

        /// A backup for a new replica of `segment`.
        fn pick(&mut self, segment: &SegmentReplicas<usize>) -> ServerId {
            loop {
                let backup = ServerId(1 + self.next_backup % BACKUPS);
                self.next_backup += 1;
                if segment.backups().all(|b| b != backup) {
                    return backup;
                }
            }
        }

        fn copy_of(&mut self, backup: ServerId, epoch: Epoch) -> Option<&mut Copy> {
            self.copies
                .iter_mut()
                .find(|c| c.backup == backup && c.epoch == epoch && !c.freed)
        }

        /// Frees `abandoned` as a backup does: every copy of it there at `epoch_max` or
        /// older. No live replica may be among them.
        fn free(&mut self, segment: &SegmentReplicas<usize>, abandoned: Abandoned) {
            for (index, copy) in self.copies.iter_mut().enumerate() {
                if copy.backup == abandoned.backup && copy.epoch <= abandoned.epoch_max {
                    assert!(
                        segment.live().all(|(_, r)| r.link != index),
                        "a free reached a live replica: {abandoned:?}"
                    );
                    copy.freed = true;
                }
            }
        }

        /// Frees what was given up on, as far as luck lets the frees through.
        fn free_some(&mut self, segment: &SegmentReplicas<usize>) {
            for abandoned in std::mem::take(&mut self.to_free) {
                if self.lucky() {
                    self.free(segment, abandoned);
                } else {
                    self.to_free.push(abandoned);
                }
            }
        }

        /// The driver's loop, with outcomes from `luck`.
        fn settle(&mut self, segment: &mut SegmentReplicas<usize>) {
            for _ in 0..1000 {
                // Upkeep may free what was given up on between any two steps (a settle
                // between batches stops after one placement round).
                self.free_some(segment);
                match segment.step() {
                    Step::Place { slots, .. } => {
                        let epoch = segment.take_epoch();
                        assert!(self.epochs_taken.iter().all(|&e| e < epoch));
                        self.epochs_taken.push(epoch);
                        for slot in slots {
                            let backup = self.pick(segment);
                            let len = segment.len();
                            self.copies.push(Copy {
                                backup,
                                epoch,
                                len,
                                freed: false,
                            });
                            let link = self.copies.len() - 1;
                            if self.lucky() {
                                segment.placed(
                                    slot,
                                    Replica::new(backup, FrameHandle(0), epoch, link),
                                );
                            } else {
                                // Opened, then the fill failed part way.
                                self.copies[link].len = len / 2;
                                self.to_free.push(Abandoned {
                                    backup,
                                    segment: SEGMENT,
                                    epoch_max: epoch,
                                });
                            }
                        }
                    }
                    Step::Bump { epoch, survivors } => {
                        for slot in survivors {
                            segment.bumping(slot, epoch);
                            let (backup, from) = match segment.replica(slot) {
                                Some(r) => (r.backup, r.epoch),
                                None => continue,
                            };
                            let landed = self.lucky();
                            if let Some(copy) = self.copy_of(backup, from) {
                                if landed {
                                    copy.epoch = epoch;
                                }
                            }
                            if landed && self.lucky() {
                                segment.bumped(slot, epoch);
                            } else {
                                // No answer: the bump may or may not have landed.
                                let lost = segment.lose(slot).map(|l| l.abandoned);
                                self.to_free.extend(lost);
                            }
                        }
                    }
                    Step::Record { epoch } => {
                        if self.lucky() {
                            self.recorded = self.recorded.max(epoch);
                            segment.recorded(epoch);
                        }
                    }
                    Step::Ready => return,
                }
            }
            panic!("the replicas never settled");
        }

        /// Every copy a recovery would count holds every acknowledged byte. Like
        /// `coordinator::recovery_plan`, it counts an open segment's copies at the
        /// recorded epoch or newer that hold a valid prefix (empty ones do not).
        fn check(&self, segment: &SegmentReplicas<usize>) -> Result<(), TestCaseError> {
            if segment.is_closed() {
                return Ok(());
            }
            for copy in self.copies.iter().filter(|c| !c.freed && c.len > 0) {
                if copy.epoch >= self.recorded {
                    prop_assert!(
                        copy.len >= self.acknowledged,
                        "{copy:?} would be counted (recorded epoch {}) but lacks acknowledged bytes up to {}",
                        self.recorded,
                        self.acknowledged
                    );
                }
            }
            Ok(())
        }
    }

    proptest! {
        #[test]
        fn no_copy_a_recovery_counts_lacks_an_acknowledged_byte_and_no_free_reaches_a_live_one(
            events in proptest::collection::vec(event(), 1..40),
            luck in proptest::collection::vec(proptest::bool::weighted(0.8), 0..200),
        ) {
            let mut world = World {
                copies: Vec::new(),
                recorded: Epoch(1),
                acknowledged: 0,
                luck: luck.into_iter(),
                next_backup: 0,
                epochs_taken: Vec::new(),
                to_free: Vec::new(),
            };
            let mut segment = SegmentReplicas::<usize>::new(SEGMENT, 3, 0);
            world.settle(&mut segment);
            for event in events {
                match event {
                    Event::Write { bytes, fails } => {
                        if segment.is_closed() {
                            continue;
                        }
                        let start = segment.len();
                        prop_assert!(segment.writable(start));
                        let end = start + bytes;
                        let live: Vec<(usize, usize)> =
                            segment.live().map(|(slot, r)| (slot, r.link)).collect();
                        for (slot, link) in live {
                            if fails & (1 << slot) != 0 {
                                // Failed part way.
                                world.copies[link].len = start + bytes / 2;
                                let abandoned = segment.lose(slot).map(|l| l.abandoned);
                                world.to_free.extend(abandoned);
                            } else {
                                world.copies[link].len = end;
                            }
                        }
                        segment.wrote(end);
                        world.settle(&mut segment);
                        prop_assert!(segment.writable(end));
                        world.acknowledged = end;
                    }
                    Event::BackupDies { slot } => {
                        // It only looked dead: its copy stays until freed.
                        if let Some(backup) = segment.replica(slot).map(|r| r.backup) {
                            let lost = segment.lose_backup(backup);
                            prop_assert_eq!(lost.len(), 1);
                            world.to_free.extend(lost.iter().map(|l| l.abandoned));
                            world.settle(&mut segment);
                        }
                    }
                    Event::Close => {
                        segment.close();
                    }
                }
                world.check(&segment)?;
                world.free_some(&segment);
            }
            for abandoned in std::mem::take(&mut world.to_free) {
                world.free(&segment, abandoned);
            }
            // Every copy the segment no longer uses was freed: each abandoned one at
            // an epoch bound it had not passed.
            let live: Vec<usize> = segment.live().map(|(_, r)| r.link).collect();
            for (index, copy) in world.copies.iter().enumerate() {
                prop_assert!(copy.freed || live.contains(&index), "{copy:?} is never freed");
            }
        }
    }
}
