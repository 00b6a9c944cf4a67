//! `rampart-tests`: helpers for multi-process integration tests.
//!
//! [`LocalCluster`] runs `rampart cluster up` as a real child process on loopback
//! with free ports, parses its announce lines, and stops it on drop. [`rampart`] runs
//! one `rampart` command (such as `rampart kv get`) and captures its output.
//!
//! The `rampart` executable is found through `RAMPART_BIN`, or next to the test binary
//! (`target/<profile>/rampart`, which `cargo test --workspace` builds because the ops
//! crate has integration tests of its own).

use anyhow::{anyhow, bail, Context, Result};
use rampart_common::announce::{Announce, ClusterLine, Pages, Speaker};
use rampart_common::failpoints::FAILPOINTS_ENV;
use rampart_common::onesided::shm::remove_default_frame_files_under;
use rampart_ops::launch::{self, Starting};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a cluster may take to print its `ready` line.
pub const CLUSTER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Frames each test server's backup allocates (`--backup-frames`) unless a test says
/// otherwise: a backup allocates its whole frame file at start-up (8 MiB per frame), and
/// tests run several clusters side by side; 16 frames hold every segment a test's few
/// masters keep open or closing at once.
pub const TEST_BACKUP_FRAMES: &str = "16";

/// `cluster up` flags for small servers: 1 MiB segments, so tests roll over often.
pub const SMALL_SERVERS: &[&str] = &[
    "--memory",
    "64MiB",
    "--segment-bytes",
    "1MiB",
    "--value-bytes-max",
    "64KiB",
];

/// The path of the `rampart` executable under test.
pub fn rampart_bin() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("RAMPART_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test binary> → target/<profile>/rampart
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or_else(|| anyhow!("cannot locate the target directory from {}", exe.display()))?;
    let bin = profile_dir.join("rampart");
    if !bin.exists() {
        bail!(
            "{} does not exist: build it with `cargo build -p rampart-ops` or set RAMPART_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// A `rampart cluster up` process and what it announced.
#[derive(Debug)]
pub struct LocalCluster {
    /// The coordinators' addresses, comma-separated (as `RAMPART_COORDINATOR` takes them).
    pub coordinator: String,
    /// (Raft id, address, pid) of each coordinator.
    pub coordinators: Vec<(u64, String, u32)>,
    /// (server id, address, pid) of each storage server.
    pub servers: Vec<(u64, String, u32)>,
    /// The status page URL of each coordinator (`coordinator N status page URL ...`).
    pub status_pages: Vec<String>,
    /// The metrics URL of each process, coordinators first.
    pub metrics: Vec<String>,
    /// The Redis-protocol gateway's address and pid (`gateway at ADDR (pid P) ...`).
    pub gateway: Option<(String, u32)>,
    child: Child,
    /// Lines the cluster printed after `ready` (e.g. "server 2 exited ...").
    _lines: mpsc::Receiver<String>,
    /// The servers' data; dropped after the processes are stopped (`Drop` below runs
    /// before the fields are dropped).
    _data_dir: tempfile::TempDir,
}

impl LocalCluster {
    /// Starts a cluster with `servers` storage servers and extra `cluster up` flags,
    /// its data in a fresh temporary directory (removed on drop).
    pub fn start(servers: u32, extra: &[&str]) -> Result<LocalCluster> {
        LocalCluster::start_on(tempfile::TempDir::new()?, servers, extra)
    }

    /// [`LocalCluster::start`] on `data_dir`, which may hold a cluster's data already
    /// (removed on drop).
    pub fn start_on(
        data_dir: tempfile::TempDir,
        servers: u32,
        extra: &[&str],
    ) -> Result<LocalCluster> {
        LocalCluster::start_with_env(data_dir, servers, extra, &[])
    }

    /// [`LocalCluster::start_on`] with `env` set for `cluster up` and every process it
    /// starts (failpoints, [`FAILPOINTS_ENV`]).
    pub fn start_with_env(
        data_dir: tempfile::TempDir,
        servers: u32,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<LocalCluster> {
        let mut command = Command::new(rampart_bin()?);
        command.envs(env.iter().copied());
        command
            .args([
                "cluster",
                "up",
                "--coordinator-addr",
                "127.0.0.1:0",
                "--servers",
            ])
            .arg(servers.to_string())
            .arg("--data-dir")
            .arg(data_dir.path())
            .args(
                Some(["--backup-frames", TEST_BACKUP_FRAMES])
                    .filter(|_| !extra.contains(&"--backup-frames"))
                    .into_iter()
                    .flatten(),
            )
            // Rebalancing off unless the test asks: what it checks stays put.
            .args(
                Some(["--rebalance", "off"])
                    .filter(|_| !extra.contains(&"--rebalance"))
                    .into_iter()
                    .flatten(),
            )
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().context("cannot start rampart cluster up")?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut coordinators = Vec::new();
        let mut announced = Vec::new();
        let mut status_pages = Vec::new();
        let mut metrics = Vec::new();
        let mut gateway = None;
        let deadline = Instant::now() + CLUSTER_START_TIMEOUT;
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let line = match lines.recv_timeout(wait) {
                Ok(line) => line,
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("cluster did not print `ready` within {CLUSTER_START_TIMEOUT:?}");
                }
            };
            match ClusterLine::parse(&line) {
                Some(ClusterLine::Started {
                    speaker, addr, pid, ..
                }) => match speaker {
                    Speaker::Coordinator(id) => coordinators.push((id, addr, pid)),
                    Speaker::Server(id) => announced.push((id, addr, pid)),
                    Speaker::Gateway => gateway = Some((addr, pid)),
                    Speaker::Echo => {}
                },
                Some(ClusterLine::Pages(Pages {
                    status,
                    metrics: url,
                    ..
                })) => {
                    status_pages.extend(status);
                    metrics.push(url);
                }
                Some(ClusterLine::Ready { .. }) => break,
                None => {}
            }
        }
        if coordinators.is_empty() {
            bail!("no coordinator line");
        }
        let coordinator = coordinators
            .iter()
            .map(|(_, addr, _)| addr.as_str())
            .collect::<Vec<_>>()
            .join(",");
        Ok(LocalCluster {
            coordinator,
            coordinators,
            servers: announced,
            status_pages,
            metrics,
            gateway,
            child,
            _lines: lines,
            _data_dir: data_dir,
        })
    }

    /// The cluster's data directory (server N's data in `server-N`).
    pub fn data_dir(&self) -> &std::path::Path {
        self._data_dir.path()
    }

    /// The `cluster up` process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the `cluster up` process.
    pub fn signal(&self, signal: i32) {
        signal_child(&self.child, signal);
    }

    /// Waits for the `cluster up` process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        wait_child(&mut self.child, timeout)
    }

    /// A client of this cluster whose operations may take `deadline`, retries included.
    pub async fn client(&self, deadline: Duration) -> Result<rampart_client::Client> {
        let options = rampart_client::ClientOptions {
            deadline,
            ..rampart_client::ClientOptions::default()
        };
        Ok(rampart_client::Client::connect_with(&[self.coordinator.as_str()], options).await?)
    }

    /// Runs `rampart ARGS...` against this cluster (RAMPART_COORDINATOR set).
    pub fn rampart(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Output> {
        rampart(args, stdin, &[("RAMPART_COORDINATOR", &self.coordinator)])
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGTERM);
            if self.wait_exit(Duration::from_secs(10)).is_err() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        // The servers keep their frame files (in /dev/shm) for a restart; there is none.
        remove_default_frame_files_under(self._data_dir.path());
    }
}

/// Sends `request` over a fresh TCP connection to `addr` and reads until `expected`
/// bytes of reply came, the peer closed, or 15 s passed without a byte (a raw RESP
/// exchange with the gateway, say).
pub fn raw_exchange(addr: &str, request: &[u8], expected: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    stream.write_all(request)?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while reply.len() < expected {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
    }
    Ok(reply)
}

/// A plain HTTP GET of `url` (`http://HOST:PORT/PATH`): the status code and the body.
pub fn http_get(url: &str, timeout: Duration) -> Result<(u16, String)> {
    use std::io::Read;
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("not an http:// URL: {url}"))?;
    let (host, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let addr: std::net::SocketAddr = host.parse().with_context(|| format!("address {host}"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no complete response head from {url}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("no status code from {url}"))?;
    Ok((status, body.to_string()))
}

/// Runs `rampart ARGS...` with `env`, feeding `stdin`, and captures its output.
pub fn rampart(args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Result<Output> {
    let mut command = Command::new(rampart_bin()?);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A developer's shell may set these; a test says what it wants through `env`.
    for inherited in [
        "RAMPART_AUTH_TOKEN_FILE",
        "RAMPART_CLUSTER_FILE",
        "RAMPART_TLS_CA",
    ] {
        command.env_remove(inherited);
    }
    command.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn()?;
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
        pipe.write_all(bytes)?;
    }
    Ok(child.wait_with_output()?)
}

/// The runtime integration tests drive clients from: two workers, like the machine.
///
/// # Panics
/// If the runtime cannot be built.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("cannot build a tokio runtime")
}

/// Whether process `pid` still exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit(") ")
            .next()
            .is_some_and(|rest| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// One `rampart` process started directly (a coordinator or a server), with the
/// address it announced. Killed on drop.
#[derive(Debug)]
pub struct RampartProcess {
    /// The address it announced (`... listening on ADDR`).
    pub addr: String,
    /// Who announced it: a server says its id.
    pub speaker: Speaker,
    child: Child,
}

impl RampartProcess {
    /// The server id a storage server announced (`server ID listening on ADDR`).
    ///
    /// # Panics
    /// If this process is not a storage server.
    pub fn server_id(&self) -> u64 {
        self.speaker
            .server_id()
            .unwrap_or_else(|| panic!("{} is not a storage server", self.speaker))
    }

    /// Starts `rampart ARGS...` and waits (up to [`CLUSTER_START_TIMEOUT`]) for its
    /// `listening on` line.
    pub fn start(args: &[&str]) -> Result<RampartProcess> {
        RampartProcess::start_with_env(args, &[])
    }

    /// [`RampartProcess::start`] with more environment variables (failpoints, say).
    pub fn start_with_env(args: &[&str], env: &[(String, String)]) -> Result<RampartProcess> {
        let mut command = Command::new(rampart_bin()?);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        RampartProcess::spawn(command, args)
    }

    /// [`RampartProcess::start`] inside network namespace `netns` (`ip netns exec`,
    /// which replaces itself with `rampart`: the pid is rampart's), logging warnings
    /// only unless `RAMPART_LOG` says otherwise.
    pub fn start_in_netns(netns: &str, args: &[&str]) -> Result<RampartProcess> {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", netns])
            .arg(rampart_bin()?)
            .args(args)
            .env(
                "RAMPART_LOG",
                std::env::var("RAMPART_LOG").unwrap_or_else(|_| "warn".to_string()),
            );
        RampartProcess::spawn(command, args)
    }

    fn spawn(command: Command, args: &[&str]) -> Result<RampartProcess> {
        let (starting, failpoints) = start_process(command, args)?;
        listening(starting, failpoints)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process with SIGTERM (a graceful stop) and waits up to `timeout` for it
    /// to exit; kills it if it does not.
    pub fn stop(mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        signal_child(&self.child, libc::SIGTERM);
        wait_child(&mut self.child, timeout).inspect_err(|_| {
            let _ = self.child.kill();
        })
    }

    /// Sends `signal` to the process (SIGSTOP and SIGCONT pause and resume it).
    pub fn signal(&self, signal: i32) {
        signal_child(&self.child, signal);
    }

    /// Waits up to `timeout` for the process to exit on its own; its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        wait_child(&mut self.child, timeout)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `signal` to `child`.
fn signal_child(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own child's pid; it has not been reaped (we hold it).
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
}

/// Waits up to `timeout` for `child` to exit; its exit status.
fn wait_child(child: &mut Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            bail!("process {} did not exit within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for RampartProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `starting`'s `listening on` line: the running process. With failpoints
/// named in its environment (`failpoints`), refuses a build that does not say it has
/// them compiled in.
fn listening(starting: Starting, failpoints: bool) -> Result<RampartProcess> {
    let mut said = false;
    let listening = starting.wait_listening(|announce| {
        if let Announce::Failpoints { compiled_in, .. } = announce {
            if failpoints && !compiled_in {
                bail!(
                    "{announce}. This test needs the failpoints: build the binary with \
                     `cargo test -p rampart-ops -p rampart-tests --no-run` (a plain `cargo \
                     build` or `cargo test -p rampart-ops` in the same target directory \
                     replaces it with one without them): {}",
                    rampart_bin()?.display()
                );
            }
            said = true;
        }
        Ok(())
    })?;
    // Held first: a process refused below is killed as this drops.
    let process = RampartProcess {
        addr: listening.addr,
        speaker: listening.speaker,
        child: listening.child,
    };
    if failpoints && !said {
        bail!(
            "{} did not say its failpoints are compiled in: {} is an older build, or one \
             without them",
            listening.name,
            rampart_bin()?.display()
        );
    }
    Ok(process)
}

/// Starts `command` (`rampart ARGS...`), its start-up lines read as `cluster up` reads
/// its children's ([`Starting`]); whether its environment names failpoints.
fn start_process(command: Command, args: &[&str]) -> Result<(Starting, bool)> {
    let failpoints = command
        .get_envs()
        .any(|(key, value)| key == FAILPOINTS_ENV && value.is_some_and(|v| !v.is_empty()));
    let name = format!("rampart {args:?}");
    Ok((
        Starting::spawn(&name, command, CLUSTER_START_TIMEOUT)?,
        failpoints,
    ))
}

/// A Raft group of `rampart coordinator` processes on free loopback ports, started
/// directly so a test can kill and restart members. Each member keeps its data directory
/// (under one temporary directory) across restarts.
#[derive(Debug)]
pub struct CoordinatorGroup {
    /// (Raft id, address) of every member.
    pub peers: Vec<(u64, String)>,
    /// Each member's data directory; a test may point a member at a new one.
    pub dirs: std::collections::BTreeMap<u64, PathBuf>,
    /// The running members.
    processes: std::collections::BTreeMap<u64, RampartProcess>,
    /// Flags every member is started with, beyond its id, peers and data directory.
    flags: Vec<String>,
    /// Environment every member is started with (failpoints, say).
    env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl CoordinatorGroup {
    /// Starts `size` coordinators with ids 1..=size.
    pub fn start(size: u64) -> Result<CoordinatorGroup> {
        CoordinatorGroup::start_with(size, &[], &[])
    }

    /// Starts `size` coordinators with ids 1..=size, each with `flags` (such as
    /// `--lease-ms 4000`) and the environment `env` (such as failpoints), now and at every
    /// restart.
    pub fn start_with(size: u64, flags: &[&str], env: &[(&str, &str)]) -> Result<CoordinatorGroup> {
        let dir = tempfile::TempDir::new()?;
        let dirs: std::collections::BTreeMap<u64, PathBuf> = (1..=size)
            .map(|id| (id, dir.path().join(format!("coordinator-{id}"))))
            .collect();
        // Each member binds a free port itself and is told its peers' on stdin once all
        // are bound (`--peers -`): no port is picked by anyone who does not hold it.
        let mut members = Vec::new();
        let mut failpoints = false;
        for (id, data_dir) in &dirs {
            let id = id.to_string();
            let data_dir = data_dir
                .to_str()
                .ok_or_else(|| anyhow!("no UTF-8 data directory for member {id}"))?;
            let mut args = vec![
                "coordinator",
                "--id",
                &id,
                "--listen",
                "127.0.0.1:0",
                "--peers",
                "-",
                "--data-dir",
                data_dir,
            ];
            // Rebalancing off unless the test asks: what it checks stays put.
            if !flags.contains(&"--rebalance") {
                args.extend(["--rebalance", "off"]);
            }
            args.extend(flags);
            let mut command = Command::new(rampart_bin()?);
            command.args(&args).envs(env.iter().copied());
            let member;
            (member, failpoints) = start_process(command, &args)?;
            members.push(member);
        }
        let bound = launch::start_group(&mut members)?;
        let peers: Vec<(u64, String)> = (1..).zip(bound).collect();
        let mut processes = std::collections::BTreeMap::new();
        for (id, member) in (1..=size).zip(members) {
            processes.insert(id, listening(member, failpoints)?);
        }
        Ok(CoordinatorGroup {
            peers,
            dirs,
            processes,
            flags: flags.iter().map(|f| f.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _dir: dir,
        })
    }

    /// Every member's address, comma-separated (for `--coordinator` and clients).
    pub fn addrs(&self) -> String {
        let addrs: Vec<&str> = self.peers.iter().map(|(_, a)| a.as_str()).collect();
        addrs.join(",")
    }

    /// Kills member `id` with SIGKILL.
    pub fn kill(&mut self, id: u64) {
        if let Some(process) = self.processes.remove(&id) {
            process.kill();
        }
    }

    /// Starts member `id` (again) on its data directory.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.restart_with(id, &[])
    }

    /// Starts member `id` (again) on its data directory, with more flags.
    pub fn restart_with(&mut self, id: u64, extra: &[&str]) -> Result<()> {
        let args = self.member_args(id)?;
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(self.flags.iter().map(String::as_str));
        args.extend_from_slice(extra);
        if !args.contains(&"--rebalance") {
            args.extend(["--rebalance", "off"]);
        }
        let process = RampartProcess::start_with_env(&args, &self.env)?;
        self.processes.insert(id, process);
        Ok(())
    }

    /// The `rampart coordinator ...` arguments of member `id`.
    pub fn member_args(&self, id: u64) -> Result<Vec<String>> {
        let addrs: Vec<&str> = self.peers.iter().map(|(_, a)| a.as_str()).collect();
        let data_dir = self
            .dirs
            .get(&id)
            .and_then(|d| d.to_str())
            .ok_or_else(|| anyhow!("no UTF-8 data directory for member {id}"))?;
        Ok(vec![
            "coordinator".into(),
            "--id".into(),
            id.to_string(),
            "--peers".into(),
            launch::peers_list(&addrs),
            "--data-dir".into(),
            data_dir.into(),
        ])
    }

    /// The member every running member agrees leads, waiting up to `timeout`.
    pub async fn leader(&self, timeout: Duration) -> Result<u64> {
        use rampart_common::protocol::coordinator::{RaftStatus, RaftStatusRequest};
        let pool = rampart_common::rpc::RpcPool::new();
        let deadline = Instant::now() + timeout;
        loop {
            let mut leaders = Vec::new();
            for (id, addr) in &self.peers {
                if !self.processes.contains_key(id) {
                    continue;
                }
                let call = tokio::time::Instant::now() + Duration::from_millis(500);
                match pool
                    .call::<RaftStatus>(addr, &RaftStatusRequest {}, call)
                    .await
                {
                    Ok(status) => leaders.push(status.leader_id),
                    Err(_) => leaders.push(0),
                }
            }
            if let Some(&leader) = leaders.first() {
                if leader != 0 && leaders.iter().all(|l| *l == leader) {
                    return Ok(leader);
                }
            }
            if Instant::now() >= deadline {
                bail!("no agreed leader within {timeout:?}: {leaders:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts a storage server enlisting with this group; `extra` are more flags.
    pub fn start_server(
        &self,
        data_dir: &std::path::Path,
        extra: &[&str],
    ) -> Result<RampartProcess> {
        self.start_server_at("127.0.0.1:0", data_dir, extra)
    }

    /// Starts a storage server listening on `listen`, enlisting with this group; `extra`
    /// are more flags.
    pub fn start_server_at(
        &self,
        listen: &str,
        data_dir: &std::path::Path,
        extra: &[&str],
    ) -> Result<RampartProcess> {
        let data_dir = data_dir
            .to_str()
            .ok_or_else(|| anyhow!("non-UTF-8 data dir"))?;
        let addrs = self.addrs();
        let mut args = vec![
            "server",
            "--coordinator",
            &addrs,
            "--listen",
            listen,
            "--data-dir",
            data_dir,
        ];
        if !extra.contains(&"--backup-frames") {
            args.extend(["--backup-frames", TEST_BACKUP_FRAMES]);
        }
        args.extend_from_slice(extra);
        RampartProcess::start(&args)
    }
}
