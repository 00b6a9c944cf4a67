//! RPCs served by the coordinator.

use super::rpcs;
use crate::bincode_message;
use crate::ids::{ServerId, TableId};
use crate::tablet::{Services, TabletMap};
use serde::{Deserialize, Serialize};

/// A storage server announces itself and receives its id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnlistRequest {
    /// Where its RPC listener is reachable.
    pub addr: String,
    /// What it runs.
    pub services: Services,
    /// Its failure domain (rack).
    pub failure_domain: String,
    /// Its backup's measured disk read bandwidth, MB/s.
    pub disk_read_mbps: u32,
}

/// The id assigned at enlistment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnlistReply {
    /// The new server's id.
    pub id: ServerId,
}

/// Create a table spread over `span` tablets. Creating an existing name returns its id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTableRequest {
    /// The table's name.
    pub name: String,
    /// How many tablets to split it into (spread over the masters).
    pub span: u32,
}

/// The id of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableIdReply {
    /// The table.
    pub id: TableId,
}

/// Names a table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableNameRequest {
    /// The table's name.
    pub name: String,
}

/// Asks for the whole tablet map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletMapRequest {}

bincode_message!(
    EnlistRequest,
    EnlistReply,
    CreateTableRequest,
    TableIdReply,
    TableNameRequest,
    TabletMapRequest,
    TabletMap,
);

rpcs! {
    /// Enlist a storage server.
    Enlist = 100: EnlistRequest => EnlistReply;
    /// Create a table (idempotent by name).
    CreateTable = 101: CreateTableRequest => TableIdReply;
    /// Drop a table (idempotent; dropping a missing table succeeds).
    DropTable = 102: TableNameRequest => ();
    /// Look up a table's id (`TableDoesntExist` if none).
    GetTableId = 103: TableNameRequest => TableIdReply;
    /// The server list and every table's tablets.
    GetTabletMap = 104: TabletMapRequest => TabletMap;
}
