//! `Children`: child processes of this binary (coordinators, servers) that never
//! outlive their parent.
//!
//! Each child is this same executable with a subcommand. It prints one line naming its
//! bound address (`rampart_common::announce`); [`Children::spawn`] waits for that line
//! (with a timeout, through `rampart_ops::launch`, as the tests' harness does) and
//! returns the address. Orphans are prevented twice: children ask the kernel for SIGTERM when
//! the parent dies (`PR_SET_PDEATHSIG`, which covers a SIGKILLed parent), and dropping
//! `Children` terminates them (SIGTERM, then SIGKILL after a grace period). Each child
//! has a process group of its own, so that Ctrl-C on a terminal reaches the parent
//! alone, which then stops them in order.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not only the
//! process: start children from a thread that lives as long as they should (the main
//! thread), or they are stopped when a short-lived thread that started them ends.

use anyhow::{anyhow, bail, Context, Result};
use rampart_common::announce::Speaker;
use rampart_ops::launch::Starting;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long a child may take to print its address.
pub const CHILD_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a child may take to exit after SIGTERM before it is killed.
pub const CHILD_STOP_GRACE: Duration = Duration::from_secs(3);

/// One running child.
#[derive(Debug)]
pub struct Running {
    /// What it is, for messages ("coordinator", "server 2").
    pub name: String,
    /// The address it announced.
    pub addr: String,
    /// Who said it was listening (a server says its id).
    pub speaker: Option<Speaker>,
    /// The HTTP URLs it announced before that line (`... metrics at http://...`), in
    /// order: a server's metrics; a coordinator's status page, then its metrics.
    pub urls: Vec<String>,
    child: Child,
    exited: Option<ExitStatus>,
    /// Its CPU ticks and page faults when [`Children::usage`] last read them: what it
    /// counts for once it has exited and `/proc` no longer has them.
    usage_seen: std::cell::Cell<ProcUsage>,
}

/// What a process has used so far, from its `/proc/PID/stat` line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ProcUsage {
    /// User plus system clock ticks, all threads.
    cpu_ticks: u64,
    /// Minor page faults: pages mapped without a disk read, most of them fresh memory
    /// the kernel zeroed on first touch.
    minor_faults: u64,
}

/// What the children have used so far, all of them together ([`Children::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// CPU-seconds, user and system, all threads.
    pub cpu_s: f64,
    /// Minor page faults.
    pub minor_faults: u64,
}

impl Usage {
    /// What was used between `earlier` and this reading.
    pub fn since(self, earlier: Usage) -> Usage {
        Usage {
            cpu_s: self.cpu_s - earlier.cpu_s,
            minor_faults: self.minor_faults.saturating_sub(earlier.minor_faults),
        }
    }
}

/// The CPU time of every thread of the running children at one moment
/// ([`Children::thread_cpu`]); [`ThreadCpu::since`] turns two readings into CPU-seconds
/// by kind of process and name of thread: where a benchmark's CPU went.
///
/// A thread's time is its `schedstat` (nanoseconds on a CPU), a process's its `stat`
/// (user plus system, in clock ticks: the kernel scales them to the same nanoseconds,
/// then rounds each down to a tick). So a process's ticks against the sum of its threads'
/// nanoseconds differ by less than a tick at each reading, and by more only when threads
/// exited in between.
#[derive(Clone, Debug, Default)]
pub struct ThreadCpu {
    /// (pid, tid) → (thread name, nanoseconds); the kind is its process's.
    threads: HashMap<(u32, u32), (String, u64)>,
    /// pid → (kind of process, nanoseconds of the whole process, exited threads
    /// included, rounded down to a clock tick).
    processes: HashMap<u32, (String, u64)>,
}

/// How [`ThreadCpu::since`] names the CPU time of threads that exited in between: the
/// kernel adds it to their process's, and no thread of `/proc` shows it any more.
pub const EXITED_THREADS: &str = "(threads gone since)";

impl ThreadCpu {
    /// CPU-seconds spent between `earlier` and this reading, keyed "KIND: THREAD NAME"
    /// (`server: rampart-flush`), over the processes alive at both readings (a process
    /// that exited in between, a killed one, counts for nothing). A thread started in
    /// between counts whole. What the processes of a kind spent beyond their threads
    /// counts under [`EXITED_THREADS`] when it is more than their clock ticks' rounding
    /// can explain (a tick per process and reading), and is left out otherwise.
    pub fn since(&self, earlier: &ThreadCpu) -> BTreeMap<String, f64> {
        let tick_ns = 1e9 / clock_ticks_per_second();
        let mut nanos: BTreeMap<String, f64> = BTreeMap::new();
        // Per kind: what its processes spent beyond their threads, and how many.
        let mut beyond: BTreeMap<&str, (f64, u32)> = BTreeMap::new();
        let mut threads_of: HashMap<u32, u64> = HashMap::new();
        for (&(pid, tid), (name, now)) in &self.threads {
            let (Some((kind, _)), true) = (
                self.processes.get(&pid),
                earlier.processes.contains_key(&pid),
            ) else {
                continue;
            };
            let before = earlier.threads.get(&(pid, tid)).map_or(0, |(_, t)| *t);
            let spent = now.saturating_sub(before);
            *nanos.entry(format!("{kind}: {name}")).or_default() += spent as f64;
            *threads_of.entry(pid).or_default() += spent;
        }
        for (pid, (kind, now)) in &self.processes {
            let Some((_, before)) = earlier.processes.get(pid) else {
                continue;
            };
            let spent = now.saturating_sub(*before) as f64;
            let entry = beyond.entry(kind.as_str()).or_default();
            entry.0 += spent - threads_of.get(pid).copied().unwrap_or(0) as f64;
            entry.1 += 1;
        }
        for (kind, (ns, processes)) in beyond {
            if ns > 2.0 * f64::from(processes) * tick_ns {
                nanos.insert(format!("{kind}: {EXITED_THREADS}"), ns);
            }
        }
        nanos.into_iter().map(|(key, ns)| (key, ns / 1e9)).collect()
    }
}

/// The kind of a child, from its name: "server #3" → "server", "coordinator 2" →
/// "coordinator".
fn kind_of(name: &str) -> String {
    name.split([' ', '#'])
        .next()
        .filter(|kind| !kind.is_empty())
        .unwrap_or(name)
        .to_string()
}

/// A thread's nanoseconds on a CPU, the first field of its `/proc/.../schedstat` line.
fn schedstat_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
}

impl Running {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The children of this process.
#[derive(Debug, Default)]
pub struct Children {
    running: Vec<Running>,
}

impl Children {
    /// No children yet.
    pub fn new() -> Children {
        Children::default()
    }

    /// Starts `rampart ARGS...` (in network namespace `netns`, if given) and waits for
    /// its address line.
    pub fn spawn(
        &mut self,
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        netns: Option<&Path>,
    ) -> Result<&Running> {
        let starting = Children::start(name, args, env, netns)?;
        self.wait_ready(starting)
    }

    /// Starts `rampart ARGS...` without waiting for it: several children can start side
    /// by side, then [`Children::wait_ready`] takes each in. A child whose [`Starting`]
    /// is dropped instead is killed. With `netns` (a file under `/run/netns`, see
    /// `netns`), the child runs in that network namespace.
    pub fn start(
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        netns: Option<&Path>,
    ) -> Result<Starting> {
        let exe = std::env::current_exe().context("cannot find the rampart executable")?;
        let parent = std::process::id();
        // Opened here, entered between fork and exec; closed on exec.
        let netns = netns
            .map(|path| {
                std::fs::File::open(path)
                    .with_context(|| format!("cannot open network namespace {}", path.display()))
            })
            .transpose()?;
        let netns_fd = netns.as_ref().map(|file| file.as_raw_fd());
        let mut command = Command::new(exe);
        command.args(args);
        // Security is passed as flags; an inherited variable would secure a private
        // cluster (a benchmark's) that its parent cannot reach.
        command.env_remove(crate::security::TOKEN_FILE_ENV);
        command.env_remove(crate::security::TLS_CA_ENV);
        for (key, value) in env {
            command.env(key, value);
        }
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit, setpgid, setns) between fork
        // and exec, as `pre_exec` requires; `netns_fd` stays open until after the spawn.
        unsafe {
            command.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                // The parent may have died before prctl took effect.
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                // A process group of its own: Ctrl-C on a terminal reaches only this
                // process, which stops its children itself (after a drill's final
                // reads, for one), rather than every child at once.
                libc::setpgid(0, 0);
                if let Some(fd) = netns_fd {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let starting = Starting::spawn(name, command, CHILD_START_TIMEOUT);
        drop(netns);
        starting
    }

    /// Waits (at most [`CHILD_START_TIMEOUT`] from now) for a started child's address
    /// line and makes it one of these children.
    pub fn wait_ready(&mut self, starting: Starting) -> Result<&Running> {
        let listening = starting.wait_listening(|_| Ok(()))?;
        self.running.push(Running {
            name: listening.name,
            addr: listening.addr,
            speaker: Some(listening.speaker),
            urls: listening.urls,
            child: listening.child,
            exited: None,
            usage_seen: Default::default(),
        });
        Ok(self.running.last().expect("just pushed"))
    }

    /// Kills the running child called `name` with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self, name: &str) -> Result<()> {
        let running = self
            .running
            .iter_mut()
            .find(|r| r.name == name && r.exited.is_none())
            .ok_or_else(|| anyhow!("no running child called {name}"))?;
        running
            .child
            .kill()
            .with_context(|| format!("cannot kill {name}"))?;
        running.exited = Some(running.child.wait()?);
        Ok(())
    }

    /// The process id of the running child called `name`.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.running
            .iter()
            .find(|r| r.name == name && r.exited.is_none())
            .map(Running::pid)
    }

    /// Sends `signal` to the running child called `name`.
    pub fn signal(&self, name: &str, signal: libc::c_int) -> Result<()> {
        let pid = self
            .pid_of(name)
            .ok_or_else(|| anyhow!("no running child called {name}"))?;
        // SAFETY: kill(2) on a pid we spawned and have not reaped (so not reused).
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            bail!("cannot signal {name}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the child called `name` has exited (reaping it if it just did); false
    /// for a name never started.
    pub fn has_exited(&mut self, name: &str) -> bool {
        let mut seen = false;
        for running in self.running.iter_mut().filter(|r| r.name == name) {
            seen = true;
            if running.exited.is_none() {
                if let Ok(Some(status)) = running.child.try_wait() {
                    running.exited = Some(status);
                }
            }
            if running.exited.is_none() {
                return false;
            }
        }
        seen
    }

    /// Children that exited since the last call: their name, who they said they were
    /// (a server's id) and their status.
    pub fn reap(&mut self) -> Vec<(String, Option<Speaker>, ExitStatus)> {
        let mut exited = Vec::new();
        for running in &mut self.running {
            if running.exited.is_none() {
                if let Ok(Some(status)) = running.child.try_wait() {
                    running.exited = Some(status);
                    exited.push((running.name.clone(), running.speaker, status));
                }
            }
        }
        exited
    }

    /// CPU-seconds (user and system, all threads) that the children have used so far
    /// ([`Children::usage`]).
    pub fn cpu_seconds(&self) -> f64 {
        self.usage().cpu_s
    }

    /// What the children have used so far, from `/proc` (0 where it cannot be read:
    /// another system). A child that has exited counts with what the last call read of
    /// it, so that differences of two calls measure the work done in between even when
    /// a child exits meanwhile (they miss only what it did between its last reading and
    /// its exit).
    pub fn usage(&self) -> Usage {
        let ticks_per_s = clock_ticks_per_second();
        let mut total = ProcUsage::default();
        for running in &self.running {
            if running.exited.is_none() {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", running.pid()));
                if let Some(now) = stat.ok().and_then(|stat| proc_usage(&stat)) {
                    running.usage_seen.set(now);
                }
            }
            let seen = running.usage_seen.get();
            total.cpu_ticks += seen.cpu_ticks;
            total.minor_faults += seen.minor_faults;
        }
        Usage {
            cpu_s: total.cpu_ticks as f64 / ticks_per_s,
            minor_faults: total.minor_faults,
        }
    }

    /// The CPU time of every thread of every running child, now (see [`ThreadCpu`]).
    /// A thread or process gone while it is read is left out.
    pub fn thread_cpu(&self) -> ThreadCpu {
        let tick_ns = 1e9 / clock_ticks_per_second();
        let mut reading = ThreadCpu::default();
        for running in self.running.iter().filter(|r| r.exited.is_none()) {
            let pid = running.pid();
            let kind = kind_of(&running.name);
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
            let Some(process) = stat.ok().and_then(|stat| proc_usage(&stat)) else {
                continue;
            };
            let process_ns = (process.cpu_ticks as f64 * tick_ns) as u64;
            reading.processes.insert(pid, (kind, process_ns));
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                let name = std::fs::read_to_string(task.path().join("comm"));
                let schedstat = std::fs::read_to_string(task.path().join("schedstat"));
                let ns = schedstat.ok().as_deref().and_then(schedstat_ns);
                if let (Ok(name), Some(ns)) = (name, ns) {
                    reading
                        .threads
                        .insert((pid, tid), (name.trim_end().to_string(), ns));
                }
            }
        }
        reading
    }

    /// Whether every child has exited.
    pub fn all_exited(&self) -> bool {
        self.running.iter().all(|r| r.exited.is_some())
    }

    /// Stops every child: SIGTERM, then SIGKILL for those still alive after the grace
    /// period. Waits for all of them, so none is left as a zombie or orphan.
    pub fn stop_all(&mut self) {
        for running in &mut self.running {
            if running.exited.is_none() {
                // SAFETY: kill(2) on a pid we spawned and have not reaped.
                unsafe {
                    libc::kill(running.child.id() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + CHILD_STOP_GRACE;
        for running in &mut self.running {
            while running.exited.is_none() {
                match running.child.try_wait() {
                    Ok(Some(status)) => running.exited = Some(status),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    _ => {
                        let _ = running.child.kill();
                        running.exited = running.child.wait().ok();
                        break;
                    }
                }
            }
        }
    }
}

/// A process's usage from its `/proc/PID/stat` line: minor faults are field 10, user
/// and system clock ticks fields 14 and 15, counted after the command name, which is in
/// parentheses and may itself contain spaces and parentheses.
fn proc_usage(stat: &str) -> Option<ProcUsage> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields from the third (state) on: minflt is the 10th overall, so the 8th here;
    // utime the 14th, the 12th here.
    let mut fields = after_name.split_whitespace().skip(7);
    let minor_faults: u64 = fields.next()?.parse().ok()?;
    let mut fields = fields.skip(3);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(ProcUsage {
        cpu_ticks: user + system,
        minor_faults,
    })
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_fields_10_14_and_15_whatever_the_name_holds() {
        let stat = "4242 (rampart (x) y) S 1 4242 4242 0 -1 4194560 2127 5 3 1 \
                    731 69 0 0 20 0 9 0 1000 100000 500 18446744073709551615";
        let usage = ProcUsage {
            cpu_ticks: 800,
            minor_faults: 2127,
        };
        assert_eq!(proc_usage(stat), Some(usage));
        assert_eq!(proc_usage("4242 (cut short) S 1 2"), None);
        assert_eq!(
            proc_usage("4242 (no times) S 1 4242 4242 0 -1 4194560 2127 0 0 0"),
            None
        );
        assert_eq!(proc_usage("no name at all"), None);
    }

    #[test]
    fn thread_cpu_counts_live_processes_new_threads_and_threads_gone() {
        // Times in clock ticks, as nanoseconds (a process's are whole ticks).
        let tick_ns = 1e9 / clock_ticks_per_second();
        let ns = |ticks: f64| (ticks * tick_ns) as u64;
        let reading =
            |threads: &[(u32, u32, &str, f64)], processes: &[(u32, &str, f64)]| ThreadCpu {
                threads: threads
                    .iter()
                    .map(|&(pid, tid, name, ticks)| ((pid, tid), (name.to_string(), ns(ticks))))
                    .collect(),
                processes: processes
                    .iter()
                    .map(|&(pid, kind, ticks)| (pid, (kind.to_string(), ns(ticks))))
                    .collect(),
            };
        let earlier = reading(
            &[
                (1, 1, "raft", 10.0),
                (2, 2, "worker", 5.0),
                (2, 3, "flush", 1.0),
                (3, 3, "worker", 7.0),
            ],
            &[
                (1, "coordinator", 10.0),
                (2, "server", 9.0),
                (3, "server", 7.0),
            ],
        );
        // Server 3 was killed and server 4 started; server 2's flush thread ran 3 more
        // ticks and exited, a reader started; the coordinator's process figure is a
        // tick's rounding off its thread's.
        let later = reading(
            &[
                (1, 1, "raft", 12.5),
                (2, 2, "worker", 25.0),
                (2, 9, "reader", 6.0),
                (4, 4, "worker", 50.0),
            ],
            &[
                (1, "coordinator", 13.0),
                (2, "server", 38.0),
                (4, "server", 50.0),
            ],
        );
        let spent = later.since(&earlier);
        let expected = BTreeMap::from([
            ("coordinator: raft".to_string(), 2.5),
            ("server: worker".to_string(), 20.0),
            ("server: reader".to_string(), 6.0),
            ("server: (threads gone since)".to_string(), 3.0),
        ]);
        assert_eq!(
            spent.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "a process started in between (4) and one gone (3) count for nothing, nor \
             does rounding: {spent:?}"
        );
        for (key, ticks) in expected {
            let seconds = ticks * tick_ns / 1e9;
            assert!((spent[&key] - seconds).abs() < 1e-6, "{key}: {spent:?}");
        }
    }

    #[test]
    fn kinds_and_thread_times_come_from_names_and_schedstat_lines() {
        assert_eq!(kind_of("server #3"), "server");
        assert_eq!(kind_of("coordinator 2"), "coordinator");
        assert_eq!(kind_of("gateway"), "gateway");
        assert_eq!(
            schedstat_ns("703309973 196898269 1843\n"),
            Some(703_309_973)
        );
        assert_eq!(schedstat_ns(""), None);
        assert_eq!(schedstat_ns("x 1 2"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_busy_child_shows_cpu_seconds_and_an_exited_one_its_last_reading() {
        let mut children = Children::new();
        let child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 30",
            ])
            .spawn()
            .expect("spawn sh");
        children.running.push(Running {
            name: "busy".into(),
            addr: String::new(),
            speaker: None,
            urls: Vec::new(),
            child,
            exited: None,
            usage_seen: Default::default(),
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while children.cpu_seconds() < 0.05 {
            assert!(
                Instant::now() < deadline,
                "no CPU time seen for a busy child"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = children.usage();
        // Every process faults pages in as it starts (its stack, its heap).
        assert!(before.minor_faults > 0, "no page faults read: {before:?}");
        // Its one thread, by the name the shell runs under, with the process's kind.
        let threads = children.thread_cpu();
        let pid = children.running[0].pid();
        assert!(
            threads
                .threads
                .iter()
                .any(|(&(p, _), (name, _))| p == pid && name == "sh"),
            "{threads:?}"
        );
        assert_eq!(
            threads.processes.get(&pid).map(|(kind, _)| kind.as_str()),
            Some("busy")
        );
        children.kill("busy").expect("kill");
        assert!(children.running[0].exited.is_some());
        assert_eq!(
            children.usage(),
            before,
            "an exited child counts with its last reading"
        );
    }
}
