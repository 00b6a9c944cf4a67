//! The server list: enlisting a server (which crashes an `Up` one at the same address),
//! moving a server's status forward, and the queries over the list.

use super::command::{CommandResult, Outcome, Reject, SERVERS_MAX, SERVER_FIELD_BYTES_MAX};
use super::core::CoordinatorState;
use rampart_common::ids::ServerId;
use rampart_common::tablet::{ServerInfo, ServerStatus, Services};

impl CoordinatorState {
    /// The server `id`, whatever its status.
    pub fn server(&self, id: ServerId) -> Option<&ServerInfo> {
        self.servers.get(&id)
    }

    /// Every server ever enlisted, in id order.
    pub fn servers(&self) -> impl Iterator<Item = &ServerInfo> {
        self.servers.values()
    }

    /// The `Up` servers, in id order. Costs O(Up servers), however many crashed and
    /// removed servers the list keeps.
    pub fn up_servers(&self) -> Vec<&ServerInfo> {
        let mut up: Vec<&ServerInfo> = self
            .up_addrs
            .values()
            .filter_map(|id| self.servers.get(id))
            .collect();
        up.sort_unstable_by_key(|s| s.id);
        up
    }

    /// The servers declared crashed and not yet removed: those whose recovery is due or
    /// under way, in id order.
    pub fn crashed_servers(&self) -> Vec<ServerId> {
        self.servers
            .values()
            .filter(|s| s.status == ServerStatus::Crashed)
            .map(|s| s.id)
            .collect()
    }

    pub(super) fn enlist_server(
        &mut self,
        addr: &str,
        services: Services,
        failure_domain: &str,
        disk_read_mbps: u32,
    ) -> Result<Outcome, Reject> {
        if addr.is_empty() {
            return Err(Reject::AddrEmpty);
        }
        for (field, value) in [("address", addr), ("failure domain", failure_domain)] {
            if value.len() > SERVER_FIELD_BYTES_MAX {
                return Err(Reject::ServerFieldTooLong {
                    field,
                    len: value.len(),
                });
            }
        }
        if self.servers.len() >= SERVERS_MAX {
            return Err(Reject::TooManyServers);
        }

        // Never overflows: SERVERS_MAX bounds the number of enlistments.
        let id = ServerId(self.next_server_id);
        self.next_server_id += 1;
        if let Some(old) = self.up_addrs.insert(addr.to_owned(), id) {
            // A process restarted at the same address lost its DRAM: the old server is
            // gone, and recovery (later) reassigns its tablets.
            if let Some(old) = self.servers.get_mut(&old) {
                old.status = ServerStatus::Crashed;
            }
            self.abort_moves_of_server(old);
            self.draining.remove(&old);
        }
        self.servers.insert(
            id,
            ServerInfo {
                id,
                addr: addr.to_owned(),
                services,
                status: ServerStatus::Up,
                failure_domain: failure_domain.to_owned(),
                disk_read_mbps,
            },
        );
        Ok(Outcome::Changed(CommandResult::Enlisted { id }))
    }

    pub(super) fn set_server_status(
        &mut self,
        id: ServerId,
        status: ServerStatus,
    ) -> Result<Outcome, Reject> {
        let server = self.servers.get_mut(&id).ok_or(Reject::UnknownServer(id))?;
        if server.status == status {
            return Ok(Outcome::Unchanged(CommandResult::StatusSet));
        }
        if rank(status) < rank(server.status) {
            return Err(Reject::StatusBackwards {
                id,
                from: server.status,
                to: status,
            });
        }
        if server.status == ServerStatus::Up {
            self.up_addrs.remove(&server.addr);
        }
        // A crashed server keeps its tablets: recovery reassigns them
        // (`RecoveredPartition`), then marks it removed. Its moves end here.
        server.status = status;
        self.abort_moves_of_server(id);
        self.draining.remove(&id);
        if status == ServerStatus::Removed {
            self.wills.remove(&id);
            self.allow_loss.remove(&id);
            self.open_epochs.remove(&id);
            self.tablet_epochs.remove(&id);
            self.version_ceilings.remove(&id);
        }
        Ok(Outcome::Changed(CommandResult::StatusSet))
    }
}

/// Position of a status in its only allowed direction of travel.
fn rank(status: ServerStatus) -> u8 {
    match status {
        ServerStatus::Up => 0,
        ServerStatus::Crashed => 1,
        ServerStatus::Removed => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::Command;
    use super::super::test_support::*;
    use super::*;
    use rampart_common::status::Status;

    #[test]
    fn enlist_assigns_increasing_ids_from_one() {
        let (state, ids) = cluster(3);
        assert_eq!(ids, vec![ServerId(1), ServerId(2), ServerId(3)]);
        assert_eq!(state.version(), 3);
        let server = state.server(ServerId(2)).expect("enlisted");
        assert_eq!(server.addr, "10.0.0.1:7000");
        assert_eq!(server.status, ServerStatus::Up);
        assert_eq!(server.failure_domain, "rack-1");
        assert_eq!(server.disk_read_mbps, 500);
        let listed: Vec<ServerId> = state.servers().map(|s| s.id).collect();
        assert_eq!(listed, ids);
    }

    #[test]
    fn enlist_at_the_address_of_an_up_server_crashes_the_old_one() {
        let (mut state, ids) = cluster(2);
        let (_, tablets) = created(&mut state, "t", 2);
        let again = enlist(&mut state, "10.0.0.0:7000", BOTH);
        assert_eq!(again, ServerId(3));
        assert_eq!(state.version(), 4, "one bump for enlist + crash");
        let old = state.server(ids[0]).expect("kept in the list");
        assert_eq!(old.status, ServerStatus::Crashed);
        assert_eq!(
            state.server(again).map(|s| s.status),
            Some(ServerStatus::Up)
        );
        assert_eq!(
            state.server(ids[1]).map(|s| s.status),
            Some(ServerStatus::Up)
        );
        // The crashed server keeps its tablet until recovery reassigns it.
        assert_eq!(state.tablets_of(ids[0]), vec![tablets[0]]);
        assert!(state.tablets_of(again).is_empty());
        // A third process at that address crashes only the second (the first is already
        // crashed).
        let third = enlist(&mut state, "10.0.0.0:7000", BOTH);
        assert_eq!(
            state.server(again).map(|s| s.status),
            Some(ServerStatus::Crashed)
        );
        assert_eq!(
            state.server(third).map(|s| s.status),
            Some(ServerStatus::Up)
        );
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn enlist_after_the_old_server_was_removed_leaves_it_removed() {
        let (mut state, ids) = cluster(1);
        state.apply(&Command::SetServerStatus {
            id: ids[0],
            status: ServerStatus::Removed,
        });
        let again = enlist(&mut state, "10.0.0.0:7000", BOTH);
        assert_eq!(
            state.server(ids[0]).map(|s| s.status),
            Some(ServerStatus::Removed)
        );
        assert_eq!(
            state.server(again).map(|s| s.status),
            Some(ServerStatus::Up)
        );
    }

    #[test]
    fn enlist_with_bad_fields_is_rejected_without_change() {
        let (mut state, _) = cluster(1);
        let bad = |addr: &str, domain: &str| Command::EnlistServer {
            addr: addr.to_owned(),
            services: BOTH,
            failure_domain: domain.to_owned(),
            disk_read_mbps: 0,
        };
        let long = "x".repeat(SERVER_FIELD_BYTES_MAX + 1);
        assert_rejected(&mut state, bad("", "r"), Status::InvalidArgument);
        assert_rejected(&mut state, bad(&long, "r"), Status::InvalidArgument);
        assert_rejected(&mut state, bad("a:1", &long), Status::InvalidArgument);
    }

    #[test]
    fn set_server_status_moves_forward_and_is_idempotent() {
        let (mut state, ids) = cluster(1);
        let set = |status| Command::SetServerStatus { id: ids[0], status };
        assert_eq!(
            state.apply(&set(ServerStatus::Crashed)),
            CommandResult::StatusSet
        );
        assert_eq!(state.version(), 2);
        let before = state.clone();
        assert_eq!(
            state.apply(&set(ServerStatus::Crashed)),
            CommandResult::StatusSet
        );
        assert_eq!(
            state, before,
            "repeating a status changes nothing, not even the version"
        );
        assert_rejected(&mut state, set(ServerStatus::Up), Status::InvalidArgument);
        assert_eq!(
            state.apply(&set(ServerStatus::Removed)),
            CommandResult::StatusSet
        );
        assert_eq!(state.version(), 3);
        assert_rejected(
            &mut state,
            set(ServerStatus::Crashed),
            Status::InvalidArgument,
        );
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn set_server_status_of_an_unknown_server_is_rejected() {
        let (mut state, _) = cluster(1);
        for id in [ServerId(0), ServerId(2)] {
            let command = Command::SetServerStatus {
                id,
                status: ServerStatus::Crashed,
            };
            assert_rejected(&mut state, command, Status::InvalidArgument);
        }
    }

    #[test]
    fn crashing_a_server_keeps_its_tablets() {
        let (mut state, ids) = cluster(2);
        let (_, tablets) = created(&mut state, "t", 2);
        state.apply(&Command::SetServerStatus {
            id: ids[1],
            status: ServerStatus::Crashed,
        });
        assert_eq!(state.tablets_of(ids[1]), vec![tablets[1]]);
        assert_eq!(state.check_invariants(), Ok(()));
    }
}
