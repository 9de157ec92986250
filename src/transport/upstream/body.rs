//! Reading an upstream's reply body, whichever client brought it: chunk by
//! chunk, as an SSE stream decoded event by event, and the gateway's words for
//! a transport failure or an HTML error page.
//!
//! Place: under [`super::Connection`], between the connection and the
//! [`Reply`](crate::transport::reply::Reply) the pipeline reads.
//!
//! Invariants: each SSE event is capped and the gap between two events is
//! bounded (long-lived listen streams excepted); a body that breaks off is an
//! upstream failure, never a truncated reply passed on; an upstream's text is
//! never quoted whole.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;

use crate::error::UpstreamKind;
use crate::mcp::sse::{SseDecoder, SseItem};
use crate::transport::reply::{SseStream, UpstreamError};
use crate::util::time::humanize;

/// A reply body from either client.
pub(super) type Body = BoxBody<Bytes, BodyBroke>;

/// A reply body that broke off before its end (the cause is the transport's).
#[derive(Debug)]
pub(super) struct BodyBroke;

impl std::fmt::Display for BodyBroke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(BROKE)
    }
}

impl std::error::Error for BodyBroke {}

pub(super) const BROKE: &str = "the connection closed in the middle of the reply";

impl UpstreamError {
    pub(super) fn from_http(e: &reqwest::Error) -> Self {
        let mut err = Self::new(UpstreamKind::Unavailable, describe(e));
        err.not_run = e.is_connect();
        err
    }
}

/// The next data of a body (trailers are skipped); `None` at its end.
pub(super) async fn chunk(body: &mut Body) -> Result<Option<Bytes>, BodyBroke> {
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// Decodes an SSE body into items, with a per-event cap and an idle timeout.
pub(super) fn sse_stream(
    response: http::Response<Body>,
    max_event: usize,
    idle: Option<Duration>,
) -> SseStream {
    struct State {
        bytes: Pin<Box<dyn Stream<Item = Result<Bytes, BodyBroke>> + Send>>,
        decoder: SseDecoder,
        pending: VecDeque<SseItem>,
        done: bool,
        idle: Option<Duration>,
        /// When the last item was handed on: the next one must follow within `idle`,
        /// however slowly its bytes trickle in.
        since: tokio::time::Instant,
    }
    let state = State {
        bytes: Box::pin(futures_util::stream::unfold(
            response.into_body(),
            |mut body| async move { chunk(&mut body).await.transpose().map(|c| (c, body)) },
        )),
        decoder: SseDecoder::new(max_event),
        pending: VecDeque::new(),
        done: false,
        idle,
        since: tokio::time::Instant::now(),
    };
    Box::pin(futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.pending.pop_front() {
                st.since = tokio::time::Instant::now();
                return Some((Ok(item), st));
            }
            if st.done {
                return None;
            }
            let next = match st.idle {
                Some(idle) => match tokio::time::timeout_at(st.since + idle, st.bytes.next()).await
                {
                    Ok(n) => n,
                    Err(_) => {
                        st.done = true;
                        let e = UpstreamError::new(
                            UpstreamKind::Timeout,
                            format!(
                                "its event stream sent no complete event for {}",
                                humanize(idle)
                            ),
                        );
                        return Some((Err(e), st));
                    }
                },
                None => st.bytes.next().await,
            };
            match next {
                Some(Ok(chunk)) => match st.decoder.push(&chunk) {
                    Ok(items) => st.pending.extend(items),
                    Err(e) => {
                        st.done = true;
                        return Some((
                            Err(UpstreamError::new(UpstreamKind::Protocol, e.to_string())),
                            st,
                        ));
                    }
                },
                Some(Err(e)) => {
                    st.done = true;
                    let e = UpstreamError::new(
                        UpstreamKind::Unavailable,
                        format!("its event stream broke: {e}"),
                    );
                    return Some((Err(e), st));
                }
                None => {
                    st.done = true;
                    match st.decoder.finish() {
                        Ok(Some(item)) => st.pending.push_back(item),
                        Ok(None) => {}
                        Err(e) => {
                            return Some((
                                Err(UpstreamError::new(UpstreamKind::Protocol, e.to_string())),
                                st,
                            ));
                        }
                    }
                }
            }
        }
    }))
}

/// The words of an HTML page: its `<title>` when it has one, else its text
/// with the tags, scripts and styles left out.
pub(super) fn html_words(html: &str) -> String {
    let lower = html.to_ascii_lowercase();
    if let Some(start) = lower.find("<title>") {
        let from = start + "<title>".len();
        if let Some(len) = lower[from..].find("</title>") {
            let title = html[from..from + len].trim();
            if !title.is_empty() {
                return title.to_owned();
            }
        }
    }
    let mut out = String::new();
    let mut in_tag = false;
    let mut skip_until: Option<&str> = None;
    let mut i = 0;
    while i < html.len() {
        let rest = &lower[i..];
        if let Some(end) = skip_until {
            match rest.find(end) {
                Some(at) => {
                    i += at + end.len();
                    skip_until = None;
                    continue;
                }
                None => break,
            }
        }
        if rest.starts_with("<script") {
            skip_until = Some("</script>");
        } else if rest.starts_with("<style") {
            skip_until = Some("</style>");
        }
        let Some(c) = html[i..].chars().next() else {
            break;
        };
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            _ if !in_tag => out.push(c),
            _ => {}
        }
        i += c.len_utf8();
    }
    out
}

/// A reqwest error in words that name no URL or credential.
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "the connection timed out".to_owned()
    } else if e.is_connect() {
        "the connection was refused or could not be made".to_owned()
    } else if e.is_body() || e.is_decode() {
        "the connection closed in the middle of the reply".to_owned()
    } else if e.is_redirect() {
        "the server answered with a redirect, which the gateway does not follow".to_owned()
    } else {
        "the request failed at the HTTP level".to_owned()
    }
}

/// A hyper client error in the words [`describe`] uses for reqwest's.
pub(super) fn describe_plain(e: &hyper_util::client::legacy::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return "the connection timed out".to_owned();
        }
        source = s.source();
    }
    if e.is_connect() {
        "the connection was refused or could not be made".to_owned()
    } else {
        "the request failed at the HTTP level".to_owned()
    }
}
