//! The MCP transport headers, and the 2026-07-28 rule that the standard ones
//! (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`, `MCP-Protocol-Version`) agree with
//! the body.
//!
//! Invariants: a header that appears twice is a mismatch (a desync between what
//! policy reads and what the upstream runs is exactly what this guards against);
//! encoded values (`=?base64?…?=`) are decoded before comparing; integers compare
//! numerically, everything else exactly.

use base64::Engine as _;
use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value};

use super::jsonrpc::Message;

pub(crate) const MCP_PROTOCOL_VERSION: &str = "mcp-protocol-version";
pub(crate) const MCP_SESSION_ID: &str = "mcp-session-id";
pub(crate) const MCP_METHOD: &str = "mcp-method";
pub(crate) const MCP_NAME: &str = "mcp-name";
pub(crate) const MCP_PARAM_PREFIX: &str = "mcp-param-";
pub(crate) const LAST_EVENT_ID: &str = "last-event-id";

/// Methods whose target must be mirrored in `Mcp-Name`.
const NAMED_METHODS: &[&str] = &["tools/call", "resources/read", "prompts/get"];

/// Why the headers and the body disagree (HTTP 400, JSON-RPC -32020).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Mismatch(pub String);

/// The single value of header `name`; two values, or a value that is not
/// visible ASCII, is a mismatch.
pub(crate) fn single<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, Mismatch> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Mismatch(format!(
            "the {name} header appears more than once"
        )));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| Mismatch(format!("the {name} header is not plain ASCII")))
}

/// Decodes a header value, unwrapping the `=?base64?…?=` form.
pub(crate) fn decode(raw: &str) -> Result<String, Mismatch> {
    match raw
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        None => Ok(raw.to_owned()),
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| {
                Mismatch(format!(
                    "the header value {raw:?} is not valid base64 UTF-8"
                ))
            }),
    }
}

/// A header value for `value`: itself when it is plain visible ASCII, else the
/// `=?base64?…?=` form (also for plain values that look like that form).
pub(crate) fn encode(value: &str) -> HeaderValue {
    let plain = !value.is_empty()
        && value.bytes().all(|b| (0x21..=0x7e).contains(&b))
        && !value.starts_with("=?base64?");
    let text = if plain {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    };
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Checks `Mcp-Method` and `Mcp-Name` against the body. With `required`
/// (2026-era requests) they must be present; otherwise only present ones are checked.
pub(crate) fn check_method_and_name(
    headers: &HeaderMap,
    message: &Message,
    required: bool,
) -> Result<(), Mismatch> {
    let Some(method) = message.method() else {
        return Ok(());
    };
    match single(headers, MCP_METHOD)? {
        Some(h) if decode(h)? == method => {}
        Some(h) => {
            return Err(Mismatch(format!(
                "the Mcp-Method header says {h:?} but the body's method is {method:?}"
            )));
        }
        None if required => {
            return Err(Mismatch(format!(
                "the Mcp-Method header is missing; it must repeat the body's method {method:?}"
            )));
        }
        None => {}
    }
    let target = body_name(message);
    match (single(headers, MCP_NAME)?, target) {
        (Some(h), Some(t)) if decode(h)? == t => Ok(()),
        (Some(h), Some(t)) => Err(Mismatch(format!(
            "the Mcp-Name header says {h:?} but the body names {t:?}"
        ))),
        (Some(h), None) => Err(Mismatch(format!(
            "the Mcp-Name header says {h:?} but the body names nothing"
        ))),
        (None, Some(t)) if required && NAMED_METHODS.contains(&method) => Err(Mismatch(format!(
            "the Mcp-Name header is missing; it must repeat {t:?} from the body"
        ))),
        (None, _) => Ok(()),
    }
}

/// The name a request targets: `params.name`, `params.uri` or `params.taskId`.
fn body_name(message: &Message) -> Option<&str> {
    let params = message.params()?;
    ["name", "uri", "taskId"]
        .iter()
        .find_map(|k| params.get(*k).and_then(Value::as_str))
}

/// Checks `Mcp-Param-*` headers against the arguments, for every property the
/// tool's schema marks with `x-mcp-header`. With `required`, a mirrored argument
/// whose header is absent is a mismatch too. Unknown `Mcp-Param-*` headers are
/// left alone (they are forwarded, as the spec asks of intermediaries).
pub(crate) fn check_params(
    headers: &HeaderMap,
    arguments: &Map<String, Value>,
    input_schema: &Value,
    required: bool,
) -> Result<(), Mismatch> {
    let Some(properties) = input_schema.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    for (property, spec) in properties {
        let Some(header) = spec.get("x-mcp-header").and_then(Value::as_str) else {
            continue;
        };
        let name = format!("{MCP_PARAM_PREFIX}{}", header.to_ascii_lowercase());
        let sent = single(headers, &name)?.map(decode).transpose()?;
        let arg = arguments.get(property).filter(|v| !v.is_null());
        match (sent, arg) {
            (None, None) => {}
            (None, Some(_)) if !required => {}
            (None, Some(_)) => {
                return Err(Mismatch(format!(
                    "the argument {property:?} must be mirrored in the Mcp-Param-{header} header"
                )));
            }
            (Some(_), None) => {
                return Err(Mismatch(format!(
                    "the Mcp-Param-{header} header is set but the argument {property:?} is absent"
                )));
            }
            (Some(h), Some(v)) if !same_value(&h, v) => {
                return Err(Mismatch(format!(
                    "the Mcp-Param-{header} header does not match the argument {property:?}"
                )));
            }
            (Some(_), Some(_)) => {}
        }
    }
    Ok(())
}

fn same_value(header: &str, arg: &Value) -> bool {
    match arg {
        Value::String(s) => s == header,
        Value::Bool(b) => header == if *b { "true" } else { "false" },
        Value::Number(n) => match (n.as_i64(), header.trim().parse::<i64>()) {
            (Some(a), Ok(b)) => a == b,
            _ => n.to_string() == header,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(v: Value) -> Message {
        Message::classify(v.to_string().as_bytes(), 64).expect("message")
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    fn call() -> Message {
        message(
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}),
        )
    }

    #[test]
    fn matching_headers_pass() {
        let h = headers(&[("mcp-method", "tools/call"), ("mcp-name", "echo")]);
        assert_eq!(check_method_and_name(&h, &call(), true), Ok(()));
        let h = headers(&[
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?ZWNobw==?="),
        ]);
        assert_eq!(check_method_and_name(&h, &call(), true), Ok(()));
    }

    #[test]
    fn mismatches_are_caught() {
        for h in [
            headers(&[("mcp-method", "tools/list"), ("mcp-name", "echo")]),
            headers(&[("mcp-method", "tools/call"), ("mcp-name", "delete_all")]),
            headers(&[("mcp-method", "tools/call")]),
            headers(&[("mcp-name", "echo")]),
            headers(&[
                ("mcp-method", "tools/call"),
                ("mcp-name", "echo"),
                ("mcp-name", "other"),
            ]),
            headers(&[("mcp-method", "tools/call"), ("mcp-name", "=?base64?!!?=")]),
        ] {
            assert!(check_method_and_name(&h, &call(), true).is_err(), "{h:?}");
        }
        // Outside the 2026 era absent headers are fine, present ones still checked.
        assert_eq!(
            check_method_and_name(&HeaderMap::new(), &call(), false),
            Ok(())
        );
        let h = headers(&[("mcp-name", "other")]);
        assert!(check_method_and_name(&h, &call(), false).is_err());
    }

    #[test]
    fn param_headers_follow_x_mcp_header() {
        let schema = json!({"type":"object","properties":{
            "region":{"type":"string","x-mcp-header":"Region"},
            "count":{"type":"integer","x-mcp-header":"Count"}}});
        let args = json!({"region":"eu-west","count":7});
        let args = args.as_object().expect("object");
        let ok = headers(&[("mcp-param-region", "eu-west"), ("mcp-param-count", "07")]);
        assert_eq!(check_params(&ok, args, &schema, true), Ok(()));
        let wrong = headers(&[("mcp-param-region", "us-east"), ("mcp-param-count", "7")]);
        assert!(check_params(&wrong, args, &schema, true).is_err());
        let missing = headers(&[("mcp-param-count", "7")]);
        assert!(check_params(&missing, args, &schema, true).is_err());
        assert_eq!(check_params(&missing, args, &schema, false), Ok(()));
        let unknown = headers(&[
            ("mcp-param-region", "eu-west"),
            ("mcp-param-count", "7"),
            ("mcp-param-other", "x"),
        ]);
        assert_eq!(check_params(&unknown, args, &schema, true), Ok(()));
    }

    #[test]
    fn encoded_values_decode_to_themselves() {
        for v in ["echo", "a b", "é", "=?base64?eA==?=", ""] {
            let h = encode(v);
            assert_eq!(decode(h.to_str().unwrap()).unwrap(), v, "{v:?}");
        }
        assert_eq!(encode("echo"), "echo");
    }
}
