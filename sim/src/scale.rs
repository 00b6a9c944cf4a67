//! # Recovery at scale: one crash recovery of a cluster of up to thousands of servers
//!
//! [`simulate`] answers the operator's question "how long is my data unavailable when a
//! master of G GiB dies in a cluster of N servers?" without the cluster: the decisions
//! are Rampart's own code, the hardware is modelled, and the model's costs are
//! calibrated from `rampart bench recovery` ([`Costs`]).
//!
//! # What is real
//! [`plan`] makes every decision with the code the cluster runs:
//! * **placement** — each crashed master's segments placed by the master's real
//!   `BackupSelector` (R replicas in distinct failure domains; the primary by refinement
//!   over `CANDIDATES_K` random candidates weighted by disk speed, or pure random choice
//!   with [`Scenario::candidates`] = 1), seeded per master;
//! * **the will** — the master's real `Profiler` tracks its log (entries at random key
//!   hashes) and cuts it into partitions (`Profiler::will`), which the coordinator's real
//!   `partitions_for` turns into the recovery's partitions; the backups' real
//!   `PartitionIndex` accepts them (or refuses them, as a real backup would, past
//!   `RECOVERY_PARTITIONS_MAX`);
//! * **the log check and the read order** — what the live backups would list goes
//!   through the coordinator's real `check_log` (is the log complete, which segments)
//!   and `choose_sources_by_speed` (which copy of each segment each backup reads, in
//!   which order, balancing reads over every complete copy by disk speed);
//! * **who replays what** — the real `most_free` and `assign_partitions`, one partition
//!   at a time per recovery master (`RECOVERY_PARTITIONS_AT_ONCE`), and the lease rules
//!   (`LEASE_DEFAULT`, renewals every `LEASE_RENEW_INTERVAL`, `LEASE_MARGIN`): no
//!   partition goes live before the crashed master's lease has run out.
//!
//! # What is modelled
//! [`flow`] is a discrete-event simulation of the data's way through the cluster, as
//! fluid flows between events:
//! * each backup reads its share from its disk, one segment after another in the order
//!   `choose_sources_by_speed` gave (several recoveries at once: their reads interleaved), at its
//!   disk's read bandwidth;
//! * then splits each segment by partition on one core and sends the pieces (its NIC's
//!   send bandwidth bounds it);
//! * each recovery master takes the pieces of its partition as they are split (it keeps
//!   several fetches in flight and pieces are small, so it is never held by one slow
//!   backup while another has pieces ready) and replays them on one core — decoding,
//!   staging, appending, indexing and sending R copies — bounded by its NIC (receiving
//!   the pieces, sending R copies);
//! * a partition goes live a commit after it is replayed, and not before the crashed
//!   master's lease ran out.
//!
//! Cores are shared: every server has [`Host::PerServer`] cores of its own, or — to
//! check the model against a local cluster — all servers share one machine's cores
//! ([`Host::Shared`]); each busy pipeline wants a core and gets its fair share. Disks of
//! one cluster may differ in speed ([`Scenario::disk_spread`]); the selector knows each
//! one's speed, as the real one learns it from the server list.
//!
//! # Not modelled
//! Writes into backups' frames and their flushes to disk happen on other servers'
//! spare cores and in the background, so at scale they are off the recovery's path
//! (with one shared machine they are charged to the recovery masters' pipelines:
//! [`Costs::frame_ns_per_byte`]); switches and the network's core are assumed to carry
//! every NIC at full speed; failures during the recovery; the cleaner (a log is its
//! live data; dead entries would add to what is read and replayed).

pub mod flow;
pub mod loss;
mod model;
pub mod plan;

pub use model::{Costs, Host, Outcome, Scenario, GIB};

/// Simulates one recovery of `scenario` with `costs`.
pub fn simulate(scenario: &Scenario, costs: &Costs) -> Result<Outcome, String> {
    scenario.check()?;
    costs.check()?;
    let plan = plan::Plan::build(scenario)?;
    Ok(flow::run(scenario, costs, &plan))
}
