//! The shape of `src/`: layers that only point down, and no import circle.
//!
//! Every source file's imports (`use crate::…`, `use super::…`, paths written
//! inline, and a parent's references to its own child modules) are read as
//! text and resolved to the file that defines them. Two properties are
//! checked: no circle of files importing each other, whatever its length; and
//! every import between top-level modules goes to a layer at or below the
//! importer's, per the table below. Test modules (`tests.rs`, `#[cfg(test)]`
//! blocks) are left out: they may reach anything.
//!
//! `cargo test --test suite layers::` runs it; a failure names the circle or the
//! upward import, with the names that tie the files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first; a module may import from its own layer or below.
const LAYERS: &[&[&str]] = &[
    // small utilities
    &["util"],
    // the pure protocol model
    &["mcp"],
    // decisions, each owning its settings type
    &[
        "approval",
        "auth",
        "flow",
        "identity",
        "pins",
        "policy",
        "ratelimit",
        "sanitize",
        "state",
        "validate",
    ],
    // refusals and how they are rendered; the span exporter and trace context
    &["error", "telemetry"],
    // the record layer: event, trail, spans, sinks, the live ring
    &["record"],
    // sinks above the record layer
    &["audit", "metrics"],
    // the configuration, compiled into the settings types beneath it
    &["config"],
    // the transports to upstream servers: HTTP client, stdio children
    &["transport"],
    // the gateway pipeline, whose steps hand exchanges to the transport
    &["proxy"],
    // the admin listener on its own state
    &["admin"],
    // app wiring: sinks, listeners, shutdown
    &["app"],
    // commands of the binary, and the demo
    &["cli", "demo"],
    // the crate root and the binary
    &["lib", "main"],
];

type Module = Vec<String>;

/// Every source file of `src/`, by module path (`proxy/state` → ["proxy", "state"]).
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .expect("under src")
                    .with_extension("");
                let mut parts: Module = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if parts.last().is_some_and(|p| p == "tests") {
                    continue;
                }
                if parts.last().is_some_and(|p| p == "mod") {
                    parts.pop();
                }
                out.insert(parts, path);
            }
        }
    }
    out
}

/// The text without comments, string literals and `#[cfg(test)]` items.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for n in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if n == '\\' {
                        escaped = true;
                    } else if n == '"' {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    drop_test_items(&out)
}

/// Removes each `#[cfg(test)]` item (up to its matching closing brace or `;`).
fn drop_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The paths a file names: each `use` tree expanded, and inline `crate::…` / `super::…`.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let tail = &rest[at + 3..];
        let end = tail.find(';').unwrap_or(tail.len());
        expand(&mut paths, Vec::new(), tail[..end].trim());
        rest = &tail[end..];
    }
    for prefix in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                let path: Vec<String> = tail[..len]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                paths.push(path);
            }
            rest = &tail[len.max(1)..];
        }
    }
    paths
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let bounded = |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if bounded(before) && after.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Expands one `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(out: &mut Vec<Vec<String>>, prefix: Vec<String>, tree: &str) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    let mut depth = 0usize;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    if parts.len() > 1 {
        for part in parts {
            expand(out, prefix.clone(), part);
        }
        return;
    }
    let one = parts[0].trim();
    if let Some(open) = one.find('{') {
        let head = one[..open].trim_end_matches("::");
        let mut path = prefix;
        path.extend(
            head.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        expand(out, path, &one[open + 1..one.len() - 1]);
    } else if one.starts_with('{') {
        expand(out, prefix, &one[1..one.len() - 1]);
    } else {
        let one = one.split(" as ").next().unwrap_or(one);
        let mut path = prefix;
        path.extend(one.split("::").map(|s| s.trim().to_owned()));
        out.push(path);
    }
}

/// The file a path names from `module`, if it is one of the crate's.
fn resolve(files: &BTreeMap<Module, PathBuf>, module: &Module, path: &[String]) -> Option<Module> {
    let (mut at, rest): (Module, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("super") => (
            module[..module.len().saturating_sub(1)].to_vec(),
            &path[1..],
        ),
        Some("self") => (module.clone(), &path[1..]),
        _ => return None,
    };
    let mut rest = rest;
    while rest.first().is_some_and(|s| s == "super") {
        at.pop();
        rest = &rest[1..];
    }
    for segment in rest {
        let mut next = at.clone();
        next.push(segment.clone());
        if files.contains_key(&next) {
            at = next;
        } else {
            break;
        }
    }
    Some(at)
}

/// Who imports whom, with the names that tie them.
fn graph(root: &Path) -> BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> {
    let files = modules(root);
    let mut edges: BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> = BTreeMap::new();
    for (module, path) in &files {
        let code = code_of(&std::fs::read_to_string(path).expect("read"));
        let mut paths = named_paths(&code);
        // A parent naming its own child module (`child::item`).
        for child in files
            .keys()
            .filter(|k| k.len() == module.len() + 1 && k[..module.len()] == module[..])
        {
            let name = child.last().expect("child name");
            if code.match_indices(&format!("{name}::")).any(|(i, _)| {
                !code[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            }) {
                paths.push(vec!["self".into(), name.clone()]);
            }
        }
        let entry = edges.entry(module.clone()).or_default();
        for path in paths {
            if let Some(target) = resolve(&files, module, &path)
                && &target != module
                && files.contains_key(&target)
            {
                let name = path.last().cloned().unwrap_or_default();
                entry.entry(target).or_default().insert(name);
            }
        }
    }
    edges
}

fn show(module: &Module) -> String {
    if module.is_empty() {
        "lib".to_owned()
    } else {
        module.join("/")
    }
}

fn layer_of(module: &Module) -> usize {
    let top = module.first().map_or("lib", String::as_str);
    LAYERS
        .iter()
        .position(|layer| layer.contains(&top))
        .unwrap_or_else(|| panic!("src/{top} is in no layer: add it to LAYERS"))
}

#[test]
fn no_file_of_src_is_in_an_import_circle() {
    let edges = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // Depth-first search; a back edge closes a circle, reported with its names.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    let mut marks: BTreeMap<Module, Mark> = BTreeMap::new();
    let mut circles = Vec::new();
    fn visit(
        m: &Module,
        edges: &BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
        circles: &mut Vec<String>,
    ) {
        marks.insert(m.clone(), Mark::Open);
        stack.push(m.clone());
        for (next, names) in edges.get(m).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let from = stack.iter().position(|s| s == next).expect("on the stack");
                    let ring: Vec<String> = stack[from..].iter().map(show).collect();
                    let tie: Vec<&str> = names.iter().map(String::as_str).collect();
                    circles.push(format!(
                        "{} -> {} (via {})",
                        ring.join(" -> "),
                        show(next),
                        tie.join(", ")
                    ));
                }
                Some(Mark::Done) => {}
                None => visit(next, edges, marks, stack, circles),
            }
        }
        stack.pop();
        marks.insert(m.clone(), Mark::Done);
    }
    for m in edges.keys() {
        if !marks.contains_key(m) {
            visit(m, &edges, &mut marks, &mut Vec::new(), &mut circles);
        }
    }
    assert!(
        circles.is_empty(),
        "import circles in src/:\n{}",
        circles.join("\n")
    );
    assert!(edges.len() > 50, "the source tree was not read");
}

#[test]
fn every_import_points_down_the_layers() {
    let edges = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut upward = Vec::new();
    for (from, targets) in &edges {
        for (to, names) in targets {
            let (a, b) = (layer_of(from), layer_of(to));
            if b > a {
                let tie: Vec<&str> = names.iter().map(String::as_str).collect();
                upward.push(format!(
                    "src/{} (layer {a}) imports src/{} (layer {b}): {}",
                    show(from),
                    show(to),
                    tie.join(", ")
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that point up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_checker_sees_a_circle_and_an_upward_import() {
    // Two throwaway files that import each other, one of them from a lower layer.
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("util")).expect("dirs");
    std::fs::write(src.join("lib.rs"), "pub mod util;\npub mod proxy;\n").expect("lib");
    std::fs::write(src.join("util.rs"), "pub mod a;\n").expect("util");
    std::fs::write(
        src.join("util/a.rs"),
        "use crate::proxy::Thing;\npub struct Leaf;\n",
    )
    .expect("a");
    std::fs::write(
        src.join("proxy.rs"),
        "use crate::util::a::Leaf;\npub struct Thing;\n",
    )
    .expect("proxy");
    let edges = graph(src);
    let util_a = vec!["util".to_owned(), "a".to_owned()];
    let proxy = vec!["proxy".to_owned()];
    assert!(edges[&util_a].contains_key(&proxy), "{edges:?}");
    assert!(edges[&proxy].contains_key(&util_a), "{edges:?}");
    assert!(layer_of(&util_a) < layer_of(&proxy));
}

#[test]
fn the_transport_sits_beneath_the_pipeline_and_imports_none_of_it() {
    let transport = vec!["transport".to_owned()];
    let proxy = vec!["proxy".to_owned()];
    let config = vec!["config".to_owned()];
    assert!(layer_of(&transport) < layer_of(&proxy));
    assert!(layer_of(&config) < layer_of(&transport));
    // The real tree: the pipeline reaches the transport, never the reverse.
    let edges = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut from_transport = Vec::new();
    let mut into_transport = 0;
    for (from, targets) in &edges {
        for to in targets.keys() {
            if from.first() == Some(&transport[0]) && to.first() == Some(&proxy[0]) {
                from_transport.push(format!("{} -> {}", show(from), show(to)));
            }
            if from.first() == Some(&proxy[0]) && to.first() == Some(&transport[0]) {
                into_transport += 1;
            }
        }
    }
    assert!(from_transport.is_empty(), "{from_transport:?}");
    assert!(
        into_transport > 0,
        "the pipeline was seen using no transport"
    );
}
