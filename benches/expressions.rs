//! Micro-benchmark of a decision over a rule set of 50 rules that all carry a
//! CEL `when` condition: what a `tools/call` pays for the access rules when
//! the rules read the client, the JWT's claims, the tool, its annotations and
//! the call's arguments.
//!
//! Run with `cargo bench --bench expressions`. Settings are kept short (2 s of
//! measurement, 30 samples) because the reference machine has 2 shared cores.
//!
//! The rule set: 50 rules, every one with a `when`, over globs of clients,
//! servers and tools in the shapes operators write (literals, prefixes,
//! suffixes, `*`). For the benchmarked call (`alice` calling `update_ticket`
//! on `crm`), 6 rules match by their globs and have their condition
//! evaluated; the other 44 are left out by their globs before any condition
//! runs. The worst case (`every_rule_matches`) is a set of 50 rules whose
//! globs all match the call, so all 50 conditions run.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Map, Value, json};

use portcullis::auth::ClientId;
use portcullis::policy::{Facts, Policy, Subject};

const PREAMBLE: &str = r#"
[servers.crm]
url = "http://127.0.0.1:1/mcp"
[servers.files]
url = "http://127.0.0.1:2/mcp"
[servers.flights]
url = "http://127.0.0.1:3/mcp"
[clients.alice]
api_key_sha256 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
[clients.bob]
api_key_sha256 = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
[clients.svc-export]
api_key_sha256 = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
"#;

/// The six rules that match `alice` calling `update_ticket` on `crm`: four
/// allow rules whose conditions are true, two deny rules whose conditions are
/// false (so the call is allowed and every one of them is evaluated).
const MATCHING: [(&str, &str, &str, &str, &str); 6] = [
    (
        r#"["*"]"#,
        r#"["crm"]"#,
        r#"["update_*", "get_*"]"#,
        "allow",
        "claims.team == arguments.ticket.team",
    ),
    (
        r#"["alice", "bob"]"#,
        r#"["crm", "files"]"#,
        r#"["*_ticket"]"#,
        "allow",
        "'support' in claims.roles && arguments.priority <= 3",
    ),
    (
        r#"["*"]"#,
        r#"["crm"]"#,
        r#"["*"]"#,
        "deny",
        "has(arguments.note) && arguments.note.contains('DROP TABLE')",
    ),
    (
        r#"["alice"]"#,
        r#"["c?m"]"#,
        r#"["update_ticket"]"#,
        "allow",
        "client == 'alice' && tool.startsWith('update_') && server == 'crm'",
    ),
    (
        r#"["*"]"#,
        r#"["*"]"#,
        r#"["*_ticket", "*_tickets"]"#,
        "deny",
        "annotations.destructiveHint == true && !('admin' in claims.roles)",
    ),
    (
        r#"["*"]"#,
        r#"["crm"]"#,
        r#"["update_*"]"#,
        "allow",
        "claims.tenant == 'acme' && size(arguments.note) < 10000",
    ),
];

/// One of the 44 rules that do not match the call by their globs, `i` in 0..44:
/// other clients, other servers, other tools, each with a condition of its own.
fn other_rule(i: usize) -> (String, String, String, &'static str, String) {
    let quoted = |s: String| format!("[\"{s}\"]");
    match i % 4 {
        0 => (
            r#"["*"]"#.into(),
            r#"["crm"]"#.into(),
            quoted(format!("report_{i}_*")),
            "allow",
            format!("claims.team == 'team{i}' || 'auditor' in claims.roles"),
        ),
        1 => (
            r#"["svc-*"]"#.into(),
            r#"["*"]"#.into(),
            r#"["*"]"#.into(),
            "allow",
            format!("claims.sub == 'service-{i}' && tool != 'delete_all'"),
        ),
        2 => (
            r#"["*"]"#.into(),
            r#"["files"]"#.into(),
            quoted(format!("read_{i}_*")),
            "deny",
            format!("has(arguments.path) && arguments.path.startsWith('/secret/{i}')"),
        ),
        _ => (
            r#"["alice", "bob"]"#.into(),
            r#"["flights"]"#.into(),
            quoted(format!("*book_{i}")),
            "allow",
            format!("arguments.passengers <= {}", 1 + i % 9),
        ),
    }
}

fn render(
    rules: impl IntoIterator<Item = (String, String, String, &'static str, String)>,
) -> Policy {
    let mut text = PREAMBLE.to_owned();
    for (clients, servers, tools, action, when) in rules {
        text.push_str(&format!(
            "\n[[rules]]\nclients = {clients}\nservers = {servers}\ntools = {tools}\naction = \"{action}\"\nwhen = \"{}\"\n",
            when.replace('\\', "\\\\").replace('"', "\\\"")
        ));
    }
    portcullis::config::load_str(&text, "bench.toml", &|_| None)
        .unwrap_or_else(|e| panic!("the benchmark policy is valid: {e}"))
        .policy
}

/// The realistic set: the 6 matching rules spread among 44 others, in file order.
fn fifty_rules() -> Policy {
    let mut others = (0..44).map(other_rule);
    let mut rules = Vec::new();
    for (clients, servers, tools, action, when) in MATCHING {
        rules.push((
            clients.to_owned(),
            servers.to_owned(),
            tools.to_owned(),
            action,
            when.to_owned(),
        ));
        rules.extend(others.by_ref().take(8));
    }
    rules.extend(others);
    assert_eq!(rules.len(), 50);
    render(rules)
}

/// The worst case: the 6 matching rules repeated until there are 50, so every
/// condition runs.
fn every_rule_matches() -> Policy {
    render(MATCHING.iter().cycle().take(50).map(|r| {
        (
            r.0.to_owned(),
            r.1.to_owned(),
            r.2.to_owned(),
            r.3,
            r.4.to_owned(),
        )
    }))
}

fn claims() -> Map<String, Value> {
    match json!({
        "iss": "https://idp.example.com",
        "sub": "alice@example.com",
        "aud": "https://gateway.example.com/mcp",
        "exp": 1_900_000_000u64,
        "team": "payments",
        "tenant": "acme",
        "roles": ["support", "reader"],
        "scope": "mcp:tools"
    }) {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("cel");
    let alice = ClientId::named("alice");
    let bob = ClientId::named("bob");
    let claims = claims();
    let arguments = json!({
        "ticket": {"id": 48213, "team": "payments"},
        "priority": 2,
        "status": "waiting",
        "note": "customer called back; refund approved by the team lead"
    });
    let dropping = json!({
        "ticket": {"id": 48213, "team": "payments"},
        "priority": 2,
        "note": "DROP TABLE tickets"
    });
    let annotations = json!({"title": "Update a ticket", "destructiveHint": false});
    let facts = |arguments| Facts {
        claims: Some(&claims),
        method: "tools/call",
        arguments: Some(arguments),
        annotations: Some(&annotations),
        query: None,
        labels: &[],
    };
    let (allowed, denied) = (facts(&arguments), facts(&dropping));

    for (name, p) in [
        ("50_rules", fifty_rules()),
        ("50_rules_every_rule_matches", every_rule_matches()),
    ] {
        let d = p
            .decide_call(&alice, "crm", "update_ticket", &allowed)
            .expect("no condition fails");
        assert!(d.allowed && !d.allow_rules.is_empty(), "{d:?}");
        let d = p
            .decide_call(&alice, "crm", "update_ticket", &denied)
            .expect("no condition fails");
        assert!(!d.allowed && d.rule.is_some(), "{d:?}");
        let d = p
            .decide_call(&bob, "files", "purge_all", &allowed)
            .expect("no condition fails");
        assert!(!d.allowed && d.rule.is_none(), "{d:?}");

        group.bench_function(format!("{name}/allow"), |b| {
            b.iter(|| {
                p.decide_call(
                    black_box(&alice),
                    black_box("crm"),
                    black_box("update_ticket"),
                    black_box(&allowed),
                )
            })
        });
        group.bench_function(format!("{name}/deny_by_condition"), |b| {
            b.iter(|| {
                p.decide_call(
                    black_box(&alice),
                    black_box("crm"),
                    black_box("update_ticket"),
                    black_box(&denied),
                )
            })
        });
        group.bench_function(format!("{name}/no_rule_matches"), |b| {
            b.iter(|| {
                p.decide_call(
                    black_box(&bob),
                    black_box("files"),
                    black_box("purge_all"),
                    black_box(&allowed),
                )
            })
        });
        // A list: conditions that read call-time facts are left to the call.
        group.bench_function(format!("{name}/list"), |b| {
            b.iter(|| {
                p.decide(
                    black_box(&alice),
                    black_box("crm"),
                    Subject::Tool(black_box("update_ticket")),
                )
            })
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = decisions
}
criterion_main!(benches);
