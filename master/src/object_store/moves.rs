//! The source's side of a move of tablets (docs/design.md §7, "Moving a tablet"): the
//! live objects of a range cut into pieces from the index, the changes made to the range
//! meanwhile sent as tails, and the range frozen for the last tail.
//!
//! # Why from the index, not the log
//! Dead versions never leave this master: a piece holds each live object once, as its
//! log entry (copied as it is, its CRC with it), so the target can never meet a version
//! whose tombstone it missed.
//!
//! # The rules
//! * **Open before the walk.** [`open_move_out`](ObjectStore::open_move_out) starts the
//!   move's *dirty set* before the first piece is cut: every key of the range that a
//!   published batch changes from then on, and every completion record of the range —
//!   those held at the open, and those published after — is in it until a tail sends
//!   it. Keys are noted at publish, under the store lock, so a tail never reads a key
//!   whose change is staged and not yet visible: that change publishes later and is
//!   noted again.
//! * **A tail sends current state.** For each key drained: its live object's entry, or
//!   a tombstone of the version just below the safe version *as the last publish left
//!   it*, and each record still held. That safe version lies above every version removed
//!   in a published batch, so the tombstone masks whatever version of the key the target
//!   may hold; and every object of the key staged since (a batch replicating while the
//!   tail is cut, acknowledged after it) got that safe version or more, so the
//!   tombstone never masks one. The current safe version would not do: a removal staged
//!   later in that same batch may have raised it above the create staged before it.
//!   A key leaves the set only when a tail takes it, so nothing noted is lost between
//!   two tails.
//! * **Bounded.** At most [`DIRTY_KEYS_MAX`] keys and [`DIRTY_RECORDS_MAX`] records
//!   wait. One more overflows the set, and the move then fails (the target aborts it):
//!   a set that lost a key cannot say whether it was removed, and a removal missed would
//!   bring the key back on the target.
//! * **Frozen for the last tail.** [`freeze_move_out`](ObjectStore::freeze_move_out)
//!   (an appender store job, so every write acknowledged before it is published and
//!   noted) makes reads and writes of the range answer `Retry` until the move ends
//!   here: [`end_move_out`](ObjectStore::end_move_out) after an abort the coordinators
//!   committed, or the range leaving this master's tablets after the commit.

use rampart_common::ids::{ClientId, KeyHash, MoveId, SegmentId, TableId, Version};
use rampart_common::log::encode_tombstone;
use rampart_common::status::Status;
use rampart_common::tablet::HashRange;
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::time::Instant;

use super::move_types::{
    MoveOut, MovePiece, DIRTY_KEYS_MAX, DIRTY_RECORDS_MAX, ENDED_MOVES_KEPT, MOVES_OUT_MAX,
    MOVE_PIECE_BYTES_MAX,
};
use super::store::ObjectStore;

impl ObjectStore {
    /// Opens move `id` of `range` out of this master at `now`, which must own all of
    /// it: from now on its changes are noted (module doc). Opening an open move again
    /// changes nothing.
    pub fn open_move_out(
        &mut self,
        id: MoveId,
        range: HashRange,
        now: Instant,
    ) -> Result<(), Status> {
        if self.ended_moves.contains(&id) {
            return Err(Status::MoveAborted);
        }
        if let Some(open) = self.moves_out.get(&id) {
            return if open.range == range {
                Ok(())
            } else {
                Err(Status::InvalidArgument)
            };
        }
        let HashRange { table, start, end } = range;
        if start > end || !self.tablets.unowned_parts(table, start, end).is_empty() {
            return Err(Status::UnknownTablet);
        }
        if self.moves_out.len() >= MOVES_OUT_MAX
            || self.moves_out.values().any(|m| m.range.overlaps(&range))
        {
            return Err(Status::Retry);
        }
        let records: BTreeSet<(ClientId, u64)> = self
            .completions
            .keys_where(|t, hash| t == table && (start..=end).contains(&hash.0))
            .collect();
        let overflowed = records.len() > DIRTY_RECORDS_MAX;
        self.moves_out.insert(
            id,
            MoveOut {
                range,
                dirty: HashSet::new(),
                dirty_order: VecDeque::new(),
                dirty_records: if overflowed { BTreeSet::new() } else { records },
                overflowed,
                frozen: None,
                opened: now,
            },
        );
        Ok(())
    }

    /// The next piece of open move `id`'s live objects, from hash `from`: about
    /// `bytes_max` bytes (at most [`MOVE_PIECE_BYTES_MAX`]), ending between two hashes.
    pub fn move_out_piece(
        &self,
        id: MoveId,
        from: u64,
        bytes_max: usize,
    ) -> Result<MovePiece, Status> {
        let open = self.moves_out.get(&id).ok_or(Status::InvalidArgument)?;
        let HashRange { table, start, end } = open.range;
        if !(start..=end).contains(&from) {
            return Err(Status::InvalidArgument);
        }
        let budget = bytes_max.clamp(1, MOVE_PIECE_BYTES_MAX);
        let mut piece = MovePiece {
            safe_version: self.safe_version,
            ..MovePiece::default()
        };
        let mut last = None;
        for (hash, at) in self.index.range(table, from..=end) {
            if piece.entries.len() >= budget && last != Some(hash) {
                piece.next = Some(hash.0);
                break;
            }
            last = Some(hash);
            piece.entries.extend_from_slice(self.log.entry_bytes(at));
            piece.count += 1;
        }
        Ok(piece)
    }

    /// Drains about `bytes_max` bytes of open move `id`'s dirty set into a piece of the
    /// current state of what it names (module doc). `left` says how much still waits.
    /// Fails with `Internal` once the set overflowed: the move cannot complete.
    pub fn move_out_tail(&mut self, id: MoveId, bytes_max: usize) -> Result<MovePiece, Status> {
        let budget = bytes_max.clamp(1, MOVE_PIECE_BYTES_MAX);
        let ObjectStore {
            moves_out,
            index,
            log,
            completions,
            safe_version,
            published_safe,
            ..
        } = self;
        let open = moves_out.get_mut(&id).ok_or(Status::InvalidArgument)?;
        if open.overflowed {
            return Err(Status::Internal);
        }
        let table = open.range.table;
        let mut piece = MovePiece {
            safe_version: *safe_version,
            ..MovePiece::default()
        };
        while piece.entries.len() < budget {
            let Some((hash, key)) = open.dirty_order.pop_front() else {
                break;
            };
            open.dirty.remove(&(hash, key.clone()));
            match index.lookup(table, hash, &key, |r| log.key(r)) {
                Some(at) => piece.entries.extend_from_slice(log.entry_bytes(at)),
                None => encode_tombstone(
                    &mut piece.entries,
                    table,
                    Version(published_safe.0.saturating_sub(1)),
                    SegmentId(0),
                    &key,
                ),
            }
            piece.count += 1;
        }
        while piece.entries.len() < budget {
            let Some((client, seq)) = open.dirty_records.pop_first() else {
                break;
            };
            if let Some(record) = completions.record(client, seq) {
                piece.entries.extend_from_slice(log.entry_bytes(record.at));
                piece.count += 1;
            }
        }
        piece.left = (open.dirty.len() + open.dirty_records.len()) as u64;
        Ok(piece)
    }

    /// Freezes open move `id`'s range at `now`: its reads and writes answer `Retry`
    /// until the move ends here. Run it from the appender (`Appender::on_store`), after
    /// the writes queued before it. Returns the keys and records still to send.
    pub fn freeze_move_out(&mut self, id: MoveId, now: Instant) -> Result<u64, Status> {
        let open = self.moves_out.get_mut(&id).ok_or(Status::MoveAborted)?;
        open.frozen.get_or_insert(now);
        Ok((open.dirty.len() + open.dirty_records.len()) as u64)
    }

    /// Ends move `id` here (aborted: the range is served again), for good: a later step
    /// of it is refused (`MoveAborted`), so a target that has not heard yet cannot open
    /// or freeze it again. Ending a move that is not open only remembers that.
    pub fn end_move_out(&mut self, id: MoveId) {
        self.moves_out.remove(&id);
        self.remember_ended(id);
    }

    /// The moves into this master registered now: id and range.
    pub fn moves_in(&self) -> Vec<(MoveId, HashRange)> {
        self.moves_in
            .iter()
            .map(|(&id, &range)| (id, range))
            .collect()
    }

    /// The moves open here: id, range, when opened, since when frozen.
    pub fn moves_out(&self) -> Vec<(MoveId, HashRange, Instant, Option<Instant>)> {
        self.moves_out
            .iter()
            .map(|(&id, open)| (id, open.range, open.opened, open.frozen))
            .collect()
    }

    /// Registers move `id` of `range` into this master: it owns none of it, and what is
    /// replayed there stays until the commit gives it the range or the move ends
    /// ([`end_move_in`](Self::end_move_in)); a recovery's forgetting leaves it alone
    /// ([`forget_unowned`](Self::forget_unowned)). Refused (`InvalidArgument`) for a
    /// range owned here in part, (`MoveAborted`) for a move registered or ended here
    /// already (a move runs once: its tails are not sent twice), and (`Retry`) while
    /// another move into an overlapping range is registered or too many are.
    pub fn begin_move_in(&mut self, id: MoveId, range: HashRange) -> Result<(), Status> {
        // Once only: a second run of a move would start a fresh replay state over the
        // first's copy, and the source's tails already sent to the first are gone.
        if self.ended_moves.contains(&id) || self.moves_in.contains_key(&id) {
            return Err(Status::MoveAborted);
        }
        let HashRange { table, start, end } = range;
        if start > end || self.tablets.owns_any(table, start, end) {
            return Err(Status::InvalidArgument);
        }
        // A range moved away and still being forgotten here would take the copy's
        // objects with it (`forget_step`).
        if self.moves_in.len() >= MOVES_OUT_MAX
            || self.moves_in.values().any(|r| r.overlaps(&range))
            || self.forgetting.iter().any(|r| r.overlaps(&range))
        {
            return Err(Status::Retry);
        }
        self.moves_in.insert(id, range);
        Ok(())
    }

    /// Ends move `id` into this master, for good (a late `MoveIn` of it is refused);
    /// returns its range, whose objects not owned here the caller then forgets. `None`
    /// if it was not registered.
    pub fn end_move_in(&mut self, id: MoveId) -> Option<HashRange> {
        self.remember_ended(id);
        self.moves_in.remove(&id)
    }

    fn remember_ended(&mut self, id: MoveId) {
        self.ended_moves.insert(id);
        while self.ended_moves.len() > ENDED_MOVES_KEPT {
            self.ended_moves.pop_first();
        }
    }

    /// The parts of `table`'s hashes `start..=end` outside every move into this master.
    pub(super) fn outside_moves_in(&self, table: TableId, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut parts = vec![(start, end)];
        for moving in self.moves_in.values().filter(|r| r.table == table) {
            parts = parts
                .into_iter()
                .flat_map(|(from, to)| {
                    let mut left = Vec::with_capacity(2);
                    if moving.end < from || to < moving.start {
                        left.push((from, to));
                    } else {
                        if from < moving.start {
                            left.push((from, moving.start - 1));
                        }
                        if moving.end < to {
                            left.push((moving.end + 1, to));
                        }
                    }
                    left
                })
                .collect();
        }
        parts
    }

    /// Whether `hash` of `table` lies in a frozen moving range.
    pub(super) fn frozen(&self, table: TableId, hash: KeyHash) -> bool {
        self.moves_out
            .values()
            .any(|m| m.frozen.is_some() && m.range.contains(table, hash))
    }

    /// Where a walk of `table`'s hashes `start..=end` must stop short of a frozen
    /// moving range: the last hash before the first one it meets (`end` if none).
    /// `Retry` if `start` lies in one.
    pub(super) fn before_frozen(
        &self,
        table: TableId,
        start: u64,
        end: u64,
    ) -> Result<u64, Status> {
        let mut last = end;
        for open in self.moves_out.values().filter(|m| m.frozen.is_some()) {
            let HashRange {
                table: t,
                start: from,
                end: to,
            } = open.range;
            if t != table || to < start || from > last {
                continue;
            }
            if from <= start {
                return Err(Status::Retry);
            }
            last = from - 1;
        }
        Ok(last)
    }

    /// Notes a published change of `key`, and a published record, in the dirty set of
    /// the move whose range holds them.
    pub(super) fn note_moving(&mut self, table: TableId, hash: KeyHash, key: &[u8]) {
        for open in self.moves_out.values_mut() {
            if !open.range.contains(table, hash) || open.overflowed {
                continue;
            }
            let noted = (hash, key.to_vec());
            if open.dirty.contains(&noted) {
                continue;
            }
            if open.dirty.len() >= DIRTY_KEYS_MAX {
                open.overflowed = true;
                open.dirty.clear();
                open.dirty_order.clear();
            } else {
                open.dirty.insert(noted.clone());
                open.dirty_order.push_back(noted);
            }
        }
    }

    /// Notes a published completion record of `client`'s operation `seq` on `hash` of
    /// `table`.
    pub(super) fn note_moving_record(
        &mut self,
        table: TableId,
        hash: KeyHash,
        client: ClientId,
        seq: u64,
    ) {
        for open in self.moves_out.values_mut() {
            if !open.range.contains(table, hash)
                || open.overflowed
                || open.dirty_records.contains(&(client, seq))
            {
                continue;
            }
            if open.dirty_records.len() >= DIRTY_RECORDS_MAX {
                open.overflowed = true;
                open.dirty_records.clear();
            } else {
                open.dirty_records.insert((client, seq));
            }
        }
    }

    /// Drops the moves out whose ranges this master no longer owns in full (the commit
    /// took them elsewhere), and the moves in whose ranges it owns now (the commit gave
    /// them here).
    pub(super) fn drop_moves_not_owned(&mut self) {
        let tablets = &self.tablets;
        self.moves_out.retain(|_, open| {
            let HashRange { table, start, end } = open.range;
            tablets.unowned_parts(table, start, end).is_empty()
        });
        self.moves_in
            .retain(|_, range| !tablets.owns_any(range.table, range.start, range.end));
    }
}
