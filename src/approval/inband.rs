//! The handshake-era in-band exchange: an `elicitation/create` request the
//! gateway itself sends on a call's SSE stream, and the client's answer.
//!
//! Place in the path: the approval gate opens a question here and holds the
//! call; a client's POSTed JSON-RPC response whose id is a question's id is
//! delivered here instead of being relayed upstream. Also here: which
//! sessions declared the elicitation capability at `initialize`.
//!
//! Invariants: question ids are `portcullis-approval-` and 128 random bits,
//! and an upstream's server→client request with an id of that form is never
//! relayed (the relay drops it), so an answer can only be to the gateway's
//! own question; an answer counts only from the client and session the
//! question was sent to (anything else is answered like an unknown id); a
//! question is answered at most once; both tables are bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::oneshot;

/// The prefix of every question id the gateway sends.
pub const ID_PREFIX: &str = "portcullis-approval-";

/// Whether a JSON-RPC id is of the gateway's own question form.
pub fn is_question_id(id: &Value) -> bool {
    id.as_str().is_some_and(|s| s.starts_with(ID_PREFIX))
}

struct Question {
    client: String,
    session: String,
    answer: oneshot::Sender<Value>,
}

/// Open questions, by id.
#[derive(Default)]
pub struct Questions {
    open: Mutex<HashMap<String, Question>>,
}

impl std::fmt::Debug for Questions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Questions").finish_non_exhaustive()
    }
}

/// What became of a client's response.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// It answered an open question of this client and session.
    Delivered,
    /// Its id is of the question form but names no open question of this
    /// client and session.
    Unknown,
    /// Not an answer to the gateway (relay it upstream).
    NotOurs,
}

impl Questions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Question>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a question for `client` on `session`; refused when `max` are
    /// open, or `max_per_client` of this client's.
    pub fn open(
        &self,
        client: &str,
        session: &str,
        max: usize,
        max_per_client: usize,
    ) -> Result<(String, oneshot::Receiver<Value>), super::queue::Full> {
        let mut open = self.lock();
        // Questions whose call went away (the stream was closed) free their place.
        open.retain(|_, q| !q.answer.is_closed());
        if open.len() >= max {
            return Err(super::queue::Full::Queue(max));
        }
        if open.values().filter(|q| q.client == client).count() >= max_per_client {
            return Err(super::queue::Full::Client(max_per_client));
        }
        let id = format!("{ID_PREFIX}{}", hex::encode(rand::random::<[u8; 16]>()));
        let (tx, rx) = oneshot::channel();
        open.insert(
            id.clone(),
            Question {
                client: client.to_owned(),
                session: session.to_owned(),
                answer: tx,
            },
        );
        Ok((id, rx))
    }

    /// Closes a question nobody answered (timeout).
    pub fn close(&self, id: &str) {
        self.lock().remove(id);
    }

    /// A client's JSON-RPC response: delivered when it answers one of its
    /// own open questions.
    pub fn deliver(&self, client: &str, session: Option<&str>, response: &Value) -> Delivery {
        let Some(id) = response.get("id").filter(|id| is_question_id(id)) else {
            return Delivery::NotOurs;
        };
        let id = id.as_str().unwrap_or_default();
        let mut open = self.lock();
        let mine = open
            .get(id)
            .is_some_and(|q| q.client == client && Some(q.session.as_str()) == session);
        if !mine {
            return Delivery::Unknown;
        }
        match open.remove(id).map(|q| q.answer.send(response.clone())) {
            Some(Ok(())) => Delivery::Delivered,
            _ => Delivery::Unknown,
        }
    }
}

/// A client's session: (client name, session id).
type SessionKey = (String, String);

/// Which handshake-era sessions can be asked (they declared `elicitation`).
#[derive(Default)]
pub struct Sessions {
    /// Each session's capability, and the order they were first seen in.
    known: Mutex<(HashMap<SessionKey, bool>, VecDeque<SessionKey>)>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

impl Sessions {
    /// Records what `client` declared when it opened `session`. Past
    /// `max.1` sessions of this client its own oldest is forgotten; past
    /// `max.0` in all, the oldest of the client that holds the most — never
    /// another client's because one client opened many (a forgotten session
    /// is treated as one that cannot be asked: the operator path, or the
    /// documented refusal).
    pub fn remember(&self, client: &str, session: &str, elicits: bool, max: (usize, usize)) {
        let (max, per_client) = (max.0.max(1), max.1.max(1));
        let mut guard = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *guard;
        let key = (client.to_owned(), session.to_owned());
        if map.insert(key.clone(), elicits).is_none() {
            order.push_back(key);
        }
        let forget =
            |order: &mut VecDeque<SessionKey>, map: &mut HashMap<SessionKey, bool>, whose: &str| {
                if let Some(at) = order.iter().position(|(c, _)| c == whose)
                    && let Some(old) = order.remove(at)
                {
                    map.remove(&old);
                }
            };
        while order.iter().filter(|(c, _)| c == client).count() > per_client {
            forget(order, map, client);
        }
        while map.len() > max {
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for (c, _) in order.iter() {
                *counts.entry(c.as_str()).or_default() += 1;
            }
            let Some(most) = counts
                .into_iter()
                .max_by_key(|(_, n)| *n)
                .map(|(c, _)| c.to_owned())
            else {
                break;
            };
            forget(order, map, &most);
        }
    }

    /// Whether `client`'s `session` declared the elicitation capability.
    pub fn elicits(&self, client: &str, session: &str) -> bool {
        let guard = self.known.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .0
            .get(&(client.to_owned(), session.to_owned()))
            .copied()
            .unwrap_or(false)
    }
}

/// Whether client capabilities (`initialize` params or the 2026 `_meta`
/// key) declare form elicitation: `elicitation: {}` (form, the default) or
/// with a `form` member.
pub fn declares_elicitation(capabilities: Option<&Value>) -> bool {
    match capabilities.and_then(|c| c.get("elicitation")) {
        Some(Value::Object(e)) => e.is_empty() || e.contains_key("form"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_counts_only_from_its_client_and_session_once() {
        let q = Questions::default();
        let (id, mut rx) = q.open("alice", "s1", 10, 1).expect("open");
        assert!(q.open("alice", "s1", 10, 1).is_err(), "one per client");
        assert!(
            q.open("bob", "s1", 10, 1).is_ok(),
            "another client's place is its own"
        );
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept"}});
        assert_eq!(q.deliver("bob", Some("s1"), &answer), Delivery::Unknown);
        assert_eq!(q.deliver("alice", Some("s2"), &answer), Delivery::Unknown);
        assert_eq!(q.deliver("alice", Some("s1"), &answer), Delivery::Delivered);
        assert_eq!(rx.try_recv().expect("answer")["result"]["action"], "accept");
        assert_eq!(q.deliver("alice", Some("s1"), &answer), Delivery::Unknown);
        let upstream = json!({"jsonrpc": "2.0", "id": 7, "result": {}});
        assert_eq!(q.deliver("alice", Some("s1"), &upstream), Delivery::NotOurs);
    }

    #[test]
    fn one_clients_sessions_never_push_out_another_clients() {
        let s = Sessions::default();
        s.remember("bob", "b1", true, (4, 3));
        for n in 0..50 {
            s.remember("alice", &format!("a{n}"), true, (4, 3));
        }
        assert!(s.elicits("bob", "b1"), "bob's session is kept");
        assert!(s.elicits("alice", "a49") && s.elicits("alice", "a47"));
        assert!(!s.elicits("alice", "a46"), "alice keeps her own bound");
        // The whole table full: the client holding the most gives way.
        s.remember("carol", "c1", true, (4, 3));
        s.remember("dave", "d1", true, (4, 3));
        assert!(s.elicits("bob", "b1") && s.elicits("carol", "c1") && s.elicits("dave", "d1"));
        assert!(!s.elicits("alice", "a47"));
    }

    #[test]
    fn the_capability_is_read_from_what_the_client_declared() {
        assert!(declares_elicitation(Some(&json!({"elicitation": {}}))));
        assert!(declares_elicitation(Some(
            &json!({"elicitation": {"form": {}}})
        )));
        assert!(!declares_elicitation(Some(
            &json!({"elicitation": {"url": {}}})
        )));
        assert!(!declares_elicitation(Some(&json!({"sampling": {}}))));
        assert!(!declares_elicitation(None));
        let s = Sessions::default();
        s.remember("alice", "s1", true, (1, 1));
        assert!(s.elicits("alice", "s1"));
        assert!(!s.elicits("bob", "s1"));
        s.remember("alice", "s2", true, (1, 1));
        assert!(
            !s.elicits("alice", "s1"),
            "the oldest is forgotten past the bound"
        );
    }
}
