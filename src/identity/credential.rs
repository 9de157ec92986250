//! What the broker hands the upstream transport: a [`Credential`] (the
//! headers carrying one caller's identity to one server), or the
//! [`CredentialError`] saying why none can be had.
//!
//! Invariants: only the identity module makes a credential; its values are
//! never printed; an error's text is the gateway's own and never holds a
//! token, a secret or an authorization server's words.

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The headers that carry one caller's identity to one server. Only a
/// [`Broker`] makes one; values are marked sensitive and never printed.
#[derive(Clone)]
pub(crate) struct Credential {
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
}

impl Credential {
    /// Puts the credential's headers on an upstream request.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        write!(f, "Credential({names:?})")
    }
}

/// Why no credential could be had: the gateway's own words (never a token,
/// a secret or an authorization server's text), and whether retrying helps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CredentialError {
    pub(crate) reason: String,
    pub(crate) retry_helps: bool,
}
