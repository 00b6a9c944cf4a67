//! What the recovery of a crashed master carries on from, whichever coordinator leads:
//! masters' wills, the epochs of re-created open segments, version ceilings, the
//! operator's consent to lose data, and the hand-over of recovered partitions.

use super::command::{
    CommandResult, Outcome, Reject, OPEN_EPOCH_SEGMENTS_MAX, TABLETS_MAX, WILL_RANGES_MAX,
};
use super::core::CoordinatorState;
use rampart_common::ids::{Epoch, SegmentId, ServerId, TabletEpoch};
use rampart_common::tablet::{HashRange, ServerInfo, ServerStatus, Tablet};
use rampart_common::will::Will;
use std::collections::BTreeMap;

impl CoordinatorState {
    /// The will `server` uploaded last.
    pub fn will(&self, server: ServerId) -> Option<&Will> {
        self.wills.get(&server)
    }

    /// Whether the operator let the recovery of `server` proceed with an incomplete log.
    pub fn loss_allowed(&self, server: ServerId) -> bool {
        self.allow_loss.contains(&server)
    }

    /// The version ceiling of `server` (0: it never reserved any).
    pub fn version_ceiling(&self, server: ServerId) -> u64 {
        self.version_ceilings.get(&server).copied().unwrap_or(0)
    }

    /// The epochs `server` recorded for its open segments
    /// ([`Command::SetOpenEpoch`](super::command::Command::SetOpenEpoch)).
    pub fn open_epochs(&self, server: ServerId) -> BTreeMap<SegmentId, Epoch> {
        self.open_epochs.get(&server).cloned().unwrap_or_default()
    }

    pub(super) fn set_will(&mut self, server: ServerId, will: &Will) -> Result<Outcome, Reject> {
        let info = self
            .servers
            .get(&server)
            .ok_or(Reject::UnknownServer(server))?;
        if info.status != ServerStatus::Up {
            return Err(Reject::NotUp(server));
        }
        let bad = |why: &str| Reject::BadWill {
            server,
            why: why.to_owned(),
        };
        if will_ranges(will) > WILL_RANGES_MAX {
            return Err(bad("too many ranges"));
        }
        for partition in &will.partitions {
            check_ranges(&partition.tablets).map_err(bad)?;
        }
        if self.wills.get(&server) == Some(will) {
            return Ok(Outcome::Unchanged(CommandResult::WillSet));
        }
        self.wills.insert(server, will.clone());
        Ok(Outcome::Changed(CommandResult::WillSet))
    }

    pub(super) fn allow_loss(&mut self, server: ServerId) -> Result<Outcome, Reject> {
        let info = self
            .servers
            .get(&server)
            .ok_or(Reject::UnknownServer(server))?;
        if info.status == ServerStatus::Removed {
            return Err(Reject::NotCrashed(server));
        }
        if self.allow_loss.insert(server) {
            Ok(Outcome::Changed(CommandResult::LossAllowed))
        } else {
            Ok(Outcome::Unchanged(CommandResult::LossAllowed))
        }
    }

    /// Refuses a command of a master about its own log unless it is `Up`: one declared
    /// crashed is being recovered and may change nothing of it any more.
    fn require_up(&self, server: ServerId) -> Result<(), Reject> {
        let info = self
            .servers
            .get(&server)
            .ok_or(Reject::UnknownServer(server))?;
        if info.status != ServerStatus::Up {
            return Err(Reject::Crashed(server));
        }
        Ok(())
    }

    pub(super) fn reserve_versions(
        &mut self,
        server: ServerId,
        ceiling: u64,
    ) -> Result<Outcome, Reject> {
        self.require_up(server)?;
        let held = self.version_ceiling(server);
        if ceiling <= held {
            // No entry is made: a command that changes nothing leaves the state exactly
            // as it was.
            return Ok(Outcome::Unchanged(CommandResult::VersionsReserved {
                ceiling: held,
            }));
        }
        self.version_ceilings.insert(server, ceiling);
        Ok(Outcome::Changed(CommandResult::VersionsReserved {
            ceiling,
        }))
    }

    pub(super) fn set_open_epoch(
        &mut self,
        server: ServerId,
        segment: SegmentId,
        epoch: Epoch,
    ) -> Result<Outcome, Reject> {
        self.require_up(server)?;
        let epochs = self.open_epochs.entry(server).or_default();
        if epochs.get(&segment).is_some_and(|held| *held >= epoch) {
            return Ok(Outcome::Unchanged(CommandResult::EpochRecorded));
        }
        epochs.insert(segment, epoch);
        while epochs.len() > OPEN_EPOCH_SEGMENTS_MAX {
            epochs.pop_first();
        }
        Ok(Outcome::Changed(CommandResult::EpochRecorded))
    }

    /// Hands `ranges` of `crashed` over to `owner`. Checks everything before changing
    /// anything (a rejected command changes nothing).
    pub(super) fn recovered_partition(
        &mut self,
        crashed: ServerId,
        ranges: &[HashRange],
        owner: ServerId,
    ) -> Result<Outcome, Reject> {
        let status_of = |id| self.servers.get(&id).map(|s: &ServerInfo| s.status);
        match status_of(crashed) {
            None => return Err(Reject::UnknownServer(crashed)),
            Some(ServerStatus::Crashed) => {}
            Some(_) => return Err(Reject::NotCrashed(crashed)),
        }
        match self.servers.get(&owner) {
            None => return Err(Reject::UnknownServer(owner)),
            Some(s) if s.status != ServerStatus::Up || !s.services.master => {
                return Err(Reject::NotUp(owner))
            }
            Some(_) => {}
        }
        if ranges.len() > WILL_RANGES_MAX {
            return Err(Reject::BadWill {
                server: crashed,
                why: "partition with too many ranges".to_owned(),
            });
        }
        check_ranges(ranges).map_err(|why| Reject::BadWill {
            server: crashed,
            why: why.to_owned(),
        })?;
        // Every hash of every range must lie in a tablet `crashed` owns.
        for &HashRange { table, start, end } in ranges {
            let not_owned = Reject::NotOwned {
                crashed,
                table,
                start,
                end,
            };
            let Some(info) = self.tables.get(&table) else {
                return Err(not_owned);
            };
            let first = info.tablets.partition_point(|t| t.end_hash < start);
            let mut covered_to = start;
            for tablet in &info.tablets[first..] {
                if tablet.start_hash > end {
                    break;
                }
                if tablet.owner != crashed {
                    return Err(not_owned);
                }
                covered_to = tablet.end_hash;
            }
            if first == info.tablets.len() || covered_to < end {
                return Err(not_owned);
            }
        }
        // Splits add at most two tablets per range.
        if self.tablet_count + 2 * ranges.len() > TABLETS_MAX {
            return Err(Reject::TooManyTablets {
                have: self.tablet_count,
                span: u32::try_from(2 * ranges.len()).unwrap_or(u32::MAX),
            });
        }
        let mut handed = Vec::new();
        for &HashRange { table, start, end } in ranges {
            let Some(info) = self.tables.get_mut(&table) else {
                continue;
            };
            let before = info.tablets.len();
            let mut split = Vec::with_capacity(before + 2);
            for tablet in info.tablets.drain(..) {
                if tablet.end_hash < start || tablet.start_hash > end {
                    split.push(tablet);
                    continue;
                }
                if tablet.start_hash < start {
                    split.push(Tablet {
                        end_hash: start - 1,
                        ..tablet
                    });
                }
                let inner = Tablet {
                    table,
                    start_hash: tablet.start_hash.max(start),
                    end_hash: tablet.end_hash.min(end),
                    owner,
                };
                split.push(inner);
                handed.push(inner);
                if tablet.end_hash > end {
                    split.push(Tablet {
                        start_hash: end + 1,
                        ..tablet
                    });
                }
            }
            info.tablets = split;
            self.tablet_count += info.tablets.len() - before;
        }
        // The owner now holds objects of versions below the crashed master's ceiling —
        // shifted up by it when loss was allowed (see `RecoverRequest::version_floor`).
        let crashed_ceiling = self.version_ceiling(crashed);
        let needed = if self.allow_loss.contains(&crashed) {
            crashed_ceiling.saturating_mul(2)
        } else {
            crashed_ceiling
        };
        if needed > self.version_ceiling(owner) {
            self.version_ceilings.insert(owner, needed);
        }
        let epochs = self.bump_tablet_epochs([owner, crashed]);
        let epoch = epochs
            .iter()
            .find(|(server, _)| *server == owner)
            .map_or(TabletEpoch::default(), |(_, epoch)| *epoch);
        Ok(Outcome::Changed(CommandResult::PartitionRecovered {
            tablets: handed,
            epoch,
        }))
    }
}

/// Ranges over all partitions of a will.
pub(super) fn will_ranges(will: &Will) -> usize {
    will.partitions.iter().map(|p| p.tablets.len()).sum()
}

/// Checks that ranges are non-empty, sorted and disjoint.
fn check_ranges(ranges: &[HashRange]) -> Result<(), &'static str> {
    if ranges
        .iter()
        .any(|&HashRange { start, end, .. }| start > end)
    {
        return Err("empty range");
    }
    if ranges
        .windows(2)
        .any(|pair| (pair[0].table, pair[0].end) >= (pair[1].table, pair[1].start))
    {
        return Err("ranges not sorted and disjoint");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::command::Command;
    use super::super::test_support::*;
    use super::*;
    use rampart_common::status::Status;

    #[test]
    fn version_ceilings_only_grow_and_cover_what_a_recovery_hands_over() {
        let (mut state, ids) = cluster(3);
        let reserve = |server, ceiling| Command::ReserveVersions { server, ceiling };
        assert_eq!(
            state.apply(&reserve(ids[0], 100)),
            CommandResult::VersionsReserved { ceiling: 100 }
        );
        assert_eq!(
            state.apply(&reserve(ids[0], 50)),
            CommandResult::VersionsReserved { ceiling: 100 },
            "a lower ceiling changes nothing"
        );
        state.apply(&reserve(ids[1], 10));
        state.apply(&reserve(ids[2], 10));
        // ids[0] crashes; its table goes to ids[1], whose ceiling must now cover the
        // versions it replays (below 100).
        let CommandResult::TableCreated { tablets, .. } = create(&mut state, "t", 3) else {
            panic!("not created");
        };
        crash(&mut state, ids[0]);
        assert_rejected(&mut state, reserve(ids[0], 200), Status::ServerCrashed);
        let lost = tablets
            .iter()
            .find(|t| t.owner == ids[0])
            .expect("a tablet");
        let range = vec![HashRange::new(
            lost.table,
            lost.start_hash,
            lost.start_hash + 9,
        )];
        state.apply(&recovered(ids[0], range, ids[1]));
        assert_eq!(state.version_ceiling(ids[1]), 100);
        // With loss allowed, replayed versions are shifted up by 100: twice that.
        state.apply(&Command::AllowLoss { server: ids[0] });
        let range = vec![HashRange::new(
            lost.table,
            lost.start_hash + 10,
            lost.start_hash + 19,
        )];
        state.apply(&recovered(ids[0], range, ids[2]));
        assert_eq!(state.version_ceiling(ids[2]), 200);
        state.apply(&Command::SetServerStatus {
            id: ids[0],
            status: ServerStatus::Removed,
        });
        assert_eq!(state.version_ceiling(ids[0]), 0);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn recovered_partition_splits_tablets_and_hands_the_ranges_over() {
        let (mut state, ids) = cluster(2);
        let (table, tablets) = created(&mut state, "t", 2);
        let lost = tablets[0];
        crash(&mut state, lost.owner);
        let survivor = ids
            .iter()
            .copied()
            .find(|id| *id != lost.owner)
            .expect("two");
        let mid = lost.end_hash / 2;
        let result = state.apply(&recovered(
            lost.owner,
            vec![HashRange::new(table, 100, mid)],
            survivor,
        ));
        let CommandResult::PartitionRecovered {
            tablets: handed, ..
        } = result
        else {
            panic!("not recovered: {result:?}");
        };
        assert_eq!(
            handed,
            vec![Tablet {
                table,
                start_hash: 100,
                end_hash: mid,
                owner: survivor
            }]
        );
        let now = &state.table(table).expect("table").tablets;
        let shape: Vec<(u64, u64, ServerId)> = now
            .iter()
            .map(|t| (t.start_hash, t.end_hash, t.owner))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, 99, lost.owner),
                (100, mid, survivor),
                (mid + 1, lost.end_hash, lost.owner),
                (tablets[1].start_hash, u64::MAX, tablets[1].owner),
            ]
        );
        assert_eq!(state.check_invariants(), Ok(()));
        // The rest goes too; then the crashed server owns nothing.
        let rest = vec![
            HashRange::new(table, 0, 99),
            HashRange::new(table, mid + 1, lost.end_hash),
        ];
        let result = state.apply(&recovered(lost.owner, rest, survivor));
        assert!(matches!(result, CommandResult::PartitionRecovered { .. }));
        assert!(state.tablets_of(lost.owner).is_empty());
        assert_eq!(state.crashed_servers(), vec![lost.owner]);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn recovered_partition_twice_is_refused_without_change() {
        let (mut state, _) = cluster(2);
        let (table, tablets) = created(&mut state, "t", 2);
        crash(&mut state, tablets[0].owner);
        let range = vec![tablets[0].range()];
        let first = state.apply(&recovered(
            tablets[0].owner,
            range.clone(),
            tablets[1].owner,
        ));
        assert!(matches!(first, CommandResult::PartitionRecovered { .. }));
        let again = recovered(tablets[0].owner, range, tablets[1].owner);
        assert_rejected(&mut state, again, Status::RecoveryFailed);
        // A range reaching into a tablet of a server that is not crashed is refused whole.
        let reaching = vec![HashRange::new(
            table,
            tablets[0].end_hash - 5,
            tablets[0].end_hash + 5,
        )];
        let crashed_again = recovered(tablets[0].owner, reaching, tablets[1].owner);
        assert_rejected(&mut state, crashed_again, Status::RecoveryFailed);
    }

    #[test]
    fn recovered_partition_needs_a_crashed_source_and_an_up_owner() {
        let (mut state, ids) = cluster(3);
        let (table, tablets) = created(&mut state, "t", 1);
        let owner = tablets[0].owner;
        let other = ids.iter().copied().find(|id| *id != owner).expect("three");
        let whole = vec![HashRange::whole(table)];
        // Not crashed yet.
        assert_rejected(
            &mut state,
            recovered(owner, whole.clone(), other),
            Status::RecoveryFailed,
        );
        crash(&mut state, owner);
        // The owner-to-be is crashed too.
        let third = ids
            .iter()
            .copied()
            .find(|id| *id != owner && *id != other)
            .expect("3");
        crash(&mut state, third);
        assert_rejected(
            &mut state,
            recovered(owner, whole.clone(), third),
            Status::InvalidArgument,
        );
        // Unsorted ranges.
        let unsorted = vec![HashRange::new(table, 10, 20), HashRange::new(table, 0, 5)];
        assert_rejected(
            &mut state,
            recovered(owner, unsorted, other),
            Status::InvalidArgument,
        );
        let result = state.apply(&recovered(owner, whole, other));
        assert!(matches!(result, CommandResult::PartitionRecovered { .. }));
    }

    #[test]
    fn wills_are_kept_for_up_servers_and_dropped_on_removal() {
        let (mut state, ids) = cluster(2);
        let (table, _) = created(&mut state, "t", 1);
        let will = Will {
            bytes_max: 1 << 20,
            records_max: 1000,
            partitions: vec![rampart_common::will::Partition {
                tablets: vec![HashRange::whole(table)],
                bytes: 10,
                records: 1,
            }],
        };
        let set = |server| Command::SetWill {
            server,
            will: will.clone(),
        };
        assert_eq!(state.apply(&set(ids[0])), CommandResult::WillSet);
        let version = state.version();
        assert_eq!(state.apply(&set(ids[0])), CommandResult::WillSet);
        assert_eq!(state.version(), version, "the same will changes nothing");
        assert_eq!(state.will(ids[0]), Some(&will));
        crash(&mut state, ids[0]);
        assert_rejected(&mut state, set(ids[0]), Status::InvalidArgument);
        assert_eq!(
            state.apply(&Command::AllowLoss { server: ids[0] }),
            CommandResult::LossAllowed
        );
        assert!(state.loss_allowed(ids[0]));
        assert_eq!(state.check_invariants(), Ok(()));
        state.apply(&Command::SetServerStatus {
            id: ids[0],
            status: ServerStatus::Removed,
        });
        assert_eq!(state.will(ids[0]), None);
        assert!(!state.loss_allowed(ids[0]));
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn set_open_epoch_keeps_the_two_newest_segments_and_is_refused_once_crashed() {
        let (mut state, ids) = cluster(2);
        let set = |segment: u64, epoch: u64| Command::SetOpenEpoch {
            server: ids[0],
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
        };
        assert_eq!(state.apply(&set(4, 2)), CommandResult::EpochRecorded);
        let version = state.version();
        assert_eq!(state.apply(&set(4, 2)), CommandResult::EpochRecorded);
        assert_eq!(state.apply(&set(4, 1)), CommandResult::EpochRecorded);
        assert_eq!(
            state.version(),
            version,
            "an older or equal epoch changes nothing"
        );
        state.apply(&set(5, 3));
        state.apply(&set(7, 2));
        let kept: Vec<(SegmentId, Epoch)> = state.open_epochs(ids[0]).into_iter().collect();
        assert_eq!(
            kept,
            vec![(SegmentId(5), Epoch(3)), (SegmentId(7), Epoch(2))]
        );
        assert!(state.open_epochs(ids[1]).is_empty());
        assert_eq!(state.check_invariants(), Ok(()));
        // A master declared crashed may not move its log any more.
        crash(&mut state, ids[0]);
        assert_rejected(&mut state, set(7, 3), Status::ServerCrashed);
        assert_eq!(
            state.open_epochs(ids[0]).get(&SegmentId(7)),
            Some(&Epoch(2))
        );
        state.apply(&Command::SetServerStatus {
            id: ids[0],
            status: ServerStatus::Removed,
        });
        assert!(state.open_epochs(ids[0]).is_empty());
        assert_eq!(state.check_invariants(), Ok(()));
    }
}
