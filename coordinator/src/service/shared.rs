//! The [`CoordinatorService`] struct, its construction and accessors, and what every
//! handler shares: proposing a command ([`apply`](CoordinatorService::apply)), the
//! read barrier, the table-name locks, and the replies for what the node or the state
//! machine refused. A leaf: the handlers' files build on it, never the other way round.

use parking_lot::Mutex;
use rampart_common::rifl::CLIENT_LEASE;
use rampart_common::rpc::{Reply, RpcPool};
use rampart_common::status::Status;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::client_leases::{ClientExpirer, ClientLeases};
use crate::collector::Collector;
use crate::drainer::Drainer;
use crate::failure_verifier::FailureVerifier;
use crate::mover::Mover;
use crate::node::{NodeError, RaftNode};
use crate::rebalancer::Rebalancer;
use crate::recovery_manager::{RecoveryConfig, RecoveryManager};
use crate::state::{Command, CommandResult, CoordinatorState};

// How long a handler waits for its proposal to commit, or for a read barrier. Part of
// the protocol (clients size their attempts by it), so it lives with the messages.
use rampart_common::protocol::coordinator::PROPOSAL_TIMEOUT;

/// Lock stripes that serialise changes to one table name with their pushes.
pub const NAME_LOCKS: usize = 64;

/// The coordinator service of one coordinator process.
#[derive(Debug)]
pub struct CoordinatorService {
    /// This coordinator's Raft member, holding the configuration.
    pub(super) node: RaftNode,
    /// Serialise a table's change with the pushes that follow it, by name hash.
    names: Vec<tokio::sync::Mutex<()>>,
    /// Connections to masters.
    pub(super) pool: Arc<RpcPool>,
    /// Failure verification (active while this member leads).
    pub(super) verifier: Arc<FailureVerifier>,
    /// Crash recovery (active while this member leads).
    pub(super) recovery: Arc<RecoveryManager>,
    /// Stops the recovery manager's loop when the service goes away.
    _recovery_task: AbortOnDrop,
    /// Client leases as this member sees them while it leads.
    pub(super) client_leases: Arc<Mutex<ClientLeases>>,
    /// Stops the client expirer when the service goes away.
    _expirer_task: AbortOnDrop,
    /// `WatchTabletMap`s waiting now (at most `WATCH_TABLET_MAP_WAITERS_MAX`).
    pub(super) map_watchers: Arc<tokio::sync::Semaphore>,
    /// Drives moves of tablets (and, while this member leads, ends those nobody drives).
    pub(super) mover: Arc<Mover>,
    /// Stops the mover's janitor when the service goes away.
    _mover_task: AbortOnDrop,
    /// Drives drains of servers while this member leads.
    pub(super) drainer: Arc<Drainer>,
    /// Serialises the check and the commit of drains: two drains checked at once could
    /// each leave enough backups alone, and too few together.
    pub(super) drain_lock: tokio::sync::Mutex<()>,
    /// Stops the drainer when the service goes away.
    _drainer_task: AbortOnDrop,
    /// Stops the collector of replicas nobody needs when the service goes away.
    _collector_task: AbortOnDrop,
    /// Rebalances tablets by load while this member leads (when on).
    pub(super) rebalancer: Arc<Rebalancer>,
    /// Stops the rebalancer when the service goes away.
    _rebalancer_task: AbortOnDrop,
}

/// Aborts a background task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl CoordinatorService {
    /// The service of a running Raft member, with the default recovery settings; must be
    /// called inside a tokio runtime (it starts the recovery manager).
    pub fn new(node: RaftNode) -> CoordinatorService {
        CoordinatorService::with_recovery(node, RecoveryConfig::default())
    }

    /// The service of a running Raft member; must be called inside a tokio runtime (it
    /// starts the recovery manager, stopped when the service is dropped).
    pub fn with_recovery(node: RaftNode, config: RecoveryConfig) -> CoordinatorService {
        let pool = Arc::new(RpcPool::new());
        let collector = Collector::new(node.clone(), Arc::clone(&pool), config.collect_interval);
        let collector_task = tokio::spawn(Arc::new(collector).run());
        let verifier = Arc::new(FailureVerifier::new(
            node.clone(),
            Arc::clone(&pool),
            config.verify_timeout,
            config.verify_attempts,
            config.proof_of_death,
        ));
        let recovery = Arc::new(RecoveryManager::new(
            node.clone(),
            Arc::clone(&pool),
            config,
            Arc::clone(&verifier),
        ));
        let task = tokio::spawn(Arc::clone(&recovery).run());
        let client_leases = Arc::new(Mutex::new(ClientLeases::new(CLIENT_LEASE)));
        let expirer = ClientExpirer::new(node.clone(), Arc::clone(&client_leases));
        let expirer_task = tokio::spawn(expirer.run());
        let mover = Arc::new(Mover::new(node.clone(), Arc::clone(&pool)));
        let mover_task = tokio::spawn(Arc::clone(&mover).run());
        let drainer = Arc::new(Drainer::new(
            node.clone(),
            Arc::clone(&pool),
            Arc::clone(&mover),
        ));
        let drainer_task = tokio::spawn(Arc::clone(&drainer).run());
        let rebalancer = Arc::new(Rebalancer::new(
            node.clone(),
            Arc::clone(&pool),
            Arc::clone(&mover),
            config.rebalance.is_some(),
            config.rebalance.unwrap_or_default(),
        ));
        let rebalancer_task = tokio::spawn(Arc::clone(&rebalancer).run());
        CoordinatorService {
            rebalancer,
            _rebalancer_task: AbortOnDrop(rebalancer_task),
            drainer,
            drain_lock: tokio::sync::Mutex::new(()),
            _collector_task: AbortOnDrop(collector_task),
            _drainer_task: AbortOnDrop(drainer_task),
            mover,
            _mover_task: AbortOnDrop(mover_task),
            client_leases,
            _expirer_task: AbortOnDrop(expirer_task),
            node,
            names: (0..NAME_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            pool,
            verifier,
            recovery,
            _recovery_task: AbortOnDrop(task),
            map_watchers: Arc::new(tokio::sync::Semaphore::new(
                rampart_common::protocol::coordinator::WATCH_TABLET_MAP_WAITERS_MAX,
            )),
        }
    }

    /// The same service, with client leases of `lease` instead of
    /// [`CLIENT_LEASE`] (tests). Give it before the service serves requests.
    pub fn with_client_lease(mut self, lease: Duration) -> CoordinatorService {
        *self.client_leases.lock() = ClientLeases::new(lease);
        // A new expirer, which sleeps by the new length (the old one is aborted).
        let expirer = ClientExpirer::new(self.node.clone(), Arc::clone(&self.client_leases));
        self._expirer_task = AbortOnDrop(tokio::spawn(expirer.run()));
        self
    }

    /// The recovery manager (reports of past recoveries).
    pub fn recovery(&self) -> &Arc<RecoveryManager> {
        &self.recovery
    }

    /// This coordinator's Raft member.
    pub fn node(&self) -> &RaftNode {
        &self.node
    }

    /// A copy of this member's state machine (for status pages and tests; not
    /// necessarily current on a follower).
    pub fn state(&self) -> CoordinatorState {
        self.node.with_state(CoordinatorState::clone)
    }

    pub(super) fn name_lock(&self, name: &str) -> &tokio::sync::Mutex<()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut hasher);
        &self.names[(hasher.finish() % NAME_LOCKS as u64) as usize]
    }

    /// Proposes `command` and waits for its result, or for the reply that says why not.
    pub(super) async fn apply(&self, command: Command) -> Result<CommandResult, Reply> {
        let what = command_name(&command);
        match tokio::time::timeout(PROPOSAL_TIMEOUT, self.node.propose(command)).await {
            Ok(Ok(result)) => {
                tracing::debug!(what, ?result, "applied");
                Ok(result)
            }
            Ok(Err(e)) => Err(node_error_reply(e)),
            Err(_) => Err(Reply::error(
                Status::Retry,
                format!(
                    "{what} not committed within {PROPOSAL_TIMEOUT:?}: this coordinator \
                     cannot reach a majority of the coordinators; it may still commit, and \
                     retrying is safe"
                ),
            )),
        }
    }

    /// Waits until this member's state reflects every change committed before the call.
    pub(super) async fn read_barrier(&self) -> Result<(), Reply> {
        match tokio::time::timeout(PROPOSAL_TIMEOUT, self.node.read_barrier()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(node_error_reply(e)),
            Err(_) => Err(Reply::error(
                Status::Retry,
                format!(
                    "read not confirmed within {PROPOSAL_TIMEOUT:?}: this coordinator cannot \
                     reach a majority of the coordinators"
                ),
            )),
        }
    }
}

/// What a command is, for messages.
fn command_name(command: &Command) -> &'static str {
    match command {
        Command::EnlistServer { .. } => "enlistment",
        Command::SetServerStatus { .. } => "server status change",
        Command::CreateTable { .. } => "create-table",
        Command::DropTable { .. } => "drop-table",
        Command::SetWill { .. } => "will upload",
        Command::RecoveredPartition { .. } => "recovered partition",
        Command::AllowLoss { .. } => "allow-loss",
        Command::SetOpenEpoch { .. } => "open segment epoch",
        Command::ReserveVersions { .. } => "version reservation",
        Command::OpenClient | Command::OpenClientWithoutLease => "client opening",
        Command::ExpireClients { .. } => "client expiry",
        Command::SplitTablet { .. } => "tablet split",
        Command::BeginMove { .. } => "move start",
        Command::CommitMove { .. } => "move commit",
        Command::AbortMove { .. } => "move abort",
        Command::DrainServer { .. } => "drain",
        Command::RemoveDrained { .. } => "removal of a drained server",
        Command::SetRebalancePaused { .. } => "rebalancer pause",
        Command::PinTablets { .. } => "tablet pin",
        Command::SetMoveCap { .. } => "move bandwidth cap",
    }
}

/// The reply for a proposal or read the node did not carry out.
pub(super) fn node_error_reply(error: NodeError) -> Reply {
    match error {
        NodeError::NotLeader(hint) => Reply::error(Status::NotLeader, hint.encode()),
        NodeError::Dropped | NodeError::Busy | NodeError::OutcomeUnknown => {
            Reply::error(Status::Retry, error.to_string())
        }
        NodeError::Stopped(_) => Reply::error(Status::ShuttingDown, error.to_string()),
    }
}

/// The reply for a committed command the state machine refused (or answered with a
/// result its handler did not expect).
pub(super) fn rejected(result: CommandResult) -> Reply {
    match result {
        CommandResult::Rejected { status, detail } => Reply::error(status, detail),
        other => Reply::error(Status::Internal, format!("unexpected result {other:?}")),
    }
}
