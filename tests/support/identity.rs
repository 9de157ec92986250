//! Upstream identity: a real OAuth authorization server (oidc-provider,
//! `tests/peers/authz_server.mjs`), an official Python SDK server that says
//! whom it verified (`tests/peers/py_identity_server.py`), and the gateway's
//! signing keys made on the spot.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::peers::recorded;
use super::{http, peers_dir, repo, require};

/// The audience the authorization server's tokens name for the gateway
/// (its resource URL: every server and the merged view).
pub const GATEWAY_AUDIENCE: &str = "https://gateway.test/mcp";

/// Reads `LISTENING <port>` from a child's stdout, then keeps draining it.
async fn announced(child: &mut Child, what: &str) -> u16 {
    let stdout = child.stdout.take().expect("stdout");
    tokio::time::timeout(Duration::from_secs(60), async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(p) = line.strip_prefix("LISTENING ") {
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return p.trim().parse::<u16>().ok();
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("{what} did not announce its port"))
}

/// The authorization server, stopped by its PID when dropped.
#[derive(Debug)]
pub struct AuthServer {
    child: Child,
    /// `http://127.0.0.1:P`: the issuer; `/token`, `/jwks` beneath it.
    pub issuer: String,
}

impl AuthServer {
    /// Starts it; `gateway_key` (a PEM file) registers the `private_key_jwt` client.
    pub async fn start(gateway_key: Option<&Path>) -> Self {
        let peers = peers_dir();
        require(
            peers.join("authz/node_modules/oidc-provider"),
            "oidc-provider (the authorization server)",
        );
        let mut cmd = Command::new("node");
        cmd.arg(repo("tests/peers/authz_server.mjs"))
            .args(["--port", "0"]);
        if let Some(key) = gateway_key {
            cmd.arg("--gateway-key").arg(key);
        }
        cmd.env("PORTCULLIS_PEERS", &peers)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("the authorization server starts");
        let port = announced(&mut child, "the authorization server").await;
        Self {
            child,
            issuer: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Its token endpoint.
    pub fn token_endpoint(&self) -> String {
        format!("{}/token", self.issuer)
    }

    /// `[auth.jwt]` accepting its tokens for [`GATEWAY_AUDIENCE`].
    pub fn auth_jwt(&self) -> String {
        format!(
            "[auth.jwt]\nissuer = \"{}\"\naudience = \"{GATEWAY_AUDIENCE}\"\njwks_url = \"{}/jwks\"\n",
            self.issuer, self.issuer
        )
    }

    /// A JWT access token of `client` (alice, bob, carol) for the gateway.
    pub async fn sign_in(&self, client: &str) -> String {
        let response = http()
            .post(self.token_endpoint())
            .basic_auth(client, Some(format!("{client}-secret")))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&scope=mcp%3Atools&resource={}",
                "https%3A%2F%2Fgateway.test%2Fmcp"
            ))
            .send()
            .await
            .expect("token request");
        let text = response.text().await.expect("token answer");
        let body: Value = serde_json::from_str(&text).expect("token JSON");
        body["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token for {client}: {body}"))
            .to_owned()
    }

    /// Revokes a subject token (by its `jti`) for token exchange.
    pub async fn revoke(&self, token: &str) {
        let jti = claims(token)["jti"].as_str().expect("jti").to_owned();
        let status = http()
            .post(format!("{}/test/revoke", self.issuer))
            .body(format!("jti={jti}"))
            .send()
            .await
            .expect("revoke")
            .status();
        assert_eq!(status, 204);
    }

    /// The exchanges and grants it served (and refused), in order.
    pub async fn log(&self) -> Vec<Value> {
        let text = http()
            .get(format!("{}/test/log", self.issuer))
            .send()
            .await
            .expect("log")
            .text()
            .await
            .expect("log body");
        let body: Value = serde_json::from_str(&text).expect("log JSON");
        body.as_array().cloned().unwrap_or_default()
    }

    /// Stops it by its PID and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The claims of a compact JWS, unverified (to read a `jti` or `kid`).
pub fn claims(token: &str) -> Value {
    part(token, 1)
}

/// The header of a compact JWS.
pub fn header(token: &str) -> Value {
    part(token, 0)
}

fn part(token: &str, i: usize) -> Value {
    let segment = token.split('.').nth(i).expect("a JWS segment");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(segment).expect("base64url")).expect("JSON")
}

/// The Python SDK server that says whom it verified.
#[derive(Debug)]
pub struct IdentityPeer {
    child: Child,
    /// `http://127.0.0.1:P/mcp`.
    pub url: String,
    record: tempfile::NamedTempFile,
}

impl IdentityPeer {
    /// Starts it with `args` (see the script: `--verify jwt --issuer …`, `--show NAME`, …).
    pub async fn start(args: &[&str]) -> Self {
        let peers = peers_dir();
        let record = tempfile::NamedTempFile::new().expect("temp file");
        let mut cmd = Command::new(require(
            peers.join("venv/bin/python"),
            "the Python SDK venv",
        ));
        cmd.arg(repo("tests/peers/py_identity_server.py"))
            .args(["--port", "0", "--record"])
            .arg(record.path())
            .args(args)
            .env("PORTCULLIS_PEERS", &peers)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("the identity peer starts");
        let port = announced(&mut child, "the identity peer").await;
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            record,
        }
    }

    /// The identity of every call the server ran, in order.
    pub fn identities(&self) -> Vec<Value> {
        recorded(Some(&self.record))
            .into_iter()
            .map(|c| c["identity"].clone())
            .collect()
    }

    /// Stops it by its PID and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A new Ed25519 signing key for the gateway, as a PKCS#8 PEM file in `dir`
/// written the way `openssl genpkey -algorithm ed25519` writes it (PKCS#8 v1).
pub fn signing_key(dir: &Path, name: &str) -> std::path::PathBuf {
    let rng = ring::rand::SystemRandom::new();
    // ring writes PKCS#8 v2 (with the public key), which OpenSSL-based
    // peers refuse; its seed sits at bytes 16..48, behind the same prefix v1 has.
    let v2 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("a key");
    let mut der = hex::decode("302e020100300506032b657004220420").expect("hex");
    der.extend_from_slice(&v2.as_ref()[16..48]);
    let body = STANDARD.encode(&der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    );
    let path = dir.join(format!("{name}.pem"));
    std::fs::write(&path, pem).expect("write the key");
    path
}

/// What a `whoami` answer says, from an SDK client's result.
pub fn whoami(result: &Value) -> Value {
    assert_eq!(result["isError"], false, "{result}");
    serde_json::from_str(result["text"].as_str().expect("text")).expect("whoami JSON")
}
