use std::num::NonZeroU32;

use serde_json::json;

use super::*;
use crate::config;

fn policy(rules: &str) -> Policy {
    let text = format!(
        r#"
[servers.flights]
url = "http://127.0.0.1:1/mcp"
[servers.crm]
url = "http://127.0.0.1:2/mcp"
[clients.alice]
api_key_sha256 = "{k}"
[clients.bob]
api_key_sha256 = "{k2}"
[clients.anonymous]
{rules}"#,
        k = "a".repeat(64),
        k2 = "b".repeat(64),
    );
    config::load_str(&text, "test.toml", &|_| None)
        .expect("valid config")
        .policy
}

fn alice() -> ClientId {
    ClientId::named("alice")
}

#[test]
fn deny_by_default() {
    let p = policy("");
    assert!(!p.decide(&alice(), "flights", Subject::Tool("echo")).allowed);
}

#[test]
fn allow_rules_match_client_server_and_tool() {
    let p = policy(
        r#"
[[rules]]
clients = ["alice"]
servers = ["flights"]
tools = ["search_*", "echo"]
action = "allow"
"#,
    );
    assert!(
        p.decide(&alice(), "flights", Subject::Tool("search_flights"))
            .allowed
    );
    assert!(p.decide(&alice(), "flights", Subject::Tool("echo")).allowed);
    assert!(!p.decide(&alice(), "crm", Subject::Tool("echo")).allowed);
    assert!(
        !p.decide(&ClientId::named("bob"), "flights", Subject::Tool("echo"))
            .allowed
    );
    assert!(
        !p.decide(&alice(), "flights", Subject::Tool("delete_all"))
            .allowed
    );
    // Tool rules say nothing about resources or prompts.
    assert!(
        !p.decide(&alice(), "flights", Subject::Resource("echo"))
            .allowed
    );
}

#[test]
fn deny_overrides_allow_wherever_it_stands() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["*"]
tools = ["*"]
action = "allow"
[[rules]]
clients = ["bob"]
servers = ["flights"]
tools = ["delete_*"]
action = "deny"
"#,
    );
    let d = p.decide(
        &ClientId::named("bob"),
        "flights",
        Subject::Tool("delete_booking"),
    );
    assert_eq!(
        d,
        Decision {
            allowed: false,
            rule: Some(1),
            allow_rules: vec![]
        }
    );
    assert!(
        p.decide(&alice(), "flights", Subject::Tool("delete_booking"))
            .allowed
    );
}

#[test]
fn star_does_not_cover_the_anonymous_client() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["*"]
tools = ["*"]
action = "allow"
[[rules]]
clients = ["anonymous"]
servers = ["flights"]
tools = ["echo"]
action = "allow"
"#,
    );
    let anon = ClientId::anonymous();
    assert!(!p.decide(&anon, "flights", Subject::Tool("search")).allowed);
    assert!(p.decide(&anon, "flights", Subject::Tool("echo")).allowed);
}

#[test]
fn argument_constraints_of_matching_allow_rules_apply() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["book"]
action = "allow"
arguments = { properties = { passengers = { maximum = 4 } } }
"#,
    );
    let d = p.decide(&alice(), "flights", Subject::Tool("book"));
    assert_eq!(p.check_arguments(&d, &json!({"passengers": 2})), Ok(()));
    let (rule, violations) = p
        .check_arguments(&d, &json!({"passengers": 5}))
        .expect_err("refused");
    assert_eq!(rule, 0);
    assert_eq!(
        violations[0].line(),
        "/passengers: expected a number ≤ 4, got 5"
    );
}

#[test]
fn resources_and_prompts_have_their_own_globs() {
    let p = policy(
        r#"
[[rules]]
clients = ["alice"]
servers = ["crm"]
resources = ["file:///public/*"]
prompts = ["summarize"]
action = "allow"
"#,
    );
    assert!(
        p.decide(&alice(), "crm", Subject::Resource("file:///public/a.txt"))
            .allowed
    );
    assert!(
        !p.decide(&alice(), "crm", Subject::Resource("file:///private/a.txt"))
            .allowed
    );
    assert!(
        p.decide(&alice(), "crm", Subject::Prompt("summarize"))
            .allowed
    );
    assert!(
        !p.decide(&alice(), "crm", Subject::Tool("summarize"))
            .allowed
    );
}

#[test]
fn closest_names_are_suggested() {
    let names = ["search_flights", "book_flight", "echo", "cancel_booking"];
    assert_eq!(closest("serch_flights", &names, 3), vec!["search_flights"]);
    assert_eq!(
        closest("book", &names, 3),
        vec!["book_flight", "cancel_booking"]
    );
    assert!(closest("zzzzzz", &names, 3).is_empty());
}

#[test]
fn suggestions_are_bounded_work_whatever_the_name() {
    // A name past the suggestion cap is not compared at all (it was 2.6 s at 1 MB).
    let huge = "search_flights".repeat(80_000);
    let names = ["search_flights", "book_flight"];
    assert!(closest(&huge, &names, 3).is_empty());
    // Up to the cap, near names are still found, and long candidates are skipped.
    let long = format!("{}x", "a".repeat(120));
    let near = "a".repeat(120);
    let far = "b".repeat(100_000);
    let many: Vec<&str> = std::iter::repeat_n(far.as_str(), 5000)
        .chain([near.as_str()])
        .collect();
    assert_eq!(
        closest(&long, &[near.as_str(), &far], 3),
        vec![near.as_str()]
    );
    // Only the first candidates are looked at: the bound is on the work, not the answer.
    assert!(closest(&long, &many, 3).is_empty());
}

#[test]
fn rates_describe_themselves() {
    let rate = Rate {
        burst: NonZeroU32::MIN.saturating_add(2),
        per_second: 0.05,
        key: RateKey::Client,
    };
    assert_eq!(rate.describe(), "3 calls, then 1 every 20 s, per client");
}

/// The rule index decides exactly what a scan of every rule in file order
/// decides, for any rules, client, server and subject.
mod index_agrees_with_a_scan {
    use proptest::prelude::*;

    use super::*;

    const PATTERNS: &[&str] = &[
        "*",
        "a",
        "b",
        "ab",
        "a*",
        "*b",
        "?b",
        "[ab]*",
        "c",
        "anonymous",
    ];
    const NAMES: &[&str] = &["a", "b", "ab", "ba", "c", "abc", "anonymous", ""];

    fn globs() -> impl Strategy<Value = Vec<Glob>> {
        proptest::collection::vec(proptest::sample::select(PATTERNS), 0..3).prop_map(|ps| {
            ps.into_iter()
                .map(|p| Glob::new(p).expect("a valid pattern"))
                .collect()
        })
    }

    fn rule() -> impl Strategy<Value = (Vec<Glob>, Vec<Glob>, Vec<Glob>, Vec<Glob>, bool)> {
        (globs(), globs(), globs(), globs(), any::<bool>())
    }

    /// The decision as it was made before the index: every rule visited.
    fn scan(p: &Policy, client: &ClientId, server: &str, subject: Subject<'_>) -> Decision {
        let mut allow_rules = Vec::new();
        for (i, rule) in p.rules.iter().enumerate() {
            if !rule.matches(client, server, subject) {
                continue;
            }
            match rule.action {
                Action::Deny => {
                    return Decision {
                        allowed: false,
                        rule: Some(rule.index),
                        allow_rules: Vec::new(),
                    };
                }
                Action::Allow => allow_rules.push(i),
            }
        }
        Decision {
            allowed: !allow_rules.is_empty(),
            rule: allow_rules.first().map(|i| p.rules[*i].index),
            allow_rules,
        }
    }

    proptest! {
        #[test]
        fn for_any_rules(
            // Up to 70 rules, so the bit sets span more than one word.
            rules in proptest::collection::vec(rule(), 0..70),
            client in proptest::sample::select(NAMES),
            anonymous in any::<bool>(),
            server in proptest::sample::select(NAMES),
            name in proptest::sample::select(NAMES),
            kind in 0..3u8,
        ) {
            let rules = rules
                .into_iter()
                .enumerate()
                .map(|(index, (clients, servers, tools, prompts, deny))| Rule {
                    flow: None,
                    index,
                    clients,
                    servers,
                    resources: tools.clone(),
                    tools,
                    prompts,
                    action: if deny { Action::Deny } else { Action::Allow },
                    rate: None,
                    arguments: None,
                    approval: None,
                    when: None,
                })
                .collect();
            let p = Policy::new(rules);
            let client = if anonymous { ClientId::anonymous() } else { ClientId::named(client) };
            let subject = match kind {
                0 => Subject::Tool(name),
                1 => Subject::Resource(name),
                _ => Subject::Prompt(name),
            };
            prop_assert_eq!(p.decide(&client, server, subject), scan(&p, &client, server, subject));
        }
    }
}

#[test]
fn the_strictest_approval_of_the_matching_rules_wins() {
    let rule = |tools: &str, by: &str| {
        format!(
            "[[rules]]\nclients = [\"*\"]\nservers = [\"flights\"]\ntools = [\"{tools}\"]\naction = \"allow\"\napproval = {{ by = \"{by}\" }}\n"
        )
    };
    let by = |rules: &str, tool: &str| {
        let p = policy(rules);
        let e = p.resolve(&alice(), "flights", Subject::Tool(tool));
        e.approval.map(|a| (a.by.as_str(), a.rule))
    };
    // Operator over either over user, whatever the order in the file.
    let rules = [
        rule("*", "user"),
        rule("book_*", "operator"),
        rule("book_flight", "either"),
    ]
    .concat();
    assert_eq!(by(&rules, "book_flight"), Some(("operator", 1)));
    assert_eq!(by(&rules, "echo"), Some(("user", 0)));
    let rules = [rule("*", "either"), rule("book_*", "user")].concat();
    assert_eq!(by(&rules, "book_flight"), Some(("either", 0)));
    // The first in file order among equals.
    let rules = [rule("book_*", "operator"), rule("*", "operator")].concat();
    assert_eq!(by(&rules, "book_flight"), Some(("operator", 0)));
}

#[test]
fn every_rate_and_constraint_of_the_matching_allow_rules_applies() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "allow"
rate = { burst = 5, per_second = 1.0 }
[[rules]]
clients = ["alice"]
servers = ["flights"]
tools = ["book_*"]
action = "allow"
rate = { burst = 2, per_second = 1.0 }
arguments = { properties = { passengers = { maximum = 4 } } }
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["book_flight"]
action = "allow"
arguments = { required = ["date"] }
"#,
    );
    let e = p.resolve(&alice(), "flights", Subject::Tool("book_flight"));
    assert_eq!(e.rates.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(e.constraints, [1, 2]);
    let e = p.resolve(
        &ClientId::named("bob"),
        "flights",
        Subject::Tool("book_flight"),
    );
    assert_eq!(e.rates.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0]);
    assert_eq!(e.constraints, [2]);
}

/// Where `text` (a source file) calls the fact-less [`Policy::decide`]: the
/// 1-based lines of each call, whatever its spacing and line breaks.
fn factless_calls(text: &str) -> Vec<usize> {
    // Test modules sit at the end of a file; comments say nothing.
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut squeezed = String::new();
    let mut lines = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or_default();
        for c in line.chars().filter(|c| !c.is_whitespace()) {
            squeezed.push(c);
            lines.push(n + 1);
        }
    }
    let mut found = Vec::new();
    for needle in ["policy.decide(", "Policy::decide("] {
        found.extend(squeezed.match_indices(needle).map(|(i, _)| lines[i]));
    }
    found
}

/// Every use on the request path is decided with its facts: a call of the
/// fact-less decision there would leave a condition that reads the claims,
/// the method, the labels or the arguments undecided, and count an allow
/// rule as matching (fail open). Only `portcullis check` without a request
/// may decide knowing nothing of the use.
#[test]
fn nothing_on_the_request_path_decides_without_the_uses_facts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stack = vec![root.join("src/proxy")];
    let mut found = Vec::new();
    let mut read = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/proxy") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let is_test = path.file_stem().is_some_and(|s| s == "tests");
            if path.extension().is_none_or(|e| e != "rs") || is_test {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            read += 1;
            for line in factless_calls(&text) {
                found.push(format!(
                    "{}:{line}: Policy::decide knows nothing of the use; decide it with its facts \
                     (decide_listed, decide_use, decide_call)",
                    path.strip_prefix(root).unwrap_or(&path).display()
                ));
            }
        }
    }
    assert!(read > 20, "src/proxy was not read");
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The scan sees a call however it is spelled, and nothing else.
    let seen = "let d = config\n    .policy\n    .decide(client, &server, subject);\n";
    assert_eq!(factless_calls(seen), [2]);
    assert_eq!(
        factless_calls("crate::policy::Policy::decide(&p, c, s, x)"),
        [1]
    );
    for fine in [
        "config.policy.decide_listed(client, name, subject, &facts)",
        "config.policy.decide_use(client, name, subject, &facts)",
        "// policy.decide(client, server, subject)",
        "state.approvals.decide(&id, approve, &by, now)",
        "#[cfg(test)]\nmod tests { fn f() { policy.decide(a, b, c); } }",
    ] {
        assert!(factless_calls(fine).is_empty(), "seen: {fine}");
    }
}
