//! `rampart-common`: what every Rampart process shares.
//!
//! * [`ids`] — newtype identifiers and the key hash of docs/design.md §3.
//! * [`status`] — the wire status code of every RPC reply.
//! * [`limits`] — protocol limits (key size, payload size, in-flight requests).
//! * [`config`] — validated configuration of masters and servers.
//! * [`tablet`] — tables, tablets and the server list.
//! * [`reject`] — reject rules of conditional operations.
//! * [`rifl`] — what a client puts on a write so that its retries apply it once.
//! * [`log`] — the log format of docs/design.md §4: entries, the segment writer with
//!   Tailwind checksums, and the valid-prefix scanner.
//! * [`rpc`] — length-prefixed RPC frames over TCP, client and server (docs/design.md §8).
//! * [`auth`] — the cluster token every connection proves (HMAC handshake), and the
//!   process's security settings; [`tls`] — optional TLS for client connections;
//!   [`secure`] — both applied to a connection as it is dialled or accepted.
//! * [`protocol`] — every RPC's request and reply messages, by service.
//! * [`recovery_timeline`] — one recovery's phases as an SVG timeline.
//! * [`coordinator_set`] — calls that must reach the leader of the coordinators' Raft
//!   group, following `NotLeader` hints until a deadline.
//! * [`will`] — a master's will: how its tablets are cut into recovery partitions.
//! * [`onesided`] — one-sided writes into backup frames: `shm`, the `tcp` soft-NIC,
//!   and `rdma` (docs/design.md §5).
//! * [`http`] — a small GET-only HTTP server (metrics, the status page).
//! * [`metrics`] — Prometheus metrics: the RPC layer's, and serving them at `/metrics`.
//! * [`buffer_pool`] — large transient buffers kept for reuse (frames, replication
//!   copies), so that their pages are faulted in once.
//! * [`failpoints`] — deliberate misbehaviour for process tests, compiled in only for
//!   them.

pub mod announce;
pub mod auth;
pub mod backoff;
pub mod buffer_pool;
pub mod config;
pub mod coordinator_set;
pub mod failpoints;
pub mod http;
pub mod ids;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod onesided;
pub mod protocol;
pub mod recovery_timeline;
pub mod reject;
pub mod rifl;
pub mod rpc;
pub mod secure;
pub mod status;
pub mod tablet;
pub mod tls;
pub mod will;
