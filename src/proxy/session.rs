//! Upstream sessions (handshake era), each bound to the client that opened it.
//!
//! Place in the path: after authentication, before forwarding. A request that
//! presents `Mcp-Session-Id` must come from the client the session was minted
//! for; anything else is answered like an unknown session (404), so the answer
//! says nothing about whether the id exists.
//!
//! A session of the merged `/mcp` view is the gateway's own: its id is minted
//! here and it names one upstream session per member server.
//!
//! Invariants: bounded (`max_sessions`, least recently used dropped first,
//! merged sessions included); `Mcp-Session-Id` is never an identity: it only
//! narrows what an already authenticated client can reach.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::auth::ClientId;

/// Sessions per (server, session id).
#[derive(Debug)]
pub(crate) struct SessionTable {
    inner: Mutex<Inner>,
    max: usize,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<(String, String), Entry>,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    client: ClientId,
    last_used: u64,
    /// For a merged-view session: the upstream session of each member server.
    members: Option<Arc<[Member]>>,
}

/// One server's part in a merged-view session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub server: String,
    /// The session the server minted (none when it keeps no sessions).
    pub session: Option<String>,
    /// The protocol version the server agreed to.
    pub version: String,
}

/// The table key of merged-view sessions (server names are never empty).
const MERGED: &str = "";

impl SessionTable {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max,
        }
    }

    /// Records that `session` on `server` belongs to `client`.
    pub(crate) fn bind(&self, server: &str, session: &str, client: &ClientId) {
        self.insert(server, session, client, None);
    }

    /// Mints a merged-view session for `client` over the servers' own sessions.
    pub(crate) fn bind_merged(&self, client: &ClientId, members: Vec<Member>) -> String {
        let mut bytes = [0u8; 24];
        rand::Rng::fill(&mut rand::rng(), &mut bytes[..]);
        let id = hex::encode(bytes);
        self.insert(MERGED, &id, client, Some(members.into()));
        id
    }

    /// The members of merged session `session`, when `client` opened it.
    pub(crate) fn merged(&self, session: &str, client: &ClientId) -> Option<Arc<[Member]>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        match inner
            .sessions
            .get_mut(&(MERGED.to_owned(), session.to_owned()))
        {
            Some(e) if e.client == *client => {
                e.last_used = now;
                e.members.clone()
            }
            _ => None,
        }
    }

    /// Forgets a merged-view session.
    pub(crate) fn remove_merged(&self, session: &str) {
        self.remove(MERGED, session);
    }

    fn insert(
        &self,
        server: &str,
        session: &str,
        client: &ClientId,
        members: Option<Arc<[Member]>>,
    ) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        let key = (server.to_owned(), session.to_owned());
        if !inner.sessions.contains_key(&key) && inner.sessions.len() >= self.max {
            let oldest = inner
                .sessions
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                inner.sessions.remove(&k);
            }
        }
        inner.sessions.insert(
            key,
            Entry {
                client: client.clone(),
                last_used: now,
                members,
            },
        );
    }

    /// True when `session` on `server` was opened by `client`.
    pub(crate) fn check(&self, server: &str, session: &str, client: &ClientId) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        match inner
            .sessions
            .get_mut(&(server.to_owned(), session.to_owned()))
        {
            Some(e) if e.client == *client => {
                e.last_used = now;
                true
            }
            _ => false,
        }
    }

    /// Forgets a session (ended, or expired upstream).
    pub(crate) fn remove(&self, server: &str, session: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .sessions
            .remove(&(server.to_owned(), session.to_owned()));
    }

    /// Ends every session whose client `revoked` says has lost `server` (a
    /// merged-view session ends when any of its member servers is lost); the
    /// client's next request with one is answered like an unknown session.
    /// Returns how many ended.
    pub(crate) fn end_where(&self, revoked: impl Fn(&ClientId, &str) -> bool) -> usize {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let before = inner.sessions.len();
        inner
            .sessions
            .retain(|(server, _), entry| match &entry.members {
                Some(members) => !members.iter().any(|m| revoked(&entry.client, &m.server)),
                None => !revoked(&entry.client, server),
            });
        before - inner.sessions.len()
    }

    /// Number of sessions tracked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sessions
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_belong_to_their_client() {
        let t = SessionTable::new(10);
        let (alice, bob) = (ClientId::named("alice"), ClientId::named("bob"));
        t.bind("s", "abc", &alice);
        assert!(t.check("s", "abc", &alice));
        assert!(!t.check("s", "abc", &bob));
        assert!(!t.check("other", "abc", &alice));
        assert!(!t.check("s", "nope", &alice));
        t.remove("s", "abc");
        assert!(!t.check("s", "abc", &alice));
    }

    #[test]
    fn merged_sessions_belong_to_their_client_and_are_not_server_sessions() {
        let t = SessionTable::new(10);
        let (alice, bob) = (ClientId::named("alice"), ClientId::named("bob"));
        let member = Member {
            server: "a".into(),
            session: Some("up-1".into()),
            version: "2025-11-25".into(),
        };
        let id = t.bind_merged(&alice, vec![member.clone()]);
        assert_eq!(id.len(), 48);
        assert_eq!(t.merged(&id, &alice).as_deref(), Some(&[member][..]));
        assert!(t.merged(&id, &bob).is_none());
        assert!(!t.check("a", &id, &alice));
        assert_ne!(t.bind_merged(&alice, Vec::new()), id);
        t.remove_merged(&id);
        assert!(t.merged(&id, &alice).is_none());
    }

    #[test]
    fn revoked_clients_lose_their_sessions_on_that_server_only() {
        let t = SessionTable::new(10);
        let (alice, bob) = (ClientId::named("alice"), ClientId::named("bob"));
        t.bind("a", "1", &alice);
        t.bind("b", "2", &alice);
        t.bind("a", "3", &bob);
        let member = |server: &str| Member {
            server: server.into(),
            session: None,
            version: "2025-11-25".into(),
        };
        let merged = t.bind_merged(&alice, vec![member("a"), member("b")]);
        let kept = t.bind_merged(&alice, vec![member("b")]);
        let ended = t.end_where(|c, s| c.name() == "alice" && s == "a");
        assert_eq!(ended, 2);
        assert!(!t.check("a", "1", &alice));
        assert!(t.check("b", "2", &alice));
        assert!(t.check("a", "3", &bob));
        assert!(t.merged(&merged, &alice).is_none());
        assert!(t.merged(&kept, &alice).is_some());
    }

    #[test]
    fn the_table_is_bounded_and_drops_the_least_recently_used() {
        let t = SessionTable::new(2);
        let a = ClientId::named("a");
        t.bind("s", "1", &a);
        t.bind("s", "2", &a);
        assert!(t.check("s", "1", &a));
        t.bind("s", "3", &a);
        assert_eq!(t.len(), 2);
        assert!(t.check("s", "1", &a));
        assert!(!t.check("s", "2", &a));
        assert!(t.check("s", "3", &a));
    }
}
