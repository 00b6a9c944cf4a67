//! `BackupSelector`: which backups hold the replicas of each new segment of this
//! master (DESIGN.md §5, "Replica placement — randomized with refinement").
//!
//! The replica manager asks for R backups per new segment with [`BackupSelector::select`];
//! the first one returned holds the *primary* replica. (A recovery of this master need
//! not read the primaries: of each segment's complete copies, the coordinator reads the
//! one that balances the backups' reads by disk speed,
//! `recovery_plan::choose_sources_by_speed`, so refining the primaries matters little
//! while two or more copies of each segment are up; `rampart simulate --report` shows
//! both.) When a backup is lost, it asks for
//! one replacement with [`BackupSelector::select_replacement`]. It feeds the selector
//! the server list with [`BackupSelector::update_backups`] and tells it when a segment
//! is freed with [`BackupSelector::primary_freed`]. The selector does no I/O: it keeps
//! the eligible backups, this master's primary count on each, and a seeded random
//! generator, so that one seed reproduces every choice.
//!
//! # How a primary is chosen
//! Recovery of this master reads every primary in parallel, each backup reading its own
//! share from disk, so the recovery takes as long as the *slowest* backup: the one whose
//! (primaries of this master × segment size) / disk read bandwidth is largest. The
//! selector draws [`CANDIDATES_K`] distinct random candidates among the eligible backups
//! and takes the one that would finish soonest with one more primary, i.e. the smallest
//! `(primaries + 1) / disk_read_mbps` (ties: fewer primaries, then the lower server id,
//! so that a seed fully determines the result). This is the "power of k choices" of
//! Mitzenmacher, as in RAMCloud's `BackupSelector` (Ongaro et al., SOSP 2011, §3.3): it
//! costs O(k) per segment instead of O(backups) for the exact minimum, and keeps the
//! busiest backup within a few segments of the mean rather than the ≈ 2× of pure random
//! choice. It balances only *this* master's primaries: it does not know the others', and
//! they are not read when this master is recovered.
//!
//! # How secondaries are chosen
//! Uniformly at random among the eligible backups, as in RAMCloud. A secondary is read
//! only when its primary is unavailable, so balancing secondaries would not shorten a
//! recovery; random choice already scatters them, which is what lets many backups take
//! part when a primary's backup is lost too.
//!
//! # Eligibility
//! A backup may hold a replica of a segment when
//! 1. it is not this master's own server (a crash of the server would lose the DRAM copy
//!    and the replica together);
//! 2. it is Up and runs the backup service ([`BackupInfo::from_server`] filters the
//!    server list);
//! 3. it is not in the caller's `exclude` set (backups that refused `open`, e.g. full);
//! 4. no other replica of the segment is in its failure domain (rack), so that one rack
//!    failure loses at most one replica.
//!
//! A backup on *another server* in the master's own failure domain is eligible, as in
//! RAMCloud, which forbids only the master's server and shared domains among the
//! replicas. The master's DRAM copy is not one of the R replicas: a failure of the
//! master's rack loses the master and at most one replica, leaving R − 1 on disk, which is
//! exactly the guarantee R replicas in distinct domains give against any single rack
//! failure. Forbidding the master's domain as well would need R + 1 domains and, with
//! few racks, would move every replica of every master off its own rack for no gain in
//! that guarantee.
//!
//! A backup that reports `disk_read_mbps` 0 has not measured its disk (or did not
//! report it); it counts as the median of the known speeds in the list — neither
//! favoured nor starved — or [`DISK_READ_MBPS_ASSUMED`] when none is known, in which case
//! all are equal and only the primary counts matter.
//!
//! # Failure handling
//! When fewer failure domains than R hold an eligible backup, `select` returns
//! [`NotEnoughBackups`] with the counts it saw and changes nothing; the caller waits for
//! the server list to change (or for a full backup to free space) and tries again.
//! A selection never fails while enough domains are eligible: when random draws find no
//! eligible candidate (most backups excluded, or all in domains already used), the
//! selector scans the eligible list.
//!
//! # Cost
//! O(k) draws per replica when most backups are eligible, plus O(backups) for the
//! fallback scan when they are not; `update_backups` is O(n log n). For scale: 8,000
//! segments of 8 MiB (a 64 GiB log) over 1,000 backups is a mean of 8 primaries, 64 MiB,
//! per backup: about 0.7 s of reading at 100 MB/s, which refinement keeps within 1.5×
//! for the busiest backup (the tests below measure it).

use rampart_common::ids::ServerId;
use rampart_common::tablet::{ServerInfo, ServerStatus};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

/// Replicas per segment unless configured otherwise (DESIGN.md §5): survives two
/// simultaneous backup failures, the usual choice for disk-backed replication.
pub const REPLICAS_DEFAULT: usize = 3;

/// Random candidates drawn per primary. Two already improve the busiest backup
/// exponentially over one; RAMCloud uses 5, past which the gain is small.
pub const CANDIDATES_K: usize = 5;

/// Random draws per wanted candidate before falling back to a scan of the eligible list.
/// With at least a quarter of the backups eligible, 8 draws miss with probability
/// (3/4)^8 ≈ 10 %, so the O(backups) scan stays rare while a hopeless search stays short.
pub const CANDIDATE_DRAWS_PER_PICK_MAX: usize = 8;

/// Disk read bandwidth assumed when no backup in the list reports one, MB/s. Only ratios
/// between backups matter, so any positive value gives the same choices.
pub const DISK_READ_MBPS_ASSUMED: u32 = 100;

const _: () = assert!(CANDIDATES_K >= 1, "a primary needs at least one candidate");
const _: () = assert!(CANDIDATE_DRAWS_PER_PICK_MAX >= 1);
const _: () = assert!(DISK_READ_MBPS_ASSUMED > 0, "speeds divide read times");

/// A backup as the selector needs it; callers build it from the server list with
/// [`BackupInfo::from_server`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupInfo {
    /// The server running the backup.
    pub id: ServerId,
    /// Its failure domain (rack); replicas of one segment never share one.
    pub failure_domain: String,
    /// Its measured disk read bandwidth, MB/s; 0 when unknown.
    pub disk_read_mbps: u32,
}

impl BackupInfo {
    /// The backup of `server`, or `None` when it is not Up or runs no backup service.
    pub fn from_server(server: &ServerInfo) -> Option<BackupInfo> {
        (server.status == ServerStatus::Up && server.services.backup).then(|| BackupInfo {
            id: server.id,
            failure_domain: server.failure_domain.clone(),
            disk_read_mbps: server.disk_read_mbps,
        })
    }
}

/// Not enough failure domains hold an eligible backup for the replicas asked for.
/// Eligible: in the current list, not this master's server, not excluded by the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "need {wanted} backups in distinct failure domains, but only {domains} failure \
     domains hold an eligible backup ({backups} eligible backups)"
)]
pub struct NotEnoughBackups {
    /// Replicas (hence distinct failure domains) wanted.
    pub wanted: usize,
    /// Eligible backups seen.
    pub backups: usize,
    /// Distinct failure domains among them (for a replacement, counting the domains of
    /// the segment's other replicas too).
    pub domains: usize,
}

impl NotEnoughBackups {
    /// What an operator reads: the cause and the two ways out.
    pub fn explain(&self) -> String {
        format!(
            "writes wait for backups: {self}; start more servers (in distinct failure \
             domains), or run the cluster with fewer replicas (--replicas, now {})",
            self.wanted
        )
    }
}

/// Whether this master's writes wait because too few backups are eligible, published
/// by the replicator for status reports (the write path itself waits inside it).
#[derive(Debug, Default)]
pub struct BackupShortage {
    current: parking_lot::Mutex<Option<NotEnoughBackups>>,
}

impl BackupShortage {
    /// The shortage writes wait on now, if any.
    pub fn current(&self) -> Option<NotEnoughBackups> {
        self.current.lock().clone()
    }

    /// Records the state; true when it changed (so the caller logs the change once).
    pub fn set(&self, shortage: Option<NotEnoughBackups>) -> bool {
        let mut current = self.current.lock();
        let changed = *current != shortage;
        *current = shortage;
        changed
    }
}

/// Index of an interned failure-domain name; only compared for equality.
type DomainIdx = u32;

/// One eligible backup.
#[derive(Clone, Debug)]
struct Backup {
    id: ServerId,
    domain: DomainIdx,
    /// Effective read bandwidth, MB/s: the reported one, or the median when unknown.
    /// Invariant: > 0.
    read_mbps: u32,
    /// Primaries of this master's live segments placed here.
    primaries: u32,
}

/// Chooses the backups of each new segment; see the module doc.
#[derive(Debug)]
pub struct BackupSelector {
    /// This master's server: never chosen.
    own: ServerId,
    /// Candidates drawn per primary (1: pure random choice).
    /// Invariant: ≥ 1.
    candidates_k: usize,
    /// The only source of randomness, seeded by the caller.
    rng: SmallRng,
    /// The eligible backups, sorted by id so that choices depend on the seed and the set
    /// of backups, not on the order of the server list.
    /// Invariants: 1. no entry is `own`; 2. ids are unique; 3. `read_mbps` > 0.
    backups: Vec<Backup>,
    /// Server id → position in `backups`. Invariant: exactly the ids of `backups`.
    index: HashMap<ServerId, usize>,
    /// Distinct failure domains among `backups`.
    domains: usize,
}

impl BackupSelector {
    /// A selector for the master on server `own`, with no backups yet and
    /// [`CANDIDATES_K`] candidates per primary. One `seed` reproduces every choice.
    pub fn new(own: ServerId, seed: u64) -> BackupSelector {
        BackupSelector {
            own,
            candidates_k: CANDIDATES_K,
            rng: SmallRng::seed_from_u64(seed),
            backups: Vec::new(),
            index: HashMap::new(),
            domains: 0,
        }
    }

    /// Draws `k` candidates per primary instead of [`CANDIDATES_K`]; `k` = 1 is pure
    /// random choice (the baseline refinement is measured against).
    ///
    /// # Panics
    /// If `k` is 0 (a programmer error).
    pub fn with_candidates(mut self, k: usize) -> BackupSelector {
        assert!(k >= 1, "a primary needs at least one candidate");
        self.candidates_k = k;
        self
    }

    /// Replaces the set of backups with `backups` (the Up servers running a backup, see
    /// [`BackupInfo::from_server`]). This master's own server is skipped if present; a
    /// later entry with the same id replaces an earlier one. Primary counts of backups
    /// still present are kept; a backup that left the list loses its count (its replicas
    /// are gone with it, and server ids are never reused).
    pub fn update_backups(&mut self, backups: &[BackupInfo]) {
        let mut domain_idx: HashMap<&str, DomainIdx> = HashMap::new();
        let mut by_id: HashMap<ServerId, Backup> = HashMap::new();
        for info in backups.iter().filter(|b| b.id != self.own) {
            let next = DomainIdx::try_from(domain_idx.len()).expect("fewer than 2^32 domains");
            let domain = *domain_idx
                .entry(info.failure_domain.as_str())
                .or_insert(next);
            let primaries = self.primaries_on(info.id);
            by_id.insert(
                info.id,
                Backup {
                    id: info.id,
                    domain,
                    read_mbps: info.disk_read_mbps,
                    primaries,
                },
            );
        }
        let mut list: Vec<Backup> = by_id.into_values().collect();
        list.sort_unstable_by_key(|b| b.id);

        let mut known: Vec<u32> = list
            .iter()
            .map(|b| b.read_mbps)
            .filter(|&m| m > 0)
            .collect();
        known.sort_unstable();
        // Upper median: a plain element of the list, so no rounding question.
        let median = known
            .get(known.len() / 2)
            .copied()
            .unwrap_or(DISK_READ_MBPS_ASSUMED);
        for b in list.iter_mut().filter(|b| b.read_mbps == 0) {
            b.read_mbps = median;
        }

        self.domains = list.iter().map(|b| b.domain).collect::<HashSet<_>>().len();
        self.index = list.iter().enumerate().map(|(i, b)| (b.id, i)).collect();
        self.backups = list;
    }

    /// Chooses `replicas` backups for a new segment, in distinct failure domains, none
    /// in `exclude`; the first holds the primary and its primary count goes up by one.
    /// `replicas` = 0 returns no backups.
    ///
    /// # Errors
    /// [`NotEnoughBackups`] when fewer than `replicas` failure domains hold an eligible
    /// backup; nothing changes then.
    pub fn select(
        &mut self,
        replicas: usize,
        exclude: &HashSet<ServerId>,
    ) -> Result<Vec<ServerId>, NotEnoughBackups> {
        let mut taken: Vec<DomainIdx> = Vec::with_capacity(replicas);
        let mut chosen: Vec<usize> = Vec::with_capacity(replicas);
        for nth in 0..replicas {
            // Greedy is enough: each pick uses up one domain, so while at least
            // `replicas` domains hold an eligible backup, every pick finds one.
            let Some(i) = self.pick(nth == 0, &taken, exclude) else {
                return Err(self.not_enough(replicas, &[], exclude));
            };
            taken.push(self.backups[i].domain);
            chosen.push(i);
        }
        if let Some(&primary) = chosen.first() {
            self.backups[primary].primaries += 1;
        }
        Ok(chosen.into_iter().map(|i| self.backups[i].id).collect())
    }

    /// Chooses one backup to replace a lost replica of a segment whose other replicas
    /// are on `others`: outside their failure domains and not in `exclude`. With
    /// `primary` the new replica is the segment's primary, chosen by refinement and
    /// counted; otherwise it is chosen at random. Entries of `others` no longer in the
    /// list are ignored (their replicas are gone).
    ///
    /// # Errors
    /// [`NotEnoughBackups`] when no eligible backup is outside those domains.
    pub fn select_replacement(
        &mut self,
        others: &[ServerId],
        primary: bool,
        exclude: &HashSet<ServerId>,
    ) -> Result<ServerId, NotEnoughBackups> {
        let mut taken: Vec<DomainIdx> = others
            .iter()
            .filter_map(|id| self.index.get(id).map(|&i| self.backups[i].domain))
            .collect();
        taken.sort_unstable();
        taken.dedup();
        let Some(i) = self.pick(primary, &taken, exclude) else {
            return Err(self.not_enough(taken.len() + 1, &taken, exclude));
        };
        if primary {
            self.backups[i].primaries += 1;
        }
        Ok(self.backups[i].id)
    }

    /// A segment whose primary is on `backup` was freed: its primary count goes down by
    /// one. A backup no longer in the list (its count is already gone) or already at
    /// zero is left alone, since the free may race with the backup leaving.
    pub fn primary_freed(&mut self, backup: ServerId) {
        if let Some(&i) = self.index.get(&backup) {
            let b = &mut self.backups[i];
            b.primaries = b.primaries.saturating_sub(1);
        }
    }

    /// This master's primaries on `backup` (0 for a backup not in the list).
    pub fn primaries_on(&self, backup: ServerId) -> u32 {
        self.index
            .get(&backup)
            .map_or(0, |&i| self.backups[i].primaries)
    }

    /// The read bandwidth the selector assumes for `backup`, MB/s (the median of the
    /// known ones when it reported none), or `None` when it is not in the list.
    pub fn disk_read_mbps_of(&self, backup: ServerId) -> Option<u32> {
        self.index.get(&backup).map(|&i| self.backups[i].read_mbps)
    }

    /// Backups that may be chosen (the list less this master's own server).
    pub fn backup_count(&self) -> usize {
        self.backups.len()
    }

    /// Distinct failure domains among those backups.
    pub fn domain_count(&self) -> usize {
        self.domains
    }

    /// One eligible backup outside the `taken` domains and `exclude`: with `refine`, the
    /// best of up to `candidates_k` distinct random candidates, else a random one.
    /// `None` only when no backup is eligible.
    fn pick(
        &mut self,
        refine: bool,
        taken: &[DomainIdx],
        exclude: &HashSet<ServerId>,
    ) -> Option<usize> {
        let n = self.backups.len();
        if n == 0 {
            return None;
        }
        let want = if refine { self.candidates_k } else { 1 };
        let mut candidates: Vec<usize> = Vec::with_capacity(want);
        // Rejection sampling: uniform over the eligible backups, O(want) draws when most
        // are eligible. Distinct candidates, so a small cluster is fully compared.
        for _ in 0..want * CANDIDATE_DRAWS_PER_PICK_MAX {
            if candidates.len() == want {
                break;
            }
            let i = self.rng.gen_range(0..n);
            if self.eligible(i, taken, exclude) && !candidates.contains(&i) {
                candidates.push(i);
            }
        }
        if candidates.is_empty() {
            // Eligible backups are rare (or absent): find them all.
            let pool: Vec<usize> = (0..n)
                .filter(|&i| self.eligible(i, taken, exclude))
                .collect();
            candidates.extend(pool.choose_multiple(&mut self.rng, want).copied());
        }
        candidates
            .into_iter()
            .min_by(|&a, &b| self.compare_as_primary(a, b))
    }

    fn eligible(&self, i: usize, taken: &[DomainIdx], exclude: &HashSet<ServerId>) -> bool {
        let b = &self.backups[i];
        !taken.contains(&b.domain) && !exclude.contains(&b.id)
    }

    /// Orders backups by when they would finish reading this master's primaries with
    /// one more: (primaries + 1) / read_mbps, compared exactly by cross-multiplying;
    /// then fewer primaries; then lower id.
    fn compare_as_primary(&self, a: usize, b: usize) -> Ordering {
        let (a, b) = (&self.backups[a], &self.backups[b]);
        let finish_a = (u64::from(a.primaries) + 1) * u64::from(b.read_mbps);
        let finish_b = (u64::from(b.primaries) + 1) * u64::from(a.read_mbps);
        finish_a
            .cmp(&finish_b)
            .then(a.primaries.cmp(&b.primaries))
            .then(a.id.cmp(&b.id))
    }

    /// The error for `wanted` replicas: eligible backups (not excluded) and the distinct
    /// domains among them and `taken`.
    fn not_enough(
        &self,
        wanted: usize,
        taken: &[DomainIdx],
        exclude: &HashSet<ServerId>,
    ) -> NotEnoughBackups {
        let eligible: Vec<&Backup> = self
            .backups
            .iter()
            .filter(|b| !exclude.contains(&b.id))
            .collect();
        let domains: HashSet<DomainIdx> = eligible
            .iter()
            .map(|b| b.domain)
            .chain(taken.iter().copied())
            .collect();
        NotEnoughBackups {
            wanted,
            backups: eligible.len(),
            domains: domains.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::config::SEGMENT_BYTES_DEFAULT;
    use rampart_common::tablet::Services;

    const OWN: ServerId = ServerId(1_000_000);

    fn none() -> HashSet<ServerId> {
        HashSet::new()
    }

    /// `n` backups with ids 1..=n, backup i in domain `rack-{i % domains}`, at `mbps(i)`.
    fn backups(n: u64, domains: u64, mbps: impl Fn(u64) -> u32) -> Vec<BackupInfo> {
        (1..=n)
            .map(|i| BackupInfo {
                id: ServerId(i),
                failure_domain: format!("rack-{}", i % domains),
                disk_read_mbps: mbps(i),
            })
            .collect()
    }

    fn selector(seed: u64, list: &[BackupInfo]) -> BackupSelector {
        let mut s = BackupSelector::new(OWN, seed);
        s.update_backups(list);
        s
    }

    fn domain_of(list: &[BackupInfo], id: ServerId) -> &str {
        &list
            .iter()
            .find(|b| b.id == id)
            .expect("chosen backups come from the list")
            .failure_domain
    }

    /// Places `segments` segments with R = 3 and returns the primary count per backup.
    fn place(s: &mut BackupSelector, list: &[BackupInfo], segments: usize) -> Vec<u32> {
        for _ in 0..segments {
            s.select(REPLICAS_DEFAULT, &none()).expect("enough domains");
        }
        list.iter().map(|b| s.primaries_on(b.id)).collect()
    }

    #[test]
    fn refinement_keeps_the_busiest_backup_near_the_mean_and_random_choice_does_not() {
        const SEED: u64 = 0x5eed_0003;
        const SEGMENTS: usize = 8_000;
        let list = backups(1_000, 100, |_| 100);
        let mean = SEGMENTS as f64 / list.len() as f64;

        let refined = place(&mut selector(SEED, &list), &list, SEGMENTS);
        let mut random_selector = BackupSelector::new(OWN, SEED).with_candidates(1);
        random_selector.update_backups(&list);
        let random = place(&mut random_selector, &list, SEGMENTS);

        let max_refined = f64::from(*refined.iter().max().expect("backups"));
        let max_random = f64::from(*random.iter().max().expect("backups"));
        println!(
            "seed {SEED:#x}: {SEGMENTS} primaries over {} equal backups, mean {mean:.2}; \
             busiest: refinement (k = {CANDIDATES_K}) {max_refined} = {:.2}× mean, \
             pure random (k = 1) {max_random} = {:.2}× mean",
            list.len(),
            max_refined / mean,
            max_random / mean,
        );
        assert_eq!(refined.iter().sum::<u32>() as usize, SEGMENTS);
        assert!(
            max_refined <= 1.5 * mean,
            "seed {SEED:#x}: refinement too uneven"
        );
        assert!(
            max_random >= 2.0 * mean,
            "seed {SEED:#x}: random unexpectedly even"
        );
    }

    #[test]
    fn refinement_balances_read_time_over_backups_of_different_disk_speeds() {
        const SEED: u64 = 0x5eed_0004;
        const SEGMENTS: usize = 8_000;
        // Half the backups read at 100 MB/s, half at 400 MB/s.
        let list = backups(1_000, 100, |i| if i % 2 == 0 { 100 } else { 400 });
        let counts = place(&mut selector(SEED, &list), &list, SEGMENTS);

        let segment_mb = f64::from(SEGMENT_BYTES_DEFAULT) / 1e6;
        let read_s: Vec<f64> = list
            .iter()
            .zip(&counts)
            .map(|(b, &p)| f64::from(p) * segment_mb / f64::from(b.disk_read_mbps))
            .collect();
        let mean_s = read_s.iter().sum::<f64>() / read_s.len() as f64;
        let slowest_s = read_s.iter().copied().fold(0.0, f64::max);
        let total_mbps: f64 = list.iter().map(|b| f64::from(b.disk_read_mbps)).sum();
        let ideal_s = SEGMENTS as f64 * segment_mb / total_mbps;
        let mean_primaries = |mbps: u32| {
            let of_speed: Vec<u32> = list
                .iter()
                .zip(&counts)
                .filter(|(b, _)| b.disk_read_mbps == mbps)
                .map(|(_, &p)| p)
                .collect();
            f64::from(of_speed.iter().sum::<u32>()) / of_speed.len() as f64
        };
        println!(
            "seed {SEED:#x}: {SEGMENTS} primaries of {segment_mb:.1} MB over 500 backups at \
             100 MB/s and 500 at 400 MB/s; mean primaries {:.2} (slow) / {:.2} (fast); \
             read time: slowest backup {slowest_s:.3} s = {:.2}× the mean {mean_s:.3} s \
             (ideal, all equal: {ideal_s:.3} s)",
            mean_primaries(100),
            mean_primaries(400),
            slowest_s / mean_s,
        );
        assert!(
            slowest_s <= 1.3 * mean_s,
            "seed {SEED:#x}: slowest backup reads {slowest_s:.3} s, mean {mean_s:.3} s"
        );
    }

    #[test]
    fn select_never_chooses_the_own_server() {
        let mut list = backups(6, 6, |_| 100);
        list.push(BackupInfo {
            id: OWN,
            failure_domain: "rack-own".into(),
            disk_read_mbps: 1_000,
        });
        for seed in 0..200 {
            let mut s = selector(seed, &list);
            assert_eq!(s.backup_count(), 6);
            for _ in 0..20 {
                let chosen = s.select(3, &none()).expect("6 domains");
                assert!(!chosen.contains(&OWN), "seed {seed}: chose own server");
            }
        }
    }

    #[test]
    fn select_never_places_two_replicas_in_one_failure_domain() {
        for seed in 0..300 {
            // 3–5 domains over 4–19 backups, some excluded; R up to the domain count.
            let mut setup = SmallRng::seed_from_u64(seed);
            let domains = setup.gen_range(3..=5);
            let n = setup.gen_range(4..20);
            let list = backups(n, domains, |i| 50 * (1 + (i % 4) as u32));
            let mut s = selector(seed, &list);
            for _ in 0..50 {
                let exclude: HashSet<ServerId> = list
                    .iter()
                    .filter(|_| setup.gen_bool(0.2))
                    .map(|b| b.id)
                    .collect();
                let replicas = setup.gen_range(1..=domains as usize);
                let Ok(chosen) = s.select(replicas, &exclude) else {
                    continue; // the exclusions left too few domains
                };
                assert_eq!(chosen.len(), replicas, "seed {seed}");
                let used: HashSet<&str> = chosen.iter().map(|&id| domain_of(&list, id)).collect();
                assert_eq!(
                    used.len(),
                    replicas,
                    "seed {seed}: shared domain in {chosen:?}"
                );
                assert!(chosen.iter().all(|id| !exclude.contains(id)), "seed {seed}");
            }
        }
    }

    #[test]
    fn select_succeeds_whenever_enough_domains_are_eligible() {
        // One backup per domain outside a big crowded domain: the random draws nearly
        // always hit the crowded one, so the fallback scan must find the others.
        let mut list = backups(500, 1, |_| 100);
        for (i, rack) in ["rack-a", "rack-b"].into_iter().enumerate() {
            list.push(BackupInfo {
                id: ServerId(10_000 + i as u64),
                failure_domain: rack.into(),
                disk_read_mbps: 100,
            });
        }
        for seed in 0..50 {
            let mut s = selector(seed, &list);
            let chosen = s.select(3, &none()).expect("3 domains");
            assert!(chosen.contains(&ServerId(10_000)), "seed {seed}");
            assert!(chosen.contains(&ServerId(10_001)), "seed {seed}");
        }
    }

    #[test]
    fn select_never_chooses_an_excluded_backup() {
        let list = backups(20, 10, |_| 100);
        let exclude: HashSet<ServerId> = (1..=15).map(ServerId).collect();
        for seed in 0..100 {
            let mut s = selector(seed, &list);
            for _ in 0..10 {
                let chosen = s
                    .select(3, &exclude)
                    .expect("5 backups in 5 domains remain");
                assert!(chosen.iter().all(|id| id.0 > 15), "seed {seed}: {chosen:?}");
            }
        }
    }

    #[test]
    fn select_fails_with_not_enough_backups_when_fewer_domains_than_replicas() {
        let list = backups(6, 2, |_| 100);
        let mut s = selector(7, &list);
        assert_eq!(s.domain_count(), 2);
        let err = s.select(3, &none()).expect_err("only 2 domains");
        assert_eq!(
            err,
            NotEnoughBackups {
                wanted: 3,
                backups: 6,
                domains: 2
            }
        );
        assert_eq!(
            err.to_string(),
            "need 3 backups in distinct failure domains, but only 2 failure domains hold an \
             eligible backup (6 eligible backups)"
        );
        // Nothing was counted by the failed attempt.
        assert!(list.iter().all(|b| s.primaries_on(b.id) == 0));

        // Excluding every backup of one domain leaves one domain.
        let rack0: HashSet<ServerId> = [2, 4, 6].map(ServerId).into();
        let err = s.select(2, &rack0).expect_err("one domain left");
        assert_eq!((err.backups, err.domains), (3, 1));

        // No backups at all, or only this master's own server.
        let mut empty = BackupSelector::new(OWN, 7);
        empty.update_backups(&[BackupInfo {
            id: OWN,
            failure_domain: "rack".into(),
            disk_read_mbps: 100,
        }]);
        let err = empty.select(1, &none()).expect_err("no backups");
        assert_eq!((err.wanted, err.backups, err.domains), (1, 0, 0));
    }

    #[test]
    fn select_of_zero_replicas_chooses_and_counts_nothing() {
        let list = backups(4, 4, |_| 100);
        let mut s = selector(1, &list);
        assert_eq!(s.select(0, &none()), Ok(vec![]));
        assert!(list.iter().all(|b| s.primaries_on(b.id) == 0));
        assert_eq!(BackupSelector::new(OWN, 1).select(0, &none()), Ok(vec![]));
    }

    #[test]
    fn select_allows_the_own_failure_domain_for_another_server() {
        // The master's rack holds one other server; with 3 racks and R = 3 it must be
        // used, which the module doc argues is safe.
        let list = vec![
            BackupInfo {
                id: OWN,
                failure_domain: "rack-a".into(),
                disk_read_mbps: 100,
            },
            BackupInfo {
                id: ServerId(1),
                failure_domain: "rack-a".into(),
                disk_read_mbps: 100,
            },
            BackupInfo {
                id: ServerId(2),
                failure_domain: "rack-b".into(),
                disk_read_mbps: 100,
            },
            BackupInfo {
                id: ServerId(3),
                failure_domain: "rack-c".into(),
                disk_read_mbps: 100,
            },
        ];
        let mut s = selector(3, &list);
        let mut chosen = s.select(3, &none()).expect("3 domains besides own server");
        chosen.sort();
        assert_eq!(chosen, [ServerId(1), ServerId(2), ServerId(3)]);
    }

    #[test]
    fn select_counts_only_the_first_backup_as_primary() {
        let list = backups(10, 10, |_| 100);
        let mut s = selector(11, &list);
        let chosen = s.select(3, &none()).expect("10 domains");
        assert_eq!(s.primaries_on(chosen[0]), 1);
        assert_eq!(s.primaries_on(chosen[1]), 0);
        assert_eq!(s.primaries_on(chosen[2]), 0);
    }

    #[test]
    fn primary_freed_lowers_the_count() {
        let list = backups(3, 3, |_| 100);
        let mut s = selector(5, &list);
        for _ in 0..30 {
            s.select(1, &none()).expect("3 domains");
        }
        let busiest = list
            .iter()
            .map(|b| b.id)
            .max_by_key(|&id| s.primaries_on(id))
            .expect("backups");
        let before = s.primaries_on(busiest);
        assert!(before > 0);
        s.primary_freed(busiest);
        assert_eq!(s.primaries_on(busiest), before - 1);

        // At zero it stays at zero; an unknown backup is ignored.
        let mut fresh = selector(5, &list);
        fresh.primary_freed(ServerId(1));
        fresh.primary_freed(ServerId(999));
        assert_eq!(fresh.primaries_on(ServerId(1)), 0);
        assert_eq!(fresh.primaries_on(ServerId(999)), 0);
    }

    #[test]
    fn same_seed_gives_same_choices() {
        let list = backups(200, 20, |i| 100 + (i % 7) as u32 * 50);
        let mut reversed = list.clone();
        reversed.reverse();
        let run = |seed: u64, list: &[BackupInfo]| -> Vec<Vec<ServerId>> {
            let mut s = selector(seed, list);
            (0..500)
                .map(|_| s.select(3, &none()).expect("20 domains"))
                .collect()
        };
        assert_eq!(run(42, &list), run(42, &list));
        // The order of the server list does not matter, only the set.
        assert_eq!(run(42, &list), run(42, &reversed));
        assert_ne!(run(42, &list), run(43, &list));
    }

    #[test]
    fn update_backups_keeps_counts_and_drops_vanished_backups() {
        let list = backups(4, 4, |_| 100);
        let mut s = selector(9, &list);
        for _ in 0..40 {
            s.select(1, &none()).expect("4 domains");
        }
        let counts: Vec<u32> = list.iter().map(|b| s.primaries_on(b.id)).collect();
        assert_eq!(counts.iter().sum::<u32>(), 40);

        // Backup 4 leaves, backup 5 joins.
        let mut next = list[..3].to_vec();
        next.push(BackupInfo {
            id: ServerId(5),
            failure_domain: "rack-new".into(),
            disk_read_mbps: 100,
        });
        s.update_backups(&next);
        for (b, &count) in list[..3].iter().zip(&counts) {
            assert_eq!(s.primaries_on(b.id), count);
        }
        assert_eq!(s.primaries_on(ServerId(4)), 0);
        assert_eq!(s.primaries_on(ServerId(5)), 0);
        // The newcomer is the least loaded, so refinement favours it.
        let first = s.select(1, &none()).expect("4 domains");
        assert_eq!(first, [ServerId(5)]);

        // Backup 4 coming back (a replay of an old list) starts from zero.
        s.update_backups(&list);
        assert_eq!(s.primaries_on(ServerId(4)), 0);
    }

    #[test]
    fn unknown_disk_speed_counts_as_the_median_of_known_speeds() {
        let mut list = backups(4, 4, |i| [0, 100, 200, 400][i as usize - 1]);
        let mut s = selector(1, &list);
        assert_eq!(s.disk_read_mbps_of(ServerId(1)), Some(200));
        assert_eq!(s.disk_read_mbps_of(ServerId(4)), Some(400));
        assert_eq!(s.disk_read_mbps_of(ServerId(99)), None);

        for b in &mut list {
            b.disk_read_mbps = 0;
        }
        s.update_backups(&list);
        assert!(list
            .iter()
            .all(|b| s.disk_read_mbps_of(b.id) == Some(DISK_READ_MBPS_ASSUMED)));
    }

    #[test]
    fn refinement_prefers_the_backup_that_finishes_soonest() {
        // With 2 backups both are always candidates: primaries go 4:1 to the backup
        // that reads 4× faster.
        let list = vec![
            BackupInfo {
                id: ServerId(1),
                failure_domain: "a".into(),
                disk_read_mbps: 100,
            },
            BackupInfo {
                id: ServerId(2),
                failure_domain: "b".into(),
                disk_read_mbps: 400,
            },
        ];
        let mut s = selector(2, &list);
        for _ in 0..100 {
            s.select(1, &none()).expect("2 domains");
        }
        assert_eq!(s.primaries_on(ServerId(1)), 20);
        assert_eq!(s.primaries_on(ServerId(2)), 80);
    }

    #[test]
    fn select_replacement_avoids_the_domains_of_the_other_replicas() {
        let list = backups(30, 5, |_| 100);
        for seed in 0..100 {
            let mut s = selector(seed, &list);
            let chosen = s.select(3, &none()).expect("5 domains");
            let others = [chosen[0], chosen[1]];
            let exclude: HashSet<ServerId> = [chosen[2]].into();
            let new = s
                .select_replacement(&others, false, &exclude)
                .expect("2 domains left");
            let used: HashSet<&str> = [others[0], others[1], new]
                .iter()
                .map(|&id| domain_of(&list, id))
                .collect();
            assert_eq!(used.len(), 3, "seed {seed}");
            assert_ne!(new, chosen[2], "seed {seed}");
            assert_eq!(
                s.primaries_on(new),
                0,
                "seed {seed}: a secondary is not counted"
            );

            let primary = s
                .select_replacement(&chosen[1..], true, &none())
                .expect("3 domains left");
            assert_eq!(s.primaries_on(primary), 1, "seed {seed}");
        }

        let small = backups(3, 3, |_| 100);
        let mut s = selector(0, &small);
        let all: Vec<ServerId> = small.iter().map(|b| b.id).collect();
        let err = s
            .select_replacement(&all, false, &none())
            .expect_err("every domain holds a replica");
        assert_eq!((err.wanted, err.backups, err.domains), (4, 3, 3));
    }

    #[test]
    fn from_server_skips_servers_that_are_not_up_or_run_no_backup() {
        let server = |status, backup| ServerInfo {
            id: ServerId(4),
            addr: "127.0.0.1:1".into(),
            services: Services {
                master: true,
                backup,
            },
            status,
            failure_domain: "rack-9".into(),
            disk_read_mbps: 250,
        };
        assert_eq!(
            BackupInfo::from_server(&server(ServerStatus::Up, true)),
            Some(BackupInfo {
                id: ServerId(4),
                failure_domain: "rack-9".into(),
                disk_read_mbps: 250,
            })
        );
        assert_eq!(
            BackupInfo::from_server(&server(ServerStatus::Up, false)),
            None
        );
        assert_eq!(
            BackupInfo::from_server(&server(ServerStatus::Crashed, true)),
            None
        );
        assert_eq!(
            BackupInfo::from_server(&server(ServerStatus::Removed, true)),
            None
        );
    }

    #[test]
    #[should_panic(expected = "at least one candidate")]
    fn with_candidates_rejects_zero() {
        let _ = BackupSelector::new(OWN, 0).with_candidates(0);
    }
}
