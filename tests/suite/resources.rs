//! Resource rules, rate limits and the merged view's routing decide a URI by
//! its canonical form, in front of the official Python SDK server with
//! templated resources (`tests/peers/py_server.py`): every spelling the server
//! resolves to one resource is decided and counted as that resource, and a
//! spelling whose decoding would change the URI's structure is refused before
//! any rule is looked at, the upstream not called.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use portcullis::policy::uri::canonical;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};
use support::{
    ALICE, Mode, Peer, PeerServer, Raw, Sdk, TestGateway, clients, modern_meta, peers_dir,
    raw_post, sdk,
};
use tokio::io::AsyncWriteExt;

/// Everyone may read `users://`, `res://` and `file:///` resources, except
/// the admin's and the secret files.
const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://*", "res://*", "file:///*"]
action = "allow"

[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["users://admin/*", "res://admin/*", "file:///secret/*"]
action = "deny"
"#;

/// Spellings of denied resources that the server, asked directly, serves.
const BYPASSES: &[&str] = &[
    "users://%61dmin/profile",
    "users://Admin/profile",
    "USERS://admin/profile",
    "res://Admin/a",
    "res://./admin/a",
    "res://open/../admin/a",
    "file:///public/../secret/key.txt",
    "file:///public/%2e%2e/secret/key.txt",
    "res://open/..%2Fadmin%2Fa",
];

fn read(uri: &str) -> Value {
    json!({"op": "read", "uri": uri})
}

/// A 2026-07-28 `resources/read` of `uri`, posted as is.
async fn modern_read(url: &str, uri: &str) -> Raw {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read",
        "params": {"uri": uri, "_meta": modern_meta()}});
    let auth = format!("Bearer {ALICE}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "resources/read"),
        ("mcp-name", uri),
    ];
    raw_post(url, &headers, body.to_string()).await
}

/// The URIs the server resolved and served, as it resolved them.
fn served(peer: &PeerServer) -> Vec<String> {
    peer.calls()
        .iter()
        .filter(|c| c["tool"] == "read")
        .filter_map(|c| c["arguments"]["uri"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn every_spelling_of_a_denied_resource_is_refused_in_both_eras() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(&[("py", &py.url)], &format!("{}{RULES}", clients())).await;
    for mode in [Mode::Legacy, Mode::Modern] {
        let mut ops: Vec<Value> = BYPASSES.iter().map(|u| read(u)).collect();
        // What the rules allow still reads, however it is spelled.
        ops.extend([
            read("users://bob/profile"),
            read("users://%62ob/profile"),
            read("res://open/a"),
            read("res://Open/./b"),
            read("file:///public/readme.txt"),
        ]);
        let results = sdk(Sdk::Python, mode, &gateway.url("py"), ALICE, json!(ops)).await;
        let context = format!("{mode:?}: {results:#?}");
        assert!(
            !context.contains("SECRET"),
            "nothing secret is read: {context}"
        );
        for (i, uri) in BYPASSES.iter().enumerate() {
            assert!(
                results[i]["error"].is_string(),
                "{uri} is refused: {context}"
            );
        }
        let texts: Vec<String> = results[BYPASSES.len()..]
            .iter()
            .map(|r| r["texts"][0].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            texts,
            [
                "profile of bob",
                "profile of bob",
                "item open/a",
                "item open/b",
                "public public/readme.txt"
            ],
            "{context}"
        );
    }
    let served = served(&py);
    assert!(
        served
            .iter()
            .all(|u| !u.contains("admin") && !u.contains("secret")),
        "the server never resolved a denied resource: {served:?}"
    );
    gateway.stop().await;
    py.stop().await;
}

#[tokio::test]
async fn a_spelling_that_changes_structure_gets_an_explicit_answer_and_is_not_forwarded() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(&[("py", &py.url)], &format!("{}{RULES}", clients())).await;
    for uri in [
        "res://open/..%2Fadmin%2Fa",
        "res://open/a%5Cb",
        "res://open/%2e%2e/x",
        "res://open/%252e%252e/x",
        "res://open/a%00",
        "res://open/%FF",
        "res://open/%zz",
        "res://open/../../x",
    ] {
        let r = modern_read(&gateway.url("py"), uri).await;
        assert_eq!(r.status, 400, "{uri}: {}", r.text);
        assert_eq!(r.body["error"]["code"], -31011, "{uri}: {}", r.text);
        assert_eq!(r.body["error"]["data"]["code"], "non_canonical_uri");
        assert_eq!(r.body["error"]["data"]["uri"], uri);
        let message = r.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("refused for its spelling"),
            "{uri}: {message}"
        );
    }
    // The same refusal whatever the rules say: even an allowed prefix.
    let r = modern_read(&gateway.url("py"), "file:///public/%2E%2E/secret/key.txt").await;
    assert_eq!(r.body["error"]["code"], -31011, "{}", r.text);
    assert_eq!(
        served(&py),
        Vec::<String>::new(),
        "the upstream was never asked"
    );
    // A canonical spelling is forwarded as the client sent it; another one as its canonical form.
    let r = modern_read(&gateway.url("py"), "res://Open/x/%79/../z#frag").await;
    assert_eq!(
        r.body["result"]["contents"][0]["text"], "item open/x/z",
        "{}",
        r.text
    );
    assert_eq!(r.body["result"]["contents"][0]["uri"], "res://open/x/z");
    gateway.stop().await;
    py.stop().await;
}

/// Observe mode lets a denied read through (and records it), but a spelling
/// that changes structure is refused in every mode.
#[tokio::test]
async fn observe_mode_still_refuses_a_spelling_that_changes_structure() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let text = Config::new()
        .gateway("mode", "observe")
        .server("py", &py.url)
        .clients()
        .raw(RULES)
        .render();
    let gateway = TestGateway::start_raw(&text).await;
    let observed = modern_read(&gateway.url("py"), "users://%61dmin/profile").await;
    assert_eq!(
        observed.body["result"]["contents"][0]["uri"], "users://admin/profile",
        "observed, and forwarded in canonical form: {}",
        observed.text
    );
    let refused = modern_read(&gateway.url("py"), "res://open/..%2Fadmin%2Fa").await;
    assert_eq!(refused.body["error"]["code"], -31011, "{}", refused.text);
    assert_eq!(served(&py), ["users://admin/profile"]);
    gateway.stop().await;
    py.stop().await;
}

#[tokio::test]
async fn the_merged_view_routes_on_the_canonical_uri() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let a = PeerServer::start(Peer::Python).await;
    let b = PeerServer::start(Peer::PythonStateless).await;
    let gateway = TestGateway::start(
        &[("a", &a.url), ("b", &b.url)],
        &format!("{}{RULES}", clients()),
    )
    .await;
    for mode in [Mode::Legacy, Mode::Modern] {
        let ops = json!([
            read("res://open/..%2Fadmin%2Fa"),
            read("users://x%2F..%2Fadmin/profile"),
            read("res://./admin/a"),
            read("users://%61dmin/profile"),
            read("res://open/%61"),
        ]);
        let results = sdk(Sdk::Python, mode, &gateway.merged_url(), ALICE, ops).await;
        let context = format!("{mode:?}: {results:#?}");
        assert!(!context.contains("SECRET"), "{context}");
        for r in &results[..4] {
            assert!(r["error"].is_string(), "{context}");
        }
        assert_eq!(results[4]["texts"][0], "item open/a", "{context}");
    }
    for peer in [&a, &b] {
        assert!(
            served(peer).iter().all(|u| !u.contains("admin")),
            "{:?}",
            served(peer)
        );
    }
    gateway.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn the_spellings_of_one_resource_share_one_rate_limit_bucket() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let rules = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["res://*"]
action = "allow"
rate = { burst = 2, per_second = 0.01, key = "client+tool" }
"#;
    let gateway = TestGateway::start(&[("py", &py.url)], &format!("{}{rules}", clients())).await;
    let url = gateway.url("py");
    for uri in ["res://open/a", "res://open/./a"] {
        let r = modern_read(&url, uri).await;
        assert_eq!(
            r.body["result"]["contents"][0]["text"], "item open/a",
            "{}",
            r.text
        );
    }
    for uri in [
        "res://open/a?1",
        "res://open/a?2",
        "res://open//a",
        "res://open/a#x",
        "res://Open/a",
        "res://open/%61",
        "RES://open/b/../a",
    ] {
        let r = modern_read(&url, uri).await;
        assert_eq!(r.body["error"]["code"], -31009, "{uri}: {}", r.text);
        assert_eq!(r.body["error"]["data"]["resource"], "res://open/a");
    }
    // Another resource has its own bucket.
    let r = modern_read(&url, "res://open/b").await;
    assert_eq!(
        r.body["result"]["contents"][0]["text"], "item open/b",
        "{}",
        r.text
    );
    assert_eq!(
        served(&py),
        ["res://open/a", "res://open/a", "res://open/b"]
    );
    gateway.stop().await;
    py.stop().await;
}

// === The property: one decision, one bucket ===

/// Unreserved characters a URI may spell raw or percent-encoded (`.` is
/// left out: its escape is refused).
const PLAIN: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_~";
/// Characters the SDKs' template matchers never read as structure.
const SAFE: &str = "!$'()*+:@";

/// One resource: a scheme, a host and path segments, each segment made of
/// plain and safe characters and the occasional non-ASCII letter.
fn resource() -> impl Strategy<Value = (String, String, Vec<String>)> {
    let segment = proptest::collection::vec(
        prop_oneof![
            6 => proptest::sample::select(PLAIN.chars().collect::<Vec<_>>()),
            1 => proptest::sample::select(SAFE.chars().collect::<Vec<_>>()),
            1 => proptest::sample::select(vec!['é', 'ß', '日']),
        ],
        1..5,
    )
    .prop_map(|cs| cs.into_iter().collect::<String>());
    let host = proptest::collection::vec(
        proptest::sample::select(PLAIN.chars().collect::<Vec<_>>()),
        1..6,
    )
    .prop_map(|cs| cs.into_iter().collect::<String>());
    (
        proptest::sample::select(vec!["users", "res", "file"]),
        host,
        proptest::collection::vec(segment, 1..4),
    )
        .prop_map(|(scheme, host, path)| {
            let host = if scheme == "file" {
                String::new()
            } else {
                host
            };
            let path = if scheme == "users" {
                vec![path[0].clone(), "profile".into()]
            } else {
                path
            };
            (scheme.to_owned(), host, path)
        })
}

/// How one spelling departs from the plain URI.
#[derive(Debug, Clone)]
struct Spelling {
    /// Per character: flip its case (scheme, host) / percent-encode it (host, path).
    flips: Vec<bool>,
    encodes: Vec<bool>,
    lower_hex: bool,
    /// Where to insert `./`, `x/../` or an extra `/` (segment index, kind).
    inserts: Vec<(usize, u8)>,
    fragment: bool,
    query: Option<u8>,
}

fn spelling() -> impl Strategy<Value = Spelling> {
    (
        proptest::collection::vec(proptest::bool::weighted(0.15), 64),
        proptest::collection::vec(proptest::bool::weighted(0.3), 64),
        any::<bool>(),
        proptest::collection::vec((0usize..4, 0u8..3), 0..2),
        proptest::bool::weighted(0.15),
        proptest::option::weighted(0.15, 0u8..3),
    )
        .prop_map(
            |(flips, encodes, lower_hex, inserts, fragment, query)| Spelling {
                flips,
                encodes,
                lower_hex,
                inserts,
                fragment,
                query,
            },
        )
}

fn escape(bytes: &[u8], lower: bool) -> String {
    bytes
        .iter()
        .map(|b| {
            if lower {
                format!("%{b:02x}")
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The URI `(scheme, host, path)` spelled as `s` says.
fn spell((scheme, host, path): &(String, String, Vec<String>), s: &Spelling) -> String {
    let mut k = 0;
    let mut next = |v: &Vec<bool>| {
        k += 1;
        v[k % v.len()]
    };
    let mut out: String = scheme
        .chars()
        .map(|c| {
            if next(&s.flips) {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect();
    out.push_str("://");
    for c in host.chars() {
        let c = if next(&s.flips) {
            c.to_ascii_uppercase()
        } else {
            c
        };
        if next(&s.encodes) {
            out.push_str(&escape(c.to_string().as_bytes(), s.lower_hex));
        } else {
            out.push(c);
        }
    }
    for (i, segment) in path.iter().enumerate() {
        for (at, kind) in &s.inserts {
            if *at == i {
                out.push_str(["/.", "/x", "/"][*kind as usize]);
                if *kind == 1 {
                    out.push_str("/..");
                }
            }
        }
        out.push('/');
        for c in segment.chars() {
            if next(&s.encodes) || !c.is_ascii() && next(&s.flips) {
                out.push_str(&escape(c.to_string().as_bytes(), s.lower_hex));
            } else {
                out.push(c);
            }
        }
    }
    if let Some(q) = s.query {
        out.push_str(&format!("?v={q}"));
    }
    if s.fragment {
        out.push_str("#top");
    }
    out
}

/// The canonical identity, written independently of the gateway's: tokens of
/// characters and escapes, the safe escapes decoded, the host lowercased,
/// segments resolved.
fn reference(uri: &str) -> String {
    #[derive(Clone, Copy)]
    enum T {
        C(char),
        E(u8),
    }
    fn tokens(s: &str, safe: &str) -> Vec<T> {
        let mut out = Vec::new();
        let mut bytes = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let v = u8::from_str_radix(&s[i + 1..i + 3], 16).expect("hex");
                bytes.push(v);
                i += 3;
                continue;
            }
            let c = s[i..].chars().next().expect("char");
            for x in c.to_string().bytes() {
                bytes.push(x);
            }
            i += c.len_utf8();
        }
        for v in bytes {
            let c = v as char;
            if v.is_ascii() && (PLAIN.contains(c) || safe.contains(c) || c == '/' || c == '.') {
                out.push(T::C(c));
            } else {
                out.push(T::E(v));
            }
        }
        out
    }
    fn text(ts: &[T], lower: bool) -> String {
        ts.iter()
            .map(|t| match t {
                T::C(c) if lower => c.to_ascii_lowercase().to_string(),
                T::C(c) => c.to_string(),
                T::E(b) => format!("%{b:02X}"),
            })
            .collect()
    }
    let uri = uri.split('#').next().unwrap_or_default();
    let uri = uri.split('?').next().unwrap_or_default();
    let (scheme, rest) = uri.split_once("://").expect("scheme");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = text(&tokens(host, "!$'()*+"), true);
    let path = text(&tokens(path, SAFE), false);
    let mut kept: Vec<&str> = Vec::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        match segment {
            "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
    }
    format!(
        "{}://{host}/{}",
        scheme.to_ascii_lowercase(),
        kept.join("/")
    )
}

/// The resource the SDK's own template matcher resolves each URI to.
async fn sdk_resolves(uris: &[String]) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/uri_match.py");
    let mut child = tokio::process::Command::new(peers_dir().join("venv/bin/python"))
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the Python SDK venv runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(json!(uris).to_string().as_bytes())
        .await
        .expect("write URIs");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the matcher finishes in time")
        .expect("the matcher runs");
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("the matcher prints JSON")
}

/// Random spellings of random resources: the gateway's canonical identity is
/// the reference's, canonicalizing is idempotent, and any two spellings the
/// SDK resolves to one (template, variables) have one identity — so one
/// decision (rules match the identity) and one bucket (keys are built from it).
#[tokio::test]
async fn spellings_the_sdk_resolves_alike_are_one_resource_to_the_gateway() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut runner = TestRunner::default();
    let mut uris = Vec::new();
    for _ in 0..100 {
        let base = resource().new_tree(&mut runner).expect("tree").current();
        for _ in 0..8 {
            let s = spelling().new_tree(&mut runner).expect("tree").current();
            uris.push(spell(&base, &s));
        }
    }
    let resolved = sdk_resolves(&uris).await;
    assert_eq!(resolved.len(), uris.len());
    let mut identity_of: HashMap<String, (String, &str)> = HashMap::new();
    let mut alike = 0;
    for (uri, sdk) in uris.iter().zip(&resolved) {
        let c = canonical(uri).unwrap_or_else(|e| panic!("{uri} is refused: {e}"));
        assert_eq!(c.identity(), reference(uri), "{uri}");
        let again = canonical(c.as_str()).expect("canonical again");
        assert_eq!(again.as_str(), c.as_str(), "idempotent on {uri}");
        if sdk.is_null() {
            continue;
        }
        let key = sdk.to_string();
        match identity_of.get(&key) {
            Some((identity, first)) => {
                alike += 1;
                assert_eq!(
                    c.identity(),
                    identity,
                    "{uri} and {first} resolve alike in the SDK ({key})"
                );
            }
            None => {
                identity_of.insert(key, (c.identity().to_owned(), uri));
            }
        }
    }
    assert!(
        alike >= 30,
        "enough spellings resolve alike in the SDK to test the property: {alike}"
    );
}

/// Random structure-changing edits of a plain URI are refused, whatever else
/// the spelling does.
#[test]
fn spellings_that_change_structure_are_always_refused() {
    let edits = proptest::sample::select(vec![
        "%2F",
        "%2f",
        "%5C",
        "\\",
        "/%2e%2e/",
        "/%2E/",
        "%00",
        "%1b",
        "%7F",
        "%252e",
        "%25%32%65",
        "%FF",
        "%C3",
        "%g1",
        "%23",
        "%3F",
        "%2C",
        "%C2%9B",
    ]);
    proptest!(ProptestConfig::with_cases(200), |(
        base in resource(),
        s in spelling(),
        edit in edits,
        at in 0usize..64,
    )| {
        let uri = spell(&base, &Spelling { fragment: false, query: None, ..s });
        // Somewhere in the path, after `scheme://host/`.
        let start = uri.find("://").map(|i| i + 3).unwrap_or(0);
        let start = start + uri[start..].find('/').unwrap_or(0) + 1;
        let mut cut = start + at % (uri.len() - start + 1);
        while !uri.is_char_boundary(cut) || uri[..cut].ends_with('%') || uri[..cut].chars().rev().nth(1) == Some('%') {
            cut -= 1;
        }
        let edited = format!("{}{edit}{}", &uri[..cut], &uri[cut..]);
        prop_assert!(canonical(&edited).is_err(), "{edited} was accepted as {:?}", canonical(&edited).map(|c| c.as_str().to_owned()));
    });
}
