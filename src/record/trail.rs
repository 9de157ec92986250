//! The record of one request while it is served: a [`Trail`] travels with
//! the request (the pipeline's exchange, the forwarder, the reply's
//! recipient); each stage notes what it learned (decision, violations,
//! sanitizer actions, pin findings, upstream status and latency), and the
//! request's spans open their stages through it.
//!
//! Place: the top of the record layer, under every stage of the pipeline.
//! Invariants: the event is recorded exactly once: when the last holder lets
//! go (after the response body has been handed on to the end), or earlier
//! when a stream [seals](Trail::seal) it just before its final answer
//! leaves, so that a sink that keeps events outside the process (the fleet's
//! audit spool) holds the event of every answer a client received; the spans
//! end with it and share its trace id, then every sink sees it; nothing here
//! waits for a network.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::event::Event;
use super::sink::Sinks;
use crate::record::span::RequestTrace;
use crate::sanitize::Report;

/// The audit event of one request while it is served; recorded when dropped.
#[derive(Debug)]
pub(crate) struct Trail {
    sinks: Arc<Sinks>,
    started: Instant,
    event: Mutex<Event>,
    /// The request's spans: they end with the event and share its trace id.
    trace: RequestTrace,
    /// The event has been recorded already ([`Trail::seal`]).
    sealed: AtomicBool,
}

impl Trail {
    pub(crate) fn new(
        sinks: Arc<Sinks>,
        started: Instant,
        event: Event,
        trace: RequestTrace,
    ) -> Arc<Self> {
        Arc::new(Self {
            sinks,
            started,
            event: Mutex::new(event),
            trace,
            sealed: AtomicBool::new(false),
        })
    }

    /// The request's spans (stages, trace context).
    pub(crate) fn trace(&self) -> &RequestTrace {
        &self.trace
    }

    /// The pipeline enters stage `name` (a child span of the request's).
    pub(crate) fn stage(&self, name: &'static str) {
        self.trace.stage(name);
    }

    /// Changes the event.
    pub(crate) fn note(&self, f: impl FnOnce(&mut Event)) {
        f(&mut self.event.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Adds what the sanitizer did.
    pub(crate) fn sanitized(&self, report: &Report) {
        if !report.is_empty() {
            self.note(|e| {
                for (k, n) in report.counts() {
                    *e.sanitizer.entry(k.clone()).or_default() += n;
                }
            });
        }
    }

    /// The upstream answered, with an HTTP status (`None` over stdio, which
    /// has none), after `took`.
    pub(crate) fn upstream(&self, status: Option<u16>, took: Duration) {
        if let Some(status) = status {
            self.trace.replied(status);
        }
        self.note(|e| {
            e.upstream_status = status;
            let us = took.as_micros() as u64;
            // Lists may take several round trips: their latencies add up.
            e.upstream_latency_us = Some(e.upstream_latency_us.unwrap_or(0) + us);
        });
    }

    /// The result the client gets was decided later on (a rewritten tool result).
    pub(crate) fn decided(&self, code: &str, stage: &str) {
        self.note(|e| {
            e.decision = code.to_owned();
            e.stage = stage.to_owned();
        });
    }
}

impl Trail {
    /// Records the event now, before the final answer of a stream leaves
    /// (what is noted afterwards is not kept); the last holder's letting go
    /// then records nothing.
    pub(crate) fn seal(&self) {
        if !self.sealed.swap(true, Ordering::AcqRel) {
            let event = std::mem::take(&mut *self.event.lock().unwrap_or_else(|p| p.into_inner()));
            self.record(event);
        }
    }

    fn record(&self, mut event: Event) {
        event.latency_us = self.started.elapsed().as_micros() as u64;
        event.trace_id = self.trace.trace_id();
        event.bound();
        self.trace.finish(&event);
        self.sinks.record(event);
    }
}

impl Drop for Trail {
    fn drop(&mut self) {
        if !*self.sealed.get_mut() {
            let event = std::mem::take(self.event.get_mut().unwrap_or_else(|p| p.into_inner()));
            self.record(event);
        }
    }
}
