//! Tasks belong to the client that created them.
//!
//! Place in the path: on the way back, the reply to a `tools/call` that
//! creates a task (a 2025-11-25 `CreateTaskResult {task: {taskId, …}}`, or a
//! 2026-07-28 result with `resultType: "task"` and `taskId`) binds the task to
//! the authenticated client, the server, the tool, the era and what the
//! gateway knows of the tool's output ([`CallFacts`]). On the way in, every
//! task method (`tasks/get`, `tasks/result`, `tasks/cancel`, `tasks/update`)
//! names a task by `params.taskId`: another client's task, an expired one and
//! one the gateway never saw created all get the one answer an unknown task
//! gets (the spec's -32602, [`Rejection::UnknownTask`]), and the upstream is
//! not called. `tasks/list` is collected whole by the gateway and filtered to
//! the caller's own tasks. A task's result (`tasks/result`, a completed 2026
//! `tasks/get`, a task status notification carrying a result) passes the same
//! output checks as the `tools/call` result it stands for, under the task's
//! tool; status notifications of a task that is not the recipient's are not
//! relayed.
//!
//! Invariants: bounded in total (`gateway.max_tasks`) and per client
//! (`gateway.max_tasks_per_client`; past it, that client's own oldest task is
//! forgotten, never another's; when the whole store is full, the client
//! holding the most tasks loses its oldest). A binding lasts the task's own
//! ttl, at most `gateway.max_task_ttl`. With the memory state store, after a
//! restart the gateway knows no task, so every task created before it is
//! answered as unknown (fail closed) and must be started again. With a
//! shared one (`[state] backend = "redis"`), each binding is also written to
//! it as the reply leaves ([`TaskStore::bind`]; a failed write is logged and
//! the task stays known to this replica only), and a task this replica does
//! not know is looked up there ([`TaskStore::owned_in_fleet`]): found and the
//! caller's, it is served and remembered here; a store that cannot answer
//! refuses the task method (`state_unavailable`), never serves it. Anonymous
//! requests bind to the one anonymous identity when anonymous access is
//! configured, so anonymous callers share their tasks with each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::catalog::CallFacts;
use crate::auth::ClientId;
use crate::mcp::methods::{self, Method as Rpc};
use crate::mcp::version::Era;
use crate::sanitize::{Report, SanitizeSettings, Sanitizer};
use crate::state::{SharedState, Unavailable};

/// `_meta` key naming the task a message belongs to (2025-11-25).
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// The task methods a client sends, by what the gateway must do with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskMethod {
    /// `tasks/get`: the task's state (2026: with its result once completed).
    Get,
    /// `tasks/result` (2025-11-25): the task's result, a tools/call result.
    Result,
    /// `tasks/cancel`.
    Cancel,
    /// `tasks/update` (2026-07-28): answers to the task's input requests.
    Update,
    /// `tasks/list` (2025-11-25).
    List,
}

impl TaskMethod {
    /// The task method `method` is, if any.
    pub(crate) fn of(method: Rpc) -> Option<Self> {
        Some(match method {
            Rpc::TasksGet => TaskMethod::Get,
            Rpc::TasksResult => TaskMethod::Result,
            Rpc::TasksCancel => TaskMethod::Cancel,
            Rpc::TasksUpdate => TaskMethod::Update,
            Rpc::TasksList => TaskMethod::List,
            _ => return None,
        })
    }
}

/// A server's task status notification (either era's), by the method table.
fn is_task_status(message: &Value) -> bool {
    matches!(
        methods::named_in(message),
        Some(Rpc::TasksStatus | Rpc::Tasks)
    )
}

/// What the gateway knows of one task.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub client: ClientId,
    pub tool: String,
    pub era: Era,
    /// The tool's output facts when the task was created.
    pub facts: CallFacts,
    expires: Instant,
    /// Creation order, for eviction.
    seq: u64,
}

/// Tasks per (server, task id), in memory.
#[derive(Debug)]
pub(crate) struct TaskStore {
    inner: Mutex<Inner>,
    max: usize,
    per_client: usize,
    max_ttl: Duration,
    /// Where the fleet's bindings are (the memory store: nowhere else).
    shared: Arc<SharedState>,
}

/// A binding as the shared store keeps it (JSON, bounded).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Shared {
    /// Client name, anonymous, unlisted.
    c: String,
    a: bool,
    u: bool,
    /// Tool.
    t: String,
    /// Era (`Era::as_str`).
    e: String,
    /// Expiry, Unix ms.
    x: i64,
}

#[derive(Debug, Default)]
struct Inner {
    tasks: HashMap<(String, String), Task>,
    held: HashMap<ClientId, usize>,
    seq: u64,
}

impl Inner {
    fn drop_key(&mut self, key: &(String, String)) {
        if let Some(t) = self.tasks.remove(key)
            && let Some(n) = self.held.get_mut(&t.client)
        {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&t.client);
            }
        }
    }

    fn oldest_of(&self, client: &ClientId) -> Option<(String, String)> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.client == *client)
            .min_by_key(|(_, t)| t.seq)
            .map(|(k, _)| k.clone())
    }

    fn purge_expired(&mut self, now: Instant) {
        let expired: Vec<_> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.expires <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.drop_key(&k);
        }
    }
}

/// What a task creation binds.
#[derive(Debug)]
pub(crate) struct Created<'a> {
    pub server: &'a str,
    pub task_id: &'a str,
    pub client: &'a ClientId,
    pub tool: &'a str,
    pub era: Era,
    pub facts: &'a CallFacts,
    /// The task's ttl as the upstream gave it (`None`: unlimited or absent).
    pub ttl: Option<Duration>,
}

impl TaskStore {
    pub(crate) fn new(max: usize, per_client: usize, max_ttl: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max: max.max(1),
            per_client: per_client.clamp(1, max.max(1)),
            max_ttl,
            shared: Arc::new(SharedState::memory()),
        }
    }

    /// The store whose bindings every replica sharing `shared` sees.
    pub(crate) fn shared(mut self, shared: Arc<SharedState>) -> Self {
        self.shared = shared;
        self
    }

    /// Binds a task to its creator; a task id seen again is bound anew. With
    /// a shared state store the binding is written there too, off the
    /// request's path (inside a Tokio runtime).
    pub(crate) fn bind(&self, c: Created<'_>) {
        let ttl = c.ttl.map_or(self.max_ttl, |t| t.min(self.max_ttl));
        self.bind_here(&c, ttl);
        if !self.shared.is_shared() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now_ms = crate::util::time::now_ms();
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4);
        let max_ttl_ms = i64::try_from(self.max_ttl.as_millis()).unwrap_or(i64::MAX / 4);
        let value = serde_json::to_string(&Shared {
            c: c.client.name().to_owned(),
            a: c.client.is_anonymous(),
            u: c.client.is_unlisted(),
            t: c.tool.to_owned(),
            e: c.era.as_str().to_owned(),
            x: now_ms.saturating_add(ttl_ms),
        })
        .unwrap_or_default();
        let (shared, per_client) = (self.shared.clone(), self.per_client);
        let (server, task_id) = (c.server.to_owned(), c.task_id.to_owned());
        let client = c.client.name().to_owned();
        runtime.spawn(async move {
            let ids = (server.as_str(), task_id.as_str(), client.as_str());
            let written = shared
                .bind_task(ids, &value, (ttl_ms, max_ttl_ms), now_ms, per_client)
                .await;
            if let Err(e) = written {
                tracing::warn!(server = %server, error = %e,
                    "a task's binding could not be shared: it is known to this replica only");
            }
        });
    }

    /// The task `task_id` on `server` when `client` created it, known here or
    /// to the fleet's shared store (then remembered here, with `facts`: what
    /// this replica's catalog knows of its tool).
    pub(crate) async fn owned_in_fleet(
        &self,
        server: &str,
        task_id: &str,
        client: &ClientId,
        facts: impl FnOnce(&str) -> CallFacts,
    ) -> Result<Option<Task>, Unavailable> {
        if let Some(task) = self.owned(server, task_id, client) {
            return Ok(Some(task));
        }
        let Some(text) = self.shared.task(server, task_id).await? else {
            return Ok(None);
        };
        let Ok(found) = serde_json::from_str::<Shared>(&text) else {
            return Ok(None);
        };
        let era = match found.e.as_str() {
            e if e == Era::Modern.as_str() => Era::Modern,
            e if e == Era::Legacy.as_str() => Era::Legacy,
            _ => return Ok(None),
        };
        let left = found.x - crate::util::time::now_ms();
        let mine = found.c == client.name()
            && found.a == client.is_anonymous()
            && found.u == client.is_unlisted();
        if !mine || left <= 0 {
            return Ok(None);
        }
        let facts = facts(&found.t);
        let created = Created {
            server,
            task_id,
            client,
            tool: &found.t,
            era,
            facts: &facts,
            ttl: None,
        };
        self.bind_here(
            &created,
            Duration::from_millis(left as u64).min(self.max_ttl),
        );
        Ok(self.owned(server, task_id, client))
    }

    /// Binds a task in this process only.
    fn bind_here(&self, c: &Created<'_>, ttl: Duration) {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let key = (c.server.to_owned(), c.task_id.to_owned());
        inner.drop_key(&key);
        let full = |inner: &Inner| {
            inner.held.get(c.client).copied().unwrap_or(0) >= self.per_client
                || inner.tasks.len() >= self.max
        };
        if full(&inner) {
            inner.purge_expired(now);
        }
        if inner.held.get(c.client).copied().unwrap_or(0) >= self.per_client {
            if let Some(k) = inner.oldest_of(c.client) {
                inner.drop_key(&k);
            }
        } else if inner.tasks.len() >= self.max {
            let most = inner
                .held
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(c, _)| c.clone());
            if let Some(k) = most.and_then(|m| inner.oldest_of(&m)) {
                inner.drop_key(&k);
            }
        }
        inner.seq += 1;
        let seq = inner.seq;
        *inner.held.entry(c.client.clone()).or_default() += 1;
        inner.tasks.insert(
            key,
            Task {
                client: c.client.clone(),
                tool: c.tool.to_owned(),
                era: c.era,
                facts: c.facts.clone(),
                expires: now + ttl,
                seq,
            },
        );
    }

    /// The task `task_id` on `server`, when `client` created it and it has not expired.
    pub(crate) fn owned(&self, server: &str, task_id: &str, client: &ClientId) -> Option<Task> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let key = (server.to_owned(), task_id.to_owned());
        match inner.tasks.get(&key) {
            Some(t) if t.expires <= Instant::now() => {
                inner.drop_key(&key);
                None
            }
            Some(t) if t.client == *client => Some(t.clone()),
            _ => None,
        }
    }

    /// Number of tasks tracked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tasks
            .len()
    }
}

/// What a task scope needs to know of the reply it serves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub server: &'a str,
    /// The called tool (a `tools/call` reply).
    pub tool: Option<&'a str>,
    pub era: Era,
    pub call: &'a CallFacts,
    pub sanitize: &'a SanitizeSettings,
}

/// The task side of one reply: whose tasks it may show, and whether it may
/// create one (a `tools/call`).
#[derive(Debug, Clone)]
pub(crate) struct TaskScope {
    pub store: Arc<TaskStore>,
    pub client: ClientId,
    /// The reply answers a `tools/call`: a task it creates is bound.
    pub creates: bool,
}

impl TaskScope {
    /// Binds the task a `tools/call` reply creates (what the client receives).
    pub(crate) fn learn(&self, to: &Reader<'_>, message: &Value) {
        let (true, Some(tool)) = (self.creates, to.tool) else {
            return;
        };
        let Some(result) = message.get("result").and_then(Value::as_object) else {
            return;
        };
        let (task, ttl_key) = match result.get("task") {
            // 2025-11-25: `CreateTaskResult {task: Task}`, ttl in ms (null: unlimited).
            Some(task @ Value::Object(_)) => (task, "ttl"),
            // 2026-07-28: the task's fields in the result itself.
            _ if result.get("resultType").and_then(Value::as_str) == Some("task") => {
                (message.get("result").unwrap_or(&Value::Null), "ttlMs")
            }
            _ => return,
        };
        let Some(task_id) = task.get("taskId").and_then(Value::as_str) else {
            return;
        };
        let ttl = task
            .get(ttl_key)
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        self.store.bind(Created {
            server: to.server,
            task_id,
            client: &self.client,
            tool,
            era: to.era,
            facts: to.call,
            ttl,
        });
    }

    /// True when `message` is a server message about a task that is not this
    /// client's (a status notification, or a message `_meta` relates to a
    /// task): it is not relayed.
    pub(crate) fn hides(&self, server: &str, message: &Value) -> bool {
        if message.get("method").is_none() {
            return false;
        }
        let params = message.get("params");
        let status = is_task_status(message);
        let named = if status {
            Some(params.and_then(|p| p.get("taskId")).and_then(Value::as_str))
        } else {
            params
                .and_then(|p| p.get("_meta"))
                .and_then(|m| m.get(RELATED_TASK))
                .map(|r| r.get("taskId").and_then(Value::as_str))
        };
        match named {
            None => false,
            Some(None) => true,
            Some(Some(id)) => self.store.owned(server, id, &self.client).is_none(),
        }
    }

    /// Sanitizes the task state `message` carries — every string and key of
    /// a `Task` (a CreateTaskResult of either era, a `tasks/get` or
    /// `tasks/cancel` answer, each task of a list, a status notification's
    /// params) except its nested `result`, which is judged whole by
    /// the recipient's task-result check or the tools/call checks. What it finds is
    /// added to `report`, so block mode sees secrets in a status message too.
    pub(crate) fn clean(&self, to: &Reader<'_>, message: &mut Value, report: &mut Report) {
        let sanitizer = Sanitizer::new(to.sanitize, to.call.skip);
        let mut task = |t: &mut Value| {
            if let Some(map) = t.as_object_mut().filter(|m| m.contains_key("taskId")) {
                for (k, v) in map.iter_mut() {
                    if k != "result" {
                        sanitizer.value(v, report);
                    }
                }
            }
        };
        if is_task_status(message) {
            if let Some(params) = message.get_mut("params") {
                task(params);
            }
            return;
        }
        let Some(result) = message.get_mut("result").filter(|r| r.is_object()) else {
            return;
        };
        if let Some(inner) = result.get_mut("task") {
            task(inner);
        }
        if let Some(Value::Array(list)) = result.get_mut("tasks") {
            list.iter_mut().for_each(&mut task);
        }
        task(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created<'a>(id: &'a str, client: &'a ClientId, facts: &'a CallFacts) -> Created<'a> {
        Created {
            server: "s",
            task_id: id,
            client,
            tool: "research",
            era: Era::Legacy,
            facts,
            ttl: None,
        }
    }

    #[test]
    fn a_task_is_its_creators_only() {
        let store = TaskStore::new(10, 10, Duration::from_secs(60));
        let (alice, bob) = (ClientId::named("alice"), ClientId::named("bob"));
        let facts = CallFacts::default();
        store.bind(created("t1", &alice, &facts));
        assert_eq!(
            store.owned("s", "t1", &alice).map(|t| t.tool),
            Some("research".into())
        );
        assert!(store.owned("s", "t1", &bob).is_none());
        assert!(store.owned("other", "t1", &alice).is_none());
        assert!(store.owned("s", "t2", &alice).is_none());
    }

    #[test]
    fn one_clients_flood_forgets_only_its_own_tasks() {
        let store = TaskStore::new(100, 3, Duration::from_secs(60));
        let (alice, mallory) = (ClientId::named("alice"), ClientId::named("mallory"));
        let facts = CallFacts::default();
        store.bind(created("alice-1", &alice, &facts));
        let ids: Vec<String> = (0..500).map(|i| format!("m-{i}")).collect();
        for id in &ids {
            store.bind(created(id, &mallory, &facts));
        }
        assert!(store.owned("s", "alice-1", &alice).is_some());
        assert_eq!(store.len(), 4);
        assert!(store.owned("s", "m-499", &mallory).is_some());
        assert!(store.owned("s", "m-496", &mallory).is_none());
    }

    #[test]
    fn a_binding_ends_with_the_tasks_ttl_or_the_gateways_maximum() {
        let store = TaskStore::new(10, 10, Duration::from_secs(60));
        let alice = ClientId::named("alice");
        let facts = CallFacts::default();
        let mut c = created("short", &alice, &facts);
        c.ttl = Some(Duration::ZERO);
        store.bind(c);
        assert!(store.owned("s", "short", &alice).is_none());
        let zero = TaskStore::new(10, 10, Duration::ZERO);
        zero.bind(created("long", &alice, &facts));
        assert!(zero.owned("s", "long", &alice).is_none());
    }

    #[test]
    fn task_methods_are_named_exactly() {
        assert_eq!(TaskMethod::of(Rpc::TasksGet), Some(TaskMethod::Get));
        assert_eq!(TaskMethod::of(Rpc::TasksUpdate), Some(TaskMethod::Update));
        assert_eq!(TaskMethod::of(Rpc::ToolsCall), None);
        assert_eq!(TaskMethod::of(Rpc::TasksStatus), None);
    }
}
