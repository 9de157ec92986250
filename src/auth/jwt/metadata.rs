//! RFC 9728 protected-resource metadata: where a client learns which
//! authorization server issues the tokens this gateway accepts, and the
//! description `portcullis check` prints.
//!
//! Place: served on the well-known path, and named in `WWW-Authenticate`.
//! Invariants: the metadata names the resource and the issuer as
//! configured, nothing the request supplied.

use serde_json::{Value, json};

use super::settings::KeySource;
use super::verify::JwtVerifier;

/// Where RFC 9728 puts the metadata of a resource, before the resource's path.
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

impl JwtVerifier {
    /// `[auth.jwt]` as `portcullis check` prints it.
    pub fn describe(&self) -> String {
        let s = &self.settings;
        let keys = match &s.keys {
            KeySource::File(set) => format!("{} key(s) from the file read at load", set.len()),
            KeySource::Url { url, refresh } => format!(
                "from {url}, fetched on first use and every {}",
                crate::util::time::humanize(*refresh)
            ),
        };
        let audiences: Vec<String> = s
            .audiences
            .iter()
            .map(|a| match &a.server {
                Some(server) => format!("{} (server {server} only)", a.value),
                None => a.value.clone(),
            })
            .collect();
        let algorithms: Vec<&str> = s.algorithms.iter().map(|a| a.name()).collect();
        let mut out = format!(
            "\nbearer JWTs (a token names its client in \"{}\"; unnamed clients match \"*\" rules)\n  issuer     {}\n  audience   {}\n  keys       {keys}\n  algorithms {}\n",
            s.client_claim,
            s.issuer,
            audiences.join(", "),
            algorithms.join(", "),
        );
        if !s.required_scopes.is_empty() {
            out.push_str(&format!("  scopes     {}\n", s.required_scopes.join(" ")));
        }
        out.push_str(&format!(
            "  metadata   {}/mcp/<server>\n",
            self.metadata_url("")
        ));
        out
    }

    /// RFC 9728 metadata of the resource at `resource_path` (`""`, `/mcp` or `/mcp/<server>`).
    pub(crate) fn metadata(&self, resource_path: &str) -> Value {
        let s = &self.settings;
        let mut doc = json!({
            "resource": format!("{}{resource_path}", s.resource_url),
            "authorization_servers": [s.issuer],
            "bearer_methods_supported": ["header"],
        });
        if !s.required_scopes.is_empty() {
            doc["scopes_supported"] = json!(s.required_scopes);
        }
        doc
    }

    /// The absolute URL of that metadata, for `WWW-Authenticate`.
    pub(crate) fn metadata_url(&self, resource_path: &str) -> String {
        format!(
            "{}{METADATA_PATH}{resource_path}",
            self.settings.resource_url
        )
    }
}
