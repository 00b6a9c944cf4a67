//! Open clients: opening one (a new id from a counter, never reused) and expiring those
//! the leader found silent. Clients are not configuration: the version stays.

use super::command::{CommandResult, Outcome, Reject, CLIENTS_MAX, EXPIRE_CLIENTS_MAX};
use super::core::CoordinatorState;
use rampart_common::ids::ClientId;

impl CoordinatorState {
    /// Whether `client` is open (not expired).
    pub fn client_open(&self, client: ClientId) -> bool {
        self.clients.contains(&client)
    }

    /// The clients open (not expired), in id order.
    pub fn open_clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.clients.iter().copied()
    }

    pub(super) fn open_client(&mut self) -> Result<Outcome, Reject> {
        if self.clients.len() >= CLIENTS_MAX {
            return Err(Reject::TooManyClients);
        }
        let id = ClientId(self.next_client_id);
        self.next_client_id += 1;
        self.clients.insert(id);
        // Not configuration: the version stays.
        Ok(Outcome::Unchanged(CommandResult::ClientOpened { id }))
    }

    pub(super) fn expire_clients(&mut self, clients: &[ClientId]) -> Outcome {
        let expired = clients
            .iter()
            .take(EXPIRE_CLIENTS_MAX)
            .filter(|c| self.clients.remove(c))
            .count();
        Outcome::Unchanged(CommandResult::ClientsExpired { expired })
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::{Command, CLIENT_IDS_START};
    use super::*;

    #[test]
    fn clients_get_new_ids_and_expire_for_good_without_moving_the_version() {
        let mut state = CoordinatorState::new();
        let opened = |state: &mut CoordinatorState| match state.apply(&Command::OpenClient) {
            CommandResult::ClientOpened { id } => id,
            other => panic!("{other:?}"),
        };
        let (a, b) = (opened(&mut state), opened(&mut state));
        assert!(a.0 >= CLIENT_IDS_START && b.0 > a.0);
        assert!(state.client_open(a) && state.client_open(b));
        let expire = Command::ExpireClients {
            clients: vec![a, ClientId(999)],
        };
        assert_eq!(
            state.apply(&expire),
            CommandResult::ClientsExpired { expired: 1 }
        );
        assert!(!state.client_open(a) && state.client_open(b));
        assert_eq!(
            state.apply(&expire),
            CommandResult::ClientsExpired { expired: 0 },
            "an expiry is final and repeats change nothing"
        );
        assert!(opened(&mut state).0 > b.0, "ids are never reused");
        assert_eq!(
            state.apply(&Command::OpenClientWithoutLease),
            CommandResult::ClientOpened { id: ClientId(0) },
            "an entry of the release before leases opens nothing"
        );
        assert_eq!(state.version(), 0);
        assert_eq!(state.open_clients().count(), 2);
    }
}
