//! Moves of tablets between masters: beginning one ([`Command::BeginMove`]), and ending
//! it by exactly one of a commit, which hands the tablets to the target, and an abort
//! (docs/design.md §7, "Moving a tablet").
//!
//! # Rules
//! * **Whole tablets of one `Up` owner.** A move covers whole tablets (split first), all
//!   owned by its source, an `Up` master; its target is another `Up` master. Open moves
//!   never overlap, so a range has at most one mover.
//! * **One outcome.** A move ends by its commit or its abort, never both: the first
//!   committed wins, and the other is refused from then on. A retry of the one that won
//!   changes nothing and answers as the first did; so does a `BeginMove` repeated while
//!   its move is open. The last [`ENDED_MOVES_KEPT`] outcomes are kept for those
//!   answers: a master that lost track of a move asks how it ended.
//! * **An endpoint that stops being `Up` aborts the move** in the same command that
//!   declares it crashed or removed (or re-enlists its address), and a dropped table
//!   aborts the moves of its tablets. So an open move's source is `Up` and owns the
//!   range: a recovery (`RecoveredPartition`, which takes only a crashed master's
//!   tablets) never races a commit, and the commit checks the range again all the same.
//! * **The commit** gives every tablet of the range to the target, bumps both owners'
//!   tablet epochs once, and raises the target's version ceiling to the source's: the
//!   target holds the source's versions now, and any version either hands out later
//!   must lie above them.
//! * **Splits go on.** A split inside a moving range keeps both halves with the source
//!   and the range whole tablets of it; the commit moves them all.

use super::command::{
    CommandResult, MoveEnd, OpenMove, Outcome, Reject, ENDED_MOVES_KEPT, MOVES_MAX,
};
use super::core::CoordinatorState;
use rampart_common::ids::{MoveId, ServerId, TableId};
use rampart_common::tablet::{HashRange, ServerStatus, Tablet};

impl CoordinatorState {
    /// The open moves, in id order.
    pub fn open_moves(&self) -> impl Iterator<Item = &OpenMove> {
        self.moves.values()
    }

    /// Move `id` if it is open.
    pub fn open_move(&self, id: MoveId) -> Option<&OpenMove> {
        self.moves.get(&id)
    }

    /// How move `id` ended, if it did and is among the last [`ENDED_MOVES_KEPT`].
    pub fn move_end(&self, id: MoveId) -> Option<MoveEnd> {
        self.ended_moves.get(&id).copied()
    }

    /// [`Command::BeginMove`](super::Command::BeginMove).
    pub(super) fn begin_move(
        &mut self,
        table: TableId,
        start: u64,
        end: u64,
        target: ServerId,
    ) -> Result<Outcome, Reject> {
        let range = HashRange::new(table, start, end);
        if let Some(open) = self.moves.values().find(|m| m.range == range) {
            if open.target == target {
                // A retry while it is open.
                return Ok(Outcome::Unchanged(CommandResult::MoveBegun {
                    id: open.id,
                    source: open.source,
                    begun: false,
                }));
            }
        }
        if start > end {
            return Err(Reject::BadMove {
                why: format!("empty range {start:#x}..={end:#x}"),
            });
        }
        let source = self.whole_tablets_owner(range)?;
        if !self.is_up_master(source) {
            return Err(Reject::OwnerNotUp {
                table,
                at: start,
                owner: source,
            });
        }
        if target == source {
            return Err(Reject::BadMove {
                why: format!("{table} hashes {start:#x}..={end:#x} are on {target} already"),
            });
        }
        if !self.is_up_master(target) {
            return Err(Reject::NotUp(target));
        }
        if self.draining.contains(&target) {
            return Err(Reject::BadMove {
                why: format!("{target} is being drained"),
            });
        }
        if let Some(other) = self.moves.values().find(|m| m.range.overlaps(&range)) {
            return Err(Reject::Moving {
                id: other.id,
                range: other.range,
            });
        }
        if self.moves.len() >= MOVES_MAX {
            return Err(Reject::TooManyMoves);
        }
        let id = MoveId(self.next_move_id);
        self.next_move_id += 1;
        self.moves.insert(
            id,
            OpenMove {
                id,
                range,
                source,
                target,
            },
        );
        Ok(Outcome::Changed(CommandResult::MoveBegun {
            id,
            source,
            begun: true,
        }))
    }

    /// [`Command::CommitMove`](super::Command::CommitMove).
    pub(super) fn commit_move(&mut self, id: MoveId) -> Result<Outcome, Reject> {
        let Some(open) = self.moves.get(&id).cloned() else {
            return match self.ended_moves.get(&id) {
                Some(MoveEnd::Committed) => Ok(Outcome::Unchanged(CommandResult::MoveEnded {
                    id,
                    end: MoveEnd::Committed,
                    tablets: Vec::new(),
                    epochs: Vec::new(),
                })),
                Some(MoveEnd::Aborted) => Err(Reject::MoveEndedOtherwise {
                    id,
                    end: MoveEnd::Aborted,
                }),
                None => Err(Reject::UnknownMove(id)),
            };
        };
        // Kept by the rules of the module doc; checked again all the same: a commit must
        // never take tablets from anyone but an `Up` source that holds them whole.
        let owner = self.whole_tablets_owner(open.range)?;
        if owner != open.source || !self.is_up_master(open.source) {
            return Err(Reject::OwnerNotUp {
                table: open.range.table,
                at: open.range.start,
                owner,
            });
        }
        if !self.is_up_master(open.target) {
            return Err(Reject::NotUp(open.target));
        }
        let mut moved = Vec::new();
        if let Some(info) = self.tables.get_mut(&open.range.table) {
            for tablet in &mut info.tablets {
                if open.range.start <= tablet.start_hash && tablet.end_hash <= open.range.end {
                    tablet.owner = open.target;
                    moved.push(*tablet);
                }
            }
        }
        let source_ceiling = self.version_ceilings.get(&open.source).copied();
        if let Some(ceiling) = source_ceiling {
            let target = self.version_ceilings.entry(open.target).or_default();
            *target = (*target).max(ceiling);
        }
        let epochs = self.bump_tablet_epochs([open.source, open.target]);
        self.end_move(id, MoveEnd::Committed);
        Ok(Outcome::Changed(CommandResult::MoveEnded {
            id,
            end: MoveEnd::Committed,
            tablets: moved,
            epochs,
        }))
    }

    /// [`Command::AbortMove`](super::Command::AbortMove).
    pub(super) fn abort_move(&mut self, id: MoveId) -> Result<Outcome, Reject> {
        if self.moves.contains_key(&id) {
            self.end_move(id, MoveEnd::Aborted);
            return Ok(Outcome::Changed(aborted(id)));
        }
        match self.ended_moves.get(&id) {
            Some(MoveEnd::Aborted) => Ok(Outcome::Unchanged(aborted(id))),
            Some(MoveEnd::Committed) => Err(Reject::MoveEndedOtherwise {
                id,
                end: MoveEnd::Committed,
            }),
            None => Err(Reject::UnknownMove(id)),
        }
    }

    /// Aborts the open moves that `server` is an endpoint of (it is no longer `Up`).
    pub(super) fn abort_moves_of_server(&mut self, server: ServerId) {
        let ids: Vec<MoveId> = self
            .moves
            .values()
            .filter(|m| m.source == server || m.target == server)
            .map(|m| m.id)
            .collect();
        for id in ids {
            self.end_move(id, MoveEnd::Aborted);
        }
    }

    /// Aborts the open moves of table `table` (it was dropped).
    pub(super) fn abort_moves_of_table(&mut self, table: TableId) {
        let ids: Vec<MoveId> = self
            .moves
            .values()
            .filter(|m| m.range.table == table)
            .map(|m| m.id)
            .collect();
        for id in ids {
            self.end_move(id, MoveEnd::Aborted);
        }
    }

    /// Closes open move `id` with `end`, keeping the newest [`ENDED_MOVES_KEPT`]
    /// outcomes.
    fn end_move(&mut self, id: MoveId, end: MoveEnd) {
        self.moves.remove(&id);
        self.ended_moves.insert(id, end);
        while self.ended_moves.len() > ENDED_MOVES_KEPT {
            self.ended_moves.pop_first();
        }
    }

    /// The one owner of the whole tablets that make up `range` exactly: refused if the
    /// table is unknown, if a tablet of it reaches past either end, or if two owners
    /// share it.
    pub(super) fn whole_tablets_owner(&self, range: HashRange) -> Result<ServerId, Reject> {
        let HashRange { table, start, end } = range;
        let info = self.tables.get(&table).ok_or(Reject::UnknownTable(table))?;
        let first = info.tablets.partition_point(|t| t.end_hash < start);
        let inside: Vec<&Tablet> = info.tablets[first..]
            .iter()
            .take_while(|t| t.start_hash <= end)
            .collect();
        let (Some(lowest), Some(highest)) = (inside.first(), inside.last()) else {
            return Err(Reject::UnknownTable(table));
        };
        if lowest.start_hash != start || highest.end_hash != end {
            return Err(Reject::BadMove {
                why: format!(
                    "{table} hashes {start:#x}..={end:#x} are not whole tablets: split at \
                     {start:#x} and after {end:#x} first"
                ),
            });
        }
        let owner = lowest.owner;
        if let Some(other) = inside.iter().find(|t| t.owner != owner) {
            return Err(Reject::BadMove {
                why: format!(
                    "{table} hashes {start:#x}..={end:#x} belong to {owner} and {}: move \
                     one owner's tablets at a time",
                    other.owner
                ),
            });
        }
        Ok(owner)
    }

    /// Whether `server` is an `Up` server that runs a master.
    fn is_up_master(&self, server: ServerId) -> bool {
        self.servers
            .get(&server)
            .is_some_and(|s| s.status == ServerStatus::Up && s.services.master)
    }
}

fn aborted(id: MoveId) -> CommandResult {
    CommandResult::MoveEnded {
        id,
        end: MoveEnd::Aborted,
        tablets: Vec::new(),
        epochs: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::Command;
    use super::super::test_support::*;
    use super::*;
    use rampart_common::ids::TabletEpoch;
    use rampart_common::status::Status;

    #[test]
    fn a_move_begins_once_and_a_repeat_answers_with_it() {
        let (mut state, ids) = cluster(3);
        let (table, tablets) = created(&mut state, "t", 2);
        let target = other_than(&ids, tablets[0].owner);
        let command = begin(table, &tablets[0], target);
        let version = state.version();
        assert_eq!(
            state.apply(&command),
            CommandResult::MoveBegun {
                id: MoveId(1),
                source: tablets[0].owner,
                begun: true
            }
        );
        assert_eq!(state.version(), version + 1);
        let before = state.clone();
        assert_eq!(
            state.apply(&command),
            CommandResult::MoveBegun {
                id: MoveId(1),
                source: tablets[0].owner,
                begun: false
            }
        );
        assert_eq!(state, before, "a repeat changes nothing");
        // Nothing changed owner yet.
        assert_eq!(state.table(table).expect("table").tablets, tablets);
        assert_eq!(state.open_moves().count(), 1);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn a_move_of_anything_but_whole_tablets_of_one_up_owner_to_another_is_refused() {
        let (mut state, ids) = cluster(3);
        let backup = enlist(&mut state, "10.0.0.9:7000", BACKUP_ONLY);
        let (table, tablets) = created(&mut state, "t", 2);
        let (first, second) = (tablets[0], tablets[1]);
        let target = other_than(&ids, first.owner);
        let refused = [
            // Part of a tablet.
            Command::BeginMove {
                table,
                start: first.start_hash + 1,
                end: first.end_hash,
                target,
            },
            Command::BeginMove {
                table,
                start: first.start_hash,
                end: first.end_hash - 1,
                target,
            },
            // Two owners' tablets.
            Command::BeginMove {
                table,
                start: first.start_hash,
                end: second.end_hash,
                target: ids[2],
            },
            Command::BeginMove {
                table,
                start: 9,
                end: 3,
                target,
            },
            begin(table, &first, first.owner),
            begin(table, &first, backup),
            begin(table, &first, ServerId(77)),
            begin(TableId(9), &first, target),
        ];
        for command in refused {
            let status = if matches!(
                command,
                Command::BeginMove {
                    table: TableId(9),
                    ..
                }
            ) {
                Status::TableDoesntExist
            } else {
                Status::InvalidArgument
            };
            assert_rejected(&mut state, command, status);
        }
        // A crashed target, or a crashed owner (its recovery decides: retry).
        let crashed_target = other_than(&ids, first.owner);
        let mut with_crashed = state.clone();
        crash(&mut with_crashed, crashed_target);
        assert_rejected(
            &mut with_crashed,
            begin(table, &first, crashed_target),
            Status::InvalidArgument,
        );
        crash(&mut state, first.owner);
        assert_rejected(&mut state, begin(table, &first, target), Status::Retry);
    }

    #[test]
    fn open_moves_never_overlap_and_are_bounded() {
        let (mut state, ids) = cluster(2);
        let (table, tablets) = created(&mut state, "whole", 1);
        let whole = tablets[0];
        let target = other_than(&ids, whole.owner);
        begun(&mut state, &begin(table, &whole, target));
        // The same range to another target, or a part of it split off.
        let third = enlist(&mut state, "10.0.0.8:7000", BOTH);
        assert_rejected(
            &mut state,
            begin(table, &whole, third),
            Status::InvalidArgument,
        );
        state.apply(&Command::SplitTablet { table, at: 1 << 63 });
        let lower = state.table(table).expect("table").tablets[0];
        assert_rejected(
            &mut state,
            begin(table, &lower, target),
            Status::InvalidArgument,
        );
        // Up to MOVES_MAX open at once.
        let (wide, tablets) = created(&mut state, "wide", 1024);
        for (opened, tablet) in tablets.iter().enumerate() {
            let command = begin(wide, tablet, other_than(&ids, tablet.owner));
            if opened + 1 == MOVES_MAX {
                assert_rejected(&mut state, command, Status::Retry);
                break;
            }
            begun(&mut state, &command);
        }
        assert_eq!(state.open_moves().count(), MOVES_MAX);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn a_commit_hands_the_tablets_over_and_raises_the_targets_ceiling() {
        let (mut state, ids) = cluster(3);
        let (table, tablets) = created(&mut state, "t", 3);
        let (moved, source) = (tablets[1], tablets[1].owner);
        let target = other_than(&ids, source);
        let reserve = |server, ceiling| Command::ReserveVersions { server, ceiling };
        state.apply(&reserve(source, 900));
        state.apply(&reserve(target, 100));
        let id = begun(&mut state, &begin(table, &moved, target));
        let (source_epoch, target_epoch) = (state.tablet_epoch(source), state.tablet_epoch(target));
        let result = state.apply(&Command::CommitMove { id });
        let mine = Tablet {
            owner: target,
            ..moved
        };
        assert_eq!(
            result,
            CommandResult::MoveEnded {
                id,
                end: MoveEnd::Committed,
                tablets: vec![mine],
                epochs: {
                    let mut epochs =
                        vec![(source, source_epoch.next()), (target, target_epoch.next())];
                    epochs.sort();
                    epochs
                },
            }
        );
        assert_eq!(state.table(table).expect("table").tablets[1], mine);
        assert_eq!(state.version_ceilings.get(&target), Some(&900));
        assert_eq!(state.move_end(id), Some(MoveEnd::Committed));
        assert_eq!(state.open_moves().count(), 0);
        // A repeat answers alike, changing nothing; an abort now is refused.
        let before = state.clone();
        assert!(matches!(
            state.apply(&Command::CommitMove { id }),
            CommandResult::MoveEnded {
                end: MoveEnd::Committed,
                ..
            }
        ));
        assert_eq!(state, before);
        assert_rejected(
            &mut state,
            Command::AbortMove { id },
            Status::InvalidArgument,
        );
        // A lower ceiling on the source does not lower the target's.
        let id = begun(&mut state, &begin(table, &mine, source));
        state.apply(&Command::CommitMove { id });
        assert_eq!(state.version_ceilings.get(&source), Some(&900));
        assert_eq!(state.table(table).expect("table").tablets, tablets);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn an_abort_leaves_the_tablets_and_refuses_a_later_commit() {
        let (mut state, ids) = cluster(2);
        let (table, tablets) = created(&mut state, "t", 2);
        let target = other_than(&ids, tablets[0].owner);
        let id = begun(&mut state, &begin(table, &tablets[0], target));
        let epochs: Vec<TabletEpoch> = ids.iter().map(|&id| state.tablet_epoch(id)).collect();
        assert!(matches!(
            state.apply(&Command::AbortMove { id }),
            CommandResult::MoveEnded {
                end: MoveEnd::Aborted,
                ..
            }
        ));
        assert_eq!(state.table(table).expect("table").tablets, tablets);
        let after: Vec<TabletEpoch> = ids.iter().map(|&id| state.tablet_epoch(id)).collect();
        assert_eq!(after, epochs, "nobody's tablets changed");
        let before = state.clone();
        state.apply(&Command::AbortMove { id });
        assert_eq!(state, before, "a repeat changes nothing");
        assert_rejected(
            &mut state,
            Command::CommitMove { id },
            Status::InvalidArgument,
        );
        assert_rejected(
            &mut state,
            Command::CommitMove { id: MoveId(5) },
            Status::InvalidArgument,
        );
        // The range may move again, under a new id.
        assert_eq!(
            begun(&mut state, &begin(table, &tablets[0], target)),
            MoveId(2)
        );
    }

    #[test]
    fn an_endpoint_that_stops_being_up_or_a_dropped_table_aborts_the_move() {
        type Stop = fn(&mut CoordinatorState, ServerId, ServerId, TableId);
        let stops: [(&str, Stop); 5] = [
            ("source crashed", |state, source, _, _| crash(state, source)),
            ("target crashed", |state, _, target, _| crash(state, target)),
            ("target removed", |state, _, target, _| {
                state.apply(&Command::SetServerStatus {
                    id: target,
                    status: ServerStatus::Removed,
                });
            }),
            ("source's address re-enlisted", |state, source, _, _| {
                let addr = state.server(source).expect("source").addr.clone();
                enlist(state, &addr, BOTH);
            }),
            ("table dropped", |state, _, _, table| {
                state.apply(&Command::DropTable { id: table });
            }),
        ];
        for (what, stop) in stops {
            let (mut state, ids) = cluster(3);
            let (table, tablets) = created(&mut state, "t", 2);
            let (source, target) = (tablets[0].owner, other_than(&ids, tablets[0].owner));
            let id = begun(&mut state, &begin(table, &tablets[0], target));
            stop(&mut state, source, target, table);
            assert_eq!(state.move_end(id), Some(MoveEnd::Aborted), "{what}");
            assert_eq!(state.check_invariants(), Ok(()), "{what}");
            assert_rejected(
                &mut state,
                Command::CommitMove { id },
                Status::InvalidArgument,
            );
        }
    }

    #[test]
    fn a_split_inside_a_moving_range_goes_on_and_the_commit_takes_both_halves() {
        let (mut state, ids) = cluster(2);
        let (table, tablets) = created(&mut state, "t", 1);
        let target = other_than(&ids, tablets[0].owner);
        let id = begun(&mut state, &begin(table, &tablets[0], target));
        state.apply(&Command::SplitTablet { table, at: 1 << 40 });
        assert_eq!(state.check_invariants(), Ok(()));
        state.apply(&Command::CommitMove { id });
        let owners: Vec<ServerId> = state
            .table(table)
            .expect("table")
            .tablets
            .iter()
            .map(|t| t.owner)
            .collect();
        assert_eq!(owners, vec![target, target]);
    }

    #[test]
    fn the_newest_outcomes_are_kept_and_ids_never_reused() {
        let (mut state, ids) = cluster(2);
        let (table, tablets) = created(&mut state, "t", 1);
        let target = other_than(&ids, tablets[0].owner);
        for _ in 0..=ENDED_MOVES_KEPT {
            let id = begun(&mut state, &begin(table, &tablets[0], target));
            state.apply(&Command::AbortMove { id });
        }
        assert_eq!(state.move_end(MoveId(1)), None, "the oldest forgotten");
        assert_rejected(
            &mut state,
            Command::AbortMove { id: MoveId(1) },
            Status::InvalidArgument,
        );
        let last = MoveId(ENDED_MOVES_KEPT as u64 + 1);
        assert_eq!(state.move_end(last), Some(MoveEnd::Aborted));
        assert_eq!(
            begun(&mut state, &begin(table, &tablets[0], target)),
            MoveId(last.0 + 1)
        );
        assert_eq!(state.check_invariants(), Ok(()));
    }
}
