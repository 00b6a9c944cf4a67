//! `rampart kv`: table operations from the shell, script-friendly.
//!
//! Output is meant for pipes: `get` prints the value alone (raw bytes, no newline
//! added) into a pipe or a file, or with `--raw`; on a terminal it adds a newline, so
//! the prompt starts on a line of its own. A missing key prints `not found` on stderr
//! and exits 1; errors print on stderr and exit 2. Values come from the argument, or
//! from stdin when it is omitted. `scan` prints one line per object with non-printable
//! bytes escaped.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rampart_client::{Client, ClientError};
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

/// `rampart kv`
#[derive(Args, Debug)]
pub struct KvArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: KvCommand,
}

/// How a command that works through the client library reaches the cluster (`kv`,
/// `tablet`).
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// Coordinator address(es), comma-separated.
    #[arg(
        long,
        global = true,
        env = "RAMPART_COORDINATOR",
        default_value = "127.0.0.1:7000"
    )]
    pub coordinator: String,
    /// Seconds an operation may take, retries included.
    #[arg(long, global = true, default_value_t = 10.0)]
    pub timeout: f64,
    #[command(flatten)]
    pub security: crate::security::ClientSecurityArgs,
}

/// One table operation.
#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// Create a table (prints its id); an existing table's id is printed unchanged.
    CreateTable {
        /// Table name.
        table: String,
        /// Number of tablets to spread it over.
        #[arg(long, default_value_t = 1)]
        span: u32,
    },
    /// Drop a table and all its objects.
    DropTable {
        /// Table name.
        table: String,
    },
    /// Write a value (from the argument, or stdin if omitted); prints the new version.
    Put {
        /// Table name.
        table: String,
        /// Key.
        key: String,
        /// Value; read from stdin when omitted.
        value: Option<String>,
    },
    /// Print a value: the bytes as stored, and a newline after them on a terminal.
    Get {
        /// Table name.
        table: String,
        /// Key.
        key: String,
        /// Print `VERSION<TAB>VALUE` instead.
        #[arg(long)]
        with_version: bool,
        /// Print the bytes as stored even on a terminal (no newline added); into a pipe or
        /// a file they always are.
        #[arg(long)]
        raw: bool,
    },
    /// Remove a key (succeeds if it is already gone).
    Del {
        /// Table name.
        table: String,
        /// Key.
        key: String,
    },
    /// Add to an integer value (missing counts as 0); prints the new value.
    Incr {
        /// Table name.
        table: String,
        /// Key.
        key: String,
        /// Amount to add.
        #[arg(default_value_t = 1, allow_negative_numbers = true)]
        delta: i64,
    },
    /// Print every object of a table as `KEY<TAB>VALUE` lines, one per object; tab,
    /// newline, backslash and bytes outside printable ASCII are escaped (`\t`, `\n`,
    /// `\\`, `\xNN`), so every line parses unambiguously.
    Scan {
        /// Table name.
        table: String,
    },
}

/// A client of the cluster `args` name.
pub(crate) async fn connect(args: &ClientArgs) -> Result<Client> {
    let coordinators = crate::startup::coordinator_list(&args.coordinator);
    let options = rampart_client::ClientOptions {
        deadline: std::time::Duration::from_secs_f64(args.timeout.max(0.001)),
        ..Default::default()
    };
    Client::connect_with(&coordinators, options)
        .await
        .with_context(|| format!("cannot reach the cluster at {}", args.coordinator))
}

/// Runs `rampart kv ...`.
pub fn run(args: KvArgs) -> Result<ExitCode> {
    crate::startup::run_client(&args.client.security, async {
        let client = connect(&args.client).await?;
        match execute(&client, args.command).await {
            Ok(code) => Ok(code),
            Err(error) => {
                eprintln!("error: {error}");
                Ok(ExitCode::from(2))
            }
        }
    })?
}

async fn execute(client: &Client, command: KvCommand) -> Result<ExitCode, ClientError> {
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| ClientError::Server(format!("stdout: {e}"));
    match command {
        KvCommand::CreateTable { table, span } => {
            let id = client.create_table(&table, span).await?;
            writeln!(out, "{}", id.0).map_err(io)?;
        }
        KvCommand::DropTable { table } => client.drop_table(&table).await?,
        KvCommand::Put { table, key, value } => {
            let value = match value {
                Some(value) => value.into_bytes(),
                None => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .map_err(|e| ClientError::Server(format!("stdin: {e}")))?;
                    buf
                }
            };
            let id = client.get_table_id(&table).await?;
            let version = client.write(id, key.as_bytes(), &value).await?;
            writeln!(out, "{}", version.0).map_err(io)?;
        }
        KvCommand::Get {
            table,
            key,
            with_version,
            raw,
        } => {
            let id = client.get_table_id(&table).await?;
            match client.read(id, key.as_bytes()).await? {
                Some(object) => {
                    let version = with_version.then_some(object.version.0);
                    let newline = !raw && std::io::stdout().is_terminal();
                    write_value(&mut out, version, &object.value, newline).map_err(io)?;
                }
                None => {
                    eprintln!("not found");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        KvCommand::Del { table, key } => {
            let id = client.get_table_id(&table).await?;
            client.remove(id, key.as_bytes()).await?;
        }
        KvCommand::Incr { table, key, delta } => {
            let id = client.get_table_id(&table).await?;
            let (value, _) = client.increment(id, key.as_bytes(), delta).await?;
            writeln!(out, "{value}").map_err(io)?;
        }
        KvCommand::Scan { table } => {
            let id = client.get_table_id(&table).await?;
            let mut pages = client.enumerate(id);
            while let Some(page) = pages.next_page().await? {
                for object in page {
                    writeln!(out, "{}\t{}", escape(&object.key), escape(&object.value))
                        .map_err(io)?;
                }
            }
        }
    }
    out.flush().map_err(io)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes what `get` prints: `VERSION<TAB>` when asked, the value's bytes as stored, and
/// a newline when `newline` (stdout is a terminal and `--raw` was not given).
fn write_value(
    out: &mut impl Write,
    version: Option<u64>,
    value: &[u8],
    newline: bool,
) -> std::io::Result<()> {
    if let Some(version) = version {
        write!(out, "{version}\t")?;
    }
    out.write_all(value)?;
    if newline {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Escapes what would break a `KEY<TAB>VALUE` line; printable ASCII stays as it is.
fn escape(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(bytes.len());
    for &byte in bytes {
        match byte {
            b'\\' => text.push_str("\\\\"),
            b'\t' => text.push_str("\\t"),
            b'\n' => text.push_str("\\n"),
            b'\r' => text.push_str("\\r"),
            0x20..=0x7e => text.push(char::from(byte)),
            other => {
                let _ = write!(text, "\\x{other:02x}");
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{escape, write_value};

    fn written(version: Option<u64>, value: &[u8], newline: bool) -> Vec<u8> {
        let mut out = Vec::new();
        write_value(&mut out, version, value, newline).expect("writing to a Vec cannot fail");
        out
    }

    #[test]
    fn write_value_gives_the_bytes_as_stored_without_newline() {
        let binary: Vec<u8> = (0..=255u8).collect();
        assert_eq!(written(None, &binary, false), binary);
        assert_eq!(written(None, b"", false), b"");
        assert_eq!(written(Some(7), b"v\n", false), b"7\tv\n");
    }

    #[test]
    fn write_value_on_a_terminal_ends_with_a_newline() {
        assert_eq!(written(None, b"engineer", true), b"engineer\n");
        assert_eq!(written(Some(3), b"manager", true), b"3\tmanager\n");
    }

    #[test]
    fn escape_keeps_printable_ascii_and_escapes_line_breakers() {
        assert_eq!(escape(br#"{"a": 1}"#), r#"{"a": 1}"#);
        assert_eq!(escape(b"a\tb\nc\\d\x00\xff"), r"a\tb\nc\\d\x00\xff");
    }
}
