//! `Network`: a private network of "hosts" on this machine, for drills that cut links
//! (issue 15): one Linux network namespace per host, each with its own address on a
//! bridge, and `iptables` in a host's namespace to cut it off from chosen peers.
//!
//! Layout: a bridge `rpbTAG` in the root namespace holds the first address of a free
//! `10.77.K.0/24` (the drill's own clients run there and reach every host through it);
//! host `i` is namespace `rampart-TAG-NAME` with loopback up and `eth0` (the far end of
//! the veth pair `rpvTAG-i`, whose near end joins the bridge) at `10.77.K.(i+2)`. TAG is
//! the creating process's id in hex, so that leftovers of a drill that was killed can be
//! told from another drill's live network and removed ([`Network::create`] does so).
//!
//! A cut is symmetric: rules on INPUT (from the peer) and OUTPUT (to the peer) in the
//! cut host's namespace. A [`CutKind::Drop`] cut is silent: packets vanish as they do
//! when a switch fails, and connections time out. A [`CutKind::Reject`] cut answers
//! every TCP segment with a reset (`REJECT --reject-with tcp-reset`, as a firewall
//! rule does), so connections are refused at once although the process behind the
//! port lives; other packets are dropped. [`Network::heal`] flushes the host's rules. Dropping the `Network` deletes the namespaces (their veth pairs go
//! with them) and the bridge.
//!
//! Needs root (namespaces, `setns`), `ip` (iproute2) and `iptables`: [`Network::create`]
//! says plainly which is missing. Networks are built one at a time on a machine (a lock
//! on `/run/rampart-netns.lock`). Leftovers are told by their creator's pid, which is
//! only meaningful in one pid namespace: drills in separate containers must not share
//! `/run/netns`. With `br_netfilter` loaded and a FORWARD policy of DROP (Docker sets
//! one), the bridge's traffic is dropped too and the drill fails to start its cluster.

use anyhow::{anyhow, bail, Context, Result};

/// How a cut treats the cut-off traffic (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutKind {
    /// Packets vanish: connections time out.
    Drop,
    /// TCP is answered with resets, as by a firewall `REJECT` rule: connections are
    /// refused at once.
    Reject,
}
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where `ip netns` keeps its namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Prefix of the namespaces this module creates.
const NETNS_PREFIX: &str = "rampart-";

/// Prefix of the bridges this module creates.
const BRIDGE_PREFIX: &str = "rpb";

/// Prefix of the veth pairs' root ends.
const VETH_PREFIX: &str = "rpv";

/// Most hosts of one network (addresses .2 to .201 of its /24).
pub const HOSTS_MAX: usize = 200;

/// One host of a [`Network`].
#[derive(Clone, Debug)]
pub struct Host {
    /// Its name in the drill (`c1`, `s3`).
    pub name: String,
    /// Its network namespace's name (`ip netns exec NAME ...`).
    pub netns: String,
    /// Its address.
    pub ip: Ipv4Addr,
}

impl Host {
    /// The file that names its namespace (for `setns`).
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.netns)
    }
}

/// A bridge and one namespace per host; removed when dropped.
#[derive(Debug)]
pub struct Network {
    bridge: String,
    /// The bridge's address: where the processes of the root namespace (the drill's
    /// clients) come from.
    pub root_ip: Ipv4Addr,
    hosts: Vec<Host>,
}

impl Network {
    /// Whether this process may build a network: root, with `ip` and `iptables`.
    /// `Err` says what is missing, to be shown as is.
    pub fn check_available() -> Result<()> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            bail!("network namespaces need root (running as uid {uid})");
        }
        for (program, package) in [("ip", "iproute2"), ("iptables", "iptables")] {
            let found = Command::new(program)
                .arg("-V")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !found {
                bail!("`{program}` is not installed (Debian package {package})");
            }
        }
        Ok(())
    }

    /// Creates a network of `names` (at most [`HOSTS_MAX`]), each a host of its own,
    /// after removing what drills that are no longer running left behind. One network
    /// per process at a time.
    pub fn create(names: &[&str]) -> Result<Network> {
        Network::check_available()?;
        if names.len() > HOSTS_MAX {
            bail!(
                "at most {HOSTS_MAX} hosts in one network, not {}",
                names.len()
            );
        }
        if CREATED.swap(true, Ordering::SeqCst) {
            bail!("this process has a network already (one at a time: names carry the pid)");
        }
        let mut network = Network {
            bridge: String::new(),
            root_ip: Ipv4Addr::UNSPECIFIED,
            hosts: Vec::new(),
        };
        network.build(names)?;
        Ok(network)
    }

    /// Builds what `create` promises into this empty network; what it built is removed
    /// when it is dropped, also after a failure half-way.
    fn build(&mut self, names: &[&str]) -> Result<()> {
        // One builder at a time on this machine: two drills starting together would
        // otherwise pick the same free subnet.
        let _lock = BuildLock::take()?;
        remove_leftovers();
        let tag = format!("{:x}", std::process::id());
        let subnet = free_subnet()?;
        let root_ip = Ipv4Addr::new(10, 77, subnet, 1);
        let bridge = format!("{BRIDGE_PREFIX}{tag}");
        self.root_ip = root_ip;
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        self.bridge = bridge.clone();
        ip(&["addr", "add", &format!("{root_ip}/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for (i, name) in names.iter().enumerate() {
            let host = Host {
                name: name.to_string(),
                netns: format!("{NETNS_PREFIX}{tag}-{name}"),
                ip: Ipv4Addr::new(10, 77, subnet, i as u8 + 2),
            };
            let veth = format!("{VETH_PREFIX}{tag}-{i}");
            let inner = format!("{veth}i");
            ip(&["netns", "add", &host.netns])?;
            self.hosts.push(host.clone());
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &host.netns])?;
            ip(&["link", "set", &veth, "master", &bridge])?;
            ip(&["link", "set", &veth, "up"])?;
            let ns = &host.netns;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", &inner, "name", "eth0"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", host.ip),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Result<&Host> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| anyhow!("no host {name} in the drill's network"))
    }

    /// Cuts host `name` off from `peers` (both directions) as `kind` says; other links
    /// stay.
    pub fn cut(&self, name: &str, peers: &[&str], kind: CutKind) -> Result<()> {
        let host = self.host(name)?;
        for peer in peers {
            let peer = self.host(peer)?.ip.to_string();
            for (chain, side) in [("INPUT", "-s"), ("OUTPUT", "-d")] {
                if kind == CutKind::Reject {
                    if chain == "OUTPUT" {
                        // The resets the INPUT rule answers with must leave.
                        let resets = ["-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "ACCEPT"];
                        let mut rule = vec!["-A", chain, side, &peer];
                        rule.extend(resets);
                        iptables(&host.netns, &rule)?;
                    }
                    let reset = ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"];
                    let mut rule = vec!["-A", chain, side, &peer];
                    rule.extend(reset);
                    iptables(&host.netns, &rule)?;
                }
                iptables(&host.netns, &["-A", chain, side, &peer, "-j", "DROP"])?;
            }
        }
        Ok(())
    }

    /// Restores every link of host `name`.
    pub fn heal(&self, name: &str) -> Result<()> {
        let host = self.host(name)?;
        iptables(&host.netns, &["-F", "INPUT"])?;
        iptables(&host.netns, &["-F", "OUTPUT"])
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = ip(&["netns", "del", &host.netns]);
        }
        if !self.bridge.is_empty() {
            let _ = ip(&["link", "del", &self.bridge]);
        }
        CREATED.store(false, Ordering::SeqCst);
    }
}

/// Whether this process has a [`Network`] now.
static CREATED: AtomicBool = AtomicBool::new(false);

/// An exclusive lock on [`BUILD_LOCK`] while a network is built; released when dropped
/// (or when the process dies).
struct BuildLock {
    /// Holds the lock while open.
    _file: std::fs::File,
}

/// The file whose lock serialises the building of networks on this machine.
const BUILD_LOCK: &str = "/run/rampart-netns.lock";

impl BuildLock {
    fn take() -> Result<BuildLock> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(BUILD_LOCK)
            .with_context(|| format!("cannot open {BUILD_LOCK}"))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "cannot lock {BUILD_LOCK}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(BuildLock { _file: file })
    }
}

/// Runs `ip ARGS`; its error output on failure.
fn ip(args: &[&str]) -> Result<()> {
    run("ip", args)
}

/// Runs `iptables -w ARGS` in namespace `netns`.
fn iptables(netns: &str, args: &[&str]) -> Result<()> {
    let mut all = vec!["netns", "exec", netns, "iptables", "-w"];
    all.extend_from_slice(args);
    run("ip", &all)
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run `{program}`"))?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The third byte K of a `10.77.K.0/24` that no interface of the root namespace uses.
fn free_subnet() -> Result<u8> {
    let output = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .context("cannot run `ip addr`")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let used: Vec<u8> = text
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("10.77."))
        .filter_map(|rest| rest.split('.').next()?.parse().ok())
        .collect();
    (0..=255u8)
        .find(|k| !used.contains(k))
        .ok_or_else(|| anyhow!("every 10.77.K.0/24 is in use on this machine"))
}

/// Removes the namespaces and bridges of networks whose creating process is gone.
fn remove_leftovers() {
    let dead = |tag: &str| {
        let Ok(pid) = u32::from_str_radix(tag, 16) else {
            return false;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        !alive
    };
    if let Ok(entries) = std::fs::read_dir(NETNS_DIR) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(NETNS_PREFIX) else {
                continue;
            };
            if rest.split('-').next().is_some_and(dead) {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.strip_prefix(BRIDGE_PREFIX).is_some_and(dead) {
                let _ = ip(&["link", "del", &name]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::time::Duration;

    /// Runs `f` on a thread that has entered `host`'s namespace (a thread's namespace is
    /// its own; the test's other threads stay where they are).
    fn in_host<T: Send + 'static>(
        host: &Host,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = host.netns_path();
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("open the namespace");
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a file descriptor we own, for this thread only.
            assert_eq!(
                unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) },
                0,
                "setns: {}",
                std::io::Error::last_os_error()
            );
            f()
        })
    }

    fn reaches(to: SocketAddr) -> bool {
        TcpStream::connect_timeout(&to, Duration::from_millis(300)).is_ok()
    }

    #[test]
    fn a_cut_host_is_unreachable_from_its_peers_until_healed_and_reachable_from_the_root() {
        if let Err(why) = Network::check_available() {
            eprintln!("skipped: {why:#}");
            return;
        }
        let network = Network::create(&["a", "b", "c"]).expect("create the network");
        let (a, b) = (
            network.host("a").expect("a").clone(),
            network.host("b").expect("b").clone(),
        );
        let ip = a.ip;
        let listener = in_host(&a, move || {
            let listener = TcpListener::bind((ip, 0)).expect("bind in a");
            let addr = listener.local_addr().expect("addr");
            std::thread::spawn(move || for _ in listener.incoming() {});
            addr
        })
        .join()
        .expect("listen in a");
        let from_b = |b: &Host| in_host(b, move || reaches(listener)).join().expect("b");
        assert!(from_b(&b), "b reaches a");
        assert!(reaches(listener), "the root namespace reaches a");

        network.cut("a", &["b"], CutKind::Drop).expect("cut");
        assert!(!from_b(&b), "b still reaches a after the cut");
        let dialled = in_host(&b, move || {
            TcpStream::connect_timeout(&listener, Duration::from_millis(300)).map_err(|e| e.kind())
        })
        .join()
        .expect("b");
        assert_eq!(
            dialled.err(),
            Some(std::io::ErrorKind::TimedOut),
            "a dropping cut is silent"
        );
        let c = network.host("c").expect("c").clone();
        assert!(from_b(&c), "c, not cut off, no longer reaches a");
        assert!(reaches(listener), "the root namespace no longer reaches a");

        network.heal("a").expect("heal");
        assert!(from_b(&b), "b does not reach a after the heal");

        // A rejecting cut refuses b's connections at once, though a still listens.
        network.cut("a", &["b"], CutKind::Reject).expect("cut");
        let dialled = in_host(&b, move || {
            TcpStream::connect_timeout(&listener, Duration::from_secs(2)).map_err(|e| e.kind())
        })
        .join()
        .expect("b");
        assert_eq!(
            dialled.err(),
            Some(std::io::ErrorKind::ConnectionRefused),
            "a rejecting cut resets"
        );
        assert!(from_b(&c), "c, not cut off, no longer reaches a");
        network.heal("a").expect("heal");
        assert!(from_b(&b), "b does not reach a after the heal");

        let namespaces: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|n| network.host(n).expect("host").netns.clone())
            .collect();
        drop(network);
        for ns in namespaces {
            assert!(
                !PathBuf::from(NETNS_DIR).join(&ns).exists(),
                "namespace {ns} left behind"
            );
        }
    }
}
