//! `Mover`: the leader's driver of moves of tablets (docs/design.md §7, "Moving a
//! tablet"). The decisions are the state machine's (`state::moves`: a move begins, then
//! exactly one of its commit and its abort takes effect); this drives the masters
//! around them.
//!
//! # A move
//! With the move begun (committed `BeginMove`), the target is asked to take the range
//! (`MoveIn`: it copies from the source, which freezes the range for the last tail, and
//! answers once that is on its backups). Then the leader commits the move
//! (`CommitMove`), and both owners are told to catch up with their tablets
//! (`SyncTablets`): the target serves the range, the source forgets it and unfreezes
//! by no longer owning it. If the target fails, or the commit is refused, the leader
//! commits the abort (`AbortMove`) and only then tells both (`EndMove`): the source
//! serves the range again, the target forgets its copy. Nobody acts on an abort before
//! it is committed: a commit proposed by a deposed leader may still win.
//!
//! The drive runs on a task of its own, so a client that goes away does not stop it
//! halfway.
//!
//! # A new leader
//! An open move that no drive of this member runs (its leader died, or the member that
//! drove it was deposed) is aborted by [`Mover::run`], which looks every
//! [`JANITOR_INTERVAL`] while this member leads. A drive registers its range before it
//! proposes `BeginMove`, so the janitor never aborts a move in the moment between its
//! commit and its drive.
//!
//! # Failure handling
//! A proposal whose outcome is unknown leaves the move open: the janitor ends it. A
//! push that fails is logged: masters catch up at their next lease renewal, and an
//! `EndMove` that did not arrive leaves the source frozen until it is sent again (the
//! janitor resends the last aborts' `EndMove`s for [`END_RESEND_FOR`]).

use parking_lot::Mutex;
use rampart_common::ids::{MoveId, ServerId};
use rampart_common::protocol::coordinator::{MovedTablets, PROPOSAL_TIMEOUT};
use rampart_common::protocol::master::{
    EndMove, EndMoveRequest, MoveIn, MoveInRequest, SyncTablets, SyncTabletsRequest,
    MOVE_IN_TIMEOUT,
};
use rampart_common::rpc::{Reply, RpcPool};
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, ServerStatus, Tablet};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::node::RaftNode;
use crate::state::{Command, CommandResult, MoveEnd};

/// How often the leader looks for open moves nobody drives.
pub const JANITOR_INTERVAL: Duration = Duration::from_secs(1);

/// How long after an abort the janitor sends its `EndMove`s again (a source that missed
/// one stays frozen until then).
pub const END_RESEND_FOR: Duration = Duration::from_secs(30);

/// Deadline of a push after a move ends.
const PUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The leader's driver of moves; see the module doc.
#[derive(Debug)]
pub struct Mover {
    node: RaftNode,
    pool: Arc<RpcPool>,
    /// Ranges whose moves a drive of this member runs (registered before `BeginMove`).
    driving: Mutex<HashSet<HashRange>>,
    /// Aborted moves whose `EndMove`s the janitor sends again.
    ended: Mutex<HashMap<MoveId, Aborted>>,
}

/// An aborted move whose ends are told again until `until`.
#[derive(Debug, Clone, Copy)]
struct Aborted {
    request: EndMoveRequest,
    ends: [ServerId; 2],
    until: Instant,
}

/// Unregisters a drive's range when the drive ends, however it ends.
struct Driving<'a> {
    mover: &'a Mover,
    range: HashRange,
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        self.mover.driving.lock().remove(&self.range);
    }
}

impl Mover {
    /// The mover of `node`'s cluster, calling masters through `pool`.
    pub fn new(node: RaftNode, pool: Arc<RpcPool>) -> Mover {
        Mover {
            node,
            pool,
            driving: Mutex::new(HashSet::new()),
            ended: Mutex::new(HashMap::new()),
        }
    }

    /// Begins a move of `range` (whole tablets) to `target` and drives it to its end, on
    /// a task of its own; answers once it is committed, or with why it was not.
    pub async fn move_range(
        self: &Arc<Self>,
        range: HashRange,
        target: ServerId,
    ) -> Result<MovedTablets, Reply> {
        let mover = Arc::clone(self);
        tokio::spawn(async move { mover.drive(range, target).await })
            .await
            .map_err(|error| Reply::error(Status::Internal, format!("the move's task: {error}")))?
    }

    async fn drive(&self, range: HashRange, target: ServerId) -> Result<MovedTablets, Reply> {
        if !self.driving.lock().insert(range) {
            return Err(Reply::error(
                Status::Retry,
                format!("a move of {range:?} is being driven already"),
            ));
        }
        let _driving = Driving { mover: self, range };
        let command = Command::BeginMove {
            table: range.table,
            start: range.start,
            end: range.end,
            target,
        };
        let (id, source) = match self.propose(command).await? {
            CommandResult::MoveBegun {
                id, begun: false, ..
            } => {
                // Open already: begun by a drive that is gone (a deposed leader's, or
                // this member's before a lost answer). Only the drive that began a move
                // drives it, since the source's tails are not sent twice; the janitor
                // aborts this one, and a retry then begins a new move.
                return Err(Reply::error(
                    Status::Retry,
                    format!("{id} of {range:?} is open with no drive here; it is being ended"),
                ));
            }
            CommandResult::MoveBegun { id, source, .. } => (id, source),
            CommandResult::Rejected { status, detail } => return Err(Reply::error(status, detail)),
            other => return Err(refused(other)),
        };
        tracing::info!(%id, ?range, %source, %target, "move begun");
        let (source_addr, target_addr, cap_mb_s) = self.node.with_state(|state| {
            (
                addr_of(state, source),
                addr_of(state, target),
                state.move_cap_mb_s(),
            )
        });
        let (Some(source_addr), Some(target_addr)) = (source_addr, target_addr) else {
            return Err(self
                .abort(id, range, [source, target], "an end is not up".into())
                .await);
        };
        let request = MoveInRequest {
            id,
            range,
            source,
            source_addr,
            bytes_per_s: u64::from(cap_mb_s) * 1_000_000,
        };
        let deadline = Instant::now() + MOVE_IN_TIMEOUT + Duration::from_secs(5);
        let taken = match self
            .pool
            .call::<MoveIn>(&target_addr, &request, deadline)
            .await
        {
            Ok(taken) => taken,
            Err(error) => {
                let why = format!("the target {target} did not take the range: {error}");
                return Err(self.abort(id, range, [source, target], why).await);
            }
        };
        let frozen_since = Instant::now() - Duration::from_millis(u64::from(taken.frozen_ms));
        let (tablets, epochs) = match self.propose(Command::CommitMove { id }).await {
            Ok(CommandResult::MoveEnded {
                end: MoveEnd::Committed,
                tablets,
                epochs,
                ..
            }) => (tablets, epochs),
            // Refused: the move was aborted meanwhile (an end crashed, the table was
            // dropped), or cannot commit. Its abort is then committed or changes
            // nothing, and both ends are told.
            Ok(other) => {
                let why = format!("the commit was refused: {other:?}");
                return Err(self.abort(id, range, [source, target], why).await);
            }
            // Unknown: it may still commit. The janitor of whoever leads ends it.
            Err(reply) => return Err(reply),
        };
        let pushes = epochs.iter().map(|&(owner, epoch)| {
            let addr = self.node.with_state(|state| addr_of(state, owner));
            async move {
                let Some(addr) = addr else { return };
                let request = SyncTabletsRequest { owner, epoch };
                let deadline = Instant::now() + PUSH_TIMEOUT;
                if let Err(error) = crate::push::push_until::<SyncTablets>(
                    &self.pool, &addr, &request, deadline,
                )
                .await
                {
                    tracing::warn!(%id, %owner, %error, "owner not told of the committed move; it catches up at its next lease renewal");
                }
            }
        });
        futures::future::join_all(pushes).await;
        let frozen_ms = u32::try_from(frozen_since.elapsed().as_millis()).unwrap_or(u32::MAX);
        tracing::info!(%id, ?range, %source, %target, entries = taken.entries, bytes = taken.bytes, copy_ms = taken.copy_ms, frozen_ms, "move committed");
        Ok(MovedTablets {
            id,
            source,
            tablets,
            entries: taken.entries,
            bytes: taken.bytes,
            copy_ms: taken.copy_ms,
            frozen_ms,
        })
    }

    /// Cancels open move `id` (an operator's word): its abort is committed and both ends
    /// told, which stops the target's copy; the drive then answers its caller
    /// `MoveAborted`. Refused (`InvalidArgument`) for a move that is not open.
    pub async fn cancel(&self, id: MoveId) -> Result<(), Reply> {
        let open = self.node.with_state(|state| {
            state
                .open_move(id)
                .map(|open| (open.range, [open.source, open.target]))
        });
        let Some((range, ends)) = open else {
            let ended = self.node.with_state(|state| state.move_end(id));
            return Err(Reply::error(
                Status::InvalidArgument,
                match ended {
                    Some(end) => format!("{id} is not open: it ended {end:?}"),
                    None => format!("{id} is not open (unknown, or ended long ago)"),
                },
            ));
        };
        let reply = self
            .abort(id, range, ends, "cancelled by an operator".into())
            .await;
        if reply.status() == Status::MoveAborted {
            Ok(())
        } else {
            Err(reply)
        }
    }

    /// Commits the abort of move `id` and, once it is committed, tells both ends
    /// (`EndMove`). Returns the reply for the drive's caller.
    async fn abort(&self, id: MoveId, range: HashRange, ends: [ServerId; 2], why: String) -> Reply {
        tracing::warn!(%id, ?range, %why, "aborting the move");
        match self.propose(Command::AbortMove { id }).await {
            Ok(CommandResult::MoveEnded {
                end: MoveEnd::Aborted,
                ..
            }) => {
                let request = EndMoveRequest { id, range };
                let until = Instant::now() + END_RESEND_FOR;
                self.ended.lock().insert(
                    id,
                    Aborted {
                        request,
                        ends,
                        until,
                    },
                );
                self.tell_ended(request, ends).await;
                Reply::error(Status::MoveAborted, format!("{id} aborted: {why}"))
            }
            Ok(other) => Reply::error(
                Status::Internal,
                format!("{id}: {why}; its abort was refused: {other:?}"),
            ),
            Err(reply) => reply,
        }
    }

    /// Sends `EndMove` to both ends of an aborted move (each ignores what it does not
    /// hold).
    async fn tell_ended(&self, request: EndMoveRequest, ends: [ServerId; 2]) {
        let addrs: Vec<(ServerId, String)> = self.node.with_state(|state| {
            ends.iter()
                .filter_map(|&end| addr_of(state, end).map(|addr| (end, addr)))
                .collect()
        });
        let calls = addrs.into_iter().map(|(end, addr)| async move {
            let deadline = Instant::now() + PUSH_TIMEOUT;
            if let Err(error) = self
                .pool
                .call::<EndMove>(&addr, &request, deadline)
                .await
            {
                tracing::warn!(id = %request.id, %end, %error, "an end of the aborted move was not told; told again later");
            }
        });
        futures::future::join_all(calls).await;
    }

    /// While this member leads, every [`JANITOR_INTERVAL`]: aborts the open moves that
    /// no drive of it runs, and resends the `EndMove`s of recent aborts. Runs until
    /// aborted.
    pub async fn run(self: Arc<Self>) {
        loop {
            tokio::time::sleep(JANITOR_INTERVAL).await;
            if self.node.leader_term().is_none() {
                continue;
            }
            let orphans: Vec<(MoveId, HashRange, [ServerId; 2])> = {
                let driving = self.driving.lock();
                self.node.with_state(|state| {
                    state
                        .open_moves()
                        .filter(|open| !driving.contains(&open.range))
                        .map(|open| (open.id, open.range, [open.source, open.target]))
                        .collect()
                })
            };
            for (id, range, ends) in orphans {
                let _ = self
                    .abort(id, range, ends, "no leader drives it any more".into())
                    .await;
            }
            let now = Instant::now();
            let resend: Vec<Aborted> = {
                let mut ended = self.ended.lock();
                ended.retain(|_, aborted| aborted.until > now);
                ended.values().copied().collect()
            };
            for aborted in resend {
                self.tell_ended(aborted.request, aborted.ends).await;
            }
        }
    }

    /// Proposes `command`; `Err` when its outcome is unknown (not committed in time,
    /// or this member does not lead), `Ok` with what applying it gave, refusals
    /// included.
    async fn propose(&self, command: Command) -> Result<CommandResult, Reply> {
        match tokio::time::timeout(PROPOSAL_TIMEOUT, self.node.propose(command)).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(Reply::error(Status::Retry, error.to_string())),
            Err(_) => Err(Reply::error(
                Status::Retry,
                format!("not committed within {PROPOSAL_TIMEOUT:?}"),
            )),
        }
    }
}

/// Where `server` listens, if it is `Up`.
fn addr_of(state: &crate::state::CoordinatorState, server: ServerId) -> Option<String> {
    state
        .server(server)
        .filter(|s| s.status == ServerStatus::Up)
        .map(|s| s.addr.clone())
}

fn refused(result: CommandResult) -> Reply {
    Reply::error(Status::Internal, format!("unexpected {result:?}"))
}

/// The runs of `tablets` (one table's, in hash order) that lie in `start..=end`, each a
/// range of consecutive tablets of one owner, with that owner, in hash order.
pub fn owner_runs(tablets: &[Tablet], start: u64, end: u64) -> Vec<(HashRange, ServerId)> {
    let mut runs: Vec<(HashRange, ServerId)> = Vec::new();
    for tablet in tablets
        .iter()
        .filter(|t| start <= t.start_hash && t.end_hash <= end)
    {
        match runs.last_mut() {
            Some((range, owner))
                if *owner == tablet.owner
                    && range.end.checked_add(1) == Some(tablet.start_hash) =>
            {
                range.end = tablet.end_hash;
            }
            _ => runs.push((tablet.range(), tablet.owner)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::TableId;

    #[test]
    fn a_range_is_moved_as_runs_of_one_owners_tablets() {
        let tablet = |start_hash, end_hash, owner| Tablet {
            table: TableId(1),
            start_hash,
            end_hash,
            owner: ServerId(owner),
        };
        let tablets = [
            tablet(0, 9, 1),
            tablet(10, 19, 1),
            tablet(20, 29, 2),
            tablet(30, 39, 1),
            tablet(40, u64::MAX, 1),
        ];
        let run = |start, end, owner| (HashRange::new(TableId(1), start, end), ServerId(owner));
        assert_eq!(
            owner_runs(&tablets, 0, u64::MAX),
            vec![run(0, 19, 1), run(20, 29, 2), run(30, u64::MAX, 1)]
        );
        assert_eq!(
            owner_runs(&tablets, 10, 29),
            vec![run(10, 19, 1), run(20, 29, 2)]
        );
        assert_eq!(
            owner_runs(&tablets, 40, u64::MAX),
            vec![run(40, u64::MAX, 1)]
        );
        assert_eq!(
            owner_runs(&tablets, 11, 18),
            vec![],
            "not whole tablets: none"
        );
    }
}
