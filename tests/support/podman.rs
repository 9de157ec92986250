//! Podman for the container stories: the image built once from the repository's
//! Dockerfile, the podman command line, names unique to one run, and [`Cleanup`], which
//! removes by name everything a story made (containers, pods, volumes, secrets, a played
//! manifest, a compose project) when the story ends, also when it fails.
//!
//! Every name a story gives podman carries [`run_id`]: two runs of the suite on one
//! machine never share a container, pod, volume or secret, and never remove each
//! other's. Podman makes a volume of every ConfigMap a manifest mounts and keeps it (and
//! a claim's) after `kube down`, so a story lists those volumes in its [`Cleanup`].

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const IMAGE: &str = "localhost/portcullis:test";
/// The real MCP server image `tests/container/images.sh` builds.
pub const MCP_IMAGE: &str = "localhost/portcullis-test-mcp:2.3.0";
pub const AGENT_KEY: &str = "agent-container-key";
pub const ADMIN_TOKEN: &str = "admin-container-token";

/// `podman ARGS`, whatever its exit status.
pub fn run(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?} cannot run ({e}): tests/run.sh installs it"))
}

/// `podman ARGS`, which must succeed: its trimmed stdout.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A name part of this run alone: concurrent runs on one machine never share a pod, a
/// volume, a secret or a container. Unique within the process as well (a counter), so
/// two stories of one run never share one either.
pub fn run_id() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:x}{:x}{n}", std::process::id(), nanos & 0xfffff)
}

/// Builds the image from the repository's Dockerfile once per test binary.
pub fn image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let setup = Command::new("bash")
            .arg(Path::new(ROOT).join("tests/container/images.sh"))
            .status()
            .expect("bash runs");
        assert!(setup.success(), "tests/container/images.sh failed");
        let started = Instant::now();
        // The binary this test run was built with goes into the image: the Dockerfile's
        // `host` path, so the dependency tree is not compiled a second time inside it.
        let host = tempfile::tempdir().expect("dir");
        std::fs::copy(
            env!("CARGO_BIN_EXE_portcullis"),
            host.path().join("portcullis"),
        )
        .expect("copy the binary");
        let context = format!("host-binary={}", host.path().display());
        ok(&[
            "build",
            "--format",
            "docker",
            "--network",
            "host",
            "--build-arg",
            "BINARY=host",
            "--build-context",
            &context,
            "--tag",
            IMAGE,
            ROOT,
        ]);
        let size: u64 = ok(&["image", "inspect", "--format", "{{.Size}}", IMAGE])
            .parse()
            .expect("a size");
        println!(
            "image {IMAGE}: {:.1} MiB, built in {:.0} s",
            size as f64 / 1048576.0,
            started.elapsed().as_secs_f64()
        );
    });
    IMAGE
}

/// Everything one story made, removed by name when the story ends, whatever happened:
/// the played manifest (`kube down`), then the containers, pods, volumes and secrets by
/// name, and whatever carries the compose project's label. Each removal is tried whatever the others did; one that finds nothing to
/// remove is fine (the story may have failed before making it).
pub struct Cleanup(pub Made);

/// What a story made, by name; [`Cleanup`] removes it.
#[derive(Default)]
pub struct Made {
    pub manifest: Option<PathBuf>,
    /// A podman-compose project's name (its story runs `down --volumes` itself, with
    /// the environment the compose file requires, before this runs).
    pub compose_project: Option<String>,
    pub containers: Vec<String>,
    pub pods: Vec<String>,
    pub volumes: Vec<String>,
    pub secrets: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let made = &self.0;
        if let Some(manifest) = &made.manifest {
            run(&["kube", "down", &manifest.to_string_lossy()]);
        }
        if let Some(project) = &made.compose_project {
            let label = format!("label=io.podman.compose.project={project}");
            for (list, remove) in [
                (&["ps", "--all"][..], &["rm"][..]),
                (&["pod", "ps"], &["pod", "rm"]),
                (&["volume", "ls"], &["volume", "rm"]),
            ] {
                let found = run(&[list, &["--quiet", "--filter", &label]].concat());
                let ids = String::from_utf8_lossy(&found.stdout).into_owned();
                for id in ids.split_whitespace() {
                    run(&[remove, &["--force", id]].concat());
                }
            }
        }
        for container in &made.containers {
            run(&["rm", "--force", "--time", "0", container]);
        }
        for pod in &made.pods {
            run(&["pod", "rm", "--force", pod]);
        }
        for volume in &made.volumes {
            run(&["volume", "rm", "--force", volume]);
        }
        for secret in &made.secrets {
            run(&["secret", "rm", secret]);
        }
    }
}

/// A Secret manifest's `stringData` as podman's secret store holds it for
/// `secretKeyRef` (podman 4.3): the JSON of the base64 values. It must hold `keys` keys.
pub fn secret_json(secret: &str, keys: usize) -> String {
    use base64::Engine as _;
    let data: serde_json::Map<String, Value> = secret
        .lines()
        .skip_while(|l| l.trim() != "stringData:")
        .skip(1)
        .filter_map(|l| l.trim().split_once(": "))
        .map(|(k, v)| {
            let v = v.trim_matches('"').as_bytes();
            let v = base64::engine::general_purpose::STANDARD.encode(v);
            (k.to_owned(), Value::String(v))
        })
        .collect();
    assert_eq!(data.len(), keys, "the Secret's stringData: {secret}");
    Value::Object(data).to_string()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(portcullis::auth::hash_key(s))
}

/// A file of the repository, as text.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).expect(path)
}

/// Polls `url` until it answers 200; the time it took.
pub async fn ready(url: &str, within: Duration) -> Duration {
    super::init();
    let started = Instant::now();
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    while started.elapsed() < within {
        if let Ok(r) = client.get(url).send().await
            && r.status().is_success()
        {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} was not ready within {within:?}");
}

/// Waits until something accepts connections on 127.0.0.1:`port` (a server in a
/// container: the gateway's /readyz does not probe HTTP upstreams).
pub async fn listening(port: u16, within: Duration) {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < within,
            "nothing listens on 127.0.0.1:{port} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replaces `from` by `to` in `text`, which must contain it: a manifest that no longer
/// has what the test fills in fails here, loudly.
pub fn fill(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the manifest no longer contains {from:?}"
    );
    text.replace(from, to)
}

/// A shipped configuration with its listeners on the ports the test picked on
/// 127.0.0.1, and its upstream on the MCP server's.
pub fn on_loopback(config: &str, gateway: u16, admin: u16, server: u16) -> String {
    let config = fill(
        config,
        "listen = \"0.0.0.0:8080\"",
        &format!("listen = \"127.0.0.1:{gateway}\""),
    );
    let config = fill(
        &config,
        "admin_listen = \"0.0.0.0:9090\"",
        &format!("admin_listen = \"127.0.0.1:{admin}\""),
    );
    fill(
        &config,
        "url = \"http://127.0.0.1:3001/mcp\"",
        &format!("url = \"http://127.0.0.1:{server}/mcp\""),
    )
}
