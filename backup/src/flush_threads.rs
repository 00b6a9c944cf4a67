//! `FlushThreads`: the few long-lived threads on which a backup writes closed frames to
//! its segment store.
//!
//! A close copies its frame into a buffer and writes it to the disk with `O_DIRECT`
//! through a page-aligned staging buffer; both buffers belong to the thread (thread
//! locals), so that their pages are faulted in once. On tokio's blocking pool, which
//! starts a thread per waiting task and ends it after 10 s idle, each close under load
//! ran on a fresh thread and faulted in 16 MiB of new memory: a profile of a 1 GiB
//! recovery found 27 % of all CPU in closes, most of it zeroing those pages. A fixed
//! set of threads keeps the buffers warm and bounds the writes a backup has in flight
//! (the disk gains nothing from more).
//!
//! # What callers see
//! [`FlushThreads::run`] queues a job and awaits its result. The queue is bounded
//! ([`FlushThreads::start`]'s `queue_max`): a caller past it waits for room.
//!
//! # Failure handling
//! A job that panics is caught: its caller gets [`FlushThreadsGone`], the thread lives
//! on. Dropping the `FlushThreads` closes the queue; the threads finish what is queued
//! and end.

use parking_lot::Mutex;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Flush threads of one backup: two overlap one flush's copy and checksum with the
/// other's transfer, and the disk's queue stays short, so a read for recovery waits
/// behind at most two writes.
pub const FLUSH_THREADS: usize = 2;

type Job = Box<dyn FnOnce() + Send>;

/// The job's result never came: it panicked, or the threads are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the flush threads are gone or the flush panicked")]
pub struct FlushThreadsGone;

/// A fixed set of threads running jobs from one bounded queue. See the module doc.
#[derive(Debug, Clone)]
pub struct FlushThreads {
    queue: mpsc::Sender<Job>,
}

impl FlushThreads {
    /// Starts `threads` threads (at least one) named `name`, fed by a queue of at most
    /// `queue_max` jobs (at least one).
    pub fn start(threads: usize, queue_max: usize, name: &str) -> std::io::Result<FlushThreads> {
        let (queue, receiver) = mpsc::channel::<Job>(queue_max.max(1));
        let receiver = Arc::new(Mutex::new(receiver));
        for _ in 0..threads.max(1) {
            let receiver = Arc::clone(&receiver);
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || loop {
                    // One thread waits on the queue while the others wait for the lock.
                    let job = receiver.lock().blocking_recv();
                    let Some(job) = job else { return };
                    // The caller learns of a panic from its dropped reply channel.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                })?;
        }
        Ok(FlushThreads { queue })
    }

    /// Runs `job` on one of the threads and returns its result.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, FlushThreadsGone> {
        let (reply, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = reply.send(job());
        });
        self.queue.send(job).await.map_err(|_| FlushThreadsGone)?;
        result.await.map_err(|_| FlushThreadsGone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[tokio::test]
    async fn jobs_run_on_the_same_few_threads_and_a_panic_is_survived() {
        let threads = FlushThreads::start(2, 4, "test-flush").expect("start");
        let mut seen = HashSet::new();
        for _ in 0..20 {
            let id = threads
                .run(|| std::thread::current().id())
                .await
                .expect("ran");
            seen.insert(id);
        }
        assert!(seen.len() <= 2, "{seen:?}");
        let panicked = threads.run(|| panic!("a job panics")).await;
        assert_eq!(panicked, Err::<(), _>(FlushThreadsGone));
        let after = threads.run(|| 7).await;
        assert_eq!(after, Ok(7), "the threads live on");
    }
}
