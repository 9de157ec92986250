//! The list and the calls agree: for generated rules whose conditions read
//! the claims, the annotations, the method, the time and the arguments, what
//! a list shows a client is what its calls get, except where a matching
//! rule's condition reads the arguments (then the tool is listed whenever
//! some call could be allowed).

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::{object_of, policy};
use crate::auth::ClientId;
use crate::policy::{Facts, ListFacts, Subject};

/// Conditions a generated rule may carry: over the arguments (alone and
/// with other facts), the claims, the annotations, the method and the time,
/// over who calls what where, and ones that fail on some uses (a missing
/// claim or annotation) or on every use.
const WHENS: &[&str] = &[
    "arguments.n <= 2",
    "has(arguments.n) && arguments.n > 3",
    "arguments.n == 1 || client == 'bob'",
    "claims.team == 'ops' && arguments.n < 4",
    "has(claims.team) && claims.team == 'ops'",
    "claims.team == 'ops'",
    "claims.team != 'dev'",
    "has(annotations.readOnlyHint) && annotations.readOnlyHint",
    "annotations.destructiveHint == true",
    "has(annotations.destructiveHint) && annotations.destructiveHint",
    "now > timestamp('2020-01-01T00:00:00Z')",
    "now < timestamp('2020-01-01T00:00:00Z') || claims.size() > 1",
    "method == 'tools/call' && tool != 'echo'",
    "method != 'tools/call'",
    "client == 'alice'",
    "tool.startsWith('book')",
    "server == 'crm'",
    "client + 1 == 2",
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
                .map(|w| format!("when = {w:?}\n"))
                .unwrap_or_default();
            format!(
                "[[rules]]\nclients = [{client:?}]\nservers = [{server:?}]\ntools = [{tool:?}]\naction = \"{}\"\n{when}",
                if deny { "deny" } else { "allow" }
            )
        })
}

/// The claims a client may carry: none (a key client), or a team.
fn claims_of(which: usize) -> Option<Map<String, Value>> {
    [
        None,
        Some(json!({"team": "ops"})),
        Some(json!({"team": "dev", "sub": "carol"})),
    ][which % 3]
        .clone()
        .map(object_of)
}

/// The annotations a tool may carry in the catalog.
fn annotations_of(which: usize) -> Option<Value> {
    [
        None,
        Some(json!({"readOnlyHint": true})),
        Some(json!({"readOnlyHint": false, "destructiveHint": true})),
    ][which % 3]
        .clone()
}

proptest! {
    /// For generated rules, clients, claims, annotations and calls: where no
    /// matching rule's condition reads the arguments, the list shows a tool
    /// exactly when every call to it is allowed (and a call that is refused
    /// is refused whatever its arguments); where one does, a tool some call
    /// may make is listed.
    #[test]
    fn the_list_and_the_calls_agree_except_where_a_condition_reads_the_call(
        rules in proptest::collection::vec(rule(), 0..8),
    ) {
        let p = policy(&rules.concat());
        for client in ["alice", "bob"].map(ClientId::named) {
            for server in ["flights", "crm"] {
                for tool in ["book_flight", "echo"] {
                    // Read from the compiled program, not from what the list decision uses.
                    let reads_arguments = p
                        .rules
                        .iter()
                        .filter(|r| r.matches(&client, server, Subject::Tool(tool)))
                        .any(|r| {
                            r.when.as_ref().is_some_and(|w| w.program.references().has_variable("arguments"))
                        });
                    for (claims, annotations) in (0..3).flat_map(|c| (0..3).map(move |a| (c, a))) {
                        let (claims, annotations) = (claims_of(claims), annotations_of(annotations));
                        let known = ListFacts { claims: claims.as_ref(), annotations: annotations.as_ref() };
                        let listed = p.decide_listed(&client, server, Subject::Tool(tool), &known).allowed;
                        let mut decided = Vec::new();
                        for n in 0..6 {
                            let arguments = json!({"n": n});
                            let facts = Facts {
                                claims: claims.as_ref(),
                                method: "tools/call",
                                arguments: Some(&arguments),
                                annotations: annotations.as_ref(),
                                query: None,
                                labels: &[],
                            };
                            let called = p
                                .decide_call(&client, server, tool, &facts)
                                .is_ok_and(|d| d.allowed);
                            prop_assert!(
                                !called || listed,
                                "{} may call {tool} on {server} (n = {n}, {claims:?}, {annotations:?}) but it is not listed",
                                client.name()
                            );
                            if !reads_arguments {
                                prop_assert_eq!(
                                    called, listed,
                                    "{} {} {} n = {} {:?} {:?}: the list and the call disagree",
                                    client.name(), server, tool, n, claims, annotations
                                );
                            }
                            decided.push(called);
                        }
                        if !reads_arguments {
                            prop_assert!(
                                decided.iter().all(|d| *d == decided[0]),
                                "{} {} {}: the arguments changed a decision no condition reads them for: {:?}",
                                client.name(), server, tool, decided
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A condition over claims or annotations is decided in the list as the
/// call decides it; one that fails there (a claim the token lacks) hides the
/// tool, allow rule or deny rule, as the call is denied; one over the
/// arguments keeps the tool listed.
#[test]
fn a_list_decides_every_condition_but_the_arguments() {
    let p = policy(
        r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "allow"
when = "claims.team == 'ops'"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["*"]
action = "deny"
when = "annotations.destructiveHint == true"
[[rules]]
clients = ["*"]
servers = ["crm"]
tools = ["*"]
action = "allow"
when = "arguments.n <= 2 && claims.team == 'ops'"
"#,
    );
    let alice = ClientId::named("alice");
    let ops = object_of(json!({"team": "ops"}));
    let dev = object_of(json!({"team": "dev"}));
    let destructive = json!({"destructiveHint": true});
    let safe = json!({"destructiveHint": false});
    let listed = |server: &str, claims: Option<&Map<String, Value>>, annotations: &Value| {
        let facts = ListFacts {
            claims,
            annotations: Some(annotations),
        };
        p.decide_listed(&alice, server, Subject::Tool("t"), &facts)
            .allowed
    };
    assert!(listed("flights", Some(&ops), &safe));
    assert!(!listed("flights", Some(&dev), &safe), "the claim is read");
    assert!(
        !listed("flights", None, &safe),
        "a missing claim fails: hidden"
    );
    assert!(
        !listed("flights", Some(&ops), &destructive),
        "the annotation is read"
    );
    assert!(
        !listed("flights", Some(&ops), &json!({})),
        "a missing annotation fails the deny rule: hidden"
    );
    assert!(
        listed("crm", None, &safe),
        "a condition over the arguments is left to the call"
    );
    // Knowing nothing of the use, every call-time condition is left to the call.
    assert!(p.decide(&alice, "flights", Subject::Tool("t")).allowed);
    assert!(p.lists_vary(), "a condition over claims varies per list");
    assert!(!policy("").lists_vary());
}
