//! The shipped deployments, for real: the Kubernetes manifests (`deploy/kubernetes/`)
//! played with `podman kube play` as the sidecar pod, and the compose file
//! (`deploy/compose/`) brought up with podman-compose, each with the gateway image beside
//! a real MCP server container, through which Python SDK clients list, call, and have a
//! call that breaks the schema refused.
//!
//! Both are run from a copy in which only the ports, the loopback addresses, the image
//! names, the secrets' values and the names are filled in: every name is of this run
//! alone ([`podman::run_id`]), so concurrent runs never clash, and everything made is
//! removed by name when the test ends, whatever happened ([`podman::Cleanup`]): the pod,
//! the secret, and the volumes podman makes of the ConfigMap (which `kube down` keeps)
//! and of the `emptyDir` (podman 4.3 names it as the manifest does, so it is renamed too:
//! two runs' pods would otherwise share one pin store).

use crate::support;
use support::podman::{
    self, ADMIN_TOKEN, AGENT_KEY, MCP_IMAGE, fill, free_port, listening, on_loopback, read, ready,
    sha256_hex,
};
use support::tiers::{self, Tier};

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Mode, Sdk, call, gateway_code, list, sdk};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_manifests_play_as_a_sidecar_pod() {
    if !tiers::ready(&[Tier::Python, Tier::Podman]) {
        return;
    }
    let image = tokio::task::spawn_blocking(podman::image)
        .await
        .expect("built");
    let (gateway, admin, server) = (free_port(), free_port(), free_port());
    // The names the manifests give, made this run's own: the ConfigMap (and so the
    // volume podman makes of it), the Secret, the Deployment (and so its pod), and the
    // `emptyDir` (podman 4.3 makes it a volume named as the manifest names it).
    let run = podman::run_id();
    let (config_name, secret_name, deployment_name, pins_name) = (
        format!("portcullis-config-{run}"),
        format!("portcullis-secrets-{run}"),
        format!("mcp-tools-{run}"),
        format!("portcullis-pins-{run}"),
    );
    let mut configmap = on_loopback(
        &read("deploy/kubernetes/configmap.yaml"),
        gateway,
        admin,
        server,
    );
    configmap = fill(
        &configmap,
        "  name: portcullis-config\n",
        &format!("  name: {config_name}\n"),
    );
    let secret = fill(
        &fill(
            &read("deploy/kubernetes/secret.yaml"),
            "\"replace-with-64-hex-characters\"",
            &format!("\"{}\"", sha256_hex(ADMIN_TOKEN)),
        ),
        "\"replace-with-the-agent-api-key\"",
        &format!("\"{AGENT_KEY}\""),
    );
    let mut deployment = read("deploy/kubernetes/deployment.yaml");
    deployment = fill(
        &deployment,
        "  name: mcp-tools\n",
        &format!("  name: {deployment_name}\n"),
    );
    deployment = fill(
        &deployment,
        "name: portcullis-config\n",
        &format!("name: {config_name}\n"),
    );
    deployment = fill(
        &deployment,
        "name: portcullis-secrets\n",
        &format!("name: {secret_name}\n"),
    );
    deployment = fill(
        &deployment,
        "- name: pins\n",
        &format!("- name: {pins_name}\n"),
    );
    deployment = fill(&deployment, "ghcr.io/example/portcullis:latest", image);
    deployment = fill(
        &deployment,
        "image: ghcr.io/example/mcp-server:latest",
        &format!("image: {MCP_IMAGE}\n          args: [\"--port\", \"{server}\"]"),
    );
    // The pod's network is the host's here (no bridge networks on these machines), where
    // podman refuses port mappings: the listeners' own addresses are the pod's ports.
    deployment = fill(
        &deployment,
        "      terminationGracePeriodSeconds: 30",
        "      hostNetwork: true\n      terminationGracePeriodSeconds: 30",
    );
    deployment = fill(
        &deployment,
        "          ports:\n            - name: mcp\n              containerPort: 8080\n            - name: admin\n              containerPort: 9090\n",
        "",
    );
    // The probes name the admin port by its number once the named ports are gone.
    deployment = deployment.replace("port: admin", &format!("port: {admin}"));
    let dir = tempfile::tempdir().expect("dir");
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(&manifest, format!("{configmap}\n---\n{deployment}")).expect("write");
    // Podman names a Deployment's pods NAME-pod-N and keeps the ConfigMap's volume.
    let _cleanup = podman::Cleanup(podman::Made {
        manifest: Some(manifest.clone()),
        pods: vec![format!("{deployment_name}-pod-0")],
        volumes: vec![config_name, pins_name],
        secrets: vec![secret_name.clone()],
        ..Default::default()
    });
    // podman 4.3 resolves `secretKeyRef` in its own secret store, where a secret holds the
    // Secret's `data` (base64 values); it is made here from the manifest's stringData.
    let secret_file = dir.path().join("secret.json");
    std::fs::write(&secret_file, podman::secret_json(&secret, 2)).expect("write");
    podman::ok(&[
        "secret",
        "create",
        &secret_name,
        &secret_file.to_string_lossy(),
    ]);
    let started = Instant::now();
    podman::ok(&[
        "kube",
        "play",
        "--network",
        "host",
        &manifest.to_string_lossy(),
    ]);
    let to_ready = ready(
        &format!("http://127.0.0.1:{admin}/readyz"),
        Duration::from_secs(90),
    )
    .await;
    println!(
        "pod played to ready: {:.1} s (readyz polling {:.1} s)",
        started.elapsed().as_secs_f64(),
        to_ready.as_secs_f64()
    );
    listening(server, Duration::from_secs(90)).await;
    let url = format!("http://127.0.0.1:{gateway}/mcp/tools");
    for mode in [Mode::Legacy, Mode::Modern] {
        lists_calls_and_refuses(&url, mode).await;
    }
    // The admin listener needs the token from the Secret for its API.
    support::init();
    let client = support::http();
    let events = format!("http://127.0.0.1:{admin}/api/events");
    let anonymous = client.get(&events).send().await.expect("answers");
    assert_eq!(anonymous.status().as_u16(), 401);
    let authorized: Value = serde_json::from_str(
        &client
            .get(&events)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answers")
            .text()
            .await
            .expect("a body"),
    )
    .expect("JSON");
    assert!(
        authorized.to_string().contains("book_flight"),
        "{authorized}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_file_comes_up_with_podman_compose() {
    if !tiers::ready(&[Tier::Python, Tier::Podman]) {
        return;
    }
    let image = tokio::task::spawn_blocking(podman::image)
        .await
        .expect("built");
    let compose = support::peers_dir().join("compose-venv/bin/podman-compose");
    assert!(
        compose.exists(),
        "podman-compose is missing: tests/container/images.sh installs it"
    );
    let (gateway, admin, server) = (free_port(), free_port(), free_port());
    let config = on_loopback(
        &read("deploy/compose/portcullis.toml"),
        gateway,
        admin,
        server,
    );
    let mut file = read("deploy/compose/compose.yaml");
    // The server: the real MCP server image, on the host's network (no bridge networks
    // here, where podman refuses published ports); Portcullis joins its namespace as written.
    file = fill(
        &file,
        "    image: node:22-bookworm-slim\n    command: [\"npx\", \"-y\", \"@modelcontextprotocol/server-everything\", \"streamableHttp\"]\n    environment:\n      PORT: \"3001\"\n    ports:\n      # The namespace is shared: these are Portcullis's ports, published here.\n      - \"8080:8080\"\n      - \"9090:9090\"\n",
        &format!(
            "    image: {MCP_IMAGE}\n    command: [\"--port\", \"{server}\"]\n    network_mode: host\n"
        ),
    );
    file = fill(
        &file,
        "    build:\n      context: ../..\n",
        &format!("    image: {image}\n"),
    );
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("portcullis.toml"), config).expect("write");
    std::fs::write(dir.path().join("compose.yaml"), file).expect("write");
    let project = format!("portcullis-test-{}", podman::run_id());
    let run = |args: &[&str]| {
        Command::new(&compose)
            .args(["--project-name", &project, "--file"])
            .arg(dir.path().join("compose.yaml"))
            .args(args)
            .env("PORTCULLIS_ADMIN_TOKEN_SHA256", sha256_hex(ADMIN_TOKEN))
            .env("AGENT_KEY", AGENT_KEY)
            .output()
            .expect("podman-compose runs")
    };
    // What podman-compose makes is named after the project: its containers, its pod,
    // and the named volume.
    let _cleanup = podman::Cleanup(podman::Made {
        compose_project: Some(project.clone()),
        containers: ["mcp-server", "portcullis"]
            .map(|service| format!("{project}_{service}_1"))
            .to_vec(),
        pods: vec![format!("pod_{project}")],
        volumes: vec![format!("{project}_portcullis-pins")],
        ..Default::default()
    });
    // Dropped before the removals by name: podman-compose's own `down` first.
    struct Down<F: Fn()>(F);
    impl<F: Fn()> Drop for Down<F> {
        fn drop(&mut self) {
            (self.0)();
        }
    }
    let _down = Down(|| {
        run(&["down", "--volumes", "--timeout", "5"]);
    });
    let up = run(&["up", "--detach"]);
    assert!(
        up.status.success(),
        "podman-compose up: {}{}",
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&up.stderr)
    );
    ready(
        &format!("http://127.0.0.1:{admin}/readyz"),
        Duration::from_secs(90),
    )
    .await;
    listening(server, Duration::from_secs(90)).await;
    let url = format!("http://127.0.0.1:{gateway}/mcp/tools");
    lists_calls_and_refuses(&url, Mode::Modern).await;
}

/// A Python SDK client of `mode` lists the tools, calls one, and has a call that
/// breaks the advertised schema refused.
async fn lists_calls_and_refuses(url: &str, mode: Mode) {
    let results = sdk(
        Sdk::Python,
        mode,
        url,
        AGENT_KEY,
        json!([
            list(),
            call("echo", json!({"text": "through the deployment"})),
            call("book_flight", json!({"passengers": 99}))
        ]),
    )
    .await;
    assert!(
        results[0]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{mode:?}: {}",
        results[0]
    );
    assert_eq!(
        results[1]["isError"],
        json!(false),
        "{mode:?}: {}",
        results[1]
    );
    assert_eq!(
        gateway_code(&results[2]),
        Some("invalid_arguments"),
        "{mode:?}: {}",
        results[2]
    );
}
