//! What a drill does to its cluster and when: [`FaultKind`], the seeded [`FaultPlan`], and
//! the choice of victims from what the cluster looks like ([`choose`]). Pure: the drill's
//! driver carries the choices out on processes.
//!
//! One fault at a time: the driver injects it, waits until the cluster has healed (every
//! server killed is recovered and a replacement started, a killed coordinator restarted),
//! then waits a gap drawn from the seed before the next. Kinds come in rounds, each a
//! random order of every kind asked for, so a short drill still meets each kind.

use rampart_ops::netns::CutKind;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::time::Duration;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL a server that masters tablets of the drill's table.
    KillMaster,
    /// SIGKILL a server that masters none of them (it holds replicas only).
    KillBackup,
    /// SIGKILL two servers at once.
    KillTwo,
    /// SIGKILL the coordinators' Raft leader; restart it after a while.
    KillCoordinatorLeader,
    /// SIGKILL a master, then one of its recovery masters once that has a partition.
    KillDuringRecovery,
    /// Cut a host off from others ([`Cut`]): a master from the coordinators and its
    /// peers, or from the coordinators alone, or the coordinators' leader from the other
    /// coordinators and the servers; the drill's clients reach every host throughout.
    Partition,
    /// SIGSTOP a master until it is declared crashed and recovered, then SIGCONT it: it
    /// must serve nothing stale and exit.
    Pause,
    /// Move a tablet of the table to another server under the load (`rampart tablet
    /// move`): committed or aborted, never half.
    Move,
    /// Drain a server (`rampart drain`): its tablets move away and it is removed without
    /// a recovery; a replacement then starts in its slot.
    Drain,
}

impl FaultKind {
    /// Every kind, in the order of the `--faults` help.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::KillMaster,
        FaultKind::KillBackup,
        FaultKind::KillTwo,
        FaultKind::KillCoordinatorLeader,
        FaultKind::KillDuringRecovery,
        FaultKind::Partition,
        FaultKind::Pause,
        FaultKind::Move,
        FaultKind::Drain,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillMaster => "kill-master",
            FaultKind::KillBackup => "kill-backup",
            FaultKind::KillTwo => "kill-two",
            FaultKind::KillCoordinatorLeader => "kill-coordinator-leader",
            FaultKind::KillDuringRecovery => "kill-during-recovery",
            FaultKind::Partition => "partition",
            FaultKind::Pause => "pause",
            FaultKind::Move => "move",
            FaultKind::Drain => "drain",
        }
    }

    /// Parses a comma-separated list (`all` for every kind); repeats are ignored.
    pub fn parse_list(text: &str) -> Result<Vec<FaultKind>, String> {
        let mut kinds = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word == "all" {
                kinds.extend(FaultKind::ALL);
                continue;
            }
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| k.name() == word)
                .ok_or_else(|| {
                    let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "unknown fault `{word}`: one of {}, or all",
                        names.join(", ")
                    )
                })?;
            kinds.push(kind);
        }
        kinds.sort();
        kinds.dedup();
        Ok(kinds)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The order of faults and the gaps between them, drawn from a seed.
#[derive(Debug)]
pub struct FaultPlan {
    kinds: Vec<FaultKind>,
    round: Vec<FaultKind>,
    gap_min: Duration,
    gap_max: Duration,
    rng: SmallRng,
}

impl FaultPlan {
    /// A plan over `kinds` (none: a drill without faults), waiting between `gap_min` and
    /// `gap_max` between two faults.
    pub fn new(seed: u64, kinds: &[FaultKind], gap_min: Duration, gap_max: Duration) -> FaultPlan {
        FaultPlan {
            kinds: kinds.to_vec(),
            round: Vec::new(),
            gap_min,
            gap_max: gap_max.max(gap_min),
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The next fault and the gap to wait before it; `None` when the plan has no kinds.
    pub fn next_fault(&mut self) -> Option<(Duration, FaultKind)> {
        if self.kinds.is_empty() {
            return None;
        }
        if self.round.is_empty() {
            self.round = self.kinds.clone();
            self.round.shuffle(&mut self.rng);
        }
        let kind = self.round.pop()?;
        let gap = self.rng.gen_range(self.gap_min..=self.gap_max);
        Some((gap, kind))
    }

    /// A number drawn from the plan's seed, for the choices a fault makes.
    pub fn draw(&mut self) -> u64 {
        self.rng.gen()
    }
}

/// A server as the drill sees it when it chooses victims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerView {
    /// The drill's slot (its process name `server #SLOT`, its data directory).
    pub slot: usize,
    /// Its server id now.
    pub id: u64,
    /// Whether it masters tablets of the drill's table.
    pub masters_tablets: bool,
}

/// What one `partition` fault cuts off. The drill's clients run on a host of their own
/// and reach every host throughout, so that they meet the far side of every cut: a
/// master that cannot renew its lease must refuse them, a leader that lost its quorum
/// must not answer them with stale configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// A master from the coordinators and every other server: its peers report it, the
    /// coordinator declares it crashed, its tablets are recovered elsewhere.
    MasterAlone,
    /// A master from the coordinators only: its peers still reach it (so none reports
    /// it); it must stop serving when its lease lapses, and its clients must get it
    /// declared crashed.
    MasterFromCoordinators,
    /// The coordinators' leader from the other coordinators and every server: the rest
    /// must elect another.
    LeaderAlone,
    /// A master from the coordinators and every other server by `REJECT` rules: their
    /// connections to it are refused at once, as if nothing listened, though it lives
    /// and still reaches the drill's clients. The coordinators of a drill with a network
    /// take only a supervisor's word as proof of death (`--proof-of-death supervisor`),
    /// so it must be waited out like a silent one: its recovery must say "lease waited".
    MasterRejected,
}

impl Cut {
    /// The cut of one `partition` fault, from a draw of the plan.
    pub fn drawn(draw: u64) -> Cut {
        match draw % 4 {
            0 => Cut::MasterAlone,
            1 => Cut::MasterFromCoordinators,
            2 => Cut::LeaderAlone,
            _ => Cut::MasterRejected,
        }
    }

    /// How the cut treats the traffic it cuts.
    pub fn kind(self) -> CutKind {
        match self {
            Cut::MasterRejected => CutKind::Reject,
            _ => CutKind::Drop,
        }
    }

    /// The hosts `victim` is cut off from, among `coordinators` and `servers` (host
    /// names; `victim` is one of them and never its own peer).
    pub fn peers<'a>(
        self,
        victim: &str,
        coordinators: &'a [String],
        servers: &'a [String],
    ) -> Vec<&'a str> {
        let with_servers = self != Cut::MasterFromCoordinators;
        coordinators
            .iter()
            .chain(servers.iter().filter(|_| with_servers))
            .map(String::as_str)
            .filter(|host| *host != victim)
            .collect()
    }
}

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cut::MasterAlone => "from the coordinators and the other servers",
            Cut::MasterFromCoordinators => "from the coordinators only",
            Cut::LeaderAlone => "from the other coordinators and the servers",
            Cut::MasterRejected => {
                "from the coordinators and the other servers by REJECT rules (resets)"
            }
        })
    }
}

/// Why a fault was not injected this time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip(pub String);

/// The servers (slots) to kill or pause for `kind`, among `up` (servers up now, each in
/// a slot of its own), drawing with `draw`. A cluster that cannot lose them without
/// losing writes or its recovery (fewer than `replicas` backups left for a master, R + 1
/// servers) skips the fault. Not for the coordinator's faults.
pub fn choose(
    kind: FaultKind,
    up: &[ServerView],
    replicas: usize,
    draw: u64,
) -> Result<Vec<usize>, Skip> {
    let masters: Vec<&ServerView> = up.iter().filter(|s| s.masters_tablets).collect();
    let backups: Vec<&ServerView> = up.iter().filter(|s| !s.masters_tablets).collect();
    let pick = |among: &[&ServerView], salt: u64| -> Option<usize> {
        (!among.is_empty())
            .then(|| among[(draw.wrapping_add(salt) % among.len() as u64) as usize].slot)
    };
    let victims = match kind {
        FaultKind::KillMaster
        | FaultKind::Pause
        | FaultKind::KillDuringRecovery
        | FaultKind::Partition => {
            vec![pick(&masters, 0).ok_or_else(|| Skip("no server masters tablets".into()))?]
        }
        FaultKind::KillBackup => vec![pick(&backups, 0)
            .ok_or_else(|| Skip("every server up masters tablets of the table".into()))?],
        FaultKind::Drain => {
            let all: Vec<&ServerView> = up.iter().collect();
            vec![pick(&all, 0).ok_or_else(|| Skip("no server is up".into()))?]
        }
        FaultKind::Move => {
            return Err(Skip(format!("{kind} chooses tablets, not servers")));
        }
        FaultKind::KillTwo => {
            let all: Vec<&ServerView> = up.iter().collect();
            let first = pick(&all, 0).ok_or_else(|| Skip("no server is up".into()))?;
            let rest: Vec<&ServerView> = all.into_iter().filter(|s| s.slot != first).collect();
            let second = pick(&rest, draw >> 32).ok_or_else(|| Skip("one server is up".into()))?;
            vec![first, second]
        }
        FaultKind::KillCoordinatorLeader => {
            return Err(Skip(format!("{kind} does not kill servers")));
        }
    };
    // A kill during recovery takes a recovery master as well.
    let lost = victims.len() + usize::from(kind == FaultKind::KillDuringRecovery);
    let left = up.len().saturating_sub(lost);
    if left < replicas + 1 {
        return Err(Skip(format!(
            "{} servers up: losing {lost} leaves {left}, fewer than R + 1 = {} (writes and \
             recoveries would wait for a replacement)",
            up.len(),
            replicas + 1
        )));
    }
    Ok(victims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(slots_with_tablets: &[(usize, bool)]) -> Vec<ServerView> {
        slots_with_tablets
            .iter()
            .map(|&(slot, masters_tablets)| ServerView {
                slot,
                id: slot as u64 + 10,
                masters_tablets,
            })
            .collect()
    }

    #[test]
    fn fault_lists_parse_with_all_and_reject_unknown_names() {
        assert_eq!(
            FaultKind::parse_list("pause, kill-master,pause"),
            Ok(vec![FaultKind::KillMaster, FaultKind::Pause])
        );
        assert_eq!(
            FaultKind::parse_list("all").map(|k| k.len()),
            Ok(FaultKind::ALL.len())
        );
        assert_eq!(FaultKind::parse_list(""), Ok(vec![]));
        let error = FaultKind::parse_list("kill-everything").unwrap_err();
        assert!(error.contains("unknown fault `kill-everything`"), "{error}");
    }

    #[test]
    fn every_round_of_a_plan_holds_each_kind_once_and_a_seed_replays_it() {
        let kinds = [FaultKind::KillMaster, FaultKind::KillTwo, FaultKind::Pause];
        let gap = (Duration::from_secs(1), Duration::from_secs(3));
        let mut plan = FaultPlan::new(7, &kinds, gap.0, gap.1);
        let mut again = FaultPlan::new(7, &kinds, gap.0, gap.1);
        for _ in 0..4 {
            let mut round: Vec<FaultKind> = (0..3)
                .map(|_| {
                    let (wait, kind) = plan.next_fault().expect("kinds given");
                    assert!(gap.0 <= wait && wait <= gap.1);
                    assert_eq!(again.next_fault(), Some((wait, kind)));
                    kind
                })
                .collect();
            round.sort();
            assert_eq!(round, kinds);
        }
        assert_eq!(
            FaultPlan::new(7, &[], gap.0, gap.1).next_fault(),
            None,
            "a drill without faults"
        );
    }

    #[test]
    fn masters_backups_and_pairs_are_chosen_among_the_right_servers() {
        let up = view(&[(1, true), (2, true), (3, false), (4, true), (5, false)]);
        for draw in 0..20 {
            let master = choose(FaultKind::KillMaster, &up, 2, draw).unwrap();
            assert!([1, 2, 4].contains(&master[0]), "{master:?}");
            let backup = choose(FaultKind::KillBackup, &up, 2, draw).unwrap();
            assert!([3, 5].contains(&backup[0]), "{backup:?}");
            let two = choose(FaultKind::KillTwo, &up, 2, draw).unwrap();
            assert_eq!(two.len(), 2);
            assert_ne!(two[0], two[1]);
        }
    }

    #[test]
    fn a_fault_that_would_leave_fewer_than_r_plus_one_servers_is_skipped() {
        let up = view(&[(1, true), (2, true), (3, false), (4, true)]);
        // R = 2: 4 up, two kills leave 2 < 3.
        assert!(choose(FaultKind::KillTwo, &up, 2, 0).is_err());
        assert!(choose(FaultKind::KillDuringRecovery, &up, 2, 0).is_err());
        assert!(choose(FaultKind::KillMaster, &up, 2, 0).is_ok());
        let only_masters = view(&[(1, true), (2, true), (3, true), (4, true)]);
        assert!(choose(FaultKind::KillBackup, &only_masters, 1, 0).is_err());
        assert!(choose(FaultKind::KillCoordinatorLeader, &up, 1, 0).is_err());
        assert!(choose(FaultKind::Partition, &only_masters, 3, 0).is_err());
    }

    #[test]
    fn each_cut_leaves_out_the_right_hosts_and_every_cut_is_drawn() {
        let coordinators: Vec<String> = ["c1", "c2", "c3"].map(String::from).to_vec();
        let servers: Vec<String> = ["s1", "s2", "s3"].map(String::from).to_vec();
        assert_eq!(
            Cut::MasterAlone.peers("s2", &coordinators, &servers),
            ["c1", "c2", "c3", "s1", "s3"]
        );
        assert_eq!(
            Cut::MasterFromCoordinators.peers("s2", &coordinators, &servers),
            ["c1", "c2", "c3"]
        );
        assert_eq!(
            Cut::LeaderAlone.peers("c3", &coordinators, &servers),
            ["c1", "c2", "s1", "s2", "s3"]
        );
        assert_eq!(
            Cut::MasterRejected.peers("s2", &coordinators, &servers),
            ["c1", "c2", "c3", "s1", "s3"]
        );
        assert_eq!(Cut::MasterRejected.kind(), CutKind::Reject);
        assert_eq!(Cut::MasterAlone.kind(), CutKind::Drop);
        let drawn: std::collections::HashSet<_> =
            (0..4).map(|d| format!("{}", Cut::drawn(d))).collect();
        assert_eq!(drawn.len(), 4);
    }
}
