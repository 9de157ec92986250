//! Commands of the `portcullis` binary that work on a configuration and its
//! stores without a running gateway (`portcullis pins list | approve`, `portcullis check --explain`).
//!
//! Place: the top layer beside the binary; it reads config and the stores,
//! nothing reads it.

pub mod explain;
pub mod pins;
