//! The cluster secret: every connection between Rampart processes, and from clients to
//! them, proves that both ends hold it before anything else is said. (docs/design.md §8
//! assumes a trusted network; this is what stands between the cluster and anything else
//! that can reach its ports.)
//!
//! An operator writes a random token into a file (`head -c 32 /dev/urandom | base64 >
//! F`) and starts every coordinator, server, gateway and client command with
//! `--auth-token-file F`. The token never crosses the network: the two ends prove they
//! hold it with HMAC-SHA-256 over nonces both chose, so a recorded handshake cannot be
//! replayed and a server that lacks the token cannot pose as one (mutual proof).
//!
//! # Handshake (before the first frame of the connection's own protocol)
//! ```text
//! client → server  HELLO      "RAUT" | version u8 (1) | client nonce [32]
//! server → client  CHALLENGE  "RAUT" | code u8 | server nonce [32] | server proof [32]
//! client → server  PROOF      client proof [32]
//! server → client  VERDICT    code u8
//! server proof = HMAC(token, "rampart server" | client nonce | server nonce)
//! client proof = HMAC(token, "rampart client" | client nonce | server nonce)
//! ```
//! CHALLENGE codes: 0 the proof follows; 1 this server holds no token (it was started
//! without one); 2 unsupported version. VERDICT codes: 0 accepted; 3 wrong token.
//! A server with a token that reads anything but HELLO first refuses the connection
//! ([`HandshakeError::NoToken`]; its caller answers in its own protocol — an RPC error
//! reply, a soft-NIC status — so a client without the token is told why) and logs the
//! refusal with the peer's address and never a secret.
//!
//! [`ClientHandshake`] and [`ServerHandshake`] are the protocol as plain synchronous
//! state machines, tested alone; [`client_handshake`] and [`server_handshake`] drive them
//! over a stream with [`HANDSHAKE_TIMEOUT`].
//!
//! # The process's security
//! A process has one token (or none) and one TLS set-up, fixed at start-up by
//! [`install`] before any connection is made; the RPC layer, the soft-NIC and the
//! gateway read it through [`process_security`]. It is process-wide on purpose, as
//! rustls's crypto provider is: every component of a process dials and serves with the
//! same identity, and passing it down through every pool of every component would add a
//! parameter to each for one value. Tests that need other settings pass a [`Security`]
//! explicitly (`RpcPool::with_security`, `RpcServer::run_with`).

use crate::tls::{TlsAcceptor, TlsConnector};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// First four bytes of HELLO and CHALLENGE: `RAUT`.
pub const AUTH_MAGIC: [u8; 4] = *b"RAUT";

/// The handshake version this build speaks.
pub const AUTH_VERSION: u8 = 1;

/// Bytes of a nonce and of a proof.
const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;

/// Bytes of HELLO: magic, version, client nonce.
pub const HELLO_BYTES: usize = 4 + 1 + NONCE_BYTES;
/// Bytes of CHALLENGE: magic, code, server nonce, server proof.
pub const CHALLENGE_BYTES: usize = 4 + 1 + NONCE_BYTES + PROOF_BYTES;

/// The shortest token accepted: 32 bytes. The token must be random (`head -c 32
/// /dev/urandom | base64` gives 44 characters): a server sends its proof to any client
/// that says HELLO, and a guessable token could be found offline from one.
pub const TOKEN_BYTES_MIN: usize = 32;
/// The longest token file read.
pub const TOKEN_BYTES_MAX: usize = 4096;

/// How long a handshake may take, on either side, before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const CODE_OK: u8 = 0;
const CODE_SERVER_HAS_NO_TOKEN: u8 = 1;
const CODE_UNSUPPORTED_VERSION: u8 = 2;
const CODE_WRONG_TOKEN: u8 = 3;

/// The cluster secret. Its bytes are kept only as an HMAC key; `Debug` and
/// [`fingerprint`](Self::fingerprint) show a hash prefix that identifies it in logs.
#[derive(Clone)]
pub struct ClusterToken {
    key: hmac::Key,
    fingerprint: String,
}

impl fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterToken({})", self.fingerprint)
    }
}

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the token file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// What the OS said.
        reason: String,
    },
    /// The token is shorter than [`TOKEN_BYTES_MIN`] (after trimming whitespace) or
    /// longer than [`TOKEN_BYTES_MAX`].
    #[error(
        "the token in {path} is {len} bytes; it must be {TOKEN_BYTES_MIN} to \
         {TOKEN_BYTES_MAX} (make one with: head -c 32 /dev/urandom | base64 > {path})"
    )]
    Length {
        /// The file.
        path: String,
        /// The token's length.
        len: usize,
    },
}

impl ClusterToken {
    /// A token from its bytes; `None` if its length is out of bounds.
    pub fn new(secret: &[u8]) -> Option<ClusterToken> {
        if !(TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&secret.len()) {
            return None;
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let digest = ring::digest::digest(&ring::digest::SHA256, secret);
        let fingerprint = digest.as_ref()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(ClusterToken { key, fingerprint })
    }

    /// Reads a token file: its contents without surrounding whitespace (a trailing
    /// newline from `echo` or `base64` is not part of the token).
    pub fn from_file(path: &Path) -> Result<ClusterToken, TokenError> {
        let shown = path.display().to_string();
        let bytes = read_bounded(path).map_err(|e| TokenError::Read {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let trimmed = bytes.trim_ascii();
        ClusterToken::new(trimmed).ok_or(TokenError::Length {
            path: shown,
            len: trimmed.len(),
        })
    }

    /// The first 4 bytes of the token's SHA-256 in hex: says which token a process
    /// holds without revealing it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The password RESP clients give the gateway (`AUTH`): derived from the token
    /// (48 hex digits of an HMAC of a fixed label), never the token itself. RESP's `AUTH`
    /// crosses the network in clear unless TLS is used, and the password opens only the
    /// gateway: seeing it does not give away the token that servers prove to each other.
    pub fn resp_password(&self) -> String {
        hmac::sign(&self.key, RESP_PASSWORD_LABEL).as_ref()[..24]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether `password` is [`resp_password`](Self::resp_password) (compared in
    /// constant time).
    pub fn matches_resp_password(&self, password: &[u8]) -> bool {
        let expected = hmac::sign(&self.key, self.resp_password().as_bytes());
        hmac::verify(&self.key, password, expected.as_ref()).is_ok()
    }

    fn proof(&self, role: &[u8], client_nonce: &[u8], server_nonce: &[u8]) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.key);
        context.update(role);
        context.update(client_nonce);
        context.update(server_nonce);
        context.sign()
    }

    fn verify(&self, role: &[u8], client_nonce: &[u8], server_nonce: &[u8], proof: &[u8]) -> bool {
        let mut message = Vec::with_capacity(role.len() + 2 * NONCE_BYTES);
        message.extend_from_slice(role);
        message.extend_from_slice(client_nonce);
        message.extend_from_slice(server_nonce);
        hmac::verify(&self.key, &message, proof).is_ok()
    }
}

/// Reads at most [`TOKEN_BYTES_MAX`] + 64 bytes (room for surrounding whitespace; a
/// longer token is refused by length).
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(TOKEN_BYTES_MAX as u64 + 64)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

const SERVER_ROLE: &[u8] = b"rampart server";
const RESP_PASSWORD_LABEL: &[u8] = b"rampart resp password v1";
const CLIENT_ROLE: &[u8] = b"rampart client";

/// Why a handshake failed. Messages name the fix and never the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The peer did not start with HELLO: it presented no token. `first` holds the four
    /// bytes it sent instead, for the caller to answer in the peer's protocol.
    #[error("the peer presented no cluster token")]
    NoToken {
        /// What the peer sent first.
        first: [u8; 4],
    },
    /// The server was started without a token (so it is not part of this cluster's
    /// secured set-up).
    #[error(
        "the server holds no cluster token (it was started without --auth-token-file) but \
         this process does"
    )]
    ServerHasNoToken,
    /// The server accepted this process's proof but its own proof is wrong: it does not
    /// hold the token (something between the two relays the handshake).
    #[error("the server did not prove that it holds this cluster's token")]
    ServerWrongToken,
    /// The server refused this process's token.
    #[error(
        "the server holds a different cluster token than this process (whose token's \
         fingerprint is {fingerprint}); start both with the cluster's --auth-token-file"
    )]
    WrongToken {
        /// The fingerprint of the token presented.
        fingerprint: String,
    },
    /// The peer presented a wrong proof (server side).
    #[error("the peer presented a wrong cluster token")]
    PeerWrongToken,
    /// The client speaks another handshake version than this server (server side).
    #[error("the peer speaks handshake version {0}, this build {AUTH_VERSION}")]
    UnsupportedVersion(u8),
    /// The server does not speak this build's handshake version (client side).
    #[error(
        "the server does not speak handshake version {AUTH_VERSION}: it runs an older or \
         newer build"
    )]
    ServerRefusedVersion,
    /// The peer's message was not a handshake message.
    #[error("the peer's handshake message is malformed")]
    Malformed,
    /// The stream failed or ended during the handshake.
    #[error("connection failed during the cluster-token handshake: {0}")]
    Io(String),
    /// The handshake took longer than [`HANDSHAKE_TIMEOUT`].
    #[error("the cluster-token handshake took longer than {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
}

/// The client's side of the handshake.
#[derive(Debug)]
pub struct ClientHandshake {
    token: ClusterToken,
    nonce: [u8; NONCE_BYTES],
}

impl ClientHandshake {
    /// Starts a handshake with a fresh `nonce`; returns the HELLO to send.
    pub fn start(token: &ClusterToken, nonce: [u8; NONCE_BYTES]) -> (Self, [u8; HELLO_BYTES]) {
        let mut hello = [0; HELLO_BYTES];
        hello[..4].copy_from_slice(&AUTH_MAGIC);
        hello[4] = AUTH_VERSION;
        hello[5..].copy_from_slice(&nonce);
        let state = ClientHandshake {
            token: token.clone(),
            nonce,
        };
        (state, hello)
    }

    /// Reads the server's CHALLENGE; returns the PROOF to send and whether the server
    /// proved it holds the token. The proof goes out either way, so that a server with
    /// another token logs the mismatch rather than a dropped connection.
    pub fn on_challenge(
        &self,
        challenge: &[u8; CHALLENGE_BYTES],
    ) -> Result<([u8; PROOF_BYTES], bool), HandshakeError> {
        if challenge[..4] != AUTH_MAGIC {
            return Err(HandshakeError::Malformed);
        }
        match challenge[4] {
            CODE_OK => {}
            CODE_SERVER_HAS_NO_TOKEN => return Err(HandshakeError::ServerHasNoToken),
            CODE_UNSUPPORTED_VERSION => return Err(HandshakeError::ServerRefusedVersion),
            _ => return Err(HandshakeError::Malformed),
        }
        let server_nonce = &challenge[5..5 + NONCE_BYTES];
        let server_proof = &challenge[5 + NONCE_BYTES..];
        let server_proven = self
            .token
            .verify(SERVER_ROLE, &self.nonce, server_nonce, server_proof);
        let mut proof = [0; PROOF_BYTES];
        proof.copy_from_slice(
            self.token
                .proof(CLIENT_ROLE, &self.nonce, server_nonce)
                .as_ref(),
        );
        Ok((proof, server_proven))
    }

    /// Reads the server's VERDICT; `server_proven` is what
    /// [`on_challenge`](Self::on_challenge) found.
    pub fn on_verdict(&self, verdict: u8, server_proven: bool) -> Result<(), HandshakeError> {
        match verdict {
            CODE_OK if server_proven => Ok(()),
            CODE_OK => Err(HandshakeError::ServerWrongToken),
            CODE_WRONG_TOKEN => Err(HandshakeError::WrongToken {
                fingerprint: self.token.fingerprint().to_string(),
            }),
            _ => Err(HandshakeError::Malformed),
        }
    }
}
/// The server's side of the handshake, after HELLO.
#[derive(Debug)]
pub struct ServerHandshake {
    token: ClusterToken,
    client_nonce: [u8; NONCE_BYTES],
    server_nonce: [u8; NONCE_BYTES],
}

impl ServerHandshake {
    /// Reads HELLO with a fresh server `nonce`; returns the state and the CHALLENGE to
    /// send. On an error the CHALLENGE, if any, still goes out (it tells the client why)
    /// before the connection closes.
    #[allow(clippy::type_complexity)]
    pub fn on_hello(
        token: &ClusterToken,
        hello: &[u8; HELLO_BYTES],
        nonce: [u8; NONCE_BYTES],
    ) -> Result<(Self, [u8; CHALLENGE_BYTES]), (HandshakeError, Option<[u8; CHALLENGE_BYTES]>)>
    {
        if hello[..4] != AUTH_MAGIC {
            let mut first = [0; 4];
            first.copy_from_slice(&hello[..4]);
            return Err((HandshakeError::NoToken { first }, None));
        }
        if hello[4] != AUTH_VERSION {
            return Err((
                HandshakeError::UnsupportedVersion(hello[4]),
                Some(refusal(CODE_UNSUPPORTED_VERSION)),
            ));
        }
        let mut client_nonce = [0; NONCE_BYTES];
        client_nonce.copy_from_slice(&hello[5..]);
        let mut challenge = [0; CHALLENGE_BYTES];
        challenge[..4].copy_from_slice(&AUTH_MAGIC);
        challenge[4] = CODE_OK;
        challenge[5..5 + NONCE_BYTES].copy_from_slice(&nonce);
        challenge[5 + NONCE_BYTES..]
            .copy_from_slice(token.proof(SERVER_ROLE, &client_nonce, &nonce).as_ref());
        let state = ServerHandshake {
            token: token.clone(),
            client_nonce,
            server_nonce: nonce,
        };
        Ok((state, challenge))
    }

    /// Checks the client's PROOF; returns the VERDICT byte to send and the outcome.
    pub fn on_proof(&self, proof: &[u8; PROOF_BYTES]) -> (u8, Result<(), HandshakeError>) {
        if self
            .token
            .verify(CLIENT_ROLE, &self.client_nonce, &self.server_nonce, proof)
        {
            (CODE_OK, Ok(()))
        } else {
            (CODE_WRONG_TOKEN, Err(HandshakeError::PeerWrongToken))
        }
    }
}

/// The CHALLENGE a server without a token answers a HELLO with, so the client learns
/// why instead of seeing its connection drop.
pub fn no_token_challenge() -> [u8; CHALLENGE_BYTES] {
    refusal(CODE_SERVER_HAS_NO_TOKEN)
}

fn refusal(code: u8) -> [u8; CHALLENGE_BYTES] {
    let mut challenge = [0; CHALLENGE_BYTES];
    challenge[..4].copy_from_slice(&AUTH_MAGIC);
    challenge[4] = code;
    challenge
}

fn fresh_nonce() -> Result<[u8; NONCE_BYTES], HandshakeError> {
    let mut nonce = [0; NONCE_BYTES];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| HandshakeError::Io("the system's random source failed".to_string()))?;
    Ok(nonce)
}

fn io_error(error: std::io::Error) -> HandshakeError {
    HandshakeError::Io(error.to_string())
}

/// Writes `bytes` and flushes them: over TLS, rustls may otherwise hold them until the
/// stream is written again, and the peer, waiting for them, never answers.
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> Result<(), HandshakeError> {
    stream.write_all(bytes).await.map_err(io_error)?;
    stream.flush().await.map_err(io_error)
}

/// Proves `token` to the server at the other end of `stream`, and checks the server
/// holds it too, within [`HANDSHAKE_TIMEOUT`].
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &ClusterToken,
) -> Result<(), HandshakeError> {
    let exchange = async {
        let (state, hello) = ClientHandshake::start(token, fresh_nonce()?);
        send(stream, &hello).await?;
        let mut challenge = [0; CHALLENGE_BYTES];
        stream.read_exact(&mut challenge).await.map_err(io_error)?;
        let (proof, server_proven) = state.on_challenge(&challenge)?;
        send(stream, &proof).await?;
        let verdict = stream.read_u8().await.map_err(io_error)?;
        state.on_verdict(verdict, server_proven)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| HandshakeError::Timeout)?
}

/// Checks that the client at the other end of `stream` holds `token` (and proves this
/// server does), within [`HANDSHAKE_TIMEOUT`]. On [`HandshakeError::NoToken`] nothing
/// has been written; the caller answers in its own protocol.
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &ClusterToken,
) -> Result<(), HandshakeError> {
    let exchange = async {
        let mut hello = [0; HELLO_BYTES];
        // Read the magic alone first: a tokenless RPC peer sends a 20-byte header and
        // may send nothing more, so waiting for 37 bytes would stall until the timeout.
        stream.read_exact(&mut hello[..4]).await.map_err(io_error)?;
        if hello[..4] != AUTH_MAGIC {
            let mut first = [0; 4];
            first.copy_from_slice(&hello[..4]);
            return Err(HandshakeError::NoToken { first });
        }
        stream.read_exact(&mut hello[4..]).await.map_err(io_error)?;
        let (state, challenge) = match ServerHandshake::on_hello(token, &hello, fresh_nonce()?) {
            Ok(accepted) => accepted,
            Err((error, answer)) => {
                if let Some(answer) = answer {
                    let _ = send(stream, &answer).await;
                }
                return Err(error);
            }
        };
        send(stream, &challenge).await?;
        let mut proof = [0; PROOF_BYTES];
        stream.read_exact(&mut proof).await.map_err(io_error)?;
        let (verdict, outcome) = state.on_proof(&proof);
        send(stream, &[verdict]).await?;
        outcome
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| HandshakeError::Timeout)?
}

/// What a process presents and demands on its connections: the cluster token, TLS for
/// the connections it dials (`tls_client`) and TLS it offers on those it accepts
/// (`tls_server`).
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// The cluster token; `None`: an open cluster.
    pub token: Option<ClusterToken>,
    /// Dial every peer over TLS, verifying it against these roots.
    pub tls_client: Option<TlsConnector>,
    /// Accept TLS (besides plain connections) with this certificate.
    pub tls_server: Option<TlsAcceptor>,
}

impl Security {
    /// No token, no TLS: an open cluster (the default).
    pub fn open() -> Security {
        Security::default()
    }

    /// The token only.
    pub fn with_token(token: ClusterToken) -> Security {
        Security {
            token: Some(token),
            ..Security::default()
        }
    }
}

static PROCESS_SECURITY: OnceLock<Arc<Security>> = OnceLock::new();

/// Fixes this process's security; at most once, before the first connection. Returns
/// `false` if it was already fixed (then nothing changes).
pub fn install(security: Security) -> bool {
    PROCESS_SECURITY.set(Arc::new(security)).is_ok()
}

/// This process's security: what [`install`] set, or open.
pub fn process_security() -> Arc<Security> {
    Arc::clone(PROCESS_SECURITY.get_or_init(|| Arc::new(Security::open())))
}

/// A token of `text`, padded to the minimum length: for this crate's tests.
#[cfg(test)]
pub(crate) fn test_token(text: &str) -> ClusterToken {
    let padded = format!("{text:.<width$}", width = TOKEN_BYTES_MIN);
    ClusterToken::new(padded.as_bytes()).expect("token length")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str) -> ClusterToken {
        test_token(text)
    }

    /// Runs the state machines against each other; returns what each side concluded.
    fn exchange(
        client_token: &ClusterToken,
        server_token: &ClusterToken,
    ) -> (Result<(), HandshakeError>, Result<(), HandshakeError>) {
        let (client, hello) = ClientHandshake::start(client_token, [1; NONCE_BYTES]);
        let (server, challenge) =
            ServerHandshake::on_hello(server_token, &hello, [2; NONCE_BYTES]).expect("hello");
        let (proof, server_proven) = match client.on_challenge(&challenge) {
            Ok(answer) => answer,
            Err(error) => return (Err(error), Ok(())),
        };
        let (verdict, server_outcome) = server.on_proof(&proof);
        (client.on_verdict(verdict, server_proven), server_outcome)
    }

    #[test]
    fn the_same_token_is_accepted_both_ways() {
        let t = token("correct horse battery staple");
        assert_eq!(exchange(&t, &t), (Ok(()), Ok(())));
    }

    #[test]
    fn different_tokens_are_refused_by_both_ends() {
        let (client, server) =
            exchange(&token("the client's token!"), &token("the server's token!"));
        assert!(
            matches!(client, Err(HandshakeError::WrongToken { .. })),
            "{client:?}"
        );
        assert_eq!(server, Err(HandshakeError::PeerWrongToken));
    }

    #[test]
    fn a_server_that_cannot_prove_the_token_is_not_trusted() {
        let t = token("correct horse battery staple");
        let (client, hello) = ClientHandshake::start(&t, [1; NONCE_BYTES]);
        let (_, mut challenge) =
            ServerHandshake::on_hello(&t, &hello, [2; NONCE_BYTES]).expect("hello");
        challenge[CHALLENGE_BYTES - 1] ^= 1;
        let (_, server_proven) = client.on_challenge(&challenge).expect("challenge");
        assert!(!server_proven);
        assert_eq!(
            client.on_verdict(CODE_OK, server_proven),
            Err(HandshakeError::ServerWrongToken)
        );
    }

    #[test]
    fn a_client_proof_made_with_another_token_is_refused() {
        let server_token = token("the server's token!");
        let (_, hello) = ClientHandshake::start(&server_token, [1; NONCE_BYTES]);
        let (server, _) =
            ServerHandshake::on_hello(&server_token, &hello, [2; NONCE_BYTES]).expect("hello");
        // A client that skipped checking the server, proving with a wrong token.
        let wrong = token("a different token");
        let proof = wrong.proof(CLIENT_ROLE, &[1; NONCE_BYTES], &[2; NONCE_BYTES]);
        let mut bytes = [0; PROOF_BYTES];
        bytes.copy_from_slice(proof.as_ref());
        let (verdict, outcome) = server.on_proof(&bytes);
        assert_eq!(outcome, Err(HandshakeError::PeerWrongToken));
        let (client, _) = ClientHandshake::start(&wrong, [1; NONCE_BYTES]);
        assert!(matches!(
            client.on_verdict(verdict, true),
            Err(HandshakeError::WrongToken { .. })
        ));
    }

    #[test]
    fn a_recorded_proof_does_not_pass_another_server_nonce() {
        let t = token("correct horse battery staple");
        let (client, hello) = ClientHandshake::start(&t, [1; NONCE_BYTES]);
        let (first, challenge) =
            ServerHandshake::on_hello(&t, &hello, [2; NONCE_BYTES]).expect("hello");
        let (proof, _) = client.on_challenge(&challenge).expect("challenge");
        assert_eq!(first.on_proof(&proof).1, Ok(()));
        // The same HELLO and PROOF replayed to a connection with a new server nonce.
        let (second, _) = ServerHandshake::on_hello(&t, &hello, [3; NONCE_BYTES]).expect("hello");
        assert_eq!(
            second.on_proof(&proof).1,
            Err(HandshakeError::PeerWrongToken)
        );
    }

    #[test]
    fn refusals_say_why() {
        let t = token("correct horse battery staple");
        let (client, mut hello) = ClientHandshake::start(&t, [1; NONCE_BYTES]);
        assert_eq!(
            client.on_challenge(&no_token_challenge()),
            Err(HandshakeError::ServerHasNoToken)
        );
        hello[4] = 9;
        let Err((error, Some(answer))) = ServerHandshake::on_hello(&t, &hello, [2; NONCE_BYTES])
        else {
            panic!("a wrong version must be answered");
        };
        assert_eq!(error, HandshakeError::UnsupportedVersion(9));
        assert_eq!(
            client.on_challenge(&answer),
            Err(HandshakeError::ServerRefusedVersion)
        );
        let mut frame = [0; HELLO_BYTES];
        frame[..4].copy_from_slice(b"RAMP");
        assert!(matches!(
            ServerHandshake::on_hello(&t, &frame, [2; NONCE_BYTES]),
            Err((HandshakeError::NoToken { first }, None)) if &first == b"RAMP"
        ));
    }

    #[test]
    fn tokens_are_read_trimmed_and_bounded_and_never_shown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "correct horse battery staple, 32+ bytes\n").expect("write");
        let read = ClusterToken::from_file(&path).expect("token");
        let same = ClusterToken::new(b"correct horse battery staple, 32+ bytes").expect("token");
        assert_eq!(
            read.fingerprint(),
            same.fingerprint(),
            "the newline is not part of it"
        );
        assert!(!format!("{read:?}").contains("horse"));
        let password = read.resp_password();
        assert_eq!(password.len(), 48);
        assert!(!password.contains("horse"));
        assert!(read.matches_resp_password(password.as_bytes()));
        assert!(!read.matches_resp_password(b"correct horse battery staple, 32+ bytes"));
        assert!(!token("another token of at least thirty-two bytes")
            .matches_resp_password(password.as_bytes()));
        assert_eq!(read.fingerprint().len(), 8);
        std::fs::write(&path, "sixteen bytes ok\n").expect("write");
        let error = ClusterToken::from_file(&path).expect_err("too short");
        assert!(error.to_string().contains("/dev/urandom"), "{error}");
        let missing = ClusterToken::from_file(&dir.path().join("absent")).expect_err("missing");
        assert!(matches!(missing, TokenError::Read { .. }));
    }

    #[tokio::test]
    async fn the_drivers_complete_over_a_stream_and_refuse_a_wrong_token() {
        let t = token("correct horse battery staple");
        let (mut a, mut b) = tokio::io::duplex(1024);
        let server_token = t.clone();
        let server = tokio::spawn(async move { server_handshake(&mut b, &server_token).await });
        assert_eq!(client_handshake(&mut a, &t).await, Ok(()));
        assert_eq!(server.await.expect("join"), Ok(()));

        let (mut a, mut b) = tokio::io::duplex(1024);
        let server = tokio::spawn(async move { server_handshake(&mut b, &t).await });
        let other = token("another cluster's token");
        assert!(matches!(
            client_handshake(&mut a, &other).await,
            Err(HandshakeError::WrongToken { .. })
        ));
        assert_eq!(
            server.await.expect("join"),
            Err(HandshakeError::PeerWrongToken)
        );
    }
}
