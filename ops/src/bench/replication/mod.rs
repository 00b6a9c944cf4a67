//! `rampart bench replication`: what one-sided replication saves, transport against
//! transport, on a symmetric cluster.
//!
//! For each transport named by `--mode` (`shm`, `tcp`, `rpc`; `rdma` where built) the
//! benchmark starts its own local cluster of `--servers` storage servers, each both a
//! master and a backup (symmetric, as in the Tailwind paper's evaluation), every segment kept on
//! `--replicas` backups over that transport (`rampart server --replication MODE`). Each
//! cluster gets a table of one tablet per master, loaded with `--records` objects. Then
//! the measured *windows* run: YCSB write-only (100% updates) and YCSB-A (50% read, 50%
//! update), Zipfian keys, `--clients` closed-loop clients. The windows alternate between
//! the modes' clusters, round after round (the order rotating), so that on a noisy
//! shared machine every mode sees the same conditions and the ratios between modes are
//! measured side by side. Figures are the medians over `--rounds` rounds.
//!
//! Per mode and workload it reports throughput, update (write) latency p50/p99, and the
//! CPU seconds the *backup side* spends per million replicated writes — the figure
//! one-sided writes exist to shrink.
//!
//! # How backup CPU is measured
//! Every server runs its backup (RPC handlers, the `tcp` soft-NIC, flushes to disk) on a
//! runtime whose threads are named
//! [`BACKUP_THREAD_NAME`](rampart_server::BACKUP_THREAD_NAME) (see
//! `rampart_server::storage_service`). The benchmark sums `utime + stime` (fields 14 and
//! 15 of `/proc/PID/task/TID/stat`, in `sysconf(_SC_CLK_TCK)` ticks) over those threads
//! of the cluster's servers, sampled just before and just after each window, and divides
//! by the replicated writes of the window (acknowledged updates × R). Tick accounting is
//! coarse (10 ms at 100 Hz, and charged to whichever thread runs at the tick), so the
//! exact scheduler run time (`/proc/PID/task/TID/schedstat`, nanoseconds) is reported
//! beside it where the kernel offers it. A [`CpuSampler`](backup_cpu::CpuSampler) thread
//! also samples every [`CPU_SAMPLE_INTERVAL`](backup_cpu::CPU_SAMPLE_INTERVAL), so a
//! thread that exits (tokio retires idle blocking threads) is never lost. A segment's
//! close and flush is a lump of backup CPU that lands in one window or the next, so the
//! figure pooled over all windows (their CPU over their writes) is reported beside the
//! median.
//!
//! Caveat: for `rpc` the `WriteReplica` frame is read and decoded on the connection's
//! thread (a master-runtime thread of the backup's server) before the handler moves to
//! the backup runtime, so rpc's backup CPU is under-counted and the shm/rpc CPU ratio is
//! conservative (it flatters rpc). Segment closes that finish after a window ends are
//! charged to the cluster's next window; the whole-run figure (every sample from the end
//! of the load to the end of the run, over every write including warm-ups) counts them,
//! and also what a backup spends while its cluster waits for the other modes' windows:
//! masters probe quiet backups (`ListReplicas`), and a probe costs the backup a scan of
//! each open frame of that master.
//!
//! # Targets
//! On the 2-core development machine, `shm` against `rpc` in the same run: throughput
//! ≥ [`THROUGHPUT_RATIO_MIN`](report::THROUGHPUT_RATIO_MIN)×, write p50 ≤
//! [`WRITE_P50_RATIO_MAX`](report::WRITE_P50_RATIO_MAX)×, backup CPU per write ≤
//! [`BACKUP_CPU_RATIO_MAX`](report::BACKUP_CPU_RATIO_MAX)×. Back of the envelope: an rpc
//! replica write costs the backup a batch's receive, decode, copy and reply — some µs of
//! CPU per write once the batch's writes share it — while an shm one costs it nothing
//! but its share of each segment's open, close and flush (an 8 MiB segment holds
//! ≈ 60 000 100-byte objects, so ≈ 0.1–0.2 s per million); the master waits for R round
//! trips in parallel under rpc, for R memcpys under shm. The benchmark reports PASS or
//! MISS; it never fails on a target (STYLE.md habit 13), only on errors.
//!
//! Measured (2 cores, defaults: 4 servers, R = 3, 16 clients, 100-byte values, 3 rounds
//! of 3 s; two runs): write-only, shm/rpc throughput 2.9× and 3.5×, write p50 0.32× and
//! 0.30×, backup CPU per write 0.030× and 0.024× (shm ≈ 0.13 s, rpc ≈ 5 s, tcp ≈ 9.5 s
//! per million replicated writes). YCSB-A halves the writes per window, so the lumps of
//! segment closes weigh more: CPU ratio 0.072× and 0.036×.
//!
//! # Output
//! A table per workload, the shm/rpc ratios with PASS/MISS, and with `--json FILE`:
//! `{"conditions": {...}, "modes": {"shm": {"throughput_ops_s", "write_p50_us",
//! "write_p99_us", "backup_cpu_s_per_million_writes", ...}, ...}, "ycsb_a": {...},
//! "ratios_shm_over_rpc": {...}, "whole_run": {...}}`; `modes` holds the write-only
//! figures.
//!
//! One role per file:
//!
//! * [`args`] — the flags;
//! * `run` — the benchmark from its flags to its figures;
//! * [`clusters`] — a local cluster per transport, and its servers' pids;
//! * [`backup_cpu`] — the backup threads' CPU, from `/proc`;
//! * [`windows`] — the measured windows, round after round;
//! * [`figures`] — the units of the figures;
//! * [`conditions`] — what the figures were measured under;
//! * [`report`] — the summaries, ratios and targets, printed and as JSON.

mod args;
mod backup_cpu;
mod clusters;
mod conditions;
mod figures;
mod report;
mod run;
mod windows;

pub use args::ReplicationArgs;
pub use run::run;
