//! `Recovery`: the recovery of the crashed master, with the coordinator's real planning
//! (`rampart_coordinator::recovery_plan`: `check_log`, `choose_sources`) over what the
//! simulated backups list, and a replay of the chosen copies (newest version wins,
//! tombstones remove what they name) whose result the checker compares with what
//! clients were told.
//!
//! It advances one step at a time, so that a zombie master (declared crashed, still
//! running) can act between any two of them: fence and list one backup; plan; read one
//! segment. A down backup is waited for (the coordinator cannot tell it from a slow
//! one); a lost one is left out (it is no longer listed Up). A read that finds its copy
//! gone, and no equal copy elsewhere, fails the attempt, and the next one lists again.

use rampart_common::ids::{SegmentId, ServerId, Version};
use rampart_common::log::{entries, scan, Entry};
use rampart_common::tablet::ServerStatus;
use rampart_coordinator::recovery_plan::{check_log, choose_sources, FoundReplica};
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
    /// The copies read so far, by segment.
    read: BTreeMap<SegmentId, Vec<u8>>,
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
                    "recovery fenced and listed {id}: {}",
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
                        self.read.insert(segment, bytes);
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
                    "recovery plan (floors {floors:?}): {:?}",
                    plan.sources
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

    /// Replays the copies read (newest version wins; a tombstone removes the object it
    /// names and older ones) into the objects the recovery masters now serve, by key
    /// number.
    pub fn replay(&self) -> Result<BTreeMap<u64, (Version, Vec<u8>)>, String> {
        // key → (version, value or removed)
        let mut state: BTreeMap<Vec<u8>, (Version, Option<Vec<u8>>)> = BTreeMap::new();
        for (segment, bytes) in &self.read {
            let scanned = scan(bytes);
            if (scanned.valid_bytes as usize) < bytes.len() {
                return Err(format!(
                    "{segment}: read {} bytes but only {} scan valid",
                    bytes.len(),
                    scanned.valid_bytes
                ));
            }
            for (_, entry) in entries(bytes, scanned.valid_bytes) {
                match entry {
                    Entry::Object(object) => {
                        let newer = state
                            .get(object.key)
                            .map_or(true, |(v, _)| object.version > *v);
                        if newer {
                            state.insert(
                                object.key.to_vec(),
                                (object.version, Some(object.value.to_vec())),
                            );
                        }
                    }
                    Entry::Tombstone(tombstone) => {
                        let kills = state
                            .get(tombstone.key)
                            .map_or(true, |(v, _)| tombstone.version >= *v);
                        if kills {
                            state.insert(tombstone.key.to_vec(), (tombstone.version, None));
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut objects = BTreeMap::new();
        for (key, (version, value)) in state {
            let Some(value) = value else { continue };
            let number = std::str::from_utf8(&key)
                .ok()
                .and_then(|k| k.strip_prefix("key-"))
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| format!("replayed a key no client wrote: {key:?}"))?;
            objects.insert(number, (version, value));
        }
        Ok(objects)
    }
}
