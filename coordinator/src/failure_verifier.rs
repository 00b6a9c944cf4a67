//! `FailureVerifier`: the leader's check of a reported failure (docs/design.md §6,
//! detection), before anything is recovered.
//!
//! # What it does for callers
//! * [`FailureVerifier::report_failure`]: a server or a client says a server stopped
//!   answering. The leader pings the suspect itself (`verify_attempts` pings, one after
//!   another, each on a fresh connection and within `verify_timeout`) and, if it stays
//!   silent, commits `SetServerStatus{Crashed}` through Raft, pushes the new server-list
//!   version (servers stop pinging it, clients' next map has it crashed) and wakes the
//!   recovery manager ([`FailureVerifier::crash_declared`]).
//! * [`FailureVerifier::take_declared`]: when this leader saw a crash committed, and how
//!   long detection took (from the first report), for the recovery's lease wait and its
//!   report.
//! * [`FailureVerifier::process_exited`]: a supervisor saw a server's process exit. Where
//!   its word counts (`proof_of_death`), the server is declared crashed at once, without
//!   pings, and its death is proven; otherwise it is verified as a report.
//! * Proofs of death ([`FailureVerifier::proof_of`], [`FailureVerifier::probe`]): what
//!   the pings, the supervisors and the recovery's probe of a crashed server's address
//!   found, kept by server (`proof_of_death::Proofs`) for the recovery's lease wait.
//!   Under `Direct`, a refused ping is proof, and the suspect is declared without the
//!   pings left.
//!
//! The bookkeeping is [`Suspects`], a plain struct tested alone: one verification per
//! suspect at a time, however many report it; detection timed from the first report.
//!
//! # Failure handling
//! A suspect that answers any ping is left `Up` (its reporter may have been cut off,
//! not it). A commit that fails (this coordinator lost leadership) declares nothing; the
//! reporters report again to the new leader.

use rampart_common::ids::ServerId;
use rampart_common::protocol::master::{Identify, Ping, PingRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::ServerStatus;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::node::{NodeError, RaftNode};
use crate::proof_of_death::{address_is_direct, Evidence, ProofOfDeath, Proofs};
use crate::state::{Command, CommandResult};

/// Milliseconds in `d`, saturating (for reports and logs).
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the leader keeps about suspects and declared crashes (module doc). Time and the
/// Raft term are inputs: callers pass `now` and `term`.
///
/// Kept for one term of leadership: the first report in a later term forgets
/// everything of an earlier one (suspects reported to a leader that was deposed before
/// it declared them, crashes no recovery of that term took), so nothing piles up over
/// elections and a leader elected again never times detection from a report of its
/// previous term.
#[derive(Debug, Default)]
pub struct Suspects {
    /// The term of leadership the entries below belong to.
    term: u64,
    /// Suspects being verified now.
    verifying: BTreeSet<ServerId>,
    /// When each suspect was first reported (until it is declared crashed or found alive).
    first_report: BTreeMap<ServerId, Instant>,
    /// When this leader saw each crash committed, and how long detection took; taken by
    /// the server's recovery.
    declared: BTreeMap<ServerId, (Instant, Duration)>,
}

impl Suspects {
    /// `server` was reported at `now` to the leader of `term`; returns whether a
    /// verification must start (none is running for it).
    pub fn reported(&mut self, server: ServerId, now: Instant, term: u64) -> bool {
        if term != self.term {
            // A verification of the old term still running may yet end one of this
            // term's early: at worst a suspect is then verified twice at once, and
            // declared once (statuses only move forward).
            *self = Suspects {
                term,
                ..Suspects::default()
            };
        }
        self.first_report.entry(server).or_insert(now);
        self.verifying.insert(server)
    }

    /// The verification of `server` found it answering: a later report times detection
    /// afresh.
    pub fn answered(&mut self, server: ServerId) {
        self.first_report.remove(&server);
    }

    /// `server`'s crash was committed at `now`; returns how long detection took.
    pub fn declared(&mut self, server: ServerId, now: Instant) -> Duration {
        let first = self.first_report.remove(&server).unwrap_or(now);
        let detection = now.saturating_duration_since(first);
        self.declared.insert(server, (now, detection));
        detection
    }

    /// The verification of `server` ended, whatever it found.
    pub fn verification_ended(&mut self, server: ServerId) {
        self.verifying.remove(&server);
    }

    /// When `server`'s crash was committed here and how long detection took, once.
    pub fn take_declared(&mut self, server: ServerId) -> Option<(Instant, Duration)> {
        self.declared.remove(&server)
    }
}

/// Verifies reported failures on the coordinators' leader (module doc).
#[derive(Debug)]
pub struct FailureVerifier {
    node: RaftNode,
    pool: Arc<RpcPool>,
    verify_timeout: Duration,
    verify_attempts: u32,
    /// A `parking_lot` mutex: held only for bookkeeping, never across an await.
    suspects: parking_lot::Mutex<Suspects>,
    /// Notified when a crash is declared.
    declared: tokio::sync::Notify,
    /// The proofs of death found (held like `suspects`).
    proofs: parking_lot::Mutex<Proofs<Instant>>,
    /// Notified (every waiter) when a proof is found.
    proof_found: tokio::sync::Notify,
}

impl FailureVerifier {
    /// A verifier over this coordinator's Raft member: a suspect is declared crashed once
    /// `verify_attempts` pings (at least one), each given `verify_timeout`, all failed
    /// (or one was refused, where `proof_of_death` takes a refusal as proof).
    pub fn new(
        node: RaftNode,
        pool: Arc<RpcPool>,
        verify_timeout: Duration,
        verify_attempts: u32,
        proof_of_death: ProofOfDeath,
    ) -> FailureVerifier {
        FailureVerifier {
            node,
            pool,
            verify_timeout,
            verify_attempts: verify_attempts.max(1),
            suspects: parking_lot::Mutex::new(Suspects::default()),
            declared: tokio::sync::Notify::new(),
            proofs: parking_lot::Mutex::new(Proofs::new(proof_of_death)),
            proof_found: tokio::sync::Notify::new(),
        }
    }

    /// What proves a crashed server's death here.
    pub fn proof_of_death(&self) -> ProofOfDeath {
        self.proofs.lock().setting()
    }

    /// The proof of `server`'s death found so far, and when.
    pub fn proof_of(&self, server: ServerId) -> Option<(Instant, Evidence)> {
        self.proofs.lock().of(server)
    }

    /// Completes at the next proof of death found. Create it (and `enable` it) before
    /// reading [`proof_of`](Self::proof_of), so that none is missed in between.
    pub fn proof_found(&self) -> tokio::sync::futures::Notified<'_> {
        self.proof_found.notified()
    }

    /// Forgets the proof of `server`'s death (its recovery is over).
    pub fn forget_proof(&self, server: ServerId) {
        self.proofs.lock().forget(server);
    }

    /// Records `evidence` about `server`; returns whether it proves its death.
    /// Evidence about a server that is gone from the list, or never was, is not kept.
    fn seen(&self, server: ServerId, evidence: Evidence) -> bool {
        let listed = self.node.with_state(|state| {
            state
                .server(server)
                .is_some_and(|s| s.status != ServerStatus::Removed)
        });
        if !listed {
            return false;
        }
        let proof = self.proofs.lock().seen(server, evidence, Instant::now());
        if proof {
            self.proof_found.notify_waiters();
        }
        proof
    }

    /// What `addr` answers an `Identify` with (within the verify timeout, on a fresh
    /// connection), as evidence about `server`: `Ok(None)` when `server` itself answers
    /// (alive), or when something answers with an error status — a server of an older
    /// release answers `UnknownOpcode`, a stopping one `ShuttingDown`: a process is
    /// there, maybe `server`, so nothing about it may be taken as proof of its death;
    /// `Err(())` when nothing can be said (silence, a broken connection, an address
    /// whose refusal proves nothing: `proof_of_death::address_is_direct`).
    async fn identify(&self, server: ServerId, addr: &str) -> Result<Option<Evidence>, ()> {
        self.pool.forget(addr);
        let deadline = Instant::now() + self.verify_timeout;
        let answer = self
            .pool
            .call::<Identify>(addr, &PingRequest {}, deadline)
            .await;
        let direct = address_is_direct(addr);
        match answer {
            Ok(reply) if reply.server == server => Ok(None),
            Ok(reply) if direct => Ok(Some(Evidence::OtherServer(reply.server))),
            Err(error) if error.status().is_some() => Ok(None),
            Err(error) if direct && error.refused() => Ok(Some(Evidence::Refused)),
            _ => Err(()),
        }
    }

    /// Probes the address `addr` of the crashed server `server` once (within the verify
    /// timeout, on a fresh connection): a refusal, or another server's id there, is
    /// recorded as evidence. Returns whether its death is proven now.
    pub async fn probe(&self, server: ServerId, addr: &str) -> bool {
        if self.proof_of(server).is_some() {
            return true;
        }
        let Ok(Some(evidence)) = self.identify(server, addr).await else {
            return false;
        };
        let proof = self.seen(server, evidence);
        tracing::info!(%server, %addr, ?evidence, proof, "crashed server's address probed");
        proof
    }

    /// A supervisor saw the process of `server` exit. Where its word counts, `server` is
    /// declared crashed at once (if `Up`) with its death proven — unless `server` itself
    /// still answers at its address (the supervisor named the wrong server: its word is
    /// then a failure report like any other, and proves nothing); elsewhere it is
    /// verified as a failure report. Fails with `NotLeader` on a follower.
    pub fn process_exited(
        self: &Arc<Self>,
        server: ServerId,
        supervisor: &str,
    ) -> Result<(), NodeError> {
        if !self.node.is_leader() {
            return Err(NodeError::NotLeader(self.node.hint()));
        }
        let known = self.node.with_state(|state| {
            state
                .server(server)
                .filter(|s| s.status != ServerStatus::Removed)
                .map(|s| (s.status, s.addr.clone()))
        });
        let Some((status, addr)) = known else {
            return Ok(());
        };
        if !self.proof_of_death().accepts(Evidence::ExitSeen) {
            tracing::info!(%server, %supervisor, "process exit reported; its supervisor's word is not proof here");
            return self.report_failure(server, supervisor);
        }
        let me = Arc::clone(self);
        let supervisor = supervisor.to_string();
        tokio::spawn(async move {
            // One look first: a supervisor that names the wrong server must not let a
            // live one's tablets go live elsewhere.
            if me.identify(server, &addr).await == Ok(None) {
                tracing::warn!(%server, %addr, %supervisor, "process exit reported, but the server answers at its address: not proof; verifying");
                let _ = me.report_failure(server, &supervisor);
                return;
            }
            if !me.seen(server, Evidence::ExitSeen) {
                return;
            }
            tracing::info!(%server, %addr, %supervisor, "process exit reported: proof of death");
            let term = me.node.status().term;
            if status != ServerStatus::Up
                || !me.suspects.lock().reported(server, Instant::now(), term)
            {
                // Declared already, or being verified (whose pings end at the proof).
                return;
            }
            let why = format!("its supervisor {supervisor} saw its process exit");
            me.declare(server, &addr, &why).await;
            me.suspects.lock().verification_ended(server);
        });
        Ok(())
    }

    /// A server or client reports `server` silent. Verifies in the background and
    /// declares it crashed if it stays silent. Fails with `NotLeader` on a follower, so
    /// that reporters find the leader.
    pub fn report_failure(
        self: &Arc<Self>,
        server: ServerId,
        reporter: &str,
    ) -> Result<(), NodeError> {
        if !self.node.is_leader() {
            return Err(NodeError::NotLeader(self.node.hint()));
        }
        let addr = self.node.with_state(|state| {
            state
                .server(server)
                .filter(|s| s.status == ServerStatus::Up)
                .map(|s| s.addr.clone())
        });
        let Some(addr) = addr else {
            return Ok(());
        };
        let term = self.node.status().term;
        if !self.suspects.lock().reported(server, Instant::now(), term) {
            return Ok(());
        }
        tracing::info!(%server, %addr, %reporter, "failure reported; verifying");
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.verify(server, addr).await;
            me.suspects.lock().verification_ended(server);
        });
        Ok(())
    }

    /// When this leader saw `server`'s crash committed and how long detection took, if
    /// it did (once: the recovery of `server` takes it).
    pub fn take_declared(&self, server: ServerId) -> Option<(Instant, Duration)> {
        self.suspects.lock().take_declared(server)
    }

    /// Completes at the next crash this verifier declares.
    pub async fn crash_declared(&self) {
        self.declared.notified().await;
    }

    async fn verify(&self, server: ServerId, addr: String) {
        let mut last = String::new();
        for _ in 0..self.verify_attempts {
            if self.proof_of(server).is_some() {
                // Its supervisor's word came meanwhile: no need to ping a dead process.
                last = "its death was proven".to_string();
                break;
            }
            let deadline = Instant::now() + self.verify_timeout;
            match self
                .pool
                .call::<Ping>(&addr, &PingRequest {}, deadline)
                .await
            {
                Ok(_) => {
                    tracing::info!(%server, "reported server answers; not crashed");
                    self.suspects.lock().answered(server);
                    return;
                }
                Err(error) => {
                    // A fresh connection for the next try: the old one may be the problem.
                    self.pool.forget(&addr);
                    last = error.to_string();
                    if error.refused()
                        && address_is_direct(&addr)
                        && self.seen(server, Evidence::Refused)
                    {
                        // Proof of death: more pings would only be refused too.
                        break;
                    }
                }
            }
        }
        self.declare(server, &addr, &last).await;
    }

    /// Commits `server`'s crash (`why`: the last ping's error, or the supervisor's
    /// word), then tells the servers and wakes the recovery manager.
    async fn declare(&self, server: ServerId, addr: &str, why: &str) {
        let command = Command::SetServerStatus {
            id: server,
            status: ServerStatus::Crashed,
        };
        match self.node.propose(command).await {
            Ok(CommandResult::StatusSet) => {
                let detection = self.suspects.lock().declared(server, Instant::now());
                tracing::warn!(
                    %server, %addr, error = %why,
                    detection_ms = ms(detection),
                    "server declared crashed"
                );
                self.declared.notify_one();
                // Servers stop pinging it, and clients' next map has it crashed.
                crate::push::push_server_list_version(&self.node, &self.pool);
            }
            Ok(other) => tracing::warn!(%server, ?other, "crash not recorded"),
            Err(error) => tracing::warn!(%server, %error, "crash not committed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ServerId = ServerId(1);
    const B: ServerId = ServerId(2);

    #[test]
    fn one_verification_runs_per_suspect_however_many_report_it() {
        let mut suspects = Suspects::default();
        let now = Instant::now();
        assert!(suspects.reported(A, now, 1));
        assert!(!suspects.reported(A, now, 1), "already being verified");
        assert!(
            suspects.reported(B, now, 1),
            "another suspect is verified at once"
        );
        suspects.verification_ended(A);
        assert!(
            suspects.reported(A, now, 1),
            "a report after the end verifies again"
        );
    }

    #[test]
    fn detection_is_timed_from_the_first_report_of_a_silent_server() {
        let mut suspects = Suspects::default();
        let first = Instant::now();
        suspects.reported(A, first, 1);
        suspects.verification_ended(A);
        // Reported again (the first verification's commit failed, say): the clock runs on.
        suspects.reported(A, first + Duration::from_millis(300), 1);
        let declared_at = first + Duration::from_millis(500);
        assert_eq!(
            suspects.declared(A, declared_at),
            Duration::from_millis(500)
        );
        assert_eq!(
            suspects.take_declared(A),
            Some((declared_at, Duration::from_millis(500)))
        );
        assert_eq!(suspects.take_declared(A), None, "taken once");
    }

    #[test]
    fn a_new_term_of_leadership_forgets_the_suspects_and_crashes_of_the_last() {
        let mut suspects = Suspects::default();
        let first = Instant::now();
        suspects.reported(A, first, 1);
        suspects.reported(B, first, 1);
        suspects.declared(B, first + Duration::from_millis(100));
        // Deposed before A was declared and before B's recovery started; elected again.
        let again = first + Duration::from_secs(60);
        assert!(
            suspects.reported(A, again, 3),
            "verified anew, though the old verification never ended"
        );
        assert_eq!(suspects.take_declared(B), None, "nothing of term 1 is kept");
        assert_eq!(
            suspects.declared(A, again + Duration::from_millis(5)),
            Duration::from_millis(5),
            "timed from this term's report"
        );
    }

    #[test]
    fn a_suspect_found_answering_starts_a_new_clock_when_reported_again() {
        let mut suspects = Suspects::default();
        let first = Instant::now();
        suspects.reported(A, first, 1);
        suspects.answered(A);
        suspects.verification_ended(A);
        let again = first + Duration::from_secs(10);
        suspects.reported(A, again, 1);
        assert_eq!(
            suspects.declared(A, again + Duration::from_millis(2)),
            Duration::from_millis(2)
        );
    }
}
