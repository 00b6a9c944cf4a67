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
//! # Concurrency
//! Lock-free: RPC tasks push, the appender task reads. `pushed` only grows (pushes may
//! arrive out of order; an older one changes nothing).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::Notify;

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

    #[tokio::test]
    async fn poked_completes_for_a_push_made_before_the_wait() {
        let watch = ServerListWatch::new();
        watch.push(1);
        tokio::time::timeout(std::time::Duration::from_secs(2), watch.poked())
            .await
            .expect("the push left a permit");
    }
}
