//! The transport: how a request reaches an MCP server and how its answer
//! comes back, over HTTP (a pooled client per server) or stdio (one
//! supervised child process per server).
//!
//! Place: a layer of its own beneath the pipeline (`proxy`), above the
//! configuration it is built from. The pipeline's steps decide whether and
//! when to send; this layer only sends and reads, and hands back one
//! [`reply::Reply`] or one [`reply::UpstreamError`] per exchange whatever the
//! server speaks.
//!
//! Invariants:
//! - nothing here imports from the pipeline: breakers, retries, deadlines and
//!   the accounting of calls in flight sit above, around an exchange;
//! - every wait and every read is bounded (see [`upstream`] and [`stdio`]);
//! - upstream text is carried raw and sanitized above, before anyone sees it.

pub(crate) mod reply;
mod stdio;
pub(crate) mod upstream;

pub(crate) use upstream::{Connection, forwarded_headers};
