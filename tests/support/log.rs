//! The in-process gateway's log, read by a test: one subscriber for the
//! whole test process (every test shares it), writing JSON lines, as the
//! binary's log does, into the buffer of the thread that captures, and
//! nothing for any other thread.
//!
//! Why one process-wide subscriber rather than a test's own scoped one:
//! tracing caches per call site whether anyone listens, process-wide. A call
//! site first reached by another test's gateway, on a thread with no
//! subscriber, would be cached as silent, and a scoped subscriber would miss
//! it. Here one subscriber is always there, and its filter is asked again per
//! event (a dynamic filter: `Interest::sometimes`, never an answer cached per
//! call site); the answer is whether the emitting thread captures.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Once};

use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

thread_local! {
    static BUFFER: RefCell<Option<Arc<Mutex<Vec<u8>>>>> = const { RefCell::new(None) };
}

/// What the log wrote on this thread while it lives; the thread's capture
/// ends when it is dropped. A test reading the log runs on a current-thread
/// runtime, so every task of the gateway it starts logs on its thread.
#[derive(Debug)]
pub struct Capture {
    buffer: Arc<Mutex<Vec<u8>>>,
}

/// Starts capturing the log of this thread (at INFO and above).
pub fn capture() -> Capture {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        // A dynamic filter: asked per event, never cached per call site.
        let only_capturing = tracing_subscriber::filter::dynamic_filter_fn(|meta, _| {
            *meta.level() <= tracing::Level::INFO && BUFFER.with(|b| b.borrow().is_some())
        });
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .with_writer(|| ThreadWriter)
            .with_filter(only_capturing);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the test process's only log subscriber");
    });
    let buffer = Arc::new(Mutex::new(Vec::new()));
    BUFFER.with(|b| *b.borrow_mut() = Some(buffer.clone()));
    Capture { buffer }
}

impl Capture {
    /// The lines written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.buffer.lock().expect("log").clone()).expect("UTF-8")
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        BUFFER.with(|b| *b.borrow_mut() = None);
    }
}

/// Appends to the capturing thread's buffer.
struct ThreadWriter;

impl std::io::Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        BUFFER.with(|b| {
            if let Some(buffer) = &*b.borrow() {
                buffer.lock().expect("log").extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
