//! The record layer: what the gateway keeps of each request. The
//! [event](event::Event) of a request, the [trail](trail::Trail) that carries
//! it through the stages, the [sinks](sink::Sink) it is handed to at the end,
//! and the dashboard's [live ring](live::Recent), one of them.
//!
//! The request's spans ([`span`]) belong here too: they end with its event.
//!
//! Place: above the protocol model and the span exporter, below the
//! decisions' callers. The other sinks (the SQLite store in `audit`, the
//! Prometheus counters in `metrics`) sit above it and implement its trait;
//! the app wires them.

pub mod event;
pub mod live;
#[doc(hidden)]
pub mod probe;
pub mod sink;
pub(crate) mod span;
pub mod trail;
