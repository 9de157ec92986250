//! The sidecar packaging: the example configurations under `deploy/` pass
//! `portcullis check`, the manifests agree with the Dockerfile (ports, config
//! path, probes), and `portcullis health` is the container's health check.
//! The image itself is built and run with podman in `tests/suite/container.rs`.

use crate::support;

use std::fs;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_portcullis");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn check(path: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["check", "--config"])
        .arg(path)
        .env("PORTCULLIS_ADMIN_TOKEN_SHA256", "ab".repeat(32))
        .env("AGENT_KEY", "agent-key")
        .output()
        .expect("the binary runs")
}

/// The TOML embedded in a ConfigMap (`portcullis.toml: |` block).
fn configmap_toml(path: &str) -> String {
    let yaml = read(path);
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim() != "portcullis.toml: |");
    lines.next().expect("the ConfigMap holds portcullis.toml");
    let block: Vec<&str> = lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .collect();
    let mut text = block
        .iter()
        .map(|l| l.strip_prefix("    ").unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    text.push('\n');
    text
}

#[test]
fn the_deploy_configs_pass_check() {
    let compose = Path::new(ROOT).join("deploy/compose/portcullis.toml");
    let out = check(&compose);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().expect("dir");
    let k8s = dir.path().join("portcullis.toml");
    fs::write(&k8s, configmap_toml("deploy/kubernetes/configmap.yaml")).expect("write");
    let out = check(&k8s);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        configmap_toml("deploy/kubernetes/configmap.yaml"),
        read("deploy/compose/portcullis.toml"),
        "the ConfigMap and the compose example hold the same configuration"
    );
}

#[test]
fn the_manifests_agree_with_the_dockerfile() {
    let docker = read("Dockerfile");
    let config = read("deploy/compose/portcullis.toml");
    let deployment = read("deploy/kubernetes/deployment.yaml");
    let service: String = read("deploy/kubernetes/service.yaml")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let compose = read("deploy/compose/compose.yaml");
    // Ports: the config's listeners, the image's EXPOSE, the pod's containerPorts.
    assert!(config.contains("listen = \"0.0.0.0:8080\""));
    assert!(config.contains("admin_listen = \"0.0.0.0:9090\""));
    assert!(docker.contains("EXPOSE 8080 9090"));
    assert!(
        deployment.contains("containerPort: 8080") && deployment.contains("containerPort: 9090")
    );
    assert!(compose.contains("\"8080:8080\"") && compose.contains("\"9090:9090\""));
    // Only the MCP port is in the Service.
    assert!(
        service.contains("port: 8080") && !service.contains("9090") && !service.contains("admin")
    );
    // The configuration path.
    let path = "/etc/portcullis/portcullis.toml";
    assert!(docker.contains(path) && deployment.contains(path) && compose.contains(path));
    assert!(deployment.contains("mountPath: /etc/portcullis\n"));
    // Health: the image's check and the probes hit the admin listener.
    // (`portcullis health` probes the admin listener of PORTCULLIS_CONFIG).
    assert!(docker.contains("CMD [\"/usr/local/bin/portcullis\", \"health\"]"));
    assert!(docker.contains("ENV PORTCULLIS_CONFIG=/etc/portcullis/portcullis.toml"));
    assert!(compose.contains("test: [\"CMD\", \"/usr/local/bin/portcullis\", \"health\"]"));
    assert!(deployment.contains("path: /readyz") && deployment.contains("path: /healthz"));
    // The pin store is writable by the non-root user.
    assert!(config.contains("database = \"/var/lib/portcullis/pins.db\""));
    assert!(
        docker.contains("USER 10001:10001")
            && docker.contains("chown 10001:10001 /rootfs/var/lib/portcullis")
            && docker.contains("VOLUME /var/lib/portcullis")
    );
    assert!(deployment.contains("mountPath: /var/lib/portcullis"));
    // Admin off loopback needs the token; it comes from the Secret.
    assert!(config.contains("admin_token_sha256 = \"${PORTCULLIS_ADMIN_TOKEN_SHA256}\""));
    assert!(
        deployment.contains("name: PORTCULLIS_ADMIN_TOKEN_SHA256")
            && deployment.contains("secretKeyRef")
    );
}

/// The fleet variant (`deploy/kubernetes/fleet/`): its configuration passes `portcullis
/// check` with the environment its Deployment gives, every `${VAR}` it reads is in that
/// environment, and every Secret key a manifest names is in the example Secret. It is
/// played with podman in `tests/suite/container_fleet.rs`.
#[test]
fn the_fleet_manifests_agree_with_each_other() {
    let toml = configmap_toml("deploy/kubernetes/fleet/configmap.yaml");
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("portcullis.toml");
    fs::write(&path, &toml).expect("write");
    let out = Command::new(BIN)
        .args(["check", "--config"])
        .arg(&path)
        .env("PORTCULLIS_ADMIN_TOKEN_SHA256", "ab".repeat(32))
        .env("AGENT_KEY", "agent-key")
        .env("POD_NAME", "portcullis-fleet-0")
        .env("PORTCULLIS_APPROVAL_KEY", "k".repeat(32))
        .env("REDIS_PASSWORD", "redispassword")
        .env("PGPASSWORD", "pgpassword")
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for shared in [
        "backend = \"redis\"",
        "backend = \"postgres\"",
        "replica = \"${POD_NAME}\"",
    ] {
        assert!(
            toml.contains(shared),
            "the fleet configuration sets {shared}"
        );
    }
    let gateway = read("deploy/kubernetes/fleet/gateway.yaml");
    assert!(gateway.contains("  replicas: 3\n"));
    assert!(gateway.contains("fieldPath: metadata.name"));
    let mut rest = toml.as_str();
    while let Some(start) = rest.find("${") {
        let end = rest[start..].find('}').expect("a closed ${") + start;
        let var = &rest[start + 2..end];
        assert!(
            gateway.contains(&format!("- name: {var}\n")),
            "the gateway's environment lacks {var}"
        );
        rest = &rest[end..];
    }
    let secret = read("deploy/kubernetes/fleet/secret.yaml");
    for file in ["gateway.yaml", "redis.yaml", "postgres.yaml"] {
        let yaml = read(&format!("deploy/kubernetes/fleet/{file}"));
        for key in yaml.lines().filter_map(|l| l.trim().strip_prefix("key: ")) {
            assert!(
                secret.contains(&format!("\n  {key}: ")),
                "{file} names the Secret key {key}, which secret.yaml lacks"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_exits_0_on_a_live_admin_listener_and_1_otherwise() {
    let up = support::upstreams::InProcess::demo().await;
    let gw = support::TestGateway::start(&[("s", &up.url)], &support::clients()).await;
    let url = format!("{}/healthz", gw.admin_url());
    let ok = tokio::process::Command::new(BIN)
        .args(["health", "--url", &url])
        .status()
        .await
        .expect("runs");
    assert!(ok.success());
    gw.stop().await;
    let down = tokio::process::Command::new(BIN)
        .args(["health", "--url", &url])
        .output()
        .await
        .expect("runs");
    assert_eq!(down.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&down.stderr).starts_with("unhealthy: "));
}

/// Without `--url`, `portcullis health` probes the admin listener the configuration
/// names, on loopback when it listens on every address: the image's health check
/// follows whatever port the operator configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_finds_the_admin_listener_in_the_configuration() {
    let up = support::upstreams::InProcess::demo().await;
    let gw = support::TestGateway::start(&[("s", &up.url)], &support::clients()).await;
    let port = gw
        .admin_url()
        .rsplit(':')
        .next()
        .expect("a port")
        .to_owned();
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("portcullis.toml");
    fs::write(
        &config,
        format!(
            "[gateway]\nadmin_listen = \"0.0.0.0:{port}\"\nadmin_token_sha256 = \"{}\"\n[servers.s]\nurl = \"{}\"\n",
            "ab".repeat(32),
            up.url
        ),
    )
    .expect("write");
    let ok = tokio::process::Command::new(BIN)
        .arg("health")
        .env("PORTCULLIS_CONFIG", &config)
        .status()
        .await
        .expect("runs");
    assert!(ok.success());
    gw.stop().await;
    let down = tokio::process::Command::new(BIN)
        .args(["health", "--config"])
        .arg(&config)
        .output()
        .await
        .expect("runs");
    assert_eq!(down.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&down.stderr);
    assert!(
        stderr.contains(&format!("http://127.0.0.1:{port}/healthz")),
        "{stderr}"
    );
}
