//! The fleet manifests (`deploy/kubernetes/fleet/`), for real: played with `podman kube
//! play` as three gateway pods (each the gateway image beside a real MCP server container),
//! one Redis pod and one PostgreSQL pod, from images built locally out of Debian's packages
//! (`tests/container/images.sh`). Through the pods: a Python SDK client calls through every
//! replica; a 2026-07-28 approval asked on one replica runs through a second, once, and is
//! refused as used on the others (its nonce is one key in the Redis pod, which refuses
//! clients without the Secret's password), also after Redis restarted (its append-only file
//! is on the claim); the audit rows of all three replicas land in the one PostgreSQL with
//! their pods' names, and one replica's admin API shows them all.
//!
//! The manifests are played from a copy in which only what a cluster would supply is filled
//! in, as the sidecar test does (`container_deploy.rs`): the host network and ports this test picks
//! on 127.0.0.1 (so the named `containerPort`s go and the probes use numbers), the Services'
//! names in the URLs become those ports, the locally built image names, the Secret's values
//! (in podman's own secret store, where 4.3 reads `secretKeyRef`), and names unique to this
//! run. Podman plays `replicas: 3` as three pods, but on the host network all three would
//! bind the same ports: the copy holds three Deployments of one replica, each with a
//! ConfigMap naming its own ports. Podman 4.3 also makes a pod's `emptyDir` a volume named
//! as the manifest names it (`state`), the same one for every pod that names it so, where
//! Kubernetes gives each pod its own: the copy names each replica's, or the three replicas
//! would write one audit spool (which the gateway refuses: one writer per spool). The test
//! adds one rule to the configuration: `admin_reset` needs the user's approval. Everything
//! played is removed when the test ends, whatever happened: `podman kube down`, then the
//! pods, volumes and secret by name.

use crate::support;
use support::fleet::refusal_code;
use support::podman::{
    self, ADMIN_TOKEN, AGENT_KEY, MCP_IMAGE, fill, free_port, listening, on_loopback, read, ready,
    run_id, sha256_hex,
};
use support::tiers::{self, Tier};

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Mode, Sdk, borrow, call, gateway_code, list, modern_call_headers, raw_post, sdk};

const REDIS_IMAGE: &str = "localhost/portcullis-test-redis:7.0";
const POSTGRES_IMAGE: &str = "localhost/portcullis-test-postgres:15";
const APPROVAL_KEY: &str = "fleet-approval-key-of-at-least-32-bytes";
const REDIS_PASSWORD: &str = "redisfleetpassword1";
const POSTGRES_PASSWORD: &str = "postgresfleetpassword1";
const REPLICAS: usize = 3;

/// The Secret's `stringData` with the test's values filled in, as the JSON of base64 values
/// podman's secret store holds for `secretKeyRef`.
fn secret_data() -> String {
    let mut secret = read("deploy/kubernetes/fleet/secret.yaml");
    for (from, to) in [
        ("replace-with-64-hex-characters", sha256_hex(ADMIN_TOKEN)),
        ("replace-with-the-agent-api-key", AGENT_KEY.to_owned()),
        (
            "replace-with-at-least-32-random-bytes",
            APPROVAL_KEY.to_owned(),
        ),
        ("replace-with-the-redis-password", REDIS_PASSWORD.to_owned()),
        (
            "replace-with-the-postgres-password",
            POSTGRES_PASSWORD.to_owned(),
        ),
    ] {
        secret = fill(&secret, &format!("\"{from}\""), &format!("\"{to}\""));
    }
    podman::secret_json(&secret, 5)
}

/// Ports this test picked on 127.0.0.1.
struct Ports {
    redis: u16,
    postgres: u16,
    /// Per replica: (MCP listener, admin listener, MCP server).
    replicas: Vec<(u16, u16, u16)>,
}

/// A pod spec on the host network.
fn on_host_network(manifest: &str, spec_starts: &str) -> String {
    fill(
        manifest,
        spec_starts,
        &spec_starts.replacen("    spec:\n", "    spec:\n      hostNetwork: true\n", 1),
    )
}

/// The manifest podman plays: Redis, PostgreSQL, then each replica's ConfigMap and
/// Deployment, and the network policies (which podman does not apply).
fn manifest_text(run: &str, ports: &Ports, gateway_image: &str) -> String {
    let secrets = format!("portcullis-fleet-secrets-{run}");
    let mut redis = read("deploy/kubernetes/fleet/redis.yaml");
    redis = fill(&redis, "portcullis-fleet-secrets", &secrets);
    redis = fill(
        &redis,
        "portcullis-redis",
        &format!("portcullis-redis-{run}"),
    );
    redis = fill(&redis, "docker.io/library/redis:7.0-bookworm", REDIS_IMAGE);
    redis = fill(
        &redis,
        "exec redis-server ",
        &format!("exec redis-server --port {} --bind 127.0.0.1 ", ports.redis),
    );
    redis = fill(
        &redis,
        "          ports:\n            - name: redis\n              containerPort: 6379\n",
        "",
    );
    redis = on_host_network(&redis, "    spec:\n      securityContext:\n");

    let mut postgres = read("deploy/kubernetes/fleet/postgres.yaml");
    postgres = fill(&postgres, "portcullis-fleet-secrets", &secrets);
    postgres = fill(
        &postgres,
        "portcullis-postgres",
        &format!("portcullis-postgres-{run}"),
    );
    postgres = fill(
        &postgres,
        "          image: docker.io/library/postgres:15-bookworm\n",
        &format!(
            "          image: {POSTGRES_IMAGE}\n          args: [\"-p\", \"{}\", \"-c\", \"listen_addresses=127.0.0.1\"]\n",
            ports.postgres
        ),
    );
    postgres = fill(
        &postgres,
        "[\"pg_isready\", ",
        &format!("[\"pg_isready\", \"-p\", \"{}\", ", ports.postgres),
    );
    postgres = fill(
        &postgres,
        "          ports:\n            - name: postgres\n              containerPort: 5432\n",
        "",
    );
    postgres = on_host_network(&postgres, "    spec:\n      securityContext:\n");

    let mut docs = vec![redis, postgres];
    for (i, &(gateway, admin, server)) in ports.replicas.iter().enumerate() {
        let config_name = format!("portcullis-fleet-config-{run}-{i}");
        let mut configmap = read("deploy/kubernetes/fleet/configmap.yaml");
        configmap = on_loopback(&configmap, gateway, admin, server);
        configmap = fill(&configmap, "portcullis-fleet-config", &config_name);
        configmap = fill(
            &configmap,
            "@portcullis-redis:6379",
            &format!("@127.0.0.1:{}", ports.redis),
        );
        configmap = fill(
            &configmap,
            "@portcullis-postgres:5432/",
            &format!("@127.0.0.1:{}/", ports.postgres),
        );
        // The one rule the test adds: a write that needs the user's approval.
        configmap = fill(
            &configmap,
            "    [state]\n",
            "    [[rules]]\n    clients = [\"agent\"]\n    servers = [\"tools\"]\n    \
             tools = [\"admin_reset\"]\n    action = \"allow\"\n    \
             approval = { by = \"user\", timeout = \"5m\", reason = \"resets all data\" }\n    \n    [state]\n",
        );
        let mut gateway_yaml = read("deploy/kubernetes/fleet/gateway.yaml");
        gateway_yaml = fill(&gateway_yaml, "portcullis-fleet-secrets", &secrets);
        gateway_yaml = fill(&gateway_yaml, "portcullis-fleet-config", &config_name);
        gateway_yaml = fill(
            &gateway_yaml,
            "  name: portcullis-fleet\n",
            &format!("  name: portcullis-fleet-{run}-{i}\n"),
        );
        gateway_yaml = fill(&gateway_yaml, "  replicas: 3\n", "  replicas: 1\n");
        // Podman 4.3 makes an `emptyDir` a volume named as the manifest names it, one for
        // every pod that names it so: each replica's spool and pins must be its own.
        gateway_yaml = fill(
            &gateway_yaml,
            "- name: state\n",
            &format!("- name: {}\n", state_volume(run, i)),
        );
        gateway_yaml = fill(
            &gateway_yaml,
            "ghcr.io/example/portcullis:latest",
            gateway_image,
        );
        gateway_yaml = fill(
            &gateway_yaml,
            "image: ghcr.io/example/mcp-server:latest",
            &format!("image: {MCP_IMAGE}\n          args: [\"--port\", \"{server}\"]"),
        );
        gateway_yaml = fill(
            &gateway_yaml,
            "      terminationGracePeriodSeconds: 30",
            "      hostNetwork: true\n      terminationGracePeriodSeconds: 30",
        );
        gateway_yaml = fill(
            &gateway_yaml,
            "          ports:\n            - name: mcp\n              containerPort: 8080\n            - name: admin\n              containerPort: 9090\n",
            "",
        );
        gateway_yaml = fill(&gateway_yaml, "port: admin", &format!("port: {admin}"));
        docs.push(configmap);
        docs.push(gateway_yaml);
    }
    docs.push(read("deploy/kubernetes/fleet/networkpolicy.yaml"));
    docs.join("\n---\n")
}

/// The volume podman makes of replica `i`'s `emptyDir` (its audit spool and pins).
fn state_volume(run: &str, i: usize) -> String {
    format!("portcullis-fleet-state-{run}-{i}")
}

/// A 2026-07-28 `tools/call` of `admin_reset` from a client that declares elicitation,
/// with `extra` merged into its params (an answer and its `requestState`).
fn admin_reset(id: u64, extra: Value) -> String {
    let mut params = json!({"name": "admin_reset", "arguments": {}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}});
    if let (Value::Object(p), Value::Object(e)) = (&mut params, extra) {
        p.extend(e);
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

/// Sends `body` as the agent to `url`; the JSON-RPC result.
async fn post(url: &str, body: String) -> Value {
    let headers = modern_call_headers(AGENT_KEY, "admin_reset");
    let raw = raw_post(url, &borrow(&headers), body).await;
    assert_eq!(raw.status, 200, "{}", raw.text);
    raw.body["result"].clone()
}

/// `psql` in the PostgreSQL pod's container: the rows, one line each, fields split on `|`.
fn psql(container: &str, port: u16, sql: &str) -> Vec<Vec<String>> {
    let out = Command::new("podman")
        .args(["exec", container, "psql", "-p", &port.to_string()])
        .args(["-U", "portcullis", "-d", "audit", "-X", "-A", "-t", "-q"])
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("podman runs");
    assert!(
        out.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_manifests_play_three_replicas_sharing_one_redis_and_one_postgres() {
    if !tiers::ready(&[Tier::Python, Tier::Podman]) {
        return;
    }
    let gateway_image = tokio::task::spawn_blocking(podman::image)
        .await
        .expect("built");
    for local in [REDIS_IMAGE, POSTGRES_IMAGE] {
        assert!(
            podman::run(&["image", "exists", local]).status.success(),
            "{local} is missing: tests/container/images.sh builds it"
        );
    }
    let run = run_id();
    let ports = Ports {
        redis: free_port(),
        postgres: free_port(),
        replicas: (0..REPLICAS)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect(),
    };
    let dir = tempfile::tempdir().expect("dir");
    let manifest = dir.path().join("fleet.yaml");
    std::fs::write(&manifest, manifest_text(&run, &ports, gateway_image)).expect("write");
    let secret_file = dir.path().join("secret.json");
    std::fs::write(&secret_file, secret_data()).expect("write");
    // Podman names a Deployment's pods NAME-pod-N; a replica's name is its pod's.
    let gateways: Vec<String> = (0..REPLICAS)
        .map(|i| format!("portcullis-fleet-{run}-{i}-pod-0"))
        .collect();
    let redis_pod = format!("portcullis-redis-{run}-pod-0");
    let postgres_pod = format!("portcullis-postgres-{run}-pod-0");
    let secret = format!("portcullis-fleet-secrets-{run}");
    let played = podman::Cleanup(podman::Made {
        manifest: Some(manifest.clone()),
        pods: gateways
            .iter()
            .chain([&redis_pod, &postgres_pod])
            .cloned()
            .collect(),
        // The claims, and the volumes podman makes of the ConfigMaps (`kube down` keeps both)
        // and of each replica's `emptyDir`.
        volumes: [
            format!("portcullis-redis-{run}-data"),
            format!("portcullis-postgres-{run}-data"),
        ]
        .into_iter()
        .chain((0..REPLICAS).map(|i| format!("portcullis-fleet-config-{run}-{i}")))
        .chain((0..REPLICAS).map(|i| state_volume(&run, i)))
        .collect(),
        secrets: vec![secret.clone()],
        ..Default::default()
    });
    podman::ok(&["secret", "create", &secret, &secret_file.to_string_lossy()]);
    let started = Instant::now();
    podman::ok(&[
        "kube",
        "play",
        "--network",
        "host",
        &manifest.to_string_lossy(),
    ]);
    for &(_, admin, server) in &ports.replicas {
        ready(
            &format!("http://127.0.0.1:{admin}/readyz"),
            Duration::from_secs(120),
        )
        .await;
        listening(server, Duration::from_secs(120)).await;
    }
    listening(ports.postgres, Duration::from_secs(120)).await;
    println!(
        "fleet played to ready (3 gateway pods, Redis, PostgreSQL): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let urls: Vec<String> = ports
        .replicas
        .iter()
        .map(|(gateway, _, _)| format!("http://127.0.0.1:{gateway}/mcp/tools"))
        .collect();

    // Every replica lists, calls, and refuses a call that breaks the schema (never run).
    for (i, url) in urls.iter().enumerate() {
        let text = format!("through replica {i}");
        let results = sdk(
            Sdk::Python,
            Mode::Modern,
            url,
            AGENT_KEY,
            json!([
                list(),
                call("echo", json!({"text": text})),
                call("book_flight", json!({"passengers": 99}))
            ]),
        )
        .await;
        assert!(
            results[0]["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|n| n == "admin_reset")),
            "replica {i}: {}",
            results[0]
        );
        assert_eq!(results[1]["isError"], false, "replica {i}: {}", results[1]);
        assert!(
            results[1]["text"]
                .as_str()
                .is_some_and(|t| t.contains(&text)),
            "replica {i}: {}",
            results[1]
        );
        assert_eq!(
            gateway_code(&results[2]),
            Some("invalid_arguments"),
            "replica {i}: {}",
            results[2]
        );
    }

    // An approval asked on replica 0 runs through replica 1, once; replayed anywhere it is
    // refused as used: its nonce is in the one Redis.
    let asked = post(&urls[0], admin_reset(1, json!({}))).await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let state = asked["requestState"].as_str().expect("a state").to_owned();
    let yes = json!({"requestState": state, "inputResponses": {"portcullis_approval":
        {"action": "accept", "content": {"approve": true}}}});
    let ran = post(&urls[1], admin_reset(2, yes.clone())).await;
    assert_eq!(ran["isError"], false, "approved through replica 1: {ran}");
    for (url, id) in [(&urls[2], 3), (&urls[0], 4), (&urls[1], 5)] {
        let replayed = post(url, admin_reset(id, yes.clone())).await;
        assert_eq!(refusal_code(&replayed), "approval_used", "{replayed}");
    }
    let redis = format!("{redis_pod}-redis");
    let redis_port = ports.redis.to_string();
    let keys = podman::ok(&[
        "exec",
        &redis,
        "redis-cli",
        "-p",
        &redis_port,
        "-a",
        REDIS_PASSWORD,
        "--no-auth-warning",
        "KEYS",
        "portcullis:mcp-tools:nonce:*",
    ]);
    assert_eq!(keys.lines().count(), 1, "one used nonce: {keys:?}");
    // Without the Secret's password Redis answers nothing else.
    let anonymous = podman::ok(&["exec", &redis, "redis-cli", "-p", &redis_port, "KEYS", "*"]);
    assert!(anonymous.contains("NOAUTH"), "{anonymous:?}");

    // The used nonce outlives a restart of Redis (its append-only file is on the claim). Redis
    // is shut down from inside and comes back by the pod's restart policy, as a crashed
    // container does under a kubelet (stopping and starting it from outside races with that
    // policy in podman). Once the replica has reconnected, the replay is still refused as used.
    let _ = podman::run(&[
        "exec",
        &redis,
        "redis-cli",
        "-p",
        &redis_port,
        "-a",
        REDIS_PASSWORD,
        "--no-auth-warning",
        "SHUTDOWN",
    ]);
    // Until Redis is back a replay is refused unused (`state_unavailable`); the restart count
    // is read after each replay, so the first one Redis answers again ends the loop.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut after_restart = Value::Null;
    for _ in 0..240 {
        after_restart = post(&urls[2], admin_reset(6, yes.clone())).await;
        let restarts = podman::ok(&["inspect", "--format", "{{.RestartCount}}", &redis]);
        let back = restarts.parse::<u32>().is_ok_and(|n| n >= 1);
        if (back && refusal_code(&after_restart) != "state_unavailable")
            || Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if refusal_code(&after_restart) != "approval_used" {
        let logs = |c: &str| {
            let out = podman::run(&["logs", "--tail", "30", c]);
            format!(
                "{c}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        panic!(
            "after Redis restarted: {after_restart}\n{}\n{}",
            logs(&redis),
            logs(&format!("{}-portcullis", gateways[2]))
        );
    }

    // The audit rows of all three replicas, in the one PostgreSQL, with their pods' names.
    let postgres = format!("{postgres_pod}-postgres");
    let sql = "SELECT replica, tool, decision FROM portcullis_events \
               WHERE method = 'tools/call' ORDER BY id";
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rows = Vec::new();
    for _ in 0..240 {
        rows = psql(&postgres, ports.postgres, sql);
        let shipped = gateways.iter().all(|g| {
            rows.iter()
                .any(|r| r[0] == *g && r[1] == "echo" && r[2] == "forwarded")
        }) && rows
            .iter()
            .filter(|r| r[1] == "admin_reset" && r[2] != "state_unavailable")
            .count()
            >= 6;
        if shipped || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for g in &gateways {
        assert!(
            rows.iter()
                .any(|r| r[0] == *g && r[1] == "echo" && r[2] == "forwarded"),
            "no forwarded echo of {g}: {rows:?}"
        );
        assert!(
            rows.iter()
                .any(|r| r[0] == *g && r[1] == "book_flight" && r[2] == "invalid_arguments"),
            "no refusal of {g}: {rows:?}"
        );
    }
    // Asked on 0, run on 1, refused as used on 2, 0, 1 and (after Redis restarted) 2, leaving
    // aside refusals while the replica reconnected: in shipping order, so sorted.
    let mut resets: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r[1] == "admin_reset" && r[2] != "state_unavailable")
        .map(|r| (r[0].as_str(), r[2].as_str()))
        .collect();
    resets.sort_unstable();
    let mut expected = vec![
        (gateways[0].as_str(), "approval_asked"),
        (gateways[1].as_str(), "forwarded"),
        (gateways[2].as_str(), "approval_used"),
        (gateways[0].as_str(), "approval_used"),
        (gateways[1].as_str(), "approval_used"),
        (gateways[2].as_str(), "approval_used"),
    ];
    expected.sort_unstable();
    assert_eq!(
        resets, expected,
        "the approved reset ran once, through replica 1"
    );

    // Any replica's admin API reads the fleet's audit: replica 2 shows all three.
    let events: Value = serde_json::from_str(
        &support::http()
            .get(format!(
                "http://127.0.0.1:{}/api/events",
                ports.replicas[2].1
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answers")
            .text()
            .await
            .expect("a body"),
    )
    .expect("JSON");
    let text = events.to_string();
    for g in &gateways {
        assert!(text.contains(g.as_str()), "{g} missing from /api/events");
    }
    drop(played);
}
