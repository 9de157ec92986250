use super::*;

/// The methods that ride inside a 2026-07-28 `input_required` result's
/// `inputRequests` (never as messages of their own in that era).
const INPUT_REQUESTS: &[Method] = &[M::SamplingCreateMessage, M::ElicitationCreate, M::RootsList];

/// The published schemas' message unions (`ClientRequest`, `ClientNotification`,
/// `ServerRequest`, `ServerNotification`, and 2026-07-28's `InputRequest`),
/// method by method, as `tests/peers/schema_methods.py` reads them from
/// `mcp-types` 2.3.0 (PyPI), which is generated from the specification's
/// `schema/2025-11-25.json` and `schema/2026-07-28.json`, the JSON forms of each
/// era's `schema.ts` (no registry publishes the `.ts` files themselves). The
/// suite's `methods::the_method_lists_are_the_published_schemas` checks that this
/// snapshot is what the installed package says, so this test needs nothing
/// but Rust and still compares against the published schemas.
const PUBLISHED: &str = include_str!("../../../tests/snapshots/methods/published_schemas.txt");

/// The 2026-07-28 tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663):
/// not part of `schema/2026-07-28.json`, and no registry publishes its schema, so
/// it is written here from the extension's text.
const TASKS_EXTENSION: &[(&str, &str)] = &[
    ("tasks/get", "ClientRequest"),
    ("tasks/update", "ClientRequest"),
    ("tasks/cancel", "ClientRequest"),
    ("notifications/tasks", "ServerNotification"),
];

/// Every method of the published schema of `era` (`"2025-11-25"`,
/// `"2026-07-28"`) with the unions it belongs to.
fn published(era: &str) -> Vec<(String, Vec<String>)> {
    let all: serde_json::Value = serde_json::from_str(PUBLISHED).expect("the snapshot is JSON");
    let unions = all[era]["unions"].as_object().expect("the era's unions");
    let mut methods: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (union_name, names) in unions {
        for name in names.as_array().expect("a list of methods") {
            let name = name.as_str().expect("a method name").to_owned();
            methods.entry(name).or_default().push(union_name.clone());
        }
    }
    if era == "2026-07-28" {
        for (name, union_name) in TASKS_EXTENSION {
            methods
                .entry((*name).to_owned())
                .or_default()
                .push((*union_name).to_owned());
        }
    }
    assert!(
        methods.len() > 20,
        "only {} methods for {era}",
        methods.len()
    );
    methods.into_iter().collect()
}

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
fn table_is_the_schema(era: Era, schema: &[(String, Vec<String>)]) {
    for (name, unions) in schema {
        let method = Method::of(name).unwrap_or_else(|| panic!("{name} is not in the table"));
        assert_eq!(method.name(), name);
        for union_name in unions {
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
            name == e.method.name() && unions.iter().any(|u| u == union(e.direction, e.kind))
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
    table_is_the_schema(Era::Legacy, &published("2025-11-25"));
}

#[test]
fn the_table_is_the_2026_07_28_schema() {
    table_is_the_schema(Era::Modern, &published("2026-07-28"));
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
