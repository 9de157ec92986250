//! The broker's modes, without a network: which header each caller gets,
//! and what is refused (with words that never carry a secret).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderMap;
use serde_json::{Value, json};

use super::*;

const ED25519: &str = "-----BEGIN PRIVATE KEY-----\n\
    MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
    -----END PRIVATE KEY-----\n";

fn headers(c: Credential) -> HeaderMap {
    let mut h = HeaderMap::new();
    c.apply(&mut h);
    h
}

fn caller(client: &ClientId, token: Option<&PresentedToken>) -> Caller {
    Caller {
        client: client.clone(),
        token: token.cloned(),
    }
}

#[tokio::test]
async fn each_client_gets_its_own_secret_and_a_client_without_one_gets_nothing() {
    let mut secrets = BTreeMap::new();
    secrets.insert(
        "alice".into(),
        (Secret::new("alice-secret"), "env A".into()),
    );
    secrets.insert("bob".into(), (Secret::new("bob-secret"), "file b".into()));
    let identity = ServerIdentity::Secrets {
        header: HeaderName::from_static("x-api-key"),
        format: Format::parse("{secret}", "{secret}").expect("format"),
        secrets,
    };
    let gateway = IdentitySettings::default();
    let broker = Broker::new("files", "http://u/mcp", Some(identity), &gateway);
    for (name, expected) in [("alice", "alice-secret"), ("bob", "bob-secret")] {
        let id = ClientId::named(name);
        let got = headers(
            broker
                .credential(&caller(&id, None), &gateway)
                .await
                .expect("ok"),
        );
        assert_eq!(got["x-api-key"], expected);
        assert!(got["x-api-key"].is_sensitive());
    }
    let carol = ClientId::named("carol");
    let refused = broker
        .credential(&caller(&carol, None), &gateway)
        .await
        .expect_err("no secret");
    assert!(
        refused
            .reason
            .contains("servers.files.identity.secrets.carol")
    );
    assert!(
        !refused.reason.contains("secret\"") && !format!("{refused:?}").contains("alice-secret")
    );
}

#[tokio::test]
async fn a_template_carries_the_verified_claims_and_refuses_a_forged_line() {
    let identity = ServerIdentity::Template {
        headers: vec![(
            HeaderName::from_static("x-user"),
            Template::parse("{client} <{claims.email}>").expect("template"),
        )],
    };
    let gateway = IdentitySettings::default();
    let broker = Broker::new("files", "http://u/mcp", Some(identity), &gateway);
    let alice = ClientId::unlisted("alice");
    let good = PresentedToken::new(
        "t",
        json!({"email": "a@x.test"})
            .as_object()
            .cloned()
            .expect("map"),
    );
    let got = headers(
        broker
            .credential(&caller(&alice, Some(&good)), &gateway)
            .await
            .expect("ok"),
    );
    assert_eq!(got["x-user"], "alice <a@x.test>");
    let forged = PresentedToken::new(
        "t",
        json!({"email": "a@x.test\r\nX-Admin: yes"})
            .as_object()
            .cloned()
            .expect("map"),
    );
    let refused = broker
        .credential(&caller(&alice, Some(&forged)), &gateway)
        .await
        .expect_err("CR LF refused");
    assert!(refused.reason.contains("`email`"), "{}", refused.reason);
    let keyed = broker.credential(&caller(&alice, None), &gateway).await;
    assert!(keyed.is_err(), "a template over claims needs a token");
}

fn claims_of(token: &str) -> (Value, Value) {
    let mut parts = token.split('.');
    let mut next = || -> Value {
        serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(parts.next().expect("part"))
                .expect("b64"),
        )
        .expect("json")
    };
    let header = next();
    (header, next())
}

#[tokio::test]
async fn an_assertion_names_the_client_the_server_and_the_gateway_and_is_signed_by_the_first_key() {
    let key = Arc::new(SigningKey::from_pem(ED25519).expect("key"));
    let gateway = IdentitySettings {
        issuer: Some("https://gw.example".into()),
        keys: vec![key.clone()],
        ..Default::default()
    };
    let identity = ServerIdentity::Assertion(AssertionSettings {
        header: http::header::AUTHORIZATION,
        format: Format::bearer(),
        audience: "https://files.example/mcp".into(),
        lifetime: Duration::from_secs(60),
        reuse: None,
    });
    let broker = Broker::new("files", "http://u/mcp", Some(identity), &gateway);
    let alice = ClientId::named("alice");
    let first = headers(
        broker
            .credential(&caller(&alice, None), &gateway)
            .await
            .expect("ok"),
    );
    let second = headers(
        broker
            .credential(&caller(&alice, None), &gateway)
            .await
            .expect("ok"),
    );
    let token = first["authorization"]
        .to_str()
        .expect("ascii")
        .strip_prefix("Bearer ")
        .expect("bearer");
    let (header, claims) = claims_of(token);
    assert_eq!(header["kid"], key.kid());
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["aud"], "https://files.example/mcp");
    assert_eq!(claims["iss"], "https://gw.example");
    assert_eq!(claims["azp"], "https://gw.example");
    assert_eq!(claims["act"]["sub"], "https://gw.example");
    assert_eq!(
        claims["exp"].as_u64().expect("exp") - claims["iat"].as_u64().expect("iat"),
        60
    );
    assert_ne!(
        first["authorization"], second["authorization"],
        "a new jti per call"
    );
    assert_eq!(jwks([&*key])["keys"][0]["kid"], key.kid());
}

#[tokio::test]
async fn an_exchange_needs_the_clients_token_and_says_so() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let gateway = IdentitySettings::default();
    let grant = GrantSettings {
        header: http::header::AUTHORIZATION,
        format: Format::bearer(),
        endpoint: "http://127.0.0.1:9/token".parse().expect("url"),
        client_id: "gw".into(),
        auth: ClientAuth::Basic(Secret::new("s")),
        resource: None,
        audience: None,
        scopes: vec![],
        subject_token_type: "urn:ietf:params:oauth:token-type:access_token".into(),
        timeout: Duration::from_secs(2),
        refresh_before: DEFAULT_REFRESH_BEFORE,
        max_reuse: DEFAULT_MAX_TOKEN_REUSE,
    };
    let broker = Broker::new(
        "files",
        "http://u/mcp",
        Some(ServerIdentity::Exchange(grant)),
        &gateway,
    );
    let bob = ClientId::named("bob");
    let refused = broker
        .credential(&caller(&bob, None), &gateway)
        .await
        .expect_err("no token");
    assert!(!refused.retry_helps && refused.reason.contains("did not sign in with one"));
    // An unreachable endpoint (port 9, discard, is closed on loopback): a retry may help.
    let token = PresentedToken::new(
        "a.b.c",
        json!({"exp": 4_000_000_000u64})
            .as_object()
            .cloned()
            .expect("map"),
    );
    let down = broker
        .credential(&caller(&bob, Some(&token)), &gateway)
        .await
        .expect_err("down");
    assert!(down.retry_helps, "{}", down.reason);
    assert!(!down.reason.contains("a.b.c"));
}
