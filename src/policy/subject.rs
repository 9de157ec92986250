//! What a decision is about: a tool, a resource or a prompt, and its kind.
//!
//! Place: the bottom of the policy, beneath the rules, their index and the
//! conditions, which all read it. Invariant: a resource is named by its
//! canonical identity ([`super::uri::CanonicalUri::identity`]) only, so rules
//! never see another spelling.

/// What a client asks to use.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A tool, by name.
    Tool(&'a str),
    /// A resource, by URI (or URI template). A URI is given as its canonical
    /// identity ([`super::uri::CanonicalUri::identity`]): rules never see another spelling.
    Resource(&'a str),
    /// A prompt, by name.
    Prompt(&'a str),
}

/// Which kind of subject a lookup, a rule or a rule's condition is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tool,
    Resource,
    Prompt,
}

impl<'a> Subject<'a> {
    /// The tool's or prompt's name, or the resource's URI.
    pub fn name(self) -> &'a str {
        match self {
            Subject::Tool(name) | Subject::Resource(name) | Subject::Prompt(name) => name,
        }
    }

    /// Its kind.
    pub fn kind(self) -> Kind {
        match self {
            Subject::Tool(_) => Kind::Tool,
            Subject::Resource(_) => Kind::Resource,
            Subject::Prompt(_) => Kind::Prompt,
        }
    }
}
