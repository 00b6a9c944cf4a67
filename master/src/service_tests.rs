//! Tests of [`MasterService`](crate::service::MasterService) through its RPC entry
//! point, [`Service::handle`]: requests are encoded as a client would send them and
//! replies decoded from their payload bytes, with no sockets in between.

// A failed unwrap is a failed test, with its location: exactly what a test wants.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, Bytes, BytesMut};
use rampart_common::config::MasterConfig;
use rampart_common::ids::{ServerId, TableId, Version};
use rampart_common::limits::{KEY_BYTES_MAX, MULTI_OPS_MAX};
use rampart_common::protocol::master::{
    DropTablets, Enumerate, EnumerateRequest, Increment, IncrementRequest, MultiRead,
    MultiReadRequest, MultiRemove, MultiRemoveRequest, MultiWrite, MultiWriteRequest, ObjectKey,
    Ping, PingRequest, Read, ReadRequest, Remove, RemoveRequest, TabletsRequest, TakeTablets,
    Write, WriteRequest,
};
use rampart_common::reject::RejectRules;
use rampart_common::rpc::{Opcode, Reply, Rpc, Service, WireMessage};
use rampart_common::status::Status;
use rampart_common::tablet::Tablet;

use crate::service::MasterService;

const TABLE: TableId = TableId(1);

/// A master of 8 × 128 KiB segments (must run inside a tokio runtime).
fn service() -> MasterService {
    let config = MasterConfig {
        segment_bytes: 128 * 1024,
        memory_bytes: 1024 * 1024,
        value_bytes_max: 1024,
    };
    MasterService::new(ServerId(1), config)
}

fn whole_table() -> TabletsRequest {
    TabletsRequest {
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
    call::<TakeTablets>(&service, &whole_table()).await;
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
    call::<TakeTablets>(&service, &whole_table()).await;
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
    call::<TakeTablets>(&service, &whole_table()).await;
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

    call::<TakeTablets>(&service, &whole_table()).await;
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

    call::<TakeTablets>(&service, &whole_table()).await;
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
            })
            .collect(),
    };
    call::<MultiRemove>(&service, &keys).await;
    assert_eq!(call::<Ping>(&service, &PingRequest {}).await.objects, 20);

    call::<DropTablets>(&service, &whole_table()).await;
    assert_eq!(call::<Ping>(&service, &PingRequest {}).await.objects, 0);
}
