//! Helpers of the state's tests: a cluster of masters, and commands applied with their
//! expected outcome.

use super::command::{Command, CommandResult};
use super::core::CoordinatorState;
use rampart_common::ids::{MoveId, ServerId, TableId};
use rampart_common::status::Status;
use rampart_common::tablet::{HashRange, ServerStatus, Services, Tablet};

pub(super) const BOTH: Services = Services {
    master: true,
    backup: true,
};
pub(super) const BACKUP_ONLY: Services = Services {
    master: false,
    backup: true,
};

pub(super) fn enlist(state: &mut CoordinatorState, addr: &str, services: Services) -> ServerId {
    match state.apply(&Command::EnlistServer {
        addr: addr.to_owned(),
        services,
        failure_domain: "rack-1".to_owned(),
        disk_read_mbps: 500,
    }) {
        CommandResult::Enlisted { id } => id,
        other => panic!("enlist failed: {other:?}"),
    }
}

pub(super) fn create(state: &mut CoordinatorState, name: &str, span: u32) -> CommandResult {
    state.apply(&Command::CreateTable {
        name: name.to_owned(),
        span,
    })
}

pub(super) fn created(
    state: &mut CoordinatorState,
    name: &str,
    span: u32,
) -> (TableId, Vec<Tablet>) {
    match create(state, name, span) {
        CommandResult::TableCreated {
            id,
            tablets,
            created: true,
            ..
        } => (id, tablets),
        other => panic!("create failed: {other:?}"),
    }
}

pub(super) fn cluster(masters: usize) -> (CoordinatorState, Vec<ServerId>) {
    let mut state = CoordinatorState::new();
    let ids = (0..masters)
        .map(|i| enlist(&mut state, &format!("10.0.0.{i}:7000"), BOTH))
        .collect();
    (state, ids)
}

pub(super) fn assert_rejected(state: &mut CoordinatorState, command: Command, status: Status) {
    let before = state.clone();
    match state.apply(&command) {
        CommandResult::Rejected { status: got, .. } => assert_eq!(got, status, "{command:?}"),
        other => panic!("{command:?} not rejected: {other:?}"),
    }
    assert_eq!(*state, before, "{command:?} changed the state");
}

pub(super) fn crash(state: &mut CoordinatorState, id: ServerId) {
    let result = state.apply(&Command::SetServerStatus {
        id,
        status: ServerStatus::Crashed,
    });
    assert_eq!(result, CommandResult::StatusSet);
}

pub(super) fn recovered(crashed: ServerId, ranges: Vec<HashRange>, owner: ServerId) -> Command {
    Command::RecoveredPartition {
        crashed,
        ranges,
        owner,
    }
}

pub(super) fn begin(table: TableId, tablet: &Tablet, target: ServerId) -> Command {
    Command::BeginMove {
        table,
        start: tablet.start_hash,
        end: tablet.end_hash,
        target,
    }
}

pub(super) fn begun(state: &mut CoordinatorState, command: &Command) -> MoveId {
    match state.apply(command) {
        CommandResult::MoveBegun {
            id, begun: true, ..
        } => id,
        other => panic!("{command:?} did not begin: {other:?}"),
    }
}

pub(super) fn commit(state: &mut CoordinatorState, id: MoveId) {
    match state.apply(&Command::CommitMove { id }) {
        CommandResult::MoveEnded { .. } => {}
        other => panic!("{id} did not commit: {other:?}"),
    }
}

pub(super) fn other_than(ids: &[ServerId], owner: ServerId) -> ServerId {
    ids.iter().copied().find(|&id| id != owner).expect("two")
}
