//! Raw HTTP to the gateway, for the inputs no SDK client would send: one POST and what
//! came back (JSON or SSE), the common `tools/call` and `tools/list` bodies in both eras,
//! and the 2026-07-28 call's headers.

use super::*;

/// A raw HTTP exchange, for the inputs no SDK client would send.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

/// POSTs `body` to `url` with `headers`.
pub async fn raw_post(url: &str, headers: &[(&str, &str)], body: impl Into<reqwest::Body>) -> Raw {
    init();
    let client = http();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.body(body).send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text)
        .or_else(|_| {
            // An SSE reply: take the last data line.
            let data = text
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or("null");
            serde_json::from_str(data)
        })
        .unwrap_or(Value::Null);
    Raw {
        status,
        headers,
        body,
        text,
    }
}

/// The JSON-RPC id of the requests [`tools_call`] and [`tools_list`] send.
pub const RPC_ID: u64 = 1;

/// A 2026-07-28 `tools/call` of `name` with `args` on `url` as the client
/// holding `key`, with `extra` headers: the raw exchange. Every test calls a
/// tool through here (or through an SDK client with [`sdk`]).
pub async fn tools_call(
    url: &str,
    key: &str,
    name: &str,
    args: Value,
    extra: &[(&str, &str)],
) -> Raw {
    let headers = modern_call_headers(key, name);
    let mut headers = borrow(&headers);
    headers.extend_from_slice(extra);
    raw_post(url, &headers, modern_call(RPC_ID, name, args)).await
}

/// A 2026-07-28 `tools/list` on `url` as the client holding `key`: the raw exchange.
pub async fn tools_list(url: &str, key: &str) -> Raw {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": RPC_ID, "method": "tools/list",
        "params": {"_meta": modern_meta()}});
    let auth = format!("Bearer {key}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ];
    raw_post(url, &headers, body.to_string()).await
}

impl Raw {
    /// Asserts an HTTP 200 answer; its body.
    pub fn ok(self) -> Value {
        assert_eq!(self.status, 200, "{}", self.text);
        self.body
    }

    /// Asserts an HTTP 200 answer with a JSON-RPC result to request
    /// [`RPC_ID`]; that result.
    pub fn result(self) -> Value {
        assert_eq!(self.status, 200, "{}", self.text);
        assert_eq!(self.body["id"], RPC_ID, "{}", self.text);
        assert!(self.body["result"].is_object(), "{}", self.text);
        self.body["result"].clone()
    }

    /// The gateway's refusal code of a `tools/call` result (asserting one,
    /// as [`Raw::result`]), `None` when the tool ran.
    pub fn refusal(self) -> Option<String> {
        self.result()["_meta"]["portcullis/error"]["code"]
            .as_str()
            .map(str::to_owned)
    }
}

impl TestGateway {
    /// `tools/call` of `name` on `server` as alice ([`tools_call`]): asserts
    /// a JSON-RPC result ([`Raw::result`]) and returns it.
    pub async fn call(&self, server: &str, name: &str, args: Value) -> Value {
        tools_call(&self.url(server), ALICE, name, args, &[])
            .await
            .result()
    }

    /// `tools/list` on `server` as alice ([`tools_list`]): the tools listed.
    pub async fn list(&self, server: &str) -> Vec<Value> {
        tools_list(&self.url(server), ALICE).await.body["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// `_meta` of a 2026-07-28 request.
pub fn modern_meta() -> Value {
    serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// A 2026-07-28 `tools/call` body.
pub fn modern_call(id: u64, name: &str, args: Value) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": args, "_meta": modern_meta()}})
    .to_string()
}

/// Headers of a 2026-07-28 `tools/call` for `name` with `key`.
pub fn modern_call_headers<'a>(key: &'a str, name: &'a str) -> Vec<(&'static str, String)> {
    vec![
        ("authorization", format!("Bearer {key}")),
        ("mcp-protocol-version", "2026-07-28".into()),
        ("mcp-method", "tools/call".into()),
        ("mcp-name", name.into()),
    ]
}

/// Borrows owned header pairs for [`raw_post`].
pub fn borrow<'a>(headers: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    headers.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// An open 2026-07-28 `subscriptions/listen` stream: what it carried so far, as
/// text, grows in `seen` while `reader` runs (abort it to close the stream).
pub struct Listening {
    pub seen: std::sync::Arc<std::sync::Mutex<String>>,
    pub reader: tokio::task::JoinHandle<()>,
}

/// Opens a `subscriptions/listen` on `url` as `key`, asking for
/// `notifications` (`{"toolsListChanged": true}`, `{"resourceSubscriptions": [...]}`);
/// the gateway must answer it with a stream.
pub async fn listen(url: &str, key: &str, notifications: Value) -> Listening {
    use futures_util::StreamExt as _;
    let body = serde_json::json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
        "params": {"_meta": modern_meta(), "notifications": notifications}});
    let response = http()
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .body(body.to_string())
        .send()
        .await
        .expect("listen");
    assert_eq!(
        response.status(),
        200,
        "the listen is answered with a stream"
    );
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let into = seen.clone();
    let reader = tokio::spawn(async move {
        let mut stream = response.bytes_stream();
        while let Some(Ok(chunk)) = stream.next().await {
            into.lock()
                .expect("lock")
                .push_str(&String::from_utf8_lossy(&chunk));
        }
    });
    Listening { seen, reader }
}
