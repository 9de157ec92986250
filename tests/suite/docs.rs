//! The README and the book (`docs/`, mdBook's layout) hold what they promise:
//! every relative link and `#anchor` resolves, nothing cites a file outside the
//! repository, `docs/src/SUMMARY.md` lists every chapter, and the configuration
//! reference is exactly what `portcullis config-reference` prints, with a row
//! for every key of `portcullis config-schema`.
//!
//! Anchors are GitHub's: a heading's text lowercased, letters, digits, `-`, `_`
//! and spaces kept, spaces made `-`, a repeated one suffixed `-1`, `-2`; plus
//! explicit `<a id="…">`. Links inside code (fenced or `inline`) are text, not
//! links. `UPDATE_SNAPSHOTS=1 cargo test --test suite docs::` writes the
//! reference again.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BIN: &str = env!("CARGO_BIN_EXE_portcullis");
const REFERENCE: &str = "docs/src/reference.md";

/// README.md and every Markdown file under docs/.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).expect("a docs directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = Path::new(ROOT);
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut out);
    out.sort();
    out
}

/// The lines of `text` outside fenced code blocks, inline code removed.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans: drop the text between backtick pairs.
        let kept: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join("");
        out.push(kept);
    }
    out
}

/// GitHub's anchor of a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a document offers.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let mut candidate = base.clone();
            let mut n = 0;
            while out.contains(&candidate) {
                n += 1;
                candidate = format!("{base}-{n}");
            }
            out.insert(candidate);
        }
        let mut rest = line;
        while let Some(i) = rest.find("<a id=\"") {
            rest = &rest[i + 7..];
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_owned());
            }
        }
    }
    out
}

/// The targets of `[text](target)` links (and images) in prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].trim().to_owned());
                rest = &rest[end..];
            }
        }
    }
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(ROOT)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_relative_link_and_anchor_resolves_inside_the_repository() {
    let root = fs::canonicalize(ROOT).expect("the repository");
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = fs::read_to_string(&doc).expect("document");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().expect("a directory").join(path)
            };
            let Ok(file) = fs::canonicalize(&file) else {
                broken.push(format!("{}: `{target}`: no such file", relative(&doc)));
                continue;
            };
            if !file.starts_with(&root) {
                broken.push(format!(
                    "{}: `{target}` leaves the repository",
                    relative(&doc)
                ));
                continue;
            }
            if let Some(anchor) = anchor {
                let offered = fs::read_to_string(&file)
                    .map(|t| anchors(&t))
                    .unwrap_or_default();
                if !offered.contains(anchor) {
                    broken.push(format!(
                        "{}: `{target}`: {} has no anchor `{anchor}`",
                        relative(&doc),
                        relative(&file)
                    ));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn nothing_cites_a_file_outside_the_repository() {
    // Files the project's own working notes live in, which a reader of the
    // repository cannot open.
    let outside = [
        "product.md",
        "mcp-protocol.md",
        "threats.md",
        "../shared",
        "/work/",
    ];
    let mut found = Vec::new();
    for doc in documents() {
        let text = fs::read_to_string(&doc).expect("document");
        for (n, line) in text.lines().enumerate() {
            for name in outside {
                if line.contains(name) {
                    found.push(format!("{}:{}: {name}", relative(&doc), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "citations of files outside the repository:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_summary_lists_every_chapter_and_the_readme_stays_short() {
    let src = Path::new(ROOT).join("docs/src");
    let summary = fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    assert!(
        Path::new(ROOT).join("docs/book.toml").is_file(),
        "docs/book.toml is missing"
    );
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let chapters: BTreeSet<String> = fs::read_dir(&src)
        .expect("docs/src")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "SUMMARY.md")
        .collect();
    let missing: Vec<&String> = chapters.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "chapters not in SUMMARY.md: {missing:?}"
    );
    let readme = fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: a newcomer reads it in five minutes (at most 250); move detail into a chapter"
    );
}

fn portcullis(command: &str) -> String {
    let out = Command::new(BIN)
        .arg(command)
        .current_dir(ROOT)
        .env_clear()
        .output()
        .expect("the portcullis binary runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn the_reference_is_what_config_reference_prints() {
    let generated = portcullis("config-reference");
    let path = Path::new(ROOT).join(REFERENCE);
    if std::env::var("UPDATE_SNAPSHOTS").as_deref() == Ok("1") {
        fs::write(&path, &generated).expect("write the reference");
        return;
    }
    let checked_in = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{REFERENCE} is not what `portcullis config-reference` prints: the configuration types \
         changed. Run `UPDATE_SNAPSHOTS=1 cargo test --test suite docs::` and read the diff."
    );
}

#[test]
fn every_key_of_the_schema_has_a_row_in_the_reference() {
    fn keys(value: &serde_json::Value, out: &mut BTreeSet<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                    out.extend(props.keys().cloned());
                }
                map.values().for_each(|v| keys(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }
    let schema: serde_json::Value =
        serde_json::from_str(&portcullis("config-schema")).expect("config-schema prints JSON");
    let mut all = BTreeSet::new();
    keys(&schema, &mut all);
    assert!(all.len() > 80, "only {} keys in the schema", all.len());
    let reference = fs::read_to_string(Path::new(ROOT).join(REFERENCE)).expect(REFERENCE);
    let missing: Vec<&String> = all
        .iter()
        .filter(|k| !reference.contains(&format!("| `{k}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "keys without a row in {REFERENCE}: {missing:?}"
    );
}

/// The checker reads Markdown as GitHub renders it: a repeated heading's
/// anchor gets `-1`, code spans and fences hold no links, explicit anchors count.
#[test]
fn the_checker_sees_anchors_and_links_as_github_does() {
    let text = "# Fail-closed rules\n\n## `[auth.jwt]`: OAuth bearer tokens\n\n\
                # Fail-closed rules\n\n<a id=\"audiences\"></a>**Audiences**\n\n\
                ```toml\n# not a heading\n[a](#not-a-link)\n```\n\n\
                See [here](#fail-closed-rules-1), `[code](#nope)` and ![x](img/x.png).\n";
    let offered = anchors(text);
    for anchor in [
        "fail-closed-rules",
        "fail-closed-rules-1",
        "authjwt-oauth-bearer-tokens",
        "audiences",
    ] {
        assert!(offered.contains(anchor), "{anchor}: {offered:?}");
    }
    assert!(!offered.contains("not-a-heading"), "{offered:?}");
    assert_eq!(links(text), vec!["#fail-closed-rules-1", "img/x.png"]);
}
