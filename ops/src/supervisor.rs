//! `ExitReporter`: what `rampart cluster up` tells the coordinators as the supervisor of
//! the servers it started — that a server's process exited (`ProcessExited`).
//!
//! A supervisor that saw the process of server N exit knows that server N serves
//! nothing any more: the coordinators take that as proof of its death
//! (`rampart_coordinator::proof_of_death`), declare it crashed at once and let its
//! recovered tablets go live without waiting out its lease. The word is about one
//! incarnation: the id is the one the process announced when it started (`server N
//! listening on ...`), and a process restarted on the same data directory enlists
//! under a new id.
//!
//! # Failure handling
//! Best effort, bounded by [`EXIT_REPORT_TIMEOUT`]: coordinators that cannot be told
//! still find the server silent (its peers' pings fail, and the leader's own) and
//! recover it, waiting out its lease unless its address refuses connections under
//! `--proof-of-death direct`.

use anyhow::{Context, Result};
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{ProcessExited, ProcessExitedRequest};
use rampart_common::rpc::RpcPool;
use std::time::Duration;

/// How long one report may take (finding the leader included).
pub const EXIT_REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Reports exits of servers to their coordinators (module doc).
#[derive(Debug)]
pub struct ExitReporter {
    runtime: tokio::runtime::Runtime,
    coordinators: CoordinatorSet,
    pool: RpcPool,
    /// Who reports, for the coordinators' log.
    name: String,
}

impl ExitReporter {
    /// A reporter to the coordinators at `coordinators` (comma-separated), with this
    /// process's security.
    pub fn new(coordinators: &str) -> Result<ExitReporter> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime to report exits")?;
        Ok(ExitReporter {
            runtime,
            coordinators: CoordinatorSet::new(&[coordinators]),
            pool: RpcPool::new(),
            name: format!("rampart cluster up (pid {})", std::process::id()),
        })
    }

    /// Tells the coordinators that the process of server `server` exited; blocks for
    /// at most [`EXIT_REPORT_TIMEOUT`].
    pub fn exited(&self, server: u64) -> Result<()> {
        let request = ProcessExitedRequest {
            server: ServerId(server),
            supervisor: self.name.clone(),
        };
        self.runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + EXIT_REPORT_TIMEOUT;
            self.coordinators
                .call::<ProcessExited>(&self.pool, &request, deadline)
                .await
                .with_context(|| {
                    format!("the coordinators were not told that server {server} exited")
                })
        })
    }
}
