//! Snapshots: decoding the state (today's encoding, or the shorter ones of the releases
//! before rebalancing, before drains, before moves and before open clients) and checking every invariant of one read from disk before it is
//! installed.

use super::command::{MoveEnd, OpenMove};
use super::command::{
    CLIENTS_MAX, CLIENT_IDS_START, ENDED_MOVES_KEPT, MOVES_MAX, OPEN_EPOCH_SEGMENTS_MAX,
    PINNED_MAX, SERVERS_MAX, TABLES_MAX, TABLETS_MAX, WILL_RANGES_MAX,
};
use super::core::CoordinatorState;
use super::recovery_records::will_ranges;
use rampart_common::ids::{ClientId, Epoch, MoveId, SegmentId, ServerId, TableId, TabletEpoch};
use rampart_common::tablet::{HashRange, ServerInfo, ServerStatus, TableInfo};
use rampart_common::will::Will;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// An invariant of [`CoordinatorState`] that does not hold: a bug, or a corrupt snapshot.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum InvariantViolation {
    /// A server entry is inconsistent.
    #[error("{server}: {what}")]
    Server {
        /// The server.
        server: ServerId,
        /// What is wrong.
        what: &'static str,
    },
    /// A table entry or its tablets are inconsistent.
    #[error("{table}: {what}")]
    Table {
        /// The table.
        table: TableId,
        /// What is wrong.
        what: &'static str,
    },
    /// The name index disagrees with the tables.
    #[error("name index: {what}")]
    NameIndex {
        /// What is wrong.
        what: &'static str,
    },
    /// The address index disagrees with the up servers.
    #[error("address index: {what}")]
    AddrIndex {
        /// What is wrong.
        what: &'static str,
    },
    /// The open clients are inconsistent.
    #[error("clients: {what}")]
    Clients {
        /// What is wrong.
        what: &'static str,
    },
    /// The moves are inconsistent.
    #[error("moves: {what}")]
    Moves {
        /// What is wrong.
        what: &'static str,
    },
    /// The pinned ranges are inconsistent.
    #[error("pinned ranges: {what}")]
    Pinned {
        /// What is wrong.
        what: &'static str,
    },
}

/// The state as releases before open clients encoded it: today's fields but the last
/// ones. Only decoded ([`CoordinatorState::decode`]).
#[derive(Deserialize)]
pub(crate) struct StateWithoutClients {
    next_server_id: u64,
    next_table_id: u64,
    servers: BTreeMap<ServerId, ServerInfo>,
    tables: BTreeMap<TableId, TableInfo>,
    names: BTreeMap<String, TableId>,
    up_addrs: BTreeMap<String, ServerId>,
    tablet_count: usize,
    last_placed: ServerId,
    wills: BTreeMap<ServerId, Will>,
    allow_loss: BTreeSet<ServerId>,
    open_epochs: BTreeMap<ServerId, BTreeMap<SegmentId, Epoch>>,
    tablet_epochs: BTreeMap<ServerId, TabletEpoch>,
    version_ceilings: BTreeMap<ServerId, u64>,
    version: u64,
}

/// The state as releases before rebalancing encoded it: today's fields but the last
/// four.
#[derive(Deserialize)]
pub(crate) struct StateWithoutRebalancing {
    before: StateWithoutDrains,
    draining: BTreeSet<ServerId>,
}

impl From<StateWithoutRebalancing> for CoordinatorState {
    fn from(old: StateWithoutRebalancing) -> CoordinatorState {
        CoordinatorState {
            draining: old.draining,
            ..CoordinatorState::from(old.before)
        }
    }
}

/// The state as releases before drains encoded it: today's fields but the last.
#[derive(Deserialize)]
pub(crate) struct StateWithoutDrains {
    before: StateWithoutMoves,
    next_move_id: u64,
    moves: BTreeMap<MoveId, OpenMove>,
    ended_moves: BTreeMap<MoveId, MoveEnd>,
}

impl From<StateWithoutDrains> for CoordinatorState {
    fn from(old: StateWithoutDrains) -> CoordinatorState {
        CoordinatorState {
            next_move_id: old.next_move_id,
            moves: old.moves,
            ended_moves: old.ended_moves,
            ..CoordinatorState::from(old.before)
        }
    }
}

/// The state as releases before moves encoded it: today's fields but the last three
/// (bincode writes a nested struct's fields one after another, as if inline).
#[derive(Deserialize)]
pub(crate) struct StateWithoutMoves {
    before: StateWithoutClients,
    next_client_id: u64,
    clients: BTreeSet<ClientId>,
}

impl From<StateWithoutMoves> for CoordinatorState {
    fn from(old: StateWithoutMoves) -> CoordinatorState {
        CoordinatorState {
            next_client_id: old.next_client_id,
            clients: old.clients,
            ..CoordinatorState::from(old.before)
        }
    }
}

impl From<StateWithoutClients> for CoordinatorState {
    fn from(old: StateWithoutClients) -> CoordinatorState {
        // Its clients had ids of Raft indexes and no leases: none counts as open, so
        // their writes are refused (`ClientLeaseExpired`) and they connect again.
        CoordinatorState {
            next_server_id: old.next_server_id,
            next_table_id: old.next_table_id,
            servers: old.servers,
            tables: old.tables,
            names: old.names,
            up_addrs: old.up_addrs,
            tablet_count: old.tablet_count,
            last_placed: old.last_placed,
            wills: old.wills,
            allow_loss: old.allow_loss,
            open_epochs: old.open_epochs,
            tablet_epochs: old.tablet_epochs,
            version_ceilings: old.version_ceilings,
            version: old.version,
            next_client_id: CLIENT_IDS_START,
            clients: BTreeSet::new(),
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
}

impl CoordinatorState {
    /// Decodes a state encoded (bincode) by this release, or by one before rebalancing,
    /// drains, moves or open clients existed (see `StateWithoutRebalancing`,
    /// `StateWithoutDrains`, `StateWithoutMoves`, `StateWithoutClients`).
    pub fn decode(bytes: &[u8]) -> Result<CoordinatorState, bincode::Error> {
        use bincode::Options;
        // An older encoding only if the old fields use it up whole: a damaged tail of
        // today's encoding must not pass for an old one (bincode's default ignores
        // trailing bytes).
        let exact = || {
            bincode::DefaultOptions::new()
                .with_fixint_encoding()
                .reject_trailing_bytes()
        };
        bincode::deserialize(bytes).or_else(|error| {
            exact()
                .deserialize::<StateWithoutRebalancing>(bytes)
                .map(CoordinatorState::from)
                .or_else(|_| {
                    exact()
                        .deserialize::<StateWithoutDrains>(bytes)
                        .map(CoordinatorState::from)
                })
                .or_else(|_| {
                    exact()
                        .deserialize::<StateWithoutMoves>(bytes)
                        .map(CoordinatorState::from)
                })
                .or_else(|_| {
                    exact()
                        .deserialize::<StateWithoutClients>(bytes)
                        .map(CoordinatorState::from)
                })
                .map_err(|_| error)
        })
    }

    /// Checks every invariant written on the fields. `apply` keeps them; this is for tests
    /// and for a snapshot read from disk before it is installed.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        for (&id, server) in &self.servers {
            let fail = |what| Err(InvariantViolation::Server { server: id, what });
            if server.id != id {
                return fail("keyed under another id");
            }
            if id.0 == 0 || id.0 >= self.next_server_id {
                return fail("id outside 1..next_server_id");
            }
            let indexed = self.up_addrs.get(&server.addr) == Some(&id);
            if (server.status == ServerStatus::Up) != indexed {
                return fail("up status disagrees with the address index");
            }
        }
        if self.servers.len() > SERVERS_MAX {
            return Err(InvariantViolation::Server {
                server: ServerId(self.next_server_id),
                what: "more than SERVERS_MAX servers",
            });
        }
        for (addr, id) in &self.up_addrs {
            let up = self
                .servers
                .get(id)
                .is_some_and(|s| s.status == ServerStatus::Up && &s.addr == addr);
            if !up {
                return Err(InvariantViolation::AddrIndex {
                    what: "entry without an up server at that address",
                });
            }
        }

        let mut tablet_count = 0;
        for (&id, table) in &self.tables {
            let fail = |what| Err(InvariantViolation::Table { table: id, what });
            if table.id != id {
                return fail("keyed under another id");
            }
            if id.0 == 0 || id.0 >= self.next_table_id {
                return fail("id outside 1..next_table_id");
            }
            if self.names.get(&table.name) != Some(&id) {
                return fail("name not indexed");
            }
            if table.tablets.first().map(|t| t.start_hash) != Some(0)
                || table.tablets.last().map(|t| t.end_hash) != Some(u64::MAX)
            {
                return fail("tablets do not cover [0, u64::MAX]");
            }
            if table.tablets.windows(2).any(|pair| {
                pair[0].end_hash >= pair[1].start_hash || pair[0].end_hash + 1 != pair[1].start_hash
            }) {
                return fail("tablets not contiguous in hash order");
            }
            for tablet in &table.tablets {
                if tablet.table != id {
                    return fail("tablet of another table");
                }
                if tablet.start_hash > tablet.end_hash {
                    return fail("empty tablet");
                }
                if !self.servers.contains_key(&tablet.owner) {
                    return fail("tablet owner never enlisted");
                }
            }
            tablet_count += table.tablets.len();
        }
        if self.tables.len() > TABLES_MAX
            || tablet_count > TABLETS_MAX
            || tablet_count != self.tablet_count
        {
            return Err(InvariantViolation::Table {
                table: TableId(self.next_table_id),
                what: "table or tablet count wrong or over its limit",
            });
        }
        if self.names.len() != self.tables.len() {
            return Err(InvariantViolation::NameIndex {
                what: "entries without a table",
            });
        }
        // What is kept per server exists only for servers that are not removed.
        let kept = |server: ServerId, what: &'static str| {
            let live = self
                .servers
                .get(&server)
                .is_some_and(|s| s.status != ServerStatus::Removed);
            if live {
                Ok(())
            } else {
                Err(InvariantViolation::Server { server, what })
            }
        };
        for (&server, will) in &self.wills {
            kept(server, "will of a server never enlisted or removed")?;
            if will_ranges(will) > WILL_RANGES_MAX {
                return Err(InvariantViolation::Server {
                    server,
                    what: "will with more than WILL_RANGES_MAX ranges",
                });
            }
        }
        for (&server, epochs) in &self.open_epochs {
            kept(server, "open epochs of a server never enlisted or removed")?;
            if epochs.is_empty() || epochs.len() > OPEN_EPOCH_SEGMENTS_MAX {
                return Err(InvariantViolation::Server {
                    server,
                    what: "open epochs of no or too many segments",
                });
            }
        }
        for &server in self.tablet_epochs.keys() {
            kept(server, "tablet epoch of a server never enlisted or removed")?;
        }
        for &server in self.version_ceilings.keys() {
            kept(
                server,
                "version ceiling of a server never enlisted or removed",
            )?;
        }
        for &server in &self.allow_loss {
            kept(server, "loss allowed for a server not crashed or up")?;
        }
        let ids = self.clients.first().zip(self.clients.last());
        if self.clients.len() > CLIENTS_MAX
            || self.next_client_id < CLIENT_IDS_START
            || ids.is_some_and(|(first, last)| {
                first.0 < CLIENT_IDS_START || last.0 >= self.next_client_id
            })
        {
            return Err(InvariantViolation::Clients {
                what: "more than CLIENTS_MAX, or an id outside CLIENT_IDS_START..next_client_id",
            });
        }
        self.check_moves()
    }

    /// The invariants of `moves` and `ended_moves`.
    fn check_moves(&self) -> Result<(), InvariantViolation> {
        let fail = |what| Err(InvariantViolation::Moves { what });
        if self.moves.len() > MOVES_MAX || self.ended_moves.len() > ENDED_MOVES_KEPT {
            return fail("more than MOVES_MAX open or ENDED_MOVES_KEPT ended");
        }
        let highest = self.moves.keys().chain(self.ended_moves.keys()).max();
        if self.next_move_id == 0 || highest.is_some_and(|id| id.0 >= self.next_move_id) {
            return fail("an id outside 1..next_move_id");
        }
        let up_master = |id: ServerId| {
            self.servers
                .get(&id)
                .is_some_and(|s| s.status == ServerStatus::Up && s.services.master)
        };
        let mut ranges: Vec<&HashRange> = Vec::with_capacity(self.moves.len());
        for (&id, open) in &self.moves {
            if open.id != id || self.ended_moves.contains_key(&id) {
                return fail("an open move keyed under another id, or ended too");
            }
            if open.source == open.target || !up_master(open.source) || !up_master(open.target) {
                return fail("an open move whose endpoints are not two up masters");
            }
            if self.whole_tablets_owner(open.range).ok() != Some(open.source) {
                return fail("an open move whose range is not whole tablets of its source");
            }
            if ranges.iter().any(|other| other.overlaps(&open.range)) {
                return fail("two open moves overlap");
            }
            ranges.push(&open.range);
        }
        if self.pinned.len() > PINNED_MAX
            || self
                .pinned
                .iter()
                .any(|r| r.start > r.end || !self.tables.contains_key(&r.table))
        {
            return Err(InvariantViolation::Pinned {
                what: "more than PINNED_MAX pinned ranges, or one empty or of no table",
            });
        }
        if let Some(&server) = self
            .drained
            .iter()
            .find(|id| self.servers.get(id).map(|s| s.status) != Some(ServerStatus::Removed))
        {
            return Err(InvariantViolation::Server {
                server,
                what: "a drained server is not removed",
            });
        }
        if let Some(&server) = self
            .draining
            .iter()
            .find(|id| self.servers.get(id).map(|s| s.status) != Some(ServerStatus::Up))
        {
            return Err(InvariantViolation::Server {
                server,
                what: "a server being drained is not up",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::{Command, CommandResult};
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn states_encoded_before_rebalancing_drains_moves_and_open_clients_decode() {
        let mut state = CoordinatorState::new();
        enlist(&mut state, "a:1", BOTH);
        assert!(matches!(
            create(&mut state, "t", 2),
            CommandResult::TableCreated { .. }
        ));
        state.apply(&Command::OpenClient);
        // The encoding before rebalancing is today's without its last four fields, a
        // bool, an empty set (its length, a u64), a u32 and another empty set.
        let bytes = bincode::serialize(&state).expect("a state encodes");
        let before_rebalancing = &bytes[..bytes.len() - 21];
        assert_eq!(
            CoordinatorState::decode(before_rebalancing)
                .expect("the encoding before rebalancing decodes"),
            state
        );
        // Before drains, without the one before those, an empty set.
        let before_drains = &before_rebalancing[..before_rebalancing.len() - 8];
        assert_eq!(
            CoordinatorState::decode(before_drains).expect("the encoding before drains decodes"),
            state
        );
        // Before moves, without the three fields before it: the counter (a u64) and two
        // empty maps (their lengths, a u64 each).
        let before_moves = &before_drains[..before_drains.len() - 24];
        assert_eq!(
            CoordinatorState::decode(before_moves).expect("the encoding before moves decodes"),
            state
        );
        // Before open clients, without the two fields before those: a set of one
        // client (its length and the id) and the counter.
        let before_clients = &before_moves[..before_moves.len() - 24];
        let decoded =
            CoordinatorState::decode(before_clients).expect("the encoding before clients decodes");
        assert_eq!(decoded.clients, BTreeSet::new(), "none open");
        assert_eq!(decoded.tables, state.tables);
        assert_eq!(
            CoordinatorState::decode(&bytes).expect("today's encoding decodes"),
            state
        );
        for damaged in [bytes.len() - 4, bytes.len() - 16, bytes.len() - 28] {
            assert!(
                CoordinatorState::decode(&bytes[..damaged]).is_err(),
                "a damaged tail of today's encoding is not taken for an old one ({damaged})"
            );
        }
    }

    #[test]
    fn check_invariants_catches_a_corrupt_state() {
        let (mut state, _) = cluster(1);
        created(&mut state, "t", 2);
        let mut gap = state.clone();
        if let Some(table) = gap.tables.get_mut(&TableId(1)) {
            table.tablets[1].start_hash += 1;
        }
        assert!(gap.check_invariants().is_err());
        let mut orphan = state.clone();
        orphan.servers.clear();
        orphan.up_addrs.clear();
        assert!(orphan.check_invariants().is_err());
        let mut unnamed = state;
        unnamed.names.clear();
        assert!(unnamed.check_invariants().is_err());
    }
}
