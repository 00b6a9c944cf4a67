//! Draining servers (docs/design.md §7, "Draining a server"): a server being drained
//! stays `Up` — it serves its tablets until they are moved away, and its backup keeps
//! its replicas for recoveries until every master re-created them elsewhere — but
//! nothing new is placed on it: no table's tablets (`create_table`), no move's range
//! (`BeginMove`), and no recovered partition of a recovery attempt begun since (the
//! recovery driver asks [`CoordinatorState::is_draining`]). The leader's drainer (`coordinator::drainer`)
//! moves its tablets and asks the masters to leave its backup; then
//! [`Command::RemoveDrained`](super::Command::RemoveDrained) removes it, refused while
//! it owns a tablet, is an end of an open move, a crashed server awaits its recovery
//! (which may read its backup), or an `Up` master has not confirmed it left its backup.
//!
//! A recovery that chose its masters before a drain began may still hand a partition to
//! the server; the drainer moves it away again.
//!
//! A server that stops being `Up` (crashed, removed, its address re-enlisted) stops
//! being drained: a crash's recovery takes over what was left.

use super::command::{CommandResult, Outcome, Reject};
use super::core::CoordinatorState;
use rampart_common::ids::ServerId;
use rampart_common::tablet::ServerStatus;

impl CoordinatorState {
    /// The servers being drained, in id order.
    pub fn draining(&self) -> impl Iterator<Item = ServerId> + '_ {
        self.draining.iter().copied()
    }

    /// Whether `server` is being drained: nothing new goes to it.
    pub fn is_draining(&self, server: ServerId) -> bool {
        self.draining.contains(&server)
    }

    /// Whether `server` was removed after a drain (not after a crash).
    pub fn is_drained(&self, server: ServerId) -> bool {
        self.drained.contains(&server)
    }

    /// The tablets `server` owns, over every table.
    pub fn tablets_owned(&self, server: ServerId) -> usize {
        self.tables
            .values()
            .flat_map(|t| &t.tablets)
            .filter(|t| t.owner == server)
            .count()
    }

    /// [`Command::DrainServer`](super::Command::DrainServer).
    pub(super) fn drain_server(&mut self, id: ServerId) -> Result<Outcome, Reject> {
        let server = self.servers.get(&id).ok_or(Reject::UnknownServer(id))?;
        if server.status != ServerStatus::Up {
            return Err(Reject::NotUp(id));
        }
        if self.draining.contains(&id) {
            return Ok(Outcome::Unchanged(CommandResult::DrainBegun {
                id,
                begun: false,
            }));
        }
        if self.tablets_owned(id) > 0 {
            let others = self
                .up_servers()
                .into_iter()
                .any(|s| s.id != id && s.services.master && !self.draining.contains(&s.id));
            if !others {
                return Err(Reject::BadDrain {
                    why: format!(
                        "no other master is up and not being drained to take {id}'s tablets"
                    ),
                });
            }
        }
        self.draining.insert(id);
        Ok(Outcome::Changed(CommandResult::DrainBegun {
            id,
            begun: true,
        }))
    }

    /// [`Command::RemoveDrained`](super::Command::RemoveDrained).
    pub(super) fn remove_drained(
        &mut self,
        id: ServerId,
        confirmed: &[ServerId],
    ) -> Result<Outcome, Reject> {
        let server = self.servers.get(&id).ok_or(Reject::UnknownServer(id))?;
        if server.status == ServerStatus::Removed {
            return Ok(Outcome::Unchanged(CommandResult::StatusSet));
        }
        if !self.draining.contains(&id) {
            return Err(Reject::BadDrain {
                why: format!("{id} is not being drained"),
            });
        }
        let owned = self.tablets_owned(id);
        if owned > 0 {
            return Err(Reject::BadDrain {
                why: format!("{id} still owns {owned} tablets"),
            });
        }
        if let Some(open) = self
            .moves
            .values()
            .find(|m| m.source == id || m.target == id)
        {
            return Err(Reject::BadDrain {
                why: format!("{id} is an end of {}, which is open", open.id),
            });
        }
        // A recovery due or under way may need the replicas on its backup: a master that
        // crashed while it re-created them elsewhere left them the only copies.
        if let Some(crashed) = self.crashed_servers().first() {
            return Err(Reject::BadDrain {
                why: format!("{id} waits for the recovery of {crashed}, which may read its backup"),
            });
        }
        // Every master must have left its backup, those that enlisted since they were
        // asked included.
        if let Some(master) = self
            .up_servers()
            .into_iter()
            .find(|s| s.services.master && s.id != id && !confirmed.contains(&s.id))
        {
            return Err(Reject::BadDrain {
                why: format!("{} has not confirmed it left {id}'s backup", master.id),
            });
        }
        let outcome = self.set_server_status(id, ServerStatus::Removed)?;
        self.drained.insert(id);
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::Command;
    use super::super::test_support::*;
    use super::*;
    use rampart_common::ids::MoveId;
    use rampart_common::status::Status;

    fn drain(state: &mut CoordinatorState, id: ServerId) -> CommandResult {
        state.apply(&Command::DrainServer { id })
    }

    #[test]
    fn a_drained_server_gets_nothing_new_and_is_removed_only_once_it_owns_nothing() {
        let (mut state, ids) = cluster(3);
        let (table, tablets) = created(&mut state, "t", 3);
        let drained = tablets[0].owner;
        let version = state.version();
        assert_eq!(
            drain(&mut state, drained),
            CommandResult::DrainBegun {
                id: drained,
                begun: true
            }
        );
        assert_eq!(state.version(), version + 1);
        // Again: nothing changes.
        assert_eq!(
            drain(&mut state, drained),
            CommandResult::DrainBegun {
                id: drained,
                begun: false
            }
        );
        assert_eq!(state.version(), version + 1);
        assert!(state.is_draining(drained));
        assert_eq!(state.check_invariants(), Ok(()));

        // No new table's tablet lands on it.
        let (_, more) = created(&mut state, "u", 6);
        assert!(more.iter().all(|t| t.owner != drained), "{more:?}");
        // No move goes to it.
        let other = other_than(&ids, drained);
        let elsewhere = tablets.iter().find(|t| t.owner == other).expect("a tablet");
        assert_rejected(
            &mut state,
            begin(table, elsewhere, drained),
            Status::InvalidArgument,
        );
        // Not removed while it owns a tablet, nor while an end of an open move.
        let all = ids.clone();
        assert_rejected(
            &mut state,
            Command::RemoveDrained {
                id: drained,
                confirmed: all.clone(),
            },
            Status::InvalidArgument,
        );
        let id = begun(&mut state, &begin(table, &tablets[0], other));
        assert_eq!(id, MoveId(1));
        commit(&mut state, id);
        let back = tablets.iter().find(|t| t.owner == drained);
        assert!(back.is_none() || state.tablets_owned(drained) == 0);
        assert_eq!(state.tablets_owned(drained), 0);
        // Not while a master has not confirmed it left the backup.
        let others: Vec<ServerId> = ids.iter().copied().filter(|&i| i != drained).collect();
        assert_rejected(
            &mut state,
            Command::RemoveDrained {
                id: drained,
                confirmed: others[..1].to_vec(),
            },
            Status::InvalidArgument,
        );
        // Not while a crashed master's recovery may read its backup.
        let late = enlist(&mut state, "10.0.9.9:7000", BOTH);
        crash(&mut state, late);
        assert_rejected(
            &mut state,
            Command::RemoveDrained {
                id: drained,
                confirmed: all.clone(),
            },
            Status::InvalidArgument,
        );
        state.apply(&Command::SetServerStatus {
            id: late,
            status: ServerStatus::Removed,
        });
        assert_eq!(
            state.apply(&Command::RemoveDrained {
                id: drained,
                confirmed: others.clone(),
            }),
            CommandResult::StatusSet
        );
        assert_eq!(
            state.server(drained).map(|s| s.status),
            Some(ServerStatus::Removed)
        );
        assert!(!state.is_draining(drained));
        assert_eq!(state.check_invariants(), Ok(()));
        // A repeat changes nothing; a drain of a removed server is refused.
        let version = state.version();
        assert_eq!(
            state.apply(&Command::RemoveDrained {
                id: drained,
                confirmed: Vec::new(),
            }),
            CommandResult::StatusSet
        );
        assert_eq!(state.version(), version);
        assert_rejected(
            &mut state,
            Command::DrainServer { id: drained },
            Status::InvalidArgument,
        );
    }

    #[test]
    fn a_drain_is_refused_with_nowhere_to_go_and_ends_when_the_server_crashes() {
        let (mut state, ids) = cluster(2);
        created(&mut state, "t", 2);
        assert!(matches!(
            drain(&mut state, ids[0]),
            CommandResult::DrainBegun { begun: true, .. }
        ));
        // The only other master cannot be drained too: nobody would take its tablets.
        assert_rejected(
            &mut state,
            Command::DrainServer { id: ids[1] },
            Status::InvalidArgument,
        );
        assert_rejected(
            &mut state,
            Command::DrainServer { id: ServerId(99) },
            Status::InvalidArgument,
        );
        // A backup with no tablets drains even with no master free.
        let backup = enlist(&mut state, "10.0.1.1:7000", BACKUP_ONLY);
        assert!(matches!(
            drain(&mut state, backup),
            CommandResult::DrainBegun { begun: true, .. }
        ));
        crash(&mut state, ids[0]);
        assert!(!state.is_draining(ids[0]));
        // Re-enlisting the backup's address crashes it, and ends its drain too.
        enlist(&mut state, "10.0.1.1:7000", BACKUP_ONLY);
        assert!(!state.is_draining(backup));
        assert_eq!(state.check_invariants(), Ok(()));
    }
}
