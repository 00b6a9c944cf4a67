//! Recovery's side of the backup: the fence ([`BackupService::fence_master`]) and the
//! RPCs of a master's crash recovery (docs/design.md §6).
//! * `StartRecovery` fences the master's open frames and reports every replica of it
//!   held here, sorted by segment — open frames with their fenced lengths, stored
//!   replicas open or closed, a frame shadowing the stored copy as in lists (unless the
//!   frame has no footer and the stored copy is closed) — with the log digest, and the
//!   successor named by a footer, of each replica that is not closed (the coordinator's
//!   completeness check, docs/design.md §4: every footer found needs its successor, whether
//!   or not its copy was closed).
//! * `RecoveryRead` answers at once and has
//!   [`RecoveryReads`](crate::recovery_reads::RecoveryReads) read the named replicas in order
//!   on a blocking thread, splitting each by partition.
//! * `RecoveryData` hands out one (segment, partition) piece, waits for it, or reads
//!   the replica on demand (a fallback); see
//!   [`RecoveryReads::fetch`](crate::recovery_reads::RecoveryReads::fetch).
//! * `EndRecovery` forgets the master's recovery and frees every replica of it here,
//!   frames first, as `FreeReplica` does (so a close in flight cannot resurrect one).
//!
//! Every recovery read fences the master first if `StartRecovery` did not reach this
//! backup (`RecoverySource`): bytes a still-running master could change are never
//! served to recovery.

use bytes::Bytes;
use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::backup::{
    EndRecoveryReply, EndRecoveryRequest, RecoveryDataRequest, RecoveryReadRequest, ReplicaInfo,
    StartRecoveryReply, StartRecoveryRequest,
};
use rampart_common::rpc::Reply;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::fencing;
use crate::frame_table::ReplicaKey;
use crate::frames::Frames;
use crate::rdma::RdmaTarget;
use crate::recovery_reads::{HeldReplica, ReplicaSource};
use crate::segment_store::StoreError;
use crate::stored::StoreHandle;

use super::held::{read_held, recovery_replicas};
use super::replies::{blocking, store_error_reply};
use super::state::BackupService;

/// The service's replicas as recovery reads them ([`ReplicaSource`]). Fences the
/// master first where that has not been done ([`fencing::fence_before_reading`]): a
/// frame is served to recovery only with its final, fenced length.
#[derive(Debug)]
struct RecoverySource {
    store: Arc<StoreHandle>,
    frames: Arc<Frames>,
    rdma: Arc<RdmaTarget>,
}

impl ReplicaSource for RecoverySource {
    fn read(
        &self,
        master: ServerId,
        segment: SegmentId,
        reuse: Vec<u8>,
    ) -> Result<Option<HeldReplica>, StoreError> {
        let key = (master, segment);
        fencing::fence_frames_before_reading(&self.frames, &self.rdma, key);
        read_held(&self.store, &self.frames, key, reuse)
    }
}

impl BackupService {
    /// Fences every open frame of `master` (recovery of it has begun) and reports each
    /// one with the length of its valid prefix. After this returns, no write to those
    /// frames is acknowledged by any transport, and every write acknowledged before it
    /// lies within the reported lengths (`service` module doc, guarantee 6;
    /// `fencing.rs`). The first fence's lengths are final: later fences, lists and reads
    /// report the same. Idempotent.
    ///
    /// Blocks while it copies and scans the frames (≈ 1–5 ms per 8 MiB frame): call it
    /// on a blocking thread.
    pub fn fence_master(&self, master: ServerId) -> Vec<ReplicaInfo> {
        fencing::fence_frames(&self.frames, &self.rdma, master)
    }

    /// What recovery reads replicas through.
    fn recovery_source(&self) -> Arc<dyn ReplicaSource> {
        Arc::new(RecoverySource {
            store: Arc::clone(&self.store),
            frames: Arc::clone(&self.frames),
            rdma: Arc::clone(&self.rdma),
        })
    }

    /// `StartRecovery`: fence, then report every replica of the master with digests.
    pub(super) async fn start_recovery(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: StartRecoveryRequest = Reply::decode(payload)?;
        let master = request.master;
        let (store, frames, rdma) = (
            Arc::clone(&self.store),
            Arc::clone(&self.frames),
            Arc::clone(&self.rdma),
        );
        let replicas = blocking(move || {
            fencing::fence_frames(&frames, &rdma, master);
            recovery_replicas(&store, &frames, master)
        })
        .await?;
        tracing::info!(%master, replicas = replicas.len(), "recovery started: replicas reported");
        Ok(Reply::ok(&StartRecoveryReply { replicas }))
    }

    /// `RecoveryRead`: schedule the reads, answer at once.
    pub(super) async fn recovery_read(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: RecoveryReadRequest = Reply::decode(payload)?;
        self.recovery
            .start(request, self.recovery_source())
            .map_err(|error| Reply::error(error.status(), error))?;
        Ok(Reply::ok(&()))
    }

    /// `RecoveryData`: one piece, from the cache, after a wait, or read on demand.
    pub(super) async fn recovery_data(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: RecoveryDataRequest = Reply::decode(payload)?;
        let reply = self
            .recovery
            .fetch(&request, self.recovery_source())
            .await
            .map_err(|error| Reply::error(error.status(), error))?;
        Ok(Reply::ok(&reply))
    }

    /// `EndRecovery`: forget the master's recovery, then free every replica of it held
    /// here with the ordering of `free` (frames leave the table before the store step,
    /// so a close in flight either lands first and is deleted, or finds its frame gone).
    pub(super) async fn end_recovery(&self, payload: Bytes) -> Result<Reply, Reply> {
        let request: EndRecoveryRequest = Reply::decode(payload)?;
        let master = request.master;
        self.recovery.end(master);
        // Recovered: the master is fenced here for good (also if `StartRecovery` never
        // reached this backup), and its freed frames keep answering `Fenced`.
        let ended = self.frames.table.lock().end_master(master);
        let (store, frames) = (Arc::clone(&self.store), Arc::clone(&self.frames));
        let releases = ended.releases;
        let (result, stored) = blocking(move || {
            for slot in releases {
                frames.release_slot(slot);
            }
            store.free_master(master)
        })
        .await?;
        result.map_err(store_error_reply)?;
        let freed: BTreeSet<ReplicaKey> = ended.frames.into_iter().chain(stored).collect();
        tracing::info!(%master, freed = freed.len(), "recovery ended: replicas freed");
        Ok(Reply::ok(&EndRecoveryReply {
            freed: u32::try_from(freed.len()).unwrap_or(u32::MAX),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use rampart_common::ids::{Epoch, SegmentId, ServerId, TableId};
    use rampart_common::onesided::nic::NicTarget;
    use rampart_common::onesided::shm::ShmMapping;
    use rampart_common::onesided::FrameWriteError;
    use rampart_common::protocol::backup::{self as proto, RecoveryReplica};
    use rampart_common::status::Status;
    use rampart_common::tablet::HashRange;
    use std::path::Path;
    use tempfile::TempDir;

    #[tokio::test]
    async fn a_fenced_master_cannot_open_new_replicas() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        // Fenced with no open frame here: a backup recovery only asked.
        assert_eq!(service.fence_master(ServerId(7)), vec![]);
        let refused = call::<proto::OpenReplica>(&service, &open_req(7, 1, 1)).await;
        assert_eq!(status(refused), Status::Fenced);
        // Other masters are unaffected.
        open(&service, 8, 1, 1).await;
    }

    #[tokio::test]
    async fn fence_master_reports_acknowledged_writes_and_refuses_every_later_one() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let fenced = open_reply(&service, 1, 1, 1).await;
        let other_segment = open(&service, 1, 2, 1).await;
        let other_master = open(&service, 2, 1, 1).await;
        let (bytes, ends) = segment(1, 1, 2);
        let shm = fenced.shm.clone().expect("shm location");
        let mapping = ShmMapping::open(Path::new(&shm.path)).expect("map");
        mapping
            .write(
                shm.slot_offset,
                shm.slot_capacity,
                fenced.handle,
                0,
                &bytes[..ends[1] as usize],
            )
            .expect("shm write before the fence");
        let infos = service.fence_master(ServerId(1));
        assert_eq!(
            infos,
            vec![info(1, 1, 1, ends[1], false), info(1, 2, 1, 0, false)]
        );
        // Every transport is refused now.
        let late = &bytes[ends[1] as usize..ends[2] as usize];
        assert!(matches!(
            mapping.write(
                shm.slot_offset,
                shm.slot_capacity,
                fenced.handle,
                u64::from(ends[1]),
                late
            ),
            Err(FrameWriteError::Fenced)
        ));
        assert_eq!(
            status(write(&service, fenced.handle, 1, ends[1], late).await),
            Status::Fenced
        );
        assert_eq!(
            service
                .nic_target()
                .place(fenced.handle, Epoch(1), u64::from(ends[1]), late),
            Err(Status::Fenced)
        );
        assert_eq!(
            status(close(&service, fenced.handle, 1, ends[1]).await),
            Status::Fenced
        );
        assert_eq!(
            status(bump(&service, fenced.handle, 1, 2).await),
            Status::Fenced
        );
        for epoch in [1, 2] {
            assert_eq!(
                status(call::<proto::OpenReplica>(&service, &open_req(1, 1, epoch)).await),
                Status::Fenced
            );
        }
        assert_eq!(
            status(write(&service, other_segment, 1, 0, b"x").await),
            Status::Fenced
        );
        // The replica is still listed and readable with what was acknowledged.
        let replica = read(&service, 1, 1).await.expect("read");
        assert_eq!(&replica.bytes[..], &bytes[..ends[1] as usize]);
        // Fencing is idempotent; other masters are unaffected.
        assert_eq!(service.fence_master(ServerId(1)), infos);
        write(&service, other_master, 1, 0, b"fine")
            .await
            .expect("other master");
        // Recovery frees the fenced frames; their slots serve new frames.
        assert!(free(&service, 1, 1).await);
        assert!(free(&service, 1, 2).await);
        open(&service, 3, 1, 1).await;
        open(&service, 3, 2, 1).await;
    }

    /// Guarantee 6 under a race: a writer copies batches through the shared mapping
    /// while the backup fences; every batch acknowledged to the writer lies within the
    /// reported length, and nothing is acknowledged once the fence has returned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fence_master_racing_an_shm_writer_never_loses_an_acknowledged_write() {
        const ROUNDS: u64 = 50;
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let (bytes, ends) = segment(1, 1, 40);
        let mut fenced_mid_stream = 0;
        for round in 0..ROUNDS {
            // Each round a new master: the fence of an earlier round is not in the way.
            let master = round + 1;
            let reply = open_reply(&service, master, 1, 1).await;
            let shm = reply.shm.clone().expect("shm location");
            let mapping = ShmMapping::open(Path::new(&shm.path)).expect("map");
            let shm_write = |from: u32, to: u32| {
                let batch = &bytes[from as usize..to as usize];
                let (at, capacity) = (shm.slot_offset, shm.slot_capacity);
                mapping.write(at, capacity, reply.handle, u64::from(from), batch)
            };
            shm_write(0, ends[0]).expect("the opening");
            let (acked_end, reported) = std::thread::scope(|scope| {
                let writer = scope.spawn(|| {
                    let mut acked_end = ends[0];
                    for pair in ends.windows(2) {
                        match shm_write(pair[0], pair[1]) {
                            Ok(()) => acked_end = pair[1],
                            Err(FrameWriteError::Fenced) => break,
                            Err(error) => panic!("unexpected {error:?}"),
                        }
                    }
                    acked_end
                });
                // Let the writer get going for a while that varies by round.
                for _ in 0..(round * 997) % 20_000 {
                    std::hint::spin_loop();
                }
                let infos = service.fence_master(ServerId(master));
                (writer.join().expect("writer"), infos[0].length)
            });
            assert!(
                reported >= acked_end,
                "round {round}: batches acknowledged up to {acked_end}, fence reported {reported}"
            );
            assert!(ends.contains(&reported), "round {round}: {reported}");
            assert!(matches!(
                shm_write(0, ends[0]),
                Err(FrameWriteError::Fenced)
            ));
            let held = read(&service, master, 1).await.expect("read");
            assert_eq!(held.info.length, reported);
            assert_eq!(&held.bytes[..], &bytes[..reported as usize]);
            if acked_end < *ends.last().expect("batches") {
                fenced_mid_stream += 1;
            }
            assert!(free(&service, master, 1).await);
        }
        eprintln!("{fenced_mid_stream} of {ROUNDS} fences landed mid-stream");
    }

    #[tokio::test]
    async fn a_zombie_masters_frames_freed_by_end_recovery_keep_answering_fenced() {
        // Master 7's recovery fenced its frame here and, once done, freed it. The master,
        // still running somewhere (a zombie), writes late: it must hear Fenced — by every
        // path — never UnknownFrame, which it would take for an ordinary lost replica.
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (head, _, _) = recovery_segment(7, 1, &[1], false);
        let fenced = write_open(&service, 7, 1, &head).await;
        start_recovery(&service, 7).await;
        // A frame of master 8 that this backup never fenced: its recovery ended without
        // `StartRecovery` reaching here.
        let unfenced = write_open(&service, 8, 1, &head).await;
        assert_eq!(end_recovery(&service, 7).await, 1);
        assert_eq!(end_recovery(&service, 8).await, 1);
        for handle in [fenced, unfenced] {
            let late = write(&service, handle, 1, head.len() as u32, b"late").await;
            assert_eq!(status(late), Status::Fenced, "write to {handle}");
            assert_eq!(
                status(close(&service, handle, 1, head.len() as u32).await),
                Status::Fenced
            );
            assert_eq!(status(bump(&service, handle, 1, 2).await), Status::Fenced);
            let placed = service.nic_target().place(handle, Epoch(1), 0, b"late");
            assert_eq!(placed, Err(Status::Fenced), "soft-NIC write to {handle}");
        }
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(8, 2, 1)).await),
            Status::Fenced
        );
        // A handle that never was a fenced frame is still merely unknown.
        let other = write_open(&service, 9, 1, &head).await;
        free(&service, 9, 1).await;
        assert_eq!(
            status(write(&service, other, 1, 0, b"x").await),
            Status::UnknownFrame
        );
    }

    #[tokio::test]
    async fn start_recovery_fences_and_reports_closed_and_open_replicas_with_digests() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (closed, _, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &closed).await;
        let (head, _, _) = recovery_segment(1, 2, &[1, 2], false);
        let handle = write_open(&service, 1, 2, &head).await;
        let other_master = write_open(&service, 2, 1, b"").await;

        let replicas = start_recovery(&service, 1).await;
        assert_eq!(
            replicas,
            vec![
                RecoveryReplica {
                    info: info(1, 1, 1, closed.len() as u32, true),
                    digest: None,
                    successor: None,
                },
                RecoveryReplica {
                    info: info(1, 2, 1, head.len() as u32, false),
                    digest: Some(vec![SegmentId(1), SegmentId(2)]),
                    successor: None,
                },
            ]
        );
        // Fenced: a later write to the open frame is refused, and so is a new replica.
        assert_eq!(
            status(write(&service, handle, 1, head.len() as u32, b"late").await),
            Status::Fenced
        );
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(1, 3, 1)).await),
            Status::Fenced
        );
        write(&service, other_master, 1, 0, b"fine")
            .await
            .expect("another master is not fenced");
        // Idempotent.
        assert_eq!(start_recovery(&service, 1).await, replicas);
    }

    #[tokio::test]
    async fn recovery_read_then_recovery_data_returns_each_partitions_entries_once() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (first, first_logged, first_safe) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &first).await;
        let (head, head_logged, head_safe) = recovery_segment(1, 2, &[1, 2], false);
        write_open(&service, 1, 2, &head).await;
        start_recovery(&service, 1).await;

        recovery_read(&service, 1, 7, &[2, 1], partitions())
            .await
            .expect("recovery read");
        // Asked in the backup's read order, as recovery masters do.
        for (segment, logged, safe, epoch) in [
            (2, &head_logged, head_safe, 1),
            (1, &first_logged, first_safe, 1),
        ] {
            for partition in 0..2 {
                let reply = recovery_data(&service, 1, 7, segment, partition, vec![])
                    .await
                    .expect("piece");
                let want = expected(logged, partition);
                assert!(!want.is_empty(), "the test covers every partition");
                assert_eq!(decode_piece(&reply), want, "{segment}/{partition}");
                assert_eq!((reply.safe_version, reply.epoch), (safe, Epoch(epoch)));
            }
        }
        assert_eq!(service.recovery.pieces_bytes(), 0, "every piece handed out");
        // Handed out once: a repeat re-reads the replica and cuts out the given ranges.
        let again = recovery_data(&service, 1, 7, 1, 1, partitions()[1].clone())
            .await
            .expect("re-read");
        assert_eq!(decode_piece(&again), expected(&first_logged, 1));
        assert_eq!(
            status(recovery_data(&service, 1, 7, 1, 2, vec![]).await),
            Status::InvalidArgument,
            "no partition 2"
        );
    }

    #[tokio::test]
    async fn recovery_data_for_an_unscheduled_segment_reads_it_and_cuts_out_the_ranges() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (bytes, logged, safe) = recovery_segment(3, 4, &[4], true);
        store_closed(&service, 3, 4, &bytes).await;
        // No StartRecovery, no RecoveryRead here: a fallback for a failed backup.
        for partition in 0..2u32 {
            let ranges = partitions()[partition as usize].clone();
            let reply = recovery_data(&service, 3, 1, 4, partition, ranges)
                .await
                .expect("on demand");
            assert_eq!(decode_piece(&reply), expected(&logged, partition));
            assert_eq!(reply.safe_version, safe);
        }
        assert_eq!(service.recovery.pieces_bytes(), 0, "nothing cached");
        // The read fenced the master.
        assert_eq!(
            status(call::<proto::OpenReplica>(&service, &open_req(3, 9, 1)).await),
            Status::Fenced
        );
        assert_eq!(
            status(recovery_data(&service, 3, 1, 5, 0, partitions()[0].clone()).await),
            Status::ObjectDoesntExist
        );
        let overlapping = vec![
            HashRange::new(TableId(1), 0, 10),
            HashRange::new(TableId(1), 5, 20),
        ];
        assert_eq!(
            status(recovery_data(&service, 3, 1, 4, 0, overlapping).await),
            Status::InvalidArgument
        );
    }

    #[tokio::test]
    async fn recovery_data_of_a_corrupt_stored_replica_is_internal() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 1);
        let (bytes, _, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &bytes).await;
        // Another frame takes the only slot: the replica is read from the disk.
        open(&service, 2, 1, 1).await;
        let path = dir.path().join("replicas").join("m1-s1.replica");
        let mut image = std::fs::read(&path).expect("read file");
        let middle = image.len() / 2;
        image[middle] ^= 0xFF;
        std::fs::write(&path, image).expect("corrupt");

        recovery_read(&service, 1, 1, &[1], partitions())
            .await
            .expect("recovery read");
        let (code, detail) = recovery_data(&service, 1, 1, 1, 0, vec![])
            .await
            .expect_err("corrupt");
        assert_eq!(code, Status::Internal);
        assert!(detail.contains("checksum"), "{detail}");
        // Every partition of it gets the same answer.
        assert_eq!(
            status(recovery_data(&service, 1, 1, 1, 1, vec![]).await),
            Status::Internal
        );
        // It was quarantined: no longer held.
        assert_eq!(list(&service, Some(1)).await, vec![]);
    }

    #[tokio::test]
    async fn end_recovery_frees_every_replica_and_is_idempotent() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 2);
        let (first, _, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &first).await;
        let (head, _, _) = recovery_segment(1, 2, &[1, 2], false);
        write_open(&service, 1, 2, &head).await;
        let (other, _, _) = recovery_segment(2, 1, &[1], true);
        store_closed(&service, 2, 1, &other).await;
        start_recovery(&service, 1).await;
        recovery_read(&service, 1, 1, &[1, 2], partitions())
            .await
            .expect("recovery read");
        recovery_data(&service, 1, 1, 1, 0, vec![])
            .await
            .expect("a piece, so the reader has run");

        assert_eq!(end_recovery(&service, 1).await, 2);
        assert_eq!(list(&service, Some(1)).await, vec![]);
        assert_eq!(service.recovery.pieces_bytes(), 0);
        assert_eq!(service.recovery.current(ServerId(1)), None);
        assert_eq!(end_recovery(&service, 1).await, 0);
        // Another master's replica stays; the freed frame's slot serves a new frame.
        assert_eq!(list(&service, Some(2)).await.len(), 1);
        open(&service, 3, 1, 1).await;
        open(&service, 3, 2, 1).await;
        // Nothing of master 1 is left to read.
        assert_eq!(
            status(recovery_data(&service, 1, 1, 1, 0, partitions()[0].clone()).await),
            Status::ObjectDoesntExist
        );
        // After a restart too.
        drop(service);
        let service = open_service(&dir, 2);
        assert_eq!(list(&service, Some(1)).await, vec![]);
    }

    #[tokio::test]
    async fn a_newer_recovery_replaces_an_older_one_and_drops_its_pieces() {
        let dir = TempDir::new().expect("tempdir");
        let service = open_service(&dir, 4);
        let (first, first_logged, _) = recovery_segment(1, 1, &[1], true);
        store_closed(&service, 1, 1, &first).await;
        let (second, second_logged, _) = recovery_segment(1, 2, &[1, 2], true);
        store_closed(&service, 1, 2, &second).await;
        start_recovery(&service, 1).await;

        // Attempt 1: everything in one partition. Let it read both segments.
        let everything = vec![vec![
            HashRange::whole(TableId(1)),
            HashRange::whole(TableId(2)),
        ]];
        recovery_read(&service, 1, 1, &[1, 2], everything.clone())
            .await
            .expect("attempt 1");
        recovery_data(&service, 1, 1, 1, 0, vec![])
            .await
            .expect("attempt 1 read segment 1");
        // Attempt 2 splits in two; attempt 1's unfetched pieces are dropped.
        recovery_read(&service, 1, 2, &[1, 2], partitions())
            .await
            .expect("attempt 2");
        assert_eq!(service.recovery.current(ServerId(1)), Some(2));
        for (segment, logged) in [(1, &first_logged), (2, &second_logged)] {
            for partition in 0..2 {
                let reply = recovery_data(&service, 1, 2, segment, partition, vec![])
                    .await
                    .expect("attempt 2 piece");
                assert_eq!(decode_piece(&reply), expected(logged, partition));
            }
        }
        assert_eq!(
            service.recovery.pieces_bytes(),
            0,
            "attempt 1's pieces are gone"
        );
        // Attempt 1 is stale; its late requests are served on demand with their ranges.
        assert_eq!(
            status(recovery_read(&service, 1, 1, &[1, 2], everything.clone()).await),
            Status::InvalidArgument
        );
        let late = recovery_data(&service, 1, 1, 2, 0, everything[0].clone())
            .await
            .expect("on demand");
        let all: Vec<Logged> = second_logged
            .iter()
            .filter(|(_, table, _, _)| table.0 <= 2)
            .cloned()
            .collect();
        assert_eq!(decode_piece(&late), all);
        assert_eq!(service.recovery.pieces_bytes(), 0);
    }
}
