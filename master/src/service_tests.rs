//! Tests of [`MasterService`](crate::service::MasterService) through its RPC entry
//! point, [`Service::handle`]: requests are encoded as a client would send them and
//! replies decoded from their payload bytes, with no sockets in between.

// A failed unwrap is a failed test, with its location: exactly what a test wants.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, Bytes, BytesMut};
use rampart_common::config::MasterConfig;
use rampart_common::ids::{Epoch, ServerId, TableId, TabletEpoch, Version};
use rampart_common::limits::{KEY_BYTES_MAX, MULTI_OPS_MAX};
use rampart_common::protocol::master::{
    DropTablets, Enumerate, EnumerateRequest, Increment, IncrementRequest, MultiRead,
    MultiReadRequest, MultiRemove, MultiRemoveRequest, MultiWrite, MultiWriteRequest, ObjectKey,
    Ping, PingRequest, Read, ReadRequest, Remove, RemoveRequest, SyncTablets, SyncTabletsRequest,
    TabletsRequest, TakeTablets, Write, WriteRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::{Opcode, Reply, Rpc, Service, WireMessage};
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, Tablet};

use crate::object_store::ReadResult;
use crate::service::MasterService;

const TABLE: TableId = TableId(1);

/// A master of 8 × 128 KiB segments (must run inside a tokio runtime).
fn service() -> MasterService {
    let config = MasterConfig {
        segment_bytes: 128 * 1024,
        memory_bytes: 1024 * 1024,
        value_bytes_max: 1024,
        ..Default::default()
    };
    MasterService::new(ServerId(1), config)
}

/// The next numbered change of `service`'s tablets: take (or drop) the whole table.
fn whole_table(service: &MasterService) -> TabletsRequest {
    TabletsRequest {
        owner: service.id(),
        epoch: service.tablet_sync().applied().next(),
        tablets: vec![Tablet {
            table: TABLE,
            start_hash: 0,
            end_hash: u64::MAX,
            owner: ServerId(1),
        }],
    }
}

fn encode<M: WireMessage>(message: &M) -> Bytes {
    let mut out = BytesMut::new();
    message.encode(&mut out);
    out.freeze()
}

/// Sends `request` as RPC `R` and returns the raw reply.
async fn send<R: Rpc>(service: &MasterService, request: &R::Request) -> Reply {
    service.handle(R::OPCODE, encode(request)).await
}

/// Sends `request` as RPC `R`, expects a successful frame and decodes its payload.
async fn call<R: Rpc>(service: &MasterService, request: &R::Request) -> R::Reply {
    let reply = send::<R>(service, request).await;
    assert_eq!(
        reply.status(),
        Status::Ok,
        "{} failed: {reply:?}",
        R::OPCODE
    );
    R::Reply::decode(Bytes::copy_from_slice(reply.payload())).unwrap()
}

fn write_request(key: &str, value: &str) -> WriteRequest {
    WriteRequest {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        rules: RejectRules::default(),
        rifl: rampart_common::rifl::Rifl::NONE,
    }
}

fn read_request(key: &str) -> ReadRequest {
    ReadRequest {
        table: TABLE,
        key: Bytes::copy_from_slice(key.as_bytes()),
    }
}

/// Checks that the service still serves a full write/read round trip.
async fn assert_still_serving(service: &MasterService, key: &str) {
    let written = call::<Write>(service, &write_request(key, "alive")).await;
    assert_eq!(written.status, Status::Ok);
    let read = call::<Read>(service, &read_request(key)).await;
    assert_eq!((read.status, read.version), (Status::Ok, written.version));
    assert_eq!(&read.value[..], b"alive");
}

#[tokio::test]
async fn unknown_opcode_is_answered_unknown_opcode() {
    let service = service();
    call::<TakeTablets>(&service, &whole_table(&service)).await;
    for opcode in [Opcode(0), Opcode(77), Opcode(100), Opcode(0x7fff)] {
        let reply = service
            .handle(opcode, Bytes::from_static(b"whatever"))
            .await;
        assert_eq!(reply.status(), Status::UnknownOpcode, "{opcode}");
    }
    assert_still_serving(&service, "k").await;
}

#[tokio::test]
async fn garbage_payloads_are_malformed_request() {
    let service = service();
    call::<TakeTablets>(&service, &whole_table(&service)).await;
    let garbage: [&[u8]; 3] = [b"", b"\xff\xff\xff", &[0xff; 64]];
    let opcodes = [
        Read::OPCODE,
        Write::OPCODE,
        Remove::OPCODE,
        Increment::OPCODE,
        MultiRead::OPCODE,
        MultiWrite::OPCODE,
        MultiRemove::OPCODE,
        Enumerate::OPCODE,
        TakeTablets::OPCODE,
        DropTablets::OPCODE,
    ];
    for opcode in opcodes {
        for payload in garbage {
            let reply = service
                .handle(opcode, Bytes::copy_from_slice(payload))
                .await;
            assert_eq!(
                reply.status(),
                Status::MalformedRequest,
                "{opcode} with {} garbage bytes",
                payload.len()
            );
        }
    }
    // Valid encodings cut short.
    let read = encode(&read_request("some key"));
    let write = encode(&write_request("some key", "value"));
    let multi = encode(&MultiWriteRequest {
        objects: vec![write_request("a", "1"), write_request("b", "2")],
    });
    for (opcode, whole, cut) in [
        (Read::OPCODE, &read, read.len() - 1),
        (Write::OPCODE, &write, 16),
        (MultiWrite::OPCODE, &multi, multi.len() - 3),
    ] {
        let reply = service.handle(opcode, whole.slice(..cut)).await;
        assert_eq!(
            reply.status(),
            Status::MalformedRequest,
            "{opcode} cut at {cut}"
        );
    }
    // A multi-write claiming 2^60 objects must be refused without allocating them.
    let mut hostile = BytesMut::new();
    hostile.put_u64_le(1 << 60);
    let reply = service.handle(MultiWrite::OPCODE, hostile.freeze()).await;
    assert_eq!(reply.status(), Status::MalformedRequest);

    assert_eq!(
        service.store().lock().object_count(),
        0,
        "nothing was written"
    );
    assert_still_serving(&service, "k").await;
}

#[tokio::test]
async fn multi_ops_over_the_limit_are_invalid_argument() {
    let service = service();
    call::<TakeTablets>(&service, &whole_table(&service)).await;
    let writes = MultiWriteRequest {
        objects: (0..=MULTI_OPS_MAX)
            .map(|i| write_request(&format!("key-{i}"), "v"))
            .collect(),
    };
    let reply = send::<MultiWrite>(&service, &writes).await;
    assert_eq!(reply.status(), Status::InvalidArgument);
    assert_eq!(
        service.store().lock().object_count(),
        0,
        "none of it was applied"
    );

    let keys: Vec<ObjectKey> = (0..=MULTI_OPS_MAX)
        .map(|i| ObjectKey {
            table: TABLE,
            key: Bytes::from(format!("key-{i}")),
        })
        .collect();
    let reply = send::<MultiRead>(&service, &MultiReadRequest { objects: keys }).await;
    assert_eq!(reply.status(), Status::InvalidArgument);
    let removes = MultiRemoveRequest {
        objects: (0..=MULTI_OPS_MAX)
            .map(|i| RemoveRequest {
                table: TABLE,
                key: Bytes::from(format!("key-{i}")),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            })
            .collect(),
    };
    let reply = send::<MultiRemove>(&service, &removes).await;
    assert_eq!(reply.status(), Status::InvalidArgument);

    // Exactly at the limit is served, and the service keeps answering.
    let at_limit = MultiWriteRequest {
        objects: writes.objects[..MULTI_OPS_MAX].to_vec(),
    };
    let replies = call::<MultiWrite>(&service, &at_limit).await;
    assert_eq!(replies.objects.len(), MULTI_OPS_MAX);
    assert!(replies.objects.iter().all(|r| r.status == Status::Ok));
    assert_eq!(service.store().lock().object_count(), MULTI_OPS_MAX as u64);
    assert_still_serving(&service, "k").await;
}

#[tokio::test]
async fn take_tablets_then_write_and_read_round_trip() {
    let service = service();
    // Before the coordinator hands over the tablet, the master refuses its keys.
    let refused = call::<Write>(&service, &write_request("k", "v")).await;
    assert_eq!(refused.status, Status::UnknownTablet);
    let refused = call::<Read>(&service, &read_request("k")).await;
    assert_eq!(refused.status, Status::UnknownTablet);

    call::<TakeTablets>(&service, &whole_table(&service)).await;
    let first = call::<Write>(&service, &write_request("k", "one")).await;
    assert_eq!((first.status, first.version), (Status::Ok, Version::FIRST));
    let second = call::<Write>(&service, &write_request("k", "two")).await;
    assert_eq!(
        (second.status, second.version),
        (Status::Ok, first.version.next())
    );
    let read = call::<Read>(&service, &read_request("k")).await;
    assert_eq!((read.status, read.version), (Status::Ok, second.version));
    assert_eq!(&read.value[..], b"two");

    // A rejected write reports the current version.
    let create = WriteRequest {
        rules: RejectRules::create_only(),
        ..write_request("k", "three")
    };
    let rejected = call::<Write>(&service, &create).await;
    assert_eq!(
        (rejected.status, rejected.version),
        (Status::ObjectExists, second.version)
    );

    // Per-object failures travel inside an Ok frame.
    let missing = call::<Read>(&service, &read_request("missing")).await;
    assert_eq!(missing.status, Status::ObjectDoesntExist);
    let too_large = WriteRequest {
        key: Bytes::from(vec![b'k'; KEY_BYTES_MAX + 1]),
        ..write_request("", "v")
    };
    assert_eq!(
        call::<Write>(&service, &too_large).await.status,
        Status::KeyTooLarge
    );

    let incremented = call::<Increment>(
        &service,
        &IncrementRequest {
            table: TABLE,
            key: Bytes::from_static(b"n"),
            delta: 41,
            rules: RejectRules::default(),
            rifl: rampart_common::rifl::Rifl::NONE,
        },
    )
    .await;
    assert_eq!((incremented.status, incremented.value), (Status::Ok, 41));
    let read = call::<Read>(&service, &read_request("n")).await;
    assert_eq!(&read.value[..], &41i64.to_le_bytes());

    let page = call::<Enumerate>(
        &service,
        &EnumerateRequest {
            table: TABLE,
            resume_hash: 0,
            end_hash: u64::MAX,
            max_bytes: 1 << 20,
        },
    )
    .await;
    assert_eq!(page.objects.len(), 2);
    assert_eq!(page.next_hash, None);

    let removed = call::<Remove>(
        &service,
        &RemoveRequest {
            table: TABLE,
            key: Bytes::from_static(b"k"),
            rules: RejectRules::default(),
            rifl: rampart_common::rifl::Rifl::NONE,
        },
    )
    .await;
    assert_eq!(
        (removed.status, removed.version),
        (Status::Ok, second.version)
    );
    let read = call::<Read>(&service, &read_request("k")).await;
    assert_eq!(read.status, Status::ObjectDoesntExist);
}

#[tokio::test]
async fn ping_reports_the_object_count() {
    let service = service();
    let ping = call::<Ping>(&service, &PingRequest {}).await;
    assert_eq!(ping.objects, 0);
    assert_eq!(ping.log_bytes_max, 1024 * 1024);
    assert!(ping.log_bytes_used > 0 && ping.log_bytes_used <= ping.log_bytes_max);

    call::<TakeTablets>(&service, &whole_table(&service)).await;
    let batch = MultiWriteRequest {
        objects: (0..25)
            .map(|i| write_request(&format!("key-{i}"), "v"))
            .collect(),
    };
    let replies = call::<MultiWrite>(&service, &batch).await;
    assert!(replies.objects.iter().all(|r| r.status == Status::Ok));
    // Overwrites do not add objects.
    call::<Write>(&service, &write_request("key-0", "again")).await;
    assert_eq!(call::<Ping>(&service, &PingRequest {}).await.objects, 25);

    let keys = MultiRemoveRequest {
        objects: (0..5)
            .map(|i| RemoveRequest {
                table: TABLE,
                key: Bytes::from(format!("key-{i}")),
                rules: RejectRules::default(),
                rifl: rampart_common::rifl::Rifl::NONE,
            })
            .collect(),
    };
    call::<MultiRemove>(&service, &keys).await;
    assert_eq!(call::<Ping>(&service, &PingRequest {}).await.objects, 20);

    call::<DropTablets>(&service, &whole_table(&service)).await;
    assert_eq!(call::<Ping>(&service, &PingRequest {}).await.objects, 0);
}

#[tokio::test]
async fn tablets_meant_for_another_server_are_refused_and_nothing_is_taken() {
    // A server restarted at the address of server 7 (which crashed) is server 1 here: the
    // coordinator, or a stale push, sends it 7's tablets.
    let service = service();
    let mut request = whole_table(&service);
    request.owner = ServerId(7);
    for tablet in &mut request.tablets {
        tablet.owner = ServerId(7);
    }
    let reply = send::<TakeTablets>(&service, &request).await;
    assert_eq!(reply.status(), Status::WrongServer);
    let sync = SyncTabletsRequest {
        owner: ServerId(7),
        epoch: TabletEpoch(1),
    };
    assert_eq!(
        send::<SyncTablets>(&service, &sync).await.status(),
        Status::WrongServer
    );
    // Addressed to this server, but naming another's tablet: refused too.
    let mut request = whole_table(&service);
    request.tablets[0].owner = ServerId(7);
    assert_eq!(
        send::<TakeTablets>(&service, &request).await.status(),
        Status::InvalidArgument
    );
    let read = call::<Read>(&service, &read_request("k")).await;
    assert_eq!(read.status, Status::UnknownTablet, "nothing was taken");
    assert_eq!(service.tablet_sync().applied(), TabletEpoch(0));
}

#[tokio::test]
async fn numbered_changes_apply_in_order_and_a_late_one_changes_nothing() {
    let service = service();
    let take = whole_table(&service);
    call::<TakeTablets>(&service, &take).await;
    assert_eq!(service.tablet_sync().applied(), TabletEpoch(1));
    call::<Write>(&service, &write_request("k", "v")).await;
    // The same push again (a retried create): held already, the object stays.
    call::<TakeTablets>(&service, &take).await;
    assert_eq!(
        call::<Read>(&service, &read_request("k")).await.status,
        Status::Ok
    );
    // The drop of change 2, then the take of change 1 arriving late: not re-taken.
    call::<DropTablets>(&service, &whole_table(&service)).await;
    assert_eq!(service.tablet_sync().applied(), TabletEpoch(2));
    call::<TakeTablets>(&service, &take).await;
    let read = call::<Read>(&service, &read_request("k")).await;
    assert_eq!(
        read.status,
        Status::UnknownTablet,
        "a late push resurrected a dropped table"
    );
}

#[tokio::test]
async fn a_change_after_a_missed_one_is_not_applied_without_a_pull() {
    // Without coordinators the master cannot pull its set: the push is refused with
    // Retry, and nothing is taken (applying change 3 on top of 1 would skip change 2).
    let service = service();
    call::<TakeTablets>(&service, &whole_table(&service)).await;
    let mut gap = whole_table(&service);
    gap.epoch = TabletEpoch(3);
    gap.tablets[0].table = TableId(2);
    assert_eq!(
        send::<TakeTablets>(&service, &gap).await.status(),
        Status::Retry
    );
    assert_eq!(service.tablet_sync().applied(), TabletEpoch(1));
    let other = ReadRequest {
        table: TableId(2),
        key: Bytes::from_static(b"k"),
    };
    assert_eq!(
        call::<Read>(&service, &other).await.status,
        Status::UnknownTablet
    );
}

#[test]
fn a_ping_is_answered_while_the_store_is_held() {
    // A long store job (a moved range forgotten) must not make the master look dead.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the test");
    let _guard = runtime.enter();
    let service = std::sync::Arc::new(service());
    let store = std::sync::Arc::clone(service.store());
    let (held, hold) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let _store = store.lock();
        held.send(()).expect("the test waits for the hold");
        std::thread::sleep(std::time::Duration::from_secs(2));
    });
    hold.recv().expect("the holder thread holds the store");
    let started = std::time::Instant::now();
    let reply = service
        .handle_now(
            rampart_common::protocol::master::Ping::OPCODE,
            &Bytes::new(),
        )
        .expect("answered at once");
    assert_eq!(reply.status(), Status::Ok);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "the ping waited for the store"
    );
    holder.join().expect("the holder thread ends");
}

// ---- Recover and AbandonRecovery, against fake backups on loopback ----

mod recovery {
    use super::*;
    use parking_lot::Mutex;
    use rampart_common::ids::SegmentId;
    use rampart_common::log::{object_entry_bytes, tombstone_entry_bytes, SegmentWriter};
    use rampart_common::onesided::shm::{RecoveryRegion, SealedSlot};
    use rampart_common::protocol::backup::{
        RecoveryData, RecoveryDataReply, RecoveryDataRequest, SharedPiece, SharedRun,
    };
    use rampart_common::protocol::master::{
        AbandonRecovery, AbandonRecoveryRequest, FinishRecovery, FinishRecoveryRequest, Recover,
        RecoverReply, RecoverRequest, RecoverySource,
    };
    use rampart_common::rpc::server::HandleFuture;
    use rampart_common::rpc::RpcServer;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    const CRASHED: ServerId = ServerId(9);
    const RECOVERED: TableId = TableId(7);

    fn ranges() -> Vec<HashRange> {
        vec![HashRange::whole(RECOVERED)]
    }

    /// One entry of a crashed master's log.
    enum E {
        Obj(&'static str, u64, &'static str),
        Tomb(&'static str, u64),
    }

    /// A backup's answer carrying `entries` in the log's format, with floor `safe`.
    fn piece(entries: &[E], safe: u64) -> RecoveryDataReply {
        let mut writer =
            SegmentWriter::open(CRASHED, SegmentId(1), 1 << 20, &[SegmentId(1)]).unwrap();
        let mut out = BytesMut::new();
        for entry in entries {
            let (offset, len) = match entry {
                E::Obj(key, version, value) => (
                    writer
                        .append_object(
                            RECOVERED,
                            Version(*version),
                            key.as_bytes(),
                            value.as_bytes(),
                        )
                        .unwrap(),
                    object_entry_bytes(key.len(), value.len()),
                ),
                E::Tomb(key, version) => (
                    writer
                        .append_tombstone(
                            RECOVERED,
                            Version(*version),
                            SegmentId(1),
                            key.as_bytes(),
                        )
                        .unwrap(),
                    tombstone_entry_bytes(key.len()),
                ),
            };
            let offset = offset as usize;
            out.extend_from_slice(&writer.bytes()[offset..offset + len]);
        }
        RecoveryDataReply {
            epoch: Epoch(1),
            safe_version: Version(safe),
            entries: out.freeze(),
            count: entries.len() as u32,
            shared: None,
        }
    }

    /// How a fake backup answers `RecoveryData` for one segment.
    #[derive(Clone, Debug)]
    enum Answer {
        Serve(RecoveryDataReply),
        Fail(Status),
        /// `Retry` this many more times, then serve.
        RetryThenServe(u32, RecoveryDataReply),
        /// To an asker naming a host, this place in shared memory (`entries` empty);
        /// to one naming none, the reply.
        Shared(SharedPiece, RecoveryDataReply),
    }

    /// A backup that answers only `RecoveryData`, from a table of answers; a segment
    /// not in it is `ObjectDoesntExist`.
    #[derive(Debug, Default)]
    struct FakeBackup {
        answers: Mutex<HashMap<SegmentId, Answer>>,
        calls: AtomicU32,
    }

    impl FakeBackup {
        fn answer(&self, request: RecoveryDataRequest) -> Reply {
            self.calls.fetch_add(1, Ordering::Relaxed);
            assert_eq!((request.master, request.ranges), (CRASHED, ranges()));
            let mut answers = self.answers.lock();
            match answers.get_mut(&request.segment) {
                None => Reply::error(Status::ObjectDoesntExist, "replica not held"),
                Some(Answer::Serve(reply)) => Reply::ok(&*reply),
                Some(Answer::Fail(status)) => Reply::error(*status, "fake failure"),
                Some(Answer::RetryThenServe(0, reply)) => Reply::ok(&*reply),
                Some(Answer::RetryThenServe(left, _)) => {
                    *left -= 1;
                    Reply::error(Status::Retry, "still reading")
                }
                Some(Answer::Shared(shared, reply)) => match request.shared_host {
                    Some(_) => Reply::ok(&RecoveryDataReply {
                        entries: Bytes::new(),
                        shared: Some(shared.clone()),
                        ..reply.clone()
                    }),
                    None => Reply::ok(&*reply),
                },
            }
        }
    }

    impl Service for FakeBackup {
        fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
            Box::pin(async move {
                if opcode != RecoveryData::OPCODE {
                    return Reply::error(Status::UnknownOpcode, "fake backup");
                }
                match Reply::decode::<RecoveryDataRequest>(payload) {
                    Ok(request) => self.answer(request),
                    Err(reply) => reply,
                }
            })
        }
    }

    /// Serves `answers` on a fresh loopback port until the test ends.
    async fn backup(answers: &[(u64, Answer)]) -> (String, Arc<FakeBackup>) {
        let fake = Arc::new(FakeBackup::default());
        fake.answers.lock().extend(
            answers
                .iter()
                .map(|(segment, answer)| (SegmentId(*segment), answer.clone())),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(RpcServer::run(
            listener,
            Arc::clone(&fake),
            std::future::pending(),
        ));
        (addr, fake)
    }

    /// An address where nothing listens.
    async fn dead_addr() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().to_string()
    }

    fn request(segments: &[(u64, &[&str])]) -> RecoverRequest {
        RecoverRequest {
            crashed: CRASHED,
            recovery: 1,
            partition: 0,
            ranges: ranges(),
            segments: segments
                .iter()
                .map(|(segment, backups)| RecoverySource {
                    segment: SegmentId(*segment),
                    backups: backups.iter().map(|b| b.to_string()).collect(),
                })
                .collect(),
            version_floor: 0,
        }
    }

    fn recovered_tablets(service: &MasterService) -> TabletsRequest {
        TabletsRequest {
            owner: service.id(),
            epoch: service.tablet_sync().applied().next(),
            tablets: vec![Tablet {
                table: RECOVERED,
                start_hash: 0,
                end_hash: u64::MAX,
                owner: ServerId(1),
            }],
        }
    }

    fn read(service: &MasterService, key: &str) -> (Status, Version, Vec<u8>) {
        let reply = service.store().lock().read(RECOVERED, key.as_bytes());
        (reply.status(), reply.version(), reply.value().to_vec())
    }

    /// The crashed master's log over three segments: `a` overwritten, `b` deleted, `c`
    /// untouched, `d` deleted and re-created; floor 50 in the last segment.
    fn three_segments() -> Vec<(u64, RecoveryDataReply)> {
        vec![
            (
                1,
                piece(
                    &[
                        E::Obj("a", 1, "a1"),
                        E::Obj("b", 2, "b2"),
                        E::Obj("d", 3, "d3"),
                    ],
                    1,
                ),
            ),
            (
                2,
                piece(&[E::Obj("a", 4, "a4"), E::Tomb("b", 2), E::Tomb("d", 3)], 4),
            ),
            (3, piece(&[E::Obj("c", 5, "c5"), E::Obj("d", 6, "d6")], 50)),
        ]
    }

    fn serve_all(segments: &[(u64, RecoveryDataReply)]) -> Vec<(u64, Answer)> {
        segments
            .iter()
            .map(|(id, reply)| (*id, Answer::Serve(reply.clone())))
            .collect()
    }

    fn assert_three_segments_recovered(service: &MasterService) {
        assert_eq!(read(service, "a"), (Status::Ok, Version(4), b"a4".to_vec()));
        assert_eq!(read(service, "b").0, Status::ObjectDoesntExist);
        assert_eq!(read(service, "c"), (Status::Ok, Version(5), b"c5".to_vec()));
        assert_eq!(read(service, "d"), (Status::Ok, Version(6), b"d6".to_vec()));
    }

    #[tokio::test]
    async fn recover_replays_every_segment_and_take_tablets_makes_it_readable() {
        let service = service();
        call::<TakeTablets>(&service, &whole_table(&service)).await;
        let segments = three_segments();
        let (addr, fake) = backup(&serve_all(&segments)).await;
        let reply: RecoverReply = call::<Recover>(
            &service,
            &request(&[(1, &[&addr]), (2, &[&addr]), (3, &[&addr])]),
        )
        .await;
        assert_eq!(fake.calls.load(Ordering::Relaxed), 3);
        assert_eq!(reply.entries_received, 8);
        assert_eq!(reply.objects, 3, "a, c and d");
        assert!(reply.tombstones >= 1, "b's tombstone is kept");
        assert_eq!(reply.fallbacks, 0);
        assert!(reply.bytes > 0);
        // Replicated and indexed, but not served before TakeTablets.
        assert_eq!(read(&service, "a").0, Status::UnknownTablet);
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
        // Versions keep increasing: b, deleted on the crashed master, comes back newer
        // than the floor it had.
        let written = call::<Write>(
            &service,
            &WriteRequest {
                table: RECOVERED,
                ..write_request("b", "again")
            },
        )
        .await;
        assert_eq!(written.status, Status::Ok);
        assert!(written.version >= Version(50), "{}", written.version);
        // The master's own table still works.
        assert_still_serving(&service, "own").await;
    }

    #[tokio::test]
    async fn a_recovery_ends_a_move_into_its_ranges_and_replays_without_its_copy() {
        // A move from the crashed master into this one left a copy here (its EndMove
        // lost): `b`, which the crashed master deleted later, its tombstone since
        // cleaned out of its log. The recovery must not take the copy with the range.
        let service = service();
        call::<TakeTablets>(&service, &whole_table(&service)).await;
        {
            let mut store = service.store().lock();
            store
                .begin_move_in(rampart_common::ids::MoveId(1), HashRange::whole(RECOVERED))
                .unwrap();
            let stale = crate::replay::PieceEntry::Object {
                table: RECOVERED,
                hash: rampart_common::ids::key_hash(b"b"),
                version: Version(2),
                key: Bytes::from_static(b"b"),
                value: Bytes::from_static(b"b2"),
            };
            let piece =
                crate::replay::RecoveryPiece::from_entries(SegmentId(0), Version(0), vec![stale]);
            let mut batch = crate::object_store::Batch::new();
            let mut state = crate::replay::ReplayState::new();
            store.stage_replay(&mut batch, &mut state, &piece).unwrap();
            store.seal();
            store.publish_recovered(batch);
        }
        let segments = vec![(3, piece(&[E::Obj("c", 5, "c5")], 50))];
        let (addr, _fake) = backup(&serve_all(&segments)).await;
        call::<Recover>(&service, &request(&[(3, &[&addr])])).await;
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_eq!(
            read(&service, "c"),
            (Status::Ok, Version(5), b"c5".to_vec())
        );
        assert_eq!(
            read(&service, "b").0,
            Status::ObjectDoesntExist,
            "the aborted move's copy came back with the recovered range"
        );
        assert!(service.store().lock().moves_in().is_empty());
    }

    /// Recovers the three segments, each from the one fake backup answering `answers`:
    /// the reply, how many `RecoveryData` calls the backup got, and the master's totals.
    async fn recover_three_from_one_backup(
        service: &MasterService,
        answers: &[(u64, Answer)],
    ) -> (RecoverReply, u32, crate::recovery_master::RecoveryTotals) {
        let (addr, fake) = backup(answers).await;
        let reply = call::<Recover>(
            service,
            &request(&[(1, &[&addr]), (2, &[&addr]), (3, &[&addr])]),
        )
        .await;
        let calls = fake.calls.load(Ordering::Relaxed);
        (reply, calls, service.stats().recoveries)
    }

    /// `reply`'s entries left in a slot of `region`, as a backup on this host leaves a
    /// piece; the slot stays sealed while the handle lives.
    fn leave_in(region: &RecoveryRegion, reply: &RecoveryDataReply) -> (SharedPiece, SealedSlot) {
        let mut slot = region.take().expect("a free slot");
        slot.write(0, &reply.entries);
        let sealed = slot.seal();
        let run = sealed.run(0, reply.entries.len() as u32);
        let shared = SharedPiece {
            region: region.path().to_string(),
            nonce: region.nonce(),
            runs: vec![SharedRun::from(run)],
        };
        (shared, sealed)
    }

    #[tokio::test]
    async fn recover_reads_pieces_a_backup_left_in_shared_memory() {
        let service = service();
        let segments = three_segments();
        let region = RecoveryRegion::create(3, 1 << 20, std::time::Duration::ZERO).expect("region");
        let mut slots = Vec::new();
        let answers: Vec<(u64, Answer)> = segments
            .iter()
            .map(|(id, reply)| {
                let (shared, sealed) = leave_in(&region, reply);
                slots.push(sealed);
                // Asked inline, the fake serves a piece without its entries, which
                // fails its check: every entry must come from shared memory.
                let inline = RecoveryDataReply {
                    entries: Bytes::new(),
                    ..reply.clone()
                };
                (*id, Answer::Shared(shared, inline))
            })
            .collect();
        let (reply, calls, totals) = recover_three_from_one_backup(&service, &answers).await;
        assert_eq!(calls, 3, "one call a segment");
        assert_eq!((reply.entries_received, reply.fallbacks), (8, 0));
        assert_eq!(
            (totals.shared_pieces, totals.shared_pieces_refetched),
            (3, 0)
        );
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }

    /// A slot the backup filled again after naming it holds other entries, each with a
    /// valid CRC, where the piece was: the recovery master must not replay them, and
    /// asks for the piece inside a reply instead.
    #[tokio::test]
    async fn a_shared_piece_whose_slot_was_refilled_is_asked_for_again() {
        let service = service();
        let segments = three_segments();
        let region = RecoveryRegion::create(1, 1 << 20, std::time::Duration::ZERO).expect("region");
        // Segment 1's piece was left in the slot, then the slot went to a piece of the
        // same length whose values are wrong.
        let (shared, sealed) = leave_in(&region, &segments[0].1);
        drop(sealed);
        let wrong = piece(
            &[
                E::Obj("a", 1, "XX"),
                E::Obj("b", 2, "XX"),
                E::Obj("d", 3, "XX"),
            ],
            1,
        );
        assert_eq!(wrong.entries.len(), segments[0].1.entries.len());
        let (_, _refilled) = leave_in(&region, &wrong);
        let mut answers = serve_all(&segments[1..]);
        answers.push((1, Answer::Shared(shared, segments[0].1.clone())));
        let (reply, calls, totals) = recover_three_from_one_backup(&service, &answers).await;
        assert_eq!(calls, 4, "segment 1 asked twice");
        assert_eq!(reply.fallbacks, 0, "the same backup answered");
        assert_eq!(
            (totals.shared_pieces, totals.shared_pieces_refetched),
            (0, 1)
        );
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }

    /// A backup whose region cannot be mapped here is asked for the bytes once per
    /// piece it named, and from then on for the bytes alone: each failed shared read
    /// costs the backup a whole replica read.
    #[tokio::test]
    async fn a_backup_whose_region_cannot_be_mapped_is_asked_for_bytes_from_then_on() {
        let config = crate::recovery_master::RecoveryConfig {
            fetches_in_flight: 1,
            ..crate::recovery_master::RecoveryConfig::default()
        };
        let service = service().with_recovery_config(config);
        let segments = three_segments();
        // A descriptor no process of this test holds.
        let nowhere = SharedPiece {
            region: format!("/proc/{}/fd/999999", std::process::id()),
            nonce: 1,
            runs: Vec::new(),
        };
        let answers: Vec<(u64, Answer)> = segments
            .iter()
            .map(|(id, reply)| (*id, Answer::Shared(nowhere.clone(), reply.clone())))
            .collect();
        let (reply, calls, totals) = recover_three_from_one_backup(&service, &answers).await;
        assert_eq!(calls, 4, "segment 1 twice, then bytes only");
        assert_eq!(reply.fallbacks, 0);
        assert_eq!(
            (totals.shared_pieces, totals.shared_pieces_refetched),
            (0, 1)
        );
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }

    /// A master with shared reads off asks for bytes. A backup that names a place in
    /// shared memory all the same has failed that fetch: the piece comes from the next
    /// backup, and nothing is read from the place named.
    #[tokio::test]
    async fn a_shared_piece_a_master_did_not_ask_for_fails_over_to_the_next_backup() {
        let config = crate::recovery_master::RecoveryConfig {
            shared_reads: false,
            ..crate::recovery_master::RecoveryConfig::default()
        };
        let service = service().with_recovery_config(config);
        let segments = three_segments();
        let region = RecoveryRegion::create(1, 1 << 20, std::time::Duration::ZERO).expect("region");
        let (shared, _sealed) = leave_in(&region, &segments[0].1);
        let unasked = RecoveryDataReply {
            entries: Bytes::new(),
            shared: Some(shared),
            ..segments[0].1.clone()
        };
        let (careless, careless_fake) = backup(&[(1, Answer::Serve(unasked))]).await;
        let (good, _) = backup(&serve_all(&segments)).await;
        let reply = call::<Recover>(
            &service,
            &request(&[(1, &[&careless, &good]), (2, &[&good]), (3, &[&good])]),
        )
        .await;
        assert_eq!(careless_fake.calls.load(Ordering::Relaxed), 1);
        assert_eq!((reply.entries_received, reply.fallbacks), (8, 1));
        let totals = service.stats().recoveries;
        assert_eq!(
            (totals.shared_pieces, totals.shared_pieces_refetched),
            (0, 0)
        );
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }

    #[tokio::test]
    async fn recover_falls_back_to_the_next_backup_when_one_fails() {
        let service = service();
        let segments = three_segments();
        let (good, _) = backup(&serve_all(&segments)).await;
        let mut corrupt_piece = segments[2].1.clone();
        let mut bytes = corrupt_piece.entries.to_vec();
        let last = bytes.len() - 3;
        bytes[last] ^= 0xff;
        corrupt_piece.entries = Bytes::from(bytes);
        let (refusing, _) = backup(&[(2, Answer::Fail(Status::Internal))]).await;
        let (corrupt, _) = backup(&[(3, Answer::Serve(corrupt_piece))]).await;
        let dead = dead_addr().await;
        let reply = call::<Recover>(
            &service,
            &request(&[
                (1, &[&dead, &good]),
                (2, &[&refusing, &good]),
                (3, &[&corrupt, &good]),
            ]),
        )
        .await;
        assert_eq!(reply.fallbacks, 3);
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }

    #[tokio::test]
    async fn retry_answers_ask_the_same_backup_again() {
        let service = service();
        let segments = three_segments();
        let answers: Vec<(u64, Answer)> = segments
            .iter()
            .map(|(id, reply)| (*id, Answer::RetryThenServe(2, reply.clone())))
            .collect();
        let (addr, fake) = backup(&answers).await;
        let (never_asked, spare) = backup(&serve_all(&segments)).await;
        let reply = call::<Recover>(
            &service,
            &request(&[
                (1, &[&addr, &never_asked]),
                (2, &[&addr, &never_asked]),
                (3, &[&addr, &never_asked]),
            ]),
        )
        .await;
        assert_eq!(reply.fallbacks, 0);
        assert_eq!(fake.calls.load(Ordering::Relaxed), 9);
        assert_eq!(spare.calls.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn recover_fails_when_every_backup_of_a_segment_fails_and_leaves_nothing() {
        let service = service();
        call::<TakeTablets>(&service, &whole_table(&service)).await;
        call::<Write>(&service, &write_request("own", "kept")).await;
        let segments = three_segments();
        // Segments 1 and 3 replay fine; segment 2 has no usable replica.
        let (good, _) = backup(&[
            (1, Answer::Serve(segments[0].1.clone())),
            (3, Answer::Serve(segments[2].1.clone())),
        ])
        .await;
        let (refusing, _) = backup(&[]).await;
        let dead = dead_addr().await;
        let reply = send::<Recover>(
            &service,
            &request(&[(1, &[&good]), (2, &[&refusing, &dead]), (3, &[&good])]),
        )
        .await;
        assert_eq!(reply.status(), Status::RecoveryFailed);
        let detail = String::from_utf8_lossy(reply.payload()).into_owned();
        assert!(
            detail.contains(&format!("{}: every backup failed", SegmentId(2))),
            "{detail}"
        );
        assert!(
            detail.contains(&refusing) && detail.contains(&dead),
            "{detail}"
        );
        assert_eq!(
            service.store().lock().object_count(),
            1,
            "only the master's own"
        );
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        for key in ["a", "c", "d"] {
            assert_eq!(read(&service, key).0, Status::ObjectDoesntExist, "{key}");
        }
        assert_eq!(read_own(&service), b"kept");
    }

    #[tokio::test]
    async fn recover_into_a_full_log_fails_and_leaves_nothing() {
        // The master holds 1 MiB of log; the partition holds about 1.8 MB.
        let service = service();
        call::<TakeTablets>(&service, &whole_table(&service)).await;
        call::<Write>(&service, &write_request("own", "kept")).await;
        let value: &'static str = Box::leak("v".repeat(1000).into_boxed_str());
        let big = |segment: u64| {
            let entries: Vec<E> = (0..900)
                .map(|i| {
                    let key: &'static str = Box::leak(format!("s{segment}-k{i}").into_boxed_str());
                    E::Obj(key, 1, value)
                })
                .collect();
            (segment, piece(&entries, 1))
        };
        let (fake, _) = backup(&serve_all(&[big(1), big(2)])).await;
        let reply = send::<Recover>(&service, &request(&[(1, &[&fake]), (2, &[&fake])])).await;
        assert_eq!(reply.status(), Status::RecoveryFailed);
        let detail = String::from_utf8_lossy(reply.payload()).into_owned();
        assert!(detail.contains("log memory full"), "{detail}");
        assert_eq!(
            service.store().lock().object_count(),
            1,
            "only the master's own"
        );
        assert_eq!(read_own(&service), b"kept");
    }

    /// The log space of a failed or abandoned replay comes back (issue 11): its entries
    /// are dead once forgotten, and the cleaner copies the live ones out of the segments
    /// they share and frees them. After an abandoned replay of about 450 KB into a 1 MiB
    /// log, 600 KB of new writes fit — only if the replay's segments were cleaned.
    #[tokio::test]
    async fn the_log_space_of_an_abandoned_replay_is_given_back() {
        let service = service();
        call::<TakeTablets>(&service, &whole_table(&service)).await;
        call::<Write>(&service, &write_request("own", "kept")).await;
        let value: &'static str = Box::leak("v".repeat(1000).into_boxed_str());
        let entries: Vec<E> = (0..450)
            .map(|i| {
                let key: &'static str = Box::leak(format!("k{i}").into_boxed_str());
                E::Obj(key, 1, value)
            })
            .collect();
        let (fake, _) = backup(&serve_all(&[(1, piece(&entries, 1))])).await;
        call::<Recover>(&service, &request(&[(1, &[&fake])])).await;
        let abandon = AbandonRecoveryRequest {
            crashed: CRASHED,
            recovery: 1,
            ranges: ranges(),
        };
        call::<AbandonRecovery>(&service, &abandon).await;
        assert_eq!(
            service.store().lock().object_count(),
            1,
            "only the master's own"
        );
        for i in 0..600 {
            let key = format!("new-{i}");
            let reply = send::<Write>(&service, &write_request(&key, value)).await;
            assert_eq!(reply.status(), Status::Ok, "write {i}");
        }
        assert_eq!(service.store().lock().object_count(), 601);
        assert_eq!(read_own(&service), b"kept");
        let (used, max) = service.store().lock().log_bytes();
        assert!(used <= max);
    }

    fn read_own(service: &MasterService) -> Vec<u8> {
        service.store().lock().read(TABLE, b"own").value().to_vec()
    }

    #[tokio::test]
    async fn recover_refuses_its_own_log_owned_ranges_and_bad_ranges() {
        let service = service();
        let own = RecoverRequest {
            crashed: service.id(),
            ..request(&[])
        };
        assert_eq!(
            send::<Recover>(&service, &own).await.status(),
            Status::InvalidArgument
        );
        let empty = RecoverRequest {
            ranges: vec![],
            ..request(&[])
        };
        assert_eq!(
            send::<Recover>(&service, &empty).await.status(),
            Status::InvalidArgument
        );
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_eq!(
            send::<Recover>(&service, &request(&[])).await.status(),
            Status::InvalidArgument
        );
    }

    /// Replays [`three_segments`] as attempt 1 on `service`, not taken; returns the
    /// `Recover` sent.
    async fn replayed_not_taken(service: &MasterService) -> RecoverRequest {
        let (addr, _) = backup(&serve_all(&three_segments())).await;
        let request = request(&[(1, &[&addr]), (2, &[&addr]), (3, &[&addr])]);
        call::<Recover>(service, &request).await;
        assert_eq!(service.store().lock().object_count(), 3);
        request
    }

    #[tokio::test]
    async fn abandon_recovery_forgets_a_recovery_not_yet_taken() {
        let service = service();
        let segments_request = replayed_not_taken(&service).await;
        abandon_attempt_1(&service).await;
        assert_eq!(service.store().lock().object_count(), 0);
        // The same attempt's `Recover` arriving after its abandon (delayed on its way)
        // replays nothing: the coordinator has given the partition up here.
        let late = send::<Recover>(&service, &segments_request).await;
        assert_eq!(late.status(), Status::RecoveryFailed);
        assert_eq!(service.store().lock().object_count(), 0);
        // A later attempt replays the partition again, to the same result.
        let again = RecoverRequest {
            recovery: 2,
            ..segments_request
        };
        let again = call::<Recover>(&service, &again).await;
        assert_eq!(again.objects, 3);
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }

    fn finish_recovery(service: &MasterService) -> FinishRecoveryRequest {
        FinishRecoveryRequest {
            owner: service.id(),
            crashed: CRASHED,
            tablet_epoch: service.tablet_sync().applied(),
        }
    }

    #[tokio::test]
    async fn finish_recovery_forgets_what_was_replayed_for_nobody_and_refuses_later_recovers() {
        // The `Recover` reply and its abandon were lost: the coordinator gave the
        // partition to another master, and this one holds it for nobody.
        let service = service();
        let segments_request = replayed_not_taken(&service).await;
        let other = FinishRecoveryRequest {
            owner: ServerId(99),
            ..finish_recovery(&service)
        };
        assert_eq!(
            send::<FinishRecovery>(&service, &other).await.status(),
            Status::WrongServer
        );
        assert_eq!(service.store().lock().object_count(), 3);
        call::<FinishRecovery>(&service, &finish_recovery(&service)).await;
        assert_eq!(service.store().lock().object_count(), 0);
        // A deposed leader's `Recover`, arriving later still, is refused.
        let late = RecoverRequest {
            recovery: 2,
            ..segments_request
        };
        assert_eq!(
            send::<Recover>(&service, &late).await.status(),
            Status::RecoveryFailed
        );
        assert_eq!(service.store().lock().object_count(), 0);
        // Repeated (its answer was lost): the same answer.
        call::<FinishRecovery>(&service, &finish_recovery(&service)).await;
    }

    #[tokio::test]
    async fn finish_recovery_of_a_master_behind_its_tablets_forgets_nothing_until_it_catches_up() {
        // The committed map gave this master the partition (tablet epoch +1), but the
        // push was lost and it cannot pull (no coordinators here): forgetting now would
        // drop what it is about to serve.
        let service = service();
        replayed_not_taken(&service).await;
        let ahead = FinishRecoveryRequest {
            tablet_epoch: service.tablet_sync().applied().next(),
            ..finish_recovery(&service)
        };
        assert_eq!(
            send::<FinishRecovery>(&service, &ahead).await.status(),
            Status::Retry
        );
        assert_eq!(service.store().lock().object_count(), 3, "kept");
        // The push arrives; the coordinator asks again.
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        call::<FinishRecovery>(&service, &ahead).await;
        assert_three_segments_recovered(&service);
    }

    #[tokio::test]
    async fn finish_recovery_keeps_what_the_committed_map_gave_this_master() {
        let service = service();
        replayed_not_taken(&service).await;
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        call::<FinishRecovery>(&service, &finish_recovery(&service)).await;
        assert_three_segments_recovered(&service);
    }

    #[tokio::test]
    async fn finish_recovery_cancels_a_recovery_still_replaying_here() {
        let service = std::sync::Arc::new(service());
        let addr = stuck_backup(&[]).await;
        let recovering = recovery_in_progress(&service, &addr).await;
        call::<FinishRecovery>(&service, &finish_recovery(&service)).await;
        assert_eq!(
            recovering.await.expect("the recovery task does not panic"),
            Status::RecoveryFailed
        );
        assert_eq!(service.store().lock().object_count(), 0);
    }

    #[tokio::test]
    async fn an_abandon_or_a_recover_of_an_older_attempt_changes_nothing() {
        // Attempt 4's abandon, delayed in the network, arrives after attempt 5 replayed
        // the same ranges here (and may have committed them to this master): ignored.
        let service = service();
        let segments = three_segments();
        let (addr, _) = backup(&serve_all(&segments)).await;
        let mut newer = request(&[(1, &[&addr]), (2, &[&addr]), (3, &[&addr])]);
        newer.recovery = 5;
        call::<Recover>(&service, &newer).await;
        let stale = AbandonRecoveryRequest {
            crashed: CRASHED,
            recovery: 4,
            ranges: ranges(),
        };
        call::<AbandonRecovery>(&service, &stale).await;
        assert_eq!(service.store().lock().object_count(), 3, "kept");
        // A deposed leader's late Recover of attempt 4 is refused: it would forget too.
        let mut late = newer.clone();
        late.recovery = 4;
        let reply = send::<Recover>(&service, &late).await;
        assert_eq!(reply.status(), Status::RecoveryFailed);
        assert_eq!(service.store().lock().object_count(), 3, "still kept");
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }

    #[tokio::test]
    async fn a_lossy_recovery_with_nothing_to_replay_still_raises_the_version_floor() {
        // Allow-loss, and no replica of the crashed master survived: nothing to replay.
        // A key it held at version 999 (lost) written again here must get a version
        // above the crashed master's ceiling.
        let service = service();
        let mut lossy = request(&[]);
        lossy.version_floor = 1000;
        call::<Recover>(&service, &lossy).await;
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        let write = WriteRequest {
            table: RECOVERED,
            ..write_request("k", "again")
        };
        let written = call::<Write>(&service, &write).await;
        assert_eq!(written.status, Status::Ok);
        assert!(written.version >= Version(1000), "{:?}", written.version);
    }

    /// A backup serving segment 1 of [`three_segments`] and answering `Retry` for segment
    /// 2 for ever, and `more`.
    async fn stuck_backup(more: &[(u64, Answer)]) -> String {
        let segments = three_segments();
        let mut answers = vec![
            (1, Answer::Serve(segments[0].1.clone())),
            (2, Answer::RetryThenServe(u32::MAX, segments[1].1.clone())),
        ];
        answers.extend_from_slice(more);
        backup(&answers).await.0
    }

    /// Starts attempt 1 of recovering segments 1 and 2 from a [`stuck_backup`] and
    /// returns once segment 1 is replayed: a recovery that stays in progress. The task
    /// ends with the `Recover`'s status.
    async fn recovery_in_progress(
        service: &Arc<MasterService>,
        addr: &str,
    ) -> tokio::task::JoinHandle<Status> {
        let recovering = {
            let service = Arc::clone(service);
            let request = request(&[(1, &[addr]), (2, &[addr])]);
            tokio::spawn(async move { send::<Recover>(&service, &request).await.status() })
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while service.store().lock().object_count() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "segment 1 never replayed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        recovering
    }

    /// A second partition of attempt 1 (another table, nothing to fetch): done at once
    /// when its turn comes.
    fn second_partition() -> RecoverRequest {
        RecoverRequest {
            partition: 1,
            ranges: vec![HashRange::whole(TableId(8))],
            ..request(&[])
        }
    }

    /// The answer to `request` sent as a `Recover`, which must come within 10 s (`why`).
    async fn recover_within_10_s(
        service: &MasterService,
        request: &RecoverRequest,
        why: &str,
    ) -> Reply {
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            send::<Recover>(service, request),
        )
        .await
        .unwrap_or_else(|_| panic!("no answer within 10 s: {why}"))
    }

    /// `AbandonRecovery` of attempt 1 of the whole recovered table.
    async fn abandon_attempt_1(service: &MasterService) {
        call::<AbandonRecovery>(
            service,
            &AbandonRecoveryRequest {
                crashed: CRASHED,
                recovery: 1,
                ranges: ranges(),
            },
        )
        .await;
    }

    #[tokio::test]
    async fn abandon_recovery_cancels_a_recovery_in_progress() {
        let service = std::sync::Arc::new(service());
        let addr = stuck_backup(&[]).await;
        let recovering = recovery_in_progress(&service, &addr).await;
        // Overlapping ranges may not be recovered twice at once.
        let overlapping = send::<Recover>(&service, &request(&[(1, &[&addr])])).await;
        assert_eq!(overlapping.status(), Status::Retry);
        abandon_attempt_1(&service).await;
        assert_eq!(
            recovering.await.expect("the recovery task does not panic"),
            Status::RecoveryFailed
        );
        assert_eq!(service.store().lock().object_count(), 0);
    }

    #[tokio::test]
    async fn partitions_replay_one_at_a_time_and_a_waiting_one_goes_next() {
        let service = std::sync::Arc::new(service());
        let addr = stuck_backup(&[]).await;
        let first = recovery_in_progress(&service, &addr).await;
        // A second partition of the same crash (another table, nothing to fetch) would
        // be done at once; it waits for the first instead.
        let mut second = {
            let service = Arc::clone(&service);
            let request = second_partition();
            tokio::spawn(async move { send::<Recover>(&service, &request).await.status() })
        };
        let early = tokio::time::timeout(std::time::Duration::from_millis(300), &mut second).await;
        assert!(
            early.is_err(),
            "the second partition replayed beside the first"
        );
        abandon_attempt_1(&service).await;
        assert_eq!(
            first
                .await
                .expect("the first partition's task does not panic"),
            Status::RecoveryFailed
        );
        assert_eq!(
            second
                .await
                .expect("the second partition's task does not panic"),
            Status::Ok,
            "its turn came"
        );
    }

    #[tokio::test]
    async fn a_recover_its_caller_gave_up_on_is_cancelled_and_frees_its_turn() {
        // The coordinator waits `answer_within` for a `Recover`, then gives the partition
        // to another master; this one must not go on holding its only turn.
        let config = crate::recovery_master::RecoveryConfig {
            answer_within: std::time::Duration::from_millis(300),
            ..crate::recovery_master::RecoveryConfig::default()
        };
        let service = Arc::new(service().with_recovery_config(config));
        let addr = stuck_backup(&[]).await;
        let stuck = recovery_in_progress(&service, &addr).await;
        // Without the deadline it would wait for segment 2 for `RECOVERY_RETRY_FOR`.
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), stuck)
            .await
            .expect("cancelled at its deadline")
            .expect("the recovery's task does not panic");
        assert_eq!(outcome, Status::RecoveryFailed);
        assert_eq!(
            service.store().lock().object_count(),
            0,
            "what it replayed is forgotten"
        );
        let reply = recover_within_10_s(&service, &second_partition(), "the turn is free").await;
        assert_eq!(reply.status(), Status::Ok);
    }

    #[tokio::test]
    async fn a_newer_attempt_cancels_an_older_one_still_replaying_here() {
        let service = std::sync::Arc::new(service());
        let addr = stuck_backup(&[(3, Answer::Serve(three_segments()[2].1.clone()))]).await;
        // Attempt 1 (of a leader since deposed) stays in progress on segment 2.
        let older = recovery_in_progress(&service, &addr).await;
        // Attempt 2 of the same ranges is not refused as "in progress": it replaces it.
        let newer = RecoverRequest {
            recovery: 2,
            ..request(&[(3, &[&addr])])
        };
        let reply = recover_within_10_s(
            &service,
            &newer,
            "the newer attempt waited for the older one",
        )
        .await;
        assert_eq!(reply.status(), Status::Ok);
        assert_eq!(
            older
                .await
                .expect("the older attempt's task does not panic"),
            Status::RecoveryFailed
        );
        // Only what attempt 2 replayed is left.
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_eq!(read(&service, "a").0, Status::ObjectDoesntExist);
        assert_eq!(
            read(&service, "c"),
            (Status::Ok, Version(5), b"c5".to_vec())
        );
    }

    #[tokio::test]
    async fn a_recover_sent_twice_gives_the_same_objects() {
        let service = service();
        let segments = three_segments();
        let (addr, _) = backup(&serve_all(&segments)).await;
        let segments_request = request(&[(3, &[&addr]), (1, &[&addr]), (2, &[&addr])]);
        let first = call::<Recover>(&service, &segments_request).await;
        let second = call::<Recover>(&service, &segments_request).await;
        assert_eq!(first.objects, second.objects);
        assert_eq!(service.store().lock().object_count(), 3);
        call::<TakeTablets>(&service, &recovered_tablets(&service)).await;
        assert_three_segments_recovered(&service);
    }
}

/// A `MultiWrite` payload's objects as `decode_multi_write` should give them.
fn as_ops(request: &MultiWriteRequest) -> Vec<crate::object_store::WriteOp> {
    request
        .objects
        .iter()
        .map(|w| crate::object_store::WriteOp::Write {
            table: w.table,
            key: w.key.clone(),
            value: w.value.clone(),
            rules: w.rules,
            rifl: w.rifl,
        })
        .collect()
}

mod multi_write_decoding {
    use super::*;
    use crate::service::decode_multi_write;
    use proptest::prelude::*;
    use rampart_common::ids::ClientId;
    use rampart_common::rifl::Rifl;

    fn any_write_request() -> impl Strategy<Value = WriteRequest> {
        (
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..24),
            proptest::collection::vec(any::<u8>(), 0..40),
            (any::<u64>(), any::<[bool; 4]>()),
            any::<[u64; 3]>(),
        )
            .prop_map(|(table, key, value, (given, flags), rifl)| WriteRequest {
                table: TableId(table),
                key: Bytes::from(key),
                value: Bytes::from(value),
                rules: RejectRules {
                    given_version: Version(given),
                    doesnt_exist: flags[0],
                    exists: flags[1],
                    version_le_given: flags[2],
                    version_ne_given: flags[3],
                },
                rifl: Rifl {
                    client: ClientId(rifl[0]),
                    seq: rifl[1],
                    ack: rifl[2],
                },
            })
    }

    proptest! {
        /// Whatever the client encodes decodes to the same objects as through serde.
        #[test]
        fn decode_multi_write_reads_what_serde_writes(
            objects in proptest::collection::vec(any_write_request(), 0..20),
        ) {
            let request = MultiWriteRequest { objects };
            let ops = decode_multi_write(encode(&request)).expect("serde accepted this payload");
            prop_assert_eq!(ops, as_ops(&request));
        }

        /// A damaged payload (bytes changed, cut short or added) is refused exactly when
        /// serde refuses it, and otherwise decodes to what serde decodes.
        #[test]
        fn decode_multi_write_accepts_exactly_what_serde_accepts(
            objects in proptest::collection::vec(any_write_request(), 0..6),
            // Small bytes as well as any: lengths and flags are where 0, 1 and 2 matter.
            damage in proptest::collection::vec(
                (any::<prop::sample::Index>(), prop_oneof![0..3u8, any::<u8>()]),
                0..4,
            ),
            cut in any::<prop::sample::Index>(),
            extra in proptest::collection::vec(any::<u8>(), 0..3),
            how in 0..3u8,
        ) {
            let request = MultiWriteRequest { objects };
            let mut payload = encode(&request).to_vec();
            match how {
                0 => {
                    for (at, byte) in damage {
                        let at = at.index(payload.len());
                        payload[at] = byte;
                    }
                }
                1 => payload.truncate(cut.index(payload.len() + 1)),
                _ => payload.extend_from_slice(&extra),
            }
            let payload = Bytes::from(payload);
            let by_hand = decode_multi_write(payload.clone());
            let by_serde = MultiWriteRequest::decode(payload);
            match (by_hand, by_serde) {
                (Ok(ops), Ok(request)) => prop_assert_eq!(ops, as_ops(&request)),
                (Err(_), Err(_)) => {}
                (by_hand, by_serde) => prop_assert!(
                    false,
                    "by hand: {:?}; serde: {:?}",
                    by_hand.map(|ops| ops.len()),
                    by_serde.map(|r| r.objects.len())
                ),
            }
        }
    }

    #[test]
    fn decode_multi_write_refuses_a_count_the_payload_cannot_hold_without_allocating_it() {
        let mut payload = BytesMut::new();
        payload.put_u64_le(u64::MAX);
        assert!(decode_multi_write(payload.freeze()).is_err());
        // Keys and values are slices of the payload, not copies.
        let request = MultiWriteRequest {
            objects: vec![super::write_request("k", "v")],
        };
        let payload = encode(&request);
        let ops = decode_multi_write(payload.clone()).expect("serde accepted this payload");
        let crate::object_store::WriteOp::Write { key, .. } = &ops[0] else {
            panic!("not a write");
        };
        let inside = payload.as_ptr_range();
        assert!(inside.contains(&key.as_ptr()), "the key was copied");
    }
}
