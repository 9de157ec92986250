//! What an upstream answers, whatever its transport: a [`Reply`] (JSON, an
//! SSE stream of events, nothing, or something else), or an
//! [`UpstreamError`] before it is attributed to a request.
//!
//! Place: beneath both transports (the pooled HTTP client and the stdio
//! child) and the pipeline that reads their answers. Invariant: upstream
//! text is carried raw here and sanitized before anyone sees it.

use std::pin::Pin;

use bytes::Bytes;
use futures_util::Stream;
use http::{HeaderMap, StatusCode};

use crate::error::UpstreamKind;
use crate::mcp::sse::SseItem;

/// A failed exchange with the upstream, before it is attributed to a request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpstreamError {
    pub kind: UpstreamKind,
    /// Gateway-written (never upstream text).
    pub reason: String,
    /// The upstream's own words, raw: sanitized before anyone sees them.
    pub snippet: Option<String>,
    /// True when the request certainly never reached the upstream.
    pub not_run: bool,
    /// True when the gateway's own bound refused to send it (a stdio
    /// server's table of requests in flight is full): no failure of the
    /// server's, so its breaker does not count it.
    pub busy: bool,
    /// With [`UpstreamKind::Refused`]: the upstream's JSON-RPC error object,
    /// raw (sanitized before it is relayed).
    pub error: Option<Box<serde_json::Value>>,
}

/// How the transport framed an answer. An HTTP upstream answers with a
/// status; a stdio server has none (its message is its whole answer), and
/// the gateway does not make one up for it: what the client gets is decided
/// where the reply is relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// The HTTP status the upstream answered with.
    Http(StatusCode),
    /// A message with no status of its own (stdio, or the gateway's own stream).
    Message,
}

impl Framing {
    /// The upstream failed (HTTP 5xx).
    pub(crate) fn is_server_error(self) -> bool {
        matches!(self, Framing::Http(s) if s.is_server_error())
    }

    /// A success: any HTTP 2xx, and every message without a status.
    pub(crate) fn is_success(self) -> bool {
        match self {
            Framing::Http(s) => s.is_success(),
            Framing::Message => true,
        }
    }

    /// The upstream's HTTP status, when it has one (recorded as `upstream_status`).
    pub(crate) fn code(self) -> Option<u16> {
        match self {
            Framing::Http(s) => Some(s.as_u16()),
            Framing::Message => None,
        }
    }

    /// The status the client gets: the upstream's, or `otherwise` for a
    /// message without one.
    pub(crate) fn or(self, otherwise: StatusCode) -> StatusCode {
        match self {
            Framing::Http(s) => s,
            Framing::Message => otherwise,
        }
    }

    /// How the answer is named in a gateway text: `HTTP 404 Not Found`, or
    /// `a message` for one without a status.
    pub(crate) fn words(self) -> String {
        match self {
            Framing::Http(s) => format!("HTTP {}", crate::error::status_words(s.as_u16())),
            Framing::Message => "a message".to_owned(),
        }
    }
}

/// What the upstream answered.
pub(crate) enum Reply {
    /// `application/json`, read whole (over stdio: the response line).
    Json {
        status: Framing,
        headers: HeaderMap,
        body: Bytes,
    },
    /// `text/event-stream`, still streaming (over stdio: the messages of
    /// the request, up to its response).
    Sse {
        status: Framing,
        headers: HeaderMap,
        events: SseStream,
    },
    /// No body (HTTP 202 for notifications, 204, …; over stdio, a
    /// notification or response taken).
    Empty { status: Framing, headers: HeaderMap },
    /// Anything else (an HTML error page, plain text): its body is never shown
    /// to clients as it is; at most a sanitized snippet of its text is quoted.
    Other {
        status: StatusCode,
        headers: HeaderMap,
        /// The first [`OTHER_BODY_BYTES`] of the body, as text, when it is text.
        text: Option<String>,
    },
}

/// How much of a non-JSON body is kept to quote from.
pub(crate) const OTHER_BODY_BYTES: usize = 4096;

/// Events of an upstream SSE response.
pub(crate) type SseStream = Pin<Box<dyn Stream<Item = Result<SseItem, UpstreamError>> + Send>>;

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Json { status, .. } => write!(f, "Reply::Json({status:?})"),
            Reply::Sse { status, .. } => write!(f, "Reply::Sse({status:?})"),
            Reply::Empty { status, .. } => write!(f, "Reply::Empty({status:?})"),
            Reply::Other { status, .. } => write!(f, "Reply::Other({status})"),
        }
    }
}

impl UpstreamError {
    pub(crate) fn new(kind: UpstreamKind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
            snippet: None,
            not_run: false,
            busy: false,
            error: None,
        }
    }

    /// No credential could be had for the caller: nothing was sent.
    pub(crate) fn credentials(e: crate::identity::CredentialError) -> Self {
        let mut err = Self::new(
            UpstreamKind::Credentials {
                retry_helps: e.retry_helps,
            },
            e.reason,
        );
        err.not_run = true;
        err
    }

    /// With the upstream's own words (raw; sanitized later).
    pub(crate) fn with_snippet(mut self, text: Option<String>) -> Self {
        self.snippet = text;
        self
    }
}
