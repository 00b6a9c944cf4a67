//! Placement: which backups get a segment's empty slots when [`Settling`] asks for
//! [`Effect::Place`], and the `BackupSelector`'s primary counts kept true as replicas
//! come and go. Pure and synchronous; the replicator and the simulation's master
//! (`rampart-sim`) both place through it, with a `BackupSelector` each.
//!
//! # Decisions
//! * A fresh segment (no replica yet) gets all R backups from one
//!   [`BackupSelector::select`]: distinct failure domains, the first (slot 0, the
//!   primary) by refinement. Otherwise each empty slot gets a
//!   [`BackupSelector::select_replacement`] outside the failure domains of the
//!   segment's other replicas (and of the replacements chosen before it in the same
//!   round); slot 0's is a primary.
//! * Excluded: the backups the caller names — those [`ReplicaFailures::excluded`] lists
//!   now (failed, or refused an open or a close lately).
//! * Every primary the selector counted is given back when the replica does not exist
//!   after all: its open failed ([`open_failed`]), it was lost ([`lost`]), or its
//!   segment was freed ([`lost`] on what `ReplicaFailures::segment_freed` returns).
//!
//! [`Settling`]: super::settling::Settling
//! [`Effect::Place`]: super::settling::Effect::Place
//! [`ReplicaFailures::excluded`]: super::replica_failures::ReplicaFailures::excluded

use rampart_common::ids::ServerId;
use std::collections::HashSet;

use super::backup_selector::{BackupSelector, NotEnoughBackups};
use super::segment_replicas::Lost;
use super::segment_replicas::SegmentReplicas;

/// Backups for the empty `slots` of `segment` (all `replicas` afresh when `fresh`), none
/// in `exclude`, as (slot, backup); see the module doc. The selector counts the
/// primary's backup.
///
/// # Errors
/// [`NotEnoughBackups`] when too few failure domains hold an eligible backup; a
/// replacement chosen before the shortage keeps its count only if it was a primary
/// (given back by the caller's [`open_failed`] if it never opens).
pub fn targets<L>(
    selector: &mut BackupSelector,
    segment: &SegmentReplicas<L>,
    (slots, fresh, replicas): (&[usize], bool, usize),
    exclude: &HashSet<ServerId>,
) -> Result<Vec<(usize, ServerId)>, NotEnoughBackups> {
    if fresh {
        let chosen = selector.select(replicas, exclude)?;
        return Ok(chosen.into_iter().enumerate().collect());
    }
    let mut others: Vec<ServerId> = segment.backups().collect();
    let mut targets = Vec::with_capacity(slots.len());
    for &slot in slots {
        let backup = match selector.select_replacement(&others, slot == 0, exclude) {
            Ok(backup) => backup,
            Err(shortage) => {
                // A primary counted for this round is given back: nothing opens.
                if let Some(&(_, primary)) = targets.iter().find(|(slot, _)| *slot == 0) {
                    selector.primary_freed(primary);
                }
                return Err(shortage);
            }
        };
        others.push(backup);
        targets.push((slot, backup));
    }
    Ok(targets)
}

/// The open of a replica placed in `slot` on `backup` failed: a primary's count is given
/// back (the selector counted it when it chose the backup).
pub fn open_failed(selector: &mut BackupSelector, slot: usize, backup: ServerId) {
    if slot == 0 {
        selector.primary_freed(backup);
    }
}

/// Replicas that are gone (lost to a failure, or freed with their segment): each
/// primary's count is given back.
pub fn lost<'a>(selector: &mut BackupSelector, lost: impl IntoIterator<Item = &'a Lost>) {
    for lost in lost {
        if lost.primary {
            selector.primary_freed(lost.abandoned.backup);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica_manager::backup_selector::BackupInfo;
    use crate::replica_manager::segment_replicas::Replica;
    use rampart_common::ids::{FrameHandle, SegmentId};

    const OWN: ServerId = ServerId(100);

    fn selector(backups: &[(u64, &str)]) -> BackupSelector {
        let mut selector = BackupSelector::new(OWN, 7);
        let infos: Vec<BackupInfo> = backups
            .iter()
            .map(|&(id, domain)| BackupInfo {
                id: ServerId(id),
                failure_domain: domain.into(),
                disk_read_mbps: 100,
            })
            .collect();
        selector.update_backups(&infos);
        selector
    }

    fn primaries(selector: &BackupSelector, backups: &[u64]) -> u32 {
        backups
            .iter()
            .map(|&b| selector.primaries_on(ServerId(b)))
            .sum()
    }

    /// A segment of 3 replicas with `placed` (slot, backup) live.
    fn segment(placed: &[(usize, u64)]) -> SegmentReplicas<()> {
        let mut segment = SegmentReplicas::new(SegmentId(1), 3, 0);
        let epoch = segment.take_epoch();
        for &(slot, backup) in placed {
            segment.placed(
                slot,
                Replica::new(ServerId(backup), FrameHandle(slot as u64 + 1), epoch, ()),
            );
        }
        segment
    }

    #[test]
    fn a_fresh_segment_gets_every_slot_in_distinct_domains_and_one_primary() {
        let all = [1, 2, 3, 4, 5, 6];
        let mut s = selector(&[(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c"), (6, "c")]);
        let chosen = targets(
            &mut s,
            &segment(&[]),
            (&[0, 1, 2], true, 3),
            &HashSet::new(),
        )
        .expect("three domains");
        assert_eq!(
            chosen.iter().map(|(slot, _)| *slot).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        let domains: HashSet<u64> = chosen.iter().map(|(_, b)| b.0.div_ceil(2)).collect();
        assert_eq!(domains.len(), 3, "{chosen:?}");
        assert_eq!(primaries(&s, &all), 1);
        assert_eq!(s.primaries_on(chosen[0].1), 1, "slot 0 holds the primary");
    }

    #[test]
    fn a_replacement_avoids_the_other_replicas_domains_and_the_excluded() {
        let mut s = selector(&[(1, "a"), (2, "b"), (3, "c"), (4, "c"), (5, "d")]);
        let exclude = HashSet::from([ServerId(5)]);
        // Slot 1 lost; the others are on 1 (domain a) and 3 (domain c).
        let chosen = targets(
            &mut s,
            &segment(&[(0, 1), (2, 3)]),
            (&[1], false, 3),
            &exclude,
        )
        .expect("domain b is left");
        assert_eq!(chosen, [(1, ServerId(2))]);
        assert_eq!(
            primaries(&s, &[1, 2, 3, 4, 5]),
            0,
            "a secondary counts nothing"
        );
    }

    #[test]
    fn replacements_of_one_round_avoid_each_others_domains() {
        let mut s = selector(&[(1, "a"), (2, "b"), (3, "b"), (4, "c")]);
        let chosen = targets(
            &mut s,
            &segment(&[(2, 1)]),
            (&[0, 1], false, 3),
            &HashSet::new(),
        )
        .expect("domains b and c");
        let domains: HashSet<&str> = chosen
            .iter()
            .map(|(_, b)| if b.0 == 4 { "c" } else { "b" })
            .collect();
        assert_eq!(domains.len(), 2, "{chosen:?}");
        assert_eq!(
            s.primaries_on(chosen[0].1),
            1,
            "slot 0's replacement is a primary"
        );
    }

    #[test]
    fn a_round_short_of_backups_gives_its_primary_back() {
        let mut s = selector(&[(1, "a"), (2, "b")]);
        // Slots 0 and 2 lost, 1 on backup 1: slot 0 gets backup 2, slot 2 nothing.
        let shortage = targets(
            &mut s,
            &segment(&[(1, 1)]),
            (&[0, 2], false, 3),
            &HashSet::new(),
        );
        assert!(shortage.is_err());
        assert_eq!(primaries(&s, &[1, 2]), 0, "the round placed nothing");
    }

    #[test]
    fn a_failed_open_of_a_primary_gives_its_count_back_fresh_or_not() {
        let mut s = selector(&[(1, "a"), (2, "b"), (3, "c"), (4, "d")]);
        let fresh = targets(
            &mut s,
            &segment(&[]),
            (&[0, 1, 2], true, 3),
            &HashSet::new(),
        )
        .expect("four domains");
        open_failed(&mut s, 0, fresh[0].1);
        assert_eq!(primaries(&s, &[1, 2, 3, 4]), 0);
        let replaced = targets(
            &mut s,
            &segment(&[(1, 1), (2, 2)]),
            (&[0], false, 3),
            &HashSet::new(),
        )
        .expect("domains c and d");
        assert_eq!(primaries(&s, &[1, 2, 3, 4]), 1);
        open_failed(&mut s, 0, replaced[0].1);
        assert_eq!(primaries(&s, &[1, 2, 3, 4]), 0, "a replacement primary too");
        open_failed(&mut s, 1, ServerId(3));
        assert_eq!(
            primaries(&s, &[1, 2, 3, 4]),
            0,
            "a secondary gives nothing back"
        );
    }
}
