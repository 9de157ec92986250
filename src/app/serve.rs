//! The accept loop of both listeners: HTTP/1.1 and HTTP/2 connections served
//! by hyper, with the client-side deadlines `axum::serve` does not set.
//!
//! Place in the path: before everything else; a connection reaches the router
//! only through here.
//!
//! Invariants: a client must send a request's headers within
//! `client_timeout` (slowloris), and an idle keep-alive connection is closed
//! after it; a new connection must send enough bytes to tell HTTP/1.1 from
//! HTTP/2 within it too (hyper waits for them without a timer), and an HTTP/2
//! peer that stops answering pings is closed; a write to a client that does not
//! read for `client_timeout` fails and closes the connection, so a stalled
//! reader cannot pin a task, a descriptor and a buffered response forever.
//! Reads are not timed once a connection has spoken: a client listening to a
//! long event stream sends nothing, legitimately. On shutdown, accepting stops
//! and open connections finish gracefully.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// Serves `router` on `listener` until `stop` resolves, then lets open
/// connections finish (the caller bounds how long).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    client_timeout: Duration,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(client_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(client_timeout)
        .keep_alive_timeout(client_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Deadlines::new(stream, client_timeout));
        let service = TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that hangs up or times out is not an error of the gateway.
            let _ = connection.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Per-connection accept errors (the peer reset before accept) are skipped;
/// others (out of descriptors) back off briefly instead of spinning.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(error = %e, "accepting a connection failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Bytes hyper reads before it picks HTTP/1.1 or HTTP/2 (the HTTP/2 preface).
const GREETING_BYTES: usize = 24;

/// A TCP stream whose writes fail once they have made no progress for
/// `limit`, and whose first [`GREETING_BYTES`] must arrive within `limit`.
#[derive(Debug)]
struct Deadlines {
    stream: TcpStream,
    limit: Duration,
    /// Armed while a write is pending; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Running until the greeting has arrived or a response has been written.
    greeting: Option<Pin<Box<Sleep>>>,
    read: usize,
}

impl Deadlines {
    fn new(stream: TcpStream, limit: Duration) -> Self {
        Self {
            stream,
            limit,
            stalled: None,
            greeting: Some(Box::pin(tokio::time::sleep(limit))),
            read: 0,
        }
    }

    /// Passes a write `poll` through, timing how long it stays pending.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(result) = poll(Pin::new(&mut self.stream), cx) {
            self.stalled = None;
            return Poll::Ready(result);
        }
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        ready!(sleep.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client did not read its response in time",
        )))
    }
}

impl Deadlines {
    /// Bytes written mean a request was read: the greeting is over.
    fn answered(&mut self, written: &io::Result<usize>) {
        if matches!(written, Ok(n) if *n > 0) {
            self.greeting = None;
        }
    }
}

impl AsyncRead for Deadlines {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        if let Poll::Ready(result) = Pin::new(&mut this.stream).poll_read(cx, buf) {
            this.read += buf.filled().len() - before;
            if this.read >= GREETING_BYTES {
                this.greeting = None;
            }
            return Poll::Ready(result);
        }
        if let Some(greeting) = this.greeting.as_mut() {
            ready!(greeting.as_mut().poll(cx));
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not start a request in time",
            )));
        }
        Poll::Pending
    }
}

impl AsyncWrite for Deadlines {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(self.timed(cx, |s, cx| s.poll_write(cx, buf)));
        self.answered(&written);
        Poll::Ready(written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(self.timed(cx, |s, cx| s.poll_write_vectored(cx, bufs)));
        self.answered(&written);
        Poll::Ready(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.timed(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.timed(cx, |s, cx| s.poll_shutdown(cx))
    }
}
