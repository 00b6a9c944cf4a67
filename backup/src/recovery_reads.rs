//! `RecoveryReads`: the backup's side of replaying a crashed master's log (docs/design.md §6,
//! step 2): reading that master's replicas in the order the coordinator gave, splitting
//! each into one *piece* per recovery partition as it is read, and handing the pieces
//! to the recovery masters that fetch them.
//!
//! Callers (the `RecoveryRead` and `RecoveryData` handlers of
//! [`BackupService`](crate::service::BackupService)) see three calls:
//! [`RecoveryReads::start`] schedules the reads of one recovery attempt and returns at
//! once; [`RecoveryReads::fetch`] answers one (segment, partition) request — from the
//! cache, after waiting for the reader, or by reading the replica on demand; and
//! [`RecoveryReads::end`] forgets a master's recovery. Where the bytes come from (open
//! frames or the segment store, the fence, the locks around them) is hidden behind
//! [`ReplicaSource`]; the reader threads, the cache, its memory bound and the wake-ups
//! are hidden here.
//!
//! # Pieces in shared memory
//! Given a recovery region ([`RecoveryReads::with_region`], the service's default), the
//! reader writes each piece into slots of the region (`onesided::shm::RecoveryRegion`)
//! of its own, one after another ([`RECOVERY_REGION_SLOT_BYTES`] each), rather than into
//! a buffer. A fetch from an asker naming this host (`RecoveryDataRequest::shared_host`)
//! is answered with the piece's place (`RecoveryDataReply::shared`): the recovery master
//! copies it out of its own mapping of the region, so the piece crosses no socket and is
//! copied into no reply. Any other asker gets the bytes, copied out of the slots. A
//! piece's slots go back to the region when it is handed out or dropped; a reply that
//! outlives their reuse is caught by the region's seqlock, and the recovery master asks
//! again without naming its host. A piece that finds too few free slots stays in the
//! backup's own memory, as without a region. The last recovery to end gives the
//! region's memory back.
//!
//! The split itself is the pure function [`split_replica`]: replica bytes and a
//! [`PartitionIndex`] in, one [`Piece`] per partition and the replica's highest
//! `SafeVersion` out. It scans the replica for its valid prefix (docs/design.md §4), walks
//! its entries once, and appends the raw bytes of every `Object` and `Tombstone` whose
//! (table, key hash) falls in a partition to that partition's piece; entries in no
//! partition (tablets the crashed master no longer owned) are dropped.
//!
//! # Guarantees
//! 1. Each cached piece is handed out once; a later request for it re-reads the replica
//!    on demand (the first reply may have been lost on the way).
//! 2. A piece holds the entries in log order, each with its own header and CRC: the
//!    recovery master decodes and verifies them as it would its own log.
//! 3. A request for a segment scheduled in its attempt but not read yet waits at most
//!    [`RECOVERY_DATA_WAIT_MS`], then answers [`FetchError::NotReadYet`] (`Retry`) —
//!    unless the attempt's reader is held by a full cache, in which case the request is
//!    served on demand at once (see *Held readers* below).
//! 4. Cached pieces, all recoveries together, never exceed the bound given to
//!    [`RecoveryReads::new`] ([`RECOVERY_PIECES_BYTES_MAX`] in the service), wherever
//!    they lie. Beyond them, memory holds one split replica per reader waiting for room,
//!    one replica per on-demand read in flight (bounded by the RPC server's in-flight
//!    limit), and in the region the unfilled end of each piece's last slot and the
//!    slots cooling after their piece was handed out (all of it within the region's
//!    size, [`RECOVERY_REGION_BYTES`] in the service).
//!
//! # Concurrency
//! One reader per recovery attempt, a blocking thread (`spawn_blocking`): replica
//! reads touch the disk and splits cost milliseconds of CPU, neither of which may run
//! on the backup's reactor. `fetch` runs on the reactor and never blocks: a wait is an
//! `.await` on the attempt's progress channel (a `watch`), an on-demand read goes to a
//! blocking thread of its own.
//!
//! One lock, `Inner::state` (a `parking_lot` mutex: nothing awaits while holding it,
//! and nothing holds it across a replica read or a split). A reader waiting for room
//! in the cache waits on the condition variable `Inner::room`, which releases the lock.
//! The lock is never held while a [`ReplicaSource`] is called, so it nests with no lock
//! of the service's.
//!
//! A newer attempt for the same master, [`RecoveryReads::end`], or dropping the
//! `RecoveryReads` removes the attempt from the table: its pieces are dropped at once,
//! its waiting fetches wake (the progress channel closes) and fall back to an on-demand
//! read, and its reader — which checks before each segment and before publishing —
//! stops at the next segment. Readers are told apart by a generation number, so an
//! attempt that was ended and started again under the same id does not adopt the old
//! reader.
//!
//! # Held readers
//! A recovery master replays a few partitions at a time; the others wait their turn
//! and fetch nothing meanwhile, so their pieces stay cached. A log larger than the
//! cache fills it with the waiting partitions' pieces and holds the reader; waiting for
//! it would then never end, because only the waiting partitions could free room, and
//! they start only when the replaying ones finish. Before this rule, the replaying
//! partitions got `Retry` until the recovery master gave up on every backup, and each
//! new attempt would fail the same way: a log larger than the cache never recovered.
//!
//! So while a reader is held, a fetch of a segment it has not published is read on
//! demand, and waiting fetches are woken to do the same. The partition served that way
//! is remembered in the pending segment, and its piece is dropped when the reader
//! publishes the segment, so it never occupies the cache. Freeing room ends the hold
//! until the reader finds there is still not enough. The cost: one whole replica read
//! per such fetch, for as long as the cache stays full.
//!
//! # Failure handling
//! * A replica that cannot be read, fails verification (the store quarantines it), or
//!   does not split (a closed replica that does not scan to its footer, a header naming
//!   another segment) is remembered as [`FetchError::Unreadable`] for that segment
//!   (`Internal`): the recovery master falls back to another backup's replica.
//! * A replica not held is remembered as [`FetchError::NotHeld`] (`ObjectDoesntExist`).
//! * A reader that stops early (its thread panicked, the runtime shut down) marks every
//!   segment it had not read as unreadable (a drop guard), so no fetch waits for it.
//! * The cache is not persistent: a restarted backup answers every fetch on demand.
//!
//! # Cost
//! A split makes one scan (CRC over the replica, ≈ 0.6 ms per 8 MiB), one decoding
//! pass (objects' own CRCs again, key hashes, a binary search of the partition index
//! per entry) and one copy of the entries kept, in runs of neighbouring entries of one
//! partition: ≈ 3–5 ms per 8 MiB segment on one
//! core, below the ≈ 16 ms the disk takes to read it at 500 MB/s, so reading stays
//! disk-bound. An on-demand fetch pays a whole read and split for one partition's piece.

use crate::segment_store::{StoreError, REPLICA_BYTES_MAX};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use rampart_common::ids::{Epoch, SegmentId, ServerId, Version};
use rampart_common::onesided::shm::{RecoveryRegion, RegionSlot, SealedSlot};
use rampart_common::protocol::backup::{
    RecoveryDataReply, RecoveryDataRequest, RecoveryReadRequest, ReplicaInfo, SharedPiece,
    SharedRun,
};
use rampart_common::rpc::RPC_TIMEOUT_DEFAULT;
use rampart_common::status::Status;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Bytes of pieces held in memory for all recoveries together. A backup reads ahead of
/// its recovery masters (the disk is the bottleneck of recovery, docs/design.md §6), but a
/// stalled recovery master must not make it read the whole log into memory: past this
/// bound the readers wait until fetches free space. 2 GiB is ≈ 250 segments of 8 MiB,
/// seconds of read-ahead at disk speed, and a twelfth of a 24 GiB storage server whose
/// master needs the rest.
pub const RECOVERY_PIECES_BYTES_MAX: u64 = 2 * 1024 * 1024 * 1024;

/// Bytes of a backup's recovery region (`onesided::shm::RecoveryRegion`), where the
/// reader puts the pieces that recovery masters on this host copy out for themselves:
/// half the cache's bound, which the region's pieces count against too. Sparse: only
/// the slots a recovery fills hold memory, until it ends.
pub const RECOVERY_REGION_BYTES: u64 = RECOVERY_PIECES_BYTES_MAX / 2;

/// Bytes of a recovery region's slot. A piece fills slots of its own, one after
/// another, and gives them back when it is handed out: small slots let a slot go back
/// as soon as its own piece is fetched (one slot per replica would hold a replica's
/// memory until the slowest partition fetched its piece, and a reader going through a
/// log would fill fresh pages all along), large ones keep the runs per piece few (a
/// piece of 1.6 MiB, 8 MiB segments cut for 5 recovery masters, fills 7). The 4 KiB
/// page of each slot's header costs 1.6 %.
pub const RECOVERY_REGION_SLOT_BYTES: u32 = 256 * 1024;

const _: () = assert!(
    RECOVERY_REGION_BYTES / RECOVERY_REGION_SLOT_BYTES as u64
        <= rampart_common::protocol::backup::SHARED_PIECE_RUNS_MAX as u64
);

/// A single replica's pieces (never more than its bytes) always fit, so a reader can
/// always make progress once the cache is empty.
const _: () = assert!(RECOVERY_PIECES_BYTES_MAX >= REPLICA_BYTES_MAX as u64);

/// How long a `RecoveryData` for a scheduled segment that is not read yet waits before
/// answering `Retry`, in milliseconds. Recovery masters ask in the backup's read order
/// with a few requests outstanding, so a request normally waits for a few segment
/// reads (tens of ms); a longer wait means the reader is held up (cache full, a slow
/// disk), and the recovery master is better told so than left hanging. Kept below the
/// default RPC deadline so that the answer arrives before the caller gives up on it.
pub const RECOVERY_DATA_WAIT_MS: u64 = 2_000;

const _: () = assert!((RECOVERY_DATA_WAIT_MS as u128) < RPC_TIMEOUT_DEFAULT.as_millis());

/// Recoveries (of distinct masters) tracked at once; a `RecoveryRead` past it is
/// answered `Retry`. Each holds a reader thread while it reads and its bookkeeping until
/// `EndRecovery`; 64 covers a rack of masters crashing together.
pub const RECOVERIES_MAX: usize = 64;

/// Segments one `RecoveryRead` may name: a 8 TiB log of 8 MiB segments. Bounds the
/// per-attempt bookkeeping.
pub const RECOVERY_SEGMENTS_MAX: usize = 1 << 20;

mod split;

use split::{copy_pieces, note_places, EntryPlace, Notes};
pub use split::{
    split_replica, PartitionError, PartitionIndex, Piece, SplitError, SplitReplica,
    RECOVERY_PARTITIONS_MAX, RECOVERY_RANGES_MAX,
};

/// Where replicas come from: the service's open frames and segment store. Implemented
/// by the service; tests inject their own (STYLE habit 10).
pub trait ReplicaSource: Send + Sync + fmt::Debug + 'static {
    /// The replica of `segment` of `master` as recovery must see it (for an open frame,
    /// its fenced valid prefix; for a stored copy, verified bytes), or `None` if not
    /// held. Blocks on the disk: called on blocking threads only.
    ///
    /// `reuse` is a buffer the caller is done with (a previous read's bytes): the
    /// replica is read into it where the source can, so a reader going through a
    /// log copies into memory it has already touched instead of faulting in 8 MiB of
    /// fresh pages per segment.
    fn read(
        &self,
        master: ServerId,
        segment: SegmentId,
        reuse: Vec<u8>,
    ) -> Result<Option<HeldReplica>, StoreError>;
}

/// A replica as a [`ReplicaSource`] hands it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldReplica {
    /// Its facts.
    pub info: ReplicaInfo,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The second pass of a split, into slots of the recovery region where it has enough
/// free for a piece (each piece fills slots of its own, one after another, so that it
/// gives them back alone when it is handed out), else into the backup's own memory.
/// Returns the non-empty pieces, by partition.
fn write_pieces(
    bytes: &[u8],
    notes: &Notes,
    places: &[EntryPlace],
    region: &RecoveryRegion,
) -> Vec<(u32, CachedPiece)> {
    let capacity = region.slot_capacity() as usize;
    // Each piece's slots (all it needs or none), else its own buffer.
    let mut targets: Vec<Target> = notes
        .bytes
        .iter()
        .map(|&size| {
            let wanted = size.div_ceil(capacity);
            let slots: Option<Vec<RegionSlot>> = (0..wanted).map(|_| region.take()).collect();
            match slots {
                Some(slots) if size > 0 => Target::Slots(slots),
                _ => Target::Owned(Vec::with_capacity(size)),
            }
        })
        .collect();
    let mut written = vec![0usize; targets.len()];
    for &(partition, start, end) in places {
        let partition = partition as usize;
        // In bounds: `entries` decoded these entries whole from `bytes`.
        let mut run = &bytes[start..end];
        match &mut targets[partition] {
            Target::Owned(entries) => entries.extend_from_slice(run),
            Target::Slots(slots) => {
                while !run.is_empty() {
                    let at = written[partition];
                    let (slot, offset) = (at / capacity, at % capacity);
                    let len = run.len().min(capacity - offset);
                    // `offset < capacity`, a u32.
                    slots[slot].write(offset as u32, &run[..len]);
                    written[partition] += len;
                    run = &run[len..];
                }
            }
        }
    }
    (0u32..)
        .zip(targets)
        .zip(notes.bytes.iter().zip(&notes.counts))
        .filter(|(_, (_, &count))| count > 0)
        .map(|((partition, target), (&size, &count))| {
            let piece = match target {
                Target::Owned(entries) => CachedPiece::Owned(Piece { entries, count }),
                Target::Slots(slots) => CachedPiece::Shared {
                    slots: slots.into_iter().map(RegionSlot::seal).collect(),
                    // At most a replica's length, a u32.
                    len: size as u32,
                    count,
                },
            };
            (partition, piece)
        })
        .collect()
}

/// Where [`write_pieces`] puts one piece.
enum Target {
    Slots(Vec<RegionSlot>),
    Owned(Vec<u8>),
}

/// Why a [`RecoveryReads::start`] was refused.
#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq)]
pub enum StartError {
    /// A newer attempt at recovering the master is under way here.
    #[error("recovery {recovery} of {master} is stale: recovery {current} replaced it")]
    Stale {
        /// The master.
        master: ServerId,
        /// The attempt asked for.
        recovery: u64,
        /// The attempt under way.
        current: u64,
    },
    /// [`RECOVERIES_MAX`] recoveries are tracked already.
    #[error("{max} recoveries are under way on this backup; retry later")]
    TooManyRecoveries {
        /// The limit.
        max: usize,
    },
    /// More segments than [`RECOVERY_SEGMENTS_MAX`].
    #[error("{count} segments exceed the limit of {max}")]
    TooManySegments {
        /// Segments named.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The partitions cannot be indexed.
    #[error("bad partitions: {0}")]
    Partitions(#[from] PartitionError),
    /// Called outside a tokio runtime (a programmer error in the caller).
    #[error("no tokio runtime to run the reader on")]
    NoRuntime,
}

impl StartError {
    /// The wire status for this refusal.
    pub fn status(&self) -> Status {
        match self {
            StartError::TooManyRecoveries { .. } => Status::Retry,
            StartError::NoRuntime => Status::Internal,
            StartError::Stale { .. }
            | StartError::TooManySegments { .. }
            | StartError::Partitions(_) => Status::InvalidArgument,
        }
    }
}

/// Why a [`RecoveryReads::fetch`] has no entries to return.
#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq)]
pub enum FetchError {
    /// This backup holds no replica of the segment.
    #[error("no replica of {master}/{segment} on this backup")]
    NotHeld {
        /// Whose log.
        master: ServerId,
        /// Which segment.
        segment: SegmentId,
    },
    /// The replica could not be read, did not verify, or did not split.
    #[error("replica {master}/{segment} cannot be used: {reason}")]
    Unreadable {
        /// Whose log.
        master: ServerId,
        /// Which segment.
        segment: SegmentId,
        /// What went wrong.
        reason: String,
    },
    /// The segment is scheduled but was not read within [`RECOVERY_DATA_WAIT_MS`].
    #[error("replica {master}/{segment} is not read yet (waited {waited_ms} ms); ask again")]
    NotReadYet {
        /// Whose log.
        master: ServerId,
        /// Which segment.
        segment: SegmentId,
        /// How long the request waited.
        waited_ms: u64,
    },
    /// The partition index lies past the attempt's partitions.
    #[error("recovery {recovery} of {master} has {partitions} partitions, not {partition}")]
    NoSuchPartition {
        /// The master.
        master: ServerId,
        /// The attempt.
        recovery: u64,
        /// Partitions of the attempt.
        partitions: u32,
        /// The index asked for.
        partition: u32,
    },
    /// The ranges of an on-demand request cannot be indexed.
    #[error("bad ranges: {0}")]
    Ranges(#[from] PartitionError),
}

impl FetchError {
    /// The wire status for this answer.
    pub fn status(&self) -> Status {
        match self {
            FetchError::NotHeld { .. } => Status::ObjectDoesntExist,
            FetchError::Unreadable { .. } => Status::Internal,
            FetchError::NotReadYet { .. } => Status::Retry,
            FetchError::NoSuchPartition { .. } | FetchError::Ranges(_) => Status::InvalidArgument,
        }
    }
}

/// The recovery reads of one backup. See the module doc.
#[derive(Debug)]
pub struct RecoveryReads {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<ReadsState>,
    /// Signalled (with `state` held) whenever `pieces_bytes` falls or an attempt leaves
    /// the table: readers waiting for room in the cache wait on it.
    room: Condvar,
    /// The bound on `ReadsState::pieces_bytes`.
    pieces_bytes_max: u64,
    /// Where the reader puts pieces that askers on this host read for themselves.
    shared: Option<SharedRegion>,
}

/// The recovery region and this host's identity, which an asker must name to be
/// answered with a piece's place in it.
#[derive(Debug)]
struct SharedRegion {
    region: RecoveryRegion,
    host: String,
}

#[derive(Debug, Default)]
struct ReadsState {
    /// The current attempt of each master under recovery. Invariant: at most
    /// [`RECOVERIES_MAX`] entries.
    recoveries: HashMap<ServerId, Recovery>,
    /// Bytes (allocated capacity) of every piece held. Invariants: 1. the sum of the
    /// attempts' `pieces_bytes`; 2. at most `Inner::pieces_bytes_max`, except while a
    /// single replica's pieces, published into an empty cache, exceed it (impossible in
    /// the service: they are at most [`REPLICA_BYTES_MAX`]).
    pieces_bytes: u64,
    /// The next reader generation; never reused.
    next_generation: u64,
}

#[derive(Debug)]
struct Recovery {
    /// The attempt's id, from the coordinator.
    id: u64,
    /// The reader working for this attempt (see the module doc on why ids are not
    /// enough).
    generation: u64,
    /// Every scheduled segment. Invariant: `Pending` until the reader publishes it.
    segments: HashMap<SegmentId, SegmentRead>,
    /// Partitions of the attempt.
    partitions: u32,
    /// Whether the reader is waiting for room in the cache: fetches of pending segments
    /// are then served on demand (module doc, *Held readers*).
    reader_held: bool,
    /// Bytes of this attempt's pieces held.
    pieces_bytes: u64,
    /// Counts segments published. Fetches waiting for a segment subscribe to it (under
    /// `state`, so no publication is missed); dropped with the attempt, which wakes them.
    /// Also touched, unchanged, when the reader becomes held, to wake them too.
    progress: watch::Sender<u64>,
}

#[derive(Debug)]
enum SegmentRead {
    /// Not read yet. `served`: partitions given this segment's entries by an on-demand
    /// read while the reader was held; their pieces are dropped when it publishes.
    /// Invariant: every member is below the attempt's `partitions`.
    Pending { served: HashSet<u32> },
    /// Read and split.
    Ready(ReadyReplica),
    /// Not held, or unusable: every fetch gets this answer.
    Failed(FetchError),
}

#[derive(Debug)]
struct ReadyReplica {
    epoch: Epoch,
    safe_version: Version,
    /// Non-empty pieces not handed out yet, by partition.
    pieces: HashMap<u32, CachedPiece>,
    /// Partitions whose piece (empty or not) was handed out: a later fetch re-reads.
    handed_out: HashSet<u32>,
}

/// A cached piece: in the backup's own memory, or in slots of the recovery region
/// (which go back to the region when the piece is handed out or dropped).
#[derive(Debug)]
enum CachedPiece {
    Owned(Piece),
    Shared {
        /// The piece's bytes fill these slots one after another.
        slots: Vec<SealedSlot>,
        len: u32,
        count: u32,
    },
}

impl CachedPiece {
    /// What the piece counts against the cache's bound.
    fn bytes(&self) -> u64 {
        match self {
            CachedPiece::Owned(piece) => piece.entries.capacity() as u64,
            CachedPiece::Shared { len, .. } => u64::from(*len),
        }
    }
}

/// One segment's split, as the reader publishes it.
#[derive(Debug)]
struct Cut {
    epoch: Epoch,
    safe_version: Version,
    /// The non-empty pieces, by partition.
    pieces: Vec<(u32, CachedPiece)>,
}

/// What a fetch found in the table.
enum Lookup {
    /// The answer: an error, or a piece to answer with.
    Done(Result<(Epoch, Version, CachedPiece), FetchError>),
    /// Scheduled, not read yet: wait for progress.
    Wait(watch::Receiver<u64>),
    /// Not scheduled in this attempt here (or handed out already): read on demand.
    OnDemand,
}

impl RecoveryReads {
    /// No recoveries; pieces bounded by `pieces_bytes_max` (the service passes
    /// [`RECOVERY_PIECES_BYTES_MAX`]; tests pass small bounds).
    pub fn new(pieces_bytes_max: u64) -> RecoveryReads {
        RecoveryReads::build(pieces_bytes_max, None)
    }

    /// As [`RecoveryReads::new`], with the reader putting pieces into slots of
    /// `region` while it has free ones: an asker naming `host` (this host's
    /// `onesided::host_id`) is then answered with where its piece lies. The region's
    /// pieces count against `pieces_bytes_max` like the others; the region holds at
    /// most its own size besides, in slots not handed out in full yet.
    pub fn with_region(
        pieces_bytes_max: u64,
        region: RecoveryRegion,
        host: String,
    ) -> RecoveryReads {
        RecoveryReads::build(pieces_bytes_max, Some(SharedRegion { region, host }))
    }

    fn build(pieces_bytes_max: u64, shared: Option<SharedRegion>) -> RecoveryReads {
        RecoveryReads {
            inner: Arc::new(Inner {
                state: Mutex::new(ReadsState::default()),
                room: Condvar::new(),
                pieces_bytes_max,
                shared,
            }),
        }
    }

    /// Starts attempt `request.recovery` at recovering `request.master`: a reader on a
    /// blocking thread of the current runtime reads `request.segments` from `source`, in
    /// order (repeats ignored), and splits each by `request.partitions`. Returns at
    /// once. A newer attempt replaces the master's older one (its pieces are dropped,
    /// its reader stops); a repeat of the current attempt is a no-op (a retried RPC).
    pub fn start(
        &self,
        request: RecoveryReadRequest,
        source: Arc<dyn ReplicaSource>,
    ) -> Result<(), StartError> {
        if request.segments.len() > RECOVERY_SEGMENTS_MAX {
            return Err(StartError::TooManySegments {
                count: request.segments.len(),
                max: RECOVERY_SEGMENTS_MAX,
            });
        }
        let index = PartitionIndex::new(&request.partitions)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let master = request.master;
        let mut seen = HashSet::with_capacity(request.segments.len());
        let order: Vec<SegmentId> = request
            .segments
            .into_iter()
            .filter(|segment| seen.insert(*segment))
            .collect();
        let (generation, replaced) = {
            let mut state = self.inner.state.lock();
            match state.recoveries.get(&master) {
                Some(current) if current.id == request.recovery => return Ok(()),
                Some(current) if current.id > request.recovery => {
                    return Err(StartError::Stale {
                        master,
                        recovery: request.recovery,
                        current: current.id,
                    });
                }
                Some(_) => {}
                None if state.recoveries.len() >= RECOVERIES_MAX => {
                    return Err(StartError::TooManyRecoveries {
                        max: RECOVERIES_MAX,
                    });
                }
                None => {}
            }
            let generation = state.next_generation;
            state.next_generation += 1;
            let recovery = Recovery {
                id: request.recovery,
                generation,
                segments: order
                    .iter()
                    .map(|&s| {
                        (
                            s,
                            SegmentRead::Pending {
                                served: HashSet::new(),
                            },
                        )
                    })
                    .collect(),
                partitions: index.partitions(),
                reader_held: false,
                pieces_bytes: 0,
                progress: watch::channel(0).0,
            };
            let replaced = state.recoveries.insert(master, recovery);
            if let Some(old) = &replaced {
                self.inner.free(&mut state, old.pieces_bytes);
            }
            (generation, replaced)
        };
        if let Some(old) = replaced {
            tracing::info!(%master, old = old.id, new = request.recovery, "recovery attempt replaced");
            // Dropped outside the lock: frees the old pieces and wakes its fetches.
            drop(old);
        }
        tracing::info!(
            %master, recovery = request.recovery, segments = order.len(),
            partitions = index.partitions(), "recovery reads scheduled"
        );
        let guard = ReaderGuard {
            inner: Arc::clone(&self.inner),
            master,
            generation,
        };
        // Detached: the reader stops by itself once its attempt leaves the table.
        drop(runtime.spawn_blocking(move || guard.run(source.as_ref(), order, &index)));
        Ok(())
    }

    /// The entries of `request.segment` in partition `request.partition`: the cached
    /// piece if this attempt read it here (handed out once); after waiting at most
    /// [`RECOVERY_DATA_WAIT_MS`] if it is scheduled but not read yet; otherwise read
    /// from `source` now, on a blocking thread, and cut to `request.ranges` (not cached).
    pub async fn fetch(
        &self,
        request: &RecoveryDataRequest,
        source: Arc<dyn ReplicaSource>,
    ) -> Result<RecoveryDataReply, FetchError> {
        let wait = Duration::from_millis(RECOVERY_DATA_WAIT_MS);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut progress = match self.lookup(request) {
                Lookup::Done(answer) => {
                    let (epoch, safe_version, piece) = answer?;
                    return self.answer(request, epoch, safe_version, piece).await;
                }
                Lookup::Wait(progress) => progress,
                Lookup::OnDemand => break,
            };
            // A change or a closed channel (the attempt left the table): look again.
            if tokio::time::timeout_at(deadline, progress.changed())
                .await
                .is_err()
            {
                return Err(FetchError::NotReadYet {
                    master: request.master,
                    segment: request.segment,
                    waited_ms: RECOVERY_DATA_WAIT_MS,
                });
            }
        }
        let index = PartitionIndex::new(std::slice::from_ref(&request.ranges))?;
        let (master, segment) = (request.master, request.segment);
        let read = tokio::task::spawn_blocking(move || {
            // Not cached: no region slots for a piece handed out at once.
            read_and_cut(
                source.as_ref(),
                master,
                segment,
                &index,
                &mut ReadBuffers::default(),
                None,
            )
        })
        .await
        .map_err(|error| FetchError::Unreadable {
            master,
            segment,
            reason: format!("the read task failed: {error}"),
        })?;
        let cut = read?;
        let piece = cut
            .pieces
            .into_iter()
            .next()
            .map_or_else(|| CachedPiece::Owned(Piece::default()), |(_, piece)| piece);
        self.answer(request, cut.epoch, cut.safe_version, piece)
            .await
    }

    /// Forgets `master`'s recovery: drops its pieces, stops its reader at the next
    /// segment, and sends its waiting fetches to on-demand reads. Returns whether an
    /// attempt was under way. Idempotent.
    pub fn end(&self, master: ServerId) -> bool {
        let (ended, idle) = {
            let mut state = self.inner.state.lock();
            let ended = state.recoveries.remove(&master);
            if let Some(recovery) = &ended {
                self.inner.free(&mut state, recovery.pieces_bytes);
            }
            (ended, state.recoveries.is_empty())
        };
        let Some(recovery) = ended else {
            return false;
        };
        tracing::info!(%master, recovery = recovery.id, "recovery reads ended");
        // Its pieces go first, their region slots with them.
        drop(recovery);
        if let (true, Some(shared)) = (idle, &self.inner.shared) {
            // A system call per slot: off the reactor where there is a runtime.
            let region = shared.region.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || region.trim())),
                Err(_) => region.trim(),
            }
        }
        true
    }

    /// Bytes of pieces held now, all recoveries together.
    pub fn pieces_bytes(&self) -> u64 {
        self.inner.state.lock().pieces_bytes
    }

    /// The attempt of `master` under way here, if any.
    pub fn current(&self, master: ServerId) -> Option<u64> {
        self.inner
            .state
            .lock()
            .recoveries
            .get(&master)
            .map(|r| r.id)
    }

    fn lookup(&self, request: &RecoveryDataRequest) -> Lookup {
        let mut guard = self.inner.state.lock();
        let state = &mut *guard;
        let Some(recovery) = state
            .recoveries
            .get_mut(&request.master)
            .filter(|recovery| recovery.id == request.recovery)
        else {
            return Lookup::OnDemand;
        };
        let Some(read) = recovery.segments.get_mut(&request.segment) else {
            return Lookup::OnDemand;
        };
        if request.partition >= recovery.partitions {
            return Lookup::Done(Err(FetchError::NoSuchPartition {
                master: request.master,
                recovery: request.recovery,
                partitions: recovery.partitions,
                partition: request.partition,
            }));
        }
        let ready = match read {
            SegmentRead::Pending { served } if recovery.reader_held => {
                // The held segment may be this one, and fit once this piece is dropped.
                if served.insert(request.partition) {
                    self.inner.room.notify_all();
                }
                return Lookup::OnDemand;
            }
            SegmentRead::Pending { .. } => return Lookup::Wait(recovery.progress.subscribe()),
            SegmentRead::Failed(error) => return Lookup::Done(Err(error.clone())),
            SegmentRead::Ready(ready) => ready,
        };
        if !ready.handed_out.insert(request.partition) {
            return Lookup::OnDemand;
        }
        let piece = ready
            .pieces
            .remove(&request.partition)
            .unwrap_or(CachedPiece::Owned(Piece::default()));
        let found = (ready.epoch, ready.safe_version);
        let bytes = piece.bytes();
        if bytes > 0 {
            recovery.pieces_bytes -= bytes;
            self.inner.free(state, bytes);
        }
        Lookup::Done(Ok((found.0, found.1, piece)))
    }

    /// The reply handing out `piece`: its place in the region for an asker on this
    /// host, else its bytes (copied out of the region on a blocking thread: megabytes).
    async fn answer(
        &self,
        request: &RecoveryDataRequest,
        epoch: Epoch,
        safe_version: Version,
        piece: CachedPiece,
    ) -> Result<RecoveryDataReply, FetchError> {
        Ok(match piece {
            CachedPiece::Owned(piece) => reply(epoch, safe_version, piece),
            CachedPiece::Shared { slots, len, count } => {
                // The piece fills each slot but the last.
                let capacity = self
                    .inner
                    .shared
                    .as_ref()
                    .map_or(len, |shared| shared.region.slot_capacity())
                    .max(1);
                let runs = slots
                    .iter()
                    .zip((0..len).step_by(capacity as usize))
                    .map(|(slot, start)| slot.run(0, capacity.min(len - start)));
                match &self.inner.shared {
                    Some(shared)
                        if request.shared_host.as_deref() == Some(shared.host.as_str()) =>
                    {
                        let runs = runs.map(SharedRun::from).collect();
                        RecoveryDataReply {
                            epoch,
                            safe_version,
                            entries: Bytes::new(),
                            count,
                            shared: Some(SharedPiece {
                                region: shared.region.path().to_string(),
                                nonce: shared.region.nonce(),
                                runs,
                            }),
                        }
                    }
                    _ => {
                        let lens: Vec<u32> = runs.map(|run| run.len).collect();
                        let copy = move || {
                            let mut entries = Vec::with_capacity(len as usize);
                            for (slot, len) in slots.iter().zip(lens) {
                                slot.append_to(0, len, &mut entries);
                            }
                            entries
                        };
                        let entries = tokio::task::spawn_blocking(copy).await.map_err(|error| {
                            FetchError::Unreadable {
                                master: request.master,
                                segment: request.segment,
                                reason: format!("the copy out of the region failed: {error}"),
                            }
                        })?;
                        reply(epoch, safe_version, Piece { entries, count })
                    }
                }
            }
        })
    }
}

impl Inner {
    /// Takes `bytes` off the cache's count (the caller took them off its attempt's)
    /// and wakes the readers waiting for room. No attempt counts as held until its
    /// reader finds there is still no room, so that fetches wait for a reader that may
    /// now publish rather than pay an on-demand read.
    fn free(&self, state: &mut ReadsState, bytes: u64) {
        state.pieces_bytes -= bytes;
        for recovery in state.recoveries.values_mut() {
            recovery.reader_held = false;
        }
        self.room.notify_all();
    }
}

impl Drop for RecoveryReads {
    /// Stops every reader at its next segment (they hold the store through their
    /// source) and frees the pieces.
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        state.recoveries.clear();
        state.pieces_bytes = 0;
        self.inner.room.notify_all();
    }
}

fn reply(epoch: Epoch, safe_version: Version, piece: Piece) -> RecoveryDataReply {
    RecoveryDataReply {
        epoch,
        safe_version,
        entries: piece.entries.into(),
        count: piece.count,
        shared: None,
    }
}

/// What a reader reuses from one replica to the next: the bytes of the last one read
/// (handed to [`ReplicaSource::read`]) and the split's notes. About one segment of
/// memory per reader, for the whole recovery, outside the cache's budget.
#[derive(Debug, Default)]
struct ReadBuffers {
    bytes: Vec<u8>,
    places: Vec<EntryPlace>,
}

/// Reads one replica into `buffers.bytes` (the previous read's, reused) and cuts it into
/// its non-empty pieces: into slots of `region` where it has enough free, else into the
/// backup's own memory. After a read that failed or found nothing, the buffers start
/// afresh. Blocks.
fn read_and_cut(
    source: &dyn ReplicaSource,
    master: ServerId,
    segment: SegmentId,
    index: &PartitionIndex,
    buffers: &mut ReadBuffers,
    region: Option<&RecoveryRegion>,
) -> Result<Cut, FetchError> {
    let unreadable = |reason: String| FetchError::Unreadable {
        master,
        segment,
        reason,
    };
    let held = source
        .read(master, segment, std::mem::take(&mut buffers.bytes))
        .map_err(|error| unreadable(error.to_string()))?
        .ok_or(FetchError::NotHeld { master, segment })?;
    let places = &mut buffers.places;
    let cut = note_places(&held.bytes, &held.info, index, places).map(|notes| {
        let pieces = match region {
            Some(region) => write_pieces(&held.bytes, &notes, places, region),
            None => (0u32..)
                .zip(copy_pieces(&held.bytes, &notes, places))
                .filter(|(_, piece)| piece.count > 0)
                .map(|(partition, piece)| (partition, CachedPiece::Owned(piece)))
                .collect(),
        };
        Cut {
            epoch: held.info.epoch,
            safe_version: notes.safe_version,
            pieces,
        }
    });
    buffers.bytes = held.bytes;
    cut.map_err(|error| unreadable(error.to_string()))
}

/// One attempt's reader. Dropping it (done, panicked, or never run because the
/// runtime shut down) marks the segments it left unread as unreadable, so that no
/// fetch waits for them.
struct ReaderGuard {
    inner: Arc<Inner>,
    master: ServerId,
    generation: u64,
}

impl ReaderGuard {
    fn run(self, source: &dyn ReplicaSource, order: Vec<SegmentId>, index: &PartitionIndex) {
        let started = std::time::Instant::now();
        let count = order.len();
        let mut buffers = ReadBuffers::default();
        for segment in order {
            if !self.is_current() {
                tracing::info!(master = %self.master, "recovery reader stops: attempt replaced or ended");
                return;
            }
            let region = self.inner.shared.as_ref().map(|shared| &shared.region);
            let read = read_and_cut(source, self.master, segment, index, &mut buffers, region);
            if let Err(error) = &read {
                tracing::warn!(master = %self.master, %segment, %error, "recovery read failed");
            }
            if !self.publish(segment, read) {
                return;
            }
        }
        tracing::info!(
            master = %self.master, segments = count, elapsed = ?started.elapsed(),
            "recovery reads done"
        );
    }

    fn is_current(&self) -> bool {
        let state = self.inner.state.lock();
        is_current(&state, self.master, self.generation)
    }

    /// Publishes one segment's outcome, first waiting (lock released) while its pieces
    /// would overfill the cache; while it waits, the reader is *held* (module doc). The
    /// pieces of partitions served on demand meanwhile are dropped, not cached. Returns
    /// false if the attempt left the table meanwhile.
    fn publish(&self, segment: SegmentId, read: Result<Cut, FetchError>) -> bool {
        let mut entry = match read {
            Ok(cut) => SegmentRead::Ready(ReadyReplica {
                epoch: cut.epoch,
                safe_version: cut.safe_version,
                pieces: cut.pieces.into_iter().collect(),
                handed_out: HashSet::new(),
            }),
            Err(error) => SegmentRead::Failed(error),
        };
        let mut guard = self.inner.state.lock();
        let bytes = loop {
            if !is_current(&guard, self.master, self.generation) {
                return false;
            }
            let state = &mut *guard;
            let Some(recovery) = state.recoveries.get_mut(&self.master) else {
                return false;
            };
            let bytes = match &mut entry {
                SegmentRead::Ready(ready) => {
                    if let Some(SegmentRead::Pending { served }) = recovery.segments.get(&segment) {
                        for partition in served {
                            ready.pieces.remove(partition);
                            ready.handed_out.insert(*partition);
                        }
                    }
                    ready.pieces.values().map(CachedPiece::bytes).sum()
                }
                _ => 0,
            };
            let held = state.pieces_bytes;
            if held == 0 || held.saturating_add(bytes) <= self.inner.pieces_bytes_max {
                recovery.reader_held = false;
                break bytes;
            }
            if !recovery.reader_held {
                // Debug: freeing a piece clears the flag, so a cache that stays full logs
                // this once per piece served.
                tracing::debug!(
                    master = %self.master, %segment, held, bytes,
                    "recovery reader held by a full cache: unread segments are served on demand"
                );
                recovery.reader_held = true;
                // Wakes the fetches waiting for a segment, which now go on demand.
                recovery.progress.send_modify(|_| ());
            }
            self.inner.room.wait(&mut guard);
        };
        let state = &mut *guard;
        let Some(recovery) = state.recoveries.get_mut(&self.master) else {
            return false;
        };
        state.pieces_bytes += bytes;
        recovery.pieces_bytes += bytes;
        recovery.segments.insert(segment, entry);
        recovery.progress.send_modify(|published| *published += 1);
        true
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        if !is_current(&state, self.master, self.generation) {
            return;
        }
        let Some(recovery) = state.recoveries.get_mut(&self.master) else {
            return;
        };
        let mut abandoned = 0;
        for (&segment, read) in recovery.segments.iter_mut() {
            if matches!(read, SegmentRead::Pending { .. }) {
                *read = SegmentRead::Failed(FetchError::Unreadable {
                    master: self.master,
                    segment,
                    reason: "the backup's recovery reader stopped before reading it".into(),
                });
                abandoned += 1;
            }
        }
        if abandoned > 0 {
            tracing::error!(master = %self.master, abandoned, "recovery reader stopped early");
            recovery.progress.send_modify(|published| *published += 1);
        }
    }
}

fn is_current(state: &ReadsState, master: ServerId, generation: u64) -> bool {
    state
        .recoveries
        .get(&master)
        .is_some_and(|recovery| recovery.generation == generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_common::ids::{key_hash, KeyHash, TableId};
    use rampart_common::log::Entry;
    use rampart_common::log::{decode_entry, SegmentWriter};
    use rampart_common::tablet::HashRange;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const MASTER: ServerId = ServerId(9);
    const CAPACITY: u32 = 64 * 1024;

    fn info(segment: u64, closed: bool) -> ReplicaInfo {
        ReplicaInfo {
            master: MASTER,
            segment: SegmentId(segment),
            epoch: Epoch(3),
            length: 0,
            closed,
        }
    }

    /// What a decoded entry says, for comparisons: (tombstone?, table, key, version).
    type Seen = (bool, TableId, Vec<u8>, Version);

    fn decode_all(bytes: &[u8]) -> Vec<Seen> {
        let mut offset = 0;
        let mut seen = Vec::new();
        while let Some((entry, next)) = decode_entry(bytes, offset).expect("entry decodes") {
            match entry {
                Entry::Object(o) => seen.push((false, o.table, o.key.to_vec(), o.version)),
                Entry::Tombstone(t) => seen.push((true, t.table, t.key.to_vec(), t.version)),
                other => panic!("unexpected {other:?} in a piece"),
            }
            offset = next;
        }
        seen
    }

    /// The first key `{prefix}-{i}` whose hash `accept` takes, with its hash.
    fn key_with_hash(prefix: &str, accept: impl Fn(u64) -> bool) -> (Vec<u8>, u64) {
        (0..100_000)
            .map(|i| format!("{prefix}-{i}").into_bytes())
            .map(|key| {
                let hash = key_hash(&key).0;
                (key, hash)
            })
            .find(|(_, hash)| accept(*hash))
            .expect("a key with such a hash exists")
    }

    #[test]
    fn partition_index_finds_ranges_at_their_boundaries_only() {
        let index = PartitionIndex::new(&[
            vec![
                HashRange::new(TableId(1), 100, 200),
                HashRange::whole(TableId(2)),
            ],
            vec![HashRange::new(TableId(1), 201, 300)],
            vec![],
            vec![HashRange::new(TableId(1), 0, 99)],
        ])
        .expect("disjoint");
        assert_eq!(index.partitions(), 4);
        let at = |table, hash| index.partition_of(TableId(table), KeyHash(hash));
        assert_eq!(at(1, 0), Some(3));
        assert_eq!(at(1, 99), Some(3));
        assert_eq!(at(1, 100), Some(0));
        assert_eq!(at(1, 200), Some(0));
        assert_eq!(at(1, 201), Some(1));
        assert_eq!(at(1, 300), Some(1));
        assert_eq!(at(1, 301), None);
        assert_eq!(at(1, u64::MAX), None);
        assert_eq!(at(2, 0), Some(0));
        assert_eq!(at(2, u64::MAX), Some(0));
        assert_eq!(at(0, 150), None);
        assert_eq!(at(3, 0), None);
    }

    #[test]
    fn partition_index_refuses_overlaps_and_empty_ranges() {
        let overlap = PartitionIndex::new(&[
            vec![HashRange::new(TableId(1), 0, 100)],
            vec![HashRange::new(TableId(1), 100, 200)],
        ]);
        assert_eq!(
            overlap,
            Err(PartitionError::Overlap {
                table: TableId(1),
                first: 0,
                second: 1,
                at: 100
            })
        );
        let within = PartitionIndex::new(&[vec![
            HashRange::new(TableId(1), 50, 60),
            HashRange::new(TableId(1), 0, 50),
        ]]);
        assert!(matches!(within, Err(PartitionError::Overlap { .. })));
        let empty = PartitionIndex::new(&[vec![HashRange::new(TableId(1), 5, 4)]]);
        assert!(matches!(empty, Err(PartitionError::EmptyRange { .. })));
        let many = vec![vec![]; RECOVERY_PARTITIONS_MAX + 1];
        assert!(matches!(
            PartitionIndex::new(&many),
            Err(PartitionError::TooManyPartitions { .. })
        ));
    }

    #[test]
    fn split_replica_puts_each_entry_in_its_partition_and_skips_the_rest() {
        // Partition 0: table 1, hashes below 2^63; partition 1: table 1 from 2^63 on,
        // and table 2 at exactly one key's hash (a range of one hash: both boundaries).
        let half = 1u64 << 63;
        let (low_key, _) = key_with_hash("low", |h| h < half);
        let (high_key, _) = key_with_hash("high", |h| h >= half);
        let (exact_key, exact_hash) = key_with_hash("exact", |_| true);
        let (beside_key, _) = key_with_hash("beside", |h| h != exact_hash);
        let partitions = vec![
            vec![HashRange::new(TableId(1), 0, half - 1)],
            vec![
                HashRange::new(TableId(1), half, u64::MAX),
                HashRange::new(TableId(2), exact_hash, exact_hash),
            ],
        ];
        let index = PartitionIndex::new(&partitions).expect("index");
        let mut writer =
            SegmentWriter::open(MASTER, SegmentId(4), CAPACITY, &[SegmentId(4)]).expect("open");
        let objects = [
            (1, &low_key, 1),
            (1, &high_key, 2),
            (2, &exact_key, 3),
            (2, &beside_key, 4),
            (3, &low_key, 5),
        ];
        for (table, key, version) in objects {
            writer
                .append_object(TableId(table), Version(version), key, b"value")
                .expect("fits");
        }
        writer.append_safe_version(Version(40)).expect("fits");
        writer.seal_batch();
        writer
            .append_tombstone(TableId(1), Version(1), SegmentId(2), &low_key)
            .expect("fits");
        writer
            .append_tombstone(TableId(9), Version(6), SegmentId(2), &high_key)
            .expect("fits");
        writer.append_safe_version(Version(30)).expect("fits");
        writer.seal_batch();
        // A torn batch past the valid prefix contributes nothing.
        writer
            .append_object(TableId(1), Version(7), &low_key, b"torn")
            .expect("fits");
        let bytes = writer.bytes().to_vec();

        let split = split_replica(&bytes, &info(4, false), &index).expect("splits");
        assert_eq!(split.safe_version, Version(40));
        assert_eq!(split.pieces.len(), 2);
        assert_eq!(
            decode_all(&split.pieces[0].entries),
            vec![
                (false, TableId(1), low_key.clone(), Version(1)),
                (true, TableId(1), low_key.clone(), Version(1)),
            ]
        );
        assert_eq!(split.pieces[0].count, 2);
        assert_eq!(
            decode_all(&split.pieces[1].entries),
            vec![
                (false, TableId(1), high_key.clone(), Version(2)),
                (false, TableId(2), exact_key.clone(), Version(3)),
            ]
        );
        assert_eq!(split.pieces[1].count, 2);
    }

    #[test]
    fn split_replica_sends_each_completion_record_with_its_objects_key_hash() {
        let half = 1u64 << 63;
        let (low_key, low_hash) = key_with_hash("low", |h| h < half);
        let (high_key, high_hash) = key_with_hash("high", |h| h >= half);
        let partitions = vec![
            vec![HashRange::new(TableId(1), 0, half - 1)],
            vec![HashRange::new(TableId(1), half, u64::MAX)],
        ];
        let index = PartitionIndex::new(&partitions).expect("index");
        let mut writer =
            SegmentWriter::open(MASTER, SegmentId(4), CAPACITY, &[SegmentId(4)]).expect("open");
        let record = |hash: u64, seq: u64| rampart_common::log::CompletionEntry {
            table: TableId(1),
            key_hash: KeyHash(hash),
            client: rampart_common::ids::ClientId(5),
            seq,
            ack: 0,
            version: Version(seq),
            counter: None,
        };
        for (key, hash, seq) in [(&low_key, low_hash, 1), (&high_key, high_hash, 2)] {
            writer
                .append_object(TableId(1), Version(seq), key, b"value")
                .expect("fits");
            writer.append_completion(&record(hash, seq)).expect("fits");
        }
        writer.seal_batch();
        let split = split_replica(writer.bytes(), &info(4, false), &index).expect("splits");
        for (piece, (key, hash, seq)) in split
            .pieces
            .iter()
            .zip([(&low_key, low_hash, 1), (&high_key, high_hash, 2)])
        {
            assert_eq!(piece.count, 2);
            let (object, next) = decode_entry(&piece.entries, 0)
                .expect("a piece decodes")
                .expect("a piece holds the object");
            assert!(matches!(object, Entry::Object(o) if o.key == &key[..]));
            let (completion, _) = decode_entry(&piece.entries, next)
                .expect("a piece decodes")
                .expect("a piece holds the record");
            assert_eq!(completion, Entry::Completion(record(hash, seq)));
        }
    }

    #[test]
    fn split_replica_allocates_each_piece_at_its_exact_size() {
        let index = PartitionIndex::new(&[vec![HashRange::whole(TableId(1))]]).expect("index");
        let mut writer =
            SegmentWriter::open(MASTER, SegmentId(4), CAPACITY, &[SegmentId(4)]).expect("open");
        // A large entry first: a piece grown by doubling then ends with spare room.
        for (version, value_bytes) in [(1, 100), (2, 1), (3, 1)] {
            writer
                .append_object(TableId(1), Version(version), b"k", &vec![7; value_bytes])
                .expect("fits");
        }
        writer.seal_batch();
        let split = split_replica(writer.bytes(), &info(4, false), &index).expect("splits");
        let piece = &split.pieces[0];
        assert_eq!(piece.count, 3);
        assert_eq!(piece.entries.capacity(), piece.entries.len());
    }

    #[test]
    fn split_replica_refuses_a_closed_replica_cut_short_or_another_segment() {
        let index = PartitionIndex::new(&[vec![HashRange::whole(TableId(1))]]).expect("index");
        let mut writer =
            SegmentWriter::open(MASTER, SegmentId(4), CAPACITY, &[SegmentId(4)]).expect("open");
        writer
            .append_object(TableId(1), Version(1), b"k", b"v")
            .expect("fits");
        let sealed = writer.seal_batch();
        let closed = writer.close(SegmentId(5));
        let bytes = writer.bytes().to_vec();
        let whole = split_replica(&bytes, &info(4, true), &index).expect("closed splits");
        assert_eq!(whole.pieces[0].count, 1);
        let cut = split_replica(&bytes[..sealed as usize], &info(4, true), &index);
        assert!(matches!(cut, Err(SplitError::NotClosed { .. })), "{cut:?}");
        // The same bytes as an open replica are fine.
        split_replica(&bytes[..sealed as usize], &info(4, false), &index).expect("open");
        let other = split_replica(&bytes[..closed as usize], &info(5, true), &index);
        assert!(
            matches!(other, Err(SplitError::WrongSegment { .. })),
            "{other:?}"
        );
        // An empty open frame (nothing acknowledged) splits into empty pieces.
        let empty = split_replica(&[], &info(6, false), &index).expect("empty");
        assert_eq!(empty.pieces, vec![Piece::default()]);
    }

    /// Replicas in memory, counting reads; reads of segment `gated`, if any, wait (counted
    /// on arrival) until `open` is set. A replica is copied into the buffer the read is
    /// handed, as the service does; `reused` counts reads handed one that already had
    /// room for it.
    #[derive(Debug, Default)]
    struct FakeSource {
        replicas: HashMap<SegmentId, HeldReplica>,
        reads: AtomicUsize,
        reused: AtomicUsize,
        gated: Option<SegmentId>,
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl ReplicaSource for FakeSource {
        fn read(
            &self,
            master: ServerId,
            segment: SegmentId,
            mut reuse: Vec<u8>,
        ) -> Result<Option<HeldReplica>, StoreError> {
            assert_eq!(master, MASTER);
            self.reads.fetch_add(1, Ordering::SeqCst);
            if self.gated == Some(segment) {
                let mut open = self.open.lock();
                while !*open {
                    self.opened.wait(&mut open);
                }
            }
            let Some(held) = self.replicas.get(&segment) else {
                return Ok(None);
            };
            if reuse.capacity() >= held.bytes.len() {
                self.reused.fetch_add(1, Ordering::SeqCst);
            }
            reuse.clear();
            reuse.extend_from_slice(&held.bytes);
            Ok(Some(HeldReplica {
                info: held.info,
                bytes: reuse,
            }))
        }
    }

    /// Closed replicas of segments `1..=segments`, each holding `objects`: (table, key,
    /// value bytes), at the segment's number as version.
    fn replicas(segments: u64, objects: &[(u64, &[u8], usize)]) -> HashMap<SegmentId, HeldReplica> {
        (1..=segments)
            .map(|segment| {
                let id = SegmentId(segment);
                let mut writer = SegmentWriter::open(MASTER, id, CAPACITY, &[id]).expect("open");
                for &(table, key, value_bytes) in objects {
                    writer
                        .append_object(TableId(table), Version(segment), key, &vec![7; value_bytes])
                        .expect("fits");
                }
                writer.seal_batch();
                writer.close(SegmentId(segment + 1));
                let held = HeldReplica {
                    info: info(segment, true),
                    bytes: writer.bytes().to_vec(),
                };
                (id, held)
            })
            .collect()
    }

    /// `segments` closed replicas of one object each, of `value_bytes` bytes, all in
    /// table 1.
    fn source(segments: u64, value_bytes: usize) -> Arc<FakeSource> {
        Arc::new(FakeSource {
            replicas: replicas(segments, &[(1, b"key", value_bytes)]),
            ..FakeSource::default()
        })
    }

    /// Waits until `condition` holds (the reader runs on its own thread); fails after
    /// 10 s.
    async fn eventually(condition: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "condition never held");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn read_request(recovery: u64, segments: u64) -> RecoveryReadRequest {
        RecoveryReadRequest {
            master: MASTER,
            recovery,
            segments: (1..=segments).map(SegmentId).collect(),
            partitions: vec![vec![HashRange::whole(TableId(1))]],
        }
    }

    fn data_request(recovery: u64, segment: u64) -> RecoveryDataRequest {
        RecoveryDataRequest {
            master: MASTER,
            recovery,
            segment: SegmentId(segment),
            partition: 0,
            ranges: vec![HashRange::whole(TableId(1))],
            shared_host: None,
        }
    }

    /// Pieces in the region: an asker on this host gets their place and reads them
    /// there, any other gets their bytes; the same entries either way, as the pure
    /// split gives them. Each piece's slots go back to the region once it is handed
    /// out.
    #[tokio::test]
    async fn pieces_in_the_region_are_read_on_this_host_and_sent_to_others() {
        let replicas = replicas(
            2,
            &[(1, b"one", 5000), (2, b"two", 3000), (1, b"uno", 4000)],
        );
        let source = Arc::new(FakeSource {
            replicas: replicas.clone(),
            ..FakeSource::default()
        });
        // Slots smaller than the pieces: each fills several.
        let region = RecoveryRegion::create(64, 4096, Duration::ZERO).expect("region");
        let reads = RecoveryReads::with_region(1 << 20, region.clone(), "this-host".to_string());
        let ranges = [HashRange::whole(TableId(1)), HashRange::whole(TableId(2))];
        let request = RecoveryReadRequest {
            master: MASTER,
            recovery: 1,
            segments: vec![SegmentId(1), SegmentId(2)],
            partitions: ranges.iter().map(|&range| vec![range]).collect(),
        };
        let index = PartitionIndex::new(&request.partitions).expect("index");
        reads.start(request, source.clone()).expect("start");
        eventually(|| source.reads.load(Ordering::SeqCst) == 2).await;
        eventually(|| reads.pieces_bytes() > 0 && region.free_slots() < 64).await;
        let region_reader =
            rampart_common::onesided::shm::RegionReader::open(region.path(), region.nonce())
                .expect("maps");
        for segment in [1, 2] {
            let held = &replicas[&SegmentId(segment)];
            let split = split_replica(&held.bytes, &held.info, &index).expect("splits");
            for (partition, host) in [(0, Some("this-host")), (1, Some("another-host"))] {
                let request = RecoveryDataRequest {
                    partition,
                    ranges: vec![ranges[partition as usize]],
                    shared_host: host.map(str::to_string),
                    ..data_request(1, segment)
                };
                let reply = reads.fetch(&request, source.clone()).await.expect("piece");
                let expected = &split.pieces[partition as usize];
                assert_eq!(reply.count, expected.count);
                let entries = match (&reply.shared, partition) {
                    (Some(shared), 0) => {
                        assert!(reply.entries.is_empty());
                        assert_eq!(
                            (shared.region.as_str(), shared.nonce),
                            (region.path(), region.nonce())
                        );
                        let runs = shared.region_runs();
                        assert!(runs.len() > 1, "a piece over several slots");
                        let mut out = Vec::new();
                        region_reader.copy_runs(&runs, &mut out).expect("reads");
                        out
                    }
                    (None, 1) => reply.entries.to_vec(),
                    other => panic!("partition {partition} answered {other:?}"),
                };
                assert_eq!(
                    entries, expected.entries,
                    "segment {segment} partition {partition}"
                );
            }
        }
        assert_eq!(source.reads.load(Ordering::SeqCst), 2, "all from the cache");
        assert_eq!(
            region.free_slots(),
            64,
            "every piece handed out, every slot back"
        );
        assert_eq!(reads.pieces_bytes(), 0);
        assert!(reads.end(MASTER));
    }

    /// A region too small for every piece: the pieces that find no free slots stay in
    /// the backup's own memory and go out as bytes, even to an asker on this host; and
    /// ending the recovery with pieces still in the region gives their slots back.
    #[tokio::test]
    async fn a_full_region_keeps_pieces_in_memory_and_an_end_gives_its_slots_back() {
        // Two segments, one 5,000-byte piece each: each piece needs both slots.
        let source = source(2, 5000);
        let region = RecoveryRegion::create(2, 4096, Duration::ZERO).expect("region");
        let reads = RecoveryReads::with_region(1 << 20, region.clone(), "this-host".to_string());
        reads
            .start(read_request(1, 2), source.clone())
            .expect("start");
        eventually(|| source.reads.load(Ordering::SeqCst) == 2).await;
        eventually(|| region.free_slots() == 0).await;
        // The reader cut segment 1 first: its piece took both slots, and segment 2's
        // found none and stayed in memory.
        let request = RecoveryDataRequest {
            shared_host: Some("this-host".to_string()),
            ..data_request(1, 2)
        };
        let owned = reads.fetch(&request, source.clone()).await.expect("piece");
        assert!(
            owned.shared.is_none(),
            "a piece not in the region goes as bytes"
        );
        assert_eq!(owned.count, 1);
        assert!(owned.entries.len() > 5000);
        assert_eq!(region.free_slots(), 0, "segment 1's piece still holds both");
        // The recovery ends before segment 1's piece is fetched.
        assert!(reads.end(MASTER));
        assert_eq!(reads.pieces_bytes(), 0);
        assert_eq!(
            region.free_slots(),
            2,
            "the ended recovery's slots came back"
        );
    }

    #[tokio::test]
    async fn a_full_cache_holds_the_reader_until_fetches_free_room() {
        const VALUE: usize = 10_000;
        // Room for two pieces, not three.
        let reads = RecoveryReads::new(2 * VALUE as u64 + 200);
        let source = source(5, VALUE);
        reads
            .start(read_request(1, 5), source.clone())
            .expect("start");
        eventually(|| source.reads.load(Ordering::SeqCst) == 3).await;
        // Give an unbounded reader time to go on; this one must not.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            source.reads.load(Ordering::SeqCst),
            3,
            "two published, one held"
        );
        assert!(reads.pieces_bytes() <= 2 * VALUE as u64 + 200);
        for segment in 1..=5 {
            let reply = reads
                .fetch(&data_request(1, segment), source.clone())
                .await
                .expect("piece");
            assert_eq!(reply.count, 1);
        }
        assert_eq!(
            source.reads.load(Ordering::SeqCst),
            5,
            "every piece from the cache"
        );
        assert_eq!(
            source.reused.load(Ordering::SeqCst),
            4,
            "the reader reads each replica into the previous one's buffer"
        );
        assert_eq!(reads.pieces_bytes(), 0);
        // Handed out once: a repeat re-reads.
        let again = reads
            .fetch(&data_request(1, 3), source.clone())
            .await
            .expect("again");
        assert_eq!(again.count, 1);
        assert_eq!(source.reads.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn a_reader_held_by_a_full_cache_serves_unread_segments_on_demand() {
        // A recovery master replays partition 0 while partition 1 waits its turn, so
        // nothing fetches partition 1's large pieces, and they fill the cache after two
        // segments. Partition 0 must still get every segment (it used to get `Retry`
        // until it gave up); partition 1 then gets its pieces from the cache, and the
        // pieces partition 0 got on demand never occupy it.
        const VALUE: usize = 10_000;
        let replicas = replicas(4, &[(1, b"small", 1), (2, b"large", VALUE)]);
        let source = Arc::new(FakeSource {
            replicas,
            gated: Some(SegmentId(3)),
            ..FakeSource::default()
        });
        let reads_so_far = || source.reads.load(Ordering::SeqCst);
        let reads = Arc::new(RecoveryReads::new(2 * VALUE as u64 + 600));
        let partition_ranges = [HashRange::whole(TableId(1)), HashRange::whole(TableId(2))];
        let request = RecoveryReadRequest {
            master: MASTER,
            recovery: 1,
            segments: (1..=4).map(SegmentId).collect(),
            partitions: partition_ranges.iter().map(|&range| vec![range]).collect(),
        };
        let fetch = move |segment: u64, partition: u32| RecoveryDataRequest {
            master: MASTER,
            recovery: 1,
            segment: SegmentId(segment),
            partition,
            ranges: vec![partition_ranges[partition as usize]],
            shared_host: None,
        };
        reads.start(request, source.clone()).expect("start");
        // The reader has published segments 1 and 2 and is at the gate of segment 3.
        eventually(|| reads_so_far() == 3).await;
        // A fetch of segment 3 waits for the reader ...
        let waiting = tokio::spawn({
            let (reads, source, request) = (Arc::clone(&reads), source.clone(), fetch(3, 0));
            async move { reads.fetch(&request, source).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "segment 3 is not read yet");
        // ... which finds no room for segment 3 once it is read: the waiting fetch is
        // woken and served on demand.
        *source.open.lock() = true;
        source.opened.notify_all();
        let third = waiting.await.expect("task").expect("served on demand");
        assert_eq!(decode_all(&third.entries)[0].2, b"small");
        assert_eq!(
            reads_so_far(),
            4,
            "segment 3 read by the reader, then on demand"
        );
        for segment in [1, 2, 4] {
            let reply = reads.fetch(&fetch(segment, 0), source.clone()).await;
            assert_eq!(reply.expect("partition 0 piece").count, 1, "{segment}");
        }
        assert_eq!(
            reads_so_far(),
            5,
            "segment 4 on demand: the reader is still held"
        );
        // Partition 1's turn: every piece comes from the reader.
        for segment in 1..=4 {
            let reply = reads.fetch(&fetch(segment, 1), source.clone()).await;
            let reply = reply.expect("partition 1 piece");
            assert_eq!(decode_all(&reply.entries)[0].2, b"large", "{segment}");
        }
        assert_eq!(
            reads_so_far(),
            6,
            "the reader read segment 4 once there was room"
        );
        assert_eq!(
            reads.pieces_bytes(),
            0,
            "pieces served on demand were dropped, not cached"
        );
        // A partition past the attempt's: refused.
        let mut bad = fetch(4, 1);
        bad.partition = 2;
        let bad = reads.fetch(&bad, source.clone()).await;
        assert!(
            matches!(bad, Err(FetchError::NoSuchPartition { .. })),
            "{bad:?}"
        );
    }

    #[tokio::test]
    async fn ending_a_recovery_frees_its_pieces_and_stops_its_reader() {
        const VALUE: usize = 10_000;
        let reads = RecoveryReads::new(VALUE as u64 + 200);
        let source = source(5, VALUE);
        reads
            .start(read_request(1, 5), source.clone())
            .expect("start");
        eventually(|| source.reads.load(Ordering::SeqCst) == 2).await;
        assert!(reads.pieces_bytes() > 0);
        assert!(reads.end(MASTER));
        assert!(!reads.end(MASTER));
        assert_eq!(reads.pieces_bytes(), 0);
        // Give a reader that ignored the end time to go on; this one must not.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            source.reads.load(Ordering::SeqCst),
            2,
            "the reader stopped after the segment it held"
        );
        assert_eq!(reads.current(MASTER), None);
    }

    #[tokio::test]
    async fn start_refuses_stale_attempts_and_treats_a_repeat_as_a_retry() {
        let reads = RecoveryReads::new(1 << 20);
        let source = source(2, 10);
        reads
            .start(read_request(5, 2), source.clone())
            .expect("start");
        reads
            .start(read_request(5, 2), source.clone())
            .expect("repeat");
        let stale = reads.start(read_request(4, 2), source.clone());
        assert!(matches!(stale, Err(StartError::Stale { current: 5, .. })));
        assert_eq!(stale.map_err(|e| e.status()), Err(Status::InvalidArgument));
        reads
            .start(read_request(6, 2), source.clone())
            .expect("newer");
        assert_eq!(reads.current(MASTER), Some(6));
    }

    #[tokio::test]
    async fn a_reader_that_dies_marks_its_unread_segments_unreadable() {
        /// Panics on the second read.
        #[derive(Debug, Default)]
        struct Crashing(AtomicUsize);
        impl ReplicaSource for Crashing {
            fn read(
                &self,
                _: ServerId,
                segment: SegmentId,
                _: Vec<u8>,
            ) -> Result<Option<HeldReplica>, StoreError> {
                if self.0.fetch_add(1, Ordering::SeqCst) == 1 {
                    panic!("injected reader crash");
                }
                let mut writer =
                    SegmentWriter::open(MASTER, segment, CAPACITY, &[segment]).expect("open");
                writer.seal_batch();
                Ok(Some(HeldReplica {
                    info: info(segment.0, false),
                    bytes: writer.bytes().to_vec(),
                }))
            }
        }
        let reads = RecoveryReads::new(1 << 20);
        let source: Arc<dyn ReplicaSource> = Arc::new(Crashing::default());
        reads
            .start(read_request(1, 3), Arc::clone(&source))
            .expect("start");
        let first = reads
            .fetch(&data_request(1, 1), Arc::clone(&source))
            .await
            .expect("first segment");
        assert_eq!(first.count, 0);
        for segment in [2, 3] {
            let answer = reads
                .fetch(&data_request(1, segment), Arc::clone(&source))
                .await;
            assert!(
                matches!(answer, Err(FetchError::Unreadable { .. })),
                "{segment}: {answer:?}"
            );
        }
    }
}
