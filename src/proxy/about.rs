//! What a resource, prompt, completion or listen request is about, as the
//! audit records it (the event's `subject`): the resource's canonical URI
//! as forwarded (query included, since that is what runs), the prompt's
//! name, a completion's reference, the URIs a listen subscribes to.
//!
//! Place in the path: right after the message is typed (the conductor's
//! `scan_outgoing` step), before any routing or decision, so a request
//! refused by any later step (a hidden resource answered as missing, a URI
//! that cannot be canonicalized, a prompt no rule allows, a name the merged
//! view cannot route) is still recorded with what it asked for. The
//! dispatch steps narrow it to what the server routed to receives (a
//! merged-view prompt's name without its server prefix, like a tool's).
//!
//! Invariants: a tool call has no subject (its name is the event's `tool`);
//! no secret a detector finds is kept (it is written `[redacted:<kind>]`);
//! a URI that cannot be canonicalized is kept as sent with its control
//! characters replaced, so no client text can forge a line of a log or a
//! row of the dashboard; the whole is bounded by the event
//! ([`Event::bound`](crate::record::event::Event::bound)), and a listen
//! names at most [`MAX_LISTED`] URIs.

use crate::mcp::request::{Ask, Reference};
use crate::policy::uri;
use crate::sanitize::SanitizeSettings;

/// Most URIs of a `subscriptions/listen` named in its subject; the rest are counted.
pub(super) const MAX_LISTED: usize = 16;

/// What `ask` is about, for the audit; `None` for every other kind of request.
pub(super) fn subject(ask: &Ask, sanitize: &SanitizeSettings) -> Option<String> {
    asked(ask).map(|subject| redacted(sanitize, subject))
}

fn asked(ask: &Ask) -> Option<String> {
    match ask {
        Ask::Resource { uri } => Some(forwarded(uri)),
        Ask::Prompt { name, .. } => Some(shown(name)),
        Ask::Completion { reference } => Some(match reference {
            Reference::Prompt { name } => shown(name),
            // A template is decided as listed; a URI is completed on its
            // identity (the query is left to the read).
            Reference::Resource { uri } if uri.contains('{') => shown(uri),
            Reference::Resource { uri } => match uri::canonical(uri) {
                Ok(canonical) => canonical.identity().to_owned(),
                Err(_) => shown(uri),
            },
        }),
        Ask::Subscription {
            uris: Some(uris), ..
        } => Some(listed(uris)),
        _ => None,
    }
}

/// A client's URI as the server receives it: canonical, query included;
/// as sent (made printable) when it has no canonical form.
fn forwarded(raw: &str) -> String {
    match uri::canonical(raw) {
        Ok(canonical) => canonical.as_str().to_owned(),
        Err(_) => shown(raw),
    }
}

/// The URIs of a listen, space-separated (a canonical URI has no space),
/// the first [`MAX_LISTED`] of them and a count of the others.
fn listed(uris: &[String]) -> String {
    let mut named: Vec<String> = uris.iter().take(MAX_LISTED).map(|u| forwarded(u)).collect();
    if uris.len() > MAX_LISTED {
        named.push(format!("(+{} more)", uris.len() - MAX_LISTED));
    }
    named.join(" ")
}

/// `subject` with every secret the detectors find (a token in a URI's
/// query, say) written `[redacted:<kind>]`, whatever `[sanitize] arguments`
/// and `[audit] arguments` say: a subject reaches the log line and the spans
/// as well as the store, and none of them may hold a secret.
fn redacted(sanitize: &SanitizeSettings, subject: String) -> String {
    let mut found = crate::sanitize::secrets_in(sanitize, &subject);
    if found.is_empty() {
        return subject;
    }
    found.sort_by_key(|(start, _, _)| *start);
    let mut kept = String::with_capacity(subject.len());
    let mut at = 0;
    for (start, end, kind) in found {
        // Overlapping findings: the first one covers the text.
        if start < at {
            at = at.max(end);
            continue;
        }
        kept.push_str(&subject[at..start]);
        kept.push_str(&format!("[redacted:{kind}]"));
        at = end;
    }
    kept.push_str(&subject[at.min(subject.len())..]);
    kept
}

/// `text` with every control character written U+FFFD.
fn shown(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn subject_of(ask: &Ask) -> Option<String> {
        subject(ask, &crate::sanitize::SanitizeSettings::default())
    }

    fn read(uri: &str) -> Ask {
        Ask::Resource { uri: uri.into() }
    }

    #[test]
    fn a_read_is_about_its_canonical_uri_with_the_query_it_forwards() {
        let about = subject_of(&read("FILE:///docs/./a.md?rev=2")).unwrap();
        assert_eq!(
            about,
            uri::canonical("file:///docs/a.md?rev=2").unwrap().as_str()
        );
        assert!(about.ends_with("?rev=2"), "{about}");
    }

    #[test]
    fn a_uri_without_a_canonical_form_is_kept_as_sent_made_printable() {
        let raw = "file:///docs/%2e%2e/secret\nforged line";
        assert!(uri::canonical(raw).is_err(), "the example must be refused");
        let about = subject_of(&read(raw)).unwrap();
        assert_eq!(about, "file:///docs/%2e%2e/secret\u{FFFD}forged line");
    }

    #[test]
    fn a_completion_is_about_its_reference_and_a_tool_call_about_nothing() {
        let prompt = Ask::Completion {
            reference: Reference::Prompt {
                name: "greet".into(),
            },
        };
        assert_eq!(subject_of(&prompt).as_deref(), Some("greet"));
        let resource = Ask::Completion {
            reference: Reference::Resource {
                uri: "file:///a.md?q=1".into(),
            },
        };
        assert_eq!(subject_of(&resource).as_deref(), Some("file:///a.md"));
        assert_eq!(subject_of(&Ask::Plain), None);
    }

    #[test]
    fn a_listen_names_its_first_uris_and_counts_the_others() {
        let uris: Vec<String> = (0..MAX_LISTED + 3)
            .map(|i| format!("file:///r/{i}"))
            .collect();
        let ask = Ask::Subscription {
            uris: Some(uris),
            tools_list_changed: false,
        };
        let about = subject_of(&ask).unwrap();
        assert!(about.starts_with("file:///r/0 file:///r/1 "), "{about}");
        assert!(
            about.ends_with(&format!("file:///r/{} (+3 more)", MAX_LISTED - 1)),
            "{about}"
        );
    }

    #[test]
    fn a_secret_in_a_uri_is_not_kept() {
        let settings = crate::sanitize::SanitizeSettings::default();
        let key = "AKIAZ7QWERTYUIOPCANA";
        let ask = read(&format!("file:///docs/a.md?key={key}"));
        let about = subject(&ask, &settings).unwrap();
        assert!(!about.contains(key), "{about}");
        assert!(
            about.starts_with("file:///docs/a.md?key=[redacted:"),
            "{about}"
        );
    }

    proptest! {
        #[test]
        fn no_subject_carries_a_control_character(raw in any::<String>()) {
            for ask in [read(&raw), Ask::Prompt { name: raw.clone(), arguments: None }] {
                let about = subject_of(&ask).unwrap();
                prop_assert!(!about.chars().any(char::is_control), "{about:?}");
            }
        }
    }
}
