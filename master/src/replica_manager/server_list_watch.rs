//! `ServerListWatch`: how the master service tells the replicator that the coordinator
//! announced a newer server list.
//!
//! The coordinator leader pushes `ServerListChanged { version }` to every Up server after
//! the server list changes (only the configuration version travels). The master service
//! records it here with [`push`](ServerListWatch::push), from its RPC handler, without
//! waiting; the replicator compares it with the `TabletMap::version` of the list it holds
//! and pulls the list at its next upkeep when it is behind
//! ([`is_newer_than`](ServerListWatch::is_newer_than)). A push that raises the version
//! also asks the appender for that upkeep at once ([`take_poke`](ServerListWatch::take_poke)
//! between batches, [`poked`](ServerListWatch::poked) when idle), instead of at its next
//! upkeep interval. The periodic pull (`SERVER_LIST_REFRESH`) stays the fallback for a
//! push that is lost.
//!
//! # Drains
//! The coordinators' leader drains a server (docs/design.md §7, "Draining a server") by
//! asking every master to stop using its backup (`EvacuateBackup`). The service records
//! the backup here with [`evacuate`](ServerListWatch::evacuate), which pokes the
//! appender like a newer list does; from its next upkeep on, the replicator leaves that
//! backup out of the list it holds, so it fails it the way it fails a backup gone from
//! the list (every replica on it lost and re-created elsewhere, never chosen again),
//! and, once that list is applied, [`report`](ServerListWatch::report)s at each upkeep
//! how far it got. The backup
//! still serves recoveries meanwhile: its copies stay where they are, and the server
//! stays `Up`, until every master reports none of its segments there and all whole.
//! The entry goes once the list no longer shows the backup `Up`
//! ([`retain_evacuating`](ServerListWatch::retain_evacuating)).
//!
//! # Collection
//! The leader's collector asks a master which of its segments' copies on a backup it
//! no longer needs ([`ask_unneeded`](ServerListWatch::ask_unneeded), from the
//! `UnneededReplicas` handler); the question waits here, at most
//! [`UNNEEDED_QUESTIONS_MAX`] at once, and the replicator answers every waiting one at
//! its next upkeep ([`take_questions`](ServerListWatch::take_questions)), from its own
//! view of each segment's replicas.
//!
//! # Concurrency
//! RPC tasks push, the appender task reads. `pushed` only grows (pushes may arrive out
//! of order; an older one changes nothing). The drains are behind a short lock.

use parking_lot::Mutex;
use rampart_common::ids::{SegmentId, ServerId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::{oneshot, Notify};

/// Most questions of the collector waiting for the replicator at once; past it, the
/// collector is told to ask again at its next collection.
pub const UNNEEDED_QUESTIONS_MAX: usize = 8;

/// A question of the collector's: which of `segments`, whose copies `backup` holds,
/// this master no longer needs there. Answered with those.
#[derive(Debug)]
pub struct UnneededQuestion {
    /// The backup.
    pub backup: ServerId,
    /// The segments it holds copies of.
    pub segments: Vec<SegmentId>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Vec<SegmentId>>,
}

/// How far this master got in leaving a backup being drained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evacuation {
    /// Segments with a live replica still on the backup.
    pub on_backup: u32,
    /// Segments not whole (`SegmentReplicas::whole`): a replica is missing, not on disk
    /// yet, or its epoch unrecorded.
    pub not_whole: u32,
}

impl Evacuation {
    /// Nothing of this master's log needs the backup any more.
    pub fn done(&self) -> bool {
        self.on_backup == 0 && self.not_whole == 0
    }
}

/// The newest server-list version announced to this master; see the module doc.
#[derive(Debug, Default)]
pub struct ServerListWatch {
    /// The highest version pushed so far (0: none). Only grows.
    pushed: AtomicU64,
    /// Set by a push that raised `pushed`; cleared by the appender when it runs the
    /// upkeep that pulls.
    poke: AtomicBool,
    /// Wakes an idle appender after a poke. `notify_one` keeps a permit when nobody
    /// waits, so a push between two waits is not missed.
    notify: Notify,
    /// Backups being drained, each with the replicator's last report on it (`None`
    /// until its first upkeep since).
    evacuating: Mutex<BTreeMap<ServerId, Option<Evacuation>>>,
    /// Set by an [`evacuate`](Self::evacuate) of a new backup; cleared by the
    /// replicator when it next refreshes its list.
    evacuation_news: AtomicBool,
    /// The collector's questions waiting for the next upkeep (at most
    /// [`UNNEEDED_QUESTIONS_MAX`]).
    questions: Mutex<Vec<UnneededQuestion>>,
}

impl ServerListWatch {
    /// A watch that has seen no push.
    pub fn new() -> ServerListWatch {
        ServerListWatch::default()
    }

    /// Records a pushed version; returns whether it was newer than every earlier push
    /// (only then is the appender poked).
    pub fn push(&self, version: u64) -> bool {
        let newer = self.pushed.fetch_max(version, Ordering::SeqCst) < version;
        if newer {
            self.poke.store(true, Ordering::SeqCst);
            self.notify.notify_one();
        }
        newer
    }

    /// The highest version pushed so far (0: none).
    pub fn pushed(&self) -> u64 {
        self.pushed.load(Ordering::SeqCst)
    }

    /// Whether a push announced a list newer than version `held`.
    pub fn is_newer_than(&self, held: u64) -> bool {
        self.pushed() > held
    }

    /// Records that `backup` is being drained (module doc), poking the appender the first
    /// time; returns the replicator's last report on it (`None` before its first).
    pub fn evacuate(&self, backup: ServerId) -> Option<Evacuation> {
        let mut evacuating = self.evacuating.lock();
        match evacuating.get(&backup) {
            Some(report) => *report,
            None => {
                evacuating.insert(backup, None);
                self.evacuation_news.store(true, Ordering::SeqCst);
                self.poke.store(true, Ordering::SeqCst);
                self.notify.notify_one();
                None
            }
        }
    }

    /// The backups being drained.
    pub fn evacuating(&self) -> Vec<ServerId> {
        self.evacuating.lock().keys().copied().collect()
    }

    /// Whether a backup was newly asked to be drained since the last call (and clears
    /// it): the replicator then refreshes its list at once.
    pub fn take_evacuation_news(&self) -> bool {
        self.evacuation_news.swap(false, Ordering::SeqCst)
    }

    /// Sets the news again: the refresh that took it could not apply it.
    pub fn keep_evacuation_news(&self) {
        self.evacuation_news.store(true, Ordering::SeqCst);
    }

    /// The replicator's report on `backup`, if it is being drained.
    pub fn report(&self, backup: ServerId, report: Evacuation) {
        if let Some(entry) = self.evacuating.lock().get_mut(&backup) {
            *entry = Some(report);
        }
    }

    /// Keeps the drains of the backups `listed_up` says are still `Up`.
    pub fn retain_evacuating(&self, listed_up: impl Fn(ServerId) -> bool) {
        self.evacuating
            .lock()
            .retain(|&backup, _| listed_up(backup));
    }

    /// Asks which of `segments`, whose copies `backup` holds, this master no longer
    /// needs there; the answer comes at the replicator's next upkeep (which this pokes).
    /// `None` when [`UNNEEDED_QUESTIONS_MAX`] wait already.
    pub fn ask_unneeded(
        &self,
        backup: ServerId,
        segments: Vec<SegmentId>,
    ) -> Option<oneshot::Receiver<Vec<SegmentId>>> {
        let mut questions = self.questions.lock();
        if questions.len() >= UNNEEDED_QUESTIONS_MAX {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        questions.push(UnneededQuestion {
            backup,
            segments,
            reply,
        });
        self.poke.store(true, Ordering::SeqCst);
        self.notify.notify_one();
        Some(answer)
    }

    /// The questions waiting, for the replicator to answer.
    pub fn take_questions(&self) -> Vec<UnneededQuestion> {
        std::mem::take(&mut *self.questions.lock())
    }

    /// Whether a push asked for an upkeep since the last call (and clears the request).
    pub fn take_poke(&self) -> bool {
        self.poke.swap(false, Ordering::SeqCst)
    }

    /// Completes after a push that raised the version (at once if one came since the
    /// last wait).
    pub async fn poked(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_of_a_newer_version_pokes_once_and_an_older_one_not_at_all() {
        let watch = ServerListWatch::new();
        assert!(!watch.is_newer_than(0));
        assert!(watch.push(5));
        assert!(watch.is_newer_than(4));
        assert!(!watch.is_newer_than(5));
        assert!(watch.take_poke());
        assert!(!watch.take_poke());
        assert!(!watch.push(5));
        assert!(!watch.push(3));
        assert!(!watch.take_poke());
        assert_eq!(watch.pushed(), 5);
    }

    #[test]
    fn an_evacuation_pokes_once_and_answers_the_last_report() {
        let watch = ServerListWatch::new();
        let backup = ServerId(3);
        assert_eq!(watch.evacuate(backup), None);
        assert!(watch.take_poke() && watch.take_evacuation_news());
        assert_eq!(watch.evacuate(backup), None, "no report yet");
        assert!(!watch.take_poke() && !watch.take_evacuation_news());
        let report = Evacuation {
            on_backup: 0,
            not_whole: 2,
        };
        watch.report(backup, report);
        watch.report(ServerId(9), Evacuation::default());
        assert_eq!(watch.evacuate(backup), Some(report));
        assert!(!report.done() && Evacuation::default().done());
        assert_eq!(watch.evacuating(), [backup]);
        watch.retain_evacuating(|id| id != backup);
        assert!(watch.evacuating().is_empty());
    }

    #[test]
    fn questions_wait_bounded_for_the_replicator_and_poke_it() {
        let watch = ServerListWatch::new();
        let mut answers: Vec<_> = (0..UNNEEDED_QUESTIONS_MAX)
            .map(|i| watch.ask_unneeded(ServerId(2), vec![SegmentId(i as u64)]))
            .collect();
        assert!(watch.take_poke());
        assert!(
            watch.ask_unneeded(ServerId(2), Vec::new()).is_none(),
            "bounded"
        );
        let questions = watch.take_questions();
        assert_eq!(questions.len(), UNNEEDED_QUESTIONS_MAX);
        for question in questions {
            let _ = question.reply.send(question.segments);
        }
        let first = answers.remove(0).expect("asked").try_recv();
        assert_eq!(first.ok(), Some(vec![SegmentId(0)]));
        assert!(watch.ask_unneeded(ServerId(2), Vec::new()).is_some());
    }

    #[tokio::test]
    async fn poked_completes_for_a_push_made_before_the_wait() {
        let watch = ServerListWatch::new();
        watch.push(1);
        tokio::time::timeout(std::time::Duration::from_secs(2), watch.poked())
            .await
            .expect("the push left a permit");
    }
}
