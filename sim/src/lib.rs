//! # rampart-sim: deterministic simulation of replication and crash recovery
//!
//! One seed fixes a whole run: one to three masters serve a table whose tablets the
//! coordinators spread over them, and take a random workload of writes and removes
//! ([`workload`]: keys written and removed at random, and in some runs keys deleted for
//! good — written beside cold data, overwritten 1–3 times, removed and never written
//! again); they replicate their logs to simulated backups while the world drops and
//! loses messages (or holds requests back and delivers them late, after the master gave
//! up on them), takes backups down for a while or for good, leaves the coordinators
//! without a leader, and kills masters — while they write or while idle — or declares
//! them crashed while they keep running (zombies, cut off from the coordinators, their
//! lease running on). Every crash is recovered into the surviving masters or a spare,
//! which replicate what they replayed and serve the tablets once the crashed master's
//! lease ran out — a recovery master may be told to abandon a partition halfway through
//! its replay, forget it and clean it out of its log, and the partition is tried again,
//! elsewhere or there later; a recovery master's own clients send it batches between
//! the pieces of a replay, and in one seed in four the master that owns a partition it
//! abandoned a try of is killed soon after (`SimConfig::with_leftovers`); clients read
//! between batches (some with a stale tablet
//! map, from a zombie), and after every recovery every key is read from its owner and
//! checked against what clients were told and read before ([`checker`]: a key whose
//! removal was acknowledged or read must stay absent). Every write carries the client's
//! exactly-once identity (`rampart_common::rifl`): one whose batch stopped after
//! staging it is retried, with that identity, on whichever master serves its key next,
//! and must be answered from its completion record if it applied before (on the crashed
//! master, the record replayed with the object) rather than applied again — retried
//! with fresh identities instead, a quarter of the seeds fail. At the end, every client
//! operation of the run is checked for linearizability with `rampart_check`, the
//! drill's checker (real-time order, reject rules, versions that increase across
//! removes and recoveries). A failing seed prints itself and replays exactly:
//! `rampart simulate --seed N --trace`.
//!
//! # What is real and what is simulated
//! The protocol decisions are Rampart's own code, not models of it:
//! * each master's store is a real `ObjectStore` (staging with versions below a
//!   ceiling reserved at the coordinators, tablets, reads, tombstones, the recovery
//!   replay `stage_replay`, the forgetting of an abandoned attempt `forget_unowned`
//!   with its tainted segments, `close_tainted_head` and `tainted_held`, the cleaner's
//!   passes: `plan_cleaning`, `clean_step`, `commit_cleaning`, `free_cleaned`, run
//!   between batches at random points with random step sizes and pass lengths,
//!   `SimConfig::clean_p` — in some runs after every batch, in many small steps — and
//!   after a forget as the appender runs them), its log a real `SegmentedLog`
//!   (entries, tombstones of removed and of overwritten versions, Tailwind checksums,
//!   digests — later ones too — footers, rollovers, survivors);
//! * each segment's replicas are a real `SegmentReplicas` (placement, epochs, bumps,
//!   the epoch recorded at the coordinator, closes, frees), driven through the
//!   replicator's own cores: `RangeWrite`, `Creation` and `Upkeep` (the order of its
//!   calls: a range's write, a replica's creation, the upkeep round between batches),
//!   `Settling` (the next effect a segment needs), `ReplicaFailures` (what a failed
//!   call loses, exclusions, the copies to free) and `placement` with a real
//!   `BackupSelector`;
//! * each backup's steps of a fence, a close and a free are the backup's own
//!   (`rampart_backup::fencing`, `rampart_backup::lifecycle`), and so are its recovery
//!   listing and replica read-back (`rampart_backup::held_replicas`);
//! * the coordinators' state is the real `CoordinatorState` (enlistment, the table's
//!   tablets, crash declarations, `SetOpenEpoch` with its two-segment bound and its
//!   refusal once the master is crashed, `ReserveVersions`, `RecoveredPartition` with
//!   the version ceiling it hands on, and in the world of [`run_splitting`]
//!   `SplitTablet`, its halves pulled by the owner into its store through the real
//!   `replace_tablets`, or not at all when the push is lost);
//! * each master's lease is the real `Lease` on simulated time (`ManualClock`), and the
//!   recovery waits out the lease and `LEASE_MARGIN` before tablets go live elsewhere,
//!   unless the master's death is proven (`lease_end` and `Proofs`, the coordinator's
//!   own `proof_of_death`): in the world of [`run_proving_death`], a killed master's
//!   port refuses and its supervisor may report its exit, a zombie may be cut off by a
//!   rule that refuses its port, and what counts as proof is drawn per seed;
//! * each backup's decisions about its frames are the real `FrameTable` of
//!   `rampart-backup` (opens and the replacing open that keeps a slot's bytes, epoch
//!   checks, writes, bumps, closes, frees with their epoch bound, fences and fenced
//!   lengths, which frame shadows a stored copy, the slot a flushed replica stays
//!   readable from);
//! * backups' listings use the real log scanner; the recovery's choice of copies and
//!   partitions is the real `recovery_plan` (`check_log`, `choose_sources`,
//!   `partitions_for`); the copies are cut into pieces by the backups' real
//!   `split_replica` and checked by the recovery masters' real `RecoveryPiece::parse`.
//!
//! Around them, thin synchronous drivers stand in for the async ones ([`master`] for
//! the appender, `Replicator` and the recovery master's `Recover` and abandon,
//! [`crash_recovery`] and [`cluster`] for the coordinator's recovery driver and its
//! `PartitionTries`, [`backup`] for the backup's frames, store and request handlers:
//! frame slots and the disk are bytes in memory, under the real store's write and free
//! rules). The network, the clock and the faults are the [`world`].
//!
//! # Why an executor of our own, not `madsim` or `turmoil`
//! The cores are synchronous state machines (STYLE.md habit 8), so a seeded loop over
//! them needs no async runtime at all: no crate to adopt, runs of a few milliseconds
//! (thousands of seeds a minute on two cores), and exact replay. `madsim` would replace
//! tokio in every crate behind a `cfg`, yet could not make the real drivers
//! deterministic as they stand: `raft-engine` writes from its own threads, frames are
//! shared memory mapped by two processes with pidfd liveness, and the drivers read
//! `std::time`. `turmoil` simulates TCP between hosts, but a third of the replication
//! is one-sided writes into shared memory and the interesting faults are between a
//! write and its fence. Running the real async drivers under simulation needs the RPC
//! layer over an injected network and time from an injected clock first (STYLE.md
//! habit 10); that is the next layer, not this one.
//!
//! # Recovery at scale
//! [`scale`] is another kind of simulation: not of correctness but of time. It simulates
//! one crash recovery of a cluster of up to thousands of servers — the placement, will and
//! recovery plan made by the same real code, disks, NICs and cores modelled, costs
//! calibrated from `rampart bench recovery` — to predict how long the data is unavailable
//! (`rampart simulate --servers N`).
//!
//! # Not simulated yet
//! One table; the end of a recovery freeing the crashed master's replicas on the backups
//! (`EndRecovery`: its fenced frames stay) and its `FinishRecovery` (an abandon always
//! reaches its master, before the next try starts); backups that restart under a new id;
//! several recoveries at once, so a recovery master that crashes during its replay (one
//! that is told to abandon it is simulated); the coordinators' own crashes beyond
//! windows without a leader (their Raft log is not simulated); the real async drivers
//! (`Replicator`, the coordinator's recovery task) under an injected network and clock.
//! In the splitting world: splits during a recovery (a recovery runs whole between two
//! batches), a lost split push caught up by a lease renewal (the owner serves the
//! whole tablet until a later change), and wills (each tablet is its own partition, so
//! the profiler's inheritance on a split is not exercised here).

pub mod backup;
pub mod checker;
pub mod cluster;
mod config;
pub mod crash_recovery;
pub mod master;
pub mod scale;
pub mod trace;
pub mod workload;
pub mod world;

pub use config::SimConfig;

use std::fmt;

use cluster::Cluster;
use world::{Crash, World};

/// A run that passed its checks.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    /// Masters at the end (spares included).
    pub masters: usize,
    /// Operations appended, and acknowledged to their clients.
    pub appended: usize,
    pub acknowledged: usize,
    /// Reads checked (between batches, and of every key after each recovery).
    pub reads: usize,
    /// Client operations checked for linearizability, and of them of unknown outcome
    /// (their batch stopped after staging them).
    pub linearizable_ops: usize,
    pub unknown_ops: usize,
    /// The crashes recovered, in order: killed, or declared crashed while running.
    pub crashes: Vec<Crash>,
    /// Partitions replayed by recovery masters.
    pub partitions: usize,
    /// Tries of a partition that failed on a recovery master (abandoned by the
    /// coordinator, or refused by the master) and went to another try.
    pub partition_tries_failed: usize,
    /// Writes of unknown outcome that the client retried with their identities and
    /// was answered, and of them those answered from a completion record (they had
    /// applied before, on the crashed master or here) rather than applied then.
    pub retries_answered: usize,
    pub retries_from_record: usize,
    /// Objects the live masters serve at the end.
    pub objects: usize,
    /// Simulated time at the end, µs.
    pub time_us: u64,
    /// Events in the trace, and the CRC32 of all of them: equal for two runs of one
    /// seed.
    pub events: usize,
    pub trace_crc32: u32,
    /// Requests that reached a backup after their sender gave up on them.
    pub late_delivered: usize,
    /// Segments the masters' cleaners freed.
    pub segments_cleaned: usize,
    /// Every event of the run.
    pub trace: Vec<String>,
}

/// A run that failed a check: the seed replays it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    /// The `rampart simulate` flag of the seed's world ("" for the plain one), so that
    /// the replay runs the same world.
    pub world: &'static str,
    pub why: String,
    /// Every event of the run.
    pub trace: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation seed {} failed: {}\n  replay it: cargo run -p rampart-ops -- simulate{} --seed {} --trace",
            self.seed, self.why, self.world, self.seed
        )
    }
}

/// Runs seed `seed` and checks it.
pub fn run(seed: u64) -> Result<Report, Failure> {
    run_config(SimConfig::for_seed(seed), seed, "")
}

/// Runs seed `seed` of the world where a crashed master's death may be proven
/// ([`SimConfig::proving_death`]: the coordinator's `proof_of_death` rules, with
/// killed masters whose ports refuse and whose supervisors may report them, and
/// zombies cut off by rules that refuse their ports), and checks it.
pub fn run_proving_death(seed: u64) -> Result<Report, Failure> {
    run_config(SimConfig::proving_death(seed), seed, " --proving-death")
}

/// Runs seed `seed` of the world where the coordinators split tablets while the
/// workload runs ([`SimConfig::splitting`]), and checks it.
pub fn run_splitting(seed: u64) -> Result<Report, Failure> {
    run_config(SimConfig::splitting(seed), seed, " --splitting")
}

/// Runs `config` from seed `seed` and checks it; `flag` names its world.
fn run_config(config: SimConfig, seed: u64, flag: &'static str) -> Result<Report, Failure> {
    let mut world = World::new(config.clone(), seed);
    world.note(format!("{config:?}"));
    let result = Cluster::new(&mut world).and_then(|mut cluster| {
        cluster.run(&mut world)?;
        Ok(cluster)
    });
    let cluster = match result {
        Ok(cluster) => cluster,
        Err(why) => {
            return Err(Failure {
                seed,
                world: flag,
                why,
                trace: world.trace,
            })
        }
    };
    Ok(Report {
        seed,
        masters: cluster.masters.len(),
        appended: cluster.history.len(),
        acknowledged: cluster.history.acknowledged(),
        reads: cluster.history.reads(),
        linearizable_ops: cluster.history.recorded().0,
        unknown_ops: cluster.history.recorded().1,
        crashes: cluster.crashes.clone(),
        partitions: cluster.partitions_recovered,
        partition_tries_failed: cluster.partition_tries_failed,
        retries_answered: cluster.retries_answered,
        retries_from_record: cluster.retries_from_record,
        objects: cluster.objects(&world),
        time_us: world.now_us,
        events: world.trace.len(),
        trace_crc32: world
            .trace
            .iter()
            .fold(crc32fast::Hasher::new(), |mut crc, line| {
                crc.update(line.as_bytes());
                crc
            })
            .finalize(),
        late_delivered: world.late_delivered,
        segments_cleaned: world.segments_cleaned,
        trace: world.trace,
    })
}
