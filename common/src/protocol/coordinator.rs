//! RPCs served by the coordinator.

use super::rpcs::rpcs;
use crate::bincode_message;
use crate::ids::{ClientId, Epoch, MoveId, SegmentId, ServerId, TableId, TabletEpoch};
use crate::tablet::{Services, Tablet, TabletLoad, TabletMap};
use crate::will::Will;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a coordinator waits for a proposal to commit, or for a read barrier, before it
/// answers: several election timeouts, as a leader that lost its majority steps down
/// within one. A caller's attempt must outlast it, or it would abandon a leader that was
/// about to answer and send the request again.
pub const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(2);

/// A storage server announces itself and receives its id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnlistRequest {
    /// Where its RPC listener is reachable.
    pub addr: String,
    /// What it runs.
    pub services: Services,
    /// Its failure domain (rack).
    pub failure_domain: String,
    /// Its backup's measured disk read bandwidth, MB/s.
    pub disk_read_mbps: u32,
}

/// The id assigned at enlistment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnlistReply {
    /// The new server's id.
    pub id: ServerId,
}

/// Create a table spread over `span` tablets. Creating an existing name returns its id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTableRequest {
    /// The table's name.
    pub name: String,
    /// How many tablets to split it into (spread over the masters).
    pub span: u32,
}

/// The id of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableIdReply {
    /// The table.
    pub id: TableId,
}

/// Drop the table with this id. By id, not name: a drop sent again after an unknown
/// outcome must not drop a table created under the same name meanwhile (ids are never
/// reused). Dropping a table that no longer exists succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropTableRequest {
    /// The table.
    pub id: TableId,
}

/// Split the tablet of table `table` that holds hash `at` in two, `[start, at - 1]` and
/// `[at, end]`, both kept by its owner: no data moves. By id, as a drop. A split where a
/// tablet starts already succeeds and changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitTabletRequest {
    /// The table.
    pub table: TableId,
    /// The first hash of the upper half.
    pub at: u64,
}

/// What a split left.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitTabletReply {
    /// The tablets that meet at the hash asked for, in hash order: the lower and the
    /// upper half (only the upper at hash 0, where every table starts).
    pub tablets: Vec<Tablet>,
    /// False if a tablet started there already: nothing changed.
    pub split: bool,
}

/// Move the tablets of `table` that cover hashes `start..=end` to master `target`
/// (splitting first where a tablet reaches past either end): one move per run of
/// tablets of one owner, in turn, passing over those on the target already. Answered
/// once every move is committed, or with why one was aborted (the ones before it
/// stay committed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveTabletsRequest {
    /// The table.
    pub table: TableId,
    /// The first hash moved.
    pub start: u64,
    /// The last hash moved.
    pub end: u64,
    /// The master that takes them.
    pub target: ServerId,
}

/// One committed move of [`MoveTabletsReply`]: one source's tablets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedTablets {
    /// The move's id.
    pub id: MoveId,
    /// Where the tablets were.
    pub source: ServerId,
    /// The tablets the target owns now.
    pub tablets: Vec<Tablet>,
    /// Entries copied (objects, tombstones, completion records).
    pub entries: u64,
    /// Bytes of those entries.
    pub bytes: u64,
    /// Milliseconds from the start to the freeze.
    pub copy_ms: u32,
    /// Milliseconds the range was frozen (reads and writes answered `Retry`) until
    /// the commit.
    pub frozen_ms: u32,
}

/// What a `MoveTablets` moved: one move per run of tablets of one owner, in hash order
/// (none when the target held them all already).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveTabletsReply {
    /// The moves, each committed.
    pub moves: Vec<MovedTablets>,
}

/// Names a move of tablets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveIdRequest {
    /// The move.
    pub id: MoveId,
}

/// Where a move stands in the committed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveState {
    /// Open: neither committed nor aborted yet.
    Open,
    /// Its tablets went to the target.
    Committed,
    /// Its tablets stayed with the source.
    Aborted,
    /// Not open, and not among the newest ended moves the state keeps.
    Unknown,
}

/// A master's load over its last report interval (docs/design.md §7, "Rebalancing").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportLoadRequest {
    /// The master.
    pub server: ServerId,
    /// How long the counts of `tablets` ran, in milliseconds.
    pub interval_ms: u32,
    /// Every tablet it owns, in (table, hash) order (at most
    /// [`LOAD_REPORT_TABLETS_MAX`]: past it, the first ones).
    pub tablets: Vec<TabletLoad>,
}

/// Most tablets one load report names.
pub const LOAD_REPORT_TABLETS_MAX: usize = 16_384;

/// What an operator asks of the rebalancer (`rampart rebalance`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RebalanceAction {
    /// Only show where it stands.
    Show,
    /// Stop deciding moves and splits (committed: every leader after holds to it). A
    /// move under way goes on.
    Pause,
    /// Decide again.
    Resume,
    /// Leave the tablets meeting this range where they are (committed).
    Pin(crate::tablet::HashRange),
    /// Unpin every pinned range meeting this one.
    Unpin(crate::tablet::HashRange),
    /// Cap the megabytes per second each move copies from now on, the rebalancer's, a
    /// drain's and an operator's alike (0: no cap; committed).
    Cap(u32),
}

/// A request to the rebalancer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalanceRequest {
    /// What to do.
    pub action: RebalanceAction,
}

/// Where rebalancing stands, as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalanceReply {
    /// Whether the leader rebalances at all (`rampart coordinator --rebalance`).
    pub enabled: bool,
    /// Paused by an operator (committed).
    pub paused: bool,
    /// The pinned ranges (committed), in order.
    pub pinned: Vec<crate::tablet::HashRange>,
    /// The cap on each move's copy, in megabytes per second (committed; 0: none).
    pub move_cap_mb_s: u32,
    /// The moves open now, whoever began them (`rampart tablet cancel-move` ends one).
    pub moves: Vec<OpenMoveView>,
    /// The load of each `Up` master, as last reported, by id.
    pub servers: Vec<ServerLoad>,
    /// The newest decisions, oldest first, each with the figures behind it.
    pub decisions: Vec<RebalanceDecision>,
}

/// A move open now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenMoveView {
    /// Its id.
    pub id: MoveId,
    /// Its tablets.
    pub range: crate::tablet::HashRange,
    /// Where they are.
    pub source: ServerId,
    /// Where they go.
    pub target: ServerId,
}

/// One master's load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerLoad {
    /// The master.
    pub server: ServerId,
    /// Reads and writes served per second (smoothed over the last reports).
    pub ops_per_s: u64,
    /// Log bytes of its tablets.
    pub bytes: u64,
    /// Its tablets, each with its operations per second and bytes, in (table, hash)
    /// order.
    pub tablets: Vec<TabletLoad>,
}

/// One decision of the rebalancer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalanceDecision {
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// What: a split or a move, in words.
    pub action: String,
    /// Why, with the figures.
    pub why: String,
    /// How it ended (`"under way"` until it has).
    pub outcome: String,
    /// When it ended, in milliseconds since the Unix epoch (0: under way).
    pub done_unix_ms: u64,
    /// Bytes a move copied (0 for a split, or a move that failed).
    pub bytes_moved: u64,
}

/// Where the drain of a server stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReply {
    /// The server.
    pub server: ServerId,
    /// Where it stands.
    pub state: DrainState,
    /// Tablets it still owns.
    pub tablets_left: u32,
    /// Masters whose logs still need its backup (as the leader last asked them).
    pub masters_waiting: u32,
    /// What the drain waits for now, for an operator.
    pub detail: String,
    /// Bytes its moves copied so far (as this leader drove them).
    pub bytes_moved: u64,
}

/// Asks for every drain under way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDrainsRequest {}

/// Every drain under way, by server id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDrainsReply {
    /// One per server being drained.
    pub drains: Vec<DrainReply>,
}

/// The stages of a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainState {
    /// Its tablets move away, then the masters re-create the replicas on its backup
    /// elsewhere.
    Draining,
    /// Drained and removed: nothing needs it any more.
    Removed,
    /// Not being drained: `Up` (never drained), or crashed (recovery took over what it
    /// held).
    NotDraining,
}

/// Names a table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableNameRequest {
    /// The table's name.
    pub name: String,
}

/// Asks for the whole tablet map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletMapRequest {}

/// Asks for the tablet map once it is newer than `seen`, waiting up to `wait_ms` (at
/// most `WATCH_TABLET_MAP_WAIT_MAX`) for a change: a client whose key's owner crashed
/// learns the moment its tablet goes live elsewhere, without polling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchTabletMapRequest {
    /// The version the client holds.
    pub seen: u64,
    /// How long to wait for a newer one, ms.
    pub wait_ms: u32,
}

/// The longest a `WatchTabletMap` waits, whatever it asks.
pub const WATCH_TABLET_MAP_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// `WatchTabletMap`s one coordinator holds at once; past it, one is answered at once
/// with the map as it is (the client then pauses as it would without watching).
pub const WATCH_TABLET_MAP_WAITERS_MAX: usize = 4096;

/// Where the Raft leader is, as far as a coordinator that is not it knows: the detail of
/// a [`crate::status::Status::NotLeader`] reply. On the wire it is text, so that it reads
/// well in an error message too: `leader N at ADDR`, or `no leader: WHY`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotLeaderHint {
    /// Coordinator `id`, serving clients at `addr`, is the leader this one follows.
    Leader {
        /// Its Raft id.
        id: u64,
        /// Its RPC address.
        addr: String,
    },
    /// No leader is known (an election is under way, or no majority is reachable).
    Unknown {
        /// Why, for the error message.
        why: String,
    },
}

impl NotLeaderHint {
    /// The reply detail.
    pub fn encode(&self) -> String {
        match self {
            NotLeaderHint::Leader { id, addr } => format!("leader {id} at {addr}"),
            NotLeaderHint::Unknown { why } => format!("no leader: {why}"),
        }
    }

    /// Reads a reply detail; anything that does not name a leader is `Unknown`.
    pub fn parse(detail: &str) -> NotLeaderHint {
        let mut words = detail.split_whitespace();
        if let (Some("leader"), Some(id), Some("at"), Some(addr), None) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) {
            if let Ok(id) = id.parse() {
                return NotLeaderHint::Leader {
                    id,
                    addr: addr.to_string(),
                };
            }
        }
        let why = detail.strip_prefix("no leader: ").unwrap_or(detail);
        NotLeaderHint::Unknown {
            why: why.to_string(),
        }
    }

    /// The leader's address, if known.
    pub fn leader_addr(&self) -> Option<&str> {
        match self {
            NotLeaderHint::Leader { addr, .. } => Some(addr),
            NotLeaderHint::Unknown { .. } => None,
        }
    }
}

/// Asks a coordinator how its Raft node stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftStatusRequest {}

/// One coordinator's view of the Raft group. Served by every coordinator, leader or not,
/// without going through Raft (it describes the node, not the configuration).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftStatusReply {
    /// This coordinator's Raft id.
    pub id: u64,
    /// Its group's id: a hash of the voters and of the seed the group started from.
    pub group: u64,
    /// `leader`, `follower`, `candidate` or `pre-candidate`.
    pub role: String,
    /// Its current term.
    pub term: u64,
    /// The leader it knows of (0: none).
    pub leader_id: u64,
    /// Highest log index known committed.
    pub commit: u64,
    /// Highest log index applied to its state machine.
    pub applied: u64,
    /// Index of its latest state-machine snapshot (0: none).
    pub snapshot_index: u64,
    /// Configuration version of its state machine.
    pub config_version: u64,
    /// Every member: (Raft id, RPC address).
    pub peers: Vec<(u64, String)>,
}

/// Raft messages from one coordinator to another (coordinator ↔ coordinator only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftMessagesRequest {
    /// The sender's Raft id.
    pub from: u64,
    /// The sender's group id; a member refuses messages from another group.
    pub group: u64,
    /// Each a protobuf-encoded `raft::eraftpb::Message`, in the order sent.
    pub messages: Vec<bytes::Bytes>,
}

/// A server that did not answer: reported by a server's pinger or a client, verified by
/// the coordinator with its own ping before it declares the server crashed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportFailureRequest {
    /// The server that did not answer.
    pub server: ServerId,
    /// Who reports it (an address or a name), for the log.
    pub reporter: String,
}

/// A supervisor (`rampart cluster up`, or a deployment's own) saw the process of
/// `server` exit: the server is gone for good, and, where the coordinators take a
/// supervisor's word (`--proof-of-death`), its recovery need not wait out its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessExitedRequest {
    /// The server whose process exited (the id it announced when it started).
    pub server: ServerId,
    /// Who saw it (a name), for the log.
    pub supervisor: String,
}

/// A master asks to keep serving for another lease period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewLeaseRequest {
    /// The master.
    pub server: ServerId,
}

/// A granted lease (`ServerCrashed` when the server was declared crashed: it must stop).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewLeaseReply {
    /// How long the master may serve, counted from when it *sent* the request.
    pub lease_ms: u32,
    /// The master's tablet epoch in the committed map (see
    /// `protocol::master::TabletsRequest`): a master behind it missed a change of its
    /// tablets and pulls them (`GetOwnedTablets`).
    pub tablets_epoch: TabletEpoch,
    /// The master's version ceiling in the committed map (see `ReserveVersionsRequest`);
    /// a recovery may have raised it.
    pub version_ceiling: u64,
}

/// A master reserves versions: it may hand out versions below `ceiling` (and hold
/// objects of such versions) from now on. Every version a master ever handed out is
/// below its ceiling in the committed map, so a recovery that lost part of its log still
/// knows a version above all of them (`allow-loss` keeps versions increasing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveVersionsRequest {
    /// The master.
    pub server: ServerId,
    /// The ceiling it asks for (a lower one than held changes nothing).
    pub ceiling: u64,
}

/// Open a client of the table API: get its id for exactly-once writes
/// (`crate::rifl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenClientRequest {}

/// A new client's id: never given to another client of this cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenClientReply {
    /// The id.
    pub client: ClientId,
    /// The client's lease, counted from when it sent the request: it renews it
    /// (`RenewClientLease`) well within this.
    pub lease_ms: u32,
}

/// A client renews its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewClientLeaseRequest {
    /// The client.
    pub client: ClientId,
}

/// A renewed client lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewClientLeaseReply {
    /// How long the lease lasts, counted from when the client sent the request.
    pub lease_ms: u32,
}

/// A master asks whether clients' leases hold (before it executes their writes, and
/// to drop the completion records of clients that are gone). At most
/// [`CLIENT_LEASE_CHECKS_MAX`] clients.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckClientLeasesRequest {
    /// The clients.
    pub clients: Vec<ClientId>,
}

/// Most clients one [`CheckClientLeasesRequest`] asks about.
pub const CLIENT_LEASE_CHECKS_MAX: usize = 4096;

/// What the leader knows of each client asked about, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckClientLeasesReply {
    /// One per client asked about, in order.
    pub leases: Vec<ClientLeaseState>,
}

/// What the leader knows of one client's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientLeaseState {
    /// It holds for at least this long, counted from when the master sent the request.
    Valid {
        /// Milliseconds.
        ms: u32,
    },
    /// It ran out, and its expiry is not committed yet: execute nothing of it, keep its
    /// records.
    Lapsed,
    /// Expired for good (committed), or never opened: its records may be dropped.
    Expired,
}

/// The version ceiling a master now holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveVersionsReply {
    /// The ceiling (at least the one asked for).
    pub ceiling: u64,
}

/// The tablets one server owns in the committed map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedTabletsReply {
    /// The server's tablet epoch these tablets are at.
    pub epoch: TabletEpoch,
    /// Every tablet it owns, in (table, hash) order.
    pub tablets: Vec<crate::tablet::Tablet>,
}

/// A master uploads its will (docs/design.md §5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadWillRequest {
    /// The master.
    pub server: ServerId,
    /// Its will.
    pub will: Will,
}

/// A master re-created replicas of its open segment and moved every replica it writes to
/// `epoch`: copies of the segment at older epochs without its footer no longer count in a
/// recovery (`coordinator::recovery_plan`). Sent before the master acknowledges another
/// write; `ServerCrashed` once the master was declared crashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetOpenEpochRequest {
    /// The master.
    pub server: ServerId,
    /// Its open segment.
    pub segment: SegmentId,
    /// The epoch of every replica it now writes.
    pub epoch: Epoch,
}

/// Names one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerIdRequest {
    /// The server.
    pub server: ServerId,
}

/// Asks for the recoveries the leader ran or runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryStatusRequest {}

/// One partition of a recovery, as the leader saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionReport {
    /// Its index.
    pub partition: u32,
    /// The recovery master that replayed it (0 while none has).
    pub master: ServerId,
    /// Milliseconds from the crash being declared until its tablets went live (0: not yet).
    pub live_ms: u64,
    /// Milliseconds from the `Recover`'s arrival at the recovery master to its reply
    /// (its own figure): the wait for a turn (a master replays one partition at a time),
    /// then fetch, replay and re-replication.
    pub replay_ms: u64,
    /// Milliseconds from the crash being declared until the `Recover` was sent.
    pub replay_start_ms: u64,
    /// Log bytes and objects replayed.
    pub bytes: u64,
    /// Objects replayed.
    pub objects: u64,
    /// Attempts (1 unless a recovery master failed).
    pub attempts: u32,
}

/// One recovery, as the leader saw it; times in milliseconds since the crash was
/// declared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryReport {
    /// The crashed server.
    pub crashed: ServerId,
    /// When the crash was declared (or, for a recovery a new leader took over, when it
    /// took it over), in milliseconds since the Unix epoch: to line the timings up with
    /// an outside clock on the same host.
    pub declared_unix_ms: u64,
    /// Milliseconds from the first failure report to the crash being declared (0 when
    /// it was declared for another reason, e.g. a restart at the same address).
    pub detection_ms: u64,
    /// Setup (fence, list, completeness check, reads started) ended.
    pub setup_ms: u64,
    /// Every partition live and the replicas freed (0: not yet).
    pub done_ms: u64,
    /// Segments in the crashed master's log.
    pub segments: u64,
    /// Why it waits, if it does (a missing replica, no recovery master).
    pub waiting: Option<String>,
    /// Its partitions.
    pub partitions: Vec<PartitionReport>,
    /// Why the crashed master's tablets could go live elsewhere (`None`: no partition
    /// was ready to yet): its lease ran out, or its death was proven.
    pub lease_end: Option<LeaseEnd>,
    /// When that was, in milliseconds since the crash was declared (0 with a proof
    /// found before it was declared).
    pub lease_end_ms: u64,
}

/// Why a crashed master can no longer serve anything, so that its tablets may go live
/// elsewhere (`coordinator::proof_of_death`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseEnd {
    /// Its lease ran out: nothing proved its death (a hung, paused or cut-off server, or
    /// proof of death not accepted here).
    Waited,
    /// Its address refused a connection: nothing listens on its port.
    Refused,
    /// Another server answered at its address.
    OtherServer,
    /// Its supervisor saw its process exit.
    ExitSeen,
}

impl std::fmt::Display for LeaseEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LeaseEnd::Waited => "lease waited",
            LeaseEnd::Refused => "refused",
            LeaseEnd::OtherServer => "another server at its address",
            LeaseEnd::ExitSeen => "supervisor saw it exit",
        })
    }
}

/// The recoveries this leader knows of, oldest first (at most
/// `coordinator::recovery_manager::REPORTS_MAX`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryStatusReply {
    /// Oldest first.
    pub recoveries: Vec<RecoveryReport>,
}

bincode_message!(
    OpenClientRequest,
    OpenClientReply,
    RenewClientLeaseRequest,
    RenewClientLeaseReply,
    CheckClientLeasesRequest,
    CheckClientLeasesReply,
    ReserveVersionsRequest,
    ReserveVersionsReply,
    DropTableRequest,
    SplitTabletRequest,
    SplitTabletReply,
    MoveTabletsRequest,
    MovedTablets,
    MoveTabletsReply,
    MoveIdRequest,
    MoveState,
    DrainReply,
    DrainState,
    ReportLoadRequest,
    RebalanceRequest,
    RebalanceReply,
    ListDrainsRequest,
    ListDrainsReply,
    OwnedTabletsReply,
    SetOpenEpochRequest,
    ReportFailureRequest,
    RenewLeaseRequest,
    RenewLeaseReply,
    ProcessExitedRequest,
    UploadWillRequest,
    ServerIdRequest,
    RecoveryStatusRequest,
    PartitionReport,
    RecoveryReport,
    RecoveryStatusReply,
    EnlistRequest,
    EnlistReply,
    CreateTableRequest,
    TableIdReply,
    TableNameRequest,
    TabletMapRequest,
    WatchTabletMapRequest,
    TabletMap,
    RaftStatusRequest,
    RaftStatusReply,
    RaftMessagesRequest,
);

rpcs! {
    /// Enlist a storage server.
    Enlist = 100: EnlistRequest => EnlistReply;
    /// Create a table (idempotent by name).
    CreateTable = 101: CreateTableRequest => TableIdReply;
    /// Drop a table by id (idempotent; dropping a missing table succeeds).
    DropTable = 102: DropTableRequest => ();
    /// Look up a table's id (`TableDoesntExist` if none).
    GetTableId = 103: TableNameRequest => TableIdReply;
    /// The server list and every table's tablets.
    GetTabletMap = 104: TabletMapRequest => TabletMap;
    /// This coordinator's Raft role, term, leader and indexes (any coordinator answers).
    RaftStatus = 105: RaftStatusRequest => RaftStatusReply;
    /// A server stopped answering (the coordinator verifies before declaring a crash).
    ReportFailure = 106: ReportFailureRequest => ();
    /// Renew a master's lease (`ServerCrashed` once it was declared crashed).
    RenewLease = 107: RenewLeaseRequest => RenewLeaseReply;
    /// Upload a master's will.
    UploadWill = 108: UploadWillRequest => ();
    /// Let the recovery of a server whose log is incomplete go on with the replicas
    /// found (the operator accepts losing what the missing ones held).
    AllowLoss = 109: ServerIdRequest => ();
    /// The recoveries the leader ran or runs, with their timings.
    RecoveryStatus = 111: RecoveryStatusRequest => RecoveryStatusReply;
    /// Raft messages between coordinators.
    RaftMessages = 110: RaftMessagesRequest => ();
    /// Record the epoch of a master's open segment after it re-created replicas of it
    /// (`ServerCrashed` once the master was declared crashed).
    SetOpenEpoch = 112: SetOpenEpochRequest => ();
    /// The tablets a server owns, with its tablet epoch (linearizable; `ServerCrashed`
    /// once it was declared crashed).
    GetOwnedTablets = 113: ServerIdRequest => OwnedTabletsReply;
    /// Raise a master's version ceiling (`ServerCrashed` once it was declared crashed).
    ReserveVersions = 114: ReserveVersionsRequest => ReserveVersionsReply;
    /// Open a client: its id for exactly-once writes, and its lease.
    OpenClient = 115: OpenClientRequest => OpenClientReply;
    /// Renew a client's lease (`ClientLeaseExpired` once it expired).
    RenewClientLease = 116: RenewClientLeaseRequest => RenewClientLeaseReply;
    /// How long clients' leases hold (linearizable).
    CheckClientLeases = 117: CheckClientLeasesRequest => CheckClientLeasesReply;
    /// A supervisor saw a server's process exit (declared crashed at once; proof of its
    /// death where the coordinators take a supervisor's word).
    ProcessExited = 118: ProcessExitedRequest => ();
    /// The tablet map once newer than the version the client holds, or as it is after
    /// a wait (linearizable, like `GetTabletMap`).
    WatchTabletMap = 119: WatchTabletMapRequest => TabletMap;
    /// Split a tablet in two on its owner (idempotent: a split where a tablet starts
    /// already changes nothing; `Retry` while the owner is being recovered).
    SplitTablet = 120: SplitTabletRequest => SplitTabletReply;
    /// Move tablets to another master: copied live, frozen briefly, committed (answered
    /// once committed; an aborted move leaves them where they were).
    MoveTablets = 121: MoveTabletsRequest => MoveTabletsReply;
    /// Where a move stands (linearizable): a source frozen for a move it heard no end
    /// of asks.
    GetMove = 122: MoveIdRequest => MoveState;
    /// Begin draining a server (its tablets move away, the masters stop using its
    /// backup, then it is removed); answers where the drain stands.
    DrainServer = 123: ServerIdRequest => DrainReply;
    /// Where the drain of a server stands (linearizable).
    GetDrain = 124: ServerIdRequest => DrainReply;
    /// Every drain under way (linearizable).
    ListDrains = 125: ListDrainsRequest => ListDrainsReply;
    /// A master's load over its last interval (the leader's rebalancer reads it).
    ReportLoad = 126: ReportLoadRequest => ();
    /// Show, pause, resume rebalancing, pin or unpin tablets, or cap moves' bandwidth;
    /// answers where it stands (the leader's view).
    Rebalance = 127: RebalanceRequest => RebalanceReply;
    /// Cancel an open move: its abort is committed and both ends told (the target
    /// forgets its copy, the source serves the range again); `MoveAborted` answers the
    /// move's caller.
    CancelMove = 128: MoveIdRequest => ();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_hint_round_trips() {
        let hints = [
            NotLeaderHint::Leader {
                id: 2,
                addr: "127.0.0.1:7001".into(),
            },
            NotLeaderHint::Unknown {
                why: "election under way".into(),
            },
        ];
        for hint in hints {
            assert_eq!(NotLeaderHint::parse(&hint.encode()), hint);
        }
        assert_eq!(
            NotLeaderHint::parse("leader x at y"),
            NotLeaderHint::Unknown {
                why: "leader x at y".into()
            }
        );
        assert_eq!(
            NotLeaderHint::Leader {
                id: 3,
                addr: "h:1".into()
            }
            .leader_addr(),
            Some("h:1")
        );
    }
}
