//! `World`: everything outside the simulated masters — the clock, the network's
//! decisions, the backups, the coordinators' state machine and the faults — all drawn
//! from one seeded generator, so a seed fixes every delay, drop, outage and crash.
//!
//! Time is simulated: every call a master makes is a *boundary* ([`World::boundary`])
//! where the clock moves on by a random delay and the world may inject a fault, the
//! crash of the master acting then ([`World::active`]) included. The master cannot tell
//! a dropped request from a lost reply: a call is [`Delivery::Dropped`] (nothing
//! happened), [`Delivery::Unanswered`] (it happened, the reply was lost) or
//! [`Delivery::Answered`].
//!
//! One crash is handled at a time: while a master's crash is being recovered
//! ([`World::crashed`]), no other master crashes and no backup is lost.

use rampart_common::ids::{Epoch, FrameHandle, SegmentId, ServerId};
use rampart_common::status::Status;
use rampart_common::tablet::{ServerStatus, Services};
use rampart_coordinator::proof_of_death::{Evidence, Proofs};
use rampart_coordinator::state::{Command, CommandResult, CoordinatorState};
use rampart_master::lease::ManualClock;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;

use crate::backup::{Liveness, Refusal, SimBackup};
use crate::config::SimConfig;
use crate::crash_recovery::{Reach, Recovery};

/// A request to a backup, as it travels (and may arrive late).
#[derive(Clone, Debug)]
pub enum Request {
    /// `OpenReplica`.
    Open {
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
        capacity: u32,
    },
    /// A one-sided write of `bytes` at `offset`.
    Write {
        handle: FrameHandle,
        epoch: Epoch,
        offset: u32,
        bytes: Vec<u8>,
    },
    /// `BumpEpoch`.
    Bump {
        handle: FrameHandle,
        epoch: Epoch,
        new_epoch: Epoch,
    },
    /// `CloseReplica`.
    Close {
        handle: FrameHandle,
        epoch: Epoch,
        length: u32,
    },
    /// `FreeReplica`.
    Free {
        master: ServerId,
        segment: SegmentId,
        epoch_max: Epoch,
    },
}

impl Request {
    /// Carries it out on `backup`: the opened frame's handle for an open.
    fn apply(&self, backup: &mut SimBackup) -> Result<Option<FrameHandle>, Refusal> {
        match self {
            Request::Open {
                master,
                segment,
                epoch,
                capacity,
            } => backup.open(*master, *segment, *epoch, *capacity).map(Some),
            Request::Write {
                handle,
                epoch,
                offset,
                bytes,
            } => backup
                .write(*handle, *epoch, *offset, bytes, bytes.len())
                .map(|()| None),
            Request::Bump {
                handle,
                epoch,
                new_epoch,
            } => backup.bump(*handle, *epoch, *new_epoch).map(|()| None),
            Request::Close {
                handle,
                epoch,
                length,
            } => backup.close(*handle, *epoch, *length).map(|()| None),
            Request::Free {
                master,
                segment,
                epoch_max,
            } => {
                backup.free(*master, *segment, *epoch_max);
                Ok(None)
            }
        }
    }
}

/// A master's lease, as the coordinators grant it (µs).
pub const LEASE_US: u64 = 150_000;

/// Requests held back at once, at most (a bound on the simulated network's buffers).
const LATE_REQUESTS_MAX: usize = 64;

/// What became of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// It never arrived: nothing happened.
    Dropped,
    /// It arrived and took effect, but its reply was lost.
    Unanswered,
    /// It arrived and its reply came back.
    Answered,
}

impl Delivery {
    /// It took effect.
    pub fn arrived(self) -> bool {
        self != Delivery::Dropped
    }
}

/// Why the simulated master stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Killed (`kill -9`) at a boundary.
    Killed,
    /// It stopped itself: a backup fenced it, or the coordinators said it was declared
    /// crashed. Everything it had not acknowledged is never acknowledged.
    Fatal(String),
    /// The log memory is full: the workload ends.
    LogFull,
}

/// What the coordinators answered to a `SetOpenEpoch` or a server-list read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinatorAnswer {
    /// Done (or, for a read, this master is listed Up).
    Ok,
    /// This master is not Up: it was declared crashed.
    Crashed,
    /// No answer (no leader, or the reply was lost): try again.
    Silent,
}

/// How the master's life ends, once decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// Killed.
    Killed,
    /// Declared crashed while still running (a false suspicion, a partition): a zombie
    /// whose recovery runs alongside it.
    Declared,
}

/// The world around the masters.
#[derive(Debug)]
pub struct World {
    pub config: SimConfig,
    rng: SmallRng,
    /// Decides which dropped requests arrive late, and when: draws of its own, so that
    /// a run without late requests draws from `rng` as before they existed.
    late_rng: SmallRng,
    /// Requests the network holds back: (arrival time µs, backup, request).
    late: Vec<(u64, ServerId, Request)>,
    /// Requests held back that reached their backup.
    pub late_delivered: usize,
    /// Decides what proves a crashed master's death (`SimConfig::exit_seen_p`,
    /// `reject_cut_p`): draws of its own, so that a run where nothing counts as proof
    /// draws from `rng` as before death could be proven.
    proof_rng: SmallRng,
    /// The proofs of death the coordinators found (µs since the start), under
    /// `SimConfig::proof_of_death`: the coordinator's own book.
    pub proofs: Proofs<Duration>,
    /// Segments the masters' cleaners freed.
    pub segments_cleaned: usize,
    /// Simulated time, µs.
    pub now_us: u64,
    pub backups: Vec<SimBackup>,
    /// The coordinators' replicated state machine (the real one); the Raft group around
    /// it is modelled as windows without a leader.
    pub coordinator: CoordinatorState,
    coordinator_silent_until_us: u64,
    /// The masters enlisted, in order (spares enlisted later for recoveries included).
    pub masters: Vec<ServerId>,
    /// The master whose calls are the boundaries now: the one a crash strikes.
    pub active: ServerId,
    /// Whether the active master may crash now (not while it replays a recovery).
    pub crash_allowed: bool,
    /// Crashes of masters still to come, at most.
    crashes_left: usize,
    /// The master whose crash is being handled, and how it crashed.
    pub crashed: Option<(ServerId, Crash)>,
    /// When that crash was declared (µs): its tablets go live elsewhere only once the
    /// master's lease surely ran out.
    pub declared_at_us: u64,
    /// A zombie cut off from the coordinators (why it was suspected), until when (µs):
    /// its lease renewals and other calls to them are lost meanwhile.
    cut_off: Option<(ServerId, u64)>,
    /// The masters' lease clock: simulated time.
    pub clock: Arc<ManualClock>,
    /// The recovery of that master, once declared crashed; advanced at boundaries while
    /// a zombie runs, then to its end.
    pub recovery: Option<Recovery>,
    /// Backups that may still be lost for good: fewer than R in all, so every segment
    /// keeps a copy, and at least R left, so that masters can still place replicas.
    losses_left: usize,
    /// What happened, one line per event, for a failure report.
    pub trace: Vec<String>,
}

impl World {
    /// A world for `config`, its randomness fixed by `seed`.
    pub fn new(config: SimConfig, seed: u64) -> World {
        let proof_of_death = config.proof_of_death;
        let mut coordinator = CoordinatorState::new();
        let mut enlist =
            |name: String, services: Services| match coordinator.apply(&Command::EnlistServer {
                addr: name.clone(),
                services,
                failure_domain: name,
                disk_read_mbps: 100,
            }) {
                CommandResult::Enlisted { id } => id,
                other => panic!("enlisting in a fresh state is accepted: {other:?}"),
            };
        let masters: Vec<ServerId> = (0..config.masters)
            .map(|i| {
                enlist(
                    format!("master-{i}"),
                    Services {
                        master: true,
                        backup: false,
                    },
                )
            })
            .collect();
        let backups = (0..config.backups)
            .map(|i| {
                let id = enlist(
                    format!("backup-{i}"),
                    Services {
                        master: false,
                        backup: true,
                    },
                );
                SimBackup::new(id, config.segment_bytes)
            })
            .collect();
        World {
            // Fewer than R (every segment keeps a copy), and R left to place on.
            losses_left: config
                .replicas
                .saturating_sub(1)
                .min(config.backups.saturating_sub(config.replicas)),
            crashes_left: config.crashes,
            config,
            rng: SmallRng::seed_from_u64(seed),
            late_rng: SmallRng::seed_from_u64(seed ^ 0x4c41_5445),
            proof_rng: SmallRng::seed_from_u64(seed ^ 0x5052_4f4f_4653),
            proofs: Proofs::new(proof_of_death),
            late: Vec::new(),
            late_delivered: 0,
            segments_cleaned: 0,
            now_us: 0,
            backups,
            coordinator,
            coordinator_silent_until_us: 0,
            active: masters[0],
            masters,
            crash_allowed: true,
            crashed: None,
            declared_at_us: 0,
            cut_off: None,
            clock: Arc::new(ManualClock::new()),
            recovery: None,
            trace: Vec::new(),
        }
    }

    /// Notes an event in the trace.
    pub fn note(&mut self, event: impl Into<String>) {
        let line = crate::trace::line(self.now_us, &event.into());
        self.trace.push(line);
    }

    /// What a recovery step reaches ([`Recovery::advance`]).
    pub fn reach(&mut self) -> Reach<'_> {
        Reach {
            backups: &mut self.backups,
            coordinator: &self.coordinator,
            now_us: self.now_us,
            trace: &mut self.trace,
        }
    }

    /// A random number in `range`.
    pub fn draw(&mut self, range: std::ops::Range<u64>) -> u64 {
        self.rng.gen_range(range)
    }

    /// The cleaner steps a master runs now (`SimConfig::clean_p`): how many, the bytes
    /// each walks at most, and the survivors a pass fills at most; none (all 0) when
    /// it does not clean now. Small passes too (one survivor), so that a tombstone's
    /// segment is sometimes cleaned before the segment of the object it deletes.
    pub fn draw_cleaning(&mut self) -> (usize, usize, u64) {
        if self.config.clean_p == 0.0 || !self.chance(self.config.clean_p) {
            return (0, 0, 0);
        }
        let steps = self.draw(1..self.config.clean_steps_max + 1) as usize;
        let (least, most) = self.config.clean_step_bytes;
        (steps, self.draw(least..most) as usize, self.draw(1..5))
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.gen_bool(p.clamp(0.0, 1.0))
    }

    /// Index of backup `id`.
    pub fn backup_index(&self, id: ServerId) -> Option<usize> {
        self.backups.iter().position(|b| b.id == id)
    }

    /// A call from the active master: time passes, faults strike. `Err` when the
    /// master is killed here.
    pub fn boundary(&mut self) -> Result<(), Stop> {
        let us = self.draw(5..200);
        self.advance(us);
        self.inject_faults();
        self.deliver_late();
        if self.may_crash() && self.chance(self.config.master_crash_p) {
            let active = self.active;
            if self.chance(self.config.zombie_p) {
                self.declare_crashed(active, Crash::Declared);
            } else {
                self.declare_crashed(active, Crash::Killed);
                return Err(Stop::Killed);
            }
        }
        // A zombie's recovery runs beside it (and beside the other masters).
        if self.crashed.is_some_and(|(_, how)| how == Crash::Declared) {
            if let Some(mut recovery) = self.recovery.take() {
                recovery.advance(&mut self.reach());
                self.recovery = Some(recovery);
            }
        }
        Ok(())
    }

    /// Whether a master may crash now: crashes are left, none is being handled, and
    /// the active master is not replaying a recovery.
    pub fn may_crash(&self) -> bool {
        self.crash_allowed && self.crashes_left > 0 && self.crashed.is_none()
    }

    /// Marks `master` crashed in the coordinators' state and starts its recovery.
    pub fn declare_crashed(&mut self, master: ServerId, how: Crash) {
        let result = self.coordinator.apply(&Command::SetServerStatus {
            id: master,
            status: ServerStatus::Crashed,
        });
        let what = match how {
            Crash::Killed => "killed",
            Crash::Declared => "declared crashed while it runs (a zombie)",
        };
        self.note(format!("master {master} {what}: {result:?}"));
        self.crashes_left = self.crashes_left.saturating_sub(1);
        self.crashed = Some((master, how));
        self.declared_at_us = self.now_us;
        if how == Crash::Declared {
            // Suspected because it was cut off from the coordinators: for a while, it
            // does not hear that it was declared crashed, and its lease runs on.
            let until = self.now_us + self.draw(0..3 * LEASE_US);
            self.cut_off = Some((master, until));
            self.note(format!(
                "{master} cut off from the coordinators until {until} µs"
            ));
        }
        self.look_for_proof_of_death(master, how);
        self.recovery = Some(Recovery::new(master));
    }

    /// What the coordinators find about `master`, declared crashed as `how` says: a
    /// killed master's port refuses, and its supervisor may report its exit; a zombie
    /// cut off by a `REJECT` rule refuses too, though it lives (a silent one gives
    /// nothing). What counts as proof is the coordinator's `Proofs`' to say.
    fn look_for_proof_of_death(&mut self, master: ServerId, how: Crash) {
        let mut evidence = Vec::new();
        match how {
            Crash::Killed => {
                evidence.push(Evidence::Refused);
                if self.proof_rng.gen_bool(self.config.exit_seen_p) {
                    evidence.push(Evidence::ExitSeen);
                }
            }
            Crash::Declared => {
                if self.proof_rng.gen_bool(self.config.reject_cut_p) {
                    self.note(format!(
                        "{master} is cut off by a REJECT rule: its port refuses"
                    ));
                    evidence.push(Evidence::Refused);
                }
            }
        }
        let now = Duration::from_micros(self.now_us);
        for seen in evidence {
            if self.proofs.seen(master, seen, now) {
                self.note(format!("proof of {master}'s death: {seen:?}"));
            }
        }
    }

    /// Enlists another master (a spare a recovery replays into).
    pub fn enlist_master(&mut self) -> ServerId {
        let name = format!("master-{}", self.masters.len());
        let result = self.coordinator.apply(&Command::EnlistServer {
            addr: name.clone(),
            services: Services {
                master: true,
                backup: false,
            },
            failure_domain: name,
            disk_read_mbps: 100,
        });
        let CommandResult::Enlisted { id } = result else {
            panic!("enlisting a spare master is accepted: {result:?}");
        };
        self.note(format!("spare master {id} enlisted"));
        self.masters.push(id);
        id
    }

    fn inject_faults(&mut self) {
        if self.chance(self.config.backup_down_p) {
            let i = self.draw(0..self.backups.len() as u64) as usize;
            if self.backups[i].liveness == Liveness::Up {
                let until = self.now_us + self.draw(1_000..300_000);
                self.backups[i].liveness = Liveness::DownUntil(until);
                let id = self.backups[i].id;
                self.note(format!("backup {id} down until {until} µs"));
            }
        }
        if self.losses_left > 0 && self.crashed.is_none() && self.chance(self.config.backup_lost_p)
        {
            let i = self.draw(0..self.backups.len() as u64) as usize;
            if self.backups[i].liveness != Liveness::Lost {
                self.losses_left -= 1;
                self.backups[i].lose();
                let id = self.backups[i].id;
                self.coordinator.apply(&Command::SetServerStatus {
                    id,
                    status: ServerStatus::Crashed,
                });
                self.note(format!("backup {id} lost for good"));
            }
        }
        if self.chance(self.config.coordinator_silent_p) {
            self.coordinator_silent_until_us = self.now_us + self.draw(150_000..500_000);
            let until = self.coordinator_silent_until_us;
            self.note(format!("no coordinator leader until {until} µs"));
        }
    }

    /// Whether a call to backup `id` arrives, and whether its reply comes back.
    pub fn call_backup(&mut self, id: ServerId) -> Delivery {
        let now = self.now_us;
        let answers = self
            .backup_index(id)
            .is_some_and(|i| self.backups[i].answers(now));
        if !answers {
            return Delivery::Dropped;
        }
        self.network_delivery()
    }

    fn network_delivery(&mut self) -> Delivery {
        if self.chance(self.config.drop_p) {
            if self.chance(0.5) {
                Delivery::Dropped
            } else {
                Delivery::Unanswered
            }
        } else {
            Delivery::Answered
        }
    }

    /// Whether a call from `master` to the coordinators arrives and is answered.
    fn coordinator_delivery(&mut self, master: ServerId) -> Delivery {
        let cut_off = self
            .cut_off
            .is_some_and(|(id, until)| id == master && self.now_us < until);
        if self.now_us < self.coordinator_silent_until_us || cut_off {
            return Delivery::Dropped;
        }
        self.network_delivery()
    }

    /// `RenewLease` from `master`: granted while the coordinators list it Up. Not a
    /// boundary (a renewal runs beside the master's work, not in it).
    pub fn renew_lease(&mut self, master: ServerId) -> CoordinatorAnswer {
        if self.coordinator_delivery(master) != Delivery::Answered {
            return CoordinatorAnswer::Silent;
        }
        match self.coordinator.server(master).map(|s| s.status) {
            Some(ServerStatus::Up) => CoordinatorAnswer::Ok,
            _ => CoordinatorAnswer::Crashed,
        }
    }

    /// `SetOpenEpoch` from `master`.
    pub fn record_open_epoch(
        &mut self,
        master: ServerId,
        segment: SegmentId,
        epoch: Epoch,
    ) -> CoordinatorAnswer {
        let delivery = self.coordinator_delivery(master);
        if !delivery.arrived() {
            return CoordinatorAnswer::Silent;
        }
        let result = self.coordinator.apply(&Command::SetOpenEpoch {
            server: master,
            segment,
            epoch,
        });
        let answer = match result {
            CommandResult::Rejected {
                status: Status::ServerCrashed,
                ..
            } => CoordinatorAnswer::Crashed,
            CommandResult::EpochRecorded => CoordinatorAnswer::Ok,
            other => panic!("SetOpenEpoch of an enlisted master: {other:?}"),
        };
        self.note(format!(
            "{master}: SetOpenEpoch {segment} epoch {epoch}: {answer:?} ({delivery:?})"
        ));
        match delivery {
            Delivery::Answered => answer,
            _ => CoordinatorAnswer::Silent,
        }
    }

    /// `ReserveVersions`: `master` may hand out versions below `ceiling`.
    pub fn reserve_versions(&mut self, master: ServerId, ceiling: u64) -> CoordinatorAnswer {
        let delivery = self.coordinator_delivery(master);
        if !delivery.arrived() {
            return CoordinatorAnswer::Silent;
        }
        let result = self.coordinator.apply(&Command::ReserveVersions {
            server: master,
            ceiling,
        });
        let answer = match result {
            CommandResult::Rejected {
                status: Status::ServerCrashed,
                ..
            } => CoordinatorAnswer::Crashed,
            CommandResult::VersionsReserved { .. } => CoordinatorAnswer::Ok,
            other => panic!("ReserveVersions of an enlisted master: {other:?}"),
        };
        match delivery {
            Delivery::Answered => answer,
            _ => CoordinatorAnswer::Silent,
        }
    }

    /// `master` reads the server list to confirm that it is still Up.
    pub fn confirm_alive(&mut self, master: ServerId) -> CoordinatorAnswer {
        if self.coordinator_delivery(master) != Delivery::Answered {
            return CoordinatorAnswer::Silent;
        }
        match self.coordinator.server(master).map(|s| s.status) {
            Some(ServerStatus::Up) => CoordinatorAnswer::Ok,
            _ => CoordinatorAnswer::Crashed,
        }
    }

    /// Backups the server list shows Up.
    pub fn listed_backups(&self) -> Vec<ServerId> {
        self.backups
            .iter()
            .map(|b| b.id)
            .filter(|id| {
                self.coordinator
                    .server(*id)
                    .is_some_and(|s| s.status == ServerStatus::Up)
            })
            .collect()
    }

    /// Lets time pass while a recovery runs: backups still go down and come back,
    /// leaders still come and go.
    pub fn pass_time(&mut self) {
        let us = self.draw(100..2_000);
        self.advance(us);
        self.inject_faults();
        self.deliver_late();
    }

    /// Requests held back whose time came reach their backups (if they answer then);
    /// nobody waits for their replies.
    fn deliver_late(&mut self) {
        let now = self.now_us;
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.late)
            .into_iter()
            .partition(|(at, _, _)| *at <= now);
        self.late = held;
        for (_, backup, request) in due {
            let Some(i) = self.backup_index(backup) else {
                continue;
            };
            if !self.backups[i].answers(now) {
                continue;
            }
            let result = request.apply(&mut self.backups[i]);
            self.late_delivered += 1;
            self.note(
                format!("late {request:?} reached {backup}: {result:?}")
                    .replace("bytes: [", "bytes: (")
                    .chars()
                    .take(200)
                    .collect::<String>(),
            );
        }
    }

    /// A request from the master to backup `backup`: whether it arrived and whether
    /// its reply came back, and what the backup answered if it did. A dropped request
    /// may be held back and arrive later (`SimConfig::late_p`).
    pub fn call(
        &mut self,
        backup: ServerId,
        request: Request,
    ) -> (Delivery, Option<Result<Option<FrameHandle>, Refusal>>) {
        let delivery = self.call_backup(backup);
        if delivery == Delivery::Dropped {
            if self.late.len() < LATE_REQUESTS_MAX && self.late_rng.gen_bool(self.config.late_p) {
                let at = self.now_us + self.late_rng.gen_range(1_000..200_000);
                self.late.push((at, backup, request));
            }
            return (delivery, None);
        }
        let Some(i) = self.backup_index(backup) else {
            return (Delivery::Dropped, None);
        };
        (delivery, Some(request.apply(&mut self.backups[i])))
    }

    /// Lets time pass with nothing else happening (waiting for a backup or a leader).
    pub fn wait(&mut self, us: u64) {
        self.advance(us);
    }

    /// Moves simulated time (and the masters' lease clock) on by `us`.
    fn advance(&mut self, us: u64) {
        self.now_us += us;
        self.clock.advance(Duration::from_micros(us));
    }
}
