//! Starting `rampart` processes and learning where they listen: one way for every
//! launcher of processes — `rampart cluster up` (the binary's `child_processes`, which
//! adds what its children need: the parent-death signal, a process group, a network
//! namespace) and the integration tests' harness (`rampart-tests`).
//!
//! A starting process announces itself on stdout, one line per fact
//! (`rampart_common::announce`): its failpoints, the URLs of its pages, where it is
//! bound while it waits for its peers, where it listens. [`Starting`] reads those lines
//! as they come and waits for the one a launcher needs; [`start_group`] is the handshake
//! of a Raft group whose members take free ports (`--listen HOST:0 --peers -`): each binds
//! its own port and says where, then all are told their peers' addresses on stdin.
//! Nobody picks a port it does not hold, so two clusters started at once never share
//! one.

use anyhow::{anyhow, bail, Context, Result};
use rampart_common::announce::{Announce, Speaker};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A process started, reading its announcements, not yet listening. Killed if dropped
/// before [`Starting::wait_listening`] hands it over.
#[derive(Debug)]
pub struct Starting {
    name: String,
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    /// Its stdin, for [`Starting::send_line`]; closed (end of file) once sent, or once
    /// it is waited for as listening.
    stdin: Option<ChildStdin>,
    /// How long each wait for an announcement may take.
    timeout: Duration,
    /// The announcements a wait went past (its failpoints, say, before its bound
    /// address), for [`Starting::wait_listening`] to see too.
    passed: Vec<Announce>,
}

/// A process that said it listens.
#[derive(Debug)]
pub struct Listening {
    /// What it is, for messages ("coordinator 1", "server 2").
    pub name: String,
    /// Who said it listens (a server says its id).
    pub speaker: Speaker,
    /// Where.
    pub addr: String,
    /// The URLs it announced before (`... metrics at http://...`), in order: a server's
    /// metrics; a coordinator's status page, then its metrics.
    pub urls: Vec<String>,
    /// The process, the caller's to stop: dropping a `Child` does not kill it.
    pub child: Child,
}

impl Starting {
    /// Starts `command` (a `rampart` subcommand), its stdin and stdout piped (stderr
    /// inherited), its stdout read line by line and drained to its end, so that it never
    /// blocks on a full pipe. `name` names it in errors; each wait for an announcement
    /// may take `timeout`.
    pub fn spawn(name: &str, mut command: Command, timeout: Duration) -> Result<Starting> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{name} has no stdout"))?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Nobody listening any more: keep draining.
                let _ = tx.send(line);
            }
        });
        Ok(Starting {
            name: name.to_string(),
            child: Some(child),
            lines,
            stdin,
            timeout,
            passed: Vec::new(),
        })
    }

    /// Waits (up to its timeout from now) for the announcement `wanted` picks; every
    /// announcement before it goes to `wanted` too, which may refuse the process (an
    /// error). Other lines are skipped. An error if the process exits first or the time
    /// runs out (then the process is killed).
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        mut wanted: impl FnMut(Announce) -> Result<Option<T>>,
    ) -> Result<T> {
        let name = self.name.clone();
        let child = self
            .child
            .as_mut()
            .ok_or_else(|| anyhow!("{name} was handed over already"))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            match self.lines.recv_timeout(wait) {
                Ok(line) => {
                    let Some(announce) = Announce::parse(&line) else {
                        continue;
                    };
                    if let Some(found) = wanted(announce.clone())? {
                        return Ok(found);
                    }
                    self.passed.push(announce);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().ok();
                    bail!(
                        "{name} exited before it printed `{what}` ({status:?}); see its \
                         messages above"
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        bail!("{name} exited before it printed `{what}` ({status})");
                    }
                    if Instant::now() >= deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        bail!("{name} did not print `{what}` within {:?}", self.timeout);
                    }
                }
            }
        }
    }

    /// Waits for its `waiting for its peers, bound to ADDR` line
    /// ([`Announce::WaitingForPeers`]); ADDR.
    pub fn wait_bound(&mut self) -> Result<String> {
        self.wait_for("waiting for its peers", |announce| {
            Ok(match announce {
                Announce::WaitingForPeers { addr, .. } => Some(addr),
                _ => None,
            })
        })
    }

    /// Writes `line` to its stdin and closes it.
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let mut stdin = self
            .stdin
            .take()
            .ok_or_else(|| anyhow!("{}'s stdin is closed", self.name))?;
        writeln!(stdin, "{line}").with_context(|| format!("cannot write to {}", self.name))
    }

    /// Closes its stdin (nothing more will be sent) and waits for its `listening on`
    /// line ([`Announce::Listening`]); `each` sees every announcement before it — also
    /// those earlier waits went past — and may refuse the process. The process is
    /// handed over, listening.
    pub fn wait_listening(
        mut self,
        mut each: impl FnMut(&Announce) -> Result<()>,
    ) -> Result<Listening> {
        drop(self.stdin.take());
        let mut urls = Vec::new();
        let mut before = |announce: &Announce| -> Result<()> {
            each(announce)?;
            urls.extend(announce.urls().into_iter().map(String::from));
            Ok(())
        };
        for announce in std::mem::take(&mut self.passed) {
            before(&announce)?;
        }
        let (speaker, addr) = self.wait_for("listening on", |announce| {
            if let Announce::Listening { speaker, addr } = announce {
                return Ok(Some((speaker, addr)));
            }
            before(&announce)?;
            Ok(None)
        })?;
        let child = self
            .child
            .take()
            .ok_or_else(|| anyhow!("{} was handed over already", self.name))?;
        Ok(Listening {
            name: std::mem::take(&mut self.name),
            speaker,
            addr,
            urls,
            child,
        })
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `ID=ADDR,...`: the `--peers` list of a group whose members, with ids from 1, are at
/// `addrs`.
pub fn peers_list<S: AsRef<str>>(addrs: &[S]) -> String {
    let peers: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("{}={}", i + 1, addr.as_ref()))
        .collect();
    peers.join(",")
}

/// The handshake of a group whose `members` (ids 1, 2, ... in order, each started with
/// `--listen HOST:0 --peers -`) bind free ports: waits until each says where it is
/// bound, then tells each the whole group ([`peers_list`]) on stdin. Returns the
/// members' addresses; each is then waited for as listening.
pub fn start_group(members: &mut [Starting]) -> Result<Vec<String>> {
    let bound = members
        .iter_mut()
        .map(Starting::wait_bound)
        .collect::<Result<Vec<_>>>()?;
    let peers = peers_list(&bound);
    for member in members.iter_mut() {
        member.send_line(&peers)?;
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str) -> Starting {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        Starting::spawn("sh", command, Duration::from_secs(10)).expect("sh starts")
    }

    #[test]
    fn the_peers_list_numbers_members_from_one() {
        assert_eq!(peers_list(&["a:1", "b:2"]), "1=a:1,2=b:2");
        assert_eq!(peers_list::<&str>(&[]), "");
    }

    #[test]
    fn a_group_is_told_its_peers_once_every_member_is_bound() {
        // Each "member" says where it is bound, then says it listens "on" what it was
        // told on stdin.
        let member = |id: u64, port: u16| {
            shell(&format!(
                "echo 'coordinator {id} waiting for its peers, bound to 127.0.0.1:{port}'; \
                 read peers; echo \"coordinator {id} listening on $peers\"; sleep 5"
            ))
        };
        let mut members = vec![member(1, 7001), member(2, 7002)];
        let bound = start_group(&mut members).expect("the handshake");
        assert_eq!(bound, vec!["127.0.0.1:7001", "127.0.0.1:7002"]);
        for (member, id) in members.into_iter().zip(1..) {
            let listening = member.wait_listening(|_| Ok(())).expect("listening");
            assert_eq!(listening.addr, "1=127.0.0.1:7001,2=127.0.0.1:7002");
            assert_eq!(listening.speaker, Speaker::Coordinator(id));
            let mut child = listening.child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    #[test]
    fn what_a_wait_went_past_is_seen_when_waiting_for_the_listening_line() {
        let mut member = shell(
            "echo 'coordinator 1 status at http://127.0.0.1:9/ metrics at http://127.0.0.1:9/m'; \
             echo 'coordinator 1 waiting for its peers, bound to 127.0.0.1:7001'; \
             read peers; echo 'coordinator 1 listening on 127.0.0.1:7001'; sleep 5",
        );
        start_group(std::slice::from_mut(&mut member)).expect("the handshake");
        let mut seen = Vec::new();
        let listening = member
            .wait_listening(|announce| {
                seen.push(announce.clone());
                Ok(())
            })
            .expect("listening");
        assert_eq!(
            listening.urls,
            ["http://127.0.0.1:9/", "http://127.0.0.1:9/m"]
        );
        assert!(matches!(seen[..], [Announce::Urls(_)]), "{seen:?}");
        let mut child = listening.child;
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_process_that_exits_before_its_line_is_an_error_naming_the_line() {
        let error = shell("echo unrelated")
            .wait_listening(|_| Ok(()))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("exited before it printed `listening on`"),
            "{error}"
        );
    }

    #[test]
    fn an_announcement_may_refuse_the_process() {
        let starting = shell("echo 'server 9 metrics at http://127.0.0.1:9/metrics'; sleep 5");
        let error = starting
            .wait_listening(|announce| match announce.urls().is_empty() {
                true => Ok(()),
                false => bail!("no pages wanted"),
            })
            .unwrap_err();
        assert_eq!(error.to_string(), "no pages wanted");
    }
}
