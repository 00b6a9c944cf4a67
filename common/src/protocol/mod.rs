//! Every RPC of every service: opcode, request and reply.
//!
//! * [`master`] — the data API served by masters, and tablet ownership changes sent
//!   to them by the coordinator.
//! * [`coordinator`] — enlistment, tables and the tablet map.
//! * [`backup`] — segment replicas: open, write, close, free, list, read.
//!
//! Opcodes are stable wire constants: masters use 1–99, coordinators 100–199, backups
//! 200–299. Each RPC
//! is a zero-sized marker type implementing [`crate::rpc::Rpc`], so a call site reads
//! `pool.call::<Read>(addr, &request, deadline)` and cannot pair a request with the
//! wrong reply type.

pub mod backup;
pub mod coordinator;
pub mod master;
mod rpcs;

use crate::rpc::Opcode;

/// The name of an opcode, if it is one of ours.
pub fn opcode_name(opcode: Opcode) -> Option<&'static str> {
    master::OPCODE_NAMES
        .iter()
        .chain(coordinator::OPCODE_NAMES)
        .chain(backup::OPCODE_NAMES)
        .find(|(code, _)| *code == opcode.0)
        .map(|(_, name)| *name)
}

#[cfg(test)]
mod decoder_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn opcodes_are_unique_across_services() {
        let all: Vec<u16> = master::OPCODE_NAMES
            .iter()
            .chain(coordinator::OPCODE_NAMES)
            .chain(backup::OPCODE_NAMES)
            .map(|(c, _)| *c)
            .collect();
        let unique: HashSet<u16> = all.iter().copied().collect();
        assert_eq!(all.len(), unique.len());
        assert!(
            all.iter().all(|code| *code < 0x8000),
            "the high bit marks replies"
        );
    }
}
