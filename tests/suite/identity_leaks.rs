//! Upstream identity, what must never leak: in every identity mode (token exchange at a
//! real authorization server, a signed assertion, the client's own secret, a header
//! template) the client's own token never reaches the server, and no credential the gateway
//! minted or read reaches its log.

use crate::identity::{everyone_may_call, exchange, start_with_env};
use crate::support;
use support::tiers::{self, Tier};

use serde_json::json;
use support::identity::{AuthServer, claims, header, signing_key};
use support::upstreams::InProcess;
use support::{Config, Mode, Sdk, call, sdk};

/// One mode's `[servers.s.identity]` (and what else it needs), for the leak test.
struct ModeCase {
    name: &'static str,
    table: String,
    extra: String,
}

// On the current thread: the log capture reads the events of this thread.
#[tokio::test]
async fn the_clients_own_token_never_reaches_the_server_nor_a_minted_one_the_log_in_any_mode() {
    if !tiers::ready(&[Tier::Authz]) {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let key = signing_key(dir.path(), "gateway");
    let auth = AuthServer::start(Some(&key)).await;
    let alice_secret = dir.path().join("alice-secret");
    std::fs::write(&alice_secret, "alice-upstream-secret\n").expect("write");
    let identity = format!(
        "[identity]\nissuer = \"https://gateway.test\"\nsigning_keys = [{{ file = \"{}\" }}]\n",
        key.display()
    );
    let cases = [
        ModeCase {
            name: "secret",
            table: format!(
                "mode = \"secret\"\nheader = \"X-Upstream-Key\"\nformat = \"{{secret}}\"\nsecrets.alice = {{ file = \"{}\" }}\n",
                alice_secret.display()
            ),
            extra: String::new(),
        },
        ModeCase {
            name: "template",
            table: "mode = \"template\"\nheaders = { X-User = \"{client}\", X-Client-Id = \"{claims.client_id}\" }\n".into(),
            extra: String::new(),
        },
        ModeCase { name: "assertion", table: "mode = \"assertion\"\n".into(), extra: identity.clone() },
        ModeCase {
            name: "exchange",
            table: exchange(&auth, "private_key_jwt", &[]),
            extra: identity.clone(),
        },
        ModeCase {
            name: "client_credentials",
            table: exchange(&auth, "client_secret_basic", &["files:read"]).replace("\"exchange\"", "\"client_credentials\""),
            extra: String::new(),
        },
    ];
    let alice_jwt = auth.sign_in("alice").await;
    for case in cases {
        let upstream = InProcess::demo().await;
        let text = Config::new()
            .server("s", &upstream.url)
            .set("pinning", "off")
            .raw(&format!("[servers.s.identity]\n{}", case.table))
            .raw(&case.extra)
            .raw(&auth.auth_jwt())
            .raw("[clients.alice]\n")
            .raw(everyone_may_call())
            .render();
        let log = support::log::capture();
        let gateway = start_with_env(&text).await;
        let results = sdk(
            Sdk::Python,
            Mode::Legacy,
            &gateway.url("s"),
            &alice_jwt,
            json!([call("echo", json!({"text": "hi"}))]),
        )
        .await;
        assert_eq!(results[0]["isError"], false, "{}: {results:?}", case.name);
        let seen = upstream.headers();
        assert!(!seen.is_empty(), "{}", case.name);
        let signature = alice_jwt.rsplit('.').next().expect("signature");
        let mut minted = Vec::new();
        for h in &seen {
            let all = format!("{h:?}");
            assert!(
                !all.contains(signature),
                "{}: the client's token reached the server: {all}",
                case.name
            );
            match case.name {
                "secret" => assert_eq!(h["x-upstream-key"], "alice-upstream-secret"),
                "template" => {
                    assert_eq!(h["x-user"], "alice");
                    assert_eq!(h["x-client-id"], "alice");
                }
                _ => {
                    let bearer = h["authorization"].to_str().expect("ascii");
                    let token = bearer.strip_prefix("Bearer ").expect("bearer").to_owned();
                    let expected = if case.name == "client_credentials" {
                        "portcullis"
                    } else {
                        "alice"
                    };
                    assert_eq!(claims(&token)["sub"], expected, "{}", case.name);
                    if case.name == "assertion" {
                        assert_eq!(header(&token)["alg"], "EdDSA");
                    }
                    minted.push(token);
                }
            }
        }
        // The dashboard's feed (the audit trail as it is shown) and `check`'s view.
        let mut shown = String::new();
        for path in ["/api/events", "/api/config"] {
            let response = support::http()
                .get(format!("{}{path}", gateway.admin_url()))
                .send()
                .await
                .expect("admin API");
            assert_eq!(response.status(), 200, "{path}");
            shown.push_str(&response.text().await.expect("body"));
        }
        assert!(
            shown.contains("echo"),
            "{}: the call is in the feed",
            case.name
        );
        gateway.stop().await;
        let logged = log.text();
        assert!(
            logged.contains("\"request\""),
            "{}: the log was captured",
            case.name
        );
        for token in &minted {
            let sig = token.rsplit('.').next().expect("signature");
            assert!(
                !logged.contains(sig),
                "{}: a minted token is in the log",
                case.name
            );
            assert!(
                !shown.contains(sig),
                "{}: a minted token is on the dashboard",
                case.name
            );
        }
        for text in [&logged, &shown] {
            assert!(
                !text.contains(signature) && !text.contains("alice-upstream-secret"),
                "{}",
                case.name
            );
        }
        drop(upstream);
    }
    auth.stop().await;
}
