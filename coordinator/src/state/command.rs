//! The replicated interface of the state: [`Command`], one Raft log entry, and the
//! [`CommandResult`] applying it produced; the limits that `apply` enforces; the moves'
//! types ([`OpenMove`], [`MoveEnd`]); and why a command is refused (`Reject`) or
//! whether it changed the state (`Outcome`). Commands
//! are in Raft logs on disk: their variants and fields keep their order, new variants go
//! last.

use rampart_common::ids::{ClientId, Epoch, MoveId, SegmentId, ServerId, TableId, TabletEpoch};
use rampart_common::limits::RPC_PAYLOAD_BYTES_MAX;
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, ServerStatus, Services, Tablet};
use rampart_common::will::Will;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Most live tables. Bounds the memory of the state and the size of a
/// [`TabletMap`](rampart_common::tablet::TabletMap) that clients fetch.
pub const TABLES_MAX: usize = 65_536;

/// Most tablets over all live tables. A [`TabletMap`](rampart_common::tablet::TabletMap)
/// travels in one RPC, so its tablets must fit in half a payload (the other half is left
/// to the server list).
pub const TABLETS_MAX: usize = 1 << 20;

/// Bytes of one [`Tablet`] in bincode's fixed-width encoding: four `u64`s.
const TABLET_WIRE_BYTES: usize = 32;

/// Most entries in the server list. Ids are never reused and the list keeps crashed and
/// removed servers (their ids must stay known), so this bounds enlistments over the life
/// of the cluster, restarts included.
pub const SERVERS_MAX: usize = 100_000;

/// Longest table name, in bytes. Names travel in every `get_table_id` request.
pub const TABLE_NAME_BYTES_MAX: usize = 256;

/// Most tablets a table is created with. Spreading one table over more masters than this
/// buys nothing in a cluster of the size Rampart targets. Splits may take a table past
/// it; only [`TABLETS_MAX`] bounds them.
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

/// Most moves open at once (`state::moves`). Each holds a source's and a target's attention for its
/// length; a cluster rebalancing needs a few per server at most.
pub const MOVES_MAX: usize = 256;

/// Most ranges pinned at once (`state::rebalancing`).
pub const PINNED_MAX: usize = 1024;

/// How many ended moves' outcomes the state keeps (the newest by id), to answer a
/// retried commit or abort and a master asking how a move ended.
pub const ENDED_MOVES_KEPT: usize = 1024;

/// An open move: whole tablets of `range`, from `source` to `target`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenMove {
    /// Its id.
    pub id: MoveId,
    /// The tablets moved, as one range of their table (whole tablets of `source`).
    pub range: HashRange,
    /// Their owner until the commit.
    pub source: ServerId,
    /// Their owner after it.
    pub target: ServerId,
}

/// How a move ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveEnd {
    /// Its tablets went to the target.
    Committed,
    /// They stayed with the source.
    Aborted,
}

// A whole `TabletMap` must fit one RPC payload: its tablets in half of it, the table names
// well within it, and no one table larger than the tablet budget.
const _: () = assert!(TABLETS_MAX * TABLET_WIRE_BYTES <= RPC_PAYLOAD_BYTES_MAX / 2);
const _: () = assert!(TABLE_SPAN_MAX as usize <= TABLETS_MAX);
const _: () = assert!(TABLE_NAME_BYTES_MAX * TABLES_MAX <= RPC_PAYLOAD_BYTES_MAX);

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
    /// Splits the tablet of table `table` that holds hash `at` in two, `[start, at - 1]`
    /// and `[at, end]`, both with its owner: no data moves, and the owner's tablet epoch
    /// is bumped once. By id, as [`Command::DropTable`]. A split where a tablet starts
    /// already changes nothing (a retry after an unknown outcome is harmless). Refused
    /// while the owner is not `Up` (its recovery decides where the tablet goes), and
    /// beyond [`TABLETS_MAX`] tablets.
    SplitTablet {
        /// The table.
        table: TableId,
        /// The first hash of the upper half.
        at: u64,
    },
    /// Opens a move of the whole tablets `start..=end` of table `table` from their one
    /// owner (an `Up` master) to `target` (another): a new [`MoveId`]. Nothing changes
    /// owner yet. Repeated while that move is open, it answers with it. Refused for a
    /// range that is not whole tablets of one owner, that overlaps an open move, or
    /// beyond [`MOVES_MAX`] open moves.
    BeginMove {
        /// The table.
        table: TableId,
        /// The first hash of the first tablet moved.
        start: u64,
        /// The last hash of the last tablet moved.
        end: u64,
        /// The master that takes them.
        target: ServerId,
    },
    /// Ends open move `id` by handing its tablets to the target (see `state::moves`):
    /// both owners' tablet epochs are bumped, and the target's version ceiling is raised
    /// to the source's. Refused once the move was aborted; a repeat after it committed
    /// changes nothing.
    CommitMove {
        /// The move.
        id: MoveId,
    },
    /// Ends open move `id` with its tablets left on the source. Refused once the move
    /// committed; a repeat after it was aborted changes nothing.
    AbortMove {
        /// The move.
        id: MoveId,
    },
    /// Begins draining `Up` server `id` (`state::drains`): nothing new is placed on it
    /// from now on. Refused when it owns tablets and no other master could take them; a
    /// repeat changes nothing.
    DrainServer {
        /// The server.
        id: ServerId,
    },
    /// Removes drained server `id`. Refused unless it is being drained, owns no tablet,
    /// is no end of an open move, no crashed server awaits its recovery (which may read
    /// its backup), and every other `Up` master is in `confirmed` (said its log needs
    /// nothing on that backup any more); a repeat after it was removed changes nothing.
    RemoveDrained {
        /// The server.
        id: ServerId,
        /// The masters that confirmed they left its backup.
        confirmed: Vec<ServerId>,
    },
    /// Pauses (or resumes) the rebalancer (`state::rebalancing`); a repeat changes
    /// nothing.
    SetRebalancePaused {
        /// Paused from now on.
        paused: bool,
    },
    /// Pins the tablets meeting `range` to their masters (`pin`), or unpins every pinned
    /// range that meets it. Refused for an unknown table or an empty range, and past
    /// [`PINNED_MAX`] pinned ranges; a repeat changes nothing.
    PinTablets {
        /// The range.
        range: HashRange,
        /// Pin, or unpin.
        pin: bool,
    },
    /// Caps the megabytes per second each move may copy from now on (0: no cap); a
    /// repeat changes nothing.
    SetMoveCap {
        /// The cap.
        mb_per_s: u32,
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
    /// A tablet was split, or `at` was where a tablet starts already.
    TabletSplit {
        /// The tablets that meet at `at`, in hash order: the lower and the upper half
        /// (only the upper when `at` is 0, the start of every table).
        tablets: Vec<Tablet>,
        /// False if `at` was a tablet boundary already and nothing changed.
        split: bool,
        /// The owners' tablet epochs: after the split when `split`, else as they stand
        /// (an owner then needs only catch up to it).
        epochs: Vec<(ServerId, TabletEpoch)>,
    },
    /// A move is open (or was already, for a repeated `BeginMove`).
    MoveBegun {
        /// Its id.
        id: MoveId,
        /// The master its tablets come from.
        source: ServerId,
        /// False if the move was open already and nothing changed.
        begun: bool,
    },
    /// A move ended (or had ended that way already: then `tablets` and `epochs` are
    /// empty, and the owners need only catch up with the map).
    MoveEnded {
        /// Its id.
        id: MoveId,
        /// How.
        end: MoveEnd,
        /// The tablets the target owns now (committed only).
        tablets: Vec<Tablet>,
        /// The source's and the target's tablet epochs after the commit.
        epochs: Vec<(ServerId, TabletEpoch)>,
    },
    /// A drain is under way (or was already, for a repeated `DrainServer`).
    DrainBegun {
        /// The server being drained.
        id: ServerId,
        /// False if it was being drained already and nothing changed.
        begun: bool,
    },
    /// The rebalancer's committed settings, as they stand after the command.
    RebalancingSet {
        /// Paused.
        paused: bool,
        /// The pinned ranges, in order.
        pinned: Vec<HashRange>,
        /// The cap on a move's copy, in megabytes per second (0: none).
        move_cap_mb_s: u32,
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
pub(super) enum Reject {
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
    #[error("cannot pin: {why}")]
    BadPin { why: String },
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
    #[error("no table has id {0}")]
    UnknownTable(TableId),
    #[error("the tablet of {table} holding hash {at:#x} belongs to {owner}, which is not up: its recovery decides where the tablet goes; retry when it is over")]
    OwnerNotUp {
        table: TableId,
        at: u64,
        owner: ServerId,
    },
    #[error("too many clients open (limit {max}): no more until some expire", max = CLIENTS_MAX)]
    TooManyClients,
    #[error("cannot move: {why}")]
    BadMove { why: String },
    #[error("{range:?} overlaps {id}, which is open: wait for it to end, or abort it")]
    Moving { id: MoveId, range: HashRange },
    #[error("too many moves open (limit {max}): wait for some to end", max = MOVES_MAX)]
    TooManyMoves,
    #[error("no move {0} is open or ended recently")]
    UnknownMove(MoveId),
    #[error("{id} ended already: {end:?}")]
    MoveEndedOtherwise { id: MoveId, end: MoveEnd },
    #[error("cannot drain: {why}")]
    BadDrain { why: String },
    #[error("server {id} cannot go from {from:?} to {to:?}")]
    StatusBackwards {
        id: ServerId,
        from: ServerStatus,
        to: ServerStatus,
    },
}

impl Reject {
    pub(super) fn status(&self) -> Status {
        match self {
            Reject::NoMasters => Status::NotEnoughServers,
            Reject::TooManyClients | Reject::OwnerNotUp { .. } | Reject::TooManyMoves => {
                Status::Retry
            }
            Reject::UnknownTable(_) => Status::TableDoesntExist,
            Reject::Crashed(_) => Status::ServerCrashed,
            Reject::NotOwned { .. } | Reject::NotCrashed(_) => Status::RecoveryFailed,
            _ => Status::InvalidArgument,
        }
    }
}

/// A command that was not rejected: whether it changed the state decides the version bump.
pub(super) enum Outcome {
    Changed(CommandResult),
    Unchanged(CommandResult),
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Random commands, for the property tests of the whole state machine (`core`) and of
    /// the commands' encoding.
    pub(crate) fn command_strategy() -> impl Strategy<Value = Command> {
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
            2 => (1u64..6, prop_oneof![Just(0u64), Just(1 << 63), Just(u64::MAX), any::<u64>()])
                .prop_map(|(id, at)| Command::SplitTablet { table: TableId(id), at }),
            2 => (1u64..6, prop_oneof![Just((0u64, u64::MAX)), Just((0, (1 << 63) - 1)), Just((1 << 63, u64::MAX)), (any::<u64>(), any::<u64>())], 0u64..12)
                .prop_map(|(id, (start, end), target)| Command::BeginMove {
                    table: TableId(id),
                    start,
                    end,
                    target: ServerId(target),
                }),
            1 => (1u64..5).prop_map(|id| Command::CommitMove { id: MoveId(id) }),
            1 => (1u64..5).prop_map(|id| Command::AbortMove { id: MoveId(id) }),
            1 => (1u64..6).prop_map(|id| Command::DrainServer { id: ServerId(id) }),
            1 => any::<bool>().prop_map(|paused| Command::SetRebalancePaused { paused }),
            1 => (0u32..4).prop_map(|mb_per_s| Command::SetMoveCap { mb_per_s }),
            1 => (1u64..6, any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(id, a, b, pin)| {
                Command::PinTablets {
                    range: HashRange::new(TableId(id), a.min(b), a.max(b)),
                    pin,
                }
            }),
            1 => (1u64..6, prop::collection::vec(1u64..6, 0..6)).prop_map(|(id, confirmed)| {
                Command::RemoveDrained {
                    id: ServerId(id),
                    confirmed: confirmed.into_iter().map(ServerId).collect(),
                }
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

    proptest! {
        #[test]
        fn commands_round_trip_through_bincode(command in command_strategy()) {
            let bytes = bincode::serialize(&command).expect("serializable");
            let back: Command = bincode::deserialize(&bytes).expect("deserializable");
            prop_assert_eq!(back, command);
        }
    }
}
