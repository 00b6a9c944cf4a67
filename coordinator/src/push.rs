//! The coordinator's messages to masters about a change it committed: the server-list
//! version after a server enlisted or was declared crashed, and the changes of a
//! master's tablets (`TakeTablets`, `DropTablets`, `SyncTablets`).
//!
//! Both the RPC service and the recovery driver send them; neither waits on the other.
//! They are best effort by design: a server that misses a server-list push pulls the
//! list at its periodic refresh, and a master that misses a tablet change catches up at
//! its next lease renewal (`master::tablet_sync`). What the callers need from here is
//! only a bounded retry, [`push_until`] (or [`push_while_busy`], which gives up on an
//! unreachable server at once).

use rampart_common::protocol::master::{ServerListChanged, ServerListVersion};
use rampart_common::rpc::{Rpc, RpcError, RpcPool};
use rampart_common::status::Status;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::node::RaftNode;

/// Pause between attempts to reach a master that is unreachable or answered `Retry`.
pub const PUSH_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Deadline of one `ServerListChanged` push; a server that misses it pulls within its
/// periodic refresh anyway.
pub const SERVER_LIST_PUSH_TIMEOUT: Duration = Duration::from_millis(500);

/// Calls `R` on `addr` until it succeeds, answers an error other than `Retry`, or
/// `deadline` passes, pausing [`PUSH_RETRY_PAUSE`] after each transport failure or
/// `Retry` (a master between enlisting and serving, or still catching up). Returns why
/// it did not get through: the last error.
pub async fn push_until<R>(
    pool: &RpcPool,
    addr: &str,
    request: &R::Request,
    deadline: Instant,
) -> Result<(), RpcError>
where
    R: Rpc<Reply = ()>,
{
    push::<R>(pool, addr, request, deadline, true).await
}

/// As [`push_until`], but a transport failure ends it at once: for a caller that
/// reports an unreachable server to the failure verifier and asks again later, once
/// the server list says whether it is still up (retrying a dead server until
/// `deadline` would only delay the others).
pub async fn push_while_busy<R>(
    pool: &RpcPool,
    addr: &str,
    request: &R::Request,
    deadline: Instant,
) -> Result<(), RpcError>
where
    R: Rpc<Reply = ()>,
{
    push::<R>(pool, addr, request, deadline, false).await
}

async fn push<R>(
    pool: &RpcPool,
    addr: &str,
    request: &R::Request,
    deadline: Instant,
    retry_unreachable: bool,
) -> Result<(), RpcError>
where
    R: Rpc<Reply = ()>,
{
    loop {
        match pool.call::<R>(addr, request, deadline).await {
            Ok(()) => return Ok(()),
            Err(e)
                if ((retry_unreachable && e.is_transport())
                    || e.status() == Some(Status::Retry))
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(PUSH_RETRY_PAUSE).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Tells every `Up` server, in the background, that the server list changed (a server
/// enlisted or was declared crashed).
pub fn push_server_list_version(node: &RaftNode, pool: &Arc<RpcPool>) {
    let (version, addrs): (u64, Vec<String>) = node.with_state(|state| {
        let addrs = state
            .up_servers()
            .into_iter()
            .map(|s| s.addr.clone())
            .collect();
        (state.version(), addrs)
    });
    let pool = Arc::clone(pool);
    tokio::spawn(async move {
        let request = ServerListVersion { version };
        let deadline = Instant::now() + SERVER_LIST_PUSH_TIMEOUT;
        let pushes = addrs.iter().map(|addr| {
            let pool = &pool;
            let request = &request;
            async move {
                if let Err(e) = pool
                    .call::<ServerListChanged>(addr, request, deadline)
                    .await
                {
                    tracing::debug!(%addr, error = %e, "server-list push not delivered");
                }
            }
        });
        futures::future::join_all(pushes).await;
    });
}
