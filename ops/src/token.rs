//! `rampart token`: making a cluster token, and the RESP password derived from it.
//!
//! * `rampart token new FILE` — 32 random bytes, base64 (44 characters), written to a new
//!   FILE readable by its owner only; refuses to overwrite one.
//! * `rampart token resp-password` — the password Redis clients give the gateway
//!   (`AUTH`), derived from the token of `--auth-token-file` (or
//!   `RAMPART_AUTH_TOKEN_FILE`): the token itself never goes into an application's
//!   configuration.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rampart_common::auth::ClusterToken;
use ring::rand::{SecureRandom, SystemRandom};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// `rampart token ...`
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Write a new random cluster token to FILE (mode 600; never overwrites).
    New {
        /// The file to create.
        file: PathBuf,
    },
    /// Print the password RESP clients give the gateway (`AUTH`), derived from the token.
    RespPassword(RespPasswordArgs),
}

/// `rampart token resp-password`
#[derive(Args, Debug)]
pub struct RespPasswordArgs {
    /// File holding the cluster token.
    #[arg(long, env = crate::security::TOKEN_FILE_ENV, value_name = "FILE")]
    pub auth_token_file: PathBuf,
}

/// Runs `rampart token ...`.
pub fn run(command: TokenCommand) -> Result<ExitCode> {
    match command {
        TokenCommand::New { file } => {
            let mut bytes = [0u8; 32];
            SystemRandom::new()
                .fill(&mut bytes)
                .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
            let text = base64(&bytes);
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .with_context(|| format!("cannot create {} (it must not exist)", file.display()))?;
            writeln!(out, "{text}")?;
            let token = ClusterToken::new(text.as_bytes())
                .context("a fresh token has the minimum length")?;
            println!(
                "wrote a new cluster token to {} (fingerprint {}); give every process \
                 --auth-token-file {}",
                file.display(),
                token.fingerprint(),
                file.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::RespPassword(args) => {
            let token = ClusterToken::from_file(&args.auth_token_file)?;
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                eprintln!("the gateway's RESP password (redis-cli --askpass, or REDISCLI_AUTH):");
            }
            println!("{}", token.resp_password());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(chunk.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(chunk.get(2).copied().unwrap_or(0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0u8; 32]).len(), 44);
    }

    #[test]
    fn a_new_token_is_private_fresh_and_never_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        run(TokenCommand::New { file: file.clone() }).expect("created");
        let mode = std::fs::metadata(&file).expect("exists").permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let first = ClusterToken::from_file(&file).expect("a valid token");
        assert!(
            run(TokenCommand::New { file: file.clone() }).is_err(),
            "no overwrite"
        );
        let other = dir.path().join("other");
        run(TokenCommand::New {
            file: other.clone(),
        })
        .expect("created");
        let second = ClusterToken::from_file(&other).expect("a valid token");
        assert_ne!(first.fingerprint(), second.fingerprint());
    }
}
