//! Approval settings from the operator's side: bad approval settings are refused with their
//! place in the file, and `portcullis check` shows which calls need approval and by whom.

use crate::support;

use support::clients;
use tokio::process::Command;

#[tokio::test]
async fn bad_approval_settings_are_refused_with_their_place() {
    support::init();
    let load = |rest: &str| {
        let text = format!(
            "[servers.files]\nurl = \"http://127.0.0.1:1/mcp\"\n{}\n{rest}",
            clients()
        );
        portcullis::config::load_str(&text, "a.toml", &|name| {
            (name == "SHORT").then(|| "abc".to_owned())
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    let rule = |action: &str, approval: &str| {
        format!(
            "[[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"echo\"]\naction = \"{action}\"\napproval = {approval}\n"
        )
    };
    let cases = [
        (rule("deny", r#"{ by = "user" }"#), "rules[0].approval"),
        (
            rule("allow", r#"{ by = "somebody" }"#),
            "rules[0].approval.by",
        ),
        (
            rule("allow", r#"{ by = "user", timeout = "0s" }"#),
            "rules[0].approval.timeout",
        ),
        (
            rule("allow", r#"{ by = "user", pending = "retry" }"#),
            "rules[0].approval.pending",
        ),
        (rule("allow", r#"{ by = "user", color = "red" }"#), "color"),
        (
            "[approvals]\nkey = \"${SHORT}\"\n".to_owned(),
            "approvals.key",
        ),
        (
            "[approvals]\nmax_pending = 0\n".to_owned(),
            "approvals.max_pending",
        ),
    ];
    for (text, key) in cases {
        let refused = load(&text);
        assert!(refused.contains(key), "{key}: {refused}");
        assert!(refused.contains("a.toml"), "{refused}");
    }
}

#[tokio::test]
async fn check_shows_which_calls_need_approval_and_by_whom() {
    let file = support::ConfigFile::new(&format!(
        "[servers.files]\nurl = \"http://127.0.0.1:1/mcp\"\n{}\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"files\"]\ntools = [\"delete_*\"]\naction = \"allow\"\n\
         approval = {{ by = \"operator\", pending = \"retry\", timeout = \"10m\" }}\n",
        clients()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["check", "--config"])
        .arg(file.path())
        .output()
        .await
        .expect("check runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(
            "delete_*  approval: by an operator (the client retries after approval), within 10m"
        ),
        "{text}"
    );
}
