//! `Status`: the result code carried in every RPC reply header.
//!
//! Codes are stable `u16`s on the wire. The enum is `#[non_exhaustive]`: a newer peer may
//! send a code this build does not know, which decodes as [`Status::Unrecognized`] rather
//! than failing the whole reply.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The outcome of one RPC. `Ok` means the payload holds the operation's reply; any other
/// value means the payload is empty or a human-readable detail string.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Status {
    /// Success.
    Ok,
    /// The server does not own the tablet for this key hash (any more, or yet). The
    /// client refreshes its tablet map and retries.
    UnknownTablet,
    /// No table with this name or id exists.
    TableDoesntExist,
    /// A table with this name exists already.
    TableExists,
    /// A reject rule fired: the object does not exist.
    ObjectDoesntExist,
    /// A reject rule fired: the object exists.
    ObjectExists,
    /// A reject rule fired: the object's version did not satisfy the rule.
    WrongVersion,
    /// The master's log memory is full; the write was not applied.
    NoSpace,
    /// The key is longer than [`crate::limits::KEY_BYTES_MAX`].
    KeyTooLarge,
    /// The value is longer than the server's configured limit.
    ValueTooLarge,
    /// `increment` on an object whose value is not an 8-byte integer.
    NotAnInteger,
    /// The request could not be decoded.
    MalformedRequest,
    /// The opcode is not served by this process.
    UnknownOpcode,
    /// The frame's payload exceeds [`crate::limits::RPC_PAYLOAD_BYTES_MAX`].
    MessageTooLarge,
    /// A request argument is invalid (detail in the payload).
    InvalidArgument,
    /// The server is too busy or not ready yet; try again later.
    Retry,
    /// The server is shutting down.
    ShuttingDown,
    /// There are not enough servers to do what was asked (e.g. a table span larger than
    /// the number of masters).
    NotEnoughServers,
    /// A bug or an unexpected failure on the server (detail in the payload).
    Internal,
    /// A backup refused a replica operation whose epoch is older than the replica's.
    StaleEpoch,
    /// A backup has no open frame with this handle (never opened, closed or freed).
    UnknownFrame,
    /// A backup cannot take another replica: no free frame, or its disk is full.
    BackupFull,
    /// A backup fenced this replica (recovery of its master has begun): the write may not
    /// be acknowledged.
    Fenced,
    /// This coordinator is not the Raft leader (or, being leader, cannot reach a majority
    /// of coordinators): it changed nothing. The detail names the leader when known
    /// (see [`crate::protocol::coordinator::NotLeaderHint`]); callers retry there, or
    /// every coordinator in turn, until their deadline.
    NotLeader,
    /// The coordinator declared this server crashed: its tablets are (being) recovered
    /// elsewhere. A master told so stops serving and exits.
    ServerCrashed,
    /// A recovery cannot proceed: its log is incomplete, or a partition could not be
    /// replayed (detail in the payload).
    RecoveryFailed,
    /// The request names another server than the one that received it: a server was
    /// restarted at the address of the one the sender meant (a new server, with a new
    /// id). Ownership changes are refused so; the sender's view of the address is stale.
    WrongServer,
    /// A retried write whose client already acknowledged having its outcome
    /// (`rifl::Rifl::ack`): it is never executed again. A client that follows the
    /// protocol never sees it.
    StaleRequest,
    /// The client's lease expired (it stopped renewing it, for longer than
    /// `rifl::CLIENT_LEASE`): its completion records may be gone, so none of its writes
    /// is executed any more. The client must open a new identity.
    ClientLeaseExpired,
    /// The connection presented no cluster token where the cluster requires one
    /// (`crate::auth`); it is closed after this answer.
    Unauthenticated,
    /// A move of tablets was aborted: they stay with their owner (the detail says why).
    /// Nothing was lost; the move may be asked for again.
    MoveAborted,
    /// The coordinator removed this server after draining it (`rampart drain`): it holds
    /// nothing the cluster needs. A master told so stops serving and exits cleanly.
    ServerDrained,
    /// A code this build does not know.
    Unrecognized(u16),
}

impl Status {
    /// The wire code.
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 0,
            Status::UnknownTablet => 1,
            Status::TableDoesntExist => 2,
            Status::TableExists => 3,
            Status::ObjectDoesntExist => 4,
            Status::ObjectExists => 5,
            Status::WrongVersion => 6,
            Status::NoSpace => 7,
            Status::KeyTooLarge => 8,
            Status::ValueTooLarge => 9,
            Status::NotAnInteger => 10,
            Status::MalformedRequest => 11,
            Status::UnknownOpcode => 12,
            Status::MessageTooLarge => 13,
            Status::InvalidArgument => 14,
            Status::Retry => 15,
            Status::ShuttingDown => 16,
            Status::NotEnoughServers => 17,
            Status::Internal => 18,
            Status::StaleEpoch => 19,
            Status::UnknownFrame => 20,
            Status::BackupFull => 21,
            Status::Fenced => 22,
            Status::NotLeader => 23,
            Status::ServerCrashed => 24,
            Status::RecoveryFailed => 25,
            Status::WrongServer => 26,
            Status::StaleRequest => 27,
            Status::ClientLeaseExpired => 28,
            Status::Unauthenticated => 29,
            Status::MoveAborted => 30,
            Status::ServerDrained => 31,
            Status::Unrecognized(code) => code,
        }
    }

    /// Decodes a wire code; unknown codes become [`Status::Unrecognized`].
    pub fn from_code(code: u16) -> Status {
        match code {
            0 => Status::Ok,
            1 => Status::UnknownTablet,
            2 => Status::TableDoesntExist,
            3 => Status::TableExists,
            4 => Status::ObjectDoesntExist,
            5 => Status::ObjectExists,
            6 => Status::WrongVersion,
            7 => Status::NoSpace,
            8 => Status::KeyTooLarge,
            9 => Status::ValueTooLarge,
            10 => Status::NotAnInteger,
            11 => Status::MalformedRequest,
            12 => Status::UnknownOpcode,
            13 => Status::MessageTooLarge,
            14 => Status::InvalidArgument,
            15 => Status::Retry,
            16 => Status::ShuttingDown,
            17 => Status::NotEnoughServers,
            18 => Status::Internal,
            19 => Status::StaleEpoch,
            20 => Status::UnknownFrame,
            21 => Status::BackupFull,
            22 => Status::Fenced,
            23 => Status::NotLeader,
            24 => Status::ServerCrashed,
            25 => Status::RecoveryFailed,
            26 => Status::WrongServer,
            27 => Status::StaleRequest,
            28 => Status::ClientLeaseExpired,
            29 => Status::Unauthenticated,
            30 => Status::MoveAborted,
            31 => Status::ServerDrained,
            other => Status::Unrecognized(other),
        }
    }

    /// Whether the status rejects a write because of its reject rules.
    pub fn is_rejection(self) -> bool {
        matches!(
            self,
            Status::ObjectDoesntExist | Status::ObjectExists | Status::WrongVersion
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Status::Ok => "ok",
            Status::UnknownTablet => "server does not own this tablet",
            Status::TableDoesntExist => "table does not exist",
            Status::TableExists => "table exists already",
            Status::ObjectDoesntExist => "object does not exist",
            Status::ObjectExists => "object exists",
            Status::WrongVersion => "object version does not match",
            Status::NoSpace => "master log memory is full",
            Status::KeyTooLarge => "key too large",
            Status::ValueTooLarge => "value too large",
            Status::NotAnInteger => "value is not an 8-byte integer",
            Status::MalformedRequest => "malformed request",
            Status::UnknownOpcode => "unknown opcode",
            Status::MessageTooLarge => "message too large",
            Status::InvalidArgument => "invalid argument",
            Status::Retry => "server busy, retry",
            Status::ShuttingDown => "server shutting down",
            Status::NotEnoughServers => "not enough servers",
            Status::Internal => "internal server error",
            Status::StaleEpoch => "replica epoch is stale",
            Status::UnknownFrame => "no such open frame on the backup",
            Status::BackupFull => "backup has no room for the replica",
            Status::Fenced => "replica fenced by its backup",
            Status::NotLeader => "coordinator is not the Raft leader",
            Status::ServerCrashed => "server was declared crashed",
            Status::RecoveryFailed => "recovery failed",
            Status::WrongServer => "request meant for another server at this address",
            Status::StaleRequest => "retried write that its client had acknowledged",
            Status::ClientLeaseExpired => "client lease expired",
            Status::Unauthenticated => "no cluster token presented",
            Status::MoveAborted => "move of tablets aborted",
            Status::ServerDrained => "server was drained and removed",
            Status::Unrecognized(code) => return write!(f, "unrecognized status {code}"),
        };
        f.write_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0..=100u16 {
            assert_eq!(Status::from_code(code).code(), code);
        }
        assert_eq!(Status::from_code(500), Status::Unrecognized(500));
    }
}
