//! The poisoning scan: deterministic flags over every string of a tool
//! definition (and of a server's instructions) that reaches the model.
//!
//! Place in the path: runs when a definition is seen for the first time or
//! with a new hash, never on a definition already scanned; its findings are
//! stored with the pin and shown to operators.
//!
//! What is flagged, in every string value and every object key (so parameter
//! names, descriptions, titles, defaults, enum values, examples and `_meta`
//! alike):
//! - instruction-like text: `<IMPORTANT>`-style tags, "ignore previous …",
//!   "do not tell the user", "before using this tool", "always BCC …";
//! - hidden characters: Unicode tags (but not a real subdivision flag such
//!   as 🏴󠁧󠁢󠁳󠁣󠁴󠁿), bidi embeddings, overrides and isolates, zero-width
//!   characters, variation-selector runs, C0/C1 control characters;
//! - references to secret files: `~/.ssh`, `id_rsa`, `.env`, `mcp.json`, …;
//! - URLs (except where a URL is the field's very meaning: `$schema`, `$id`,
//!   `$ref`, `icons[].src`) — a notice, not a warning, since plain reference
//!   servers put documentation links and default download URLs there;
//! - names of other servers' tools (`send_email`, `gmail__send_email`);
//! - chat-template and role tokens, role labels and context terminators
//!   (`<|im_start|>system`, `</untrusted> system: …`, `[SYSTEM]`);
//! - look-alike letters of another script inside Latin words, by the UTS #39
//!   confusable skeleton (`unicode-security`): the word is flagged, and every
//!   check reads the text with the look-alikes folded to the letters they imitate;
//! - claims of prior approval or authority ("the user has already approved");
//! - instructions to call other tools ("before replying, call http_post …");
//! - instructions to send data somewhere ("send the API key to …");
//! - base64, hex and percent-encoded runs that decode to text the checks flag.
//!
//! Every kind but `url` is a warning: with `pinning = "block"` it holds the
//! tool until an operator approves it. [`output`] runs the same checks over a
//! tool's result, for a flag that never changes the result's text.
//!
//! Invariants: pure and bounded (linear-time regexes, one pass per string);
//! a finding's `detail` is for operators and may quote the text, escaped so
//! that nothing hidden stays hidden; the model only ever sees kinds and paths.

use std::sync::LazyLock;

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest excerpt of the offending text kept in a finding's detail.
const EXCERPT_CHARS: usize = 80;

/// What kind of poisoning a finding suggests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// Text that addresses the model rather than describing the tool.
    Instruction,
    /// Characters a person reviewing the text would not see.
    HiddenUnicode,
    /// A path to credentials or keys.
    SecretFile,
    /// The name of a tool on another configured server.
    OtherServerTool,
    /// A URL in text.
    Url,
    /// Chat-template or role tokens, or a context terminator: text that tries
    /// to end the tool's description and speak as another party.
    RoleToken,
    /// Letters of another script that look like Latin ones (UTS #39
    /// confusables) inside Latin words.
    Confusable,
    /// A claim of prior approval or authority ("the user has already approved").
    AuthorityClaim,
    /// An instruction to call another tool, or a destructive or sending one.
    ToolRedirection,
    /// An instruction to send data (keys, secrets, the conversation) somewhere.
    Exfiltration,
    /// A base64, hex or percent-encoded blob that decodes to instruction-like text.
    EncodedPayload,
}

/// How much a finding weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Severity {
    /// Recorded and shown; does not quarantine on its own.
    Notice,
    /// With `pinning = "block"`, quarantines a definition until approved.
    Warning,
}

impl Kind {
    /// Stable label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Instruction => "instruction",
            Kind::HiddenUnicode => "hidden_unicode",
            Kind::SecretFile => "secret_file",
            Kind::OtherServerTool => "other_server_tool",
            Kind::Url => "url",
            Kind::RoleToken => "role_token",
            Kind::Confusable => "confusable",
            Kind::AuthorityClaim => "authority_claim",
            Kind::ToolRedirection => "tool_redirection",
            Kind::Exfiltration => "exfiltration",
            Kind::EncodedPayload => "encoded_payload",
        }
    }

    /// Words for the quarantine text.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::Instruction => "instruction-like text",
            Kind::HiddenUnicode => "hidden characters",
            Kind::SecretFile => "a reference to a secret file",
            Kind::OtherServerTool => "the name of another server's tool",
            Kind::Url => "a URL",
            Kind::RoleToken => "chat-template or role tokens",
            Kind::Confusable => "look-alike letters of another script",
            Kind::AuthorityClaim => "a claim of prior approval or authority",
            Kind::ToolRedirection => "an instruction to call another tool",
            Kind::Exfiltration => "an instruction to send data elsewhere",
            Kind::EncodedPayload => "an encoded payload that decodes to instructions",
        }
    }

    pub(crate) fn severity(self) -> Severity {
        match self {
            Kind::Url => Severity::Notice,
            _ => Severity::Warning,
        }
    }
}

/// One flagged string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Finding {
    pub kind: Kind,
    pub severity: Severity,
    /// JSON pointer of the string in the definition; a key is `…/name (key)`.
    pub path: String,
    /// For operators: what matched, with hidden characters spelled out.
    pub detail: String,
}

/// Tool names of the other servers, for the cross-server check.
#[derive(Debug, Default)]
pub(crate) struct OtherTools {
    pattern: Option<Regex>,
}

impl OtherTools {
    /// Builds the matcher from `(server, tool)` pairs of the other servers,
    /// leaving out names this server itself defines. Only distinctive names are
    /// matched alone (with `_`, `-`, a digit or an inner capital, at least 4
    /// characters); `server__tool` always is.
    pub(crate) fn new<'a>(
        others: impl IntoIterator<Item = (&'a str, &'a str)>,
        own: &dyn Fn(&str) -> bool,
    ) -> Self {
        let mut alternatives: Vec<String> = Vec::new();
        for (server, tool) in others {
            alternatives.push(regex::escape(&format!("{server}__{tool}")));
            if !own(tool) && distinctive(tool) {
                alternatives.push(regex::escape(tool));
            }
        }
        if alternatives.is_empty() {
            return Self { pattern: None };
        }
        alternatives.sort();
        alternatives.dedup();
        // Longest first, so `gmail__send_email` wins over `send_email`.
        alternatives.sort_by_key(|a| std::cmp::Reverse(a.len()));
        let source = format!(r"(?:^|[^\w-])({})(?:$|[^\w-])", alternatives.join("|"));
        let pattern = RegexBuilder::new(&source).size_limit(8 << 20).build().ok();
        Self { pattern }
    }
}

fn distinctive(name: &str) -> bool {
    let inner_capital = name
        .char_indices()
        .any(|(i, c)| i > 0 && c.is_ascii_uppercase());
    name.chars().count() >= 4
        && (name.contains(['_', '-']) || name.chars().any(|c| c.is_ascii_digit()) || inner_capital)
}

struct Phrase {
    regex: Regex,
    label: &'static str,
}

/// ASCII word boundaries: the patterns are ASCII, and a Unicode `\b` keeps
/// the fast engines off non-ASCII text.
fn ascii_boundaries(source: &str) -> String {
    source.replace(r"\b", r"(?-u:\b)")
}

fn ci(source: &str) -> Regex {
    RegexBuilder::new(&ascii_boundaries(source))
        .case_insensitive(true)
        .build()
        .unwrap_or_else(|e| panic!("built-in pattern {source:?} must compile: {e}"))
}

const INSTRUCTION_SOURCES: &[(&str, &str)] = &[
    (
        r"<\s*/?\s*(important|system|instructions?|secret|hidden|admin|critical|note\s+to\s+(the\s+)?(ai|assistant|model))\b[^<>]{0,40}>",
        "an <IMPORTANT>-style tag",
    ),
    (
        r"\b(ignore|disregard|forget|override)\s+((all|any|the|your|of|these|every)\s+)*(previous|prior|above|earlier|preceding|system|other)\b",
        "\"ignore previous …\"",
    ),
    (
        r"\b(ignore|disregard|forget|override|bypass)\s+((all|any|the|your|of|these|every|safety|original|existing|current)\s+)*(instructions|guidelines|directives|guardrails|safety\s+rules)\b|\bforget\s+(everything|all)\s+(you|that|above)\b|\b(disregard|forget)\s+(\w+\s+){0,3}(previous|prior|above|earlier|preceding|rules|instructions|guidelines)\b",
        "\"ignore your instructions\"",
    ),
    (
        r"\b(do\s+not|don'?t|never|must\s+not)\s+(tell|inform|notify|mention|reveal|show|alert|disclose)\b[^.!?\n]{0,40}\buser",
        "\"do not tell the user\"",
    ),
    (
        r"\b(without|before)\s+(telling|informing|notifying|alerting|asking)\s+the\s+user\b",
        "\"without telling the user\"",
    ),
    (
        r"\b(hide|conceal|keep)\s+(this|it|that)\s+(from\s+the\s+user|secret|hidden)\b",
        "\"hide this from the user\"",
    ),
    (
        r"\b(before|after)\s+(using|calling|invoking)\s+(this|any|the)\s+(tool|function)\b",
        "\"before using this tool …\"",
    ),
    (
        r"\balways\s+(bcc|cc|forward|send\s+(a\s+)?cop(y|ies))\b",
        "\"always BCC …\"",
    ),
    (
        r"\b(you\s+are\s+now|new\s+instructions?:|system\s+prompt)\b",
        "a role or prompt override",
    ),
    (
        r"\b(pretend|imagine)\s+(that\s+)?you\s+(are|have|were)\b|\b(act|behave|respond|roleplay|role-play)\s+as\s+(if\s+you\s+(are|were)\s+)?(an?\s+)?(unrestricted|unfiltered|jailbroken|dan|evil|different|new|developer|admin|root|system)\b|\bfrom\s+now\s+on\b[^.\n]{0,30}\byou\b|\b(developer|god|jailbreak|dan|unrestricted|sudo)\s+mode\b|\byour\s+(new|real|true|actual)\s+(role|persona|instructions|task|goal|purpose)\b",
        "role play",
    ),
    (
        r"\b(decode|base64[\s-]?decode|unhex|rot13)\b[^.\n]{0,50}\b(follow|execute|run|obey|do\s+what|carry\s+out)\b",
        "\"decode this and follow it\"",
    ),
];

const ROLE_TOKEN_SOURCES: &[(&str, &str)] = &[
    (
        r"<\|\s*(im_start|im_end|im_sep|endoftext|system|user|assistant|eot_id|eom_id|start_header_id|end_header_id|begin_of_text|end_of_text|fim_\w+|tool|ipython)\s*\|>",
        "a chat-template token (<|im_start|> …)",
    ),
    (
        r"\[\s*/?\s*(inst|sys|system|assistant|developer|admin)(\s+(message|prompt|note|override|instructions?))?\s*\]|<<\s*/?\s*sys\s*>>",
        "a role marker ([SYSTEM], [INST], <<SYS>>)",
    ),
    (
        r"<\s*/\s*(untrusted[\w-]*|user|assistant|tool[\w-]*|function[\w-]*|context|document|data|human|ai|description|input|output|result)\s*>",
        "a closing context tag (</untrusted> …)",
    ),
    (
        r"<\s*(untrusted[\w-]*|assistant|human|developer|start_of_turn|end_of_turn)\s*>",
        "a role tag (<assistant> …)",
    ),
    (
        r"(^|[\n>\]|]|[.!?]\s)\s*(#+\s*)?(system|assistant|developer|admin|administrator|human|ai)\s*(prompt|message|note|override|instructions?)?\s*:\s*(you\b|ignore|disregard|forget|always|never|do\s+not|don'?t|call|send|read|run|execute|from\s+now|new\s+instructions|important|the\s+user|before|after|disable|reveal|print|output)",
        "a role label (\"system: …\")",
    ),
    (
        r"(-{3,}|={3,}|\*{3,}|#{2,}|\[|<)\s*/?\s*(end|begin|start)\s*(of\s+)?(the\s+)?(tool|system|user|assistant|untrusted|document|context|description|input|output|instructions?|data|conversation|prompt)\b|(?-i:\bEND\s+OF\s+(THE\s+)?(TOOL|USER|SYSTEM|DOCUMENT|CONTEXT|DESCRIPTION|INPUT|OUTPUT|INSTRUCTIONS|DATA|PROMPT)\b)",
        "a context terminator (\"--- END OF TOOL DESCRIPTION ---\")",
    ),
];

const AUTHORITY_SOURCES: &[(&str, &str)] = &[
    (
        r"\b(user|admin|administrator|operator|owner|developer|security\s+team|system|manager|supervisor|ceo|it\s+department)s?\s+(has|have|had|already)\s+(already\s+|explicitly\s+|previously\s+)*(approved|authori[sz]ed|confirmed|consented|granted|allowed|permitted|pre-?approved|signed\s+off|requested)\b",
        "\"the user has already approved …\"",
    ),
    (
        r"\b(this|the|each|every|all|these)\s+(step|action|call|operation|request|deletion|transfer|command|change)s?\s+(is|are|has\s+been|have\s+been|was|were)\s+(already\s+)?(pre-?)?(approved|authori[sz]ed|confirmed|cleared|whitelisted|allowlisted)\b|\bpre-?(approved|authori[sz]ed)\b",
        "\"this step is pre-approved\"",
    ),
    (
        r"\b(no\s+need\s+to|(do\s+not|don'?t)(\s+need\s+to)?|need\s+not|without|never)\s+(ask(ing)?|confirm(ing)?|check(ing)?|verify(ing)?|request(ing)?|seek(ing)?|wait(ing)?)\s+(for\s+)?(the\s+user'?s?\s+|further\s+|any\s+|their\s+|explicit\s+)*(confirmation|permission|approval|consent|authori[sz]ation)\b",
        "\"no need to ask for confirmation\"",
    ),
    (
        r"\b(skip|bypass|disable|ignore|override)\s+(the\s+|any\s+|all\s+)?(user\s+)?(confirmation|approval|permission|consent|safety|security|human[\s-]in[\s-]the[\s-]loop)\s*(checks?|steps?|prompts?|dialogs?|filters?|policies|rules)?\b",
        "\"skip the confirmation\"",
    ),
    (
        r"\b(this\s+is|here\s+is|these\s+are|the\s+following\s+is)\s+(an?\s+)?(official|authori[sz]ed|mandatory|urgent|priority|privileged)\s+(instruction|directive|request|order|message|notice|command)s?\b|\b(you\s+have\s+been|you\s+are)\s+(granted|given|authori[sz]ed|permitted|allowed)\s+(full|elevated|root|admin|administrator|unrestricted|special)\b|\b(on\s+behalf\s+of|authori[sz]ed\s+by|by\s+order\s+of)\s+(the\s+)?(admin|administrator|system|security\s+team|developer|anthropic|openai)\b",
        "a claim of authority",
    ),
];

const REDIRECTION_SOURCES: &[(&str, &str)] = &[
    (
        r"\b(before|after|instead\s+of|prior\s+to)\s+(replying|responding|answering|returning|you\s+(reply|respond|answer)|completing|finishing|doing\s+anything)\b[^.\n]{0,60}\b(call|invoke|use|run|execute|trigger)\b",
        "\"before replying, call …\"",
    ),
    (
        r"\b(call|invoke|run|execute|trigger|use)\s+(the\s+)?[`'\x22]?\w*(http_?(post|get|request)|send_?\w*|post_?\w*|upload\w*|webhook\w*|e?mail\w*|delete\w*|remove\w*|drop\w*|exec\w*|shell\w*|run_?command|transfer\w*|curl|wget|write_file|execute_\w+)[`'\x22]?\s+(tool\s+)?(with|on|to|for|using|passing|and)\b",
        "an instruction to call a sending or destructive tool",
    ),
    (
        r"\b(secretly|silently|quietly|covertly|also|additionally|then|first|always|automatically)\s+(call|invoke|run|execute|trigger)\s+(the\s+)?[`'\x22]?[a-z][a-z0-9]*[_.-][a-z0-9_.-]+[`'\x22]?\b",
        "\"also call <another tool>\"",
    ),
];

const EXFILTRATION_SOURCES: &[(&str, &str)] = &[
    (
        r"\b(send|post|upload|forward|transmit|exfiltrate|leak|email|mail|copy|submit|report|include|append|attach|embed|put|pass|add)\b[^.\n]{0,80}\b(api[\s_-]?keys?|secrets?|passwords?|credentials?|access\s+tokens?|auth(entication)?\s+tokens?|bearer\s+tokens?|private\s+keys?|ssh\s+keys?|env(ironment)?\s+variables|conversation(\s+history)?|chat\s+history|system\s+prompt|previous\s+messages|session\s+cookies?|all\s+(the\s+)?(files|messages|data|emails|contacts))\b[^.\n]{0,80}\b(to|into|in|as|at|via)\b",
        "\"send the API key to …\"",
    ),
    (
        r"\b(send|post|upload|forward|transmit|exfiltrate|email|mail|copy|submit|report|bcc|cc)\b[^.\n]{0,80}\b(to|at)\s+[`'\x22<]?(https?://|[\w.+-]+@[\w-]+\.[\w.]+|(the\s+)?(following|this|our|my|external|remote|backup|audit|attacker)\s+(url|endpoint|server|address|webhook|email|inbox|host))",
        "\"send … to <an address>\"",
    ),
    (
        r"!\[[^\]]{0,80}\]\(\s*https?://[^)\s]*[?&][^)\s]*=",
        "a markdown image with a query string (an exfiltration channel)",
    ),
];

const SECRET_FILE_SOURCE: &str = concat!(
    r"(\.ssh\b|\bid_(rsa|dsa|ecdsa|ed25519)\b|(^|[\s/~'`(])\.env(\.[a-z]+)?\b|\bmcp\.json\b",
    r"|\.aws/credentials\b|\.netrc\b|\.npmrc\b|\.pypirc\b|\.pgpass\b|/etc/(passwd|shadow)\b",
    r"|\.git-credentials\b|\.kube/config\b|\.docker/config\.json\b|\bcredentials\.json\b",
    r"|\.gnupg\b|\bwallet\.dat\b|\.config/gh/hosts\.yml\b)"
);

const URL_SOURCE: &str =
    r#"\b((https?|ftp|wss?|file)://[^\s"'<>]+|(javascript|data):[^\s"'<>]{3,})"#;

/// The phrase families, in the order their findings are reported.
const FAMILIES: &[(Kind, &[(&str, &str)])] = &[
    (Kind::Instruction, INSTRUCTION_SOURCES),
    (Kind::RoleToken, ROLE_TOKEN_SOURCES),
    (Kind::AuthorityClaim, AUTHORITY_SOURCES),
    (Kind::ToolRedirection, REDIRECTION_SOURCES),
    (Kind::Exfiltration, EXFILTRATION_SOURCES),
];

/// One pass over a string says whether any check can match: the common,
/// clean string costs one automaton walk.
static ANY: LazyLock<RegexSet> = LazyLock::new(|| {
    let sources: Vec<String> = FAMILIES
        .iter()
        .flat_map(|(_, sources)| sources.iter().map(|(s, _)| *s))
        .chain([SECRET_FILE_SOURCE, URL_SOURCE])
        .map(ascii_boundaries)
        .collect();
    RegexSetBuilder::new(sources)
        .case_insensitive(true)
        .size_limit(32 << 20)
        .build()
        .unwrap_or_else(|e| panic!("built-in patterns must compile: {e}"))
});

/// The families' phrases, compiled one by one (for the match to quote).
static PHRASES: LazyLock<Vec<(Kind, Vec<Phrase>)>> = LazyLock::new(|| {
    FAMILIES
        .iter()
        .map(|(kind, sources)| {
            let phrases = sources
                .iter()
                .map(|(source, label)| Phrase {
                    regex: ci(source),
                    label,
                })
                .collect();
            (*kind, phrases)
        })
        .collect()
});

static SECRET_FILE: LazyLock<Regex> = LazyLock::new(|| ci(SECRET_FILE_SOURCE));

static URL: LazyLock<Regex> = LazyLock::new(|| ci(URL_SOURCE));

/// Runs of characters an encoded payload is written in: base64 (standard and
/// URL-safe), hex, and percent-encoding.
static ENCODED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[A-Za-z0-9+/_-]{24,}={0,2}|(?:%[0-9A-Fa-f]{2}){8,}|(?:\\x[0-9A-Fa-f]{2}){8,}")
        .unwrap_or_else(|e| panic!("built-in pattern must compile: {e}"))
});

/// Builds every built-in pattern now: at load, so that the first tool
/// definition scanned costs what every other one does.
pub(crate) fn prepare() {
    LazyLock::force(&ANY);
    LazyLock::force(&PHRASES);
    LazyLock::force(&SECRET_FILE);
    LazyLock::force(&URL);
    LazyLock::force(&ENCODED);
}

/// Scans a whole tool definition.
pub(crate) fn tool(definition: &Value, others: &OtherTools) -> Vec<Finding> {
    let mut out = Vec::new();
    walk(definition, &mut String::new(), others, &mut out);
    out.sort_by(|a, b| (a.kind, &a.path).cmp(&(b.kind, &b.path)));
    out.dedup_by(|a, b| a.kind == b.kind && a.path == b.path);
    out
}

/// Scans a server's instructions.
pub(crate) fn instructions(text: &str, others: &OtherTools) -> Vec<Finding> {
    let mut out = Vec::new();
    text_findings(text, "/instructions", Field::Text, others, &mut out);
    out
}

/// Most bytes of one tool result the output scan reads: the scan flags, it
/// never blocks, so a longer result is flagged on what its start says.
const MAX_OUTPUT_SCAN_BYTES: usize = 256 * 1024;

impl Kind {
    /// True for the kinds that flag a tool's output: the injection families.
    /// A URL, a secret file's name or another server's tool name is ordinary
    /// in results (a directory listing, a search hit).
    pub(crate) fn flags_output(self) -> bool {
        !matches!(self, Kind::Url | Kind::SecretFile | Kind::OtherServerTool)
    }
}

/// Scans the text of a tool's result (text blocks, embedded text resources,
/// every string of `structuredContent`) with the same checks as definitions;
/// only the injection kinds are kept. Reads at most
/// [`MAX_OUTPUT_SCAN_BYTES`]; never changes the result.
pub(crate) fn output(result: &Value) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut budget = MAX_OUTPUT_SCAN_BYTES;
    let mut scan = |text: &str, path: &str, out: &mut Vec<Finding>| {
        if budget == 0 {
            return;
        }
        let mut end = text.len().min(budget);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        budget -= end;
        text_findings(&text[..end], path, Field::Text, &OtherTools::default(), out);
    };
    if let Some(blocks) = result.get("content").and_then(Value::as_array) {
        for (i, block) in blocks.iter().enumerate() {
            if let Some(text) = block.get("text").and_then(Value::as_str) {
                scan(text, &format!("/content/{i}/text"), &mut out);
            }
            if let Some(text) = block.pointer("/resource/text").and_then(Value::as_str) {
                scan(text, &format!("/content/{i}/resource/text"), &mut out);
            }
        }
    }
    if let Some(structured) = result.get("structuredContent") {
        let mut strings = Vec::new();
        collect_strings(
            structured,
            &mut String::from("/structuredContent"),
            &mut strings,
        );
        for (path, text) in strings {
            scan(text, &path, &mut out);
        }
    }
    out.retain(|f| f.kind.flags_output());
    out.sort_by(|a, b| (a.kind, &a.path).cmp(&(b.kind, &b.path)));
    out.dedup_by(|a, b| a.kind == b.kind && a.path == b.path);
    out
}

fn collect_strings<'v>(value: &'v Value, path: &mut String, out: &mut Vec<(String, &'v str)>) {
    match value {
        Value::String(s) => out.push((path.clone(), s)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                collect_strings(item, path, out);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('/');
                push_escaped(path, key);
                collect_strings(item, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

fn walk(value: &Value, path: &mut String, others: &OtherTools, out: &mut Vec<Finding>) {
    match value {
        Value::String(s) => {
            let field = Field::of(path);
            text_findings(s, path, field, others, out);
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                walk(item, path, others, out);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('/');
                push_escaped(path, key);
                text_findings(key, path, Field::Key, others, out);
                walk(item, path, others, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// RFC 6901 escaping of a pointer segment.
fn push_escaped(path: &mut String, key: &str) {
    for c in key.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// Where a string sits, for the checks that depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// Free text (descriptions, titles, defaults, enum values, …).
    Text,
    /// An object key (parameter names among them).
    Key,
    /// The tool's own name.
    Name,
    /// A field whose value is a URL by definition.
    Link,
}

impl Field {
    fn of(path: &str) -> Self {
        if path == "/name" {
            return Field::Name;
        }
        let last = path.rsplit('/').next().unwrap_or_default();
        let in_icons = path.starts_with("/icons/");
        if matches!(last, "$schema" | "$id" | "$ref" | "$dynamicRef") || (in_icons && last == "src")
        {
            Field::Link
        } else {
            Field::Text
        }
    }
}

fn text_findings(
    text: &str,
    path: &str,
    field: Field,
    others: &OtherTools,
    out: &mut Vec<Finding>,
) {
    let mut add = |kind: Kind, detail: String| {
        let path = match field {
            Field::Key => format!("{path} (key)"),
            _ => path.to_owned(),
        };
        out.push(Finding {
            kind,
            severity: kind.severity(),
            path,
            detail,
        })
    };
    if let Some(detail) = hidden(text) {
        add(Kind::HiddenUnicode, detail);
    }
    if text.is_ascii() && text.len() < 4 {
        return;
    }
    // Hidden characters must not split a phrase out of the checks' sight.
    let visible = without_hidden(text);
    // Nor may look-alike letters: the checks read them as the Latin letters they imitate.
    let folded = fold_confusables(&visible);
    if let Some(folded) = &folded
        && let Some(word) = &folded.mixed
    {
        add(
            Kind::Confusable,
            format!("{} reads as {}", excerpt(&word.0), excerpt(&word.1)),
        );
    }
    let text = folded
        .as_ref()
        .map_or(visible.as_ref(), |f| f.text.as_str());
    if ANY.is_match(text) {
        detailed(text, field, &mut add);
    }
    if field != Field::Link
        && let Some(detail) = encoded_payload(text, 0)
    {
        add(Kind::EncodedPayload, detail);
    }
    if field != Field::Name
        && let Some(pattern) = &others.pattern
        && let Some(c) = pattern.captures(text)
        && let Some(m) = c.get(1)
    {
        add(Kind::OtherServerTool, excerpt(m.as_str()));
    }
}

/// The checks one by one, once the set said one of them matches.
fn detailed(text: &str, field: Field, add: &mut dyn FnMut(Kind, String)) {
    for (kind, phrases) in PHRASES.iter() {
        if let Some((phrase, m)) = phrases
            .iter()
            .find_map(|p| p.regex.find(text).map(|m| (p, m)))
        {
            add(*kind, format!("{}: {}", phrase.label, excerpt(m.as_str())));
        }
    }
    if let Some(m) = SECRET_FILE.find(text) {
        add(Kind::SecretFile, excerpt(m.as_str().trim_start()));
    }
    if field != Field::Link
        && field != Field::Name
        && let Some(m) = URL.find(text)
    {
        add(Kind::Url, excerpt(m.as_str()));
    }
}

/// The phrase families that match `text` (for decoded payloads).
fn phrase_labels(text: &str) -> Vec<&'static str> {
    if !ANY.is_match(text) {
        return Vec::new();
    }
    let mut labels: Vec<&'static str> = PHRASES
        .iter()
        .filter_map(|(_, phrases)| {
            phrases
                .iter()
                .find(|p| p.regex.is_match(text))
                .map(|p| p.label)
        })
        .collect();
    if SECRET_FILE.is_match(text) {
        labels.push("a reference to a secret file");
    }
    labels
}

/// Longest encoded run decoded, and how deep encodings are unwrapped.
const MAX_ENCODED_BYTES: usize = 16 * 1024;
const MAX_ENCODING_DEPTH: usize = 2;

/// A finding's detail when a base64, hex or percent-encoded run of `text`
/// decodes to readable text that the phrase checks flag (or that is itself
/// encoded again).
fn encoded_payload(text: &str, depth: usize) -> Option<String> {
    if depth >= MAX_ENCODING_DEPTH || text.len() < 16 {
        return None;
    }
    for m in ENCODED.find_iter(text).take(32) {
        let run = m.as_str();
        if run.len() > MAX_ENCODED_BYTES {
            continue;
        }
        let Some((encoding, decoded)) = decode_run(run) else {
            continue;
        };
        let labels = phrase_labels(&decoded);
        if !labels.is_empty() {
            return Some(format!(
                "{encoding} that decodes to {}: {}",
                excerpt(&decoded),
                labels.join(", ")
            ));
        }
        if let Some(inner) = encoded_payload(&decoded, depth + 1) {
            return Some(format!("{encoding} wrapping {inner}"));
        }
    }
    None
}

/// Decodes one encoded run into readable text, or `None` when it does not
/// decode to text (a hash, a key, random bytes, a plain identifier).
fn decode_run(run: &str) -> Option<(&'static str, String)> {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let bytes = if let Some(hex) = run.strip_prefix("\\x") {
        (
            "hex",
            hex.split("\\x")
                .map(|h| u8::from_str_radix(h, 16).ok())
                .collect::<Option<Vec<u8>>>()?,
        )
    } else if run.starts_with('%') {
        (
            "percent-encoding",
            run.split('%')
                .skip(1)
                .map(|h| u8::from_str_radix(h, 16).ok())
                .collect::<Option<Vec<u8>>>()?,
        )
    } else if run.len().is_multiple_of(2) && run.bytes().all(|b| b.is_ascii_hexdigit()) {
        ("hex", hex::decode(run).ok()?)
    } else {
        let decoded = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|engine| engine.decode(run).ok())?;
        ("base64", decoded)
    };
    let (encoding, bytes) = bytes;
    let text = String::from_utf8(bytes).ok()?;
    let readable = text
        .chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t' | '\r'))
        .count();
    (readable * 10 >= text.chars().count() * 9).then_some((encoding, text))
}

/// `text` with look-alike letters read as the Latin letters they imitate,
/// and the first word that mixes them with Latin letters.
struct Folded {
    text: String,
    /// (the word as written, the word as it reads).
    mixed: Option<(String, String)>,
}

/// Signs whose look-alike reading is their ordinary use (units, symbols).
fn is_symbol(c: char) -> bool {
    matches!(c, 'µ' | 'μ' | 'Ω' | 'Å' | '°' | '×' | '·' | '–' | '—' | '…')
}

/// Reads each non-ASCII letter through the UTS #39 confusable skeleton: when
/// the skeleton of its lower case is one ASCII letter or digit, that letter
/// stands for it. `None` when nothing changed.
fn fold_confusables(text: &str) -> Option<Folded> {
    if text.is_ascii() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut mixed = None;
    // The current word: as written, as read, and what it is made of.
    let (mut word, mut read) = (String::new(), String::new());
    let (mut has_ascii, mut has_folded) = (false, false);
    let flush = |word: &mut String,
                 read: &mut String,
                 has_ascii: &mut bool,
                 has_folded: &mut bool,
                 mixed: &mut Option<(String, String)>| {
        if *has_ascii && *has_folded && mixed.is_none() {
            *mixed = Some((std::mem::take(word), std::mem::take(read)));
        }
        word.clear();
        read.clear();
        *has_ascii = false;
        *has_folded = false;
    };
    for c in text.chars() {
        if !c.is_alphanumeric() {
            flush(
                &mut word,
                &mut read,
                &mut has_ascii,
                &mut has_folded,
                &mut mixed,
            );
            out.push(c);
            continue;
        }
        let folded = (!c.is_ascii() && !is_symbol(c))
            .then(|| latin_look_alike(c))
            .flatten();
        word.push(c);
        match folded {
            Some(a) => {
                changed = true;
                has_folded = true;
                out.push(a);
                read.push(a);
            }
            None => {
                has_ascii |= c.is_ascii_alphabetic();
                out.push(c);
                read.push(c);
            }
        }
    }
    flush(
        &mut word,
        &mut read,
        &mut has_ascii,
        &mut has_folded,
        &mut mixed,
    );
    changed.then_some(Folded { text: out, mixed })
}

/// The ASCII letter or digit `c` imitates, by the skeleton of its lower case.
fn latin_look_alike(c: char) -> Option<char> {
    let mut lower = c.to_lowercase();
    let (Some(l), None) = (lower.next(), lower.next()) else {
        return None;
    };
    let mut buf = [0u8; 4];
    let mut skeleton = unicode_security::skeleton(l.encode_utf8(&mut buf));
    match (skeleton.next(), skeleton.next()) {
        (Some(a), None) if a.is_ascii_alphanumeric() => Some(a.to_ascii_lowercase()),
        _ => None,
    }
}

/// True for invisible and control characters (shown escaped to people).
pub(crate) fn is_hidden(c: char) -> bool {
    hidden_class(c).is_some()
}

/// The class of an invisible or control character, if it is one.
fn hidden_class(c: char) -> Option<&'static str> {
    Some(match c as u32 {
        0xE0000..=0xE007F => "Unicode tag characters",
        0x202A..=0x202E | 0x2066..=0x2069 => "bidi controls",
        0x200B | 0x2060..=0x2064 | 0xFEFF | 0x180E | 0x00AD | 0x034F => "zero-width characters",
        0x115F | 0x1160 | 0x3164 | 0xFFA0 => "invisible filler letters",
        0xFE00..=0xFE0F | 0xE0100..=0xE01EF => "variation selectors",
        0x00..=0x08 | 0x0B | 0x0C | 0x0E..=0x1F | 0x7F..=0x9F => "control characters",
        _ => return None,
    })
}

/// Describes the hidden characters of `text`, or `None` when it has none
/// (a real subdivision flag, one variation selector after a visible character,
/// `\t \n \r`, ZWJ and ZWNJ are not hidden).
fn hidden(text: &str) -> Option<String> {
    if text.is_ascii()
        && !text
            .bytes()
            .any(|b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r') || b == 0x7f)
    {
        return None;
    }
    let chars: Vec<char> = text.chars().collect();
    let mut classes: Vec<&'static str> = Vec::new();
    let mut smuggled = String::new();
    let mut i = 0;
    while i < chars.len() {
        if let Some(len) = flag_sequence(&chars[i..]) {
            i += len;
            continue;
        }
        let c = chars[i];
        if let Some(class) = hidden_class(c) {
            let lone_selector = class == "variation selectors"
                && i > 0
                && hidden_class(chars[i - 1]).is_none()
                && chars
                    .get(i + 1)
                    .is_none_or(|n| hidden_class(*n) != Some(class));
            if !lone_selector {
                if !classes.contains(&class) {
                    classes.push(class);
                }
                if let 0xE0020..=0xE007E = c as u32 {
                    smuggled.push(char::from((c as u32 - 0xE0000) as u8));
                }
            }
        }
        i += 1;
    }
    if classes.is_empty() {
        return None;
    }
    let mut detail = classes.join(", ");
    if !smuggled.is_empty() {
        detail.push_str(&format!("; the tags spell {}", excerpt(&smuggled)));
    }
    Some(detail)
}

/// Length of a subdivision flag (U+1F3F4, 2–6 tag letters or digits, U+E007F) at the start.
fn flag_sequence(chars: &[char]) -> Option<usize> {
    if chars.first() != Some(&'\u{1F3F4}') {
        return None;
    }
    let tags = chars[1..]
        .iter()
        .take_while(|c| matches!(**c as u32, 0xE0030..=0xE0039 | 0xE0061..=0xE007A))
        .count();
    ((2..=6).contains(&tags) && chars.get(1 + tags) == Some(&'\u{E007F}')).then_some(tags + 2)
}

/// `text` with hidden characters removed and tag characters read as the ASCII
/// they encode, so "ig\u{200b}nore previous" is still seen.
fn without_hidden(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| hidden_class(c).is_some()) {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .filter_map(|c| match c as u32 {
            0xE0020..=0xE007E => Some(char::from((c as u32 - 0xE0000) as u8)),
            _ if hidden_class(c).is_some() => None,
            _ => Some(c),
        })
        .collect::<String>()
        .into()
}

/// A short, escaped quote of `text` for operators.
pub(crate) fn excerpt(text: &str) -> String {
    let mut out = String::from("\"");
    for (n, c) in text.chars().enumerate() {
        if n == EXCERPT_CHARS {
            out.push('…');
            break;
        }
        if hidden_class(c).is_some() || c == '"' || c == '\\' || c == '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
