//! The accept loop of both listeners: HTTP/1.1 and HTTP/2 connections served
//! by hyper, with the client-side deadlines `axum::serve` does not set, and a
//! cap on how many are open.
//!
//! Place in the path: before everything else; a connection reaches the router
//! only through here.
//!
//! Invariants: at most `max_connections` connections are served at once per
//! listener; one past it takes the slot of the oldest connection that has not
//! sent its first request's head yet, which is closed ([`waiting`]), so
//! connections that never finish their headers cannot lock other clients
//! out; when every slot holds a connection that has, the new one is answered
//! at once — 503 with `Retry-After` where a
//! request can be read within [`REFUSAL_DEADLINE`], for at most [`REFUSING`]
//! such connections at a time, and closed unanswered beyond that — so a flood
//! of connections costs a bounded amount of memory. A new connection must send
//! its first request's headers within `header_timeout` (slowloris: a
//! half-open connection goes first); later requests' headers, and the idle
//! time of a keep-alive connection, within `client_timeout`; an HTTP/2 peer
//! that stops answering pings is closed; a write to a client that does not
//! read for `client_timeout` fails and closes the connection, so a stalled
//! reader cannot pin a task, a descriptor and a buffered response forever.
//! Reads are not timed once the first request's headers are in: a client
//! listening to a long event stream sends nothing, legitimately. Until they
//! are in, the connection is only a socket, a small buffer and a timer (hyper
//! takes it over with the head read), so idle connections cost little. On
//! shutdown, accepting stops, connections without a request yet are closed,
//! and open ones finish gracefully.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::metrics::Connections;

mod waiting;

use waiting::Waiting;

/// Connections past the cap that may be answered (503) at the same time;
/// past these, a connection is closed without an answer.
pub(crate) const REFUSING: usize = 64;
/// How long a connection past the cap has to send a request, and to read the
/// 503, before it is closed.
pub(crate) const REFUSAL_DEADLINE: Duration = Duration::from_secs(1);
/// What the 503 suggests: connections close every few seconds in a sidecar's life.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A listener's connection limits (read at start; a reload does not change them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Later headers, idle keep-alive, stalled writes.
    pub client_timeout: Duration,
    /// The greeting and the first request's headers.
    pub header_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `stop` resolves, then lets open
/// connections finish (the caller bounds how long).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    counters: Arc<Connections>,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    counters
        .max
        .store(limits.max_connections as u64, Ordering::Relaxed);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Started whenever hyper waits for a request: this is the idle
        // keep-alive deadline too; the first request has the shorter one.
        .header_read_timeout(limits.client_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.client_timeout)
        .keep_alive_timeout(limits.client_timeout);
    let builder = Arc::new(builder);
    let refusals = Refusals::new(limits.max_connections);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let waiting = Arc::new(Waiting::<Open>::default());
    let graceful = GracefulShutdown::new();
    // Connections still waiting for their first request's head are not
    // hyper's yet: they stop here at shutdown.
    let (stopping, stopped) = tokio::sync::watch::channel(false);
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
        let open = match slots.clone().try_acquire_owned() {
            Ok(slot) => Open::new(slot, counters.clone()),
            // At the cap: the oldest connection without a request yet makes room.
            Err(_) => match waiting.evict_oldest() {
                Some(open) => open,
                None => {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    refusals.answer(stream);
                    continue;
                }
            },
        };
        let (ticket, evicted) = waiting.enter(open);
        let _ = stream.set_nodelay(true);
        let io = Deadlines::new(stream, limits.client_timeout, limits.header_timeout);
        let (builder, router, watcher) = (builder.clone(), router.clone(), graceful.watcher());
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let io = tokio::select! {
                head = first_head(io) => match head {
                    Ok(io) => io,
                    Err(_) => return,
                },
                _ = evicted => return,
                _ = stopped.wait_for(|s| *s) => return,
            };
            // Evicted as its head came in: the slot is another's now.
            let Some(open) = ticket.claim() else {
                return;
            };
            let service = TowerToHyperService::new(router);
            // Boxed: this task stays small while it waits for the head.
            let connection = Box::pin(
                watcher.watch(
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(io), service)
                        .into_owned(),
                ),
            );
            // A client that hangs up or times out is not an error of the gateway.
            let _ = connection.await;
            drop(open);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    graceful.shutdown().await;
    Ok(())
}

/// Most bytes of a first request's head read before hyper takes the
/// connection; past them (a head that large is rare) hyper reads the rest.
const PREREAD_MAX: usize = 16 * 1024;

/// Reads the first request's head (or the HTTP/2 preface) into a buffer of
/// its own size, before hyper builds its connection: hyper's two 8 KiB
/// buffers and its connection state exist only for connections that have
/// sent a request, so a half-open one costs a few hundred bytes.
async fn first_head(mut io: Deadlines) -> io::Result<Prefixed> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    while !io.head_done() && head.len() < PREREAD_MAX {
        // Doubling from 256 bytes: a request line and a few headers fit the first.
        head.reserve(head.len().max(256).min(PREREAD_MAX - head.len()));
        if io.read_buf(&mut head).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(Prefixed { head, at: 0, io })
}

/// A connection whose first bytes were read already: they are read again,
/// then the stream.
#[derive(Debug)]
struct Prefixed {
    head: Vec<u8>,
    at: usize,
    io: Deadlines,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.head.len() {
            let n = buf.remaining().min(this.head.len() - this.at);
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            if this.at == this.head.len() {
                this.head = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One served connection: holds its slot and counts itself open until dropped.
#[derive(Debug)]
struct Open {
    _slot: OwnedSemaphorePermit,
    counters: Arc<Connections>,
}

impl Open {
    fn new(slot: OwnedSemaphorePermit, counters: Arc<Connections>) -> Self {
        counters.open.fetch_add(1, Ordering::Relaxed);
        Self {
            _slot: slot,
            counters,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How connections past the cap are answered.
struct Refusals {
    builder: Builder<TokioExecutor>,
    service: TowerToHyperService<Router>,
    /// At most [`REFUSING`] answers in progress.
    answering: Arc<Semaphore>,
}

impl Refusals {
    fn new(max_connections: usize) -> Self {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .keep_alive(false)
            .header_read_timeout(REFUSAL_DEADLINE);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(1);
        let router = Router::new().fallback(move || async move {
            crate::error::overloaded(max_connections, RETRY_AFTER)
        });
        Self {
            builder,
            service: TowerToHyperService::new(router),
            answering: Arc::new(Semaphore::new(REFUSING)),
        }
    }

    /// Answers `stream` with 503 if a request comes within the deadline and
    /// fewer than [`REFUSING`] are being answered; else closes it now.
    fn answer(&self, stream: TcpStream) {
        let Ok(permit) = self.answering.clone().try_acquire_owned() else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Deadlines::new(stream, REFUSAL_DEADLINE, REFUSAL_DEADLINE));
        let connection = self
            .builder
            .serve_connection(io, self.service.clone())
            .into_owned();
        tokio::spawn(async move {
            // Bounded even for an HTTP/2 peer that keeps its stream open.
            let _ = tokio::time::timeout(REFUSAL_DEADLINE * 2, connection).await;
            drop(permit);
        });
    }
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

/// A TCP stream whose writes fail once they have made no progress for
/// `limit`, and whose first request's headers must arrive within `first`.
#[derive(Debug)]
struct Deadlines {
    stream: TcpStream,
    limit: Duration,
    /// Armed while a write is pending; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Running until the first request's headers have arrived (or a
    /// response has been written).
    first: Option<Pin<Box<Sleep>>>,
    /// Where the reader is in looking for the end of those headers.
    head: HeadEnd,
}

impl Deadlines {
    fn new(stream: TcpStream, limit: Duration, first: Duration) -> Self {
        Self {
            stream,
            limit,
            stalled: None,
            first: Some(Box::pin(tokio::time::sleep(first))),
            head: HeadEnd::default(),
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
    /// The first request's head has arrived (or been answered).
    fn head_done(&self) -> bool {
        self.first.is_none()
    }

    /// Bytes written mean a request was read: the first deadline is over.
    fn answered(&mut self, written: &io::Result<usize>) {
        if matches!(written, Ok(n) if *n > 0) {
            self.first = None;
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
            if this.first.is_some() && this.head.scan(&buf.filled()[before..]) {
                this.first = None;
            }
            return Poll::Ready(result);
        }
        if let Some(first) = this.first.as_mut() {
            ready!(first.as_mut().poll(cx));
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not send its first request's headers in time",
            )));
        }
        Poll::Pending
    }
}

/// Finds the end of an HTTP/1.1 request head in bytes as they arrive: an
/// empty line, `\r\n\r\n` or the bare `\n\n` parsers also accept. The
/// HTTP/2 preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`) has one too, so an
/// HTTP/2 connection's first deadline ends with its preface; its pings
/// watch it from then on.
#[derive(Debug, Default, Clone, Copy)]
struct HeadEnd {
    /// The last bytes were a line end (`\n`), then maybe a `\r`.
    after_newline: bool,
    after_newline_cr: bool,
}

impl HeadEnd {
    /// Feeds `bytes`; whether the head has ended.
    fn scan(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            match b {
                b'\n' if self.after_newline || self.after_newline_cr => return true,
                b'\n' => {
                    self.after_newline = true;
                    self.after_newline_cr = false;
                }
                b'\r' if self.after_newline => {
                    self.after_newline = false;
                    self.after_newline_cr = true;
                }
                _ => {
                    self.after_newline = false;
                    self.after_newline_cr = false;
                }
            }
        }
        false
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

#[cfg(test)]
mod tests {
    use super::HeadEnd;

    fn ends(chunks: &[&[u8]]) -> bool {
        let mut head = HeadEnd::default();
        chunks.iter().any(|c| head.scan(c))
    }

    #[test]
    fn the_end_of_a_request_head_is_found_across_reads() {
        assert!(ends(&[b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"]));
        assert!(ends(&[b"GET / HTTP/1.1\r\nHost: a\r", b"\n", b"\r", b"\n"]));
        assert!(ends(&[b"GET / HTTP/1.1\nHost: a\n\n"]));
        assert!(ends(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]));
        assert!(!ends(&[b"GET / HTTP/1.1\r\nHost: a\r\n"]));
        assert!(!ends(&[b"GET / HTTP/1.1\r\nX: \r\r\n"]));
        assert!(!ends(&[
            b"GET / HTTP/1.1\r\n",
            b"Host: a\r\n",
            b"X-Slow: 1"
        ]));
    }
}
