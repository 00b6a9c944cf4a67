//! `ExitReporter`: what a supervisor tells the coordinators — that a server's process
//! exited (`ProcessExited`). `rampart cluster up` is the supervisor of the servers it
//! started; under systemd, the server unit's `ExecStopPost` runs `rampart server-exited`
//! (below) once the process is gone.
//!
//! A supervisor that saw the process of server N exit knows that server N serves
//! nothing any more: the coordinators take that as proof of its death
//! (`rampart_coordinator::proof_of_death`), declare it crashed at once and let its
//! recovered tablets go live without waiting out its lease. The word is about one
//! incarnation: the id is the one the process announced when it started (`server N
//! listening on ...`), and a process restarted on the same data directory enlists
//! under a new id.
//!
//! # A server under another supervisor
//! `rampart server` records the id it enlisted under in its data directory
//! ([`INCARNATION_FILE`], replaced atomically at every start). `rampart server-exited
//! --data-dir DIR` reads it and reports that server's exit. It is run by the supervisor
//! *after* the process exited (systemd runs `ExecStopPost` once every process of the
//! unit is gone, and starts the next incarnation only after it), so the id it reads is
//! the last incarnation's, or an older one's if the last died before recording its own:
//! a word about a dead incarnation is true, and the coordinators ignore it for a server
//! already declared crashed. The coordinators still check the word (`Identify`: a
//! server answering at the address with that id, or with an error status as a server
//! of an older release does, is not taken for dead).
//!
//! # Failure handling
//! Best effort, bounded by [`EXIT_REPORT_TIMEOUT`]: coordinators that cannot be told
//! still find the server silent (its peers' pings fail, and the leader's own) and
//! recover it, waiting out its lease unless its address refuses connections under
//! `--proof-of-death direct`.

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_common::coordinator_set::CoordinatorSet;
use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::{ProcessExited, ProcessExitedRequest};
use rampart_common::rpc::RpcPool;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// How long one report may take (finding the leader included).
pub const EXIT_REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Reports exits of servers to their coordinators (module doc).
#[derive(Debug)]
pub struct ExitReporter {
    runtime: tokio::runtime::Runtime,
    coordinators: CoordinatorSet,
    pool: RpcPool,
    /// Who reports, for the coordinators' log.
    name: String,
}

impl ExitReporter {
    /// A reporter to the coordinators at `coordinators` (comma-separated), with this
    /// process's security, naming itself `rampart cluster up`.
    pub fn new(coordinators: &str) -> Result<ExitReporter> {
        ExitReporter::named(
            coordinators,
            format!("rampart cluster up (pid {})", std::process::id()),
        )
    }

    /// A reporter naming itself `name` in the coordinators' log.
    pub fn named(coordinators: &str, name: String) -> Result<ExitReporter> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime to report exits")?;
        Ok(ExitReporter {
            runtime,
            coordinators: CoordinatorSet::new(&[coordinators]),
            pool: RpcPool::new(),
            name,
        })
    }

    /// Tells the coordinators that the process of server `server` exited; blocks for
    /// at most [`EXIT_REPORT_TIMEOUT`].
    pub fn exited(&self, server: u64) -> Result<()> {
        let request = ProcessExitedRequest {
            server: ServerId(server),
            supervisor: self.name.clone(),
        };
        self.runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + EXIT_REPORT_TIMEOUT;
            self.coordinators
                .call::<ProcessExited>(&self.pool, &request, deadline)
                .await
                .with_context(|| {
                    format!("the coordinators were not told that server {server} exited")
                })
        })
    }
}

/// The file in a server's data directory naming the id its current (or last)
/// incarnation enlisted under: the decimal id and a newline.
pub const INCARNATION_FILE: &str = "server.id";

/// Records `id` as the incarnation of the server whose data directory is `data_dir`:
/// written beside [`INCARNATION_FILE`] under a name of this process's own (its pid: no
/// live process shares it, so a file of that name is a dead one's leftover) and renamed
/// over it, so a reader finds the old id or the new one, never a part. Not fsynced: the
/// server calls it once enlisted, when it must answer pings at once, and a record lost
/// to a power failure costs nothing (every incarnation is dead after it; a report that
/// cannot read the file fails, and the lease is waited out).
pub fn record_incarnation(data_dir: &Path, id: u64) -> Result<()> {
    let path = data_dir.join(INCARNATION_FILE);
    let temporary = data_dir.join(format!("{INCARNATION_FILE}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        match std::fs::remove_file(&temporary) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)?;
        writeln!(file, "{id}")?;
        drop(file);
        std::fs::rename(&temporary, &path)
    };
    write().with_context(|| format!("cannot record this server's id in {}", path.display()))
}

/// The id recorded in `data_dir` by [`record_incarnation`].
pub fn recorded_incarnation(data_dir: &Path) -> Result<u64> {
    let path = data_dir.join(INCARNATION_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (a server records its id there once it enlisted; none ever \
             did with this data directory?)",
            path.display()
        )
    })?;
    match text.strip_suffix('\n').map(str::parse::<u64>) {
        Some(Ok(id)) => Ok(id),
        _ => bail!("{} does not hold a server id: {text:?}", path.display()),
    }
}

/// `rampart server-exited`: a supervisor's report that a server's process exited.
#[derive(Args, Debug)]
pub struct ServerExitedArgs {
    /// Coordinator address(es), comma-separated.
    #[arg(long, env = "RAMPART_COORDINATOR", default_value = "127.0.0.1:7000")]
    pub coordinator: String,
    /// The server's data directory: the id of its last incarnation is read there.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Who saw the process exit, for the coordinators' log (the systemd unit passes
    /// `systemd:%n`).
    #[arg(long, default_value = "a supervisor")]
    pub supervisor: String,
    /// The server's name in the cluster file (`--cluster-file`): its data directory and
    /// the coordinators come from there.
    #[arg(long, requires = "cluster_file")]
    pub name: Option<String>,
    #[command(flatten)]
    pub security: crate::security::ClientSecurityArgs,
}

/// Runs `rampart server-exited`: reads the server's id from its data directory and tells
/// the coordinators its process exited. systemd's `$SERVICE_RESULT`, `$EXIT_CODE` and
/// `$EXIT_STATUS`, when set (in `ExecStopPost`), go into the report's name.
pub fn run_server_exited(args: ServerExitedArgs) -> Result<ExitCode> {
    args.security.install()?;
    let id = recorded_incarnation(&args.data_dir)?;
    let how: Vec<String> = ["SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS"]
        .iter()
        .filter_map(|var| Some(format!("{var}={}", std::env::var(var).ok()?)))
        .collect();
    let name = if how.is_empty() {
        args.supervisor.clone()
    } else {
        format!("{} ({})", args.supervisor, how.join(" "))
    };
    ExitReporter::named(&args.coordinator, name)?.exited(id)?;
    println!("told the coordinators that server {id} exited");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_no_coordinator_answers_fails_within_its_bound() {
        // A coordinator that accepts connections (the kernel does, for a listener held
        // here) and never answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let addr = silent.local_addr().expect("its address").to_string();
        let reporter = ExitReporter::named(&addr, "test".to_string()).expect("a reporter");
        let started = std::time::Instant::now();
        let error = reporter.exited(5).expect_err("nobody answered");
        assert!(
            started.elapsed() < EXIT_REPORT_TIMEOUT + Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        assert!(
            format!("{error:#}").contains("were not told that server 5 exited"),
            "{error:#}"
        );
    }

    #[test]
    fn the_last_recorded_incarnation_is_read_back() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert!(recorded_incarnation(dir.path()).is_err());
        record_incarnation(dir.path(), 7).expect("recorded");
        record_incarnation(dir.path(), 12).expect("recorded again");
        assert_eq!(recorded_incarnation(dir.path()).expect("read"), 12);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("listed")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [INCARNATION_FILE], "no temporary file is left");
    }

    #[test]
    fn a_record_that_cannot_be_written_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let missing = dir.path().join("no-such-directory");
        let error = record_incarnation(&missing, 4).expect_err("no directory to write in");
        assert!(
            format!("{error:#}").contains(&missing.join(INCARNATION_FILE).display().to_string()),
            "{error:#}"
        );
    }

    #[test]
    fn a_leftover_temporary_file_of_a_dead_process_is_replaced() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let leftover = dir
            .path()
            .join(format!("{INCARNATION_FILE}.{}.tmp", std::process::id()));
        std::fs::write(&leftover, "garbage").expect("written");
        record_incarnation(dir.path(), 3).expect("recorded");
        assert_eq!(recorded_incarnation(dir.path()).expect("read"), 3);
        assert!(!leftover.exists());
    }

    #[test]
    fn a_file_that_is_not_an_id_is_refused() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for text in ["", "12", "x\n", "-1\n", "1 2\n"] {
            std::fs::write(dir.path().join(INCARNATION_FILE), text).expect("written");
            let error = recorded_incarnation(dir.path()).expect_err(text);
            assert!(
                error.to_string().contains("does not hold a server id"),
                "{error}"
            );
        }
    }
}
