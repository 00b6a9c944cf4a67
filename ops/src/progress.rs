//! [`Progress`]: how far a long command has got, on stderr.
//!
//! On a terminal it is an `indicatif` bar, redrawn in place and cleared when the step is
//! done. Anywhere else (a pipe, a log file, a test harness) it is plain text: nothing for
//! a step that ends within [`PLAIN_FIRST_LINE_AFTER`], then a line every
//! [`PLAIN_LINE_INTERVAL`] and a last one when the step ends, so a log shows that a slow
//! load is moving without carrying a redraw per object.
//!
//! It never writes to stdout, which holds the results scripts and tests parse; a
//! command that prints result lines while a bar is shown prints them through
//! [`Progress::suspend`], so the bar does not tear them.
//!
//! # Concurrency
//! A `Progress` is a cheap handle: clones share one count, and tasks on any thread
//! [`inc`](Progress::inc) it (an atomic add; the bar redraws at most 20 times a second).
//! The plain form's lines come from a thread of its own that holds only a weak
//! reference, so it ends at [`finish`](Progress::finish) or, when every handle is dropped
//! on an error path, at its next wake-up.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use parking_lot::Mutex;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A step that ends sooner prints no plain line at all: short steps stay quiet in logs
/// and test output.
pub const PLAIN_FIRST_LINE_AFTER: Duration = Duration::from_secs(2);

/// Time between plain lines after the first: a slow step shows it moves, a long one
/// (minutes) stays within a few dozen lines.
pub const PLAIN_LINE_INTERVAL: Duration = Duration::from_secs(5);

/// How often the bar redraws by itself, so its clock runs while nothing advances (a
/// server touching its memory, say).
const BAR_TICK: Duration = Duration::from_millis(200);

/// Progress of one step of a command (see the module doc).
#[derive(Clone, Debug)]
pub struct Progress {
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    /// Stderr is a terminal.
    Bar(ProgressBar),
    /// Stderr is not a terminal.
    Plain(Arc<Plain>),
    /// Nothing shown (a caller that prints nothing).
    Hidden,
}

/// The shared state of the plain form.
#[derive(Debug)]
struct Plain {
    label: String,
    unit: &'static str,
    total: u64,
    position: AtomicU64,
    started: Instant,
    /// Held while a line is printed, so that the last line is the last printed.
    printing: Mutex<PlainLines>,
}

#[derive(Debug, Default)]
struct PlainLines {
    /// Lines printed so far; the last line is printed only after one of them.
    printed: u64,
    /// Set by `finish`: the printer thread prints no more.
    finished: bool,
}

impl Progress {
    /// Progress of `label`, which takes `total` `unit`s (`"records"`, `"servers"`): a bar
    /// when stderr is a terminal, plain lines otherwise.
    pub fn new(label: &str, total: u64, unit: &'static str) -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::bar(label, total, unit)
        } else {
            Progress::plain(label, total, unit)
        }
    }

    /// A progress that shows nothing, for callers told to print nothing.
    pub fn hidden() -> Progress {
        Progress { kind: Kind::Hidden }
    }

    fn bar(label: &str, total: u64, unit: &'static str) -> Progress {
        // `unit` is a plain word; braces in it would be read as template keys, and a
        // template that does not parse falls back to indicatif's default bar.
        let template = format!(
            "{{prefix}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} \
             ({{per_sec}}, {{elapsed}}, eta {{eta}})"
        );
        let style = ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
            .with_style(style)
            .with_prefix(label.to_string())
            // Dropped on an error path: cleared, so the error reads cleanly.
            .with_finish(ProgressFinish::AndClear);
        bar.enable_steady_tick(BAR_TICK);
        Progress {
            kind: Kind::Bar(bar),
        }
    }

    fn plain(label: &str, total: u64, unit: &'static str) -> Progress {
        let plain = Arc::new(Plain {
            label: label.to_string(),
            unit,
            total,
            position: AtomicU64::new(0),
            started: Instant::now(),
            printing: Mutex::new(PlainLines::default()),
        });
        let weak = Arc::downgrade(&plain);
        // Detached; should it fail to start, only the lines are lost, never the command.
        let _ = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || print_plain_lines(weak));
        Progress {
            kind: Kind::Plain(plain),
        }
    }

    /// Counts `n` more units done.
    pub fn inc(&self, n: u64) {
        match &self.kind {
            Kind::Bar(bar) => bar.inc(n),
            Kind::Plain(plain) => {
                plain.position.fetch_add(n, Ordering::Relaxed);
            }
            Kind::Hidden => {}
        }
    }

    /// Sets the units done to `position`.
    pub fn set_position(&self, position: u64) {
        match &self.kind {
            Kind::Bar(bar) => bar.set_position(position),
            Kind::Plain(plain) => plain.position.store(position, Ordering::Relaxed),
            Kind::Hidden => {}
        }
    }

    /// Runs `f` (which prints to stdout) with the bar hidden, so its lines are not torn.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.kind {
            Kind::Bar(bar) => bar.suspend(f),
            Kind::Plain(_) | Kind::Hidden => f(),
        }
    }

    /// Ends the step: the bar is cleared; the plain form prints its last line if it
    /// printed any. Later calls do nothing.
    pub fn finish(&self) {
        match &self.kind {
            Kind::Bar(bar) => bar.finish_and_clear(),
            Kind::Plain(plain) => {
                let mut lines = plain.printing.lock();
                if !lines.finished && lines.printed > 0 {
                    eprintln!("{}", plain.line(true));
                }
                lines.finished = true;
            }
            Kind::Hidden => {}
        }
    }
}

impl Plain {
    fn line(&self, done: bool) -> String {
        plain_line(
            &self.label,
            self.position.load(Ordering::Relaxed),
            self.total,
            self.unit,
            self.started.elapsed(),
            done,
        )
    }
}

/// The plain form's thread: a line after [`PLAIN_FIRST_LINE_AFTER`], then every
/// [`PLAIN_LINE_INTERVAL`], until the step is finished or every handle is gone.
fn print_plain_lines(weak: Weak<Plain>) {
    let mut next = PLAIN_FIRST_LINE_AFTER;
    loop {
        std::thread::sleep(next);
        let Some(plain) = weak.upgrade() else { return };
        let mut lines = plain.printing.lock();
        if lines.finished {
            return;
        }
        eprintln!("{}", plain.line(false));
        lines.printed += 1;
        next = PLAIN_LINE_INTERVAL;
    }
}

/// `LABEL: POSITION/TOTAL UNIT (PERCENT %, RATE UNIT/s, ELAPSED s)`, with `done` after
/// the label on the last line.
fn plain_line(
    label: &str,
    position: u64,
    total: u64,
    unit: &str,
    elapsed: Duration,
    done: bool,
) -> String {
    let seconds = elapsed.as_secs_f64();
    let percent = if total == 0 {
        100.0
    } else {
        position as f64 * 100.0 / total as f64
    };
    let rate = position as f64 / seconds.max(1e-3);
    // Small counts (servers) have rates below one a second.
    let decimals = if rate < 10.0 { 1 } else { 0 };
    format!(
        "{label}{}: {position}/{total} {unit} ({percent:.0} %, {rate:.decimals$} {unit}/s, \
         {seconds:.1} s)",
        if done { " done" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_line_shows_count_share_rate_and_time() {
        let line = plain_line(
            "loading",
            2_500,
            10_000,
            "records",
            Duration::from_secs(5),
            false,
        );
        assert_eq!(
            line,
            "loading: 2500/10000 records (25 %, 500 records/s, 5.0 s)"
        );
        let last = plain_line(
            "loading",
            10_000,
            10_000,
            "records",
            Duration::from_secs(8),
            true,
        );
        assert!(
            last.starts_with("loading done: 10000/10000 records (100 %"),
            "{last}"
        );
    }

    #[test]
    fn plain_line_of_an_empty_step_is_complete() {
        let line = plain_line("run", 0, 0, "ops", Duration::ZERO, true);
        assert!(line.contains("(100 %"), "{line}");
        let slow = plain_line("up", 1, 3, "servers", Duration::from_secs(4), false);
        assert!(slow.contains("0.2 servers/s"), "{slow}");
    }

    #[test]
    fn plain_progress_counts_from_every_clone_and_finishes_once() {
        let progress = Progress::plain("load", 10, "objects");
        let clone = progress.clone();
        let other = std::thread::spawn(move || clone.inc(4));
        progress.inc(3);
        other.join().expect("the counting thread does not panic");
        let Kind::Plain(plain) = &progress.kind else {
            panic!("Progress::plain is plain");
        };
        assert_eq!(plain.position.load(Ordering::Relaxed), 7);
        progress.set_position(10);
        assert_eq!(plain.position.load(Ordering::Relaxed), 10);
        progress.finish();
        progress.finish();
        assert!(plain.printing.lock().finished);
        // Finished within the first interval: no line was printed.
        assert_eq!(plain.printing.lock().printed, 0);
    }

    #[test]
    fn hidden_progress_still_runs_what_it_suspends() {
        let progress = Progress::hidden();
        progress.inc(1);
        assert_eq!(progress.suspend(|| 42), 42);
        progress.finish();
    }
}
