//! Simulated runs from fixed seeds (see the crate doc of `rampart_sim`). A failure
//! names its seed; `cargo run -p rampart-ops -- simulate --seed N --trace` replays it.

use rampart_sim::{run, Failure};

/// Seeds every `cargo test` runs: a few seconds in a debug build.
const CI_SEEDS: u64 = 500;

/// Seeds the ignored test runs (`cargo test -p rampart-sim --release -- --ignored`).
const MANY_SEEDS: u64 = 20_000;

/// Seeds that fail with a fix undone, kept as regressions with the bug each catches:
/// for each, the smallest seeds of this world that fail with that fix undone (and,
/// where there are such, with no other), of 20,000. A change to the world gives every
/// seed a new run: after one, undo each fix in turn, run `rampart simulate --seeds
/// 20000`, and keep the smallest seeds that fail.
///
/// The world before this one (keys deleted for good beside cold data, a cleaner after
/// every batch in small steps, abandoned recovery attempts) re-found them all; with each
/// fix undone, of 20,000 seeds: 83ab2b8 2,361 fail, 297bcd6 300, 2b1bbd5 73, the
/// longest-prefix ranking 1,835, footers in open copies 9, the lease wait 18, the
/// abandoned open 15. This world changes only the one seed in four that hunts an
/// abandoned attempt's leftovers (`SimConfig::with_leftovers`); the others run as they
/// did, so those counts are of the world before, and of the seeds kept for those fixes
/// only the ones this world did not change are kept (682, 2603 and 912 went; 292, 2286
/// and 1570, unchanged, still fail with their fix undone).
///
/// Measured in this world, of 20,000 seeds: issue 39 item 1 (a tombstone for every
/// overwritten version, 8d89f9f) undone, 577 fail (546 by a deleted key read back, 31 by
/// the linearizability check); issue 39 item 2 (an abandoned recovery's segments
/// tainted and cleaned out of the log first, 8d89f9f) undone, 3 fail (4997, 11860, 18427) — each by those segments kept in the
/// log until the backups were full and a segment never settled, none by a key coming
/// back: that needs one of them to outlive every entry masking its leftovers, which the
/// cost-benefit choice rarely allows (they are dead). The master crate's
/// `objects_forgotten_after_an_abandoned_replay_never_come_back` and the simulated
/// master's `a_replay_beside_an_abandoned_attempts_segments_fails_its_try_until_they_are_cleaned`
/// check the key itself.
///
/// The simulated master then came to drive the replicator's own cores (issue 40 item 1:
/// `ReplicaFailures`, `Settling`), which frees abandoned copies in the replicator's
/// order and leaves a backup that refused a close out a while: most seeds run anew.
/// Each fix undone again, 23, 32, 2286, 19, 1716, 3778, 1570, 10 and 11860 still fail;
/// 292 (297bcd6), 1747 and 5184 (footers in open copies), 20 (issue 39 item 1) and
/// 4997 (issue 39 item 2) no longer do. The first four were replaced by the smallest
/// seeds that do: 120 and 124 (297bcd6: 48 of the first 3,000 fail), 1579 and 2063
/// (footers: 19 of 20,000), 43 (issue 39 item 1: 65 of the first 2,000); 11860
/// is left for issue 39 item 2. With 83ab2b8 undone 315 of the first 2,000 fail, with
/// the abandoned open's fix 3 (26, 912, 1570). (15 passes with the ranking undone as
/// newest epoch first, before this change as after it; 19 fails.)
const REGRESSIONS: &[(u64, &str)] = &[
    (
        23,
        "a lost replica freed before its segment was whole: the last complete copy (83ab2b8)",
    ),
    (
        32,
        "a lost replica freed before its segment was whole: the last complete copy (83ab2b8)",
    ),
    (
        120,
        "a re-created frame cut short hid the closed copy on the backup's disk (297bcd6)",
    ),
    (
        124,
        "a re-created frame cut short hid the closed copy on the backup's disk (297bcd6)",
    ),
    (
        2286,
        "a replacing open zeroed the frame that held every acknowledged byte (2b1bbd5)",
    ),
    (
        15,
        "recovery ranked copies newest epoch first: a partial newest-epoch copy won",
    ),
    (
        19,
        "recovery ranked copies newest epoch first: a partial newest-epoch copy won",
    ),
    (
        1579,
        "recovery ignored the footer in open copies: the log never looked whole",
    ),
    (
        2063,
        "recovery ignored the footer in open copies: the log never looked whole",
    ),
    (
        1716,
        "tablets went live before the zombie's lease ran out: a stale read (the sim's live_after)",
    ),
    (
        3778,
        "tablets went live before the zombie's lease ran out: a stale read (the sim's live_after)",
    ),
    (
        1570,
        "a replica given up on after its open reached the backup was never freed: BackupFull",
    ),
    (
        10,
        "a deleted key's older version came back once the cleaner took its later versions' \
         segments and the tombstone's (issue 39 item 1, 8d89f9f)",
    ),
    (
        43,
        "a deleted key's older version came back once the cleaner took its later versions' \
         segments and the tombstone's (issue 39 item 1, 8d89f9f)",
    ),
    (
        11860,
        "an abandoned recovery's segments stayed in the log until the backups were full \
         (issue 39 item 2, 8d89f9f)",
    ),
];

fn run_seeds(seeds: impl Iterator<Item = u64>) -> (usize, Vec<Failure>) {
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
    let (passed, failures) = run_seeds(seeds);
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
