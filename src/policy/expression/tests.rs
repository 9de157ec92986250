use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::config;
use crate::policy::{Policy, Subject};

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
{rules}"#,
        k = "a".repeat(64),
        k2 = "b".repeat(64),
    );
    config::load_str(&text, "test.toml", &|_| None)
        .expect("valid config")
        .policy
}

fn facts(arguments: &Value) -> Facts<'_> {
    Facts {
        claims: None,
        method: "tools/call",
        arguments,
        annotations: None,
    }
}

#[test]
fn outcomes() {
    let alice = ClientId::named("alice");
    let args = json!({"n": 2, "big": 18446744073709551615u64, "x": 1.5});
    let eval = |source: &str, with: bool| {
        let e = Expression::compile(source).expect("compiles");
        let f = facts(&args);
        e.evaluate(&alice, "flights", "book", with.then_some(&f))
    };
    assert_eq!(eval("arguments.n <= 2", true), Outcome::True);
    assert_eq!(eval("arguments.x < 2.0", true), Outcome::True);
    assert_eq!(
        eval("arguments.big == 18446744073709551615u", true),
        Outcome::True
    );
    assert_eq!(eval("arguments.n <= 2", false), Outcome::Deferred);
    assert_eq!(
        eval("client == 'alice' && tool == 'book'", false),
        Outcome::True
    );
    assert_eq!(eval("server == 'crm'", true), Outcome::False);
    assert_eq!(
        eval("claims.size() == 0 && annotations.size() == 0", true),
        Outcome::True
    );
    assert_eq!(
        eval("now > timestamp('2020-01-01T00:00:00Z')", true),
        Outcome::True
    );
    assert!(
        matches!(eval("arguments.missing == 1", true), Outcome::Failed(why) if why.contains("missing"))
    );
    assert!(
        matches!(eval("arguments.n", true), Outcome::Failed(why) if why.contains("instead of a bool"))
    );
}

#[test]
fn a_bad_expression_is_refused_at_load_with_its_column() {
    let text = r#"
[servers.flights]
url = "http://127.0.0.1:1/mcp"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "allow"
when = "arguments.n <"
"#;
    let err = config::load_str(text, "t.toml", &|_| None)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("t.toml:9:8"), "{err}");
    assert!(err.contains("rules[0].when"), "{err}");
    assert!(
        err.contains("not a valid CEL expression: at column"),
        "{err}"
    );
    // `when` decides tool calls only.
    let err = config::load_str(
        &text
            .replace("tools = [\"*\"]", "resources = [\"*\"]")
            .replace("arguments.n <", "true"),
        "t.toml",
        &|_| None,
    )
    .expect_err("refused")
    .to_string();
    assert!(err.contains("`when` decides tool calls"), "{err}");
}

/// Conditions a generated rule may carry: (expression, reads call-time facts).
const WHENS: &[(&str, bool)] = &[
    ("arguments.n <= 2", true),
    ("has(arguments.n) && arguments.n > 3", true),
    ("arguments.n == 1 || client == 'bob'", true),
    ("client == 'alice'", false),
    ("tool.startsWith('book')", false),
    ("server == 'crm'", false),
    ("client + 1 == 2", false),
];
const CLIENTS: &[&str] = &["*", "alice", "bob"];
const TOOLS: &[&str] = &["*", "book*", "echo"];
const SERVERS: &[&str] = &["*", "flights", "crm"];

fn rule() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(CLIENTS),
        proptest::sample::select(SERVERS),
        proptest::sample::select(TOOLS),
        any::<bool>(),
        0..=WHENS.len(),
    )
        .prop_map(|(client, server, tool, deny, when)| {
            let when = WHENS
                .get(when)
                .map(|(w, _)| format!("when = {w:?}\n"))
                .unwrap_or_default();
            format!(
                "[[rules]]\nclients = [{client:?}]\nservers = [{server:?}]\ntools = [{tool:?}]\naction = \"{}\"\n{when}",
                if deny { "deny" } else { "allow" }
            )
        })
}

proptest! {
    /// For generated rules and calls: a tool a client may call is listed to
    /// it, and a listed tool is callable with every arguments unless a rule
    /// that matches it has a condition reading call-time facts.
    #[test]
    fn the_list_and_the_calls_agree_except_where_a_condition_reads_the_call(
        rules in proptest::collection::vec(rule(), 0..8),
    ) {
        let p = policy(&rules.concat());
        for client in ["alice", "bob"].map(ClientId::named) {
            for server in ["flights", "crm"] {
                for tool in ["book_flight", "echo"] {
                    let listed = p.decide(&client, server, Subject::Tool(tool)).allowed;
                    let reads = p.rules.iter().any(|r| {
                        r.matches(&client, server, Subject::Tool(tool))
                            && r.when.as_ref().is_some_and(Expression::reads_call)
                    });
                    for n in 0..6 {
                        let arguments = json!({"n": n});
                        let called = p
                            .decide_call(&client, server, tool, &facts(&arguments))
                            .is_ok_and(|d| d.allowed);
                        prop_assert!(!called || listed, "{} may call {tool} on {server} (n = {n}) but it is not listed", client.name());
                        if !reads {
                            prop_assert_eq!(called, listed, "{} {} {} n = {}", client.name(), server, tool, n);
                        }
                    }
                }
            }
        }
    }
}

/// What the book says of types: ordering a value of the wrong type fails
/// (the call is denied); equality across types is CEL's answer (false for
/// `==`, true for `!=`), never an error — which is why an allow condition
/// should pin the type it compares.
#[test]
fn ordering_across_types_fails_and_equality_compares() {
    let alice = ClientId::named("alice");
    let eval = |source: &str, args: Value| {
        let e = Expression::compile(source).expect("compiles");
        e.evaluate(&alice, "flights", "book", Some(&facts(&args)))
    };
    for sent in [
        json!("3"),
        json!([3]),
        json!({"n": 3}),
        json!(null),
        json!(true),
    ] {
        let args = json!({ "n": sent });
        assert!(
            matches!(eval("arguments.n <= 5", args.clone()), Outcome::Failed(_)),
            "{args}"
        );
        assert_eq!(
            eval("arguments.env != 'prod'", json!({"env": sent.clone()})),
            Outcome::True
        );
        let pinned = match sent.is_string() {
            true => Outcome::True,
            false => Outcome::False,
        };
        assert_eq!(
            eval(
                "type(arguments.env) == string && arguments.env != 'prod'",
                json!({"env": sent})
            ),
            pinned
        );
    }
    // Numbers of different kinds compare by value, whatever their JSON spelling.
    for (sent, expected) in [
        (json!(5), Outcome::True),
        (json!(5.0), Outcome::True),
        (json!(5.5), Outcome::False),
        (json!(-0.0), Outcome::True),
        (json!(18446744073709551615u64), Outcome::False),
        (json!(1e300), Outcome::False),
    ] {
        assert_eq!(
            eval("arguments.n <= 5", json!({ "n": sent })),
            expected,
            "{sent}"
        );
    }
}
