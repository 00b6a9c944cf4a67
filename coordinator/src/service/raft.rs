//! The coordinators among themselves: `RaftStatus` (any coordinator answers) and
//! `RaftMessages`, which carries Raft's own traffic to this member's node.

use rampart_common::protocol::coordinator::RaftMessagesRequest;
use rampart_common::rpc::Reply;
use rampart_common::status::Status;

use super::shared::{node_error_reply, CoordinatorService};

impl CoordinatorService {
    /// `RaftStatus`: this member's role, term, leader and indexes. Its request carries
    /// nothing, and its payload is not read.
    pub(super) async fn raft_status(&self) -> Reply {
        Reply::ok(&self.node.status())
    }

    /// `RaftMessages`: Raft messages from another member of this group, handed to the
    /// node.
    pub(super) async fn raft_messages(&self, request: RaftMessagesRequest) -> Result<(), Reply> {
        if request.group != self.node.group() {
            let detail = format!(
                "raft messages from coordinator {} of group {:016x}; this coordinator \
                 belongs to group {:016x} (another cluster, or a member of an old \
                 group left running after the group was re-created)",
                request.from,
                request.group,
                self.node.group()
            );
            return Err(Reply::error(Status::InvalidArgument, detail));
        }
        if !self.node.peers().contains_key(&request.from) {
            let detail = format!(
                "raft messages from {}, which is not a member of this group",
                request.from
            );
            return Err(Reply::error(Status::InvalidArgument, detail));
        }
        let messages = match crate::node::decode_messages(&request) {
            Ok(messages) => messages,
            Err(detail) => return Err(Reply::error(Status::MalformedRequest, detail)),
        };
        self.node.receive(messages).map_err(node_error_reply)
    }
}
