//! The profiles of everything appended, and the will cut from them.
//!
//! Every object, tombstone and completion record appended is counted in the
//! [`Profiler`] under its tablet.
//! Entries replayed into ranges not owned yet are remembered and counted when their
//! tablet is taken, so the will ([`ObjectStore::will`]) covers every entry of the log
//! that a recovery of this master would replay.

use rampart_common::ids::{KeyHash, SegmentId, TableId};
use rampart_common::tablet::Tablet;

use crate::profiler::{Profiler, Will};

use super::store::ObjectStore;

impl ObjectStore {
    /// This master's will: its owned tablets cut into partitions within the partition
    /// limits, from the profiles of everything appended.
    pub fn will(&self) -> Will {
        self.profiler.will(
            self.partition_limits.bytes_max,
            self.partition_limits.records_max,
        )
    }

    /// The profiles behind the will.
    pub fn profiler(&self) -> &Profiler {
        &self.profiler
    }

    /// Counts a replayed entry (appended to `segment`) in the profiler, or remembers it
    /// until its tablet is taken.
    pub(super) fn note_replayed(
        &mut self,
        table: TableId,
        hash: KeyHash,
        bytes: u64,
        segment: SegmentId,
    ) {
        if !self.profiler.track(table, hash, bytes) {
            self.replayed_untracked.push((table, hash, bytes, segment));
        }
    }

    /// Starts profiling `tablets` together (see [`Profiler::take_tablets`]), counting
    /// the entries a recovery replayed into them.
    ///
    /// [`Profiler::take_tablets`]: crate::profiler::Profiler::take_tablets
    pub(super) fn profile_taken(&mut self, tablets: &[Tablet]) {
        self.profiler.take_tablets(tablets);
        let profiler = &mut self.profiler;
        self.replayed_untracked.retain(|&(table, hash, bytes, _)| {
            let inside = tablets.iter().any(|tablet| {
                table == tablet.table && (tablet.start_hash..=tablet.end_hash).contains(&hash.0)
            });
            if inside {
                profiler.track(table, hash, bytes);
            }
            !inside
        });
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rampart_common::ids::ServerId;
    use rampart_common::log::{object_entry_bytes, tombstone_entry_bytes};
    use rampart_common::tablet::HashRange;

    use crate::profiler::PartitionLimits;
    use crate::replay::{PieceEntry, ReplayState};

    use super::super::test_support::{
        config, delete, obj, piece, put, recovery_master, replay, tablet, tomb, whole, RECOVERED,
        TABLE,
    };

    #[test]
    fn the_will_covers_every_tablet_and_counts_what_was_written() {
        let mut store = ObjectStore::with_partition_limits(
            ServerId(1),
            config(),
            PartitionLimits {
                bytes_max: 4096,
                records_max: 1_000,
            },
        );
        let split = u64::MAX / 2;
        store.take_tablets(&[tablet(TABLE, 0, split), tablet(TABLE, split + 1, u64::MAX)]);
        let mut bytes = 0;
        for i in 0..100 {
            let key = format!("key-{i}");
            put(&mut store, key.as_bytes(), &[1u8; 100]);
            bytes += object_entry_bytes(key.len(), 100) as u64;
        }
        delete(&mut store, b"key-0");
        bytes += tombstone_entry_bytes(b"key-0".len()) as u64;
        let will = store.will();
        assert_eq!(will.coverage(), vec![HashRange::whole(TABLE)]);
        assert!(
            will.partitions.len() >= 2,
            "{} bytes in 4 KiB partitions",
            bytes
        );
        let records: u64 = will.partitions.iter().map(|p| p.records).sum();
        let total: u64 = will.partitions.iter().map(|p| p.bytes).sum();
        assert!(
            records >= 101 && total >= bytes,
            "{records} records, {total} bytes"
        );
        // Dropping a tablet drops it from the will.
        store.drop_tablets(&[tablet(TABLE, split + 1, u64::MAX)]);
        assert_eq!(
            store.will().coverage(),
            vec![HashRange::new(TABLE, 0, split)]
        );
    }

    #[test]
    fn taking_a_recovered_tablet_counts_its_replayed_entries_in_the_will() {
        let mut store = recovery_master();
        let mut state = ReplayState::new();
        let entries: Vec<PieceEntry> = (0..50)
            .map(|i| obj(&format!("key-{i}"), 10 + i, "value"))
            .chain([tomb("gone", 3)])
            .collect();
        let bytes: u64 = entries.iter().map(|e| e.entry_bytes() as u64).sum();
        replay(&mut store, &mut state, &[piece(entries)]);
        assert_eq!(store.will().coverage(), vec![HashRange::whole(TABLE)]);
        store.take_tablets(&[whole(RECOVERED)]);
        let will = store.will();
        let recovered: Vec<_> = will
            .partitions
            .iter()
            .filter(|p| p.tablets.iter().any(|r| r.table == RECOVERED))
            .collect();
        assert_eq!(recovered.len(), 1);
        assert_eq!((recovered[0].records, recovered[0].bytes), (51, bytes));
    }
}
