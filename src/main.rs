//! The `portcullis` command: parse arguments, load configuration, run.
//!
//! Invariant: what the command prints goes through [`say`] or [`complain`],
//! which escape every character that is not plain but the line breaks of the
//! output itself: a name or text from a server, a configuration or an error
//! cannot drive the operator's terminal.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use portcullis::util::escape::escaped_lines;
use portcullis::{Gateway, config, demo, telemetry};

/// A security gateway for MCP servers.
#[derive(Debug, Parser)]
#[command(name = "portcullis", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP clients with the given configuration.
    Run {
        /// The TOML configuration file.
        #[arg(long, short, env = "PORTCULLIS_CONFIG")]
        config: PathBuf,
        /// Do not reload when the file changes (SIGHUP and POST /api/reload still reload).
        #[arg(long)]
        no_watch: bool,
    },
    /// Check a configuration and print the effective policy.
    Check {
        /// The TOML configuration file.
        #[arg(long, short, env = "PORTCULLIS_CONFIG")]
        config: PathBuf,
        /// Explain what one call gets instead: a JSON file naming `client`,
        /// `server`, one of `tool`/`resource`/`prompt`, and optional `arguments`.
        #[arg(long, value_name = "REQUEST.json")]
        explain: Option<PathBuf>,
        /// With --explain: print the explanation as JSON.
        #[arg(long, requires = "explain")]
        json: bool,
    },
    /// Read an API key on stdin and print its SHA-256, for `api_key_sha256`.
    HashKey,
    /// Print the JSON Schema of the configuration file, for editors (taplo, Even Better TOML).
    ConfigSchema,
    /// Print the configuration reference in Markdown (every table and key, from the schema).
    ConfigReference,
    /// Exit 0 if the admin listener answers `/healthz` (for container health checks).
    ///
    /// Probes `--url` when given; otherwise the `/healthz` of the admin listener the
    /// configuration names (`--config` or `PORTCULLIS_CONFIG`; an unspecified address such
    /// as 0.0.0.0 is probed on loopback), so a health check follows the configured port;
    /// with neither, `http://127.0.0.1:9090/healthz`.
    Health {
        /// The URL to probe.
        #[arg(long)]
        url: Option<String>,
        /// The configuration whose `admin_listen` to probe.
        #[arg(long, short, env = "PORTCULLIS_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Review and approve pinned tool definitions and server instructions.
    Pins {
        #[command(subcommand)]
        command: PinsCommand,
    },
    /// Start a bundled demo server with flawed tools behind a demo configuration.
    Demo {
        /// Port of the demo's MCP endpoint on 127.0.0.1 (0 picks a free one).
        #[arg(long, default_value_t = 8080)]
        port: u16,
    },
}

#[derive(Debug, Subcommand)]
enum PinsCommand {
    /// Print every pin: its status, scan findings, what changed and how to approve it.
    List {
        /// The TOML configuration file (its `[pins] database` is read).
        #[arg(long, short, env = "PORTCULLIS_CONFIG")]
        config: PathBuf,
        /// Print JSON (the shape of the admin API's GET /api/pins).
        #[arg(long)]
        json: bool,
    },
    /// Approve the definition a server serves now; a running gateway picks it up.
    Approve {
        /// The TOML configuration file (its `[pins] database` is written).
        #[arg(long, short, env = "PORTCULLIS_CONFIG")]
        config: PathBuf,
        /// The server, as named in the configuration.
        #[arg(long)]
        server: String,
        /// The tool whose definition to approve.
        #[arg(
            long,
            required_unless_present = "instructions",
            conflicts_with = "instructions"
        )]
        tool: Option<String>,
        /// Approve the server's instructions instead of a tool.
        #[arg(long)]
        instructions: bool,
        /// Approve only if the definition still has this SHA-256 (as `pins list` prints it).
        #[arg(long)]
        hash: Option<String>,
    },
}

/// With `--features mimalloc`: mimalloc instead of glibc's malloc. A request
/// allocates and frees many small buffers, often on another worker thread than
/// the one that allocated them; mimalloc does that for less CPU, and keeps more
/// memory resident (BENCHMARKS.md, "Levers", has both figures).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            config,
            explain: None,
            ..
        } => check(&config),
        Command::Check {
            config,
            explain: Some(request),
            json,
        } => explain(&config, &request, json),
        Command::Pins { command } => pins(command),
        Command::HashKey => hash_key(),
        Command::ConfigSchema => {
            let schema = config::json_schema();
            match serde_json::to_string_pretty(&schema) {
                Ok(text) => {
                    say(&text);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    complain(format_args!("error: {e}"));
                    ExitCode::FAILURE
                }
            }
        }
        Command::ConfigReference => {
            print!("{}", config::reference_markdown());
            ExitCode::SUCCESS
        }
        Command::Health { url, config } => match health_url(url, config.as_deref()) {
            Ok(url) => health(&url),
            Err(e) => {
                complain(format_args!("unhealthy: {e}"));
                ExitCode::FAILURE
            }
        },
        Command::Run { config, no_watch } => serve(|| run(config, !no_watch)),
        Command::Demo { port } => serve(|| run_demo(port)),
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match config::load(path) {
        Ok(config) => {
            say(config.describe().trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            complain(format_args!("error: {e}"));
            ExitCode::from(2)
        }
    }
}

fn explain(path: &std::path::Path, request: &std::path::Path, json: bool) -> ExitCode {
    let result = config::load(path).map_err(|e| e.to_string()).and_then(|c| {
        std::fs::read_to_string(request)
            .map_err(|e| format!("{}: {e}", request.display()))
            .and_then(|text| portcullis::cli::explain::explain(&c, &text, json))
    });
    match result {
        Ok(text) => {
            println!("{}", text.trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn pins(command: PinsCommand) -> ExitCode {
    let result = match command {
        PinsCommand::List { config, json } => config::load(&config)
            .map_err(|e| e.to_string())
            .and_then(|c| portcullis::cli::pins::list(&c, json)),
        PinsCommand::Approve {
            config,
            server,
            tool,
            instructions: _,
            hash,
        } => {
            let subject = match tool {
                Some(t) => portcullis::cli::pins::Subject::Tool(t),
                None => portcullis::cli::pins::Subject::Instructions,
            };
            config::load(&config)
                .map_err(|e| e.to_string())
                .and_then(|c| {
                    portcullis::cli::pins::approve(&c, &server, &subject, hash.as_deref())
                })
        }
    };
    match result {
        Ok(text) => {
            say(text.trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            complain(format_args!("error: {e}"));
            ExitCode::from(2)
        }
    }
}

fn hash_key() -> ExitCode {
    let mut key = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut key) {
        complain(format_args!("error: cannot read the key from stdin: {e}"));
        return ExitCode::from(2);
    }
    let key = key.trim_end_matches(['\n', '\r']);
    if key.is_empty() {
        eprintln!("error: the key on stdin is empty");
        return ExitCode::from(2);
    }
    println!("{}", hex::encode(portcullis::auth::hash_key(key)));
    ExitCode::SUCCESS
}

/// The URL `portcullis health` probes.
fn health_url(url: Option<String>, config: Option<&std::path::Path>) -> Result<String, String> {
    if let Some(url) = url {
        return Ok(url);
    }
    let Some(path) = config else {
        return Ok("http://127.0.0.1:9090/healthz".to_owned());
    };
    // Only `[gateway] admin_listen` is read: a health probe runs often, and must not
    // fail because of what a full load checks (secrets in the environment, stores).
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let listen = table
        .get("gateway")
        .and_then(|g| g.get("admin_listen"))
        .and_then(toml::Value::as_str)
        .unwrap_or("127.0.0.1:9090");
    let mut addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|e| format!("{}: gateway.admin_listen {listen:?}: {e}", path.display()))?;
    // A listener on every address answers on loopback too.
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(format!("http://{addr}/healthz"))
}

fn health(url: &str) -> ExitCode {
    let probe = async {
        portcullis::app::install_crypto_provider();
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(3))
            .build()?;
        client.get(url).send().await?.error_for_status()?;
        Ok::<(), reqwest::Error>(())
    };
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(probe).map_err(|e| e.to_string()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            complain(format_args!("unhealthy: {url}: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn serve<F, Fut>(body: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            complain(format_args!("error: cannot start the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(body()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            complain(format_args!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

async fn run(path: PathBuf, watch: bool) -> anyhow::Result<()> {
    let config = config::load(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
    telemetry::init(
        config.telemetry.log_format,
        Some(config.telemetry.replica.as_str()),
    );
    drop(config);
    let gateway = Gateway::bind_file(&path)
        .await
        .context("cannot start")?
        .watch_file(watch);
    tracing::info!(mcp = %gateway.local_addr()?, admin = %gateway.admin_addr()?, "listening");
    reload_on_sighup(gateway.reloader());
    gateway
        .run(shutdown_signal())
        .await
        .context("the server failed")
}

async fn run_demo(port: u16) -> anyhow::Result<()> {
    telemetry::init(config::LogFormat::Pretty, None);
    let demo = demo::start(port).await.context("cannot start the demo")?;
    let addr = demo.gateway.local_addr()?;
    let admin = demo.gateway.admin_addr()?;
    println!("{}", demo::banner(addr, admin));
    demo.gateway
        .run(shutdown_signal())
        .await
        .context("the server failed")
}

/// Reloads the configuration file on every SIGHUP.
fn reload_on_sighup(reloader: portcullis::Reloader) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; reload with POST /api/reload");
            return;
        };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the configuration");
            let _ = reloader.reload("sighup").await;
        }
    });
    #[cfg(not(unix))]
    drop(reloader);
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Prints `text` and a line break on stdout, escaped (see the module's invariant).
fn say(text: impl std::fmt::Display) {
    println!("{}", escaped_lines(&text.to_string()));
}

/// Prints `text` and a line break on stderr, escaped.
fn complain(text: impl std::fmt::Display) {
    eprintln!("{}", escaped_lines(&text.to_string()));
}
