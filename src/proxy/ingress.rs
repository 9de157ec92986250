//! What a request must pass before the gateway reads its meaning: DNS-rebinding
//! defences (`Origin`, `Host`), the body cap, one JSON-RPC message, and a
//! protocol version whose headers agree with the body.
//!
//! Place in the path: first, before authentication decides who is calling and
//! long before anything reaches the upstream.
//!
//! Invariants: the body is never read past `max_request_bytes`; nesting is
//! bounded before parsing; in the 2026 era the standard headers must match
//! the body, and in either era present ones are checked.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, header};
use http_body_util::{BodyExt, Limited};

use crate::config::GatewaySettings;
use crate::error::Rejection;
use crate::mcp::META_PROTOCOL_VERSION;
use crate::mcp::headers::{self, MCP_PROTOCOL_VERSION};
use crate::mcp::jsonrpc::Message;
use crate::mcp::version::{Era, LEGACY_DEFAULT};

/// Checks `Origin` (any present value must be allowed) and, on a loopback
/// listener, the authority the request names (loopback names or
/// `allowed_hosts`): the `Host` header and the request URI's authority, which
/// is where HTTP/2 puts `:authority` (and HTTP/1.1 an absolute-form target).
/// Each present one is checked, and when both are present they must agree.
/// Both listeners apply it: the MCP endpoint first thing in the pipeline, the
/// admin listener on every path (`admin::guard`).
pub(crate) fn admit(
    headers: &HeaderMap,
    authority: Option<&str>,
    settings: &GatewaySettings,
    loopback: bool,
) -> Result<(), Rejection> {
    let mut origins = headers.get_all(header::ORIGIN).iter();
    if let Some(origin) = origins.next() {
        let value = origin
            .to_str()
            .unwrap_or("")
            .trim_end_matches('/')
            .to_ascii_lowercase();
        // On a loopback listener, pages served from loopback are local already (as the SDKs allow).
        let local = loopback && is_loopback_origin(&value);
        if origins.next().is_some() || !(local || settings.allowed_origins.contains(&value)) {
            return Err(Rejection::Forbidden(format!(
                "requests from the origin {value:?} are not allowed (see gateway.allowed_origins)"
            )));
        }
    }
    if loopback {
        let mut hosts = headers.get_all(header::HOST).iter();
        let host = hosts.next().map(|h| h.to_str().unwrap_or("\u{fffd}"));
        if hosts.next().is_some() {
            return Err(Rejection::Forbidden(
                "a request may carry one Host header only".into(),
            ));
        }
        if let (Some(host), Some(authority)) = (host, authority)
            && !host.eq_ignore_ascii_case(authority)
        {
            return Err(Rejection::Forbidden(format!(
                "the Host {host:?} and the request's authority {authority:?} disagree"
            )));
        }
        // HTTP/2 may carry `:authority` alone; with neither, the name is empty and refused.
        let host = host.or(authority).unwrap_or("");
        let name = host_name(host).to_ascii_lowercase();
        let ok = matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]")
            || settings.allowed_hosts.contains(&name);
        if !ok {
            return Err(Rejection::Forbidden(format!(
                "the Host {host:?} is not served here (see gateway.allowed_hosts)"
            )));
        }
    }
    Ok(())
}

/// `http://localhost:3000`, `http://127.0.0.1`, `http://[::1]:8080` and the https forms.
fn is_loopback_origin(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    matches!(host_name(rest), "localhost" | "127.0.0.1" | "[::1]")
}

/// `example.com:8080` → `example.com`; `[::1]:8080` → `[::1]`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map(|i| &host[..=i]).unwrap_or(host);
    }
    host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host)
}

/// Reads the body, refusing it as soon as it is known to exceed `limit`, or
/// when it has not all arrived within `deadline` (a slow-body client).
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, Rejection> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Rejection::TooLarge(limit));
    }
    let Ok(read) = tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await else {
        return Err(Rejection::InvalidParams(format!(
            "the request body did not arrive within {} s",
            deadline.as_secs_f64()
        )));
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Rejection::TooLarge(limit)),
        Err(_) => Err(Rejection::InvalidParams(
            "the request body could not be read".into(),
        )),
    }
}

/// The version a request speaks and its era, with the header ⇄ body checks.
pub(crate) fn negotiate(
    headers: &HeaderMap,
    message: &Message,
) -> Result<(Era, String), Rejection> {
    let mismatch = |m: headers::Mismatch| Rejection::HeaderMismatch(m.0);
    let header_version = headers::single(headers, MCP_PROTOCOL_VERSION).map_err(mismatch)?;
    let body_version = message.meta_str(META_PROTOCOL_VERSION);
    let (era, version) = match (body_version, header_version) {
        // Agreement first: a header that contradicts the body is a desync whatever the version.
        (Some(body), header) if header != Some(body) => {
            return Err(Rejection::HeaderMismatch(format!(
                "the MCP-Protocol-Version header ({}) must equal the body's _meta protocol version ({body})",
                header.unwrap_or("missing")
            )));
        }
        (Some(body), _) => match Era::of(body) {
            None => {
                return Err(Rejection::UnsupportedVersion {
                    requested: body.to_owned(),
                    era: Era::Modern,
                });
            }
            Some(era) => (era, body.to_owned()),
        },
        (None, Some(header)) => match Era::of(header) {
            None => {
                return Err(Rejection::UnsupportedVersion {
                    requested: header.to_owned(),
                    era: Era::Legacy,
                });
            }
            Some(Era::Modern) if matches!(message, Message::Request { .. }) => {
                return Err(Rejection::InvalidParams(format!(
                    "a {header} request must carry params._meta[\"{META_PROTOCOL_VERSION}\"]"
                )));
            }
            Some(era) => (era, header.to_owned()),
        },
        (None, None) => (Era::Legacy, LEGACY_DEFAULT.to_owned()),
    };
    headers::check_method_and_name(headers, message, era == Era::Modern).map_err(mismatch)?;
    Ok((era, version))
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn settings() -> GatewaySettings {
        crate::config::load_str(
            "[gateway]\nallowed_origins = [\"https://app.example.com\"]\nallowed_hosts = [\"mcp.example.com\"]\n[servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n",
            "t.toml",
            &|_| None,
        )
        .expect("config")
        .gateway
    }

    fn with(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    fn admit_h(h: &HeaderMap, s: &GatewaySettings, loopback: bool) -> Result<(), Rejection> {
        admit(h, None, s, loopback)
    }

    #[test]
    fn the_uri_authority_is_checked_like_host() {
        let s = settings();
        let none = HeaderMap::new();
        assert!(admit(&none, Some("127.0.0.1:8080"), &s, true).is_ok());
        assert!(admit(&none, Some("mcp.example.com"), &s, true).is_ok());
        assert!(admit(&none, Some("evil.example:8080"), &s, true).is_err());
        assert!(admit(&none, None, &s, true).is_err());
        let host = with(&[("host", "localhost:8080")]);
        assert!(admit(&host, Some("LOCALHOST:8080"), &s, true).is_ok());
        // Both present: they must agree, even when each alone would pass.
        assert!(admit(&host, Some("127.0.0.1:8080"), &s, true).is_err());
        assert!(admit(&host, Some("evil.example"), &s, true).is_err());
        let two = with(&[("host", "localhost"), ("host", "localhost")]);
        assert!(admit(&two, None, &s, true).is_err());
        assert!(admit(&none, Some("evil.example"), &s, false).is_ok());
    }

    #[test]
    fn origins_and_hosts() {
        let s = settings();
        assert!(admit_h(&with(&[("host", "127.0.0.1:8080")]), &s, true).is_ok());
        assert!(admit_h(&with(&[("host", "localhost")]), &s, true).is_ok());
        assert!(admit_h(&with(&[("host", "[::1]:9")]), &s, true).is_ok());
        assert!(admit_h(&with(&[("host", "mcp.example.com:443")]), &s, true).is_ok());
        assert!(admit_h(&with(&[("host", "evil.example")]), &s, true).is_err());
        assert!(admit_h(&with(&[("host", "evil.example")]), &s, false).is_ok());
        assert!(
            admit_h(
                &with(&[("host", "localhost"), ("origin", "https://app.example.com")]),
                &s,
                true
            )
            .is_ok()
        );
        assert!(
            admit_h(
                &with(&[("host", "localhost"), ("origin", "https://evil.example")]),
                &s,
                true
            )
            .is_err()
        );
        assert!(
            admit_h(
                &with(&[("host", "localhost"), ("origin", "null")]),
                &s,
                true
            )
            .is_err()
        ); // Loopback origins pass on a loopback listener only.
        let local = with(&[("host", "localhost"), ("origin", "http://127.0.0.1:5173")]);
        assert!(admit_h(&local, &s, true).is_ok());
        assert!(admit_h(&local, &s, false).is_err());
        let tricky = with(&[
            ("host", "localhost"),
            ("origin", "http://localhost.evil.example"),
        ]);
        assert!(admit_h(&tricky, &s, true).is_err());
    }

    fn modern_call() -> Message {
        let v = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo",
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}});
        Message::classify(v.to_string().as_bytes(), 64).expect("message")
    }

    #[test]
    fn modern_requests_need_agreeing_headers() {
        let ok = with(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ]);
        assert_eq!(negotiate(&ok, &modern_call()).map(|r| r.0), Ok(Era::Modern));
        let no_version = with(&[("mcp-method", "tools/call"), ("mcp-name", "echo")]);
        assert!(matches!(
            negotiate(&no_version, &modern_call()),
            Err(Rejection::HeaderMismatch(_))
        ));
        let other_name = with(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "rm"),
        ]);
        assert!(matches!(
            negotiate(&other_name, &modern_call()),
            Err(Rejection::HeaderMismatch(_))
        ));
    }

    #[test]
    fn versions_are_checked() {
        let v = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01"}}});
        let m = Message::classify(v.to_string().as_bytes(), 64).expect("message");
        let h = with(&[("mcp-protocol-version", "2099-01-01")]);
        assert_eq!(
            negotiate(&h, &m),
            Err(Rejection::UnsupportedVersion {
                requested: "2099-01-01".into(),
                era: Era::Modern
            })
        );
        // A header that contradicts the body is a mismatch before it is a version question.
        assert!(matches!(
            negotiate(&HeaderMap::new(), &m),
            Err(Rejection::HeaderMismatch(_))
        ));
        let legacy = Message::classify(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, 64)
            .expect("message");
        assert_eq!(
            negotiate(&HeaderMap::new(), &legacy).map(|r| r.0),
            Ok(Era::Legacy)
        );
        let h = with(&[("mcp-protocol-version", "2025-11-25")]);
        assert_eq!(
            negotiate(&h, &legacy).map(|r| r.1),
            Ok("2025-11-25".to_owned())
        );
        let h = with(&[("mcp-protocol-version", "1999-01-01")]);
        assert!(matches!(
            negotiate(&h, &legacy),
            Err(Rejection::UnsupportedVersion { .. })
        ));
    }
}
