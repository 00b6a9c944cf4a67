//! The cleaner's work on the store (its decisions are in [`cleaner`]): planning a pass
//! (the segments a failed recovery tainted first), its bounded steps that copy live
//! entries into survivors and move the index after them, committing what a pass
//! finished, and freeing the retired segments.

use rampart_common::config::SEGMENT_FIXED_OVERHEAD_BYTES;
use rampart_common::ids::{key_hash, ClientId, KeyHash, SegmentId, TableId};
use rampart_common::log::{
    decode_entry, decode_object_trusted, object_entry_bytes, Entry, LogFull,
};
use std::collections::VecDeque;

use crate::cleaner::{self, CleaningPass, StepEnd};
use crate::object_index::{LogRef, SlotAt};
use crate::segmented_log::{NoSpace, SegmentedLog};

use super::store::ObjectStore;

/// Entries the cleaner's walk parses and locates in the index ahead of the one it
/// copies (`walk_ahead`): enough for the processor to overlap their lookups' cache
/// misses, few enough that what a step walks past its budget is small.
const WALK_AHEAD: usize = 64;

impl ObjectStore {
    /// Plans a cleaning pass over the log's closed segments (cost-benefit,
    /// [`cleaner::select`]) filling at most `survivors_max` survivors
    /// ([`cleaner::PASS_SURVIVORS_MAX`] in the appender); `None` when no choice would
    /// free a segment.
    ///
    /// Tainted segments ([`forget_unowned`](Self::forget_unowned)) come first, whatever
    /// they score: until they are gone, no recovery can be replayed here.
    pub fn plan_cleaning(&self, survivors_max: u64) -> Option<CleaningPass> {
        let closed = self.log.closed_segments();
        let usage = self.log.usage();
        let tainted: Vec<SegmentId> = closed
            .iter()
            .map(|s| s.segment)
            .filter(|s| self.tainted.contains(s))
            .take(usize::try_from(survivors_max.max(1)).unwrap_or(usize::MAX))
            .collect();
        if !tainted.is_empty() {
            let stamp = closed
                .iter()
                .filter(|s| tainted.contains(&s.segment))
                .map(|s| s.stamp)
                .max()
                .unwrap_or(usage.clock);
            return Some(CleaningPass::new(tainted, stamp));
        }
        let segment_bytes = u64::from(usage.segment_bytes);
        // A survivor holds its header, a checksum per step and its footer besides the
        // entries: counted generously.
        let survivor_capacity = segment_bytes.saturating_sub(SEGMENT_FIXED_OVERHEAD_BYTES as u64);
        let chosen = cleaner::select(
            &closed,
            usage.clock,
            segment_bytes,
            survivor_capacity,
            survivors_max,
        );
        if chosen.is_empty() {
            return None;
        }
        let stamp = closed
            .iter()
            .filter(|s| chosen.contains(&s.segment))
            .map(|s| s.stamp)
            .max()
            .unwrap_or(usage.clock);
        Some(CleaningPass::new(chosen, stamp))
    }

    /// One bounded step of `pass` (module doc of [`cleaner`]): walks at most
    /// `budget_bytes` of the cleaned segments' entries, copying the live ones into the
    /// pass's survivor and dropping the dead ones (uncounting them in the profiles), and
    /// seals what it copied. Replicate the log's unreplicated ranges ([`seal`](Self::seal))
    /// before anything else; commit with [`commit_cleaning`](Self::commit_cleaning) when
    /// the step ends with a survivor closed, the pass done, or no buffer.
    ///
    /// An object is live when the index points at it; it moves with its version, and
    /// the index follows it. A tombstone is live while the segment of the object it
    /// deletes is in the log and not freed by this pass at the latest when the
    /// tombstone's own segment is ([`CleaningPass::walked_before`]); it moves unchanged.
    pub fn clean_step(&mut self, pass: &mut CleaningPass, budget_bytes: usize) -> StepEnd {
        let end = self.walk(pass, budget_bytes);
        if let Some(survivor) = pass.survivor() {
            self.log.seal_survivor(survivor);
        }
        end
    }

    fn walk(&mut self, pass: &mut CleaningPass, budget_bytes: usize) -> StepEnd {
        let mut walked = 0usize;
        // The next entries of the segment being walked, parsed and located ahead.
        let mut ahead: VecDeque<(LogRef, WalkedEntry, Option<SlotAt>)> =
            VecDeque::with_capacity(WALK_AHEAD);
        loop {
            let Some((segment, offset)) = pass.position() else {
                if let Some(survivor) = pass.survivor() {
                    self.log.close_survivor(survivor);
                    pass.survivor_closed();
                }
                return StepEnd::Done;
            };
            if walked >= budget_bytes {
                return StepEnd::Budget;
            }
            let here = LogRef { segment, offset };
            if ahead.front().map(|(at, ..)| *at) != Some(here) {
                self.walk_ahead(here, &mut ahead);
            }
            let Some((_, found, located)) = ahead.pop_front() else {
                // The end of the segment (its bytes end at the footer's checksum).
                pass.segment_walked();
                continue;
            };
            walked += (found.next - offset) as usize;
            let bytes = u64::from(found.next - offset);
            let range = (offset, found.next);
            let (table, hash) = match found.kind {
                Walked::Object { table, hash } => {
                    // Live when the index points here (located ahead); the copy and the
                    // move of the reference need no second lookup.
                    if let Some(slot) = located {
                        let new = match relocate(&mut self.log, pass, segment, range) {
                            Ok(new) => new,
                            Err(end) => return end,
                        };
                        if !self.index.repoint(slot, here, new) {
                            // Cannot happen (nothing reshapes the index during a walk);
                            // stay right anyway.
                            match self.index.ref_mut(table, hash, here) {
                                Some(held) => *held = new,
                                None => self.log.note_dead(new, bytes),
                            }
                        }
                        self.relocated(pass, here, bytes, found.next);
                        continue;
                    }
                    (table, hash)
                }
                Walked::Tombstone {
                    table,
                    hash,
                    object_segment,
                } => {
                    let live =
                        self.log.holds(object_segment) && !pass.walked_before(object_segment);
                    if live {
                        let new = match relocate(&mut self.log, pass, segment, range) {
                            Ok(new) => new,
                            Err(end) => return end,
                        };
                        self.log
                            .tombstone_moved(object_segment, segment, new.segment, bytes);
                        self.relocated(pass, here, bytes, found.next);
                        continue;
                    }
                    (table, hash)
                }
                Walked::Completion {
                    table,
                    hash,
                    client,
                    seq,
                } => {
                    // Live while its client has not acknowledged it and its tablet is
                    // here: the record then points at this very entry.
                    if self.completions.holds(client, seq, here) {
                        let new = match relocate(&mut self.log, pass, segment, range) {
                            Ok(new) => new,
                            Err(end) => return end,
                        };
                        self.completions.repoint(client, seq, here, new);
                        self.relocated(pass, here, bytes, found.next);
                        continue;
                    }
                    (table, hash)
                }
                Walked::Other => {
                    // Headers, digests, safe versions (every head opens with the floor,
                    // `SegmentedLog` module doc), checksums and footers stay behind.
                    pass.advance(found.next);
                    continue;
                }
            };
            self.profiler.untrack(table, hash, bytes);
            pass.note_dropped(bytes);
            pass.advance(found.next);
        }
    }

    /// Parses the next [`WALK_AHEAD`] entries of `from`'s segment, from `from` on, and
    /// locates each object among them in the index, into `ahead` (emptied first).
    /// Their buckets are warmed first ([`ObjectIndex::warm`]) in one short loop, so the
    /// processor overlaps their cache misses, which one lookup at a time between copies
    /// would wait out one after the other (at a million objects, most of a step's
    /// time). Nothing changes the index's shape during a walk (moves only repoint), so
    /// what is located stays valid while the walk uses it.
    ///
    /// [`ObjectIndex::warm`]: crate::object_index::ObjectIndex::warm
    fn walk_ahead(
        &self,
        from: LogRef,
        ahead: &mut VecDeque<(LogRef, WalkedEntry, Option<SlotAt>)>,
    ) {
        ahead.clear();
        let Some(bytes) = self.log.segment_bytes(from.segment) else {
            return;
        };
        let mut offset = from.offset;
        let mut objects = Vec::with_capacity(WALK_AHEAD);
        while ahead.len() < WALK_AHEAD {
            let Some(found) = walk_entry(bytes, offset) else {
                break;
            };
            let here = LogRef {
                segment: from.segment,
                offset,
            };
            if let Walked::Object { table, hash } = found.kind {
                objects.push((table, hash));
            }
            offset = found.next;
            ahead.push_back((here, found, None));
        }
        self.index.warm(&objects);
        for (here, found, located) in ahead.iter_mut() {
            if let Walked::Object { table, hash } = found.kind {
                *located = self.index.locate(table, hash, *here);
            }
        }
    }

    /// Books an entry of `bytes` at `here` copied into the survivor; the walk goes on at
    /// `next`.
    fn relocated(&mut self, pass: &mut CleaningPass, here: LogRef, bytes: u64, next: u32) {
        // Counted in the survivor now; the cleaned segment goes at a commit.
        self.log.note_dead(here, bytes);
        pass.note_relocated(bytes);
        pass.advance(next);
    }

    /// Commits what `pass` finished (module doc of [`cleaner`]): closed survivors join
    /// the log, finished segments leave it, with a digest appended to the head. Returns
    /// the segments retired; replicate the log's unreplicated ranges
    /// ([`seal`](Self::seal)), then [`free_cleaned`](Self::free_cleaned).
    ///
    /// # Errors
    /// [`NoSpace`] when the digest fits nowhere; the pass keeps its finished segments.
    pub fn commit_cleaning(&mut self, pass: &mut CleaningPass) -> Result<Vec<SegmentId>, NoSpace> {
        let finished = pass.take_finished();
        match self.log.commit_cleaning(&finished, self.safe_version) {
            Ok(()) => Ok(finished),
            Err(full) => {
                pass.return_finished(finished);
                Err(full)
            }
        }
    }

    /// Frees the segments the last commit retired, once its digest is on every replica;
    /// returns them (their replicas may now be freed on the backups).
    pub fn free_cleaned(&mut self) -> Vec<SegmentId> {
        self.log.free_retired()
    }

    /// Tainted segments still in the log ([`forget_unowned`](Self::forget_unowned)).
    pub fn tainted_held(&self) -> usize {
        self.tainted.iter().filter(|&&s| self.log.holds(s)).count()
    }

    /// Whether a tainted segment other than the head is in the log: the cleaner has one
    /// to take now.
    pub fn tainted_to_clean(&self) -> bool {
        let head = self.log.head();
        self.tainted.iter().any(|&s| s != head && self.log.holds(s))
    }

    /// Closes the head when it is tainted, so that the cleaner can take it; `NoSpace`
    /// when no buffer is free for a new head (a later rollover closes it).
    pub fn close_tainted_head(&mut self) -> Result<(), NoSpace> {
        let log = &self.log;
        self.tainted.retain(|&segment| log.holds(segment));
        if self.tainted.contains(&self.log.head()) {
            self.log.roll_over_now(self.safe_version)?;
        }
        Ok(())
    }
}

/// Copies the entry at `range` of `segment` into `pass`'s survivor in `log` (opening
/// one when none is open). Errs with where the step ends: the survivor full (closed
/// now: the entry is copied by the next step, into the next survivor) or no buffer for
/// a new one.
fn relocate(
    log: &mut SegmentedLog,
    pass: &mut CleaningPass,
    segment: SegmentId,
    range: (u32, u32),
) -> Result<LogRef, StepEnd> {
    let survivor = match pass.survivor() {
        Some(survivor) => survivor,
        None => {
            let survivor = log
                .open_survivor(pass.stamp())
                .map_err(|NoSpace| StepEnd::NoBuffer)?;
            pass.survivor_opened(survivor);
            survivor
        }
    };
    log.copy_entry(segment, range, survivor).map_err(|LogFull| {
        log.close_survivor(survivor);
        pass.survivor_closed();
        StepEnd::SurvivorClosed
    })
}

/// What the cleaner's walk found at one offset of a segment.
struct WalkedEntry {
    kind: Walked,
    /// Offset of the next entry.
    next: u32,
}

enum Walked {
    Object {
        table: TableId,
        hash: KeyHash,
    },
    Tombstone {
        table: TableId,
        hash: KeyHash,
        object_segment: SegmentId,
    },
    Completion {
        table: TableId,
        hash: KeyHash,
        client: ClientId,
        seq: u64,
    },
    Other,
}

/// The entry at `offset` of `bytes`, a segment of this master's own log: objects are
/// read without checking their CRC again (this master wrote and sealed them; the read
/// path trusts them the same way), tombstones and the rest are decoded. `None` at the
/// end of the bytes.
fn walk_entry(bytes: &[u8], offset: u32) -> Option<WalkedEntry> {
    let at = offset as usize;
    if let Some(object) = decode_object_trusted(bytes, at) {
        let next = at + object_entry_bytes(object.key.len(), object.value.len());
        return Some(WalkedEntry {
            kind: Walked::Object {
                table: object.table,
                hash: key_hash(object.key),
            },
            next: next as u32,
        });
    }
    let (entry, next) = decode_entry(bytes, at).ok()??;
    let kind = match entry {
        Entry::Tombstone(tombstone) => Walked::Tombstone {
            table: tombstone.table,
            hash: key_hash(tombstone.key),
            object_segment: tombstone.segment_id,
        },
        Entry::Completion(record) => Walked::Completion {
            table: record.table,
            hash: record.key_hash,
            client: record.client,
            seq: record.seq,
        },
        // Named one by one: an entry type added later must be decided on here.
        Entry::Object(_)
        | Entry::Header(_)
        | Entry::Digest(_)
        | Entry::SafeVersion(_)
        | Entry::Checksum(_)
        | Entry::Footer { .. } => Walked::Other,
    };
    Some(WalkedEntry {
        kind,
        next: next as u32,
    })
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use rampart_common::ids::Version;
    use rampart_common::status::Status;

    use super::super::test_support::{
        clean_tainted, log_entries, obj, partition, piece, put, reads, recovery_master, replay,
        whole, ReadResult, RECOVERED, TABLE,
    };
    use crate::replay::ReplayState;

    #[test]
    fn objects_forgotten_after_an_abandoned_replay_never_come_back() {
        // An attempt replays k into this master and is abandoned. Meanwhile the
        // partition's real owner removes k, and its cleaner drops the tombstone. Later
        // this master recovers that owner's range (without k, and with `kept` at the
        // very version the attempt replayed) and takes it, then crashes: its own log
        // must not give k back, and must keep `kept`.
        let mut store = recovery_master();
        put(&mut store, b"mine", b"v");
        let mut state = ReplayState::new();
        replay(
            &mut store,
            &mut state,
            &[piece(vec![obj("k", 5, "old"), obj("kept", 5, "x")])],
        );
        assert_eq!(store.forget_unowned(&partition()), 2);
        assert!(store.tainted_held() > 0);
        clean_tainted(&mut store);
        let mut state = ReplayState::new();
        replay(&mut store, &mut state, &[piece(vec![obj("kept", 5, "x")])]);
        store.take_tablets(&[whole(RECOVERED)]);
        let want = vec![
            (Status::ObjectDoesntExist, Version(0), vec![]),
            (Status::Ok, Version(5), b"x".to_vec()),
        ];
        assert_eq!(reads(&store, &["k", "kept"]), want);
        assert_eq!(
            store.read(TABLE, b"mine").status(),
            Status::Ok,
            "moved, kept"
        );
        let mut own = log_entries(&store);
        own.retain(|e| e.table_and_hash().0 == RECOVERED);
        for reversed in [false, true] {
            if reversed {
                own.reverse();
            }
            let mut again = recovery_master();
            let mut state = ReplayState::new();
            replay(&mut again, &mut state, &[piece(own.clone())]);
            again.take_tablets(&[whole(RECOVERED)]);
            assert_eq!(reads(&again, &["k", "kept"]), want, "reversed: {reversed}");
        }
    }
}
