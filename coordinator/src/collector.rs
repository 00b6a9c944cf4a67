//! `Collector`: the leader's garbage collection of replicas on backups
//! (docs/design.md §7, "Collecting replicas nobody needs").
//!
//! A recovery frees the crashed master's replicas on the backups that are up when it
//! ends, and a drain frees the drained master's the same way; a backup that was down or
//! unreachable then keeps them, across its restarts too (it stores them). So every
//! collection interval, while this member leads, the collector lists the replicas each
//! `Up` backup holds (`ListReplicas`) and frees there, master by master (`EndRecovery`,
//! which also fences the master there for good), those whose master the state machine
//! has `Removed`: recovered or drained, nothing reads them again ([`removed_masters`]).
//!
//! The list is taken before the state is read, so a master counted is one the state
//! knew when the backup answered. Replicas of masters the state does not know (another
//! cluster's, on a reused data directory) are left alone: no rule of this cluster says
//! nobody needs them.
//!
//! Replicas of a master that is `Up` are its to judge: the collector asks it which of
//! the segments the backup holds it no longer needs there (`UnneededReplicas`: gone from
//! its log, or whole elsewhere with none of its live replicas on that backup —
//! `master::replica_manager::segment_replicas::unneeded_on`), and frees those
//! (`FreeReplica`, bounded by the epoch listed: a replacement the master placed there
//! since, at a newer epoch, is spared). A master that does not answer keeps them until
//! the next collection.

use rampart_common::ids::ServerId;
use rampart_common::ids::{Epoch, SegmentId};
use rampart_common::protocol::backup::{
    EndRecovery, EndRecoveryRequest, FreeReplica, FreeReplicaRequest, ListReplicas,
    ListReplicasRequest, ReplicaInfo,
};
use rampart_common::protocol::master::{
    UnneededReplicas, UnneededReplicasRequest, UNNEEDED_SEGMENTS_MAX,
};
use rampart_common::rpc::RpcPool;
use rampart_common::tablet::ServerStatus;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::node::RaftNode;
use crate::state::CoordinatorState;

/// How often the leader collects, unless configured otherwise.
pub const COLLECT_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);

/// Deadline of each call to a backup.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The leader's collector; see the module doc.
#[derive(Debug)]
pub struct Collector {
    node: RaftNode,
    pool: Arc<RpcPool>,
    interval: Duration,
}

impl Collector {
    /// The collector of `node`'s cluster, calling backups through `pool` every
    /// `interval`.
    pub fn new(node: RaftNode, pool: Arc<RpcPool>, interval: Duration) -> Collector {
        Collector {
            node,
            pool,
            interval,
        }
    }

    /// While this member leads, a collection every interval. Runs until aborted.
    pub async fn run(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.interval).await;
            if self.node.leader_term().is_some() {
                self.collect().await;
            }
        }
    }

    /// One collection over every `Up` backup; returns the replicas freed.
    pub async fn collect(&self) -> u64 {
        let backups: Vec<(ServerId, String)> = self.node.with_state(|state| {
            state
                .up_servers()
                .into_iter()
                .filter(|s| s.services.backup)
                .map(|s| (s.id, s.addr.clone()))
                .collect()
        });
        let mut freed = 0;
        for (backup, addr) in backups {
            let deadline = Instant::now() + CALL_TIMEOUT;
            let request = ListReplicasRequest { master: None };
            let listed = match self
                .pool
                .call::<ListReplicas>(&addr, &request, deadline)
                .await
            {
                Ok(list) => list.replicas,
                Err(error) => {
                    tracing::debug!(%backup, %error, "replicas not listed; collected next time");
                    continue;
                }
            };
            // After the list: the state knows every master the list names.
            let (garbage, live) = self.node.with_state(|state| {
                (
                    removed_masters(state, listed.iter().map(|replica| replica.master)),
                    live_masters(state, backup, &listed),
                )
            });
            for master in garbage {
                let request = EndRecoveryRequest { master };
                let deadline = Instant::now() + CALL_TIMEOUT;
                match self
                    .pool
                    .call::<EndRecovery>(&addr, &request, deadline)
                    .await
                {
                    Ok(reply) => {
                        freed += u64::from(reply.freed);
                        tracing::info!(%backup, %master, freed = reply.freed, "replicas of a removed master collected");
                    }
                    Err(error) => {
                        tracing::debug!(%backup, %master, %error, "replicas not collected; collected next time")
                    }
                }
            }
            for (master, (master_addr, replicas)) in live {
                freed += self
                    .collect_unneeded(backup, &addr, master, &master_addr, &replicas)
                    .await;
            }
        }
        freed
    }

    /// Asks `master` (at `master_addr`) which of its `replicas` on `backup` (at `addr`)
    /// it no longer needs, and frees those there; returns how many.
    async fn collect_unneeded(
        &self,
        backup: ServerId,
        addr: &str,
        master: ServerId,
        master_addr: &str,
        replicas: &BTreeMap<SegmentId, Epoch>,
    ) -> u64 {
        let segments: Vec<SegmentId> = replicas
            .keys()
            .copied()
            .take(UNNEEDED_SEGMENTS_MAX)
            .collect();
        let request = UnneededReplicasRequest { backup, segments };
        let deadline = Instant::now() + CALL_TIMEOUT;
        let unneeded = match self
            .pool
            .call::<UnneededReplicas>(master_addr, &request, deadline)
            .await
        {
            Ok(reply) => reply.segments,
            Err(error) => {
                tracing::debug!(%backup, %master, %error, "not asked which replicas it needs; next time");
                return 0;
            }
        };
        let mut freed = 0;
        for segment in unneeded {
            // Only what was asked about, at most at the epoch listed.
            let Some(&epoch_max) = replicas.get(&segment) else {
                continue;
            };
            let request = FreeReplicaRequest {
                master,
                segment,
                epoch_max,
            };
            let deadline = Instant::now() + CALL_TIMEOUT;
            match self
                .pool
                .call::<FreeReplica>(addr, &request, deadline)
                .await
            {
                Ok(reply) if reply.freed => freed += 1,
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%backup, %master, %segment, %error, "replica not freed; next time");
                }
            }
        }
        if freed > 0 {
            tracing::info!(%backup, %master, freed, "replicas a live master no longer needs collected");
        }
        freed
    }
}

/// The `Up` masters other than `backup` whose replicas `listed` (what `backup` holds)
/// names, each with its address and the segments held there at their epochs.
pub fn live_masters(
    state: &CoordinatorState,
    backup: ServerId,
    listed: &[ReplicaInfo],
) -> BTreeMap<ServerId, (String, BTreeMap<SegmentId, Epoch>)> {
    let mut live: BTreeMap<ServerId, (String, BTreeMap<SegmentId, Epoch>)> = BTreeMap::new();
    for replica in listed {
        if replica.master == backup {
            continue;
        }
        let Some(server) = state
            .server(replica.master)
            .filter(|s| s.status == ServerStatus::Up && s.services.master)
        else {
            continue;
        };
        let entry = live
            .entry(replica.master)
            .or_insert_with(|| (server.addr.clone(), BTreeMap::new()));
        entry.1.insert(replica.segment, replica.epoch);
    }
    live
}

/// The masters among `listed` (those a backup holds replicas of) that `state` has
/// removed: recovered or drained, so that nothing reads their replicas again.
pub fn removed_masters(
    state: &CoordinatorState,
    listed: impl IntoIterator<Item = ServerId>,
) -> BTreeSet<ServerId> {
    listed
        .into_iter()
        .filter(|&master| {
            state
                .server(master)
                .is_some_and(|s| s.status == ServerStatus::Removed)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use rampart_common::tablet::Services;

    #[test]
    fn only_removed_masters_replicas_are_garbage() {
        let mut state = CoordinatorState::new();
        for i in 0..4 {
            state.apply(&Command::EnlistServer {
                addr: format!("h{i}:1"),
                services: Services {
                    master: true,
                    backup: true,
                },
                failure_domain: "rack".into(),
                disk_read_mbps: 100,
            });
        }
        let (up, crashed, removed, unknown) = (ServerId(1), ServerId(2), ServerId(3), ServerId(77));
        for (id, status) in [
            (crashed, ServerStatus::Crashed),
            (removed, ServerStatus::Crashed),
            (removed, ServerStatus::Removed),
        ] {
            state.apply(&Command::SetServerStatus { id, status });
        }
        let listed = [up, crashed, removed, removed, unknown];
        assert_eq!(
            removed_masters(&state, listed),
            BTreeSet::from([removed]),
            "a crashed master's recovery may still read them; an unknown one is not ours"
        );
        let replica = |master: ServerId, segment: u64, epoch: u64| ReplicaInfo {
            master,
            segment: SegmentId(segment),
            epoch: Epoch(epoch),
            length: 0,
            closed: true,
        };
        let listed = [
            replica(up, 3, 1),
            replica(up, 4, 2),
            replica(crashed, 1, 1),
            replica(removed, 1, 1),
            replica(unknown, 1, 1),
        ];
        let live = live_masters(&state, ServerId(4), &listed);
        assert_eq!(
            live.keys().copied().collect::<Vec<_>>(),
            vec![up],
            "only up masters judge"
        );
        assert_eq!(
            live[&up].1,
            BTreeMap::from([(SegmentId(3), Epoch(1)), (SegmentId(4), Epoch(2))])
        );
        assert!(
            live_masters(&state, up, &listed).is_empty(),
            "no master judges its own server"
        );
    }
}
