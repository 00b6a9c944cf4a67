//! Enumeration: streaming every object of a table, a page at a time, by key hash.

use rampart_common::ids::TableId;
use rampart_common::protocol::master::{Enumerate, EnumerateRequest, EnumeratedObject};
use rampart_common::rpc::RpcError;
use rampart_common::status::Status;

use super::retry::Attempt;
use super::state::Client;
use crate::error::ClientError;

impl Client {
    /// Streams every object of `table`, in key-hash order, a page at a time.
    pub fn enumerate(&self, table: TableId) -> Enumeration {
        self.enumerate_from(table, 0)
    }

    /// Like [`enumerate`](Self::enumerate), from key hash `hash` on: an enumeration
    /// resumed where [`Enumeration::resume_hash`] said (a cursor kept between calls).
    pub fn enumerate_from(&self, table: TableId, hash: u64) -> Enumeration {
        Enumeration {
            client: self.clone(),
            table,
            next_hash: Some(hash),
        }
    }
}

/// A table enumeration in progress (see [`Client::enumerate`]).
///
/// Its cursor is a key hash, so it survives tablets moving between masters: each page
/// is fetched from whoever owns the cursor's hash at that moment. An object present for
/// the whole enumeration is returned exactly once.
#[derive(Debug)]
pub struct Enumeration {
    client: Client,
    table: TableId,
    /// The next key hash to fetch from; `None` when done.
    next_hash: Option<u64>,
}

/// Bytes asked for per enumerate page.
pub const ENUMERATE_PAGE_BYTES: u32 = 1024 * 1024;

impl Enumeration {
    /// The key hash the next page starts from (to resume later with
    /// [`Client::enumerate_from`]); `None` once the table is exhausted.
    pub fn resume_hash(&self) -> Option<u64> {
        self.next_hash
    }

    /// The next non-empty page of objects, or `None` when the table is exhausted.
    pub async fn next_page(&mut self) -> Result<Option<Vec<EnumeratedObject>>, ClientError> {
        while let Some(resume) = self.next_hash {
            let client = &self.client;
            let (objects, next) = client
                .on_hash(
                    self.table,
                    resume,
                    client.deadline(),
                    |addr, tablet_end, deadline| {
                        let request = EnumerateRequest {
                            table: self.table,
                            resume_hash: resume,
                            end_hash: tablet_end,
                            max_bytes: ENUMERATE_PAGE_BYTES,
                        };
                        async move {
                            match client
                                .inner
                                .pool
                                .call::<Enumerate>(&addr, &request, deadline)
                                .await
                            {
                                Ok(page) => {
                                    let next = match page.next_hash {
                                        Some(next) => Some(next),
                                        None => tablet_end.checked_add(1),
                                    };
                                    Ok(Attempt::Done(Ok((page.objects, next))))
                                }
                                Err(RpcError::Status {
                                    status: Status::UnknownTablet,
                                    ..
                                }) => Ok(Attempt::Reroute(format!("{addr}: unknown tablet"))),
                                Err(e) => Err(e),
                            }
                        }
                    },
                )
                .await?;
            self.next_hash = next;
            if !objects.is_empty() {
                return Ok(Some(objects));
            }
        }
        Ok(None)
    }

    /// Collects the rest of the table (convenient for small tables and tests).
    pub async fn collect_all(mut self) -> Result<Vec<EnumeratedObject>, ClientError> {
        let mut all = Vec::new();
        while let Some(page) = self.next_page().await? {
            all.extend(page);
        }
        Ok(all)
    }
}
