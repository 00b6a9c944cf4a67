//! `CoordinatorSet`: calls that must reach the leader of the coordinators' Raft group.
//!
//! The coordinator runs as a Raft group (docs/design.md §2); only its leader serves
//! configuration RPCs. The others answer `NotLeader` with a [`NotLeaderHint`] naming the
//! leader when they know it. Callers — the client library, a master pulling its server
//! list, a server enlisting — hold one `CoordinatorSet` built from the addresses the
//! operator gave, and call through it; it hides which coordinator leads and elections.
//!
//! # How a call finds the leader
//! 1. It tries the leader it last found first (remembered across calls), then every given
//!    address in order; each address at most once per *round*.
//! 2. `NotLeader` naming a leader: the named address is tried next, even if it is not
//!    among the given addresses (a coordinator may advertise another name for itself),
//!    and remembered as the leader. `NotLeader` without one (an election is under way):
//!    the next address.
//! 3. A transport failure (refused, broken, no reply within the attempt's deadline),
//!    `Retry` (the leader could not commit in time) or `ShuttingDown` (a coordinator
//!    stopping): the next address. A coordinator that failed this way, or said it is not
//!    the leader, is no longer remembered as the leader.
//! 4. After a round with no success, [`call`](CoordinatorSet::call) pauses (a
//!    [`Backoff`] from [`COORDINATOR_ROUND_PAUSE_MIN`] doubling up to
//!    [`COORDINATOR_ROUND_PAUSE_MAX`], jittered so that callers that lost the leader
//!    together do not come back together) and goes round again, until the caller's
//!    deadline.
//!    [`call_round`](CoordinatorSet::call_round) makes one round only, for callers that
//!    retry on a schedule of their own.
//!
//! Any other error status (`TableDoesntExist`, `InvalidArgument`, `UnknownOpcode`, ...)
//! or an undecodable reply is the answer: it is returned at once as
//! [`CoordinatorCallError::Rpc`].
//!
//! # Failure handling
//! * Each attempt has a deadline of its own, at most
//!   [`COORDINATOR_ATTEMPT_TIMEOUT_MAX`] (adjustable per set), so one hung coordinator
//!   (a stopped process whose kernel still accepts connections) costs one attempt per
//!   round, not the whole deadline. A call cut off this way may still have run on that
//!   coordinator: use the set for RPCs that are safe to repeat, or give it an attempt
//!   timeout longer than the coordinator's own (`PROPOSAL_TIMEOUT`), so a working
//!   leader always answers first.
//! * At the deadline the call fails with [`CoordinatorCallError::NoLeader`], carrying
//!   the reasons, so an operator sees why: the last answer of a live coordinator
//!   (`... answered coordinator is not the Raft leader: no leader: election under way`)
//!   and the last transport failure (`cannot connect to ...: Connection refused`), the
//!   answer first — when one coordinator is alone, what it says matters more than that
//!   the others are down. An attempt merely cut short by the deadline does not replace a
//!   more telling failure seen before it.
//! * Hints are followed at most [`COORDINATOR_HINTS_PER_ROUND_MAX`] times per round, and
//!   an address already tried in the round is not tried again, so coordinators that
//!   point at each other (stale hints during an election) cannot loop a round forever.
//!
//! # Concurrency
//! Any number of tasks may call through one set at once. The remembered leader sits
//! behind a `parking_lot` mutex, taken briefly and never across an `.await`; a task
//! that finds the leader gone clears it only if no other task replaced it meanwhile.
//!
//! [`NotLeaderHint`]: crate::protocol::coordinator::NotLeaderHint

use crate::backoff::Backoff;
use crate::protocol::coordinator::NotLeaderHint;
use crate::rpc::{Rpc, RpcError, RpcPool};
use crate::status::Status;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// Longest one attempt (one coordinator, one call) may take. Short enough that a hung
/// coordinator leaves most of a typical 10 s client deadline to the others; long enough
/// for a leader to commit a proposal in a healthy group (milliseconds).
pub const COORDINATOR_ATTEMPT_TIMEOUT_MAX: Duration = Duration::from_secs(1);

/// First pause after a round in which no coordinator served the call: an election
/// usually ends within a few hundred milliseconds.
pub const COORDINATOR_ROUND_PAUSE_MIN: Duration = Duration::from_millis(20);

/// Longest pause between rounds, so a new leader is found soon after it is elected.
pub const COORDINATOR_ROUND_PAUSE_MAX: Duration = Duration::from_millis(200);

/// Most leader hints one round follows.
pub const COORDINATOR_HINTS_PER_ROUND_MAX: usize = 8;

const _: () = assert!(COORDINATOR_ROUND_PAUSE_MIN.as_nanos() > 0);
const _: () =
    assert!(COORDINATOR_ROUND_PAUSE_MIN.as_nanos() <= COORDINATOR_ROUND_PAUSE_MAX.as_nanos());
const _: () =
    assert!(COORDINATOR_ROUND_PAUSE_MAX.as_nanos() < COORDINATOR_ATTEMPT_TIMEOUT_MAX.as_nanos());

/// Why a call through a [`CoordinatorSet`] failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CoordinatorCallError {
    /// The leader (or a coordinator) gave an answer that asking again cannot change: an
    /// error status other than `NotLeader`, `Retry` or `ShuttingDown`, or an
    /// undecodable reply.
    #[error(transparent)]
    Rpc(RpcError),
    /// No coordinator served the call before the deadline.
    #[error("no coordinator leader answered after {attempts} attempts: {last}")]
    NoLeader {
        /// Coordinators tried, over all rounds.
        attempts: u32,
        /// Why, for the operator: the last answer of a live coordinator and the last
        /// transport failure, `; `-separated (see the module doc).
        last: String,
    },
}

/// The coordinators a process knows and the leader it last found; see the module doc.
#[derive(Debug)]
pub struct CoordinatorSet {
    /// The addresses given, trimmed, without blanks and duplicates, in the order given.
    addrs: Vec<String>,
    /// The coordinator that last served a call, or that a coordinator named as leader.
    /// May be an address outside `addrs`. `None`: unknown (start, or it failed).
    leader: Mutex<Option<String>>,
    /// Deadline of one attempt ([`COORDINATOR_ATTEMPT_TIMEOUT_MAX`] by default).
    attempt_timeout: Duration,
}

/// What one failed attempt means for the call.
enum Next {
    /// Try this address next (a leader hint).
    Hint(String),
    /// Try the next address.
    Move,
    /// Return the error.
    Stop,
}

fn next_after(error: &RpcError) -> Next {
    match error {
        RpcError::Status {
            status: Status::NotLeader,
            detail,
            ..
        } => match NotLeaderHint::parse(detail).leader_addr() {
            Some(addr) => Next::Hint(addr.to_string()),
            None => Next::Move,
        },
        RpcError::Status {
            status: Status::Retry | Status::ShuttingDown,
            ..
        } => Next::Move,
        error if error.is_transport() => Next::Move,
        _ => Next::Stop,
    }
}

/// State of one call across its rounds.
#[derive(Default)]
struct CallState {
    attempts: u32,
    /// The last answer of a coordinator that did not serve the call (`NotLeader`,
    /// `Retry`, `ShuttingDown`).
    answer: Option<String>,
    /// The last transport failure.
    failure: Option<String>,
}

impl CallState {
    /// Records why an attempt failed. `cut_short`: the caller's deadline ended it.
    fn note(&mut self, error: &RpcError, cut_short: bool) {
        if !error.is_transport() {
            self.answer = Some(error.to_string());
        } else if !(cut_short && (self.failure.is_some() || self.answer.is_some())) {
            self.failure = Some(error.to_string());
        }
    }

    fn gave_up(self) -> CoordinatorCallError {
        let last = match (self.answer, self.failure) {
            (Some(answer), Some(failure)) => format!("{answer}; {failure}"),
            (Some(reason), None) | (None, Some(reason)) => reason,
            (None, None) => "the deadline passed before any coordinator was tried".into(),
        };
        CoordinatorCallError::NoLeader {
            attempts: self.attempts,
            last,
        }
    }
}

impl CoordinatorSet {
    /// A set of the coordinators at `addrs` (`host:port`). An entry may list several,
    /// comma-separated, as `RAMPART_COORDINATOR` does. Blank entries and repeats are
    /// dropped; with none left, every call fails at once with
    /// [`CoordinatorCallError::NoLeader`].
    pub fn new<S: AsRef<str>>(addrs: &[S]) -> CoordinatorSet {
        let mut unique: Vec<String> = Vec::with_capacity(addrs.len());
        for addr in addrs.iter().flat_map(|entry| entry.as_ref().split(',')) {
            let addr = addr.trim();
            if !addr.is_empty() && !unique.iter().any(|a| a == addr) {
                unique.push(addr.to_string());
            }
        }
        CoordinatorSet {
            addrs: unique,
            leader: Mutex::new(None),
            attempt_timeout: COORDINATOR_ATTEMPT_TIMEOUT_MAX,
        }
    }

    /// The same set with attempts of at most `timeout` each (for a non-idempotent RPC,
    /// longer than the coordinator's own proposal timeout; see the module doc).
    ///
    /// # Panics
    /// If `timeout` is zero (no attempt could ever succeed).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> CoordinatorSet {
        assert!(!timeout.is_zero(), "a coordinator attempt needs time");
        self.attempt_timeout = timeout;
        self
    }

    /// The addresses given.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Whether no address was given.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The leader last found, if any.
    pub fn leader(&self) -> Option<String> {
        self.leader.lock().clone()
    }

    /// Calls RPC `R` on the leader, retrying as the module doc describes until
    /// `deadline`.
    ///
    /// # Errors
    /// [`CoordinatorCallError::Rpc`] with the leader's refusal, or
    /// [`CoordinatorCallError::NoLeader`] with the last reason at the deadline.
    pub async fn call<R: Rpc>(
        &self,
        pool: &RpcPool,
        request: &R::Request,
        deadline: Instant,
    ) -> Result<R::Reply, CoordinatorCallError> {
        self.call_with_attempts::<R>(pool, request, deadline, self.attempt_timeout)
            .await
    }

    /// Like [`call`](Self::call), each attempt given up to `attempt_timeout` (for a call
    /// the leader answers only after slow work of its own, such as a table change that
    /// waits for its masters, so that the caller gets the leader's answer, not a
    /// timeout of its own).
    ///
    /// # Errors
    /// As for [`call`](Self::call).
    pub async fn call_with_attempts<R: Rpc>(
        &self,
        pool: &RpcPool,
        request: &R::Request,
        deadline: Instant,
        attempt_timeout: Duration,
    ) -> Result<R::Reply, CoordinatorCallError> {
        let mut state = CallState::default();
        let mut backoff = Backoff::new(COORDINATOR_ROUND_PAUSE_MIN, COORDINATOR_ROUND_PAUSE_MAX);
        loop {
            if let Some(reply) = self
                .round::<R>(pool, request, deadline, attempt_timeout, &mut state)
                .await?
            {
                return Ok(reply);
            }
            let now = Instant::now();
            if now >= deadline || self.addrs.is_empty() {
                return Err(state.gave_up());
            }
            let pause = backoff.next_pause();
            tracing::debug!(attempts = state.attempts, answer = ?state.answer, failure = ?state.failure, ?pause, "no coordinator leader this round");
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    /// Like [`call`](Self::call), but one round only: every coordinator (and hinted
    /// leader) at most once, no pause, giving up at the end of the round or at
    /// `deadline`, whichever comes first.
    ///
    /// # Errors
    /// As for [`call`](Self::call).
    pub async fn call_round<R: Rpc>(
        &self,
        pool: &RpcPool,
        request: &R::Request,
        deadline: Instant,
    ) -> Result<R::Reply, CoordinatorCallError> {
        let mut state = CallState::default();
        match self
            .round::<R>(pool, request, deadline, self.attempt_timeout, &mut state)
            .await?
        {
            Some(reply) => Ok(reply),
            None => Err(state.gave_up()),
        }
    }

    /// One round: `Ok(None)` when every address failed in a way worth retrying (or the
    /// deadline came first).
    async fn round<R: Rpc>(
        &self,
        pool: &RpcPool,
        request: &R::Request,
        deadline: Instant,
        attempt_timeout: Duration,
        state: &mut CallState,
    ) -> Result<Option<R::Reply>, CoordinatorCallError> {
        if self.addrs.is_empty() {
            state.failure = Some("no coordinator address given".into());
            return Ok(None);
        }
        let mut queue: VecDeque<String> = VecDeque::with_capacity(self.addrs.len() + 1);
        queue.extend(self.leader());
        queue.extend(self.addrs.iter().cloned());
        // Bounded by the addresses given plus the hints followed.
        let mut tried: Vec<String> = Vec::with_capacity(queue.len());
        let mut hints = 0;
        while let Some(addr) = queue.pop_front() {
            if tried.contains(&addr) {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let attempt_deadline = deadline.min(now + attempt_timeout);
            state.attempts += 1;
            let error = match pool.call::<R>(&addr, request, attempt_deadline).await {
                Ok(reply) => {
                    *self.leader.lock() = Some(addr);
                    return Ok(Some(reply));
                }
                Err(error) => error,
            };
            tracing::debug!(coordinator = %addr, %error, "coordinator did not serve the call");
            match next_after(&error) {
                Next::Stop => return Err(CoordinatorCallError::Rpc(error)),
                Next::Hint(leader) => {
                    self.forget(&addr);
                    if leader != addr
                        && !tried.contains(&leader)
                        && hints < COORDINATOR_HINTS_PER_ROUND_MAX
                    {
                        hints += 1;
                        *self.leader.lock() = Some(leader.clone());
                        queue.push_front(leader);
                    }
                }
                Next::Move => {
                    // `Retry` comes from a leader that could not commit in time: it may
                    // still be the leader, so it stays remembered.
                    if error.status() != Some(Status::Retry) {
                        self.forget(&addr);
                    }
                }
            }
            // An attempt cut short by the caller's deadline says less than the failure
            // before it (a refusal, an election under way): `note` keeps that one.
            let cut_short = attempt_deadline == deadline && Instant::now() >= deadline;
            state.note(&error, cut_short);
            tried.push(addr);
        }
        Ok(None)
    }

    /// Forgets `addr` as the leader, unless another call has found a different one.
    fn forget(&self, addr: &str) {
        let mut leader = self.leader.lock();
        if leader.as_deref() == Some(addr) {
            *leader = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::coordinator::{GetTabletMap, TabletMapRequest};
    use crate::rpc::server::{HandleFuture, Reply, RpcServer, Service};
    use crate::rpc::Opcode;
    use crate::tablet::TabletMap;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::net::TcpListener;

    /// How a fake coordinator answers `GetTabletMap`.
    #[derive(Debug, Clone)]
    enum Behaviour {
        /// Serves it: a map whose version names this coordinator.
        Lead { version: u64 },
        /// `NotLeader` with this hint.
        Follow(NotLeaderHint),
        /// An error status with detail "refused".
        Refuse(Status),
        /// `Retry` for the first `retries` calls, then leads.
        RetryFirst { retries: u64, version: u64 },
    }

    #[derive(Debug)]
    struct FakeCoordinator {
        behaviour: Behaviour,
        calls: AtomicU64,
    }

    impl Service for FakeCoordinator {
        fn handle(&self, opcode: Opcode, _payload: Bytes) -> HandleFuture<'_> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            let lead = |version| {
                Reply::ok(&TabletMap {
                    version,
                    servers: Vec::new(),
                    tables: Vec::new(),
                })
            };
            let reply = if opcode != GetTabletMap::OPCODE {
                Reply::error(Status::UnknownOpcode, "fake serves GetTabletMap only")
            } else {
                match &self.behaviour {
                    Behaviour::Lead { version } => lead(*version),
                    Behaviour::Follow(hint) => Reply::error(Status::NotLeader, hint.encode()),
                    Behaviour::Refuse(status) => Reply::error(*status, "refused"),
                    Behaviour::RetryFirst { retries, version } => {
                        if call < *retries {
                            Reply::error(Status::Retry, "proposal not committed")
                        } else {
                            lead(*version)
                        }
                    }
                }
            };
            Box::pin(async move { reply })
        }
    }

    /// A fake coordinator on a listener bound already (so its address can be hinted
    /// before it serves).
    fn serve(listener: TcpListener, behaviour: Behaviour) -> Arc<FakeCoordinator> {
        let service = Arc::new(FakeCoordinator {
            behaviour,
            calls: AtomicU64::new(0),
        });
        tokio::spawn(RpcServer::run(
            listener,
            Arc::clone(&service),
            std::future::pending(),
        ));
        service
    }

    async fn bind() -> (TcpListener, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        (listener, addr)
    }

    async fn start(behaviour: Behaviour) -> (Arc<FakeCoordinator>, String) {
        let (listener, addr) = bind().await;
        (serve(listener, behaviour), addr)
    }

    /// An address nobody listens on (connections are refused).
    async fn dead_addr() -> String {
        let (listener, addr) = bind().await;
        drop(listener);
        addr
    }

    fn leader_hint(addr: &str) -> Behaviour {
        Behaviour::Follow(NotLeaderHint::Leader {
            id: 1,
            addr: addr.to_string(),
        })
    }

    fn no_leader(why: &str) -> Behaviour {
        Behaviour::Follow(NotLeaderHint::Unknown { why: why.into() })
    }

    async fn get_map(
        set: &CoordinatorSet,
        pool: &RpcPool,
        within: Duration,
    ) -> Result<TabletMap, CoordinatorCallError> {
        set.call::<GetTabletMap>(pool, &TabletMapRequest {}, Instant::now() + within)
            .await
    }

    fn calls(coordinator: &FakeCoordinator) -> u64 {
        coordinator.calls.load(Ordering::SeqCst)
    }

    const GENEROUS: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn call_follows_a_hint_to_a_leader_outside_the_given_addresses() {
        let (leader, leader_addr) = start(Behaviour::Lead { version: 7 }).await;
        let (follower, follower_addr) = start(leader_hint(&leader_addr)).await;
        let set = CoordinatorSet::new(&[follower_addr]);
        let pool = RpcPool::new();
        let map = get_map(&set, &pool, GENEROUS).await.unwrap();
        assert_eq!(map.version, 7);
        assert_eq!((calls(&follower), calls(&leader)), (1, 1));
        assert_eq!(set.leader(), Some(leader_addr));
    }

    #[tokio::test]
    async fn call_remembers_the_leader_and_asks_it_first() {
        let (leader, leader_addr) = start(Behaviour::Lead { version: 3 }).await;
        let (follower, follower_addr) = start(no_leader("just started")).await;
        let set = CoordinatorSet::new(&[follower_addr, leader_addr.clone()]);
        let pool = RpcPool::new();
        get_map(&set, &pool, GENEROUS).await.unwrap();
        assert_eq!((calls(&follower), calls(&leader)), (1, 1));
        assert_eq!(set.leader(), Some(leader_addr));
        for _ in 0..3 {
            get_map(&set, &pool, GENEROUS).await.unwrap();
        }
        assert_eq!((calls(&follower), calls(&leader)), (1, 4));
    }

    #[tokio::test]
    async fn call_skips_a_dead_address() {
        let (leader, leader_addr) = start(Behaviour::Lead { version: 1 }).await;
        let set = CoordinatorSet::new(&[dead_addr().await, leader_addr]);
        let pool = RpcPool::new();
        assert_eq!(get_map(&set, &pool, GENEROUS).await.unwrap().version, 1);
        assert_eq!(calls(&leader), 1);
    }

    #[tokio::test]
    async fn call_forgets_a_leader_that_died_and_finds_the_new_one() {
        // The remembered leader is gone; a follower names the new one.
        let (new_leader, new_leader_addr) = start(Behaviour::Lead { version: 9 }).await;
        let (_follower, follower_addr) = start(leader_hint(&new_leader_addr)).await;
        let old_leader = dead_addr().await;
        let set = CoordinatorSet::new(&[old_leader.clone(), follower_addr]);
        *set.leader.lock() = Some(old_leader);
        let pool = RpcPool::new();
        assert_eq!(get_map(&set, &pool, GENEROUS).await.unwrap().version, 9);
        assert_eq!(calls(&new_leader), 1);
        assert_eq!(set.leader(), Some(new_leader_addr));
    }

    #[tokio::test]
    async fn call_moves_past_a_hung_coordinator_within_the_attempt_timeout() {
        // A listener that never accepts: the kernel completes the handshake, nobody
        // ever answers.
        let (_hung, hung_addr) = bind().await;
        let (leader, leader_addr) = start(Behaviour::Lead { version: 2 }).await;
        let attempt = Duration::from_millis(200);
        let set = CoordinatorSet::new(&[hung_addr, leader_addr]).with_attempt_timeout(attempt);
        let pool = RpcPool::new();
        let started = Instant::now();
        assert_eq!(get_map(&set, &pool, GENEROUS).await.unwrap().version, 2);
        assert!(
            started.elapsed() < GENEROUS / 2,
            "took {:?}",
            started.elapsed()
        );
        assert_eq!(calls(&leader), 1);
    }

    #[tokio::test]
    async fn call_gives_up_at_the_deadline_with_the_last_reason() {
        let (follower, follower_addr) = start(no_leader("election under way")).await;
        let set = CoordinatorSet::new(&[follower_addr]);
        let pool = RpcPool::new();
        let within = Duration::from_millis(300);
        let started = Instant::now();
        let error = get_map(&set, &pool, within).await.unwrap_err();
        let waited = started.elapsed();
        assert!(waited >= within, "gave up after {waited:?}");
        assert!(waited < GENEROUS, "gave up after {waited:?}");
        let CoordinatorCallError::NoLeader { attempts, last } = &error else {
            panic!("unexpected {error:?}");
        };
        assert!(*attempts > 1 && u64::from(*attempts) == calls(&follower));
        assert!(last.contains("no leader: election under way"), "{last}");
        assert!(error.to_string().contains("election under way"), "{error}");

        let set = CoordinatorSet::new(&[dead_addr().await]);
        let error = get_map(&set, &pool, within).await.unwrap_err();
        let CoordinatorCallError::NoLeader { last, .. } = &error else {
            panic!("unexpected {error:?}");
        };
        assert!(last.contains("cannot connect"), "{last}");
    }

    #[tokio::test]
    async fn giving_up_reports_what_a_live_coordinator_said_before_the_dead_ones() {
        // A coordinator alone (its peers down) says why it cannot lead; the refusals of
        // the dead ones, tried after it in every round, must not hide that.
        let (_alone, alone_addr) = start(no_leader("no majority reachable")).await;
        let set = CoordinatorSet::new(&[alone_addr, dead_addr().await, dead_addr().await]);
        let pool = RpcPool::new();
        let error = get_map(&set, &pool, Duration::from_millis(200))
            .await
            .unwrap_err();
        let CoordinatorCallError::NoLeader { last, .. } = &error else {
            panic!("unexpected {error:?}");
        };
        let answer = last
            .find("no majority reachable")
            .expect("the answer is reported");
        let refusal = last
            .find("cannot connect")
            .expect("the refusal is reported");
        assert!(answer < refusal, "{last}");
    }

    #[tokio::test]
    async fn call_returns_a_refusal_at_once() {
        let (refuser, refuser_addr) = start(Behaviour::Refuse(Status::TableDoesntExist)).await;
        let (leader, leader_addr) = start(Behaviour::Lead { version: 1 }).await;
        let set = CoordinatorSet::new(&[refuser_addr, leader_addr]);
        let pool = RpcPool::new();
        let error = get_map(&set, &pool, GENEROUS).await.unwrap_err();
        match error {
            CoordinatorCallError::Rpc(error) => {
                assert_eq!(error.status(), Some(Status::TableDoesntExist));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!((calls(&refuser), calls(&leader)), (1, 0));
    }

    #[tokio::test]
    async fn call_retries_a_leader_that_answers_retry() {
        let (leader, leader_addr) = start(Behaviour::RetryFirst {
            retries: 2,
            version: 5,
        })
        .await;
        let set = CoordinatorSet::new(std::slice::from_ref(&leader_addr));
        *set.leader.lock() = Some(leader_addr.clone());
        let pool = RpcPool::new();
        assert_eq!(get_map(&set, &pool, GENEROUS).await.unwrap().version, 5);
        assert_eq!(calls(&leader), 3);
        assert_eq!(set.leader(), Some(leader_addr));
    }

    #[tokio::test]
    async fn hints_pointing_at_each_other_do_not_loop_a_round() {
        let (listener_a, addr_a) = bind().await;
        let (listener_b, addr_b) = bind().await;
        let a = serve(listener_a, leader_hint(&addr_b));
        let b = serve(listener_b, leader_hint(&addr_a));
        let set = CoordinatorSet::new(&[addr_a]);
        let pool = RpcPool::new();
        let error = set
            .call_round::<GetTabletMap>(&pool, &TabletMapRequest {}, Instant::now() + GENEROUS)
            .await
            .unwrap_err();
        assert!(
            matches!(error, CoordinatorCallError::NoLeader { attempts: 2, .. }),
            "{error:?}"
        );
        assert_eq!((calls(&a), calls(&b)), (1, 1));
    }

    #[tokio::test]
    async fn call_round_tries_each_address_once() {
        let (first, first_addr) = start(no_leader("no quorum")).await;
        let (second, second_addr) = start(no_leader("no quorum")).await;
        let set = CoordinatorSet::new(&[first_addr.clone(), second_addr, first_addr]);
        let pool = RpcPool::new();
        let error = set
            .call_round::<GetTabletMap>(&pool, &TabletMapRequest {}, Instant::now() + GENEROUS)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("no quorum"), "{error}");
        assert_eq!((calls(&first), calls(&second)), (1, 1));
    }

    #[test]
    fn new_splits_comma_separated_entries_and_drops_blanks_and_repeats() {
        let set = CoordinatorSet::new(&["a:1, b:2", " ", "b:2,c:3,", "a:1"]);
        assert_eq!(set.addrs(), ["a:1", "b:2", "c:3"]);
    }

    #[tokio::test]
    async fn a_set_without_addresses_fails_at_once() {
        let set = CoordinatorSet::new(&["", "  "]);
        assert!(set.is_empty());
        let pool = RpcPool::new();
        let error = get_map(&set, &pool, GENEROUS).await.unwrap_err();
        assert!(
            error.to_string().contains("no coordinator address"),
            "{error}"
        );
    }
}
