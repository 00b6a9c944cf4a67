//! `CoordinatorState`: the cluster configuration as a deterministic state machine
//! (DESIGN.md §7).
//!
//! It holds the server list, the tables and their tablets, the open clients (whose
//! leases the leader keeps, `crate::client_leases`), the id counters and the
//! configuration version. Every change is a [`Command`]; [`CoordinatorState::apply`] executes
//! one and returns a [`CommandResult`]. The query methods read the state and change nothing.
//! What it hides: id assignment, tablet placement and the indexes that keep look-ups by name
//! and address cheap.
//!
//! # Determinism contract
//!
//! The state is replicated with Raft: each `Command` is a log entry that every replica
//! applies in log order, and replays after a restart. Replicas must agree exactly, so
//! `apply` is a pure function of (state, command):
//!
//! 1. No clocks. A time read inside `apply` would differ between replicas and between the
//!    first apply and a replay. Decisions that depend on time (declaring a server crashed
//!    after missed pings) are taken by the leader outside the state machine and enter it as
//!    commands ([`Command::SetServerStatus`], [`Command::ExpireClients`]).
//! 2. No randomness. Tablets are placed round-robin from a cursor kept in the state.
//! 3. No I/O. The async driver persists the log and sends the results.
//! 4. Only ordered containers (`BTreeMap`, `Vec`). A `HashMap`'s iteration order depends on
//!    a per-process random seed and would leak into placement and into [`TabletMap`].
//! 5. A rejected command changes nothing, not even [`CoordinatorState::version`], so a
//!    replica never has to undo half a command.
//!
//! # Snapshots
//!
//! The state derives `Serialize`/`Deserialize`: a snapshot is the serialized state.
//! Restoring a snapshot taken after entry k and applying entries k+1.. gives the same state
//! as applying every entry (a property test checks it). The encoding is bincode, which
//! has no optional fields: new fields go at the end, and [`CoordinatorState::decode`]
//! also reads the shorter encoding of the release before them (the one before open
//! clients). Call
//! [`CoordinatorState::check_invariants`] on a snapshot read from disk before installing it.
//!
//! # Idempotence
//!
//! Clients retry after a lost reply, so commands that a retry may repeat are idempotent:
//! creating an existing table returns that table (RAMCloud semantics), dropping a missing
//! table succeeds with nothing to drop, and setting a server to its current status is a
//! no-op. None of these bump the version.
//!
//! # Tablet epochs
//!
//! Every command that changes the tablets a server owns (create, drop, recovered
//! partition) bumps that server's *tablet epoch* by one. The pushes that follow carry it,
//! and lease renewals report it, so a master applies changes in order, notices one it
//! missed, and pulls its whole set then: the tablets it serves converge to the committed
//! map whatever became of the pushes (`protocol::master::TabletsRequest`).
//!
//! # Crash recovery
//!
//! A crashed server keeps its tablets until recovery hands them over: each recovered
//! partition enters as [`Command::RecoveredPartition`], which gives the partition's ranges
//! (splitting tablets where a range starts or ends inside one) to the recovery master
//! that replayed them. A crashed server that owns no tablet any more has been recovered;
//! the leader's recovery driver then frees its replicas and marks it `Removed`. Masters'
//! wills ([`Command::SetWill`]), the epochs of open segments whose replicas they
//! re-created ([`Command::SetOpenEpoch`]) and the operator's consent to lose data of an
//! incomplete log ([`Command::AllowLoss`]) live here too, so a new leader carries on any
//! recovery where the old one stopped (`coordinator::recovery`).

use rampart_common::ids::{ClientId, Epoch, SegmentId, ServerId, TableId, TabletEpoch};
use rampart_common::limits::RPC_PAYLOAD_BYTES_MAX;
use rampart_common::status::Status;
use rampart_common::tablet::{ServerInfo, ServerStatus, Services, TableInfo, Tablet, TabletMap};
use rampart_common::will::Will;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// Most live tables. Bounds the memory of the state and the size of a [`TabletMap`] that
/// clients fetch.
pub const TABLES_MAX: usize = 65_536;

/// Most tablets over all live tables. A [`TabletMap`] travels in one RPC, so its tablets
/// must fit in half a payload (the other half is left to the server list).
pub const TABLETS_MAX: usize = 1 << 20;

/// Bytes of one [`Tablet`] in bincode's fixed-width encoding: four `u64`s.
const TABLET_WIRE_BYTES: usize = 32;

/// Most entries in the server list. Ids are never reused and the list keeps crashed and
/// removed servers (their ids must stay known), so this bounds enlistments over the life
/// of the cluster, restarts included.
pub const SERVERS_MAX: usize = 100_000;

/// Longest table name, in bytes. Names travel in every `get_table_id` request.
pub const TABLE_NAME_BYTES_MAX: usize = 256;

/// Most tablets one table is split into. Spreading one table over more masters than this
/// buys nothing in a cluster of the size Rampart targets.
pub const TABLE_SPAN_MAX: u32 = 1024;

/// Open segments per master whose recorded epochs are kept ([`Command::SetOpenEpoch`]):
/// the head and its predecessor, the two whose open copies may still count in a
/// recovery.
pub const OPEN_EPOCH_SEGMENTS_MAX: usize = 2;

/// Longest server address (`host:port`) or failure-domain name, in bytes.
pub const SERVER_FIELD_BYTES_MAX: usize = 256;

/// Most key-hash ranges in one will (over all its partitions), and in one recovered
/// partition. A will is one Raft entry and travels whole; a master that owns more tablets
/// than this would be cut coarser by the recovery driver's fallback (one partition per
/// tablet).
pub const WILL_RANGES_MAX: usize = 65_536;

/// Most clients open at once ([`Command::OpenClient`]): each costs the state 8 bytes and
/// the leader a lease entry.
pub const CLIENTS_MAX: usize = 1 << 20;

/// The first client id. Releases before client leases gave clients the Raft index of
/// their `OpenClientWithoutLease` entry as id, and masters may still hold completion
/// records under such ids: ids from the counter start above every index a group can
/// reach, so that no new client inherits an old one's records.
pub const CLIENT_IDS_START: u64 = 1 << 48;

/// Most clients one [`Command::ExpireClients`] expires (the rest of a longer list is
/// ignored).
pub const EXPIRE_CLIENTS_MAX: usize = 4096;

// A whole `TabletMap` must fit one RPC payload: its tablets in half of it, the table names
// well within it, and no one table larger than the tablet budget.
const _: () = assert!(TABLETS_MAX * TABLET_WIRE_BYTES <= RPC_PAYLOAD_BYTES_MAX / 2);
const _: () = assert!(TABLE_SPAN_MAX as usize <= TABLETS_MAX);
const _: () = assert!(TABLE_NAME_BYTES_MAX * TABLES_MAX <= RPC_PAYLOAD_BYTES_MAX);

pub use rampart_common::tablet::HashRange;

/// One change to the configuration: a Raft log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A server process starts and asks for an id.
    ///
    /// If an `Up` server already has `addr`, that server is marked `Crashed`: a process
    /// restarted at the same address has lost its memory, so it is a new server with a new
    /// id, and the old one's data must be recovered.
    EnlistServer {
        /// Where its RPC listener is (`host:port`).
        addr: String,
        /// What it runs.
        services: Services,
        /// Its rack; replicas of one segment never share one.
        failure_domain: String,
        /// Measured disk read bandwidth of its backup, MB/s.
        disk_read_mbps: u32,
    },
    /// Changes a server's status. Statuses only move forward: `Up` → `Crashed` →
    /// `Removed` (or `Up` → `Removed`); a crashed server that comes back enlists anew.
    SetServerStatus {
        /// The server.
        id: ServerId,
        /// Its new status.
        status: ServerStatus,
    },
    /// Creates a table split into `span` tablets spread over the `Up` masters.
    CreateTable {
        /// Its name: 1..=[`TABLE_NAME_BYTES_MAX`] bytes, no control characters.
        name: String,
        /// Number of tablets, 1..=[`TABLE_SPAN_MAX`]. May exceed the number of masters:
        /// a master then owns several tablets of the table.
        span: u32,
    },
    /// Drops table `id`; its owners must then drop its tablets. By id: a drop repeated
    /// after an unknown outcome must not drop a table re-created under the same name.
    DropTable {
        /// The table.
        id: TableId,
    },
    /// Records the will a master uploaded (replacing its previous one). Refused for a
    /// server that is not `Up`: a crashed master's will is what recovery follows.
    SetWill {
        /// The master.
        server: ServerId,
        /// Its will.
        will: Will,
    },
    /// A recovery master replayed one partition of `crashed`: the ranges become its own.
    /// Every range must lie in tablets `crashed` still owns (else the partition was
    /// recovered already, and the command is refused, changing nothing). Tablets are split
    /// where a range starts or ends inside one.
    RecoveredPartition {
        /// The crashed master.
        crashed: ServerId,
        /// The partition's key-hash ranges.
        ranges: Vec<HashRange>,
        /// The recovery master that holds their objects now.
        owner: ServerId,
    },
    /// The operator lets the recovery of `server` proceed with the replicas found although
    /// its log is incomplete (`rampart recovery allow-loss`).
    AllowLoss {
        /// The crashed server.
        server: ServerId,
    },
    /// Master `server` may hand out versions below `ceiling` from now on (a lower
    /// ceiling than it holds changes nothing). Refused (`ServerCrashed`) once `server` is
    /// not `Up`.
    ReserveVersions {
        /// The master.
        server: ServerId,
        /// The ceiling it asks for.
        ceiling: u64,
    },
    /// A client opened by a release before client leases, whose id was this entry's
    /// Raft index (its reply went out long ago). Applying it changes nothing: members
    /// replay such entries from different snapshots after an upgrade, so anything it
    /// changed would differ between them.
    OpenClientWithoutLease,
    /// Master `server` re-created replicas of its open segment `segment` and moved them
    /// all to `epoch`: a copy of that segment at an older epoch without its footer was
    /// replaced while open and may lack writes acknowledged from now on, so recovery
    /// does not count it (`coordinator::recovery_plan`). The master records this before
    /// it acknowledges another write. Refused (`ServerCrashed`) once `server` is not
    /// `Up`: a master declared crashed must not move its log.
    SetOpenEpoch {
        /// The master.
        server: ServerId,
        /// Its open segment.
        segment: SegmentId,
        /// The epoch every replica it writes now holds.
        epoch: Epoch,
    },
    // New variants go last: a command's encoding (its variant's index) is in the Raft
    // log on disk.
    /// A client connects and needs an id for its writes' completion records
    /// (`rampart_common::rifl`): the next of a counter, never reused. It joins the
    /// clients whose leases the leader keeps. Refused beyond [`CLIENTS_MAX`] clients.
    /// Clients are not configuration: the version does not change.
    OpenClient,
    /// The leader found that these clients stopped renewing their leases: they are
    /// expired for good, and masters may drop their completion records. Clients not
    /// open (expired already) are passed over. The version does not change.
    ExpireClients {
        /// The clients (at most [`EXPIRE_CLIENTS_MAX`]).
        clients: Vec<ClientId>,
    },
}

/// What applying a [`Command`] produced; sent back to the client that proposed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// The server's new id.
    Enlisted {
        /// Assigned now; never reused.
        id: ServerId,
    },
    /// The status was set (or already was the requested one).
    StatusSet,
    /// The table exists.
    TableCreated {
        /// Its id.
        id: TableId,
        /// Its tablets, in hash order; the owners must be told to take them.
        tablets: Vec<Tablet>,
        /// False if the table existed already: the existing table is returned, so a client
        /// retry after a lost reply is harmless.
        created: bool,
        /// The tablet epoch of each owner, in id order: after this change when
        /// `created`, else as it stands (the owners then need only catch up to it).
        epochs: Vec<(ServerId, TabletEpoch)>,
    },
    /// The table is gone.
    TableDropped {
        /// Its id; `None` if no such table existed (dropping is idempotent).
        id: Option<TableId>,
        /// The tablets the owners must drop; empty if no such table existed.
        tablets: Vec<Tablet>,
        /// The tablet epoch of each owner after this change, in id order.
        epochs: Vec<(ServerId, TabletEpoch)>,
    },
    /// A will was recorded (or was already the recorded one).
    WillSet,
    /// A partition was handed over.
    PartitionRecovered {
        /// The new owner's tablets that the partition's ranges became; the owner must be
        /// told to take them.
        tablets: Vec<Tablet>,
        /// The new owner's tablet epoch after this change.
        epoch: TabletEpoch,
    },
    /// The operator's consent to lose data was recorded.
    LossAllowed,
    /// An open segment's epoch was recorded (or a newer one already was).
    EpochRecorded,
    /// A master's version ceiling, now at least the one asked for.
    VersionsReserved {
        /// The ceiling held.
        ceiling: u64,
    },
    /// A client was opened.
    ClientOpened {
        /// Its id; 0 for [`Command::OpenClientWithoutLease`], which opens nothing.
        id: ClientId,
    },
    /// Clients expired.
    ClientsExpired {
        /// How many of those named were open until now.
        expired: usize,
    },
    /// The command was refused and changed nothing.
    Rejected {
        /// Why, as a wire status.
        status: Status,
        /// Human-readable detail.
        detail: String,
    },
}

/// Why a command is refused. Each variant maps to a wire [`Status`]; its message is the
/// detail of [`CommandResult::Rejected`].
#[derive(Debug, Error)]
enum Reject {
    #[error("table name is empty")]
    TableNameEmpty,
    #[error("table name is {len} bytes, more than {max}", max = TABLE_NAME_BYTES_MAX)]
    TableNameTooLong { len: usize },
    #[error("table name contains a control character")]
    TableNameControl,
    #[error("span {span} is outside 1..={max}", max = TABLE_SPAN_MAX)]
    SpanOutOfRange { span: u32 },
    #[error("too many tables (limit {max})", max = TABLES_MAX)]
    TooManyTables,
    #[error("too many tablets: {have} + {span} exceeds {max}", max = TABLETS_MAX)]
    TooManyTablets { have: usize, span: u32 },
    #[error("no up server runs a master")]
    NoMasters,
    #[error("server address is empty")]
    AddrEmpty,
    #[error("{field} is {len} bytes, more than {max}", max = SERVER_FIELD_BYTES_MAX)]
    ServerFieldTooLong { field: &'static str, len: usize },
    #[error("too many servers (limit {max})", max = SERVERS_MAX)]
    TooManyServers,
    #[error("unknown server {0}")]
    UnknownServer(ServerId),
    #[error("will of {server}: {why}")]
    BadWill { server: ServerId, why: String },
    #[error("{0} is not up")]
    NotUp(ServerId),
    #[error("{0} was declared crashed: its log is being recovered")]
    Crashed(ServerId),
    #[error("{0} is not crashed")]
    NotCrashed(ServerId),
    #[error("{crashed} no longer owns {table} hashes {start:#x}..={end:#x}: recovered already")]
    NotOwned {
        crashed: ServerId,
        table: TableId,
        start: u64,
        end: u64,
    },
    #[error("too many clients open (limit {max}): no more until some expire", max = CLIENTS_MAX)]
    TooManyClients,
    #[error("server {id} cannot go from {from:?} to {to:?}")]
    StatusBackwards {
        id: ServerId,
        from: ServerStatus,
        to: ServerStatus,
    },
}

impl Reject {
    fn status(&self) -> Status {
        match self {
            Reject::NoMasters => Status::NotEnoughServers,
            Reject::TooManyClients => Status::Retry,
            Reject::Crashed(_) => Status::ServerCrashed,
            Reject::NotOwned { .. } | Reject::NotCrashed(_) => Status::RecoveryFailed,
            _ => Status::InvalidArgument,
        }
    }
}

/// A command that was not rejected: whether it changed the state decides the version bump.
enum Outcome {
    Changed(CommandResult),
    Unchanged(CommandResult),
}

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
}

/// The coordinator's configuration. See the module doc for the determinism contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorState {
    /// The id the next enlisted server gets.
    /// 1. Starts at 1 and only grows, so ids are never reused.
    /// 2. Greater than every key of `servers`.
    next_server_id: u64,
    /// The id the next created table gets.
    /// 1. Starts at 1 and only grows, so a dropped and re-created name gets a new id.
    /// 2. Greater than every key of `tables`.
    next_table_id: u64,
    /// Every server ever enlisted, by id.
    /// 1. `servers[id].id == id`.
    /// 2. At most [`SERVERS_MAX`] entries.
    servers: BTreeMap<ServerId, ServerInfo>,
    /// Every live table, by id.
    /// 1. `tables[id].id == id`.
    /// 2. Its tablets belong to it, are in hash order, contiguous, and cover
    ///    `[0, u64::MAX]`.
    /// 3. Every tablet's owner is a key of `servers` (possibly no longer `Up`).
    /// 4. At most [`TABLES_MAX`] tables and [`TABLETS_MAX`] tablets in all.
    tables: BTreeMap<TableId, TableInfo>,
    /// Table ids by name.
    /// 1. `names[t.name] == t.id` for every table `t`, and nothing else.
    names: BTreeMap<String, TableId>,
    /// The `Up` server at each address.
    /// 1. `up_addrs[s.addr] == s.id` for every `Up` server `s`, and nothing else; so at
    ///    most one `Up` server per address.
    up_addrs: BTreeMap<String, ServerId>,
    /// Tablets over all tables (the sum of `tables[..].tablets.len()`).
    tablet_count: usize,
    /// The master that received the most recent tablet (`ServerId(0)` before any). The next
    /// tablet goes to the first `Up` master with a larger id, wrapping around, so many small
    /// tables spread over all masters instead of piling onto the first one.
    last_placed: ServerId,
    /// The latest will of each master.
    /// 1. Keys are servers of `servers`; a `Removed` server has none.
    /// 2. At most [`WILL_RANGES_MAX`] ranges each.
    wills: BTreeMap<ServerId, Will>,
    /// Crashed servers whose recovery may proceed with an incomplete log.
    /// 1. Keys are servers of `servers` that are not `Removed`.
    allow_loss: BTreeSet<ServerId>,
    /// Per master, the epochs it recorded for open segments whose replicas it
    /// re-created ([`Command::SetOpenEpoch`]).
    /// 1. Keys are servers of `servers` that are not `Removed`.
    /// 2. At most [`OPEN_EPOCH_SEGMENTS_MAX`] segments per server: the newest recorded
    ///    and the one before it. Older ones are not needed: two below the head, only a
    ///    copy holding the footer counts anyway.
    open_epochs: BTreeMap<ServerId, BTreeMap<SegmentId, Epoch>>,
    /// Per server, how many times the set of tablets it owns changed (its *tablet
    /// epoch*; absent: 0). Every command bumps each server whose tablets it changes by
    /// exactly one, so a master that applied changes 1..=n knows change n + 1 when it
    /// sees it, and that it missed one when it sees a later one
    /// (`protocol::master::TabletsRequest`).
    /// 1. Keys are servers of `servers` that are not `Removed`.
    tablet_epochs: BTreeMap<ServerId, TabletEpoch>,
    /// Per master, a version above every version it ever handed out or holds (its
    /// *version ceiling*; absent: 0, nothing handed out). A master reserves ranges ahead
    /// ([`Command::ReserveVersions`]); a recovered partition raises its new owner's
    /// ceiling above what it replays (twice the crashed one's when loss was allowed,
    /// as such a recovery shifts versions up by the crashed one's ceiling; a chain of
    /// some thirty lossy recoveries of 2^33-version masters would reach `u64::MAX`, where
    /// versions saturate).
    /// 1. Keys are servers of `servers` that are not `Removed`.
    /// 2. Only grow.
    version_ceilings: BTreeMap<ServerId, u64>,
    /// Configuration version.
    /// 1. Bumped exactly once by every command that changes the state other than its
    ///    clients; never otherwise.
    version: u64,
    // New fields go last: the encoding of a release before them is then a prefix of
    // this one ([`CoordinatorState::decode`]).
    /// The id the next opened client gets.
    /// 1. Starts at [`CLIENT_IDS_START`] and only grows, so client ids are never reused.
    /// 2. Greater than every member of `clients`.
    next_client_id: u64,
    /// The clients opened and not expired (whose leases the leader keeps).
    /// 1. At most [`CLIENTS_MAX`].
    clients: BTreeSet<ClientId>,
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
        }
    }
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

    /// The id of the live table called `name`.
    pub fn table_id(&self, name: &str) -> Option<TableId> {
        self.names.get(name).copied()
    }

    /// The live table `id`.
    pub fn table(&self, id: TableId) -> Option<&TableInfo> {
        self.tables.get(&id)
    }

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

    /// The tablets `owner` serves, in (table id, hash) order. Scans every table: for the
    /// rare control-path callers (enlist replies, recovery planning), not per request.
    pub fn tablets_of(&self, owner: ServerId) -> Vec<Tablet> {
        self.tables
            .values()
            .flat_map(|table| table.tablets.iter())
            .filter(|tablet| tablet.owner == owner)
            .copied()
            .collect()
    }

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

    /// The tablet epoch of `server`: how many changes of its tablets were committed.
    pub fn tablet_epoch(&self, server: ServerId) -> TabletEpoch {
        self.tablet_epochs.get(&server).copied().unwrap_or_default()
    }

    /// Splits `ranges` (inclusive key-hash ranges) into the parts whose tablets
    /// `server` owns and the rest, each in order.
    pub fn split_by_owner(
        &self,
        ranges: &[HashRange],
        server: ServerId,
    ) -> (Vec<HashRange>, Vec<HashRange>) {
        let (mut owned, mut other) = (Vec::new(), Vec::new());
        for &HashRange { table, start, end } in ranges {
            // Where the tablets do not reach (a dropped table): not owned.
            let mut at = Some(start);
            if let Some(info) = self.tables.get(&table) {
                let first = info.tablets.partition_point(|t| t.end_hash < start);
                for tablet in &info.tablets[first..] {
                    let Some(from) = at.filter(|from| *from <= end) else {
                        break;
                    };
                    let to = tablet.end_hash.min(end);
                    let part = HashRange::new(table, from.max(tablet.start_hash), to);
                    if tablet.owner == server {
                        owned.push(part);
                    } else {
                        other.push(part);
                    }
                    at = to.checked_add(1);
                }
            }
            if let Some(from) = at.filter(|from| *from <= end) {
                other.push(HashRange::new(table, from, end));
            }
        }
        (owned, other)
    }

    /// Bumps the tablet epoch of every server in `owners` once (a removed one has none
    /// and serves nothing); returns them with their new epochs, in id order.
    fn bump_tablet_epochs(
        &mut self,
        owners: impl IntoIterator<Item = ServerId>,
    ) -> Vec<(ServerId, TabletEpoch)> {
        let owners: BTreeSet<ServerId> = owners
            .into_iter()
            .filter(|owner| {
                self.servers
                    .get(owner)
                    .is_some_and(|s| s.status != ServerStatus::Removed)
            })
            .collect();
        owners
            .into_iter()
            .map(|owner| {
                let epoch = self.tablet_epochs.entry(owner).or_default();
                *epoch = epoch.next();
                (owner, *epoch)
            })
            .collect()
    }

    /// The epochs `server` recorded for its open segments ([`Command::SetOpenEpoch`]).
    pub fn open_epochs(&self, server: ServerId) -> BTreeMap<SegmentId, Epoch> {
        self.open_epochs.get(&server).cloned().unwrap_or_default()
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

    /// The whole configuration as clients and masters cache it: version, every server and
    /// every table, both in id order.
    pub fn tablet_map(&self) -> TabletMap {
        TabletMap {
            version: self.version,
            servers: self.servers.values().cloned().collect(),
            tables: self.tables.values().cloned().collect(),
        }
    }

    /// Decodes a state encoded (bincode) by this release, or by one before open clients
    /// existed (see `StateWithoutClients`).
    pub fn decode(bytes: &[u8]) -> Result<CoordinatorState, bincode::Error> {
        use bincode::Options;
        bincode::deserialize(bytes).or_else(|error| {
            // Only an encoding that the old fields use up whole: a damaged tail of
            // today's encoding must not pass for an old one (bincode's default ignores
            // trailing bytes).
            bincode::DefaultOptions::new()
                .with_fixint_encoding()
                .reject_trailing_bytes()
                .deserialize::<StateWithoutClients>(bytes)
                .map(CoordinatorState::from)
                .map_err(|_| error)
        })
    }

    /// Tables.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// Tablets over all tables.
    pub fn tablet_count(&self) -> usize {
        self.tablet_count
    }

    /// Whether `client` is open (not expired).
    pub fn client_open(&self, client: ClientId) -> bool {
        self.clients.contains(&client)
    }

    /// The clients open (not expired), in id order.
    pub fn open_clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.clients.iter().copied()
    }

    fn open_client(&mut self) -> Result<Outcome, Reject> {
        if self.clients.len() >= CLIENTS_MAX {
            return Err(Reject::TooManyClients);
        }
        let id = ClientId(self.next_client_id);
        self.next_client_id += 1;
        self.clients.insert(id);
        // Not configuration: the version stays.
        Ok(Outcome::Unchanged(CommandResult::ClientOpened { id }))
    }

    fn expire_clients(&mut self, clients: &[ClientId]) -> Outcome {
        let expired = clients
            .iter()
            .take(EXPIRE_CLIENTS_MAX)
            .filter(|c| self.clients.remove(c))
            .count();
        Outcome::Unchanged(CommandResult::ClientsExpired { expired })
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
        Ok(())
    }

    fn enlist_server(
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

    fn set_server_status(&mut self, id: ServerId, status: ServerStatus) -> Result<Outcome, Reject> {
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
        // (`RecoveredPartition`), then marks it removed.
        server.status = status;
        if status == ServerStatus::Removed {
            self.wills.remove(&id);
            self.allow_loss.remove(&id);
            self.open_epochs.remove(&id);
            self.tablet_epochs.remove(&id);
            self.version_ceilings.remove(&id);
        }
        Ok(Outcome::Changed(CommandResult::StatusSet))
    }

    fn create_table(&mut self, name: &str, span: u32) -> Result<Outcome, Reject> {
        validate_table_name(name)?;
        if !(1..=TABLE_SPAN_MAX).contains(&span) {
            return Err(Reject::SpanOutOfRange { span });
        }
        if let Some(table) = self.names.get(name).and_then(|id| self.tables.get(id)) {
            // Idempotent: even with a different span, so that a retry never fails.
            let owners: BTreeSet<ServerId> = table.tablets.iter().map(|t| t.owner).collect();
            return Ok(Outcome::Unchanged(CommandResult::TableCreated {
                id: table.id,
                tablets: table.tablets.clone(),
                created: false,
                epochs: owners
                    .into_iter()
                    .map(|owner| (owner, self.tablet_epoch(owner)))
                    .collect(),
            }));
        }
        if self.tables.len() >= TABLES_MAX {
            return Err(Reject::TooManyTables);
        }
        if self.tablet_count + span as usize > TABLETS_MAX {
            return Err(Reject::TooManyTablets {
                have: self.tablet_count,
                span,
            });
        }
        let masters: Vec<ServerId> = self
            .up_servers()
            .into_iter()
            .filter(|s| s.services.master)
            .map(|s| s.id)
            .collect();
        if masters.is_empty() {
            return Err(Reject::NoMasters);
        }

        // Never overflows: one id per applied command.
        let id = TableId(self.next_table_id);
        self.next_table_id += 1;
        let first = masters.partition_point(|&m| m <= self.last_placed);
        let owners = masters.iter().cycle().skip(first);
        let tablets: Vec<Tablet> = Tablet::split_hash_space(span)
            .into_iter()
            .zip(owners)
            .map(|((start_hash, end_hash), &owner)| Tablet {
                table: id,
                start_hash,
                end_hash,
                owner,
            })
            .collect();
        if let Some(last) = tablets.last() {
            self.last_placed = last.owner;
        }
        self.tablet_count += tablets.len();
        self.names.insert(name.to_owned(), id);
        self.tables.insert(
            id,
            TableInfo {
                id,
                name: name.to_owned(),
                tablets: tablets.clone(),
            },
        );
        let epochs = self.bump_tablet_epochs(tablets.iter().map(|t| t.owner));
        Ok(Outcome::Changed(CommandResult::TableCreated {
            id,
            tablets,
            created: true,
            epochs,
        }))
    }

    fn drop_table(&mut self, id: TableId) -> Outcome {
        let Some(table) = self.tables.remove(&id) else {
            return Outcome::Unchanged(CommandResult::TableDropped {
                id: None,
                tablets: Vec::new(),
                epochs: Vec::new(),
            });
        };
        self.names.remove(&table.name);
        self.tablet_count -= table.tablets.len();
        let epochs = self.bump_tablet_epochs(table.tablets.iter().map(|t| t.owner));
        Outcome::Changed(CommandResult::TableDropped {
            id: Some(table.id),
            tablets: table.tablets,
            epochs,
        })
    }
}

impl CoordinatorState {
    fn set_will(&mut self, server: ServerId, will: &Will) -> Result<Outcome, Reject> {
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

    fn allow_loss(&mut self, server: ServerId) -> Result<Outcome, Reject> {
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

    fn reserve_versions(&mut self, server: ServerId, ceiling: u64) -> Result<Outcome, Reject> {
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

    fn set_open_epoch(
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
    fn recovered_partition(
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
fn will_ranges(will: &Will) -> usize {
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

/// Position of a status in its only allowed direction of travel.
fn rank(status: ServerStatus) -> u8 {
    match status {
        ServerStatus::Up => 0,
        ServerStatus::Crashed => 1,
        ServerStatus::Removed => 2,
    }
}

fn validate_table_name(name: &str) -> Result<(), Reject> {
    if name.is_empty() {
        return Err(Reject::TableNameEmpty);
    }
    if name.len() > TABLE_NAME_BYTES_MAX {
        return Err(Reject::TableNameTooLong { len: name.len() });
    }
    if name.chars().any(char::is_control) {
        return Err(Reject::TableNameControl);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BOTH: Services = Services {
        master: true,
        backup: true,
    };
    const BACKUP_ONLY: Services = Services {
        master: false,
        backup: true,
    };

    fn enlist(state: &mut CoordinatorState, addr: &str, services: Services) -> ServerId {
        match state.apply(&Command::EnlistServer {
            addr: addr.to_owned(),
            services,
            failure_domain: "rack-1".to_owned(),
            disk_read_mbps: 500,
        }) {
            CommandResult::Enlisted { id } => id,
            other => panic!("enlist failed: {other:?}"),
        }
    }

    fn create(state: &mut CoordinatorState, name: &str, span: u32) -> CommandResult {
        state.apply(&Command::CreateTable {
            name: name.to_owned(),
            span,
        })
    }

    fn created(state: &mut CoordinatorState, name: &str, span: u32) -> (TableId, Vec<Tablet>) {
        match create(state, name, span) {
            CommandResult::TableCreated {
                id,
                tablets,
                created: true,
                ..
            } => (id, tablets),
            other => panic!("create failed: {other:?}"),
        }
    }

    fn cluster(masters: usize) -> (CoordinatorState, Vec<ServerId>) {
        let mut state = CoordinatorState::new();
        let ids = (0..masters)
            .map(|i| enlist(&mut state, &format!("10.0.0.{i}:7000"), BOTH))
            .collect();
        (state, ids)
    }

    fn assert_rejected(state: &mut CoordinatorState, command: Command, status: Status) {
        let before = state.clone();
        match state.apply(&command) {
            CommandResult::Rejected { status: got, .. } => assert_eq!(got, status, "{command:?}"),
            other => panic!("{command:?} not rejected: {other:?}"),
        }
        assert_eq!(*state, before, "{command:?} changed the state");
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

    fn crash(state: &mut CoordinatorState, id: ServerId) {
        let result = state.apply(&Command::SetServerStatus {
            id,
            status: ServerStatus::Crashed,
        });
        assert_eq!(result, CommandResult::StatusSet);
    }

    fn recovered(crashed: ServerId, ranges: Vec<HashRange>, owner: ServerId) -> Command {
        Command::RecoveredPartition {
            crashed,
            ranges,
            owner,
        }
    }

    #[test]
    fn every_change_of_a_servers_tablets_bumps_its_tablet_epoch_once() {
        let (mut state, ids) = cluster(2);
        assert_eq!(state.tablet_epoch(ids[0]), TabletEpoch(0));
        // Two tablets of one table on each: one change each.
        let CommandResult::TableCreated { epochs, .. } = create(&mut state, "a", 4) else {
            panic!("not created");
        };
        assert_eq!(
            epochs,
            vec![(ids[0], TabletEpoch(1)), (ids[1], TabletEpoch(1))]
        );
        let CommandResult::TableCreated { epochs, .. } = create(&mut state, "b", 1) else {
            panic!("not created");
        };
        let owner = epochs[0].0;
        assert_eq!(epochs, vec![(owner, TabletEpoch(2))]);
        // A retried create changes nothing and reports the epochs as they stand.
        let CommandResult::TableCreated {
            epochs, created, ..
        } = create(&mut state, "a", 4)
        else {
            panic!("not created");
        };
        assert!(!created);
        assert_eq!(
            epochs,
            vec![
                (ids[0], state.tablet_epoch(ids[0])),
                (ids[1], state.tablet_epoch(ids[1]))
            ]
        );
        let a = state.table_id("a").expect("a");
        let dropped = state.apply(&Command::DropTable { id: a });
        let CommandResult::TableDropped { epochs, .. } = dropped else {
            panic!("not dropped");
        };
        assert_eq!(epochs.len(), 2);
        assert_eq!(state.tablet_epoch(owner), TabletEpoch(3));
        // Recovery hands a crashed server's table to the other: one change of it.
        let other = if owner == ids[0] { ids[1] } else { ids[0] };
        let before = state.tablet_epoch(other);
        crash(&mut state, owner);
        let table = state.table_id("b").expect("b");
        let result = state.apply(&recovered(owner, vec![HashRange::whole(table)], other));
        assert_eq!(
            result,
            CommandResult::PartitionRecovered {
                tablets: vec![Tablet {
                    table,
                    start_hash: 0,
                    end_hash: u64::MAX,
                    owner: other
                }],
                epoch: before.next(),
            }
        );
        state.apply(&Command::SetServerStatus {
            id: owner,
            status: ServerStatus::Removed,
        });
        assert_eq!(
            state.tablet_epoch(owner),
            TabletEpoch(0),
            "a removed server keeps none"
        );
        assert_eq!(state.check_invariants(), Ok(()));
    }

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
    fn split_by_owner_tells_a_servers_parts_of_ranges_from_the_rest() {
        let (mut state, ids) = cluster(2);
        let (table, tablets) = created(&mut state, "t", 2);
        let boundary = tablets[1].start_hash;
        let (first, second) = (tablets[0].owner, tablets[1].owner);
        let ranges = vec![
            HashRange::new(table, 10, boundary + 10),
            HashRange::new(TableId(99), 0, 5),
        ];
        let (owned, other) = state.split_by_owner(&ranges, first);
        assert_eq!(owned, vec![HashRange::new(table, 10, boundary - 1)]);
        assert_eq!(
            other,
            vec![
                HashRange::new(table, boundary, boundary + 10),
                HashRange::new(TableId(99), 0, 5)
            ],
            "another owner's part, and a table that does not exist"
        );
        let (owned, _) = state.split_by_owner(&ranges, second);
        assert_eq!(owned, vec![HashRange::new(table, boundary, boundary + 10)]);
        assert!(ids.contains(&first) && ids.contains(&second));
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

    #[test]
    fn create_table_splits_evenly_and_covers_the_hash_space() {
        let (mut state, ids) = cluster(4);
        let (id, tablets) = created(&mut state, "users", 4);
        assert_eq!(id, TableId(1));
        assert_eq!(state.table_id("users"), Some(id));
        let table = state.table(id).expect("created");
        assert_eq!(table.name, "users");
        assert_eq!(table.tablets, tablets);
        assert_eq!(tablets.len(), 4);
        assert_eq!(tablets[0].start_hash, 0);
        assert_eq!(tablets[3].end_hash, u64::MAX);
        for pair in tablets.windows(2) {
            assert_eq!(pair[0].end_hash + 1, pair[1].start_hash);
        }
        for tablet in &tablets {
            assert_eq!(tablet.table, id);
            assert_eq!(tablet.end_hash - tablet.start_hash, u64::MAX / 4);
        }
        let owners: Vec<ServerId> = tablets.iter().map(|t| t.owner).collect();
        assert_eq!(owners, ids, "one tablet per master, in id order");
        assert_eq!(state.version(), 5);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn create_table_wider_than_the_cluster_wraps_round_robin() {
        let (mut state, ids) = cluster(3);
        let (_, tablets) = created(&mut state, "wide", 7);
        let owners: Vec<u64> = tablets.iter().map(|t| t.owner.0).collect();
        assert_eq!(owners, vec![1, 2, 3, 1, 2, 3, 1]);
        // The cursor continues where the last table stopped.
        let (_, next) = created(&mut state, "next", 2);
        let owners: Vec<ServerId> = next.iter().map(|t| t.owner).collect();
        assert_eq!(owners, vec![ids[1], ids[2]]);
    }

    #[test]
    fn many_single_tablet_tables_spread_over_all_masters() {
        let (mut state, ids) = cluster(5);
        for i in 0..20 {
            created(&mut state, &format!("t{i}"), 1);
        }
        for id in &ids {
            assert_eq!(state.tablets_of(*id).len(), 4, "{id}");
        }
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn create_table_skips_crashed_servers_and_backup_only_servers() {
        let (mut state, ids) = cluster(3);
        let backup = enlist(&mut state, "10.0.1.0:7000", BACKUP_ONLY);
        state.apply(&Command::SetServerStatus {
            id: ids[1],
            status: ServerStatus::Crashed,
        });
        let (_, tablets) = created(&mut state, "t", 4);
        let owners: Vec<ServerId> = tablets.iter().map(|t| t.owner).collect();
        assert_eq!(owners, vec![ids[0], ids[2], ids[0], ids[2]]);
        assert!(state.tablets_of(backup).is_empty());
    }

    #[test]
    fn create_table_cursor_survives_the_last_placed_master_crashing() {
        let (mut state, ids) = cluster(3);
        created(&mut state, "a", 2);
        state.apply(&Command::SetServerStatus {
            id: ids[1],
            status: ServerStatus::Crashed,
        });
        let (_, tablets) = created(&mut state, "b", 1);
        assert_eq!(tablets[0].owner, ids[2], "first up master after the cursor");
    }

    #[test]
    fn create_existing_name_returns_the_same_table_unchanged() {
        let (mut state, _) = cluster(2);
        let (id, tablets) = created(&mut state, "t", 2);
        let before = state.clone();
        let again = create(&mut state, "t", 5);
        assert_eq!(
            again,
            CommandResult::TableCreated {
                id,
                tablets,
                created: false,
                epochs: vec![(ServerId(1), TabletEpoch(1)), (ServerId(2), TabletEpoch(1))],
            }
        );
        assert_eq!(state, before, "no version bump, no cursor move");
    }

    #[test]
    fn create_existing_name_succeeds_even_without_masters() {
        let (mut state, ids) = cluster(1);
        let (id, _) = created(&mut state, "t", 1);
        state.apply(&Command::SetServerStatus {
            id: ids[0],
            status: ServerStatus::Crashed,
        });
        assert!(matches!(
            create(&mut state, "t", 1),
            CommandResult::TableCreated { id: got, created: false, .. } if got == id
        ));
    }

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

    #[test]
    fn a_state_encoded_before_open_clients_decodes_with_none_open() {
        let mut state = CoordinatorState::new();
        enlist(&mut state, "a:1", BOTH);
        assert!(matches!(
            create(&mut state, "t", 2),
            CommandResult::TableCreated { .. }
        ));
        // The encoding before open clients is today's without the last two fields: an
        // empty set (its length, a u64) and the counter (a u64).
        let bytes = bincode::serialize(&state).expect("a state encodes");
        let old = &bytes[..bytes.len() - 16];
        assert_eq!(
            CoordinatorState::decode(old).expect("the older encoding decodes"),
            state
        );
        assert_eq!(
            CoordinatorState::decode(&bytes).expect("today's encoding decodes"),
            state
        );
        assert!(CoordinatorState::decode(&bytes[..bytes.len() - 20]).is_err());
        assert!(
            CoordinatorState::decode(&bytes[..bytes.len() - 8]).is_err(),
            "a damaged tail of today's encoding is not taken for an old one"
        );
        state.apply(&Command::OpenClient);
        let bytes = bincode::serialize(&state).expect("a state encodes");
        assert_eq!(
            CoordinatorState::decode(&bytes).expect("today's encoding decodes"),
            state
        );
    }

    #[test]
    fn create_after_drop_gets_a_new_id() {
        let (mut state, _) = cluster(1);
        let (first, tablets) = created(&mut state, "t", 3);
        assert_eq!(
            state.apply(&Command::DropTable { id: first }),
            CommandResult::TableDropped {
                id: Some(first),
                tablets,
                epochs: vec![(ServerId(1), TabletEpoch(2))],
            }
        );
        assert_eq!(state.table_id("t"), None);
        assert_eq!(state.table(first), None);
        assert!(state.tablets_of(ServerId(1)).is_empty());
        let (second, _) = created(&mut state, "t", 1);
        assert_eq!(second, TableId(2));
        assert_ne!(first, second);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn a_drop_repeated_after_the_name_was_re_created_leaves_the_new_table() {
        // A client's drop commits but its reply is lost; another client creates the name
        // again; the first client's library sends its drop again.
        let (mut state, _) = cluster(2);
        let (old, _) = created(&mut state, "t", 1);
        state.apply(&Command::DropTable { id: old });
        let (new, _) = created(&mut state, "t", 2);
        let again = state.apply(&Command::DropTable { id: old });
        assert!(matches!(
            again,
            CommandResult::TableDropped { id: None, .. }
        ));
        assert_eq!(state.table_id("t"), Some(new), "the new table survives");
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn drop_unknown_table_is_idempotent() {
        let (mut state, _) = cluster(1);
        let (id, _) = created(&mut state, "t", 1);
        state.apply(&Command::DropTable { id });
        let before = state.clone();
        for id in [id, TableId(77), TableId(0)] {
            let result = state.apply(&Command::DropTable { id });
            assert_eq!(
                result,
                CommandResult::TableDropped {
                    id: None,
                    tablets: vec![],
                    epochs: vec![],
                }
            );
        }
        assert_eq!(state, before);
    }

    #[test]
    fn create_table_with_bad_name_or_span_is_rejected_without_change() {
        let (mut state, _) = cluster(2);
        created(&mut state, "ok", 1);
        let long = "n".repeat(TABLE_NAME_BYTES_MAX + 1);
        let longest = "n".repeat(TABLE_NAME_BYTES_MAX);
        for (name, span) in [
            ("", 1),
            (long.as_str(), 1),
            ("tab\tle", 1),
            ("new\nline", 1),
            ("nul\0", 1),
            ("del\u{7f}", 1),
            ("fine", 0),
            ("fine", TABLE_SPAN_MAX + 1),
            ("fine", u32::MAX),
            // Bad arguments are refused even when the name exists.
            ("ok", 0),
        ] {
            let command = Command::CreateTable {
                name: name.to_owned(),
                span,
            };
            assert_rejected(&mut state, command, Status::InvalidArgument);
        }
        created(&mut state, &longest, TABLE_SPAN_MAX);
        created(&mut state, "ünïcödé 表", 1);
    }

    #[test]
    fn create_table_without_up_masters_is_rejected_without_change() {
        let mut state = CoordinatorState::new();
        let command = Command::CreateTable {
            name: "t".into(),
            span: 1,
        };
        assert_rejected(&mut state, command.clone(), Status::NotEnoughServers);
        enlist(&mut state, "10.0.1.0:7000", BACKUP_ONLY);
        assert_rejected(&mut state, command.clone(), Status::NotEnoughServers);
        let master = enlist(&mut state, "10.0.0.0:7000", BOTH);
        state.apply(&Command::SetServerStatus {
            id: master,
            status: ServerStatus::Crashed,
        });
        assert_rejected(&mut state, command, Status::NotEnoughServers);
    }

    #[test]
    fn create_table_beyond_the_table_limit_is_rejected() {
        let (mut state, _) = cluster(1);
        for i in 0..TABLES_MAX {
            created(&mut state, &format!("t{i}"), 1);
        }
        let before = state.clone();
        match create(&mut state, "one-more", 1) {
            CommandResult::Rejected { status, detail } => {
                assert_eq!(status, Status::InvalidArgument);
                assert!(detail.contains("too many tables"), "{detail}");
            }
            other => panic!("not rejected: {other:?}"),
        }
        assert_eq!(state, before);
        // An existing name is still answered.
        assert!(matches!(
            create(&mut state, "t0", 1),
            CommandResult::TableCreated { created: false, .. }
        ));
    }

    #[test]
    fn create_table_beyond_the_tablet_limit_is_rejected() {
        let (mut state, _) = cluster(1);
        let full = TABLETS_MAX / TABLE_SPAN_MAX as usize;
        for i in 0..full {
            created(&mut state, &format!("t{i}"), TABLE_SPAN_MAX);
        }
        assert_rejected(
            &mut state,
            Command::CreateTable {
                name: "x".into(),
                span: 1,
            },
            Status::InvalidArgument,
        );
        let t0 = state.table_id("t0").expect("t0");
        state.apply(&Command::DropTable { id: t0 });
        created(&mut state, "x", TABLE_SPAN_MAX);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn tablet_map_lists_everything_at_the_current_version() {
        let (mut state, _) = cluster(2);
        created(&mut state, "b", 1);
        created(&mut state, "a", 2);
        let map = state.tablet_map();
        assert_eq!(map.version, state.version());
        assert_eq!(map.servers.len(), 2);
        let names: Vec<&str> = map.tables.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, vec!["b", "a"], "tables in id order");
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

    fn command_strategy() -> impl Strategy<Value = Command> {
        let name =
            prop::sample::select(vec!["a", "b", "c", "d", "", "bad\n"]).prop_map(String::from);
        let addr =
            prop::sample::select(vec!["h1:1", "h2:1", "h3:1", "h4:1"]).prop_map(String::from);
        let status = prop::sample::select(vec![
            ServerStatus::Up,
            ServerStatus::Crashed,
            ServerStatus::Removed,
        ]);
        prop_oneof![
            3 => (addr, any::<bool>(), any::<bool>(), 0u32..1000).prop_map(
                |(addr, master, backup, disk_read_mbps)| Command::EnlistServer {
                    addr,
                    services: Services { master, backup },
                    failure_domain: "rack".into(),
                    disk_read_mbps,
                }
            ),
            2 => (0u64..12, status).prop_map(|(id, status)| Command::SetServerStatus {
                id: ServerId(id),
                status,
            }),
            4 => (name.clone(), 0u32..=20).prop_map(|(name, span)| Command::CreateTable { name, span }),
            2 => (1u64..6).prop_map(|id| Command::DropTable { id: TableId(id) }),
            1 => Just(Command::OpenClient),
            1 => Just(Command::OpenClientWithoutLease),
            1 => proptest::collection::vec(0u64..8, 0..4).prop_map(|ids| Command::ExpireClients {
                clients: ids.into_iter().map(ClientId).collect(),
            }),
            1 => (0u64..12, 0u64..1000).prop_map(|(id, ceiling)| Command::ReserveVersions {
                server: ServerId(id),
                ceiling,
            }),
            1 => (0u64..12, 1u64..6, 1u64..4).prop_map(|(id, segment, epoch)| {
                Command::SetOpenEpoch {
                    server: ServerId(id),
                    segment: SegmentId(segment),
                    epoch: Epoch(epoch),
                }
            }),
        ]
    }

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

        #[test]
        fn commands_round_trip_through_bincode(command in command_strategy()) {
            let bytes = bincode::serialize(&command).expect("serializable");
            let back: Command = bincode::deserialize(&bytes).expect("deserializable");
            prop_assert_eq!(back, command);
        }
    }
}
