//! The access-control and TLS flags of every command, and installing them as the
//! process's security (`rampart_common::auth::install`) before anything connects.
//!
//! * [`ClientSecurityArgs`] — client commands (`kv`, `status`, `recovery`, the
//!   gateway's own connections): the cluster token, and a CA to dial over TLS with.
//! * [`ServerSecurityArgs`] — coordinators and servers: the cluster token, and a
//!   certificate to offer TLS to clients with (beside plain TCP, which servers use among
//!   themselves).
//!
//! `RAMPART_AUTH_TOKEN_FILE` stands for `--auth-token-file` and `RAMPART_TLS_CA` for
//! `--tls-ca`, so a shell can set them once. `cluster up` passes its flags to its
//! children explicitly and clears the variables in their environment
//! (`child_processes::Children::start`), so a benchmark's private cluster is never secured by
//! accident.

use anyhow::{bail, Context, Result};
use clap::Args;
use rampart_common::auth::{ClusterToken, Security};
use rampart_common::tls::{TlsAcceptor, TlsConnector};
use rampart_ops::cluster_file::CLUSTER_FILE_ENV;
use std::path::PathBuf;

/// The environment variable that stands for `--auth-token-file`.
pub const TOKEN_FILE_ENV: &str = "RAMPART_AUTH_TOKEN_FILE";
/// The environment variable that stands for `--tls-ca`.
pub const TLS_CA_ENV: &str = "RAMPART_TLS_CA";

/// Security flags of a client command.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientSecurityArgs {
    /// A cluster file (TOML): the coordinators, the token and the TLS CA it names stand
    /// for --coordinator, --auth-token-file and --tls-ca.
    #[arg(long, env = CLUSTER_FILE_ENV, global = true, value_name = "FILE")]
    pub cluster_file: Option<PathBuf>,
    /// File holding the cluster token, for a cluster started with one (make one with
    /// `head -c 32 /dev/urandom | base64 > FILE`).
    #[arg(long, env = TOKEN_FILE_ENV, global = true, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Dial coordinators and servers over TLS, trusting the CA certificate (PEM) in
    /// FILE; their certificates must name the addresses dialled.
    #[arg(long, env = TLS_CA_ENV, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

impl ClientSecurityArgs {
    /// The security these flags describe.
    pub fn security(&self) -> Result<Security> {
        Ok(Security {
            token: token(self.auth_token_file.as_ref())?,
            tls_client: self
                .tls_ca
                .as_ref()
                .map(|ca| TlsConnector::from_ca_file(ca))
                .transpose()?,
            tls_server: None,
        })
    }

    /// Installs them as the process's security.
    pub fn install(&self) -> Result<()> {
        install(self.security()?)
    }
}

/// Security flags of a coordinator or server.
#[derive(Args, Debug, Clone, Default)]
pub struct ServerSecurityArgs {
    /// File holding the cluster token: every connection to this process must prove it
    /// holds it, and every connection this process makes proves it (make one with
    /// `head -c 32 /dev/urandom | base64 > FILE`; give every process the same file).
    #[arg(long, env = TOKEN_FILE_ENV, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Certificate chain (PEM) to offer TLS to clients with, beside plain TCP on the
    /// same port; needs --tls-key.
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl ServerSecurityArgs {
    /// The TLS acceptor of `--tls-cert`/`--tls-key`, if given.
    pub fn tls_acceptor(&self) -> Result<Option<TlsAcceptor>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(TlsAcceptor::from_files(cert, key)?)),
            (None, None) => Ok(None),
            _ => bail!("--tls-cert and --tls-key go together"),
        }
    }

    /// Installs them as the process's security; logs what it holds (the token's
    /// fingerprint, never the token).
    pub fn install(&self) -> Result<()> {
        let security = Security {
            token: token(self.auth_token_file.as_ref())?,
            tls_client: None,
            tls_server: self.tls_acceptor()?,
        };
        match &security.token {
            Some(token) => tracing::info!(
                fingerprint = token.fingerprint(),
                tls = security.tls_server.is_some(),
                "connections need the cluster token"
            ),
            None => tracing::info!(
                tls = security.tls_server.is_some(),
                "no cluster token: any process that reaches this one may use it \
                 (--auth-token-file to require one)"
            ),
        }
        install(security)
    }

    /// The flags again, for a child process (paths made absolute: a child may run
    /// elsewhere).
    pub fn to_args(&self) -> Result<Vec<String>> {
        let mut args = Vec::new();
        for (flag, path) in [
            ("--auth-token-file", &self.auth_token_file),
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
        ] {
            if let Some(path) = path {
                let absolute = std::path::absolute(path)
                    .with_context(|| format!("{flag} {}", path.display()))?;
                args.extend([flag.to_string(), absolute.display().to_string()]);
            }
        }
        Ok(args)
    }
}

fn token(file: Option<&PathBuf>) -> Result<Option<ClusterToken>> {
    file.map(|path| ClusterToken::from_file(path).map_err(anyhow::Error::from))
        .transpose()
}

fn install(security: Security) -> Result<()> {
    if !rampart_common::auth::install(security) {
        bail!("this process's security was set twice");
    }
    Ok(())
}
