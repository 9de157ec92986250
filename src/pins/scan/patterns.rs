//! The built-in patterns of the scan: each family's phrases, secret-file
//! names and URLs, compiled once.
//!
//! Place: read by the checks of every string; built at load by
//! [`super::prepare`].
//!
//! Invariants: linear-time regexes only; a built-in pattern that does not
//! compile is a bug, so it panics at load, never on a request; word
//! boundaries are ASCII ones, so that a look-alike letter cannot hide a word
//! from them.

use std::sync::LazyLock;

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};

use super::anchors;
use super::finding::Kind;

pub(super) struct Phrase {
    pub(super) regex: Regex,
    pub(super) label: &'static str,
    /// Its bit among [`candidates`].
    pub(super) bit: u32,
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

/// How many phrases the families hold.
const fn phrase_count() -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < FAMILIES.len() {
        n += FAMILIES[i].1.len();
        i += 1;
    }
    n
}

/// The bit of [`SECRET_FILE`] among [`candidates`].
pub(super) const SECRET_FILE_BIT: u32 = 1 << phrase_count();

/// The bit of [`URL`] among [`candidates`].
pub(super) const URL_BIT: u32 = 1 << (phrase_count() + 1);

/// Every check's pattern, with ASCII word boundaries.
pub(super) fn any_sources() -> Vec<String> {
    FAMILIES
        .iter()
        .flat_map(|(_, sources)| sources.iter().map(|(s, _)| *s))
        .chain([SECRET_FILE_SOURCE, URL_SOURCE])
        .map(ascii_boundaries)
        .collect()
}

/// One pass over a string says whether any check can match: the common,
/// clean string costs one automaton walk.
pub(super) static ANY: LazyLock<RegexSet> = LazyLock::new(|| {
    RegexSetBuilder::new(any_sources())
        .case_insensitive(true)
        .size_limit(32 << 20)
        .build()
        .unwrap_or_else(|e| panic!("built-in patterns must compile: {e}"))
});

/// [`ANY`] for ASCII text: the same patterns with Unicode off. On a text of
/// ASCII bytes only, Unicode classes (`\w`, `\s`, `[^.\n]`) and case
/// folding match exactly what their ASCII forms match (the patterns are
/// ASCII, and the letters whose Unicode case folding leaves ASCII, `K` and
/// `ſ`, are not in such a text), while the automaton is smaller and walks
/// about twice as fast: most results and arguments are ASCII.
pub(super) static ANY_ASCII: LazyLock<regex::bytes::RegexSet> = LazyLock::new(|| {
    regex::bytes::RegexSetBuilder::new(any_sources())
        .case_insensitive(true)
        .unicode(false)
        .size_limit(32 << 20)
        .build()
        .unwrap_or_else(|e| panic!("built-in patterns must compile without Unicode: {e}"))
});

/// The checks that may match `text`, as bits in the order of the sources
/// (phrases, then [`SECRET_FILE_BIT`] and [`URL_BIT`]); 0 when none can.
/// [`ANY`] (or [`ANY_ASCII`] when the text is ASCII) says first whether any
/// check matches at all: the common, clean text costs that one walk. Where
/// one does, the anchors rule out the checks whose words are absent, so
/// that the detailed checks run only the others one by one.
///
/// The anchors do not go first: their automaton (case-insensitive, with
/// overlapping matches) walks a clean text at about the set's own speed,
/// so on clean text they would only add a pass (BENCHMARKS.md, "The
/// poisoning scan's anchor words").
pub(super) fn candidates(text: &str) -> u32 {
    let any = if text.is_ascii() {
        ANY_ASCII.is_match(text.as_bytes())
    } else {
        ANY.is_match(text)
    };
    if any { anchors::candidates(text) } else { 0 }
}

/// The families' phrases, compiled one by one (for the match to quote).
pub(super) static PHRASES: LazyLock<Vec<(Kind, Vec<Phrase>)>> = LazyLock::new(|| {
    let mut bit = 0;
    FAMILIES
        .iter()
        .map(|(kind, sources)| {
            let phrases = sources
                .iter()
                .map(|(source, label)| {
                    bit += 1;
                    Phrase {
                        regex: ci(source),
                        label,
                        bit: 1 << (bit - 1),
                    }
                })
                .collect();
            (*kind, phrases)
        })
        .collect()
});

pub(super) static SECRET_FILE: LazyLock<Regex> = LazyLock::new(|| ci(SECRET_FILE_SOURCE));

pub(super) static URL: LazyLock<Regex> = LazyLock::new(|| ci(URL_SOURCE));

/// The phrase families that match `text` (for decoded payloads).
pub(super) fn phrase_labels(text: &str) -> Vec<&'static str> {
    let candidates = candidates(text);
    if candidates == 0 {
        return Vec::new();
    }
    let mut labels: Vec<&'static str> = PHRASES
        .iter()
        .filter_map(|(_, phrases)| {
            phrases
                .iter()
                .find(|p| p.bit & candidates != 0 && p.regex.is_match(text))
                .map(|p| p.label)
        })
        .collect();
    if candidates & SECRET_FILE_BIT != 0 && SECRET_FILE.is_match(text) {
        labels.push("a reference to a secret file");
    }
    labels
}
