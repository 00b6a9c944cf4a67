//! `Recovery`: the recovery of a crashed master, with the coordinator's real planning
//! (`rampart_coordinator::recovery_plan`: `check_log`, `choose_sources`) over what the
//! simulated backups list, and the copies read cut into each partition's pieces as the
//! backups and recovery masters do (the real `split_replica` and `RecoveryPiece::parse`)
//! for the recovery masters' real replay ([`crate::master::SimMaster::recover`]).
//!
//! It advances one step at a time, so that a zombie master (declared crashed, still
//! running) can act between any two of them: fence and list one backup; plan; read one
//! segment. A down backup is waited for (the coordinator cannot tell it from a slow
//! one); a lost one is left out (it is no longer listed Up). A read that finds its copy
//! gone, and no equal copy elsewhere, fails the attempt, and the next one lists again.

use bytes::Bytes;
use rampart_backup::recovery_reads::{split_replica, PartitionIndex};
use rampart_common::ids::{SegmentId, ServerId};
use rampart_common::protocol::backup::{PartitionRanges, ReplicaInfo};
use rampart_common::tablet::ServerStatus;
use rampart_coordinator::recovery_plan::{check_log, choose_sources, FoundReplica};
use rampart_master::replay::{PieceBytes, RecoveryPiece};
use std::collections::BTreeMap;

use rampart_coordinator::state::CoordinatorState;

use crate::backup::SimBackup;

/// What one step of a recovery reaches, lent by the world for that step: the backups,
/// the coordinators' state, the clock and the trace. (The world owns the recovery and
/// lends these, so neither module imports the other both ways.)
#[derive(Debug)]
pub struct Reach<'a> {
    pub backups: &'a mut [SimBackup],
    pub coordinator: &'a CoordinatorState,
    pub now_us: u64,
    pub trace: &'a mut Vec<String>,
}

impl Reach<'_> {
    fn note(&mut self, event: impl Into<String>) {
        self.trace
            .push(crate::trace::line(self.now_us, &event.into()));
    }
}

/// Attempts after which a recovery that keeps failing is reported (a real one retries
/// for ever; here every fault ends, so this many failures mean it never would succeed).
pub const ATTEMPTS_MAX: usize = 20;

/// Where a recovery stands.
#[derive(Debug)]
enum Phase {
    /// Declared, not started.
    NotStarted,
    /// Fencing and listing the backups not yet listed (indexes into the world's backups).
    Listing { left: Vec<usize> },
    /// Reading the chosen copies, in plan order.
    Reading {
        sources: Vec<(SegmentId, Vec<usize>)>,
        next: usize,
    },
    /// Every partition replayed.
    Done,
    /// It cannot succeed: why.
    Failed(String),
}

/// The recovery of one crashed master.
#[derive(Debug)]
pub struct Recovery {
    master: ServerId,
    phase: Phase,
    /// What the backups listed in this attempt.
    found: Vec<FoundReplica>,
    /// The copies read so far, by segment, with what their backup listed.
    read: BTreeMap<SegmentId, (ReplicaInfo, Vec<u8>)>,
    attempts: usize,
}

impl Recovery {
    /// The recovery of `master`, not started.
    pub fn new(master: ServerId) -> Recovery {
        Recovery {
            master,
            phase: Phase::NotStarted,
            found: Vec::new(),
            read: BTreeMap::new(),
            attempts: 0,
        }
    }

    /// Whether it ended (done or failed).
    pub fn ended(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Failed(_))
    }

    /// Whether every chosen copy was read: nothing a zombie does now changes what is
    /// replayed.
    pub fn read_all(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Why it cannot succeed, if so.
    pub fn failure(&self) -> Option<&str> {
        match &self.phase {
            Phase::Failed(why) => Some(why),
            _ => None,
        }
    }

    fn restart(&mut self, world: &mut Reach<'_>, why: &str) {
        world.note(format!(
            "recovery attempt {} of {}: {why}",
            self.attempts + 1,
            self.master
        ));
        if self.attempts >= ATTEMPTS_MAX {
            self.phase = Phase::Failed(format!("{ATTEMPTS_MAX} attempts failed; last: {why}"));
            return;
        }
        let left = (0..world.backups.len())
            .filter(|&i| {
                world
                    .coordinator
                    .server(world.backups[i].id)
                    .is_some_and(|s| s.status == ServerStatus::Up)
            })
            .collect();
        self.attempts += 1;
        self.found.clear();
        self.read.clear();
        self.phase = Phase::Listing { left };
    }

    /// One step.
    pub fn advance(&mut self, world: &mut Reach<'_>) {
        match &mut self.phase {
            Phase::NotStarted => self.restart(world, "begins"),
            Phase::Done | Phase::Failed(_) => {}
            Phase::Listing { left } => {
                let Some(&i) = left.last() else {
                    self.plan(world);
                    return;
                };
                let now = world.now_us;
                if world.backups[i].liveness == crate::backup::Liveness::Lost {
                    left.pop();
                    return;
                }
                if !world.backups[i].answers(now) {
                    return;
                }
                left.pop();
                let listed = world.backups[i].fence_and_list(self.master);
                let id = world.backups[i].id;
                world.note(format!(
                    "recovery of {} fenced and listed {id}: {}",
                    self.master,
                    listed
                        .iter()
                        .map(|r| format!(
                            "{}@{}:{}{}",
                            r.info.segment,
                            r.info.epoch,
                            r.info.length,
                            if r.info.closed {
                                "c"
                            } else if r.successor.is_some() {
                                "f"
                            } else {
                                ""
                            }
                        ))
                        .collect::<Vec<_>>()
                        .join(" ")
                ));
                self.found.extend(
                    listed
                        .into_iter()
                        .map(|replica| FoundReplica { backup: i, replica }),
                );
            }
            Phase::Reading { sources, next } => {
                let Some((segment, backups)) = sources.get(*next).cloned() else {
                    self.phase = Phase::Done;
                    return;
                };
                let now = world.now_us;
                let mut waiting = false;
                for i in backups {
                    let Some(listed) = self
                        .found
                        .iter()
                        .find(|f| f.backup == i && f.replica.info.segment == segment)
                    else {
                        continue;
                    };
                    if !world.backups[i].answers(now) {
                        waiting |= world.backups[i].liveness != crate::backup::Liveness::Lost;
                        continue;
                    }
                    let info = &listed.replica.info;
                    if let Some(bytes) = world.backups[i].read(
                        self.master,
                        segment,
                        info.epoch,
                        info.closed,
                        info.length,
                    ) {
                        self.read.insert(segment, (*info, bytes));
                        *next += 1;
                        return;
                    }
                }
                if !waiting {
                    self.restart(world, &format!("no listed copy of {segment} could be read"));
                }
            }
        }
    }

    fn plan(&mut self, world: &mut Reach<'_>) {
        let floors = world.coordinator.open_epochs(self.master);
        let never_wrote = world.coordinator.version_ceiling(self.master) == 0;
        match check_log(&self.found, &floors, false, never_wrote) {
            Ok(segments) => {
                let plan = choose_sources(&segments, &self.found, &floors);
                world.note(format!(
                    "recovery plan of {} (floors {floors:?}): {:?}",
                    self.master, plan.sources
                ));
                self.phase = Phase::Reading {
                    sources: plan.sources,
                    next: 0,
                };
            }
            Err(incomplete) => {
                let why = format!("log incomplete: {}", incomplete.why);
                self.restart(world, &why);
            }
        }
    }

    /// The crashed master.
    pub fn master(&self) -> ServerId {
        self.master
    }

    /// The pieces of partition `ranges` in the copies read, as the backups cut them
    /// (`split_replica`) and the recovery master checks them (`RecoveryPiece::parse`);
    /// why not, if a copy cannot be cut or a piece fails its checks.
    pub fn pieces(&self, ranges: &PartitionRanges) -> Result<Vec<RecoveryPiece>, String> {
        let index = PartitionIndex::new(std::slice::from_ref(ranges))
            .map_err(|e| format!("partition {ranges:?}: {e}"))?;
        let mut pieces = Vec::new();
        for (segment, (info, bytes)) in &self.read {
            let split = split_replica(bytes, info, &index)
                .map_err(|e| format!("{segment} cannot be split: {e}"))?;
            let Some(piece) = split.pieces.into_iter().next() else {
                continue;
            };
            let reply = PieceBytes {
                safe_version: split.safe_version,
                entries: Bytes::from(piece.entries),
                count: piece.count,
            };
            let piece = RecoveryPiece::parse(*segment, reply, ranges)
                .map_err(|e| format!("piece of {segment}: {e}"))?;
            pieces.push(piece);
        }
        Ok(pieces)
    }
}
