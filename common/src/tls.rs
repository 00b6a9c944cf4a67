//! Optional TLS for client connections (rustls, ring as crypto provider), with
//! certificates from PEM files.
//!
//! A server or coordinator started with `--tls-cert`/`--tls-key` accepts TLS and plain
//! connections on the same port: the first byte tells them apart (a TLS record starts
//! with [`TLS_HANDSHAKE_BYTE`], an RPC frame with `R` of `RAMP`, a soft-NIC request with
//! `R` of `RNIC`). Clients outside the cluster's network dial with TLS (`--tls-ca`,
//! verifying the server's certificate against that root); servers talk to each other in
//! plain TCP, where the one-sided replication path is not slowed by encryption, and the
//! cluster token still authenticates every connection (`crate::auth`).
//!
//! The server name checked is the host of the address dialled: an IP address must be in
//! the certificate's IP subject-alternative names, a host name in its DNS names.
//!
//! # Failure handling
//! A file that is missing, not PEM, or holds no certificate or key is an error at start
//! naming the file. A TLS handshake that fails or takes longer than
//! [`TLS_HANDSHAKE_TIMEOUT`] drops the connection (the server logs it at debug level:
//! scanners would flood the log otherwise); the client reports it as a connect error
//! with rustls's reason (an unknown issuer, a name mismatch).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// The first byte of a TLS connection (a handshake record).
pub const TLS_HANDSHAKE_BYTE: u8 = 0x16;

/// How long the TLS handshake may take on either side.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a TLS set-up could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{what} {path}: {reason}")]
    File {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the configuration (a key that does not match its certificate...).
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_error(what: &'static str, path: &Path, reason: impl fmt::Display) -> TlsError {
    TlsError::File {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    const WHAT: &str = "certificate file";
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(WHAT, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(WHAT, path, e))?;
    if certs.is_empty() {
        return Err(file_error(WHAT, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The client's side: dials with TLS and checks the server's certificate.
#[derive(Clone)]
pub struct TlsConnector {
    connector: tokio_rustls::TlsConnector,
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsConnector")
    }
}

impl TlsConnector {
    /// Trusts the certificates in the PEM file `ca` (a CA or the server's own
    /// self-signed certificate).
    pub fn from_ca_file(ca: &Path) -> Result<TlsConnector, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca)? {
            roots
                .add(cert)
                .map_err(|e| file_error("CA certificate file", ca, e))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsConnector {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// Runs the TLS handshake on `stream`, dialled to `addr` (`host:port`).
    pub async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let host = host_of(addr);
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| format!("{host} is not a valid TLS server name"))?;
        tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, self.connector.connect(name, stream))
            .await
            .map_err(|_| format!("TLS handshake took longer than {TLS_HANDSHAKE_TIMEOUT:?}"))?
            .map_err(|e| format!("TLS handshake failed: {e}"))
    }
}

/// The host part of `host:port` (brackets of an IPv6 literal removed).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The server's side: accepts TLS with a certificate and its key.
#[derive(Clone)]
pub struct TlsAcceptor {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsAcceptor")
    }
}

impl TlsAcceptor {
    /// Serves the certificate chain in the PEM file `cert` with the private key in the
    /// PEM file `key`.
    pub fn from_files(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
        let chain = certificates(cert)?;
        let key_der = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| file_error("private key file", key, e))?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(TlsAcceptor {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Runs the TLS handshake on an accepted `stream`.
    pub async fn accept(
        &self,
        stream: TcpStream,
    ) -> Result<tokio_rustls::server::TlsStream<TcpStream>, String> {
        tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, self.acceptor.accept(stream))
            .await
            .map_err(|_| format!("TLS handshake took longer than {TLS_HANDSHAKE_TIMEOUT:?}"))?
            .map_err(|e| format!("TLS handshake failed: {e}"))
    }
}

/// Whether the connection on `stream` starts with a TLS record (its first byte,
/// peeked, not consumed). A peer that sends nothing for [`TLS_HANDSHAKE_TIMEOUT`] is
/// taken as plain (a TLS client speaks first at once; a pooled plain connection may
/// idle). `None` if the peer closed or the socket failed.
pub async fn starts_with_tls(stream: &TcpStream) -> Option<bool> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1)) => Some(first[0] == TLS_HANDSHAKE_BYTE),
        Ok(_) => None,
        Err(_) => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_address() {
        assert_eq!(host_of("127.0.0.1:7000"), "127.0.0.1");
        assert_eq!(host_of("db1.rack-a.example:7000"), "db1.rack-a.example");
        assert_eq!(host_of("[::1]:7000"), "::1");
    }

    #[test]
    fn missing_or_empty_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem").expect("write");
        let error = TlsConnector::from_ca_file(&empty).expect_err("no certificate");
        assert!(error.to_string().contains("empty.pem"), "{error}");
        let error =
            TlsAcceptor::from_files(&dir.path().join("absent.pem"), &empty).expect_err("missing");
        assert!(error.to_string().contains("absent.pem"), "{error}");
    }
}
