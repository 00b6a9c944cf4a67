//! One local cluster per transport, and the pids of its storage servers (whose backup
//! threads are measured).

use anyhow::{bail, Context, Result};
use rampart_common::onesided::TransportKind;
use std::path::{Path, PathBuf};

use super::args::ReplicationArgs;
use super::backup_cpu::stat_field;
use crate::cluster::{self, LocalCluster, UpArgs};

/// One mode's local cluster and the pids of its servers.
pub(super) struct ModeCluster {
    pub(super) mode: TransportKind,
    /// The processes; dropping it stops them.
    pub(super) cluster: LocalCluster,
    /// The storage servers' pids, whose backup threads are measured.
    pub(super) pids: Vec<u32>,
    /// The frame files the servers should remove when they stop.
    frame_files: Vec<PathBuf>,
}

impl ModeCluster {
    pub(super) fn start(
        args: &ReplicationArgs,
        mode: TransportKind,
        root: &Path,
    ) -> Result<ModeCluster> {
        let data_dir = root.join(mode.name());
        let up = UpArgs {
            memory: args.memory.clone(),
            replicas: Some(args.replicas),
            replication: Some(mode.name().to_string()),
            // The data path is measured; one coordinator (the default here) leaves the
            // cores to it.
            ..UpArgs::private(data_dir.clone(), args.servers)
        };
        let cluster = cluster::start(&up, false)?;
        let pids = server_pids(&data_dir, args.servers)?;
        let frame_files = (1..=args.servers)
            .map(|i| {
                rampart_common::onesided::shm::default_frame_file(
                    &data_dir.join(format!("server-{i}")),
                )
            })
            .collect();
        Ok(ModeCluster {
            mode,
            cluster,
            pids,
            frame_files,
        })
    }

    /// Stops the servers and reports (and removes) frame files they left behind.
    pub(super) fn stop(mut self) {
        self.cluster.children.stop_all();
        for file in &self.frame_files {
            if file.exists() {
                eprintln!(
                    "warning: {} cluster: a server left its frame file {} behind; removing it",
                    self.mode,
                    file.display()
                );
                let _ = std::fs::remove_file(file);
            }
        }
    }
}

/// The clusters' processes that exited, named with their status.
pub(super) fn reap_exited(clusters: &mut [ModeCluster]) -> Vec<String> {
    clusters
        .iter_mut()
        .flat_map(|c| {
            let mode = c.mode;
            c.cluster
                .children
                .reap()
                .into_iter()
                .map(move |(name, _, status)| format!("{mode} {name} ({status})"))
        })
        .collect()
}

/// The pids of this process's `rampart server` children whose data directory lies under
/// `data_dir`; exactly `expected` of them.
fn server_pids(data_dir: &Path, expected: u32) -> Result<Vec<u32>> {
    let me = std::process::id();
    let prefix = data_dir.display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if stat_field(&stat, 4).and_then(|p| p.parse::<u32>().ok()) != Some(me) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_server = argv.get(1) == Some(&b"server".as_slice());
        let in_dir = argv
            .windows(2)
            .any(|w| w[0] == b"--data-dir" && w[1].starts_with(prefix.as_bytes()));
        if is_server && in_dir {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    if pids.len() != expected as usize {
        bail!(
            "found {} server processes under {prefix}, expected {expected}",
            pids.len()
        );
    }
    Ok(pids)
}
