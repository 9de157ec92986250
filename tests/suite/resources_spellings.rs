//! The property behind resource decisions, one decision and one bucket: random spellings of
//! random resources, resolved by the official Python SDK's own template matcher, are one
//! resource to the gateway whenever the SDK resolves them alike (the canonical form is the
//! reference's and canonicalizing is idempotent), and a random edit that changes a URI's
//! structure is always refused; and the query values a condition reads are the ones the SDKs bind
//! (the Python SDK's, the TypeScript SDK's and FastMCP's matchers), a query never adding a climbing
//! segment to a path.

use crate::support;
use support::tiers::{self, Tier};

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use portcullis::policy::expression::query::parameters;
use portcullis::policy::uri::canonical;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};
use support::peers_dir;
use tokio::io::AsyncWriteExt;

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

/// What an SDK's own template matcher binds for each URI: `script` (under
/// `tests/peers/`) run by `program`, URIs in as JSON, one answer per URI out.
async fn matcher(program: std::path::PathBuf, script: &str, uris: &[String]) -> Vec<Value> {
    let script = format!("{}/tests/peers/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = tokio::process::Command::new(program)
        .arg(script)
        .env("PORTCULLIS_PEERS", peers_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the matcher runs");
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
    let answers: Vec<Value> = serde_json::from_slice(&out.stdout).expect("the matcher prints JSON");
    assert_eq!(answers.len(), uris.len());
    answers
}

/// The resource the Python SDK's matcher resolves each URI to.
async fn sdk_resolves(uris: &[String]) -> Vec<Value> {
    matcher(peers_dir().join("venv/bin/python"), "uri_match.py", uris).await
}

/// What the TypeScript SDK's matcher binds for each URI.
async fn ts_sdk_resolves(uris: &[String]) -> Vec<Value> {
    matcher("node".into(), "uri_match.mjs", uris).await
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

/// A random query: pairs of a name (the template's, spelled raw or encoded,
/// or another) and a value made of characters and escapes, some of which a
/// reader may take for structure (`+`, `;`, `&`, `=`, `,`, `?`, `#`).
fn query() -> impl Strategy<Value = String> {
    let name = proptest::sample::select(vec![
        "level", "since", "lev%65l", "%73ince", "LEVEL", "x", "",
    ]);
    let token = proptest::sample::select(vec![
        "a", "Z", "0", "-", ".", "_", "~", "%20", " ", "%2B", "%2b", "+", ";", "%3B", "%26", "%3D",
        "=", "%C3%A9", "é", ",", "%2C", "?", "%3F", "/", ":", "@", "!", "*", "'", "(", "%25",
        "%41", "#x",
    ]);
    let value = proptest::collection::vec(token, 0..5).prop_map(|t| t.concat());
    let pair = (name, any::<bool>(), value).prop_map(|(n, eq, v)| match eq {
        true => format!("{n}={v}"),
        false => n.to_owned(),
    });
    proptest::collection::vec(pair, 0..4).prop_map(|pairs| pairs.join("&"))
}

/// Random queries on the Python test server's `logs://{service}{?level,since}`:
/// wherever a condition may read a query (the gateway neither refuses the
/// URI nor finds servers would read its query differently), the SDK's own
/// matcher, given the canonical URI the gateway forwards, binds each of the
/// template's names to exactly the value the condition reads as `query`, and
/// binds none the condition does not see. What is judged is what runs.
#[tokio::test]
async fn a_condition_reads_the_query_values_the_sdk_binds() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut runner = TestRunner::default();
    let mut forwarded = Vec::new();
    let mut ambiguous = 0;
    for _ in 0..600 {
        let q = query().new_tree(&mut runner).expect("tree").current();
        let Ok(c) = canonical(&format!("logs://api?{q}")) else {
            continue;
        };
        match parameters(c.query()) {
            Ok(_) => forwarded.push(c),
            Err(_) => ambiguous += 1,
        }
    }
    let uris: Vec<String> = forwarded.iter().map(|c| c.as_str().to_owned()).collect();
    let resolved = sdk_resolves(&uris).await;
    assert_eq!(resolved.len(), uris.len());
    let mut bound = 0;
    for (c, sdk) in forwarded.iter().zip(&resolved) {
        assert_eq!(
            sdk["template"],
            "logs://{service}{?level,since}",
            "{}: {sdk}",
            c.as_str()
        );
        let read = parameters(c.query()).expect("read above");
        for name in ["level", "since"] {
            let judged = read
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_ref());
            let runs = sdk["vars"][name].as_str();
            assert_eq!(judged, runs, "{name} of {}: {sdk}", c.as_str());
            bound += usize::from(runs.is_some());
        }
    }
    assert!(
        forwarded.len() >= 150 && ambiguous >= 50 && bound >= 150,
        "enough of each case to test the property: {} read, {ambiguous} refused, {bound} bound",
        forwarded.len()
    );
}

/// A random query made of path and query structure: `/`, dot segments,
/// `?` raw and encoded, pairs.
fn structured_query() -> impl Strategy<Value = String> {
    let token = proptest::sample::select(vec![
        "/", ".", "..", "?", "%3F", "=", "&", "level", "level=", "x", "debug", "%20",
    ]);
    proptest::collection::vec(token, 0..8).prop_map(|t| t.concat())
}

/// Random queries on URIs the TypeScript SDK matches against the whole URI
/// (`logs://{service}{?level}`, `file:///{+path}`): wherever the gateway
/// forwards the URI, the SDK binds the judged resource's own variable
/// (`service` is `api`), a `level` that decodes to the value a condition
/// reads, and a path that a query never makes climb (no `..` segment).
#[tokio::test]
async fn the_typescript_sdk_binds_what_was_judged() {
    if !tiers::ready(&[Tier::Node]) {
        return;
    }
    let mut runner = TestRunner::default();
    let mut forwarded = Vec::new();
    for _ in 0..1000 {
        let q = prop_oneof![query(), structured_query()]
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        for base in ["logs://api", "file:///public/a"] {
            if let Ok(c) = canonical(&format!("{base}?{q}")) {
                forwarded.push(c);
            }
        }
    }
    let uris: Vec<String> = forwarded.iter().map(|c| c.as_str().to_owned()).collect();
    let resolved = ts_sdk_resolves(&uris).await;
    assert_eq!(resolved.len(), uris.len());
    let (mut levels, mut paths) = (0, 0);
    for (c, ts) in forwarded.iter().zip(&resolved) {
        let uri = c.as_str();
        match ts["template"].as_str() {
            Some("file:///{+path}") => {
                let path = ts["vars"]["path"].as_str().expect("path");
                assert!(!path.split('/').any(|s| s == ".."), "{uri}: {ts}");
                paths += 1;
            }
            Some("logs://{service}{?level}") => {
                assert_eq!(ts["vars"]["service"], "api", "{uri}: {ts}");
                // A condition reads the query only where no server would read it otherwise.
                let Ok(read) = parameters(c.query()) else {
                    continue;
                };
                let judged = read.iter().find(|(n, _)| *n == "level").map(|(_, v)| v);
                let raw = ts["vars"]["level"].as_str().expect("level");
                let pair = format!("level={raw}");
                let decoded = parameters(&pair).expect("one value");
                assert_eq!(judged, Some(&decoded[0].1), "{uri}: {ts}");
                levels += 1;
            }
            _ => {}
        }
    }
    assert!(
        levels >= 20 && paths >= 100,
        "enough of each case to test the property: {levels} levels, {paths} paths"
    );
}

/// Random queries whose names FastMCP decodes (`%C3%A9` is `é`, `my%20name`
/// is `my name`, `a%2Cb` is `a,b`): wherever a condition may read the query,
/// FastMCP's own matcher binds each of its template's query names to exactly
/// the value the condition reads under that name, and binds none it does not
/// see.
#[tokio::test]
async fn a_condition_reads_the_query_names_fastmcp_decodes() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let name = proptest::sample::select(vec![
        "level",
        "%C3%A9",
        "\u{e9}",
        "my%20name",
        "my name",
        "a%2Cb",
        "a,b",
        "a",
        "b",
    ]);
    let value = proptest::sample::select(vec!["x", "%20", "%C3%A9", "%2C", ",", "%3D"]);
    let pairs = proptest::collection::vec((name, value), 0..4).prop_map(|p| {
        p.iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    });
    let mut runner = TestRunner::default();
    let mut forwarded = Vec::new();
    for _ in 0..300 {
        let q = pairs.new_tree(&mut runner).expect("tree").current();
        if let Ok(c) = canonical(&format!("logs://api?{q}"))
            && parameters(c.query()).is_ok()
        {
            forwarded.push(c);
        }
    }
    let uris: Vec<String> = forwarded.iter().map(|c| c.as_str().to_owned()).collect();
    let program = peers_dir().join("fastmcp-venv/bin/python");
    let bound = matcher(program, "fastmcp_uri_match.py", &uris).await;
    let mut compared = 0;
    for (c, fast) in forwarded.iter().zip(&bound) {
        let read = parameters(c.query()).expect("read above");
        for name in ["level", "\u{e9}", "my name", "a", "b"] {
            let judged = read
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_ref());
            assert_eq!(
                judged,
                fast[name].as_str(),
                "{name} of {}: {fast}",
                c.as_str()
            );
            compared += usize::from(judged.is_some());
        }
    }
    assert!(
        compared >= 100,
        "enough bound names to test the property: {compared}"
    );
}
