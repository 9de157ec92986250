//! The physical limit of one proxy hop, for load benchmarks: a hyper server in
//! front of one pooled hyper client, both bodies parsed once with `serde_json`
//! (and written back), nothing else: no policy, no validation, no sanitizing,
//! no audit. `bench/load.py` measures it in the same run as the upstream direct
//! and the gateway, so the gateway's cost is stated against what any hop costs.
//!
//! ```text
//! cargo run --release --example bare_forwarder -- --upstream http://127.0.0.1:P/mcp [--port P]
//! ```
//!
//! Prints `LISTENING <port>` once it accepts connections; stops on SIGINT/SIGTERM.
//! Plain HTTP only (the benchmark's upstream is on loopback).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Upstream = Client<HttpConnector, Full<Bytes>>;

/// Request headers that are the hop's own, not the request's.
const HOP: &[header::HeaderName] = &[
    header::HOST,
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
];

fn main() -> std::io::Result<()> {
    let mut port = 0u16;
    let mut upstream: Option<Uri> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--port", Some(v)) => port = v.parse().unwrap_or(0),
            ("--upstream", Some(v)) => upstream = v.parse().ok(),
            _ => {
                eprintln!("usage: bare_forwarder --upstream http://HOST:PORT/PATH [--port P]");
                std::process::exit(2);
            }
        }
    }
    let Some(upstream) = upstream else {
        eprintln!("--upstream http://HOST:PORT/PATH is required");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(port, upstream))
}

async fn serve(port: u16, target: Uri) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("LISTENING {}", listener.local_addr()?.port());
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build(connector);
    let shared = Arc::new((client, target));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(forward(&shared.0, &shared.1, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Parses the request body once, forwards it, parses the reply once.
async fn forward(client: &Upstream, target: &Uri, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let Ok(message) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let Ok(body) = serde_json::to_vec(&message) else {
        return status(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let mut out = Request::builder().method(parts.method).uri(target.clone());
    for (name, value) in &parts.headers {
        if !HOP.contains(name) {
            out = out.header(name, value);
        }
    }
    let Ok(out) = out.body(Full::new(Bytes::from(body))) else {
        return status(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let Ok(reply) = client.request(out).await else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let (parts, body) = reply.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let body = if json && !body.is_empty() {
        match serde_json::from_slice::<serde_json::Value>(&body).map(|v| serde_json::to_vec(&v)) {
            Ok(Ok(v)) => Bytes::from(v),
            _ => return status(StatusCode::BAD_GATEWAY),
        }
    } else {
        body
    };
    let mut response = Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if !HOP.contains(name) {
            response = response.header(name, value);
        }
    }
    response
        .body(Full::new(body))
        .unwrap_or_else(|_| status(StatusCode::BAD_GATEWAY))
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r
}
