//! How the backups' CPU is measured: `utime + stime` and the scheduler's run time of
//! every thread named `BACKUP_THREAD_NAME` in a cluster's servers, read from `/proc`,
//! sampled between windows and every [`CPU_SAMPLE_INTERVAL`] besides, so that a thread
//! that exits keeps what it spent.

use anyhow::{anyhow, Context, Result};
use rampart_server::BACKUP_THREAD_NAME;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the [`CpuSampler`] reads the backup threads' CPU. Well below tokio's
/// 10 s keep-alive of idle blocking threads, so a backup thread that exits was sampled
/// after its last work.
pub(super) const CPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// `sysconf(_SC_CLK_TCK)`: the unit of `/proc/.../stat` CPU times.
pub(super) fn clock_ticks_per_second() -> Result<u64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| anyhow!("sysconf(_SC_CLK_TCK) failed"))
}

/// Field `n` (1-based, as proc(5) numbers them) of a `/proc/PID/stat` line. The command
/// name (field 2) may hold spaces and parentheses, so fields from 3 on are counted after
/// the last `)`.
pub(super) fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let close = stat.rfind(')')?;
    match n {
        0 => None,
        1 => stat.split_whitespace().next(),
        2 => Some(&stat[stat.find('(')? + 1..close]),
        _ => stat[close + 1..].split_whitespace().nth(n - 3),
    }
}

/// `utime + stime` (fields 14 and 15) of a `/proc/.../stat` line, in clock ticks.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let utime: u64 = stat_field(stat, 14)?.parse().ok()?;
    let stime: u64 = stat_field(stat, 15)?.parse().ok()?;
    Some(utime + stime)
}

/// Time on CPU (the first field of `/proc/.../schedstat`), in nanoseconds.
fn schedstat_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// CPU used, in both units the kernel offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Cpu {
    /// `utime + stime`, clock ticks.
    pub(super) ticks: u64,
    /// Scheduler run time, nanoseconds (0 where schedstat is missing).
    pub(super) ns: u64,
}

impl Cpu {
    fn plus(self, other: Cpu) -> Cpu {
        Cpu {
            ticks: self.ticks + other.ticks,
            ns: self.ns + other.ns,
        }
    }

    /// `self − earlier`; saturating, as counters never go back.
    pub(super) fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            ticks: self.ticks.saturating_sub(earlier.ticks),
            ns: self.ns.saturating_sub(earlier.ns),
        }
    }
}

/// One backup thread's CPU.
#[derive(Clone, Copy, Debug)]
struct ThreadCpu {
    /// At the meter's first sample, or 0 for a thread born later.
    base: Cpu,
    /// At the last sample that found the thread.
    last: Cpu,
}

/// The CPU spent by the backup threads of a set of processes since the meter started.
///
/// # Invariants
/// 1. `threads` holds exactly the backup threads found by the last sample.
/// 2. [`total`](Self::total) never decreases: a thread that vanished keeps the CPU it
///    had at its last sample, in `retired`.
#[derive(Debug)]
pub(super) struct BackupCpuMeter {
    pids: Vec<u32>,
    /// Live backup threads, by (pid, tid).
    threads: HashMap<(u32, u32), ThreadCpu>,
    /// Threads of other names: their `comm` is read once only.
    others: HashSet<(u32, u32)>,
    /// CPU of backup threads that exited, up to their last sample.
    retired: Cpu,
    /// Whether every read of schedstat succeeded (else `Cpu::ns` is not reported).
    schedstat: bool,
    /// Whether the first sample was taken.
    started: bool,
}

impl BackupCpuMeter {
    pub(super) fn new(pids: Vec<u32>) -> BackupCpuMeter {
        let mut meter = BackupCpuMeter {
            pids,
            threads: HashMap::new(),
            others: HashSet::new(),
            retired: Cpu::default(),
            schedstat: true,
            started: false,
        };
        meter.sample();
        meter
    }

    /// Reads every backup thread's CPU now.
    fn sample(&mut self) {
        let mut seen = HashSet::new();
        for &pid in &self.pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let Some(tid) = task
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                let id = (pid, tid);
                if self.others.contains(&id) {
                    seen.insert(id);
                    continue;
                }
                let dir = format!("/proc/{pid}/task/{tid}");
                if !self.threads.contains_key(&id) {
                    let Ok(comm) = std::fs::read_to_string(format!("{dir}/comm")) else {
                        continue;
                    };
                    if comm.trim_end() != BACKUP_THREAD_NAME {
                        self.others.insert(id);
                        seen.insert(id);
                        continue;
                    }
                }
                let Some(ticks) = std::fs::read_to_string(format!("{dir}/stat"))
                    .ok()
                    .and_then(|s| stat_cpu_ticks(&s))
                else {
                    continue;
                };
                let ns = std::fs::read_to_string(format!("{dir}/schedstat"))
                    .ok()
                    .and_then(|s| schedstat_ns(&s));
                self.schedstat &= ns.is_some();
                let now = Cpu {
                    ticks,
                    ns: ns.unwrap_or(0),
                };
                let started = self.started;
                self.threads
                    .entry(id)
                    .and_modify(|t| t.last = now)
                    .or_insert(ThreadCpu {
                        base: if started { Cpu::default() } else { now },
                        last: now,
                    });
                seen.insert(id);
            }
        }
        let gone: Vec<(u32, u32)> = self
            .threads
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        for id in gone {
            if let Some(thread) = self.threads.remove(&id) {
                self.retired = self.retired.plus(thread.last.since(thread.base));
            }
        }
        self.others.retain(|id| seen.contains(id));
        self.started = true;
    }

    /// CPU since the meter started, up to the last sample.
    fn total(&self) -> Cpu {
        self.threads
            .values()
            .fold(self.retired, |sum, t| sum.plus(t.last.since(t.base)))
    }
}

/// Samples the meters every [`CPU_SAMPLE_INTERVAL`] on a thread of its own, until
/// dropped.
#[derive(Debug)]
pub(super) struct CpuSampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CpuSampler {
    pub(super) fn start(meters: Arc<Mutex<Vec<BackupCpuMeter>>>) -> Result<CpuSampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("cpu-sampler".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(CPU_SAMPLE_INTERVAL);
                    let Ok(mut meters) = meters.lock() else {
                        return;
                    };
                    meters.iter_mut().for_each(BackupCpuMeter::sample);
                }
            })
            .context("cannot start the CPU sampler thread")?;
        Ok(CpuSampler {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for CpuSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Samples meter `index` now and returns its total. The `/proc` reads block the
/// benchmark's thread for well under a millisecond, between windows only.
pub(super) fn backup_cpu_now(meters: &Mutex<Vec<BackupCpuMeter>>, index: usize) -> Result<Cpu> {
    let mut meters = meters
        .lock()
        .map_err(|_| anyhow!("the CPU sampler panicked"))?;
    let meter = meters
        .get_mut(index)
        .ok_or_else(|| anyhow!("no CPU meter for mode #{index}"))?;
    meter.sample();
    Ok(meter.total())
}

/// Whether every meter could read schedstat.
pub(super) fn schedstat_available(meters: &Mutex<Vec<BackupCpuMeter>>) -> bool {
    meters
        .lock()
        .map(|m| m.iter().all(|m| m.schedstat))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (rampart (x) y) S 1 4242 4242 0 -1 4194368 321 0 0 0 \
                        17 5 0 0 20 0 3 0 12345 1000 100 18446744073709551615";

    #[test]
    fn stat_field_counts_after_a_command_name_with_parentheses() {
        assert_eq!(stat_field(STAT, 1), Some("4242"));
        assert_eq!(stat_field(STAT, 2), Some("rampart (x) y"));
        assert_eq!(stat_field(STAT, 3), Some("S"));
        assert_eq!(stat_field(STAT, 4), Some("1"));
        assert_eq!(stat_cpu_ticks(STAT), Some(22));
    }

    #[test]
    fn schedstat_ns_reads_the_run_time() {
        assert_eq!(schedstat_ns("320009 43249 2\n"), Some(320_009));
        assert_eq!(schedstat_ns(""), None);
    }

    #[test]
    fn backup_cpu_meter_keeps_the_cpu_of_a_backup_thread_that_exited() {
        let mut meter = BackupCpuMeter::new(vec![std::process::id()]);
        assert_eq!(meter.total(), Cpu::default());
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (worked_tx, worked_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(BACKUP_THREAD_NAME.into())
            .spawn(move || {
                let mut x = 0u64;
                for i in 0..5_000_000u64 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
                worked_tx.send(()).expect("the test waits");
                go_rx.recv().expect("the test sends");
                x
            })
            .expect("spawn");
        worked_rx.recv().expect("the thread sends");
        meter.sample();
        assert_eq!(meter.threads.len(), 1, "one backup-named thread: {meter:?}");
        let live = meter.total();
        if meter.schedstat {
            assert!(live.ns > 0, "the thread ran: {live:?}");
        }
        go_tx.send(()).expect("the thread waits");
        thread.join().expect("join");
        meter.sample();
        assert!(meter.threads.is_empty());
        assert_eq!(meter.total(), live, "an exited thread keeps its CPU");
    }
}
