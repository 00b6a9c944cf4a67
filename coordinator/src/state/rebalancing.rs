//! The operators' settings of the rebalancer (docs/design.md §7, "Rebalancing"),
//! committed so that every leader after holds to them: whether it is paused, the ranges
//! whose tablets it leaves where they are (pinned), and the cap on the bandwidth of each
//! move (the rebalancer's, a drain's and an operator's alike). The leader's rebalancer
//! (`coordinator::rebalancer`) reads them before each decision; a drain still moves a
//! pinned tablet (a drain is an operator's explicit word).

use super::command::{CommandResult, Outcome, Reject, PINNED_MAX};
use super::core::CoordinatorState;
use rampart_common::tablet::{HashRange, Tablet};

impl CoordinatorState {
    /// Whether an operator paused the rebalancer.
    pub fn rebalance_paused(&self) -> bool {
        self.rebalance_paused
    }

    /// The pinned ranges, in order.
    pub fn pinned(&self) -> impl Iterator<Item = &HashRange> {
        self.pinned.iter()
    }

    /// Whether `tablet` meets a pinned range: the rebalancer neither moves nor splits it.
    pub fn is_pinned(&self, tablet: &Tablet) -> bool {
        let range = tablet.range();
        self.pinned.iter().any(|pinned| pinned.overlaps(&range))
    }

    /// The most megabytes per second a move may copy (0: no cap).
    pub fn move_cap_mb_s(&self) -> u32 {
        self.move_cap_mb_s
    }

    /// [`Command::SetRebalancePaused`](super::Command::SetRebalancePaused).
    pub(super) fn set_rebalance_paused(&mut self, paused: bool) -> Outcome {
        if self.rebalance_paused == paused {
            return Outcome::Unchanged(self.rebalancing_set());
        }
        self.rebalance_paused = paused;
        Outcome::Changed(self.rebalancing_set())
    }

    /// [`Command::SetMoveCap`](super::Command::SetMoveCap).
    pub(super) fn set_move_cap(&mut self, mb_per_s: u32) -> Outcome {
        if self.move_cap_mb_s == mb_per_s {
            return Outcome::Unchanged(self.rebalancing_set());
        }
        self.move_cap_mb_s = mb_per_s;
        Outcome::Changed(self.rebalancing_set())
    }

    /// [`Command::PinTablets`](super::Command::PinTablets).
    pub(super) fn pin_tablets(&mut self, range: HashRange, pin: bool) -> Result<Outcome, Reject> {
        if !self.tables.contains_key(&range.table) {
            return Err(Reject::UnknownTable(range.table));
        }
        if range.start > range.end {
            return Err(Reject::BadPin {
                why: format!("start {:#x} is past end {:#x}", range.start, range.end),
            });
        }
        let before = self.pinned.len();
        if pin {
            if self.pinned.contains(&range) {
                return Ok(Outcome::Unchanged(self.rebalancing_set()));
            }
            if before >= PINNED_MAX {
                return Err(Reject::BadPin {
                    why: format!("{PINNED_MAX} ranges are pinned already"),
                });
            }
            self.pinned.insert(range);
        } else {
            self.pinned.retain(|pinned| !pinned.overlaps(&range));
            if self.pinned.len() == before {
                return Ok(Outcome::Unchanged(self.rebalancing_set()));
            }
        }
        Ok(Outcome::Changed(self.rebalancing_set()))
    }

    fn rebalancing_set(&self) -> CommandResult {
        CommandResult::RebalancingSet {
            paused: self.rebalance_paused,
            pinned: self.pinned.iter().copied().collect(),
            move_cap_mb_s: self.move_cap_mb_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::Command;
    use super::super::test_support::*;
    use super::*;
    use rampart_common::ids::TableId;

    #[test]
    fn pins_hold_for_the_tablets_they_meet_and_go_with_their_table() {
        let mut state = CoordinatorState::new();
        enlist(&mut state, "a:1", BOTH);
        create(&mut state, "t", 2);
        let table = TableId(1);
        let low = HashRange::new(table, 0, 10);
        let pin = |state: &mut CoordinatorState, range, pin| {
            state.apply(&Command::PinTablets { range, pin })
        };
        assert!(matches!(
            pin(&mut state, low, true),
            CommandResult::RebalancingSet { pinned, .. } if pinned == vec![low]
        ));
        let tablets: Vec<Tablet> = state.tables().flat_map(|t| t.tablets.clone()).collect();
        assert!(state.is_pinned(&tablets[0]));
        assert!(!state.is_pinned(&tablets[1]));
        // Repeats change nothing; an unpin removes every range it meets.
        let version = state.version();
        pin(&mut state, low, true);
        assert_eq!(state.version(), version);
        pin(&mut state, HashRange::new(table, 5, 5), false);
        assert!(!state.is_pinned(&tablets[0]));
        assert!(matches!(
            pin(&mut state, HashRange::new(TableId(9), 0, 1), true),
            CommandResult::Rejected { .. }
        ));
        pin(&mut state, low, true);
        state.apply(&Command::DropTable { id: table });
        assert_eq!(state.pinned().count(), 0);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn the_move_cap_is_committed_once() {
        let mut state = CoordinatorState::new();
        let version = state.version();
        state.apply(&Command::SetMoveCap { mb_per_s: 50 });
        state.apply(&Command::SetMoveCap { mb_per_s: 50 });
        assert_eq!((state.move_cap_mb_s(), state.version()), (50, version + 1));
        state.apply(&Command::SetMoveCap { mb_per_s: 0 });
        assert_eq!(state.move_cap_mb_s(), 0);
    }

    #[test]
    fn pausing_is_committed_once() {
        let mut state = CoordinatorState::new();
        let version = state.version();
        state.apply(&Command::SetRebalancePaused { paused: true });
        assert!(state.rebalance_paused());
        state.apply(&Command::SetRebalancePaused { paused: true });
        assert_eq!(state.version(), version + 1);
        state.apply(&Command::SetRebalancePaused { paused: false });
        assert!(!state.rebalance_paused());
    }
}
