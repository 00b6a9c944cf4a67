//! Simulated runs from fixed seeds (see the crate doc of `rampart_sim`). A failure
//! names its seed; `cargo run -p rampart-ops -- simulate --seed N --trace` replays it.

use rampart_sim::{run, run_proving_death, run_splitting, Failure, Report};

/// Seeds every `cargo test` runs: a few seconds in a debug build.
const CI_SEEDS: u64 = 500;

/// Seeds the ignored test runs (`cargo test -p rampart-sim --release -- --ignored`).
const MANY_SEEDS: u64 = 20_000;

/// Seeds that fail with a fix undone, kept as regressions with the bug each catches:
/// for each, the two smallest seeds of this world that fail with that fix undone, of
/// 20,000. A change to the world gives every seed a new run: after one, undo each fix in
/// turn and keep the smallest seeds that fail (`rampart simulate --seeds 20000
/// --stop-at-first` finds the first; `--from` the next).
///
/// This world (issue 40, item 1) runs the replicator's own order of calls
/// (`sequencing`: a range's write, a replica's creation, and the upkeep round, which
/// now settles an open segment that lost replicas between batches, as the replicator
/// does, where the simulated master left it to the next write) and the backup's own
/// steps of a fence, a close and a free (`fencing`, `lifecycle`; these changed no run).
/// Every seed runs anew, so the table was re-found, each fix undone in the library
/// alone:
/// * 83ab2b8, `ReplicaFailures::take_frees` freeing a lost replica before its segment is
///   whole (`SegmentReplicas::whole` always true): 12, 20;
/// * 297bcd6, `FrameTable::shadows_stored` always true: 63, 96;
/// * 2b1bbd5, `FrameTable::open` never keeping the replaced frame's bytes: 120, 292;
/// * the recovery plan ranking copies newest epoch first (`rank`): 3, 4;
/// * footers in open copies ignored (`FoundReplica::successor` only for closed ones): 36,
///   99;
/// * tablets live at once, without waiting out the crashed master's lease (the
///   coordinator's `tablets_live_after` returning the declaration's time): 1987, 2654;
/// * a failed creation's copy not abandoned (`Creation::failed` without
///   `ReplicaFailures::open_failed`): 26, 912;
/// * issue 39 item 1 (a tombstone for every overwritten version, 8d89f9f; undone as no
///   tombstone for an overwrite): 9, 106;
/// * issue 39 item 2 (an abandoned recovery's segments tainted and cleaned out of the log
///   first, 8d89f9f; undone as `forget_unowned` tainting nothing): 12578 (those segments
///   kept in the log until the backups were full and a segment never settled) and 18342
///   (a deleted key read back). The simulated master's
///   `a_replay_beside_an_abandoned_attempts_segments_fails_its_try_until_they_are_cleaned`
///   and the master crate's `objects_forgotten_after_an_abandoned_replay_never_come_back`
///   check the key itself;
/// * issue 40 (a write waiting for backups frees abandoned copies,
///   `Settling::short_of_backups`): 0, 1 — nearly every seed stalls without it.
///
/// With no fix undone, the 20,000 seeds from 0 all pass.
///
/// Several are below [`CI_SEEDS`] and run there too; they stay here with their bug.
const REGRESSIONS: &[(u64, &str)] = &[
    (
        12,
        "a lost replica freed before its segment was whole: the last complete copy (83ab2b8)",
    ),
    (
        20,
        "a lost replica freed before its segment was whole: the last complete copy (83ab2b8)",
    ),
    (
        63,
        "a re-created frame cut short hid the closed copy on the backup's disk (297bcd6)",
    ),
    (
        96,
        "a re-created frame cut short hid the closed copy on the backup's disk (297bcd6)",
    ),
    (
        120,
        "a replacing open zeroed the frame that held every acknowledged byte (2b1bbd5)",
    ),
    (
        292,
        "a replacing open zeroed the frame that held every acknowledged byte (2b1bbd5)",
    ),
    (
        3,
        "recovery ranked copies newest epoch first: a partial newest-epoch copy won",
    ),
    (
        4,
        "recovery ranked copies newest epoch first: a partial newest-epoch copy won",
    ),
    (
        36,
        "recovery ignored the footer in open copies: the log never looked whole",
    ),
    (
        99,
        "recovery ignored the footer in open copies: the log never looked whole",
    ),
    (
        1987,
        "tablets went live before the zombie's lease ran out: a stale read (tablets_live_after)",
    ),
    (
        2654,
        "tablets went live before the zombie's lease ran out: a stale read (tablets_live_after)",
    ),
    (
        26,
        "a replica given up on after its open reached the backup was never freed: BackupFull",
    ),
    (
        912,
        "a replica given up on after its open reached the backup was never freed: BackupFull",
    ),
    (
        9,
        "a deleted key's older version came back once the cleaner took its later versions' \
         segments and the tombstone's (issue 39 item 1, 8d89f9f)",
    ),
    (
        106,
        "a deleted key's older version came back once the cleaner took its later versions' \
         segments and the tombstone's (issue 39 item 1, 8d89f9f)",
    ),
    (
        12578,
        "an abandoned recovery's segments stayed in the log until the backups were full \
         (issue 39 item 2, 8d89f9f)",
    ),
    (
        18342,
        "an abandoned recovery's segments stayed in the log: a deleted key came back \
         (issue 39 item 2, 8d89f9f)",
    ),
    (
        0,
        "a write waiting for backups freed nothing: backups full of frames the master gave \
         up on, a segment never settled (issue 40)",
    ),
    (
        1,
        "a write waiting for backups freed nothing: backups full of frames the master gave \
         up on, a segment never settled (issue 40)",
    ),
];

/// Seeds of the world where death may be proven (`run_proving_death`) every `cargo
/// test` runs.
const CI_PROVING_DEATH_SEEDS: u64 = 200;

/// Seeds of that world that fail with a rule of `proof_of_death` undone, with the bug
/// each catches (of 10,000 from 0, all passing with no rule undone): a refused
/// connection taken as proof of death where only a supervisor's word counts
/// (`ProofOfDeath::accepts` true for every evidence under `Supervisor`): a zombie cut
/// off by a `REJECT` rule is taken for dead, its tablets go live while it still serves
/// reads under its lease, and a client with a stale map reads an old value.
const PROVING_DEATH_REGRESSIONS: &[(u64, &str)] = &[
    (
        2654,
        "a zombie's firewall reset taken as proof of death: a stale read",
    ),
    (
        3998,
        "a zombie's firewall reset taken as proof of death: a stale read",
    ),
];

/// Seeds of the world where tablets are split (`run_splitting`) every `cargo test`
/// runs. With a split pushed as a `TakeTablets` of its halves (the owner forgets the
/// upper half's objects), 163 of the first 200 fail.
const CI_SPLITTING_SEEDS: u64 = 20;

fn run_seeds_of(
    run: fn(u64) -> Result<Report, Failure>,
    seeds: impl Iterator<Item = u64>,
) -> (usize, Vec<Failure>) {
    let mut passed = 0;
    let mut failures = Vec::new();
    for seed in seeds {
        match run(seed) {
            Ok(_) => passed += 1,
            Err(failure) => failures.push(failure),
        }
    }
    (passed, failures)
}

fn assert_all_pass(seeds: impl Iterator<Item = u64>) {
    assert_all_pass_of(run, seeds);
}

fn assert_all_pass_of(run: fn(u64) -> Result<Report, Failure>, seeds: impl Iterator<Item = u64>) {
    let (passed, failures) = run_seeds_of(run, seeds);
    if let Some(first) = failures.first() {
        let tail: Vec<&String> = first.trace.iter().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
        panic!(
            "{} of {} seeds failed; the first:\n{first}\nlast events:\n{}",
            failures.len(),
            failures.len() + passed,
            tail.join("\n")
        );
    }
}

#[test]
fn fixed_seeds_lose_no_acknowledged_write() {
    assert_all_pass(0..CI_SEEDS);
}

#[test]
fn regression_seeds_pass() {
    assert_all_pass(REGRESSIONS.iter().map(|(seed, _)| *seed));
}

#[test]
fn seeds_where_death_may_be_proven_serve_no_stale_read() {
    assert_all_pass_of(run_proving_death, 0..CI_PROVING_DEATH_SEEDS);
    assert_all_pass_of(
        run_proving_death,
        PROVING_DEATH_REGRESSIONS.iter().map(|(seed, _)| *seed),
    );
}

#[test]
fn seeds_where_tablets_are_split_lose_no_acknowledged_write() {
    assert_all_pass_of(run_splitting, 0..CI_SPLITTING_SEEDS);
}

#[test]
fn a_seed_replays_exactly() {
    let summary = |seed| {
        run(seed)
            .map(|r| (r.events, r.trace_crc32, r.acknowledged, r.time_us))
            .ok()
    };
    let first = summary(7);
    assert!(first.is_some_and(|(events, ..)| events > 10));
    assert_eq!(first, summary(7));
    assert_ne!(first, summary(8), "another seed is another run");
}

#[test]
#[ignore = "thousands of seeds: run with --release -- --ignored"]
fn many_seeds_lose_no_acknowledged_write() {
    assert_all_pass(CI_SEEDS..CI_SEEDS + MANY_SEEDS);
}
