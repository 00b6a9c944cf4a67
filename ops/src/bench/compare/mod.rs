//! `rampart bench compare --peer redis`: Rampart and Redis on the same machine, in one
//! run, alternating, with the same workloads (issue 18).
//!
//! Three systems, started by the benchmark on loopback and stopped (by PID) afterwards:
//!
//! * `rampart` — a local cluster of `--servers` servers with R = `--replicas` (every
//!   acknowledged write is in R backups), one coordinator;
//! * `redis_wait` — Redis with `--replicas` replicas, every write followed by `WAIT R`
//!   (the closest Redis comes to a write acknowledged on R copies);
//! * `redis_async` — one Redis, no replication.
//!
//! Both Redis set-ups keep nothing on disk (`--save '' --appendonly no`): the comparison is
//! of acknowledged copies in memory, which is what Rampart acknowledges. The YCSB
//! workloads (`--workloads`, default write-only, A, B, C) run with the same records, value
//! size, Zipfian skew and closed-loop clients on each system. The run is cut into
//! `--rounds`; in each round every workload runs a slice on every system, the systems'
//! order rotating, so that a noisy machine's slow moments fall on all of them.
//!
//! Prints a table (throughput, read and write p50/p99 per system, and Rampart's
//! throughput over each Redis's), and with `--json FILE` writes the figures there and one
//! plot per comparison beside it (`FILE` without its extension, `-ycsb.svg`).
//! `--quick` runs a reduced version (10,000 records and operations, 2 rounds, 8 clients)
//! in well under two minutes. Redis must be installed (`redis-server`, Debian's
//! `redis-server` package); the benchmark says so plainly if it is not.
//!
//! **The loss of a server holding `--loss-gib`** (1 KB objects; `--no-loss` skips it):
//! Rampart's client-observed unavailability through the crash recovery of a master
//! holding that much (`rampart bench recovery` as a child, R = `--replicas`, R + 2
//! servers), against a Redis holding as much, persisted as an RDB snapshot (`SAVE`) or as
//! its append-only file (`everysec`, after its rewrites settled and the next fsync),
//! killed with SIGKILL and restarted at once on its files: kill → the last object written
//! is served again; and against Redis Sentinel failover (a primary holding as much, 2
//! replicas, 3 sentinels with the lowest of `--sentinel-down-after-ms` that held
//! `--sentinel-stable-s` under a write load without a sentinel deeming the primary down,
//! the primary killed: until the address the sentinels give takes a write and serves the
//! last object). Every system takes the same write load until its kill (`--loss-write-ms`,
//! default 500: 16 closed-loop writers overwriting 10,000 keys of 1 KB, the stability
//! phase's load), and once it serves again the load's keys are read back: the
//! acknowledged writes missing are counted beside each time ([`lost_writes`]). Plotted
//! beside the JSON as `-loss.svg`.
//!
//! [`lost_writes`]: crate::bench::lost_writes
//!
//! One role per file:
//!
//! * [`args`] — the flags;
//! * `run` — the benchmark from its flags to its figures;
//! * [`redis`] — the `redis-server` children, and loading records into them;
//! * [`ycsb_runs`] — the YCSB rounds, every workload on every system in turn;
//! * [`loss`] — the loss of a server: Rampart's crash recovery, and Redis restarted on its
//!   RDB snapshot or its AOF;
//! * [`sentinel`] — the loss of a server against Redis Sentinel failover;
//! * [`output`] — the table, the loss comparison's line and the JSON;
//! * [`plots`] — the plots beside the JSON.

mod args;
mod loss;
mod output;
mod plots;
mod redis;
mod run;
mod sentinel;
mod ycsb_runs;

pub use args::CompareArgs;
pub use run::run;
