//! [`Announce`]: the lines a `rampart` process prints on its stdout while it starts,
//! before it serves — which build it is (failpoints), where it waits for its peers,
//! where its status page and metrics are, and where it listens. A parent that asked for
//! port 0 learns the ports from them. The processes (`rampart coordinator`, `server`,
//! `gateway`) write them with [`Announce`]'s `Display` and every launcher (`rampart
//! cluster up`, the tests' harness) reads them with [`Announce::parse`]: the text is
//! defined here once, and a test checks that each line reads back as itself.
//! [`ClusterLine`] does the same for `rampart cluster up`'s report of the processes it
//! started, which the tests' harness reads.
//!
//! Lines, one per event, in this order (those that apply):
//! * `failpoints compiled in: NAMES` or `failpoints compiled out of this build:
//!   RAMPART_FAILPOINTS ignored` — only when `RAMPART_FAILPOINTS` names failpoints;
//! * `coordinator N waiting for its peers, bound to ADDR` — a coordinator started with
//!   `--peers -`, which then reads its group's list on stdin;
//! * `coordinator N status at URL metrics at URL`, `server N metrics at URL`;
//! * `coordinator N listening on ADDR`, `server N listening on ADDR`, `gateway listening
//!   on ADDR` (and `echo listening on ADDR`, the benchmarks' echo server) — the process
//!   serves from here on.

use std::fmt;

/// The process a line is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    /// Coordinator `id` of its group.
    Coordinator(u64),
    /// The storage server with this server id.
    Server(u64),
    /// A Redis-protocol gateway.
    Gateway,
    /// The echo server of `rampart bench ycsb`'s floor.
    Echo,
}

/// One start-up line; see the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Announce {
    /// Whether this build honours the failpoints `RAMPART_FAILPOINTS` named (`named`,
    /// as given, when compiled in).
    Failpoints { compiled_in: bool, named: String },
    /// A coordinator bound `addr` and waits for its group's list on stdin.
    WaitingForPeers { coordinator: u64, addr: String },
    /// Where a process serves HTTP (`S status at URL metrics at URL`).
    Urls(Pages),
    /// The process serves on `addr` from now on.
    Listening { speaker: Speaker, addr: String },
}

const LISTENING: &str = " listening on ";
const WAITING: &str = " waiting for its peers, bound to ";

/// Where a process serves HTTP: its status page (coordinators), its metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pages {
    pub speaker: Speaker,
    pub status: Option<String>,
    pub metrics: String,
}

/// The words between a speaker and its URLs: a process's own line, or cluster up's.
struct PageWords {
    status: &'static str,
    metrics: &'static str,
}

/// `coordinator 1 status at URL metrics at URL`
const PROCESS_PAGES: PageWords = PageWords {
    status: " status at ",
    metrics: " metrics at ",
};

/// `coordinator 1 status page URL metrics URL`
const CLUSTER_PAGES: PageWords = PageWords {
    status: " status page ",
    metrics: " metrics ",
};

impl Pages {
    fn write(&self, f: &mut fmt::Formatter<'_>, words: &PageWords) -> fmt::Result {
        write!(f, "{}", self.speaker)?;
        if let Some(status) = &self.status {
            write!(f, "{}{status}", words.status)?;
        }
        write!(f, "{}{}", words.metrics, self.metrics)
    }

    fn parse(line: &str, words: &PageWords) -> Option<Pages> {
        let (before, metrics) = line.split_once(words.metrics)?;
        let (speaker, status) = match before.split_once(words.status) {
            Some((speaker, status)) => (speaker, Some(one_word(status)?)),
            None => (before, None),
        };
        Some(Pages {
            speaker: Speaker::parse(speaker)?,
            status,
            metrics: one_word(metrics)?,
        })
    }
}
const FAILPOINTS_IN: &str = "failpoints compiled in: ";
const FAILPOINTS_OUT: &str = "failpoints compiled out of this build: ";

impl fmt::Display for Speaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Speaker::Coordinator(id) => write!(f, "coordinator {id}"),
            Speaker::Server(id) => write!(f, "server {id}"),
            Speaker::Gateway => f.write_str("gateway"),
            Speaker::Echo => f.write_str("echo"),
        }
    }
}

impl Speaker {
    fn parse(text: &str) -> Option<Speaker> {
        match text {
            "gateway" => return Some(Speaker::Gateway),
            "echo" => return Some(Speaker::Echo),
            _ => {}
        }
        let (role, id) = text.split_once(' ')?;
        let id: u64 = id.parse().ok()?;
        match role {
            "coordinator" => Some(Speaker::Coordinator(id)),
            "server" => Some(Speaker::Server(id)),
            _ => None,
        }
    }

    /// The server id of a storage server.
    pub fn server_id(&self) -> Option<u64> {
        match self {
            Speaker::Server(id) => Some(*id),
            Speaker::Coordinator(_) | Speaker::Gateway | Speaker::Echo => None,
        }
    }
}

impl fmt::Display for Announce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Announce::Failpoints {
                compiled_in: true,
                named,
            } => write!(f, "{FAILPOINTS_IN}{named}"),
            Announce::Failpoints {
                compiled_in: false, ..
            } => write!(
                f,
                "{FAILPOINTS_OUT}{} ignored",
                crate::failpoints::FAILPOINTS_ENV
            ),
            Announce::WaitingForPeers { coordinator, addr } => {
                write!(f, "{}{WAITING}{addr}", Speaker::Coordinator(*coordinator))
            }
            Announce::Urls(pages) => pages.write(f, &PROCESS_PAGES),
            Announce::Listening { speaker, addr } => write!(f, "{speaker}{LISTENING}{addr}"),
        }
    }
}

impl Announce {
    /// The announcement `line` is, or `None` for any other line (a process's log).
    pub fn parse(line: &str) -> Option<Announce> {
        let line = line.trim_end();
        if let Some(named) = line.strip_prefix(FAILPOINTS_IN) {
            return Some(Announce::Failpoints {
                compiled_in: true,
                named: named.to_string(),
            });
        }
        if line.starts_with(FAILPOINTS_OUT) {
            return Some(Announce::Failpoints {
                compiled_in: false,
                named: String::new(),
            });
        }
        if let Some((speaker, addr)) = line.split_once(LISTENING) {
            return Some(Announce::Listening {
                speaker: Speaker::parse(speaker)?,
                addr: one_word(addr)?,
            });
        }
        if let Some((speaker, addr)) = line.split_once(WAITING) {
            let Speaker::Coordinator(coordinator) = Speaker::parse(speaker)? else {
                return None;
            };
            return Some(Announce::WaitingForPeers {
                coordinator,
                addr: one_word(addr)?,
            });
        }
        Pages::parse(line, &PROCESS_PAGES).map(Announce::Urls)
    }

    /// The HTTP URLs of a `status at` / `metrics at` line.
    pub fn urls(&self) -> Vec<&str> {
        match self {
            Announce::Urls(Pages {
                status, metrics, ..
            }) => status
                .iter()
                .map(String::as_str)
                .chain([metrics.as_str()])
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// One line of `rampart cluster up`'s report of the cluster it started, read by the
/// tests' harness (`LocalCluster`): where each process listens, with its pid, and its
/// pages. Lines for people (progress, hints) are not among them, except `ready`, which
/// ends the start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterLine {
    /// `coordinator N at ADDR (pid P)`, `server N at ADDR (pid P, data DIR)`, `gateway at
    /// ADDR (pid P) HINT`.
    Started {
        speaker: Speaker,
        addr: String,
        pid: u32,
        /// A server's data directory.
        data: Option<String>,
        /// What follows, for people (the gateway's `redis-cli` line).
        hint: String,
    },
    /// `coordinator N status page URL metrics URL`, `server N metrics URL`.
    Pages(Pages),
    /// `ready: HINT` — every process is up.
    Ready { hint: String },
}

impl fmt::Display for ClusterLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterLine::Started {
                speaker,
                addr,
                pid,
                data,
                hint,
            } => {
                write!(f, "{speaker} at {addr} (pid {pid}")?;
                if let Some(data) = data {
                    write!(f, ", data {data}")?;
                }
                f.write_str(")")?;
                if !hint.is_empty() {
                    write!(f, " {hint}")?;
                }
                Ok(())
            }
            ClusterLine::Pages(pages) => pages.write(f, &CLUSTER_PAGES),
            ClusterLine::Ready { hint } => write!(f, "ready: {hint}"),
        }
    }
}

impl ClusterLine {
    /// The report line `line` is, or `None` for any other line.
    pub fn parse(line: &str) -> Option<ClusterLine> {
        let line = line.trim_end();
        if let Some(hint) = line.strip_prefix("ready: ") {
            return Some(ClusterLine::Ready {
                hint: hint.to_string(),
            });
        }
        if let Some((speaker, rest)) = line.split_once(" at ") {
            let speaker = Speaker::parse(speaker)?;
            let (addr, rest) = rest.split_once(" (pid ")?;
            let (inside, hint) = rest.split_once(')')?;
            let (pid, data) = match inside.split_once(", data ") {
                Some((pid, data)) => (pid, Some(data.to_string())),
                None => (inside, None),
            };
            return Some(ClusterLine::Started {
                speaker,
                addr: one_word(addr)?,
                pid: pid.parse().ok()?,
                data,
                hint: hint.trim_start().to_string(),
            });
        }
        Pages::parse(line, &CLUSTER_PAGES).map(ClusterLine::Pages)
    }
}

/// `text` when it is one non-empty word (an address or a URL).
fn one_word(text: &str) -> Option<String> {
    (!text.is_empty() && !text.contains(char::is_whitespace)).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<Announce> {
        vec![
            Announce::Failpoints {
                compiled_in: true,
                named: "close_job.after_claim=panic".into(),
            },
            Announce::Failpoints {
                compiled_in: false,
                named: String::new(),
            },
            Announce::WaitingForPeers {
                coordinator: 2,
                addr: "127.0.0.1:40001".into(),
            },
            Announce::Urls(Pages {
                speaker: Speaker::Coordinator(1),
                status: Some("http://127.0.0.1:9000/".into()),
                metrics: "http://127.0.0.1:9000/metrics".into(),
            }),
            Announce::Urls(Pages {
                speaker: Speaker::Server(7),
                status: None,
                metrics: "http://127.0.0.1:9100/metrics".into(),
            }),
            Announce::Listening {
                speaker: Speaker::Coordinator(3),
                addr: "127.0.0.1:7000".into(),
            },
            Announce::Listening {
                speaker: Speaker::Server(12),
                addr: "[::1]:7101".into(),
            },
            Announce::Listening {
                speaker: Speaker::Gateway,
                addr: "127.0.0.1:6379".into(),
            },
            Announce::Listening {
                speaker: Speaker::Echo,
                addr: "127.0.0.1:5000".into(),
            },
        ]
    }

    #[test]
    fn every_line_reads_back_as_itself() {
        for announce in every_kind() {
            let line = announce.to_string();
            assert_eq!(Announce::parse(&line), Some(announce), "{line}");
        }
    }

    #[test]
    fn the_lines_are_the_ones_launchers_and_operators_know() {
        let lines: Vec<String> = every_kind().iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "failpoints compiled in: close_job.after_claim=panic",
                "failpoints compiled out of this build: RAMPART_FAILPOINTS ignored",
                "coordinator 2 waiting for its peers, bound to 127.0.0.1:40001",
                "coordinator 1 status at http://127.0.0.1:9000/ metrics at \
                 http://127.0.0.1:9000/metrics",
                "server 7 metrics at http://127.0.0.1:9100/metrics",
                "coordinator 3 listening on 127.0.0.1:7000",
                "server 12 listening on [::1]:7101",
                "gateway listening on 127.0.0.1:6379",
                "echo listening on 127.0.0.1:5000",
            ]
        );
    }

    #[test]
    fn other_lines_are_not_announcements() {
        for line in [
            "",
            "2026-11-28T03:00:00Z INFO rampart: replica stored",
            "server x listening on 127.0.0.1:1",
            "backup 3 listening on 127.0.0.1:1",
            "server 3 listening on ",
            "server 3 listening on two words",
            "gateway waiting for its peers, bound to 127.0.0.1:1",
        ] {
            assert_eq!(Announce::parse(line), None, "{line:?}");
        }
    }
    #[test]
    fn cluster_reports_read_back_as_themselves() {
        let lines = [
            ClusterLine::Started {
                speaker: Speaker::Coordinator(1),
                addr: "127.0.0.1:7000".into(),
                pid: 4242,
                data: None,
                hint: String::new(),
            },
            ClusterLine::Started {
                speaker: Speaker::Server(3),
                addr: "127.0.0.1:7102".into(),
                pid: 4250,
                data: Some("/var/lib/rampart/server-2".into()),
                hint: String::new(),
            },
            ClusterLine::Started {
                speaker: Speaker::Gateway,
                addr: "127.0.0.1:6379".into(),
                pid: 4260,
                data: None,
                hint: "speaks RESP (Redis): redis-cli -p 6379".into(),
            },
            ClusterLine::Pages(Pages {
                speaker: Speaker::Coordinator(1),
                status: Some("http://127.0.0.1:9000/".into()),
                metrics: "http://127.0.0.1:9000/metrics".into(),
            }),
            ClusterLine::Pages(Pages {
                speaker: Speaker::Server(3),
                status: None,
                metrics: "http://127.0.0.1:9100/metrics".into(),
            }),
            ClusterLine::Ready {
                hint: "3 server(s); Ctrl-C stops the cluster".into(),
            },
        ];
        let text: Vec<String> = lines.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "coordinator 1 at 127.0.0.1:7000 (pid 4242)",
                "server 3 at 127.0.0.1:7102 (pid 4250, data /var/lib/rampart/server-2)",
                "gateway at 127.0.0.1:6379 (pid 4260) speaks RESP (Redis): redis-cli -p 6379",
                "coordinator 1 status page http://127.0.0.1:9000/ metrics \
                 http://127.0.0.1:9000/metrics",
                "server 3 metrics http://127.0.0.1:9100/metrics",
                "ready: 3 server(s); Ctrl-C stops the cluster",
            ]
        );
        for (line, text) in lines.into_iter().zip(&text) {
            assert_eq!(ClusterLine::parse(text), Some(line), "{text}");
        }
        for other in [
            "data in /tmp/x",
            "replicas 3",
            "stopping the cluster",
            "servers started in 1.0 s",
        ] {
            assert_eq!(ClusterLine::parse(other), None, "{other}");
        }
    }
}
