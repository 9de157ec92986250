//! `portcullis check --explain` on a resource read and a prompt get, run the
//! way an operator runs it (the real binary): a condition over the
//! resource's canonical `uri` and its `query`, a prompt's name and its `arguments`, the
//! claims, the labels and the method is evaluated as the gateway would, and
//! each outcome printed; a request giving a resource what only a tool or a
//! prompt has is refused with the reason.

use std::fs;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_portcullis");

const RULES: &str = r#"
[servers.crm]
url = "http://127.0.0.1:3001/mcp"
[clients.alice]
api_key_sha256 = "5e7f90955ab6db92018dc161092b571c1d6dc39e7ce4abe7a77ade44acbbba62"
[[rules]]
clients = ["*"]
servers = ["crm"]
resources = ["users://*"]
action = "allow"
when = "uri.startsWith('users://' + claims.team + '/')"
[[rules]]
clients = ["*"]
servers = ["crm"]
resources = ["*"]
action = "deny"
when = "'untrusted' in labels && method == 'resources/read'"
[[rules]]
clients = ["*"]
servers = ["crm"]
prompts = ["summarize*"]
action = "allow"
when = "prompt != 'summarize_all' && arguments.team == claims.team"
[[rules]]
clients = ["*"]
servers = ["crm"]
resources = ["logs://*"]
action = "allow"
when = "!has(query.level) || query.level == 'warn'"
"#;

#[test]
fn check_explains_conditions_on_a_resource_read_and_a_prompt_get() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("portcullis.toml");
    fs::write(&config, RULES).expect("write");
    let request = dir.path().join("request.json");
    let ops = r#""client": "alice", "server": "crm", "claims": {"team": "ops"}"#;
    let cases: [(String, &[&str]); 14] = [
        (
            // Read in its canonical form: the host is lowercased.
            format!(r#"{{{ops}, "resource": "users://OPS/profile"}}"#),
            &[
                "resource users://ops/profile",
                "rules[0] condition is true",
                "rules[1] condition is false",
                "verdict: runs",
            ],
        ),
        (
            format!(r#"{{{ops}, "resource": "users://dev/profile"}}"#),
            &["rules[0] condition is false", "verdict: refused"],
        ),
        (
            format!(r#"{{{ops}, "resource": "users://ops/profile", "labels": ["untrusted"]}}"#),
            &["rules[1] condition is true", "verdict: refused"],
        ),
        (
            // Another method: the deny rule's condition is false for it.
            format!(
                r#"{{{ops}, "resource": "users://ops/profile", "labels": ["untrusted"], "method": "resources/subscribe"}}"#
            ),
            &["rules[1] condition is false", "verdict: runs"],
        ),
        (
            format!(r#"{{{ops}, "prompt": "summarize_day", "arguments": {{"team": "ops"}}}}"#),
            &[
                "prompt summarize_day",
                "rules[2] condition is true",
                "verdict: runs",
            ],
        ),
        (
            format!(r#"{{{ops}, "prompt": "summarize_all", "arguments": {{"team": "ops"}}}}"#),
            &["rules[2] condition is false", "verdict: refused"],
        ),
        (
            format!(r#"{{{ops}, "prompt": "summarize_day", "arguments": {{"team": "dev"}}}}"#),
            &["rules[2] condition is false", "verdict: refused"],
        ),
        (
            format!(r#"{{{ops}, "prompt": "summarize_day"}}"#),
            &[
                "rules[2] condition is failed: No such key: team",
                "verdict: refused",
            ],
        ),
        (
            // The query as forwarded: canonical, decoded once.
            format!(r#"{{{ops}, "resource": "logs://api?level=w%61rn"}}"#),
            &[
                "resource logs://api",
                "rules[3] condition is true",
                "verdict: runs",
            ],
        ),
        (
            format!(r#"{{{ops}, "resource": "logs://api?level=debug"}}"#),
            &["rules[3] condition is false", "verdict: refused"],
        ),
        (
            format!(r#"{{{ops}, "resource": "logs://api?level=warn&level=debug"}}"#),
            &[
                "rules[3] condition is failed: the query names `level` twice",
                "verdict: refused",
            ],
        ),
        (
            // A `?` inside the query is forwarded as `%3F`: no `level` here.
            format!(r#"{{{ops}, "resource": "logs://api?x?level=debug"}}"#),
            &["rules[3] condition is true", "verdict: runs"],
        ),
        (
            // A completion carries neither a query nor arguments of its
            // own: the gateway leaves a condition over them to the read or
            // the get, and so does the explanation.
            format!(
                r#"{{{ops}, "resource": "logs://api?level=debug", "method": "completion/complete"}}"#
            ),
            &[
                "rules[3] condition is decided at call time",
                "verdict: runs",
            ],
        ),
        (
            format!(r#"{{{ops}, "prompt": "summarize_day", "method": "completion/complete"}}"#),
            &[
                "rules[2] condition is decided at call time",
                "verdict: runs",
            ],
        ),
    ];
    for (body, says) in cases {
        fs::write(&request, &body).expect("write");
        let out = Command::new(BIN)
            .args(["check", "--config"])
            .arg(&config)
            .arg("--explain")
            .arg(&request)
            .output()
            .expect("runs");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{body}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in says {
            assert!(printed.contains(line), "{body}: {printed}");
        }
    }
    // What a resource never carries is refused with the reason.
    for (body, says) in [
        (
            format!(r#"{{{ops}, "resource": "users://ops/profile", "arguments": {{}}}}"#),
            "a resource is read without arguments",
        ),
        (
            format!(r#"{{{ops}, "prompt": "summarize_day", "annotations": {{}}}}"#),
            "`annotations` are a tool's",
        ),
    ] {
        fs::write(&request, &body).expect("write");
        let out = Command::new(BIN)
            .args(["check", "--config"])
            .arg(&config)
            .arg("--explain")
            .arg(&request)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{body}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{body}: {stderr}");
    }
}
