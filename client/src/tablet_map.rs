//! `TabletMapCache`: the client's copy of the tablet map, indexed for routing.

use rampart_common::ids::{KeyHash, ServerId, TableId};
use rampart_common::tablet::{ServerInfo, ServerStatus, Tablet, TabletMap};
use std::collections::{BTreeMap, HashMap};

/// A tablet map indexed by table name and by (table, start hash).
#[derive(Debug, Default)]
pub struct TabletMapCache {
    /// The map's version.
    pub version: u64,
    /// When it was fetched (`None` for the empty map a client starts with).
    pub fetched_at: Option<std::time::Instant>,
    names: HashMap<String, TableId>,
    /// (table, start hash) → tablet.
    tablets: BTreeMap<(TableId, u64), Tablet>,
    servers: HashMap<ServerId, ServerInfo>,
}

impl TabletMapCache {
    /// Indexes `map`.
    pub fn new(map: TabletMap) -> TabletMapCache {
        let mut cache = TabletMapCache {
            version: map.version,
            fetched_at: Some(std::time::Instant::now()),
            ..TabletMapCache::default()
        };
        for table in map.tables {
            cache.names.insert(table.name, table.id);
            for tablet in table.tablets {
                cache
                    .tablets
                    .insert((tablet.table, tablet.start_hash), tablet);
            }
        }
        cache.servers = map.servers.into_iter().map(|s| (s.id, s)).collect();
        cache
    }

    /// The id of table `name`.
    pub fn table_id(&self, name: &str) -> Option<TableId> {
        self.names.get(name).copied()
    }

    /// Whether table `id` exists in this map.
    pub fn has_table(&self, id: TableId) -> bool {
        self.tablets
            .range((id, 0)..=(id, u64::MAX))
            .next()
            .is_some()
    }

    /// The tablet of `table` holding key hash `hash`.
    pub fn tablet(&self, table: TableId, hash: KeyHash) -> Option<&Tablet> {
        self.tablets
            .range(..=(table, hash.0))
            .next_back()
            .map(|(_, tablet)| tablet)
            .filter(|tablet| tablet.contains(table, hash))
    }

    /// The server `id` as listed.
    pub fn server(&self, id: ServerId) -> Option<&ServerInfo> {
        self.servers.get(&id)
    }

    /// Why [`route`](Self::route) finds no owner to send a request for `hash` to.
    pub fn why_unrouted(&self, table: TableId, hash: KeyHash) -> String {
        match self.tablet(table, hash) {
            None => format!("no tablet of {table} covers key hash {:016x}", hash.0),
            Some(tablet) => format!(
                "the tablet of {table} holding key hash {:016x} is on {}, which is not in \
                 the server list",
                hash.0, tablet.owner
            ),
        }
    }

    /// The address of server `id`.
    pub fn addr(&self, id: ServerId) -> Option<&str> {
        self.servers.get(&id).map(|s| s.addr.as_str())
    }

    /// The server at `addr` (the `Up` one, if a restarted server left a crashed entry
    /// at the same address). A scan of the server list: for failure reports, not for
    /// every request.
    pub fn server_at(&self, addr: &str) -> Option<ServerId> {
        let mut found = None;
        for server in self.servers.values().filter(|s| s.addr == addr) {
            if server.status == ServerStatus::Up {
                return Some(server.id);
            }
            found = Some(server.id);
        }
        found
    }

    /// The tablet holding `hash` and its owner's address.
    pub fn route(&self, table: TableId, hash: KeyHash) -> Option<(Tablet, String)> {
        let tablet = self.tablet(table, hash)?;
        let addr = self.addr(tablet.owner)?;
        Some((*tablet, addr.to_string()))
    }
}
