//! Bearer JWTs from an OAuth authorization server (`[auth.jwt]`), end to end:
//! real keys (RSA, P-256, Ed25519), tokens signed here, the gateway in front
//! of the real Python SDK server. Only a valid token reaches the upstream;
//! every forgery and every wrong claim gets 401 (a missing scope 403) with the
//! challenge that sends the client to the RFC 9728 metadata; a key set URL is
//! fetched, and a rotated key is picked up; rules name JWT clients. The metadata and
//! challenges that lead a client to its authorization server: `jwt_metadata.rs`.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use std::io::Write as _;

use serde_json::{Value, json};
use support::jwt::{JwksServer, Signer, claims, hs256, jwks, now, tampered, unsigned};
use support::{
    ALICE, Mode, Peer, PeerServer, Raw, Sdk, TestGateway, allow_all, borrow, call, clients, list,
    modern_call, modern_call_headers, raw_post, sdk,
};

pub(crate) const ISS: &str = "https://idp.example.test/realms/mcp";
pub(crate) const AUD: &str = "https://mcp.example.test/mcp/flights";
const METADATA: &str = "https://mcp.example.test/.well-known/oauth-protected-resource/mcp/flights";

/// `[auth.jwt]` for this test's issuer and audience, with `keys` (`jwks_file = …`
/// or `jwks_url = …`) and any `extra` lines.
pub(crate) fn jwt_table(keys: &str, extra: &str) -> String {
    format!("[auth.jwt]\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\n{keys}\n{extra}\n")
}

/// A JWKS file holding the public keys of `signers`.
pub(crate) fn jwks_file(signers: &[&Signer]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(jwks(signers).as_bytes()).expect("write");
    file
}

/// A 2026-07-28 `tools/call` of `tool` with `bearer` (no header when empty).
pub(crate) async fn call_with(url: &str, bearer: &str, tool: &str, args: Value) -> Raw {
    let mut headers = modern_call_headers(bearer, tool);
    if bearer.is_empty() {
        headers.retain(|(k, _)| *k != "authorization");
    }
    raw_post(url, &borrow(&headers), modern_call(1, tool, args)).await
}

pub(crate) fn challenge(r: &Raw) -> &str {
    r.headers
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The `portcullis/error` code of a raw tools/call answer, if the gateway made one.
pub(crate) fn raw_code(r: &Raw) -> Option<&str> {
    r.body["result"]["_meta"]["portcullis/error"]["code"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_valid_token_reaches_the_upstream() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let (rsa, ec, ed) = (
        Signer::rsa("rsa-1"),
        Signer::ec("ec-1"),
        Signer::ed25519("ed-1"),
    );
    let file = jwks_file(&[&rsa, &ec, &ed]);
    let rest = format!(
        "{}{}",
        jwt_table(
            &format!("jwks_file = \"{}\"", file.path().display()),
            "required_scopes = [\"mcp:tools\"]"
        ),
        allow_all()
    );
    let gateway = TestGateway::start(&[("flights", &server.url)], &rest).await;
    let url = gateway.url("flights");
    let good = claims(ISS, AUD, "carol", "openid mcp:tools");
    let echo = json!({"text": "hi"});

    // Each algorithm, each key: accepted.
    for signer in [&rsa, &ec, &ed] {
        let r = call_with(&url, &signer.token(&good), "echo", echo.clone()).await;
        assert_eq!(r.status, 200, "{signer:?}: {}", r.text);
        assert_eq!(r.body["result"]["isError"], false, "{signer:?}: {}", r.text);
        assert_eq!(raw_code(&r), None, "{}", r.text);
    }
    assert_eq!(server.ran(), ["echo", "echo", "echo"]);

    let with = |change: Value| {
        let mut c = good.clone();
        for (k, v) in change.as_object().expect("object") {
            c[k] = v.clone();
        }
        c
    };
    let t = now();
    let impostor = Signer::ec("ec-1");
    let refused = [
        (
            "expired",
            rsa.token(&with(
                json!({"exp": t - 120, "iat": t - 600, "nbf": t - 600}),
            )),
        ),
        ("not yet valid", rsa.token(&with(json!({"nbf": t + 600})))),
        (
            "issued in the future",
            ed.token(&with(json!({"iat": t + 600}))),
        ),
        (
            "wrong audience",
            ec.token(&with(json!({"aud": "https://mcp.example.test/mcp/other"}))),
        ),
        (
            "wrong issuer",
            ec.token(&with(json!({"iss": "https://evil.example.test"}))),
        ),
        ("no expiry", ed.token(&with(json!({"exp": null})))),
        ("unknown kid", Signer::ed25519("ed-unknown").token(&good)),
        ("alg none", unsigned("rsa-1", &good)),
        (
            "HS256 with the public key as secret",
            hs256("rsa-1", &rsa.public_bytes(), &good),
        ),
        (
            "HS256 with the JWK as secret",
            hs256("rsa-1", rsa.jwk().to_string().as_bytes(), &good),
        ),
        (
            "tampered payload",
            tampered(&rsa.token(&good), &with(json!({"sub": "admin"}))),
        ),
        ("a known kid on another key", impostor.token(&good)),
        (
            "RS256 header on the Ed25519 key",
            ed.sign_with_header(&json!({"alg": "RS256", "kid": "ed-1"}), &good),
        ),
        (
            "a key named by jku",
            impostor.sign_with_header(
                &json!({"alg": "ES256", "kid": "attacker", "jku": "http://127.0.0.1:1/jwks.json"}),
                &good,
            ),
        ),
        ("an unknown API key", "not-a-jwt-and-not-a-key".to_owned()),
    ];
    for (what, token) in &refused {
        let r = call_with(&url, token, "echo", echo.clone()).await;
        assert_eq!(r.status, 401, "{what}: {}", r.text);
        assert_eq!(
            challenge(&r),
            format!(
                "Bearer error=\"invalid_token\", scope=\"mcp:tools\", resource_metadata=\"{METADATA}\""
            ),
            "{what}"
        );
    }

    // No credentials: the challenge alone tells the client where to start.
    let r = call_with(&url, "", "echo", echo.clone()).await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(
        challenge(&r),
        format!("Bearer scope=\"mcp:tools\", resource_metadata=\"{METADATA}\"")
    );

    // A valid token without the required scope: 403, naming the scope.
    let r = call_with(
        &url,
        &rsa.token(&with(json!({"scope": "openid"}))),
        "echo",
        echo,
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(
        challenge(&r),
        format!(
            "Bearer error=\"insufficient_scope\", scope=\"mcp:tools\", resource_metadata=\"{METADATA}\""
        )
    );

    assert_eq!(
        server.ran(),
        ["echo", "echo", "echo"],
        "no refused call reached the upstream"
    );
    gateway.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_clients_connect_with_a_token() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let key = Signer::rsa("rsa-1");
    let file = jwks_file(&[&key]);
    let rest = format!(
        "{}{}",
        jwt_table(&format!("jwks_file = \"{}\"", file.path().display()), ""),
        allow_all()
    );
    let gateway = TestGateway::start(&[("flights", &server.url)], &rest).await;
    let token = key.token(&claims(ISS, AUD, "carol", ""));
    for client in [Sdk::Python, Sdk::TypeScript] {
        for mode in [Mode::Legacy, Mode::Modern] {
            let r = sdk(
                client,
                mode,
                &gateway.url("flights"),
                &token,
                json!([list(), call("echo", json!({"text": "hi"}))]),
            )
            .await;
            let names = r[0]["tools"].as_array().cloned().unwrap_or_default();
            assert!(names.contains(&json!("echo")), "{client:?} {mode:?}: {r:?}");
            assert_eq!(
                support::gateway_code(&r[1]),
                None,
                "{client:?} {mode:?}: {r:?}"
            );
        }
    }
    assert_eq!(server.ran(), ["echo", "echo", "echo", "echo"]);
    gateway.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_address_a_jwt_client_by_name_beside_api_keys() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let key = Signer::ed25519("ed-1");
    let file = jwks_file(&[&key]);
    // carol is a JWT client (no key); alice keeps her API key.
    let rest = format!(
        "{}[clients.carol]\n{}{}",
        clients(),
        jwt_table(&format!("jwks_file = \"{}\"", file.path().display()), ""),
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["echo"]
action = "allow"

[[rules]]
clients = ["carol"]
servers = ["flights"]
tools = ["book_flight"]
action = "allow"
"#
    );
    let gateway = TestGateway::start(&[("flights", &server.url)], &rest).await;
    let url = gateway.url("flights");
    let booking =
        json!({"origin": "CDG", "destination": "LHR", "date": "2026-12-01", "passengers": 2});
    let token = |sub: &str| key.token(&claims(ISS, AUD, sub, ""));

    // carol, named by her token, gets her own rule.
    let r = call_with(&url, &token("carol"), "book_flight", booking.clone()).await;
    assert_eq!((r.status, raw_code(&r)), (200, None), "{}", r.text);
    // dave is authenticated but unnamed: only the "*" rule applies.
    let r = call_with(&url, &token("dave"), "book_flight", booking.clone()).await;
    assert_eq!(raw_code(&r), Some("unknown_tool"), "{}", r.text);
    let r = call_with(&url, &token("dave"), "echo", json!({"text": "hi"})).await;
    assert_eq!((r.status, raw_code(&r)), (200, None), "{}", r.text);
    // A token cannot take the name of a client that holds an API key.
    for sub in ["alice", "anonymous"] {
        let r = call_with(&url, &token(sub), "echo", json!({"text": "hi"})).await;
        assert_eq!(r.status, 401, "{sub}: {}", r.text);
    }
    // alice's API key works beside the tokens.
    let r = call_with(&url, ALICE, "echo", json!({"text": "hi"})).await;
    assert_eq!((r.status, raw_code(&r)), (200, None), "{}", r.text);

    assert_eq!(server.ran(), ["book_flight", "echo", "echo"]);

    // Metrics name carol; dave, whom no table names, is counted as `other`.
    let metrics = support::http()
        .get(format!("{}/metrics", gateway.admin_url()))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("client=\"carol\""), "{metrics}");
    assert!(metrics.contains("client=\"other\""), "{metrics}");
    assert!(!metrics.contains("dave"), "{metrics}");
    gateway.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_is_fetched_and_a_rotated_key_is_picked_up() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let (old, new) = (Signer::ed25519("2026-01"), Signer::ec("2026-02"));
    let idp = JwksServer::start(jwks(&[&old])).await;
    let rest = format!(
        "{}{}",
        jwt_table(
            &format!("jwks_url = \"{}\"\njwks_refresh = \"1h\"", idp.url),
            ""
        ),
        allow_all()
    );
    let gateway = TestGateway::start(&[("flights", &server.url)], &rest).await;
    let url = gateway.url("flights");
    let good = claims(ISS, AUD, "carol", "");
    let echo = json!({"text": "hi"});
    assert_eq!(idp.hits(), 0, "nothing is fetched before a token needs it");

    let r = call_with(&url, &old.token(&good), "echo", echo.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.hits(), 1);
    let r = call_with(&url, &old.token(&good), "echo", echo.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.hits(), 1, "the key set is cached");

    // The authorization server rotates: the new key appears, the old one goes.
    idp.set(jwks(&[&new]));
    let r = call_with(&url, &new.token(&good), "echo", echo.clone()).await;
    assert_eq!(r.status, 200, "the new kid triggers one fetch: {}", r.text);
    assert_eq!(idp.hits(), 2);
    let r = call_with(&url, &old.token(&good), "echo", echo.clone()).await;
    assert_eq!(r.status, 401, "the withdrawn key is no longer trusted");

    // Unknown kids do not make the gateway hammer the key set URL.
    for i in 0..10 {
        let stranger = Signer::ed25519(&format!("stranger-{i}"));
        let r = call_with(&url, &stranger.token(&good), "echo", echo.clone()).await;
        assert_eq!(r.status, 401, "{}", r.text);
    }
    assert_eq!(
        idp.hits(),
        2,
        "at most one fetch per cooldown for unknown kids"
    );
    assert_eq!(server.ran(), ["echo", "echo", "echo"]);
    gateway.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirected_or_oversized_key_set_is_not_trusted() {
    let upstream = support::upstreams::InProcess::demo().await;
    let key = Signer::ed25519("ed-1");
    let idp = JwksServer::start(jwks(&[&key])).await;
    let good = claims(ISS, AUD, "carol", "");
    let echo = json!({"text": "hi"});

    // Redirects are not followed: the document behind one is never read.
    let moved = idp.url.replace("/jwks.json", "/moved");
    let rest = format!(
        "{}{}",
        jwt_table(&format!("jwks_url = \"{moved}\""), ""),
        allow_all()
    );
    let gateway = TestGateway::start(&[("flights", &upstream.url)], &rest).await;
    let r = call_with(
        &gateway.url("flights"),
        &key.token(&good),
        "echo",
        echo.clone(),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(idp.hits(), 0, "the redirect was not followed");
    gateway.stop().await;

    // A document over 1 MiB is not read.
    let mut doc: Value = serde_json::from_str(&jwks(&[&key])).expect("jwks");
    doc["padding"] = json!("x".repeat(1100 * 1024));
    idp.set(doc.to_string());
    let rest = format!(
        "{}{}",
        jwt_table(&format!("jwks_url = \"{}\"", idp.url), ""),
        allow_all()
    );
    let gateway = TestGateway::start(&[("flights", &upstream.url)], &rest).await;
    let url = gateway.url("flights");
    let r = call_with(&url, &key.token(&good), "echo", echo.clone()).await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(idp.hits(), 1);
    gateway.stop().await;
    assert!(upstream.hits() == 0, "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_file_is_read_again_on_reload() {
    let upstream = support::upstreams::InProcess::demo().await;
    let (first, second) = (Signer::rsa("rsa-1"), Signer::ed25519("ed-2"));
    let dir = tempfile::tempdir().expect("dir");
    let keys = dir.path().join("jwks.json");
    std::fs::write(&keys, jwks(&[&first])).expect("write");
    let admin_token = "jwt-admin-token";
    let path = dir.path().join("portcullis.toml");
    let text = Config::new()
        .admin_token(admin_token)
        .server("flights", &upstream.url)
        .raw(&jwt_table(
            &format!("jwks_file = \"{}\"", keys.display()),
            "",
        ))
        .allow_all()
        .memory_stores()
        .render();
    std::fs::write(&path, text).expect("write");
    support::init();
    let gateway = TestGateway::from_handle(
        portcullis::Gateway::start_file(&path)
            .await
            .expect("gateway starts"),
    );
    let url = gateway.url("flights");
    let good = claims(ISS, AUD, "carol", "");
    let echo = json!({"text": "hi"});
    assert_eq!(
        call_with(&url, &first.token(&good), "echo", echo.clone())
            .await
            .status,
        200
    );
    assert_eq!(
        call_with(&url, &second.token(&good), "echo", echo.clone())
            .await
            .status,
        401
    );

    // The key set file is rotated, then the configuration reloaded.
    std::fs::write(&keys, jwks(&[&second])).expect("write");
    let reload = support::http()
        .post(format!("{}/api/reload", gateway.admin_url()))
        .bearer_auth(admin_token)
        .send()
        .await
        .expect("reload");
    assert_eq!(reload.status().as_u16(), 200);
    assert_eq!(
        call_with(&url, &second.token(&good), "echo", echo.clone())
            .await
            .status,
        200
    );
    assert_eq!(
        call_with(&url, &first.token(&good), "echo", echo)
            .await
            .status,
        401
    );
    gateway.stop().await;
}

/// A token's client name is visible ASCII or the token is refused: an
/// invisible or look-alike character would let a token pose as a keyed
/// client in the audit trail, the logs and the dashboard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_name_with_invisible_or_look_alike_characters_is_refused() {
    let upstream = support::upstreams::InProcess::demo().await;
    let key = Signer::ed25519("ed-1");
    let file = jwks_file(&[&key]);
    let rest = format!(
        "{}{}{}",
        clients(),
        jwt_table(&format!("jwks_file = \"{}\"", file.path().display()), ""),
        allow_all()
    );
    let gateway = TestGateway::start(&[("flights", &upstream.url)], &rest).await;
    let url = gateway.url("flights");
    let token = |sub: &str| key.token(&claims(ISS, AUD, sub, ""));
    for sub in [
        "alice\u{200b}",  // zero width space
        "\u{202e}ecila",  // right-to-left override
        "alice\u{e0041}", // tag character
        "\u{430}lice",    // Cyrillic a
        "alice ",         // trailing space
        "alice\u{a0}",    // no-break space
        "alice\u{85}",    // C1 next line
        "ali\u{ad}ce",    // soft hyphen
        "alice\u{feff}",  // byte order mark
        "alice\u{fe0f}",  // variation selector
    ] {
        let r = call_with(&url, &token(sub), "echo", json!({"text": "hi"})).await;
        assert_eq!(r.status, 401, "{sub:?}: {}", r.text);
    }
    assert_eq!(upstream.hits(), 0, "no posing token reached the upstream");
    // A name of visible ASCII, however unusual, is a name.
    for sub in [
        "carol",
        "auth0|5f7c8ec7c33c6c004bbafe82",
        "carol@example.com",
    ] {
        let r = call_with(&url, &token(sub), "echo", json!({"text": "hi"})).await;
        assert_eq!((r.status, raw_code(&r)), (200, None), "{sub:?}: {}", r.text);
    }
    gateway.stop().await;
}
