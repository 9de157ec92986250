//! A client's message typed once: what it asks ([`Ask`]), with the fields the
//! rules judge moved out of its `params`.
//!
//! Place in the path: classification ([`super::jsonrpc::Message`]) → era →
//! method table ([`super::methods::Called`]) → here. From then on the
//! pipeline reads a client's message only through a [`Request`]: the tool
//! and its arguments, the resource's URI, the prompt, the completion's
//! reference, the subscribed URIs, the task id, the list cursor, the
//! `initialize` version and capabilities, the request a cancellation names,
//! a tool call's input round ([`Round`]: `requestState`, `inputResponses`,
//! the approval id it names), and the few `_meta` facts it uses — never a
//! parameter by its key, never the method by its name.
//!
//! Invariants: pure. The judged fields are moved out of the parsed params,
//! not copied (arguments can be large), and [`Request::to_value`] puts each
//! back where it came from: the message forwarded is the message judged
//! (`re_serialises_to_the_parsed_message`). A field a method cannot go
//! without (a tool's or prompt's `name`, a resource's `uri`, a completion's
//! `ref`, the URIs a listen subscribes to) is refused here, with the path of
//! the field, when it is missing or of the wrong type. A field the pipeline
//! refuses in its own words later (a cursor, a task id, arguments of the
//! wrong type) is kept as it came.

use serde_json::{Map, Value};

use super::jsonrpc::Message;
use super::methods::{Called, Class, ListKind, Method};

mod round;

#[cfg(test)]
pub(crate) use round::META_APPROVAL_ID;
pub(crate) use round::{NO_ROUND, Round};

/// `_meta` key of the 2026-era client capabilities.
pub(crate) const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// The `_meta` prefix of the keys the protocol itself defines.
const META_PROTOCOL_PREFIX: &str = "io.modelcontextprotocol/";

/// What a client's message asks, by its class.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ask {
    /// `tools/call`, or an operator's method of class tool.
    Tool {
        name: String,
        /// As sent: an object, or anything else the checks refuse.
        arguments: Option<Value>,
        /// What it carries of an input round, judged by the approval gate.
        round: Round,
    },
    /// `prompts/get`, or an operator's method of class prompt.
    Prompt {
        name: String,
        arguments: Option<Value>,
    },
    /// `resources/read`, `resources/subscribe`, `resources/unsubscribe`, or an
    /// operator's method of class resource: the URI as the client spelled it
    /// (canonicalized by the pipeline's resource step).
    Resource { uri: String },
    /// `completion/complete`.
    Completion { reference: Reference },
    /// `subscriptions/listen`.
    Subscription {
        /// `notifications.resourceSubscriptions`, when present.
        uris: Option<Vec<String>>,
        /// `notifications.toolsListChanged` is `true`.
        tools_list_changed: bool,
    },
    /// A task method: the task it names (a string, or nothing) and, for
    /// `tasks/list`, the cursor it sent.
    Task {
        task_id: Option<String>,
        cursor: Option<Value>,
    },
    /// One of the four lists, with the cursor the client sent.
    List {
        kind: ListKind,
        cursor: Option<Value>,
    },
    /// `notifications/cancelled`, with the id of the request it gives up.
    Cancel { request_id: Option<Value> },
    /// `initialize`, with the version the client asked for and the
    /// capabilities it declared.
    Initialize {
        protocol_version: Option<Value>,
        capabilities: Option<Value>,
    },
    /// Every other request or notification: nothing in its params is judged.
    Plain,
    /// A client's answer to a server's request.
    Response,
}

/// What a `completion/complete` completes an argument of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reference {
    /// `ref/prompt`, by name.
    Prompt { name: String },
    /// `ref/resource`, by URI or URI template.
    Resource { uri: String },
}

/// Why a client's message cannot be typed: the text of the -32602 refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Untyped(pub(crate) String);

/// A client's message, typed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    id: Option<Value>,
    /// The method's name as received (`None`: a response).
    name: Option<String>,
    called: Option<Called>,
    ask: Ask,
    /// The params left once the judged fields were moved out.
    rest: Option<Map<String, Value>>,
}

impl Request {
    /// Types `message`, whose method the table typed `called` (`None` for a
    /// response), moving the judged fields out of its params.
    pub(crate) fn typed(message: Message, called: Option<Called>) -> Result<Self, Untyped> {
        let (id, name, params) = match message {
            Message::Request { id, method, params } => (Some(id), Some(method), params),
            Message::Notification { method, params } => (None, Some(method), params),
            Message::Response { id } => (Some(id), None, None),
        };
        let mut request = Request {
            id,
            name,
            called,
            ask: Ask::Response,
            rest: params,
        };
        request.ask = request.take_ask()?;
        Ok(request)
    }

    /// The gateway's own request for the first page of a list, carrying the
    /// protocol's `_meta` keys of `client` (2026 era: `with_meta`).
    pub(crate) fn own_list(id: Value, kind: ListKind, client: &Request, with_meta: bool) -> Self {
        let mut params = Map::new();
        if with_meta && client.meta().is_some() {
            params.insert("_meta".into(), Value::Object(client.protocol_meta()));
        }
        let method = kind.method();
        Request {
            id: Some(id),
            name: Some(method.name().to_owned()),
            called: super::methods::TABLE
                .iter()
                .find(|e| e.method == method)
                .copied()
                .map(Called::Spec),
            ask: Ask::List { kind, cursor: None },
            rest: Some(params),
        }
    }

    fn take_ask(&mut self) -> Result<Ask, Untyped> {
        let Some(called) = &self.called else {
            return Ok(Ask::Response);
        };
        let method = called.method();
        Ok(match called.class() {
            Class::Tool => Ask::Tool {
                name: self.take_string("name")?,
                arguments: self.take("arguments"),
                round: self.rest.as_mut().map(Round::take).unwrap_or_default(),
            },
            Class::Prompt => Ask::Prompt {
                name: self.take_string("name")?,
                arguments: self.take("arguments"),
            },
            Class::Resource => Ask::Resource {
                uri: self.take_string("uri")?,
            },
            Class::Completion => Ask::Completion {
                reference: self.take_reference()?,
            },
            Class::Subscription => self.take_subscription()?,
            Class::Task => Ask::Task {
                task_id: self
                    .take_if("taskId", Value::is_string)
                    .and_then(into_string),
                cursor: self.take("cursor"),
            },
            Class::List(kind) => Ask::List {
                kind,
                cursor: self.take("cursor"),
            },
            Class::Lifecycle if method == Some(Method::Initialize) => Ask::Initialize {
                protocol_version: self.take("protocolVersion"),
                capabilities: self.take("capabilities"),
            },
            Class::Notification if method == Some(Method::Cancelled) => Ask::Cancel {
                request_id: self.take("requestId"),
            },
            Class::Lifecycle | Class::Notification | Class::ClientFeature => Ask::Plain,
        })
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.rest.as_mut()?.remove(key)
    }

    fn take_if(&mut self, key: &str, fits: impl Fn(&Value) -> bool) -> Option<Value> {
        let params = self.rest.as_mut()?;
        params.get(key).filter(|v| fits(v))?;
        params.remove(key)
    }

    fn needs(&self, path: &str, what: &str) -> Untyped {
        Untyped(format!(
            "{} needs params.{path}, {what}",
            self.method_name()
        ))
    }

    fn take_string(&mut self, key: &str) -> Result<String, Untyped> {
        self.take_if(key, Value::is_string)
            .and_then(into_string)
            .ok_or_else(|| self.needs(key, "a string"))
    }

    fn take_reference(&mut self) -> Result<Reference, Untyped> {
        let wrong = || {
            Untyped(
                "completion/complete needs params.ref of type ref/prompt or ref/resource".into(),
            )
        };
        let reference = self.rest.as_mut().and_then(|p| p.get_mut("ref"));
        let Some(Value::Object(reference)) = reference else {
            return Err(wrong());
        };
        let (key, prompt) = match reference.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => ("name", true),
            Some("ref/resource") => ("uri", false),
            _ => return Err(wrong()),
        };
        match reference.get(key) {
            Some(Value::String(_)) => {}
            _ => return Err(self.needs(&format!("ref.{key}"), "a string")),
        }
        let value = reference
            .remove(key)
            .and_then(into_string)
            .unwrap_or_default();
        Ok(match prompt {
            true => Reference::Prompt { name: value },
            false => Reference::Resource { uri: value },
        })
    }

    fn take_subscription(&mut self) -> Result<Ask, Untyped> {
        let invalid = || {
            Untyped(
                "subscriptions/listen needs params.notifications.resourceSubscriptions to be a list of URI strings"
                    .into(),
            )
        };
        let notifications = self
            .rest
            .as_mut()
            .and_then(|p| p.get_mut("notifications"))
            .and_then(Value::as_object_mut);
        let Some(notifications) = notifications else {
            return Ok(Ask::Subscription {
                uris: None,
                tools_list_changed: false,
            });
        };
        let tools_list_changed = notifications.get("toolsListChanged") == Some(&Value::Bool(true));
        let uris = match notifications.get("resourceSubscriptions") {
            None => None,
            Some(Value::Array(uris)) if uris.iter().all(Value::is_string) => {
                let taken = notifications.remove("resourceSubscriptions");
                let Some(Value::Array(uris)) = taken else {
                    return Err(invalid());
                };
                Some(uris.into_iter().filter_map(into_string).collect())
            }
            Some(_) => return Err(invalid()),
        };
        Ok(Ask::Subscription {
            uris,
            tools_list_changed,
        })
    }

    // === what the pipeline reads ===

    /// What the message asks.
    pub(crate) fn ask(&self) -> &Ask {
        &self.ask
    }

    /// The method as the table typed it (`None`: a response).
    pub(crate) fn called(&self) -> Option<&Called> {
        self.called.as_ref()
    }

    /// The method of the specification, when it is one.
    pub(crate) fn method(&self) -> Option<Method> {
        self.called.as_ref().and_then(Called::method)
    }

    /// The method's name as received, for messages and the audit.
    pub(crate) fn method_name(&self) -> &str {
        self.name.as_deref().unwrap_or("(response)")
    }

    /// The id, for requests (and responses).
    pub(crate) fn id(&self) -> Option<&Value> {
        self.id.as_ref()
    }

    /// True for a notification (no id, a method).
    pub(crate) fn is_notification(&self) -> bool {
        self.id.is_none()
    }

    /// The tool a tool call names.
    pub(crate) fn tool(&self) -> Option<&str> {
        match &self.ask {
            Ask::Tool { name, .. } => Some(name),
            _ => None,
        }
    }

    /// A tool call's or prompt's arguments as sent.
    pub(crate) fn arguments(&self) -> Option<&Value> {
        match &self.ask {
            Ask::Tool { arguments, .. } | Ask::Prompt { arguments, .. } => arguments.as_ref(),
            _ => None,
        }
    }

    /// The params the rules do not judge (`_meta` and whatever else the
    /// client sent), forwarded as they came; read through the accessors
    /// above, never by key.
    #[cfg(test)]
    pub(crate) fn unjudged(&self) -> Option<&Map<String, Value>> {
        self.rest.as_ref()
    }

    /// `params._meta[key]`, when a string.
    pub(crate) fn meta_str(&self, key: &str) -> Option<&str> {
        self.meta()?.get(key)?.as_str()
    }

    /// `params._meta[key]`.
    pub(crate) fn meta_value(&self, key: &str) -> Option<&Value> {
        self.meta()?.get(key)
    }

    fn meta(&self) -> Option<&Map<String, Value>> {
        self.rest.as_ref()?.get("_meta")?.as_object()
    }

    /// The `_meta` keys the protocol defines (version, capabilities, client
    /// information), which the 2026 era requires on every request.
    pub(crate) fn protocol_meta(&self) -> Map<String, Value> {
        self.meta()
            .map(|meta| {
                meta.iter()
                    .filter(|(k, _)| k.starts_with(META_PROTOCOL_PREFIX))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What a tool call carries of an input round ([`NO_ROUND`] for any
    /// other message).
    pub(crate) fn round(&self) -> &Round {
        match &self.ask {
            Ask::Tool { round, .. } => round,
            _ => &NO_ROUND,
        }
    }

    // === what the pipeline changes before forwarding ===

    /// The same request naming `name` instead (the merged view's tool or
    /// prompt, or completion's prompt, as its server knows it).
    pub(crate) fn renamed(mut self, inner: &str) -> Self {
        match &mut self.ask {
            Ask::Tool { name, .. }
            | Ask::Prompt { name, .. }
            | Ask::Completion {
                reference: Reference::Prompt { name },
            } => *name = inner.to_owned(),
            _ => {}
        }
        self
    }

    /// The resource, completion or subscription URIs replaced by `uris` (the
    /// canonical forms the pipeline decided on); true when anything changed.
    pub(crate) fn set_uris(&mut self, uris: &[&str]) -> bool {
        match &mut self.ask {
            Ask::Resource { uri }
            | Ask::Completion {
                reference: Reference::Resource { uri },
            } => match uris {
                [decided] if uri != decided => {
                    *uri = (*decided).to_owned();
                    true
                }
                _ => false,
            },
            Ask::Subscription { uris: sent, .. } => {
                let unchanged = match sent {
                    Some(sent) => {
                        sent.len() == uris.len() && sent.iter().zip(uris).all(|(a, b)| a == b)
                    }
                    None => uris.is_empty(),
                };
                if !unchanged {
                    *sent = Some(uris.iter().map(|u| (*u).to_owned()).collect());
                }
                !unchanged
            }
            _ => false,
        }
    }

    /// The message as forwarded: a tool call with `round` in place of the
    /// round it carried (the one the approval decided to forward), and an
    /// `_meta` left empty not sent; any other message as [`Request::to_value`].
    pub(crate) fn forwarded_with(&self, round: &Round) -> Value {
        self.serialise(Some(round))
    }

    /// The canonical bytes ([`crate::util::canonical`]) of
    /// [`Request::forwarded_with`]: the same bytes, with a tool call's
    /// arguments written from where they are instead of copied into a
    /// value first (they can be large).
    pub(crate) fn forwarded_bytes(&self, round: &Round) -> Vec<u8> {
        use crate::util::canonical;
        if let Ask::Tool {
            arguments: Some(arguments),
            ..
        } = &self.ask
        {
            let skeleton = self.serialise_as(Some(round), false);
            let member = ("arguments", arguments);
            if let Some(bytes) = canonical::to_vec_with(&skeleton, &["params"], member) {
                return bytes;
            }
        }
        canonical::to_vec(&self.forwarded_with(round))
    }

    /// The message as a JSON value again, each judged field back where it
    /// came from; `round` (a tool call's) replaces the round it carried.
    fn serialise(&self, round: Option<&Round>) -> Value {
        self.serialise_as(round, true)
    }

    /// [`Request::serialise`], a tool call's arguments left out unless
    /// `with_arguments`.
    fn serialise_as(&self, round: Option<&Round>, with_arguments: bool) -> Value {
        let mut v = Map::new();
        v.insert("jsonrpc".into(), "2.0".into());
        if let Some(id) = &self.id {
            v.insert("id".into(), id.clone());
        }
        let Some(name) = &self.name else {
            return Value::Object(v);
        };
        v.insert("method".into(), name.as_str().into());
        let had_params = self.rest.is_some();
        let mut params = self.rest.clone().unwrap_or_default();
        let put = |params: &mut Map<String, Value>, key: &str, value: Option<&Value>| {
            if let Some(value) = value {
                params.insert(key.to_owned(), value.clone());
            }
        };
        match &self.ask {
            Ask::Tool {
                name,
                arguments,
                round: sent,
            } => {
                params.insert("name".into(), name.as_str().into());
                if with_arguments {
                    put(&mut params, "arguments", arguments.as_ref());
                }
                match round {
                    Some(forwarded) => {
                        forwarded.put(&mut params);
                        round::drop_empty_meta(&mut params);
                    }
                    None => sent.put(&mut params),
                }
            }
            Ask::Prompt { name, arguments } => {
                params.insert("name".into(), name.as_str().into());
                put(&mut params, "arguments", arguments.as_ref());
            }
            Ask::Resource { uri } => {
                params.insert("uri".into(), uri.as_str().into());
            }
            Ask::Completion { reference } => {
                let (key, value) = match reference {
                    Reference::Prompt { name } => ("name", name),
                    Reference::Resource { uri } => ("uri", uri),
                };
                if let Some(Value::Object(r)) = params.get_mut("ref") {
                    r.insert(key.into(), value.as_str().into());
                }
            }
            Ask::Subscription { uris, .. } => {
                if let Some(uris) = uris {
                    let notifications = params
                        .entry("notifications")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(n) = notifications {
                        n.insert("resourceSubscriptions".into(), uris.clone().into());
                    }
                }
            }
            Ask::Task { task_id, cursor } => {
                put(
                    &mut params,
                    "taskId",
                    task_id.clone().map(Value::from).as_ref(),
                );
                put(&mut params, "cursor", cursor.as_ref());
            }
            Ask::List { cursor, .. } => put(&mut params, "cursor", cursor.as_ref()),
            Ask::Cancel { request_id } => put(&mut params, "requestId", request_id.as_ref()),
            Ask::Initialize {
                protocol_version,
                capabilities,
            } => {
                put(&mut params, "protocolVersion", protocol_version.as_ref());
                put(&mut params, "capabilities", capabilities.as_ref());
            }
            Ask::Plain | Ask::Response => {}
        }
        if had_params || !params.is_empty() {
            v.insert("params".into(), Value::Object(params));
        }
        Value::Object(v)
    }

    /// The message as a JSON value again.
    pub(crate) fn to_value(&self) -> Value {
        self.serialise(None)
    }
}

fn into_string(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests;
