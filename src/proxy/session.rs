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
//! Invariants: bounded in total (`max_sessions`) and per client
//! (`max_sessions_per_client`), merged sessions included. A new binding past a
//! client's quota drops that client's own least recently used binding, so one
//! client's `initialize` flood never evicts another client's sessions; when
//! the whole table is full, the client holding the most bindings loses its
//! least recently used one (a flooding client is that client). A new session
//! is never refused: a client that lost sessions without ending them (a crash)
//! must still be able to start again. `Mcp-Session-Id` is never an identity:
//! it only narrows what an already authenticated client can reach.
//!
//! With a shared state store (`[state] backend = "redis"`), a server's own
//! session binding is also written there as it is made (off the request's
//! path; a failed write is logged and the session stays this replica's), and
//! a session this replica does not know is looked up there
//! ([`SessionTable::check_in_fleet`]): the same client's, it is served and
//! remembered here; a store that cannot answer refuses the request
//! (`state_unavailable`), never serves it. Merged-view sessions stay per
//! replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::auth::ClientId;
use crate::state::{SharedState, Unavailable};

/// Sessions per (server, session id).
#[derive(Debug)]
pub(crate) struct SessionTable {
    inner: Mutex<Inner>,
    max: usize,
    per_client: usize,
    /// Where the fleet's bindings are (the memory store: nowhere else).
    shared: Arc<SharedState>,
}

/// A binding as the shared store keeps it: client name, anonymous, unlisted.
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct SharedBinding {
    c: String,
    a: bool,
    u: bool,
}

impl SharedBinding {
    fn of(client: &ClientId) -> Self {
        Self {
            c: client.name().to_owned(),
            a: client.is_anonymous(),
            u: client.is_unlisted(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<(String, String), Entry>,
    /// Bindings held by each client.
    held: HashMap<ClientId, usize>,
    clock: u64,
}

impl Inner {
    /// The least recently used binding, among `client`'s when given.
    fn oldest(&self, client: Option<&ClientId>) -> Option<(String, String)> {
        self.sessions
            .iter()
            .filter(|(_, e)| client.is_none_or(|c| e.client == *c))
            .min_by_key(|(_, e)| e.last_used)
            .map(|(k, _)| k.clone())
    }

    fn drop_key(&mut self, key: &(String, String)) {
        if let Some(e) = self.sessions.remove(key)
            && let Some(n) = self.held.get_mut(&e.client)
        {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&e.client);
            }
        }
    }
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
    /// A table of at most `max` bindings, `per_client` of them per client.
    pub(crate) fn new(max: usize, per_client: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max,
            per_client: per_client.clamp(1, max.max(1)),
            shared: Arc::new(SharedState::memory()),
        }
    }

    /// The table whose server sessions every replica sharing `shared` sees.
    pub(crate) fn shared(mut self, shared: Arc<SharedState>) -> Self {
        self.shared = shared;
        self
    }

    /// Records that `session` on `server` belongs to `client` (and, with a
    /// shared store, writes it there off the request's path).
    pub(crate) fn bind(&self, server: &str, session: &str, client: &ClientId) {
        self.insert(server, session, client, None);
        if !self.shared.is_shared() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let value = serde_json::to_string(&SharedBinding::of(client)).unwrap_or_default();
        let (shared, per_client) = (self.shared.clone(), self.per_client);
        let (server, session, name) = (
            server.to_owned(),
            session.to_owned(),
            client.name().to_owned(),
        );
        runtime.spawn(async move {
            let now = crate::util::time::now_ms();
            let ids = (server.as_str(), session.as_str(), name.as_str());
            if let Err(e) = shared.bind_session(ids, &value, now, per_client).await {
                tracing::warn!(server = %server, error = %e,
                    "a session's binding could not be shared: it is served by this replica only");
            }
        });
    }

    /// [`Self::check`], and with a shared store a session this replica does
    /// not know is looked up there: the same client's, it is remembered here.
    pub(crate) async fn check_in_fleet(
        &self,
        server: &str,
        session: &str,
        client: &ClientId,
    ) -> Result<bool, Unavailable> {
        if self.check(server, session, client) {
            return Ok(true);
        }
        let Some(text) = self.shared.session(server, session).await? else {
            return Ok(false);
        };
        let mine = serde_json::from_str::<SharedBinding>(&text)
            .is_ok_and(|b| b == SharedBinding::of(client));
        if mine {
            self.insert(server, session, client, None);
        }
        Ok(mine)
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
        // A rebinding replaces the old entry (whoever held it) and counts anew.
        inner.drop_key(&key);
        if inner.held.get(client).copied().unwrap_or(0) >= self.per_client {
            if let Some(k) = inner.oldest(Some(client)) {
                inner.drop_key(&k);
            }
        } else if inner.sessions.len() >= self.max {
            let most = inner
                .held
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(c, _)| c.clone());
            if let Some(k) = most.and_then(|c| inner.oldest(Some(&c))) {
                inner.drop_key(&k);
            }
        }
        *inner.held.entry(client.clone()).or_default() += 1;
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

    /// Forgets a session (ended, or expired upstream), fleet-wide with a
    /// shared store (off the request's path).
    pub(crate) fn remove(&self, server: &str, session: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.drop_key(&(server.to_owned(), session.to_owned()));
        drop(inner);
        if let (true, Ok(runtime)) = (
            self.shared.is_shared(),
            tokio::runtime::Handle::try_current(),
        ) {
            let shared = self.shared.clone();
            let (server, session) = (server.to_owned(), session.to_owned());
            runtime.spawn(async move {
                let _ = shared.forget_session(&server, &session).await;
            });
        }
    }

    /// Ends every session whose client `revoked` says has lost `server` (a
    /// merged-view session ends when any of its member servers is lost); the
    /// client's next request with one is answered like an unknown session.
    /// Returns how many ended.
    pub(crate) fn end_where(&self, revoked: impl Fn(&ClientId, &str) -> bool) -> usize {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let ended: Vec<(String, String)> = inner
            .sessions
            .iter()
            .filter(|((server, _), entry)| match &entry.members {
                Some(members) => members.iter().any(|m| revoked(&entry.client, &m.server)),
                None => revoked(&entry.client, server),
            })
            .map(|(key, _)| key.clone())
            .collect();
        // Through `drop_key`, so each client's count of held sessions (its quota)
        // goes down with them.
        for key in &ended {
            inner.drop_key(key);
        }
        ended.len()
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
    fn sessions_ended_by_revocation_give_their_quota_back() {
        let t = SessionTable::new(10, 2);
        let (alice, bob) = (ClientId::named("alice"), ClientId::named("bob"));
        t.bind("s", "a1", &alice);
        t.bind("s", "a2", &alice);
        t.bind("s", "b1", &bob);
        assert_eq!(t.end_where(|c, _| *c == alice), 2);
        // Alice's quota is whole again: two new sessions evict nothing.
        t.bind("s", "a3", &alice);
        t.bind("s", "a4", &alice);
        assert!(t.check("s", "a3", &alice) && t.check("s", "a4", &alice));
        assert!(t.check("s", "b1", &bob));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn sessions_belong_to_their_client() {
        let t = SessionTable::new(10, 10);
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
        let t = SessionTable::new(10, 10);
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
        let t = SessionTable::new(10, 10);
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
        let t = SessionTable::new(2, 2);
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

    #[test]
    fn one_clients_flood_evicts_only_its_own_bindings() {
        let t = SessionTable::new(100, 3);
        let (alice, mallory) = (ClientId::named("alice"), ClientId::named("mallory"));
        t.bind("s", "alice-1", &alice);
        let merged = t.bind_merged(&alice, Vec::new());
        for i in 0..1000 {
            t.bind("s", &format!("m-{i}"), &mallory);
        }
        assert!(t.check("s", "alice-1", &alice));
        assert!(t.merged(&merged, &alice).is_some());
        assert_eq!(t.len(), 2 + 3);
        // Mallory keeps its three most recent.
        assert!(t.check("s", "m-999", &mallory));
        assert!(t.check("s", "m-997", &mallory));
        assert!(!t.check("s", "m-996", &mallory));
    }

    #[test]
    fn a_full_table_takes_from_the_client_holding_the_most() {
        let t = SessionTable::new(4, 3);
        let (alice, bob, carol) = (
            ClientId::named("alice"),
            ClientId::named("bob"),
            ClientId::named("carol"),
        );
        t.bind("s", "a1", &alice);
        t.bind("s", "b1", &bob);
        t.bind("s", "b2", &bob);
        t.bind("s", "b3", &bob);
        t.bind("s", "c1", &carol);
        assert_eq!(t.len(), 4);
        assert!(t.check("s", "a1", &alice));
        assert!(t.check("s", "c1", &carol));
        assert!(!t.check("s", "b1", &bob));
        // Ending a session frees its place in the quota.
        t.remove("s", "b2");
        t.remove("s", "b3");
        t.bind("s", "b4", &bob);
        assert_eq!(t.len(), 3);
    }
}
