//! `MasterService`: the master's RPC handlers.
//!
//! Reads take the store lock only long enough to look up the object and copy its
//! value into the reply frame. Write-type requests go through the [`Appender`], which
//! replies once the write is durable and visible. Every request is validated before it
//! touches the store: an oversized key or value, an unknown opcode or a malformed
//! payload gets its status and the master keeps serving.

use bytes::Bytes;
use parking_lot::Mutex;
use rampart_common::config::MasterConfig;
use rampart_common::ids::ServerId;
use rampart_common::limits::MULTI_OPS_MAX;
use rampart_common::protocol::master::{
    self as proto, EnumerateRequest, IncrementRequest, MultiReadReply, MultiReadRequest,
    MultiRemoveRequest, MultiWriteReply, MultiWriteRequest, PingReply, ReadRequest, RemoveRequest,
    TabletsRequest, WriteRequest,
};
use rampart_common::rpc::server::HandleFuture;
use rampart_common::rpc::{Opcode, Reply, Rpc, Service};
use rampart_common::status::Status;
use std::sync::Arc;

use crate::appender::Appender;
use crate::object_store::{ObjectStore, WriteOp};

/// The master service of one storage server.
#[derive(Debug)]
pub struct MasterService {
    id: ServerId,
    /// The store. A `parking_lot` mutex, not an async one: nothing awaits while holding
    /// it, and every critical section is a lookup or a batch of appends.
    store: Arc<Mutex<ObjectStore>>,
    appender: Appender,
}

impl MasterService {
    /// A master with an empty log; must run inside a tokio runtime (it spawns the
    /// appender).
    ///
    /// # Panics
    /// If `config` does not validate (callers validate at start-up).
    pub fn new(id: ServerId, config: MasterConfig) -> MasterService {
        let store = Arc::new(Mutex::new(ObjectStore::new(id, config)));
        let appender = Appender::spawn(Arc::clone(&store));
        MasterService {
            id,
            store,
            appender,
        }
    }

    /// This master's server id.
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// The store, for tests and statistics.
    pub fn store(&self) -> &Arc<Mutex<ObjectStore>> {
        &self.store
    }

    async fn write_ops(
        &self,
        ops: Vec<WriteOp>,
    ) -> Result<Vec<crate::object_store::OpOutcome>, Reply> {
        self.appender
            .submit(ops)
            .await
            .map_err(|e| Reply::error(Status::ShuttingDown, e))
    }

    /// Requests served from memory without waiting — reads, enumerate, ping — which the
    /// RPC layer runs on the connection's task (see `Service::handle_now`).
    fn handle_immediately(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        let reply = match opcode {
            proto::Read::OPCODE => {
                let request: ReadRequest = match Reply::decode(payload.clone()) {
                    Ok(r) => r,
                    Err(reply) => return Some(reply),
                };
                let store = self.store.lock();
                // The value is copied once, from the log into the reply frame.
                store.read_with(request.table, &request.key, |status, version, value| {
                    Reply::ok_with(|out| proto::encode_read_reply(out, status, version, value))
                })
            }
            proto::MultiRead::OPCODE => {
                let request: MultiReadRequest = match Reply::decode(payload.clone()) {
                    Ok(r) => r,
                    Err(reply) => return Some(reply),
                };
                if let Err(reply) = check_multi(request.objects.len()) {
                    return Some(reply);
                }
                let store = self.store.lock();
                let objects = request
                    .objects
                    .iter()
                    .map(|o| store.read(o.table, &o.key))
                    .collect();
                Reply::ok(&MultiReadReply { objects })
            }
            proto::Enumerate::OPCODE => {
                let request: EnumerateRequest = match Reply::decode(payload.clone()) {
                    Ok(r) => r,
                    Err(reply) => return Some(reply),
                };
                match self.store.lock().enumerate(&request) {
                    Ok(page) => Reply::ok(&page),
                    Err(status) => Reply::error(status, "enumerate"),
                }
            }
            proto::Ping::OPCODE => {
                let store = self.store.lock();
                let (used, max) = store.log_bytes();
                Reply::ok(&PingReply {
                    objects: store.object_count(),
                    log_bytes_used: used,
                    log_bytes_max: max,
                })
            }
            _ => return None,
        };
        Some(reply)
    }

    async fn handle_request(&self, opcode: Opcode, payload: Bytes) -> Reply {
        if let Some(reply) = self.handle_immediately(opcode, &payload) {
            return reply;
        }
        match opcode {
            proto::Write::OPCODE => {
                let request: WriteRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let op = WriteOp::Write {
                    table: request.table,
                    key: request.key,
                    value: request.value,
                    rules: request.rules,
                };
                match self.write_ops(vec![op]).await {
                    Ok(outcomes) => Reply::ok(&single(outcomes).into_write_reply()),
                    Err(reply) => reply,
                }
            }
            proto::Remove::OPCODE => {
                let request: RemoveRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let op = WriteOp::Remove {
                    table: request.table,
                    key: request.key,
                    rules: request.rules,
                };
                match self.write_ops(vec![op]).await {
                    Ok(outcomes) => Reply::ok(&single(outcomes).into_write_reply()),
                    Err(reply) => reply,
                }
            }
            proto::Increment::OPCODE => {
                let request: IncrementRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let op = WriteOp::Increment {
                    table: request.table,
                    key: request.key,
                    delta: request.delta,
                    rules: request.rules,
                };
                match self.write_ops(vec![op]).await {
                    Ok(outcomes) => Reply::ok(&single(outcomes).into_increment_reply()),
                    Err(reply) => reply,
                }
            }
            proto::MultiWrite::OPCODE => {
                let request: MultiWriteRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                if let Err(reply) = check_multi(request.objects.len()) {
                    return reply;
                }
                let ops = request
                    .objects
                    .into_iter()
                    .map(|o| WriteOp::Write {
                        table: o.table,
                        key: o.key,
                        value: o.value,
                        rules: o.rules,
                    })
                    .collect();
                self.multi_write_reply(ops).await
            }
            proto::MultiRemove::OPCODE => {
                let request: MultiRemoveRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                if let Err(reply) = check_multi(request.objects.len()) {
                    return reply;
                }
                let ops = request
                    .objects
                    .into_iter()
                    .map(|o| WriteOp::Remove {
                        table: o.table,
                        key: o.key,
                        rules: o.rules,
                    })
                    .collect();
                self.multi_write_reply(ops).await
            }
            proto::TakeTablets::OPCODE => {
                let request: TabletsRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                tracing::info!(master = %self.id, tablets = request.tablets.len(), "taking tablets");
                match self.appender.take_tablets(request.tablets).await {
                    Ok(()) => Reply::ok(&()),
                    Err(e) => Reply::error(Status::ShuttingDown, e),
                }
            }
            proto::DropTablets::OPCODE => {
                let request: TabletsRequest = match Reply::decode(payload) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                match self.appender.drop_tablets(request.tablets).await {
                    Ok(removed) => {
                        tracing::info!(master = %self.id, removed, "dropped tablets");
                        Reply::ok(&())
                    }
                    Err(e) => Reply::error(Status::ShuttingDown, e),
                }
            }
            other => Reply::error(
                Status::UnknownOpcode,
                format!("master does not serve {other}"),
            ),
        }
    }

    async fn multi_write_reply(&self, ops: Vec<WriteOp>) -> Reply {
        match self.write_ops(ops).await {
            Ok(outcomes) => Reply::ok(&MultiWriteReply {
                objects: outcomes.into_iter().map(|o| o.into_write_reply()).collect(),
            }),
            Err(reply) => reply,
        }
    }
}

impl Service for MasterService {
    fn handle(&self, opcode: Opcode, payload: Bytes) -> HandleFuture<'_> {
        Box::pin(self.handle_request(opcode, payload))
    }

    fn handle_now(&self, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        self.handle_immediately(opcode, payload)
    }
}

fn single(outcomes: Vec<crate::object_store::OpOutcome>) -> crate::object_store::OpOutcome {
    outcomes
        .into_iter()
        .next()
        .expect("one outcome per submitted op")
}

fn check_multi(count: usize) -> Result<(), Reply> {
    if count > MULTI_OPS_MAX {
        return Err(Reply::error(
            Status::InvalidArgument,
            format!("{count} objects in one request; the limit is {MULTI_OPS_MAX}"),
        ));
    }
    Ok(())
}
