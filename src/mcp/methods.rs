//! Every JSON-RPC method MCP defines, in one closed table, and the typed value a
//! message's method becomes once it has been looked up in it.
//!
//! Place in the path: right after classification and era negotiation, the
//! pipeline turns the method string of a client's message into a [`Called`]
//! (or refuses it), and dispatches on that value alone; on the way back, every
//! message an upstream sends with a `method` is looked up in the same table
//! for the server→client direction.
//!
//! Invariants: pure — no I/O, no configuration other than the operator's
//! extras handed in. Names match exactly (case-sensitive: `Tools/call` is not
//! `tools/call`). A method is known only in the direction, the kind (request
//! or notification) and the era the specification gives it: `resources/subscribe`
//! exists in 2025-11-25 and not in 2026-07-28, `tools/call` sent as a
//! notification is not a `tools/call`. Whatever is not in the table is
//! unknown, and unknown is refused — unless the operator named the method in
//! `[methods]` with the class whose rules it must pass. An operator cannot
//! reclassify a method of the table.
//!
//! Sources: `schema/2025-11-25/schema.ts` (`ClientRequest`, `ClientNotification`,
//! `ServerRequest`, `ServerNotification`, the experimental tasks of that
//! revision), `schema/2026-07-28/schema.ts` and the `io.modelcontextprotocol/tasks`
//! extension of 2026-07-28 (`tasks/get`, `tasks/update`, `tasks/cancel`,
//! `notifications/tasks`). The legacy era is 2024-11-05 … 2025-11-25; the
//! older revisions define a subset of 2025-11-25's methods.

use std::collections::BTreeMap;
use std::fmt;

use super::version::Era;

/// Who sends the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Client → server (what the gateway receives on its listener).
    ClientToServer,
    /// Server → client (what an upstream sends back).
    ServerToClient,
}

/// Whether the message expects an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Request,
    Notification,
}

/// The eras a method exists in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eras {
    /// Handshake era only (2024-11-05 … 2025-11-25).
    Legacy,
    /// 2026-07-28 only.
    Modern,
    /// Both.
    Both,
}

impl Eras {
    /// True when a method of these eras exists in `era`.
    pub(crate) fn has(self, era: Era) -> bool {
        matches!(
            (self, era),
            (Eras::Both, _) | (Eras::Legacy, Era::Legacy) | (Eras::Modern, Era::Modern)
        )
    }
}

/// Which of the four lists a list method asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListKind {
    Tools,
    Resources,
    Templates,
    Prompts,
}

impl ListKind {
    /// The list method of this kind.
    pub(crate) fn method(self) -> Method {
        match self {
            ListKind::Tools => Method::ToolsList,
            ListKind::Resources => Method::ResourcesList,
            ListKind::Templates => Method::ResourcesTemplatesList,
            ListKind::Prompts => Method::PromptsList,
        }
    }

    /// The result key holding the items.
    pub(crate) fn key(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Resources => "resources",
            ListKind::Templates => "resourceTemplates",
            ListKind::Prompts => "prompts",
        }
    }
}

/// What a method does, which decides the rules it must pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Session and protocol plumbing (`initialize`, `ping`, `server/discover`,
    /// `logging/setLevel`): no rule applies.
    Lifecycle,
    /// One of the four lists the gateway collects and filters per client.
    List(ListKind),
    /// Acts on the tool named in `params.name`: tool rules.
    Tool,
    /// Acts on the resource in `params.uri`: resource rules.
    Resource,
    /// Acts on the prompt named in `params.name`: prompt rules.
    Prompt,
    /// `completion/complete`: the rules of the prompt or resource in `params.ref`.
    Completion,
    /// `subscriptions/listen`: the resource rules of every subscribed URI.
    Subscription,
    /// Acts on a task by `params.taskId` (or lists tasks).
    Task,
    /// A server asks the client for something (sampling, elicitation, roots).
    ClientFeature,
    /// Expects no answer and changes nothing the rules govern.
    Notification,
}

impl Class {
    /// The classes an operator may give a method of their own, as written in
    /// `[methods]`.
    pub(crate) const NAMEABLE: &'static [(&'static str, Class)] = &[
        ("tool", Class::Tool),
        ("resource", Class::Resource),
        ("prompt", Class::Prompt),
        ("task", Class::Task),
        ("lifecycle", Class::Lifecycle),
        ("notification", Class::Notification),
    ];

    /// The class as written in `[methods]`.
    pub(crate) fn named(text: &str) -> Option<Class> {
        Self::NAMEABLE
            .iter()
            .find(|(name, _)| *name == text)
            .map(|(_, c)| *c)
    }

    /// Label for `portcullis check` and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Class::Lifecycle => "lifecycle",
            Class::List(_) => "list",
            Class::Tool => "tool",
            Class::Resource => "resource",
            Class::Prompt => "prompt",
            Class::Completion => "completion",
            Class::Subscription => "subscription",
            Class::Task => "task",
            Class::ClientFeature => "client feature",
            Class::Notification => "notification",
        }
    }
}

macro_rules! methods {
    ($($variant:ident = $name:literal),* $(,)?) => {
        /// A method of the specification (either era, either direction).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum Method {
            $($variant),*
        }

        impl Method {
            /// Every method of the table.
            #[cfg(test)]
            pub(crate) const ALL: &'static [Method] = &[$(Method::$variant),*];

            /// The method's name on the wire.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Method::$variant => $name),*
                }
            }

            /// The method named exactly `name`.
            pub(crate) fn of(name: &str) -> Option<Method> {
                match name {
                    $($name => Some(Method::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

methods! {
    Initialize = "initialize",
    Ping = "ping",
    ServerDiscover = "server/discover",
    LoggingSetLevel = "logging/setLevel",
    CompletionComplete = "completion/complete",
    ToolsList = "tools/list",
    ToolsCall = "tools/call",
    ResourcesList = "resources/list",
    ResourcesTemplatesList = "resources/templates/list",
    ResourcesRead = "resources/read",
    ResourcesSubscribe = "resources/subscribe",
    ResourcesUnsubscribe = "resources/unsubscribe",
    PromptsList = "prompts/list",
    PromptsGet = "prompts/get",
    SubscriptionsListen = "subscriptions/listen",
    TasksGet = "tasks/get",
    TasksResult = "tasks/result",
    TasksList = "tasks/list",
    TasksCancel = "tasks/cancel",
    TasksUpdate = "tasks/update",
    SamplingCreateMessage = "sampling/createMessage",
    ElicitationCreate = "elicitation/create",
    RootsList = "roots/list",
    Initialized = "notifications/initialized",
    Cancelled = "notifications/cancelled",
    Progress = "notifications/progress",
    Message = "notifications/message",
    RootsListChanged = "notifications/roots/list_changed",
    ResourcesUpdated = "notifications/resources/updated",
    ResourcesListChanged = "notifications/resources/list_changed",
    ToolsListChanged = "notifications/tools/list_changed",
    PromptsListChanged = "notifications/prompts/list_changed",
    ElicitationComplete = "notifications/elicitation/complete",
    TasksStatus = "notifications/tasks/status",
    Tasks = "notifications/tasks",
    SubscriptionsAcknowledged = "notifications/subscriptions/acknowledged",
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One row of the table: a method as one side may send it in some eras.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub method: Method,
    pub direction: Direction,
    pub kind: Kind,
    pub eras: Eras,
    pub class: Class,
}

const fn row(method: Method, direction: Direction, kind: Kind, eras: Eras, class: Class) -> Entry {
    Entry {
        method,
        direction,
        kind,
        eras,
        class,
    }
}

use Class as C;
use Direction::{ClientToServer as Up, ServerToClient as Down};
use Eras::{Both, Legacy, Modern};
use Kind::{Notification as Note, Request as Req};
use Method as M;

/// Every message of both eras. A method may have several rows (`ping` and the
/// 2025-11-25 `tasks/*` go both ways; `tasks/get` exists in both eras).
pub(crate) const TABLE: &[Entry] = &[
    // Client → server requests.
    row(M::Initialize, Up, Req, Legacy, C::Lifecycle),
    row(M::Ping, Up, Req, Legacy, C::Lifecycle),
    row(M::ServerDiscover, Up, Req, Modern, C::Lifecycle),
    // A session-wide setting; 2026-07-28 sets the level per request in `_meta`.
    row(M::LoggingSetLevel, Up, Req, Legacy, C::Lifecycle),
    row(M::CompletionComplete, Up, Req, Both, C::Completion),
    row(M::ToolsList, Up, Req, Both, C::List(ListKind::Tools)),
    row(M::ToolsCall, Up, Req, Both, C::Tool),
    row(
        M::ResourcesList,
        Up,
        Req,
        Both,
        C::List(ListKind::Resources),
    ),
    row(
        M::ResourcesTemplatesList,
        Up,
        Req,
        Both,
        C::List(ListKind::Templates),
    ),
    row(M::ResourcesRead, Up, Req, Both, C::Resource),
    row(M::ResourcesSubscribe, Up, Req, Legacy, C::Resource),
    row(M::ResourcesUnsubscribe, Up, Req, Legacy, C::Resource),
    row(M::PromptsList, Up, Req, Both, C::List(ListKind::Prompts)),
    row(M::PromptsGet, Up, Req, Both, C::Prompt),
    row(M::SubscriptionsListen, Up, Req, Modern, C::Subscription),
    // Tasks: experimental core in 2025-11-25; the io.modelcontextprotocol/tasks
    // extension in 2026-07-28 (no tasks/result, no tasks/list; tasks/update).
    row(M::TasksGet, Up, Req, Both, C::Task),
    row(M::TasksResult, Up, Req, Legacy, C::Task),
    row(M::TasksList, Up, Req, Legacy, C::Task),
    row(M::TasksCancel, Up, Req, Both, C::Task),
    row(M::TasksUpdate, Up, Req, Modern, C::Task),
    // Client → server notifications.
    row(M::Initialized, Up, Note, Legacy, C::Lifecycle),
    row(M::Cancelled, Up, Note, Both, C::Notification),
    row(M::Progress, Up, Note, Legacy, C::Notification),
    row(M::RootsListChanged, Up, Note, Legacy, C::Notification),
    row(M::TasksStatus, Up, Note, Legacy, C::Notification),
    // Server → client requests: the handshake era only; 2026-07-28 carries
    // sampling, elicitation and roots inside `input_required` results instead.
    row(M::Ping, Down, Req, Legacy, C::Lifecycle),
    row(
        M::SamplingCreateMessage,
        Down,
        Req,
        Legacy,
        C::ClientFeature,
    ),
    row(M::ElicitationCreate, Down, Req, Legacy, C::ClientFeature),
    row(M::RootsList, Down, Req, Legacy, C::ClientFeature),
    row(M::TasksGet, Down, Req, Legacy, C::Task),
    row(M::TasksResult, Down, Req, Legacy, C::Task),
    row(M::TasksList, Down, Req, Legacy, C::Task),
    row(M::TasksCancel, Down, Req, Legacy, C::Task),
    // Server → client notifications.
    row(M::Cancelled, Down, Note, Both, C::Notification),
    row(M::Progress, Down, Note, Both, C::Notification),
    row(M::Message, Down, Note, Both, C::Notification),
    row(M::ResourcesUpdated, Down, Note, Both, C::Notification),
    row(M::ResourcesListChanged, Down, Note, Both, C::Notification),
    row(M::ToolsListChanged, Down, Note, Both, C::Notification),
    row(M::PromptsListChanged, Down, Note, Both, C::Notification),
    row(M::ElicitationComplete, Down, Note, Legacy, C::Notification),
    row(M::TasksStatus, Down, Note, Legacy, C::Notification),
    row(M::Tasks, Down, Note, Modern, C::Notification),
    row(
        M::SubscriptionsAcknowledged,
        Down,
        Note,
        Modern,
        C::Notification,
    ),
];

/// The row of `name` for a message of this direction, kind and era.
pub(crate) fn entry(name: &str, direction: Direction, kind: Kind, era: Era) -> Option<Entry> {
    let method = Method::of(name)?;
    TABLE
        .iter()
        .find(|e| {
            e.method == method && e.direction == direction && e.kind == kind && e.eras.has(era)
        })
        .copied()
}

/// A client's method as the gateway understood it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Called {
    /// A method of the table, valid in this direction, kind and era.
    Spec(Entry),
    /// A method the operator named in `[methods]`, with its class.
    Extra { name: String, class: Class },
}

impl Called {
    /// The class whose rules apply.
    pub(crate) fn class(&self) -> Class {
        match self {
            Called::Spec(e) => e.class,
            Called::Extra { class, .. } => *class,
        }
    }

    /// The method of the table, when it is one.
    pub(crate) fn method(&self) -> Option<Method> {
        match self {
            Called::Spec(e) => Some(e.method),
            Called::Extra { .. } => None,
        }
    }
}

/// Methods the operator named in `[methods]`, each with its class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Extras(BTreeMap<String, Class>);

/// Why a name cannot be an operator's method.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ExtraError {
    #[error("a method name cannot be empty")]
    Empty,
    #[error(
        "a method name is visible ASCII (no spaces, no control characters) and at most 256 bytes"
    )]
    Form,
    #[error(
        "`{0}` is a method of the MCP specification; its class is fixed by the gateway and cannot be named here"
    )]
    Spec(String),
    #[error("unknown class {0:?}; expected one of {1}")]
    Class(String, String),
}

impl Extras {
    /// Adds `name` with the class written `class`.
    pub(crate) fn add(&mut self, name: &str, class: &str) -> Result<(), ExtraError> {
        if name.is_empty() {
            return Err(ExtraError::Empty);
        }
        if name.len() > 256 || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ExtraError::Form);
        }
        if Method::of(name).is_some() {
            return Err(ExtraError::Spec(name.to_owned()));
        }
        let Some(class) = Class::named(class) else {
            let expected = Class::NAMEABLE
                .iter()
                .map(|(n, _)| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ExtraError::Class(class.to_owned(), expected));
        };
        self.0.insert(name.to_owned(), class);
        Ok(())
    }

    /// The operator's methods, by name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, Class)> {
        self.0.iter().map(|(n, c)| (n.as_str(), *c))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn get(&self, name: &str) -> Option<Class> {
        self.0.get(name).copied()
    }
}

/// A client's message with method `name`, of `kind`, in `era`: what it is, or
/// `None` when the gateway does not know it (the caller refuses it with -32601).
///
/// An operator's method of class notification is taken as a notification
/// only; of any other class, as a request only.
pub(crate) fn client_call(name: &str, kind: Kind, era: Era, extras: &Extras) -> Option<Called> {
    if let Some(entry) = entry(name, Direction::ClientToServer, kind, era) {
        return Some(Called::Spec(entry));
    }
    if Method::of(name).is_some() {
        // A method of the specification out of its era or kind is not an extra.
        return None;
    }
    let class = extras.get(name)?;
    let fits = (class == Class::Notification) == (kind == Kind::Notification);
    fits.then(|| Called::Extra {
        name: name.to_owned(),
        class,
    })
}

/// A message an upstream sent with method `name`: its row, or `None` when
/// the specification defines no such message from a server in `era`.
pub(crate) fn server_message(name: &str, kind: Kind, era: Era) -> Option<Entry> {
    entry(name, Direction::ServerToClient, kind, era)
}

/// The method of the specification an upstream's message names (`None`: a
/// response, or a name the table does not have): its method looked up in the
/// table once, wherever the message is read.
pub(crate) fn named_in(message: &serde_json::Value) -> Option<Method> {
    message.get("method")?.as_str().and_then(Method::of)
}

/// True when an upstream's message says its tool list changed: the one test
/// of it, whatever the transport the message came by.
pub(crate) fn tool_list_changed(message: &serde_json::Value) -> bool {
    named_in(message) == Some(Method::ToolsListChanged)
}

#[cfg(test)]
mod tests;
