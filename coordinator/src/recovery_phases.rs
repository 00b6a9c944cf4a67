//! The decisions of one recovery (docs/design.md §6) as plain synchronous state machines: what
//! to do next given what was committed and what the last step answered. The driver,
//! `recovery::RecoveryManager`, carries the decisions out (barriers, proposals, RPCs,
//! pauses) and feeds the answers back; nothing here is async, reads a clock or does I/O.
//!
//! * [`Phases`] — the recovery as a whole: attempt while the crashed master owns
//!   tablets, then have every master confirm the end, then clean up; wait and ask again
//!   when something is missing; stop when leadership is lost.
//! * [`PartitionTries`] — one partition within an attempt: which recovery master next,
//!   when a silent one must be told to abandon, what a commit's outcome means, when to
//!   give up until the next attempt.
//! * [`FinishRound`] — the end of a recovery: which masters still have to confirm
//!   `FinishRecovery`, and what each answer means.
//!
//! The `recovery_phases` tests check each rule alone (the driver's end-to-end behaviour
//! is tested with real processes in `tests/tests/crash_recovery.rs`).

use rampart_common::ids::ServerId;
use rampart_common::tablet::Tablet;
use std::collections::BTreeSet;

/// What the driver does next in a recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Read the committed map (after a barrier) and report what the crashed master
    /// still owns ([`Phases::committed`]).
    ReadMap,
    /// Set up and replay what the crashed master still owns.
    Attempt(Vec<Tablet>),
    /// Every tablet is recovered: have every master confirm the end ([`FinishRound`]).
    Finish,
    /// Report why the recovery waits, pause, then read the map again.
    Wait(String),
    /// Pause (nothing went live: do not spin), then read the map again.
    Pause,
    /// Free the backups' replicas and mark the server removed.
    Cleanup,
    /// This coordinator no longer leads (or cannot read the committed map): leave the
    /// recovery to the next leader.
    Stop,
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Attempted {
    /// Every partition went live or was given up on for this attempt.
    Ran,
    /// Setup cannot proceed yet (the reason): an incomplete log, no master up.
    Wait(String),
    /// Leadership was lost during the attempt.
    LeadershipLost,
}

/// The recovery of one crashed master as a whole. See the module doc.
#[derive(Debug, Default)]
pub(crate) struct Phases {
    /// What the crashed master owned when the running attempt started.
    attempting: Option<Vec<Tablet>>,
}

impl Phases {
    /// A recovery about to read the committed map for the first time.
    pub fn new() -> Phases {
        Phases::default()
    }

    /// The first step: read the committed map.
    pub fn start(&self) -> Next {
        Next::ReadMap
    }

    /// The committed map was read after a barrier: `owned` is what the crashed master
    /// still owns (`None`: the map could not be read, or this coordinator no longer
    /// leads). Recovered until it owns nothing, as committed — a leader new in its term
    /// may not have applied a partition its predecessor handed over, and recovering it
    /// again would make its owner forget what it replayed while the commit gives it the
    /// tablets.
    pub fn committed(&mut self, owned: Option<Vec<Tablet>>) -> Next {
        match owned {
            None => Next::Stop,
            Some(owned) if owned.is_empty() => Next::Finish,
            Some(owned) => {
                self.attempting = Some(owned.clone());
                Next::Attempt(owned)
            }
        }
    }

    /// The attempt ended as `attempted`; the crashed master owns `left` now (as this
    /// coordinator applied it).
    pub fn attempted(&mut self, attempted: Attempted, left: &[Tablet]) -> Next {
        let before = self.attempting.take();
        match attempted {
            Attempted::LeadershipLost => Next::Stop,
            Attempted::Wait(why) => Next::Wait(why),
            // No partition went live (every recovery master failed): pause before
            // setting up again rather than spin.
            Attempted::Ran if before.as_deref() == Some(left) => Next::Pause,
            Attempted::Ran => Next::ReadMap,
        }
    }

    /// Every master was asked to confirm the end: `Ok`, all did; else who did not.
    pub fn finished(&mut self, confirmed: Result<(), String>) -> Next {
        match confirmed {
            Ok(()) => Next::Cleanup,
            Err(why) => Next::Wait(why),
        }
    }
}

/// What the driver does after a step of one partition's replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PartitionNext {
    /// Send `Recover` to the candidate master of this index.
    Recover(usize),
    /// Propose `RecoveredPartition` for the master that replayed it (once every lease
    /// of the crashed master has lapsed).
    Commit,
    /// Read the committed map to learn what became of the proposal, and report back
    /// with [`PartitionTries::settled`].
    Settle,
    /// The partition is live (its owner was told, or settled): report it.
    Live,
    /// Nothing more in this attempt (given up, or left to the next attempt).
    Done,
    /// Leadership lost: stop the attempt, telling nobody to abandon anything.
    Stop,
}

/// How a `RecoveredPartition` proposal ended, as the driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Commit {
    /// Committed: the ranges are the master's.
    Committed,
    /// This coordinator lost leadership (or stopped): the entry may still commit under
    /// the next leader.
    LeadershipLost,
    /// The state machine refused it (the ranges changed hands meanwhile).
    Rejected,
    /// Dropped, covered by a snapshot, or of unknown outcome.
    Unknown,
}

/// One partition's replay within an attempt: recovery masters tried in turn, from the
/// one the plan assigned, up to `attempts_max` of them. See the module doc.
#[derive(Clone, Debug)]
pub(crate) struct PartitionTries {
    first: usize,
    candidates: usize,
    tries: usize,
    /// Masters asked so far; the current one is `tried - 1`.
    tried: usize,
    /// Whether the last proposal was rejected (for [`PartitionTries::settled`]).
    rejected: bool,
}

impl PartitionTries {
    /// Tries from candidate `first` on, over `candidates` masters, at most
    /// `attempts_max` of them.
    pub fn new(first: usize, candidates: usize, attempts_max: usize) -> PartitionTries {
        PartitionTries {
            first,
            candidates,
            tries: candidates.min(attempts_max),
            tried: 0,
            rejected: false,
        }
    }

    /// The first step.
    pub fn start(&mut self, leading: bool) -> PartitionNext {
        self.next_master(leading)
    }

    /// The next master to ask, if any is left; a deposed leader asks none (the new
    /// leader's attempt owns these ranges now).
    fn next_master(&mut self, leading: bool) -> PartitionNext {
        if !leading {
            return PartitionNext::Stop;
        }
        if self.tried >= self.tries {
            return PartitionNext::Done;
        }
        let index = (self.first + self.tried) % self.candidates;
        self.tried += 1;
        PartitionNext::Recover(index)
    }

    /// The candidate asked last.
    pub fn current(&self) -> Option<usize> {
        self.tried
            .checked_sub(1)
            .map(|tried| (self.first + tried) % self.candidates)
    }

    /// Whether the candidate asked last is the first one asked.
    pub fn first_try(&self) -> bool {
        self.tried == 1
    }

    /// The master replayed the partition.
    pub fn replayed(&self) -> PartitionNext {
        PartitionNext::Commit
    }

    /// The master failed: it answered an error (`answered`), or gave no answer (the
    /// connection broke, the deadline passed). Returns the candidate to tell to abandon
    /// the partition in the background — one that gave no answer may still be
    /// replaying, or hold what it replayed — and the next step (the next master starts
    /// at once, not after a dead one's abandon).
    pub fn failed(&mut self, answered: bool, leading: bool) -> (Option<usize>, PartitionNext) {
        let abandon = if answered { None } else { self.current() };
        (abandon, self.next_master(leading))
    }

    /// The proposal ended as `commit`.
    pub fn committed(&mut self, commit: Commit) -> PartitionNext {
        match commit {
            Commit::Committed => PartitionNext::Live,
            // The entry may still commit under the next leader, which then finds the
            // ranges in the recovery master's hands: it must keep what it replayed.
            Commit::LeadershipLost => PartitionNext::Stop,
            // The committed map says what became of it, never a guess.
            Commit::Rejected | Commit::Unknown => {
                self.rejected = commit == Commit::Rejected;
                PartitionNext::Settle
            }
        }
    }

    /// The committed map was read after a proposal of unknown or refused outcome: all of
    /// the partition is the master's (`all_owned`; it was told to catch up with its
    /// tablets, and to forget the rest otherwise), or `None` if the map could not be
    /// read. Unknown and not the master's: the next master tries. Refused: the ranges
    /// changed hands (recovered already, or their owner-to-be crashed); the next attempt
    /// sees what is left.
    pub fn settled(&mut self, all_owned: Option<bool>, leading: bool) -> PartitionNext {
        match all_owned {
            None => PartitionNext::Stop,
            Some(true) => PartitionNext::Live,
            Some(false) if self.rejected => PartitionNext::Done,
            Some(false) => self.next_master(leading),
        }
    }
}

/// What a master answered to `FinishRecovery`, as the driver classified it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FinishAnswer {
    /// It forgot what it replayed for nobody, and refuses later `Recover`s.
    Confirmed,
    /// A new server listens at its address (`WrongServer`): the master is gone, with
    /// its memory.
    NewServer,
    /// A master of an older release (`UnknownOpcode`): it cannot be told, and waiting
    /// for it would keep the crashed master's replicas for good.
    OlderRelease,
    /// No answer (the reason): it may be dead.
    Silent(String),
    /// Any other error (the reason), `Retry` past the deadline included.
    Failed(String),
}

/// The end of one recovery: every `Up` master must confirm `FinishRecovery` before the
/// crashed server is removed. Asked in rounds; a master that confirmed is not asked
/// again. See the module doc.
#[derive(Debug, Default)]
pub(crate) struct FinishRound {
    done: BTreeSet<ServerId>,
    unconfirmed: Vec<String>,
}

impl FinishRound {
    /// No master confirmed yet.
    pub fn new() -> FinishRound {
        FinishRound::default()
    }

    /// Whether `master` must be asked in this round.
    pub fn to_ask(&self, master: ServerId) -> bool {
        !self.done.contains(&master)
    }

    /// `master` answered. Returns whether to report it to the failure verifier (it did
    /// not answer: declared crashed if it stays silent, and then no longer `Up`, so no
    /// longer asked).
    pub fn answered(&mut self, master: ServerId, answer: FinishAnswer) -> bool {
        match answer {
            FinishAnswer::Confirmed | FinishAnswer::NewServer | FinishAnswer::OlderRelease => {
                self.done.insert(master);
                false
            }
            FinishAnswer::Silent(why) => {
                self.unconfirmed.push(format!("{master} ({why})"));
                true
            }
            FinishAnswer::Failed(why) => {
                self.unconfirmed.push(format!("{master} ({why})"));
                false
            }
        }
    }

    /// Ends a round: `Ok` if every master asked confirmed, else which did not (the
    /// driver waits and asks those again).
    pub fn end_round(&mut self, crashed: ServerId) -> Result<(), String> {
        let unconfirmed = std::mem::take(&mut self.unconfirmed);
        if unconfirmed.is_empty() {
            return Ok(());
        }
        Err(format!(
            "every tablet of {crashed} is recovered; waiting for masters to confirm the end of \
             the recovery: {}",
            unconfirmed.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rampart_common::ids::TableId;

    fn tablet(start_hash: u64) -> Tablet {
        Tablet {
            table: TableId(1),
            start_hash,
            end_hash: start_hash + 9,
            owner: ServerId(3),
        }
    }

    #[test]
    fn a_recovery_attempts_until_nothing_is_owned_then_finishes_then_cleans_up() {
        let mut phases = Phases::new();
        assert_eq!(phases.start(), Next::ReadMap);
        let owned = vec![tablet(0), tablet(10)];
        assert_eq!(phases.committed(Some(owned.clone())), Next::Attempt(owned));
        // One partition went live: read the map again at once.
        assert_eq!(
            phases.attempted(Attempted::Ran, &[tablet(10)]),
            Next::ReadMap
        );
        assert_eq!(
            phases.committed(Some(vec![tablet(10)])),
            Next::Attempt(vec![tablet(10)])
        );
        assert_eq!(phases.attempted(Attempted::Ran, &[]), Next::ReadMap);
        assert_eq!(phases.committed(Some(Vec::new())), Next::Finish);
        assert_eq!(phases.finished(Ok(())), Next::Cleanup);
    }

    #[test]
    fn an_attempt_that_recovered_nothing_pauses_and_a_missing_piece_waits() {
        let mut phases = Phases::new();
        let owned = vec![tablet(0)];
        phases.committed(Some(owned.clone()));
        assert_eq!(phases.attempted(Attempted::Ran, &owned), Next::Pause);
        phases.committed(Some(owned.clone()));
        let why = "log incomplete".to_string();
        assert_eq!(
            phases.attempted(Attempted::Wait(why.clone()), &owned),
            Next::Wait(why)
        );
        assert_eq!(phases.finished(Err("m2".into())), Next::Wait("m2".into()));
    }

    #[test]
    fn a_lost_leadership_or_an_unreadable_map_stops_the_recovery() {
        let mut phases = Phases::new();
        assert_eq!(phases.committed(None), Next::Stop);
        phases.committed(Some(vec![tablet(0)]));
        assert_eq!(
            phases.attempted(Attempted::LeadershipLost, &[tablet(0)]),
            Next::Stop
        );
    }

    #[test]
    fn a_partition_tries_masters_in_turn_from_its_assigned_one_up_to_the_limit() {
        let mut tries = PartitionTries::new(2, 4, 3);
        assert_eq!(tries.start(true), PartitionNext::Recover(2));
        assert!(tries.first_try());
        assert_eq!(tries.failed(true, true), (None, PartitionNext::Recover(3)));
        assert!(!tries.first_try());
        assert_eq!(tries.failed(true, true), (None, PartitionNext::Recover(0)));
        assert_eq!(
            tries.failed(true, true),
            (None, PartitionNext::Done),
            "3 masters at most"
        );
        let mut one = PartitionTries::new(0, 1, 3);
        assert_eq!(one.start(true), PartitionNext::Recover(0));
        assert_eq!(
            one.failed(true, true).1,
            PartitionNext::Done,
            "each master once"
        );
    }

    #[test]
    fn a_silent_master_is_told_to_abandon_and_one_that_answered_is_not() {
        let mut tries = PartitionTries::new(0, 3, 3);
        tries.start(true);
        assert_eq!(
            tries.failed(false, true),
            (Some(0), PartitionNext::Recover(1))
        );
        assert_eq!(tries.failed(true, true), (None, PartitionNext::Recover(2)));
    }

    #[test]
    fn a_deposed_leader_asks_no_more_masters_and_abandons_nothing_it_proposed() {
        let mut tries = PartitionTries::new(0, 3, 3);
        assert_eq!(tries.start(false), PartitionNext::Stop);
        let mut tries = PartitionTries::new(0, 3, 3);
        tries.start(true);
        // A silent master is still told to abandon: it was never proposed.
        assert_eq!(tries.failed(false, false), (Some(0), PartitionNext::Stop));
        let mut tries = PartitionTries::new(0, 3, 3);
        tries.start(true);
        assert_eq!(tries.replayed(), PartitionNext::Commit);
        // The entry may commit under the next leader: nothing to settle or abandon.
        assert_eq!(tries.committed(Commit::LeadershipLost), PartitionNext::Stop);
    }

    #[test]
    fn a_commit_of_unknown_outcome_is_settled_from_the_map_never_guessed() {
        let mut tries = PartitionTries::new(0, 3, 3);
        tries.start(true);
        assert_eq!(tries.committed(Commit::Committed), PartitionNext::Live);
        assert_eq!(tries.committed(Commit::Unknown), PartitionNext::Settle);
        assert_eq!(tries.settled(Some(true), true), PartitionNext::Live);
        assert_eq!(tries.committed(Commit::Unknown), PartitionNext::Settle);
        assert_eq!(
            tries.settled(Some(false), true),
            PartitionNext::Recover(1),
            "not the master's"
        );
        assert_eq!(tries.committed(Commit::Rejected), PartitionNext::Settle);
        assert_eq!(
            tries.settled(Some(false), true),
            PartitionNext::Done,
            "left to the next attempt"
        );
        assert_eq!(tries.committed(Commit::Unknown), PartitionNext::Settle);
        assert_eq!(
            tries.settled(None, true),
            PartitionNext::Stop,
            "the map unreadable"
        );
    }

    proptest! {
        /// Whatever the answers: each master is asked at most once per attempt, never
        /// more than the limit, always in turn from the assigned one; only a silent one
        /// is told to abandon, and only the one just asked.
        #[test]
        fn every_master_is_asked_at_most_once_and_in_turn(
            first in 0..6usize,
            candidates in 1..6usize,
            limit in 1..5usize,
            answers in proptest::collection::vec(0..4u8, 0..12),
        ) {
            let first = first % candidates;
            let mut tries = PartitionTries::new(first, candidates, limit);
            let mut asked = Vec::new();
            let mut step = tries.start(true);
            for answer in answers {
                let PartitionNext::Recover(index) = step else { break };
                asked.push(index);
                step = match answer {
                    0 => {
                        let (abandon, next) = tries.failed(false, true);
                        prop_assert_eq!(abandon, Some(index));
                        next
                    }
                    1 => {
                        let (abandon, next) = tries.failed(true, true);
                        prop_assert_eq!(abandon, None);
                        next
                    }
                    2 => {
                        prop_assert_eq!(tries.committed(Commit::Unknown), PartitionNext::Settle);
                        tries.settled(Some(false), true)
                    }
                    _ => {
                        prop_assert_eq!(tries.replayed(), PartitionNext::Commit);
                        prop_assert_eq!(tries.committed(Commit::Committed), PartitionNext::Live);
                        break;
                    }
                };
            }
            prop_assert!(asked.len() <= limit.min(candidates));
            for (n, index) in asked.iter().enumerate() {
                prop_assert_eq!(*index, (first + n) % candidates);
            }
        }
    }

    #[test]
    fn the_end_waits_for_every_master_but_not_for_one_gone_or_of_an_older_release() {
        let mut round = FinishRound::new();
        let crashed = ServerId(9);
        assert!(!round.answered(ServerId(1), FinishAnswer::Confirmed));
        assert!(!round.answered(ServerId(2), FinishAnswer::NewServer));
        assert!(!round.answered(ServerId(3), FinishAnswer::OlderRelease));
        assert!(round.answered(ServerId(4), FinishAnswer::Silent("refused".into())));
        assert!(!round.answered(ServerId(5), FinishAnswer::Failed("Retry".into())));
        let waiting = round
            .end_round(crashed)
            .expect_err("4 and 5 did not confirm");
        assert!(
            waiting.contains("server-4 (refused)") && waiting.contains("server-5"),
            "{waiting}"
        );
        assert!(!waiting.contains("server-1"), "{waiting}");
        for done in 1..=3 {
            assert!(
                !round.to_ask(ServerId(done)),
                "confirmed masters are not asked again"
            );
        }
        assert!(round.to_ask(ServerId(4)) && round.to_ask(ServerId(5)));
        assert!(!round.answered(ServerId(5), FinishAnswer::Confirmed));
        assert_eq!(
            round.end_round(crashed),
            Ok(()),
            "4 was declared crashed: not asked"
        );
    }
}
