//! Which resources a reply may name to its client: a server's
//! `notifications/resources/updated` about a resource the client's list
//! hides is dropped, never relayed.
//!
//! Place: beside the task scope in [`super::Recipient::hides`], on every
//! message of one server's stream (a request's, the handshake era's GET
//! stream, a `subscriptions/listen` stream); on the merged view's listen,
//! on each member's stream before they are merged ([`Shown::sent_by`]).
//! Why: a hidden resource answers like a missing one; a notification that
//! it changed would tell the client it exists, and a stream opened before a
//! reload that hid it would keep telling. Invariants: decided as the
//! resource list decides (the client's claims, the method its list
//! promises), with the configuration in force when the notification
//! arrives, for the server that sent it alone (the same URI on another
//! server names another resource); a notification whose URI is absent or
//! cannot be canonicalized is dropped (it could never be read).

use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::Value;

use crate::auth::{ClientId, PresentedToken};
use crate::mcp::methods::{self, Method};
use crate::mcp::sse::SseItem;
use crate::policy::uri;
use crate::policy::{ListFacts, Subject};
use crate::proxy::state::AppState;
use crate::transport::reply::SseStream;

/// What a client may be told of resources on a reply's servers.
#[derive(Clone)]
pub(crate) struct Shown {
    /// Where the configuration in force is read, per notification.
    pub state: Arc<AppState>,
    pub client: ClientId,
    /// The verified JWT of the client (its claims); `None` for key and anonymous clients.
    pub token: Option<PresentedToken>,
}

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shown")
            .field("client", &self.client.name())
            .finish_non_exhaustive()
    }
}

impl Shown {
    /// True when `message`, sent by `server`, names a resource `server` does
    /// not show this client.
    pub(crate) fn hides(&self, server: &str, message: &Value) -> bool {
        if methods::named_in(message) != Some(Method::ResourcesUpdated) {
            return false;
        }
        let named = message.pointer("/params/uri").and_then(Value::as_str);
        let Some(Ok(canonical)) = named.map(uri::canonical) else {
            return true;
        };
        let live = self.state.live.load();
        let facts = ListFacts {
            claims: self.token.as_ref().map(PresentedToken::claims),
            annotations: None,
        };
        let subject = Subject::Resource(canonical.identity());
        !(live.config.policy)
            .decide_listed(&self.client, server, subject, &facts)
            .allowed
    }

    /// `events`, the stream `server` sent, without the updates it hides:
    /// how a stream merged from several servers' judges each update by the
    /// server that sent it, before the merge forgets which one that was.
    /// Each is judged as it is read (the configuration in force then).
    pub(crate) fn sent_by(self, server: String, events: SseStream) -> SseStream {
        Box::pin(events.filter(move |item| {
            let hidden = match item {
                Ok(SseItem::Event(e)) => {
                    serde_json::from_str(&e.data).is_ok_and(|message| self.hides(&server, &message))
                }
                _ => false,
            };
            std::future::ready(!hidden)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{self, Config};
    use crate::mcp::sse::SseEvent;
    use crate::pins::Pins;
    use crate::proxy::state::Live;
    use proptest::prelude::*;
    use serde_json::json;

    fn config(media: &str) -> Config {
        let text = format!(
            "[servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\n\
             [servers.b]\nurl = \"http://127.0.0.1:2/mcp\"\n\
             [pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"a\"]\nresources = [\"test://*\"]\n\
             action = \"allow\"\nwhen = \"uri == 'test://static-' + '{media}'\"\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"b\"]\nresources = [\"test://b-*\"]\n\
             action = \"allow\"\n"
        );
        config::load_str(&text, "t.toml", &|_| None).expect("config")
    }

    /// What carol is shown under `config("text")`.
    fn shown() -> Shown {
        crate::app::install_crypto_provider();
        let pins = Pins::open(None, "t.toml").expect("pins");
        let state = AppState::new(
            Arc::new(config("text")),
            pins,
            Arc::default(),
            Arc::new(crate::telemetry::Traces::off()),
            true,
        )
        .expect("state");
        Shown {
            state: Arc::new(state),
            client: ClientId::named("carol"),
            token: None,
        }
    }

    fn updated(uri: Value) -> Value {
        json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}})
    }

    /// Each notification is judged with the configuration in force when it
    /// arrives: a reload that hides a resource stops its updates on a
    /// stream opened before it; what one server shows is shown of that
    /// server only; what is not a resource update passes.
    #[test]
    fn an_update_is_shown_as_the_list_in_force_shows_its_uri() {
        let shown = shown();
        let (text, binary) = ("test://static-text", "test://static-binary");
        assert!(!shown.hides("a", &updated(json!(text))));
        assert!(!shown.hides("a", &updated(json!("TEST://static-%74ext#f"))));
        assert!(shown.hides("a", &updated(json!(binary))));
        for odd in [
            json!(null),
            json!(7),
            json!("no scheme"),
            json!("test://a/%2F"),
        ] {
            assert!(shown.hides("a", &updated(odd.clone())), "{odd}");
        }
        let other = json!({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"});
        assert!(!shown.hides("a", &other));
        // Server b shows nothing of a's, and a nothing of b's.
        assert!(shown.hides("b", &updated(json!(text))));
        assert!(!shown.hides("b", &updated(json!("test://b-1"))));
        assert!(shown.hides("a", &updated(json!("test://b-1"))));
        // A reload: the same stream now shows the binary one only.
        let pins = shown.state.pins.clone();
        let live = Live::build(Arc::new(config("binary")), None, &pins).expect("live");
        shown.state.live.store(Arc::new(live));
        assert!(shown.hides("a", &updated(json!(text))));
        assert!(!shown.hides("a", &updated(json!(binary))));
    }

    /// An event of `server`'s stream, its `n`-th, that names `uri` (`None`:
    /// a list change, which names nothing); its id says who sent it.
    fn event(server: &str, n: usize, uri: Option<&str>) -> SseItem {
        let message = match uri {
            Some(uri) => updated(json!(uri)),
            None => json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
        };
        let mut event = SseEvent::message(message.to_string());
        event.id = Some(format!("{server}:{n}"));
        SseItem::Event(event)
    }

    /// The URIs both servers' updates may name: each server shows its own,
    /// and `test://static-text` only a's.
    const URIS: [&str; 4] = [
        "test://static-text",
        "test://b-1",
        "test://static-binary",
        "test://b-2",
    ];

    /// Two servers' streams merged as the merged view's listen merges them,
    /// each judged by [`Shown::sent_by`] first: whatever each sends, in
    /// whatever order they interleave, the client gets exactly the events
    /// of each server that server shows, in the order it sent them, and
    /// never one about a URI another server shows and its sender hides.
    #[test]
    fn a_merged_stream_judges_each_update_by_the_server_that_sent_it() {
        let shown = shown();
        let sent =
            proptest::collection::vec((any::<bool>(), proptest::option::of(0..URIS.len())), 0..24);
        let mut runner = proptest::test_runner::TestRunner::default();
        runner
            .run(&sent, |sent| {
                let mut of = [Vec::new(), Vec::new()];
                let mut expected = [Vec::new(), Vec::new()];
                for (n, (by_b, uri)) in sent.iter().enumerate() {
                    let (server, i) = if *by_b { ("b", 1) } else { ("a", 0) };
                    let uri = uri.map(|u| URIS[u]);
                    let item = event(server, n, uri);
                    // carol's rules: a shows static-text, b its `b-` ones.
                    let shows = uri.is_none_or(|u| match server {
                        "a" => u == "test://static-text",
                        _ => u.starts_with("test://b-"),
                    });
                    if shows {
                        expected[i].push(format!("{server}:{n}"));
                    }
                    of[i].push(Ok(item));
                }
                let [a, b] =
                    of.map(|items| Box::pin(futures_util::stream::iter(items)) as SseStream);
                let merged = futures_util::stream::select_all([
                    shown.clone().sent_by("a".into(), a),
                    shown.clone().sent_by("b".into(), b),
                ]);
                let out: Vec<SseItem> = futures_executor::block_on(
                    merged.filter_map(|i| std::future::ready(i.ok())).collect(),
                );
                let mut got = [Vec::new(), Vec::new()];
                for item in out {
                    let SseItem::Event(e) = item else { continue };
                    let id = e.id.unwrap_or_default();
                    got[usize::from(id.starts_with("b:"))].push(id);
                }
                prop_assert_eq!(&got, &expected);
                Ok(())
            })
            .expect("each server's updates judged by that server");
    }
}
