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
    /// With [`UpstreamKind::Refused`]: the upstream's JSON-RPC error object,
    /// raw (sanitized before it is relayed).
    pub error: Option<Box<serde_json::Value>>,
}

/// What the upstream answered.
pub(crate) enum Reply {
    /// `application/json`, read whole.
    Json {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// `text/event-stream`, still streaming.
    Sse {
        status: StatusCode,
        headers: HeaderMap,
        events: SseStream,
    },
    /// No body (202 for notifications, 204, …).
    Empty {
        status: StatusCode,
        headers: HeaderMap,
    },
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
            Reply::Json { status, .. } => write!(f, "Reply::Json({status})"),
            Reply::Sse { status, .. } => write!(f, "Reply::Sse({status})"),
            Reply::Empty { status, .. } => write!(f, "Reply::Empty({status})"),
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
            error: None,
        }
    }

    /// With the upstream's own words (raw; sanitized later).
    pub(crate) fn with_snippet(mut self, text: Option<String>) -> Self {
        self.snippet = text;
        self
    }
}
