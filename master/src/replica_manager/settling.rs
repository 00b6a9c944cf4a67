//! `Settling`: one settle of a segment — what to do next until every replica is live
//! and current, and when to stop trying. Pure and synchronous, one layer above
//! `SegmentReplicas::step`: the replicator's `settle` and the simulation's master
//! (`rampart-sim`) each loop on [`Settling::next`], carry out the [`Effect`] it returns
//! (calls to backups and the coordinator, waits) and report the outcome back, so the
//! simulation makes these decisions as the master does.
//!
//! # Decisions
//! * A placement whose segment lost every replica while it held bytes (open) is
//!   preceded by a confirmation that the coordinator still lists this master Up
//!   ([`Effect::ConfirmAlive`]): no survivor's fence could tell it otherwise. Once per
//!   placement attempt.
//! * The survivors of a loss are marked `bumping` before their `BumpEpoch`s are sent
//!   (a bump that gets no answer may have landed: a copy given up on then may be at
//!   the new epoch), and each is handed to the driver with the epoch it moves from.
//! * With [`Patience::OneAttempt`] (upkeep between batches) a settle ends after one
//!   placement round, or as soon as backups are too few or no coordinator records the
//!   epoch; with [`Patience::UntilDone`] (the write path) it goes on, the driver
//!   waiting in between ([`Settling::waits`]).
//! * While it waits for backups, the copies this master gave up on are freed where they
//!   may be ([`Effect::FreeAbandoned`]) before each pause. Upkeep between batches frees
//!   them too, but a write waiting here holds the replicator: without these frees a
//!   master whose backups are full of its own abandoned frames would wait for good.
//!
//! Which backups a placement gets is `placement`'s (through the driver's
//! `BackupSelector`), leaving out those failed or refused lately
//! (`ReplicaFailures::excluded`).

use rampart_common::ids::{Epoch, FrameHandle, ServerId};

use super::segment_replicas::{SegmentReplicas, Step};

/// How long a settle keeps trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patience {
    /// Until every replica exists (the write path: nothing is acknowledged before).
    UntilDone,
    /// One placement round (upkeep between batches: the next tick tries again).
    OneAttempt,
}

/// One `BumpEpoch` to send: the replica in `slot`, on `backup` as frame `handle`, moves
/// from epoch `from` to the effect's epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bump {
    pub slot: usize,
    pub backup: ServerId,
    pub handle: FrameHandle,
    pub from: Epoch,
}

/// What the driver does next ([`Settling::next`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// The settle is over: every replica is live and current, or one attempt was made.
    Done,
    /// Confirm that the coordinator still lists this master Up (a fatal error if it
    /// lists it otherwise), then report [`Settling::alive`].
    ConfirmAlive,
    /// Choose backups for the empty `slots` (all R afresh when `fresh`), then either
    /// report [`Settling::placing`] and open a replica on each at an epoch from
    /// `SegmentReplicas::take_epoch` (`placed`, or the failure to `ReplicaFailures`), or,
    /// when too few backups are left, wait if [`Settling::waits`] and ask again.
    Place { slots: Vec<usize>, fresh: bool },
    /// Send each of `bumps` (already marked `bumping`) to `epoch`: report each success
    /// with `SegmentReplicas::bumped`, each failure to `ReplicaFailures`.
    Bump { epoch: Epoch, bumps: Vec<Bump> },
    /// Record `epoch` at the coordinator (`SetOpenEpoch`): `SegmentReplicas::recorded`
    /// once it is; when no coordinator answers, wait if [`Settling::waits`] and ask
    /// again, else end the settle.
    Record { epoch: Epoch },
    /// Backups were too few ([`Settling::short_of_backups`]): end the failures whose
    /// exclusion is over and free the abandoned copies that may be freed now
    /// (`ReplicaFailures::expire`, then `take_frees`: room on backups that may be full
    /// of them), then pause before asking again.
    FreeAbandoned,
}

/// One settle of one segment; see the module doc.
#[derive(Clone, Debug)]
pub struct Settling {
    patience: Patience,
    /// A placement round was made.
    placed_once: bool,
    /// The coordinator confirmed this master Up for the coming placement.
    alive: bool,
    /// Backups were too few and the settle goes on: free before the next attempt.
    short: bool,
}

impl Settling {
    /// A settle that keeps trying as `patience` allows.
    pub fn new(patience: Patience) -> Settling {
        Settling {
            patience,
            placed_once: false,
            alive: false,
            short: false,
        }
    }

    /// What to do next for `segment`.
    pub fn next<L>(&mut self, segment: &mut SegmentReplicas<L>) -> Effect {
        if std::mem::take(&mut self.short) {
            return Effect::FreeAbandoned;
        }
        match segment.step() {
            Step::Ready => Effect::Done,
            Step::Place {
                slots,
                fresh,
                confirm_alive,
            } => {
                if self.placed_once && self.patience == Patience::OneAttempt {
                    return Effect::Done;
                }
                if confirm_alive && !std::mem::take(&mut self.alive) {
                    return Effect::ConfirmAlive;
                }
                Effect::Place { slots, fresh }
            }
            Step::Bump { epoch, survivors } => {
                let mut bumps = Vec::new();
                for slot in survivors {
                    segment.bumping(slot, epoch);
                    if let Some(replica) = segment.replica(slot) {
                        bumps.push(Bump {
                            slot,
                            backup: replica.backup,
                            handle: replica.handle,
                            from: replica.epoch,
                        });
                    }
                }
                Effect::Bump { epoch, bumps }
            }
            Step::Record { epoch } => Effect::Record { epoch },
        }
    }

    /// The coordinator lists this master Up: the placement that asked may go on.
    pub fn alive(&mut self) {
        self.alive = true;
    }

    /// Backups were chosen for a placement, which is being made: the round counts.
    pub fn placing(&mut self) {
        self.placed_once = true;
    }

    /// Whether to wait and ask again when backups are too few or no coordinator
    /// answers — else the settle ends, to be tried again later.
    pub fn waits(&self) -> bool {
        self.patience == Patience::UntilDone
    }

    /// The placement asked for found too few backups. Whether the settle goes on
    /// ([`Settling::waits`]); if it does, the next effect is [`Effect::FreeAbandoned`].
    pub fn short_of_backups(&mut self) -> bool {
        self.short = self.waits();
        self.short
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica_manager::segment_replicas::Replica;
    use rampart_common::ids::SegmentId;

    /// Places a replica on backup `10 + slot` in each of `slots` at a new epoch.
    fn place(segment: &mut SegmentReplicas<()>, slots: &[usize]) -> Epoch {
        let epoch = segment.take_epoch();
        for &slot in slots {
            let backup = ServerId(10 + slot as u64);
            let handle = FrameHandle(epoch.0 * 10 + slot as u64);
            segment.placed(slot, Replica::new(backup, handle, epoch, ()));
        }
        epoch
    }

    /// An open segment of 3 replicas at epoch 1, recorded, holding 100 bytes.
    fn written() -> SegmentReplicas<()> {
        let mut segment = SegmentReplicas::new(SegmentId(4), 3, 0);
        let mut settling = Settling::new(Patience::UntilDone);
        let Effect::Place { slots, fresh: true } = settling.next(&mut segment) else {
            panic!("a new segment is placed afresh");
        };
        settling.placing();
        place(&mut segment, &slots);
        assert_eq!(settling.next(&mut segment), Effect::Done);
        segment.wrote(100);
        segment
    }

    /// `written`, its replica in slot 1 lost and replaced: the survivors to bump.
    fn replaced() -> (SegmentReplicas<()>, Settling, Epoch) {
        let mut segment = written();
        segment.lose(1);
        let mut settling = Settling::new(Patience::UntilDone);
        assert_eq!(
            settling.next(&mut segment),
            Effect::Place {
                slots: vec![1],
                fresh: false
            }
        );
        settling.placing();
        let epoch = place(&mut segment, &[1]);
        (segment, settling, epoch)
    }

    #[test]
    fn a_new_segment_is_placed_afresh_without_confirmation() {
        let mut segment = SegmentReplicas::<()>::new(SegmentId(4), 2, 0);
        let mut settling = Settling::new(Patience::UntilDone);
        assert_eq!(
            settling.next(&mut segment),
            Effect::Place {
                slots: vec![0, 1],
                fresh: true
            }
        );
    }

    #[test]
    fn a_lost_replica_is_replaced_then_survivors_bumped_then_the_epoch_recorded() {
        let (mut segment, mut settling, epoch) = replaced();
        let Effect::Bump { epoch: to, bumps } = settling.next(&mut segment) else {
            panic!("survivors are bumped");
        };
        assert_eq!(to, epoch);
        let bumped: Vec<(usize, ServerId, Epoch)> =
            bumps.iter().map(|b| (b.slot, b.backup, b.from)).collect();
        assert_eq!(
            bumped,
            vec![(0, ServerId(10), Epoch(1)), (2, ServerId(12), Epoch(1))]
        );
        for bump in &bumps {
            segment.bumped(bump.slot, to);
        }
        assert_eq!(settling.next(&mut segment), Effect::Record { epoch });
        segment.recorded(epoch);
        assert_eq!(settling.next(&mut segment), Effect::Done);
    }

    #[test]
    fn survivors_are_marked_bumping_before_their_bumps_are_sent() {
        let (mut segment, mut settling, epoch) = replaced();
        assert!(matches!(settling.next(&mut segment), Effect::Bump { .. }));
        // A survivor lost before its bump answered may already be at the new epoch.
        let lost = segment.lose(2).expect("slot 2 is live");
        assert_eq!(lost.abandoned.epoch_max, epoch);
    }

    #[test]
    fn an_open_segment_that_lost_every_replica_confirms_alive_before_each_placement() {
        let mut segment = written();
        for slot in 0..3 {
            segment.lose(slot);
        }
        let mut settling = Settling::new(Patience::UntilDone);
        let place = Effect::Place {
            slots: vec![0, 1, 2],
            fresh: true,
        };
        for _ in 0..2 {
            assert_eq!(settling.next(&mut segment), Effect::ConfirmAlive);
            assert_eq!(settling.next(&mut segment), Effect::ConfirmAlive);
            settling.alive();
            assert_eq!(settling.next(&mut segment), place);
            // Too few backups: the next attempt confirms again.
        }
        assert!(settling.waits());
    }

    #[test]
    fn a_settle_short_of_backups_frees_abandoned_copies_before_it_places_again() {
        let mut segment = written();
        segment.lose(1);
        let mut settling = Settling::new(Patience::UntilDone);
        let place = Effect::Place {
            slots: vec![1],
            fresh: false,
        };
        assert_eq!(settling.next(&mut segment), place);
        for _ in 0..3 {
            assert!(settling.short_of_backups(), "the write path waits");
            assert_eq!(settling.next(&mut segment), Effect::FreeAbandoned);
            assert_eq!(settling.next(&mut segment), place, "then it asks again");
        }
        // Upkeep gives up instead: the next tick tries again.
        let mut upkeep = Settling::new(Patience::OneAttempt);
        assert_eq!(upkeep.next(&mut segment), place);
        assert!(!upkeep.short_of_backups(), "the driver ends the settle");
        assert_ne!(upkeep.next(&mut segment), Effect::FreeAbandoned);
    }

    #[test]
    fn one_attempt_ends_after_one_placement_round() {
        let mut segment = written();
        segment.lose(0);
        let mut settling = Settling::new(Patience::OneAttempt);
        assert!(!settling.waits());
        assert!(matches!(settling.next(&mut segment), Effect::Place { .. }));
        settling.placing();
        // The replacement's backup refused it: the slot is still empty.
        assert_eq!(settling.next(&mut segment), Effect::Done);
        // Until done, the settle places again.
        let mut until_done = Settling::new(Patience::UntilDone);
        until_done.placing();
        assert!(matches!(
            until_done.next(&mut segment),
            Effect::Place { .. }
        ));
    }
}
