//! Overload: thousands of connections that send a request line and never
//! finish their headers. The gateway (the real binary, so the memory read is
//! its own) holds them at a bounded cost per connection, serves a real SDK
//! client meanwhile, and at `max_connections` closes the oldest of them to
//! serve a new connection; a connection past the cap when every slot holds a
//! connection that sent its request is refused at once with 503 and
//! `Retry-After`, and `/metrics` shows the count. A connection that does not
//! finish its first request's headers within `header_timeout` is closed,
//! while an idle keep-alive connection stays.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use std::time::Duration;

use serde_json::json;
use support::process::Observed;
use support::upstreams::InProcess;
use support::{ALICE, Mode, Sdk, call, list, sdk};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Half-open connections held, unless the descriptor limit allows fewer.
const HALF_OPEN: usize = 4000;
/// Descriptors kept free for everything else (the test's and the gateway's).
const SPARE_FDS: u64 = 400;
/// The bound on the gateway's memory per idle half-open connection.
const MAX_KIB_PER_CONNECTION: f64 = 8.0;

/// Raises this process's soft descriptor limit to its hard one (the gateway
/// inherits it); returns how many half-open connections fit.
fn room_for_connections() -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.maximum.is_none_or(|hard| Some(hard) > limit.current) {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let fit = soft.saturating_sub(SPARE_FDS) as usize;
    assert!(
        fit >= 1000,
        "the descriptor limit ({soft}) leaves room for only {fit} connections: raise `ulimit -n`"
    );
    fit.min(HALF_OPEN)
}

fn config(upstream: &str, max_connections: usize, header_timeout: &str) -> String {
    Config::new()
        .gateway("max_connections", max_connections as i64)
        .gateway("header_timeout", header_timeout)
        .gateway("client_timeout", "120s")
        .server("demo", upstream)
        .set("timeout", "20s")
        .clients()
        .allow_all()
        .memory_stores()
        .render()
}

/// A connection that sends a request line and one header, never the end.
async fn half_open(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"POST /mcp/demo HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    s
}

/// The value of the `/metrics` sample `name{listener="mcp"}`.
async fn metric(gateway: &Observed, name: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", gateway.admin))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    let prefix = format!("{name}{{listener=\"mcp\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{prefix} in /metrics:\n{text}")) as u64
}

/// Polls `/metrics` (at most 200 times, 50 ms apart) until the MCP listener
/// has `want` connections open; returns the last count.
async fn open_becomes(gateway: &Observed, want: u64) -> u64 {
    let mut now = metric(gateway, "portcullis_connections_open").await;
    for _ in 0..200 {
        if now == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        now = metric(gateway, "portcullis_connections_open").await;
    }
    now
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_half_open_connections_cost_little_and_lock_no_one_out() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    // Thousands of connections keep both cores busy (see `support::exclusive`).
    let _alone = support::exclusive().await;
    support::init();
    let n = room_for_connections();
    let cap = n + 8;
    let upstream = InProcess::demo().await;
    let gateway = Observed::start(&config(&upstream.url, cap, "120s")).await;
    let url = gateway.url("demo");

    // Warm up (the first call builds the catalog and pools), then the baseline.
    let warm = sdk(Sdk::Python, Mode::Modern, &url, ALICE, json!([list()])).await;
    assert!(warm[0]["tools"].is_array(), "{warm:?}");
    assert_eq!(
        open_becomes(&gateway, 0).await,
        0,
        "the client's connections closed"
    );
    let baseline = gateway.rss_kib();

    let mut held = Vec::with_capacity(cap);
    for _ in 0..n {
        held.push(half_open(&gateway.addr).await);
    }
    assert_eq!(open_becomes(&gateway, n as u64).await, n as u64);
    let loaded = gateway.rss_kib();
    let per_connection = loaded.saturating_sub(baseline) as f64 / n as f64;
    eprintln!(
        "{n} half-open connections: RSS {baseline} KiB -> {loaded} KiB, {per_connection:.2} KiB each"
    );
    assert!(
        per_connection <= MAX_KIB_PER_CONNECTION,
        "{per_connection:.2} KiB per idle connection ({baseline} -> {loaded} KiB for {n})"
    );

    // A real client is served meanwhile, within its normal deadline.
    let served = sdk(
        Sdk::Python,
        Mode::Modern,
        &url,
        ALICE,
        json!([list(), call("echo", json!({"text": "still here"}))]),
    )
    .await;
    assert!(served[0]["tools"].is_array(), "{served:?}");
    assert_ne!(served[1]["isError"], json!(true), "{served:?}");

    // Fill the listener to its cap with half-open connections: the next
    // connection takes the oldest one's place, and is served.
    assert_eq!(open_becomes(&gateway, n as u64).await, n as u64);
    for _ in n..cap {
        held.push(half_open(&gateway.addr).await);
    }
    assert_eq!(open_becomes(&gateway, cap as u64).await, cap as u64);
    let refused_before = metric(&gateway, "portcullis_connections_refused_total").await;
    let mut extra = TcpStream::connect(&gateway.addr).await.expect("connect");
    extra
        .write_all(b"GET /mcp/demo HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), extra.read_to_end(&mut reply))
        .await
        .expect("the answer comes and the connection closes")
        .expect("read");
    let reply = String::from_utf8_lossy(&reply).to_ascii_lowercase();
    assert!(reply.starts_with("http/1.1 "), "{reply}");
    assert!(!reply.starts_with("http/1.1 503"), "{reply}");
    assert_closed(&mut held[0]).await;
    assert_eq!(
        metric(&gateway, "portcullis_connections_refused_total").await,
        refused_before
    );
    assert_eq!(
        metric(&gateway, "portcullis_connections_max").await,
        cap as u64
    );

    // Once connections close, new ones are served again.
    held.truncate(n / 2);
    let again = sdk(Sdk::Python, Mode::Modern, &url, ALICE, json!([list()])).await;
    assert!(again[0]["tools"].is_array(), "{again:?}");
    drop(held);
    gateway.stop().await;
}

/// Waits (at most 10 s) for the gateway to close `stream`.
async fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("the connection is closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

/// A keep-alive connection that has sent a request and read its answer.
async fn answered(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("an answer")
        .expect("read");
    assert!(n > 0, "an answer");
    s
}

/// `max_connections` connections that never finish their headers (and may
/// never, within a long `header_timeout`) do not lock out a real client: each
/// new connection takes the oldest one's slot. Only when every slot holds a
/// connection that has sent a request is a new one refused, with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_at_the_cap_do_not_lock_out_a_client() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    support::init();
    const CAP: usize = 16;
    let upstream = InProcess::demo().await;
    let gateway = Observed::start(&config(&upstream.url, CAP, "120s")).await;
    let url = gateway.url("demo");

    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(half_open(&gateway.addr).await);
    }
    assert_eq!(open_becomes(&gateway, CAP as u64).await, CAP as u64);
    for mode in [Mode::Modern, Mode::Legacy] {
        let served = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([list(), call("echo", json!({"text": "still here"}))]),
        )
        .await;
        assert!(served[0]["tools"].is_array(), "{mode:?}: {served:?}");
        assert_eq!(support::gateway_code(&served[1]), None, "{served:?}");
        assert_ne!(served[1]["isError"], json!(true), "{mode:?}: {served:?}");
    }
    // The oldest half-open connection made room; none was refused.
    assert_closed(&mut held[0]).await;
    assert_eq!(
        metric(&gateway, "portcullis_connections_refused_total").await,
        0
    );
    drop(held);
    assert_eq!(open_becomes(&gateway, 0).await, 0);

    // Every slot holds a connection that sent a request: the next is refused.
    let mut busy = Vec::new();
    for _ in 0..CAP {
        busy.push(answered(&gateway.addr).await);
    }
    let mut extra = TcpStream::connect(&gateway.addr).await.expect("connect");
    extra
        .write_all(b"GET /mcp/demo HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), extra.read_to_end(&mut reply))
        .await
        .expect("the refusal comes and the connection closes")
        .expect("read");
    let reply = String::from_utf8_lossy(&reply).to_ascii_lowercase();
    assert!(reply.starts_with("http/1.1 503"), "{reply}");
    assert!(reply.contains("\r\nretry-after: 1\r\n"), "{reply}");
    assert!(reply.contains("max_connections"), "{reply}");
    assert_eq!(
        metric(&gateway, "portcullis_connections_refused_total").await,
        1
    );
    drop(busy);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_finishes_its_first_headers_is_closed_an_idle_one_stays() {
    support::init();
    let upstream = InProcess::demo().await;
    let gateway = Observed::start(&config(&upstream.url, 64, "1s")).await;

    // A keep-alive connection that has been answered once.
    let mut idle = TcpStream::connect(&gateway.addr).await.expect("connect");
    let request = b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    idle.write_all(request).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = idle.read(&mut buf).await.expect("read");
    assert!(n > 0, "an answer");

    // A half-open one is closed by the first-headers deadline.
    let mut slow = half_open(&gateway.addr).await;
    let closed = tokio::time::timeout(Duration::from_secs(20), slow.read(&mut buf))
        .await
        .expect("the half-open connection is closed");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");

    // The idle one outlived that deadline and still serves.
    idle.write_all(request).await.expect("write");
    let n = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
        .await
        .expect("an answer on the idle connection")
        .expect("read");
    assert!(n > 0, "the keep-alive connection is still open");
    gateway.stop().await;
}
