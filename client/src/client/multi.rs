//! Multi-operations: reads, writes and removes of several objects, grouped by owner
//! and sent to every owner in parallel, with the objects that must be tried again
//! retried.

use bytes::Bytes;
use rampart_common::ids::{key_hash, ServerId, TableId, Version};
use rampart_common::limits::{MULTI_OPS_MAX, MULTI_WRITE_REQUEST_BYTES_MAX};
use rampart_common::protocol::master::{
    MultiRead, MultiReadRequest, MultiRemove, MultiRemoveRequest, MultiWrite, MultiWriteReply,
    MultiWriteRequest, ObjectKey, RemoveRequest, WriteRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rifl::Rifl;
use rampart_common::rpc::{Rpc, RpcError};
use rampart_common::status::Status;
use std::collections::BTreeMap;
use tokio::time::Instant;

use super::retry::Retry;
use super::state::{Client, Object, WriteItem};
use crate::error::ClientError;
use crate::tracker::{Ticket, TICKETS_MAX};

/// One object's part of a multi-op reply: its status, version and value (empty for
/// writes and removes).
type ObjectReply = (Status, Version, Bytes);

impl Client {
    /// Groups item indices by the owner of their key; items whose table is unknown
    /// after a refresh fail with `TableDoesntExist`.
    async fn group_by_owner(
        &self,
        items: &[(TableId, &[u8])],
        pending: &[usize],
        retry: &mut Retry,
    ) -> Result<BTreeMap<String, Vec<usize>>, ClientError> {
        loop {
            let map = self.map();
            // By owner first, then by its address: one address looked up (and copied)
            // per owner, not per object (`TabletMapCache::route` is per object).
            let mut by_owner: BTreeMap<ServerId, Vec<usize>> = BTreeMap::new();
            let mut unrouted = None;
            for &i in pending {
                let (table, key) = items[i];
                match map.tablet(table, key_hash(key)) {
                    Some(tablet) => by_owner.entry(tablet.owner).or_default().push(i),
                    None => unrouted = Some(table),
                }
            }
            let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for (owner, indices) in by_owner {
                match map.addr(owner) {
                    Some(addr) => groups.entry(addr.to_string()).or_default().extend(indices),
                    None => unrouted = indices.first().map(|&i| items[i].0).or(unrouted),
                }
            }
            let Some(table) = unrouted else {
                return Ok(groups);
            };
            self.refresh_map(map.version, retry.deadline).await?;
            if !self.map().has_table(table) {
                return Err(ClientError::TableDoesntExist(table.to_string()));
            }
            retry
                .pause(format!("no owner for a key of {table}"))
                .await?;
        }
    }

    /// Reads several objects, in parallel from their masters. Results in input order:
    /// `Ok(None)` for a missing object, an error for an object that could not be read
    /// (e.g. a key over the size limit).
    pub async fn multi_read(
        &self,
        keys: &[(TableId, &[u8])],
    ) -> Result<Vec<Result<Option<Object>, ClientError>>, ClientError> {
        let request = |indices: &[usize]| MultiReadRequest {
            objects: indices
                .iter()
                .map(|&i| ObjectKey {
                    table: keys[i].0,
                    key: Bytes::copy_from_slice(keys[i].1),
                })
                .collect(),
        };
        let call = |addr: String, indices: Vec<usize>, deadline| {
            let request = request(&indices);
            async move {
                let reply = self
                    .inner
                    .pool
                    .call::<MultiRead>(&addr, &request, deadline)
                    .await?;
                Ok(reply
                    .objects
                    .into_iter()
                    .map(|r| (r.status, r.version, r.value))
                    .collect())
            }
        };
        let results = self
            .multi_op(keys, self.deadline(), |i| keys[i].1.len(), call)
            .await?;
        Ok(results
            .into_iter()
            .map(|result| match result? {
                (Status::Ok, version, value) => Ok(Some(Object { value, version })),
                (Status::ObjectDoesntExist, _, _) => Ok(None),
                (status, version, _) => {
                    Err(ClientError::from_status(status, version, String::new()))
                }
            })
            .collect())
    }

    /// Writes several objects, in parallel to their masters. Each object succeeds or
    /// fails on its own; results (new version or error) in input order.
    pub async fn multi_write(
        &self,
        items: &[WriteItem],
    ) -> Result<Vec<Result<Version, ClientError>>, ClientError> {
        let mut results = Vec::with_capacity(items.len());
        // Each object takes a number, TICKETS_MAX at most at a time.
        for items in items.chunks(TICKETS_MAX) {
            let deadline = self.deadline();
            let tickets = self.tickets(items.len(), deadline).await?;
            let rifls: Vec<Rifl> = tickets.iter().map(Ticket::rifl).collect();
            let keys: Vec<(TableId, &[u8])> = items.iter().map(|w| (w.table, &w.key[..])).collect();
            let request = |indices: &[usize]| MultiWriteRequest {
                objects: indices
                    .iter()
                    .map(|&i| WriteRequest {
                        table: items[i].table,
                        key: items[i].key.clone(),
                        value: items[i].value.clone(),
                        rules: items[i].rules,
                        rifl: rifls[i],
                    })
                    .collect(),
            };
            let weight = |i: usize| items[i].key.len() + items[i].value.len();
            let done = self
                .multi_mutate::<MultiWrite, _>(&keys, deadline, weight, request, |version| version)
                .await;
            results.extend(self.settle_all(&tickets, done)?);
        }
        Ok(results)
    }

    /// Removes several objects, in parallel. Results (version removed, `None` if
    /// missing, or error) in input order.
    pub async fn multi_remove(
        &self,
        keys: &[(TableId, &[u8])],
    ) -> Result<Vec<Result<Option<Version>, ClientError>>, ClientError> {
        let mut results = Vec::with_capacity(keys.len());
        for keys in keys.chunks(TICKETS_MAX) {
            let deadline = self.deadline();
            let tickets = self.tickets(keys.len(), deadline).await?;
            let rifls: Vec<Rifl> = tickets.iter().map(Ticket::rifl).collect();
            let request = |indices: &[usize]| MultiRemoveRequest {
                objects: indices
                    .iter()
                    .map(|&i| RemoveRequest {
                        table: keys[i].0,
                        key: Bytes::copy_from_slice(keys[i].1),
                        rules: RejectRules::default(),
                        rifl: rifls[i],
                    })
                    .collect(),
            };
            let removed = |version: Version| (version != Version(0)).then_some(version);
            let weight = |i: usize| keys[i].1.len();
            let done = self
                .multi_mutate::<MultiRemove, _>(keys, deadline, weight, request, removed)
                .await;
            results.extend(self.settle_all(&tickets, done)?);
        }
        Ok(results)
    }

    /// Multi-write and multi-remove: RPC `R` built by `request` for each owner's share
    /// of `keys`, each object's version turned into its result by `done`. Every object
    /// carries its exactly-once identity, so a share whose connection broke after it was
    /// sent is sent again (see the `client` module doc).
    async fn multi_mutate<R, T>(
        &self,
        keys: &[(TableId, &[u8])],
        deadline: Instant,
        weight: impl Fn(usize) -> usize,
        request: impl Fn(&[usize]) -> R::Request,
        done: impl Fn(Version) -> T,
    ) -> Result<Vec<Result<T, ClientError>>, ClientError>
    where
        R: Rpc<Reply = MultiWriteReply>,
    {
        let call = |addr: String, indices: Vec<usize>, deadline| {
            let request = request(&indices);
            async move {
                let reply = self.inner.pool.call::<R>(&addr, &request, deadline).await?;
                Ok(reply
                    .objects
                    .into_iter()
                    .map(|r| (r.status, r.version, Bytes::new()))
                    .collect())
            }
        };
        let results = self.multi_op(keys, deadline, weight, call).await?;
        Ok(results
            .into_iter()
            .map(|result| match result? {
                (Status::Ok, version, _) => Ok(done(version)),
                (status, version, _) => {
                    Err(ClientError::from_status(status, version, String::new()))
                }
            })
            .collect())
    }

    /// The shared engine of the multi operations: groups objects by owner, in requests
    /// of at most [`MULTI_OPS_MAX`] objects and [`MULTI_WRITE_REQUEST_BYTES_MAX`] bytes
    /// (by `weight`), calls every owner in parallel, and retries the objects whose tablet
    /// moved, whose master asked to retry, or whose request never reached its master.
    /// Returns each object's (status, version, value), or the error that ended it.
    async fn multi_op<F, Fut>(
        &self,
        keys: &[(TableId, &[u8])],
        deadline: Instant,
        weight: impl Fn(usize) -> usize,
        call: F,
    ) -> Result<Vec<Result<ObjectReply, ClientError>>, ClientError>
    where
        F: Fn(String, Vec<usize>, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<ObjectReply>, RpcError>>,
    {
        let mut results: Vec<Option<Result<ObjectReply, ClientError>>> =
            keys.iter().map(|_| None).collect();
        let mut retry = self.retry_until(deadline);
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        // The owner of the last objects that had to be tried again: a timeout says what
        // the cluster knows of it.
        let mut stuck: Option<ServerId> = None;
        let finished = async {
            while !pending.is_empty() {
                let version = self.map().version;
                let groups = self.group_by_owner(keys, &pending, &mut retry).await?;
                let mut chunks = Vec::new();
                for (addr, indices) in groups {
                    let (mut chunk, mut bytes) = (Vec::new(), 0);
                    for i in indices {
                        let full = chunk.len() == MULTI_OPS_MAX
                            || (!chunk.is_empty()
                                && bytes + weight(i) > MULTI_WRITE_REQUEST_BYTES_MAX);
                        if full {
                            chunks.push((addr.clone(), std::mem::take(&mut chunk)));
                            bytes = 0;
                        }
                        bytes += weight(i);
                        chunk.push(i);
                    }
                    chunks.push((addr, chunk));
                }
                let calls = chunks.into_iter().map(|(addr, indices)| {
                    let future = call(addr.clone(), indices.clone(), retry.deadline);
                    async move { (addr, indices, future.await) }
                });
                let mut again = Vec::new();
                let mut why = String::new();
                for (addr, indices, outcome) in futures::future::join_all(calls).await {
                    if let Err(e) = &outcome {
                        if e.is_transport() || e.status() == Some(Status::Retry) {
                            if let Some(owner) = self.map().server_at(&addr) {
                                self.report_unreachable(owner, e);
                            }
                        }
                    }
                    let failed = match &outcome {
                        Ok(replies) => replies.iter().any(|(status, _, _)| {
                            matches!(status, Status::UnknownTablet | Status::Retry)
                        }),
                        Err(e) => {
                            e.is_transport()
                                || matches!(e.status(), Some(Status::Retry | Status::ShuttingDown))
                        }
                    };
                    if failed {
                        stuck = self.map().server_at(&addr).or(stuck);
                    }
                    match outcome {
                        Ok(replies) if replies.len() == indices.len() => {
                            for (i, (status, version, value)) in indices.into_iter().zip(replies) {
                                if matches!(status, Status::UnknownTablet | Status::Retry) {
                                    why = format!("{addr} answered {status} for some objects");
                                    again.push(i);
                                } else {
                                    results[i] = Some(Ok((status, version, value)));
                                }
                            }
                        }
                        Ok(replies) => {
                            let error = ClientError::Server(format!(
                                "{} replies for {} objects",
                                replies.len(),
                                indices.len()
                            ));
                            for i in indices {
                                results[i] = Some(Err(error.clone()));
                            }
                        }
                        Err(e) if e.is_transport() => {
                            why = e.to_string();
                            again.extend(indices);
                        }
                        Err(e)
                            if matches!(e.status(), Some(Status::Retry | Status::ShuttingDown)) =>
                        {
                            why = e.to_string();
                            again.extend(indices);
                        }
                        Err(e) => {
                            let error = ClientError::from_rpc(e);
                            for i in indices {
                                results[i] = Some(Err(error.clone()));
                            }
                        }
                    }
                }
                pending = again;
                if !pending.is_empty() {
                    self.refresh_after(version, &retry, &why).await?;
                    retry.pause(why).await?;
                }
            }
            Ok(())
        }
        .await;
        match (finished, stuck) {
            (Err(ClientError::Timeout { attempts, last }), Some(owner)) => {
                return Err(self.explain_timeout(attempts, last, owner).await)
            }
            (Err(error), _) => return Err(error),
            (Ok(()), _) => {}
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ClientError::Server("no reply".into()))))
            .collect())
    }
}
