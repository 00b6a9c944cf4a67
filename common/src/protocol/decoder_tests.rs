//! The protocol's message decoders against truncated, hostile and random payloads:
//! each must return `Err` (or, for random bytes, possibly `Ok`), never panic and
//! never allocate what a length prefix merely claims.

use crate::ids::{Epoch, ServerId, TableId, TabletEpoch, Version};
use crate::protocol::{backup, coordinator, master};
use crate::reject::RejectRules;
use crate::rpc::WireMessage;
use crate::status::Status;
use crate::tablet::{ServerInfo, ServerStatus, Services, TableInfo, Tablet, TabletMap};
use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use std::fmt::Debug;

fn encode<M: WireMessage>(message: &M) -> Bytes {
    let mut out = BytesMut::new();
    message.encode(&mut out);
    out.freeze()
}

/// `message` round-trips, every proper prefix of its encoding is refused, and so is
/// the encoding with a byte appended.
fn assert_only_the_whole_encoding_decodes<M: WireMessage + PartialEq + Debug>(message: M) {
    let name = std::any::type_name::<M>();
    let whole = encode(&message);
    assert_eq!(M::decode(whole.clone()).as_ref(), Ok(&message), "{name}");
    for cut in 0..whole.len() {
        assert!(
            M::decode(whole.slice(..cut)).is_err(),
            "{name}: a prefix of {cut} of {} bytes decoded",
            whole.len()
        );
    }
    let mut padded = BytesMut::from(&whole[..]);
    padded.put_u8(0);
    assert!(M::decode(padded.freeze()).is_err(), "{name}: trailing byte");
}

fn tablet(start_hash: u64) -> Tablet {
    Tablet {
        table: TableId(3),
        start_hash,
        end_hash: u64::MAX,
        owner: ServerId(2),
    }
}

fn tablet_map() -> TabletMap {
    TabletMap {
        version: 9,
        servers: vec![ServerInfo {
            id: ServerId(2),
            addr: "10.0.0.2:7000".to_string(),
            services: Services {
                master: true,
                backup: true,
            },
            status: ServerStatus::Crashed,
            failure_domain: "rack-b".to_string(),
            disk_read_mbps: 500,
        }],
        tables: vec![TableInfo {
            id: TableId(3),
            name: "users".to_string(),
            tablets: vec![tablet(0)],
        }],
    }
}

fn enlist_request() -> coordinator::EnlistRequest {
    coordinator::EnlistRequest {
        addr: "10.0.0.1:7000".to_string(),
        services: Services {
            master: true,
            backup: false,
        },
        failure_domain: "rack-a".to_string(),
        disk_read_mbps: 250,
    }
}

fn read_request() -> master::ReadRequest {
    master::ReadRequest {
        table: TableId(1),
        key: Bytes::from_static(b"some key"),
    }
}

fn multi_read_request() -> master::MultiReadRequest {
    master::MultiReadRequest {
        objects: vec![
            master::ObjectKey {
                table: TableId(1),
                key: Bytes::from_static(b"a"),
            },
            master::ObjectKey {
                table: TableId(2),
                key: Bytes::from_static(b"bcd"),
            },
        ],
    }
}

fn enumerate_reply() -> master::EnumerateReply {
    master::EnumerateReply {
        objects: vec![master::EnumeratedObject {
            key: Bytes::from_static(b"k"),
            version: Version(4),
            value: Bytes::from_static(b"value"),
        }],
        next_hash: Some(1 << 40),
    }
}

#[test]
fn truncated_and_hostile_bincode_payloads_are_refused_by_the_protocol_decoders() {
    assert_only_the_whole_encoding_decodes(enlist_request());
    assert_only_the_whole_encoding_decodes(coordinator::EnlistReply { id: ServerId(5) });
    assert_only_the_whole_encoding_decodes(coordinator::CreateTableRequest {
        name: "users".to_string(),
        span: 4,
    });
    assert_only_the_whole_encoding_decodes(coordinator::TableIdReply { id: TableId(3) });
    assert_only_the_whole_encoding_decodes(coordinator::TableNameRequest {
        name: "users".to_string(),
    });
    assert_only_the_whole_encoding_decodes(tablet_map());
    assert_only_the_whole_encoding_decodes(multi_read_request());
    assert_only_the_whole_encoding_decodes(master::MultiWriteRequest {
        objects: vec![master::WriteRequest {
            table: TableId(1),
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            rules: RejectRules::create_only(),
            rifl: crate::rifl::Rifl {
                client: crate::ids::ClientId(3),
                seq: 9,
                ack: 8,
            },
        }],
    });
    assert_only_the_whole_encoding_decodes(master::IncrementRequest {
        table: TableId(1),
        key: Bytes::from_static(b"counter"),
        delta: -5,
        rules: RejectRules::default(),
        rifl: crate::rifl::Rifl::NONE,
    });
    assert_only_the_whole_encoding_decodes(master::EnumerateRequest {
        table: TableId(1),
        resume_hash: 17,
        end_hash: u64::MAX,
        max_bytes: 1 << 20,
    });
    assert_only_the_whole_encoding_decodes(enumerate_reply());
    assert_only_the_whole_encoding_decodes(master::TabletsRequest {
        owner: ServerId(3),
        epoch: TabletEpoch(9),
        tablets: vec![tablet(0), tablet(1 << 63)],
    });
    assert_only_the_whole_encoding_decodes(master::SyncTabletsRequest {
        owner: ServerId(3),
        epoch: TabletEpoch(9),
    });
    assert_only_the_whole_encoding_decodes(master::MultiWriteReply {
        objects: vec![master::WriteReply {
            status: Status::WrongVersion,
            version: Version(8),
        }],
    });
    // The hand-coded hot-path messages with an explicit end.
    assert_only_the_whole_encoding_decodes(read_request());
    assert_only_the_whole_encoding_decodes(master::WriteReply {
        status: Status::Ok,
        version: Version(1),
    });

    // Length prefixes that claim far more than the payload holds: an error, found
    // before anything of that size is allocated.
    let mut huge_string = BytesMut::new();
    huge_string.put_u64_le(60 * 1024 * 1024); // under the 64 MiB bincode limit
    huge_string.put_slice(b"short");
    assert!(coordinator::EnlistRequest::decode(huge_string.freeze()).is_err());
    let mut endless_string = BytesMut::new();
    endless_string.put_u64_le(u64::MAX);
    assert!(coordinator::TableNameRequest::decode(endless_string.freeze()).is_err());
    let mut many_servers = BytesMut::new();
    many_servers.put_u64_le(1); // version
    many_servers.put_u64_le(1 << 40); // servers claimed
    assert!(TabletMap::decode(many_servers.freeze()).is_err());
    let mut many_tablets = BytesMut::new();
    many_tablets.put_u64_le(u64::MAX / 2);
    assert!(master::TabletsRequest::decode(many_tablets.freeze()).is_err());
    let mut long_key = BytesMut::new();
    long_key.put_u64_le(1); // table
    long_key.put_u32_le(u32::MAX); // key length
    long_key.put_slice(b"tiny");
    assert!(master::ReadRequest::decode(long_key.freeze()).is_err());
    let mut long_write_key = BytesMut::new();
    long_write_key.put_u64_le(1); // table
    long_write_key.put_u64_le(0); // given version
    long_write_key.put_u8(0); // rule flags
    long_write_key.put_u32_le(u32::MAX); // key length
    assert!(master::WriteRequest::decode(long_write_key.freeze()).is_err());
}

/// WriteRequest and ReadReply end in "the rest of the payload" (the frame length
/// delimits it), so only a cut before that tail can be detected.
#[test]
fn hot_path_messages_cut_before_their_value_are_refused() {
    let write = master::WriteRequest {
        table: TableId(1),
        key: Bytes::from_static(b"key"),
        value: Bytes::from_static(b"value"),
        rules: RejectRules::default(),
        rifl: crate::rifl::Rifl {
            client: crate::ids::ClientId(3),
            seq: 9,
            ack: 8,
        },
    };
    let whole = encode(&write);
    let value_starts = whole.len() - write.value.len();
    for cut in 0..value_starts {
        assert!(
            master::WriteRequest::decode(whole.slice(..cut)).is_err(),
            "cut at {cut}"
        );
    }
    let reply = master::ReadReply {
        status: Status::Ok,
        version: Version(3),
        value: Bytes::from_static(b"value"),
    };
    let whole = encode(&reply);
    for cut in 0..whole.len() - reply.value.len() {
        assert!(
            master::ReadReply::decode(whole.slice(..cut)).is_err(),
            "cut at {cut}"
        );
    }
}

fn recovery_data_reply() -> backup::RecoveryDataReply {
    backup::RecoveryDataReply {
        epoch: Epoch(7),
        safe_version: Version(1 << 40),
        entries: Bytes::from((0..=255u8).collect::<Vec<u8>>()),
        count: 3,
        shared: None,
    }
}

fn shared_recovery_data_reply() -> backup::RecoveryDataReply {
    backup::RecoveryDataReply {
        entries: Bytes::new(),
        shared: Some(backup::SharedPiece {
            region: "/proc/4242/fd/17".to_string(),
            nonce: 0x0123_4567_89ab_cdef,
            runs: vec![
                backup::SharedRun {
                    slot: 9,
                    generation: 14,
                    len: 1 << 18,
                },
                backup::SharedRun {
                    slot: 2,
                    generation: 6,
                    len: 100,
                },
            ],
        }),
        ..recovery_data_reply()
    }
}

/// `RecoveryDataReply` is encoded by hand: it must keep the layout its serde derive
/// gives with the protocol's bincode options, and its entries must come out of the
/// frame they arrived in, not a copy.
#[test]
fn a_recovery_data_reply_is_bincode_on_the_wire_and_decodes_without_copying() {
    let reply = recovery_data_reply();
    let mut bincode = BytesMut::new();
    crate::rpc::message::encode_bincode(&reply, &mut bincode);
    let whole = encode(&reply);
    assert_eq!(whole, bincode.freeze());
    let decoded = backup::RecoveryDataReply::decode(whole.clone()).expect("decodes");
    let frame = whole.as_ptr_range();
    assert!(
        frame.contains(&decoded.entries.as_ptr()),
        "entries share the frame"
    );
    assert_only_the_whole_encoding_decodes(reply);
    // With a shared piece instead of entries.
    let shared = shared_recovery_data_reply();
    let mut bincode = BytesMut::new();
    crate::rpc::message::encode_bincode(&shared, &mut bincode);
    assert_eq!(encode(&shared), bincode.freeze());
    assert_only_the_whole_encoding_decodes(shared);
    // A length prefix past the payload is refused before anything is allocated.
    let mut hostile = BytesMut::new();
    hostile.put_u64_le(1);
    hostile.put_u64_le(2);
    hostile.put_u64_le(u64::MAX);
    assert!(backup::RecoveryDataReply::decode(hostile.freeze()).is_err());
}

/// A shared piece's limits are the decoder's: at the limit it decodes, one past it is
/// refused with the limit named, as is a tag that is neither none nor a piece.
#[test]
fn a_shared_piece_past_its_limits_is_refused() {
    let with = |region: String, runs: usize| backup::RecoveryDataReply {
        shared: Some(backup::SharedPiece {
            region,
            nonce: 1,
            runs: vec![
                backup::SharedRun {
                    slot: 0,
                    generation: 2,
                    len: 1,
                };
                runs
            ],
        }),
        ..shared_recovery_data_reply()
    };
    let decode = |reply: &backup::RecoveryDataReply| {
        backup::RecoveryDataReply::decode(encode(reply)).map_err(|error| error.0)
    };
    let path = |bytes: usize| "p".repeat(bytes);
    let at_limits = with(
        path(backup::SHARED_PIECE_PATH_BYTES_MAX),
        backup::SHARED_PIECE_RUNS_MAX,
    );
    assert_eq!(decode(&at_limits).as_ref(), Ok(&at_limits));
    let long_path = with(path(backup::SHARED_PIECE_PATH_BYTES_MAX + 1), 1);
    let error = decode(&long_path).expect_err("a path past the limit");
    let beyond = backup::SHARED_PIECE_PATH_BYTES_MAX + 1;
    assert!(
        error.contains(&format!("region path of {beyond} bytes")),
        "{error}"
    );
    let many_runs = with(path(8), backup::SHARED_PIECE_RUNS_MAX + 1);
    let error = decode(&many_runs).expect_err("runs past the limit");
    let beyond = backup::SHARED_PIECE_RUNS_MAX + 1;
    assert!(error.contains(&format!("{beyond} runs")), "{error}");
    // The tag byte follows the entries' length, the entries and the count.
    let mut bad_tag = encode(&recovery_data_reply()).to_vec();
    let last = bad_tag.len() - 1;
    bad_tag[last] = 2;
    let error = backup::RecoveryDataReply::decode(Bytes::from(bad_tag)).expect_err("tag 2");
    assert!(error.0.contains("shared piece tag 2"), "{error:?}");
}

/// Decodes `payload` as every message type; the results do not matter, only that
/// no decoder panics.
fn decode_as_everything(payload: &Bytes) {
    let _ = coordinator::EnlistRequest::decode(payload.clone());
    let _ = coordinator::EnlistReply::decode(payload.clone());
    let _ = coordinator::CreateTableRequest::decode(payload.clone());
    let _ = coordinator::TableIdReply::decode(payload.clone());
    let _ = coordinator::TableNameRequest::decode(payload.clone());
    let _ = coordinator::TabletMapRequest::decode(payload.clone());
    let _ = TabletMap::decode(payload.clone());
    let _ = master::ReadRequest::decode(payload.clone());
    let _ = master::ReadReply::decode(payload.clone());
    let _ = master::WriteRequest::decode(payload.clone());
    let _ = master::WriteReply::decode(payload.clone());
    let _ = master::RemoveRequest::decode(payload.clone());
    let _ = master::IncrementRequest::decode(payload.clone());
    let _ = master::IncrementReply::decode(payload.clone());
    let _ = master::MultiReadRequest::decode(payload.clone());
    let _ = master::MultiReadReply::decode(payload.clone());
    let _ = master::MultiWriteRequest::decode(payload.clone());
    let _ = master::MultiRemoveRequest::decode(payload.clone());
    let _ = master::MultiWriteReply::decode(payload.clone());
    let _ = master::EnumerateRequest::decode(payload.clone());
    let _ = master::EnumerateReply::decode(payload.clone());
    let _ = master::TabletsRequest::decode(payload.clone());
    let _ = master::PingRequest::decode(payload.clone());
    let _ = master::PingReply::decode(payload.clone());
    let _ = backup::RecoveryDataReply::decode(payload.clone());
    let _ = <()>::decode(payload.clone());
}

/// Valid encodings to mutate: random bytes alone rarely get past the first length
/// prefix, mutations of real messages reach the decoders' inner paths.
fn valid_encodings() -> Vec<Bytes> {
    vec![
        encode(&enlist_request()),
        encode(&tablet_map()),
        encode(&multi_read_request()),
        encode(&enumerate_reply()),
        encode(&read_request()),
        encode(&recovery_data_reply()),
        encode(&shared_recovery_data_reply()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_payloads_never_panic_the_protocol_decoders(
        bytes in proptest::collection::vec(any::<u8>(), 0..=256),
    ) {
        decode_as_everything(&Bytes::from(bytes));
    }

    #[test]
    fn mutated_encodings_never_panic_the_protocol_decoders(
        which in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..=4),
        cut in any::<prop::sample::Index>(),
    ) {
        let encodings = valid_encodings();
        let mut bytes = encodings[which.index(encodings.len())].to_vec();
        for (at, value) in flips {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        decode_as_everything(&Bytes::from(bytes));
    }
}
