//! The data's way through the cluster during a recovery, as a discrete-event simulation
//! of fluid flows (see the parent module's *What is modelled*).
//!
//! Between two events every flow runs at a constant rate; an event is a flow reaching
//! the end of what it can do: a backup finishing the read or the split of a segment, a
//! recovery master finishing a partition or catching up with what the backups have split
//! so far. At each event the rates are worked out again: each busy pipeline wants a core
//! of its server (or of the one shared machine) and gets its fair share of the cores
//! there; a recovery master's NIC sends R copies of what it replays and receives what
//! it replays; a backup's NIC sends what it splits. Events less than [`STEP_MIN_NS`]
//! apart are taken together.
//!
//! [`run`] is synchronous and deterministic: the plan and the scenario's seed fix the
//! outcome.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

use super::model::{Costs, Host, Outcome, Scenario};
use super::plan::Plan;

/// Below this many bytes a flow counts as done (rates are recomputed in floating point).
const EPS_BYTES: f64 = 1e-3;

/// Events closer together than this (ns) are taken at once: a flow that would have
/// ended up to this much before the step's end ends at it, and the rest of its step is
/// lost, so each flow finishes late by at most this per segment or partition it goes
/// through (a few ms in a recovery of seconds). Without it, a thousand recovery masters
/// catching up with the backups one after another make a hundred thousand events of a
/// few ns each.
pub const STEP_MIN_NS: f64 = 100_000.0;

/// A segment of crash `crash`, at index `segment` of its plan, and what is left of it.
#[derive(Clone, Copy, Debug)]
struct Work {
    crash: usize,
    segment: usize,
    left: f64,
}

#[derive(Debug)]
struct Backup {
    host: usize,
    /// Bytes per ns.
    disk: f64,
    /// Segments still to read, in order.
    to_read: VecDeque<Work>,
    /// Segments read, to split; the front one is being split.
    to_split: VecDeque<Work>,
}

#[derive(Debug)]
struct Partition {
    crash: usize,
    master: usize,
    total: f64,
    /// Bytes the backups have split for it so far.
    available: f64,
    /// Bytes replayed.
    done: f64,
    /// When it was replayed (ns from the kill).
    finished: Option<f64>,
}

#[derive(Debug, Default)]
struct Master {
    /// Partitions waiting for their turn.
    queue: VecDeque<usize>,
    /// Partitions replaying.
    active: Vec<usize>,
}

/// Simulates the recovery `plan` of `scenario` (both checked) with `costs`.
pub fn run(scenario: &Scenario, costs: &Costs, plan: &Plan) -> Outcome {
    let n = scenario.servers;
    let r = scenario.replicas as f64;
    let (cores, shared) = match scenario.host {
        Host::PerServer { cores } => (cores, false),
        Host::Shared { cores } => (cores, true),
    };
    let host_of = |server: usize| if shared { 0 } else { server };
    let nic = if shared {
        f64::INFINITY
    } else {
        scenario.nic_gbps / 8.0 // Gbit/s → bytes per ns
    };
    // A replaying partition keeps one core busy with its pipeline; on one shared machine
    // the backups' frame writes for it run beside it on other cores.
    let replay_demand = if shared {
        (costs.replay_ns_per_byte + r * costs.frame_ns_per_byte) / costs.replay_ns_per_byte
    } else {
        1.0
    };

    let mut rng = SmallRng::seed_from_u64(scenario.seed ^ 0x1ea5e);
    let since_renewal = rng.gen_range(0.0..scenario.lease_renew_ms);
    let margin_ms = rampart_coordinator::proof_of_death::LEASE_MARGIN.as_secs_f64() * 1e3;
    // A proof of death found when the crash is detected ends the wait there
    // (`proof_of_death::lease_end`: the earlier of the lease's end and the proof).
    let lease_end_ms = if scenario.death_proven {
        costs
            .detection_ms
            .min((scenario.lease_ms - since_renewal + margin_ms).max(0.0))
    } else {
        (scenario.lease_ms - since_renewal + margin_ms).max(0.0)
    };
    let setup_ms = costs.detection_ms + costs.setup_ms + costs.setup_per_backup_us * n as f64 / 1e3;

    // Backups: each one's reads of every crash, interleaved (one reader per recovery).
    let mut backups: Vec<Backup> = (0..n)
        .map(|b| {
            let mut lists: Vec<VecDeque<Work>> = plan
                .crashes
                .iter()
                .enumerate()
                .map(|(crash, c)| {
                    c.reads[b]
                        .iter()
                        .map(|&segment| Work {
                            crash,
                            segment,
                            left: c.segment_bytes[segment] as f64,
                        })
                        .collect()
                })
                .collect();
            let mut to_read = VecDeque::new();
            while lists.iter().any(|l| !l.is_empty()) {
                for list in &mut lists {
                    if let Some(w) = list.pop_front() {
                        to_read.push_back(w);
                    }
                }
            }
            Backup {
                host: host_of(b),
                disk: plan.disk_bytes_per_ns[b],
                to_read,
                to_split: VecDeque::new(),
            }
        })
        .collect();
    let mut partitions: Vec<Partition> = Vec::new();
    let mut masters: Vec<Master> = (0..n).map(|_| Master::default()).collect();
    for (crash, c) in plan.crashes.iter().enumerate() {
        for (p, &master) in c.masters.iter().enumerate() {
            masters[master].queue.push_back(partitions.len());
            partitions.push(Partition {
                crash,
                master,
                total: c.partition_bytes[p] as f64,
                available: 0.0,
                done: 0.0,
                finished: None,
            });
        }
    }
    // Partitions of each crash, for handing out what a split yields.
    let mut of_crash: Vec<Vec<(usize, f64)>> = vec![Vec::new(); plan.crashes.len()];
    for (i, p) in partitions.iter().enumerate() {
        let c = &plan.crashes[p.crash];
        let at = of_crash[p.crash].len();
        of_crash[p.crash].push((i, c.fractions[at]));
    }
    for m in &mut masters {
        while m.active.len() < scenario.partitions_at_once {
            let Some(p) = m.queue.pop_front() else { break };
            m.active.push(p);
        }
    }

    let mut now = setup_ms * 1e6;
    let mut events = 0u64;
    let hosts = if shared { 1 } else { n };
    let mut demand = vec![0.0f64; hosts];
    let mut split_rate = vec![0.0f64; n];
    let mut replay_rate = vec![0.0f64; partitions.len()];
    loop {
        // Rates.
        demand.iter_mut().for_each(|d| *d = 0.0);
        for b in &backups {
            if !b.to_split.is_empty() {
                demand[b.host] += 1.0;
            }
        }
        for (server, m) in masters.iter().enumerate() {
            for &p in &m.active {
                if partitions[p].available - partitions[p].done > EPS_BYTES {
                    demand[host_of(server)] += replay_demand;
                }
            }
        }
        let share = |host: usize| (cores / demand[host].max(1e-9)).min(1.0);
        for (i, b) in backups.iter().enumerate() {
            split_rate[i] = (share(b.host) / costs.split_ns_per_byte).min(nic);
        }
        for (server, m) in masters.iter().enumerate() {
            let busy = m
                .active
                .iter()
                .filter(|&&p| partitions[p].available - partitions[p].done > EPS_BYTES)
                .count()
                .max(1) as f64;
            let by_nic = nic / (busy * r.max(1.0));
            for &p in &m.active {
                replay_rate[p] = (share(host_of(server)) / costs.replay_ns_per_byte).min(by_nic);
            }
        }

        // The next event.
        let mut dt = f64::INFINITY;
        for (i, b) in backups.iter().enumerate() {
            if let Some(w) = b.to_read.front() {
                dt = dt.min(if b.disk.is_infinite() {
                    0.0
                } else {
                    w.left / b.disk
                });
            }
            if let Some(w) = b.to_split.front() {
                dt = dt.min(w.left / split_rate[i]);
            }
        }
        for m in &masters {
            for &p in &m.active {
                let part = &partitions[p];
                let ready = part.available - part.done;
                if part.total - part.done <= EPS_BYTES {
                    dt = 0.0; // an empty partition: done as soon as it starts
                } else if ready > EPS_BYTES {
                    dt = dt.min(ready.min(part.total - part.done) / replay_rate[p]);
                }
            }
        }
        if !dt.is_finite() {
            break; // nothing left that can move: every partition is replayed
        }
        if dt > 0.0 {
            dt = dt.max(STEP_MIN_NS);
        }
        events += 1;
        now += dt;

        // Advance, and the events that end now.
        for (i, b) in backups.iter_mut().enumerate() {
            if let Some(w) = b.to_read.front_mut() {
                w.left -= if b.disk.is_infinite() {
                    w.left
                } else {
                    b.disk * dt
                };
                if w.left <= EPS_BYTES {
                    if let Some(mut w) = b.to_read.pop_front() {
                        w.left = plan.crashes[w.crash].segment_bytes[w.segment] as f64;
                        b.to_split.push_back(w);
                    }
                }
            }
            if let Some(w) = b.to_split.front_mut() {
                w.left -= split_rate[i] * dt;
                if w.left <= EPS_BYTES {
                    if let Some(w) = b.to_split.pop_front() {
                        let bytes = plan.crashes[w.crash].segment_bytes[w.segment] as f64;
                        for &(p, fraction) in &of_crash[w.crash] {
                            partitions[p].available += bytes * fraction;
                        }
                    }
                }
            }
        }
        for m in &mut masters {
            let mut finished = Vec::new();
            for &p in &m.active {
                let part = &mut partitions[p];
                if part.available - part.done > EPS_BYTES {
                    part.done = (part.done + replay_rate[p] * dt).min(part.available);
                }
                if part.total - part.done <= EPS_BYTES.max(part.total * 1e-12) {
                    part.finished = Some(now);
                    finished.push(p);
                }
            }
            m.active.retain(|p| !finished.contains(p));
            while m.active.len() < scenario.partitions_at_once {
                let Some(p) = m.queue.pop_front() else { break };
                m.active.push(p);
            }
        }
    }

    outcome(
        scenario,
        costs,
        plan,
        &partitions,
        setup_ms,
        lease_end_ms,
        events,
    )
}

/// The outcome of a finished run.
fn outcome(
    scenario: &Scenario,
    costs: &Costs,
    plan: &Plan,
    partitions: &[Partition],
    setup_ms: f64,
    lease_end_ms: f64,
    events: u64,
) -> Outcome {
    let n = scenario.servers;
    let r = scenario.replicas as f64;
    let finished: Vec<f64> = partitions
        .iter()
        .map(|p| p.finished.unwrap_or(f64::INFINITY) / 1e6)
        .collect();
    let mut live: Vec<f64> = finished
        .iter()
        .map(|&f| f.max(lease_end_ms) + costs.commit_ms)
        .collect();
    live.sort_by(f64::total_cmp);
    let replayed_ms = finished.iter().copied().fold(0.0, f64::max);
    let unavailability_ms = live.last().copied().unwrap_or(setup_ms) + costs.notice_ms;
    let median_partition_live_ms = live.get(live.len() / 2).copied().unwrap_or(setup_ms);

    let mut reads = vec![0usize; n];
    let mut read_bytes = vec![0f64; n];
    for c in &plan.crashes {
        for (b, list) in c.reads.iter().enumerate() {
            reads[b] += list.len();
            read_bytes[b] += list.iter().map(|&s| c.segment_bytes[s] as f64).sum::<f64>();
        }
    }
    let reading: Vec<usize> = reads.iter().copied().filter(|&k| k > 0).collect();
    let mut replay_bytes = vec![0f64; n];
    let mut per_master = vec![0usize; n];
    for p in partitions {
        replay_bytes[p.master] += p.total;
        per_master[p.master] += 1;
    }
    let nic = match scenario.host {
        Host::PerServer { .. } => scenario.nic_gbps / 8.0,
        Host::Shared { .. } => f64::INFINITY,
    };
    let max_of = |v: &mut dyn Iterator<Item = f64>| v.fold(0.0, f64::max);
    let bound_disk_ms = max_of(
        &mut read_bytes
            .iter()
            .zip(&plan.disk_bytes_per_ns)
            .map(|(bytes, disk)| bytes / disk / 1e6),
    );
    let bound_replay_ms = max_of(
        &mut replay_bytes
            .iter()
            .map(|bytes| bytes * costs.replay_ns_per_byte / 1e6),
    );
    let bound_nic_ms = max_of(
        &mut replay_bytes
            .iter()
            .map(|bytes| bytes * r.max(1.0))
            .chain(read_bytes.iter().copied())
            .map(|bytes| bytes / nic / 1e6),
    );
    Outcome {
        detection_ms: costs.detection_ms,
        setup_ms,
        replayed_ms,
        lease_end_ms,
        unavailability_ms,
        median_partition_live_ms,
        segments: plan.crashes.iter().map(|c| c.segment_bytes.len()).sum(),
        partitions: partitions.len(),
        recovery_masters: per_master.iter().filter(|&&k| k > 0).count(),
        partitions_per_master_max: per_master.iter().copied().max().unwrap_or(0),
        reads_per_backup_max: reading.iter().copied().max().unwrap_or(0),
        reads_per_backup_mean: reading.iter().sum::<usize>() as f64 / reading.len().max(1) as f64,
        bound_disk_ms,
        bound_replay_ms,
        bound_nic_ms,
        copysets: plan.crashes.iter().map(|c| c.copysets).sum(),
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{simulate, Costs, Host, Scenario};

    fn costs() -> Costs {
        Costs::development_vm()
    }

    #[test]
    fn one_disk_bound_recovery_takes_its_slowest_backup() {
        // 8 GiB over 100 servers with slow disks: the disks bound it, and the replay
        // ends within a few segments' reading after the slowest backup's share.
        let scenario = Scenario {
            disk_read_mbps: 50.0,
            ..Scenario::cluster(100, 8.0)
        };
        let o = simulate(&scenario, &costs()).unwrap();
        let from_setup = o.replayed_ms - o.setup_ms;
        assert!(
            from_setup >= o.bound_disk_ms && from_setup <= o.bound_disk_ms * 1.2,
            "{o:?}"
        );
        assert!(o.unavailability_ms > o.replayed_ms);
    }

    #[test]
    fn the_lease_holds_back_a_quick_replay() {
        let o = simulate(&Scenario::cluster(200, 0.5), &costs()).unwrap();
        assert!(o.replayed_ms < o.lease_end_ms, "{o:?}");
        let c = costs();
        assert!(
            (o.unavailability_ms - (o.lease_end_ms + c.commit_ms + c.notice_ms)).abs() < 1e-6,
            "{o:?}"
        );
    }

    #[test]
    fn a_proven_death_lets_a_quick_replay_go_live_when_replayed() {
        let c = costs();
        let proven = Scenario {
            death_proven: true,
            ..Scenario::cluster(200, 0.5)
        };
        let o = simulate(&proven, &c).unwrap();
        assert!((o.lease_end_ms - c.detection_ms).abs() < 1e-6, "{o:?}");
        let waited = simulate(&Scenario::cluster(200, 0.5), &c).unwrap();
        assert!(
            o.unavailability_ms < waited.unavailability_ms,
            "{o:?} {waited:?}"
        );
        assert!(
            o.median_partition_live_ms <= o.replayed_ms + c.commit_ms + 1e-6,
            "nothing holds a replayed partition but its commit: {o:?}"
        );
    }

    #[test]
    fn more_servers_recover_faster_until_the_fixed_costs() {
        let time = |servers| {
            simulate(&Scenario::cluster(servers, 16.0), &costs())
                .unwrap()
                .replayed_ms
        };
        let (t10, t100, t400) = (time(10), time(100), time(400));
        assert!(t10 > 4.0 * t100, "10: {t10} 100: {t100}");
        assert!(t100 > t400, "100: {t100} 400: {t400}");
    }

    #[test]
    fn a_shared_machine_is_bound_by_its_cores() {
        // On 2 shared cores the whole CPU work divides by 2, whatever the servers.
        let c = costs();
        let scenario = Scenario {
            host: Host::Shared { cores: 2.0 },
            replicas: 3,
            ..Scenario::cluster(6, 0.5)
        };
        let o = simulate(&scenario, &c).unwrap();
        let bytes = scenario.master_bytes as f64;
        let cpu_ms =
            bytes * (c.replay_ns_per_byte + c.split_ns_per_byte + 3.0 * c.frame_ns_per_byte) / 1e6;
        let took = o.replayed_ms - o.setup_ms;
        assert!(took >= cpu_ms / 2.0 * 0.98, "{took} vs {cpu_ms}/2");
        assert!(took <= cpu_ms / 2.0 * 1.3, "{took} vs {cpu_ms}/2");
    }

    #[test]
    fn one_seed_gives_one_outcome() {
        let scenario = Scenario {
            disk_spread: 0.3,
            crashed: 2,
            ..Scenario::cluster(50, 2.0)
        };
        let a = simulate(&scenario, &costs()).unwrap();
        let b = simulate(&scenario, &costs()).unwrap();
        assert_eq!(a, b);
    }
}
