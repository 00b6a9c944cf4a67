//! Tables, tablets and the server list: the configuration the coordinator holds and
//! clients cache.

use crate::ids::{KeyHash, ServerId, TableId};
use serde::{Deserialize, Serialize};

/// Key hashes `start..=end` (both inclusive, so a range can end at `u64::MAX`) of one
/// table: a unit of ownership, of a will's partition and of a recovery. Ordered by
/// table, then start, then end. On the wire, in the coordinator's Raft log and in its
/// snapshots it is the tuple `(table, start, end)` it replaced: bincode writes a
/// struct's fields in order, as it writes a tuple's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HashRange {
    /// The table.
    pub table: TableId,
    /// First key hash.
    pub start: u64,
    /// Last key hash.
    pub end: u64,
}

impl HashRange {
    /// Hashes `start..=end` of `table`.
    pub const fn new(table: TableId, start: u64, end: u64) -> HashRange {
        HashRange { table, start, end }
    }

    /// Every hash of `table`.
    pub const fn whole(table: TableId) -> HashRange {
        HashRange::new(table, 0, u64::MAX)
    }

    /// Whether `hash` of a key of `table` lies in the range.
    pub fn contains(&self, table: TableId, hash: KeyHash) -> bool {
        self.table == table && self.start <= hash.0 && hash.0 <= self.end
    }

    /// Whether the two ranges share a hash.
    pub fn overlaps(&self, other: &HashRange) -> bool {
        self.table == other.table && self.start <= other.end && other.start <= self.end
    }
}

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
    /// The hashes it covers.
    pub fn range(&self) -> HashRange {
        HashRange::new(self.table, self.start_hash, self.end_hash)
    }

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

/// The load a master reports of one tablet it owns (docs/design.md §7, "Rebalancing").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletLoad {
    /// The tablet.
    pub range: HashRange,
    /// Reads and writes of its keys served over the report's interval.
    pub ops: u64,
    /// Bytes of its entries in the master's log (an upper bound: the will's count).
    pub bytes: u64,
    /// A hash that cuts the tablet's operations about in half: the first hash of the
    /// upper half of a split, in `start + 1..=end`. `None` when the master cannot say
    /// (too narrow a tablet, or no operations).
    pub split_at: Option<u64>,
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
    fn a_hash_range_encodes_as_the_tuple_it_replaced() {
        // Raft logs and snapshots written before HashRange existed must still decode.
        let range = HashRange::new(TableId(7), 3, u64::MAX);
        let tuple = (TableId(7), 3u64, u64::MAX);
        let bytes = bincode::serialize(&range).expect("encodes");
        assert_eq!(bytes, bincode::serialize(&tuple).expect("encodes"));
        assert_eq!(bincode::deserialize::<HashRange>(&bytes).ok(), Some(range));
        assert!(HashRange::new(TableId(1), 5, 9) < HashRange::new(TableId(2), 0, 0));
        assert!(HashRange::new(TableId(1), 5, 9) < HashRange::new(TableId(1), 6, 6));
        assert!(range.contains(TableId(7), KeyHash(u64::MAX)));
        assert!(!range.contains(TableId(7), KeyHash(2)));
        assert!(!range.contains(TableId(8), KeyHash(4)));
        let a = HashRange::new(TableId(1), 10, 20);
        assert!(a.overlaps(&HashRange::new(TableId(1), 20, 30)));
        assert!(a.overlaps(&HashRange::new(TableId(1), 0, 10)));
        assert!(!a.overlaps(&HashRange::new(TableId(1), 21, 30)));
        assert!(!a.overlaps(&HashRange::new(TableId(2), 10, 20)));
    }

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
