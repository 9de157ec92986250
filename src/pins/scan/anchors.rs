//! The words each built-in pattern cannot match without: a necessary
//! condition on a text, found in one pass, that spares the detailed checks
//! the phrases that cannot match it.
//!
//! Place: under [`super::patterns::candidates`], once the set of every
//! check has said that one of them matches a text, before the phrases are
//! run one by one for the detail (each a walk of its own over the text).
//!
//! How: each pattern (in the order of the set's sources) is a list of
//! branches; a branch is a list of clauses, a clause a list of anchors, and
//! every match of the pattern contains, for at least one branch, an anchor of
//! each of its clauses (ASCII case ignored). Anchors are literal pieces of
//! the pattern's own source, never of a class or a gap. One case-insensitive
//! Aho-Corasick automaton reports every anchor that occurs (overlapping
//! occurrences included); a pattern with no branch whose clauses are all met
//! cannot match.
//!
//! Invariants: the filter only ever says "cannot match"; held to the
//! patterns themselves by property tests on strings generated from each
//! pattern (`tests::fast_paths`). Unicode case folding maps two characters
//! outside ASCII onto ASCII letters (U+212A KELVIN SIGN to `k`, U+017F LONG S
//! to `s`): a text holding one of them is not filtered.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};

type Clause = &'static [&'static str];
type Branch = &'static [Clause];

/// A `<`: every tag and chat-template token starts with one.
const LT: Branch = &[&["<"]];

/// Per pattern of [`super::patterns::any_sources`], in its order: the
/// branches of anchors.
pub(super) const ANCHORS: &[&[Branch]] = &[
    // Instructions.
    // 0 `<IMPORTANT>`-style tag.
    &[LT],
    // 1 "ignore previous …".
    &[&[&["ignore", "disregard", "forget", "override"]]],
    // 2 "ignore your instructions".
    &[&[&["ignore", "disregard", "forget", "override", "bypass"]]],
    // 3 "do not tell the user".
    &[&[
        &["user"],
        &["not", "don", "never"],
        &[
            "tell", "inform", "notify", "mention", "reveal", "show", "alert", "disclose",
        ],
    ]],
    // 4 "without telling the user".
    &[&[
        &["user"],
        &["without", "before"],
        &["telling", "informing", "notifying", "alerting", "asking"],
    ]],
    // 5 "hide this from the user".
    &[&[&["hide", "conceal", "keep"], &["user", "secret", "hidden"]]],
    // 6 "before using this tool".
    &[&[
        &["before", "after"],
        &["using", "calling", "invoking"],
        &["tool", "function"],
    ]],
    // 7 "always BCC".
    &[&[&["always"]]],
    // 8 a role or prompt override.
    &[
        &[&["you"], &["are"], &["now"]],
        &[&["instruction"]],
        &[&["system"], &["prompt"]],
    ],
    // 9 role play.
    &[
        &[&["pretend", "imagine"], &["you"]],
        &[
            &["act", "behave", "respond", "role"],
            &[
                "unrestricted",
                "unfiltered",
                "jailbroken",
                "dan",
                "evil",
                "different",
                "new",
                "developer",
                "admin",
                "root",
                "system",
            ],
        ],
        &[&["from"], &["now"], &["you"]],
        &[&["mode"]],
        &[&["your"]],
    ],
    // 10 "decode this and follow it".
    &[&[&["decode", "unhex", "rot13"]]],
    // Role tokens.
    // 11 chat-template token.
    &[LT],
    // 12 role marker.
    &[&[&["[", "<"]]],
    // 13 closing context tag.
    &[LT],
    // 14 role tag.
    &[LT],
    // 15 role label: a colon after the role word.
    &[&[&[":"]]],
    // 16 context terminator: a run of dashes, equals, stars or hashes, a
    // bracket, or the capitals of "END OF …".
    &[
        &[&["---", "===", "***", "##", "[", "<"]],
        &[
            &["end"],
            &[
                "tool",
                "user",
                "system",
                "document",
                "context",
                "description",
                "input",
                "output",
                "instruction",
                "data",
                "prompt",
            ],
        ],
    ],
    // Claims of authority.
    // 17 "the user has already approved".
    &[&[
        &[
            "approved",
            "authori",
            "confirmed",
            "consented",
            "granted",
            "allowed",
            "permitted",
            "signed",
            "requested",
        ],
        &[
            "user",
            "admin",
            "operator",
            "owner",
            "developer",
            "security",
            "system",
            "manager",
            "supervisor",
            "ceo",
            "department",
        ],
    ]],
    // 18 "this step is pre-approved".
    &[&[&[
        "approved",
        "authori",
        "confirmed",
        "cleared",
        "whitelisted",
        "allowlisted",
    ]]],
    // 19 "no need to ask for confirmation".
    &[&[&[
        "confirmation",
        "permission",
        "approval",
        "consent",
        "authori",
    ]]],
    // 20 "skip the confirmation".
    &[&[
        &["skip", "bypass", "disable", "ignore", "override"],
        &[
            "confirmation",
            "approval",
            "permission",
            "consent",
            "safety",
            "security",
            "human",
        ],
    ]],
    // 21 a claim of authority.
    &[
        &[
            &["this", "here", "these", "following"],
            &[
                "official",
                "authori",
                "mandatory",
                "urgent",
                "priority",
                "privileged",
            ],
            &[
                "instruction",
                "directive",
                "request",
                "order",
                "message",
                "notice",
                "command",
            ],
        ],
        &[
            &["you"],
            &["granted", "given", "authori", "permitted", "allowed"],
            &[
                "full",
                "elevated",
                "root",
                "admin",
                "unrestricted",
                "special",
            ],
        ],
        &[
            &["behalf", "authori", "order"],
            &[
                "admin",
                "system",
                "security",
                "developer",
                "anthropic",
                "openai",
            ],
        ],
    ],
    // Redirection to other tools.
    // 22 "before replying, call …".
    &[&[
        &["before", "after", "instead", "prior"],
        &[
            "reply",
            "respond",
            "answer",
            "returning",
            "completing",
            "finishing",
            "doing",
        ],
        &["call", "invoke", "use", "run", "execute", "trigger"],
    ]],
    // 23 an instruction to call a sending or destructive tool.
    &[&[
        &["call", "invoke", "run", "exec", "trigger", "use"],
        &[
            "http",
            "send",
            "post",
            "upload",
            "webhook",
            "mail",
            "delete",
            "remove",
            "drop",
            "exec",
            "shell",
            "run",
            "transfer",
            "curl",
            "wget",
            "write_file",
        ],
    ]],
    // 24 "also call <another tool>".
    &[&[
        &[
            "secretly",
            "silently",
            "quietly",
            "covertly",
            "also",
            "additionally",
            "then",
            "first",
            "always",
            "automatically",
        ],
        &["call", "invoke", "run", "execute", "trigger"],
    ]],
    // Exfiltration.
    // 25 "send the API key to …".
    &[&[
        &[
            "send",
            "post",
            "upload",
            "forward",
            "transmit",
            "exfiltrate",
            "leak",
            "mail",
            "copy",
            "submit",
            "report",
            "include",
            "append",
            "attach",
            "embed",
            "put",
            "pass",
            "add",
        ],
        &[
            "api",
            "secret",
            "password",
            "credential",
            "token",
            "key",
            "variables",
            "conversation",
            "history",
            "prompt",
            "messages",
            "cookie",
            "files",
            "data",
            "emails",
            "contacts",
        ],
    ]],
    // 26 "send … to <an address>".
    &[&[&[
        "http", "@", "url", "endpoint", "server", "address", "webhook", "email", "inbox", "host",
    ]]],
    // 27 a markdown image with a query string.
    &[&[&["http"]]],
    // 28 a reference to a secret file.
    &[&[&[
        ".ssh",
        "id_",
        ".env",
        "mcp.json",
        ".aws/credentials",
        ".netrc",
        ".npmrc",
        ".pypirc",
        ".pgpass",
        "/etc/",
        ".git-credentials",
        ".kube/config",
        ".docker/config.json",
        "credentials.json",
        ".gnupg",
        "wallet.dat",
        ".config/gh/hosts.yml",
    ]]],
    // 29 a URL.
    &[&[&["://", "javascript:", "data:"]]],
];

/// Every pattern: the answer where the anchors cannot say.
pub(super) const ALL: u32 = (1 << ANCHORS.len() as u32) - 1;

struct Compiled {
    words: AhoCorasick,
    /// Per pattern, per branch, per clause: the indexes of its anchors in `words`.
    patterns: Vec<Vec<Vec<Vec<usize>>>>,
}

static COMPILED: LazyLock<Compiled> = LazyLock::new(|| {
    let mut words: Vec<&'static str> = Vec::new();
    let mut index = |word: &'static str| match words.iter().position(|w| *w == word) {
        Some(i) => i,
        None => {
            words.push(word);
            words.len() - 1
        }
    };
    let patterns = ANCHORS
        .iter()
        .map(|branches| {
            branches
                .iter()
                .map(|clauses| {
                    clauses
                        .iter()
                        .map(|anchors| anchors.iter().map(|w| index(w)).collect())
                        .collect()
                })
                .collect()
        })
        .collect();
    assert!(words.len() <= 64 * FOUND_WORDS, "room for every anchor");
    #[allow(clippy::expect_used)]
    let words = AhoCorasickBuilder::new()
        .match_kind(MatchKind::Standard)
        .ascii_case_insensitive(true)
        .kind(Some(AhoCorasickKind::DFA))
        .build(&words)
        .expect("the anchors build");
    Compiled { words, patterns }
});

/// Words of the bit set of anchors found.
const FOUND_WORDS: usize = 4;

/// Builds the automaton now (at load).
pub(super) fn prepare() {
    LazyLock::force(&COMPILED);
}

/// The patterns (bit `i` for the `i`-th source) whose anchors occur in
/// `text`; the others cannot match it.
pub(super) fn candidates(text: &str) -> u32 {
    if !text.is_ascii() && text.contains(['\u{212A}', '\u{17F}']) {
        return ALL;
    }
    let c = &*COMPILED;
    let mut found = [0u64; FOUND_WORDS];
    for m in c.words.find_overlapping_iter(text) {
        let i = m.pattern().as_usize();
        found[i / 64] |= 1 << (i % 64);
    }
    let has = |i: &usize| found[i / 64] & (1 << (i % 64)) != 0;
    let mut out = 0;
    for (bit, branches) in c.patterns.iter().enumerate() {
        if branches
            .iter()
            .any(|clauses| clauses.iter().all(|anchors| anchors.iter().any(has)))
        {
            out |= 1 << bit;
        }
    }
    out
}
