//! Proof of death: when a crashed master's tablets may go live elsewhere before its
//! lease has run out (docs/design.md §6, "Proof of death").
//!
//! Recovered tablets wait for the crashed master's lease because the master may still
//! run — hung, paused, cut off from the coordinators — and serve reads from memory
//! until the lease it holds lapses. A master whose process is gone serves nothing, so
//! once its death is certain that wait protects nobody. Death is certain when:
//! * its **supervisor saw its process exit** ([`Evidence::ExitSeen`]): `rampart cluster
//!   up` (and the drill and `bench recovery`, which supervise their clusters the same
//!   way) reports the exit of a server it started (`ProcessExited`), naming the id the
//!   server announced, so the word is about that incarnation; a server that still
//!   answers `Identify` with that id at its address is not taken for dead on it;
//! * its **address refused a connection** ([`Evidence::Refused`]): nothing listens on
//!   its port (only for a literal IP address: [`address_is_direct`]);
//! * **another server answers at its address** ([`Evidence::OtherServer`], learnt with
//!   `Identify`): the port belongs to another process.
//!
//! The last two are observations of the network, and a network can lie: a firewall
//! `REJECT` rule, NAT or a proxy in front of the port answers with a reset (or with
//! another server) while the master lives and serves the clients behind it. So they
//! count only where the configuration says nothing stands between the coordinators and
//! the servers ([`ProofOfDeath::Direct`]: `cluster up`'s local clusters, an explicit
//! setting elsewhere); by default only a supervisor's word counts
//! ([`ProofOfDeath::Supervisor`]), and [`ProofOfDeath::Off`] always waits. A hung,
//! paused or partitioned master gives no proof at all and is waited out.
//!
//! # Why a refusal proves that the master serves nothing
//! Three rules of the storage server, each argued in the design:
//! 1. A server listens on its RPC port before it enlists, and holds that listener for as
//!    long as it serves: its accept loop ends only for its stop (an accept error backs
//!    off and keeps the listener), and a server whose listener is gone is a server that
//!    stopped.
//! 2. A graceful stop stops serving before it closes its listener: the master's lease is
//!    revoked first, so every client request after that is refused.
//! 3. No listener is opened with `SO_REUSEPORT` (a house rule test checks it): a port
//!    has one listener, so another server answering there means the old one no longer
//!    listens.
//!
//! So a refusal, or another server at the address, means the master no longer listens,
//! and by rules 1 and 2 no longer serves. Death is final — a process restarted at the
//! address is a new server, with a new id and none of the old one's tablets — so a
//! proof found at any time before the tablets go live counts, even one found before the
//! crash was declared.
//!
//! [`lease_end`] is the decision: the earlier of the lease's end and the proof. The
//! coordinator's recovery and the simulation both take it; [`Proofs`] keeps what was
//! found, by server.

use rampart_common::ids::ServerId;
use rampart_common::protocol::coordinator::LeaseEnd;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Add;
use std::str::FromStr;
use std::time::Duration;

/// Added to the lease before recovered tablets go live: clocks of two processes may run
/// at slightly different rates.
pub const LEASE_MARGIN: Duration = Duration::from_millis(25);

/// When the tablets of a master declared crashed at `declared` may go live elsewhere
/// without a proof of its death: once the `lease` it may still hold (none granted after
/// it was declared) ran out, with [`LEASE_MARGIN`]. Until then a zombie may still serve
/// reads.
pub fn tablets_live_after<T: Add<Duration, Output = T>>(declared: T, lease: Duration) -> T {
    declared + lease + LEASE_MARGIN
}

/// What counts as proof that a crashed master is gone (the coordinators'
/// `--proof-of-death`; module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProofOfDeath {
    /// Nothing: every recovery waits out the lease.
    Off,
    /// Only a supervisor's word that the process exited.
    #[default]
    Supervisor,
    /// A supervisor's word, a refused connection, or another server at the address:
    /// nothing (no firewall `REJECT` rule, NAT or proxy) stands between the
    /// coordinators and the servers.
    Direct,
}

impl ProofOfDeath {
    /// Whether `evidence` proves a master's death under this setting.
    pub fn accepts(self, evidence: Evidence) -> bool {
        match self {
            ProofOfDeath::Off => false,
            ProofOfDeath::Supervisor => evidence == Evidence::ExitSeen,
            ProofOfDeath::Direct => true,
        }
    }

    /// Whether a crashed master's address is worth probing (a refusal or another
    /// server there would count).
    pub fn probes_addresses(self) -> bool {
        self == ProofOfDeath::Direct
    }
}

impl fmt::Display for ProofOfDeath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProofOfDeath::Off => "off",
            ProofOfDeath::Supervisor => "supervisor",
            ProofOfDeath::Direct => "direct",
        })
    }
}

impl FromStr for ProofOfDeath {
    type Err = String;

    fn from_str(s: &str) -> Result<ProofOfDeath, String> {
        match s {
            "off" => Ok(ProofOfDeath::Off),
            "supervisor" => Ok(ProofOfDeath::Supervisor),
            "direct" => Ok(ProofOfDeath::Direct),
            other => Err(format!(
                "`{other}` is not off, supervisor or direct (what proves a crashed server's death)"
            )),
        }
    }
}

/// Whether a refusal at `addr`, or another server answering there, can be evidence
/// about the one server that listened there: only for a literal IP address other than
/// the unspecified one. A name may resolve to several addresses (a dial reports the
/// last one's error, which may not be the server's), and `0.0.0.0` is whatever host
/// dials it.
pub fn address_is_direct(addr: &str) -> bool {
    addr.parse::<std::net::SocketAddr>()
        .is_ok_and(|addr| !addr.ip().is_unspecified())
}

/// One observation that a master may be gone (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// Its address refused a connection.
    Refused,
    /// This other server answered at its address.
    OtherServer(ServerId),
    /// Its supervisor saw its process exit.
    ExitSeen,
}

impl Evidence {
    /// How a recovery's report names it.
    pub fn lease_end(self) -> LeaseEnd {
        match self {
            Evidence::Refused => LeaseEnd::Refused,
            Evidence::OtherServer(_) => LeaseEnd::OtherServer,
            Evidence::ExitSeen => LeaseEnd::ExitSeen,
        }
    }
}

/// When the tablets of a master declared crashed at `declared` may go live elsewhere,
/// and why: the first `proof` of its death, or else the end of its `lease`
/// ([`tablets_live_after`]), whichever comes first.
pub fn lease_end<T: Ord + Copy + Add<Duration, Output = T>>(
    declared: T,
    lease: Duration,
    proof: Option<(T, Evidence)>,
) -> (T, LeaseEnd) {
    let waited = tablets_live_after(declared, lease);
    match proof {
        Some((at, evidence)) if at < waited => (at, evidence.lease_end()),
        _ => (waited, LeaseEnd::Waited),
    }
}

/// The proofs of death found, by server: the first that counted under the setting, and
/// when it was found. `T` is the caller's clock.
#[derive(Debug)]
pub struct Proofs<T> {
    setting: ProofOfDeath,
    found: BTreeMap<ServerId, (T, Evidence)>,
}

impl<T: Copy> Proofs<T> {
    /// None found yet; `setting` says what counts.
    pub fn new(setting: ProofOfDeath) -> Proofs<T> {
        Proofs {
            setting,
            found: BTreeMap::new(),
        }
    }

    /// What counts.
    pub fn setting(&self) -> ProofOfDeath {
        self.setting
    }

    /// `evidence` about `server` was seen at `now`; returns whether it is proof of its
    /// death (new or not). The first proof is kept.
    pub fn seen(&mut self, server: ServerId, evidence: Evidence, now: T) -> bool {
        if !self.setting.accepts(evidence) {
            return false;
        }
        self.found.entry(server).or_insert((now, evidence));
        true
    }

    /// The proof of `server`'s death, if one was found.
    pub fn of(&self, server: ServerId) -> Option<(T, Evidence)> {
        self.found.get(&server).copied()
    }

    /// Forgets `server` (its recovery is over).
    pub fn forget(&mut self, server: ServerId) {
        self.found.remove(&server);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ServerId = ServerId(1);
    const LEASE: Duration = Duration::from_millis(750);
    const ALL: [Evidence; 3] = [
        Evidence::Refused,
        Evidence::OtherServer(ServerId(9)),
        Evidence::ExitSeen,
    ];

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn only_a_direct_network_makes_a_refusal_or_another_server_proof() {
        for evidence in ALL {
            assert!(!ProofOfDeath::Off.accepts(evidence), "{evidence:?}");
            assert!(ProofOfDeath::Direct.accepts(evidence), "{evidence:?}");
            assert_eq!(
                ProofOfDeath::Supervisor.accepts(evidence),
                evidence == Evidence::ExitSeen,
                "{evidence:?}"
            );
        }
        assert!(ProofOfDeath::Direct.probes_addresses());
        assert!(!ProofOfDeath::Supervisor.probes_addresses());
        assert_eq!(ProofOfDeath::default(), ProofOfDeath::Supervisor);
    }

    #[test]
    fn without_proof_the_tablets_wait_for_the_lease_and_its_margin() {
        let declared = ms(1_000);
        assert_eq!(
            lease_end(declared, LEASE, None),
            (declared + LEASE + LEASE_MARGIN, LeaseEnd::Waited)
        );
    }

    #[test]
    fn a_proof_ends_the_wait_when_found_even_before_the_crash_was_declared() {
        let declared = ms(1_000);
        for evidence in ALL {
            let later = (declared + ms(40), evidence);
            assert_eq!(
                lease_end(declared, LEASE, Some(later)),
                (declared + ms(40), evidence.lease_end())
            );
            let earlier = (declared - ms(5), evidence);
            assert_eq!(
                lease_end(declared, LEASE, Some(earlier)),
                (declared - ms(5), evidence.lease_end())
            );
        }
        // Found only after the lease ran out: the lease ended it.
        let late = (declared + LEASE + LEASE_MARGIN + ms(1), Evidence::Refused);
        assert_eq!(lease_end(declared, LEASE, Some(late)).1, LeaseEnd::Waited);
    }

    #[test]
    fn the_book_keeps_the_first_proof_that_counts_under_its_setting() {
        let mut proofs = Proofs::new(ProofOfDeath::Supervisor);
        assert!(
            !proofs.seen(A, Evidence::Refused, ms(1)),
            "a reset may be a firewall's"
        );
        assert_eq!(proofs.of(A), None);
        assert!(proofs.seen(A, Evidence::ExitSeen, ms(2)));
        assert!(proofs.seen(A, Evidence::ExitSeen, ms(3)));
        assert_eq!(proofs.of(A), Some((ms(2), Evidence::ExitSeen)));
        proofs.forget(A);
        assert_eq!(proofs.of(A), None);

        let mut off = Proofs::new(ProofOfDeath::Off);
        for evidence in ALL {
            assert!(!off.seen(A, evidence, ms(1)));
        }
        assert_eq!(off.of(A), None);
    }

    #[test]
    fn only_a_literal_specified_address_can_refuse_for_its_server() {
        assert!(address_is_direct("10.0.1.7:7100"));
        assert!(address_is_direct("[::1]:7100"));
        assert!(!address_is_direct("0.0.0.0:7100"), "the dialler's own host");
        assert!(!address_is_direct("[::]:7100"));
        assert!(
            !address_is_direct("storage-7.example:7100"),
            "a name may be many"
        );
    }

    #[test]
    fn the_setting_reads_and_prints_its_three_names() {
        for setting in [
            ProofOfDeath::Off,
            ProofOfDeath::Supervisor,
            ProofOfDeath::Direct,
        ] {
            assert_eq!(setting.to_string().parse(), Ok(setting));
        }
        let error = "on".parse::<ProofOfDeath>().unwrap_err();
        assert!(error.contains("off, supervisor or direct"), "{error}");
    }
}
