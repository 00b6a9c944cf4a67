//! The cluster file: one TOML file describing a deployment — its coordinators, servers
//! and gateways, each with the address it listens on and the address it is reached at,
//! the servers' failure domains (racks), the replication transport, R, and the security
//! files — that every host shares (`ops/deploy/cluster.toml` is an example with 3 racks).
//!
//! A process finds its own entry by `--id` (coordinator) or `--name` (server, gateway):
//! `rampart server --cluster-file F --name h1-a`. The file stands for flags: [`expand`]
//! turns it into the flags the entry describes, inserted after the subcommand before
//! clap parses the command line, so a process started from the file behaves exactly as
//! one started with those flags, and a flag given both ways is refused by clap ("cannot
//! be used multiple times") rather than silently overridden. Client commands (`kv`,
//! `status`, `recovery`) take `--cluster-file` (or `RAMPART_CLUSTER_FILE`) for the
//! coordinators' addresses, the token and the TLS CA.
//!
//! ```toml
//! [cluster]
//! replicas = 3
//! replication = "tcp"
//! auth_token_file = "token"          # relative paths: from the file's directory
//!
//! [[coordinator]]
//! id = 1
//! address = "10.0.1.1:7000"          # what peers and clients dial
//! listen = "0.0.0.0:7000"            # optional; default: address
//! data_dir = "/var/lib/rampart/coordinator-1"
//!
//! [[server]]
//! name = "h1-a"
//! address = "10.0.1.1:7200"
//! listen = "0.0.0.0:7200"
//! rack = "rack-1"
//! data_dir = "/var/lib/rampart/h1-a"
//!
//! [[gateway]]
//! name = "h1"
//! listen = "0.0.0.0:6379"
//! idle_timeout_ms = 300000           # optional, as `rampart gateway --idle-timeout-ms`;
//!                                    # so are first_command_timeout_ms,
//!                                    # connections_per_peer_max, reply_bytes_pending_max
//! ```
//!
//! [`ClusterFile::parse`] checks the file as a whole (unknown keys, duplicate ids, names
//! and addresses, wildcard or port-less advertised addresses, racks too few for R) and
//! reports every problem at once, naming the entry. What stands for one process's
//! flags alone (a size, a gateway's connection limit) is checked by that process as it
//! checks its flags.

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The environment variable that stands for a client command's `--cluster-file`.
pub const CLUSTER_FILE_ENV: &str = "RAMPART_CLUSTER_FILE";

/// A parsed, checked cluster file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Settings of the whole cluster.
    pub cluster: ClusterSection,
    /// The coordinators (the Raft group).
    #[serde(rename = "coordinator", default)]
    pub coordinators: Vec<CoordinatorEntry>,
    /// The storage servers.
    #[serde(rename = "server", default)]
    pub servers: Vec<ServerEntry>,
    /// Redis-protocol gateways.
    #[serde(rename = "gateway", default)]
    pub gateways: Vec<GatewayEntry>,
}

/// `[cluster]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Backup replicas of every segment (R).
    pub replicas: u32,
    /// Replication transport: shm, tcp, rpc or rdma (default: chosen per backup).
    pub replication: Option<String>,
    /// The cluster token, given to every process and client.
    pub auth_token_file: Option<PathBuf>,
    /// Certificate and key every coordinator, server and gateway offers TLS with.
    pub tls_cert: Option<PathBuf>,
    /// The key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// The CA clients check those certificates against (clients then dial over TLS).
    pub tls_ca: Option<PathBuf>,
    /// Log memory of every server unless its entry says otherwise (e.g. "4GiB").
    pub memory: Option<String>,
    /// Bytes per log segment (e.g. "8MiB").
    pub segment_bytes: Option<String>,
    /// Largest value a server accepts (e.g. "1MiB").
    pub value_bytes_max: Option<String>,
    /// Backup frames of every server unless its entry says otherwise.
    pub backup_frames: Option<usize>,
    /// Replicated data each backup may hold only in memory (e.g. "256MiB"; `rampart
    /// server --unflushed-max`).
    pub unflushed_max: Option<String>,
    /// What the coordinators take as proof of a crashed server's death (`off`,
    /// `supervisor`, `direct`; `rampart coordinator --proof-of-death`). Hosts apart:
    /// leave it `supervisor` unless nothing (a firewall REJECT rule, NAT, a proxy) stands
    /// between coordinators and servers.
    pub proof_of_death: Option<String>,
}

/// `[[coordinator]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorEntry {
    /// Raft id (unique, never reused).
    pub id: u64,
    /// HOST:PORT its peers and clients dial.
    pub address: String,
    /// HOST:PORT it binds (default: `address`), e.g. `0.0.0.0:7000`.
    pub listen: Option<String>,
    /// Its Raft log and snapshots.
    pub data_dir: PathBuf,
    /// HOST:PORT of its status page and metrics.
    pub metrics: Option<String>,
}

/// `[[server]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    /// Its name in the file (`--name`); the cluster gives it an id when it enlists.
    pub name: String,
    /// HOST:PORT the others and clients dial (it enlists with it).
    pub address: String,
    /// HOST:PORT it binds (default: `address`).
    pub listen: Option<String>,
    /// Failure domain: no two replicas of a segment in one rack.
    pub rack: String,
    /// Port of its soft-NIC (the `tcp` transport), on `listen`'s IP (default: a free
    /// one); name it for firewalls.
    pub nic_port: Option<u16>,
    /// Its backup's replicas.
    pub data_dir: PathBuf,
    /// Log memory (default: `[cluster] memory`, else the server's default).
    pub memory: Option<String>,
    /// Backup frames (default: `[cluster] backup_frames`, else the server's default).
    pub backup_frames: Option<usize>,
    /// Disk read bandwidth in MB/s, instead of measuring it at start.
    pub disk_mbps: Option<u32>,
    /// HOST:PORT of its metrics.
    pub metrics: Option<String>,
}

/// `[[gateway]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayEntry {
    /// Its name in the file (`--name`).
    pub name: String,
    /// HOST:PORT it serves RESP on.
    pub listen: String,
    /// The table it serves (default: the gateway's default).
    pub table: Option<String>,
    /// `--first-command-timeout-ms` (default: the gateway's default, as for the three
    /// below; see `rampart gateway --help`).
    pub first_command_timeout_ms: Option<u64>,
    /// `--connections-per-peer-max`.
    pub connections_per_peer_max: Option<usize>,
    /// `--idle-timeout-ms` (0: never).
    pub idle_timeout_ms: Option<u64>,
    /// `--reply-bytes-pending-max` (e.g. "64MiB").
    pub reply_bytes_pending_max: Option<String>,
}

impl GatewayEntry {
    /// The flags of the connection limits the entry sets (none for those it leaves to
    /// the gateway's defaults).
    fn connection_limit_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        push_some(
            &mut flags,
            "--first-command-timeout-ms",
            self.first_command_timeout_ms.as_ref(),
        );
        push_some(
            &mut flags,
            "--connections-per-peer-max",
            self.connections_per_peer_max.as_ref(),
        );
        push_some(
            &mut flags,
            "--idle-timeout-ms",
            self.idle_timeout_ms.as_ref(),
        );
        push_some(
            &mut flags,
            "--reply-bytes-pending-max",
            self.reply_bytes_pending_max.as_ref(),
        );
        flags
    }
}

impl ClusterFile {
    /// Reads and checks the file at `path`; relative paths in it are taken from its
    /// directory.
    pub fn load(path: &Path) -> Result<ClusterFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the cluster file {}", path.display()))?;
        let mut file = ClusterFile::parse(&text)
            .map_err(|e| anyhow!("cluster file {}: {e}", path.display()))?;
        let base = std::path::absolute(directory_of(path))
            .with_context(|| format!("cannot resolve the directory of {}", path.display()))?;
        file.resolve_paths(&base);
        Ok(file)
    }

    /// Parses and checks a cluster file's text.
    pub fn parse(text: &str) -> Result<ClusterFile, String> {
        let file: ClusterFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let problems = file.problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(file)
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        let section = &mut self.cluster;
        for path in [
            &mut section.auth_token_file,
            &mut section.tls_cert,
            &mut section.tls_key,
            &mut section.tls_ca,
        ]
        .into_iter()
        .flatten()
        {
            resolve(path);
        }
        for coordinator in &mut self.coordinators {
            resolve(&mut coordinator.data_dir);
        }
        for server in &mut self.servers {
            resolve(&mut server.data_dir);
        }
    }

    /// Everything wrong with the file, each naming its entry.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.coordinators.is_empty() {
            problems.push("no [[coordinator]]: a cluster needs at least one".to_string());
        }
        let mut ids = BTreeSet::new();
        let mut addresses: BTreeMap<String, String> = BTreeMap::new();
        let mut claim = |address: &str, who: String, problems: &mut Vec<String>| {
            if let Some(first) = addresses.insert(address.to_string(), who.clone()) {
                problems.push(format!("{who} and {first} both use address {address}"));
            }
        };
        for c in &self.coordinators {
            let who = format!("coordinator {}", c.id);
            if c.id == 0 || !ids.insert(c.id) {
                problems.push(format!("{who}: ids must be unique and above 0"));
            }
            check_advertised(&c.address, &who, &mut problems);
            claim(&c.address, who, &mut problems);
        }
        let mut names = BTreeSet::new();
        for s in &self.servers {
            let who = format!("server {}", s.name);
            if !names.insert(s.name.as_str()) {
                problems.push(format!("{who}: names must be unique"));
            }
            if s.rack.trim().is_empty() {
                problems.push(format!("{who}: rack is empty"));
            }
            check_advertised(&s.address, &who, &mut problems);
            claim(&s.address, who, &mut problems);
        }
        for g in &self.gateways {
            if !names.insert(g.name.as_str()) {
                problems.push(format!("gateway {}: names must be unique", g.name));
            }
        }
        let section = &self.cluster;
        if section.tls_cert.is_some() != section.tls_key.is_some() {
            problems.push("[cluster] tls_cert and tls_key go together".to_string());
        }
        if let Some(problem) = self.racks_short_of_replicas() {
            problems.push(problem);
        }
        problems
    }

    /// A master never keeps a replica on its own server, and no two replicas of a
    /// segment share a rack: every server needs R racks among the *other* servers.
    fn racks_short_of_replicas(&self) -> Option<String> {
        let r = self.cluster.replicas as usize;
        if r == 0 || self.servers.is_empty() {
            return None;
        }
        self.servers.iter().find_map(|server| {
            let racks: BTreeSet<&str> = self
                .servers
                .iter()
                .filter(|other| other.name != server.name)
                .map(|other| other.rack.as_str())
                .collect();
            (racks.len() < r).then(|| {
                format!(
                    "replicas = {r} needs, for every server, {r} racks among the other \
                     servers; server {} has {} ({}): add servers in other racks or lower \
                     replicas",
                    server.name,
                    racks.len(),
                    racks.into_iter().collect::<Vec<_>>().join(", ")
                )
            })
        })
    }

    /// The coordinators' addresses, comma-separated (what `--coordinator` takes).
    pub fn coordinator_list(&self) -> String {
        self.coordinators
            .iter()
            .map(|c| c.address.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The flags of coordinator `id`.
    pub fn coordinator_flags(&self, id: u64) -> Result<Vec<String>> {
        let entry = self
            .coordinators
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| anyhow!("the cluster file has no coordinator with id {id}"))?;
        let peers = self
            .coordinators
            .iter()
            .map(|c| format!("{}={}", c.id, c.address))
            .collect::<Vec<_>>()
            .join(",");
        let mut flags = vec![
            "--peers".to_string(),
            peers,
            "--listen".to_string(),
            entry
                .listen
                .clone()
                .unwrap_or_else(|| entry.address.clone()),
            "--data-dir".to_string(),
            entry.data_dir.display().to_string(),
        ];
        push_some(&mut flags, "--metrics-addr", entry.metrics.as_ref());
        push_some(
            &mut flags,
            "--proof-of-death",
            self.cluster.proof_of_death.as_ref(),
        );
        self.push_server_security(&mut flags);
        Ok(flags)
    }

    /// Server `name`'s entry.
    fn server(&self, name: &str) -> Result<&ServerEntry> {
        self.servers
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| anyhow!("the cluster file has no server named {name}"))
    }

    /// The flags of server `name`.
    pub fn server_flags(&self, name: &str) -> Result<Vec<String>> {
        let entry = self.server(name)?;
        let section = &self.cluster;
        let mut flags = vec![
            "--coordinator".to_string(),
            self.coordinator_list(),
            "--listen".to_string(),
            entry
                .listen
                .clone()
                .unwrap_or_else(|| entry.address.clone()),
            "--advertise".to_string(),
            entry.address.clone(),
            "--failure-domain".to_string(),
            entry.rack.clone(),
            "--data-dir".to_string(),
            entry.data_dir.display().to_string(),
            "--replicas".to_string(),
            section.replicas.to_string(),
        ];
        push_some(&mut flags, "--replication", section.replication.as_ref());
        push_some(
            &mut flags,
            "--memory",
            entry.memory.as_ref().or(section.memory.as_ref()),
        );
        push_some(
            &mut flags,
            "--segment-bytes",
            section.segment_bytes.as_ref(),
        );
        push_some(
            &mut flags,
            "--value-bytes-max",
            section.value_bytes_max.as_ref(),
        );
        push_some(
            &mut flags,
            "--backup-frames",
            entry.backup_frames.or(section.backup_frames).as_ref(),
        );
        push_some(
            &mut flags,
            "--unflushed-max",
            section.unflushed_max.as_ref(),
        );
        push_some(&mut flags, "--disk-mbps", entry.disk_mbps.as_ref());
        push_some(&mut flags, "--nic-port", entry.nic_port.as_ref());
        push_some(&mut flags, "--metrics-addr", entry.metrics.as_ref());
        self.push_server_security(&mut flags);
        Ok(flags)
    }

    /// The flags of gateway `name`.
    pub fn gateway_flags(&self, name: &str) -> Result<Vec<String>> {
        let entry = self
            .gateways
            .iter()
            .find(|g| g.name == name)
            .ok_or_else(|| anyhow!("the cluster file has no gateway named {name}"))?;
        let mut flags = vec![
            "--coordinator".to_string(),
            self.coordinator_list(),
            "--listen".to_string(),
            entry.listen.clone(),
        ];
        push_some(&mut flags, "--table", entry.table.as_ref());
        flags.extend(entry.connection_limit_flags());
        push_path(
            &mut flags,
            "--auth-token-file",
            &self.cluster.auth_token_file,
        );
        push_path(&mut flags, "--tls-cert", &self.cluster.tls_cert);
        push_path(&mut flags, "--tls-key", &self.cluster.tls_key);
        Ok(flags)
    }

    /// The flags of `rampart server-exited` for server `name`: the coordinators, the
    /// client's security, and the server's data directory.
    pub fn server_exited_flags(&self, name: &str) -> Result<Vec<String>> {
        let entry = self.server(name)?;
        let mut flags = self.client_flags();
        flags.extend([
            "--data-dir".to_string(),
            entry.data_dir.display().to_string(),
        ]);
        Ok(flags)
    }

    /// The flags of a client command: the coordinators, the token, the TLS CA.
    pub fn client_flags(&self) -> Vec<String> {
        let mut flags = vec!["--coordinator".to_string(), self.coordinator_list()];
        push_path(
            &mut flags,
            "--auth-token-file",
            &self.cluster.auth_token_file,
        );
        push_path(&mut flags, "--tls-ca", &self.cluster.tls_ca);
        flags
    }

    fn push_server_security(&self, flags: &mut Vec<String>) {
        push_path(flags, "--auth-token-file", &self.cluster.auth_token_file);
        push_path(flags, "--tls-cert", &self.cluster.tls_cert);
        push_path(flags, "--tls-key", &self.cluster.tls_key);
    }
}

fn push_some<T: ToString>(flags: &mut Vec<String>, flag: &str, value: Option<&T>) {
    if let Some(value) = value {
        flags.extend([flag.to_string(), value.to_string()]);
    }
}

fn push_path(flags: &mut Vec<String>, flag: &str, path: &Option<PathBuf>) {
    if let Some(path) = path {
        flags.extend([flag.to_string(), path.display().to_string()]);
    }
}

/// An address others dial must be HOST:PORT with a port, and not a wildcard.
fn check_advertised(address: &str, who: &str, problems: &mut Vec<String>) {
    let Some((host, port)) = address.rsplit_once(':') else {
        problems.push(format!("{who}: address {address} lacks a port (HOST:PORT)"));
        return;
    };
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        problems.push(format!("{who}: address {address} needs a fixed port"));
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host == "0.0.0.0" || host == "::" {
        problems.push(format!(
            "{who}: address {address} is a wildcard; give the address others reach it at \
             (bind the wildcard with listen)"
        ));
    }
}

/// The value of `--flag VALUE` or `--flag=VALUE` in `args`, before any `--` (after
/// it, words are values: a key named `--name` is not the flag).
fn flag_value(args: &[OsString], flag: &str) -> Option<String> {
    let with_eq = format!("{flag}=");
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let args = &args[..end];
    args.iter().enumerate().find_map(|(i, arg)| {
        let arg = arg.to_str()?;
        if arg == flag {
            args.get(i + 1)?.to_str().map(str::to_string)
        } else {
            arg.strip_prefix(&with_eq).map(str::to_string)
        }
    })
}

/// Whether `args` (before any `--`) give `flag`, as `--flag VALUE` or `--flag=VALUE`.
fn has_flag(args: &[OsString], flag: &str) -> bool {
    let with_eq = format!("{flag}=");
    args.iter()
        .take_while(|a| *a != "--")
        .filter_map(|a| a.to_str())
        .any(|a| a == flag || a.starts_with(&with_eq))
}

/// The directory of the file at `path`: a bare file name's is the current one (its
/// parent is empty, which `std::path::absolute` refuses).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// `flags` (pairs of flag and value) without those `args` give already.
fn drop_given(flags: Vec<String>, args: &[OsString]) -> Vec<String> {
    flags
        .chunks(2)
        .filter(|pair| !has_flag(args, &pair[0]))
        .flatten()
        .cloned()
        .collect()
}

/// The command line with a cluster file's flags inserted after the subcommand, when it
/// names one (`--cluster-file F`, or `RAMPART_CLUSTER_FILE` for client commands and a
/// gateway given `--name`); otherwise `args` unchanged. `args[0]` is the program,
/// `args[1]` the subcommand (the binary has no flags of its own before it). A flag the
/// file stands for, given on the command line too, is refused by clap as given twice —
/// unless the file came from the environment: a flag typed on the command line then
/// wins over the file's.
pub fn expand(args: Vec<OsString>) -> Result<Vec<OsString>> {
    expand_with(args, std::env::var(CLUSTER_FILE_ENV).ok())
}

fn expand_with(args: Vec<OsString>, env_file: Option<String>) -> Result<Vec<OsString>> {
    let Some(command) = args.get(1).and_then(|c| c.to_str()).map(str::to_string) else {
        return Ok(args);
    };
    let client = matches!(command.as_str(), "kv" | "status" | "recovery");
    let named_gateway = command == "gateway" && has_flag(&args, "--name");
    let (path, from_env) = match flag_value(&args, "--cluster-file") {
        Some(path) => (path, false),
        None => match env_file.filter(|_| client || named_gateway) {
            Some(path) => (path, true),
            None => return Ok(args),
        },
    };
    let file = ClusterFile::load(Path::new(&path))?;
    let flags = match command.as_str() {
        "coordinator" => {
            let id = flag_value(&args, "--id")
                .ok_or_else(|| anyhow!("--cluster-file needs --id: which coordinator this is"))?;
            let id = id
                .parse()
                .map_err(|_| anyhow!("--id {id} is not a number"))?;
            file.coordinator_flags(id)?
        }
        "server" => {
            let name = flag_value(&args, "--name")
                .ok_or_else(|| anyhow!("--cluster-file needs --name: which server this is"))?;
            file.server_flags(&name)?
        }
        "server-exited" => {
            let name = flag_value(&args, "--name").ok_or_else(|| {
                anyhow!("--cluster-file needs --name: which server's process exited")
            })?;
            file.server_exited_flags(&name)?
        }
        "gateway" => {
            let name = flag_value(&args, "--name")
                .ok_or_else(|| anyhow!("--cluster-file needs --name: which gateway this is"))?;
            file.gateway_flags(&name)?
        }
        _ if client => file.client_flags(),
        other => bail!("`rampart {other}` does not take --cluster-file"),
    };
    let flags = if from_env {
        drop_given(flags, &args)
    } else {
        flags
    };
    let mut expanded = args[..2].to_vec();
    expanded.extend(flags.into_iter().map(OsString::from));
    expanded.extend(args[2..].iter().cloned());
    Ok(expanded)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE_RACKS: &str = r#"
        [cluster]
        replicas = 2
        replication = "tcp"
        auth_token_file = "token"
        memory = "2GiB"

        [[coordinator]]
        id = 1
        address = "10.0.1.1:7000"
        listen = "0.0.0.0:7000"
        data_dir = "/var/lib/rampart/coordinator-1"

        [[coordinator]]
        id = 2
        address = "10.0.2.1:7000"
        data_dir = "/var/lib/rampart/coordinator-2"

        [[server]]
        name = "a"
        address = "10.0.1.1:7200"
        listen = "0.0.0.0:7200"
        rack = "rack-1"
        data_dir = "/var/lib/rampart/a"

        [[server]]
        name = "b"
        address = "10.0.2.1:7200"
        rack = "rack-2"
        data_dir = "/var/lib/rampart/b"
        memory = "1GiB"

        [[server]]
        name = "c"
        address = "10.0.3.1:7200"
        rack = "rack-3"
        data_dir = "/var/lib/rampart/c"

        [[server]]
        name = "d"
        address = "10.0.3.1:7201"
        rack = "rack-3"
        data_dir = "/var/lib/rampart/d"

        [[gateway]]
        name = "resp"
        listen = "0.0.0.0:6379"
    "#;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn entries_become_the_flags_they_describe() {
        let mut file = ClusterFile::parse(THREE_RACKS).expect("a valid file");
        file.resolve_paths(Path::new("/etc/rampart"));
        assert_eq!(
            file.coordinator_flags(1).expect("coordinator 1"),
            strings(&[
                "--peers",
                "1=10.0.1.1:7000,2=10.0.2.1:7000",
                "--listen",
                "0.0.0.0:7000",
                "--data-dir",
                "/var/lib/rampart/coordinator-1",
                "--auth-token-file",
                "/etc/rampart/token",
            ])
        );
        assert_eq!(
            file.server_flags("b").expect("server b"),
            strings(&[
                "--coordinator",
                "10.0.1.1:7000,10.0.2.1:7000",
                "--listen",
                "10.0.2.1:7200",
                "--advertise",
                "10.0.2.1:7200",
                "--failure-domain",
                "rack-2",
                "--data-dir",
                "/var/lib/rampart/b",
                "--replicas",
                "2",
                "--replication",
                "tcp",
                "--memory",
                "1GiB",
                "--auth-token-file",
                "/etc/rampart/token",
            ])
        );
        assert_eq!(
            file.client_flags(),
            strings(&[
                "--coordinator",
                "10.0.1.1:7000,10.0.2.1:7000",
                "--auth-token-file",
                "/etc/rampart/token",
            ])
        );
        assert!(file.server_flags("z").is_err());
        assert!(file.gateway_flags("resp").is_ok());
    }

    #[test]
    fn gateway_flags_carry_the_connection_limits_the_entry_sets() {
        let limited = THREE_RACKS.replace(
            "listen = \"0.0.0.0:6379\"",
            "listen = \"0.0.0.0:6379\"\nidle_timeout_ms = 5000\n\
             first_command_timeout_ms = 2000\nconnections_per_peer_max = 50\n\
             reply_bytes_pending_max = \"1MiB\"",
        );
        let file = ClusterFile::parse(&limited).expect("a valid file");
        let flags = file.gateway_flags("resp").expect("gateway resp");
        for pair in [
            ["--idle-timeout-ms", "5000"],
            ["--first-command-timeout-ms", "2000"],
            ["--connections-per-peer-max", "50"],
            ["--reply-bytes-pending-max", "1MiB"],
        ] {
            assert!(flags.windows(2).any(|w| w == pair), "{pair:?} in {flags:?}");
        }
        // An entry without them gives none: the gateway's defaults apply.
        let plain = ClusterFile::parse(THREE_RACKS).expect("a valid file");
        let flags = plain.gateway_flags("resp").expect("gateway resp");
        assert_eq!(
            flags,
            strings(&[
                "--coordinator",
                "10.0.1.1:7000,10.0.2.1:7000",
                "--listen",
                "0.0.0.0:6379",
                "--auth-token-file",
                "token",
            ])
        );
    }

    #[test]
    fn the_example_deployment_is_a_valid_three_rack_cluster() {
        let file = ClusterFile::parse(include_str!("../deploy/cluster.toml"))
            .expect("ops/deploy/cluster.toml is valid");
        assert_eq!(file.coordinators.len(), 3);
        assert_eq!(file.servers.len(), 9);
        let racks: BTreeSet<&str> = file.servers.iter().map(|s| s.rack.as_str()).collect();
        assert_eq!(racks.len(), 3);
        assert_eq!(file.cluster.replicas, 3);
        let flags = file.server_flags("h2-b").expect("server h2-b");
        assert!(
            flags
                .windows(2)
                .any(|w| w == ["--advertise", "10.0.2.10:7201"]),
            "{flags:?}"
        );
        assert!(
            flags.windows(2).any(|w| w == ["--listen", "0.0.0.0:7201"]),
            "{flags:?}"
        );
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let broken = THREE_RACKS
            .replace("id = 2", "id = 1")
            .replace("10.0.3.1:7201", "10.0.3.1:7200")
            .replace("address = \"10.0.2.1:7200\"", "address = \"0.0.0.0:7200\"");
        let error = ClusterFile::parse(&broken).expect_err("three problems");
        assert!(
            error.contains("coordinator 1: ids must be unique"),
            "{error}"
        );
        assert!(
            error.contains("server d and server c both use address"),
            "{error}"
        );
        assert!(
            error.contains("server b: address 0.0.0.0:7200 is a wildcard"),
            "{error}"
        );
        let unknown = THREE_RACKS.replace("rack = \"rack-1\"", "rack = \"rack-1\"\nrakc = 1");
        assert!(ClusterFile::parse(&unknown)
            .expect_err("unknown key")
            .contains("rakc"));
    }

    #[test]
    fn racks_must_be_enough_for_r_without_the_own_server() {
        // Server a is alone in its rack: the others span 2 racks, too few for R = 3
        // (though the cluster has 3 racks).
        let three = THREE_RACKS.replace("replicas = 2", "replicas = 3");
        let error = ClusterFile::parse(&three).expect_err("3 replicas for server a");
        assert!(error.contains("server a has 2 (rack-2, rack-3)"), "{error}");
        // Two racks only (c and d moved to rack-2): server a's others are in 1.
        let two = THREE_RACKS.replace("rack-3", "rack-2");
        let error = ClusterFile::parse(&two).expect_err("2 replicas in 2 racks");
        assert!(error.contains("server a has 1 (rack-2)"), "{error}");
    }

    #[test]
    fn the_command_line_gains_the_entry_s_flags_after_the_subcommand() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, THREE_RACKS).expect("write");
        let args = |words: &[&str]| -> Vec<OsString> { words.iter().map(OsString::from).collect() };
        let path_text = path.display().to_string();
        let expanded = expand_with(
            args(&[
                "rampart",
                "server",
                "--cluster-file",
                &path_text,
                "--name=c",
                "--threads",
                "2",
            ]),
            None,
        )
        .expect("expands");
        let expanded: Vec<String> = expanded
            .into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect();
        assert_eq!(
            &expanded[..4],
            &[
                "rampart",
                "server",
                "--coordinator",
                "10.0.1.1:7000,10.0.2.1:7000"
            ]
        );
        assert!(expanded.ends_with(&strings(&[
            "--cluster-file",
            &path_text,
            "--name=c",
            "--threads",
            "2"
        ])));
        let token = dir.path().join("token").display().to_string();
        assert!(expanded.contains(&token), "{expanded:?}");
        let missing = expand_with(
            args(&["rampart", "server", "--cluster-file", &path_text]),
            None,
        );
        assert!(missing.expect_err("no name").to_string().contains("--name"));
        let untouched = args(&["rampart", "server", "--data-dir", "d"]);
        assert_eq!(
            expand_with(untouched.clone(), None).expect("no file"),
            untouched
        );
        // After `--`, words are values, not flags.
        let key = args(&["rampart", "kv", "get", "t", "--", "--cluster-file"]);
        assert_eq!(expand_with(key.clone(), None).expect("no file"), key);
        // From the environment, a flag on the command line wins over the file's.
        let kv = args(&[
            "rampart",
            "kv",
            "--coordinator",
            "10.9.9.9:7000",
            "get",
            "t",
            "k",
        ]);
        let expanded = expand_with(kv, Some(path_text.clone())).expect("expands");
        let coordinators = expanded.iter().filter(|a| *a == "--coordinator").count();
        assert_eq!(coordinators, 1, "{expanded:?}");
        assert!(expanded.iter().any(|a| a == "--auth-token-file"));
        // A gateway named on the command line finds its entry through the environment.
        let gateway = args(&["rampart", "gateway", "--name", "resp"]);
        let expanded = expand_with(gateway, Some(path_text.clone())).expect("expands");
        assert!(expanded.iter().any(|a| a == "0.0.0.0:6379"), "{expanded:?}");
        // A supervisor's report names the server's data directory, the coordinators and
        // the token.
        let exited = args(&[
            "rampart",
            "server-exited",
            "--cluster-file",
            &path_text,
            "--name",
            "c",
        ]);
        let expanded: Vec<String> = expand_with(exited, None)
            .expect("expands")
            .into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect();
        for pair in [
            ["--coordinator", "10.0.1.1:7000,10.0.2.1:7000"],
            ["--data-dir", "/var/lib/rampart/c"],
            ["--auth-token-file", &token],
        ] {
            assert!(
                expanded.windows(2).any(|w| w == pair),
                "{pair:?} in {expanded:?}"
            );
        }
        let unnamed = expand_with(
            args(&["rampart", "server-exited", "--cluster-file", &path_text]),
            None,
        );
        assert!(unnamed.expect_err("no name").to_string().contains("--name"));
    }

    #[test]
    fn a_file_named_without_a_directory_is_in_the_current_one() {
        assert_eq!(directory_of(Path::new("cluster.toml")), Path::new("."));
        assert_eq!(
            directory_of(Path::new("/etc/rampart/cluster.toml")),
            Path::new("/etc/rampart")
        );
        assert!(std::path::absolute(directory_of(Path::new("cluster.toml"))).is_ok());
    }
}
