//! A Raft group of coordinators in one process, talking over loopback RPC: election,
//! replication, leader loss, restarts from disk, snapshots, a minority that refuses, and
//! the leader's verification of reported failures.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_common::protocol::coordinator::{
    GetTabletMap, NotLeaderHint, RaftStatus, RaftStatusRequest, TabletMapRequest,
};
use rampart_common::rpc::{RpcError, RpcPool, RpcServer};
use rampart_common::status::Status;
use rampart_common::tablet::Services;
use rampart_coordinator::node::{NodeConfig, NodeError, RaftNode, Seed};
use rampart_coordinator::proof_of_death::ProofOfDeath;
use rampart_coordinator::{Command, CommandResult, CoordinatorService, CoordinatorState};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long a test waits for an election or for members to converge.
const SETTLE: Duration = Duration::from_secs(10);

struct Member {
    node: RaftNode,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
}

struct Group {
    peers: BTreeMap<u64, String>,
    dirs: BTreeMap<u64, PathBuf>,
    snapshot_entries: u64,
    seed: Option<Seed>,
    members: BTreeMap<u64, Member>,
    _root: tempfile::TempDir,
}

impl Group {
    async fn start(size: u64, snapshot_entries: u64) -> Group {
        let root = tempfile::TempDir::new().unwrap();
        let mut listeners = BTreeMap::new();
        for id in 1..=size {
            listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let peers: BTreeMap<u64, String> = listeners
            .iter()
            .map(|(id, l)| (*id, l.local_addr().unwrap().to_string()))
            .collect();
        let dirs = peers
            .keys()
            .map(|id| (*id, root.path().join(format!("coordinator-{id}"))))
            .collect();
        let mut group = Group {
            peers,
            dirs,
            snapshot_entries,
            seed: None,
            members: BTreeMap::new(),
            _root: root,
        };
        for (id, listener) in listeners {
            group.serve(id, listener);
        }
        group
    }

    fn config(&self, id: u64) -> NodeConfig {
        let mut config = NodeConfig::new(id, self.peers.clone(), self.dirs[&id].clone());
        config.snapshot_entries = self.snapshot_entries;
        config.seed = self.seed.clone();
        config
    }

    fn serve(&mut self, id: u64, listener: TcpListener) {
        let node = RaftNode::start(self.config(id), tokio::runtime::Handle::current()).unwrap();
        let service = Arc::new(CoordinatorService::new(node.clone()));
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            RpcServer::run(listener, service, async {
                let _ = stopped.await;
            })
            .await;
        });
        self.members.insert(
            id,
            Member {
                node,
                stop: Some(stop),
                served,
            },
        );
    }

    /// Stops member `id` as a crash would: its listener and connections close, its Raft
    /// thread ends; what it synced stays on disk.
    async fn stop(&mut self, id: u64) {
        let mut member = self.members.remove(&id).unwrap();
        let _ = member.stop.take().unwrap().send(());
        let _ = (&mut member.served).await;
        let node = member.node.clone();
        tokio::task::spawn_blocking(move || node.stop())
            .await
            .unwrap();
    }

    /// Stops every member but `kept`, as [`stop`](Self::stop) does; returns their ids.
    async fn stop_all_but(&mut self, kept: u64) -> Vec<u64> {
        let others: Vec<u64> = self
            .peers
            .keys()
            .copied()
            .filter(|id| *id != kept)
            .collect();
        for &id in &others {
            self.stop(id).await;
        }
        others
    }

    async fn restart(&mut self, id: u64) {
        let addr = self.peers[&id].clone();
        let listener = TcpListener::bind(&addr).await.unwrap();
        self.serve(id, listener);
    }

    fn node(&self, id: u64) -> &RaftNode {
        &self.members[&id].node
    }

    /// Waits until exactly one running member leads and the others follow it.
    async fn leader(&self) -> u64 {
        let deadline = Instant::now() + SETTLE;
        loop {
            let leaders: Vec<u64> = self
                .members
                .iter()
                .filter(|(_, m)| m.node.is_leader())
                .map(|(id, _)| *id)
                .collect();
            if let [leader] = leaders.as_slice() {
                let agreed = self
                    .members
                    .values()
                    .all(|m| m.node.status().leader_id == *leader);
                if agreed {
                    return *leader;
                }
            }
            assert!(Instant::now() < deadline, "no leader within {SETTLE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every running member's state machine equals the leader's.
    async fn converged(&self) -> CoordinatorState {
        let deadline = Instant::now() + SETTLE;
        loop {
            let leader = self.leader().await;
            let state = self.node(leader).with_state(CoordinatorState::clone);
            if self
                .members
                .values()
                .all(|m| m.node.with_state(|s| *s == state))
            {
                return state;
            }
            assert!(Instant::now() < deadline, "members did not converge");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop_all(&mut self) {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        for id in ids {
            self.stop(id).await;
        }
    }
}

fn enlist(addr: &str) -> Command {
    Command::EnlistServer {
        addr: addr.to_string(),
        services: Services {
            master: true,
            backup: true,
        },
        failure_domain: String::new(),
        disk_read_mbps: 500,
    }
}

fn create(name: &str) -> Command {
    Command::CreateTable {
        name: name.to_string(),
        span: 2,
    }
}

/// Proposes on the current leader, retrying through elections, until `SETTLE`.
async fn propose(group: &Group, command: Command) -> CommandResult {
    let deadline = Instant::now() + SETTLE;
    loop {
        let leader = group.leader().await;
        match group.node(leader).propose(command.clone()).await {
            Ok(result) => return result,
            Err(e) => assert!(Instant::now() < deadline, "proposal failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_one_leader_and_apply_the_same_changes() {
    let mut group = Group::start(3, 10_000).await;
    let leader = group.leader().await;
    assert!(matches!(
        propose(&group, enlist("127.0.0.1:9001")).await,
        CommandResult::Enlisted { .. }
    ));
    assert!(matches!(
        propose(&group, create("t")).await,
        CommandResult::TableCreated { created: true, .. }
    ));
    let state = group.converged().await;
    assert_eq!(state.version(), 2);
    assert!(state.table_id("t").is_some());

    // A follower refuses proposals and reads, naming the leader.
    let follower = *group.peers.keys().find(|id| **id != leader).unwrap();
    let refused = group.node(follower).propose(create("u")).await;
    let hint = NotLeaderHint::Leader {
        id: leader,
        addr: group.peers[&leader].clone(),
    };
    assert_eq!(refused, Err(NodeError::NotLeader(hint.clone())));
    assert_eq!(
        group.node(follower).read_barrier().await,
        Err(NodeError::NotLeader(hint))
    );
    // Over RPC: NotLeader with the hint in the detail; the leader serves the map.
    let pool = RpcPool::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    match pool
        .call::<GetTabletMap>(&group.peers[&follower], &TabletMapRequest {}, deadline)
        .await
    {
        Err(RpcError::Status { status, detail, .. }) => {
            assert_eq!(status, Status::NotLeader);
            assert_eq!(
                NotLeaderHint::parse(&detail).leader_addr(),
                Some(group.peers[&leader].as_str())
            );
        }
        other => panic!("expected NotLeader, got {other:?}"),
    }
    let map = pool
        .call::<GetTabletMap>(&group.peers[&leader], &TabletMapRequest {}, deadline)
        .await
        .unwrap();
    assert_eq!(map.version, 2);
    let status = pool
        .call::<RaftStatus>(&group.peers[&follower], &RaftStatusRequest {}, deadline)
        .await
        .unwrap();
    assert_eq!((status.id, status.leader_id), (follower, leader));
    assert_eq!(status.role, "follower");
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_leader_elects_another_and_loses_nothing_committed() {
    let mut group = Group::start(3, 10_000).await;
    propose(&group, enlist("127.0.0.1:9001")).await;
    for i in 0..5 {
        propose(&group, create(&format!("before-{i}"))).await;
    }
    let before = group.converged().await;
    let old = group.leader().await;
    group.stop(old).await;
    let new = group.leader().await;
    assert_ne!(new, old);
    // A new leader serves reads before its first entry committed (raft-rs drops a
    // ReadIndex until then; the node holds it instead of losing it).
    tokio::time::timeout(SETTLE, group.node(new).read_barrier())
        .await
        .expect("a read on a new leader never completed")
        .unwrap();
    let survivor = group.node(new).with_state(CoordinatorState::clone);
    assert_eq!(
        survivor, before,
        "a committed change was lost with the leader"
    );
    for i in 0..5 {
        propose(&group, create(&format!("after-{i}"))).await;
    }
    // The old leader comes back from its disk and catches up.
    group.restart(old).await;
    let state = group.converged().await;
    assert_eq!(state.version(), before.version() + 5);
    assert!(state.table_id("before-4").is_some() && state.table_id("after-4").is_some());
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_group_restarted_from_disk_has_its_state_back() {
    let mut group = Group::start(3, 7).await;
    propose(&group, enlist("127.0.0.1:9001")).await;
    for i in 0..20 {
        propose(&group, create(&format!("t{i}"))).await;
    }
    let before = group.converged().await;
    group.stop_all().await;
    for id in 1..=3 {
        group.restart(id).await;
    }
    let after = group.converged().await;
    assert_eq!(after, before);
    // Snapshots were taken (every 7 entries) and the log compacted behind them.
    let leader = group.leader().await;
    assert!(group.node(leader).status().snapshot_index > 0);
    propose(&group, create("more")).await;
    assert_eq!(group.converged().await.version(), before.version() + 1);
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_far_behind_catches_up_from_a_snapshot() {
    let mut group = Group::start(3, 5).await;
    propose(&group, enlist("127.0.0.1:9001")).await;
    let leader = group.leader().await;
    let behind = *group.peers.keys().find(|id| **id != leader).unwrap();
    group.stop(behind).await;
    for i in 0..30 {
        propose(&group, create(&format!("t{i}"))).await;
    }
    let leader = group.leader().await;
    assert!(
        group.node(leader).status().snapshot_index > 2,
        "the leader compacted the entries the stopped member lacks"
    );
    group.restart(behind).await;
    let state = group.converged().await;
    assert!(state.table_id("t29").is_some());
    assert!(group.node(behind).status().snapshot_index > 0);
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_survivor_refuses_changes_and_reads() {
    let mut group = Group::start(3, 10_000).await;
    propose(&group, enlist("127.0.0.1:9001")).await;
    let leader = group.leader().await;
    // Keep the leader: the survivor that believed itself leader must step down too.
    group.stop_all_but(leader).await;
    let survivor = group.node(leader).clone();
    let deadline = Instant::now() + SETTLE;
    while survivor.is_leader() {
        assert!(
            Instant::now() < deadline,
            "a leader without a majority kept leading"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let version = survivor.with_state(|s| s.version());
    match survivor.propose(create("lost")).await {
        Err(NodeError::NotLeader(NotLeaderHint::Unknown { why })) => {
            assert!(why.contains("majority"), "{why}");
        }
        other => panic!("expected NotLeader without a leader, got {other:?}"),
    }
    assert!(matches!(
        survivor.read_barrier().await,
        Err(NodeError::NotLeader(_))
    ));
    assert_eq!(survivor.with_state(|s| s.version()), version);
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_is_refused_under_another_id_or_other_peers() {
    let root = tempfile::TempDir::new().unwrap();
    let dir = root.path().join("c");
    let peers: BTreeMap<u64, String> = (1..=3).map(|i| (i, format!("127.0.0.1:{i}"))).collect();
    let handle = tokio::runtime::Handle::current();
    let node = RaftNode::start(
        NodeConfig::new(1, peers.clone(), dir.clone()),
        handle.clone(),
    )
    .unwrap();
    tokio::task::spawn_blocking(move || node.stop())
        .await
        .unwrap();
    let wrong_id = RaftNode::start(
        NodeConfig::new(2, peers.clone(), dir.clone()),
        handle.clone(),
    )
    .unwrap_err();
    assert!(wrong_id.to_string().contains("belongs to"), "{wrong_id}");
    let mut five = peers.clone();
    five.insert(4, "127.0.0.1:4".into());
    five.insert(5, "127.0.0.1:5".into());
    let wrong_peers =
        RaftNode::start(NodeConfig::new(1, five, dir.clone()), handle.clone()).unwrap_err();
    assert!(wrong_peers.to_string().contains("voters"), "{wrong_peers}");
    let not_member = RaftNode::start(NodeConfig::new(9, peers, dir), handle).unwrap_err();
    assert!(not_member.to_string().contains("not among"), "{not_member}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_coordinator_commits_alone() {
    let mut group = Group::start(1, 3).await;
    propose(&group, enlist("127.0.0.1:9001")).await;
    for i in 0..10 {
        propose(&group, create(&format!("t{i}"))).await;
    }
    let before = group.converged().await;
    group.stop(1).await;
    group.restart(1).await;
    tokio::time::timeout(SETTLE, group.node(1).read_barrier())
        .await
        .expect("a read right after a restart never completed")
        .unwrap();
    assert_eq!(group.converged().await, before);
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_re_created_from_a_seed_has_the_old_configuration() {
    let mut group = Group::start(3, 5).await;
    propose(&group, enlist("127.0.0.1:9001")).await;
    for i in 0..12 {
        propose(&group, create(&format!("t{i}"))).await;
    }
    let before = group.converged().await;
    let old_group = group.node(1).group();
    group.stop_all().await;

    let seed = Seed::export(&group.dirs[&2]).unwrap();
    assert_eq!(seed.state, before);
    let bytes = seed.encode().unwrap();
    assert_eq!(Seed::decode(&bytes).unwrap(), seed);
    let mut corrupt = bytes.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 1;
    assert!(Seed::decode(&corrupt).is_err());
    assert!(Seed::decode(b"not a seed").is_err());

    // Every member of the new group starts on a fresh directory from the same seed.
    for (id, dir) in group.dirs.iter_mut() {
        *dir = dir.with_file_name(format!("new-coordinator-{id}"));
    }
    group.seed = Some(seed);
    for id in 1..=3 {
        group.restart(id).await;
    }
    let after = group.converged().await;
    assert_eq!(after, before);
    assert_ne!(group.node(1).group(), old_group);
    propose(&group, create("new")).await;
    assert_eq!(group.converged().await.version(), before.version() + 1);
    group.stop_all().await;

    // A seed never overwrites a used directory.
    let dir = group.dirs[&1].clone();
    let mut config = NodeConfig::new(1, group.peers.clone(), dir);
    config.seed = Some(Seed::export(&group.dirs[&2]).unwrap());
    let refused = RaftNode::start(config, tokio::runtime::Handle::current()).unwrap_err();
    assert!(refused.to_string().contains("fresh"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_cut_short_before_the_member_file_is_finished_by_the_next_start() {
    let root = tempfile::TempDir::new().unwrap();
    let dir = root.path().join("c");
    let peers: BTreeMap<u64, String> = (1..=3).map(|i| (i, format!("127.0.0.1:{i}"))).collect();
    // What a start leaves when it dies between initializing the store and the member file.
    rampart_coordinator::raft_storage::RaftStorage::open(&dir)
        .unwrap()
        .initialize(&[1, 2, 3])
        .unwrap();
    let handle = tokio::runtime::Handle::current();
    // Started with a seed, it is not what this start would have written: refused.
    let mut seeded = NodeConfig::new(1, peers.clone(), dir.clone());
    seeded.seed = Some(Seed {
        index: 7,
        last_term: 3,
        state: CoordinatorState::new(),
    });
    let refused = RaftNode::start(seeded, handle.clone()).unwrap_err();
    assert!(refused.to_string().contains("did not finish"), "{refused}");
    // Started as it was first meant, it finishes the start.
    let node = RaftNode::start(NodeConfig::new(1, peers, dir.clone()), handle).unwrap();
    tokio::task::spawn_blocking(move || node.stop())
        .await
        .unwrap();
    // An empty log is no seed.
    let empty = Seed::export(&dir).unwrap_err();
    assert!(empty.to_string().contains("empty log"), "{empty}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_rpcs_refuse_garbage_and_answer_unknown_or_crashed_servers_plainly() {
    use rampart_common::ids::ServerId;
    use rampart_common::protocol::coordinator::{
        AllowLoss, RenewLease, RenewLeaseRequest, ReportFailure, ReportFailureRequest, UploadWill,
    };
    use rampart_common::rpc::{Rpc, Service, WireMessage};
    use rampart_common::tablet::ServerStatus;

    let mut group = Group::start(1, 100).await;
    let service = CoordinatorService::new(group.node(1).clone());
    tokio::time::timeout(SETTLE, group.node(1).read_barrier())
        .await
        .expect("a single coordinator leads")
        .unwrap();
    let garbage = bytes::Bytes::from_static(&[0xff; 3]);
    for opcode in [
        ReportFailure::OPCODE,
        RenewLease::OPCODE,
        UploadWill::OPCODE,
        AllowLoss::OPCODE,
        rampart_common::protocol::coordinator::SetOpenEpoch::OPCODE,
        rampart_common::protocol::coordinator::GetOwnedTablets::OPCODE,
        rampart_common::protocol::coordinator::ReserveVersions::OPCODE,
        rampart_common::protocol::coordinator::DropTable::OPCODE,
    ] {
        let reply = service.handle(opcode, garbage.clone()).await;
        assert_eq!(reply.status(), Status::MalformedRequest, "{opcode:?}");
    }
    let encode = |message: &dyn Fn(&mut bytes::BytesMut)| {
        let mut out = bytes::BytesMut::new();
        message(&mut out);
        out.freeze()
    };
    let renew = |server| encode(&|out| RenewLeaseRequest { server }.encode(out));
    // A server that never enlisted gets no lease.
    let reply = service.handle(RenewLease::OPCODE, renew(ServerId(7))).await;
    assert_eq!(reply.status(), Status::InvalidArgument);
    // An up server gets one; once declared crashed it is told so.
    let CommandResult::Enlisted { id } = propose(&group, enlist("127.0.0.1:9001")).await else {
        panic!("enlist failed");
    };
    let reply = service.handle(RenewLease::OPCODE, renew(id)).await;
    assert_eq!(reply.status(), Status::Ok);
    propose(
        &group,
        Command::SetServerStatus {
            id,
            status: ServerStatus::Crashed,
        },
    )
    .await;
    let reply = service.handle(RenewLease::OPCODE, renew(id)).await;
    assert_eq!(reply.status(), Status::ServerCrashed);
    // Reports about servers that are not up change nothing.
    let report = encode(&|out| {
        ReportFailureRequest {
            server: ServerId(99),
            reporter: "test".into(),
        }
        .encode(out)
    });
    let reply = service.handle(ReportFailure::OPCODE, report).await;
    assert_eq!(reply.status(), Status::Ok);
    drop(service);
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_and_version_rpcs_serve_up_masters_and_refuse_crashed_ones() {
    use rampart_common::ids::{Epoch, SegmentId, ServerId, TabletEpoch};
    use rampart_common::protocol::coordinator::{
        GetOwnedTablets, OwnedTabletsReply, RenewLease, RenewLeaseReply, RenewLeaseRequest,
        ReserveVersions, ReserveVersionsReply, ReserveVersionsRequest, ServerIdRequest,
        SetOpenEpoch, SetOpenEpochRequest,
    };
    use rampart_common::rpc::{Reply, Rpc, Service, WireMessage};
    use rampart_common::tablet::ServerStatus;

    let mut group = Group::start(1, 100).await;
    let service = CoordinatorService::new(group.node(1).clone());
    tokio::time::timeout(SETTLE, group.node(1).read_barrier())
        .await
        .expect("a single coordinator leads")
        .unwrap();
    async fn call<R: Rpc>(service: &CoordinatorService, request: &R::Request) -> Reply {
        let mut out = bytes::BytesMut::new();
        request.encode(&mut out);
        service.handle(R::OPCODE, out.freeze()).await
    }
    fn decode<M: WireMessage>(reply: &Reply) -> M {
        assert_eq!(reply.status(), Status::Ok, "{:?}", reply.payload());
        Reply::decode(bytes::Bytes::copy_from_slice(reply.payload())).unwrap()
    }
    // Never enlisted: plainly refused.
    let unknown = ServerIdRequest {
        server: ServerId(42),
    };
    let reply = call::<GetOwnedTablets>(&service, &unknown).await;
    assert_eq!(reply.status(), Status::InvalidArgument);
    let CommandResult::Enlisted { id } = propose(&group, enlist("127.0.0.1:9002")).await else {
        panic!("enlist failed");
    };
    propose(
        &group,
        Command::CreateTable {
            name: "t".into(),
            span: 2,
        },
    )
    .await;
    // Up: its tablets with their epoch, the same epoch in its lease, a reservation.
    let owned: OwnedTabletsReply =
        decode(&call::<GetOwnedTablets>(&service, &ServerIdRequest { server: id }).await);
    assert_eq!((owned.epoch, owned.tablets.len()), (TabletEpoch(1), 2));
    let reserve = ReserveVersionsRequest {
        server: id,
        ceiling: 1 << 32,
    };
    let reserved: ReserveVersionsReply = decode(&call::<ReserveVersions>(&service, &reserve).await);
    assert_eq!(reserved.ceiling, 1 << 32);
    let lease: RenewLeaseReply =
        decode(&call::<RenewLease>(&service, &RenewLeaseRequest { server: id }).await);
    assert_eq!(
        (lease.tablets_epoch, lease.version_ceiling),
        (TabletEpoch(1), 1 << 32)
    );
    let epoch = SetOpenEpochRequest {
        server: id,
        segment: SegmentId(3),
        epoch: Epoch(2),
    };
    assert_eq!(
        call::<SetOpenEpoch>(&service, &epoch).await.status(),
        Status::Ok
    );
    // Declared crashed: it may not move its log, reserve versions or learn its tablets.
    propose(
        &group,
        Command::SetServerStatus {
            id,
            status: ServerStatus::Crashed,
        },
    )
    .await;
    let refused = [
        call::<SetOpenEpoch>(&service, &epoch).await.status(),
        call::<ReserveVersions>(&service, &reserve).await.status(),
        call::<GetOwnedTablets>(&service, &ServerIdRequest { server: id })
            .await
            .status(),
    ];
    assert_eq!(refused, [Status::ServerCrashed; 3]);
    drop(service);
    group.stop_all().await;
}

// ---- The leader's verification of reported failures ----

mod failure_verification {
    use super::*;
    use rampart_common::ids::ServerId;
    use rampart_common::protocol::master::{Identify, IdentifyReply, Ping, PingReply};
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::{Opcode, Reply, Rpc, Service};
    use rampart_common::tablet::ServerStatus;
    use rampart_coordinator::failure_verifier::FailureVerifier;
    use rampart_coordinator::proof_of_death::Evidence;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A server that answers every `Ping`, counting them.
    #[derive(Debug, Default)]
    struct Pingable {
        pings: AtomicU32,
    }

    impl Service for Pingable {
        fn handle(&self, opcode: Opcode, _payload: bytes::Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                if opcode != Ping::OPCODE {
                    return Reply::error(Status::UnknownOpcode, "only pings here");
                }
                self.pings.fetch_add(1, Ordering::SeqCst);
                Reply::ok(&PingReply::default())
            })
        }
    }

    /// A verifier on `node` pinging each suspect twice, each ping given `timeout`.
    fn verifier(node: &RaftNode, timeout: Duration) -> Arc<FailureVerifier> {
        Arc::new(FailureVerifier::new(
            node.clone(),
            Arc::new(RpcPool::new()),
            timeout,
            2,
            ProofOfDeath::default(),
        ))
    }

    async fn enlisted(group: &Group, addr: &str) -> ServerId {
        match propose(group, enlist(addr)).await {
            CommandResult::Enlisted { id } => id,
            other => panic!("enlist failed: {other:?}"),
        }
    }

    fn status(node: &RaftNode, server: ServerId) -> ServerStatus {
        node.with_state(|s| s.server(server).map(|s| s.status))
            .expect("enlisted")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_suspect_is_declared_crashed_and_one_that_answers_stays_up() {
        let mut group = Group::start(1, 10_000).await;
        let node = group.node(group.leader().await).clone();
        let pingable = Arc::new(Pingable::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let alive_addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(RpcServer::run(
            listener,
            Arc::clone(&pingable),
            std::future::pending(),
        ));
        // Nothing listens there: every ping is refused.
        let dead_addr = {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let alive = enlisted(&group, &alive_addr).await;
        let dead = enlisted(&group, &dead_addr).await;
        let verifier = verifier(&node, Duration::from_millis(200));
        verifier.report_failure(alive, "test").unwrap();
        verifier.report_failure(dead, "test").unwrap();
        tokio::time::timeout(SETTLE, verifier.crash_declared())
            .await
            .expect("the silent suspect is declared crashed");
        // Crashed, or recovered already (it owns nothing): `Removed`.
        assert!(matches!(
            status(&node, dead),
            ServerStatus::Crashed | ServerStatus::Removed
        ));
        assert!(verifier.take_declared(dead).is_some());
        let deadline = Instant::now() + SETTLE;
        while pingable.pings.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the other suspect never pinged");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status(&node, alive), ServerStatus::Up);
        assert_eq!(verifier.take_declared(alive), None);
        group.stop_all().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_whose_commit_fails_is_declared_by_the_next_leader_when_reported_again() {
        let mut group = Group::start(3, 10_000).await;
        // It accepts connections (the kernel's backlog) and never answers: every ping
        // waits out its deadline.
        let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hung_addr = hung.local_addr().unwrap().to_string();
        let suspect = enlisted(&group, &hung_addr).await;
        let leader = group.leader().await;
        let node = group.node(leader).clone();
        let ping = Duration::from_millis(300);
        let first = verifier(&node, ping);
        first.report_failure(suspect, "test").unwrap();
        let verified = Instant::now() + 2 * ping;
        // While it pings, the leader loses its majority: its commit fails.
        let others = group.stop_all_but(leader).await;
        let deadline = Instant::now() + SETTLE;
        while node.is_leader() {
            assert!(Instant::now() < deadline, "kept leading without a majority");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Its pings are over by now, and its proposal refused.
        tokio::time::sleep_until(verified + Duration::from_millis(300)).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(200), first.crash_declared())
                .await
                .is_err(),
            "a crash declared without a majority"
        );
        assert_eq!(status(&node, suspect), ServerStatus::Up);
        // The reporters report again, to whoever leads now.
        for id in others {
            group.restart(id).await;
        }
        let mut verifiers = BTreeMap::new();
        let deadline = Instant::now() + SETTLE;
        loop {
            let state = group.converged().await;
            // Declared crashed, or crashed and recovered already: owning nothing, the
            // suspect's recovery may end (`Removed`) between two polls.
            let status = state.server(suspect).map(|s| s.status);
            if matches!(status, Some(ServerStatus::Crashed | ServerStatus::Removed)) {
                break;
            }
            // Each coordinator has its verifier; `NotLeader` while an election runs.
            let leader = group.leader().await;
            let verifier = verifiers
                .entry(leader)
                .or_insert_with(|| verifier(group.node(leader), Duration::from_millis(200)));
            let _ = verifier.report_failure(suspect, "test");
            assert!(Instant::now() < deadline, "never declared crashed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(hung);
        group.stop_all().await;
    }

    /// A server that answers `Identify` as `id`.
    #[derive(Debug)]
    struct Identified {
        id: ServerId,
    }

    impl Service for Identified {
        fn handle(&self, opcode: Opcode, _payload: bytes::Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                if opcode != Identify::OPCODE {
                    return Reply::error(Status::UnknownOpcode, "only identify here");
                }
                Reply::ok(&IdentifyReply { server: self.id })
            })
        }
    }

    /// The address of a server that answers `Identify` as `id`.
    async fn identified(id: ServerId) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = Arc::new(Identified { id });
        tokio::spawn(RpcServer::run(listener, server, std::future::pending()));
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_proves_death_by_a_refusal_or_another_server_only_where_the_network_is_direct()
    {
        let mut group = Group::start(1, 10_000).await;
        let node = group.node(group.leader().await).clone();
        // Listed (evidence about a server the list does not hold is not kept).
        let crashed = enlisted(&group, "127.0.0.1:1").await;
        // Bound, not listening: connections are refused, and the port stays ours.
        let closed = tokio::net::TcpSocket::new_v4().unwrap();
        closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let refused_addr = closed.local_addr().unwrap().to_string();
        let impostor_addr = identified(ServerId(9)).await;
        let itself_addr = identified(crashed).await;
        let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hung_addr = hung.local_addr().unwrap().to_string();

        let probe = |setting: ProofOfDeath| {
            Arc::new(FailureVerifier::new(
                node.clone(),
                Arc::new(RpcPool::new()),
                Duration::from_millis(200),
                2,
                setting,
            ))
        };
        let direct = probe(ProofOfDeath::Direct);
        assert!(
            !direct.probe(crashed, &itself_addr).await,
            "it still answers"
        );
        assert!(
            !direct.probe(crashed, &hung_addr).await,
            "silence proves nothing"
        );
        assert_eq!(direct.proof_of(crashed), None);
        assert!(direct.probe(crashed, &impostor_addr).await);
        assert!(matches!(
            direct.proof_of(crashed),
            Some((_, Evidence::OtherServer(ServerId(9))))
        ));
        let direct = probe(ProofOfDeath::Direct);
        assert!(direct.probe(crashed, &refused_addr).await);
        assert!(matches!(
            direct.proof_of(crashed),
            Some((_, Evidence::Refused))
        ));
        // A firewall's reset, or a proxy's other server, looks the same: without a
        // direct network neither is proof.
        for setting in [ProofOfDeath::Supervisor, ProofOfDeath::Off] {
            let verifier = probe(setting);
            assert!(!verifier.probe(crashed, &refused_addr).await, "{setting}");
            assert!(!verifier.probe(crashed, &impostor_addr).await, "{setting}");
            assert_eq!(verifier.proof_of(crashed), None, "{setting}");
        }
        drop((closed, hung));
        group.stop_all().await;
    }

    /// The address of a server answering `Identify` as whatever id `id` holds once set
    /// (its address is needed to enlist it, which gives the id).
    async fn identified_later() -> (String, Arc<parking_lot::Mutex<ServerId>>) {
        #[derive(Debug)]
        struct Later(Arc<parking_lot::Mutex<ServerId>>);
        impl Service for Later {
            fn handle(&self, opcode: Opcode, _payload: bytes::Bytes) -> HandleFuture<'_> {
                let id = *self.0.lock();
                Box::pin(async move {
                    match opcode {
                        Identify::OPCODE => Reply::ok(&IdentifyReply { server: id }),
                        Ping::OPCODE => Reply::ok(&PingReply::default()),
                        _ => Reply::error(Status::UnknownOpcode, "only identify and ping"),
                    }
                })
            }
        }
        let id = Arc::new(parking_lot::Mutex::new(ServerId(0)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let service = Arc::new(Later(Arc::clone(&id)));
        tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
        (addr, id)
    }

    /// The address of a server of a release before `Identify`: it answers pings, and
    /// `UnknownOpcode` to what it does not know.
    async fn older_release() -> String {
        #[derive(Debug)]
        struct Older;
        impl Service for Older {
            fn handle(&self, opcode: Opcode, _payload: bytes::Bytes) -> HandleFuture<'_> {
                Box::pin(async move {
                    match opcode {
                        Ping::OPCODE => Reply::ok(&PingReply::default()),
                        _ => Reply::error(Status::UnknownOpcode, "an older release"),
                    }
                })
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(RpcServer::run(
            listener,
            Arc::new(Older),
            std::future::pending(),
        ));
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_supervisors_word_declares_a_server_crashed_at_once_where_it_counts() {
        let mut group = Group::start(1, 10_000).await;
        let node = group.node(group.leader().await).clone();
        let verifier = |setting| {
            Arc::new(FailureVerifier::new(
                node.clone(),
                Arc::new(RpcPool::new()),
                Duration::from_millis(300),
                2,
                setting,
            ))
        };
        // Another process answers at its address (a ping gets an answer there, so pings
        // alone would never declare it): the supervisor's word alone declares it.
        let impostor = identified(ServerId(99)).await;
        let exited = enlisted(&group, &impostor).await;
        let supervised = verifier(ProofOfDeath::Supervisor);
        supervised.process_exited(exited, "test").unwrap();
        tokio::time::timeout(Duration::from_secs(5), supervised.crash_declared())
            .await
            .expect("declared on the supervisor's word");
        assert!(matches!(
            supervised.proof_of(exited),
            Some((_, Evidence::ExitSeen))
        ));
        assert_ne!(status(&node, exited), ServerStatus::Up);

        // A supervisor that names a live server is not believed: one answering as
        // itself, or one of an older release, which answers `Identify` with
        // `UnknownOpcode` (an answer all the same).
        let (alive_addr, alive_id) = identified_later().await;
        let alive = enlisted(&group, &alive_addr).await;
        *alive_id.lock() = alive;
        let older = enlisted(&group, &older_release().await).await;
        for (live, what) in [
            (alive, "answering as itself"),
            (older, "of an older release"),
        ] {
            supervised.process_exited(live, "test").unwrap();
            assert!(
                tokio::time::timeout(Duration::from_secs(2), supervised.crash_declared())
                    .await
                    .is_err(),
                "a live server {what} declared crashed on a wrong word"
            );
            assert_eq!(supervised.proof_of(live), None, "{what}");
            assert_eq!(status(&node, live), ServerStatus::Up, "{what}");
        }

        // Where the supervisor's word does not count, it is a report like any other:
        // verified by pings (here: 2 × 300 ms of silence), and no proof.
        let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hung_addr = hung.local_addr().unwrap().to_string();
        let other = enlisted(&group, &hung_addr).await;
        let off = verifier(ProofOfDeath::Off);
        let reported = Instant::now();
        off.process_exited(other, "test").unwrap();
        tokio::time::timeout(SETTLE, off.crash_declared())
            .await
            .expect("declared once its pings failed");
        assert!(reported.elapsed() >= Duration::from_millis(600));
        assert_eq!(off.proof_of(other), None);
        drop(hung);
        group.stop_all().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_client_hands_out_ids_never_repeated_even_after_a_restart() {
    use rampart_common::protocol::coordinator::{OpenClient, OpenClientReply, OpenClientRequest};
    use rampart_common::rpc::{Reply, Rpc, Service, WireMessage};

    async fn open(service: &CoordinatorService) -> u64 {
        let mut out = bytes::BytesMut::new();
        OpenClientRequest {}.encode(&mut out);
        let reply = service.handle(OpenClient::OPCODE, out.freeze()).await;
        assert_eq!(reply.status(), Status::Ok, "{:?}", reply.payload());
        let reply: OpenClientReply =
            Reply::decode(bytes::Bytes::copy_from_slice(reply.payload())).unwrap();
        reply.client.0
    }
    // Snapshots every 3 entries: ids must not depend on what the log still holds.
    let mut group = Group::start(1, 3).await;
    tokio::time::timeout(SETTLE, group.node(1).read_barrier())
        .await
        .expect("a single coordinator leads")
        .unwrap();
    let service = CoordinatorService::new(group.node(1).clone());
    let version = group.node(1).with_state(|s| s.version());
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(open(&service).await);
    }
    assert_eq!(
        group.node(1).with_state(|s| s.version()),
        version,
        "opening a client changes no configuration"
    );
    drop(service);
    group.stop(1).await;
    group.restart(1).await;
    tokio::time::timeout(SETTLE, group.node(1).read_barrier())
        .await
        .expect("the restarted coordinator leads")
        .unwrap();
    let service = CoordinatorService::new(group.node(1).clone());
    for _ in 0..10 {
        ids.push(open(&service).await);
    }
    let distinct: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    assert!(ids.iter().all(|&id| id > 0));
    group.stop_all().await;
}

/// `WatchTabletMap` of a map newer than `seen`, waiting at most `wait_ms`, answered by
/// `service` directly.
async fn watch_map(
    service: &CoordinatorService,
    seen: u64,
    wait_ms: u32,
) -> rampart_common::tablet::TabletMap {
    use rampart_common::protocol::coordinator::{WatchTabletMap, WatchTabletMapRequest};
    use rampart_common::rpc::{Reply, Rpc, Service, WireMessage};
    let mut out = bytes::BytesMut::new();
    WatchTabletMapRequest { seen, wait_ms }.encode(&mut out);
    let reply = service.handle(WatchTabletMap::OPCODE, out.freeze()).await;
    assert_eq!(reply.status(), Status::Ok, "{:?}", reply.payload());
    Reply::decode(bytes::Bytes::copy_from_slice(reply.payload())).unwrap()
}

/// A single coordinator, leading, its service, and its configuration's version.
async fn watched_coordinator() -> (Group, Arc<CoordinatorService>, u64) {
    let group = Group::start(1, 10_000).await;
    tokio::time::timeout(SETTLE, group.node(1).read_barrier())
        .await
        .expect("a single coordinator leads")
        .unwrap();
    let service = Arc::new(CoordinatorService::new(group.node(1).clone()));
    let now = group.node(1).with_state(|s| s.version());
    (group, service, now)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_watch_answers_when_the_map_changes_or_its_wait_ends() {
    let (mut group, service, now) = watched_coordinator().await;
    // Behind: answered at once.
    if now > 0 {
        let started = Instant::now();
        assert_eq!(watch_map(&service, now - 1, 10_000).await.version, now);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
    // Nothing changes: answered with the same map once the wait is over.
    let started = Instant::now();
    assert_eq!(watch_map(&service, now, 100).await.version, now);
    assert!(started.elapsed() >= Duration::from_millis(100));
    // A change while it waits: answered with it, long before the wait is over.
    let waiting = {
        let service = Arc::clone(&service);
        tokio::spawn(async move { watch_map(&service, now, 10_000).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    propose(&group, enlist("127.0.0.1:1")).await;
    let changed = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("answered once the map changed")
        .unwrap();
    assert!(changed.version > now);
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(service);
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_watch_past_the_waiters_bound_is_answered_at_once() {
    use rampart_common::protocol::coordinator::{
        WATCH_TABLET_MAP_WAITERS_MAX, WATCH_TABLET_MAP_WAIT_MAX,
    };
    let (mut group, service, now) = watched_coordinator().await;
    let wait_ms = WATCH_TABLET_MAP_WAIT_MAX.as_millis() as u32;
    // Every place taken by a watch of a map that does not change.
    let waiting: Vec<_> = (0..WATCH_TABLET_MAP_WAITERS_MAX)
        .map(|_| {
            let service = Arc::clone(&service);
            tokio::spawn(async move { watch_map(&service, now, wait_ms).await })
        })
        .collect();
    // Each takes its place when it is first polled (before its read barrier); the
    // workers poll every one of them long before this sleep ends.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // One more: answered with the map as it is, not after the wait.
    let started = Instant::now();
    assert_eq!(watch_map(&service, now, wait_ms).await.version, now);
    assert!(
        started.elapsed() < WATCH_TABLET_MAP_WAIT_MAX / 2,
        "a watch past the bound waited {:?}",
        started.elapsed()
    );
    for waiter in waiting {
        assert_eq!(waiter.await.unwrap().version, now);
    }
    drop(service);
    group.stop_all().await;
}
