//! A fast MCP upstream for load benchmarks: the bundled demo server on its own,
//! so the gateway's cost dominates what is measured.
//!
//! ```text
//! cargo run --release --example echo_upstream -- [--port P] [--sse] [--pad BYTES] [--tools N]
//! ```
//!
//! Prints `LISTENING <port>` once it accepts connections; stops on SIGINT/SIGTERM.

use portcullis::demo::upstream::{self, DemoOptions};

fn main() -> std::io::Result<()> {
    let mut options = DemoOptions::default();
    let mut port = 0u16;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0)
        };
        match arg.as_str() {
            "--port" => port = u16::try_from(value()).unwrap_or(0),
            "--sse" => options.sse = true,
            "--pad" => options.pad_output = value(),
            "--tools" => options.extra_tools = value(),
            other => {
                eprintln!(
                    "unknown argument {other:?}; expected --port P, --sse, --pad BYTES, --tools N"
                );
                std::process::exit(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        println!("LISTENING {}", listener.local_addr()?.port());
        upstream::serve(listener, options, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
    })
}
