//! What a JWT client is told to find its authorization server: the RFC 9728 protected
//! resource metadata served from the configuration, a server-bound audience that does not
//! open the merged view, and the merged view's challenge, which leads to a document that
//! exists.

use crate::jwt::{AUD, ISS, call_with, challenge, jwks_file, jwt_table, raw_code};
use crate::support;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::jwt::{Signer, claims};
use support::{Peer, PeerServer, TestGateway, allow_all, clients};

async fn get(url: &str, host: Option<&str>) -> (u16, Value) {
    support::init();
    let client = support::http();
    let mut req = client.get(url);
    if let Some(host) = host {
        req = req.header("host", host);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let body = serde_json::from_str(&resp.text().await.unwrap_or_default()).unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_resource_metadata_is_served_from_the_configuration() {
    let upstream = support::upstreams::InProcess::demo().await;
    let key = Signer::ec("ec-1");
    let file = jwks_file(&[&key]);
    let rest = format!(
        "{}{}",
        jwt_table(
            &format!("jwks_file = \"{}\"", file.path().display()),
            "required_scopes = [\"mcp:tools\", \"mcp:read\"]"
        ),
        allow_all()
    );
    let gateway = TestGateway::start(&[("flights", &upstream.url)], &rest).await;
    let base = gateway.url("flights").replace("/mcp/flights", "");
    let well_known = format!("{base}/.well-known/oauth-protected-resource");
    let doc = |resource: &str| {
        json!({
            "resource": resource,
            "authorization_servers": [ISS],
            "bearer_methods_supported": ["header"],
            "scopes_supported": ["mcp:tools", "mcp:read"],
        })
    };
    for (path, resource) in [
        ("/mcp/flights", AUD),
        ("/mcp", "https://mcp.example.test/mcp"),
        ("", "https://mcp.example.test"),
    ] {
        let (status, body) = get(&format!("{well_known}{path}"), None).await;
        assert_eq!((status, body), (200, doc(resource)), "{path}");
    }
    // The Host a request names changes nothing in the document.
    let (status, body) = get(&format!("{well_known}/mcp/flights"), Some("localhost")).await;
    assert_eq!((status, body), (200, doc(AUD)));
    let (status, _) = get(&format!("{well_known}/mcp/nope"), None).await;
    assert_eq!(status, 404);
    // Through /mcp (one server), the challenge points at the /mcp metadata.
    let r = call_with(&format!("{base}/mcp"), "", "echo", json!({"text": "hi"})).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        challenge(&r),
        "Bearer scope=\"mcp:tools mcp:read\", resource_metadata=\"https://mcp.example.test/.well-known/oauth-protected-resource/mcp\""
    );
    gateway.stop().await;

    // Without [auth.jwt], none of this exists, and challenges stay as they were.
    let gateway = TestGateway::start(
        &[("flights", &upstream.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    let base = gateway.url("flights").replace("/mcp/flights", "");
    for path in ["", "/mcp", "/mcp/flights"] {
        let (status, _) = get(
            &format!("{base}/.well-known/oauth-protected-resource{path}"),
            None,
        )
        .await;
        assert_eq!(status, 404, "{path}");
    }
    let r = call_with(&gateway.url("flights"), "", "echo", json!({"text": "hi"})).await;
    assert_eq!((r.status, challenge(&r)), (401, "Bearer"));
    let r = call_with(
        &gateway.url("flights"),
        "a.b.c",
        "echo",
        json!({"text": "hi"}),
    )
    .await;
    assert_eq!(
        (r.status, challenge(&r)),
        (401, "Bearer error=\"invalid_token\"")
    );
    gateway.stop().await;
}

/// On the merged `/mcp` view (several servers), a token whose audience names one
/// server is refused; a token for the gateway as a whole reaches every server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_bound_audience_does_not_open_the_merged_view() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let flights = PeerServer::start(Peer::Python).await;
    let hotels = PeerServer::start(Peer::Python).await;
    let key = Signer::ec("ec-merged");
    let file = jwks_file(&[&key]);
    const WHOLE: &str = "https://mcp.example.test/mcp";
    let rest = format!(
        "{}{}[auth.jwt]\nissuer = \"{ISS}\"\naudience = [\"{AUD}\", \"{WHOLE}\"]\njwks_file = \"{}\"\n",
        clients(),
        allow_all(),
        file.path().display()
    );
    let gateway =
        TestGateway::start(&[("flights", &flights.url), ("hotels", &hotels.url)], &rest).await;
    let merged = gateway.merged_url();
    let bound = key.token(&claims(ISS, AUD, "carol", ""));
    let whole = key.token(&claims(ISS, WHOLE, "carol", ""));

    let r = call_with(
        &gateway.url("flights"),
        &bound,
        "echo",
        json!({"text": "a"}),
    )
    .await;
    assert_eq!((r.status, raw_code(&r)), (200, None), "{}", r.text);
    let r = call_with(&merged, &bound, "hotels__echo", json!({"text": "b"})).await;
    assert_eq!(
        r.status, 401,
        "a flights-only token on the merged view: {}",
        r.text
    );
    assert!(
        challenge(&r).contains("resource_metadata="),
        "{}",
        challenge(&r)
    );
    let r = call_with(&merged, &whole, "hotels__echo", json!({"text": "c"})).await;
    assert_eq!((r.status, raw_code(&r)), (200, None), "{}", r.text);

    assert_eq!(flights.ran(), ["echo"]);
    assert_eq!(hotels.ran(), ["echo"]);
    gateway.stop().await;
    flights.stop().await;
    hotels.stop().await;
}

/// A client refused on the merged `/mcp` view (several servers) follows the
/// challenge's `resource_metadata` and finds the document there: the view is
/// a protected resource like any server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_merged_views_challenge_leads_to_a_document_that_exists() {
    let flights = support::upstreams::InProcess::demo().await;
    let hotels = support::upstreams::InProcess::demo().await;
    let key = Signer::ec("ec-merged");
    let file = jwks_file(&[&key]);
    let rest = format!(
        "{}{}",
        jwt_table(&format!("jwks_file = \"{}\"", file.path().display()), ""),
        allow_all()
    );
    let gateway =
        TestGateway::start(&[("flights", &flights.url), ("hotels", &hotels.url)], &rest).await;
    let merged = gateway.merged_url();
    let base = merged.trim_end_matches("/mcp").to_owned();

    let r = call_with(&merged, "", "hotels__echo", json!({"text": "a"})).await;
    assert_eq!(r.status, 401, "{}", r.text);
    let header = challenge(&r);
    let url = header
        .split("resource_metadata=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no resource_metadata in {header:?}"));
    // The configured origin stands for this listener: follow the path on it.
    let followed = url.replacen("https://mcp.example.test", &base, 1);
    assert_ne!(followed, url, "the URL is on the configured origin: {url}");
    let (status, body) = get(&followed, None).await;
    assert_eq!(status, 200, "{followed}: {body}");
    assert_eq!(body["resource"], "https://mcp.example.test/mcp", "{body}");
    assert_eq!(body["authorization_servers"], json!([ISS]), "{body}");
    assert_eq!(
        flights.hits() + hotels.hits(),
        0,
        "nothing reached a server"
    );
    gateway.stop().await;
}
