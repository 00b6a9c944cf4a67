//! A fake cluster for the gateway's tests: a coordinator serving the map of one table
//! of one tablet, owned by one master that keeps objects in a map and serves `Read`,
//! `Write`, `MultiRead`, `MultiWrite` and `Enumerate`, counting them. Enough for a real
//! `Client`, hence a real [`Gateway`] on a loopback port, so the connection loop
//! (deadlines, caps, reply bounds, `SCAN`, pipelines) is tested in-process.

use bytes::Bytes;
use rampart_client::{Client, ClientOptions};
use rampart_common::auth::ClusterToken;
use rampart_common::ids::{key_hash, ClientId, ServerId, TableId, Version};
use rampart_common::protocol::coordinator::{
    CreateTable, GetTabletMap, OpenClient, OpenClientReply, TableIdReply,
};
use rampart_common::protocol::master::{
    Enumerate, EnumerateReply, EnumerateRequest, EnumeratedObject, MultiRead, MultiReadReply,
    MultiReadRequest, MultiWrite, MultiWriteReply, MultiWriteRequest, Read, ReadReply, ReadRequest,
    Write, WriteReply, WriteRequest,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, RpcServer, Service};
use rampart_common::status::Status;
use rampart_common::tablet::{ServerInfo, ServerStatus, Services, TableInfo, Tablet, TabletMap};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

use crate::gateway::{ConnectionLimits, Gateway};

/// The table the fake cluster holds.
const TABLE: TableId = TableId(1);

/// A gateway in front of a fake cluster holding `keys` (values empty).
#[derive(Debug)]
pub struct FakeCluster {
    /// The master, to count what it was asked.
    pub master: Arc<FakeMaster>,
    /// The gateway's address.
    pub gateway: SocketAddr,
}

impl FakeCluster {
    /// Starts the cluster and a gateway with `limits`, demanding `AUTH` if `password`.
    pub async fn start(
        keys: &[Bytes],
        limits: ConnectionLimits,
        password: Option<ClusterToken>,
    ) -> FakeCluster {
        let objects = keys
            .iter()
            .map(|key| ((key_hash(key).0, key.clone()), (Version(1), Bytes::new())))
            .collect();
        let master = Arc::new(FakeMaster {
            objects: Mutex::new(objects),
            keys_returned: AtomicU64::new(0),
            calls: Mutex::new(BTreeMap::new()),
        });
        let master_addr = serve(Arc::clone(&master)).await;
        let coordinator = serve(Arc::new(FakeCoordinator {
            map: one_master_map(master_addr),
        }))
        .await;
        let options = ClientOptions {
            deadline: Duration::from_secs(2),
            ..ClientOptions::default()
        };
        let client = Client::connect_with(&[coordinator], options)
            .await
            .expect("the fake coordinator answers");
        let gateway = Gateway::new(client, "redis", 1)
            .await
            .expect("the fake coordinator creates the table")
            .with_password(password)
            .with_connection_limits(limits);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(Arc::new(gateway).serve(listener, std::future::pending()));
        FakeCluster {
            master,
            gateway: addr,
        }
    }
}

/// Serves the map and a client id; creates table `redis` as [`TABLE`].
#[derive(Debug)]
struct FakeCoordinator {
    map: TabletMap,
}

impl Service for FakeCoordinator {
    fn handle(&self, opcode: Opcode, _payload: Bytes) -> HandleFuture<'_> {
        Box::pin(async move {
            match opcode {
                GetTabletMap::OPCODE => Reply::ok(&self.map),
                OpenClient::OPCODE => Reply::ok(&OpenClientReply {
                    client: ClientId(7),
                    lease_ms: 30_000,
                }),
                CreateTable::OPCODE => Reply::ok(&TableIdReply { id: TABLE }),
                _ => Reply::error(Status::UnknownOpcode, "fake coordinator"),
            }
        })
    }
}

/// Largest value the fake master takes (a real master's `--value-bytes-max`, made
/// small): a longer one is refused `ValueTooLarge`.
pub const FAKE_VALUE_BYTES_MAX: usize = 1024;

/// Keeps objects in a map and serves reads, writes and enumerations of them.
#[derive(Debug)]
pub struct FakeMaster {
    /// By (key hash, key): (version, value).
    objects: Mutex<BTreeMap<(u64, Bytes), (Version, Bytes)>>,
    /// Keys it returned in enumeration pages, in all.
    pub keys_returned: AtomicU64,
    /// Requests it served, by opcode.
    calls: Mutex<BTreeMap<u16, u64>>,
}

impl FakeMaster {
    /// Requests of `R` it served.
    pub fn calls<R: Rpc>(&self) -> u64 {
        let calls = self.calls.lock().expect("not poisoned");
        calls.get(&R::OPCODE.0).copied().unwrap_or(0)
    }

    fn read(&self, request: &ReadRequest) -> ReadReply {
        let objects = self.objects.lock().expect("not poisoned");
        match objects.get(&(key_hash(&request.key).0, request.key.clone())) {
            Some((version, value)) => ReadReply {
                status: Status::Ok,
                version: *version,
                value: value.clone(),
            },
            None => ReadReply {
                status: Status::ObjectDoesntExist,
                version: Version(0),
                value: Bytes::new(),
            },
        }
    }

    fn write(&self, request: WriteRequest) -> WriteReply {
        if request.value.len() > FAKE_VALUE_BYTES_MAX {
            return WriteReply {
                status: Status::ValueTooLarge,
                version: Version(0),
            };
        }
        let mut objects = self.objects.lock().expect("not poisoned");
        let at = (key_hash(&request.key).0, request.key);
        let current = objects.get(&at).map(|(version, _)| *version);
        if let Some(status) = request.rules.check(current) {
            return WriteReply {
                status,
                version: current.unwrap_or(Version(0)),
            };
        }
        let version = Version(current.map_or(1, |v| v.0 + 1));
        objects.insert(at, (version, request.value));
        WriteReply {
            status: Status::Ok,
            version,
        }
    }

    fn enumerate(&self, request: &EnumerateRequest) -> EnumerateReply {
        let objects = self.objects.lock().expect("not poisoned");
        let mut page = Vec::new();
        let mut bytes = 0;
        let mut next_hash = None;
        for ((hash, key), (version, value)) in objects.range((request.resume_hash, Bytes::new())..)
        {
            if *hash > request.end_hash {
                break;
            }
            if bytes >= request.max_bytes as usize {
                next_hash = Some(*hash);
                break;
            }
            bytes += key.len() + value.len();
            page.push(EnumeratedObject {
                key: key.clone(),
                version: *version,
                value: value.clone(),
            });
        }
        self.keys_returned
            .fetch_add(page.len() as u64, Ordering::Relaxed);
        EnumerateReply {
            objects: page,
            next_hash,
        }
    }
}

impl Service for FakeMaster {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        Box::pin(async move {
            *self
                .calls
                .lock()
                .expect("not poisoned")
                .entry(opcode.0)
                .or_insert(0) += 1;
            let served = match opcode {
                Read::OPCODE => Reply::decode(payload).map(|r| Reply::ok(&self.read(&r))),
                Write::OPCODE => Reply::decode(payload).map(|w| Reply::ok(&self.write(w))),
                MultiRead::OPCODE => Reply::decode::<MultiReadRequest>(payload).map(|request| {
                    let objects = request
                        .objects
                        .into_iter()
                        .map(|o| {
                            self.read(&ReadRequest {
                                table: o.table,
                                key: o.key,
                            })
                        })
                        .collect();
                    Reply::ok(&MultiReadReply { objects })
                }),
                MultiWrite::OPCODE => Reply::decode::<MultiWriteRequest>(payload).map(|request| {
                    let objects = request.objects.into_iter().map(|w| self.write(w)).collect();
                    Reply::ok(&MultiWriteReply { objects })
                }),
                Enumerate::OPCODE => Reply::decode(payload).map(|e| Reply::ok(&self.enumerate(&e))),
                _ => Ok(Reply::error(Status::UnknownOpcode, "fake master")),
            };
            served.unwrap_or_else(|reply| reply)
        })
    }
}

/// Serves `service` on a port of its own; its address.
async fn serve(service: Arc<impl Service>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound").to_string();
    tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
    addr
}

/// [`TABLE`] in one tablet, owned by server 9 at `addr`.
fn one_master_map(addr: String) -> TabletMap {
    TabletMap {
        version: 2,
        servers: vec![ServerInfo {
            id: ServerId(9),
            addr,
            services: Services {
                master: true,
                backup: true,
            },
            status: ServerStatus::Up,
            failure_domain: "rack".into(),
            disk_read_mbps: 100,
        }],
        tables: vec![TableInfo {
            id: TABLE,
            name: "redis".into(),
            tablets: vec![Tablet {
                table: TABLE,
                start_hash: 0,
                end_hash: u64::MAX,
                owner: ServerId(9),
            }],
        }],
    }
}
