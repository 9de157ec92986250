//! Small utilities that know nothing of MCP or of the gateway's decisions:
//! the one serialisation of JSON the gateway forwards and digests, durations
//! as operators write them, clock readings, SQLite opening and migration,
//! text bounds, escapes for a terminal or a log line.
//!
//! Place: the bottom layer. Invariant: nothing here imports another module of
//! the crate (the layer test in `tests/` checks it).

pub mod canonical;
pub mod duration;
pub mod escape;
pub mod percent;
pub mod sqlite;
pub mod text;
pub mod time;
