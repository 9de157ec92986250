//! `[identity]` and `[servers.NAME.identity]` refused with their place and
//! reason, or compiled into the mode they name.

use super::super::super::model::{Config, ConfigError};
use super::super::compile;
use crate::identity::ServerIdentity;

const KEY: &str = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

const PEM: &str = "-----BEGIN PRIVATE KEY-----\n\
    MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
    -----END PRIVATE KEY-----\n";

fn env(name: &str) -> Option<String> {
    match name {
        "ALICE_FILES" => Some("alice-upstream-secret".into()),
        "GATEWAY_SECRET" => Some("s3cret".into()),
        "BAD_SECRET" => Some("line\r\nX-Admin: yes".into()),
        "SIGNING" => Some(PEM.into()),
        _ => None,
    }
}

fn with(identity: &str, extra: &str) -> String {
    format!(
        "[servers.files]\nurl = \"http://127.0.0.1:3001/mcp\"\n[servers.files.identity]\n{identity}\n\
         [clients.alice]\napi_key_sha256 = \"{KEY}\"\n{extra}"
    )
}

fn refuse(text: &str) -> ConfigError {
    compile(text, "p.toml", &env).expect_err("must be refused")
}

fn accept(text: &str) -> Config {
    compile(text, "p.toml", &env).unwrap_or_else(|e| panic!("{e}"))
}

const JWT_AUTH: &str = "[auth.jwt]\nissuer = \"https://idp.example\"\naudience = \"https://gw.example/mcp\"\n\
    jwks_url = \"https://idp.example/jwks\"\n";
const KEYS: &str =
    "[identity]\nissuer = \"https://gw.example\"\nsigning_keys = [{ env = \"SIGNING\" }]\n";

#[test]
fn each_mode_compiles_from_its_own_keys() {
    let c = accept(&with(
        "mode = \"secret\"\nsecrets.alice = { env = \"ALICE_FILES\" }",
        "",
    ));
    assert_eq!(
        c.servers["files"]
            .identity
            .as_ref()
            .map(ServerIdentity::mode),
        Some("secret")
    );
    let c = accept(&with(
        "mode = \"template\"\nheaders = { X-User = \"{client}\" }",
        "",
    ));
    assert_eq!(
        c.servers["files"]
            .identity
            .as_ref()
            .map(ServerIdentity::mode),
        Some("template")
    );
    let c = accept(&with(
        "mode = \"assertion\"\nlifetime = \"2m\"\nreuse = \"30s\"",
        KEYS,
    ));
    let Some(ServerIdentity::Assertion(a)) = &c.servers["files"].identity else {
        panic!("assertion");
    };
    assert_eq!(
        a.audience, "http://127.0.0.1:3001/mcp",
        "the default audience is the server's URL"
    );
    let exchange = "mode = \"exchange\"\ntoken_endpoint = \"https://idp.example/token\"\nclient_id = \"gw\"\n\
                    client_secret = { env = \"GATEWAY_SECRET\" }\nscopes = [\"files:read\"]";
    let c = accept(&with(exchange, JWT_AUTH));
    assert!(
        c.describe()
            .contains("its token exchanged at https://idp.example/token")
    );
    let service = "mode = \"client_credentials\"\ntoken_endpoint = \"http://127.0.0.1:9/token\"\nclient_id = \"gw\"\n\
                   client_auth = \"private_key_jwt\"";
    accept(&with(service, KEYS));
}

#[test]
fn check_says_what_each_client_reaches_each_server_with() {
    let c = accept(&with(
        "mode = \"secret\"\nsecrets.alice = { env = \"ALICE_FILES\" }",
        &format!("[clients.bob]\napi_key_sha256 = \"{}\"\n", "0".repeat(64)),
    ));
    let text = c.describe();
    assert!(text.contains("files (mode secret)"), "{text}");
    assert!(
        text.contains("its own secret (env ALICE_FILES) in `authorization`"),
        "{text}"
    );
    assert!(
        text.contains("bob            nothing: no secret is configured"),
        "{text}"
    );
    assert!(
        !text.contains("alice-upstream-secret"),
        "a secret is never printed: {text}"
    );
}

#[test]
fn bad_identities_are_refused_with_their_key_and_reason() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "mode = \"oauth\"",
            "",
            "servers.files.identity.mode",
            "not an identity mode",
        ),
        (
            "mode = \"secret\"\nsecrets.alice = \"plain\"",
            "",
            "servers.files.identity.secrets.?",
            "invalid type",
        ),
        (
            "mode = \"secret\"\nsecrets.carol = { env = \"ALICE_FILES\" }",
            "",
            "servers.files.identity.secrets.carol",
            "no client named",
        ),
        (
            "mode = \"secret\"\nsecrets.alice = { env = \"UNSET\" }",
            "",
            "servers.files.identity.secrets.alice.env",
            "not set",
        ),
        (
            "mode = \"secret\"\nsecrets.alice = { env = \"BAD_SECRET\" }",
            "",
            "servers.files.identity.secrets.alice",
            "visible ASCII",
        ),
        (
            "mode = \"secret\"\nlifetime = \"1m\"\nsecrets.alice = { env = \"ALICE_FILES\" }",
            "",
            "servers.files.identity.lifetime",
            "does not apply",
        ),
        (
            "mode = \"template\"\nheaders = { X-User = \"{user}\" }",
            "",
            "servers.files.identity.headers.X-User",
            "not a placeholder",
        ),
        (
            "mode = \"template\"\nheaders = { Mcp-Session-Id = \"{client}\" }",
            "",
            "servers.files.identity.headers.Mcp-Session-Id",
            "managed by the gateway",
        ),
        (
            "mode = \"assertion\"",
            "",
            "servers.files.identity.mode",
            "signing_keys",
        ),
        (
            "mode = \"assertion\"\nlifetime = \"1h\"",
            KEYS,
            "servers.files.identity.lifetime",
            "at most 600s",
        ),
        (
            "mode = \"assertion\"\nreuse = \"1m\"",
            KEYS,
            "servers.files.identity.reuse",
            "shorter than `lifetime`",
        ),
        (
            "mode = \"exchange\"\ntoken_endpoint = \"https://idp.example/token\"\nclient_id = \"gw\"\nclient_secret = { env = \"GATEWAY_SECRET\" }",
            "",
            "servers.files.identity.mode",
            "needs [auth.jwt]",
        ),
        (
            "mode = \"client_credentials\"\ntoken_endpoint = \"http://idp.example/token\"\nclient_id = \"gw\"\nclient_secret = { env = \"GATEWAY_SECRET\" }",
            "",
            "servers.files.identity.token_endpoint",
            "must be https",
        ),
        (
            "mode = \"client_credentials\"\ntoken_endpoint = \"https://u:p@idp.example/token\"\nclient_id = \"gw\"\nclient_secret = { env = \"GATEWAY_SECRET\" }",
            "",
            "servers.files.identity.token_endpoint",
            "credentials in the URL",
        ),
        (
            "mode = \"client_credentials\"\ntoken_endpoint = \"https://idp.example/token\"\nclient_id = \"gw\"",
            "",
            "servers.files.identity.client_secret",
            "is required",
        ),
        (
            "mode = \"client_credentials\"\ntoken_endpoint = \"https://idp.example/token\"\nclient_id = \"gw\"\nclient_auth = \"private_key_jwt\"",
            "",
            "servers.files.identity.client_auth",
            "signing_keys",
        ),
        (
            "mode = \"client_credentials\"\ntoken_endpoint = \"https://idp.example/token\"\nclient_id = \"gw\"\nclient_secret = { env = \"GATEWAY_SECRET\", file = \"/x\" }",
            "",
            "servers.files.identity.client_secret",
            "exactly one",
        ),
        (
            "mode = \"client_credentials\"\ntoken_endpoint = \"https://idp.example/token\"\nclient_id = \"gw\"\nclient_secret = { env = \"GATEWAY_SECRET\" }\nsubject_token_type = \"x\"",
            "",
            "servers.files.identity.subject_token_type",
            "does not apply",
        ),
        (
            "mode = \"template\"\nheaders = { Authorization = \"{client}\" }\n",
            "",
            "servers.files.identity",
            "keep one",
        ),
    ];
    for (identity, extra, key, reason) in cases {
        let mut text = with(identity, extra);
        if reason == &"keep one" {
            text = text.replace("url = \"http://127.0.0.1:3001/mcp\"\n", "url = \"http://127.0.0.1:3001/mcp\"\nheaders = { Authorization = \"Bearer static\" }\n");
        }
        let e = refuse(&text);
        assert_eq!(e.key, *key, "{identity}: {e}");
        assert!(e.reason.contains(reason), "{identity}: {e}");
        assert!(
            e.line.is_some() || e.key.ends_with("client_secret") || e.key.ends_with("client_auth"),
            "{identity}: {e}"
        );
        assert!(
            !e.to_string().contains("alice-upstream-secret") && !e.to_string().contains("s3cret"),
            "{e}"
        );
    }
}

#[test]
fn a_stdio_server_and_bad_signing_keys_are_refused() {
    let text = format!(
        "[servers.files]\ncommand = [\"python3\", \"s.py\"]\n[servers.files.identity]\nmode = \"template\"\n\
         headers = {{ X-User = \"{{client}}\" }}\n[clients.alice]\napi_key_sha256 = \"{KEY}\"\n"
    );
    assert!(refuse(&text).reason.contains("stdio server"));
    let twice = with(
        "mode = \"assertion\"",
        &KEYS.replace("}]", "}, { env = \"SIGNING\" }]"),
    );
    assert!(refuse(&twice).reason.contains("listed twice"));
    let bad = with(
        "mode = \"assertion\"",
        &KEYS.replace("SIGNING", "GATEWAY_SECRET"),
    );
    let e = refuse(&bad);
    assert_eq!(e.key, "identity.signing_keys[0]");
    assert!(e.reason.contains("PKCS#8"), "{e}");
}
