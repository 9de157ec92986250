//! Which resources a reply may name to its client: a server's
//! `notifications/resources/updated` about a resource the client's list
//! hides is dropped, never relayed.
//!
//! Place: beside the task scope in [`super::Recipient::hides`], on every
//! message of an upstream stream (a request's, the handshake era's GET
//! stream, a `subscriptions/listen` stream). Why: a hidden resource answers
//! like a missing one; a notification that it changed would tell the client
//! it exists, and a stream opened before a reload that hid it would keep
//! telling. Invariants: decided as the resource list decides (the client's
//! claims, the method its list promises), with the configuration in force
//! when the notification arrives; a notification whose URI is absent or
//! cannot be canonicalized is dropped (it could never be read).

use std::sync::Arc;

use serde_json::Value;

use crate::auth::{ClientId, PresentedToken};
use crate::mcp::methods::{self, Method};
use crate::policy::uri;
use crate::policy::{ListFacts, Subject};
use crate::proxy::state::AppState;

/// What a client may be told of resources on a reply's servers.
#[derive(Clone)]
pub(crate) struct Shown {
    /// Where the configuration in force is read, per notification.
    pub state: Arc<AppState>,
    pub client: ClientId,
    /// The verified JWT of the client (its claims); `None` for key and anonymous clients.
    pub token: Option<PresentedToken>,
    /// The servers the stream carries besides the reply's own (the other
    /// members on the merged view's `subscriptions/listen`): a resource one
    /// of them shows is shown.
    pub also: Vec<String>,
}

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shown")
            .field("client", &self.client.name())
            .field("also", &self.also)
            .finish_non_exhaustive()
    }
}

impl Shown {
    /// True when `message`, from a stream of `server`, names a resource no
    /// server of the stream shows this client.
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
        let shows = |server: &str| {
            (live.config.policy)
                .decide_listed(&self.client, server, subject, &facts)
                .allowed
        };
        !(shows(server) || self.also.iter().any(|s| shows(s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{self, Config};
    use crate::pins::Pins;
    use crate::proxy::state::Live;
    use serde_json::json;

    fn config(media: &str) -> Config {
        let text = format!(
            "[servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\n\
             [servers.b]\nurl = \"http://127.0.0.1:2/mcp\"\n\
             [pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"a\"]\nresources = [\"test://*\"]\n\
             action = \"allow\"\nwhen = \"uri == 'test://static-' + '{media}'\"\n"
        );
        config::load_str(&text, "t.toml", &|_| None).expect("config")
    }

    fn updated(uri: Value) -> Value {
        json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}})
    }

    /// Each notification is judged with the configuration in force when it
    /// arrives: a reload that hides a resource stops its updates on a
    /// stream opened before it; a stream of several servers shows what any
    /// of them shows; what is not a resource update passes.
    #[test]
    fn an_update_is_shown_as_the_list_in_force_shows_its_uri() {
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
        let shown = Shown {
            state: Arc::new(state),
            client: ClientId::named("carol"),
            token: None,
            also: Vec::new(),
        };
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
        // A stream of server b: nothing of a's is shown, unless it carries a too.
        assert!(shown.hides("b", &updated(json!(text))));
        let both = Shown {
            also: vec!["a".into()],
            ..shown.clone()
        };
        assert!(!both.hides("b", &updated(json!(text))));
        // A reload: the same stream now shows the binary one only.
        let pins = shown.state.pins.clone();
        let live = Live::build(Arc::new(config("binary")), None, &pins).expect("live");
        shown.state.live.store(Arc::new(live));
        assert!(shown.hides("a", &updated(json!(text))));
        assert!(!shown.hides("a", &updated(json!(binary))));
    }
}
