use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;
use crate::config;
use crate::policy::{Policy, Subject};

mod agree;
mod kinds;

pub(super) fn policy(rules: &str) -> Policy {
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

/// Why the configuration `text` is refused.
pub(super) fn refusal_of(text: &str) -> String {
    config::load_str(text, "t.toml", &|_| None)
        .expect_err("refused")
        .to_string()
}

fn facts(arguments: &Value) -> Facts<'_> {
    Facts {
        claims: None,
        method: "tools/call",
        arguments: Some(arguments),
        annotations: None,
        query: None,
        labels: &[],
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
    // A condition belongs to a rule of one kind of subject.
    let err = config::load_str(
        &text
            .replace("tools = [\"*\"]", "tools = [\"*\"]\nresources = [\"*\"]")
            .replace("arguments.n <", "true"),
        "t.toml",
        &|_| None,
    )
    .expect_err("refused")
    .to_string();
    assert!(err.contains("rules[0].when"), "{err}");
    assert!(err.contains("split it into one rule per kind"), "{err}");
}

/// The evaluation as it was before the scope: a fresh standard context per
/// condition, with every variable converted up front into a `cel::Value`.
fn eager(
    e: &Expression,
    client: &ClientId,
    server: &str,
    tool: &str,
    facts: Option<&Facts<'_>>,
) -> Outcome {
    use std::collections::HashMap;
    use std::sync::Arc;
    fn to_cel(value: &Value) -> cel::Value {
        match value {
            Value::Null => cel::Value::Null,
            Value::Bool(b) => cel::Value::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => cel::Value::Int(i),
                (None, Some(u)) => cel::Value::UInt(u),
                _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => cel::Value::String(Arc::new(s.clone())),
            Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
            Value::Object(map) => object(map),
        }
    }
    fn object(map: &Map<String, Value>) -> cel::Value {
        let converted: HashMap<String, cel::Value> =
            map.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
        cel::Value::from(converted)
    }
    if facts.is_none() && e.reads_call() {
        return Outcome::Deferred;
    }
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("client", client.name());
    ctx.add_variable_from_value("server", server);
    ctx.add_variable_from_value("tool", tool);
    if let Some(f) = facts {
        let empty = Map::new();
        ctx.add_variable_from_value("method", f.method);
        if let Some(arguments) = f.arguments {
            ctx.add_variable_from_value("arguments", to_cel(arguments));
        }
        ctx.add_variable_from_value("claims", object(f.claims.unwrap_or(&empty)));
        let annotations = match f.annotations {
            Some(v @ Value::Object(_)) => to_cel(v),
            _ => object(&empty),
        };
        ctx.add_variable_from_value("annotations", annotations);
        let now = chrono::Utc::now().fixed_offset();
        ctx.add_variable_from_value("now", cel::Value::Timestamp(now));
    }
    match e.program.execute(&ctx) {
        Ok(cel::Value::Bool(true)) => Outcome::True,
        Ok(cel::Value::Bool(false)) => Outcome::False,
        Ok(other) => Outcome::Failed(format!(
            "the expression yielded {} instead of a bool",
            other.type_of()
        )),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// Conditions over every variable, in the shapes rules use them: members,
/// `has`, `in`, sizes, string functions, comparisons across number types,
/// macros over lists and maps, and expressions that fail.
const READS: &[&str] = &[
    "arguments.n <= 2",
    "has(arguments.s) && arguments.s.startsWith('a')",
    "arguments.s == 'ab' || arguments.n == 2u",
    "size(arguments) > 1 && 'n' in arguments",
    "arguments.l.exists(x, x == 1) || arguments.l.all(x, x > 0.5)",
    "arguments.m.k == arguments.s",
    "has(arguments.m.k) ? arguments.m.k.contains('b') : arguments.n > 1.0",
    "arguments.l.map(x, x).size() == 2",
    "arguments.m.filter(k, k == 'k').size() >= 1",
    "claims.team == arguments.s && 'admin' in claims.roles",
    "claims.size() == 0",
    "annotations.destructiveHint == true",
    "has(annotations.title)",
    "method == 'tools/call' && tool == 'book' && server == 'flights' && client == 'alice'",
    "now > timestamp('2020-01-01T00:00:00Z')",
    "arguments.n",
    "arguments.missing == 1",
    "undeclared == 1",
    "type(arguments.n) == int",
    "arguments == {'n': 1}",
    // Member selections only, deeper: a scope reading only these converts
    // only the members they name.
    "arguments.m.k == 'b' || has(arguments.m.n)",
    "has(arguments.m.m) && arguments.m.m.l == [1]",
    "arguments.m.m.n > 1 || arguments.m.team == claims.team",
    "claims.roles.exists(r, r == 'payments') && has(claims.team)",
    "arguments.l.m == 1",
    "claims.team.n == 1",
    "has(annotations.m.k) || annotations.m.n == null",
    "arguments.m.l.size() == 2 && 'a' in arguments.m.l",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..4).prop_map(Value::from),
        Just(json!(18446744073709551615u64)),
        (-2.0f64..2.0).prop_map(|f| json!(f)),
        proptest::sample::select(vec!["", "a", "ab", "b", "payments"]).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(
                proptest::sample::select(vec!["n", "s", "l", "m", "k", "team", "roles"]),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

pub(super) fn object_of(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(m) => m,
        other => Map::from_iter([("n".to_owned(), other)]),
    }
}

proptest! {
    /// One scope shared by every condition of a decision, reading variables
    /// on demand and converting only the members the decision's conditions
    /// (a generated subset of [`READS`]) can read, says what a fresh context
    /// per condition with every variable bound up front said, on generated
    /// arguments, claims and annotations; so does each condition alone, in
    /// a scope converting only what it reads, and in one converting all.
    #[test]
    fn a_shared_scope_decides_as_a_fresh_context_per_condition(
        arguments in json_value(),
        claims in json_value(),
        annotations in proptest::option::of(json_value()),
        with_claims in any::<bool>(),
        call in any::<bool>(),
        chosen in proptest::collection::vec(any::<bool>(), READS.len()),
        padding in 0usize..24,
    ) {
        // Members no condition names, so that a large object is converted
        // by looking up the members read rather than walking its own.
        let pad = |mut m: Map<String, Value>| {
            m.extend((0..padding).map(|i| (format!("pad{i}"), json!(i))));
            m
        };
        let arguments = Value::Object(pad(object_of(arguments)));
        let claims = pad(object_of(claims));
        let alice = ClientId::named("alice");
        let f = Facts {
            claims: with_claims.then_some(&claims),
            method: "tools/call",
            arguments: Some(&arguments),
            annotations: annotations.as_ref(),
            query: None,
            labels: &[],
        };
        let facts = call.then_some(&f);
        let conditions: Vec<Expression> = READS
            .iter()
            .zip(&chosen)
            .filter(|(_, c)| **c)
            .map(|(source, _)| Expression::compile(source).expect("compiles"))
            .collect();
        let mut reads = Reads::default();
        for e in &conditions {
            reads.merge(e.reads());
        }
        let scope = Scope::new(&alice, "flights", Subject::Tool("book"), facts, &reads);
        let whole = Reads::whole();
        let everything = Scope::new(&alice, "flights", Subject::Tool("book"), facts, &whole);
        let (mut context, mut all) = (None, None);
        for e in &conditions {
            let source = e.source();
            let fresh = eager(e, &alice, "flights", "book", facts);
            prop_assert_eq!(&e.evaluate_in(&scope, &mut context), &fresh, "{}", source);
            prop_assert_eq!(&e.evaluate_in(&everything, &mut all), &fresh, "{}", source);
            prop_assert_eq!(&e.evaluate(&alice, "flights", "book", facts), &fresh, "{}", source);
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

/// A macro over the arguments whose body reads another value the client
/// sizes costs the product of two client sizes: refused when it compiles,
/// at the read that costs it; what costs the client's input times something
/// the client does not choose compiles.
#[test]
fn a_macro_over_the_arguments_reading_another_client_size_is_refused() {
    let refused = [
        ("arguments.xs.all(x, x in arguments.ys)", 26, "arguments"),
        (
            "arguments.xs.exists(x, arguments.ys.exists(y, y == x))",
            24,
            "arguments",
        ),
        ("arguments.xs.all(x, x.ys.exists(y, y in x.ys))", 41, "x"),
        (
            "arguments.xs.map(x, x).all(y, y in arguments.xs)",
            36,
            "arguments",
        ),
        (
            "claims.gs.exists(g, arguments.xs.all(x, x in arguments.ys))",
            46,
            "arguments",
        ),
        (
            "arguments.xs.filter(x, arguments.s.contains(x)).size() > 0",
            24,
            "arguments",
        ),
        ("arguments.m.all(k, arguments.m[k] > 0)", 20, "arguments"),
    ];
    for (source, column, name) in refused {
        let err = Expression::compile(source).expect_err(source);
        assert!(
            err.starts_with(&format!("refused for its cost: at column {column}: ")),
            "{source}: {err}"
        );
        assert!(err.contains(&format!("reads `{name}`")), "{source}: {err}");
    }
    for allowed in [
        "arguments.xs.all(x, x <= 10)",
        "arguments.xs.all(x, x.ys.exists(y, y == 1))",
        "claims.groups.exists(g, g == arguments.team)",
        "arguments.xs.all(x, x in claims.allowed)",
        "arguments.team in claims.teams",
        "arguments.xs.map(x, x * 2).all(y, y < 100)",
        "size(arguments.xs) < 10 && arguments.xs.all(x, x in ['a', 'b'])",
        "[1, 2].all(i, [3, 4].exists(j, i < j))",
    ] {
        Expression::compile(allowed).unwrap_or_else(|e| panic!("{allowed}: {e}"));
    }
    // On several lines, the line and column inside the expression.
    let err =
        Expression::compile("size(arguments.xs) < 10 &&\n  arguments.xs.all(x, x in arguments.ys)")
            .expect_err("refused");
    assert!(
        err.starts_with("refused for its cost: at line 2, column 28: "),
        "{err}"
    );
}

/// The configuration names the file, the rule's `when` (its line and
/// column in the file) and the read inside the expression.
#[test]
fn a_costly_expression_is_refused_at_load_with_its_place() {
    let text = r#"
[servers.flights]
url = "http://127.0.0.1:1/mcp"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "allow"
when = "arguments.xs.all(x, x in arguments.ys)"
"#;
    let err = config::load_str(text, "t.toml", &|_| None)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("t.toml:9:8"), "{err}");
    assert!(err.contains("rules[0].when"), "{err}");
    assert!(err.contains("refused for its cost: at column 26:"), "{err}");
}

/// Arguments as deep as a request may carry (the JSON reader stops at 128
/// levels) reach a condition without exhausting the stack: converting,
/// comparing and walking them answer.
#[test]
fn deeply_nested_arguments_are_evaluated_without_overflow() {
    let alice = ClientId::named("alice");
    let mut deep = json!("bottom");
    for i in 0..126 {
        deep = match i % 2 {
            0 => json!([deep]),
            _ => json!({ "a": deep }),
        };
    }
    let args = json!({ "a": deep });
    for (source, expected) in [
        ("has(arguments.a)", Outcome::True),
        ("arguments == arguments", Outcome::True),
        ("arguments.a.size() == 1", Outcome::True),
        ("arguments.a.exists(x, x.size() == 1)", Outcome::True),
        ("string(arguments.a) == ''", Outcome::False),
    ] {
        let e = Expression::compile(source).expect("compiles");
        let got = e.evaluate(&alice, "flights", "book", Some(&facts(&args)));
        match expected {
            Outcome::False => assert!(got != Outcome::True, "{source}: {got:?}"),
            _ => assert_eq!(got, expected, "{source}"),
        }
    }
}

/// A missing claim or argument never opens a door: a deny rule whose
/// condition cannot be evaluated denies the call as an allow rule's does,
/// though another allow rule matches.
#[test]
fn a_condition_over_a_missing_field_denies_whatever_its_rule_says() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "allow"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["book*"]
action = "deny"
when = "claims.team == 'dev' || arguments.env == 'prod'"
"#,
    );
    let alice = ClientId::named("alice");
    let dev = object_of(json!({"team": "dev"}));
    let ops = object_of(json!({"team": "ops"}));
    for (claims, arguments, allowed) in [
        (None, json!({"env": "test"}), None),
        (Some(&ops), json!({}), None),
        (Some(&ops), json!({"env": "test"}), Some(true)),
        (Some(&dev), json!({}), Some(false)),
        (Some(&ops), json!({"env": "prod"}), Some(false)),
    ] {
        let facts = Facts {
            claims,
            method: "tools/call",
            arguments: Some(&arguments),
            annotations: None,
            query: None,
            labels: &[],
        };
        let decided = p.decide_call(&alice, "flights", "book_flight", &facts);
        match allowed {
            None => assert!(decided.is_err(), "{claims:?} {arguments}: {decided:?}"),
            Some(a) => assert_eq!(
                decided.map(|d| d.allowed).ok(),
                Some(a),
                "{claims:?} {arguments}"
            ),
        }
    }
}

/// `labels` is the session's flow labels at the call; a list leaves a
/// condition over them to the call (they change after it), and a decision
/// that knows nothing of the use defers it too.
#[test]
fn a_condition_over_the_sessions_labels_is_decided_at_the_call_only() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "allow"
when = "!('untrusted' in labels)"
"#,
    );
    assert!(p.reads_labels());
    let alice = ClientId::named("alice");
    let arguments = json!({});
    let call = |labels: &[&'static str]| {
        let facts = Facts {
            claims: None,
            method: "tools/call",
            arguments: Some(&arguments),
            annotations: None,
            query: None,
            labels,
        };
        p.decide_call(&alice, "flights", "send", &facts)
            .expect("decided")
            .allowed
    };
    assert!(call(&[]));
    assert!(call(&["private"]));
    assert!(!call(&["private", "untrusted"]), "the label is read");
    let listed = p
        .decide_listed(
            &alice,
            "flights",
            Subject::Tool("send"),
            &ListFacts::default(),
        )
        .allowed;
    assert!(listed, "left to the call: the tool stays listed");
    let e = Expression::compile("labels.size() == 0").expect("compiles");
    assert!(e.reads_labels() && e.reads_call() && !e.varies_per_list());
    assert_eq!(
        e.evaluate(&alice, "flights", "send", None),
        Outcome::Deferred
    );
    // A policy without such a condition reads no store.
    assert!(!policy("").reads_labels());
}
