//! `portcullis demo`: a bundled MCP server with flawed tools, behind a demo
//! configuration, so a newcomer sees the gateway at work with nothing else
//! installed.
//!
//! Invariants: everything binds loopback; the demo keys are printed because
//! they guard nothing but this demo.

pub mod upstream;

use std::io;
use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::app::Gateway;
use crate::auth::hash_key;
use crate::config;

/// The analyst's API key in the demo.
pub const ANALYST_KEY: &str = "demo-analyst-key";
/// The admin's API key in the demo.
pub const ADMIN_KEY: &str = "demo-admin-key";

const TEMPLATE: &str = include_str!("demo/demo.toml");

/// A demo gateway with its upstream, bound and ready.
#[derive(Debug)]
pub struct Demo {
    /// The gateway in front of the demo server.
    pub gateway: Gateway,
    /// The demo server's own address (not for clients: they go through the gateway).
    pub upstream_addr: SocketAddr,
    /// Handle on what the demo server actually ran.
    pub upstream: upstream::DemoUpstream,
}

/// Starts the demo server on a free loopback port and binds a gateway in front
/// of it on `127.0.0.1:port` (0 picks a free port).
pub async fn start(port: u16) -> io::Result<Demo> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let upstream_addr = listener.local_addr()?;
    let (router, handle) = upstream::router(upstream::DemoOptions::default());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "demo server stopped");
        }
    });
    let text = TEMPLATE
        .replace("{port}", &port.to_string())
        .replace("{admin_port}", "0")
        .replace("{upstream}", &upstream_addr.to_string())
        .replace("{analyst_sha256}", &hex::encode(hash_key(ANALYST_KEY)))
        .replace("{admin_sha256}", &hex::encode(hash_key(ADMIN_KEY)));
    let config = config::load_str(&text, "(demo configuration)", &|_| None)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let gateway = Gateway::bind(config).await?;
    Ok(Demo {
        gateway,
        upstream_addr,
        upstream: handle,
    })
}

/// What `portcullis demo` prints once it listens.
pub fn banner(addr: SocketAddr, admin: SocketAddr) -> String {
    let url = format!("http://{addr}/mcp/demo");
    format!(
        r#"Portcullis demo: a deliberately flawed MCP server, and the gateway in front of it.

  Dashboard      http://{admin}/      <- open this: every decision shows up live
  MCP endpoint   {url}
  Clients        analyst  key {ANALYST_KEY}   (may read; slow_query capped at 5 s)
                 admin    key {ADMIN_KEY}     (may also call delete_record)
  Health, pins   http://{admin}/healthz   http://{admin}/api/pins

The story, one command each below (watch the dashboard's live feed as you go):
  1. the analyst lists the tools: delete_record is not there
  2. a call that breaks the advertised schema is refused with what a valid call looks like;
     the server never sees it
  3. a tool the analyst may not call gets the answer a tool that does not exist gets
  4. the server also lists a poisoned tool: the gateway pinned its tools, scanned them, holds it
  5. logs full of terminal escapes, a hidden link and secrets come out clean
  6. a tool that fails saying nothing: the failure is explained, with retry advice

  H='-H Content-Type:application/json -H Accept:application/json,text/event-stream -H MCP-Protocol-Version:2026-07-28'
  M='"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}'

  # 1. the tools the analyst may see (delete_record is hidden)
  curl -s {url} $H -H 'Authorization: Bearer {ANALYST_KEY}' -H Mcp-Method:tools/list \
    -d '{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{'"$M"'}}}}'

  # 2. a call that breaks the advertised schema: refused with an actionable error, never run
  curl -s {url} $H -H 'Authorization: Bearer {ANALYST_KEY}' -H Mcp-Method:tools/call -H Mcp-Name:lookup_order \
    -d '{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"lookup_order","arguments":{{"order_id":"1 OR 1=1"}},'"$M"'}}}}'

  # 3. a tool the analyst may not call: the same answer as a tool that does not exist
  curl -s {url} $H -H 'Authorization: Bearer {ANALYST_KEY}' -H Mcp-Method:tools/call -H Mcp-Name:delete_record \
    -d '{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"delete_record","arguments":{{"record_id":"42"}},'"$M"'}}}}'

  # 4. the poisoned tool, held (also on the dashboard's tools page)
  curl -s http://{admin}/api/pins
  # 5. logs full of terminal escapes, a hidden link and secrets: they come out clean
  curl -s {url} $H -H 'Authorization: Bearer {ANALYST_KEY}' -H Mcp-Method:tools/call -H Mcp-Name:fetch_logs \
    -d '{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"fetch_logs","arguments":{{}},'"$M"'}}}}'

  # 6. a tool that fails saying nothing: the failure is explained, with retry advice
  curl -s {url} $H -H 'Authorization: Bearer {ANALYST_KEY}' -H Mcp-Method:tools/call -H Mcp-Name:generate_report \
    -d '{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"generate_report","arguments":{{"month":"2026-07"}},'"$M"'}}}}'

Python SDK:  async with Client("{url}", mode="2026-07-28", ...) as c: await c.call_tool("lookup_order", {{"order_id": "ORD-004211"}})
             (send the header Authorization: Bearer {ANALYST_KEY})
Stop with Ctrl-C.
"#
    )
}

/// The demo configuration as it would be written in a file (for `check`-style inspection).
pub fn config_text() -> &'static str {
    TEMPLATE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_configuration_compiles() {
        let text = TEMPLATE
            .replace("{port}", "0")
            .replace("{admin_port}", "0")
            .replace("{upstream}", "127.0.0.1:9")
            .replace("{analyst_sha256}", &hex::encode(hash_key(ANALYST_KEY)))
            .replace("{admin_sha256}", &hex::encode(hash_key(ADMIN_KEY)));
        let config = config::load_str(&text, "demo", &|_| None).expect("the demo config compiles");
        assert_eq!(config.policy.rules.len(), 3);
    }
}
