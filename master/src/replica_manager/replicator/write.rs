//! The write path: [`Replicator::replicate`] writes each sealed range to every
//! replica of its segment, keeping a copy of the open segments' bytes to fill the
//! replicas re-created there.

use bytes::Bytes;
use futures::future::join_all;
use rampart_common::ids::SegmentId;
use std::sync::Arc;

use super::state::{Fatal, Replicator, Segment, SPARE_BUFFERS_MAX};
use crate::replica_manager::sequencing::{NotWritable, RangeStep, RangeWrite};
use crate::replica_manager::settling::Patience;
use crate::replica_manager::transport::Failure;
use crate::segmented_log::SealedRange;

impl Replicator {
    /// Returns once every replica holds `ranges` (in order). See the `replicator` module
    /// doc.
    ///
    /// # Errors
    /// [`Fatal`] when the batch must never be acknowledged.
    pub async fn replicate(&mut self, ranges: &[SealedRange]) -> Result<(), Fatal> {
        if self.config.replicas == 0 {
            return Ok(());
        }
        self.drain_closes();
        if let Some(fatal) = &self.fenced {
            return Err(fatal.clone());
        }
        for range in ranges {
            self.replicate_range(range).await?;
        }
        Ok(())
    }

    /// Carries out the steps of [`RangeWrite`] for one range.
    async fn replicate_range(&mut self, sealed: &SealedRange) -> Result<(), Fatal> {
        self.segment_capacity = sealed.capacity;
        let mut write = RangeWrite::begin(&mut self.segments, &sealed.range, self.config.replicas);
        let id = write.segment();
        loop {
            let step = write
                .next(self.segment_mut(id)?)
                .map_err(|NotWritable(id)| Fatal::NotWritable(id))?;
            match step {
                RangeStep::Settle => self.settle(id, None, Patience::UntilDone).await?,
                RangeStep::Write { offset } => {
                    let failures = self.write_all(id, offset, &sealed.bytes).await;
                    self.keep_open_bytes(sealed)?;
                    let lost_any = !failures.is_empty();
                    self.apply_failures(id, failures)?;
                    write.written(lost_any);
                }
                RangeStep::Close { slots } => {
                    self.start_closes(id, slots);
                    if let Some(mut buffer) = self.open_bytes.remove(&id) {
                        if self.spare_buffers.len() < SPARE_BUFFERS_MAX {
                            buffer.clear();
                            self.spare_buffers.push(buffer);
                        }
                    }
                }
                RangeStep::Done => return Ok(()),
            }
        }
    }

    /// Appends a range's bytes to its open segment's copy (see `open_bytes`).
    fn keep_open_bytes(&mut self, sealed: &SealedRange) -> Result<(), Fatal> {
        let id = sealed.range.segment;
        let capacity = sealed.capacity as usize;
        let spare = &mut self.spare_buffers;
        let buffer = self
            .open_bytes
            .entry(id)
            .or_insert_with(|| spare.pop().unwrap_or_else(|| Vec::with_capacity(capacity)));
        if buffer.len() != sealed.range.start as usize {
            // `writable` checked that the range starts where the replicas' bytes end.
            return Err(Fatal::MissingBytes(id));
        }
        buffer.extend_from_slice(&sealed.bytes);
        Ok(())
    }

    /// The first `len` bytes of `id` for a re-created replica: from `log_bytes` (a
    /// closed segment's, read from the log by the appender), else from the open
    /// segment's ranges. `None` when there are none to write.
    pub(super) fn fill(
        &self,
        id: SegmentId,
        len: u32,
        log_bytes: Option<&Bytes>,
    ) -> Result<Option<Bytes>, Fatal> {
        if len == 0 {
            return Ok(None);
        }
        let len = len as usize;
        if let Some(bytes) = log_bytes {
            return bytes
                .get(..len)
                .map(|_| Some(bytes.slice(..len)))
                .ok_or(Fatal::MissingBytes(id));
        }
        self.open_bytes
            .get(&id)
            .and_then(|buffer| buffer.get(..len))
            .map(|bytes| Some(Bytes::copy_from_slice(bytes)))
            .ok_or(Fatal::MissingBytes(id))
    }

    pub(super) fn segment_mut(&mut self, id: SegmentId) -> Result<&mut Segment, Fatal> {
        self.segments.get_mut(&id).ok_or(Fatal::MissingBytes(id))
    }

    /// Writes `bytes` at `offset` to every live replica of `id`; returns the failures by
    /// slot.
    async fn write_all(
        &mut self,
        id: SegmentId,
        offset: u32,
        bytes: &Bytes,
    ) -> Vec<(usize, Failure)> {
        let Some(segment) = self.segments.get(&id) else {
            return Vec::new();
        };
        let writes = segment.live().map(|(slot, replica)| {
            let (backup, handle, epoch) = (replica.backup, replica.handle, replica.epoch);
            let transport = Arc::clone(&replica.link.transport);
            let bytes = bytes.clone();
            async move {
                let result = transport.write(handle, epoch, offset, bytes).await;
                (slot, backup, result)
            }
        });
        let results = join_all(writes).await;
        let mut failures = Vec::new();
        for (slot, backup, result) in results {
            match result {
                Ok(()) => self.heard(backup),
                Err(failure) => failures.push((slot, failure)),
            }
        }
        failures
    }
}
