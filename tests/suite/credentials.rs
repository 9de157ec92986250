//! No client credential reaches the upstream — API key or JWT; the server's
//! configured headers do. The same holds in every upstream identity mode
//! (secret, template, assertion, exchange, client credentials):
//! `identity::the_clients_own_token_never_reaches_the_server_nor_a_minted_one_the_log_in_any_mode`.

use crate::support;

use std::io::Write as _;

use serde_json::json;
use support::jwt::{Signer, claims, jwks};
use support::upstreams::InProcess;
use support::{
    ALICE, TestGateway, allow_all, borrow, clients, modern_call, modern_call_headers, raw_post,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_stay_behind_and_the_gateways_own_go_upstream() {
    let upstream = InProcess::demo().await;
    // The first line continues the [servers.demo] table the harness writes.
    let rest = format!(
        "headers = {{ Authorization = \"Bearer upstream-token\", X-Tenant = \"acme\" }}\n{}{}",
        clients(),
        allow_all()
    );
    let gateway = TestGateway::start(&[("demo", &upstream.url)], &rest).await;
    let mut headers = modern_call_headers(ALICE, "echo");
    headers.extend([
        ("cookie", "session=client-cookie".to_owned()),
        ("x-api-key", "client-api-key".to_owned()),
        ("proxy-authorization", "Basic Y2xpZW50".to_owned()),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        ),
        ("mcp-param-region", "eu".to_owned()),
    ]);
    let r = raw_post(
        &gateway.url("demo"),
        &borrow(&headers),
        modern_call(1, "echo", json!({"text": "hi"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = upstream.headers();
    assert!(!seen.is_empty());
    for h in &seen {
        assert_eq!(
            h["authorization"], "Bearer upstream-token",
            "the gateway's own credential replaces the client's"
        );
        assert_eq!(h["x-tenant"], "acme");
        for leaked in ["cookie", "x-api-key", "proxy-authorization"] {
            assert!(
                h.get(leaked).is_none(),
                "{leaked} must not reach the upstream"
            );
        }
        let all = format!("{h:?}");
        assert!(
            !all.contains(ALICE)
                && !all.contains("client-cookie")
                && !all.contains("client-api-key"),
            "{all}"
        );
    }
    // Transport and trace headers do cross.
    let call = seen.last().expect("the call");
    assert_eq!(call["mcp-name"], "echo");
    assert_eq!(
        call["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
    assert_eq!(call["mcp-param-region"], "eu");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_jwt_stays_behind_too() {
    let upstream = InProcess::demo().await;
    let key = Signer::rsa("rsa-1");
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(jwks(&[&key]).as_bytes()).expect("write");
    let issuer = "https://idp.example.test";
    let audience = "https://mcp.example.test/mcp/demo";
    let rest = format!(
        "[auth.jwt]\nissuer = \"{issuer}\"\naudience = \"{audience}\"\njwks_file = \"{}\"\n{}",
        file.path().display(),
        allow_all()
    );
    let gateway = TestGateway::start(&[("demo", &upstream.url)], &rest).await;
    let token = key.token(&claims(issuer, audience, "carol", "mcp:tools"));
    let headers = modern_call_headers(&token, "echo");
    let r = raw_post(
        &gateway.url("demo"),
        &borrow(&headers),
        modern_call(1, "echo", json!({"text": "hi"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = upstream.headers();
    assert!(!seen.is_empty());
    let signature = token.rsplit('.').next().expect("signature");
    for h in &seen {
        assert!(h.get("authorization").is_none(), "{h:?}");
        let all = format!("{h:?}");
        assert!(!all.contains(signature) && !all.contains(&token), "{all}");
    }
    gateway.stop().await;
}
