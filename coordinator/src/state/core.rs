//! `CoordinatorState`: the fields of the configuration, each with its invariants, and
//! [`CoordinatorState::apply`], which runs one command (the handlers live in the sibling
//! files, by concern) and bumps the version when it changed the configuration.

use super::command::{Command, CommandResult, MoveEnd, OpenMove, Outcome, CLIENT_IDS_START};
use rampart_common::ids::{ClientId, Epoch, MoveId, SegmentId, ServerId, TableId, TabletEpoch};
use rampart_common::tablet::{HashRange, ServerInfo, TableInfo};
use rampart_common::will::Will;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The coordinator's configuration. See the `state` module's docs for the determinism
/// contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorState {
    /// The id the next enlisted server gets.
    /// 1. Starts at 1 and only grows, so ids are never reused.
    /// 2. Greater than every key of `servers`.
    pub(super) next_server_id: u64,
    /// The id the next created table gets.
    /// 1. Starts at 1 and only grows, so a dropped and re-created name gets a new id.
    /// 2. Greater than every key of `tables`.
    pub(super) next_table_id: u64,
    /// Every server ever enlisted, by id.
    /// 1. `servers[id].id == id`.
    /// 2. At most [`SERVERS_MAX`](super::command::SERVERS_MAX) entries.
    pub(super) servers: BTreeMap<ServerId, ServerInfo>,
    /// Every live table, by id.
    /// 1. `tables[id].id == id`.
    /// 2. Its tablets belong to it, are in hash order, contiguous, and cover
    ///    `[0, u64::MAX]`.
    /// 3. Every tablet's owner is a key of `servers` (possibly no longer `Up`).
    /// 4. At most [`TABLES_MAX`](super::command::TABLES_MAX) tables and
    ///    [`TABLETS_MAX`](super::command::TABLETS_MAX) tablets in all.
    pub(super) tables: BTreeMap<TableId, TableInfo>,
    /// Table ids by name.
    /// 1. `names[t.name] == t.id` for every table `t`, and nothing else.
    pub(super) names: BTreeMap<String, TableId>,
    /// The `Up` server at each address.
    /// 1. `up_addrs[s.addr] == s.id` for every `Up` server `s`, and nothing else; so at
    ///    most one `Up` server per address.
    pub(super) up_addrs: BTreeMap<String, ServerId>,
    /// Tablets over all tables (the sum of `tables[..].tablets.len()`).
    pub(super) tablet_count: usize,
    /// The master that received the most recent tablet (`ServerId(0)` before any). The next
    /// tablet goes to the first `Up` master with a larger id, wrapping around, so many small
    /// tables spread over all masters instead of piling onto the first one.
    pub(super) last_placed: ServerId,
    /// The latest will of each master.
    /// 1. Keys are servers of `servers`; a `Removed` server has none.
    /// 2. At most [`WILL_RANGES_MAX`](super::command::WILL_RANGES_MAX) ranges each.
    pub(super) wills: BTreeMap<ServerId, Will>,
    /// Crashed servers whose recovery may proceed with an incomplete log.
    /// 1. Keys are servers of `servers` that are not `Removed`.
    pub(super) allow_loss: BTreeSet<ServerId>,
    /// Per master, the epochs it recorded for open segments whose replicas it
    /// re-created ([`Command::SetOpenEpoch`]).
    /// 1. Keys are servers of `servers` that are not `Removed`.
    /// 2. At most [`OPEN_EPOCH_SEGMENTS_MAX`](super::command::OPEN_EPOCH_SEGMENTS_MAX)
    ///    segments per server: the newest recorded and the one before it. Older ones are
    ///    not needed: two below the head, only a copy holding the footer counts anyway.
    pub(super) open_epochs: BTreeMap<ServerId, BTreeMap<SegmentId, Epoch>>,
    /// Per server, how many times the set of tablets it owns changed (its *tablet
    /// epoch*; absent: 0). Every command bumps each server whose tablets it changes by
    /// exactly one, so a master that applied changes 1..=n knows change n + 1 when it
    /// sees it, and that it missed one when it sees a later one
    /// (`protocol::master::TabletsRequest`).
    /// 1. Keys are servers of `servers` that are not `Removed`.
    pub(super) tablet_epochs: BTreeMap<ServerId, TabletEpoch>,
    /// Per master, a version above every version it ever handed out or holds (its
    /// *version ceiling*; absent: 0, nothing handed out). A master reserves ranges ahead
    /// ([`Command::ReserveVersions`]); a recovered partition raises its new owner's
    /// ceiling above what it replays (twice the crashed one's when loss was allowed,
    /// as such a recovery shifts versions up by the crashed one's ceiling; a chain of
    /// some thirty lossy recoveries of 2^33-version masters would reach `u64::MAX`, where
    /// versions saturate).
    /// 1. Keys are servers of `servers` that are not `Removed`.
    /// 2. Only grow.
    pub(super) version_ceilings: BTreeMap<ServerId, u64>,
    /// Configuration version.
    /// 1. Bumped exactly once by every command that changes the state other than its
    ///    clients; never otherwise.
    pub(super) version: u64,
    // New fields go last: the encoding of a release before them is then a prefix of
    // this one ([`CoordinatorState::decode`]).
    /// The id the next opened client gets.
    /// 1. Starts at [`CLIENT_IDS_START`] and only grows, so client ids are never reused.
    /// 2. Greater than every member of `clients`.
    pub(super) next_client_id: u64,
    /// The clients opened and not expired (whose leases the leader keeps).
    /// 1. At most [`CLIENTS_MAX`](super::command::CLIENTS_MAX).
    pub(super) clients: BTreeSet<ClientId>,
    /// The id the next move gets.
    /// 1. Starts at 1 and only grows: move ids are never reused.
    /// 2. Greater than every key of `moves` and `ended_moves`.
    pub(super) next_move_id: u64,
    /// The open moves (`state::moves`).
    /// 1. At most [`MOVES_MAX`](super::command::MOVES_MAX); keyed by their ids.
    /// 2. Each covers whole tablets of its table, all owned by its source; source and
    ///    target are distinct `Up` masters.
    /// 3. No two overlap.
    pub(super) moves: BTreeMap<MoveId, OpenMove>,
    /// How the newest ended moves ended.
    /// 1. At most [`ENDED_MOVES_KEPT`](super::command::ENDED_MOVES_KEPT); none is open.
    pub(super) ended_moves: BTreeMap<MoveId, MoveEnd>,
    /// The servers being drained (`state::drains`).
    /// 1. Each is `Up`.
    pub(super) draining: BTreeSet<ServerId>,
    /// Whether an operator paused the rebalancer (`state::rebalancing`).
    pub(super) rebalance_paused: bool,
    /// Ranges whose tablets the rebalancer leaves where they are.
    /// 1. At most [`PINNED_MAX`](super::command::PINNED_MAX); each of a live table,
    ///    `start <= end`.
    pub(super) pinned: BTreeSet<HashRange>,
    /// The most megabytes per second a move may copy (0: no cap).
    pub(super) move_cap_mb_s: u32,
    /// The servers removed after a drain (not after a crash): told so, their processes
    /// exit cleanly.
    /// 1. Each is `Removed`.
    pub(super) drained: BTreeSet<ServerId>,
}

impl Default for CoordinatorState {
    fn default() -> Self {
        Self::new()
    }
}

impl CoordinatorState {
    /// An empty configuration: no servers, no tables, version 0.
    pub fn new() -> Self {
        CoordinatorState {
            next_server_id: 1,
            next_table_id: 1,
            servers: BTreeMap::new(),
            tables: BTreeMap::new(),
            names: BTreeMap::new(),
            up_addrs: BTreeMap::new(),
            tablet_count: 0,
            last_placed: ServerId(0),
            wills: BTreeMap::new(),
            allow_loss: BTreeSet::new(),
            open_epochs: BTreeMap::new(),
            tablet_epochs: BTreeMap::new(),
            version_ceilings: BTreeMap::new(),
            next_client_id: CLIENT_IDS_START,
            clients: BTreeSet::new(),
            version: 0,
            next_move_id: 1,
            moves: BTreeMap::new(),
            ended_moves: BTreeMap::new(),
            draining: BTreeSet::new(),
            rebalance_paused: false,
            pinned: BTreeSet::new(),
            move_cap_mb_s: 0,
            drained: BTreeSet::new(),
        }
    }

    /// Applies one command. Deterministic: the same state and command always give the same
    /// new state and result. A rejected command leaves the state untouched.
    pub fn apply(&mut self, command: &Command) -> CommandResult {
        let outcome = match command {
            Command::EnlistServer {
                addr,
                services,
                failure_domain,
                disk_read_mbps,
            } => self.enlist_server(addr, *services, failure_domain, *disk_read_mbps),
            Command::SetServerStatus { id, status } => self.set_server_status(*id, *status),
            Command::CreateTable { name, span } => self.create_table(name, *span),
            Command::DropTable { id } => Ok(self.drop_table(*id)),
            Command::SetWill { server, will } => self.set_will(*server, will),
            Command::RecoveredPartition {
                crashed,
                ranges,
                owner,
            } => self.recovered_partition(*crashed, ranges, *owner),
            Command::AllowLoss { server } => self.allow_loss(*server),
            Command::SetOpenEpoch {
                server,
                segment,
                epoch,
            } => self.set_open_epoch(*server, *segment, *epoch),
            Command::ReserveVersions { server, ceiling } => {
                self.reserve_versions(*server, *ceiling)
            }
            Command::OpenClient => self.open_client(),
            Command::OpenClientWithoutLease => {
                Ok(Outcome::Unchanged(CommandResult::ClientOpened {
                    id: ClientId(0),
                }))
            }
            Command::ExpireClients { clients } => Ok(self.expire_clients(clients)),
            Command::SplitTablet { table, at } => self.split_tablet(*table, *at),
            Command::BeginMove {
                table,
                start,
                end,
                target,
            } => self.begin_move(*table, *start, *end, *target),
            Command::CommitMove { id } => self.commit_move(*id),
            Command::AbortMove { id } => self.abort_move(*id),
            Command::DrainServer { id } => self.drain_server(*id),
            Command::RemoveDrained { id, confirmed } => self.remove_drained(*id, confirmed),
            Command::SetRebalancePaused { paused } => Ok(self.set_rebalance_paused(*paused)),
            Command::PinTablets { range, pin } => self.pin_tablets(*range, *pin),
            Command::SetMoveCap { mb_per_s } => Ok(self.set_move_cap(*mb_per_s)),
        };
        match outcome {
            Ok(Outcome::Changed(result)) => {
                self.version += 1;
                result
            }
            Ok(Outcome::Unchanged(result)) => result,
            Err(reject) => CommandResult::Rejected {
                status: reject.status(),
                detail: reject.to_string(),
            },
        }
    }

    /// The configuration version: bumped by every command that changes the state.
    pub fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::tests::command_strategy;
    use super::*;
    use proptest::prelude::*;
    use rampart_common::tablet::TabletMap;

    /// Applies `commands`, checking after each step the invariants and that a rejected
    /// command changed nothing and a successful one bumped the version at most once
    /// (never for clients, which are not configuration).
    fn run(state: &mut CoordinatorState, commands: &[Command]) -> Vec<CommandResult> {
        commands
            .iter()
            .map(|command| {
                let before = state.clone();
                let result = state.apply(command);
                if let Err(violation) = state.check_invariants() {
                    panic!("after {command:?}: {violation}");
                }
                match &result {
                    CommandResult::Rejected { .. } => assert_eq!(*state, before),
                    _ if *state == before => {}
                    CommandResult::ClientOpened { .. } | CommandResult::ClientsExpired { .. } => {
                        assert_eq!(state.version(), before.version(), "{command:?}")
                    }
                    _ => assert_eq!(state.version(), before.version() + 1, "{command:?}"),
                }
                result
            })
            .collect()
    }

    #[test]
    fn new_state_is_empty_at_version_zero() {
        let state = CoordinatorState::default();
        assert_eq!(state, CoordinatorState::new());
        assert_eq!(state.version(), 0);
        assert_eq!(state.servers().count(), 0);
        assert_eq!(state.tablet_map(), TabletMap::default());
        assert_eq!(state.check_invariants(), Ok(()));
    }

    proptest! {
        #[test]
        fn apply_is_deterministic(commands in prop::collection::vec(command_strategy(), 0..80)) {
            let (mut one, mut two) = (CoordinatorState::new(), CoordinatorState::new());
            let results_one = run(&mut one, &commands);
            let results_two = run(&mut two, &commands);
            prop_assert_eq!(results_one, results_two);
            prop_assert_eq!(&one, &two);
            let bytes_one = bincode::serialize(&one).expect("serializable");
            let bytes_two = bincode::serialize(&two).expect("serializable");
            prop_assert_eq!(bytes_one, bytes_two);
        }

        #[test]
        fn snapshot_then_replay_equals_full_replay(
            commands in prop::collection::vec(command_strategy(), 0..80),
            cut in any::<prop::sample::Index>(),
        ) {
            let k = cut.index(commands.len() + 1);
            let mut full = CoordinatorState::new();
            let full_results = run(&mut full, &commands);

            let mut prefix = CoordinatorState::new();
            let mut results = run(&mut prefix, &commands[..k]);
            let snapshot = bincode::serialize(&prefix).expect("serializable");
            let mut restored: CoordinatorState =
                bincode::deserialize(&snapshot).expect("deserializable");
            prop_assert_eq!(&restored, &prefix);
            prop_assert_eq!(restored.check_invariants(), Ok(()));
            results.extend(run(&mut restored, &commands[k..]));
            prop_assert_eq!(results, full_results);
            prop_assert_eq!(restored, full);
        }
    }
}
