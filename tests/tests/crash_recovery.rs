//! Crash recovery on real processes (issue 5): masters killed with SIGKILL are detected,
//! recovered from their replicas by other masters, and every acknowledged write is read
//! back afterwards, through the ordinary client, which rides through the recovery.
//!
//! Each test runs its own cluster of 3 coordinators and several storage servers on
//! loopback, with small segments so that little data spans many of them. The tests hold
//! one lock so that only one cluster runs at a time (two cores).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rampart_client::{Client, ClientError, ClientOptions};
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::failpoints::{self, FAILPOINTS_ENV};
use rampart_common::ids::{ServerId, TableId};
use rampart_common::onesided::shm::remove_default_frame_files_under;
use rampart_common::protocol::coordinator::{
    LeaseEnd, RecoveryReport, RecoveryStatus, RecoveryStatusRequest,
};
use rampart_common::protocol::master::{Ping, PingRequest, Read, ReadRequest};
use rampart_common::rpc::RpcPool;
use rampart_common::status::Status;
use rampart_tests::{runtime, CoordinatorGroup, RampartProcess};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// One cluster at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// How long a recovery may take in these tests (a loaded 2-core machine).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// A cluster started process by process, so servers can be killed and restarted on their
/// data directories.
struct Cluster {
    group: CoordinatorGroup,
    /// Running servers by id: (process, data directory).
    servers: BTreeMap<u64, (RampartProcess, PathBuf)>,
    /// Flags of every server.
    flags: Vec<String>,
    next_dir: u32,
    dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Servers first (dropping one kills it), then the frame files they kept in
        // /dev/shm for a restart that will not come.
        self.servers.clear();
        remove_default_frame_files_under(self.dir.path());
    }
}

impl Cluster {
    fn start(servers: u32, replicas: u32, extra: &[&str]) -> Cluster {
        Cluster::start_with(
            servers,
            replicas,
            extra,
            CoordinatorGroup::start(3).unwrap(),
        )
    }

    /// A cluster whose coordinators are `group` (started with flags or failpoints).
    /// A flag in `extra` replaces the default of the same name.
    fn start_with(servers: u32, replicas: u32, extra: &[&str], group: CoordinatorGroup) -> Cluster {
        let replicas = replicas.to_string();
        let defaults = [
            ("--disk-mbps", "500"),
            ("--memory", "256MiB"),
            ("--segment-bytes", "256KiB"),
            ("--value-bytes-max", "128KiB"),
            ("--backup-frames", rampart_tests::TEST_BACKUP_FRAMES),
            ("--replicas", replicas.as_str()),
        ];
        let mut flags: Vec<String> = defaults
            .iter()
            .filter(|(name, _)| !extra.contains(name))
            .flat_map(|(name, value)| [name.to_string(), value.to_string()])
            .collect();
        flags.extend(extra.iter().map(|s| s.to_string()));
        let mut cluster = Cluster {
            group,
            servers: BTreeMap::new(),
            flags,
            next_dir: 0,
            dir: tempfile::TempDir::new().unwrap(),
        };
        for _ in 0..servers {
            cluster.start_server(None);
        }
        cluster
    }

    /// Starts a server on `data_dir` (a fresh one if `None`); returns its id.
    fn start_server(&mut self, data_dir: Option<PathBuf>) -> u64 {
        self.start_server_at("127.0.0.1:0", data_dir)
    }

    /// Starts a server listening on `listen`, on `data_dir` (a fresh one if `None`);
    /// returns its id.
    fn start_server_at(&mut self, listen: &str, data_dir: Option<PathBuf>) -> u64 {
        let data_dir = data_dir.unwrap_or_else(|| {
            self.next_dir += 1;
            self.dir.path().join(format!("server-{}", self.next_dir))
        });
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        let process = self
            .group
            .start_server_at(listen, &data_dir, &flags)
            .unwrap();
        let id: u64 = process.server_id();
        self.servers.insert(id, (process, data_dir));
        id
    }

    fn addr(&self, id: u64) -> String {
        self.servers[&id].0.addr.clone()
    }

    /// The id of the server at `addr`.
    fn id_at(&self, addr: &str) -> u64 {
        *self
            .servers
            .iter()
            .find(|(_, (p, _))| p.addr == addr)
            .map(|(id, _)| id)
            .unwrap()
    }

    /// `rampart recovery allow-loss ID`, as an operator runs it.
    fn allow_loss(&self, id: u64) {
        let output = rampart_tests::rampart(
            &["recovery", "allow-loss", &id.to_string()],
            None,
            &[("RAMPART_COORDINATOR", &self.group.addrs())],
        )
        .unwrap();
        assert!(output.status.success(), "{output:?}");
    }

    /// [`Cluster::allow_loss`] of `id`, unless its recovery ends without it (a master
    /// that never acknowledged a write is recovered empty at once, possibly before the
    /// operator gets to it); retried while `id` is not declared crashed yet.
    async fn allow_loss_unless_recovered(&self, id: u64) {
        let deadline = Instant::now() + RECOVERY_TIMEOUT;
        loop {
            let output = rampart_tests::rampart(
                &["recovery", "allow-loss", &id.to_string()],
                None,
                &[("RAMPART_COORDINATOR", &self.group.addrs())],
            )
            .unwrap();
            if output.status.success() {
                return;
            }
            let reports = self.recoveries().await;
            if reports
                .iter()
                .any(|r| r.crashed == ServerId(id) && r.done_ms > 0)
            {
                return;
            }
            assert!(Instant::now() < deadline, "{output:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs server `id`; returns its data directory.
    fn kill(&mut self, id: u64) -> PathBuf {
        let (process, dir) = self.servers.remove(&id).unwrap();
        process.kill();
        dir
    }

    /// Stops server `id` gracefully; returns its data directory.
    fn stop(&mut self, id: u64) -> PathBuf {
        let (process, dir) = self.servers.remove(&id).unwrap();
        let _ = process.stop(Duration::from_secs(10));
        dir
    }

    /// Starts the stopped coordinators again, then servers on `dirs`, and waits until
    /// the old servers `crashed` are recovered; returns a fresh client.
    async fn cold_start(&mut self, dirs: Vec<PathBuf>, crashed: &[u64]) -> Client {
        for id in 1..=3 {
            self.group.restart(id).unwrap();
        }
        for dir in dirs {
            self.start_server(Some(dir));
        }
        self.wait_recovered(crashed).await;
        self.client().await
    }

    async fn client(&self) -> Client {
        let options = ClientOptions {
            deadline: Duration::from_secs(30),
            ..ClientOptions::default()
        };
        Client::connect_with(&[self.group.addrs()], options)
            .await
            .unwrap()
    }

    async fn recoveries(&self) -> Vec<RecoveryReport> {
        let addrs = self.group.addrs();
        let set = CoordinatorSet::new(&[addrs.as_str()]);
        let pool = RpcPool::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        set.call::<RecoveryStatus>(&pool, &RecoveryStatusRequest {}, deadline)
            .await
            .map(|reply| reply.recoveries)
            .unwrap_or_default()
    }

    /// Waits until the recovery of every server of `crashed` is done; returns the reports.
    async fn wait_recovered(&self, crashed: &[u64]) -> Vec<RecoveryReport> {
        self.wait_for("the end of the recovery", |reports| {
            let done: Vec<RecoveryReport> = crashed
                .iter()
                .filter_map(|id| {
                    reports
                        .iter()
                        .rev()
                        .find(|r| r.crashed == ServerId(*id) && r.done_ms > 0)
                        .cloned()
                })
                .collect();
            (done.len() == crashed.len()).then_some(done)
        })
        .await
    }
}

impl Cluster {
    /// Polls the leader's recovery reports until `found` picks something out of them.
    async fn wait_for<T>(&self, what: &str, found: impl Fn(&[RecoveryReport]) -> Option<T>) -> T {
        let deadline = Instant::now() + RECOVERY_TIMEOUT;
        loop {
            let reports = self.recoveries().await;
            if let Some(t) = found(&reports) {
                return t;
            }
            assert!(Instant::now() < deadline, "{what} never seen: {reports:#?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn value(key: &str, counter: u64, bytes: usize) -> Vec<u8> {
    let mut v = format!("{key}={counter:012};").into_bytes();
    v.resize(bytes.max(v.len()), b'x');
    v
}

/// The counter a value written by [`value`] carries.
fn counter_of(value: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(value);
    let digits = text.split('=').nth(1).and_then(|s| s.split(';').next());
    digits.and_then(|d| d.parse().ok()).unwrap()
}

/// Writes `keys` keys once each, `bytes` per value; returns (key, counter 0).
async fn fill(client: &Client, table: TableId, prefix: &str, keys: usize, bytes: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..8 {
        let client = client.clone();
        let prefix = prefix.to_string();
        tasks.spawn(async move {
            for i in (w..keys).step_by(8) {
                let key = format!("{prefix}{i}");
                client
                    .write(table, key.as_bytes(), &value(&key, 0, bytes))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// Reads back `keys` keys written by [`fill`] and checks every one.
async fn check_filled(client: &Client, table: TableId, prefix: &str, keys: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..8 {
        let client = client.clone();
        let prefix = prefix.to_string();
        tasks.spawn(async move {
            for i in (w..keys).step_by(8) {
                let key = format!("{prefix}{i}");
                let object = client.read(table, key.as_bytes()).await.unwrap();
                let object = object.unwrap_or_else(|| panic!("{key} lost"));
                assert!(
                    object.value.starts_with(format!("{key}=").as_bytes()),
                    "{key}"
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// Per key: the last acknowledged counter and the last one attempted.
type History = BTreeMap<String, (Option<u64>, u64)>;

/// Rewrites keys `w{w}-{j}` in rounds with growing counters until `stop`.
async fn write_load(client: Client, table: TableId, stop: Arc<AtomicBool>) -> History {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..6 {
        let (client, stop) = (client.clone(), Arc::clone(&stop));
        tasks.spawn(async move {
            let mut history = History::new();
            let mut counter = 0u64;
            while !stop.load(Ordering::SeqCst) {
                counter += 1;
                for j in 0..20 {
                    let key = format!("w{w}-{j}");
                    let entry = history.entry(key.clone()).or_insert((None, 0));
                    entry.1 = counter;
                    match client
                        .write(table, key.as_bytes(), &value(&key, counter, 200))
                        .await
                    {
                        Ok(_) => entry.0 = Some(counter),
                        // Retried until the deadline: only a timeout leaves it unknown.
                        Err(ClientError::Timeout { .. }) => {}
                        Err(error) => panic!("write of {key} failed: {error}"),
                    }
                }
            }
            history
        });
    }
    let mut history = History::new();
    while let Some(done) = tasks.join_next().await {
        history.extend(done.unwrap());
    }
    history
}

/// Every key holds its last acknowledged value or a later attempted one.
async fn check_history(client: &Client, table: TableId, history: &History) {
    for (key, (acked, attempted)) in history {
        let object = client.read(table, key.as_bytes()).await.unwrap();
        match (acked, object) {
            (Some(acked), None) => panic!("{key}: acknowledged counter {acked} lost"),
            (None, _) => {}
            (Some(acked), Some(object)) => {
                let got = counter_of(&object.value);
                assert!(
                    *acked <= got && got <= *attempted,
                    "{key}: holds {got}, acknowledged {acked}, last attempted {attempted}"
                );
            }
        }
    }
}

/// The server owning `key` of `table`.
fn owner_of(cluster: &Cluster, client: &Client, table: TableId, key: &str) -> u64 {
    cluster.id_at(&client.locate(table, key.as_bytes()).unwrap())
}

/// Three coordinators granting leases of `lease_ms`, taking what `proof_of_death`
/// says as proof of a crashed master's death.
fn coordinators_proving_death(lease_ms: u64, proof_of_death: &str) -> CoordinatorGroup {
    let lease_ms = lease_ms.to_string();
    CoordinatorGroup::start_with(
        3,
        &["--lease-ms", &lease_ms, "--proof-of-death", proof_of_death],
        &[],
    )
    .unwrap()
}

/// A lease long enough that a recovery that waited it out cannot be mistaken for one
/// that did not.
const LONG_LEASE_MS: u64 = 5_000;

/// Kills the owner of `k0` in a cluster of `coordinators` holding 200 keys; returns the
/// report of its recovery, once every key reads back.
async fn kill_a_master_and_recover(coordinators: CoordinatorGroup) -> RecoveryReport {
    let mut cluster = Cluster::start_with(4, 2, &[], coordinators);
    let client = cluster.client().await;
    let table = client.create_table("proof", 4).await.unwrap();
    fill(&client, table, "k", 200, 200).await;
    let victim = owner_of(&cluster, &client, table, "k0");
    cluster.kill(victim);
    let report = cluster.wait_recovered(&[victim]).await.remove(0);
    check_filled(&client, table, "k", 200).await;
    report
}

#[test]
fn a_killed_master_goes_live_without_waiting_out_its_lease() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let coordinators = coordinators_proving_death(LONG_LEASE_MS, "direct");
        let report = kill_a_master_and_recover(coordinators).await;
        // Its port refuses connections: nothing serves behind it.
        assert_eq!(report.lease_end, Some(LeaseEnd::Refused), "{report:#?}");
        assert!(report.lease_end_ms < LONG_LEASE_MS, "{report:#?}");
        assert!(!report.partitions.is_empty());
        for partition in &report.partitions {
            assert!(partition.live_ms < LONG_LEASE_MS, "{report:#?}");
        }
    });
}

#[test]
fn with_proof_of_death_off_a_killed_master_is_waited_out() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let lease_ms = 1_000;
        let report = kill_a_master_and_recover(coordinators_proving_death(lease_ms, "off")).await;
        assert_eq!(report.lease_end, Some(LeaseEnd::Waited), "{report:#?}");
        assert!(report.lease_end_ms >= lease_ms, "{report:#?}");
        for partition in &report.partitions {
            assert!(partition.live_ms >= lease_ms, "{report:#?}");
        }
    });
}

#[test]
fn cluster_up_says_when_a_server_exits_and_that_is_proof_of_its_death() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Only the supervisor's word counts: a refused connection proves nothing here.
    let cluster = rampart_tests::LocalCluster::start(
        3,
        &[
            "--replicas",
            "1",
            "--memory",
            "64MiB",
            "--no-resp",
            "--proof-of-death",
            "supervisor",
        ],
    )
    .unwrap();
    runtime().block_on(async {
        let options = ClientOptions {
            deadline: Duration::from_secs(30),
            ..ClientOptions::default()
        };
        let client = Client::connect_with(&[cluster.coordinator.as_str()], options)
            .await
            .unwrap();
        let table = client.create_table("supervised", 3).await.unwrap();
        fill(&client, table, "s", 60, 100).await;
        let (victim, _, pid) = cluster.servers[0];
        // SAFETY: kill(2) of a child of `cluster up` that runs (no reuse of its pid).
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let set = CoordinatorSet::new(&[cluster.coordinator.as_str()]);
        let pool = RpcPool::new();
        let deadline = Instant::now() + RECOVERY_TIMEOUT;
        let report = loop {
            let reports = set
                .call::<RecoveryStatus>(&pool, &RecoveryStatusRequest {}, deadline)
                .await
                .map(|reply| reply.recoveries)
                .unwrap_or_default();
            if let Some(done) = reports
                .into_iter()
                .find(|r| r.crashed == ServerId(victim) && r.done_ms > 0)
            {
                break done;
            }
            assert!(Instant::now() < deadline, "server {victim} never recovered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(report.lease_end, Some(LeaseEnd::ExitSeen), "{report:#?}");
        check_filled(&client, table, "s", 60).await;
    });
}

#[test]
fn master_crash_under_write_load_loses_no_acknowledged_write() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let mut cluster = Cluster::start(5, 3, &[]);
        let client = cluster.client().await;
        let table = client.create_table("load", 5).await.unwrap();
        fill(&client, table, "pre", 2000, 500).await;
        let stop = Arc::new(AtomicBool::new(false));
        let load = tokio::spawn(write_load(client.clone(), table, Arc::clone(&stop)));
        tokio::time::sleep(Duration::from_millis(800)).await;
        let victim = owner_of(&cluster, &client, table, "w0-0");
        cluster.kill(victim);
        // Writes go on through the recovery.
        tokio::time::sleep(Duration::from_secs(4)).await;
        stop.store(true, Ordering::SeqCst);
        let history = load.await.unwrap();
        let reports = cluster.wait_recovered(&[victim]).await;
        assert!(reports[0].partitions.iter().all(|p| p.live_ms > 0));
        check_history(&client, table, &history).await;
        check_filled(&client, table, "pre", 2000).await;
        // The victim's tablets all have live owners.
        assert_ne!(owner_of(&cluster, &client, table, "w0-0"), victim);
    });
}

/// Issue 14: a master killed (SIGKILL) while its cleaner is at work loses nothing and
/// resurrects nothing. The load overwrites and deletes keys in a small memory, so the
/// cleaner runs all along (its freed segments are checked before the kill); the kill
/// falls wherever it falls in a pass — survivors half written, a digest on some
/// replicas, freed segments not yet freed on every backup. After the recovery every key
/// holds its last acknowledged state (a value, or deleted) or a later attempted one.
#[test]
fn a_master_killed_while_cleaning_loses_and_resurrects_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let mut cluster =
            Cluster::start(4, 2, &["--memory", "32MiB", "--value-bytes-max", "16KiB"]);
        let client = cluster.client().await;
        let table = client.create_table("clean", 1).await.unwrap();
        let victim = owner_of(&cluster, &client, table, "k0");
        // Per key, states in the order they were attempted: Some(counter) written,
        // None deleted; and how many of them were acknowledged (a prefix, as each key has
        // one writer that waits for each answer).
        type States = BTreeMap<String, (Vec<Option<u64>>, usize)>;
        let states: Arc<Mutex<States>> = Arc::default();
        // Cold keys, written once: their segments stay full and old while the hot keys'
        // segments are cleaned over and over. Every sixth is deleted under the load, so
        // its tombstone lies in a hot segment, cleaned long before the object it
        // deletes: dropping it then would bring the object back after the crash.
        for i in 0..300 {
            let key = format!("cold-{i}");
            client
                .write(table, key.as_bytes(), &value(&key, 0, 3000))
                .await
                .unwrap();
            states.lock().unwrap().insert(key, (vec![Some(0)], 1));
        }
        let mut load = tokio::task::JoinSet::new();
        {
            let (client, states) = (client.clone(), Arc::clone(&states));
            load.spawn(async move {
                for i in (0..300).step_by(6) {
                    let key = format!("cold-{i}");
                    states.lock().unwrap().get_mut(&key).unwrap().0.push(None);
                    if client.remove(table, key.as_bytes()).await.is_ok() {
                        states.lock().unwrap().get_mut(&key).unwrap().1 = 2;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        }
        for w in 0..4 {
            let (client, states) = (client.clone(), Arc::clone(&states));
            load.spawn(async move {
                for counter in 1u64.. {
                    for j in 0..60 {
                        let key = format!("k{w}-{j}");
                        let state = ((counter + j) % 4 != 0).then_some(counter);
                        states
                            .lock()
                            .unwrap()
                            .entry(key.clone())
                            .or_default()
                            .0
                            .push(state);
                        let done = match state {
                            Some(counter) => client
                                .write(table, key.as_bytes(), &value(&key, counter, 3000))
                                .await
                                .map(|_| ()),
                            None => client.remove(table, key.as_bytes()).await.map(|_| ()),
                        };
                        if done.is_ok() {
                            let mut states = states.lock().unwrap();
                            let entry = states.get_mut(&key).unwrap();
                            entry.1 = entry.0.len();
                        }
                    }
                }
            });
        }
        // Until the victim's cleaner has freed a good number of segments (32 MiB of
        // memory, 540 keys of 3 KB live: it cleans continually).
        let pool = RpcPool::new();
        let addr = cluster.addr(victim);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ping = pool
                .call::<Ping>(
                    &addr,
                    &PingRequest {},
                    Instant::now() + Duration::from_secs(5),
                )
                .await
                .unwrap();
            if ping.segments_cleaned >= 150 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cleaner never got going: {ping:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cluster.kill(victim);
        tokio::time::sleep(Duration::from_millis(200)).await;
        load.abort_all();
        while load.join_next().await.is_some() {}
        cluster.wait_recovered(&[victim]).await;
        let states = states.lock().unwrap().clone();
        assert_eq!(states.len(), 540);
        for (key, (attempted, acked)) in &states {
            let object = client.read(table, key.as_bytes()).await.unwrap();
            let found = object.map(|o| counter_of(&o.value));
            // The last acknowledged state, or one attempted after it.
            let allowed = &attempted[acked.saturating_sub(1)..];
            let fresh = *acked == 0 && found.is_none();
            assert!(
                fresh || allowed.contains(&found),
                "{key}: holds {found:?}; acknowledged {:?}, attempted after: {:?}",
                attempted.get(acked.wrapping_sub(1)),
                &attempted[*acked..]
            );
        }
        assert_ne!(owner_of(&cluster, &client, table, "k0"), victim);
    });
}

/// Deleted stays deleted (issue 39, item 1), as a user found it: keys written beside
/// cold data (which keeps their first segment in the log), overwritten, then deleted
/// and never written again; then enough overwrites of other keys that the owner's
/// cleaner runs pass after pass over the segments of the second versions and of the
/// removals; then `kill -9` of the owner. Every deleted key must read back absent after
/// the recovery (before the fix, most came back with their first value), and the cold
/// data must be intact.
#[test]
fn keys_deleted_after_an_overwrite_stay_deleted_through_cleaning_and_a_crash() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let mut cluster =
            Cluster::start(4, 2, &["--memory", "24MiB", "--value-bytes-max", "16KiB"]);
        let client = cluster.client().await;
        let table = client.create_table("deleted", 1).await.unwrap();
        let victim = owner_of(&cluster, &client, table, "doomed-0");
        const DOOMED: usize = 300;
        for i in 0..DOOMED {
            let cold = format!("cold-{i}");
            client
                .write(table, cold.as_bytes(), &value(&cold, 0, 16 * 1024))
                .await
                .unwrap();
            let key = format!("doomed-{i}");
            client
                .write(table, key.as_bytes(), &value(&key, 1, 100))
                .await
                .unwrap();
        }
        for i in 0..DOOMED {
            let key = format!("doomed-{i}");
            client
                .write(table, key.as_bytes(), &value(&key, 2, 100))
                .await
                .unwrap();
        }
        for i in 0..DOOMED {
            let key = format!("doomed-{i}");
            client.remove(table, key.as_bytes()).await.unwrap();
            assert!(client.read(table, key.as_bytes()).await.unwrap().is_none());
        }
        // 128 MB of overwrites of 40 other keys, four writers: the cleaner runs all
        // along in 24 MiB.
        let mut load = tokio::task::JoinSet::new();
        for w in 0..4u64 {
            let client = client.clone();
            load.spawn(async move {
                for counter in 0..2_000u64 {
                    let key = format!("churn-{w}-{}", counter % 10);
                    client
                        .write(table, key.as_bytes(), &value(&key, counter, 16 * 1024))
                        .await
                        .unwrap();
                }
            });
        }
        while let Some(done) = load.join_next().await {
            done.unwrap();
        }
        let pool = RpcPool::new();
        let ping = pool
            .call::<Ping>(
                &cluster.addr(victim),
                &PingRequest {},
                Instant::now() + Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert!(
            ping.segments_cleaned >= 100,
            "the cleaner barely ran: {ping:?}"
        );
        cluster.kill(victim);
        cluster.wait_recovered(&[victim]).await;
        let mut back = Vec::new();
        for i in 0..DOOMED {
            let key = format!("doomed-{i}");
            if let Some(object) = client.read(table, key.as_bytes()).await.unwrap() {
                back.push((key, counter_of(&object.value)));
            }
            let cold = format!("cold-{i}");
            let object = client.read(table, cold.as_bytes()).await.unwrap();
            assert_eq!(object.map(|o| counter_of(&o.value)), Some(0), "{cold}");
        }
        assert!(
            back.is_empty(),
            "{} of {DOOMED} deleted keys came back after the crash: {:?}",
            back.len(),
            &back[..back.len().min(5)]
        );
        assert_ne!(owner_of(&cluster, &client, table, "doomed-0"), victim);
    });
}

/// A master paused (SIGSTOP) long enough to be declared crashed is a zombie once
/// resumed: its tablets were recovered elsewhere and written there since. It must not
/// serve its old values (its lease ran out while it was paused, and the recovery waited
/// the lease out before the tablets went live), and it must exit with a failure status
/// once it hears that it was declared crashed (`Stopped::MasterFailed`).
#[test]
fn a_paused_master_declared_crashed_serves_no_stale_read_and_exits_when_resumed() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        // Coordinators that take a refused connection as proof of death: a paused
        // process refuses nothing (its kernel still accepts), so it is waited out.
        let lease_ms = rampart_coordinator::recovery_manager::LEASE_DEFAULT.as_millis() as u64;
        let coordinators = coordinators_proving_death(lease_ms, "direct");
        let mut cluster = Cluster::start_with(4, 2, &[], coordinators);
        let client = cluster.client().await;
        let table = client.create_table("zombie", 4).await.unwrap();
        fill(&client, table, "z", 200, 200).await;
        let victim = owner_of(&cluster, &client, table, "z0");
        let (mut zombie, _dir) = cluster.servers.remove(&victim).unwrap();
        zombie.signal(libc::SIGSTOP);
        let report = cluster.wait_recovered(&[victim]).await.remove(0);
        assert_eq!(report.lease_end, Some(LeaseEnd::Waited), "{report:#?}");
        assert!(report.lease_end_ms >= lease_ms, "{report:#?}");
        // A client that knows the new owners (the first one's map still names the
        // paused master: its write would time out there, with an unknown outcome).
        let client = cluster.client().await;
        let newer = value("z0", 1, 200);
        client.write(table, b"z0", &newer).await.unwrap();

        zombie.signal(libc::SIGCONT);
        // A client with a stale tablet map asks the resumed master directly.
        let pool = RpcPool::new();
        let request = ReadRequest {
            table,
            key: b"z0".to_vec().into(),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let stale = pool.call::<Read>(&zombie.addr, &request, deadline).await;
        assert!(
            !matches!(&stale, Ok(reply) if reply.status == Status::Ok),
            "the zombie served a read: {stale:?}"
        );
        let status = zombie.wait_exit(RECOVERY_TIMEOUT).unwrap();
        assert!(
            !status.success(),
            "a master declared crashed exits with a failure: {status}"
        );
        let object = client.read(table, b"z0").await.unwrap().unwrap();
        assert_eq!(object.value, newer);
        check_filled(&client, table, "z", 200).await;
    });
}

#[test]
fn two_servers_killed_at_once_are_recovered_concurrently() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let mut cluster = Cluster::start(6, 3, &[]);
        let client = cluster.client().await;
        let table = client.create_table("pair", 6).await.unwrap();
        fill(&client, table, "k", 4000, 1000).await;
        let first = owner_of(&cluster, &client, table, "k0");
        let second = (1..4000)
            .map(|i| owner_of(&cluster, &client, table, &format!("k{i}")))
            .find(|id| *id != first)
            .unwrap();
        cluster.kill(first);
        cluster.kill(second);
        let reports = cluster.wait_recovered(&[first, second]).await;
        // Both ran at once: each was declared before the other finished.
        let (a, b) = (&reports[0], &reports[1]);
        assert!(a.declared_unix_ms < b.declared_unix_ms + b.done_ms);
        assert!(b.declared_unix_ms < a.declared_unix_ms + a.done_ms);
        check_filled(&client, table, "k", 4000).await;
    });
}

#[test]
fn recovery_master_and_backup_killed_mid_recovery() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        // R = 3 and 7 servers: the victim, a recovery master and a backup die, and every
        // segment keeps a replica; the 4 survivors still have 3 backups each.
        let mut cluster = Cluster::start(7, 3, &[]);
        let client = cluster.client().await;
        let table = client.create_table("mid", 7).await.unwrap();
        fill(&client, table, "k", 12_000, 2000).await;
        let victim = owner_of(&cluster, &client, table, "k0");
        cluster.kill(victim);
        // As soon as a recovery master works on a partition, kill it, and one more
        // backup that is neither the victim nor that recovery master (the reads are
        // spread over every backup holding replicas, so it is the chosen source of some
        // segments: their recovery masters fall back to other replicas).
        let recovery_master = cluster
            .wait_for("a partition in replay", |reports| {
                reports
                    .iter()
                    .filter(|r| r.crashed == ServerId(victim))
                    .flat_map(|r| r.partitions.iter())
                    .find(|p| p.master.0 != 0 && p.live_ms == 0)
                    .map(|p| p.master.0)
            })
            .await;
        cluster.kill(recovery_master);
        let backup = *cluster.servers.keys().next().unwrap();
        cluster.kill(backup);
        cluster
            .wait_recovered(&[victim, recovery_master, backup])
            .await;
        check_filled(&client, table, "k", 12_000).await;
    });
}

#[test]
fn crash_right_after_a_segment_rollover_recovers_the_new_head() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let mut cluster = Cluster::start(4, 2, &[]);
        let client = cluster.client().await;
        let table = client.create_table("roll", 1).await.unwrap();
        // Values of 3/4 of a 256 KiB segment: every write opens a new segment (header,
        // digest; the previous one gets its footer), so the crash follows a rollover.
        for i in 0..12 {
            let key = format!("big{i}");
            client
                .write(table, key.as_bytes(), &value(&key, 0, 96 * 1024))
                .await
                .unwrap();
        }
        let victim = owner_of(&cluster, &client, table, "big0");
        cluster.kill(victim);
        cluster.wait_recovered(&[victim]).await;
        check_filled(&client, table, "big", 12).await;
    });
}

#[test]
fn missing_replica_makes_recovery_wait_until_its_backup_returns() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        // R = 1: each segment of the victim has a single replica.
        let mut cluster = Cluster::start(3, 1, &[]);
        let client = cluster.client().await;
        let table = client.create_table("lonely", 1).await.unwrap();
        fill(&client, table, "k", 300, 1000).await;
        let victim = owner_of(&cluster, &client, table, "k0");
        let others: Vec<u64> = cluster
            .servers
            .keys()
            .copied()
            .filter(|id| *id != victim)
            .collect();
        // Stop both other servers (gracefully: their backups keep what they hold on
        // disk), then kill the victim: its only replicas are on stopped backups.
        let dirs: Vec<PathBuf> = others.iter().map(|id| cluster.stop(*id)).collect();
        cluster.kill(victim);
        // Bring one back on a fresh disk: it can host recovery, but holds no replica.
        let spare = cluster.start_server(None);
        let waiting = cluster
            .wait_for("a waiting recovery", |reports| {
                reports
                    .iter()
                    .find(|r| r.crashed == ServerId(victim))
                    .and_then(|r| r.waiting.clone())
            })
            .await;
        assert!(waiting.contains("incomplete"), "{waiting}");
        assert!(waiting.contains("allow-loss"), "{waiting}");
        // The backups come back on their disks: the recovery proceeds.
        for dir in dirs {
            cluster.start_server(Some(dir));
        }
        cluster.wait_recovered(&[victim]).await;
        check_filled(&client, table, "k", 300).await;
        let _ = spare;
    });
}

#[test]
fn cold_start_brings_every_table_back() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let mut cluster = Cluster::start(4, 2, &[]);
        let client = cluster.client().await;
        let a = client.create_table("alpha", 4).await.unwrap();
        let b = client.create_table("beta", 1).await.unwrap();
        fill(&client, a, "a", 1500, 700).await;
        fill(&client, b, "b", 200, 3000).await;
        client.remove(a, b"a7").await.unwrap();
        drop(client);
        // Stop everything: coordinators first (so nothing is recovered while the servers
        // go down), then every server gracefully.
        for id in 1..=3 {
            cluster.group.kill(id);
        }
        let ids: Vec<u64> = cluster.servers.keys().copied().collect();
        let dirs: Vec<PathBuf> = ids.iter().map(|id| cluster.stop(*id)).collect();
        let client = cluster.cold_start(dirs, &ids).await;
        check_filled(&client, a, "a", 7).await;
        assert_eq!(
            client.read(a, b"a7").await.unwrap(),
            None,
            "a removed key stays removed"
        );
        for i in 8..1500 {
            let key = format!("a{i}");
            let object = client.read(a, key.as_bytes()).await.unwrap();
            assert!(object.is_some(), "{key} lost in the cold start");
        }
        check_filled(&client, b, "b", 200).await;
        // And the cluster takes writes again.
        client.write(a, b"after", b"cold start").await.unwrap();
        let _ = cluster.addr(*cluster.servers.keys().next().unwrap());
    });
}

/// Issue 12, item 6: SIGKILL of every server and coordinator in the middle of a write
/// load (an OOM kill of the host's processes, a killed terminal) loses no acknowledged
/// write. The load stays below a segment per master, so none of it is on any disk: every
/// replica is in the backups' frame files, which outlive the processes and are read back
/// when the servers start again on their data directories. Before that, every master's
/// recovery waited with "0 replicas found".
#[test]
fn killing_every_process_under_write_load_loses_no_acknowledged_write() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let mut cluster = Cluster::start(4, 2, &[]);
        let client = cluster.client().await;
        let table = client.create_table("load", 4).await.unwrap();
        // Writers record each attempt before it and each acknowledgement after it, in
        // one shared history, so that aborting them keeps what they learned.
        let history = Arc::new(Mutex::new(History::new()));
        let mut load = tokio::task::JoinSet::new();
        for w in 0..4 {
            let (client, history) = (client.clone(), Arc::clone(&history));
            load.spawn(async move {
                for counter in 1u64.. {
                    for j in 0..25 {
                        let key = format!("w{w}-{j}");
                        history
                            .lock()
                            .unwrap()
                            .entry(key.clone())
                            .or_insert((None, 0))
                            .1 = counter;
                        let written = client
                            .write(table, key.as_bytes(), &value(&key, counter, 200))
                            .await;
                        if written.is_ok() {
                            history.lock().unwrap().get_mut(&key).unwrap().0 = Some(counter);
                        }
                    }
                }
            });
        }
        let acked = |history: &History| history.values().filter(|(a, _)| a.is_some()).count();
        let deadline = Instant::now() + Duration::from_secs(30);
        while acked(&history.lock().unwrap()) < 100 {
            assert!(Instant::now() < deadline, "the load never got going");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Let every key be rewritten a few times, then kill everything mid-load.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ids: Vec<u64> = cluster.servers.keys().copied().collect();
        let dirs: Vec<PathBuf> = ids.iter().map(|id| cluster.kill(*id)).collect();
        for id in 1..=3 {
            cluster.group.kill(id);
        }
        load.abort_all();
        while load.join_next().await.is_some() {}
        let history = history.lock().unwrap().clone();
        assert_eq!(
            acked(&history),
            100,
            "every key was acknowledged at least once"
        );
        drop(client);
        let client = cluster.cold_start(dirs, &ids).await;
        check_history(&client, table, &history).await;
        client.write(table, b"after", b"the kill").await.unwrap();
    });
}

/// Coordinators that misbehave at failpoint `name` (`rampart_common::failpoints`).
fn coordinators_with_failpoint(name: &str) -> CoordinatorGroup {
    CoordinatorGroup::start_with(3, &[], &[(FAILPOINTS_ENV, name)]).unwrap()
}

/// Fills 400 keys of table `t` in a 4-server cluster whose coordinators misbehave at
/// `failpoint`, kills a master, and reads back every key once it is recovered. Returns
/// the cluster and the recovery's report.
async fn crash_with_coordinators_failing_at(failpoint: &str) -> (Cluster, RecoveryReport) {
    let group = coordinators_with_failpoint(failpoint);
    let mut cluster = Cluster::start_with(4, 2, &[], group);
    let client = cluster.client().await;
    let table = client.create_table("t", 4).await.unwrap();
    fill(&client, table, "k", 400, 500).await;
    let victim = owner_of(&cluster, &client, table, "k0");
    cluster.kill(victim);
    let mut reports = cluster.wait_recovered(&[victim]).await;
    check_filled(&client, table, "k", 400).await;
    (cluster, reports.remove(0))
}

/// [`crash_with_coordinators_failing_at`], alone.
fn recover_with_coordinators_failing_at(failpoint: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(crash_with_coordinators_failing_at(failpoint));
}

#[test]
fn recovered_tablets_whose_push_was_lost_go_live_all_the_same() {
    // The leader never tells a recovery master to take its partition, as if it died
    // right after the commit: the new owner must still come to serve it.
    recover_with_coordinators_failing_at(failpoints::LOSE_RECOVERED_PUSH);
}

#[test]
fn a_recovered_partition_of_unknown_outcome_is_resolved_from_the_committed_map() {
    // Every partition commits, but the leader is told the outcome is unknown: it must
    // find out from the committed map, not guess (abandoning a committed partition makes
    // its owner forget the objects the map says it serves).
    recover_with_coordinators_failing_at(failpoints::RECOVERED_OUTCOME_UNKNOWN);
}

#[test]
fn a_partition_replayed_for_nobody_is_forgotten_when_the_recovery_finishes() {
    // The first recovery master of each partition replays it, but its reply and the
    // abandon that would follow are lost: the partition goes to another master, and the
    // first holds a copy for nobody. The end of the recovery must free it (and no later
    // range change could bring it back to life).
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let (cluster, report) =
            crash_with_coordinators_failing_at(failpoints::LOSE_RECOVER_REPLY_AND_ABANDON).await;
        let tries: Vec<u32> = report.partitions.iter().map(|p| p.attempts).collect();
        assert!(
            tries.iter().all(|&t| t >= 2),
            "the failpoint did not fire: tries per partition {tries:?}"
        );
        let pool = RpcPool::new();
        let mut held = BTreeMap::new();
        for (&id, (process, _)) in &cluster.servers {
            let deadline = Instant::now() + Duration::from_secs(5);
            let ping = pool
                .call::<Ping>(&process.addr, &PingRequest {}, deadline)
                .await
                .unwrap();
            held.insert(id, ping.objects);
        }
        assert_eq!(
            held.values().sum::<u64>(),
            400,
            "objects held by each master: {held:?}"
        );
    });
}

#[test]
fn a_server_restarted_at_a_crashed_servers_address_never_serves_its_tablets() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        // A 4 s lease, and coordinators that take a refusal, or another server at the
        // address, as proof of death: the impostor is proof, and must do no harm.
        let group = coordinators_proving_death(4_000, "direct");
        let mut cluster = Cluster::start_with(4, 2, &[], group);
        let client = cluster.client().await;
        let table = client.create_table("users", 4).await.unwrap();
        fill(&client, table, "k", 400, 200).await;
        let victim = owner_of(&cluster, &client, table, "k0");
        let addr = cluster.addr(victim);
        cluster.kill(victim);
        // The operator restarts a server on the dead one's address (a fresh memory: a
        // new server) and creates the table again, as a script might.
        let impostor = cluster.start_server_at(&addr, None);
        assert_ne!(impostor, victim);
        let started = Instant::now();
        let again = client.create_table("users", 4).await.unwrap();
        assert_eq!(again, table);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "create-table of an existing table waited for the recovery: {:?}",
            started.elapsed()
        );
        // Every key reads back its value: the victim's keys once recovered, never "not
        // found" from an empty impostor.
        check_filled(&client, table, "k", 400).await;
        let report = cluster.wait_recovered(&[victim]).await.remove(0);
        assert!(
            matches!(
                report.lease_end,
                Some(LeaseEnd::Refused | LeaseEnd::OtherServer)
            ),
            "the dead port, or the impostor on it, is proof: {report:#?}"
        );
        assert_ne!(owner_of(&cluster, &client, table, "k0"), impostor);
    });
}

#[test]
fn a_master_that_never_wrote_is_recovered_with_its_tablets_empty() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        // A table over every master, and not one write: a master's log must still be on
        // its backups (its first segment's header), or its tablets never come back.
        let mut cluster = Cluster::start(4, 2, &[]);
        let client = cluster.client().await;
        let table = client.create_table("idle", 4).await.unwrap();
        let victim = owner_of(&cluster, &client, table, "k0");
        cluster.kill(victim);
        cluster.wait_recovered(&[victim]).await;
        assert_eq!(client.read(table, b"k0").await.unwrap(), None);
        client.write(table, b"k0", b"after").await.unwrap();
        assert_ne!(owner_of(&cluster, &client, table, "k0"), victim);
    });
}

#[test]
fn allow_loss_lets_a_recovery_finish_even_when_no_replica_survived() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        // Every server is killed while each log is still its first, open segment: its
        // replicas lived only in the backups' frames, and the servers are replaced by
        // new ones on fresh disks (the hosts are gone). The recoveries wait ("no backup
        // holds any replica") until the operator accepts the loss; then they must finish,
        // the tablets coming back empty.
        let mut cluster = Cluster::start(3, 2, &[]);
        let client = cluster.client().await;
        let table = client.create_table("gone", 3).await.unwrap();
        fill(&client, table, "k", 30, 100).await;
        let dead: Vec<u64> = cluster.servers.keys().copied().collect();
        for id in &dead {
            cluster.kill(*id);
        }
        for _ in 0..3 {
            cluster.start_server(None);
        }
        for id in &dead {
            cluster
                .wait_for("a recovery waiting for lost replicas", |reports| {
                    reports
                        .iter()
                        .find(|r| r.crashed == ServerId(*id))
                        .and_then(|r| r.waiting.clone())
                })
                .await;
            cluster.allow_loss(*id);
        }
        cluster.wait_recovered(&dead).await;
        assert_eq!(client.read(table, b"k0").await.unwrap(), None);
        client.write(table, b"k0", b"after the loss").await.unwrap();
    });
}

#[test]
fn versions_keep_increasing_past_allow_loss() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        // "k" is written once into a segment that then closes (its replicas go to disk),
        // and overwritten five times in the head, which lives only in the backups' frames.
        // The host loses power: the head is lost with the frame files (memory). With
        // allow-loss, "k" comes back with its first value — but its version must be above
        // every version it ever had.
        let mut cluster = Cluster::start(3, 2, &[]);
        let client = cluster.client().await;
        let table = client.create_table("history", 1).await.unwrap();
        client.write(table, b"k", b"first").await.unwrap();
        for i in 0..4 {
            let key = format!("big{i}");
            client
                .write(table, key.as_bytes(), &value(&key, 0, 96 * 1024))
                .await
                .unwrap();
        }
        let mut last = 0;
        for i in 0..5 {
            last = client
                .write(table, b"k", format!("later {i}").as_bytes())
                .await
                .unwrap()
                .0;
        }
        let dead: Vec<u64> = cluster.servers.keys().copied().collect();
        let dirs: Vec<PathBuf> = dead.iter().map(|id| cluster.kill(*id)).collect();
        // The power loss, as the servers see it: their disks are there, their frame files
        // are not. (A server started on a moved data directory has another frame file,
        // and the old one is swept: the directory it belonged to is gone.)
        for dir in dirs {
            let moved = dir.with_extension("after-power-loss");
            std::fs::rename(&dir, &moved).unwrap();
            cluster.start_server(Some(moved));
        }
        for id in &dead {
            cluster.allow_loss_unless_recovered(*id).await;
        }
        cluster.wait_recovered(&dead).await;
        let object = client.read(table, b"k").await.unwrap().expect("k survives");
        assert_eq!(
            &object.value[..],
            b"first",
            "the head's overwrites were lost"
        );
        assert!(
            object.version.0 > last,
            "k came back at version {}, but version {last} was handed out before the loss",
            object.version.0
        );
        let again = client.write(table, b"k", b"after").await.unwrap();
        assert!(again > object.version);
    });
}
