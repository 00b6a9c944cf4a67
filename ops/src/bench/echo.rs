//! The floor of the RPC path: a raw tokio TCP ping-pong with the same message sizes.
//!
//! The client sends `[request_len u32][reply_len u32]` and `request_len` bytes; the
//! server reads them and answers with `reply_len` bytes. No framing library, no
//! dispatch, no tasks besides one per connection: the least any RPC over tokio TCP on
//! this machine can cost.

use anyhow::{Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use rampart_common::announce::{Announce, Speaker};
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `rampart bench echo`
#[derive(Args, Debug)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Worker threads (0: one per core, like a server).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Largest message the echo server accepts (it is a benchmark tool, not a service).
const ECHO_MESSAGE_BYTES_MAX: u32 = 16 << 20;

/// Serves ping-pong until stdin closes or a signal arrives.
pub fn run(args: EchoArgs) -> Result<ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if args.threads > 0 {
        builder.worker_threads(args.threads);
    }
    builder.enable_all().build()?.block_on(async {
        let listener = TcpListener::bind(&args.listen).await?;
        let addr = listener.local_addr()?;
        let mut stdout = std::io::stdout().lock();
        let listening = Announce::Listening {
            speaker: Speaker::Echo,
            addr: addr.to_string(),
        };
        writeln!(stdout, "{listening}")?;
        stdout.flush()?;
        drop(stdout);
        let serve = async {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let _ = serve_echo(stream).await;
                });
            }
        };
        tokio::select! {
            _ = serve => {}
            _ = crate::process::shutdown_signal() => {}
        }
        Ok(ExitCode::SUCCESS)
    })
}

async fn serve_echo(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut sizes = [0u8; 8];
        stream.read_exact(&mut sizes).await?;
        let request = u32::from_le_bytes([sizes[0], sizes[1], sizes[2], sizes[3]]);
        let reply = u32::from_le_bytes([sizes[4], sizes[5], sizes[6], sizes[7]]);
        if request > ECHO_MESSAGE_BYTES_MAX || reply > ECHO_MESSAGE_BYTES_MAX {
            return Ok(());
        }
        buf.resize(request.max(reply) as usize, 0);
        stream.read_exact(&mut buf[..request as usize]).await?;
        stream.write_all(&buf[..reply as usize]).await?;
    }
}

/// Measures `samples` sequential round trips of `request_bytes` → `reply_bytes`
/// against the echo server at `addr`; latencies in nanoseconds.
pub async fn ping_pong(
    addr: &str,
    request_bytes: u32,
    reply_bytes: u32,
    warmup: u32,
    samples: u32,
) -> Result<Histogram<u64>> {
    let mut stream = TcpStream::connect(addr)
        .await
        .context("cannot reach the echo server")?;
    stream.set_nodelay(true)?;
    let mut message = vec![0u8; 8 + request_bytes as usize];
    message[..4].copy_from_slice(&request_bytes.to_le_bytes());
    message[4..8].copy_from_slice(&reply_bytes.to_le_bytes());
    let mut reply = vec![0u8; reply_bytes as usize];
    let mut histogram = Histogram::<u64>::new(3)?;
    for i in 0..warmup + samples {
        let start = Instant::now();
        stream.write_all(&message).await?;
        stream.read_exact(&mut reply).await?;
        if i >= warmup {
            histogram.record(start.elapsed().as_nanos() as u64)?;
        }
    }
    Ok(histogram)
}
