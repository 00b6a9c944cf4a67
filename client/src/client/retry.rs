//! The retry loop of single-object operations and enumerations: each attempt against
//! the owner of a key hash, rerouted through a refreshed tablet map or paused until
//! the deadline; and what a `Timeout` says the cluster knows of that owner.

use rampart_common::backoff::Backoff;
use rampart_common::config::ByteSize;
use rampart_common::ids::{key_hash, ServerId, TableId};
use rampart_common::protocol::coordinator::{RecoveryStatus, RecoveryStatusRequest};
use rampart_common::protocol::master::{PingRequest, ServerStats, ServerStatsReply};
use rampart_common::rpc::{Rpc, RpcError};
use rampart_common::status::Status;
use rampart_common::tablet::ServerStatus;
use std::time::Duration;
use tokio::time::Instant;

use super::state::Client;
use crate::error::ClientError;
use crate::tablet_map::TabletMapCache;

/// The outcome of one attempt, for the retry loop.
pub(super) enum Attempt<T> {
    Done(Result<T, ClientError>),
    /// Refresh the map and try again (`UnknownTablet`, owner unreachable).
    Reroute(String),
    /// Try again after a pause (server busy).
    Later(String),
}

/// Per-operation retry state.
pub(super) struct Retry {
    pub(super) deadline: Instant,
    pub(super) attempts: u32,
    pub(super) backoff: Backoff,
}

impl Retry {
    /// Pauses before the next attempt, or fails when the deadline has passed.
    pub(super) async fn pause(&mut self, why: String) -> Result<(), ClientError> {
        self.attempts += 1;
        let now = Instant::now();
        if now >= self.deadline {
            return Err(ClientError::Timeout {
                attempts: self.attempts,
                last: why,
            });
        }
        tracing::debug!(attempt = self.attempts, %why, "retrying");
        let pause = self.backoff.next_pause();
        tokio::time::sleep(pause.min(self.deadline - now)).await;
        Ok(())
    }
}

impl Client {
    /// The deadline of an operation starting now.
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.inner.options.deadline
    }

    pub(super) fn retry(&self) -> Retry {
        self.retry_until(Instant::now() + self.inner.options.deadline)
    }

    pub(super) fn retry_until(&self, deadline: Instant) -> Retry {
        let options = &self.inner.options;
        Retry {
            deadline,
            attempts: 0,
            backoff: Backoff::new(options.backoff_min, options.backoff_max),
        }
    }

    /// Runs `attempt` against the owner of `key`, refreshing the map and retrying as
    /// the `client` module doc describes: every request may be sent again, reads because
    /// they change nothing, writes because they carry their exactly-once identity.
    async fn on_owner<T, F, Fut>(
        &self,
        table: TableId,
        key: &[u8],
        deadline: Instant,
        attempt: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(String, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, RpcError>>,
    {
        self.on_hash(table, key_hash(key).0, deadline, |addr, _, deadline| {
            attempt(addr, deadline)
        })
        .await
    }

    /// Runs `attempt(owner address, tablet end hash, deadline)` against the owner of
    /// key hash `hash` of `table`, with the retry rules of [`on_owner`](Self::on_owner),
    /// until `deadline`.
    pub(super) async fn on_hash<T, F, Fut>(
        &self,
        table: TableId,
        hash: u64,
        deadline: Instant,
        attempt: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(String, u64, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, RpcError>>,
    {
        let hash = rampart_common::ids::KeyHash(hash);
        let mut retry = self.retry_until(deadline);
        // The owner last tried: a timeout says what the cluster knows of it.
        let mut owner = None;
        let result = async {
            loop {
                let map = self.map();
                let Some((tablet, addr)) = map.route(table, hash) else {
                    // Should the deadline pass while the map is fetched, the operation timed
                    // out for want of an owner — not for want of a coordinator.
                    let why = map.why_unrouted(table, hash);
                    self.refresh_after(map.version, &retry, &why).await?;
                    let map = self.map();
                    if !map.has_table(table) {
                        return Err(ClientError::TableDoesntExist(table.to_string()));
                    }
                    if map.route(table, hash).is_none() {
                        retry.pause(map.why_unrouted(table, hash)).await?;
                    }
                    continue;
                };
                owner = Some(tablet.owner);
                let why = match attempt(addr.clone(), tablet.end_hash, retry.deadline).await {
                    Ok(Attempt::Done(result)) => return result,
                    Ok(Attempt::Reroute(why)) => {
                        self.refresh_after(map.version, &retry, &why).await?;
                        why
                    }
                    Ok(Attempt::Later(why)) => why,
                    // Never reached the master whole, or reached it and lost its answer: a
                    // read changes nothing, a write is answered from its completion record.
                    Err(e) if e.is_transport() => {
                        self.report_unreachable(tablet.owner, &e);
                        let why = e.to_string();
                        self.refresh_after(map.version, &retry, &why).await?;
                        why
                    }
                    // The master may be losing its tablets (a lapsed lease): look again, and
                    // report it, for a master cut off from the coordinators alone is still
                    // reachable here and nobody else would (the coordinator's ping decides).
                    Err(e) if matches!(e.status(), Some(Status::Retry | Status::ShuttingDown)) => {
                        if e.status() == Some(Status::Retry) {
                            self.report_unreachable(tablet.owner, &e);
                        }
                        let why = e.to_string();
                        self.refresh_after(map.version, &retry, &why).await?;
                        why
                    }
                    Err(e) => return Err(ClientError::from_rpc(e)),
                };
                // The refreshed map names another owner (a recovered tablet went live):
                // try it at once rather than after the backoff.
                let moved = self
                    .map()
                    .route(table, hash)
                    .is_some_and(|(_, owner)| owner != addr);
                if moved && Instant::now() < retry.deadline {
                    continue;
                }
                // Its owner crashed: it comes back when its recovery commits the tablet
                // elsewhere. Watch for that rather than pause blind (a pause of up to
                // `backoff_max` after the tablet went live is what the client would see).
                let crashed = |map: &TabletMapCache| {
                    map.server(tablet.owner)
                        .is_some_and(|s| s.status == ServerStatus::Crashed)
                };
                let back = |map: &TabletMapCache| {
                    !crashed(map)
                        || !map
                            .route(table, hash)
                            .is_some_and(|(_, owner)| owner == addr)
                };
                if crashed(&self.map()) && self.watch_map(retry.deadline, back).await {
                    continue;
                }
                retry.pause(why).await?;
            }
        }
        .await;
        match (result, owner) {
            (Err(ClientError::Timeout { attempts, last }), Some(owner)) => {
                Err(self.explain_timeout(attempts, last, owner).await)
            }
            (result, _) => result,
        }
    }

    /// Sends single-object RPC `R` to the owner of `key` (with the retry rules of
    /// [`on_owner`](Self::on_owner)) until `deadline` and turns its reply into the next
    /// step with `step`.
    pub(super) async fn on_owner_call<R: Rpc, T>(
        &self,
        table: TableId,
        key: &[u8],
        deadline: Instant,
        request: &R::Request,
        step: impl Fn(&str, R::Reply) -> Attempt<T>,
    ) -> Result<T, ClientError> {
        let step = &step;
        self.on_owner(table, key, deadline, |addr, deadline| async move {
            let reply = self.inner.pool.call::<R>(&addr, request, deadline).await?;
            Ok(step(&addr, reply))
        })
        .await
    }

    /// The `Timeout` of an operation whose key `owner` serves, with what the cluster
    /// says of that owner: crashed and being recovered (or why its recovery waits), or
    /// up but unable to replicate writes (too few backups for R). Asks for it briefly
    /// ([`EXPLAIN_TIMEOUT`]), after the deadline; says nothing more if nobody answers.
    pub(super) async fn explain_timeout(
        &self,
        attempts: u32,
        last: String,
        owner: ServerId,
    ) -> ClientError {
        let cached = {
            let explained = self.inner.explained.lock();
            explained
                .get(&owner)
                .filter(|(at, _)| at.elapsed() < EXPLANATION_REUSE)
                .map(|(_, cause)| cause.clone())
        };
        let cause = match cached {
            Some(cause) => cause,
            None => {
                let cause = self.ask_why(owner).await;
                let mut explained = self.inner.explained.lock();
                if explained.len() >= EXPLANATIONS_MAX {
                    explained.clear();
                }
                explained.insert(owner, (Instant::now(), cause.clone()));
                cause
            }
        };
        let last = match (cause, last.is_empty()) {
            (Some(cause), true) => cause,
            (Some(cause), false) => format!("{last}; {cause}"),
            (None, _) => last,
        };
        ClientError::Timeout { attempts, last }
    }

    /// What the cluster says of `owner`, asked within [`EXPLAIN_TIMEOUT`]; `None` when
    /// nobody answered or there is nothing to say.
    async fn ask_why(&self, owner: ServerId) -> Option<String> {
        let map = self.map();
        let deadline = Instant::now() + EXPLAIN_TIMEOUT;
        let status = map.server(owner).map(|s| (s.status, s.addr.clone()));
        match status? {
            (ServerStatus::Crashed, _) => {
                let reports = self
                    .inner
                    .coordinators
                    .call::<RecoveryStatus>(&self.inner.pool, &RecoveryStatusRequest {}, deadline)
                    .await
                    .ok()?
                    .recoveries;
                Some(match reports.iter().rev().find(|r| r.crashed == owner) {
                    Some(report) => match &report.waiting {
                        Some(why) => {
                            format!("its owner {owner} crashed and its recovery waits: {why}")
                        }
                        None => format!(
                            "its owner {owner} crashed and is being recovered ({} of {} \
                             partitions live)",
                            report.partitions.iter().filter(|p| p.live_ms > 0).count(),
                            report.partitions.len()
                        ),
                    },
                    None => format!("its owner {owner} crashed; its recovery has not started"),
                })
            }
            (ServerStatus::Up, addr) => {
                let stats = self
                    .inner
                    .pool
                    .call::<ServerStats>(&addr, &PingRequest {}, deadline)
                    .await
                    .ok()?;
                explain_stats(owner, &stats)
            }
            (ServerStatus::Removed, _) => None,
        }
    }
}

/// How long a timed-out operation asks the cluster why (`explain_timeout`), after its
/// deadline.
pub const EXPLAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// How long what the cluster said of an owner is reused for the next timeouts.
pub const EXPLANATION_REUSE: Duration = Duration::from_secs(1);

/// What a master's own figures say of why its operations time out: writes waiting for
/// backups, or memory nearly full of live data; `None` when neither.
fn explain_stats(owner: ServerId, stats: &ServerStatsReply) -> Option<String> {
    if let Some(why) = &stats.backup_shortage {
        return Some(format!("its owner {owner} is up, but {why}"));
    }
    let live = stats.log_bytes_live as f64 / stats.log_bytes_max.max(1) as f64;
    (live >= MEMORY_NEARLY_FULL).then(|| {
        format!(
            "its owner {owner} is up, but its log memory is nearly full of live data ({} of \
             {} live): its cleaner frees little room per pass, so writes wait; spread the \
             table over more masters (create it with a larger span), remove data, or give \
             the servers more --memory",
            ByteSize(stats.log_bytes_live).readable(),
            ByteSize(stats.log_bytes_max).readable()
        )
    })
}

/// The share of its log memory holding live data from which a master's timeouts are
/// explained by its memory (its cleaner frees little per pass).
const MEMORY_NEARLY_FULL: f64 = 0.85;

/// Owners whose explanation is kept at once (cleared when full).
const EXPLANATIONS_MAX: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masters_figures_explain_its_timeouts_with_the_fix() {
        let owner = ServerId(4);
        let calm = ServerStatsReply {
            log_bytes_live: 80,
            log_bytes_max: 100,
            ..ServerStatsReply::default()
        };
        assert_eq!(explain_stats(owner, &calm), None);
        let full = ServerStatsReply {
            log_bytes_live: 90 << 20,
            log_bytes_max: 100 << 20,
            ..ServerStatsReply::default()
        };
        let said = explain_stats(owner, &full).expect("a full master explains");
        assert!(
            said.contains("nearly full of live data (90MiB of 100MiB live)"),
            "{said}"
        );
        assert!(said.contains("--memory"), "{said}");
        let short = ServerStatsReply {
            backup_shortage: Some("writes wait for backups: need 3".into()),
            ..full
        };
        let said = explain_stats(owner, &short).expect("a master short of backups explains");
        assert!(
            said.ends_with("is up, but writes wait for backups: need 3"),
            "{said}"
        );
    }
}
