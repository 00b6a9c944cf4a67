//! Tables, tablets and the server list: the configuration the coordinator holds and
//! clients cache.

use crate::ids::{KeyHash, ServerId, TableId};
use serde::{Deserialize, Serialize};

/// A range `[start_hash, end_hash]` (both inclusive) of key hashes of one table, owned
/// by one master.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tablet {
    /// The table the range belongs to.
    pub table: TableId,
    /// First key hash in the tablet.
    pub start_hash: u64,
    /// Last key hash in the tablet (inclusive, so a single tablet can cover `u64::MAX`).
    pub end_hash: u64,
    /// The master that serves it.
    pub owner: ServerId,
}

impl Tablet {
    /// Whether `hash` of a key of `table` falls in this tablet.
    pub fn contains(&self, table: TableId, hash: KeyHash) -> bool {
        self.table == table && self.start_hash <= hash.0 && hash.0 <= self.end_hash
    }

    /// Splits the whole hash space `[0, u64::MAX]` into `span` contiguous ranges of
    /// (nearly) equal width, in order. The last range absorbs the remainder.
    ///
    /// # Panics
    /// If `span` is 0 (a programmer error: callers validate it).
    pub fn split_hash_space(span: u32) -> Vec<(u64, u64)> {
        assert!(span > 0, "a table spans at least one tablet");
        // Exact arithmetic over the 2^64 hashes: range i is [i·2^64/n, (i+1)·2^64/n − 1].
        let n = u128::from(span);
        let bound = |i: u128| ((i << 64) / n) as u64;
        (0..n)
            .map(|i| {
                let end = if i + 1 == n {
                    u64::MAX
                } else {
                    bound(i + 1) - 1
                };
                (bound(i), end)
            })
            .collect()
    }
}

/// What a server runs. Every storage server runs both in this version; the split exists
/// so that a later deployment can run backup-only servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Services {
    /// Serves objects from its DRAM log.
    pub master: bool,
    /// Holds segment replicas for other masters.
    pub backup: bool,
}

/// Liveness of a server as the coordinator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ServerStatus {
    /// Enlisted and serving.
    Up,
    /// Declared crashed; its data is (being) recovered elsewhere.
    Crashed,
    /// Left the cluster for good; its id is never reused.
    Removed,
}

/// One entry of the server list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// Assigned at enlistment.
    pub id: ServerId,
    /// Where its RPC listener is (`host:port`).
    pub addr: String,
    /// What it runs.
    pub services: Services,
    /// Current status.
    pub status: ServerStatus,
    /// Failure domain (rack); replicas of one segment never share one.
    pub failure_domain: String,
    /// Measured disk read bandwidth of its backup, MB/s (0 when it runs no backup).
    pub disk_read_mbps: u32,
}

/// A table as the coordinator holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfo {
    /// Its id.
    pub id: TableId,
    /// Its name.
    pub name: String,
    /// Its tablets, in hash order, covering `[0, u64::MAX]` without gaps or overlap.
    pub tablets: Vec<Tablet>,
}

/// The client's and masters' view of the configuration: every server and every tablet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletMap {
    /// Bumped by every configuration change; a reader with an older version refreshes.
    pub version: u64,
    /// Every server ever enlisted.
    pub servers: Vec<ServerInfo>,
    /// Every live table.
    pub tables: Vec<TableInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_hash_space_covers_everything_without_overlap() {
        for span in [1u32, 2, 3, 7, 64, 1000] {
            let ranges = Tablet::split_hash_space(span);
            assert_eq!(ranges.len(), span as usize);
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges[ranges.len() - 1].1, u64::MAX);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].1 + 1, pair[1].0);
            }
            let widths: Vec<u64> = ranges.iter().map(|(s, e)| e - s).collect();
            let (min, max) = (widths.iter().min(), widths.iter().max());
            assert!(max.zip(min).is_some_and(|(max, min)| max - min <= 1));
        }
    }
}
