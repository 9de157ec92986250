//! What the scan reports: the kind of a finding, its severity, and the
//! other servers' tool names a definition is checked against.
//!
//! Place: the scan's output type, stored with a pin and shown to operators.
//! Invariants: every kind but `url` is a warning; a finding's `detail` is
//! for operators, the model only ever sees kinds and paths.

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

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
    pub(super) pattern: Option<Regex>,
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

impl Kind {
    /// True for the kinds that flag a tool's output: the injection families.
    /// A URL, a secret file's name or another server's tool name is ordinary
    /// in results (a directory listing, a search hit).
    pub(crate) fn flags_output(self) -> bool {
        !matches!(self, Kind::Url | Kind::SecretFile | Kind::OtherServerTool)
    }
}
