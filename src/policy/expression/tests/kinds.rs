//! Conditions on resource and prompt rules: each kind of rule reads its own
//! subject (`tool`, `uri`, `prompt`) and nothing another kind has, refused
//! at load otherwise; a list reads `method` as the use its item promises;
//! a use is decided with its facts, a list leaves the labels and a prompt's
//! arguments to the use; and, for generated rules, a list and the reads or
//! gets it promises agree except where a condition reads those.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::{object_of, policy, refusal_of};
use crate::auth::ClientId;
use crate::policy::expression::{Expression, Outcome};
use crate::policy::{Facts, Kind, ListFacts, Subject};

/// The configuration's refusal of `rule` (one `[[rules]]` entry's keys).
fn refusal(rule: &str) -> String {
    let text = format!(
        "[servers.flights]\nurl = \"http://127.0.0.1:1/mcp\"\n[[rules]]\nclients = [\"*\"]\nservers = [\"flights\"]\naction = \"allow\"\n{rule}"
    );
    refusal_of(&text)
}

#[test]
fn a_condition_reading_what_its_kind_never_has_is_refused_at_load() {
    for (subjects, when, read) in [
        ("resources = [\"*\"]", "tool == 'echo'", "tool"),
        ("resources = [\"*\"]", "arguments.size() == 0", "arguments"),
        (
            "resources = [\"*\"]",
            "annotations.readOnlyHint",
            "annotations",
        ),
        ("resources = [\"*\"]", "prompt == 'p'", "prompt"),
        ("prompts = [\"*\"]", "tool == 'echo'", "tool"),
        ("prompts = [\"*\"]", "uri == 'res://a'", "uri"),
        (
            "prompts = [\"*\"]",
            "annotations.title == 'x'",
            "annotations",
        ),
        ("tools = [\"*\"]", "uri.startsWith('res://')", "uri"),
        ("tools = [\"*\"]", "prompt == 'p'", "prompt"),
        ("tools = [\"*\"]", "query.level == 'warn'", "query"),
        ("prompts = [\"*\"]", "query.size() > 0", "query"),
    ] {
        let err = refusal(&format!("{subjects}\nwhen = {when:?}\n"));
        assert!(err.contains("t.toml:8:8"), "{when}: {err}");
        assert!(err.contains("rules[0].when"), "{when}: {err}");
        assert!(
            err.contains(&format!("at column 1: reads `{read}`")),
            "{when}: {err}"
        );
    }
    // The column of the read, and its line in a condition of several lines.
    let err = refusal("resources = [\"*\"]\nwhen = \"claims.team == 'ops' && tool == 'x'\"\n");
    assert!(err.contains("at column 25: reads `tool`"), "{err}");
    let err =
        refusal("resources = [\"*\"]\nwhen = \"\"\"claims.team == 'ops' &&\n  tool == 'x'\"\"\"\n");
    assert!(err.contains("at line 2, column 3: reads `tool`"), "{err}");
    // Not CEL at all, on a resource or a prompt rule: CEL's reason and its column.
    for subjects in ["resources = [\"*\"]", "prompts = [\"*\"]"] {
        let err = refusal(&format!("{subjects}\nwhen = \"claims.team ==\"\n"));
        assert!(err.contains("t.toml:8:8"), "{err}");
        assert!(
            err.contains("not a valid CEL expression: at column"),
            "{err}"
        );
    }
    // A macro's own variable is not the context's.
    for (kind, when) in [
        (Kind::Resource, "claims.groups.exists(tool, tool == 'ops')"),
        (Kind::Prompt, "[1].all(uri, uri > 0) && prompt != ''"),
        (Kind::Tool, "['a'].exists(prompt, prompt == tool)"),
    ] {
        Expression::compile_for(when, kind).unwrap_or_else(|e| panic!("{when}: {e}"));
    }
    // Every kind's own names compile on its rules.
    for (kind, when) in [
        (
            Kind::Resource,
            "uri.startsWith('users://') && method == 'resources/read' && claims.size() >= 0 \
             && now > timestamp('2020-01-01T00:00:00Z') && !('private' in labels) \
             && client != '' && server != '' && query.size() >= 0",
        ),
        (
            Kind::Prompt,
            "prompt == 'p' && arguments.size() >= 0 && method == 'prompts/get'",
        ),
        (
            Kind::Tool,
            "tool == 't' && arguments.size() >= 0 && annotations.size() >= 0",
        ),
    ] {
        Expression::compile_for(when, kind).unwrap_or_else(|e| panic!("{when}: {e}"));
    }
}

#[test]
fn a_rule_mixing_kinds_with_a_condition_is_refused() {
    for subjects in [
        "tools = [\"*\"]\nresources = [\"*\"]",
        "resources = [\"*\"]\nprompts = [\"*\"]",
        "tools = [\"a\"]\nprompts = [\"b\"]",
    ] {
        let err = refusal(&format!("{subjects}\nwhen = \"true\"\n"));
        assert!(err.contains("rules[0].when"), "{err}");
        assert!(err.contains("split it into one rule per kind"), "{err}");
    }
}

/// `tool` names a tool only: a resource's URI or a prompt's name never
/// reads as one; each kind reads its own subject.
#[test]
fn each_kind_reads_its_own_subject_and_no_other() {
    let alice = ClientId::named("alice");
    let arguments = json!({"city": "Paris"});
    let eval = |source: &str, subject: Subject<'_>, method: &str| {
        let facts = Facts {
            claims: None,
            method,
            arguments: Some(&arguments),
            annotations: None,
            query: None,
            labels: &[],
        };
        let e = Expression::compile(source).expect("compiles");
        e.evaluate_use(&alice, "flights", subject, Some(&facts))
    };
    let read = Subject::Resource("users://ops/profile");
    let get = Subject::Prompt("greet");
    assert!(matches!(
        eval("tool == 'users://ops/profile'", read, "resources/read"),
        Outcome::Failed(_)
    ));
    assert!(matches!(
        eval("tool == 'greet'", get, "prompts/get"),
        Outcome::Failed(_)
    ));
    assert!(matches!(
        eval("uri == 'greet'", get, "prompts/get"),
        Outcome::Failed(_)
    ));
    assert!(matches!(
        eval("size(arguments) == 1", read, "resources/read"),
        Outcome::Failed(_)
    ));
    assert_eq!(
        eval(
            "uri == 'users://ops/profile' && method == 'resources/read'",
            read,
            "resources/read"
        ),
        Outcome::True
    );
    assert_eq!(
        eval(
            "prompt == 'greet' && arguments.city == 'Paris'",
            get,
            "prompts/get"
        ),
        Outcome::True
    );
    assert_eq!(
        eval(
            "method == 'resources/subscribe'",
            read,
            "resources/subscribe"
        ),
        Outcome::True
    );
}

/// A list reads `method` as the use its item promises, and decides a
/// condition over `uri`, `prompt`, the claims and the time as the use does;
/// it leaves one over the labels or a prompt's arguments to the use.
#[test]
fn a_list_decides_resource_and_prompt_conditions_as_their_uses() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
resources = ["users://*"]
action = "allow"
when = "uri.startsWith('users://' + claims.team + '/') && method == 'resources/read'"
[[rules]]
clients = ["*"]
servers = ["flights"]
resources = ["res://*"]
action = "allow"
when = "!('untrusted' in labels)"
[[rules]]
clients = ["*"]
servers = ["flights"]
prompts = ["*"]
action = "allow"
when = "prompt == 'greet' && method == 'prompts/get' && arguments.city != 'Atlantis'"
"#,
    );
    let alice = ClientId::named("alice");
    let ops = object_of(json!({"team": "ops"}));
    let listed = |subject, claims: Option<&Map<String, Value>>| {
        let facts = ListFacts {
            claims,
            annotations: None,
        };
        p.decide_listed(&alice, "flights", subject, &facts).allowed
    };
    let used = |subject, claims, method, arguments: Option<&Value>, labels: &[&'static str]| {
        let facts = Facts {
            claims,
            method,
            arguments,
            annotations: None,
            query: None,
            labels,
        };
        p.decide_use(&alice, "flights", subject, &facts)
            .map(|d| d.allowed)
    };
    let own = Subject::Resource("users://ops/profile");
    let other = Subject::Resource("users://dev/profile");
    assert!(listed(own, Some(&ops)));
    assert!(!listed(other, Some(&ops)));
    assert!(!listed(own, None), "a missing claim fails: hidden");
    assert_eq!(used(own, Some(&ops), "resources/read", None, &[]), Ok(true));
    assert_eq!(
        used(other, Some(&ops), "resources/read", None, &[]),
        Ok(false)
    );
    assert_eq!(
        used(own, Some(&ops), "resources/subscribe", None, &[]),
        Ok(false),
        "the method is the real one"
    );
    assert!(used(own, None, "resources/read", None, &[]).is_err());
    // Labels: left to the read by the list, read by the read.
    let res = Subject::Resource("res://a");
    assert!(listed(res, None));
    assert_eq!(
        used(res, None, "resources/read", None, &["private"]),
        Ok(true)
    );
    assert_eq!(
        used(res, None, "resources/read", None, &["untrusted"]),
        Ok(false)
    );
    // A prompt's arguments: left to the get by the list and by a completion.
    let greet = Subject::Prompt("greet");
    assert!(listed(greet, None));
    // The whole condition is left to the get: its other parts too.
    assert!(listed(Subject::Prompt("other"), None));
    assert_eq!(
        used(
            Subject::Prompt("other"),
            None,
            "prompts/get",
            Some(&json!({"city": "Paris"})),
            &[]
        ),
        Ok(false)
    );
    let paris = json!({"city": "Paris"});
    let atlantis = json!({"city": "Atlantis"});
    assert_eq!(
        used(greet, None, "prompts/get", Some(&paris), &[]),
        Ok(true)
    );
    assert_eq!(
        used(greet, None, "prompts/get", Some(&atlantis), &[]),
        Ok(false)
    );
    assert!(
        used(greet, None, "prompts/get", Some(&json!({})), &[]).is_err(),
        "a missing argument fails: denied"
    );
    assert_eq!(
        used(greet, None, "completion/complete", None, &[]),
        Ok(true),
        "a completion carries no arguments of the prompt's: left to the get, as the list leaves it"
    );
    assert!(p.reads_labels() && p.lists_vary());
    // Only uses of the kind whose conditions read the labels ask the store.
    assert!(p.reads_labels_of(Kind::Resource));
    assert!(!p.reads_labels_of(Kind::Prompt) && !p.reads_labels_of(Kind::Tool));
}

/// Conditions a generated resource or prompt rule may carry.
const WHENS: &[&str] = &[
    "uri.startsWith('users://' + claims.team + '/')",
    "has(claims.team) && uri.endsWith('/profile')",
    "uri == 'res://a'",
    "prompt.startsWith('g') && claims.team != 'dev'",
    "prompt == 'greet'",
    "method == 'resources/read' || method == 'prompts/get'",
    "method == 'resources/subscribe'",
    "now > timestamp('2020-01-01T00:00:00Z')",
    "client == 'bob' || claims.size() > 1",
    "server == 'crm'",
    "!('untrusted' in labels)",
    "size(labels) == 0 || uri != ''",
    "!has(query.level) || query.level != 'debug'",
    "query.level == 'warn' && uri.startsWith('users://')",
    "arguments.city == 'Paris'",
    "has(arguments.city) || prompt == 'greet'",
    "claims.missing == 1",
];
const CLIENTS: &[&str] = &["*", "alice", "bob"];
const SERVERS: &[&str] = &["*", "flights", "crm"];
const RESOURCES: &[&str] = &["*", "users://*", "res://a"];
const PROMPTS: &[&str] = &["*", "g*", "other"];

/// A rule of one kind (false: resources, true: prompts), with a condition
/// its kind may carry.
fn rule() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(CLIENTS),
        proptest::sample::select(SERVERS),
        any::<bool>(),
        0..3usize,
        any::<bool>(),
        0..=WHENS.len(),
    )
        .prop_map(|(client, server, prompts, subject, deny, when)| {
            let (key, subject) = match prompts {
                false => ("resources", RESOURCES[subject]),
                true => ("prompts", PROMPTS[subject]),
            };
            let kind = if prompts { Kind::Prompt } else { Kind::Resource };
            let when = WHENS
                .get(when)
                .filter(|w| Expression::compile_for(w, kind).is_ok())
                .map(|w| format!("when = {w:?}\n"))
                .unwrap_or_default();
            format!(
                "[[rules]]\nclients = [{client:?}]\nservers = [{server:?}]\n{key} = [{subject:?}]\naction = \"{}\"\n{when}",
                if deny { "deny" } else { "allow" }
            )
        })
}

fn claims_of(which: usize) -> Option<Map<String, Value>> {
    [
        None,
        Some(json!({"team": "ops"})),
        Some(json!({"team": "dev", "sub": "carol"})),
    ][which % 3]
        .clone()
        .map(object_of)
}

proptest! {
    /// For generated resource and prompt rules, clients and claims: where no
    /// matching rule's condition reads the labels, a prompt's arguments or a
    /// resource URI's query,
    /// the list shows a resource or prompt exactly when its read or get is
    /// allowed, whatever the labels and arguments; where one does, one some
    /// use may make is listed.
    #[test]
    fn the_list_and_the_reads_and_gets_agree_except_where_a_condition_reads_the_use(
        rules in proptest::collection::vec(rule(), 0..8),
    ) {
        let p = policy(&rules.concat());
        let subjects = [
            (Subject::Resource("users://ops/profile"), "resources/read"),
            (Subject::Resource("users://dev/profile"), "resources/read"),
            (Subject::Resource("res://a"), "resources/read"),
            (Subject::Prompt("greet"), "prompts/get"),
            (Subject::Prompt("other"), "prompts/get"),
        ];
        let uses = [
            (json!({}), &[][..], ""),
            (json!({"city": "Paris"}), &["private"][..], "level=warn"),
            (json!({"city": "Rome"}), &["untrusted", "private"][..], "level=debug&x=1"),
        ];
        for client in ["alice", "bob"].map(ClientId::named) {
            for server in ["flights", "crm"] {
                for (subject, method) in subjects {
                    let reads_use = p
                        .rules
                        .iter()
                        .filter(|r| r.matches(&client, server, subject))
                        .any(|r| r.when.as_ref().is_some_and(|w| {
                            let refs = w.program.references();
                            ["labels", "arguments", "query"].iter().any(|n| refs.has_variable(n))
                        }));
                    for claims in (0..3).map(claims_of) {
                        let known = ListFacts { claims: claims.as_ref(), annotations: None };
                        let listed = p.decide_listed(&client, server, subject, &known).allowed;
                        let mut decided = Vec::new();
                        for (arguments, labels, query) in &uses {
                            let resource = matches!(subject, Subject::Resource(_));
                            let facts = Facts {
                                claims: claims.as_ref(),
                                method,
                                arguments: (!resource).then_some(arguments),
                                annotations: None,
                                query: resource.then_some(*query),
                                labels,
                            };
                            let used = p
                                .decide_use(&client, server, subject, &facts)
                                .is_ok_and(|d| d.allowed);
                            prop_assert!(
                                !used || listed,
                                "{} may use {subject:?} on {server} ({claims:?}) but it is not listed",
                                client.name()
                            );
                            if !reads_use {
                                prop_assert_eq!(
                                    used, listed,
                                    "{} {} {:?} {:?}: the list and the use disagree",
                                    client.name(), server, subject, claims
                                );
                            }
                            decided.push(used);
                        }
                        if !reads_use {
                            prop_assert!(decided.iter().all(|d| *d == decided[0]));
                        }
                    }
                }
            }
        }
    }
}

/// A condition over a resource URI's `query` reads the parameters of the
/// query forwarded, decoded once; a list and a completion (no URI of their
/// own) leave it to the read; a query servers would read differently (a
/// name twice, a raw `+` or `;`) fails every condition that reads it, so
/// the read is refused whatever the rule's action, naming the cause.
#[test]
fn a_condition_over_the_query_decides_the_read_that_carries_it() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
resources = ["logs://*"]
action = "allow"
when = "!has(query.level) || query.level in ['info', 'warn']"
[[rules]]
clients = ["*"]
servers = ["flights"]
resources = ["logs://audit"]
action = "deny"
when = "has(query.since) && query.since < '2026'"
"#,
    );
    let alice = ClientId::named("alice");
    let used = |uri, method, query| {
        let facts = Facts {
            claims: None,
            method,
            arguments: None,
            annotations: None,
            query,
            labels: &[],
        };
        p.decide_use(&alice, "flights", Subject::Resource(uri), &facts)
    };
    let read = |uri, query| used(uri, "resources/read", Some(query)).map(|d| d.allowed);
    assert_eq!(read("logs://api", ""), Ok(true));
    assert_eq!(read("logs://api", "level=warn"), Ok(true));
    assert_eq!(read("logs://api", "level=w%61rn"), Ok(true), "decoded once");
    assert_eq!(read("logs://api", "level=debug"), Ok(false));
    assert_eq!(read("logs://audit", "since=2027-01"), Ok(true));
    assert_eq!(read("logs://audit", "since=2025-12"), Ok(false));
    // Read differently by some server: the condition fails, the read is
    // refused, by the allow rule and by the deny rule alike.
    for (uri, query, cause) in [
        (
            "logs://api",
            "level=warn&level=debug",
            "names `level` twice",
        ),
        ("logs://api", "level=warn+debug", "raw `+`"),
        ("logs://api", "level=warn;level=debug", "raw `;`"),
        (
            "logs://audit",
            "since=2027&since=2025",
            "names `since` twice",
        ),
    ] {
        let failed = used(uri, "resources/read", Some(query)).expect_err(query);
        assert!(failed.reason.contains(cause), "{query}: {}", failed.reason);
    }
    // A listed URI, and a completion on a template: left to the read.
    let listed = ListFacts::default();
    assert!(
        p.decide_listed(&alice, "flights", Subject::Resource("logs://api"), &listed)
            .allowed
    );
    assert_eq!(
        used("logs://api", "completion/complete", None).map(|d| d.allowed),
        Ok(true)
    );
    // A rule that does not read the query is not failed by one.
    let plain = policy(
        "[[rules]]\nclients = [\"*\"]\nservers = [\"flights\"]\nresources = [\"logs://*\"]\naction = \"allow\"\nwhen = \"uri != ''\"\n",
    );
    let facts = Facts {
        claims: None,
        method: "resources/read",
        arguments: None,
        annotations: None,
        query: Some("a=1&a=2"),
        labels: &[],
    };
    let decided = plain.decide_use(&alice, "flights", Subject::Resource("logs://api"), &facts);
    assert_eq!(decided.map(|d| d.allowed), Ok(true));
}
