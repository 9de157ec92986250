//! Upstream identity: each client reaches the server as itself — through a
//! token exchanged at a real authorization server (oidc-provider), an
//! assertion the gateway signs, its own secret or a header template — and
//! never with its own token; a credential that cannot be had stops the call
//! before the upstream. What must never leak, in every mode: `identity_leaks.rs`.

use crate::support;
use support::tiers::{self, Tier};

use std::time::Duration;

use serde_json::{Value, json};
use support::identity::{AuthServer, IdentityPeer, claims, signing_key, whoami};
use support::{ALICE, BOB, Config, Mode, Sdk, TestGateway, call, gateway_code, sdk, tools_call};

const ADMIN_TOKEN: &str = "identity-admin-token";

/// `[servers.NAME.identity]` exchanging the client's token at `auth`.
pub(crate) fn exchange(auth: &AuthServer, client_auth: &str, scopes: &[&str]) -> String {
    let id = match client_auth {
        "client_secret_post" => "portcullis-post",
        "private_key_jwt" => "portcullis-pkjwt",
        _ => "portcullis",
    };
    let secret = match client_auth {
        "private_key_jwt" => String::new(),
        _ => format!(
            "client_secret = {{ env = \"SECRET_{}\" }}\n",
            id.replace('-', "_").to_uppercase()
        ),
    };
    format!(
        "mode = \"exchange\"\ntoken_endpoint = \"{}\"\nclient_id = \"{id}\"\nclient_auth = \"{client_auth}\"\n{secret}scopes = {scopes:?}\n",
        auth.token_endpoint()
    )
}

/// The gateway's client secrets, as its environment would hold them.
fn env(name: &str) -> Option<String> {
    match name {
        "SECRET_PORTCULLIS" => Some("portcullis-secret".into()),
        "SECRET_PORTCULLIS_POST" => Some("portcullis-post-secret".into()),
        _ => None,
    }
}

pub(crate) async fn start_with_env(text: &str) -> TestGateway {
    support::init();
    let mut text = text.to_owned();
    text.push_str("\n[pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n");
    let config = portcullis::config::load_str(&text, "identity.toml", &env)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let handle = portcullis::Gateway::start(config)
        .await
        .expect("gateway starts");
    TestGateway::from_handle(handle)
}

/// A peer that accepts only a token the authorization server issued for it.
async fn verifying_peer(auth: &AuthServer) -> IdentityPeer {
    let jwks = format!("{}/jwks", auth.issuer);
    IdentityPeer::start(&[
        "--verify",
        "jwt",
        "--issuer",
        &auth.issuer,
        "--audience-self",
        "--jwks",
        &jwks,
    ])
    .await
}

pub(crate) fn everyone_may_call() -> &'static str {
    "[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"*\"]\naction = \"allow\"\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_and_bob_reach_the_server_as_themselves_in_both_eras_and_the_merged_view() {
    if !tiers::ready(&[Tier::Python, Tier::Authz]) {
        return;
    }
    let auth = AuthServer::start(None).await;
    let files = verifying_peer(&auth).await;
    let mail = verifying_peer(&auth).await;
    let text = Config::new()
        .server("files", &files.url)
        .set("pinning", "off")
        .raw(&format!(
            "[servers.files.identity]\n{}",
            exchange(&auth, "client_secret_basic", &["files:read"])
        ))
        .server("mail", &mail.url)
        .set("pinning", "off")
        .raw(&format!(
            "[servers.mail.identity]\n{}",
            exchange(&auth, "client_secret_post", &[])
        ))
        .raw(&auth.auth_jwt())
        .raw(everyone_may_call())
        .render();
    let gateway = start_with_env(&text).await;
    let alice = auth.sign_in("alice").await;
    let bob = auth.sign_in("bob").await;
    for (who, token) in [("alice", &alice), ("bob", &bob)] {
        for mode in [Mode::Legacy, Mode::Modern] {
            let ops = json!([call("whoami", json!({})), call("whoami", json!({}))]);
            for result in sdk(Sdk::Python, mode, &gateway.url("files"), token, ops).await {
                let seen = whoami(&result);
                assert_eq!(seen["sub"], who, "{seen}");
                assert_eq!(seen["act"]["sub"], "portcullis", "{seen}");
                assert_eq!(seen["scope"], "files:read");
            }
        }
        let merged = json!([
            call("mail__whoami", json!({})),
            call("files__whoami", json!({}))
        ]);
        let results = sdk(
            Sdk::Python,
            Mode::Legacy,
            &gateway.merged_url(),
            token,
            merged,
        )
        .await;
        assert_eq!(whoami(&results[0])["act"]["sub"], "portcullis-post");
        for result in &results {
            assert_eq!(whoami(result)["sub"], who);
        }
    }
    // Every call ran as its caller, verified by the server itself.
    let ran: Vec<Value> = files
        .identities()
        .into_iter()
        .chain(mail.identities())
        .collect();
    assert_eq!(ran.len(), 12, "{ran:?}");
    assert!(ran.iter().all(|i| i.get("refused").is_none()), "{ran:?}");
    // One exchange per client and server: every later request was served from the cache.
    let exchanges: Vec<Value> = auth
        .log()
        .await
        .into_iter()
        .filter(|e| e["grant"] == "token-exchange")
        .collect();
    let count = |sub: &str, resource: &str| {
        exchanges
            .iter()
            .filter(|e| e["subject"] == sub && e["resource"] == resource)
            .count()
    };
    for who in ["alice", "bob"] {
        assert_eq!(count(who, &files.url), 1, "{exchanges:?}");
        assert_eq!(count(who, &mail.url), 1, "{exchanges:?}");
    }
    gateway.stop().await;
    files.stop().await;
    mail.stop().await;
    auth.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_or_expired_subject_token_is_refused_and_the_server_is_not_called() {
    if !tiers::ready(&[Tier::Python, Tier::Authz]) {
        return;
    }
    let auth = AuthServer::start(None).await;
    let files = verifying_peer(&auth).await;
    let text = Config::new()
        .server("files", &files.url)
        .set("pinning", "off")
        .raw(&format!(
            "[servers.files.identity]\n{}",
            exchange(&auth, "client_secret_basic", &[])
        ))
        .raw(&auth.auth_jwt())
        .raw(everyone_may_call())
        .render();
    let gateway = start_with_env(&text).await;
    // carol's tokens live 3 s; the gateway accepts them a minute longer (its leeway).
    let carol = auth.sign_in("carol").await;
    let carol_call = async |token: &str| {
        let call = tools_call(&gateway.url("files"), token, "whoami", json!({}), &[]).await;
        call.result()
    };
    let first = carol_call(&carol).await;
    assert_eq!(first["isError"], false, "{first}");
    let bob = auth.sign_in("bob").await;
    auth.revoke(&bob).await;
    let once = |token: String| {
        let url = gateway.url("files");
        async move {
            sdk(
                Sdk::Python,
                Mode::Modern,
                &url,
                &token,
                json!([call("whoami", json!({}))]),
            )
            .await
        }
    };
    let refused = &once(bob.clone()).await[0];
    assert_eq!(
        gateway_code(refused),
        Some("upstream_credentials_unavailable"),
        "{refused}"
    );
    assert_eq!(refused["meta"]["portcullis/error"]["retry"], "no");
    let text = refused["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("invalid_grant") && text.contains("client must obtain a new token"),
        "{text}"
    );
    assert!(
        !text.contains(&bob),
        "the token is never in an error's text"
    );
    // Past its expiry carol's token is not served from the cache, and its exchange is refused.
    let expiry = claims(&carol)["exp"].as_u64().expect("exp");
    while support::jwt::now() as u64 <= expiry {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expired = carol_call(&carol).await;
    let meta = &expired["_meta"]["portcullis/error"];
    assert_eq!(
        meta["code"], "upstream_credentials_unavailable",
        "{expired}"
    );
    assert_eq!(meta["retry"], "no", "{expired}");
    let ran = files.identities();
    assert_eq!(
        ran.len(),
        1,
        "only carol's first call reached the server: {ran:?}"
    );
    let refusals: Vec<Value> = auth
        .log()
        .await
        .into_iter()
        .filter(|e| e.get("refused").is_some())
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    gateway.stop().await;
    files.stop().await;
    auth.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_authorization_server_down_the_call_is_refused_before_the_server() {
    if !tiers::ready(&[Tier::Python, Tier::Authz]) {
        return;
    }
    let auth = AuthServer::start(None).await;
    let files = verifying_peer(&auth).await;
    let text = Config::new()
        .server("files", &files.url)
        .set("pinning", "off")
        .raw(&format!(
            "[servers.files.identity]\n{}",
            exchange(&auth, "client_secret_basic", &[])
        ))
        .raw(&auth.auth_jwt())
        .raw(everyone_may_call())
        .render();
    let gateway = start_with_env(&text).await;
    let alice = auth.sign_in("alice").await;
    let bob = auth.sign_in("bob").await;
    // alice's first request makes the gateway fetch the key set (and exchange
    // her token); then the authorization server goes away.
    let first = sdk(
        Sdk::Python,
        Mode::Legacy,
        &gateway.url("files"),
        &alice,
        json!([{"op": "ping"}]),
    )
    .await;
    assert_eq!(first[0]["pong"], true, "{first:?}");
    let calls_before = files.identities().len();
    auth.stop().await;
    // bob's token verifies, but cannot be exchanged now.
    let results = sdk(
        Sdk::Python,
        Mode::Modern,
        &gateway.url("files"),
        &bob,
        json!([call("whoami", json!({}))]),
    )
    .await;
    let refused = &results[0];
    assert_eq!(
        gateway_code(refused),
        Some("upstream_credentials_unavailable"),
        "{refused}"
    );
    assert_eq!(refused["meta"]["portcullis/error"]["retry"], "later");
    let text = refused["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("could not be reached") && text.contains("token_endpoint"),
        "{text}"
    );
    assert!(text.contains("Retrying later may help"), "{text}");
    assert_eq!(
        files.identities().len(),
        calls_before,
        "the server was not called"
    );
    gateway.stop().await;
    files.stop().await;
}

/// The gateway's configuration for assertions signed with `keys` (the first signs).
fn assertion_config(upstream: &str, keys: &[&std::path::Path]) -> String {
    let keys: Vec<String> = keys
        .iter()
        .map(|k| format!("{{ file = \"{}\" }}", k.display()))
        .collect();
    Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("files", upstream)
        .set("pinning", "off")
        .raw("[servers.files.identity]\nmode = \"assertion\"\nlifetime = \"30s\"\n")
        .clients()
        .allow(&["*"])
        .section("identity")
        .set("issuer", "https://gateway.test")
        .set_raw("signing_keys", &format!("[{}]", keys.join(", ")))
        .memory_stores()
        .render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assertions_name_each_client_and_a_key_rotation_fails_no_call() {
    if !tiers::ready(&[Tier::Python, Tier::Authz]) {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let (old, new) = (
        signing_key(dir.path(), "old"),
        signing_key(dir.path(), "new"),
    );
    let jwks_url_file = dir.path().join("jwks-url");
    let jwks_arg = jwks_url_file.display().to_string();
    let files = IdentityPeer::start(&[
        "--verify",
        "jwt",
        "--issuer",
        "https://gateway.test",
        "--audience-self",
        "--jwks-url-file",
        &jwks_arg,
        "--jwks-lifespan",
        "1",
    ])
    .await;
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, assertion_config(&files.url, &[&old])).expect("write");
    support::init();
    let gateway = TestGateway::from_handle(
        portcullis::Gateway::start_file(&path)
            .await
            .expect("starts"),
    );
    let base = gateway.url("files");
    let origin = base.trim_end_matches("/mcp/files");
    std::fs::write(&jwks_url_file, format!("{origin}/.well-known/jwks.json")).expect("write");
    let round = |key: &'static str| {
        let url = base.clone();
        async move {
            let ops = json!([call("whoami", json!({})), call("whoami", json!({}))]);
            sdk(Sdk::Python, Mode::Legacy, &url, key, ops).await
        }
    };
    for (key, who) in [(ALICE, "alice"), (BOB, "bob")] {
        for result in round(key).await {
            let seen = whoami(&result);
            assert_eq!(seen["sub"], who, "{seen}");
            assert_eq!(seen["act"]["sub"], "https://gateway.test");
            assert_eq!(seen["azp"], "https://gateway.test");
        }
    }
    // Rotation, as the README says: publish the new key beside the signing
    // one; once upstreams have fetched the key set again (here after 1 s),
    // sign with it; later drop the old one. No call fails on the way.
    let steps = [
        vec![old.as_path(), new.as_path()],
        vec![new.as_path(), old.as_path()],
        vec![new.as_path()],
    ];
    for (step, keys) in steps.iter().enumerate() {
        std::fs::write(&path, assertion_config(&files.url, keys)).expect("write");
        let reload = support::http()
            .post(format!("{}/api/reload", gateway.admin_url()))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("reload");
        assert_eq!(
            reload.status(),
            200,
            "{}",
            reload.text().await.unwrap_or_default()
        );
        for key in [ALICE, BOB] {
            for result in round(key).await {
                assert!(
                    whoami(&result).get("refused").is_none(),
                    "step {step}: {result}"
                );
            }
        }
        if step == 0 {
            // The peer keeps a fetched key set for its lifespan (1 s here, 300 s by default).
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    }
    let published = support::http()
        .get(format!("{origin}/.well-known/jwks.json"))
        .send()
        .await
        .expect("jwks")
        .text()
        .await
        .expect("body");
    let published: Value = serde_json::from_str(&published).expect("JSON");
    assert_eq!(
        published["keys"].as_array().map(Vec::len),
        Some(1),
        "{published}"
    );
    assert!(
        published["keys"][0].get("d").is_none(),
        "only public halves are published"
    );
    let ran = files.identities();
    assert_eq!(ran.len(), 16, "every call ran: {ran:?}");
    let signed_by: Vec<&Value> = ran.iter().map(|i| &i["kid"]).collect();
    assert_ne!(
        signed_by[0], signed_by[15],
        "the new key signs after the rotation"
    );
    assert_eq!(signed_by[15], &published["keys"][0]["kid"]);
    assert!(ran.iter().all(|i| i.get("refused").is_none()), "{ran:?}");
    gateway.stop().await;
    files.stop().await;
}
