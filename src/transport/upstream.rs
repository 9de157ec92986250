//! One server's connection: a pooled HTTP client, the headers that may
//! cross, and reading replies as JSON or as an SSE stream; or, for a stdio
//! server, its supervised child process ([`super::stdio`]), which answers with
//! the same [`Reply`].
//!
//! Place in the path: the transport layer, beneath the pipeline's forwarding
//! step (which keeps the server's breaker, retry budget and calls in flight
//! beside this connection); the last code before the MCP server, and the first
//! after it.
//!
//! A plain `http://` server is reached through hyper's pooled client with the
//! URL parsed once at load (no URL parsing, no middleware on the request
//! path); an `https://` one through reqwest (rustls with ring). Both replies
//! are read by the same code, so limits, timeouts and headers do not depend
//! on the client.
//!
//! Invariants:
//! - redirects are never followed and no environment proxy is used;
//! - only an allow-list of client headers crosses (MCP transport headers and
//!   trace context); `Authorization`, cookies and every other credential stay
//!   behind, and the server's configured `headers` are added instead;
//! - every request carries the [`Credential`] the server's identity mode
//!   gave for its caller: [`Connection::exchange`] cannot be called without one;
//! - every wait is bounded: connect, response headers, a JSON body, and the gap
//!   between two SSE events of a response (long-lived listen streams excepted);
//! - every read is bounded: a JSON body and each SSE event are capped.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;

use super::reply::{Framing, OTHER_BODY_BYTES, Reply, UpstreamError};
use super::stdio::Stdio;
use crate::config::{ServerSettings, Transport};
use crate::error::UpstreamKind;
use crate::identity::Credential;
use crate::mcp::headers::{
    LAST_EVENT_ID, MCP_METHOD, MCP_NAME, MCP_PARAM_PREFIX, MCP_PROTOCOL_VERSION, MCP_SESSION_ID,
};
use crate::util::time::humanize;

mod body;

use body::{BROKE, Body, BodyBroke, chunk, describe_plain, html_words, sse_stream};

/// Client headers that cross to the upstream (besides `Mcp-Param-*`).
const FORWARDED: &[&str] = &[
    MCP_PROTOCOL_VERSION,
    MCP_SESSION_ID,
    MCP_METHOD,
    MCP_NAME,
    LAST_EVENT_ID,
    "traceparent",
    "tracestate",
    "baggage",
];

/// Upstream reply headers that cross back to the client.
const RETURNED: &[&str] = &[
    MCP_SESSION_ID,
    MCP_PROTOCOL_VERSION,
    "cache-control",
    "retry-after",
    "allow",
];

/// One configured server and its connection pool (or child process).
#[derive(Debug)]
pub(crate) struct Connection {
    pub settings: Arc<ServerSettings>,
    link: Link,
    /// Cap on a JSON reply and on one SSE event.
    pub max_response_bytes: usize,
}

/// How requests reach the server.
// One per upstream, built at load: its size is paid once, and the hyper
// client is used in place on every request rather than behind a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Link {
    /// `https://`: reqwest with rustls.
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
    },
    /// `http://`: hyper's pooled client; the URL parsed once, here.
    Plain {
        client: HyperClient<HttpConnector, Full<Bytes>>,
        uri: http::Uri,
    },
    Stdio(Stdio),
}

// === impl Connection ===

impl Connection {
    /// The upstream of `settings`; a stdio server's process is started at once
    /// (inside a Tokio runtime). `tools_changed` is called when a stdio server
    /// announces (or a restart may bring) a different tool list.
    pub(crate) fn new(
        settings: Arc<ServerSettings>,
        max_response_bytes: usize,
        tools_changed: Box<dyn Fn() + Send + Sync>,
    ) -> Result<Self, reqwest::Error> {
        let url = match &settings.transport {
            Transport::Http(url) => url.clone(),
            Transport::Stdio(command) => {
                let stdio = Stdio::start(
                    &settings.name,
                    command.clone(),
                    settings.timeout,
                    max_response_bytes,
                    tools_changed,
                );
                return Ok(Self {
                    settings,
                    link: Link::Stdio(stdio),
                    max_response_bytes,
                });
            }
        };
        if url.scheme() == "http"
            && let Ok(uri) = url.as_str().parse::<http::Uri>()
        {
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(settings.connect_timeout));
            connector.set_nodelay(true);
            let client = HyperClient::builder(hyper_util::rt::TokioExecutor::new())
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(64)
                .build(connector);
            return Ok(Self {
                settings,
                link: Link::Plain { client, uri },
                max_response_bytes,
            });
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(settings.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            settings,
            link: Link::Http { client, url },
            max_response_bytes,
        })
    }

    /// One exchange: sends a request (`body` for POST) and classifies the
    /// reply. `idle` bounds the gap between SSE events (`None` for long-lived streams).
    pub(crate) async fn exchange(
        &self,
        method: Method,
        mut headers: HeaderMap,
        credential: Credential,
        body: Option<Bytes>,
        idle: Option<Duration>,
    ) -> Result<Reply, UpstreamError> {
        credential.apply(&mut headers);
        match &self.link {
            Link::Http { client, url } => {
                let response =
                    (self.send(client, url, method, headers, body, self.wait(idle))).await?;
                let response = http::Response::from(response)
                    .map(|b| b.map_err(|_: reqwest::Error| BodyBroke).boxed());
                self.read(response, idle).await
            }
            Link::Plain { client, uri } => {
                let response =
                    (self.send_plain(client, uri, method, headers, body, self.wait(idle))).await?;
                let response = response.map(|b| b.map_err(|_| BodyBroke).boxed());
                self.read(response, idle).await
            }
            Link::Stdio(stdio) => stdio.exchange(&method, &headers, body, idle).await,
        }
    }

    /// For `/readyz`: whether the server can take requests now, and what is known.
    /// HTTP servers are not probed (a request finds out); a stdio server
    /// reports its process.
    pub(crate) fn readiness(&self) -> (bool, serde_json::Value) {
        match &self.link {
            Link::Http { .. } | Link::Plain { .. } => {
                (true, serde_json::json!({"transport": "http"}))
            }
            Link::Stdio(stdio) => stdio.readiness(),
        }
    }

    /// Stops what the upstream runs (a stdio server's process) and waits for it.
    pub(crate) async fn stop(&self) {
        if let Link::Stdio(stdio) = &self.link {
            stdio.stop().await;
        }
    }

    /// Sends one request; waits at most `wait` for the reply's headers.
    async fn send(
        &self,
        client: &reqwest::Client,
        url: &reqwest::Url,
        method: Method,
        headers: HeaderMap,
        body: Option<Bytes>,
        wait: Duration,
    ) -> Result<reqwest::Response, UpstreamError> {
        let mut request = client.request(method, url.clone()).headers(headers);
        for (name, value) in &self.settings.headers {
            request = request.header(name, value);
        }
        if let Some(body) = body {
            request = request
                .header(header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        match tokio::time::timeout(wait, request.send()).await {
            Err(_) => Err(UpstreamError::new(
                UpstreamKind::Timeout,
                format!("no response within {}", humanize(wait)),
            )),
            Ok(Err(e)) => Err(UpstreamError::from_http(&e)),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// [`Self::send`] through hyper: the same headers (the client's allowed
    /// ones, then the server's own), the same wait for the reply's headers.
    async fn send_plain(
        &self,
        client: &HyperClient<HttpConnector, Full<Bytes>>,
        uri: &http::Uri,
        method: Method,
        mut headers: HeaderMap,
        body: Option<Bytes>,
        wait: Duration,
    ) -> Result<http::Response<hyper::body::Incoming>, UpstreamError> {
        for (name, value) in &self.settings.headers {
            headers.append(name, value.clone());
        }
        if body.is_some() {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        // What reqwest sends when nothing is said.
        if !headers.contains_key(header::ACCEPT) {
            headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        }
        let mut request = http::Request::new(Full::new(body.unwrap_or_default()));
        *request.method_mut() = method;
        *request.uri_mut() = uri.clone();
        *request.headers_mut() = headers;
        match tokio::time::timeout(wait, client.request(request)).await {
            Err(_) => Err(UpstreamError::new(
                UpstreamKind::Timeout,
                format!("no response within {}", humanize(wait)),
            )),
            Ok(Err(e)) => {
                let mut err = UpstreamError::new(UpstreamKind::Unavailable, describe_plain(&e));
                err.not_run = e.is_connect();
                Err(err)
            }
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// Classifies a response and reads what must be read whole. `idle` bounds the
    /// gap between SSE events (`None` for long-lived streams).
    async fn read(
        &self,
        response: http::Response<Body>,
        idle: Option<Duration>,
    ) -> Result<Reply, UpstreamError> {
        let status = response.status();
        let headers = returned_headers(response.headers());
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if content_type.starts_with("text/event-stream") {
            let events = sse_stream(response, self.max_response_bytes, idle);
            return Ok(Reply::Sse {
                status: Framing::Http(status),
                headers,
                events,
            });
        }
        if content_type.starts_with("application/json") {
            let body = self.read_body(response, self.wait(idle)).await?;
            if body.is_empty() {
                return Ok(Reply::Empty {
                    status: Framing::Http(status),
                    headers,
                });
            }
            return Ok(Reply::Json {
                status: Framing::Http(status),
                headers,
                body,
            });
        }
        if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT || status.is_success()
        {
            // Drain a little so the connection can be reused, but never show it.
            let _ = self.read_prefix(response, OTHER_BODY_BYTES).await;
            return Ok(Reply::Empty {
                status: Framing::Http(status),
                headers,
            });
        }
        let text = if content_type.starts_with("text/") || content_type.is_empty() {
            self.read_prefix(response, OTHER_BODY_BYTES)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        } else {
            let _ = self.read_prefix(response, OTHER_BODY_BYTES).await;
            None
        };
        let text = text.map(|t| {
            if content_type.starts_with("text/html") {
                html_words(&t)
            } else {
                t
            }
        });
        Ok(Reply::Other {
            status,
            headers,
            text,
        })
    }

    /// At most `limit` bytes of a body, within the server's timeout; `None` when
    /// reading fails.
    async fn read_prefix(&self, response: http::Response<Body>, limit: usize) -> Option<Bytes> {
        let mut body = response.into_body();
        let read = async {
            let mut out = Vec::new();
            while out.len() < limit {
                match chunk(&mut body).await {
                    Ok(Some(chunk)) => out.extend_from_slice(&chunk),
                    Ok(None) => break,
                    Err(_) => return None,
                }
            }
            out.truncate(limit);
            Some(Bytes::from(out))
        };
        tokio::time::timeout(self.settings.timeout, read)
            .await
            .ok()
            .flatten()
    }

    async fn read_body(
        &self,
        response: http::Response<Body>,
        wait: Duration,
    ) -> Result<Bytes, UpstreamError> {
        let limit = self.max_response_bytes;
        let mut body = response.into_body();
        let read = async {
            let mut out = Vec::new();
            while let Some(chunk) = chunk(&mut body)
                .await
                .map_err(|_| UpstreamError::new(UpstreamKind::Unavailable, BROKE))?
            {
                if out.len() + chunk.len() > limit {
                    return Err(UpstreamError::new(
                        UpstreamKind::Protocol,
                        format!("the reply is larger than {limit} bytes"),
                    ));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(Bytes::from(out))
        };
        tokio::time::timeout(wait, read).await.unwrap_or_else(|_| {
            Err(UpstreamError::new(
                UpstreamKind::Timeout,
                format!("the reply did not complete within {}", humanize(wait)),
            ))
        })
    }

    /// How long a request waits for its reply's headers (and a JSON reply
    /// for its body): the server's `timeout`, or a tool's longer deadline.
    fn wait(&self, idle: Option<Duration>) -> Duration {
        idle.map_or(self.settings.timeout, |idle| {
            idle.max(self.settings.timeout)
        })
    }
}

/// The client headers that may cross, with `Accept` set as MCP requires.
pub(crate) fn forwarded_headers(client: &HeaderMap, accept: &'static str) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in client {
        let n = name.as_str();
        if FORWARDED.contains(&n) || n.starts_with(MCP_PARAM_PREFIX) {
            out.append(name.clone(), value.clone());
        }
    }
    out.insert(header::ACCEPT, HeaderValue::from_static(accept));
    out
}

fn returned_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in RETURNED {
        if let Some(v) = upstream.get(*name) {
            out.insert(*name, v.clone());
        }
    }
    out
}
