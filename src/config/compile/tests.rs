use super::super::model::Transport;
use super::*;
use crate::sanitize::SecretsAction;

const KEY: &str = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

fn base() -> String {
    format!(
        "[servers.flights]\nurl = \"http://127.0.0.1:3001/mcp\"\n\n[clients.alice]\napi_key_sha256 = \"{KEY}\"\n"
    )
}

fn refuse(text: &str) -> ConfigError {
    compile(text, "p.toml", &|name| {
        (name == "SET").then(|| "value".to_owned())
    })
    .expect_err("must be refused")
}

fn accept(text: &str) -> Config {
    compile(text, "p.toml", &|name| {
        (name == "SET").then(|| "value".to_owned())
    })
    .expect("must compile")
}

#[test]
fn a_minimal_file_compiles_with_secure_defaults() {
    let c = accept(&base());
    assert_eq!(c.gateway.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.gateway.admin_listen.to_string(), "127.0.0.1:9090");
    assert_eq!(c.gateway.max_request_bytes, 1 << 20);
    assert!(c.sanitize.ansi && c.sanitize.invisible_unicode);
    assert_eq!(c.sanitize.secrets, SecretsAction::Redact);
    assert!(
        c.policy.rules.is_empty(),
        "deny by default: no rule, no access"
    );
    assert_eq!(c.servers["flights"].timeout, Duration::from_secs(30));
}

#[test]
fn unknown_keys_are_refused_with_their_place() {
    let e = refuse(&format!(
        "[gateway]\nlisten = \"127.0.0.1:1\"\nlistn = \"x\"\n{}",
        base()
    ));
    assert_eq!((e.line, e.column), (Some(3), Some(1)));
    assert_eq!(e.key, "gateway.listn");
    assert!(
        e.reason
            .starts_with("unknown key `listn`; did you mean `listen`?"),
        "{}",
        e.reason
    );
    // Keys of named tables are spelled out.
    let e = refuse(&base().replace("mcp\"\n", "mcp\"\ntimout = \"5s\"\n"));
    assert_eq!(e.key, "servers.flights.timout");
    assert!(e.reason.contains("did you mean `timeout`?"), "{}", e.reason);
}

#[test]
fn rules_must_name_defined_clients_and_servers() {
    let e = refuse(&format!(
        "{}\n[[rules]]\nclients = [\"alice\", \"bobb\"]\nservers = [\"flights\"]\ntools = [\"*\"]\naction = \"allow\"\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].clients[1]");
    assert_eq!(e.line, Some(8));
    assert!(
        e.reason
            .contains("no client named \"bobb\" is defined; defined clients: alice"),
        "{}",
        e.reason
    );
    let e = refuse(&format!(
        "{}\n[[rules]]\nclients = [\"*\"]\nservers = [\"flight\"]\ntools = [\"*\"]\naction = \"allow\"\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].servers[0]");
}

#[test]
fn bad_globs_durations_and_actions_are_explained() {
    let e = refuse(&format!(
        "{}\n[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"search_[a-\"]\naction = \"allow\"\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].tools[0]");
    assert!(e.reason.contains("never closed"), "{}", e.reason);
    let e = refuse(&base().replace("mcp\"\n", "mcp\"\ntimeout = \"30\"\n"));
    assert_eq!(e.key, "servers.flights.timeout");
    assert!(e.reason.contains("has no unit"), "{}", e.reason);
    let e = refuse(&format!(
        "{}\n[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"*\"]\naction = \"permit\"\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].action");
    assert!(
        e.reason.contains("expected one of \"allow\", \"deny\""),
        "{}",
        e.reason
    );
}

#[test]
fn environment_values_must_exist() {
    let ok = accept(&base().replace(
        "mcp\"\n",
        "mcp\"\nheaders = { Authorization = \"Bearer ${SET}\" }\n",
    ));
    assert_eq!(ok.servers["flights"].headers[0].1, "Bearer value");
    let e = refuse(&base().replace(
        "mcp\"\n",
        "mcp\"\nheaders = { Authorization = \"Bearer ${MISSING}\" }\n",
    ));
    assert_eq!(e.key, "servers.flights.headers.Authorization");
    assert!(e.reason.contains("MISSING is not set"), "{}", e.reason);
    let e = refuse(
        "[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n[clients.ci]\napi_key_env = \"MISSING\"\n",
    );
    assert_eq!(e.key, "clients.ci.api_key_env");
}

#[test]
fn clients_need_keys_unless_anonymous() {
    let e = refuse("[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n[clients.bob]\n");
    assert!(e.reason.contains("the client has no key"), "{}", e.reason);
    let c = accept("[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n[clients.anonymous]\n");
    assert_eq!(c.clients.ids().len(), 1);
    let e = refuse(&format!(
        "{}[clients.bob]\napi_key_sha256 = \"{KEY}\"\n",
        base()
    ));
    assert!(
        e.reason.contains("same key as [clients.alice]"),
        "{}",
        e.reason
    );
    let e = refuse(
        "[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n[clients.bob]\napi_key_sha256 = \"abc\"\n",
    );
    assert!(e.reason.contains("64 hexadecimal"), "{}", e.reason);
}

#[test]
fn arguments_and_rates_are_validated() {
    let rule = "\n[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"book\"]\naction = \"allow\"\n";
    let e = refuse(&format!(
        "{}{rule}arguments = {{ properties = {{ n = {{ maximum = \"four\" }} }} }}\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].arguments");
    let e = refuse(&format!(
        "{}{rule}rate = {{ burst = 0, per_second = 1.0 }}\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].rate.burst");
    let e = refuse(&format!(
        "{}{rule}rate = {{ burst = 3, per_second = 0.0 }}\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].rate.per_second");
    // A bucket that would take more than 100 years to fill is refused.
    let e = refuse(&format!(
        "{}{rule}rate = {{ burst = 10000, per_second = 0.000001 }}\n",
        base()
    ));
    assert_eq!(e.key, "rules[0].rate");
    assert!(e.reason.contains("100 years"), "{}", e.reason);
    let c = accept(&format!(
        "{}{rule}rate = {{ burst = 3, per_second = 0.05, key = \"client+tool\" }}\n",
        base()
    ));
    assert!(c.policy.rules[0].rate.is_some());
}

#[test]
fn the_display_points_at_the_fault() {
    let e = refuse(&format!(
        "{}\n[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"*\"]\naction = \"alow\"\n",
        base()
    ));
    let text = e.to_string();
    assert!(
        text.starts_with("p.toml:11:10: `rules[0].action`: \"alow\" is not allowed here"),
        "{text}"
    );
    assert!(text.contains("11 | action = \"alow\""), "{text}");
}

#[test]
fn a_non_loopback_admin_listener_needs_a_token() {
    let e = refuse(&format!(
        "[gateway]\nadmin_listen = \"0.0.0.0:9090\"\n{}",
        base()
    ));
    assert_eq!(e.key, "gateway.admin_listen");
}

#[test]
fn the_pin_store_lives_beside_the_audit_store_unless_named() {
    let c = accept(&base());
    assert_eq!(
        c.pins.database.as_deref(),
        Some(std::path::Path::new("portcullis-pins.db"))
    );
    let c = accept(&format!(
        "{}[audit]\ndatabase = \"/var/lib/portcullis/audit.db\"\n",
        base()
    ));
    assert_eq!(
        c.pins.database.as_deref(),
        Some(std::path::Path::new(
            "/var/lib/portcullis/portcullis-pins.db"
        ))
    );
    let c = accept(&format!(
        "{}[pins]\ndatabase = \"/tmp/${{SET}}.db\"\n",
        base()
    ));
    assert_eq!(
        c.pins.database.as_deref(),
        Some(std::path::Path::new("/tmp/value.db"))
    );
    let c = accept(&format!("{}[pins]\ndatabase = \":memory:\"\n", base()));
    assert!(c.pins.database.is_none());
}

#[test]
fn pin_store_refusals_are_precise() {
    let e = refuse(&format!("{}[pins]\ndatabase = \"\"\n", base()));
    assert_eq!(e.key, "pins.database");
    assert_eq!(e.line, Some(7));
    assert!(e.reason.contains(":memory:"), "{}", e.reason);
    let e = refuse(&format!("{}[pins]\ndatabase = \"/var/lib/\"\n", base()));
    assert_eq!(e.key, "pins.database");
    let e = refuse(&format!("{}[pins]\ndatabse = \"x.db\"\n", base()));
    assert_eq!(e.key, "pins.databse");
    assert!(
        e.reason.contains("did you mean `database`?"),
        "{}",
        e.reason
    );
    let e = refuse(&format!("{}[pins]\ndatabase = \"${{UNSET}}\"\n", base()));
    assert!(e.reason.contains("UNSET is not set"), "{}", e.reason);
}

#[test]
fn sanitize_exemptions_compile_to_per_tool_skips() {
    let c = accept(&format!(
        "{}[servers.vault]\nurl = \"http://127.0.0.1:3002/mcp\"\n\
         [sanitize]\narguments = \"off\"\n\
         [[sanitize.exemptions]]\nservers = [\"vault\"]\ntools = [\"read_*\"]\nskip = [\"secrets\", \"max_output_bytes\"]\n\
         [[sanitize.exemptions]]\ntools = [\"login\"]\nskip = [\"arguments\"]\n",
        base()
    ));
    assert_eq!(c.sanitize.arguments, crate::config::ArgumentScan::Off);
    let skip = c.sanitize.skip_for("vault", "read_secret");
    assert!(skip.secrets && skip.max_output_bytes && !skip.ansi && !skip.arguments);
    assert_eq!(
        c.sanitize.skip_for("flights", "read_secret"),
        Default::default()
    );
    assert!(c.sanitize.skip_for("flights", "login").arguments);
    assert_eq!(
        accept(&base()).sanitize.arguments,
        crate::config::ArgumentScan::Block
    );
}

#[test]
fn sanitize_exemptions_are_checked() {
    let e = refuse(&format!(
        "{}[[sanitize.exemptions]]\ntools = [\"x\"]\nskip = [\"secret\"]\n",
        base()
    ));
    assert_eq!(e.key, "sanitize.exemptions[0].skip[0]");
    assert!(
        e.reason
            .starts_with("\"secret\" is not a sanitizer action; did you mean \"secrets\"?"),
        "{}",
        e.reason
    );
    assert_eq!(e.line, Some(8));

    let e = refuse(&format!(
        "{}[[sanitize.exemptions]]\ntools = []\nskip = [\"ansi\"]\n",
        base()
    ));
    assert_eq!(e.key, "sanitize.exemptions[0].tools");

    let e = refuse(&format!(
        "{}[[sanitize.exemptions]]\ntools = [\"x\"]\nskip = []\n",
        base()
    ));
    assert_eq!(e.key, "sanitize.exemptions[0].skip");

    let e = refuse(&format!(
        "{}[[sanitize.exemptions]]\nservers = [\"nope\"]\ntools = [\"x\"]\nskip = [\"ansi\"]\n",
        base()
    ));
    assert_eq!(e.key, "sanitize.exemptions[0].servers[0]");
    assert!(
        e.reason.contains("no server named \"nope\""),
        "{}",
        e.reason
    );

    let e = refuse(&format!(
        "{}[[sanitize.exemptions]]\ntool = [\"x\"]\nskip = [\"ansi\"]\n",
        base()
    ));
    assert!(
        e.reason
            .starts_with("unknown key `tool`; did you mean `tools`?"),
        "{}",
        e.reason
    );

    let e = refuse(&format!("{}[sanitize]\narguments = \"redact\"\n", base()));
    assert_eq!(e.key, "sanitize.arguments");
}

fn stdio(table: &str) -> String {
    format!("[servers.local]\n{table}\n[clients.alice]\napi_key_sha256 = \"{KEY}\"\n")
}

#[test]
fn a_stdio_server_compiles_with_its_environment_expanded() {
    let c = accept(&stdio(
        "command = [\"python3\", \"server.py\", \"--key=${SET}\"]\nenv = { API_KEY = \"${SET}\" }\ncwd = \"/\"\ntimeout = \"5s\"",
    ));
    let Transport::Stdio(command) = &c.servers["local"].transport else {
        panic!("a stdio transport");
    };
    assert_eq!(command.program, "python3");
    assert_eq!(command.args, ["server.py", "--key=value"]);
    assert_eq!(command.env, [("API_KEY".to_owned(), "value".to_owned())]);
    assert_eq!(command.cwd.as_deref(), Some(std::path::Path::new("/")));
    // Expanded values may be secrets: never in a debug print or the summary.
    assert!(!format!("{command:?}").contains("value"));
    assert_eq!(
        c.servers["local"].transport.to_string(),
        "stdio: python3 server.py --key=${SET}"
    );
}

#[test]
fn a_server_needs_exactly_one_of_url_and_command() {
    let e = refuse(&stdio("timeout = \"5s\""));
    assert_eq!((e.key.as_str(), e.line), ("servers.local", Some(1)));
    assert!(
        e.reason.contains("neither `url` nor `command`"),
        "{}",
        e.reason
    );
    let e = refuse(&stdio(
        "url = \"http://127.0.0.1:1/mcp\"\ncommand = [\"x\"]",
    ));
    assert_eq!((e.key.as_str(), e.line), ("servers.local.command", Some(3)));
}

#[test]
fn stdio_and_http_keys_do_not_mix() {
    let e = refuse(&stdio("command = []"));
    assert_eq!(e.key, "servers.local.command");
    assert!(e.reason.contains("empty"), "{}", e.reason);
    let e = refuse(&stdio(
        "command = [\"x\"]\nheaders = { Authorization = \"Bearer t\" }",
    ));
    assert_eq!(e.key, "servers.local.headers.Authorization");
    let e = refuse(&stdio("command = [\"x\"]\nconnect_timeout = \"1s\""));
    assert_eq!(e.key, "servers.local.connect_timeout");
    let e = refuse(&stdio(
        "url = \"http://127.0.0.1:1/mcp\"\nenv = { A = \"b\" }",
    ));
    assert_eq!(e.key, "servers.local.env.A");
    let e = refuse(&stdio("command = [\"x\"]\nenv = { \"A-B\" = \"b\" }"));
    assert_eq!(e.key, "servers.local.env.A-B");
    let e = refuse(&stdio("command = [\"x\"]\nenv = { A = \"${UNSET}\" }"));
    assert!(e.reason.contains("UNSET is not set"), "{}", e.reason);
    let e = refuse(&stdio("command = [\"x\"]\ncwd = \"/no/such/dir\""));
    assert_eq!(e.key, "servers.local.cwd");
}

#[test]
fn connection_limits_default_for_a_sidecar_and_are_checked() {
    let c = accept(&base());
    assert_eq!(c.gateway.max_connections, DEFAULT_MAX_CONNECTIONS);
    assert_eq!(c.gateway.header_timeout, Duration::from_secs(10));
    assert!(c.gateway.header_timeout < c.gateway.client_timeout);
    // A short client_timeout bounds the default first-headers deadline too.
    let c = accept(&format!("[gateway]\nclient_timeout = \"3s\"\n{}", base()));
    assert_eq!(c.gateway.header_timeout, Duration::from_secs(3));

    let e = refuse(&format!(
        "[gateway]\nclient_timeout = \"5s\"\nheader_timeout = \"6s\"\n{}",
        base()
    ));
    assert_eq!(e.key, "gateway.header_timeout");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.reason.contains("at most client_timeout"), "{e}");
    let e = refuse(&format!("[gateway]\nmax_connections = 0\n{}", base()));
    assert_eq!(e.key, "gateway.max_connections");
}

#[test]
fn shared_state_needs_a_url_a_shared_key_and_a_namespace_without_separators() {
    use crate::ratelimit::RateBackend;
    use crate::state::StateBackend;
    let c = accept(&base());
    assert_eq!(c.state.backend, StateBackend::Memory);
    assert_eq!(c.state.namespace, "default");
    let redis = "[state]\nbackend = \"redis\"\nredis_url = \"redis://r:6379\"\n";
    let key = "[approvals]\nkey = \"0123456789abcdef0123456789abcdef\"\n";
    let e = refuse(&format!("{}{redis}", base()));
    assert_eq!(e.key, "state.backend");
    assert!(e.reason.contains("`[approvals] key`"), "{}", e.reason);
    let e = refuse(&format!("{}{key}[state]\nbackend = \"redis\"\n", base()));
    assert_eq!(e.key, "state.redis_url");
    let e = refuse(&format!("{}{key}{redis}namespace = \"a:b\"\n", base()));
    assert_eq!(e.key, "state.namespace");
    let e = refuse(&format!("{}[state]\nredis_url = \"http://r\"\n", base()));
    assert_eq!(e.key, "state.redis_url");
    // One Redis for the deployment: the rate limiter takes [state]'s URL.
    let c = accept(&format!(
        "{}{key}{redis}namespace = \"prod\"\n[rate_limit]\nbackend = \"redis\"\n",
        base()
    ));
    assert_eq!(
        c.state.backend,
        StateBackend::Redis("redis://r:6379".into())
    );
    assert_eq!(c.state.namespace, "prod");
    assert_eq!(
        c.rate_limit.backend,
        RateBackend::Redis("redis://r:6379".into())
    );
    // Its own URL wins.
    let c = accept(&format!(
        "{}{key}{redis}[rate_limit]\nbackend = \"redis\"\nredis_url = \"redis://rl:1\"\n",
        base()
    ));
    assert_eq!(
        c.rate_limit.backend,
        RateBackend::Redis("redis://rl:1".into())
    );
}

#[test]
fn an_excerpt_shows_no_url_password() {
    assert_eq!(
        super::without_passwords(
            r#"url = "postgres://portcullis:s3cret@db/audit?sslmode=x" # redis://:pw@r:1"#
        ),
        r#"url = "postgres://portcullis:***@db/audit?sslmode=x" # redis://:***@r:1"#
    );
    // Nothing to hide: unchanged.
    for line in [
        r#"url = "redis://r:6379""#,
        r#"url = "postgres://portcullis:${PGPASSWORD}@db/audit""#,
        "plain = 1",
    ] {
        let shown = super::without_passwords(line);
        if line.contains("${") {
            assert_eq!(shown, r#"url = "postgres://portcullis:***@db/audit""#);
        } else {
            assert_eq!(shown, line);
        }
    }
}

proptest::proptest! {
    /// Whatever the password, the excerpt of a line holding its URL does not show it.
    #[test]
    fn no_url_password_reaches_an_excerpt(
        scheme in "(redis|rediss|postgres|postgresql)",
        user in "[a-z]{0,8}",
        password in "PW[A-Za-z0-9._~!$&*+,;=%@:-]{1,20}",
        host in "[a-z]{1,8}(:[0-9]{1,5})?",
        tail in "(/[a-z]{0,6})?(\\?[a-z=&]{0,10})?",
    ) {
        let line = format!("url = \"{scheme}://{user}:{password}@{host}{tail}\"");
        let shown = super::without_passwords(&line);
        proptest::prop_assert!(!shown.contains(&password), "{}", shown);
        proptest::prop_assert!(shown.contains(&host), "{}", shown);
    }
}
