//! What the commands share as they start: logging to stderr, the `--coordinator` list,
//! and the runtime of a short-lived client command (`kv`, `status`, `recovery`).

use anyhow::Result;

use crate::security::ClientSecurityArgs;

/// The addresses of a `--coordinator` list (comma-separated, blanks ignored).
pub(crate) fn coordinator_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

/// Runs a short-lived client command (`kv`, `status`, `recovery`) on a current-thread
/// runtime with its security flags installed, with warnings-only logging unless
/// `RAMPART_LOG` says otherwise.
pub(crate) fn run_client<F: std::future::Future>(
    security: &ClientSecurityArgs,
    command: F,
) -> Result<F::Output> {
    init_logging("warn");
    security.install()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(command))
}

/// Sets up logging to stderr; `RAMPART_LOG` (same syntax as `RUST_LOG`) overrides
/// `default_level`.
pub(crate) fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAMPART_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
