//! `BackupService`: the backup's RPC handlers (DESIGN.md §5 "Backups", "One-sided
//! writes").
//!
//! A master opens a *frame* for each replica it places here (`OpenReplica`), fills it
//! (`WriteReplica` in the `rpc` transport; one-sided transports later), and closes it
//! (`CloseReplica`); the close writes the replica to the [`SegmentStore`] and releases
//! the frame. `FreeReplica`, `ListReplicas` and `ReadReplica` serve the cleaner and
//! recovery. Callers see replicas named by (master, segment) and frames named by
//! handles; they never see the store's files, the locks or the blocking threads.
//!
//! # Guarantees
//! 1. A `CloseReplica` is answered `Ok` only once [`SegmentStore::write_replica`]
//!    returned `Ok`, i.e. the replica is fsynced and survives a restart of the backup.
//! 2. Epochs never go back: an open frame refuses older epochs, and a closed replica is
//!    final (re-opening it at its epoch or an older one is `StaleEpoch`).
//! 3. A replica is never invisible while it moves from frame to disk: the frame stays
//!    in the frame table until the stored replica is in the metadata mirror, and both
//!    changes happen in one critical section.
//! 4. Handles are never reused, so a late request for a closed, freed or replaced frame
//!    gets `UnknownFrame` rather than touching another replica.
//! 5. No input panics the service: every request is decoded with [`Reply::decode`],
//!    every offset and length is checked in 64-bit arithmetic before it is used.
//!
//! # Frames
//! A frame is the small private struct `Frame` holding a zeroed `Vec<u8>` of the requested
//! capacity (behind an `Arc`, so a close can hand it to a blocking thread without a
//! copy). A later increment moves frames into a shared-memory file for the one-sided
//! `shm` transport; only `Frame` (where its bytes live and how they are copied) changes
//! then, not the frame table or the handlers. At most [`BackupConfig::frames_max`]
//! frames are open at once — the bound on unflushed data; past it `OpenReplica` is
//! `BackupFull` and the master picks another backup.
//!
//! # Concurrency
//! Two locks, both `parking_lot` mutexes (nothing awaits while holding either):
//! * `store` — the [`SegmentStore`]. Held across disk I/O, so it is only ever taken on
//!   a blocking thread (`spawn_blocking`), never on the reactor.
//! * `state` — the frame table and a mirror of the store's metadata. Held only for
//!   in-memory work (a lookup, a copy of at most one RPC payload), so the reactor and
//!   the connection tasks (`handle_now`) take it freely.
//!
//! Lock order: `store` before `state`. A blocking task holding `store` may take `state`
//! briefly to publish its result; nothing that holds `state` ever waits for `store`.
//! Hence `state` is never held while the store lock is held across blocking I/O by the
//! same thread, and no cycle exists.
//!
//! **Close racing free (or a replacing open) of the same replica.** `FreeReplica` first
//! removes the frame from the table (under `state`), then frees the stored replica
//! (under `store`). A close checks, *under `store`*, that its frame is still in the
//! table before it writes. So either the close's write runs first, entirely before the
//! free's store step, which then deletes it; or the close finds its frame gone, writes
//! nothing and answers `UnknownFrame`. Either way **the replica ends up freed**, and a
//! close answered `Ok` was linearised before the free. A replica the master freed is
//! never resurrected by a close that was still in flight.
//!
//! # Failure handling
//! * Store full on close → `BackupFull`; the frame stays open so the master can retry
//!   the close or free the frame and place the replica elsewhere. Any other store error
//!   also leaves the frame open (the master decides); `StaleEpoch`/`Regressed` map to
//!   `StaleEpoch`, I/O errors to `Internal` with the detail.
//! * A replica that fails verification on read is quarantined by the store and
//!   reported as `Internal` with the reason; it is no longer listed.
//! * A retried close whose first attempt succeeded finds the frame gone and gets
//!   `UnknownFrame`; the master can confirm with `ListReplicas`.
//!
//! # Cost
//! Open, write and list run on the connection task (`handle_now`). A write copies its
//! payload once, under `state` (≈ 100 µs per MiB at memory speed; writes of all frames
//! serialise there, acceptable for the `rpc` baseline that one-sided writes replace).
//! A close costs one replica write plus two fsyncs in the store (≈ 17 ms for 8 MiB at
//! 500 MB/s), on a blocking thread.

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::backup::{
    self as proto, CloseReplicaRequest, FrameHandle, FreeReplicaReply, ListReplicasReply,
    ListReplicasRequest, OpenReplicaRequest, ReadReplicaReply, ReplicaId, ReplicaInfo,
    WriteReplicaRequest,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, Service};
use rampart_common::status::Status;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::segment_store::{
    Disk, RealDisk, ReplicaMeta, ScanReport, SegmentStore, StoreError, REPLICA_BYTES_MAX,
};

/// How a backup sizes its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupConfig {
    /// Frames open at once: the bound on replica bytes held only in memory. Sized so
    /// the disk can flush them (issue 3); `OpenReplica` past it is `BackupFull`.
    pub frames_max: usize,
    /// Largest frame capacity accepted, in bytes; larger opens are `InvalidArgument`.
    /// Values above [`REPLICA_BYTES_MAX`] are treated as it (the store takes no more).
    pub frame_bytes_max: u32,
}

/// (master, segment): the key of a replica.
type ReplicaKey = (ServerId, SegmentId);

/// One open frame: a replica being written.
///
/// Kept small and private so that moving frames into a shared-memory file (the `shm`
/// transport) changes only this struct.
#[derive(Debug)]
struct Frame {
    master: ServerId,
    segment: SegmentId,
    epoch: u64,
    /// Bytes the frame holds; equals `bytes.len()`.
    capacity: u32,
    /// The frame's content, zeroed at open. Shared with a close in flight (which writes
    /// a snapshot of it to the store); otherwise the only reference.
    bytes: Arc<Vec<u8>>,
    /// One past the furthest byte written (`WriteReplica` only: one-sided writes do not
    /// tell the backup). Invariant: ≤ `capacity`.
    written_end: u32,
    /// Closes running on a blocking thread. While non-zero the frame refuses writes:
    /// the master has declared it complete, and the bytes are being flushed.
    closes_in_flight: u32,
}

impl Frame {
    fn info(&self) -> ReplicaInfo {
        ReplicaInfo {
            master: self.master,
            segment: self.segment,
            epoch: self.epoch,
            length: self.written_end,
            closed: false,
        }
    }
}

/// The frame table and the store-metadata mirror, behind `BackupService::state`.
#[derive(Debug)]
struct State {
    /// Open frames by handle.
    frames: HashMap<u64, Frame>,
    /// The handle of the open frame of each replica.
    /// Invariants: 1. a bijection with `frames` (one frame per replica at most).
    /// 2. `len() ≤ frames_max`.
    open: BTreeMap<ReplicaKey, u64>,
    /// What the store holds, mirrored so that open and list never take the store lock.
    /// Invariant: equal to `SegmentStore::list(None)` whenever the store lock is free;
    /// updated only by a thread holding the store lock, right after the store changed.
    stored: BTreeMap<ReplicaKey, ReplicaMeta>,
    /// The next handle to hand out; handles are never reused.
    next_handle: u64,
}

impl State {
    /// Copies the store's metadata of `key` into the mirror. Called with the store lock
    /// held, after any store operation on `key` (also a failed one: a write whose
    /// directory sync failed is indexed, a corrupt read is forgotten).
    fn sync_stored(&mut self, store: &SegmentStore, key: ReplicaKey) {
        match store.meta(key.0, key.1) {
            Some(meta) => self.stored.insert(key, meta),
            None => self.stored.remove(&key),
        };
    }

    fn remove_frame(&mut self, handle: u64) -> Option<Frame> {
        let frame = self.frames.remove(&handle)?;
        self.open.remove(&(frame.master, frame.segment));
        Some(frame)
    }

    /// The open frame of `key` if it is what reads and lists report for the replica:
    /// the copy with the newer epoch wins, the frame on a tie (it holds at least what
    /// was flushed of the same epoch).
    fn visible_frame(&self, key: ReplicaKey) -> Option<&Frame> {
        let frame = self.open.get(&key).and_then(|h| self.frames.get(h))?;
        match self.stored.get(&key) {
            Some(stored) if stored.epoch > frame.epoch => None,
            _ => Some(frame),
        }
    }

    fn open_replica(
        &mut self,
        request: &OpenReplicaRequest,
        config: &BackupConfig,
    ) -> Result<FrameHandle, Reply> {
        let key = (request.master, request.segment);
        if request.capacity > config.frame_bytes_max {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!(
                    "frame capacity {} exceeds the limit of {} bytes",
                    request.capacity, config.frame_bytes_max
                ),
            ));
        }
        let existing = self
            .open
            .get(&key)
            .and_then(|&handle| Some((handle, self.frames.get(&handle)?)));
        if let Some((handle, frame)) = existing {
            if frame.epoch == request.epoch {
                if frame.capacity != request.capacity {
                    return Err(Reply::error(
                        Status::InvalidArgument,
                        format!(
                            "{}/{} epoch {} is open with capacity {}, not {}",
                            request.master,
                            request.segment,
                            frame.epoch,
                            frame.capacity,
                            request.capacity
                        ),
                    ));
                }
                // A retried open: the same frame.
                return Ok(FrameHandle { handle });
            }
            if frame.epoch > request.epoch {
                return Err(stale(key, request.epoch, frame.epoch, "an open frame"));
            }
        }
        if let Some(stored) = self.stored.get(&key) {
            // A closed replica is final; an open one may be superseded by a newer epoch.
            if stored.epoch > request.epoch || (stored.closed && stored.epoch == request.epoch) {
                let what = if stored.closed {
                    "a closed replica"
                } else {
                    "a stored replica"
                };
                return Err(stale(key, request.epoch, stored.epoch, what));
            }
        }
        let replaced = self.open.get(&key).copied();
        match replaced {
            // The re-replication after an epoch bump rewrites the frame from byte 0.
            Some(old) => {
                self.remove_frame(old);
            }
            None if self.open.len() >= config.frames_max => {
                return Err(Reply::error(
                    Status::BackupFull,
                    format!("all {} frames are open", config.frames_max),
                ));
            }
            None => {}
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        let capacity = usize::try_from(request.capacity).unwrap_or(usize::MAX);
        self.frames.insert(
            handle,
            Frame {
                master: request.master,
                segment: request.segment,
                epoch: request.epoch,
                capacity: request.capacity,
                bytes: Arc::new(vec![0; capacity]),
                written_end: 0,
                closes_in_flight: 0,
            },
        );
        self.open.insert(key, handle);
        tracing::debug!(
            master = %request.master, segment = %request.segment, epoch = request.epoch,
            handle, replaced = replaced.is_some(), "frame opened"
        );
        Ok(FrameHandle { handle })
    }

    /// The frame `handle`, checked against `epoch`.
    fn frame_mut(&mut self, handle: u64, epoch: u64) -> Result<&mut Frame, Reply> {
        let Some(frame) = self.frames.get_mut(&handle) else {
            return Err(Reply::error(
                Status::UnknownFrame,
                format!("no open frame {handle}"),
            ));
        };
        if frame.epoch != epoch {
            return Err(Reply::error(
                Status::StaleEpoch,
                format!(
                    "frame {handle} of {}/{} has epoch {}, not {epoch}",
                    frame.master, frame.segment, frame.epoch
                ),
            ));
        }
        Ok(frame)
    }

    fn write_replica(&mut self, request: &WriteReplicaRequest) -> Result<(), Reply> {
        let frame = self.frame_mut(request.handle, request.epoch)?;
        if frame.closes_in_flight > 0 {
            return Err(Reply::error(
                Status::UnknownFrame,
                format!("frame {} is being closed", request.handle),
            ));
        }
        let end = u64::from(request.offset) + request.bytes.len() as u64;
        if end > u64::from(frame.capacity) {
            return Err(Reply::error(
                Status::InvalidArgument,
                format!(
                    "write of {} bytes at offset {} passes the end of frame {} ({} bytes)",
                    request.bytes.len(),
                    request.offset,
                    request.handle,
                    frame.capacity
                ),
            ));
        }
        // `end ≤ capacity ≤ u32::MAX`, and `capacity == bytes.len()`, so these fit.
        let (start, end) = (request.offset as usize, end as usize);
        // Copies only if a finished close's snapshot is still referenced (it drops its
        // reference before `closes_in_flight` falls to 0, so in practice never).
        let bytes = Arc::make_mut(&mut frame.bytes);
        let Some(target) = bytes.get_mut(start..end) else {
            return Err(Reply::error(
                Status::Internal,
                "frame shorter than capacity",
            ));
        };
        target.copy_from_slice(&request.bytes);
        frame.written_end = frame.written_end.max(end as u32);
        Ok(())
    }

    fn list(&self, master: Option<ServerId>) -> Vec<ReplicaInfo> {
        let range = match master {
            Some(master) => (master, SegmentId(0))..=(master, SegmentId(u64::MAX)),
            None => (ServerId(0), SegmentId(0))..=(ServerId(u64::MAX), SegmentId(u64::MAX)),
        };
        let mut replicas: BTreeMap<ReplicaKey, ReplicaInfo> = self
            .stored
            .range(range.clone())
            .map(|(key, meta)| (*key, info_of(meta)))
            .collect();
        for (key, _) in self.open.range(range) {
            if let Some(frame) = self.visible_frame(*key) {
                replicas.insert(*key, frame.info());
            }
        }
        replicas.into_values().collect()
    }
}

fn info_of(meta: &ReplicaMeta) -> ReplicaInfo {
    ReplicaInfo {
        master: meta.master,
        segment: meta.segment,
        epoch: meta.epoch,
        length: meta.length,
        closed: meta.closed,
    }
}

fn stale(key: ReplicaKey, epoch: u64, held: u64, what: &str) -> Reply {
    Reply::error(
        Status::StaleEpoch,
        format!(
            "{}/{}: epoch {epoch} is stale; the backup holds {what} at epoch {held}",
            key.0, key.1
        ),
    )
}

/// The reply for a store error.
fn store_error_reply(error: StoreError) -> Reply {
    let status = match &error {
        StoreError::Full { .. } => Status::BackupFull,
        StoreError::StaleEpoch { .. } | StoreError::Regressed { .. } => Status::StaleEpoch,
        StoreError::Corrupt { .. } | StoreError::InUse { .. } | StoreError::Io { .. } => {
            Status::Internal
        }
    };
    Reply::error(status, error)
}

/// Runs `f` on a blocking thread (it takes the store lock).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Reply> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Reply::error(Status::Internal, format!("backup store task failed: {e}")))
}

/// A close on its way to the store. Dropping it (done, failed, or never run because
/// the runtime shut down) releases the frame for writes again if it is still open.
struct CloseJob {
    state: Arc<Mutex<State>>,
    handle: u64,
    key: ReplicaKey,
    epoch: u64,
    length: u32,
    /// The frame's bytes; dropped before `closes_in_flight` is decremented, so the
    /// frame's `Arc` is unshared again when it next takes writes.
    bytes: Option<Arc<Vec<u8>>>,
}

/// Why a close did not store its replica.
enum CloseFailure {
    /// The frame was freed or replaced before the close reached the store.
    FrameGone,
    /// The store refused or failed.
    Store(StoreError),
}

impl CloseJob {
    /// Writes the replica, under the store lock; see "Close racing free" in the module
    /// doc for why the frame's presence is checked under that lock.
    fn run(mut self, store: &Mutex<SegmentStore>) -> Result<ReplicaMeta, CloseFailure> {
        let bytes = self.bytes.take().unwrap_or_default();
        let mut store = store.lock();
        if !self.state.lock().frames.contains_key(&self.handle) {
            return Err(CloseFailure::FrameGone);
        }
        let content = bytes.get(..self.length as usize).unwrap_or(&bytes[..]);
        let (master, segment) = self.key;
        let result = store.write_replica(master, segment, self.epoch, true, content);
        let mut state = self.state.lock();
        state.sync_stored(&store, self.key);
        if result.is_ok() {
            state.remove_frame(self.handle);
        }
        drop(state);
        drop(store);
        result.map_err(CloseFailure::Store)
    }
}

impl Drop for CloseJob {
    fn drop(&mut self) {
        self.bytes = None;
        if let Some(frame) = self.state.lock().frames.get_mut(&self.handle) {
            frame.closes_in_flight = frame.closes_in_flight.saturating_sub(1);
        }
    }
}

/// The backup service of one storage server. See the module doc.
#[derive(Debug)]
pub struct BackupService {
    config: BackupConfig,
    /// The on-disk store. Lock order: taken before `state`, and only on blocking
    /// threads (it is held across fsyncs).
    store: Arc<Mutex<SegmentStore>>,
    /// Frames and the store-metadata mirror. Never held across I/O or `.await`, and
    /// never held while waiting for `store`.
    state: Arc<Mutex<State>>,
}

impl BackupService {
    /// Opens (scans) the segment store under `data_dir` and returns the service with
    /// the scan report (the replicas this backup still holds after a restart).
    ///
    /// The scan blocks on the disk: call this at start-up, before serving. The
    /// service's handlers must run inside a tokio runtime (closes, frees and reads of
    /// stored replicas use `spawn_blocking`).
    pub fn open(
        data_dir: &Path,
        config: BackupConfig,
    ) -> Result<(BackupService, ScanReport), StoreError> {
        BackupService::open_with_disk(data_dir, config, Box::new(RealDisk))
    }

    /// [`BackupService::open`] with the store's write path going through `disk`, so
    /// tests can make the disk fill up (STYLE habit 10).
    pub fn open_with_disk(
        data_dir: &Path,
        config: BackupConfig,
        disk: Box<dyn Disk>,
    ) -> Result<(BackupService, ScanReport), StoreError> {
        let mut config = config;
        if config.frame_bytes_max > REPLICA_BYTES_MAX {
            tracing::warn!(
                frame_bytes_max = config.frame_bytes_max,
                "frame size limit above REPLICA_BYTES_MAX; using {REPLICA_BYTES_MAX}"
            );
            config.frame_bytes_max = REPLICA_BYTES_MAX;
        }
        let (store, report) = SegmentStore::open_with_disk(data_dir, disk)?;
        let stored = store
            .list(None)
            .into_iter()
            .map(|meta| ((meta.master, meta.segment), meta))
            .collect();
        let state = State {
            frames: HashMap::new(),
            open: BTreeMap::new(),
            stored,
            next_handle: 1,
        };
        let service = BackupService {
            config,
            store: Arc::new(Mutex::new(store)),
            state: Arc::new(Mutex::new(state)),
        };
        Ok((service, report))
    }

    /// The configuration in force (after clamping `frame_bytes_max`).
    pub fn config(&self) -> &BackupConfig {
        &self.config
    }

    /// Requests answered from memory without waiting: open, write, list.
    fn handle_immediately(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        let reply = match opcode {
            proto::OpenReplica::OPCODE => Reply::decode::<OpenReplicaRequest>(payload.clone())
                .and_then(|request| {
                    let handle = self.state.lock().open_replica(&request, &self.config)?;
                    Ok(Reply::ok(&handle))
                }),
            proto::WriteReplica::OPCODE => Reply::decode::<WriteReplicaRequest>(payload.clone())
                .and_then(|request| {
                    self.state.lock().write_replica(&request)?;
                    Ok(Reply::ok(&()))
                }),
            proto::ListReplicas::OPCODE => Reply::decode::<ListReplicasRequest>(payload.clone())
                .map(|request| {
                    let replicas = self.state.lock().list(request.master);
                    Reply::ok(&ListReplicasReply { replicas })
                }),
            _ => return None,
        };
        Some(reply.unwrap_or_else(|error| error))
    }

    async fn handle_request(&self, opcode: Opcode, payload: Bytes) -> Reply {
        if let Some(reply) = self.handle_immediately(opcode, &payload) {
            return reply;
        }
        let reply = match opcode {
            proto::CloseReplica::OPCODE => self.close(payload).await,
            proto::FreeReplica::OPCODE => self.free(payload).await,
            proto::ReadReplica::OPCODE => self.read(payload).await,
            other => Err(Reply::error(
                Status::UnknownOpcode,
                format!("backup does not serve {other}"),
            )),
        };
        reply.unwrap_or_else(|error| error)
    }

    async fn close(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: CloseReplicaRequest = Reply::decode(payload)?;
        let job = {
            let mut state = self.state.lock();
            let frame = state.frame_mut(request.handle, request.epoch)?;
            if request.length > frame.capacity {
                return Err(Reply::error(
                    Status::InvalidArgument,
                    format!(
                        "close length {} exceeds frame {} capacity {}",
                        request.length, request.handle, frame.capacity
                    ),
                ));
            }
            frame.closes_in_flight += 1;
            CloseJob {
                state: Arc::clone(&self.state),
                handle: request.handle,
                key: (frame.master, frame.segment),
                epoch: frame.epoch,
                length: request.length,
                bytes: Some(Arc::clone(&frame.bytes)),
            }
        };
        let store = Arc::clone(&self.store);
        match blocking(move || job.run(&store)).await? {
            Ok(meta) => {
                tracing::debug!(
                    master = %meta.master, segment = %meta.segment, epoch = meta.epoch,
                    length = meta.length, "replica closed"
                );
                Ok(Reply::ok(&info_of(&meta)))
            }
            Err(CloseFailure::FrameGone) => Err(Reply::error(
                Status::UnknownFrame,
                format!(
                    "frame {} was freed or replaced while closing",
                    request.handle
                ),
            )),
            Err(CloseFailure::Store(error)) => {
                tracing::warn!(handle = request.handle, %error, "close failed; frame kept open");
                Err(store_error_reply(error))
            }
        }
    }

    async fn free(&self, payload: Bytes) -> Result<Reply, Reply> {
        let id: ReplicaId = Reply::decode(payload)?;
        let key = (id.master, id.segment);
        // The frame goes first, so that a close in flight finds it gone (module doc).
        let frame_freed = {
            let mut state = self.state.lock();
            let handle = state.open.get(&key).copied();
            handle.and_then(|h| state.remove_frame(h)).is_some()
        };
        let (store, state) = (Arc::clone(&self.store), Arc::clone(&self.state));
        let result = blocking(move || {
            let mut store = store.lock();
            let result = store.free(key.0, key.1);
            state.lock().sync_stored(&store, key);
            result
        })
        .await?;
        let stored_freed = result.map_err(store_error_reply)?;
        tracing::debug!(master = %id.master, segment = %id.segment, frame_freed, stored_freed, "replica freed");
        Ok(Reply::ok(&FreeReplicaReply {
            freed: frame_freed || stored_freed,
        }))
    }

    async fn read(&self, payload: Bytes) -> Result<Reply, Reply> {
        let id: ReplicaId = Reply::decode(payload)?;
        let key = (id.master, id.segment);
        {
            let state = self.state.lock();
            if let Some(frame) = state.visible_frame(key) {
                let bytes = frame.bytes.get(..frame.written_end as usize).unwrap_or(&[]);
                return Ok(Reply::ok(&ReadReplicaReply {
                    info: frame.info(),
                    bytes: Bytes::copy_from_slice(bytes),
                }));
            }
            if !state.stored.contains_key(&key) {
                return Err(not_held(key));
            }
        }
        let (store, state) = (Arc::clone(&self.store), Arc::clone(&self.state));
        let (result, meta) = blocking(move || {
            let mut store = store.lock();
            let result = store.read_replica(key.0, key.1);
            let meta = store.meta(key.0, key.1);
            state.lock().sync_stored(&store, key);
            (result, meta)
        })
        .await?;
        match (result, meta) {
            (Ok(Some(bytes)), Some(meta)) => Ok(Reply::ok(&ReadReplicaReply {
                info: info_of(&meta),
                bytes: Bytes::from(bytes),
            })),
            // Freed between the lookup above and the read.
            (Ok(_), _) => Err(not_held(key)),
            (Err(error), _) => {
                tracing::error!(master = %id.master, segment = %id.segment, %error, "replica read failed");
                Err(store_error_reply(error))
            }
        }
    }
}

fn not_held(key: ReplicaKey) -> Reply {
    Reply::error(
        Status::ObjectDoesntExist,
        format!("no replica of {}/{} on this backup", key.0, key.1),
    )
}

impl Service for BackupService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        Box::pin(self.handle_request(opcode, payload))
    }

    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        self.handle_immediately(opcode, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use rampart_common::rpc::WireMessage;
    use tempfile::TempDir;

    const CAPACITY: u32 = 64 * 1024;

    fn config(frames_max: usize) -> BackupConfig {
        BackupConfig {
            frames_max,
            frame_bytes_max: CAPACITY,
        }
    }

    fn open_service(dir: &TempDir, frames_max: usize) -> BackupService {
        let (service, report) = BackupService::open(dir.path(), config(frames_max)).expect("open");
        assert_eq!(report.quarantined, vec![]);
        service
    }

    /// Calls `R` on the service directly, as the RPC server would.
    async fn call<R: Rpc>(
        service: &BackupService,
        request: &R::Request,
    ) -> Result<R::Reply, (Status, String)> {
        let mut payload = BytesMut::new();
        request.encode(&mut payload);
        let reply = service.handle(R::OPCODE, payload.freeze()).await;
        if reply.status() != Status::Ok {
            let detail = String::from_utf8_lossy(reply.payload()).into_owned();
            return Err((reply.status(), detail));
        }
        Ok(R::Reply::decode(Bytes::copy_from_slice(reply.payload())).expect("reply decodes"))
    }

    fn status<T: std::fmt::Debug>(result: Result<T, (Status, String)>) -> Status {
        match result {
            Ok(reply) => panic!("expected an error, got {reply:?}"),
            Err((status, _)) => status,
        }
    }

    fn open_req(master: u64, segment: u64, epoch: u64) -> OpenReplicaRequest {
        OpenReplicaRequest {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch,
            capacity: CAPACITY,
        }
    }

    async fn open(service: &BackupService, master: u64, segment: u64, epoch: u64) -> u64 {
        call::<proto::OpenReplica>(service, &open_req(master, segment, epoch))
            .await
            .expect("open")
            .handle
    }

    async fn write(
        service: &BackupService,
        handle: u64,
        epoch: u64,
        offset: u32,
        bytes: &[u8],
    ) -> Result<(), (Status, String)> {
        let request = WriteReplicaRequest {
            handle,
            epoch,
            offset,
            bytes: Bytes::copy_from_slice(bytes),
        };
        call::<proto::WriteReplica>(service, &request).await
    }

    async fn close(
        service: &BackupService,
        handle: u64,
        epoch: u64,
        length: u32,
    ) -> Result<ReplicaInfo, (Status, String)> {
        let request = CloseReplicaRequest {
            handle,
            epoch,
            length,
        };
        call::<proto::CloseReplica>(service, &request).await
    }

    async fn list(service: &BackupService, master: Option<u64>) -> Vec<ReplicaInfo> {
        let request = ListReplicasRequest {
            master: master.map(ServerId),
        };
        call::<proto::ListReplicas>(service, &request)
            .await
            .expect("list")
            .replicas
    }

    fn id(master: u64, segment: u64) -> ReplicaId {
        ReplicaId {
            master: ServerId(master),
            segment: SegmentId(segment),
        }
    }

    async fn read(
        service: &BackupService,
        master: u64,
        segment: u64,
    ) -> Result<ReadReplicaReply, (Status, String)> {
        call::<proto::ReadReplica>(service, &id(master, segment)).await
    }

    async fn free(service: &BackupService, master: u64, segment: u64) -> bool {
        call::<proto::FreeReplica>(service, &id(master, segment))
            .await
            .expect("free")
            .freed
    }

    fn content(seed: u8, length: usize) -> Vec<u8> {
        (0..length)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn info(master: u64, segment: u64, epoch: u64, length: u32, closed: bool) -> ReplicaInfo {
        ReplicaInfo {
            master: ServerId(master),
            segment: SegmentId(segment),
            epoch,
            length,
            closed,
        }
    }

    #[tokio::test]
    async fn close_stores_the_bytes_written_out_of_order_and_a_restart_reports_them() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let data = content(7, 10_000);
        let handle = open(&service, 1, 5, 1).await;
        for (start, end) in [(6000, 10_000), (0, 3000), (3000, 6000)] {
            write(&service, handle, 1, start as u32, &data[start..end])
                .await
                .expect("write");
        }
        let closed = close(&service, handle, 1, 10_000).await.expect("close");
        assert_eq!(closed, info(1, 5, 1, 10_000, true));
        assert_eq!(list(&service, None).await, vec![closed]);
        let replica = read(&service, 1, 5).await.expect("read");
        assert_eq!(replica.info, closed);
        assert_eq!(&replica.bytes[..], &data[..]);
        // The frame is released: its handle is gone.
        assert_eq!(
            status(write(&service, handle, 1, 0, b"late").await),
            Status::UnknownFrame
        );

        drop(service);
        let (service, report) = BackupService::open(dir.path(), config(4)).expect("reopen");
        assert_eq!(report.replicas.len(), 1);
        assert_eq!(list(&service, None).await, vec![closed]);
        assert_eq!(list(&service, Some(1)).await, vec![closed]);
        assert_eq!(list(&service, Some(2)).await, vec![]);
        let replica = read(&service, 1, 5).await.expect("read after restart");
        assert_eq!(replica.info, closed);
        assert_eq!(&replica.bytes[..], &data[..]);
    }

    #[tokio::test]
    async fn open_is_idempotent_per_epoch_replaced_by_newer_and_refuses_older_or_closed() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let first = open(&service, 1, 1, 2).await;
        assert_eq!(open(&service, 1, 1, 2).await, first);
        write(&service, first, 2, 0, b"old epoch")
            .await
            .expect("write");

        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 1, 1)).await),
            Status::StaleEpoch
        );
        let second = open(&service, 1, 1, 3).await;
        assert_ne!(second, first);
        assert_eq!(
            status(write(&service, first, 2, 0, b"x").await),
            Status::UnknownFrame
        );
        // The new frame starts zeroed: nothing of the old epoch survives.
        assert_eq!(list(&service, None).await, vec![info(1, 1, 3, 0, false)]);
        write(&service, second, 3, 0, b"new").await.expect("write");
        close(&service, second, 3, 3).await.expect("close");

        for epoch in [2, 3] {
            assert_eq!(
                status(call::<proto::OpenReplica>(&service, &open_req(1, 1, epoch)).await),
                Status::StaleEpoch,
                "epoch {epoch}"
            );
        }
        // A newer epoch than the closed replica may still be opened.
        open(&service, 1, 1, 4).await;
        // A different capacity on a retried open is a caller error.
        let mut request = open_req(1, 1, 4);
        request.capacity = 100;
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &request).await),
            Status::InvalidArgument
        );
        request.capacity = CAPACITY + 1;
        request.segment = SegmentId(9);
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &request).await),
            Status::InvalidArgument
        );
    }

    #[tokio::test]
    async fn write_and_close_check_bounds_handles_and_epochs() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let handle = open(&service, 1, 1, 1).await;
        write(&service, handle, 1, CAPACITY - 4, b"edge")
            .await
            .expect("fits");
        let past_end = write(&service, handle, 1, CAPACITY - 3, b"edge").await;
        let (code, detail) = past_end.expect_err("past the end");
        assert_eq!(code, Status::InvalidArgument);
        assert!(detail.contains("passes the end"), "{detail}");
        assert_eq!(
            status(write(&service, handle, 1, u32::MAX, b"x").await),
            Status::InvalidArgument
        );
        assert_eq!(
            status(write(&service, 999, 1, 0, b"x").await),
            Status::UnknownFrame
        );
        assert_eq!(
            status(write(&service, handle, 2, 0, b"x").await),
            Status::StaleEpoch
        );
        assert_eq!(
            status(close(&service, handle, 2, 4).await),
            Status::StaleEpoch
        );
        assert_eq!(
            status(close(&service, handle, 1, CAPACITY + 1).await),
            Status::InvalidArgument
        );
        assert_eq!(
            status(close(&service, 999, 1, 0).await),
            Status::UnknownFrame
        );

        assert!(free(&service, 1, 1).await);
        assert_eq!(
            status(write(&service, handle, 1, 0, b"x").await),
            Status::UnknownFrame
        );
        assert_eq!(
            status(close(&service, handle, 1, 0).await),
            Status::UnknownFrame
        );
    }

    #[tokio::test]
    async fn open_past_frames_max_is_backup_full_until_a_frame_closes() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let first = open(&service, 1, 1, 1).await;
        open(&service, 1, 2, 1).await;
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 3, 1)).await),
            Status::BackupFull
        );
        // A retry or an epoch bump of an open replica needs no new frame.
        open(&service, 1, 2, 1).await;
        open(&service, 1, 2, 2).await;
        close(&service, first, 1, 0).await.expect("close");
        open(&service, 1, 3, 1).await;
    }

    #[tokio::test]
    async fn free_drops_open_frames_and_stored_replicas_and_is_idempotent() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let open_frame = open(&service, 1, 1, 1).await;
        write(&service, open_frame, 1, 0, b"open")
            .await
            .expect("write");
        let closed = open(&service, 1, 2, 1).await;
        write(&service, closed, 1, 0, b"closed")
            .await
            .expect("write");
        close(&service, closed, 1, 6).await.expect("close");
        assert_eq!(
            list(&service, Some(1)).await,
            vec![info(1, 1, 1, 4, false), info(1, 2, 1, 6, true)]
        );

        assert!(free(&service, 1, 1).await);
        assert!(free(&service, 1, 2).await);
        assert!(!free(&service, 1, 1).await);
        assert!(!free(&service, 1, 2).await);
        assert_eq!(list(&service, None).await, vec![]);
        assert_eq!(
            status(read(&service, 1, 2).await),
            Status::ObjectDoesntExist
        );
        // Freed replicas stay freed across a restart.
        drop(service);
        let service = open_service(&dir, 4);
        assert_eq!(list(&service, None).await, vec![]);
    }

    #[tokio::test]
    async fn read_of_an_open_frame_returns_the_bytes_written_so_far() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let handle = open(&service, 3, 1, 1).await;
        let replica = read(&service, 3, 1).await.expect("read empty");
        assert_eq!(replica.info, info(3, 1, 1, 0, false));
        assert!(replica.bytes.is_empty());
        write(&service, handle, 1, 2, b"cd").await.expect("write");
        write(&service, handle, 1, 0, b"ab").await.expect("write");
        let replica = read(&service, 3, 1).await.expect("read");
        assert_eq!(replica.info, info(3, 1, 1, 4, false));
        assert_eq!(&replica.bytes[..], b"abcd");
        assert_eq!(
            status(read(&service, 3, 2).await),
            Status::ObjectDoesntExist
        );
        assert_eq!(
            status(read(&service, 4, 1).await),
            Status::ObjectDoesntExist
        );
    }

    #[tokio::test]
    async fn read_of_a_corrupted_replica_is_internal_and_it_is_no_longer_listed() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let handle = open(&service, 1, 1, 1).await;
        write(&service, handle, 1, 0, &content(1, 100))
            .await
            .expect("write");
        close(&service, handle, 1, 100).await.expect("close");
        let path = dir.path().join("replicas").join("m1-s1.replica");
        let mut image = std::fs::read(&path).expect("read file");
        let last = image.len() - 1;
        image[last] ^= 0xFF;
        std::fs::write(&path, image).expect("corrupt");
        let (code, detail) = read(&service, 1, 1).await.expect_err("corrupt");
        assert_eq!(code, Status::Internal);
        assert!(detail.contains("checksum"), "{detail}");
        assert_eq!(list(&service, None).await, vec![]);
    }

    /// A disk that reports `ENOSPC` on every write while `full` is set.
    #[derive(Clone, Debug, Default)]
    struct FillableDisk {
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Disk for FillableDisk {
        fn write_durable(&self, path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
            if self.full.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            RealDisk.write_durable(path, parts)
        }

        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            RealDisk.rename(from, to)
        }

        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            RealDisk.sync_dir(dir)
        }
    }

    #[tokio::test]
    async fn close_on_a_full_disk_is_backup_full_and_the_frame_stays_open_for_a_retry() {
        let dir = TempDir::new().expect("tempdir");
        let disk = FillableDisk::default();
        let (service, _) =
            BackupService::open_with_disk(dir.path(), config(4), Box::new(disk.clone()))
                .expect("open");
        let handle = open(&service, 1, 1, 1).await;
        write(&service, handle, 1, 0, b"full").await.expect("write");
        disk.full.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            status(close(&service, handle, 1, 4).await),
            Status::BackupFull
        );
        // Still open, still readable and writable.
        assert_eq!(list(&service, None).await, vec![info(1, 1, 1, 4, false)]);
        write(&service, handle, 1, 4, b"er")
            .await
            .expect("write after failed close");
        disk.full.store(false, std::sync::atomic::Ordering::SeqCst);
        let closed = close(&service, handle, 1, 6).await.expect("retry");
        assert_eq!(closed, info(1, 1, 1, 6, true));
        assert_eq!(
            &read(&service, 1, 1).await.expect("read").bytes[..],
            b"fuller"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_free_racing_a_close_always_leaves_the_replica_freed() {
        let dir = TempDir::new().expect("tempdir");
        let service = Arc::new(open_service(&dir, 64));
        let mut closes_ok = 0;
        for segment in 0..64 {
            let handle = open(&service, 1, segment, 1).await;
            write(&service, handle, 1, 0, b"bytes")
                .await
                .expect("write");
            let closer = {
                let service = Arc::clone(&service);
                tokio::spawn(async move { close(&service, handle, 1, 5).await })
            };
            // Vary how far the close gets before the free starts.
            for _ in 0..segment % 4 {
                tokio::task::yield_now().await;
            }
            let freed = free(&service, 1, segment).await;
            assert!(freed, "the frame or the replica was held");
            match closer.await.expect("join") {
                Ok(_) => closes_ok += 1,
                Err((code, _)) => assert_eq!(code, Status::UnknownFrame),
            }
            assert_eq!(list(&service, None).await, vec![], "segment {segment}");
        }
        // Report how the race went; which interleavings occur is up to the scheduler.
        eprintln!("{closes_ok} of 64 closes completed before their free");
        drop(service);
        let service = open_service(&dir, 64);
        assert_eq!(list(&service, None).await, vec![]);
    }

    #[tokio::test]
    async fn garbage_payloads_are_malformed_and_unknown_opcodes_are_refused() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let opcodes = [
            proto::OpenReplica::OPCODE,
            proto::WriteReplica::OPCODE,
            proto::CloseReplica::OPCODE,
            proto::FreeReplica::OPCODE,
            proto::ListReplicas::OPCODE,
            proto::ReadReplica::OPCODE,
        ];
        let garbage: [&[u8]; 4] = [b"", &[0xFF; 3], &[0xFF; 64], &[0x01; 200]];
        for opcode in opcodes {
            for payload in garbage {
                let reply = service
                    .handle(opcode, Bytes::copy_from_slice(payload))
                    .await;
                assert_eq!(
                    reply.status(),
                    Status::MalformedRequest,
                    "{opcode} {payload:?}"
                );
            }
        }
        let reply = service.handle(Opcode(299), Bytes::new()).await;
        assert_eq!(reply.status(), Status::UnknownOpcode);
        assert!(service.handle_now(Opcode(299), &Bytes::new()).is_none());
        assert!(service
            .handle_now(proto::CloseReplica::OPCODE, &Bytes::new())
            .is_none());
    }
}
