use super::*;

/// The methods that ride inside a 2026-07-28 `input_required` result's
/// `inputRequests` (never as messages of their own in that era).
const INPUT_REQUESTS: &[Method] = &[M::SamplingCreateMessage, M::ElicitationCreate, M::RootsList];

/// Every `method: "…"` of `schema/2025-11-25/schema.ts`, with the union it
/// belongs to (`ClientRequest`, `ClientNotification`, `ServerRequest`,
/// `ServerNotification`), as read from the schema file.
const SCHEMA_2025_11_25: &[(&str, &[&str])] = &[
    (
        "notifications/cancelled",
        &["ClientNotification", "ServerNotification"],
    ),
    ("initialize", &["ClientRequest"]),
    ("notifications/initialized", &["ClientNotification"]),
    ("ping", &["ClientRequest", "ServerRequest"]),
    (
        "notifications/progress",
        &["ClientNotification", "ServerNotification"],
    ),
    ("resources/list", &["ClientRequest"]),
    ("resources/templates/list", &["ClientRequest"]),
    ("resources/read", &["ClientRequest"]),
    (
        "notifications/resources/list_changed",
        &["ServerNotification"],
    ),
    ("resources/subscribe", &["ClientRequest"]),
    ("resources/unsubscribe", &["ClientRequest"]),
    ("notifications/resources/updated", &["ServerNotification"]),
    ("prompts/list", &["ClientRequest"]),
    ("prompts/get", &["ClientRequest"]),
    (
        "notifications/prompts/list_changed",
        &["ServerNotification"],
    ),
    ("tools/list", &["ClientRequest"]),
    ("tools/call", &["ClientRequest"]),
    ("notifications/tools/list_changed", &["ServerNotification"]),
    ("tasks/get", &["ClientRequest", "ServerRequest"]),
    ("tasks/result", &["ClientRequest", "ServerRequest"]),
    ("tasks/cancel", &["ClientRequest", "ServerRequest"]),
    ("tasks/list", &["ClientRequest", "ServerRequest"]),
    (
        "notifications/tasks/status",
        &["ClientNotification", "ServerNotification"],
    ),
    ("logging/setLevel", &["ClientRequest"]),
    ("notifications/message", &["ServerNotification"]),
    ("sampling/createMessage", &["ServerRequest"]),
    ("completion/complete", &["ClientRequest"]),
    ("roots/list", &["ServerRequest"]),
    ("notifications/roots/list_changed", &["ClientNotification"]),
    ("elicitation/create", &["ServerRequest"]),
    (
        "notifications/elicitation/complete",
        &["ServerNotification"],
    ),
];

/// The same for `schema/2026-07-28/schema.ts`, plus the tasks extension
/// (`docs/extensions/tasks`, SEP-2663). `roots/list`, `sampling/createMessage`
/// and `elicitation/create` appear there only as `inputRequests`.
const SCHEMA_2026_07_28: &[(&str, &[&str])] = &[
    (
        "notifications/cancelled",
        &["ClientNotification", "ServerNotification"],
    ),
    ("server/discover", &["ClientRequest"]),
    ("notifications/progress", &["ServerNotification"]),
    ("resources/list", &["ClientRequest"]),
    ("resources/templates/list", &["ClientRequest"]),
    ("resources/read", &["ClientRequest"]),
    (
        "notifications/resources/list_changed",
        &["ServerNotification"],
    ),
    ("subscriptions/listen", &["ClientRequest"]),
    (
        "notifications/subscriptions/acknowledged",
        &["ServerNotification"],
    ),
    ("notifications/resources/updated", &["ServerNotification"]),
    ("prompts/list", &["ClientRequest"]),
    ("prompts/get", &["ClientRequest"]),
    (
        "notifications/prompts/list_changed",
        &["ServerNotification"],
    ),
    ("tools/list", &["ClientRequest"]),
    ("tools/call", &["ClientRequest"]),
    ("notifications/tools/list_changed", &["ServerNotification"]),
    ("notifications/message", &["ServerNotification"]),
    ("sampling/createMessage", &["InputRequest"]),
    ("completion/complete", &["ClientRequest"]),
    ("roots/list", &["InputRequest"]),
    ("elicitation/create", &["InputRequest"]),
    // io.modelcontextprotocol/tasks
    ("tasks/get", &["ClientRequest"]),
    ("tasks/update", &["ClientRequest"]),
    ("tasks/cancel", &["ClientRequest"]),
    ("notifications/tasks", &["ServerNotification"]),
];

fn union(direction: Direction, kind: Kind) -> &'static str {
    match (direction, kind) {
        (Direction::ClientToServer, Kind::Request) => "ClientRequest",
        (Direction::ClientToServer, Kind::Notification) => "ClientNotification",
        (Direction::ServerToClient, Kind::Request) => "ServerRequest",
        (Direction::ServerToClient, Kind::Notification) => "ServerNotification",
    }
}

/// The table holds exactly the schema's messages of `era`: every union a
/// method belongs to has its row, and no row exists the schema lacks.
fn table_is_the_schema(era: Era, schema: &[(&str, &[&str])]) {
    for (name, unions) in schema {
        let method = Method::of(name).unwrap_or_else(|| panic!("{name} is not in the table"));
        assert_eq!(method.name(), *name);
        for union_name in *unions {
            if *union_name == "InputRequest" {
                assert!(INPUT_REQUESTS.contains(&method), "{name}");
                continue;
            }
            let found = TABLE.iter().any(|e| {
                e.method == method && e.eras.has(era) && union(e.direction, e.kind) == *union_name
            });
            assert!(found, "{name} as {union_name} is missing in {era:?}");
        }
    }
    for e in TABLE.iter().filter(|e| e.eras.has(era)) {
        let listed = schema.iter().any(|(name, unions)| {
            *name == e.method.name() && unions.contains(&union(e.direction, e.kind))
        });
        assert!(
            listed,
            "{:?} is in the table for {era:?} but not in the schema",
            e
        );
    }
}

#[test]
fn the_table_is_the_2025_11_25_schema() {
    table_is_the_schema(Era::Legacy, SCHEMA_2025_11_25);
}

#[test]
fn the_table_is_the_2026_07_28_schema() {
    table_is_the_schema(Era::Modern, SCHEMA_2026_07_28);
}

#[test]
fn every_method_has_a_row_and_rows_are_unique() {
    for m in Method::ALL {
        assert!(TABLE.iter().any(|e| e.method == *m), "{m} has no row");
        assert_eq!(Method::of(m.name()), Some(*m));
    }
    for (i, a) in TABLE.iter().enumerate() {
        for b in &TABLE[i + 1..] {
            let overlap = a.method == b.method
                && a.direction == b.direction
                && a.kind == b.kind
                && [Era::Legacy, Era::Modern]
                    .iter()
                    .any(|era| a.eras.has(*era) && b.eras.has(*era));
            assert!(!overlap, "{a:?} and {b:?} overlap");
        }
    }
}

#[test]
fn names_match_exactly() {
    let none = Extras::default();
    for name in [
        "Tools/call",
        "tools/call ",
        " tools/call",
        "tools/Call",
        "TOOLS/CALL",
        "tools//call",
        "tools/call\0",
        "",
    ] {
        assert_eq!(
            client_call(name, Kind::Request, Era::Legacy, &none),
            None,
            "{name:?}"
        );
        assert_eq!(
            client_call(name, Kind::Request, Era::Modern, &none),
            None,
            "{name:?}"
        );
    }
    let called = client_call("tools/call", Kind::Request, Era::Modern, &none);
    assert_eq!(called.map(|c| c.class()), Some(Class::Tool));
}

#[test]
fn methods_live_in_their_era_kind_and_direction() {
    let none = Extras::default();
    let up = |name, kind, era| client_call(name, kind, era, &none).map(|c| c.class());
    assert_eq!(
        up("resources/subscribe", Kind::Request, Era::Legacy),
        Some(Class::Resource)
    );
    assert_eq!(up("resources/subscribe", Kind::Request, Era::Modern), None);
    assert_eq!(up("initialize", Kind::Request, Era::Modern), None);
    assert_eq!(up("server/discover", Kind::Request, Era::Legacy), None);
    assert_eq!(up("tasks/update", Kind::Request, Era::Legacy), None);
    assert_eq!(
        up("tasks/update", Kind::Request, Era::Modern),
        Some(Class::Task)
    );
    assert_eq!(up("tasks/list", Kind::Request, Era::Modern), None);
    // A request's name sent as a notification, and the reverse, are unknown.
    assert_eq!(up("tools/call", Kind::Notification, Era::Legacy), None);
    assert_eq!(
        up("notifications/initialized", Kind::Request, Era::Legacy),
        None
    );
    // Server → client only.
    assert_eq!(
        up("sampling/createMessage", Kind::Request, Era::Legacy),
        None
    );
    assert_eq!(
        up(
            "notifications/tools/list_changed",
            Kind::Notification,
            Era::Legacy
        ),
        None
    );
    assert!(server_message("sampling/createMessage", Kind::Request, Era::Legacy).is_some());
    assert!(server_message("sampling/createMessage", Kind::Request, Era::Modern).is_none());
    assert!(server_message("notifications/tasks", Kind::Notification, Era::Modern).is_some());
    assert!(server_message("tools/call", Kind::Request, Era::Legacy).is_none());
    assert!(server_message("x/custom", Kind::Notification, Era::Legacy).is_none());
}

#[test]
fn lists_know_their_method() {
    for kind in [
        ListKind::Tools,
        ListKind::Resources,
        ListKind::Templates,
        ListKind::Prompts,
    ] {
        let e = entry(
            kind.method().name(),
            Direction::ClientToServer,
            Kind::Request,
            Era::Modern,
        );
        assert_eq!(e.map(|e| e.class), Some(Class::List(kind)));
    }
}

#[test]
fn operators_name_their_own_methods_only() {
    let mut extras = Extras::default();
    extras.add("x/custom", "tool").expect("a custom method");
    extras
        .add("x/ping", "notification")
        .expect("a custom notification");
    assert_eq!(
        extras.add("tools/call", "lifecycle"),
        Err(ExtraError::Spec("tools/call".into()))
    );
    assert!(matches!(
        extras.add("x/y", "admin"),
        Err(ExtraError::Class(..))
    ));
    assert_eq!(extras.add("", "tool"), Err(ExtraError::Empty));
    assert_eq!(extras.add("x y", "tool"), Err(ExtraError::Form));
    let called = client_call("x/custom", Kind::Request, Era::Legacy, &extras);
    assert_eq!(called.map(|c| c.class()), Some(Class::Tool));
    assert_eq!(
        client_call("X/custom", Kind::Request, Era::Legacy, &extras),
        None
    );
    assert_eq!(
        client_call("x/custom", Kind::Notification, Era::Legacy, &extras),
        None
    );
    let note = client_call("x/ping", Kind::Notification, Era::Modern, &extras);
    assert_eq!(note.map(|c| c.class()), Some(Class::Notification));
    assert_eq!(
        client_call("x/ping", Kind::Request, Era::Modern, &extras),
        None
    );
    // A spec method out of its era stays unknown even if someone tried to name it.
    assert_eq!(
        client_call("resources/subscribe", Kind::Request, Era::Modern, &extras),
        None
    );
}
